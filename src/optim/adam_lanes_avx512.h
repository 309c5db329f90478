// Internal to the AVX-512 Adam paths (adam_avx512.cpp,
// adam_states_avx512.cpp): the target strings, adam_element() on sixteen
// lanes, the bf16 conversions and the gradient loads, shared so that the
// fp32 update and the state formats' updates do the same operations in the
// same order (one rounding each), hence the same bits.  Every function is
// always_inline with its target: include only from files that enable the
// extensions per function, never for the file.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/adam.h"
#include "pstar/pstar.h"

#define PSTAR_AVX512_ISA "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define PSTAR_AVX512BF16_ISA "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,avx512bf16"
#define PSTAR_AVX512 __attribute__((target(PSTAR_AVX512_ISA), always_inline)) inline
#define PSTAR_AVX512BF16 __attribute__((target(PSTAR_AVX512BF16_ISA), always_inline)) inline

namespace pstar::optim::lanes_avx512 {

struct Consts {
  __m512 grad_mul, l2, beta1, omb1, beta2, omb2, inv_sqrt_bc2, sqrt_bc2, eps, decay_mul, neg_step;
  __m512 rcp_sqrt_bc2;  // RN(1 / sqrt_bc2) in float: exact_div_sqrt_bc2's reciprocal
};

PSTAR_AVX512 Consts make_consts(const AdamStepConstants& c) {
  Consts k;
  k.grad_mul = _mm512_set1_ps(c.grad_mul);
  k.l2 = _mm512_set1_ps(c.l2);
  k.beta1 = _mm512_set1_ps(c.beta1);
  k.omb1 = _mm512_set1_ps(c.one_minus_beta1);
  k.beta2 = _mm512_set1_ps(c.beta2);
  k.omb2 = _mm512_set1_ps(c.one_minus_beta2);
  k.inv_sqrt_bc2 = _mm512_set1_ps(c.inv_sqrt_bc2);
  k.sqrt_bc2 = _mm512_set1_ps(c.sqrt_bc2);
  k.eps = _mm512_set1_ps(c.eps);
  k.decay_mul = _mm512_set1_ps(c.decay_mul);
  k.neg_step = _mm512_set1_ps(-c.step_size);
  k.rcp_sqrt_bc2 = _mm512_set1_ps(1.0f / c.sqrt_bc2);
  return k;
}

// adam_element() on sixteen lanes; p, m and v are updated in place.
PSTAR_AVX512 void adam16(const Consts& k, __m512 g, __m512& p, __m512& m, __m512& v) {
  g = _mm512_mul_ps(g, k.grad_mul);
  g = _mm512_fmadd_ps(k.l2, p, g);
  m = _mm512_fmadd_ps(k.beta1, m, _mm512_mul_ps(k.omb1, g));
  v = _mm512_fmadd_ps(k.beta2, v, _mm512_mul_ps(_mm512_mul_ps(k.omb2, g), g));
  const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), k.inv_sqrt_bc2, k.eps);
  p = _mm512_mul_ps(p, k.decay_mul);
  p = _mm512_fmadd_ps(k.neg_step, _mm512_div_ps(m, denom), p);
}

// x / sqrt_bc2, correctly rounded, for x = sqrt(v) (v >= 0, +inf or NaN)
// without the divider: q = x * RN(1 / c), then one FMA correction with the
// exact residual x - q c (Markstein's theorem: with y = RN(1 / c) and q
// within an ulp of x / c, RN(q + (x - q c) y) = RN(x / c), barring
// underflow and overflow).  Neither happens for these x: sqrt of the
// smallest subnormal is 2^-74.5, sqrt(FLT_MAX) / c stays finite for every
// c = sqrt(1 - beta2^t) with beta2 < 1, and 0 gives 0.  Checked against
// VDIVPS for every float x in [2^-75, sqrt(FLT_MAX)] at 152 values of c
// (2026-12-06): no difference.  +inf gives NaN (inf - inf); NaN keeps the
// corrected quotient.  The kernel does not pass it through here: +inf
// comes only from v = +inf, which the block's maximum of v shows, and the
// int8 body then sets those lanes' denominators to +inf after its pass 1A
// (a VFIXUPIMMPS per 16 elements did it before; without it, and with the
// signed codes' +127 added after the first pack, the kernel ran 1.02-1.03x
// faster, bench/int8_kernel_ab.py, 2026-12-06).  On the Intel dev
// machine the AVX-512 int8 kernel ran 1.05x faster with this than with the
// division (bench/int8_kernel_ab.py, 2026-12-06); the AVX2 one ran 0.965x
// as fast with it, so AVX2 keeps the division.  The other division, by the
// per-element denominator, stays a division.
PSTAR_AVX512 __m512 exact_div_sqrt_bc2(const Consts& k, __m512 x) {
  const __m512 q = _mm512_mul_ps(x, k.rcp_sqrt_bc2);
  const __m512 r = _mm512_fnmadd_ps(q, k.sqrt_bc2, x);
  return _mm512_fmadd_ps(r, k.rcp_sqrt_bc2, q);
}

