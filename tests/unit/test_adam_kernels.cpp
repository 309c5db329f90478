// The fused Adam kernels (optim/adam_kernel.h): every instruction-set path
// this CPU can run against a double-precision reference, and the paths
// against each other bit for bit.
//
// What is checked, and how strictly:
//  - Against the reference (Adam/AdamW in double, written out from the
//    hyperparameters, not from the float per-step constants): a tolerance,
//    because the kernels compute in fp32, and one fixed relative tolerance
//    would be wrong both ways: the error of an fp32 master grows with the
//    steps (every step rounds p twice, and m and v carry their roundings
//    forward), and it depends on how well conditioned each element's
//    update is.  So the reference carries, per element, a running
//    first-order bound on |fp32 - exact| for p, m and v (Wilkinson-style
//    error analysis of exactly the operations of adam_element(): every fp32
//    operation adds at most 2^-24 of its result's magnitude, plus 2^-150
//    absolute when the result is subnormal; input errors propagate through
//    the partial derivatives: through m / denom, through sqrt(v), and
//    through the L2 term wd * p back into the gradient).  A kernel passes
//    when |fp32 - exact| <= 2 * bound (the 2 covers the dropped second-order
//    terms).  For well-conditioned elements the bound is a few hundred fp32
//    ulps after 50 steps (median about 1e-5 of |p|) and the kernels'
//    actual error stays below a quarter of it (PSTAR_TEST_ERROR_STATS=1
//    prints both).  It is tight enough to catch small slips: a step size
//    off by 1e-4 of itself, an AdamW decay factor off by 1e-3 of lr * wd,
//    beta1 off by 1e-4 or eps doubled each fail at the first step (tried
//    by mutating the reference).  Where the
//    exact dynamics are ill-conditioned the bound honestly becomes wide:
//    with L2 decay and a gradient that is zero or subnormal, Adam's step on
//    wd * p alone drives p to oscillate about 0 with steps of about lr, and
//    any rounding is amplified; the bound is then capped by the largest
//    step Adam can take (|m / denom| <= bc1 sqrt(t / beta2^t)).  Those
//    elements are still checked bit for bit between the paths (below).
//    NaN must be NaN in both, an infinity the same infinity.  The emitted
//    compute-dtype weight is checked exactly: it must be the util/dtype.h
//    conversion of the kernel's own new master, bit for bit.
//  - Between paths (scalar, AVX2, AVX-512, AVX-512 with and without the
//    AVX512-BF16 instruction): master, m, v and the slot must be
//    bit-identical (memcmp) after every step, NaN payloads included.  This
//    is the strict check: rounding-level differences that the reference
//    tolerance cannot see show up here.
//  - Paths the CPU lacks are skipped (cr_skip_test), never counted as passed.
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
#include "util/dtype.h"
#include "splitmix_rng.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace pstar::optim {
// The AVX-512 path with the bf16 emit chosen explicitly (adam_avx512.cpp), to
// check the integer rounding against VCVTNEPS2BF16 on CPUs that have both.
void adam_update_avx512(const AdamStepConstants& c, const AdamRange& r, bool native_bf16);
}  // namespace pstar::optim

using namespace pstar;
using namespace pstar::optim;

namespace {

constexpr double kEps32 = 1.0 / 16777216.0;  // 2^-24

struct Path {
  std::string name;
  std::function<void(const AdamStepConstants&, const AdamRange&)> run;
};

Path isa_path(AdamIsa isa) {
  return Path{adam_isa_name(isa), [isa](const AdamStepConstants& c, const AdamRange& r) { adam_update(isa, c, r); }};
}

// Every path this CPU can run, the scalar reference path first.
std::vector<Path> supported_paths() {
  std::vector<Path> paths{isa_path(AdamIsa::kScalar)};
  if (adam_isa_supported(AdamIsa::kAvx2)) paths.push_back(isa_path(AdamIsa::kAvx2));
  if (adam_isa_supported(AdamIsa::kAvx512)) {
    paths.push_back(Path{"avx512-intbf16", [](const AdamStepConstants& c, const AdamRange& r) {
                           adam_update_avx512(c, r, false);
                         }});
    if (cpu_has_avx512bf16()) {
      paths.push_back(Path{"avx512-bf16insn", [](const AdamStepConstants& c, const AdamRange& r) {
                             adam_update_avx512(c, r, true);
                           }});
    }
  }
  return paths;
}

using pstar_test::Rng;

const char* dtype_str(pstar_dtype d) {
  return d == PSTAR_DTYPE_F32 ? "f32" : d == PSTAR_DTYPE_F16 ? "f16" : "bf16";
}

struct Config {
  pstar_dtype dtype = PSTAR_DTYPE_BF16;
  bool adamw = true;
  bool grad_f32 = false;  // gradients from the separate fp32 list
  size_t n = 0;
  int steps = 50;
  bool specials = true;  // subnormals, zeros, inf and NaN
  uint64_t seed = 1;

