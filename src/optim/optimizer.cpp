#include "optim/optimizer.h"

#include <cmath>

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
  ++step_;
  return SegmentList(hyper_, step_, clip_coef / static_cast<double>(scaler_.scale()));
}

}  // namespace pstar::optim
