// Adam moment lists in fewer bytes (issue 45): a state format per list, and
// the fused update over a range whose moments are stored in that format.
//
// Formats (the master stays fp32 in all three):
//  - fp32: today's lists; adam_update_states() calls adam_update() and gives
//    the same bits as before.
//  - bf16: m and v stored as bf16 (util/dtype.h's rounding: to nearest even,
//    fp32 subnormals to signed zero, NaN kept quiet).  Each update widens
//    them exactly, performs adam_element() in fp32, and rounds the new m and
//    v; the master's step uses the new m and v before that rounding.
//  - int8: blockwise dynamic quantization (Dettmers, Lewis, Shleifer and
//    Zettlemoyer, "8-bit Optimizers via Block-wise Quantization", ICLR 2022).
//    m uses the signed dynamic map, v the unsigned one (256 codes each, the
//    values bitsandbytes' create_dynamic_map() builds, bit for bit); every
//    block of kInt8BlockElems elements carries one fp32 absmax per moment.
//    An update dequantizes (map[code] * absmax, one fp32 product), performs
//    adam_element_int8() in fp32 (Adam in the order of operations of
//    bitsandbytes' CPU AdamW8bit; the master's step uses these fp32 moments,
//    before quantization), takes the new absmax of each block from the new
//    fp32 values, and stores the code nearest to value * (1 / absmax).
//    Section 2 of the paper and docs/design.md give the details; the int8
//    notes at the end of this file give the exact rule.
//
// Every instruction-set path gives the same bits as the scalar reference in
// every format (tests/unit/test_adam_states.cpp demands exactly that).
//
// A zero-filled list is a zero state in every format (int8: code 0 with
// absmax 0 decodes to -0.993 * 0 = -0 for m and to 0 for v).
#pragma once

#include <cstddef>
#include <cstdint>

#include "optim/adam.h"
#include "optim/adam_kernel.h"
#include "optim/adam_masters.h"
#include "pstar/pstar.h"