  std::string str() const {
    char b[160];
    std::snprintf(b, sizeof b, "dtype=%s %s grads=%s n=%zu", dtype_str(dtype), adamw ? "adamw" : "adam",
                  grad_f32 ? "f32-list" : "slot", n);
    return b;
  }
  double loss_scale() const { return dtype == PSTAR_DTYPE_F16 ? 1024.0 : 1.0; }
  double grad_mul() const { return 0.8374 / loss_scale(); }  // clip coefficient / loss scale
  AdamHyper hyper() const {
    AdamHyper h;
    h.lr = 0.01f;
    h.weight_decay = 0.1f;
    h.adamw = adamw;
    return h;
  }
};

// One path's buffers.
struct State {
  std::vector<float> master, m, v, grad32;
  std::vector<uint8_t> slot;

  State(size_t n, pstar_dtype d) : master(n), m(n), v(n), grad32(n), slot(n * dtype_size(d)) {}

  AdamRange range(const Config& cfg) {
    AdamRange r;
    r.master = master.data();
    r.exp_avg = m.data();
    r.exp_avg_sq = v.data();
    r.slot = slot.data();
    r.dtype = cfg.dtype;
    r.grad_f32 = cfg.grad_f32 ? grad32.data() : nullptr;
    r.n = master.size();
    return r;
  }
  bool same_bits(const State& o) const {
    const size_t n = master.size();
    return std::memcmp(master.data(), o.master.data(), n * 4) == 0 && std::memcmp(m.data(), o.m.data(), n * 4) == 0 &&
           std::memcmp(v.data(), o.v.data(), n * 4) == 0 && slot == o.slot;
  }
  // First element where this and `o` differ, with the bits, for messages.
  std::string first_difference(const State& o, pstar_dtype d) const {
    const size_t es = dtype_size(d);
    for (size_t i = 0; i < master.size(); ++i) {
      const bool diff = f32_bits(master[i]) != f32_bits(o.master[i]) || f32_bits(m[i]) != f32_bits(o.m[i]) ||
                        f32_bits(v[i]) != f32_bits(o.v[i]) ||
                        std::memcmp(&slot[i * es], &o.slot[i * es], es) != 0;
      if (diff) {
        char b[256];
        std::snprintf(b, sizeof b, "element %zu: master %08x/%08x m %08x/%08x v %08x/%08x slot %g/%g", i,
                      f32_bits(master[i]), f32_bits(o.master[i]), f32_bits(m[i]), f32_bits(o.m[i]), f32_bits(v[i]),
                      f32_bits(o.v[i]), static_cast<double>(load_as(slot.data(), d, i)),
                      static_cast<double>(load_as(o.slot.data(), d, i)));
        return b;
      }
    }
    return "none";
  }
};

void put_bits(std::vector<uint8_t>& buf, pstar_dtype d, size_t i, uint32_t bits) {
  if (d == PSTAR_DTYPE_F32) {
    std::memcpy(&buf[i * 4], &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(&buf[i * 2], &h, 2);
  }
}

// Element classes for the special values (disjoint NaN and inf sets, so an
// element only ever sees one NaN payload: which of two NaN operands an
// instruction propagates depends on operand order, which the compiler may
// choose differently for a vector FMA and libm's fmaf).
bool is_nan_elem(size_t i) { return i % 101 == 50; }
bool is_inf_elem(size_t i) { return i % 101 == 77; }
bool is_frozen_elem(size_t i) { return i % 23 == 11; }  // zero gradient, subnormal master
bool is_subnormal_grad_elem(size_t i) { return i % 13 == 5; }
bool is_subnormal_master_elem(size_t i) { return i % 17 == 3 || is_frozen_elem(i); }

// The stored gradients of step t (1-based), in `stored` (the slot's dtype,
// or f32 for the separate list).
void make_grads(const Config& cfg, int t, Rng& rng, std::vector<uint8_t>& buf, pstar_dtype stored) {
  for (size_t i = 0; i < cfg.n; ++i) {
    const uint64_t r = rng.next();
    const uint32_t sign = (r >> 63) != 0 ? 1u : 0u;
    uint32_t bits;
    if (cfg.specials && is_nan_elem(i) && t % 7 == 3) {
      // A signalling NaN (the arithmetic quiets it), sign fixed per element.
      const uint32_t s = (i / 101) & 1u;
      bits = stored == PSTAR_DTYPE_F32   ? (s << 31) | 0x7fa12345u
             : stored == PSTAR_DTYPE_F16 ? (s << 15) | 0x7d55u
                                         : (s << 15) | 0x7f95u;
    } else if (cfg.specials && is_inf_elem(i) && t % 11 == 5) {
      const uint32_t s = (t / 11) & 1u;
      bits = stored == PSTAR_DTYPE_F32 ? (s << 31) | 0x7f800000u : stored == PSTAR_DTYPE_F16 ? (s << 15) | 0x7c00u
                                                                                           : (s << 15) | 0x7f80u;
    } else if (cfg.specials && is_frozen_elem(i)) {
      bits = 0;
    } else if (cfg.specials && is_subnormal_grad_elem(i)) {
      const uint32_t mant = static_cast<uint32_t>(r >> 8);
      bits = stored == PSTAR_DTYPE_F32   ? (sign << 31) | (mant % 0x7fffffu + 1u)
             : stored == PSTAR_DTYPE_F16 ? (sign << 15) | (mant % 0x3ffu + 1u)
                                         : (sign << 15) | (mant % 0x7fu + 1u);
    } else {
      // |g| from 1e-3 to 10 (times the loss scale), random sign.
      const double u = static_cast<double>((r >> 11) & 0xfffffffffffull) / 17592186044416.0;
      const double g = (sign ? -1.0 : 1.0) * std::pow(10.0, 4.0 * u - 3.0) * cfg.loss_scale();
      const float gf = static_cast<float>(g);
      bits = stored == PSTAR_DTYPE_F32 ? f32_bits(gf) : stored == PSTAR_DTYPE_F16 ? f32_to_f16(gf) : f32_to_bf16(gf);
    }
    put_bits(buf, stored, i, bits);
  }
}

void init_state(const Config& cfg, State& s) {
  Rng rng(cfg.seed * 7919 + 17);
  for (size_t i = 0; i < cfg.n; ++i) {
    const uint64_t r = rng.next();
    if (cfg.specials && is_subnormal_master_elem(i)) {
      s.master[i] = f32_from_bits((static_cast<uint32_t>(r >> 63) << 31) | (static_cast<uint32_t>(r) % 0x7fffffu + 1u));
    } else {
      const double u = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);
      s.master[i] = static_cast<float>(((r & 1) ? -1.0 : 1.0) * (0.01 + 2.0 * u));
    }
    s.m[i] = 0.0f;
    s.v[i] = 0.0f;
    store_as(s.slot.data(), cfg.dtype, i, s.master[i]);
  }
}

// Adam/AdamW in double, with a running bound on the error of an fp32
// implementation of the same operations (first-order error analysis, each
// fp32 operation contributing at most eps32 times its result's magnitude):
// see the comment at the top of this file.
struct Reference {
  std::vector<double> p, m, v;     // the exact (double) state
  std::vector<double> dp, dm, dv;  // bounds on |fp32 - exact|

