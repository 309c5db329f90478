#include "util/settings.h"

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>

#include "util/error.h"

namespace pstar::settings {

namespace {
bool float_in(float v, float lo, float hi) { return v >= lo && v <= hi; }  // NaN: false

// A double rounded to float as a C cast does (to nearest), but defined for
// every double: beyond the range that rounds to FLT_MAX, an infinity.
float to_float(double v) {
  constexpr double kRoundsToInf = static_cast<double>(FLT_MAX) + 0x1p103;  // FLT_MAX + half its ulp
  if (v >= kRoundsToInf) return std::numeric_limits<float>::infinity();
  if (v <= -kRoundsToInf) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(v);  // NaN stays NaN
}

// Shortest-enough decimal forms: 9 digits tell floats apart, 17 doubles.
std::string num_str(double v, int digits = 9) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}
}  // namespace

void require_float(float v, float lo, float hi, const char* what, const char* range) {
  require(float_in(v, lo, hi), PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return std::string(what) + " must be " + range + " (got " + num_str(v) + ")"; });
}

float require_double_as_float(double v, float lo, float hi, const char* what, const char* range) {
  const float f = to_float(v);
  require(float_in(f, lo, hi), PSTAR_ERR_INVALID_ARGUMENT, [&] {
    std::string m = std::string(what) + " must be " + range + " as a float (got " + num_str(v, 17);
    if (!(static_cast<double>(f) == v) && !std::isnan(v)) m += ", which rounds to " + num_str(f);
    return m + ")";
  });
  return f;
}

}  // namespace pstar::settings
