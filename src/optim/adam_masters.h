// Master weights in fewer bytes (issue 45): bf16 masters with stochastic
// rounding, opt-in beside the fp32 default.
//
// Formats:
//  - fp32: today's masters, 4 bytes per element.
//  - bf16: 2 bytes per element.  An update widens the bf16 master exactly,
//    runs the state format's fp32 update (adam_update_states) on it, and
//    rounds the new master back to bf16 stochastically: the 16 bits that
//    bf16 drops are compared with 16 random bits, so a value is rounded up
//    in magnitude with probability (dropped bits) / 2^16, and the expected
//    result is the fp32 value (Gupta et al., "Deep Learning with Limited
//    Numerical Precision", ICML 2015, section 3; Zamirai et al. 2020 on bf16
//    training with it).  Rounding to nearest instead would drop every update
//    smaller than half a bf16 ulp of the weight, which at lr 1e-4 is most of
//    them.  The compute-dtype weight is the compute dtype's rounding of the
//    new bf16 master (for a bf16 compute dtype, the master's bits), so the
//    model that trains is the model the masters hold.
//
// Deterministic: the random bits of an element are a function of the
// engine's seed, the step count and the element's place (its parameter and
// its offset in the parameter, which do not depend on the chunk layout, the
// placement, the capacity, the rank count or the thread split), so reruns
// and every placement give the same bits.  The update goes through fp32 tiles, so every state
// format's kernels (scalar, AVX2, AVX-512) serve it unchanged, and every
// path gives the same bits as the scalar one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pstar/pstar.h"
#include "util/dtype.h"

namespace pstar::optim {

enum class MasterFormat : uint8_t { kFp32 = 0, kBf16 = 1 };

// "fp32", "bf16"; "unknown" for another value.
const char* master_format_name(MasterFormat f);
// The C API's format as the kernels name it.
inline MasterFormat master_format_of(pstar_master_format f) {
  return f == PSTAR_MASTER_BF16 ? MasterFormat::kBf16 : MasterFormat::kFp32;
}

// Bytes of a master list of n elements: 4n (fp32) or 2n (bf16 bits).
inline size_t master_list_bytes(MasterFormat f, size_t n) { return n * (f == MasterFormat::kBf16 ? 2u : 4u); }

// The random bits of one step of one parameter.  `a` and `b` come from the
// seed, the step count and the parameter's index; an element's bits from
// them and its offset in the parameter (sr_bits).
struct SrStream {
  uint32_t a = 0, b = 0;
};
SrStream sr_stream(uint64_t seed, uint64_t step, uint64_t param);

// A 32-bit mixing function (a bijection: xor-shifts and odd multiplies, the
// constants of the "lowbias32" function found by C. Wellons'
// hash-prospector, 2018).
PSTAR_HD uint32_t sr_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The 32 random bits of the element at `offset` in its parameter.
PSTAR_HD uint32_t sr_bits(SrStream s, uint64_t offset) {
  return sr_mix32(sr_mix32(static_cast<uint32_t>(offset) ^ s.a) ^ s.b ^ static_cast<uint32_t>(offset >> 32));
}

// fp32 -> bf16, rounded stochastically with the low 16 bits of `bits`: the
// magnitude goes up one bf16 ulp when the dropped 16 bits plus the random
// ones carry.  As util/dtype.h's f32_to_bf16 otherwise: fp32 subnormal
// inputs become a signed zero, NaN stays NaN (quiet bit set), infinities
// stay; the largest finite values may round up to infinity.
PSTAR_HD uint16_t f32_to_bf16_stochastic(float f, uint32_t bits) {
  uint32_t x = f32_bits(f);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // NaN
  if (ax == 0x7f800000u) return static_cast<uint16_t>(x >> 16);             // infinity
  if ((x & 0x7f800000u) == 0) x &= 0x80000000u;                             // subnormal -> signed zero
  return static_cast<uint16_t>((x + (bits & 0xffffu)) >> 16);
}

// The bf16 masters of one range for the update (see AdamStateRange).
struct Bf16Masters {
  uint16_t* master = nullptr;           // n bf16 masters: the results
  const uint16_t* master_in = nullptr;  // out of place: the masters read
  SrStream stream;
  uint64_t offset = 0;  // the range's first element's offset in its parameter
};

// ---- master lists outside the update (values, checkpoints, restores) ------

// Elements [lo, lo + n) of a master list to fp32 (exact for both formats).
void masters_to_f32(MasterFormat f, const void* list, size_t lo, size_t n, float* out);
// From fp32: fp32 copies, bf16 rounds to nearest even (util/dtype.h: a
// value written by the caller or a checkpoint, not an update's result).
void masters_from_f32(MasterFormat f, void* list, size_t lo, size_t n, const float* in);
// From the compute dtype's values (a new parameter's initial master).
void masters_from_dtype(MasterFormat f, void* list, size_t lo, size_t n, const void* src, pstar_dtype dtype);
// The compute dtype's rounding of masters [lo, lo + n) into dst[0, n).
void masters_to_dtype(MasterFormat f, const void* list, size_t lo, size_t n, void* dst, pstar_dtype dtype);

}  // namespace pstar::optim
