// The AVX-512 paths of the bf16 and int8 state formats (optim/adam_states.h):
// AVX-512 F, BW and VL (plus FMA and F16C), with AVX512-BF16's
// VCVTNEPS2BF16 for the bf16 emits where the CPU has it, and for int8 with
// AVX512-VBMI's byte permutes for the dequantization where the CPU has them.
//
// As in adam_avx512.cpp, the extensions are enabled per function, never for
// the file, and each kernel body is a macro instantiated twice (integer bf16
// rounding, and the instruction), because a target attribute cannot depend
// on a template parameter; the int8 body is instantiated twice more with
// VBMI's dequantization, so four int8 kernels.
//
// Arithmetic: adam_element()'s (int8: adam_element_int8()'s) operations in
// its order, one rounding each;
// conversions as util/dtype.h; the int8 quantizer as adam_states_int8.h
// (decade by octave, then the linear offset, the scalar search for the rare
// lane within kAmbiguity of a threshold).  Same bits as the scalar path.
#include "optim/adam_states.h"
#include "optim/adam_prefetch.h"
#include "optim/adam_states_int8.h"
#include "util/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's AVX-512 headers start unmasked operations from a self-initialized
// "undefined" vector, which -Wmaybe-uninitialized reports once inlined
// (GCC bug 105593); for VREDUCEPS's the report is -Wuninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>

#include "optim/adam_lanes_avx512.h"

