// Dynamic loss scaling for fp16 gradients.
//
// On a clean step the scale grows by growth_factor after growth_interval
// consecutive clean steps.  On an overflow the step is skipped; the scale
// backs off by backoff_factor once `hysteresis` overflows have been seen
// since the last growth or backoff (so a single spike does not halve it),
// never below min_scale, and never grows past the largest float (a scale of
// infinity would stay infinite through every backoff).  BF16 and F32 use a
// fixed scale of 1 (disabled).
#pragma once

#include <cmath>
#include <cstdint>

namespace pstar::optim {

struct LossScalerConfig {
  bool enabled = false;
  float initial = 65536.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  uint32_t growth_interval = 2000;
  uint32_t hysteresis = 2;
  float min_scale = 1.0f;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& cfg)
      : cfg_(cfg), scale_(cfg.enabled ? cfg.initial : 1.0f), hysteresis_left_(cfg.hysteresis) {}

  float scale() const { return scale_; }
  void set_scale(float s) { scale_ = s; }
  bool enabled() const { return cfg_.enabled; }
  // The state a checkpoint keeps, and its restore.
  uint32_t clean_steps() const { return clean_steps_; }
  uint32_t hysteresis_left() const { return hysteresis_left_; }
  void restore(float scale, uint32_t clean_steps, uint32_t hysteresis_left) {
    scale_ = scale;
    clean_steps_ = clean_steps;
    hysteresis_left_ = hysteresis_left;
  }

  // Records the outcome of a step.
  void update(bool overflow) {
    if (!cfg_.enabled) return;
    if (overflow) {
      clean_steps_ = 0;
      if (hysteresis_left_ > 1) {
        --hysteresis_left_;
        return;
      }
      scale_ = scale_ * cfg_.backoff_factor;
      if (scale_ < cfg_.min_scale) scale_ = cfg_.min_scale;
      hysteresis_left_ = cfg_.hysteresis;
      return;
    }
    if (++clean_steps_ >= cfg_.growth_interval) {
      const float grown = scale_ * cfg_.growth_factor;
      if (std::isfinite(grown)) scale_ = grown;
      clean_steps_ = 0;
      hysteresis_left_ = cfg_.hysteresis;
    }
  }

 private:
  LossScalerConfig cfg_;
  float scale_;
  uint32_t clean_steps_ = 0;
  uint32_t hysteresis_left_;
};

}  // namespace pstar::optim
