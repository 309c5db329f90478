#include "memory/device_factory.h"

#include "memory/emulated_device.h"
#include "memory/modelled_device.h"
#include "util/error.h"

#if defined(PSTAR_HAVE_CUDA)
#include "memory/cuda_device.h"
#endif

namespace pstar::memory {

std::unique_ptr<Device> make_device(const DeviceConfig& c) {
  if (c.kind == PSTAR_DEVICE_EMULATED && c.modelled) {
    return std::make_unique<ModelledDevice>(c.payloads, c.h2d_bytes_per_s, c.d2h_bytes_per_s);
  }
  if (c.kind == PSTAR_DEVICE_EMULATED) {
    return std::make_unique<EmulatedDevice>(c.strict, c.strict_seed);
  }
#if defined(PSTAR_HAVE_CUDA)
  return make_cuda_device(c.ordinal);
#else
  throw Error(PSTAR_ERR_UNSUPPORTED, "this libpstar was built without CUDA");
#endif
}

int cuda_device_count() {
#if defined(PSTAR_HAVE_CUDA)
  return cuda_runtime_device_count();
#else
  return 0;
#endif
}

}  // namespace pstar::memory
