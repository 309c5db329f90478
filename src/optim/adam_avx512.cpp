// The AVX-512 path of the fused Adam update (optim/adam_kernel.h): needs
// AVX-512 F, BW and VL (plus FMA and F16C, which every such CPU has); the
// bf16 emit uses AVX512-BF16's VCVTNEPS2BF16 where the CPU has it, else an
// integer round to nearest even implementing the same policy.
//
// As in adam_avx2.cpp, the extensions are enabled per function
// (__attribute__((target(...)))), never for the whole file, so no inline
// function from a header is compiled with them by accident.
//
// Arithmetic: exactly adam_element()'s operations in its order, one
// rounding each (_mm512_fmadd_ps == fmaf; true division and square root).
// Conversions: fp16 through VCVTPS2PH/VCVTPH2PS (round to nearest even,
// exact subnormals, as util/dtype.h); bf16 as util/dtype.h says, which is
// what VCVTNEPS2BF16 does (subnormal input -> signed zero, NaN -> quiet NaN
// with the payload truncated, else round to nearest even).  Thirty-two
// elements per iteration (two independent vectors); the ragged tail runs
// the same vector code under a lane mask (masked loads and stores touch
// nothing past n), so there is no scalar tail.
//
// The kernel body is written once as a macro and instantiated twice: once
// for the base target and once with avx512bf16 added, because a target
// attribute cannot depend on a template parameter and a function of the
// base target may not inline one that needs AVX512-BF16.
#include "optim/adam_kernel.h"
#include "optim/adam_prefetch.h"
#include "util/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's AVX-512 headers start unmasked operations from a self-initialized
// "undefined" vector, which -Wmaybe-uninitialized reports once inlined
// (GCC bug 105593): silence that one warning for this file.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "optim/adam_lanes_avx512.h"

namespace pstar::optim {

void adam_update_avx512(const AdamStepConstants& c, const AdamRange& r, bool native_bf16);

namespace {

using namespace lanes_avx512;

// The kernel body; BF16_EMIT(x) turns sixteen fp32 lanes into sixteen bf16.
#define PSTAR_ADAM512_BODY(BF16_EMIT)                                                                                  \
  const Consts k = make_consts(c);                                                                                     \
  float* const master = r.master;                                                                                      \
  float* const exp_avg = r.exp_avg;                                                                                    \
  float* const exp_avg_sq = r.exp_avg_sq;                                                                              \
  const float* const master_in = r.master_in != nullptr ? r.master_in : master;                                        \
  const float* const exp_avg_in = r.exp_avg_in != nullptr ? r.exp_avg_in : exp_avg;                                    \
  const float* const exp_avg_sq_in = r.exp_avg_sq_in != nullptr ? r.exp_avg_sq_in : exp_avg_sq;                        \
  void* const slot = r.slot; /* locals: stores through float* could alias r */                                         \
  const float* const g32 = r.grad_f32;                                                                                 \
  const size_t n = r.n;                                                                                                \
  size_t i = 0;                                                                                                        \
  for (; i + 32 <= n; i += 32) {                                                                                       \
    prefetch_step<D, kGradF32>(master_in, exp_avg_in, exp_avg_sq_in, sizeof(float), g32, slot, i, 32, n);              \
    const __m512 g0 = load_grad_full<D, kGradF32>(g32, slot, i);                                                       \
    const __m512 g1 = load_grad_full<D, kGradF32>(g32, slot, i + 16);                                                  \
    __m512 p0 = _mm512_loadu_ps(master_in + i), p1 = _mm512_loadu_ps(master_in + i + 16);                              \
    __m512 m0 = _mm512_loadu_ps(exp_avg_in + i), m1 = _mm512_loadu_ps(exp_avg_in + i + 16);                            \
    __m512 v0 = _mm512_loadu_ps(exp_avg_sq_in + i), v1 = _mm512_loadu_ps(exp_avg_sq_in + i + 16);                      \
    adam16(k, g0, p0, m0, v0);                                                                                         \
    adam16(k, g1, p1, m1, v1);                                                                                         \
    _mm512_storeu_ps(master + i, p0);                                                                                  \
    _mm512_storeu_ps(master + i + 16, p1);                                                                             \
    _mm512_storeu_ps(exp_avg + i, m0);                                                                                 \
    _mm512_storeu_ps(exp_avg + i + 16, m1);                                                                            \
    _mm512_storeu_ps(exp_avg_sq + i, v0);                                                                              \
    _mm512_storeu_ps(exp_avg_sq + i + 16, v1);                                                                         \
    if (D == PSTAR_DTYPE_F32) {                                                                                        \
      float* s = static_cast<float*>(slot) + i;                                                                        \
      _mm512_storeu_ps(s, p0);                                                                                         \
      _mm512_storeu_ps(s + 16, p1);                                                                                    \
    } else {                                                                                                           \
      __m256i* s = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(slot) + i);                                       \
      if (D == PSTAR_DTYPE_F16) {                                                                                      \
        _mm256_storeu_si256(s, _mm512_cvtps_ph(p0, _MM_FROUND_TO_NEAREST_INT));                                        \
        _mm256_storeu_si256(s + 1, _mm512_cvtps_ph(p1, _MM_FROUND_TO_NEAREST_INT));                                    \
      } else {                                                                                                         \
        _mm256_storeu_si256(s, BF16_EMIT(p0));                                                                         \
        _mm256_storeu_si256(s + 1, BF16_EMIT(p1));                                                                     \
      }                                                                                                                \
    }                                                                                                                  \
  }                                                                                                                    \
  for (; i < n; i += 16) {                                                                                             \
    const size_t left = n - i;                                                                                         \
    const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);    \
    const __m512 g = load_grad<D, kGradF32>(g32, slot, i, mask);                                                       \
    __m512 p = _mm512_maskz_loadu_ps(mask, master_in + i);                                                             \
    __m512 m = _mm512_maskz_loadu_ps(mask, exp_avg_in + i);                                                            \
    __m512 v = _mm512_maskz_loadu_ps(mask, exp_avg_sq_in + i);                                                         \
    adam16(k, g, p, m, v);                                                                                             \
    _mm512_mask_storeu_ps(master + i, mask, p);                                                                        \
    _mm512_mask_storeu_ps(exp_avg + i, mask, m);                                                                       \
    _mm512_mask_storeu_ps(exp_avg_sq + i, mask, v);                                                                    \
    if (D == PSTAR_DTYPE_F32) {                                                                                        \
      _mm512_mask_storeu_ps(static_cast<float*>(slot) + i, mask, p);                                                   \
    } else if (D == PSTAR_DTYPE_F16) {                                                                                 \
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(slot) + i, mask, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT)); \
    } else {                                                                                                           \
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(slot) + i, mask, BF16_EMIT(p));                                  \
    }                                                                                                                  \
  }

