#include "chunk/tensor_state.h"

namespace pstar::chunk {

const char* state_name(TensorState s) {
  switch (s) {
    case TensorState::kFree: return "FREE";
    case TensorState::kHold: return "HOLD";
    case TensorState::kCompute: return "COMPUTE";
    case TensorState::kHoldAfterFwd: return "HOLD_AFTER_FWD";
    case TensorState::kHoldAfterBwd: return "HOLD_AFTER_BWD";
  }
  return "?";
}

const char* event_name(TensorEvent e) {
  switch (e) {
    case TensorEvent::kBuild: return "build";
    case TensorEvent::kAcquireForward: return "acquire(FORWARD)";
    case TensorEvent::kAcquireRecompute: return "acquire(RECOMPUTE)";
    case TensorEvent::kAcquireBackward: return "acquire(BACKWARD)";
    case TensorEvent::kAcquireEval: return "acquire(FORWARD, eval)";
    case TensorEvent::kReleaseForward: return "release(FORWARD)";
    case TensorEvent::kReleaseBackward: return "release(BACKWARD)";
    case TensorEvent::kReleaseBackwardLast: return "release(last BACKWARD)";
    case TensorEvent::kReleaseEval: return "release(eval)";
    case TensorEvent::kStep: return "step";
    case TensorEvent::kAcquireNextMicroBatch: return "acquire(FORWARD, next micro-batch)";
    case TensorEvent::kAbort: return "abort";
  }
  return "?";
}

}  // namespace pstar::chunk