namespace pstar::optim {

void adam_states_bf16_avx512(const AdamStepConstants& c, const AdamStateRange& r, bool native_bf16);
void adam_states_int8_avx512(const AdamStepConstants& c, const AdamStateRange& r, bool native_bf16, bool vbmi);
void int8_encode_avx512(bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax);

namespace {

using namespace lanes_avx512;

inline __mmask16 tail_mask16(size_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

// ---- int8: tables in registers ------------------------------------------------

// The quantizer's tables of one map (adam_states_int8.h), per slot and side
// of its crossing (index slot + 16 crossed, one two-source VPERMT2PS each):
// the scale, offset and last count of the decade there.  Built from the
// per-decade tables once per call; a lookup of the slot's decade before
// the three by decade took one permute more per 16 values (the whole
// kernel 1.02x, bench/int8_kernel_ab.py on the Intel dev machine,
// 2026-12-06).  last as floats, so that the clamp and the sign act on u
// before its one truncation.
struct QTab {
  __m512 slot_cross;
  __m512 s0, s1, olo0, olo1, last0, last1;  // below (0) and at or above (1) the slot's crossing
};

PSTAR_AVX512 QTab load_qtab(const int8::Map& m) {
  QTab q;
  const __m512i dec0 = _mm512_loadu_si512(m.slot_dec);
  const __m512i dec1 = _mm512_add_epi32(dec0, _mm512_set1_epi32(1));
  const __m512 s = _mm512_loadu_ps(m.dec_s);
  const __m512 olo = _mm512_loadu_ps(m.dec_olo);
  const __m512 last = _mm512_cvtepi32_ps(_mm512_loadu_si512(m.dec_last));
  q.slot_cross = _mm512_loadu_ps(m.slot_cross);
  q.s0 = _mm512_permutexvar_ps(dec0, s);
  q.s1 = _mm512_permutexvar_ps(dec1, s);
  q.olo0 = _mm512_permutexvar_ps(dec0, olo);
  q.olo1 = _mm512_permutexvar_ps(dec1, olo);
  q.last0 = _mm512_permutexvar_ps(dec0, last);
  q.last1 = _mm512_permutexvar_ps(dec1, last);
  return q;
}

// VREDUCEPS's immediate for u - floor(u): no fraction bits kept (imm[7:4] =
// 0), round down (imm[1:0] = 01), precision exception suppressed (imm[3]).
constexpr int kFracBelow = 0x09;

// The codes of sixteen normalized values y, as 32-bit lanes, less 127 for
// the signed map, which quant64 adds after its first pack (-128 for the
// code 0 of a negative y at -1.0, INT_MIN for a NaN y: the byte pack
// saturates both to 0); `amb` gets the lanes that must take the scalar search
// instead: those whose u_lo lies within 2 kAmbiguity below an integer (its
// fraction, exact from VREDUCEPS, at least 1 - 2 kAmbiguity; the bound in
// adam_states.cpp).  The count min(floor(u_lo), last) is
// floor(min(u_lo, last)) for an integer last, so the clamp and (signed) the
// sign are applied to u_lo in float, and one truncation gives the code.
// NaN: the signed map's compare is unordered, so a NaN lane (its u_lo is
// NaN) is ambiguous and takes the scalar search, which gives it magnitude
// 0.  The unsigned map: kGuard maps NaN and negatives to magnitude 0 as the
// scalar path does; without it a NaN lane's u_lo is NaN, min() keeps it
// (the NaN is the second operand), the truncation gives INT_MIN and the
// pack 0, the scalar path's unsigned code for NaN.  So the unsigned map may
// drop the guard for inputs that are NaN or at least +0 (v in the kernels:
// a product and sum of squares and non-negative map values).  A NaN lane's
// slot is out of range; the permutes read its low bits, any slot.
template <bool kSigned, bool kGuard>
PSTAR_AVX512 __m512i quant16(const QTab& q, __m512 y, __mmask16& amb) {
  __m512 a = kSigned ? _mm512_abs_ps(y) : y;
  if (!kSigned && kGuard) a = _mm512_max_ps(a, _mm512_setzero_ps());  // NaN and negatives: 0
  const __m512i slot =
      _mm512_srli_epi32(_mm512_subs_epu16(_mm512_castps_si512(a), _mm512_set1_epi32(int8::kOctaveBias << 23)), 24);
  const __m512 cross = _mm512_permutexvar_ps(slot, q.slot_cross);
  const __m512i idx = _mm512_mask_or_epi32(slot, _mm512_cmp_ps_mask(a, cross, _CMP_GE_OQ), slot, _mm512_set1_epi32(16));
  const __m512 s = _mm512_permutex2var_ps(q.s0, idx, q.s1);
  const __m512 olo = _mm512_permutex2var_ps(q.olo0, idx, q.olo1);
  const __m512 last = _mm512_permutex2var_ps(q.last0, idx, q.last1);
  const __m512 u_lo = _mm512_fmadd_ps(a, s, olo);
  amb = _mm512_cmp_ps_mask(_mm512_reduce_ps(u_lo, kFracBelow), _mm512_set1_ps(1.0f - 2 * int8::kAmbiguity),
                           kSigned ? _CMP_NLT_UQ : _CMP_GE_OQ);
  __m512 u = _mm512_min_ps(last, u_lo);
  if (kSigned) {  // -u for a negative y: the truncation gives -k (the code 127 - k)
    u = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(u), _mm512_castps_si512(y),
                                                      _mm512_set1_epi32(INT32_MIN), 0xf8));  // u | (y & sign)
  }
  return _mm512_cvttps_epi32(u);
}

// The dword order that puts the bytes of quant_block's packs (which work
// within 128-bit lanes: lane L holds elements 4 L..4 L + 3 of each of the
// four inputs) in element order.
alignas(64) const int32_t kPackOrder[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

// Quantizes 64 values, x * r (vr = r in every lane), into codes, packed
// with saturation (two VPACKSSDW, a VPACKUSWB and a permute for 64 codes,
// against four VPMOVDB; with the cheaper ambiguity test the whole kernel
// ran 1.05-1.10x faster on the Zen 4 dev machine, bench/int8_kernel_ab.py).
// kGuard: quant16's.
template <bool kSigned, bool kGuard = true>
PSTAR_AVX512 void quant64(const QTab& q, const float* x, __m512 vr, float r, uint8_t* codes) {
  __mmask16 a0, a1, a2, a3;
  const __m512i k0 = quant16<kSigned, kGuard>(q, _mm512_mul_ps(_mm512_loadu_ps(x), vr), a0);
  const __m512i k1 = quant16<kSigned, kGuard>(q, _mm512_mul_ps(_mm512_loadu_ps(x + 16), vr), a1);
  const __m512i k2 = quant16<kSigned, kGuard>(q, _mm512_mul_ps(_mm512_loadu_ps(x + 32), vr), a2);
  const __m512i k3 = quant16<kSigned, kGuard>(q, _mm512_mul_ps(_mm512_loadu_ps(x + 48), vr), a3);
  __m512i w01 = _mm512_packs_epi32(k0, k1), w23 = _mm512_packs_epi32(k2, k3);
  if (kSigned) {  // the code 127 + k, in the 16-bit lanes: half the additions
    w01 = _mm512_add_epi16(w01, _mm512_set1_epi16(127));
    w23 = _mm512_add_epi16(w23, _mm512_set1_epi16(127));
  }
  const __m512i b = _mm512_packus_epi16(w01, w23);
  _mm512_storeu_si512(codes, _mm512_permutexvar_epi32(_mm512_load_si512(kPackOrder), b));
  if ((a0 | a1 | a2 | a3) != 0) {
    if (a0 != 0) int8::fix_lanes(kSigned, x, r, a0, codes);
    if (a1 != 0) int8::fix_lanes(kSigned, x + 16, r, a1, codes + 16);
    if (a2 != 0) int8::fix_lanes(kSigned, x + 32, r, a2, codes + 32);
    if (a3 != 0) int8::fix_lanes(kSigned, x + 48, r, a3, codes + 48);
  }
}

// Quantizes nb (<= 256) values of one block, x * r, into codes: 64 at a
// time, then 16 at a time.  kGuard: quant16's.
template <bool kSigned, bool kGuard = true>
PSTAR_AVX512 void quant_block(const QTab& q, const float* x, size_t nb, float r, uint8_t* codes) {
  if (!int8::vector_scale(r)) return int8::quant_block_scalar(kSigned, x, nb, r, codes);
  const __m512 vr = _mm512_set1_ps(r);
  size_t i = 0;
  for (; i + 64 <= nb; i += 64) quant64<kSigned, kGuard>(q, x + i, vr, r, codes + i);
  for (; i < nb; i += 16) {
    const __mmask16 mask = tail_mask16(nb - i);
    __mmask16 amb;
    __m512i k = quant16<kSigned, kGuard>(q, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), vr), amb);
    if (kSigned) k = _mm512_add_epi32(k, _mm512_set1_epi32(127));
    k = _mm512_max_epi32(k, _mm512_setzero_si512());
    _mm_mask_storeu_epi8(codes + i, mask, _mm512_cvtepi32_epi8(k));
    amb &= mask;
    if (amb != 0) int8::fix_lanes(kSigned, x + i, r, amb, codes + i);
  }
}

