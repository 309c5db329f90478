// The AVX2 + FMA + F16C paths of the bf16 and int8 state formats
// (optim/adam_states.h).  Per-function target attributes, as in
// adam_avx2.cpp.  Arithmetic: adam_element()'s (int8: adam_element_int8()'s) operations in its order, one
// rounding each; conversions as util/dtype.h (util/convert_avx2.h); the
// int8 quantizer as adam_states_int8.h, with its eight-entry tables
// (three-octave slots) looked up with one VPERMD each, and the map looked up
// with VGATHERDPS.  Eight or sixteen elements per iteration; the
// ragged tails go through the scalar functions themselves.  Same bits as the
// scalar path.
#include "optim/adam_prefetch.h"
#include "optim/adam_states.h"
#include "optim/adam_states_int8.h"
#include "util/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "optim/adam_lanes_avx2.h"
#include "util/convert_avx2.h"

namespace pstar::optim {

void adam_states_bf16_avx2(const AdamStepConstants& c, const AdamStateRange& r);
void adam_states_int8_avx2(const AdamStepConstants& c, const AdamStateRange& r);
void int8_encode_avx2(bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax);

namespace {

using namespace lanes_avx2;
using simd::bf16_pack16;
using simd::load_bf16x8;

// ---- bf16 states ----------------------------------------------------------------

template <pstar_dtype D, bool kGradF32>
__attribute__((target("avx2,fma,f16c"))) void bf16_run(const AdamStepConstants& c, const AdamStateRange& r) {
  const Consts k = make_consts(c);
  const bool oop = r.master_in != nullptr;
  float* const master = r.master;
  const float* const pi = oop ? r.master_in : master;
  const uint16_t* const mi = static_cast<const uint16_t*>(oop ? r.exp_avg_in.values : r.exp_avg.values);
  const uint16_t* const vi = static_cast<const uint16_t*>(oop ? r.exp_avg_sq_in.values : r.exp_avg_sq.values);
  uint16_t* const mo = static_cast<uint16_t*>(r.exp_avg.values);
  uint16_t* const vo = static_cast<uint16_t*>(r.exp_avg_sq.values);
  void* const slot = r.slot;
  const float* const g32 = r.grad_f32;
  const size_t n = r.n;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch_step<D, kGradF32>(pi, mi, vi, sizeof(uint16_t), g32, slot, i, 16, n);
    const __m256 g0 = load_grad<D, kGradF32>(g32, slot, i);
    const __m256 g1 = load_grad<D, kGradF32>(g32, slot, i + 8);
    __m256 p0 = _mm256_loadu_ps(pi + i), p1 = _mm256_loadu_ps(pi + i + 8);
    __m256 m0 = load_bf16x8(mi + i), m1 = load_bf16x8(mi + i + 8);
    __m256 v0 = load_bf16x8(vi + i), v1 = load_bf16x8(vi + i + 8);
    adam8(k, g0, p0, m0, v0);
    adam8(k, g1, p1, m1, v1);
    _mm256_storeu_ps(master + i, p0);
    _mm256_storeu_ps(master + i + 8, p1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mo + i), bf16_pack16(m0, m1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(vo + i), bf16_pack16(v0, v1));
    emit16<D>(slot, i, p0, p1);
  }
  for (; i < n; ++i) {
    const float g = kGradF32 ? g32[i] : load_as(slot, D, i);
    float p = pi[i], m = bf16_to_f32(mi[i]), v = bf16_to_f32(vi[i]);
    const float w = adam_element(c, g, p, m, v);
    master[i] = p;
    mo[i] = f32_to_bf16(m);
    vo[i] = f32_to_bf16(v);
    store_as(slot, D, i, w);
  }
}

// ---- int8 -------------------------------------------------------------------------

inline float absmax_step(float acc, float x) {
  const float a = std::fabs(x);
  return a > acc ? a : acc;
}

PSTAR_AVX2 float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// The quantizer's tables of one map (adam_states_int8.h), eight entries
// each, one VPERMD per lookup: three-octave slots and decades 0..7.
struct QTab {
  __m256i slot_dec;
  __m256 slot_cross, dec_s, dec_olo;
  __m256i dec_last;
  __m256 top_cross;
};

PSTAR_AVX2 QTab load_qtab(const int8::Map& m) {
  return QTab{_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m.slot3_dec)),
              _mm256_loadu_ps(m.slot3_cross),
              _mm256_loadu_ps(m.dec_s),
              _mm256_loadu_ps(m.dec_olo),
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m.dec_last)),
              _mm256_set1_ps(m.top_cross)};
}