// adam_element_int8() on sixteen lanes in two parts, so that a kernel can
// run the division by the denominator apart from the rest: the moments m
// and v (in place) and the denominator, then the master p from m and the
// denominator.  kUnitGradMul: for grad_mul 1 (the gradient as stored),
// which the caller checked.  g * 1 is g, a NaN quieted; the FMA after it
// quiets it too, so the bits are the multiply's.  (Skipping the l2 term as
// well when l2 is 0 would change which NaN wins where a NaN master meets a
// NaN gradient: the final add's two NaN operands, whose order compilers
// are free to swap.)
template <bool kUnitGradMul>
PSTAR_AVX512 __m512 adam16_int8_moments(const Consts& k, __m512 g, __m512 p, __m512& m, __m512& v) {
  if (!kUnitGradMul) g = _mm512_mul_ps(g, k.grad_mul);
  g = _mm512_fmadd_ps(k.l2, p, g);
  m = _mm512_fmadd_ps(g, k.omb1, _mm512_mul_ps(m, k.beta1));
  v = _mm512_fmadd_ps(_mm512_mul_ps(k.omb2, g), g, _mm512_mul_ps(v, k.beta2));
  return _mm512_add_ps(exact_div_sqrt_bc2(k, _mm512_sqrt_ps(v)), k.eps);
}

PSTAR_AVX512 __m512 adam16_int8_master(const Consts& k, __m512 p, __m512 m, __m512 denom) {
  p = _mm512_mul_ps(p, k.decay_mul);
  return _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(k.neg_step, m), denom));
}

// f32_to_bf16() of util/dtype.h on sixteen lanes, in integer arithmetic.
PSTAR_AVX512 __m256i bf16_int16(__m512 f) {
  const __m512i x = _mm512_castps_si512(f);
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __mmask16 is_sub = _mm512_testn_epi32_mask(x, _mm512_set1_epi32(0x7f800000));
  // Subnormal (or zero) input: keep the sign only.
  const __m512i xz = _mm512_mask_and_epi32(x, is_sub, x, _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(xz, 16), _mm512_set1_epi32(1));
  __m512i res = _mm512_add_epi32(_mm512_add_epi32(xz, _mm512_set1_epi32(0x7fff)), lsb);
  res = _mm512_mask_or_epi32(res, is_nan, x, _mm512_set1_epi32(0x00400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(res, 16));
}

PSTAR_AVX512BF16 __m256i bf16_native16(__m512 f) { return (__m256i)_mm512_cvtneps_pbh(f); }

PSTAR_AVX512 __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The gradient of the lanes of `mask` from element i (zero elsewhere): from
// the fp32 list `g32`, or the slot.
template <pstar_dtype D, bool kGradF32>
PSTAR_AVX512 __m512 load_grad(const float* g32, const void* slot, size_t i, __mmask16 mask) {
  if (kGradF32) return _mm512_maskz_loadu_ps(mask, g32 + i);
  if (D == PSTAR_DTYPE_F32) return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(slot) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(slot) + i);
  if (D == PSTAR_DTYPE_F16) return _mm512_cvtph_ps(h);
  return widen_bf16(h);
}

template <pstar_dtype D, bool kGradF32>
PSTAR_AVX512 __m512 load_grad_full(const float* g32, const void* slot, size_t i) {
  if (kGradF32) return _mm512_loadu_ps(g32 + i);
  if (D == PSTAR_DTYPE_F32) return _mm512_loadu_ps(static_cast<const float*>(slot) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(slot) + i));
  if (D == PSTAR_DTYPE_F16) return _mm512_cvtph_ps(h);
  return widen_bf16(h);
}

}  // namespace pstar::optim::lanes_avx512