// Dequantization tables of one map: its 16-bit halves, 64 entries per pair
// of registers.
struct DTab {
  const __m512i* hi;  // 8 vectors of 32 halves
  const __m512i* lo;
};

// The word order that makes VPUNPCKLWD / VPUNPCKHWD (which work within
// 128-bit lanes) produce elements 0..15 and 16..31 in order.
alignas(64) const uint16_t kUnpackOrder[32] = {0, 1, 2,  3,  16, 17, 18, 19, 4,  5,  6,  7,  20, 21, 22, 23,
                                               8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

PSTAR_AVX512 __m512i lookup_half(const __m512i* t, __m512i w, __mmask32 b6, __mmask32 b7) {
  const __m512i r0 = _mm512_permutex2var_epi16(_mm512_load_si512(t + 0), w, _mm512_load_si512(t + 1));
  const __m512i r1 = _mm512_permutex2var_epi16(_mm512_load_si512(t + 2), w, _mm512_load_si512(t + 3));
  const __m512i r2 = _mm512_permutex2var_epi16(_mm512_load_si512(t + 4), w, _mm512_load_si512(t + 5));
  const __m512i r3 = _mm512_permutex2var_epi16(_mm512_load_si512(t + 6), w, _mm512_load_si512(t + 7));
  return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1), _mm512_mask_blend_epi16(b6, r2, r3));
}

// map[code] for 32 codes: elements 0..15 in f0, 16..31 in f1.
PSTAR_AVX512 void dequant32(const DTab& t, __m256i codes, __m512& f0, __m512& f1) {
  __m512i w = _mm512_cvtepu8_epi16(codes);
  w = _mm512_permutexvar_epi16(_mm512_load_si512(kUnpackOrder), w);
  const __mmask32 b6 = _mm512_test_epi16_mask(w, _mm512_set1_epi16(64));
  const __mmask32 b7 = _mm512_test_epi16_mask(w, _mm512_set1_epi16(128));
  const __m512i h = lookup_half(t.hi, w, b6, b7);
  const __m512i l = lookup_half(t.lo, w, b6, b7);
  f0 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(l, h));
  f1 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(l, h));
}

// With AVX512-VBMI: the map in byte planes (int8::Map::planes), 128 entries
// per VPERMI2B, so 64 codes take 8 lookups, 4 merges and 8 unpacks (22
// instructions, against 40 for two dequant32).
#define PSTAR_AVX512VBMI_ISA PSTAR_AVX512_ISA ",avx512vbmi"
#define PSTAR_AVX512VBMIBF16_ISA PSTAR_AVX512BF16_ISA ",avx512vbmi"
#define PSTAR_AVX512VBMI __attribute__((target(PSTAR_AVX512VBMI_ISA), always_inline)) inline

// The byte order that makes dequant64's unpacks (which work within 128-bit
// lanes) give elements in order: the permuted codes hold at 16 L + 4 q + j
// the code of element 16 q + 4 L + j, and the q-th result's lane L gets
// positions 16 L + 4 q + 0..3.
alignas(64) const uint8_t kPlaneOrder[64] = {0,  1,  2,  3,  16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51,
                                             4,  5,  6,  7,  20, 21, 22, 23, 36, 37, 38, 39, 52, 53, 54, 55,
                                             8,  9,  10, 11, 24, 25, 26, 27, 40, 41, 42, 43, 56, 57, 58, 59,
                                             12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63};

// The floats whose bytes are b[0..3] (little end first), for codes
// permuted by kPlaneOrder: elements 16 q .. 16 q + 15 in out[q].
PSTAR_AVX512VBMI void interleave_planes(const __m512i b[4], __m512 out[4]) {
  const __m512i w01l = _mm512_unpacklo_epi8(b[0], b[1]), w01h = _mm512_unpackhi_epi8(b[0], b[1]);
  const __m512i w23l = _mm512_unpacklo_epi8(b[2], b[3]), w23h = _mm512_unpackhi_epi8(b[2], b[3]);
  out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01l, w23l));
  out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01l, w23l));
  out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01h, w23h));
  out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01h, w23h));
}

// map[code] for 64 codes: elements 16 q .. 16 q + 15 in out[q].
PSTAR_AVX512VBMI void dequant64(const uint8_t (*planes)[256], __m512i codes, __m512 out[4]) {
  const __m512i idx = _mm512_permutexvar_epi8(_mm512_load_si512(kPlaneOrder), codes);
  const __mmask64 upper = _mm512_movepi8_mask(idx);  // codes 128..255
  __m512i b[4];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const __m512i* t = reinterpret_cast<const __m512i*>(planes[p]);
    const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(t + 0), idx, _mm512_load_si512(t + 1));
    const __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(t + 2), idx, _mm512_load_si512(t + 3));
    b[p] = _mm512_mask_blend_epi8(upper, lo, hi);
  }
  interleave_planes(b, out);
}

