// The Adam state formats (optim/adam_states.h): every instruction-set path
// against the scalar reference bit for bit, in every format; the int8
// quantizer against its definition; the sizes and layouts the engine relies
// on; and a convergence check of bf16 and int8 against fp32.
//
// What is checked, and how strictly:
//  - Paths (scalar, AVX2, AVX-512 with the integer bf16 rounding and with
//    VCVTNEPS2BF16): master, both moment lists (int8: codes and absmax), the
//    slot, bit-identical (memcmp) after every step, over ranges with partial
//    last blocks, in place and out of place (inputs untouched, results equal
//    to the in-place ones), gradients from the slot and from an fp32 list,
//    f16/bf16/f32 slots, with NaN, infinite and subnormal gradients at a
//    low rate.  Paths the CPU lacks are skipped (cr_skip_test), never
//    counted as passed.
//  - The quantizer: every path's int8_encode equals int8_code() (a binary
//    search over the exact midpoints) for every float within 4096 ulps of
//    every threshold, for a stride of all floats in [0, 1] and their
//    negatives (PSTAR_TEST_EXHAUSTIVE=1: every float in [0, 1]), and the
//    code is the nearest map value (checked in double against both
//    neighbours), monotonic, with 0 and the block maximum exact.
//  - Convergence: 100 steps on a quadratic; bf16 and int8 land within the
//    tolerances stated at the test of the fp32 format's result.
#include <criterion/criterion.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "optim/adam_kernel.h"
#include "optim/adam_states.h"
#include "util/dtype.h"
#include "splitmix_rng.h"
#include "util/error.h"

namespace pstar::optim {
// The AVX-512 paths with the bf16 emit chosen explicitly (adam_states_avx512.cpp).
void adam_states_bf16_avx512(const AdamStepConstants& c, const AdamStateRange& r, bool native_bf16);
void adam_states_int8_avx512(const AdamStepConstants& c, const AdamStateRange& r, bool native_bf16, bool vbmi);
}  // namespace pstar::optim

using namespace pstar;
using namespace pstar::optim;

