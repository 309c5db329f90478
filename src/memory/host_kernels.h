// Host implementations of the device-side gradient operations, used by the
// emulated device and by tests as the reference for the CUDA kernels.
#pragma once

#include <cstddef>

#include "pstar/pstar.h"

namespace pstar::memory {

void host_grad_accumulate(float* acc, const void* src, pstar_dtype src_dtype, size_t n);
// Squared sum (fp64, per block of kNormBlockElems in block order) and
// inf/NaN flag of n fp32 gradient values.
void host_grad_norm(const float* g, size_t n, double* sumsq, int* nonfinite);
void host_grad_finalize(const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq, int* nonfinite);

}  // namespace pstar::memory
