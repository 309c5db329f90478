// The Adam state formats (optim/adam_states.h): names and sizes, the int8
// dynamic maps and quantizer tables, the scalar reference of every format,
// and the dispatch to the vector paths (adam_states_avx2.cpp,
// adam_states_avx512.cpp).
#include "optim/adam_states.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "optim/adam_states_int8.h"
#include "util/dtype.h"
#include "util/error.h"

namespace pstar::optim {

// The vector paths: call only where adam_isa_supported() says yes.
// `native_bf16`: the CPU has AVX512-BF16 (VCVTNEPS2BF16 for the bf16 emits).
void adam_states_bf16_avx2(const AdamStepConstants& c, const AdamStateRange& r);
void adam_states_int8_avx2(const AdamStepConstants& c, const AdamStateRange& r);
void int8_encode_avx2(bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax);
void adam_states_bf16_avx512(const AdamStepConstants& c, const AdamStateRange& r, bool native_bf16);
void adam_states_int8_avx512(const AdamStepConstants& c, const AdamStateRange& r, bool native_bf16, bool vbmi);
void int8_encode_avx512(bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax);

// ---- formats ----------------------------------------------------------------

const char* state_format_name(StateFormat f) {
  switch (f) {
    case StateFormat::kFp32: return "fp32";
    case StateFormat::kBf16: return "bf16";
    case StateFormat::kInt8: return "int8";
  }
  return "unknown";
}

bool parse_state_format(const char* s, StateFormat* out) {
  if (s == nullptr) return false;
  for (StateFormat f : {StateFormat::kFp32, StateFormat::kBf16, StateFormat::kInt8}) {
    if (std::strcmp(s, state_format_name(f)) == 0) {
      *out = f;
      return true;
    }
  }
  return false;
}

size_t moment_list_bytes(StateFormat f, size_t n) {
  switch (f) {
    case StateFormat::kFp32: return n * sizeof(float);
    case StateFormat::kBf16: return n * sizeof(uint16_t);
    case StateFormat::kInt8: return int8_absmax_offset(n) + int8_blocks(n) * sizeof(float);
  }
  internal_error("unknown state format");
}

double adam_state_bytes_per_elem(StateFormat f, pstar_dtype dtype, bool grad_f32) {
  const double g = grad_f32 ? 4.0 : static_cast<double>(dtype_size(dtype));
  const double w = static_cast<double>(dtype_size(dtype));
  double moment = 0;  // one moment list, read and written
  switch (f) {
    case StateFormat::kFp32: moment = 8.0; break;
    case StateFormat::kBf16: moment = 4.0; break;
    case StateFormat::kInt8: moment = 2.0 + 8.0 / static_cast<double>(kInt8BlockElems); break;
  }
  return g + 8.0 + 2.0 * moment + w;
}

namespace {

template <typename List, typename Byte>
List list_at(StateFormat f, Byte* buffer, size_t n_total, size_t offset) {
  List l;
  if (buffer == nullptr) return l;
  switch (f) {
    case StateFormat::kFp32: l.values = buffer + offset * sizeof(float); break;
    case StateFormat::kBf16: l.values = buffer + offset * sizeof(uint16_t); break;
    case StateFormat::kInt8:
      if (offset % kInt8BlockElems != 0) {
        internal_error("int8 moment list range at element " + std::to_string(offset) + ", not on a block boundary (" +
                       std::to_string(kInt8BlockElems) + ")");
      }
      l.values = buffer + offset;
      l.absmax = reinterpret_cast<decltype(l.absmax)>(buffer + int8_absmax_offset(n_total)) + offset / kInt8BlockElems;
      break;
  }
  return l;
}

}  // namespace

MomentList moment_list_at(StateFormat f, void* buffer, size_t n_total, size_t offset) {
  return list_at<MomentList>(f, static_cast<uint8_t*>(buffer), n_total, offset);
}

ConstMomentList moment_list_at(StateFormat f, const void* buffer, size_t n_total, size_t offset) {
  return list_at<ConstMomentList>(f, static_cast<const uint8_t*>(buffer), n_total, offset);
}

// ---- the int8 maps and tables -------------------------------------------------

namespace int8 {
namespace {

// The dynamic map as bitsandbytes' create_dynamic_map(signed, 7, 8) builds
// it (its arithmetic reproduced exactly, so the values agree bit for bit;
// tests/optim/test_bnb_pin.py compares all 256): for each decade i = 0..6,
// the midpoints of torch.linspace(0.1, 1, 2^i + 1) (signed; 2^(i+1) + 1
// unsigned) in float32, times 10^(i-6) in float32, both signs for the
// signed map; then 0 and 1; sorted.  torch's float32 linspace computes
// start + step * j (one rounding) for the first half and end - step *
// (steps - 1 - j) for the second, with step = (end - start) / (steps - 1).
void build_values(bool is_signed, float* out) {
  static const float kPow10[7] = {1e-6f, 1e-5f, 1e-4f, 1e-3f, 1e-2f, 1e-1f, 1.0f};
  std::vector<float> v;
  for (int i = 0; i < 7; ++i) {
    const int n = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    const float start = 0.1f, end = 1.0f;
    const float step = (end - start) / static_cast<float>(n - 1);
    std::vector<float> b(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      b[static_cast<size_t>(j)] = j < n / 2 ? std::fmaf(step, static_cast<float>(j), start)
                                            : std::fmaf(-step, static_cast<float>(n - 1 - j), end);
    }
    for (int j = 0; j + 1 < n; ++j) {
      const float mean = (b[static_cast<size_t>(j)] + b[static_cast<size_t>(j) + 1]) / 2.0f;
      const float x = kPow10[i] * mean;
      v.push_back(x);
      if (is_signed) v.push_back(-x);
    }
  }
  v.push_back(0.0f);
  v.push_back(1.0f);
  if (v.size() != 256) internal_error("dynamic map with " + std::to_string(v.size()) + " values");
  std::sort(v.begin(), v.end());
  std::copy(v.begin(), v.end(), out);
}

// The smallest float strictly greater than the exact midpoint of a < b
// (the sum of two floats of these magnitudes is exact in double).
float threshold(float a, float b) {
  const double mid = (static_cast<double>(a) + static_cast<double>(b)) * 0.5;
  float t = static_cast<float>(mid);
  if (static_cast<double>(t) <= mid) t = std::nextafterf(t, std::numeric_limits<float>::infinity());
  return t;
}

// One fast path's slots, each `octaves` wide: slot 0 holds every magnitude
// below 2^(octaves - 23), slot sl in 1..open - 1 holds
// [2^(octaves sl - 23), 2^(octaves sl + octaves - 23)), slot `open` (and any
// above it) everything from its start on.  Each slot gets the decade of its
// smallest member (the boundaries cross[1..n_cross - 1] at or below it) and
// the one boundary inside it (+inf if none); slot_fn must agree with the
// bounds.
void fill_slots(const float* cross, int n_cross, int octaves, int n_slots, int open, int (*slot_fn)(float),
                const char* what, int32_t* slot_dec, float* slot_cross) {
  for (int sl = 0; sl < n_slots; ++sl) {
    const float lo = sl == 0 ? 0.0f : std::ldexp(1.0f, octaves * sl - 23);
    const float hi =
        sl >= open ? std::numeric_limits<float>::infinity() : std::ldexp(1.0f, octaves * sl + octaves - 23);
    int dec = 0, inside = 0;
    float x = std::numeric_limits<float>::infinity();
    for (int d = 1; d < n_cross; ++d) {
      if (cross[d] <= lo) {
        ++dec;
      } else if (cross[d] < hi) {
        ++inside;
        x = cross[d];
      }
    }
    if (inside > 1) internal_error(std::string("int8 quantizer: two decade boundaries in one ") + what);
    if (sl > 0 && sl <= open && (slot_fn(lo) != sl || (sl < open && slot_fn(std::nextafterf(hi, 0.0f)) != sl))) {
      internal_error(std::string("int8 quantizer: the bounds of a ") + what + " disagree with its index");
    }
    slot_dec[sl] = dec;
    slot_cross[sl] = x;
  }
}

Map build_map(bool is_signed) {
  Map m{};
  build_values(is_signed, m.values);
  for (int k = 0; k < 256; ++k) {
    const uint32_t b = f32_bits(m.values[k]);
    m.hi[k] = static_cast<uint16_t>(b >> 16);
    m.lo[k] = static_cast<uint16_t>(b & 0xffffu);
    for (int p = 0; p < 4; ++p) m.planes[p][k] = static_cast<uint8_t>(b >> (8 * p));
    m.thr[k] = std::numeric_limits<float>::infinity();
  }
  // Magnitude codes: the values the count indexes (signed: 0 and the
  // positive side; unsigned: all).
  const float* mag = is_signed ? m.values + 127 : m.values;
  const int n_mag = is_signed ? 129 : 256;
  if (is_signed) {
    if (m.values[127] != 0.0f) internal_error("signed dynamic map: the code of 0 is not 127");
    for (int t = 1; t <= 127; ++t) {
      if (m.values[127 - t] != -m.values[127 + t]) internal_error("signed dynamic map is not symmetric");
    }
  }
  m.n_thr = n_mag - 1;
  for (int k = 0; k + 1 < n_mag; ++k) m.thr[k] = threshold(mag[k], mag[k + 1]);

  // Decades of the magnitude codes: decade i of the map (10^(i-6) times
  // 0.1..1) has n_i codes, linear in value: the j-th is close to
  // 10^(i-6) * (0.1 + 0.9 * (j + 0.5) / n_i), so the threshold between the
  // j-th and the (j+1)-th is close to u = j + 1 where
  //   u(a) = (a / 10^(i-6) - 0.1) * n_i / 0.9 = a * s_i + o_i,
  // and the count of thresholds at or below a is base_i + floor(u).  The
  // vector kernels (AVX2, AVX-512) compute u_lo = fma(a, s_i, o_i + base_i
  // - kAmbiguity) in float; a lane is exact unless u_lo lies within about
  // 2 kAmbiguity below an integer: AVX2 tests u_hi = u_lo + 2 kAmbiguity,
  // in float, for the same floor (both truncations); AVX-512 tests the
  // fraction u_lo - floor(u_lo), exact from VREDUCEPS, against
  // 1 - 2 kAmbiguity.  Bound on
  // |u_lo - (u + base_i - kAmbiguity)|: s_i rounded (2^-24 of a * s_i <=
  // 144), dec_olo rounded (2^-17 of a value below 256) and the FMA (the
  // same): below 4e-5; AVX2's u_hi, with the addition's rounding (2^-17
  // more), below 4.8e-5.  Bound on
  // |u(threshold) - integer|: the map's values carry at most 4 float
  // roundings of 2^-24 relative (linspace, midpoint, power of ten, product)
  // and the threshold float 2^-23 more: below 7e-5, checked below for every
  // threshold (in double, against kAmbiguity / 3 = 8.1e-5).  So a lane
  // either test passes is at least kAmbiguity - 4.8e-5 - 8.1e-5 > 0 away
  // from any threshold: exact.
  int base[kDecades], last[kDecades];
  double o_exact[kDecades];
  base[0] = last[0] = 0;
  for (int i = 0; i < 7; ++i) {
    const int n_i = is_signed ? 1 << i : 1 << (i + 1);
    base[i + 1] = is_signed ? 1 << i : (1 << (i + 1)) - 1;
    last[i + 1] = base[i + 1] + n_i - 1;
    const double scale = std::pow(10.0, i - 6);
    m.dec_s[i + 1] = static_cast<float>(n_i / (0.9 * scale));
    o_exact[i + 1] = -n_i / 9.0;
    for (int j = 1; j < n_i; ++j) {  // interior thresholds of the decade
      const int k = base[i + 1] + j - 1;
      const double u = static_cast<double>(m.thr[k]) * static_cast<double>(m.dec_s[i + 1]) + o_exact[i + 1];
      if (std::fabs(u - j) > kAmbiguity / 3) internal_error("int8 quantizer: the map is not linear in its decade");
    }
  }
  base[8] = last[8] = n_mag - 1;
  for (int d : {0, 8}) {  // single codes: u = 0.5, never near an integer
    m.dec_s[d] = 0.0f;
    o_exact[d] = 0.5;
  }
  for (int d = 0; d < 16; ++d) {
    const int dd = d < kDecades ? d : kDecades - 1;
    m.dec_s[d] = m.dec_s[dd];
    m.dec_olo[d] = static_cast<float>(o_exact[dd] + base[dd] - kAmbiguity);
    m.dec_last[d] = last[dd];
  }
  // The boundaries between decades: X_d between the last code of decade
  // d - 1 and the first of decade d, d = 1..8.
  float cross[kDecades];
  for (int d = 1; d < kDecades; ++d) cross[d] = m.thr[base[d] - 1];
  // AVX-512's two-octave slots (slot 11 holds [0.5, 2); 12..15 are never
  // indexed), and AVX2's three-octave ones with the boundaries of decades
  // 1..7 only (that of decade 8 is top_cross).
  fill_slots(cross, kDecades, 2, kSlots, 11, slot_of, "slot", m.slot_dec, m.slot_cross);
  fill_slots(cross, kDecades - 1, 3, kSlots3, kSlots3 - 1, slot3_of, "three-octave slot", m.slot3_dec, m.slot3_cross);
  // Every a at or above the top boundary must be in decade 7 (the last slot,
  // with no boundary inside), where the count is clamped at last[7].
  m.top_cross = cross[kDecades - 1];
  if (slot3_of(m.top_cross) != kSlots3 - 1 || m.slot3_dec[kSlots3 - 1] != kDecades - 2 ||
      m.slot3_cross[kSlots3 - 1] != std::numeric_limits<float>::infinity() || last[kDecades - 2] + 1 != m.n_thr) {
    internal_error("int8 quantizer: the top boundary is not alone in the last three-octave slot");
  }
  return m;
}

}  // namespace

const Map& signed_map() {
  static const Map m = build_map(true);
  return m;
}

const Map& unsigned_map() {
  static const Map m = build_map(false);
  return m;
}

void fix_lanes(bool is_signed, const float* x, float r, uint32_t lanes, uint8_t* codes) {
  while (lanes != 0) {
    const int l = __builtin_ctz(lanes);
    lanes &= lanes - 1;
    codes[l] = code_ref(is_signed, x[l] * r);
  }
}

void quant_block_scalar(bool is_signed, const float* x, size_t nb, float r, uint8_t* codes) {
  for (size_t i = 0; i < nb; ++i) codes[i] = code_ref(is_signed, x[i] * r);
}

}  // namespace int8

const float* int8_dynamic_map(bool is_signed) { return int8::map_of(is_signed).values; }

uint8_t int8_code(bool is_signed, float y) { return int8::code_ref(is_signed, y); }

void int8_decode(bool is_signed, const uint8_t* codes, const float* absmax, size_t n, float* out) {
  const float* map = int8_dynamic_map(is_signed);
  for (size_t i = 0; i < n; ++i) out[i] = map[codes[i]] * absmax[i / kInt8BlockElems];
}

void moments_to_f32(StateFormat f, bool second, const void* list, size_t n_total, size_t lo, size_t n, float* out) {
  if (n == 0) return;
  if (lo + n > n_total) internal_error("moment list range past the list's end");
  switch (f) {
    case StateFormat::kFp32: std::memcpy(out, static_cast<const float*>(list) + lo, n * sizeof(float)); return;
    case StateFormat::kBf16: {
      const uint16_t* b = static_cast<const uint16_t*>(list) + lo;
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(b[i]);
      return;
    }
    case StateFormat::kInt8: {
      const uint8_t* codes = static_cast<const uint8_t*>(list);
      const float* absmax = reinterpret_cast<const float*>(codes + int8_absmax_offset(n_total));
      const float* map = int8_dynamic_map(!second);
      for (size_t i = 0; i < n; ++i) out[i] = map[codes[lo + i]] * absmax[(lo + i) / kInt8BlockElems];
      return;
    }
  }
  internal_error("unknown state format");
}

void moments_from_f32(StateFormat f, bool second, void* list, size_t n_total, size_t lo, size_t n, const float* in) {
  if (n == 0) return;
  if (lo + n > n_total) internal_error("moment list range past the list's end");
  switch (f) {
    case StateFormat::kFp32: std::memcpy(static_cast<float*>(list) + lo, in, n * sizeof(float)); return;
    case StateFormat::kBf16: {
      uint16_t* b = static_cast<uint16_t*>(list) + lo;
      for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(in[i]);
      return;
    }
    case StateFormat::kInt8: {
      uint8_t* codes = static_cast<uint8_t*>(list);
      float* absmax = reinterpret_cast<float*>(codes + int8_absmax_offset(n_total));
      const AdamIsa isa = adam_default_isa();
      std::vector<float> block(kInt8BlockElems);
      for (size_t b0 = lo / kInt8BlockElems * kInt8BlockElems; b0 < lo + n; b0 += kInt8BlockElems) {
        const size_t nb = std::min(kInt8BlockElems, n_total - b0);
        const size_t a = std::max(b0, lo), e = std::min(b0 + nb, lo + n);  // the part written
        if (a == b0 && e == b0 + nb) {
          int8_encode(isa, !second, in + (b0 - lo), nb, codes + b0, absmax + b0 / kInt8BlockElems);
          continue;
        }
        moments_to_f32(f, second, list, n_total, b0, nb, block.data());
        std::memcpy(block.data() + (a - b0), in + (a - lo), (e - a) * sizeof(float));
        int8_encode(isa, !second, block.data(), nb, codes + b0, absmax + b0 / kInt8BlockElems);
      }
      return;
    }
  }
  internal_error("unknown state format");
}

namespace {

void require_isa(AdamIsa isa) {
  if (!adam_isa_supported(isa)) {
    internal_error(std::string("Adam path '") + adam_isa_name(isa) + "' is not available on this CPU");
  }
}

// ---- scalar reference ---------------------------------------------------------

// The largest |x| seen so far; NaN never wins (the comparison is false).
inline float absmax_step(float acc, float x) {
  const float a = std::fabs(x);
  return a > acc ? a : acc;
}

void encode_scalar(bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax) {
  for (size_t b = 0; b * kInt8BlockElems < n; ++b) {
    const size_t off = b * kInt8BlockElems;
    const size_t nb = std::min(kInt8BlockElems, n - off);
    float a = 0.0f;
    for (size_t i = 0; i < nb; ++i) a = absmax_step(a, x[off + i]);
    absmax[b] = a;
    const float r = int8::inv_scale(a);
    for (size_t i = 0; i < nb; ++i) codes[off + i] = int8::code_ref(is_signed, x[off + i] * r);
  }
}

void bf16_scalar(const AdamStepConstants& c, const AdamStateRange& r) {
  const bool oop = r.master_in != nullptr;
  const float* const pi = oop ? r.master_in : r.master;
  const uint16_t* const mi = static_cast<const uint16_t*>(oop ? r.exp_avg_in.values : r.exp_avg.values);
  const uint16_t* const vi = static_cast<const uint16_t*>(oop ? r.exp_avg_sq_in.values : r.exp_avg_sq.values);
  uint16_t* const mo = static_cast<uint16_t*>(r.exp_avg.values);
  uint16_t* const vo = static_cast<uint16_t*>(r.exp_avg_sq.values);
  for (size_t i = 0; i < r.n; ++i) {
    const float g = r.grad_f32 != nullptr ? r.grad_f32[i] : load_as(r.slot, r.dtype, i);
    float p = pi[i], m = bf16_to_f32(mi[i]), v = bf16_to_f32(vi[i]);
    const float w = adam_element(c, g, p, m, v);
    r.master[i] = p;
    mo[i] = f32_to_bf16(m);
    vo[i] = f32_to_bf16(v);
    store_as(r.slot, r.dtype, i, w);
  }
}

void int8_scalar(const AdamStepConstants& c, const AdamStateRange& r) {
  const bool oop = r.master_in != nullptr;
  const float* const pi = oop ? r.master_in : r.master;
  const ConstMomentList min = oop ? r.exp_avg_in : ConstMomentList{r.exp_avg.values, r.exp_avg.absmax};
  const ConstMomentList vin = oop ? r.exp_avg_sq_in : ConstMomentList{r.exp_avg_sq.values, r.exp_avg_sq.absmax};
  const uint8_t* const mci = static_cast<const uint8_t*>(min.values);
  const uint8_t* const vci = static_cast<const uint8_t*>(vin.values);
  uint8_t* const mco = static_cast<uint8_t*>(r.exp_avg.values);
  uint8_t* const vco = static_cast<uint8_t*>(r.exp_avg_sq.values);
  const float* const smap = int8::signed_map().values;
  const float* const umap = int8::unsigned_map().values;
  float mf[kInt8BlockElems], vf[kInt8BlockElems];
  for (size_t b = 0; b * kInt8BlockElems < r.n; ++b) {
    const size_t off = b * kInt8BlockElems;
    const size_t nb = std::min(kInt8BlockElems, r.n - off);
    const float am_in = min.absmax[b], av_in = vin.absmax[b];
    float am = 0.0f, av = 0.0f;
    for (size_t i = 0; i < nb; ++i) {
      const size_t e = off + i;
      const float g = r.grad_f32 != nullptr ? r.grad_f32[e] : load_as(r.slot, r.dtype, e);
      float p = pi[e], m = smap[mci[e]] * am_in, v = umap[vci[e]] * av_in;
      const float w = adam_element_int8(c, g, p, m, v);
      r.master[e] = p;
      store_as(r.slot, r.dtype, e, w);
      mf[i] = m;
      vf[i] = v;
      am = absmax_step(am, m);
      av = absmax_step(av, v);
    }
    r.exp_avg.absmax[b] = am;
    r.exp_avg_sq.absmax[b] = av;
    const float rm = int8::inv_scale(am), rv = int8::inv_scale(av);
    for (size_t i = 0; i < nb; ++i) {
      mco[off + i] = int8::code_ref(true, mf[i] * rm);
      vco[off + i] = int8::code_ref(false, vf[i] * rv);
    }
  }
}

}  // namespace

void int8_encode(AdamIsa isa, bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax) {
  require_isa(isa);
  switch (isa) {
    case AdamIsa::kScalar: encode_scalar(is_signed, x, n, codes, absmax); return;
    case AdamIsa::kAvx2: int8_encode_avx2(is_signed, x, n, codes, absmax); return;
    case AdamIsa::kAvx512: int8_encode_avx512(is_signed, x, n, codes, absmax); return;
  }
}

void adam_update_states(AdamIsa isa, StateFormat f, const AdamStepConstants& c, const AdamStateRange& r) {
  if (r.bf16.master != nullptr) {
    adam_update_bf16_masters(isa, f, c, r);
    return;
  }
  if (f == StateFormat::kFp32) {
    AdamRange a;
    a.master = r.master;
    a.exp_avg = static_cast<float*>(r.exp_avg.values);
    a.exp_avg_sq = static_cast<float*>(r.exp_avg_sq.values);
    a.master_in = r.master_in;
    a.exp_avg_in = static_cast<const float*>(r.exp_avg_in.values);
    a.exp_avg_sq_in = static_cast<const float*>(r.exp_avg_sq_in.values);
    a.slot = r.slot;
    a.dtype = r.dtype;
    a.grad_f32 = r.grad_f32;
    a.n = r.n;
    adam_update(isa, c, a);
    return;
  }
  require_isa(isa);
  if (r.n == 0) return;
  const bool bf16 = f == StateFormat::kBf16;
  if (f != StateFormat::kBf16 && f != StateFormat::kInt8) internal_error("unknown state format");
  switch (isa) {
    case AdamIsa::kScalar: bf16 ? bf16_scalar(c, r) : int8_scalar(c, r); return;
    case AdamIsa::kAvx2: bf16 ? adam_states_bf16_avx2(c, r) : adam_states_int8_avx2(c, r); return;
    case AdamIsa::kAvx512:
      if (bf16) {
        adam_states_bf16_avx512(c, r, cpu_has_avx512bf16());
      } else {
        adam_states_int8_avx512(c, r, cpu_has_avx512bf16(), cpu_has_avx512vbmi());
      }
      return;
  }
}

}  // namespace pstar::optim
