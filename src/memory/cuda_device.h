// CudaDevice: the Device interface over the CUDA runtime (builds with CUDA
// only).  Streams are CUDA streams; events are CUDA events; host buffers are
// pinned (cudaHostAlloc) so that copies are truly asynchronous; the gradient
// operations are kernels in cuda_device.cu that use the same per-element code
// as the host (util/dtype.h).
#pragma once

#include <memory>

#include "memory/device.h"

namespace pstar::memory {

std::unique_ptr<Device> make_cuda_device(int ordinal);

// Device count, or 0 when the runtime reports any error (no driver: 35).
int cuda_runtime_device_count();

}  // namespace pstar::memory