// map[code] for the codes of one step of the int8 body (32 or 64 elements;
// fewer at a block's end, `left`), elements 16 q .. 16 q + 15 in out[q].
PSTAR_AVX512 void dequant_step32(const int8::Map& m, const uint8_t* codes, size_t left, __m512 out[2]) {
  const __mmask32 k = left >= 32 ? ~__mmask32{0} : (__mmask32{1} << left) - 1u;
  dequant32(DTab{reinterpret_cast<const __m512i*>(m.hi), reinterpret_cast<const __m512i*>(m.lo)},
            _mm256_maskz_loadu_epi8(k, codes), out[0], out[1]);
}

// The codes of one VBMI step: 64, or `left` at a block's end (zeros after).
PSTAR_AVX512VBMI __m512i load_codes64(const uint8_t* codes, size_t left) {
  const __mmask64 k = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1u;
  return _mm512_maskz_loadu_epi8(k, codes);
}

PSTAR_AVX512VBMI void dequant_step64(const int8::Map& m, const uint8_t* codes, size_t left, __m512 out[4]) {
  dequant64(m.planes, load_codes64(codes, left), out);
}

// The signed map's values for 64 codes, from the upper half of its planes
// alone: map[127 - k] = -map[127 + k] (k = 1..127), so code c >= 128 reads
// entry c - 128 of the upper half, c <= 126 reads entry 126 - c and flips
// the sign, and c = 127 (+0) is zeroed (int8::Map checks the symmetry when
// it builds the map).  Four VPERMT2B (two uops each on the Intel dev
// machine) instead of eight, and no merges: the whole kernel 1.03-1.04x
// (bench/int8_kernel_ab.py, 2026-12-06).
PSTAR_AVX512VBMI void dequant64_signed(const uint8_t (*planes)[256], __m512i codes, __m512 out[4]) {
  const __m512i c = _mm512_permutexvar_epi8(_mm512_load_si512(kPlaneOrder), codes);
  const __mmask64 pos = _mm512_movepi8_mask(c);  // codes 128..255
  const __mmask64 nz = _mm512_cmpneq_epi8_mask(c, _mm512_set1_epi8(127));
  const __mmask64 neg = _kandn_mask64(pos, nz);  // codes 0..126
  const __m512i idx = _mm512_mask_sub_epi8(c, neg, _mm512_set1_epi8(static_cast<char>(0xfe)), c);
  __m512i b[4];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const __m512i* t = reinterpret_cast<const __m512i*>(planes[p]);
    b[p] = _mm512_maskz_permutex2var_epi8(nz, _mm512_load_si512(t + 2), idx, _mm512_load_si512(t + 3));
  }
  b[3] = _mm512_mask_add_epi8(b[3], neg, b[3], _mm512_set1_epi8(static_cast<char>(0x80)));
  interleave_planes(b, out);
}

PSTAR_AVX512VBMI void dequant_step64_m(const int8::Map& m, const uint8_t* codes, size_t left, __m512 out[4]) {
  dequant64_signed(m.planes, load_codes64(codes, left), out);
}

// ---- kernel bodies -----------------------------------------------------------

// The weight's store into the slot, for the lanes of `mask` from element e.
#define PSTAR_AVX512_EMIT_W(BF16_EMIT, e, mask, p)                                        \
  do {                                                                                    \
    if (D == PSTAR_DTYPE_F32) {                                                           \
      _mm512_mask_storeu_ps(static_cast<float*>(slot) + (e), (mask), (p));                \
    } else if (D == PSTAR_DTYPE_F16) {                                                    \
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(slot) + (e), (mask),                \
                               _mm512_cvtps_ph((p), _MM_FROUND_TO_NEAREST_INT));          \
    } else {                                                                              \
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(slot) + (e), (mask), BF16_EMIT(p)); \
    }                                                                                     \
  } while (0)

// The same for all sixteen lanes, unmasked.
#define PSTAR_AVX512_STORE_W(BF16_EMIT, e, p)                                                            \
  do {                                                                                                   \
    if (D == PSTAR_DTYPE_F32) {                                                                          \
      _mm512_storeu_ps(static_cast<float*>(slot) + (e), (p));                                            \
    } else if (D == PSTAR_DTYPE_F16) {                                                                   \
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(slot) + (e)),                \
                          _mm512_cvtps_ph((p), _MM_FROUND_TO_NEAREST_INT));                              \
    } else {                                                                                             \
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(slot) + (e)), BF16_EMIT(p)); \
    }                                                                                                    \
  } while (0)