  explicit Reference(const State& s)
      : p(s.master.begin(), s.master.end()), m(s.m.size()), v(s.v.size()), dp(s.m.size()), dm(s.m.size()),
        dv(s.m.size()) {}

  void step(const Config& cfg, int t, const std::vector<double>& g_stored) {
    const AdamHyper h = cfg.hyper();
    const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    const double isb = 1.0 / std::sqrt(bc2), ss = lr / bc1;
    const double decay = cfg.adamw ? 1.0 - lr * wd : 1.0;
    // The L2 term is always added, with l2 = 0 for AdamW, as adam_element()
    // does: so a NaN master makes the gradient NaN in both modes.
    const double l2 = cfg.adamw ? 0.0 : wd;
    // |m / denom| <= bc1 sqrt(t / beta2^t) (Cauchy-Schwarz over the moment
    // weights): no error can exceed twice that, whatever the conditioning.
    const double q_cap = 2.2 * bc1 * std::sqrt(t / std::pow(b2, t));
    const double e = kEps32;
    // A result in the subnormal range is rounded to a multiple of 2^-149:
    // an absolute error of up to eta on top of the relative one.
    const double eta = std::ldexp(1.0, -150);
    for (size_t i = 0; i < p.size(); ++i) {
      const double gs = g_stored[i] * cfg.grad_mul();
      const double g = gs + l2 * p[i];
      // fp32: g_stored * grad_mul (grad_mul itself rounded), then the FMA;
      // plus the master's own error through the L2 term.
      const double dg = 3 * e * (std::fabs(gs) + std::fabs(l2 * p[i])) + l2 * dp[i] + 2 * eta;
      dm[i] = b1 * dm[i] + (1 - b1) * dg + 3 * e * (b1 * std::fabs(m[i]) + (1 - b1) * std::fabs(g)) + 2 * eta;
      dv[i] = b2 * dv[i] + (1 - b2) * (2 * std::fabs(g) * dg + dg * dg) +
              4 * e * (b2 * std::fabs(v[i]) + (1 - b2) * g * g) + 3 * eta;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double sv = std::sqrt(v[i]);
      const double dsv = v[i] > 0 ? std::fmin(dv[i] / (2 * sv), std::sqrt(dv[i])) : std::sqrt(dv[i]);
      const double denom = sv * isb + eps;
      const double dd = dsv * isb + 3 * e * denom;
      const double q = m[i] / denom;
      double dq = dd < 0.5 * denom ? (dm[i] + std::fabs(q) * dd) / (denom - dd) + e * std::fabs(q) : q_cap;
      dq = std::fmin(dq, q_cap);
      const double p_new = p[i] * decay - ss * q;
      dp[i] = decay * dp[i] + 3 * e * (std::fabs(p[i]) + ss * std::fabs(q)) + ss * dq + 2 * eta;
      p[i] = p_new;
    }
  }
};

bool close(double got, double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol;
}

// The bounds are first order (products of errors dropped) and each rounding
// is counted at its worst: a factor of 2 covers the neglected terms.
constexpr double kSafety = 2.0;

// Checks one path's state after step t against the reference; returns an
// empty string or the first failure.
std::string check_against_reference(const Config& cfg, int t, const State& s, const Reference& ref) {
  for (size_t i = 0; i < cfg.n; ++i) {
    const double tol_p = kSafety * ref.dp[i];
    const double tol_m = kSafety * ref.dm[i];
    const double tol_v = kSafety * ref.dv[i];
    const char* what = nullptr;
    double got = 0, want = 0, tol = 0;
    if (!close(s.master[i], ref.p[i], tol_p)) {
      what = "master", got = s.master[i], want = ref.p[i], tol = tol_p;
    } else if (!close(s.m[i], ref.m[i], tol_m)) {
      what = "m", got = s.m[i], want = ref.m[i], tol = tol_m;
    } else if (!close(s.v[i], ref.v[i], tol_v)) {
      what = "v", got = s.v[i], want = ref.v[i], tol = tol_v;
    }
    if (what != nullptr) {
      char b[256];
      std::snprintf(b, sizeof b, "step %d element %zu: %s %.9g, reference %.9g, tolerance %.3g", t, i, what, got, want,
                    tol);
      return b;
    }
    // The emitted weight: the dtype policy applied to the new master, exactly.
    uint8_t want_slot[4];
    const size_t es = dtype_size(cfg.dtype);
    store_as(want_slot, cfg.dtype, 0, s.master[i]);
    if (std::memcmp(want_slot, &s.slot[i * es], es) != 0) {
      char b[160];
      std::snprintf(b, sizeof b, "step %d element %zu: emitted weight is not the conversion of master %08x", t, i,
                    f32_bits(s.master[i]));
      return b;
    }
  }
  if (std::getenv("PSTAR_TEST_ERROR_STATS") != nullptr) {  // diagnostics: how tight the bound is
    double worst = 0;
    std::vector<double> rel;
    for (size_t i = 0; i < cfg.n; ++i) {
      if (!std::isfinite(ref.p[i]) || ref.dp[i] == 0) continue;
      worst = std::fmax(worst, std::fabs(s.master[i] - ref.p[i]) / ref.dp[i]);
      rel.push_back(ref.dp[i] / std::fmax(std::fabs(ref.p[i]), 1e-2));
    }
    std::sort(rel.begin(), rel.end());
    std::fprintf(stderr, "%s step %d: max |err|/bound %.3f, bound/max(|p|,0.01): median %.3g p99 %.3g max %.3g\n",
                 cfg.str().c_str(), t, worst, rel.empty() ? 0.0 : rel[rel.size() / 2],
                 rel.empty() ? 0.0 : rel[rel.size() * 99 / 100], rel.empty() ? 0.0 : rel.back());
  }
  return "";
}

// Runs cfg's steps on `paths` side by side: each against the reference
// (when `with_reference`), and every path bit-identical to the first.
void run_config(const Config& cfg, const std::vector<Path>& paths, bool with_reference) {
  const pstar_dtype stored = cfg.grad_f32 ? PSTAR_DTYPE_F32 : cfg.dtype;
  std::vector<State> states;
  for (size_t k = 0; k < paths.size(); ++k) {
    states.emplace_back(cfg.n, cfg.dtype);
    init_state(cfg, states.back());
  }
  Reference ref(states[0]);
  Rng rng(cfg.seed);
  std::vector<uint8_t> gbuf(cfg.n * dtype_size(stored));
  std::vector<double> gval(cfg.n);
  for (int t = 1; t <= cfg.steps; ++t) {
    make_grads(cfg, t, rng, gbuf, stored);
    for (size_t i = 0; i < cfg.n; ++i) gval[i] = load_as(gbuf.data(), stored, i);
    const AdamStepConstants c = adam_constants(cfg.hyper(), static_cast<uint64_t>(t), cfg.grad_mul(), true);
    for (size_t k = 0; k < paths.size(); ++k) {
      State& s = states[k];
      if (cfg.grad_f32) {
        std::memcpy(s.grad32.data(), gbuf.data(), gbuf.size());
      } else {
        std::memcpy(s.slot.data(), gbuf.data(), gbuf.size());
      }
      paths[k].run(c, s.range(cfg));
    }
    if (with_reference) {
      ref.step(cfg, t, gval);
      for (size_t k = 0; k < paths.size(); ++k) {
        const std::string err = check_against_reference(cfg, t, states[k], ref);
        cr_assert(err.empty(), "path %s, %s: %s", paths[k].name.c_str(), cfg.str().c_str(), err.c_str());
      }
    }
    for (size_t k = 1; k < paths.size(); ++k) {
      const bool same = states[k].same_bits(states[0]);
      cr_assert(same, "path %s differs from %s, %s, step %d: %s", paths[k].name.c_str(), paths[0].name.c_str(),
                cfg.str().c_str(), t, same ? "" : states[k].first_difference(states[0], cfg.dtype).c_str());
    }
  }
}

const size_t kRaggedLengths[] = {1, 7, 15, 16, 17, 31, 33, 47, 64, 100, 257, 1000, 4099};

void reference_test(const std::vector<Path>& paths) {
  uint64_t seed = 1;
  for (pstar_dtype d : {PSTAR_DTYPE_F16, PSTAR_DTYPE_BF16, PSTAR_DTYPE_F32}) {
    for (bool adamw : {true, false}) {
      for (bool g32 : {false, true}) {
        for (size_t n : kRaggedLengths) {
          Config cfg;
          cfg.dtype = d;
          cfg.adamw = adamw;
          cfg.grad_f32 = g32;
          cfg.n = n;
          cfg.steps = 50;
          cfg.seed = seed++;
          run_config(cfg, paths, true);
        }
      }
      // One long range (vector body plus tail), fewer steps.
      Config big;
      big.dtype = d;
      big.adamw = adamw;
      big.n = 1000003;
      big.steps = 4;
      big.seed = seed++;
      run_config(big, paths, true);
    }
  }
}

// The named path alone, or a skip when the CPU lacks it.
std::vector<Path> only(AdamIsa isa) {
  if (!adam_isa_supported(isa)) {
    if (isa == AdamIsa::kAvx512) cr_skip_test("skipped: CPU has no AVX-512 (F/BW/VL)");
    cr_skip_test("skipped: CPU has no AVX2+FMA+F16C");
  }
  if (isa == AdamIsa::kAvx512) {
    std::vector<Path> p{Path{"avx512-intbf16", [](const AdamStepConstants& c, const AdamRange& r) {
                               adam_update_avx512(c, r, false);
                             }}};
    if (cpu_has_avx512bf16()) {
      p.push_back(Path{"avx512-bf16insn",
                       [](const AdamStepConstants& c, const AdamRange& r) { adam_update_avx512(c, r, true); }});
    }
    return p;
  }
  return {isa_path(isa)};
}

// Scalar first, then the vector path(s) of `isa`.
std::vector<Path> scalar_and(AdamIsa isa) {
  std::vector<Path> p{isa_path(AdamIsa::kScalar)};
  for (Path& q : only(isa)) p.push_back(std::move(q));
  return p;
}

void identity_test(AdamIsa isa) {
  const std::vector<Path> paths = scalar_and(isa);
  uint64_t seed = 100;
  for (pstar_dtype d : {PSTAR_DTYPE_F16, PSTAR_DTYPE_BF16, PSTAR_DTYPE_F32}) {
    for (bool adamw : {true, false}) {
      for (bool g32 : {false, true}) {
        for (size_t n : kRaggedLengths) {
          Config cfg;
          cfg.dtype = d;
          cfg.adamw = adamw;
          cfg.grad_f32 = g32;
          cfg.n = n;
          cfg.steps = 50;
          cfg.seed = seed++;
          run_config(cfg, paths, false);
        }
        Config big;
        big.dtype = d;
        big.adamw = adamw;
        big.grad_f32 = g32;
        big.n = 1000003;
        big.steps = 6;
        big.seed = seed++;
        run_config(big, paths, false);
      }
    }
  }
}

// The emit of each compute dtype over a sweep of master bit patterns (every
// upper half with low halves at and around the rounding boundaries of fp16
// and bf16, plus random ones), with an update that leaves the master as it
// is: must equal util/dtype.h's conversion, and the scalar path's bits.
void emit_sweep_test(AdamIsa isa) {
  const std::vector<Path> paths = scalar_and(isa);
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x2000, 0x3000, 0x3001,
                           0x7fff, 0x8000, 0x8001, 0x9000, 0xb000, 0xffff, 0x5a5a, 0xc3e1};
  const size_t nl = sizeof lows / sizeof lows[0];
  const size_t n = 65536 * nl;
  // grad 0, m = v = 0, step_size 0, decay_mul 1, l2 0: p = fma(-0, 0 / eps, p * 1).
  AdamStepConstants c{};
  c.grad_mul = 1.0f;
  c.beta1 = 0.9f;
  c.one_minus_beta1 = 0.1f;
  c.beta2 = 0.999f;
  c.one_minus_beta2 = 0.001f;
  c.step_size = 0.0f;
  c.inv_sqrt_bc2 = 1.0f;
  c.eps = 1e-8f;
  c.l2 = 0.0f;
  c.decay_mul = 1.0f;
  for (pstar_dtype d : {PSTAR_DTYPE_F16, PSTAR_DTYPE_BF16, PSTAR_DTYPE_F32}) {
    Config cfg;
    cfg.dtype = d;
    cfg.n = n;
    std::vector<State> states;
    for (size_t k = 0; k < paths.size(); ++k) {
      State s(n, d);
      for (size_t i = 0; i < n; ++i) s.master[i] = f32_from_bits(static_cast<uint32_t>(i / nl) << 16 | lows[i % nl]);
      states.push_back(std::move(s));
      paths[k].run(c, states.back().range(cfg));
    }
    size_t bad = n, moved = n;
    for (size_t i = 0; i < n && bad == n; ++i) {
      const float before = f32_from_bits(static_cast<uint32_t>(i / nl) << 16 | lows[i % nl]);
      const float after = states[0].master[i];
      // Finite masters pass through unchanged (inf becomes NaN: 0 * inf in the L2 term).
      if (std::isfinite(before) && f32_bits(after) != f32_bits(before) && moved == n) moved = i;
      for (const State& s : states) {
        uint8_t want[4];
        store_as(want, d, 0, s.master[i]);
        if (std::memcmp(want, &s.slot[i * dtype_size(d)], dtype_size(d)) != 0) bad = i;
      }
    }
    cr_assert(moved == n, "dtype %s: master %zu changed", dtype_str(d), moved);
    for (size_t k = 0; k < states.size(); ++k) {
      cr_assert(bad == n, "path %s dtype %s: emitted element %zu (master %08x) is not the dtype.h conversion",
                paths[k].name.c_str(), dtype_str(d), bad, bad < n ? f32_bits(states[k].master[bad]) : 0u);
      cr_assert(states[k].same_bits(states[0]), "path %s dtype %s differs from scalar: %s", paths[k].name.c_str(),
                dtype_str(d), states[k].first_difference(states[0], d).c_str());
    }
  }
}