template <pstar_dtype D, bool kGradF32>
__attribute__((target(PSTAR_AVX512_ISA))) void run_int(const AdamStepConstants& c, const AdamRange& r) {
  PSTAR_ADAM512_BODY(bf16_int16)
}

template <pstar_dtype D, bool kGradF32>
__attribute__((target(PSTAR_AVX512BF16_ISA))) void run_native(const AdamStepConstants& c, const AdamRange& r) {
  PSTAR_ADAM512_BODY(bf16_native16)
}

#undef PSTAR_ADAM512_BODY

template <pstar_dtype D>
void run_dtype(const AdamStepConstants& c, const AdamRange& r, bool native_bf16) {
  // Only the bf16 emit differs between the two bodies.
  (void)native_bf16;
  if constexpr (D == PSTAR_DTYPE_BF16) {
    if (native_bf16) {
      if (r.grad_f32 != nullptr) {
        run_native<D, true>(c, r);
      } else {
        run_native<D, false>(c, r);
      }
      return;
    }
  }
  if (r.grad_f32 != nullptr) {
    run_int<D, true>(c, r);
  } else {
    run_int<D, false>(c, r);
  }
}

}  // namespace

// `native_bf16`: the CPU has AVX512-BF16 (the caller checked).
void adam_update_avx512(const AdamStepConstants& c, const AdamRange& r, bool native_bf16) {
  switch (r.dtype) {
    case PSTAR_DTYPE_F16: run_dtype<PSTAR_DTYPE_F16>(c, r, native_bf16); return;
    case PSTAR_DTYPE_F32: run_dtype<PSTAR_DTYPE_F32>(c, r, native_bf16); return;
    default:  // bf16, as store_as() treats every other value
      run_dtype<PSTAR_DTYPE_BF16>(c, r, native_bf16);
      return;
  }
}

}  // namespace pstar::optim

#else  // not x86: never selected (adam_isa_supported says no)

namespace pstar::optim {
void adam_update_avx512(const AdamStepConstants&, const AdamRange&, bool);
void adam_update_avx512(const AdamStepConstants&, const AdamRange&, bool) {}
}  // namespace pstar::optim

#endif
