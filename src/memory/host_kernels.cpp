#include "memory/host_kernels.h"

#include <cmath>

#include "memory/device.h"
#include "util/dtype.h"

namespace pstar::memory {

void host_grad_accumulate(float* acc, const void* src, pstar_dtype src_dtype, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += load_as(src, src_dtype, i);
}

void host_grad_norm(const float* g, size_t n, double* sumsq, int* nonfinite) {
  double total = 0.0;
  int bad = 0;
  for (size_t b = 0; b < n; b += kNormBlockElems) {
    const size_t e = b + kNormBlockElems < n ? b + kNormBlockElems : n;
    double block = 0.0;
    for (size_t i = b; i < e; ++i) {
      const double v = g[i];
      if (!std::isfinite(v)) bad = 1;
      block += v * v;
    }
    total += block;
  }
  *sumsq = total;
  *nonfinite = bad;
}

void host_grad_finalize(const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq, int* nonfinite) {
  double total = 0.0;
  int bad = 0;
  for (size_t b = 0; b < n; b += kNormBlockElems) {
    const size_t e = b + kNormBlockElems < n ? b + kNormBlockElems : n;
    double block = 0.0;
    for (size_t i = b; i < e; ++i) {
      store_as(slot, dtype, i, acc[i]);
      const double g = load_as(slot, dtype, i);
      if (!std::isfinite(g)) bad = 1;
      block += g * g;
    }
    total += block;
  }
  *sumsq = total;
  *nonfinite = bad;
}

}  // namespace pstar::memory