// Every 16-bit pattern as a stored fp16 / bf16 gradient (all NaN payloads,
// signalling ones included, subnormals, infinities), one step: every path
// must give the scalar path's bits.
void grad_pattern_test(AdamIsa isa) {
  const std::vector<Path> paths = scalar_and(isa);
  for (pstar_dtype d : {PSTAR_DTYPE_F16, PSTAR_DTYPE_BF16}) {
    for (bool adamw : {true, false}) {
      Config cfg;
      cfg.dtype = d;
      cfg.adamw = adamw;
      cfg.n = 65536 + 5;  // not a multiple of any vector width
      const AdamStepConstants c = adam_constants(cfg.hyper(), 3, cfg.grad_mul(), true);
      std::vector<State> states;
      for (size_t k = 0; k < paths.size(); ++k) {
        State s(cfg.n, d);
        for (size_t i = 0; i < cfg.n; ++i) {
          s.master[i] = 0.75f - static_cast<float>(i % 7) * 0.25f;
          s.m[i] = static_cast<float>(i % 5) * 0.01f - 0.02f;
          s.v[i] = static_cast<float>(i % 3) * 1e-4f;
          put_bits(s.slot, d, i, static_cast<uint32_t>(i & 0xffff));
        }
        states.push_back(std::move(s));
        paths[k].run(c, states.back().range(cfg));
      }
      for (size_t k = 1; k < states.size(); ++k) {
        cr_assert(states[k].same_bits(states[0]), "path %s %s: differs from scalar: %s", paths[k].name.c_str(),
                  cfg.str().c_str(), states[k].first_difference(states[0], d).c_str());
      }
    }
  }
}

}  // namespace

