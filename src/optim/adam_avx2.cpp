// The AVX2 + FMA + F16C path of the fused Adam update (optim/adam_kernel.h).
//
// Every function here carries __attribute__((target(...))) instead of the
// file being compiled with -mavx2: an inline function from a header (the
// dtype conversions, adam_element, the standard library) instantiated in a
// file built with -mavx2 could be the copy the linker keeps, and the library
// would then die with SIGILL on a CPU without AVX2.  With per-function
// targets only the functions below use the extensions, and they run only
// after adam_isa_supported(kAvx2) said yes.
//
// Arithmetic: exactly the operations of adam_element() in the same order,
// each with one rounding (_mm256_fmadd_ps == fmaf, true division and square
// root), so the bits equal the scalar path's.  Conversions follow the policy
// of util/dtype.h: fp16 through F16C (round to nearest even, exact
// subnormals), bf16 through an integer round to nearest even in SIMD
// (subnormal input -> signed zero, NaN -> (bits >> 16) | 0x40).  Sixteen
// elements per iteration (two independent vectors, enough to cover the
// latency of the divide and the square root); the last n % 16 go through
// adam_element() itself.
#include "optim/adam_kernel.h"
#include "optim/adam_prefetch.h"
#include "util/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "optim/adam_lanes_avx2.h"
#include "util/convert_avx2.h"

namespace pstar::optim {

void adam_update_avx2(const AdamStepConstants& c, const AdamRange& r);

namespace {

using namespace lanes_avx2;
using simd::bf16_pack16;

template <pstar_dtype D, bool kGradF32>
__attribute__((target("avx2,fma,f16c"))) void run(const AdamStepConstants& c, const AdamRange& r) {
  const Consts k = make_consts(c);
  float* const master = r.master;
  float* const exp_avg = r.exp_avg;
  float* const exp_avg_sq = r.exp_avg_sq;
  const float* const master_in = r.master_in != nullptr ? r.master_in : master;
  const float* const exp_avg_in = r.exp_avg_in != nullptr ? r.exp_avg_in : exp_avg;
  const float* const exp_avg_sq_in = r.exp_avg_sq_in != nullptr ? r.exp_avg_sq_in : exp_avg_sq;
  // Locals, not r's members: the stores through float* could alias r, which
  // would make the compiler reload them every iteration.
  void* const slot = r.slot;
  const float* const g32 = r.grad_f32;
  const size_t n = r.n;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch_step<D, kGradF32>(master_in, exp_avg_in, exp_avg_sq_in, sizeof(float), g32, slot, i, 16, n);
    const __m256 g0 = load_grad<D, kGradF32>(g32, slot, i);
    const __m256 g1 = load_grad<D, kGradF32>(g32, slot, i + 8);
    __m256 p0 = _mm256_loadu_ps(master_in + i), p1 = _mm256_loadu_ps(master_in + i + 8);
    __m256 m0 = _mm256_loadu_ps(exp_avg_in + i), m1 = _mm256_loadu_ps(exp_avg_in + i + 8);
    __m256 v0 = _mm256_loadu_ps(exp_avg_sq_in + i), v1 = _mm256_loadu_ps(exp_avg_sq_in + i + 8);
    adam8(k, g0, p0, m0, v0);
    adam8(k, g1, p1, m1, v1);
    _mm256_storeu_ps(master + i, p0);
    _mm256_storeu_ps(master + i + 8, p1);
    _mm256_storeu_ps(exp_avg + i, m0);
    _mm256_storeu_ps(exp_avg + i + 8, m1);
    _mm256_storeu_ps(exp_avg_sq + i, v0);
    _mm256_storeu_ps(exp_avg_sq + i + 8, v1);
    emit16<D>(slot, i, p0, p1);
  }
  // Ragged tail: the scalar function itself (inlined here, so fmaf is the
  // same single-rounding FMA instruction).
  for (; i < n; ++i) {
    const float g = kGradF32 ? g32[i] : load_as(slot, D, i);
    float p = master_in[i], m = exp_avg_in[i], v = exp_avg_sq_in[i];
    const float w = adam_element(c, g, p, m, v);
    master[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    store_as(slot, D, i, w);
  }
}

template <pstar_dtype D>
void run_dtype(const AdamStepConstants& c, const AdamRange& r) {
  if (r.grad_f32 != nullptr) {
    run<D, true>(c, r);
  } else {
    run<D, false>(c, r);
  }
}

}  // namespace

void adam_update_avx2(const AdamStepConstants& c, const AdamRange& r) {
  switch (r.dtype) {
    case PSTAR_DTYPE_F16: run_dtype<PSTAR_DTYPE_F16>(c, r); return;
    case PSTAR_DTYPE_F32: run_dtype<PSTAR_DTYPE_F32>(c, r); return;
    default:  // bf16, as store_as() treats every other value
      run_dtype<PSTAR_DTYPE_BF16>(c, r);
      return;
  }
}

}  // namespace pstar::optim

#else  // not x86: never selected (adam_isa_supported says no)

namespace pstar::optim {
void adam_update_avx2(const AdamStepConstants&, const AdamRange&);
void adam_update_avx2(const AdamStepConstants&, const AdamRange&) {}
}  // namespace pstar::optim

#endif