namespace pstar::optim {

enum class StateFormat : uint8_t { kFp32 = 0, kBf16 = 1, kInt8 = 2 };

// "fp32", "bf16", "int8"; "unknown" for another value.
const char* state_format_name(StateFormat f);
// Parses a name above; false (and *out untouched) for anything else.
bool parse_state_format(const char* s, StateFormat* out);

// Elements per absmax block of the int8 format: the block size of
// bitsandbytes' blockwise 8-bit optimizers (BLOCKSIZE_2STATE in its
// csrc/ops.cu, blocksize = 256 in bitsandbytes/optim/optimizer.py and in
// its CPU backend's optimizer_update_8bit_blockwise).
constexpr size_t kInt8BlockElems = 256;
// Byte alignment of the absmax array inside an int8 list.
constexpr size_t kInt8AbsmaxAlign = 64;

constexpr size_t int8_blocks(size_t n) { return (n + kInt8BlockElems - 1) / kInt8BlockElems; }
// Where an int8 list of n elements keeps its absmax array: after the n code
// bytes, rounded up to kInt8AbsmaxAlign.
constexpr size_t int8_absmax_offset(size_t n) {
  return (n + kInt8AbsmaxAlign - 1) / kInt8AbsmaxAlign * kInt8AbsmaxAlign;
}

// Bytes of one moment list of n elements, laid out in one buffer: fp32 n
// floats; bf16 n uint16 (bf16 bits); int8 n code bytes, then the absmax
// array (int8_blocks(n) floats) at int8_absmax_offset(n).
size_t moment_list_bytes(StateFormat f, size_t n);

// Bytes moved per element by one update in format f with gradients in the
// compute-dtype slot of `dtype` (or from an fp32 list): the gradient read,
// the master, m and v read and written, the weight written (int8 counts the
// absmax arrays' share).  fp32 with a 2-byte dtype: 28; bf16: 20; int8:
// 16.0625.  For bound fractions.
double adam_state_bytes_per_elem(StateFormat f, pstar_dtype dtype, bool grad_f32);

// One moment list of a range, in its format.  int8: `values` is the code of
// the range's first element and `absmax` the absmax of its first block.
struct MomentList {
  void* values = nullptr;   // fp32: float*; bf16: uint16_t*; int8: uint8_t* codes
  float* absmax = nullptr;  // int8 only
};
struct ConstMomentList {
  const void* values = nullptr;
  const float* absmax = nullptr;
};

// The list of the range that starts at element `offset` of a whole list
// buffer of `n_total` elements (moment_list_bytes(f, n_total) bytes).  int8:
// `offset` must be a multiple of kInt8BlockElems (an internal error if not).
MomentList moment_list_at(StateFormat f, void* buffer, size_t n_total, size_t offset);
ConstMomentList moment_list_at(StateFormat f, const void* buffer, size_t n_total, size_t offset);

// A range of one parameter, as AdamRange with format-typed moments.
// CONTRACT (int8): the range starts on a block boundary of its parameter;
// n is arbitrary, and the last partial block's absmax covers only its
// n % kInt8BlockElems elements (so the engine aligns each int8 parameter's
// lists, and any split of a parameter into ranges, to the block size).
struct AdamStateRange {
  float* master = nullptr;  // n fp32 master weights: the results
  MomentList exp_avg;       // first moments (signed map for int8): the results
  MomentList exp_avg_sq;    // second moments (unsigned map for int8): the results
  // Out of place, as AdamRange: when master_in is set, the update reads
  // master_in, exp_avg_in and exp_avg_sq_in (all three set) and writes the
  // lists above; the inputs are left untouched.
  const float* master_in = nullptr;
  ConstMomentList exp_avg_in;
  ConstMomentList exp_avg_sq_in;
  // The compute-dtype slot: the gradient on entry unless grad_f32 is set,
  // the new weight on exit.
  void* slot = nullptr;
  pstar_dtype dtype = PSTAR_DTYPE_BF16;
  const float* grad_f32 = nullptr;  // separate fp32 gradient list, or NULL
  size_t n = 0;
  // bf16 masters (adam_masters.h): when bf16.master is set, `master` and
  // `master_in` are unused and the masters are bf16.master (in place) or
  // bf16.master_in -> bf16.master (out of place, with the moments' inputs).
  Bf16Masters bf16;
};

// Updates one range on the calling thread with the given instruction set
// (which must be supported: adam_isa_supported).  fp32 is adam_update();
// with bf16 masters, adam_update_bf16_masters().
void adam_update_states(AdamIsa isa, StateFormat f, const AdamStepConstants& c, const AdamStateRange& r);
// The update with bf16 masters (r.bf16.master set): tiles of the range are
// widened to fp32, updated by adam_update_states, rounded stochastically
// back (adam_masters.h), and the weight re-emitted from the new masters.
void adam_update_bf16_masters(AdamIsa isa, StateFormat f, const AdamStepConstants& c, const AdamStateRange& r);

// ---- int8 lists outside the update (checkpoints, conversions, tests) -------

// The dynamic map: 256 sorted values in [-1, 1] (signed: -0.99297 .. 1, the
// code of 0 is 127) or [0, 1] (unsigned: the code of 0 is 0).
const float* int8_dynamic_map(bool is_signed);

// The code of one normalized value y (the scalar reference of every path):
// the index of the map value nearest to y.  A tie goes to the value of the
// smaller magnitude; NaN gives the code of 0; the unsigned map takes y <= 0
// as 0; the signed map's negative side ends at -0.99297, whose code 0 takes
// every y below it.
uint8_t int8_code(bool is_signed, float y);

// Blockwise encode of n values (the first on a block boundary): absmax[b] =
// the largest |x| of block b (NaN never wins; 0 for a block of zeros), and
// codes[i] = int8_code(x[i] * (1 / absmax)) (a factor of 0 where absmax is
// 0).  The same bits as the update's quantization, on every path.
void int8_encode(AdamIsa isa, bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax);
// Blockwise decode: out[i] = map[codes[i]] * absmax[i / kInt8BlockElems].
void int8_decode(bool is_signed, const uint8_t* codes, const float* absmax, size_t n, float* out);

// Whole lists to and from fp32 (checkpoints, conversions): elements
// [lo, lo + n) of a list of n_total elements laid out as above; `second`
// names the second moment (v: the unsigned map), else the first (m).
// to_f32: exact for fp32 and bf16, the decode for int8.  from_f32: fp32
// copies, bf16 rounds (util/dtype.h), int8 encodes every block the range
// touches; a block only partly inside is decoded, patched and encoded again
// (its other elements keep their values up to that requantization).
void moments_to_f32(StateFormat f, bool second, const void* list, size_t n_total, size_t lo, size_t n, float* out);
void moments_from_f32(StateFormat f, bool second, void* list, size_t n_total, size_t lo, size_t n, const float* in);

// int8 notes.  Thresholds: the exact midpoints of consecutive map values;
// a value is above one when it is strictly greater (so ties go down in
// magnitude).  The vector paths find the code without a table search: the
// float's exponent picks a pair of octaves (AVX-512; three octaves on AVX2,
// whose table lookups take eight entries) in which at most one boundary
// between the map's decades lies (a compare settles the decade), and within
// a decade the map is linear, so floor(y * s + o) is the code's offset in
// its decade except within 2^-12 of an integer, where that lane takes the
// scalar search instead (exact outside that margin by the bound in
// adam_states.cpp, checked at start-up for every threshold, and checked by
// the tests against the search for every float in [0, 1]).  A block whose
// maximum is subnormal (reciprocal +inf) takes the scalar search.  Dequantization
// looks the map up 32 codes at a time (AVX-512: VPERMI2W over the map's
// 16-bit halves), or 64 (AVX512-VBMI: VPERMI2B over its byte planes), or 8
// (AVX2: VGATHERDPS).
//
// Speed (issue 45, docs/benchmarks.md): fp32 and bf16 are memory-bound; on
// a 2-core AVX-512 machine int8 is compute-bound, and its quantization (two
// maps, about 18 vector instructions per 16 values each) is 40-50% of its
// time on Zen 4 (without it the kernel runs 1.6-1.9x as fast) and 34% on an
// Intel Xeon (1.52x).  Every vector kernel prefetches its lists in software
// (optim/adam_prefetch.h).
//
// Where bitsandbytes 0.50's CPU path (backends/cpu/ops.py, csrc/cpu_ops.cpp)
// departs from the paper, this follows the paper: its quantize_blockwise
// picks a code through a 65536-entry table over [-1, 1] (a step of 3.05e-5),
// so a normalized value below about 1.5e-5 in magnitude does not get its
// nearest code; here every value does.  Its CUDA kernel also nudges an m
// code whose sign differs from the value's (not in the paper); not done here.

}  // namespace pstar::optim