// ---- against the double-precision reference --------------------------------

Test(adam_kernels, scalar_matches_double_reference, .timeout = 110) { reference_test({isa_path(AdamIsa::kScalar)}); }

Test(adam_kernels, avx2_matches_double_reference, .timeout = 110) { reference_test(only(AdamIsa::kAvx2)); }

Test(adam_kernels, avx512_matches_double_reference, .timeout = 110) { reference_test(only(AdamIsa::kAvx512)); }

// ---- bit identity between the paths ----------------------------------------

Test(adam_kernels, avx2_bit_identical_to_scalar, .timeout = 110) { identity_test(AdamIsa::kAvx2); }

Test(adam_kernels, avx512_bit_identical_to_scalar, .timeout = 110) { identity_test(AdamIsa::kAvx512); }

Test(adam_kernels, avx512_bf16_instruction_matches_integer_rounding) {
  if (!adam_isa_supported(AdamIsa::kAvx512)) cr_skip_test("skipped: CPU has no AVX-512 (F/BW/VL)");
  if (!cpu_has_avx512bf16()) cr_skip_test("skipped: CPU has no AVX512-BF16");
  // only(kAvx512) holds both bf16 emits here: integer first, instruction second.
  const std::vector<Path> paths = only(AdamIsa::kAvx512);
  for (size_t n : kRaggedLengths) {
    Config cfg;
    cfg.dtype = PSTAR_DTYPE_BF16;
    cfg.n = n;
    cfg.seed = 7000 + n;
    run_config(cfg, paths, false);
  }
}

