// The optimizer's state of one engine: Adam's hyperparameters, the clipping
// norm, the loss scaler, the step count, the CPU kernel's instruction set and
// the threads the CPU updates run on.  The engine decides which chunks are
// updated where and when; the constants and the loop are here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "optim/adam.h"
#include "optim/adam_kernel.h"
#include "optim/chunk_update.h"
#include "optim/loss_scaler.h"
#include "pstar/pstar.h"
#include "util/thread_pool.h"

namespace pstar::optim {

class Optimizer {
 public:
  // `threads`: the CPU update's threads, the caller included (0: one per
  // hardware thread).
  Optimizer(const AdamHyper& hyper, float clip_norm, const LossScalerConfig& scaler, unsigned threads);

  AdamHyper& hyper() { return hyper_; }
  const AdamHyper& hyper() const { return hyper_; }
  float clip_norm() const { return clip_norm_; }
  void set_clip_norm(float c) { clip_norm_ = c; }
  // pstar_hparam_set and pstar_hparam_get: one setting, checked as the
  // float it is stored as; throws PSTAR_ERR_INVALID_ARGUMENT out of range,
  // PSTAR_ERR_INVALID_STATE for a loss scale without loss scaling.
  void set_hparam(pstar_hparam which, double value);
  double hparam(pstar_hparam which) const;
  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }
  // Applied steps so far (a checkpoint restores it).
  uint64_t step() const { return step_; }
  void set_step(uint64_t s) { step_ = s; }
  AdamIsa isa() const { return isa_; }

  // The clipping coefficient for the (unscaled) global gradient norm: 1
  // unless a clip norm is set and the norm is finite and above it.
  double clip_coef(double grad_norm) const;

  // Begins an applied step: counts it, and returns the segment builder
  // for its constants (the gradient multiplier is clip_coef over the loss
  // scale, which changes only at end_step).
  SegmentList begin_step(double clip_coef);
  // The segment builder begin_step(clip_coef) would return now, without
  // beginning the step (the constants of a speculative update).
  SegmentList next_step_segments(double clip_coef) const {
    return SegmentList(hyper_, step_ + 1, clip_coef / static_cast<double>(scaler_.scale()));
  }
  // Records the step's outcome (applied, or skipped for an inf or NaN
  // gradient) in the loss scaler.
  void end_step(bool skipped) { scaler_.update(skipped); }

  // The CPU update of one chunk's elements [0, elems) (update_chunk on this
  // optimizer's threads, with its instruction set).
  void update_chunk(uint64_t elems, const std::vector<Segment>& segments, const ChunkLists& lists) {
    optim::update_chunk(*pool_, isa_, elems, segments, lists);
  }

 private:
  AdamHyper hyper_;
  float clip_norm_ = 0.0f;
  LossScaler scaler_;
  uint64_t step_ = 0;
  AdamIsa isa_ = AdamIsa::kScalar;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace pstar::optim
