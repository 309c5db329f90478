#include "util/dtype.h"

namespace pstar {

const char* dtype_name(pstar_dtype d) {
  switch (d) {
    case PSTAR_DTYPE_F32: return "f32";
    case PSTAR_DTYPE_F16: return "f16";
    case PSTAR_DTYPE_BF16: return "bf16";
    case PSTAR_DTYPE_FORCE_32BIT_: break;
  }
  return "unknown";
}

void convert_to_f32(const void* src, pstar_dtype src_dtype, float* dst, size_t n) {
  if (src_dtype == PSTAR_DTYPE_F32) {
    if (n != 0) std::memcpy(dst, src, n * sizeof(float));  // either may be NULL when n == 0
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = load_as(src, src_dtype, i);
}

void convert_from_f32(const float* src, void* dst, pstar_dtype dst_dtype, size_t n) {
  if (dst_dtype == PSTAR_DTYPE_F32) {
    if (n != 0) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) store_as(dst, dst_dtype, i, src[i]);
}

}  // namespace pstar
