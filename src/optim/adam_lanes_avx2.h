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
  __m256 grad_mul, l2, beta1, omb1, beta2, omb2, inv_sqrt_bc2, eps, decay_mul, neg_step;
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

// The gradient of elements i..i+7: from the fp32 list `g32`, or the slot.
template <pstar_dtype D, bool kGradF32>
PSTAR_AVX2 __m256 load_grad(const float* g32, const void* slot, size_t i) {
  if (kGradF32) return _mm256_loadu_ps(g32 + i);
  if (D == PSTAR_DTYPE_F32) return _mm256_loadu_ps(static_cast<const float*>(slot) + i);
  if (D == PSTAR_DTYPE_F16) return simd::load_f16x8(static_cast<const uint16_t*>(slot) + i);
  return simd::load_bf16x8(static_cast<const uint16_t*>(slot) + i);
}

}  // namespace pstar::optim::lanes_avx2
