// Eight-lane conversions between fp32 and fp16/bf16 for the AVX2 + F16C
// paths (optim/adam_avx2.cpp, memory/host_kernels_avx2.cpp), following the
// policy of util/dtype.h bit for bit: fp16 through F16C (round to nearest
// even, exact subnormals), bf16 through an integer round to nearest even
// (subnormal input -> signed zero, NaN -> (bits >> 16) | 0x40).
//
// Include only from files whose callers check the CPU first
// (adam_isa_supported(kAvx2)).  Every function carries the target attribute
// and is always inlined, so no copy of it is compiled for the baseline ISA
// and none can be picked by the linker for code that runs without AVX2.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstdint>

#define PSTAR_AVX2 __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace pstar::simd {

// f32_to_bf16() on eight lanes, the result in the high 16
// bits of each 32-bit lane (the low bits are garbage).
PSTAR_AVX2 __m256i bf16_round_hi(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i is_sub = _mm256_cmpeq_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7f800000)), _mm256_setzero_si256());
  // Subnormal (or zero) input: keep the sign only.
  const __m256i xz = _mm256_andnot_si256(_mm256_and_si256(is_sub, _mm256_set1_epi32(0x7fffffff)), x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(xz, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(xz, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

// True when every lane of a and b is a normal number (exponent field
// neither 0 nor 255): then plain round-to-nearest-even is the whole policy.
// Adding 2^23 to the exponent field maps 0 to 2^23 and 255 to INT32_MIN, so
// one signed comparison per vector separates them.
PSTAR_AVX2 bool all_normal(__m256i xa, __m256i xb) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  const __m256i one_exp = _mm256_set1_epi32(0x00800000);
  const __m256i ea = _mm256_add_epi32(_mm256_and_si256(xa, exp_mask), one_exp);
  const __m256i eb = _mm256_add_epi32(_mm256_and_si256(xb, exp_mask), one_exp);
  const __m256i ok = _mm256_and_si256(_mm256_cmpgt_epi32(ea, one_exp), _mm256_cmpgt_epi32(eb, one_exp));
  return _mm256_movemask_epi8(ok) == -1;
}

// Round to nearest even, for normal numbers only.
PSTAR_AVX2 __m256i bf16_round_hi_normal(__m256i x) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb);
}

// f32_to_bf16() on sixteen lanes, two vectors of eight, the results in the
// high 16 bits of each 32-bit lane of ha and hb (the low bits are garbage).
PSTAR_AVX2 void bf16_round_hi16(__m256 a, __m256 b, __m256i& ha, __m256i& hb) {
  const __m256i xa = _mm256_castps_si256(a), xb = _mm256_castps_si256(b);
  if (all_normal(xa, xb)) {  // the common case: weights are normal numbers
    ha = bf16_round_hi_normal(xa);
    hb = bf16_round_hi_normal(xb);
  } else {
    ha = bf16_round_hi(a);
    hb = bf16_round_hi(b);
  }
}

// Sixteen bf16 values, in order, from the high halves of ha and hb.
PSTAR_AVX2 __m256i bf16_pack_hi16(__m256i ha, __m256i hb) {
  // packus works within 128-bit lanes: a0-3 b0-3 a4-7 b4-7; reorder.
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_srli_epi32(ha, 16), _mm256_srli_epi32(hb, 16)), 0xd8);
}

// Sixteen bf16 values, in order, from two vectors of eight.
PSTAR_AVX2 __m256i bf16_pack16(__m256 a, __m256 b) {
  __m256i ha, hb;
  bf16_round_hi16(a, b, ha, hb);
  return bf16_pack_hi16(ha, hb);
}

PSTAR_AVX2 __m256 load_bf16x8(const uint16_t* s) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

PSTAR_AVX2 __m256 load_f16x8(const uint16_t* s) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
}

// Eight fp16 values from eight fp32 lanes (f32_to_f16).
PSTAR_AVX2 __m128i f16_pack8(__m256 f) { return _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT); }

}  // namespace pstar::simd

#endif