#define PSTAR_AVX512_BF16_BODY(BF16_EMIT)                                                                      \
  const Consts k = make_consts(c);                                                                             \
  const bool oop = r.master_in != nullptr;                                                                     \
  float* const master = r.master;                                                                              \
  const float* const pi = oop ? r.master_in : master;                                                          \
  const uint16_t* const mi = static_cast<const uint16_t*>(oop ? r.exp_avg_in.values : r.exp_avg.values);       \
  const uint16_t* const vi = static_cast<const uint16_t*>(oop ? r.exp_avg_sq_in.values : r.exp_avg_sq.values); \
  uint16_t* const mo = static_cast<uint16_t*>(r.exp_avg.values);                                               \
  uint16_t* const vo = static_cast<uint16_t*>(r.exp_avg_sq.values);                                            \
  void* const slot = r.slot;                                                                                   \
  const float* const g32 = r.grad_f32;                                                                         \
  const size_t n = r.n;                                                                                        \
  size_t i = 0;                                                                                                \
  for (; i + 32 <= n; i += 32) {                                                                               \
    prefetch_step<D, kGradF32>(pi, mi, vi, sizeof(uint16_t), g32, slot, i, 32, n);                             \
    const __m512 g0 = load_grad_full<D, kGradF32>(g32, slot, i);                                               \
    const __m512 g1 = load_grad_full<D, kGradF32>(g32, slot, i + 16);                                          \
    __m512 p0 = _mm512_loadu_ps(pi + i), p1 = _mm512_loadu_ps(pi + i + 16);                                    \
    __m512 m0 = widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mi + i)));                      \
    __m512 m1 = widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mi + i + 16)));                 \
    __m512 v0 = widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vi + i)));                      \
    __m512 v1 = widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(vi + i + 16)));                 \
    adam16(k, g0, p0, m0, v0);                                                                                 \
    adam16(k, g1, p1, m1, v1);                                                                                 \
    _mm512_storeu_ps(master + i, p0);                                                                          \
    _mm512_storeu_ps(master + i + 16, p1);                                                                     \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mo + i), BF16_EMIT(m0));                                    \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mo + i + 16), BF16_EMIT(m1));                               \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(vo + i), BF16_EMIT(v0));                                    \
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(vo + i + 16), BF16_EMIT(v1));                               \
    PSTAR_AVX512_STORE_W(BF16_EMIT, i, p0);                                                                    \
    PSTAR_AVX512_STORE_W(BF16_EMIT, i + 16, p1);                                                               \
  }                                                                                                            \
  for (; i < n; i += 16) {                                                                                     \
    const __mmask16 mask = tail_mask16(n - i);                                                                 \
    const __m512 g = load_grad<D, kGradF32>(g32, slot, i, mask);                                               \
    __m512 p = _mm512_maskz_loadu_ps(mask, pi + i);                                                            \
    __m512 m = widen_bf16(_mm256_maskz_loadu_epi16(mask, mi + i));                                             \
    __m512 v = widen_bf16(_mm256_maskz_loadu_epi16(mask, vi + i));                                             \
    adam16(k, g, p, m, v);                                                                                     \
    _mm512_mask_storeu_ps(master + i, mask, p);                                                                \
    _mm256_mask_storeu_epi16(mo + i, mask, BF16_EMIT(m));                                                      \
    _mm256_mask_storeu_epi16(vo + i, mask, BF16_EMIT(v));                                                      \
    PSTAR_AVX512_EMIT_W(BF16_EMIT, i, mask, p);                                                                \
  }

// VRANGEPS's immediate for max(|a|, |b|) with the sign cleared (imm[1:0] =
// 11, imm[3:2] = 10): the block maximum of |m| in one instruction per 16
// elements where an abs and a max took two (the whole kernel 1.007-1.016x,
// bench/int8_kernel_ab.py on the Intel dev machine, 2026-12-07).  Like the
// max it replaces, VRANGEPS returns the other operand for a quiet NaN, so
// a NaN m does not count (m is an FMA's result: never a signalling NaN).
constexpr int kRangeAbsMax = 0x0b;

// One group of 16 lanes of the int8 body's pass 1A: lanes q of the step at
// i (a mask of all ones for a whole group, which the compiler folds).
#define PSTAR_AVX512_INT8_MOMENTS(q, KQ)                                           \
  do {                                                                             \
    const size_t e = off + i + 16 * (q);                                           \
    const __mmask16 kq = (KQ);                                                     \
    __m512 m = _mm512_mul_ps(mq[q], am_in), v = _mm512_mul_ps(vq[q], av_in), g, p; \
    if (kq == 0xffff) {                                                            \
      g = load_grad_full<D, kGradF32>(g32, slot, e);                               \
      p = _mm512_loadu_ps(pi + e);                                                 \
    } else {                                                                       \
      g = load_grad<D, kGradF32>(g32, slot, e, kq);                                \
      p = _mm512_maskz_loadu_ps(kq, pi + e);                                       \
    }                                                                              \
    const __m512 denom = adam16_int8_moments<kUnitGradMul>(k, g, p, m, v);         \
    _mm512_store_ps(mf + i + 16 * (q), m);                                         \
    _mm512_store_ps(vf + i + 16 * (q), v);                                         \
    _mm512_store_ps(df + i + 16 * (q), denom);                                     \
    accm = _mm512_mask_range_ps(accm, kq, accm, m, kRangeAbsMax);                  \
    accv = _mm512_mask_max_ps(accv, kq, v, accv); /* v: +0 or more, or NaN */      \
  } while (0)

