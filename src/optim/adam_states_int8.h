// Internal to the int8 state format (optim/adam_states.h): the dynamic maps
// and the tables of the vector quantizers, shared by adam_states.cpp (the
// scalar reference) and the per-ISA files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "util/dtype.h"

namespace pstar::optim::int8 {

// Slot of a magnitude a in [0, 2): max(biased exponent - kOctaveBias, 0) / 2
// (rounded down), a pair of octaves.  Slot 0 holds every a below 2^-21
// (the lowest decision threshold of both maps is in it), slot k >= 1 holds
// [2^(2k-23), 2^(2k-21)), slot 11 holds [0.5, 2).  The vector paths compute
// it as ((bits(a) -sat16 (kOctaveBias << 23)) >> 24): a saturating 16-bit
// subtraction on the upper half of the float.
constexpr int kOctaveBias = 104;
constexpr int kSlots = 16;
// Decades: 0 = the code of zero, 1..7 = the map's decades 10^-6 .. 10^0,
// 8 = the code of 1.0.
constexpr int kDecades = 9;
// Half-width of the band around an integer u in which a lane takes the
// scalar search (the analysis in adam_states.cpp bounds the error of u by
// 1.1e-4 = 0.45 of it).
constexpr float kAmbiguity = 1.0f / 4096.0f;

// AVX2's slots: three octaves each, max(biased exponent - kOctaveBias, 0)
// / 3; slot 0 holds every a below 2^-20, slot k >= 1 holds
// [2^(3k-23), 2^(3k-20)), slot 7 holds [0.25, 2).  The vector path divides
// by 3 as a 16-bit multiply-high by 0x5556 (exact below 2^15).
constexpr int kSlots3 = 8;

inline int slot3_of(float a) {
  const int e = static_cast<int>(f32_bits(a) >> 23) - kOctaveBias;
  return e > 0 ? e / 3 : 0;
}

inline int slot_of(float a) {
  const int e = static_cast<int>(f32_bits(a) >> 23) - kOctaveBias;
  return e > 0 ? e >> 1 : 0;
}

struct alignas(64) Map {
  float values[256];  // the map, ascending
  // The map's bits split in 16-bit halves (AVX-512 lookups with VPERMI2W).
  uint16_t hi[256];
  uint16_t lo[256];
  // The map's bits in byte planes: planes[p][k] is byte p (little end
  // first) of values[k] (AVX512-VBMI lookups with VPERMI2B).
  alignas(64) uint8_t planes[4][256];
  // Magnitude thresholds: a is above threshold k when a >= thr[k] (the
  // smallest float greater than the exact midpoint).  Unsigned map: the 255
  // thresholds between codes k and k + 1.  Signed map: the 128 between the
  // codes of 0, 5.5e-7, ..., 0.99297, 1.0 (the positive side; the negative
  // side mirrors the first 127).  +inf beyond.
  float thr[256];
  int n_thr;
  // The fast path.  Per slot: the decade of the slot's smallest member and
  // the one decade boundary inside the slot (+inf if none).
  int32_t slot_dec[kSlots];
  float slot_cross[kSlots];
  // Per decade: the count of thresholds at or below a is
  // min(floor(a * dec_s + dec_olo + kAmbiguity), dec_last), exactly, unless
  // floor(a * dec_s + dec_olo) and floor(a * dec_s + dec_olo + 2 kAmbiguity)
  // differ (a lane near a threshold: the scalar search decides).
  float dec_s[16];
  float dec_olo[16];
  int32_t dec_last[16];
  // AVX2's fast path, whose VPERMD looks up eight entries: slots of three
  // octaves (slot3_of()), each with its decade and the one boundary of
  // decades 1..7 inside it, and the decades 0..7 of the tables above.  The
  // boundary of decade 8 (the code of 1.0) is top_cross: at or above it the
  // count is n_thr, one more than decade 7's last.
  int32_t slot3_dec[kSlots3];
  float slot3_cross[kSlots3];
  float top_cross;
};

// Built once (thread-safe static initialization on first use).
const Map& signed_map();
const Map& unsigned_map();
inline const Map& map_of(bool is_signed) { return is_signed ? signed_map() : unsigned_map(); }

// The magnitude a the quantizer searches: |y| for the signed map, y for the
// unsigned one, with NaN and negatives (unsigned) as 0.
inline float magnitude(bool is_signed, float y) {
  const float a = is_signed ? f32_from_bits(f32_bits(y) & 0x7fffffffu) : y;
  return a > 0.0f ? a : 0.0f;
}

// Number of thresholds at or below a (a >= thr[k]): binary search.
inline int count_below(const Map& m, float a) {
  int lo = 0, hi = m.n_thr;  // invariant: thr[k] <= a for k < lo, > a for k >= hi
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (a >= m.thr[mid]) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The code of a normalized value, from the magnitude's count.
inline uint8_t code_from_count(bool is_signed, float y, int k) {
  if (!is_signed) return static_cast<uint8_t>(k);
  if ((f32_bits(y) & 0x80000000u) != 0) return static_cast<uint8_t>(127 - (k < 127 ? k : 127));
  return static_cast<uint8_t>(127 + k);
}

inline uint8_t code_ref(bool is_signed, float y) {
  return code_from_count(is_signed, y, count_below(map_of(is_signed), magnitude(is_signed, y)));
}

// The block's reciprocal scale: 1 / absmax, or 0 for a block of zeros.
inline float inv_scale(float absmax) { return absmax > 0.0f ? 1.0f / absmax : 0.0f; }

// Out-of-line fix-up of the lanes a vector quantizer flagged: codes[l] for
// every set bit l of `lanes`, from x[l] * r.
void fix_lanes(bool is_signed, const float* x, float r, uint32_t lanes, uint8_t* codes);

// Whether the vector quantizers take a block of reciprocal scale r: every
// x * r then lies in [-1 - 2^-23, 1 + 2^-23] (or is NaN), inside their slots'
// range [0, 2).  Not for r = +inf, the reciprocal of a subnormal absmax:
// every nonzero x * r is +-inf, and such a block takes quant_block_scalar.
inline bool vector_scale(float r) { return r <= std::numeric_limits<float>::max(); }

// The AVX-512 kernel divides sqrt(v) by sqrt(1 - beta2^t) without the
// divider (adam_lanes_avx512.h, exact_div_sqrt_bc2), exactly except for
// v = +inf, where it gives NaN; for a block whose largest v is +inf it
// then sets those lanes' denominators to sqrt(+inf) / c + eps = +inf.
inline void inf_denominators(const float* v, size_t nb, float* denom) {
  for (size_t i = 0; i < nb; ++i) {
    if (v[i] == std::numeric_limits<float>::infinity()) denom[i] = v[i];
  }
}

// The scalar search for each of the block's nb values.
void quant_block_scalar(bool is_signed, const float* x, size_t nb, float r, uint8_t* codes);

}  // namespace pstar::optim::int8
