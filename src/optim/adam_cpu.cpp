// Instruction-set dispatch and the scalar path of the fused Adam update.
#include <cstdlib>
#include <cstring>

#include "optim/adam_kernel.h"
#include "util/dtype.h"
#include "util/error.h"

namespace pstar::optim {

namespace {

void adam_update_scalar(const AdamStepConstants& c, const AdamRange& r) {
  for (size_t i = 0; i < r.n; ++i) {
    const float g = r.grad_f32 != nullptr ? r.grad_f32[i] : load_as(r.slot, r.dtype, i);
    const float w = adam_element(c, g, r.master[i], r.exp_avg[i], r.exp_avg_sq[i]);
    store_as(r.slot, r.dtype, i, w);
  }
}

}  // namespace

bool adam_isa_supported(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kScalar:
      return true;
    case AdamIsa::kAvx2:
    case AdamIsa::kAvx512:
      return false;  // vector paths: added with their kernels
  }
  return false;
}

const char* adam_isa_name(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kScalar: return "scalar";
    case AdamIsa::kAvx2: return "avx2";
    case AdamIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

AdamIsa adam_default_isa() {
  if (const char* want = std::getenv("PSTAR_ADAM_ISA")) {
    for (AdamIsa isa : {AdamIsa::kScalar, AdamIsa::kAvx2, AdamIsa::kAvx512}) {
      if (std::strcmp(want, adam_isa_name(isa)) == 0 && adam_isa_supported(isa)) return isa;
    }
  }
  for (AdamIsa isa : {AdamIsa::kAvx512, AdamIsa::kAvx2}) {
    if (adam_isa_supported(isa)) return isa;
  }
  return AdamIsa::kScalar;
}

void adam_update(AdamIsa isa, const AdamStepConstants& c, const AdamRange& r) {
  switch (isa) {
    case AdamIsa::kScalar:
      adam_update_scalar(c, r);
      return;
    case AdamIsa::kAvx2:
    case AdamIsa::kAvx512:
      break;
  }
  internal_error(std::string("Adam path '") + adam_isa_name(isa) + "' is not available");
}

}  // namespace pstar::optim