// Eight codes of x * r (x normalized by the block's scale) into codes[0..7].
template <bool kSigned>
PSTAR_AVX2 void quant8(const QTab& q, __m256 y, uint8_t* codes, const float* x, float r) {
  const __m256i yb = _mm256_castps_si256(y);
  __m256 a = kSigned ? _mm256_castsi256_ps(_mm256_and_si256(yb, _mm256_set1_epi32(0x7fffffff))) : y;
  a = _mm256_max_ps(a, _mm256_setzero_ps());  // NaN and (unsigned) negatives: 0
  const __m256i octave =
      _mm256_srli_epi32(_mm256_subs_epu16(_mm256_castps_si256(a), _mm256_set1_epi32(int8::kOctaveBias << 23)), 23);
  const __m256i slot = _mm256_mulhi_epu16(octave, _mm256_set1_epi32(0x5556));  // octave / 3
  __m256i dec = _mm256_permutevar8x32_epi32(q.slot_dec, slot);
  const __m256 cross = _mm256_permutevar8x32_ps(q.slot_cross, slot);
  dec = _mm256_sub_epi32(dec, _mm256_castps_si256(_mm256_cmp_ps(a, cross, _CMP_GE_OQ)));
  const __m256 s = _mm256_permutevar8x32_ps(q.dec_s, dec);
  const __m256 olo = _mm256_permutevar8x32_ps(q.dec_olo, dec);
  const __m256i last = _mm256_permutevar8x32_epi32(q.dec_last, dec);
  // The ambiguity test adds 2 kAmbiguity to the rounded u_lo (the bound is
  // in adam_states.cpp).  Lanes at or above the top boundary take the code
  // of 1.0 (decade 7's last count plus one) and are never ambiguous.
  const __m256 u_lo = _mm256_fmadd_ps(a, s, olo);
  const __m256i jlo = _mm256_cvttps_epi32(u_lo);
  const __m256i jhi = _mm256_cvttps_epi32(_mm256_add_ps(u_lo, _mm256_set1_ps(2 * int8::kAmbiguity)));
  const __m256 top = _mm256_cmp_ps(a, q.top_cross, _CMP_GE_OQ);
  const int amb = ~_mm256_movemask_ps(_mm256_or_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(jlo, jhi)), top)) & 0xff;
  __m256i k = _mm256_sub_epi32(_mm256_min_epi32(jlo, last), _mm256_castps_si256(top));
  if (kSigned) {  // 127 + k, or 127 - k for a negative y (-1 at -1.0: the pack saturates it to 0)
    const __m256i c127 = _mm256_set1_epi32(127);
    const __m256i neg = _mm256_srai_epi32(yb, 31);
    k = _mm256_blendv_epi8(_mm256_add_epi32(k, c127), _mm256_sub_epi32(c127, k), neg);
  }
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(codes), _mm_packus_epi16(w, w));
  if (amb != 0) int8::fix_lanes(kSigned, x, r, static_cast<uint32_t>(amb), codes);
}

template <bool kSigned>
PSTAR_AVX2 void quant_block(const QTab& q, const float* x, size_t nb, float r, uint8_t* codes) {
  if (!int8::vector_scale(r)) return int8::quant_block_scalar(kSigned, x, nb, r, codes);
  const __m256 vr = _mm256_set1_ps(r);
  size_t i = 0;
  for (; i + 8 <= nb; i += 8) quant8<kSigned>(q, _mm256_mul_ps(_mm256_loadu_ps(x + i), vr), codes + i, x + i, r);
  for (; i < nb; ++i) codes[i] = int8::code_ref(kSigned, x[i] * r);
}

