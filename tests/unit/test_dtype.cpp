// Conversions: exhaustive over fp16 and bf16 inputs, and checked against the
// CPU's own conversion instructions (F16C, AVX512-BF16) where present, since
// the fast kernels will use those and results must stay bit-identical.
#include <criterion/criterion.h>
#include <immintrin.h>

#include <cmath>
#include <random>

#include "util/dtype.h"

#include <cpuid.h>

// F16C from CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports
// does not know "f16c".
static bool pstar_cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
}


using namespace pstar;

Test(dtype, f16_to_f32_to_f16_roundtrips_every_non_nan_value) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff) != 0;
    if (nan) {
      cr_assert(std::isnan(f));
      cr_assert(std::isnan(f16_to_f32(f32_to_f16(f))), "NaN stays NaN");
    } else {
      cr_assert_eq(f32_to_f16(f), h, "value %04x", h);
    }
  }
}

Test(dtype, bf16_to_f32_to_bf16_roundtrips_every_normal_value) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      cr_assert(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else if (((b >> 7) & 0xff) == 0 && (b & 0x7f) != 0) {
      // Subnormal: flushed to a signed zero by policy.
      cr_assert_eq(f32_to_bf16(f), b & 0x8000);
    } else {
      cr_assert_eq(f32_to_bf16(f), b, "value %04x", b);
    }
  }
}

Test(dtype, round_to_nearest_even_ties) {
  // 1 + 2^-11 is halfway between fp16 1.0 and its successor: even -> 1.0.
  cr_assert_eq(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 0x3c01 and 0x3c02: even -> 0x3c02.
  cr_assert_eq(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  cr_assert_eq(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  cr_assert_eq(f32_to_f16(65519.0f), 0x7bff);
  cr_assert_eq(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  cr_assert_eq(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  cr_assert_eq(f32_to_bf16(INFINITY), 0x7f80);
  cr_assert_eq(f32_to_bf16(3.4e38f), 0x7f80);  // overflow rounds to inf
}

__attribute__((target("f16c"))) static uint16_t hw_f16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

Test(dtype, f32_to_f16_matches_f16c) {
  if (!pstar_cpu_has_f16c()) cr_skip_test("skipped: CPU has no F16C");
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t bits = rng();
    const float f = f32_from_bits(bits);
    if (std::isnan(f)) continue;
    cr_assert_eq(f32_to_f16(f), hw_f16(f), "input %08x", bits);
  }
  // Every fp16 subnormal neighbourhood, exhaustively around the threshold.
  for (uint32_t bits = 0x33000000u - 1000; bits < 0x38800000u + 1000; bits += 97) {
    cr_assert_eq(f32_to_f16(f32_from_bits(bits)), hw_f16(f32_from_bits(bits)), "input %08x", bits);
  }
}

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
__attribute__((target("avx512bf16,avx512vl,avx512f"))) static uint16_t hw_bf16(float f) {
  __m128 v = _mm_set1_ps(f);
  __m128bh r = _mm_cvtneps_pbh(v);
  uint16_t out[8];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), reinterpret_cast<__m128i>(r));
  return out[0];
}

Test(dtype, f32_to_bf16_matches_avx512_bf16) {
  if (!__builtin_cpu_supports("avx512bf16")) cr_skip_test("skipped: CPU has no AVX512-BF16");
  std::mt19937 rng(11);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t bits = rng();
    const float f = f32_from_bits(bits);
    if (std::isnan(f)) {
      cr_assert(std::isnan(bf16_to_f32(hw_bf16(f))));
      cr_assert(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    cr_assert_eq(f32_to_bf16(f), hw_bf16(f), "input %08x", bits);
  }
  // Subnormal inputs: the hardware flushes them, and so does the policy.
  for (uint32_t bits = 1; bits < 0x00800000u; bits += 4099) {
    cr_assert_eq(f32_to_bf16(f32_from_bits(bits)), hw_bf16(f32_from_bits(bits)), "input %08x", bits);
    cr_assert_eq(f32_to_bf16(f32_from_bits(bits | 0x80000000u)), hw_bf16(f32_from_bits(bits | 0x80000000u)));
  }
}
#endif

Test(dtype, array_conversions) {
  const float src[4] = {1.0f, -2.5f, 0.0f, 1e-3f};
  uint16_t h[4];
  float back[4];
  convert_from_f32(src, h, PSTAR_DTYPE_F16, 4);
  convert_to_f32(h, PSTAR_DTYPE_F16, back, 4);
  for (int i = 0; i < 4; ++i) cr_assert_eq(back[i], f16_to_f32(f32_to_f16(src[i])));
  cr_assert_eq(dtype_size(PSTAR_DTYPE_F32), 4u);
  cr_assert_eq(dtype_size(PSTAR_DTYPE_BF16), 2u);
  cr_assert(!dtype_valid(7));
}
