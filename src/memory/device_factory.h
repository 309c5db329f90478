// Creates the accelerator tier an engine's options ask for.
#pragma once

#include <memory>

#include "memory/device.h"

namespace pstar::memory {

// Throws Error(PSTAR_ERR_UNSUPPORTED) for CUDA in a build without it, and
// Error(PSTAR_ERR_DEVICE) when no CUDA device can be used.
std::unique_ptr<Device> make_device(const pstar_engine_options& options);

// Number of usable CUDA devices; 0 in builds without CUDA and on machines
// where the runtime reports any error (no driver, no device).
int cuda_device_count();

}  // namespace pstar::memory
