#include "placement/trace_follower.h"

#include "util/log.h"

namespace pstar::placement {

void TraceFollower::begin(bool enabled) {
  moment_ = 0;
  divergences_at_begin_ = divergences_;
  following_ = false;
  recording_now_ = false;
  if (!enabled) return;
  if (warmup_left_ > 0 || !ready_) {
    recording_now_ = true;
    recording_.clear();
    return;
  }
  following_ = true;
}

void TraceFollower::diverge_at_check() {
  diverge(moment_ >= trace_.moments() ? "more acquires than the trace has" : "another chunk than the trace's");
}

void TraceFollower::diverge(const char* why) {
  following_ = false;
  ++divergences_;
  if (retrace_ == Retrace::kFromDivergence) {
    recording_ = trace_;
    recording_.truncate(moment_);
    recording_now_ = true;
    log::info(label_ + ": access order diverged from the trace at moment " + std::to_string(moment_) + " (" + why +
              "); re-tracing from there");
  } else {
    ready_ = false;
    log::info(label_ + ": access order diverged from the trace at moment " + std::to_string(moment_) + " (" + why +
              "); recording anew in the next iteration");
  }
}

bool TraceFollower::end(uint32_t chunk_count) {
  if (following_ && moment_ != trace_.moments()) diverge("fewer acquires than the trace has");
  bool adopted = false;
  if (recording_now_) {
    if (warmup_left_ > 0) --warmup_left_;
    if (warmup_left_ == 0) {
      trace_ = std::move(recording_);
      recording_.clear();
      trace_.finalize(chunk_count);
      ready_ = true;
      adopted = true;
    }
  }
  following_ = false;
  recording_now_ = false;
  return adopted;
}

void TraceFollower::abort() {
  divergences_ = divergences_at_begin_;
  following_ = false;
  recording_now_ = false;
  recording_.clear();
  moment_ = 0;
}

}  // namespace pstar::placement
