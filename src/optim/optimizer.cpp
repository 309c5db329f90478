#include "optim/optimizer.h"

#include <cfloat>
#include <cmath>
#include <string>

#include "util/error.h"
#include "util/settings.h"

namespace pstar::optim {

Optimizer::Optimizer(const AdamHyper& hyper, float clip_norm, const LossScalerConfig& scaler, unsigned threads)
    : hyper_(hyper),
      clip_norm_(clip_norm),
      scaler_(scaler),
      isa_(adam_default_isa()),
      pool_(std::make_unique<ThreadPool>(threads)) {}

double Optimizer::clip_coef(double grad_norm) const {
  if (clip_norm_ > 0.0f && std::isfinite(grad_norm) && grad_norm > clip_norm_) {
    return static_cast<double>(clip_norm_) / (grad_norm + 1e-6);
  }
  return 1.0;
}

SegmentList Optimizer::begin_step(double clip_coef) {
  SegmentList segments = next_step_segments(clip_coef);
  ++step_;
  return segments;
}

// Each value is checked as the float it is stored as (pstar.h); the
// messages name the C API's call, which is the only caller.
void Optimizer::set_hparam(pstar_hparam which, double v) {
  switch (which) {
    case PSTAR_HPARAM_LR:
      hyper_.lr = settings::require_double_as_float(v, 0.0f, settings::kMax, "hparam_set: lr", settings::kRangeLr);
      return;
    case PSTAR_HPARAM_BETA1:
      hyper_.beta1 =
          settings::require_double_as_float(v, 0.0f, settings::kBelowOne, "hparam_set: beta1", settings::kRangeBeta);
      return;
    case PSTAR_HPARAM_BETA2:
      hyper_.beta2 =
          settings::require_double_as_float(v, 0.0f, settings::kBelowOne, "hparam_set: beta2", settings::kRangeBeta);
      return;
    case PSTAR_HPARAM_EPS:
      hyper_.eps =
          settings::require_double_as_float(v, FLT_MIN, settings::kMax, "hparam_set: eps", settings::kRangeEps);
      return;
    case PSTAR_HPARAM_WEIGHT_DECAY:
      hyper_.weight_decay =
          settings::require_double_as_float(v, 0.0f, settings::kMax, "hparam_set: weight_decay", settings::kRangeDecay);
      return;
    case PSTAR_HPARAM_CLIP_NORM:
      clip_norm_ =
          settings::require_double_as_float(v, 0.0f, settings::kMax, "hparam_set: clip_norm", settings::kRangeClip);
      return;
    case PSTAR_HPARAM_LOSS_SCALE: {
      const float f =
          settings::require_double_as_float(v, FLT_MIN, FLT_MAX, "hparam_set: loss scale", settings::kRangeScale);
      require(scaler_.enabled(), PSTAR_ERR_INVALID_STATE,
              "hparam_set: loss scaling is used with the F16 compute dtype only");
      scaler_.set_scale(f);
      return;
    }
    case PSTAR_HPARAM_STEP: throw Error(PSTAR_ERR_INVALID_ARGUMENT, "hparam_set: the step count is read-only");
    case PSTAR_HPARAM_FORCE_32BIT_: break;
  }
  throw Error(PSTAR_ERR_INVALID_ARGUMENT, "hparam_set: unknown hyperparameter " + std::to_string(which));
}

double Optimizer::hparam(pstar_hparam which) const {
  switch (which) {
    case PSTAR_HPARAM_LR: return hyper_.lr;
    case PSTAR_HPARAM_BETA1: return hyper_.beta1;
    case PSTAR_HPARAM_BETA2: return hyper_.beta2;
    case PSTAR_HPARAM_EPS: return hyper_.eps;
    case PSTAR_HPARAM_WEIGHT_DECAY: return hyper_.weight_decay;
    case PSTAR_HPARAM_CLIP_NORM: return clip_norm_;
    case PSTAR_HPARAM_LOSS_SCALE: return scaler_.scale();
    case PSTAR_HPARAM_STEP: return static_cast<double>(step_);
    case PSTAR_HPARAM_FORCE_32BIT_: break;
  }
  throw Error(PSTAR_ERR_INVALID_ARGUMENT, "hparam_get: unknown hyperparameter " + std::to_string(which));
}

}  // namespace pstar::optim