Test(adam_kernels, avx2_emit_follows_dtype_policy_on_bit_sweep) { emit_sweep_test(AdamIsa::kAvx2); }

Test(adam_kernels, avx512_emit_follows_dtype_policy_on_bit_sweep) { emit_sweep_test(AdamIsa::kAvx512); }

Test(adam_kernels, scalar_emit_follows_dtype_policy_on_bit_sweep) {
  // scalar_and(kScalar) would list the scalar path twice; that is harmless.
  emit_sweep_test(AdamIsa::kScalar);
}

Test(adam_kernels, avx2_every_16bit_gradient_pattern_matches_scalar) { grad_pattern_test(AdamIsa::kAvx2); }

Test(adam_kernels, avx512_every_16bit_gradient_pattern_matches_scalar) { grad_pattern_test(AdamIsa::kAvx512); }

// Splitting a range into blocks at arbitrary offsets (as the thread pool
// does) changes no bit: the update is element-wise, and vector bodies and
// tails agree.
Test(adam_kernels, split_ranges_on_a_thread_pool_give_the_same_bits) {
  const std::vector<Path> paths = supported_paths();
  Config cfg;
  cfg.dtype = PSTAR_DTYPE_BF16;
  cfg.n = 100003;
  const pstar_dtype stored = cfg.dtype;
  for (const Path& path : paths) {
    State whole(cfg.n, cfg.dtype);
    init_state(cfg, whole);
    std::vector<State> split;
    for (int k = 0; k < 3; ++k) {
      split.emplace_back(cfg.n, cfg.dtype);
      init_state(cfg, split.back());
    }
    ThreadPool pools[3] = {ThreadPool(1), ThreadPool(2), ThreadPool(4)};
    const size_t grains[3] = {1, 7, 64};
    Rng rng(cfg.seed);
    std::vector<uint8_t> gbuf(cfg.n * dtype_size(stored));
    for (int t = 1; t <= 5; ++t) {
      make_grads(cfg, t, rng, gbuf, stored);
      const AdamStepConstants c = adam_constants(cfg.hyper(), static_cast<uint64_t>(t), cfg.grad_mul(), true);
      std::memcpy(whole.slot.data(), gbuf.data(), gbuf.size());
      path.run(c, whole.range(cfg));
      for (int k = 0; k < 3; ++k) {
        State& s = split[k];
        std::memcpy(s.slot.data(), gbuf.data(), gbuf.size());
        const AdamRange full = s.range(cfg);
        pools[k].parallel_for(cfg.n, grains[k], [&](size_t b, size_t e) {
          AdamRange r = full;
          r.master += b;
          r.exp_avg += b;
          r.exp_avg_sq += b;
          r.slot = static_cast<uint8_t*>(full.slot) + b * dtype_size(cfg.dtype);
          r.n = e - b;
          path.run(c, r);
        });
        cr_assert(s.same_bits(whole), "path %s, %u threads, grain %zu, step %d: %s", path.name.c_str(),
                  pools[k].size(), grains[k], t, s.first_difference(whole, cfg.dtype).c_str());
      }
    }
  }
}

