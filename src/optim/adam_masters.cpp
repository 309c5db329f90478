#include "optim/adam_masters.h"

#include <algorithm>

#include "optim/adam_states.h"
#include "util/dtype.h"
#include "util/error.h"

namespace pstar::optim {

const char* master_format_name(MasterFormat f) {
  switch (f) {
    case MasterFormat::kFp32: return "fp32";
    case MasterFormat::kBf16: return "bf16";
  }
  return "unknown";
}

SrStream sr_stream(uint64_t seed, uint64_t step, uint64_t param) {
  // Each 32-bit word folded in through the bijection; `b` continues from
  // `a`, so an element's two rounds use unrelated words.
  uint32_t h = 0x45u;  // issue 45
  for (uint64_t w : {seed, step, param}) {
    h = sr_mix32(h ^ static_cast<uint32_t>(w));
    h = sr_mix32(h ^ static_cast<uint32_t>(w >> 32));
  }
  SrStream s;
  s.a = h;
  s.b = sr_mix32(h ^ 0x9e3779b9u);
  return s;
}

void masters_to_f32(MasterFormat f, const void* list, size_t lo, size_t n, float* out) {
  if (f == MasterFormat::kFp32) {
    std::copy_n(static_cast<const float*>(list) + lo, n, out);
    return;
  }
  const uint16_t* b = static_cast<const uint16_t*>(list) + lo;
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(b[i]);
}

void masters_from_f32(MasterFormat f, void* list, size_t lo, size_t n, const float* in) {
  if (f == MasterFormat::kFp32) {
    std::copy_n(in, n, static_cast<float*>(list) + lo);
    return;
  }
  uint16_t* b = static_cast<uint16_t*>(list) + lo;
  for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(in[i]);
}

void masters_from_dtype(MasterFormat f, void* list, size_t lo, size_t n, const void* src, pstar_dtype dtype) {
  if (f == MasterFormat::kFp32) {
    convert_to_f32(src, dtype, static_cast<float*>(list) + lo, n);
    return;
  }
  uint16_t* b = static_cast<uint16_t*>(list) + lo;
  if (dtype == PSTAR_DTYPE_BF16) {
    std::copy_n(static_cast<const uint16_t*>(src), n, b);
    return;
  }
  for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(load_as(src, dtype, i));
}

void masters_to_dtype(MasterFormat f, const void* list, size_t lo, size_t n, void* dst, pstar_dtype dtype) {
  if (f == MasterFormat::kFp32) {
    convert_from_f32(static_cast<const float*>(list) + lo, dst, dtype, n);
    return;
  }
  const uint16_t* b = static_cast<const uint16_t*>(list) + lo;
  if (dtype == PSTAR_DTYPE_BF16) {
    std::copy_n(b, n, static_cast<uint16_t*>(dst));
    return;
  }
  for (size_t i = 0; i < n; ++i) store_as(dst, dtype, i, bf16_to_f32(b[i]));
}

namespace {

// Elements per tile: a multiple of the int8 block (so that every tile of a
// range that starts on a block starts on one too) and of every vector
// width; two fp32 tiles stay in L1.
constexpr size_t kTileElems = 2048;
static_assert(kTileElems % kInt8BlockElems == 0, "tiles start on int8 blocks");

// A range's moment list from its element t on (t a multiple of kTileElems).
MomentList advanced(StateFormat f, MomentList l, size_t t) {
  switch (f) {
    case StateFormat::kFp32: l.values = static_cast<float*>(l.values) + t; break;
    case StateFormat::kBf16: l.values = static_cast<uint16_t*>(l.values) + t; break;
    case StateFormat::kInt8:
      l.values = static_cast<uint8_t*>(l.values) + t;
      l.absmax += t / kInt8BlockElems;
      break;
  }
  return l;
}
ConstMomentList advanced(StateFormat f, ConstMomentList l, size_t t) {
  const MomentList m = advanced(f, MomentList{const_cast<void*>(l.values), const_cast<float*>(l.absmax)}, t);
  return ConstMomentList{m.values, m.absmax};
}

}  // namespace

void adam_update_bf16_masters(AdamIsa isa, StateFormat f, const AdamStepConstants& c, const AdamStateRange& r) {
  alignas(64) float in[kTileElems];
  alignas(64) float out[kTileElems];
  const bool oop = r.bf16.master_in != nullptr;
  if (oop && (r.exp_avg_in.values == nullptr || r.exp_avg_sq_in.values == nullptr)) {
    internal_error("bf16 masters out of place without the moments' inputs");
  }
  const size_t slot_size = dtype_size(r.dtype);
  for (size_t t = 0; t < r.n; t += kTileElems) {
    const size_t n = std::min(kTileElems, r.n - t);
    const uint16_t* src = (oop ? r.bf16.master_in : r.bf16.master) + t;
    float* widened = oop ? in : out;
    for (size_t i = 0; i < n; ++i) widened[i] = bf16_to_f32(src[i]);

    AdamStateRange q;
    q.master = out;
    q.exp_avg = advanced(f, r.exp_avg, t);
    q.exp_avg_sq = advanced(f, r.exp_avg_sq, t);
    if (oop) {
      q.master_in = in;
      q.exp_avg_in = advanced(f, r.exp_avg_in, t);
      q.exp_avg_sq_in = advanced(f, r.exp_avg_sq_in, t);
    }
    q.slot = static_cast<char*>(r.slot) + t * slot_size;
    q.dtype = r.dtype;
    q.grad_f32 = r.grad_f32 != nullptr ? r.grad_f32 + t : nullptr;
    q.n = n;
    adam_update_states(isa, f, c, q);

    uint16_t* dst = r.bf16.master + t;
    const uint64_t first = r.bf16.offset + t;
    for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16_stochastic(out[i], sr_bits(r.bf16.stream, first + i));
    masters_to_dtype(MasterFormat::kBf16, dst, 0, n, q.slot, r.dtype);
  }
}

}  // namespace pstar::optim
