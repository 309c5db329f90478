#include <criterion/criterion.h>

#include <cmath>

#include "optim/adam.h"
#include "optim/loss_scaler.h"

using namespace pstar::optim;

// The update against a reference written in double: the float path may
// differ by rounding only.
Test(adam, matches_a_double_precision_reference) {
  AdamHyper h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  h.adamw = true;
  float p = 0.5f, m = 0.0f, v = 0.0f;
  double pd = 0.5, md = 0.0, vd = 0.0;
  for (uint64_t t = 1; t <= 20; ++t) {
    const float g = 0.25f * static_cast<float>(t % 3) - 0.2f;
    const AdamStepConstants c = adam_constants(h, t, 1.0, true);
    adam_element(c, g, p, m, v);
    md = 0.9 * md + 0.1 * g;
    vd = 0.999 * vd + 0.001 * static_cast<double>(g) * g;
    const double bc1 = 1 - std::pow(0.9, static_cast<double>(t));
    const double bc2 = 1 - std::pow(0.999, static_cast<double>(t));
    pd *= 1 - 0.01 * 0.1;
    pd -= 0.01 / bc1 * md / (std::sqrt(vd) / std::sqrt(bc2) + 1e-8);
  }
  cr_assert(std::fabs(p - pd) < 1e-5, "p %g ref %g", p, pd);
}

Test(adam, l2_mode_adds_decay_to_the_gradient_and_no_decay_flag_disables_it) {
  AdamHyper h;
  h.lr = 0.1f;
  h.weight_decay = 0.5f;
  h.adamw = false;
  const AdamStepConstants with = adam_constants(h, 1, 1.0, true);
  const AdamStepConstants without = adam_constants(h, 1, 1.0, false);
  cr_assert_eq(with.l2, 0.5f);
  cr_assert_eq(with.decay_mul, 1.0f);
  cr_assert_eq(without.l2, 0.0f);
  h.adamw = true;
  const AdamStepConstants w = adam_constants(h, 1, 1.0, true);
  cr_assert_eq(w.l2, 0.0f);
  cr_assert_eq(w.decay_mul, static_cast<float>(1.0 - 0.1 * 0.5));
}

Test(adam, zero_gradient_zero_decay_leaves_weight_unchanged) {
  AdamHyper h;
  h.weight_decay = 0.0f;
  float p = 1.25f, m = 0.0f, v = 0.0f;
  adam_element(adam_constants(h, 1, 1.0, true), 0.0f, p, m, v);
  cr_assert_eq(p, 1.25f);
}

Test(loss_scaler, growth_backoff_hysteresis_and_minimum) {
  LossScalerConfig cfg;
  cfg.enabled = true;
  cfg.initial = 8.0f;
  cfg.growth_interval = 3;
  cfg.hysteresis = 2;
  cfg.min_scale = 2.0f;
  LossScaler s(cfg);
  s.update(false);
  s.update(false);
  cr_assert_eq(s.scale(), 8.0f);
  s.update(false);
  cr_assert_eq(s.scale(), 16.0f);
  s.update(true);  // first overflow: hysteresis absorbs it
  cr_assert_eq(s.scale(), 16.0f);
  s.update(true);
  cr_assert_eq(s.scale(), 8.0f);
  for (int i = 0; i < 10; ++i) s.update(true);
  cr_assert_eq(s.scale(), 2.0f);
  LossScalerConfig off;
  LossScaler d(off);
  d.update(true);
  cr_assert_eq(d.scale(), 1.0f);
}

Test(loss_scaler, growth_stops_at_the_largest_float) {
  // A scale of infinity would stay infinite through every backoff.
  LossScalerConfig cfg;
  cfg.enabled = true;
  cfg.initial = 1e38f;
  cfg.growth_factor = 1e30f;
  cfg.growth_interval = 1;
  LossScaler s(cfg);
  s.update(false);
  cr_assert_eq(s.scale(), 1e38f, "grew to %g", static_cast<double>(s.scale()));
  cfg.initial = 1e8f;
  LossScaler t(cfg);
  t.update(false);
  cr_assert_eq(t.scale(), 1e8f * 1e30f);
  t.update(false);  // would overflow: kept
  cr_assert_eq(t.scale(), 1e8f * 1e30f);
}
