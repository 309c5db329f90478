// bf16 masters with stochastic rounding (optim/adam_masters.h).
//
// What is checked:
//  - The rounding: over all 2^16 random words, the mean of the rounded
//    values is the fp32 value exactly (unbiased), and only its two bf16
//    neighbours occur; bf16 values, NaN, infinities and subnormals as
//    documented.
//  - The random bits: a function of seed, step, chunk and offset only.
//  - The update: the scalar path against an element-by-element reference
//    (widen, adam_element, round stochastically, the weight from the new
//    master); every vector path against the scalar one bit for bit, for
//    every state format, bf16 and f16 slots, in place and out of place
//    (inputs untouched); a range split in two at any block gives the same
//    bits as the whole (the thread split and the tiles do not matter).
//  - Training: with a learning rate far below half a bf16 ulp of the
//    weights, rounding to nearest would never move them; the stochastic
//    masters follow the fp32 masters' mean path.
#include <criterion/criterion.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "optim/adam_kernel.h"
#include "optim/adam_masters.h"
#include "optim/adam_states.h"
#include "util/dtype.h"
#include "splitmix_rng.h"

using namespace pstar;
using namespace pstar::optim;

namespace {

using pstar_test::Rng;

// One range's lists: bf16 masters, moments in `f`, the slot.
struct Lists {
  StateFormat f;
  size_t n;
  pstar_dtype dtype;
  std::vector<uint16_t> master;
  std::vector<uint8_t> m, v, slot;
  Lists(StateFormat f_, size_t n_, pstar_dtype d)
      : f(f_), n(n_), dtype(d), master(n_), m(moment_list_bytes(f_, n_)), v(moment_list_bytes(f_, n_)),
        slot(n_ * dtype_size(d)) {}
  AdamStateRange range(size_t lo, size_t hi, SrStream s, uint64_t offset) {
    AdamStateRange r;
    r.bf16.master = master.data() + lo;
    r.bf16.stream = s;
    r.bf16.offset = offset + lo;
    r.exp_avg = moment_list_at(f, m.data(), n, lo);
    r.exp_avg_sq = moment_list_at(f, v.data(), n, lo);
    r.slot = slot.data() + lo * dtype_size(dtype);
    r.dtype = dtype;
    r.n = hi - lo;
    return r;
  }
  bool operator==(const Lists& o) const { return master == o.master && m == o.m && v == o.v && slot == o.slot; }
};

// Updates `in` out of place with `isa` and returns the results (new lists
// with in's slot: its gradients on entry).
Lists updated_out_of_place(AdamIsa isa, const Lists& in, const AdamStepConstants& c, SrStream s, uint64_t offset) {
  Lists out(in.f, in.n, in.dtype);
  out.slot = in.slot;
  AdamStateRange o = out.range(0, in.n, s, offset);
  o.bf16.master_in = in.master.data();
  o.exp_avg_in = moment_list_at(in.f, static_cast<const void*>(in.m.data()), in.n, 0);
  o.exp_avg_sq_in = moment_list_at(in.f, static_cast<const void*>(in.v.data()), in.n, 0);
  adam_update_states(isa, in.f, c, o);
  return out;
}

Lists initial(StateFormat f, size_t n, pstar_dtype d, uint64_t seed) {
  Lists l(f, n, d);
  Rng rng(seed);
  for (size_t i = 0; i < n; ++i) l.master[i] = f32_to_bf16(static_cast<float>(0.05 * rng.normal()));
  return l;
}

void gradients(Lists& l, uint64_t seed) {
  Rng rng(seed);
  for (size_t i = 0; i < l.n; ++i) store_as(l.slot.data(), l.dtype, i, static_cast<float>(0.01 * rng.normal()));
}

AdamStepConstants constants(uint64_t step) {
  AdamHyper h;
  h.lr = 1e-3f;
  h.weight_decay = 0.01f;
  return adam_constants(h, step, 1.0, true);
}

std::vector<AdamIsa> isas() {
  std::vector<AdamIsa> v{AdamIsa::kScalar};
  for (AdamIsa isa : {AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    if (adam_isa_supported(isa)) {
      v.push_back(isa);
    } else {
      std::fprintf(stderr, "test_adam_masters: %s not supported by this CPU: skipped\n", adam_isa_name(isa));
    }
  }
  return v;
}

const StateFormat kFormats[] = {StateFormat::kFp32, StateFormat::kBf16, StateFormat::kInt8};

}  // namespace

Test(adam_masters, rounding_is_unbiased) {
  Rng rng(7);
  std::vector<float> xs = {1.0f, -1.0f, 1.00390625f, 3.14159265f, -2.7182817f, 1e-30f, -6.5e37f, 0.0f, -0.0f};
  for (int i = 0; i < 200; ++i) xs.push_back(static_cast<float>(rng.normal() * std::pow(10.0, (i % 20) - 10)));
  for (float x : xs) {
    const uint32_t bits = f32_bits(x);
    const float down = bf16_to_f32(static_cast<uint16_t>(bits >> 16));
    double sum = 0.0;
    for (uint32_t r = 0; r < 65536; ++r) {
      const float y = bf16_to_f32(f32_to_bf16_stochastic(x, r));
      // Only the two neighbours (truncation and one ulp up in magnitude).
      cr_assert(y == down || f32_bits(y) == f32_bits(down) + 0x10000u, "%a rounded to %a", x, y);
      sum += y;
    }
    cr_assert_eq(sum / 65536.0, static_cast<double>(x), "mean of %a's roundings is %a", x, sum / 65536.0);
  }
  // A bf16 value never moves; NaN stays NaN; infinities stay; subnormals
  // become signed zeros.
  for (uint32_t r : {0u, 1u, 0x8000u, 0xffffu}) {
    cr_assert_eq(f32_to_bf16_stochastic(1.5f, r), f32_to_bf16(1.5f));
    cr_assert(std::isnan(bf16_to_f32(f32_to_bf16_stochastic(NAN, r))));
    cr_assert_eq(f32_to_bf16_stochastic(INFINITY, r), 0x7f80u);
    cr_assert_eq(f32_to_bf16_stochastic(-INFINITY, r), 0xff80u);
    cr_assert_eq(f32_to_bf16_stochastic(1e-40f, r), 0x0000u);
    cr_assert_eq(f32_to_bf16_stochastic(-1e-40f, r), 0x8000u);
  }
}

Test(adam_masters, bits_are_a_function_of_seed_step_chunk_offset) {
  const SrStream s = sr_stream(1, 2, 3);
  const SrStream again = sr_stream(1, 2, 3);
  cr_assert(s.a == again.a && s.b == again.b);
  for (const SrStream& other : {sr_stream(2, 2, 3), sr_stream(1, 3, 3), sr_stream(1, 2, 4)}) {
    int same = 0;
    for (uint64_t i = 0; i < 1024; ++i) same += sr_bits(s, i) == sr_bits(other, i);
    cr_assert_lt(same, 2, "streams of another seed, step or chunk share %d of 1024 words", same);
  }
  // Offsets beyond 2^32 differ from their low words.
  int same = 0;
  for (uint64_t i = 0; i < 1024; ++i) same += sr_bits(s, i) == sr_bits(s, i + (uint64_t{1} << 32));
  cr_assert_lt(same, 2);
  // Roughly uniform low 16 bits: the mean of 2^16 words within 1% of 2^15.
  double sum = 0.0;
  for (uint64_t i = 0; i < 65536; ++i) sum += sr_bits(s, i) & 0xffffu;
  cr_assert_lt(std::fabs(sum / 65536.0 / 32768.0 - 1.0), 0.01);
}

Test(adam_masters, scalar_matches_the_element_reference) {
  const size_t n = 2 * 2048 + 300;
  for (pstar_dtype d : {PSTAR_DTYPE_BF16, PSTAR_DTYPE_F16}) {
    Lists l = initial(StateFormat::kFp32, n, d, 11);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    std::vector<uint16_t> master = l.master;
    for (uint64_t step = 1; step <= 5; ++step) {
      gradients(l, 100 + step);
      std::vector<uint8_t> slot_in = l.slot;
      const SrStream s = sr_stream(42, step, 9);
      const AdamStepConstants c = constants(step);
      adam_update_states(AdamIsa::kScalar, StateFormat::kFp32, c, l.range(0, n, s, 1000));
      for (size_t i = 0; i < n; ++i) {
        float p = bf16_to_f32(master[i]);
        adam_element(c, load_as(slot_in.data(), d, i), p, m[i], v[i]);
        master[i] = f32_to_bf16_stochastic(p, sr_bits(s, 1000 + i));
        cr_assert_eq(l.master[i], master[i], "step %llu element %zu", static_cast<unsigned long long>(step), i);
        std::vector<uint8_t> expect(dtype_size(d));
        store_as(expect.data(), d, 0, bf16_to_f32(master[i]));
        cr_assert_eq(std::memcmp(l.slot.data() + i * dtype_size(d), expect.data(), dtype_size(d)), 0,
                     "the weight of element %zu is not the rounding of its master", i);
      }
      cr_assert_eq(std::memcmp(l.m.data(), m.data(), n * 4), 0);
      cr_assert_eq(std::memcmp(l.v.data(), v.data(), n * 4), 0);
    }
  }
}

Test(adam_masters, every_path_every_format_same_bits) {
  const size_t n = 3 * 2048 + 256 + 77;
  for (StateFormat f : kFormats) {
    for (pstar_dtype d : {PSTAR_DTYPE_BF16, PSTAR_DTYPE_F16}) {
      for (bool oop : {false, true}) {
        std::vector<Lists> runs;
        for (AdamIsa isa : isas()) {
          Lists l = initial(f, n, d, 5);
          for (uint64_t step = 1; step <= 4; ++step) {
            gradients(l, 200 + step);
            const SrStream s = sr_stream(3, step, 1);
            if (oop) {
              const Lists in = l;  // the inputs, kept to check they stay
              Lists out = updated_out_of_place(isa, l, constants(step), s, 512);
              cr_assert(l.master == in.master && l.m == in.m && l.v == in.v, "%s: inputs changed",
                        adam_isa_name(isa));
              l = out;
            } else {
              adam_update_states(isa, f, constants(step), l.range(0, n, s, 512));
            }
          }
          runs.push_back(l);
        }
        for (size_t k = 1; k < runs.size(); ++k) {
          cr_assert(runs[k] == runs[0], "format %s dtype %d %s: path %zu differs from the scalar one",
                    state_format_name(f), static_cast<int>(d), oop ? "out of place" : "in place", k);
        }
      }
    }
  }
}

Test(adam_masters, out_of_place_equals_in_place_and_splits_do_not_matter) {
  const size_t n = 2 * 2048 + 512 + 100;
  for (StateFormat f : kFormats) {
    Lists whole = initial(f, n, PSTAR_DTYPE_BF16, 8);
    Lists split = whole;
    Lists oop = whole;
    for (uint64_t step = 1; step <= 3; ++step) {
      gradients(whole, 300 + step);
      split.slot = whole.slot;
      oop.slot = whole.slot;
      const SrStream s = sr_stream(9, step, 2);
      adam_update_states(AdamIsa::kScalar, f, constants(step), whole.range(0, n, s, 0));
      const size_t cut = 256 * (step + 2);  // a block boundary, not a tile's
      adam_update_states(AdamIsa::kScalar, f, constants(step), split.range(0, cut, s, 0));
      adam_update_states(AdamIsa::kScalar, f, constants(step), split.range(cut, n, s, 0));
      oop = updated_out_of_place(AdamIsa::kScalar, oop, constants(step), s, 0);
      cr_assert(split == whole, "format %s: a split at %zu changed the bits", state_format_name(f), cut);
      cr_assert(oop == whole, "format %s: out of place differs from in place", state_format_name(f));
    }
  }
}

Test(adam_masters, small_updates_are_not_lost) {
  // Weights near 1 (a bf16 ulp of 2^-7), a steady gradient of 1 and lr
  // 1e-4: each step moves an fp32 master by about 1e-4, under 2% of an ulp.
  const size_t n = 8192;
  const int steps = 200;
  AdamHyper h;
  h.lr = 1e-4f;
  std::vector<float> fp32_master(n, 1.0f), m32(n, 0.0f), v32(n, 0.0f);
  Lists l(StateFormat::kFp32, n, PSTAR_DTYPE_BF16);
  for (size_t i = 0; i < n; ++i) l.master[i] = f32_to_bf16(1.0f);
  std::vector<uint16_t> nearest(n, f32_to_bf16(1.0f));
  std::vector<float> mn(n, 0.0f), vn(n, 0.0f);
  for (int t = 1; t <= steps; ++t) {
    const AdamStepConstants c = adam_constants(h, t, 1.0, false);
    for (size_t i = 0; i < n; ++i) {
      adam_element(c, 1.0f, fp32_master[i], m32[i], v32[i]);
      float p = bf16_to_f32(nearest[i]);
      adam_element(c, 1.0f, p, mn[i], vn[i]);
      nearest[i] = f32_to_bf16(p);
      store_as(l.slot.data(), PSTAR_DTYPE_BF16, i, 1.0f);
    }
    adam_update_states(AdamIsa::kScalar, StateFormat::kFp32, c, l.range(0, n, sr_stream(1, t, 0), 0));
  }
  double mean_sr = 0.0;
  for (size_t i = 0; i < n; ++i) mean_sr += bf16_to_f32(l.master[i]);
  mean_sr /= n;
  const double moved32 = 1.0 - fp32_master[0];
  cr_assert_eq(bf16_to_f32(nearest[0]), 1.0f, "rounding to nearest moved (the premise of this test)");
  cr_assert_gt(moved32, 0.015);
  cr_assert_lt(std::fabs((1.0 - mean_sr) - moved32), 0.03 * moved32, "stochastic masters moved %g, fp32 %g",
               1.0 - mean_sr, moved32);
}