// Pass 1B on the 16 lanes of `kq` from element j of the block: the master
// from the old one, the new m and the denominator.
#define PSTAR_AVX512_INT8_MASTER(BF16_EMIT, j, KQ)                                                  \
  do {                                                                                              \
    const size_t e = off + (j);                                                                     \
    const __mmask16 kq = (KQ);                                                                      \
    const __m512 p0 = kq == 0xffff ? _mm512_loadu_ps(pi + e) : _mm512_maskz_loadu_ps(kq, pi + e);   \
    const __m512 p = adam16_int8_master(k, p0, _mm512_load_ps(mf + (j)), _mm512_load_ps(df + (j))); \
    if (kq == 0xffff) { /* unmasked: a masked store is slow on some CPUs (AMD Zen 4) */             \
      _mm512_storeu_ps(master + e, p);                                                              \
      PSTAR_AVX512_STORE_W(BF16_EMIT, e, p);                                                        \
    } else {                                                                                        \
      _mm512_mask_storeu_ps(master + e, kq, p);                                                     \
      PSTAR_AVX512_EMIT_W(BF16_EMIT, e, kq, p);                                                     \
    }                                                                                               \
  } while (0)

// int8, block by block, in three passes over each block's elements:
//  1A dequantizes STEP elements at a time (DEQUANT_M, DEQUANT_V), updates m
//     and v 16 at a time and keeps them in fp32 with the denominator (its
//     square root is one division-unit instruction per 16 elements) and
//     the block maxima;
//  1B divides and writes the masters (the other division-unit
//     instruction);
//  2  quantizes m and v.
// Pass 2 of a block runs with pass 1B of the next, 64 elements of each in
// turn, where both are whole blocks (two buffers of m and v): 1B is bound
// by the divider and 2 by the shuffle and FMA ports, so each fills the
// other's idle units, and the block maxima and reciprocals pass 2 waits
// on are long done.  Against one pass 1 that divided too, with pass 2 of
// the block before after it: the whole kernel 1.04-1.06x
// (bench/int8_kernel_ab.py on the Intel dev machine, 2026-12-06; the
// division unit's two instructions per 16 elements took about 24 cycles
// there, the ports' work about 45).  In place, a block's codes are read in its own pass 1A
// before its pass 2 writes them, and its masters in 1A and 1B before 1B
// writes them.
#define PSTAR_AVX512_INT8_BODY(BF16_EMIT, STEP, DEQUANT_M, DEQUANT_V)                                               \
  const Consts k = make_consts(c);                                                                                  \
  const bool oop = r.master_in != nullptr;                                                                          \
  float* const master = r.master;                                                                                   \
  const float* const pi = oop ? r.master_in : master;                                                               \
  const uint8_t* const mci = static_cast<const uint8_t*>(oop ? r.exp_avg_in.values : r.exp_avg.values);             \
  const uint8_t* const vci = static_cast<const uint8_t*>(oop ? r.exp_avg_sq_in.values : r.exp_avg_sq.values);       \
  const float* const mai = oop ? r.exp_avg_in.absmax : r.exp_avg.absmax;                                            \
  const float* const vai = oop ? r.exp_avg_sq_in.absmax : r.exp_avg_sq.absmax;                                      \
  uint8_t* const mco = static_cast<uint8_t*>(r.exp_avg.values);                                                     \
  uint8_t* const vco = static_cast<uint8_t*>(r.exp_avg_sq.values);                                                  \
  float* const mao = r.exp_avg.absmax;                                                                              \
  float* const vao = r.exp_avg_sq.absmax;                                                                           \
  void* const slot = r.slot;                                                                                        \
  const float* const g32 = r.grad_f32;                                                                              \
  const size_t n = r.n;                                                                                             \
  const int8::Map& smap = int8::signed_map();                                                                       \
  const int8::Map& umap = int8::unsigned_map();                                                                     \
  const QTab sq = load_qtab(smap);                                                                                  \
  const QTab uq = load_qtab(umap);                                                                                  \
  alignas(64) float mfs[2][kInt8BlockElems];                                                                        \
  alignas(64) float vfs[2][kInt8BlockElems];                                                                        \
  alignas(64) float df[kInt8BlockElems];                                                                            \
  size_t q_off = 0, q_nb = 0; /* the block pass 2 owes: its offset and size (none while 0) */                       \
  float q_rm = 0.0f, q_rv = 0.0f;                                                                                   \
  for (size_t b = 0; b * kInt8BlockElems < n; ++b) {                                                                \
    float* const mf = mfs[b & 1];                                                                                   \
    float* const vf = vfs[b & 1];                                                                                   \
    const size_t off = b * kInt8BlockElems;                                                                         \
    const size_t nb = std::min(kInt8BlockElems, n - off);                                                           \
    const __m512 am_in = _mm512_set1_ps(mai[b]);                                                                    \
    const __m512 av_in = _mm512_set1_ps(vai[b]);                                                                    \
    __m512 accm = _mm512_setzero_ps(), accv = _mm512_setzero_ps();                                                  \
    for (size_t i = 0; i < nb; i += (STEP)) {                                                                       \
      const size_t left = nb - i;                                                                                   \
      __m512 mq[(STEP) / 16], vq[(STEP) / 16];                                                                      \
      prefetch_step<D, kGradF32, kInt8PrefetchAheadElems>(pi, mci, vci, 1, g32, slot, off + i, (STEP), n);          \
      if (left >= (STEP)) { /* a whole step: constant masks, unrolled */                                            \
        DEQUANT_M(smap, mci + off + i, (STEP), mq);                                                                 \
        DEQUANT_V(umap, vci + off + i, (STEP), vq);                                                                 \
        _Pragma("GCC unroll 4") for (size_t q = 0; q < (STEP) / 16; ++q) {                                          \
          PSTAR_AVX512_INT8_MOMENTS(q, static_cast<__mmask16>(0xffff));                                             \
        }                                                                                                           \
      } else {                                                                                                      \
        DEQUANT_M(smap, mci + off + i, left, mq);                                                                   \
        DEQUANT_V(umap, vci + off + i, left, vq);                                                                   \
        for (size_t q = 0; 16 * q < left; ++q) {                                                                    \
          PSTAR_AVX512_INT8_MOMENTS(q, tail_mask16(left - 16 * q));                                                 \
        }                                                                                                           \
      }                                                                                                             \
    }                                                                                                               \
    const float am = _mm512_reduce_max_ps(accm), av = _mm512_reduce_max_ps(accv);                                   \
    mao[b] = am;                                                                                                    \
    vao[b] = av;                                                                                                    \
    if (av == std::numeric_limits<float>::infinity()) int8::inf_denominators(vf, nb, df);                           \
    float* const qmf = mfs[(b & 1) ^ 1];                                                                            \
    float* const qvf = vfs[(b & 1) ^ 1];                                                                            \
    if (q_nb == kInt8BlockElems && nb == kInt8BlockElems && int8::vector_scale(q_rm) && int8::vector_scale(q_rv)) { \
      const __m512 vrm = _mm512_set1_ps(q_rm), vrv = _mm512_set1_ps(q_rv);                                          \
      for (size_t j = 0; j < kInt8BlockElems; j += 64) {                                                            \
        quant64<true>(sq, qmf + j, vrm, q_rm, mco + q_off + j);                                                     \
        PSTAR_AVX512_INT8_MASTER(BF16_EMIT, j, static_cast<__mmask16>(0xffff));                                     \
        PSTAR_AVX512_INT8_MASTER(BF16_EMIT, j + 16, static_cast<__mmask16>(0xffff));                                \
        quant64<false, false>(uq, qvf + j, vrv, q_rv, vco + q_off + j);                                             \
        PSTAR_AVX512_INT8_MASTER(BF16_EMIT, j + 32, static_cast<__mmask16>(0xffff));                                \
        PSTAR_AVX512_INT8_MASTER(BF16_EMIT, j + 48, static_cast<__mmask16>(0xffff));                                \
      }                                                                                                             \
    } else {                                                                                                        \
      for (size_t j = 0; j < nb; j += 16) PSTAR_AVX512_INT8_MASTER(BF16_EMIT, j, tail_mask16(nb - j));              \
      if (q_nb != 0) {                                                                                              \
        quant_block<true>(sq, qmf, q_nb, q_rm, mco + q_off);                                                        \
        quant_block<false, false>(uq, qvf, q_nb, q_rv, vco + q_off);                                                \
      }                                                                                                             \
    }                                                                                                               \
    q_off = off, q_nb = nb, q_rm = int8::inv_scale(am), q_rv = int8::inv_scale(av);                                 \
  }                                                                                                                 \
  if (q_nb != 0) {                                                                                                  \
    const size_t last = (q_off / kInt8BlockElems) & 1;                                                              \
    quant_block<true>(sq, mfs[last], q_nb, q_rm, mco + q_off);                                                      \
    quant_block<false, false>(uq, vfs[last], q_nb, q_rv, vco + q_off);                                              \
  }

