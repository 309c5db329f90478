// The chunk-update loop (optim/chunk_update.h): one chunk holding several
// parameters with their own constants, updated in one parallel pass, gives
// the bits of one adam_update call per parameter; elements outside every
// segment (alignment gaps, parameters without a gradient) stay untouched.
#include <criterion/criterion.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "optim/chunk_update.h"
#include "optim/optimizer.h"
#include "util/dtype.h"

using namespace pstar;
using namespace pstar::optim;

namespace {

struct Lists {
  std::vector<float> master, m, v, grad;
  std::vector<uint16_t> slot;  // bf16

  explicit Lists(size_t n) : master(n), m(n), v(n), grad(n), slot(n) {
    for (size_t i = 0; i < n; ++i) {
      master[i] = 0.01f * static_cast<float>(static_cast<int>(i % 97) - 48);
      m[i] = 0.001f * static_cast<float>(i % 13);
      v[i] = 0.0001f * static_cast<float>(i % 7);
      grad[i] = 0.05f * static_cast<float>(static_cast<int>(i % 31) - 15);
      slot[i] = static_cast<uint16_t>(0x3f80 + (i % 64));
    }
  }
  ChunkLists lists(bool fp32_grad) {
    ChunkLists l;
    l.master = master.data();
    l.exp_avg = m.data();
    l.exp_avg_sq = v.data();
    l.grad_f32 = fp32_grad ? grad.data() : nullptr;
    l.slot = slot.data();
    l.dtype = PSTAR_DTYPE_BF16;
    return l;
  }
  bool same_bits(const Lists& o) const {
    auto eq = [](const auto& a, const auto& b) {
      return std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    return eq(master, o.master) && eq(m, o.m) && eq(v, o.v) && eq(slot, o.slot);
  }
};

struct Span {
  uint64_t begin, end;
  float lr_scale;
  bool decay;
};

void check(unsigned threads, bool fp32_grad) {
  // Three parameters at 128-element offsets with gaps, the middle one
  // crossing several grains; elements past the last one are unused.
  const size_t n = 5 * kAdamGrainElems + 300;
  const Span spans[3] = {{0, 700, 1.0f, true}, {768, 768 + 3000, 0.5f, false}, {3840, 3840 + 1400, 2.0f, true}};
  AdamHyper h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  ThreadPool pool(threads);
  Lists looped(n), reference(n);
  for (uint64_t step = 1; step <= 3; ++step) {
    const double grad_mul = 0.75;
    SegmentList segs(h, step, grad_mul);
    for (const Span& s : spans) segs.add(s.begin, s.end, s.lr_scale, s.decay);
    update_chunk(pool, AdamIsa::kScalar, n, segs.segments(), looped.lists(fp32_grad));
    for (const Span& s : spans) {
      AdamHyper hs = h;
      hs.lr = h.lr * s.lr_scale;
      adam_update(AdamIsa::kScalar, adam_constants(hs, step, grad_mul, s.decay),
                  reference.lists(fp32_grad).range(s.begin, s.end));
    }
    cr_assert(looped.same_bits(reference), "%u threads, fp32 gradients %d, step %llu", threads, fp32_grad ? 1 : 0,
              static_cast<unsigned long long>(step));
  }
  // Untouched outside the segments.
  const Lists fresh(n);
  for (size_t i = 700; i < 768; ++i) cr_assert_eq(looped.master[i], fresh.master[i]);
  for (size_t i = 3840 + 1400; i < n; ++i) cr_assert_eq(looped.slot[i], fresh.slot[i]);
}

}  // namespace

Test(chunk_update, three_parameters_in_one_pass_match_per_parameter_updates) {
  for (unsigned threads : {1u, 2u, 3u, 4u}) {
    check(threads, false);
    check(threads, true);
  }
}

// Every supported instruction set gives the scalar path's bits through the
// loop (the engine runs the default one).
Test(chunk_update, the_optimizer_loop_matches_the_scalar_loop) {
  const size_t n = 3 * kAdamGrainElems + 128;
  AdamHyper h;
  h.lr = 0.02f;
  LossScalerConfig sc;
  sc.enabled = true;
  sc.initial = 1024.0f;
  Optimizer opt(h, 0.0f, sc, 3);
  ThreadPool pool(1);
  Lists a(n), b(n);
  for (int t = 1; t <= 2; ++t) {
    SegmentList segs = opt.begin_step(1.0);
    segs.add(0, 1000, 1.0f, true);
    segs.add(1024, n, 0.25f, true);
    opt.update_chunk(n, segs.segments(), a.lists(true));
    update_chunk(pool, AdamIsa::kScalar, n, segs.segments(), b.lists(true));
    cr_assert(a.same_bits(b), "step %d (%s)", t, adam_isa_name(opt.isa()));
    opt.end_step(false);
  }
  cr_assert_eq(opt.step(), 2u);
}
