// Creates the accelerator tier an engine's options ask for.
#pragma once

#include <cstdint>
#include <memory>

#include "memory/device.h"

namespace pstar::memory {

// Which accelerator tier to make, and how (the engine's options, resolved).
struct DeviceConfig {
  pstar_device_kind kind = PSTAR_DEVICE_EMULATED;
  int32_t ordinal = 0;  // CUDA
  // Emulated: checked stream semantics with seeded delays (strict), or the
  // modelled device (a virtual clock; `payloads` false: a dry run, address
  // space only) with the link's bandwidths in bytes per second.
  bool strict = false;
  uint64_t strict_seed = 0;
  bool modelled = false;
  bool payloads = true;
  double h2d_bytes_per_s = 0.0, d2h_bytes_per_s = 0.0;
};

// Throws Error(PSTAR_ERR_UNSUPPORTED) for CUDA in a build without it, and
// Error(PSTAR_ERR_DEVICE) when no CUDA device can be used.
std::unique_ptr<Device> make_device(const DeviceConfig& config);

// Number of usable CUDA devices; 0 in builds without CUDA and on machines
// where the runtime reports any error (no driver, no device).
int cuda_device_count();

}  // namespace pstar::memory