template <pstar_dtype D, bool kGradF32>
__attribute__((target(PSTAR_AVX512_ISA))) void bf16_int(const AdamStepConstants& c, const AdamStateRange& r) {
  PSTAR_AVX512_BF16_BODY(bf16_int16)
}

template <pstar_dtype D, bool kGradF32>
__attribute__((target(PSTAR_AVX512BF16_ISA))) void bf16_native(const AdamStepConstants& c, const AdamStateRange& r) {
  PSTAR_AVX512_BF16_BODY(bf16_native16)
}

template <pstar_dtype D, bool kGradF32, bool kUnitGradMul>
__attribute__((target(PSTAR_AVX512_ISA))) void int8_int(const AdamStepConstants& c, const AdamStateRange& r) {
  PSTAR_AVX512_INT8_BODY(bf16_int16, 32, dequant_step32, dequant_step32)
}

template <pstar_dtype D, bool kGradF32, bool kUnitGradMul>
__attribute__((target(PSTAR_AVX512BF16_ISA))) void int8_native(const AdamStepConstants& c, const AdamStateRange& r) {
  PSTAR_AVX512_INT8_BODY(bf16_native16, 32, dequant_step32, dequant_step32)
}

template <pstar_dtype D, bool kGradF32, bool kUnitGradMul>
__attribute__((target(PSTAR_AVX512VBMI_ISA))) void int8_vbmi_int(const AdamStepConstants& c, const AdamStateRange& r) {
  PSTAR_AVX512_INT8_BODY(bf16_int16, 64, dequant_step64_m, dequant_step64)
}

template <pstar_dtype D, bool kGradF32, bool kUnitGradMul>
__attribute__((target(PSTAR_AVX512VBMIBF16_ISA))) void int8_vbmi_native(const AdamStepConstants& c,
                                                                        const AdamStateRange& r) {
  PSTAR_AVX512_INT8_BODY(bf16_native16, 64, dequant_step64_m, dequant_step64)
}

