// Internal to the AVX2 Adam paths (adam_avx2.cpp, adam_states_avx2.cpp):
// adam_element() on eight lanes and the gradient loads, shared so that the
// fp32 update and the state formats' updates do the same operations in the
// same order (one rounding each), hence the same bits.  Include only from
// files whose callers enable avx2, fma and f16c per function (every
// function here is always_inline with that target).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "optim/adam.h"
#include "pstar/pstar.h"
#include "util/convert_avx2.h"

namespace pstar::optim::lanes_avx2 {

struct Consts {
  __m256 grad_mul, l2, beta1, omb1, beta2, omb2, inv_sqrt_bc2, sqrt_bc2, eps, decay_mul, neg_step;
};

PSTAR_AVX2 Consts make_consts(const AdamStepConstants& c) {
  Consts k;
  k.grad_mul = _mm256_set1_ps(c.grad_mul);
  k.l2 = _mm256_set1_ps(c.l2);
  k.beta1 = _mm256_set1_ps(c.beta1);
  k.omb1 = _mm256_set1_ps(c.one_minus_beta1);
  k.beta2 = _mm256_set1_ps(c.beta2);
  k.omb2 = _mm256_set1_ps(c.one_minus_beta2);
  k.inv_sqrt_bc2 = _mm256_set1_ps(c.inv_sqrt_bc2);
  k.sqrt_bc2 = _mm256_set1_ps(c.sqrt_bc2);
  k.eps = _mm256_set1_ps(c.eps);
  k.decay_mul = _mm256_set1_ps(c.decay_mul);
  k.neg_step = _mm256_set1_ps(-c.step_size);
  return k;
}

// adam_element() on eight lanes; p, m and v are updated in place.
PSTAR_AVX2 void adam8(const Consts& k, __m256 g, __m256& p, __m256& m, __m256& v) {
  g = _mm256_mul_ps(g, k.grad_mul);
  g = _mm256_fmadd_ps(k.l2, p, g);
  m = _mm256_fmadd_ps(k.beta1, m, _mm256_mul_ps(k.omb1, g));
  v = _mm256_fmadd_ps(k.beta2, v, _mm256_mul_ps(_mm256_mul_ps(k.omb2, g), g));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), k.inv_sqrt_bc2, k.eps);
  p = _mm256_mul_ps(p, k.decay_mul);
  p = _mm256_fmadd_ps(k.neg_step, _mm256_div_ps(m, denom), p);
}

// adam_element_int8() on eight lanes; p, m and v are updated in place.
PSTAR_AVX2 void adam8_int8(const Consts& k, __m256 g, __m256& p, __m256& m, __m256& v) {
  g = _mm256_mul_ps(g, k.grad_mul);
  g = _mm256_fmadd_ps(k.l2, p, g);
  m = _mm256_fmadd_ps(g, k.omb1, _mm256_mul_ps(m, k.beta1));
  v = _mm256_fmadd_ps(_mm256_mul_ps(k.omb2, g), g, _mm256_mul_ps(v, k.beta2));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), k.sqrt_bc2), k.eps);
  p = _mm256_mul_ps(p, k.decay_mul);
  p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(k.neg_step, m), denom));
}

// The gradient of elements i..i+7: from the fp32 list `g32`, or the slot.
template <pstar_dtype D, bool kGradF32>
PSTAR_AVX2 __m256 load_grad(const float* g32, const void* slot, size_t i) {
  if (kGradF32) return _mm256_loadu_ps(g32 + i);
  if (D == PSTAR_DTYPE_F32) return _mm256_loadu_ps(static_cast<const float*>(slot) + i);
  if (D == PSTAR_DTYPE_F16) return simd::load_f16x8(static_cast<const uint16_t*>(slot) + i);
  return simd::load_bf16x8(static_cast<const uint16_t*>(slot) + i);
}

// The new weights of elements i..i+15 (p0, p1), rounded to the slot's dtype.
template <pstar_dtype D>
PSTAR_AVX2 void emit16(void* slot, size_t i, __m256 p0, __m256 p1) {
  if (D == PSTAR_DTYPE_F32) {
    float* s = static_cast<float*>(slot) + i;
    _mm256_storeu_ps(s, p0);
    _mm256_storeu_ps(s + 8, p1);
  } else if (D == PSTAR_DTYPE_F16) {
    __m128i* s = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(slot) + i);
    _mm_storeu_si128(s, simd::f16_pack8(p0));
    _mm_storeu_si128(s + 1, simd::f16_pack8(p1));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(slot) + i), simd::bf16_pack16(p0, p1));
  }
}

template <pstar_dtype D>
PSTAR_AVX2 void emit8(void* slot, size_t i, __m256 p) {
  if (D == PSTAR_DTYPE_F32) {
    _mm256_storeu_ps(static_cast<float*>(slot) + i, p);
  } else if (D == PSTAR_DTYPE_F16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(slot) + i), simd::f16_pack8(p));
  } else {
    // bf16_pack16 rounds two vectors; keep the first eight results.
    const __m256i h = simd::bf16_pack16(p, p);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(slot) + i), _mm256_castsi256_si128(h));
  }
}

}  // namespace pstar::optim::lanes_avx2