// Out of place (AdamRange's *_in lists, the speculative update): every path
// writes the bits of its in-place update into the output lists, reads the
// input lists only, and leaves them as they were; with the fp32 gradient
// list and with the gradient in the slot, over ragged lengths.
Test(adam_kernels, out_of_place_gives_the_in_place_bits_and_keeps_the_inputs) {
  for (const Path& path : supported_paths()) {
    for (pstar_dtype d : {PSTAR_DTYPE_BF16, PSTAR_DTYPE_F16, PSTAR_DTYPE_F32}) {
      for (bool grad_f32 : {false, true}) {
        for (size_t n : {size_t{1}, size_t{15}, size_t{33}, size_t{4099}}) {
          Config cfg;
          cfg.dtype = d;
          cfg.grad_f32 = grad_f32;
          cfg.n = n;
          cfg.seed = 900 + n;
          State in_place(n, d), inputs(n, d), out(n, d);
          init_state(cfg, in_place);
          for (size_t i = 0; i < n; ++i) {  // moments from earlier steps, so that reading them matters
            in_place.m[i] = static_cast<float>(i % 5) * 0.01f - 0.02f;
            in_place.v[i] = static_cast<float>(i % 3 + 1) * 1e-4f;
          }
          Rng rng(cfg.seed);
          std::vector<uint8_t> gbuf(n * dtype_size(d));
          make_grads(cfg, 1, rng, gbuf, d);
          std::memcpy(in_place.slot.data(), gbuf.data(), gbuf.size());
          for (size_t i = 0; i < n; ++i) in_place.grad32[i] = 0.5f - static_cast<float>(i % 11) * 0.1f;
          inputs = in_place;
          out = in_place;  // the slot and the gradient list; the fp32 outputs are overwritten
          std::fill(out.master.begin(), out.master.end(), -7.0f);
          std::fill(out.m.begin(), out.m.end(), -7.0f);
          std::fill(out.v.begin(), out.v.end(), -7.0f);
          const State kept = inputs;
          const AdamStepConstants c = adam_constants(cfg.hyper(), 2, cfg.grad_mul(), true);
          path.run(c, in_place.range(cfg));
          AdamRange r = out.range(cfg);
          r.master_in = inputs.master.data();
          r.exp_avg_in = inputs.m.data();
          r.exp_avg_sq_in = inputs.v.data();
          path.run(c, r);
          cr_assert(out.same_bits(in_place), "path %s %s: out of place differs from in place: %s", path.name.c_str(),
                    cfg.str().c_str(), out.first_difference(in_place, d).c_str());
          cr_assert(inputs.same_bits(kept), "path %s %s: out of place changed its inputs", path.name.c_str(),
                    cfg.str().c_str());
        }
      }
    }
  }
}