#undef PSTAR_AVX512_BF16_BODY
#undef PSTAR_AVX512_INT8_BODY
#undef PSTAR_AVX512_INT8_MOMENTS
#undef PSTAR_AVX512_INT8_MASTER
#undef PSTAR_AVX512_EMIT_W
#undef PSTAR_AVX512_STORE_W

template <bool kSigned>
__attribute__((target(PSTAR_AVX512_ISA))) void encode(const float* x, size_t n, uint8_t* codes, float* absmax) {
  const QTab q = load_qtab(int8::map_of(kSigned));
  for (size_t b = 0; b * kInt8BlockElems < n; ++b) {
    const size_t off = b * kInt8BlockElems;
    const size_t nb = std::min(kInt8BlockElems, n - off);
    __m512 acc = _mm512_setzero_ps();
    for (size_t i = 0; i < nb; i += 16) {
      const __mmask16 mask = tail_mask16(nb - i);
      acc = _mm512_mask_max_ps(acc, mask, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask, x + off + i)), acc);
    }
    const float a = _mm512_reduce_max_ps(acc);
    absmax[b] = a;
    quant_block<kSigned>(q, x + off, nb, int8::inv_scale(a), codes + off);
  }
}

// Instantiates FN<D, kGradF32> for the range's dtype and gradient source.
#define PSTAR_AVX512_DISPATCH(FN)                                                                           \
  void FN##_dispatch(const AdamStepConstants& c, const AdamStateRange& r) {                                 \
    const bool g = r.grad_f32 != nullptr;                                                                   \
    switch (r.dtype) {                                                                                      \
      case PSTAR_DTYPE_F16: g ? FN<PSTAR_DTYPE_F16, true>(c, r) : FN<PSTAR_DTYPE_F16, false>(c, r); return; \
      case PSTAR_DTYPE_F32: g ? FN<PSTAR_DTYPE_F32, true>(c, r) : FN<PSTAR_DTYPE_F32, false>(c, r); return; \
      default: g ? FN<PSTAR_DTYPE_BF16, true>(c, r) : FN<PSTAR_DTYPE_BF16, false>(c, r); return;            \
    }                                                                                                       \
  }

// The int8 kernels also by whether grad_mul is 1 (adam16_int8's
// kUnitGradMul: bf16 training without loss scaling or clipping; one
// multiply fewer per 16 elements), then by dtype and gradient source as
// the others.
#define PSTAR_AVX512_BY_GRAD_MUL(FN)                                                 \
  template <pstar_dtype D, bool kGradF32>                                            \
  void FN##_by_grad_mul(const AdamStepConstants& c, const AdamStateRange& r) {       \
    c.grad_mul == 1.0f ? FN<D, kGradF32, true>(c, r) : FN<D, kGradF32, false>(c, r); \
  }
PSTAR_AVX512_BY_GRAD_MUL(int8_int)
PSTAR_AVX512_BY_GRAD_MUL(int8_native)
PSTAR_AVX512_BY_GRAD_MUL(int8_vbmi_int)
PSTAR_AVX512_BY_GRAD_MUL(int8_vbmi_native)
#undef PSTAR_AVX512_BY_GRAD_MUL

PSTAR_AVX512_DISPATCH(bf16_int)
PSTAR_AVX512_DISPATCH(bf16_native)
PSTAR_AVX512_DISPATCH(int8_int_by_grad_mul)
PSTAR_AVX512_DISPATCH(int8_native_by_grad_mul)
PSTAR_AVX512_DISPATCH(int8_vbmi_int_by_grad_mul)
PSTAR_AVX512_DISPATCH(int8_vbmi_native_by_grad_mul)
#undef PSTAR_AVX512_DISPATCH

}  // namespace

void adam_states_bf16_avx512(const AdamStepConstants& c, const AdamStateRange& r, bool native_bf16) {
  // Only the bf16 emits differ between the two bodies: fp32 and fp16 slots
  // with bf16 moments still emit m and v as bf16.
  native_bf16 ? bf16_native_dispatch(c, r) : bf16_int_dispatch(c, r);
}

void adam_states_int8_avx512(const AdamStepConstants& c, const AdamStateRange& r, bool native_bf16, bool vbmi) {
  const bool native = native_bf16 && r.dtype == PSTAR_DTYPE_BF16;
  if (vbmi) {
    native ? int8_vbmi_native_by_grad_mul_dispatch(c, r) : int8_vbmi_int_by_grad_mul_dispatch(c, r);
  } else {
    native ? int8_native_by_grad_mul_dispatch(c, r) : int8_int_by_grad_mul_dispatch(c, r);
  }
}

void int8_encode_avx512(bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax) {
  is_signed ? encode<true>(x, n, codes, absmax) : encode<false>(x, n, codes, absmax);
}

}  // namespace pstar::optim

#else  // not x86: never selected (adam_isa_supported says no)

namespace pstar::optim {
void adam_states_bf16_avx512(const AdamStepConstants&, const AdamStateRange&, bool) {}
void adam_states_int8_avx512(const AdamStepConstants&, const AdamStateRange&, bool, bool) {}
void int8_encode_avx512(bool, const float*, size_t, uint8_t*, float*) {}
}  // namespace pstar::optim

#endif