namespace {

struct Path {
  std::string name;
  std::function<void(StateFormat, const AdamStepConstants&, const AdamStateRange&)> run;
};

Path isa_path(AdamIsa isa) {
  return Path{adam_isa_name(isa), [isa](StateFormat f, const AdamStepConstants& c, const AdamStateRange& r) {
                adam_update_states(isa, f, c, r);
              }};
}

Path avx512_path(bool native, bool vbmi) {
  return Path{std::string(native ? "avx512-bf16insn" : "avx512-intbf16") + (vbmi ? "-vbmi" : ""),
              [native, vbmi](StateFormat f, const AdamStepConstants& c, const AdamStateRange& r) {
                if (f == StateFormat::kBf16) {
                  adam_states_bf16_avx512(c, r, native);
                } else if (f == StateFormat::kInt8) {
                  adam_states_int8_avx512(c, r, native, vbmi);
                } else {
                  adam_update_states(AdamIsa::kAvx512, f, c, r);
                }
              }};
}

// The vector paths of this CPU (the scalar reference is run separately);
// reports the missing ones.
std::vector<Path> vector_paths() {
  std::vector<Path> paths;
  if (adam_isa_supported(AdamIsa::kAvx2)) {
    paths.push_back(isa_path(AdamIsa::kAvx2));
  } else {
    std::fprintf(stderr, "test_adam_states: AVX2 path not supported by this CPU: skipped\n");
  }
  if (adam_isa_supported(AdamIsa::kAvx512)) {
    paths.push_back(avx512_path(false, false));
    if (cpu_has_avx512bf16()) {
      paths.push_back(avx512_path(true, false));
    } else {
      std::fprintf(stderr, "test_adam_states: AVX512-BF16 not supported by this CPU: that path skipped\n");
    }
    if (cpu_has_avx512vbmi()) {
      paths.push_back(avx512_path(false, true));
      if (cpu_has_avx512bf16()) paths.push_back(avx512_path(true, true));
    } else {
      std::fprintf(stderr, "test_adam_states: AVX512-VBMI not supported by this CPU: the int8 VBMI paths skipped\n");
    }
  } else {
    std::fprintf(stderr, "test_adam_states: AVX-512 path not supported by this CPU: skipped\n");
  }
  return paths;
}

std::vector<AdamIsa> vector_isas() {
  std::vector<AdamIsa> isas;
  for (AdamIsa isa : {AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    if (adam_isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

using pstar_test::Rng;

const char* dtype_str(pstar_dtype d) { return d == PSTAR_DTYPE_F32 ? "f32" : d == PSTAR_DTYPE_F16 ? "f16" : "bf16"; }

// ---- one path's state ------------------------------------------------------------

struct State {
  StateFormat f;
  size_t n;
  pstar_dtype dtype;
  std::vector<float> master, grad32;
  std::vector<uint8_t> m, v, slot;  // whole lists in the format's layout

  State(StateFormat f_, size_t n_, pstar_dtype d)
      : f(f_),
        n(n_),
        dtype(d),
        master(n_),
        grad32(n_),
        m(moment_list_bytes(f_, n_)),
        v(moment_list_bytes(f_, n_)),
        slot(n_ * dtype_size(d)) {}

  // The range [lo, hi) (lo on a block boundary), in place, or out of place
  // reading `in` and writing here.
  AdamStateRange range(bool grad_f32, size_t lo, size_t hi, const State* in = nullptr) {
    AdamStateRange r;
    r.master = master.data() + lo;
    r.exp_avg = moment_list_at(f, m.data(), n, lo);
    r.exp_avg_sq = moment_list_at(f, v.data(), n, lo);
    if (in != nullptr) {
      r.master_in = in->master.data() + lo;
      r.exp_avg_in = moment_list_at(f, static_cast<const void*>(in->m.data()), n, lo);
      r.exp_avg_sq_in = moment_list_at(f, static_cast<const void*>(in->v.data()), n, lo);
    }
    r.slot = slot.data() + lo * dtype_size(dtype);
    r.dtype = dtype;
    r.grad_f32 = grad_f32 ? grad32.data() + lo : nullptr;
    r.n = hi - lo;
    return r;
  }
  // The bytes that carry state (an int8 list's padding before its absmax
  // array is never written), compared bit for bit (NaN payloads included).
  bool same_list(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) const {
    if (f != StateFormat::kInt8) return a == b;
    const size_t ab = int8_absmax_offset(n);
    return std::memcmp(a.data(), b.data(), n) == 0 && std::memcmp(a.data() + ab, b.data() + ab, a.size() - ab) == 0;
  }
  bool same(const State& o) const {
    return std::memcmp(master.data(), o.master.data(), n * sizeof(float)) == 0 && same_list(m, o.m) &&
           same_list(v, o.v) && slot == o.slot;
  }
  std::string first_difference(const State& o) const {
    char b[200];
    for (size_t i = 0; i < n; ++i) {
      if (f32_bits(master[i]) != f32_bits(o.master[i])) {
        std::snprintf(b, sizeof b, "master[%zu] %08x vs %08x", i, f32_bits(master[i]), f32_bits(o.master[i]));
        return b;
      }
    }
    const size_t pad_lo = f == StateFormat::kInt8 ? n : m.size(),
                 pad_hi = f == StateFormat::kInt8 ? int8_absmax_offset(n) : 0;
    for (size_t i = 0; i < m.size(); ++i) {
      if (i >= pad_lo && i < pad_hi) continue;
      if (m[i] != o.m[i]) {
        std::snprintf(b, sizeof b, "m byte %zu: %02x vs %02x", i, m[i], o.m[i]);
        return b;
      }
      if (v[i] != o.v[i]) {
        std::snprintf(b, sizeof b, "v byte %zu: %02x vs %02x", i, v[i], o.v[i]);
        return b;
      }
    }
    if (slot != o.slot) return "slot";
    return "none";
  }
};

void put_grad(State& s, bool grad_f32, size_t i, float g) {
  if (grad_f32) {
    s.grad32[i] = g;
  } else {
    store_as(s.slot.data(), s.dtype, i, g);
  }
}

// Step t's gradient of element i: mostly |g| from 1e-4 to 10 (random sign),
// a few zeros, subnormals, NaN and infinities when `specials`.
float make_grad(Rng& rng, size_t i, int t, bool specials) {
  const uint64_t r = rng.next();
  if (specials) {
    if (i % 211 == 100 && t % 5 == 3) return std::nanf("");
    if (i % 307 == 77 && t % 7 == 2) return (t & 1) ? INFINITY : -INFINITY;
    if (i % 29 == 5) return f32_from_bits(static_cast<uint32_t>(r % 0x7fffffu + 1u));
    if (i % 31 == 11) return 0.0f;
  }
  const double u = static_cast<double>((r >> 11) & 0xfffffffffffull) / 17592186044416.0;
  return static_cast<float>(((r >> 63) ? -1.0 : 1.0) * std::pow(10.0, 5.0 * u - 4.0));
}

void init_state(State& s, uint64_t seed) {
  Rng rng(seed);
  for (size_t i = 0; i < s.n; ++i) {
    s.master[i] = static_cast<float>((rng.uniform() * 2.0 - 1.0) * 2.0);
    store_as(s.slot.data(), s.dtype, i, s.master[i]);
  }
  std::fill(s.m.begin(), s.m.end(), 0);
  std::fill(s.v.begin(), s.v.end(), 0);
}

struct Config {
  StateFormat f;
  pstar_dtype dtype;
  bool grad_f32;
  size_t n;
  bool adamw;
  // grad_mul exactly 1 (no loss scale or clipping factor): the AVX-512 int8
  // kernels' instance without the multiply; else grad_mul 0.8374 / loss
  // scale.
  bool unit_grad_mul = false;
  std::string str() const {
    char b[160];
    std::snprintf(b, sizeof b, "format=%s dtype=%s grads=%s n=%zu %s%s", state_format_name(f), dtype_str(dtype),
                  grad_f32 ? "f32-list" : "slot", n, adamw ? "adamw" : "adam", unit_grad_mul ? " grad_mul=1" : "");
    return b;
  }
};

AdamHyper hyper(bool adamw) {
  AdamHyper h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  h.adamw = adamw;
  return h;
}

// Runs `steps` steps of cfg on the scalar reference and on every path, in
// place and out of place; every result bit-identical to the reference's.
void run_config(const Config& cfg, const std::vector<Path>& paths, int steps) {
  const Path ref_path = isa_path(AdamIsa::kScalar);
  State ref(cfg.f, cfg.n, cfg.dtype);
  init_state(ref, cfg.n * 31 + 7);
  std::vector<State> in_place(paths.size(), ref), out_of_place(paths.size(), ref);
  Rng rng(cfg.n * 131 + static_cast<uint64_t>(cfg.f));
  const double loss_scale = cfg.dtype == PSTAR_DTYPE_F16 && !cfg.unit_grad_mul ? 1024.0 : 1.0;
  for (int t = 1; t <= steps; ++t) {
    std::vector<float> g(cfg.n);
    for (size_t i = 0; i < cfg.n; ++i) g[i] = make_grad(rng, i, t, true) * static_cast<float>(loss_scale);
    const double grad_mul = cfg.unit_grad_mul ? 1.0 : 0.8374 / loss_scale;
    const AdamStepConstants c = adam_constants(hyper(cfg.adamw), static_cast<uint64_t>(t), grad_mul, true);
    auto load = [&](State& s) {
      for (size_t i = 0; i < cfg.n; ++i) put_grad(s, cfg.grad_f32, i, g[i]);
    };
    load(ref);
    const State before = ref;
    ref_path.run(cfg.f, c, ref.range(cfg.grad_f32, 0, cfg.n));
    for (size_t k = 0; k < paths.size(); ++k) {
      State& s = in_place[k];
      load(s);
      // Two calls split at a block boundary: the contract's ranges.
      const size_t split = cfg.n > kInt8BlockElems ? (cfg.n / 2) / kInt8BlockElems * kInt8BlockElems : 0;
      if (split > 0) {
        paths[k].run(cfg.f, c, s.range(cfg.grad_f32, 0, split));
        paths[k].run(cfg.f, c, s.range(cfg.grad_f32, split, cfg.n));
      } else {
        paths[k].run(cfg.f, c, s.range(cfg.grad_f32, 0, cfg.n));
      }
      cr_assert(s.same(ref), "path %s (in place) differs from scalar, %s, step %d: %s", paths[k].name.c_str(),
                cfg.str().c_str(), t, s.first_difference(ref).c_str());
      // Out of place: from the state before this step, into buffers that
      // hold garbage; the inputs stay as they were.
      State& o = out_of_place[k];
      State input = before;
      std::fill(o.master.begin(), o.master.end(), -7.0f);
      std::fill(o.m.begin(), o.m.end(), 0xa5);
      std::fill(o.v.begin(), o.v.end(), 0x5a);
      o.slot = before.slot;
      o.grad32 = before.grad32;
      paths[k].run(cfg.f, c, o.range(cfg.grad_f32, 0, cfg.n, &input));
      cr_assert(input.same(before), "path %s (out of place) wrote its inputs, %s, step %d", paths[k].name.c_str(),
                cfg.str().c_str(), t);
      cr_assert(o.same(ref), "path %s (out of place) differs from scalar, %s, step %d: %s", paths[k].name.c_str(),
                cfg.str().c_str(), t, o.first_difference(ref).c_str());
    }
  }
}

const size_t kLengths[] = {1, 7, 16, 31, 33, 100, 255, 256, 257, 511, 1000, 1027, 4099};

void paths_test(StateFormat f) {
  const std::vector<Path> paths = vector_paths();
  if (paths.empty()) cr_skip_test("no vector path on this CPU");
  for (pstar_dtype d : {PSTAR_DTYPE_BF16, PSTAR_DTYPE_F16, PSTAR_DTYPE_F32}) {
    for (bool gf : {false, true}) {
      for (size_t n : kLengths) {
        run_config(Config{f, d, gf, n, (n & 1) == 0}, paths, 6);
        if (n % 3 == 1) run_config(Config{f, d, gf, n, n % 2 == 1, true}, paths, 6);
      }
    }
  }
}

}  // namespace

// ---- formats and layouts ------------------------------------------------------------

Test(adam_states, names_sizes_layout) {
  StateFormat f = StateFormat::kFp32;
  cr_assert(parse_state_format("int8", &f) && f == StateFormat::kInt8);
  cr_assert(parse_state_format("bf16", &f) && f == StateFormat::kBf16);
  cr_assert(parse_state_format("fp32", &f) && f == StateFormat::kFp32);
  cr_assert(!parse_state_format("fp16", &f) && f == StateFormat::kFp32);
  cr_assert_str_eq(state_format_name(StateFormat::kInt8), "int8");
  cr_assert_eq(kInt8BlockElems, 256u);
  cr_assert_eq(moment_list_bytes(StateFormat::kFp32, 1000), 4000u);
  cr_assert_eq(moment_list_bytes(StateFormat::kBf16, 1000), 2000u);
  // 1000 codes, absmax at 1024, 4 blocks.
  cr_assert_eq(int8_absmax_offset(1000), 1024u);
  cr_assert_eq(moment_list_bytes(StateFormat::kInt8, 1000), 1024u + 16u);
  cr_assert_eq(moment_list_bytes(StateFormat::kInt8, 512), 512u + 8u);
  cr_assert_float_eq(adam_state_bytes_per_elem(StateFormat::kFp32, PSTAR_DTYPE_BF16, false), 28.0, 1e-12);
  cr_assert_float_eq(adam_state_bytes_per_elem(StateFormat::kBf16, PSTAR_DTYPE_BF16, false), 20.0, 1e-12);
  cr_assert_float_eq(adam_state_bytes_per_elem(StateFormat::kInt8, PSTAR_DTYPE_BF16, false), 16.0625, 1e-12);
  std::vector<uint8_t> buf(moment_list_bytes(StateFormat::kInt8, 1000));
  const MomentList l = moment_list_at(StateFormat::kInt8, buf.data(), 1000, 512);
  cr_assert_eq(static_cast<uint8_t*>(l.values), buf.data() + 512);
  cr_assert_eq(reinterpret_cast<uint8_t*>(l.absmax), buf.data() + 1024 + 2 * 4);
  bool threw = false;
  try {
    moment_list_at(StateFormat::kInt8, buf.data(), 1000, 100);
  } catch (const Error&) {
    threw = true;
  }
  cr_assert(threw, "an int8 range off a block boundary must be refused");
  const MomentList b = moment_list_at(StateFormat::kBf16, buf.data(), 1000, 3);
  cr_assert_eq(static_cast<uint8_t*>(b.values), buf.data() + 6);
}

// ---- the dynamic maps -------------------------------------------------------------------

Test(adam_states, dynamic_maps) {
  for (bool s : {true, false}) {
    const float* map = int8_dynamic_map(s);
    for (int k = 0; k < 255; ++k) cr_assert(map[k] < map[k + 1], "map not increasing at %d", k);
    cr_assert_eq(map[255], 1.0f);
    // Decade sizes: signed 2^i codes per decade (each sign), unsigned 2^(i+1).
    for (int i = 0; i < 7; ++i) {
      const float lo = std::pow(10.0f, static_cast<float>(i - 7)), hi = std::pow(10.0f, static_cast<float>(i - 6));
      int count = 0;
      for (int k = 0; k < 256; ++k) count += map[k] > lo && map[k] < hi;
      cr_assert_eq(count, s ? 1 << i : 1 << (i + 1), "decade %d of the %s map has %d codes", i,
                   s ? "signed" : "unsigned", count);
    }
  }
  const float* sm = int8_dynamic_map(true);
  const float* um = int8_dynamic_map(false);
  cr_assert_eq(sm[127], 0.0f);
  cr_assert_eq(um[0], 0.0f);
  // A few values as bitsandbytes 0.50.2's create_dynamic_map() gives them
  // (tests/optim/test_bnb_pin.py compares all of them where bnb is installed).
  cr_assert_eq(f32_bits(sm[0]), 0xbf7e3333u);  // -0.99297
  cr_assert_eq(f32_bits(sm[3]), 0xbf736666u);
  cr_assert_eq(f32_bits(um[1]), 0x34ae7baau);  // 3.25e-7
  cr_assert_eq(f32_bits(um[6]), 0x3714e5d5u);
  for (int t = 1; t <= 127; ++t) cr_assert_eq(sm[127 - t], -sm[127 + t]);
}

// ---- the quantizer -------------------------------------------------------------------------

Test(adam_states, code_is_nearest_and_monotonic) {
  Rng rng(5);
  for (bool s : {true, false}) {
    const float* map = int8_dynamic_map(s);
    // 0 is exact; 1 maps to 1; the extremes.
    cr_assert_eq(map[int8_code(s, 0.0f)], 0.0f);
    cr_assert_eq(map[int8_code(s, -0.0f)], 0.0f);
    cr_assert_eq(int8_code(s, 1.0f), 255);
    cr_assert_eq(map[int8_code(s, std::nanf(""))], 0.0f);
    if (s) {
      cr_assert_eq(int8_code(true, -1.0f), 0);
      cr_assert_eq(map[int8_code(true, 1e-30f)], 0.0f);
    } else {
      cr_assert_eq(int8_code(false, -0.5f), 0);
    }
    // Nearest: no neighbour is strictly closer (in double, exact); ties go
    // to the smaller magnitude.
    for (int i = 0; i < 200000; ++i) {
      const double e = -9.0 * rng.uniform();
      float y = static_cast<float>(std::pow(10.0, e));
      if (s && (i & 1)) y = -y;
      const uint8_t c = int8_code(s, y);
      const double d = std::fabs(static_cast<double>(y) - map[c]);
      for (int nb : {c - 1, c + 1}) {
        if (nb < 0 || nb > 255) continue;
        if (!s && y < 0) continue;
        const double dn = std::fabs(static_cast<double>(y) - map[nb]);
        cr_assert(d <= dn, "y=%.9g: code %d (%.9g) but %d (%.9g) is closer", static_cast<double>(y), c,
                  static_cast<double>(map[c]), nb, static_cast<double>(map[nb]));
        if (d == dn) cr_assert(std::fabs(map[c]) < std::fabs(map[nb]), "tie not to the smaller magnitude");
      }
    }
    // Monotonic over a sweep of floats in increasing order.
    const float start = s ? -1.0f : 0.0f;
    uint8_t prev = int8_code(s, start);
    for (float y = start; y <= 1.0f; y = std::nextafterf(y, 2.0f) + std::fabs(y) * 1e-4f) {
      const uint8_t c = int8_code(s, y);
      cr_assert(c >= prev, "code decreases at y=%.9g", static_cast<double>(y));
      prev = c;
    }
  }
  // Exact midpoints that are floats: the tie goes down in magnitude.
  const float* um = int8_dynamic_map(false);
  int ties = 0;
  for (int k = 0; k < 255; ++k) {
    const double mid = (static_cast<double>(um[k]) + um[k + 1]) / 2;
    if (static_cast<double>(static_cast<float>(mid)) == mid) {
      cr_assert_eq(int8_code(false, static_cast<float>(mid)), k);
      ++ties;
    }
  }
  cr_assert(ties > 0, "no representable midpoint to test ties with");
}

Test(adam_states, block_roundtrip) {
  // The block maximum decodes exactly (code of 1.0, or of -0.99297 for a
  // negative maximum in the signed map); zeros stay zeros; the last partial
  // block's absmax covers its own elements only.
  const size_t n = 600;
  std::vector<float> x(n), out(n);
  Rng rng(11);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(rng.uniform() - 0.5) * (i < 512 ? 1.0f : 1e-3f);
  x[3] = 2.5f;     // block 0's max
  x[300] = -4.0f;  // block 1's max, negative
  x[10] = 0.0f;
  std::vector<AdamIsa> isas{AdamIsa::kScalar};
  for (AdamIsa i : vector_isas()) isas.push_back(i);
  for (AdamIsa isa : isas) {
    for (bool s : {true, false}) {
      std::vector<float> xs = x;
      if (!s) {
        for (float& e : xs) e = std::fabs(e);
      }
      std::vector<uint8_t> codes(n);
      std::vector<float> absmax(int8_blocks(n));
      int8_encode(isa, s, xs.data(), n, codes.data(), absmax.data());
      int8_decode(s, codes.data(), absmax.data(), n, out.data());
      cr_assert_eq(absmax[0], 2.5f);
      cr_assert_eq(absmax[1], 4.0f);
      float tail = 0;
      for (size_t i = 512; i < n; ++i) tail = std::max(tail, std::fabs(xs[i]));
      cr_assert_eq(absmax[2], tail, "partial block absmax %g, expected %g", static_cast<double>(absmax[2]),
                   static_cast<double>(tail));
      cr_assert_eq(out[3], 2.5f);
      cr_assert_eq(out[10], 0.0f);
      if (s) {
        cr_assert_eq(codes[300], 0);
        cr_assert_eq(out[300], int8_dynamic_map(true)[0] * 4.0f);
      } else {
        cr_assert_eq(out[300], 4.0f);
      }
      // Relative error of the big values: the map's step (at most 1.4% of
      // the block's absmax near 1).
      for (size_t i = 0; i < n; ++i) {
        const float a = absmax[i / kInt8BlockElems];
        cr_assert(std::fabs(out[i] - xs[i]) <= 0.0071f * a + 1e-30f, "element %zu: %g decodes to %g (absmax %g)", i,
                  static_cast<double>(xs[i]), static_cast<double>(out[i]), static_cast<double>(a));
      }
    }
  }
  // A zero block: absmax 0, every code the code of 0.
  std::vector<float> z(300, 0.0f);
  std::vector<uint8_t> zc(300);
  std::vector<float> za(2);
  int8_encode(AdamIsa::kScalar, true, z.data(), 300, zc.data(), za.data());
  cr_assert(za[0] == 0.0f && zc[0] == 127 && zc[299] == 127);
}

namespace {

// Every path's quantizer against int8_code() on the values `ys` (each in
// [-1, 1]): blocks of 255 of them plus a 1.0, so the block's factor is
// exactly 1 and the quantizer sees the values themselves.
void check_quantizer(bool s, const std::vector<float>& ys) {
  const std::vector<AdamIsa> isas = vector_isas();
  if (isas.empty()) cr_skip_test("no vector path on this CPU");
  const size_t per = kInt8BlockElems - 1;
  const size_t blocks = (ys.size() + per - 1) / per;
  std::vector<float> x(blocks * kInt8BlockElems, 0.0f);
  std::vector<uint8_t> want(x.size());
  for (size_t b = 0; b < blocks; ++b) {
    x[b * kInt8BlockElems + 17] = 1.0f;
    for (size_t i = 0, j = 0; i < kInt8BlockElems; ++i) {
      if (i == 17) continue;
      const size_t src = b * per + j++;
      if (src < ys.size()) x[b * kInt8BlockElems + i] = ys[src];
    }
  }
  for (size_t i = 0; i < x.size(); ++i) want[i] = int8_code(s, x[i]);
  std::vector<uint8_t> codes(x.size());
  std::vector<float> absmax(blocks);
  for (AdamIsa isa : isas) {
    std::fill(codes.begin(), codes.end(), 0);
    int8_encode(isa, s, x.data(), x.size(), codes.data(), absmax.data());
    for (size_t i = 0; i < x.size(); ++i) {
      cr_assert_eq(codes[i], want[i], "%s %s map: y=%.9g (%08x): code %d, reference %d", adam_isa_name(isa),
                   s ? "signed" : "unsigned", static_cast<double>(x[i]), f32_bits(x[i]), codes[i], want[i]);
    }
  }
}

// Floats within `w` ulps of each threshold (the midpoints between
// consecutive magnitudes of the map), positive and, for the signed map,
// negative.
std::vector<float> near_thresholds(bool s, int w) {
  const float* map = int8_dynamic_map(s);
  std::vector<float> ys;
  for (int k = s ? 127 : 0; k < 255; ++k) {
    const float mid = static_cast<float>((static_cast<double>(map[k]) + map[k + 1]) / 2);
    const uint32_t b = f32_bits(mid);
    for (int d = -w; d <= w; ++d) {
      const int64_t bb = static_cast<int64_t>(b) + d;
      if (bb < 0 || bb > 0x3f800000) continue;
      const float y = f32_from_bits(static_cast<uint32_t>(bb));
      ys.push_back(y);
      if (s) ys.push_back(-y);
    }
  }
  return ys;
}

}  // namespace

Test(adam_states, quantizer_near_every_threshold) {
  for (bool s : {true, false}) check_quantizer(s, near_thresholds(s, 4096));
}

Test(adam_states, quantizer_float_sweep) {
  // Every float in [0, 1] with PSTAR_TEST_EXHAUSTIVE=1 (about 2^30 of
  // them; minutes), else a stride of 61 (and the negatives for the signed
  // map), plus the specials.
  const bool all = std::getenv("PSTAR_TEST_EXHAUSTIVE") != nullptr;
  const uint32_t stride = all ? 1 : 61;
  const uint32_t chunk = 1u << 22;
  for (bool s : {true, false}) {
    std::vector<float> ys;
    for (uint32_t b = 0; b <= 0x3f800000u; b += stride) {
      ys.push_back(f32_from_bits(b));
      if (s && !all) ys.push_back(-f32_from_bits(b));
      if (ys.size() >= chunk) {
        check_quantizer(s, ys);
        ys.clear();
      }
    }
    for (float y : {0.0f, -0.0f, std::nanf(""), -std::nanf(""), 1.0f, -1.0f, 1e-45f, -1e-45f, 0.99999994f}) {
      ys.push_back(y);
    }
    check_quantizer(s, ys);
  }
}

Test(adam_states, quantizer_subnormal_absmax) {
  // Blocks whose absmax is subnormal: 1 / absmax overflows to +inf, so every
  // nonzero value quantizes as +-inf (the code of +-1.0) and every zero as
  // NaN (the code of 0), on each path as on the scalar one; and blocks just
  // above and below the overflow (absmax near 2^-127).
  const std::vector<AdamIsa> isas = vector_isas();
  if (isas.empty()) cr_skip_test("no vector path on this CPU");
  const std::vector<float> tops = {1e-40f, 1e-45f, 2.9e-39f, 2.95e-39f, f32_from_bits(0x00400001u), 1.2e-38f};
  std::vector<float> x(tops.size() * kInt8BlockElems, 0.0f);
  Rng rng(11);
  for (size_t b = 0; b < tops.size(); ++b) {
    for (size_t i = 0; i < kInt8BlockElems; ++i) {
      const double u = rng.uniform();
      x[b * kInt8BlockElems + i] = i % 7 == 3 ? 0.0f : static_cast<float>((2 * u - 1) * tops[b]);
    }
    x[b * kInt8BlockElems + 5] = tops[b];
  }
  for (bool s : {true, false}) {
    std::vector<float> xs = x;
    if (!s) {
      for (float& f : xs) f = std::fabs(f);
    }
    std::vector<uint8_t> want(xs.size()), codes(xs.size());
    std::vector<float> want_absmax(tops.size()), absmax(tops.size());
    int8_encode(AdamIsa::kScalar, s, xs.data(), xs.size(), want.data(), want_absmax.data());
    for (AdamIsa isa : isas) {
      int8_encode(isa, s, xs.data(), xs.size(), codes.data(), absmax.data());
      cr_assert(absmax == want_absmax, "%s: absmax differs", adam_isa_name(isa));
      for (size_t i = 0; i < xs.size(); ++i) {
        cr_assert_eq(codes[i], want[i], "%s %s map: x=%.9g in a block of absmax %.9g: code %d, reference %d",
                     adam_isa_name(isa), s ? "signed" : "unsigned", static_cast<double>(xs[i]),
                     static_cast<double>(want_absmax[i / kInt8BlockElems]), codes[i], want[i]);
      }
    }
  }
}

// ---- the kernels -----------------------------------------------------------------------------

Test(adam_states, fp32_format_is_adam_update) {
  const size_t n = 1027;
  std::vector<float> p1(n), m1(n, 0.0f), v1(n, 0.0f), p2, m2, v2;
  std::vector<uint16_t> s1(n), s2;
  Rng rng(3);
  for (size_t i = 0; i < n; ++i) {
    p1[i] = static_cast<float>(rng.uniform() - 0.5);
  }
  p2 = p1, m2 = m1, v2 = v1;
  for (int t = 1; t <= 5; ++t) {
    for (size_t i = 0; i < n; ++i) s1[i] = f32_to_bf16(make_grad(rng, i, t, false));
    s2 = s1;
    const AdamStepConstants c = adam_constants(hyper(true), static_cast<uint64_t>(t), 1.0, true);
    AdamRange a;
    a.master = p1.data(), a.exp_avg = m1.data(), a.exp_avg_sq = v1.data(), a.slot = s1.data(), a.n = n;
    adam_update(AdamIsa::kScalar, c, a);
    AdamStateRange r;
    r.master = p2.data();
    r.exp_avg.values = m2.data();
    r.exp_avg_sq.values = v2.data();
    r.slot = s2.data();
    r.n = n;
    for (AdamIsa isa : {AdamIsa::kScalar}) adam_update_states(isa, StateFormat::kFp32, c, r);
    cr_assert(p1 == p2 && m1 == m2 && v1 == v2 && s1 == s2, "fp32 format differs from adam_update at step %d", t);
  }
}

Test(adam_states, bf16_paths_equal_scalar) { paths_test(StateFormat::kBf16); }

Test(adam_states, int8_paths_equal_scalar) { paths_test(StateFormat::kInt8); }

Test(adam_states, int8_long_run_paths_equal_scalar) {
  // Many steps on one larger range: m and v move through the whole map.
  const std::vector<Path> paths = vector_paths();
  if (paths.empty()) cr_skip_test("no vector path on this CPU");
  run_config(Config{StateFormat::kInt8, PSTAR_DTYPE_BF16, false, 3 * kInt8BlockElems + 77, true}, paths, 60);
}

Test(adam_states, int8_bias_correction_division_over_the_float_range) {
  // The AVX-512 int8 paths divide sqrt(v) by sqrt(1 - beta2^t) without the
  // divider (exact_div_sqrt_bc2 in optim/adam_lanes_avx512.h): v from the
  // smallest subnormal to +inf (fp32 gradients of magnitude 2^-80 to 2^70,
  // zeros, infinities and NaN), at several beta2 and step counts, each
  // path bit-identical to the scalar division.
  const std::vector<Path> paths = vector_paths();
  if (paths.empty()) cr_skip_test("no vector path on this CPU");
  const size_t n = 4099;
  for (float beta2 : {0.999f, 0.5f, 0.0f, 0.99999994f}) {
    for (uint64_t t0 : {uint64_t{1}, uint64_t{2}, uint64_t{10}, uint64_t{1000}, uint64_t{1000000}}) {
      AdamHyper h = hyper(true);
      h.beta2 = beta2;
      State ref(StateFormat::kInt8, n, PSTAR_DTYPE_BF16);
      init_state(ref, t0 * 7 + 1);
      std::vector<State> got(paths.size(), ref);
      Rng rng(t0 * 13 + static_cast<uint64_t>(beta2 * 1000));
      for (uint64_t t = t0; t < t0 + 3; ++t) {
        std::vector<float> g(n);
        for (size_t i = 0; i < n; ++i) {
          const double e = -80.0 + 150.0 * rng.uniform();
          g[i] = static_cast<float>((rng.uniform() < 0.5 ? -1.0 : 1.0) * std::exp2(e));
          if (i % 97 == 13) g[i] = 0.0f;
          if (i % 101 == 17 && t == t0 + 1) g[i] = INFINITY;
          if (i % 103 == 19 && t == t0 + 2) g[i] = std::nanf("");
        }
        const AdamStepConstants c = adam_constants(h, t, 1.0, true);
        for (size_t i = 0; i < n; ++i) put_grad(ref, true, i, g[i]);
        isa_path(AdamIsa::kScalar).run(StateFormat::kInt8, c, ref.range(true, 0, n));
        for (size_t k = 0; k < paths.size(); ++k) {
          for (size_t i = 0; i < n; ++i) put_grad(got[k], true, i, g[i]);
          paths[k].run(StateFormat::kInt8, c, got[k].range(true, 0, n));
          cr_assert(got[k].same(ref), "path %s differs from scalar, beta2 %.9g, step %llu: %s", paths[k].name.c_str(),
                    static_cast<double>(beta2), static_cast<unsigned long long>(t),
                    got[k].first_difference(ref).c_str());
        }
      }
    }
  }
}

Test(adam_states, moments_to_and_from_f32) {
  const size_t n = 700;
  Rng rng(9);
  std::vector<float> x(n), back(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(rng.uniform() * 0.01);
  for (StateFormat f : {StateFormat::kFp32, StateFormat::kBf16, StateFormat::kInt8}) {
    std::vector<uint8_t> list(moment_list_bytes(f, n), 0);
    moments_from_f32(f, true, list.data(), n, 0, n, x.data());
    moments_to_f32(f, true, list.data(), n, 0, n, back.data());
    for (size_t i = 0; i < n; ++i) {
      const double tol = f == StateFormat::kFp32 ? 0.0 : f == StateFormat::kBf16 ? 0.004 * x[i] : 0.0071 * 0.01;
      cr_assert(std::fabs(back[i] - x[i]) <= tol, "%s element %zu: %g back as %g", state_format_name(f), i,
                static_cast<double>(x[i]), static_cast<double>(back[i]));
    }
    // A write of [300, 400): inside block 1 only; blocks 0 and 2 untouched.
    std::vector<uint8_t> before = list;
    std::vector<float> patch(100, 0.005f);
    moments_from_f32(f, true, list.data(), n, 300, 100, patch.data());
    moments_to_f32(f, true, list.data(), n, 300, 100, back.data());
    for (size_t i = 0; i < 100; ++i) {
      cr_assert(std::fabs(back[i] - 0.005f) <= (f == StateFormat::kFp32 ? 0.0 : 0.00004), "%s patched %g",
                state_format_name(f), static_cast<double>(back[i]));
    }
    if (f == StateFormat::kInt8) {
      cr_assert(std::memcmp(list.data(), before.data(), 256) == 0, "block 0 changed");
      cr_assert(std::memcmp(list.data() + 512, before.data() + 512, n - 512) == 0, "block 2 changed");
    }
  }
}

// ---- convergence ------------------------------------------------------------------------------

namespace {

// 100 AdamW steps on f(p) = sum h_i (p_i - t_i)^2 / 2 (gradients from the
// fp32 master, through the bf16 slot), from p = 0; returns f at the end.
double quadratic_run(StateFormat f, std::vector<float>& p, double* loss0) {
  const size_t n = 8192;
  std::vector<float> h(n), tgt(n);
  Rng rng(21);
  for (size_t i = 0; i < n; ++i) {
    h[i] = static_cast<float>(std::pow(10.0, 2.0 * rng.uniform() - 1.0));  // curvature 0.1 .. 10
    tgt[i] = static_cast<float>(2.0 * rng.uniform() - 1.0);
  }
  State s(f, n, PSTAR_DTYPE_BF16);
  std::fill(s.master.begin(), s.master.end(), 0.0f);
  if (loss0 != nullptr) {
    *loss0 = 0;
    for (size_t i = 0; i < n; ++i) *loss0 += 0.5 * h[i] * tgt[i] * tgt[i];
  }
  AdamHyper hp;
  hp.lr = 0.02f;
  hp.weight_decay = 0.0f;
  for (int t = 1; t <= 100; ++t) {
    for (size_t i = 0; i < n; ++i) s.grad32[i] = h[i] * (s.master[i] - tgt[i]);
    adam_update_states(adam_default_isa(), f, adam_constants(hp, static_cast<uint64_t>(t), 1.0, true),
                       s.range(true, 0, n));
  }
  double loss = 0;
  for (size_t i = 0; i < n; ++i) loss += 0.5 * h[i] * (s.master[i] - tgt[i]) * (s.master[i] - tgt[i]);
  p = s.master;
  return loss;
}

}  // namespace

Test(adam_states, convergence_on_a_quadratic) {
  // Tolerances: every format brings the loss below 1e-3 of where it
  // started; the final loss differs from the fp32 format's by at most 2e-4
  // (bf16: 5e-5) of the starting loss; the masters' mean distance from the
  // fp32 format's stays below 2% (bf16: 0.5%) of the mean distance they
  // travelled.  (At the end all three oscillate about the optimum with
  // steps of about lr; int8's rounding of m near 0 makes that oscillation
  // larger, so its final loss is about 3x fp32's, 1e-4 of the start.)
  std::vector<float> p32, pb, pi;
  double l0 = 0;
  const double l32 = quadratic_run(StateFormat::kFp32, p32, &l0);
  const double lb = quadratic_run(StateFormat::kBf16, pb, nullptr);
  const double li = quadratic_run(StateFormat::kInt8, pi, nullptr);
  double travel = 0, db = 0, di = 0;
  for (size_t i = 0; i < p32.size(); ++i) {
    travel += std::fabs(p32[i]);
    db += std::fabs(pb[i] - p32[i]);
    di += std::fabs(pi[i] - p32[i]);
  }
  std::fprintf(stderr,
               "convergence: loss from %.6g to: fp32 %.6g bf16 %.6g int8 %.6g; mean |p - p_fp32| / mean travel: "
               "bf16 %.3g, int8 %.3g\n",
               l0, l32, lb, li, db / travel, di / travel);
  for (double l : {l32, lb, li}) cr_assert(l < 1e-3 * l0, "a format did not converge (loss %g from %g)", l, l0);
  cr_assert(std::fabs(lb - l32) <= 5e-5 * l0, "bf16 loss %g vs fp32 %g", lb, l32);
  cr_assert(std::fabs(li - l32) <= 2e-4 * l0, "int8 loss %g vs fp32 %g", li, l32);
  cr_assert(db / travel < 0.005, "bf16 masters drift %g", db / travel);
  cr_assert(di / travel < 0.02, "int8 masters drift %g", di / travel);
}