PSTAR_AVX2 __m256 dequant8(const float* map, const uint8_t* codes) {
  const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  return _mm256_i32gather_ps(map, idx, 4);
}

template <pstar_dtype D, bool kGradF32>
__attribute__((target("avx2,fma,f16c"))) void int8_run(const AdamStepConstants& c, const AdamStateRange& r) {
  const Consts k = make_consts(c);
  const bool oop = r.master_in != nullptr;
  float* const master = r.master;
  const float* const pi = oop ? r.master_in : master;
  const uint8_t* const mci = static_cast<const uint8_t*>(oop ? r.exp_avg_in.values : r.exp_avg.values);
  const uint8_t* const vci = static_cast<const uint8_t*>(oop ? r.exp_avg_sq_in.values : r.exp_avg_sq.values);
  const float* const mai = oop ? r.exp_avg_in.absmax : r.exp_avg.absmax;
  const float* const vai = oop ? r.exp_avg_sq_in.absmax : r.exp_avg_sq.absmax;
  uint8_t* const mco = static_cast<uint8_t*>(r.exp_avg.values);
  uint8_t* const vco = static_cast<uint8_t*>(r.exp_avg_sq.values);
  float* const mao = r.exp_avg.absmax;
  float* const vao = r.exp_avg_sq.absmax;
  void* const slot = r.slot;
  const float* const g32 = r.grad_f32;
  const size_t n = r.n;
  const int8::Map& smap = int8::signed_map();
  const int8::Map& umap = int8::unsigned_map();
  const QTab sq = load_qtab(smap), uq = load_qtab(umap);
  const __m256 sign_off = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  alignas(32) float mf[kInt8BlockElems];
  alignas(32) float vf[kInt8BlockElems];
  for (size_t b = 0; b * kInt8BlockElems < n; ++b) {
    const size_t off = b * kInt8BlockElems;
    const size_t nb = std::min(kInt8BlockElems, n - off);
    const float am_in = mai[b], av_in = vai[b];
    const __m256 vam_in = _mm256_set1_ps(am_in), vav_in = _mm256_set1_ps(av_in);
    __m256 accm = _mm256_setzero_ps(), accv = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= nb; i += 16) {
      const size_t e = off + i;
      prefetch_step<D, kGradF32>(pi, mci, vci, 1, g32, slot, e, 16, n);
      __m256 m0 = _mm256_mul_ps(dequant8(smap.values, mci + e), vam_in);
      __m256 m1 = _mm256_mul_ps(dequant8(smap.values, mci + e + 8), vam_in);
      __m256 v0 = _mm256_mul_ps(dequant8(umap.values, vci + e), vav_in);
      __m256 v1 = _mm256_mul_ps(dequant8(umap.values, vci + e + 8), vav_in);
      const __m256 g0 = load_grad<D, kGradF32>(g32, slot, e);
      const __m256 g1 = load_grad<D, kGradF32>(g32, slot, e + 8);
      __m256 p0 = _mm256_loadu_ps(pi + e), p1 = _mm256_loadu_ps(pi + e + 8);
      adam8_int8(k, g0, p0, m0, v0);
      adam8_int8(k, g1, p1, m1, v1);
      _mm256_storeu_ps(master + e, p0);
      _mm256_storeu_ps(master + e + 8, p1);
      emit16<D>(slot, e, p0, p1);
      _mm256_store_ps(mf + i, m0);
      _mm256_store_ps(mf + i + 8, m1);
      _mm256_store_ps(vf + i, v0);
      _mm256_store_ps(vf + i + 8, v1);
      accm = _mm256_max_ps(_mm256_and_ps(m0, sign_off), accm);
      accm = _mm256_max_ps(_mm256_and_ps(m1, sign_off), accm);
      accv = _mm256_max_ps(_mm256_and_ps(v0, sign_off), accv);
      accv = _mm256_max_ps(_mm256_and_ps(v1, sign_off), accv);
    }
    for (; i + 8 <= nb; i += 8) {
      const size_t e = off + i;
      __m256 m0 = _mm256_mul_ps(dequant8(smap.values, mci + e), vam_in);
      __m256 v0 = _mm256_mul_ps(dequant8(umap.values, vci + e), vav_in);
      const __m256 g0 = load_grad<D, kGradF32>(g32, slot, e);
      __m256 p0 = _mm256_loadu_ps(pi + e);
      adam8_int8(k, g0, p0, m0, v0);
      _mm256_storeu_ps(master + e, p0);
      emit8<D>(slot, e, p0);
      _mm256_store_ps(mf + i, m0);
      _mm256_store_ps(vf + i, v0);
      accm = _mm256_max_ps(_mm256_and_ps(m0, sign_off), accm);
      accv = _mm256_max_ps(_mm256_and_ps(v0, sign_off), accv);
    }
    float am = hmax8(accm), av = hmax8(accv);
    for (; i < nb; ++i) {
      const size_t e = off + i;
      const float g = kGradF32 ? g32[e] : load_as(slot, D, e);
      float p = pi[e], m = smap.values[mci[e]] * am_in, v = umap.values[vci[e]] * av_in;
      const float w = adam_element_int8(c, g, p, m, v);
      master[e] = p;
      store_as(slot, D, e, w);
      mf[i] = m;
      vf[i] = v;
      am = absmax_step(am, m);
      av = absmax_step(av, v);
    }
    mao[b] = am;
    vao[b] = av;
    quant_block<true>(sq, mf, nb, int8::inv_scale(am), mco + off);
    quant_block<false>(uq, vf, nb, int8::inv_scale(av), vco + off);
  }
}

