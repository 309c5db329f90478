// Small pieces every pstar-bench subcommand uses: the median of timed reps
// and the check of a libpstar call.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "pstar/pstar.h"

namespace pstar::bench {

// The median (the mean of the two middle values for an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k % 2 == 1 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

// A failed libpstar call: the call, its status and the library's message.
struct CallError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws CallError unless `st` is PSTAR_OK.
inline void check(pstar_status st, const char* call) {
  if (st == PSTAR_OK) return;
  throw CallError(std::string(call) + " failed with " + pstar_status_name(st) + ": " + pstar_last_error_message());
}

}  // namespace pstar::bench
