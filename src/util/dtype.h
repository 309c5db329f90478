// Element types and exact scalar conversions between fp32, fp16 and bf16.
//
// Policy (one for every path, CPU and CUDA, so results are bit-identical):
//  - fp32 -> fp16: round to nearest even; fp16 subnormals are produced
//    exactly (as F16C's VCVTPS2PH does); overflow gives inf; NaN stays NaN
//    (payload truncated, quiet bit set).
//  - fp32 -> bf16: round to nearest even; fp32 subnormal inputs become a
//    signed zero (as AVX512-BF16's VCVTNEPS2BF16 treats them); NaN stays NaN
//    (quiet bit set).
//  - fp16/bf16 -> fp32: exact.
#pragma once

#include <cstdint>
#include <cstring>

#include "pstar/pstar.h"
#include "util/host_device.h"

namespace pstar {

PSTAR_HD uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

PSTAR_HD float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

PSTAR_HD uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? (0x0200u | ((ax >> 13) & 0x3ffu)) : 0u));
  }
  if (ax >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 2^16: inf
  if (ax < 0x38800000u) {                                               // below 2^-14: subnormal
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);           // <= 2^-25 rounds to 0
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // value in units of 2^-24 is m >> shift
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (ax - 0x38000000u) >> 13;  // rebias exponent 127 -> 15
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // may carry into inf: correct
  return static_cast<uint16_t>(sign | r);
}

PSTAR_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return f32_from_bits(sign);
    e = 113;  // 2^-14 as an fp32 biased exponent
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    m &= 0x3ffu;
    return f32_from_bits(sign | (e << 23) | (m << 13));
  }
  if (e == 31) return f32_from_bits(sign | 0x7f800000u | (m << 13));
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

PSTAR_HD uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // NaN
  if ((x & 0x7f800000u) == 0) x &= 0x80000000u;  // subnormal input -> signed zero
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

PSTAR_HD float bf16_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// Bytes per element of a dtype.
inline size_t dtype_size(pstar_dtype d) { return d == PSTAR_DTYPE_F32 ? 4u : 2u; }

inline bool dtype_valid(int d) { return d == PSTAR_DTYPE_F32 || d == PSTAR_DTYPE_F16 || d == PSTAR_DTYPE_BF16; }

const char* dtype_name(pstar_dtype d);

// Element-wise conversions over host arrays.
void convert_to_f32(const void* src, pstar_dtype src_dtype, float* dst, size_t n);
void convert_from_f32(const float* src, void* dst, pstar_dtype dst_dtype, size_t n);

// Rounds one fp32 value through `dtype` and stores it at element `i` of `dst`.
PSTAR_HD void store_as(void* dst, pstar_dtype dtype, size_t i, float v) {
  if (dtype == PSTAR_DTYPE_F32) {
    static_cast<float*>(dst)[i] = v;
  } else if (dtype == PSTAR_DTYPE_F16) {
    static_cast<uint16_t*>(dst)[i] = f32_to_f16(v);
  } else {
    static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v);
  }
}

PSTAR_HD float load_as(const void* src, pstar_dtype dtype, size_t i) {
  if (dtype == PSTAR_DTYPE_F32) return static_cast<const float*>(src)[i];
  if (dtype == PSTAR_DTYPE_F16) return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
  return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
}

}  // namespace pstar
