#include "memory/device_factory.h"

#include "memory/emulated_device.h"
#include "memory/modelled_device.h"
#include "util/error.h"

#if defined(PSTAR_HAVE_CUDA)
#include "memory/cuda_device.h"
#endif

namespace pstar::memory {

std::unique_ptr<Device> make_device(const pstar_engine_options& o) {
  if (o.device == PSTAR_DEVICE_EMULATED && (o.virtual_clock != 0 || o.dry_run != 0)) {
    return std::make_unique<ModelledDevice>(o.dry_run == 0, o.h2d_bytes_per_s, o.d2h_bytes_per_s);
  }
  if (o.device == PSTAR_DEVICE_EMULATED) {
    return std::make_unique<EmulatedDevice>(o.strict != 0, o.strict_seed);
  }
#if defined(PSTAR_HAVE_CUDA)
  return make_cuda_device(o.device_ordinal);
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