template <bool kSigned>
__attribute__((target("avx2,fma,f16c"))) void encode(const float* x, size_t n, uint8_t* codes, float* absmax) {
  const QTab q = load_qtab(int8::map_of(kSigned));
  const __m256 sign_off = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (size_t b = 0; b * kInt8BlockElems < n; ++b) {
    const size_t off = b * kInt8BlockElems;
    const size_t nb = std::min(kInt8BlockElems, n - off);
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= nb; i += 8) acc = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + off + i), sign_off), acc);
    float a = hmax8(acc);
    for (; i < nb; ++i) a = absmax_step(a, x[off + i]);
    absmax[b] = a;
    quant_block<kSigned>(q, x + off, nb, int8::inv_scale(a), codes + off);
  }
}

#define PSTAR_S2_DISPATCH(FN)                                                                               \
  void FN##_dispatch(const AdamStepConstants& c, const AdamStateRange& r) {                                 \
    const bool g = r.grad_f32 != nullptr;                                                                   \
    switch (r.dtype) {                                                                                      \
      case PSTAR_DTYPE_F16: g ? FN<PSTAR_DTYPE_F16, true>(c, r) : FN<PSTAR_DTYPE_F16, false>(c, r); return; \
      case PSTAR_DTYPE_F32: g ? FN<PSTAR_DTYPE_F32, true>(c, r) : FN<PSTAR_DTYPE_F32, false>(c, r); return; \
      default: g ? FN<PSTAR_DTYPE_BF16, true>(c, r) : FN<PSTAR_DTYPE_BF16, false>(c, r); return;            \
    }                                                                                                       \
  }
PSTAR_S2_DISPATCH(bf16_run)
PSTAR_S2_DISPATCH(int8_run)
#undef PSTAR_S2_DISPATCH

}  // namespace

void adam_states_bf16_avx2(const AdamStepConstants& c, const AdamStateRange& r) { bf16_run_dispatch(c, r); }

void adam_states_int8_avx2(const AdamStepConstants& c, const AdamStateRange& r) { int8_run_dispatch(c, r); }

void int8_encode_avx2(bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax) {
  is_signed ? encode<true>(x, n, codes, absmax) : encode<false>(x, n, codes, absmax);
}

}  // namespace pstar::optim

#else  // not x86: never selected (adam_isa_supported says no)

namespace pstar::optim {
void adam_states_bf16_avx2(const AdamStepConstants&, const AdamStateRange&) {}
void adam_states_int8_avx2(const AdamStepConstants&, const AdamStateRange&) {}
void int8_encode_avx2(bool, const float*, size_t, uint8_t*, float*) {}
}  // namespace pstar::optim

#endif