// ---- dispatch ----------------------------------------------------------------

namespace {
AdamIsa best_supported() {
  if (adam_isa_supported(AdamIsa::kAvx512)) return AdamIsa::kAvx512;
  if (adam_isa_supported(AdamIsa::kAvx2)) return AdamIsa::kAvx2;
  return AdamIsa::kScalar;
}
}  // namespace

Test(adam_kernels, default_isa_is_the_best_supported_and_the_environment_overrides_it) {
  unsetenv("PSTAR_ADAM_ISA");
  cr_assert_eq(static_cast<int>(adam_default_isa()), static_cast<int>(best_supported()));
  setenv("PSTAR_ADAM_ISA", "scalar", 1);
  cr_assert_eq(static_cast<int>(adam_default_isa()), static_cast<int>(AdamIsa::kScalar));
  setenv("PSTAR_ADAM_ISA", "avx2", 1);
  cr_assert_eq(static_cast<int>(adam_default_isa()),
               static_cast<int>(adam_isa_supported(AdamIsa::kAvx2) ? AdamIsa::kAvx2 : best_supported()));
  setenv("PSTAR_ADAM_ISA", "avx512", 1);
  cr_assert_eq(static_cast<int>(adam_default_isa()),
               static_cast<int>(adam_isa_supported(AdamIsa::kAvx512) ? AdamIsa::kAvx512 : best_supported()));
  // Unknown names fall back to the best supported path.
  setenv("PSTAR_ADAM_ISA", "sse9", 1);
  cr_assert_eq(static_cast<int>(adam_default_isa()), static_cast<int>(best_supported()));
  setenv("PSTAR_ADAM_ISA", "", 1);
  cr_assert_eq(static_cast<int>(adam_default_isa()), static_cast<int>(best_supported()));
  unsetenv("PSTAR_ADAM_ISA");
}

Test(adam_kernels, isa_names_and_scalar_always_supported) {
  cr_assert(adam_isa_supported(AdamIsa::kScalar));
  cr_assert_str_eq(adam_isa_name(AdamIsa::kScalar), "scalar");
  cr_assert_str_eq(adam_isa_name(AdamIsa::kAvx2), "avx2");
  cr_assert_str_eq(adam_isa_name(AdamIsa::kAvx512), "avx512");
  // AVX-512 implies the AVX2 path.
  if (adam_isa_supported(AdamIsa::kAvx512)) cr_assert(adam_isa_supported(AdamIsa::kAvx2));
}

Test(adam_kernels, an_unsupported_path_is_refused) {
  AdamIsa missing;
  if (!adam_isa_supported(AdamIsa::kAvx2)) {
    missing = AdamIsa::kAvx2;
  } else if (!adam_isa_supported(AdamIsa::kAvx512)) {
    missing = AdamIsa::kAvx512;
  } else {
    cr_skip_test("skipped: CPU supports every path");
  }
  float p = 1, m = 0, v = 0;
  uint16_t slot = 0;
  AdamRange r;
  r.master = &p;
  r.exp_avg = &m;
  r.exp_avg_sq = &v;
  r.slot = &slot;
  r.n = 1;
  const AdamStepConstants c = adam_constants(AdamHyper{}, 1, 1.0, true);
  cr_assert_throw(adam_update(missing, c, r), pstar::Error);
  cr_assert_eq(p, 1.0f, "nothing was updated");
}

Test(adam_kernels, empty_range_touches_nothing) {
  for (const Path& path : supported_paths()) {
    AdamRange r;  // all NULL, n == 0
    r.dtype = PSTAR_DTYPE_F16;
    path.run(adam_constants(AdamHyper{}, 1, 1.0, true), r);
  }
}
