// The fused Adam update as a CUDA kernel (builds with CUDA only): the same
// adam_element() and conversions as the CPU paths, so results are
// bit-identical to them (checked by tests/gpu/adam_cuda_check.cpp).
#pragma once

#include "optim/adam_kernel.h"

namespace pstar::optim {

// Queues the update of range `r` (every pointer in device memory) on the
// CUDA stream `stream` (a cudaStream_t; NULL for the legacy default stream).
// Throws Error(PSTAR_ERR_DEVICE) if the launch fails.
void adam_update_cuda(void* stream, const AdamStepConstants& c, const AdamRange& r);

}  // namespace pstar::optim
