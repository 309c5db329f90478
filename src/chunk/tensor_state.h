// Tensor states and the explicit table of legal transitions.
//
// A parameter's state says what the runtime may do with its chunk: a chunk
// with a tensor in COMPUTE must stay where it is; the others may move.  Every
// call that changes a state looks the transition up here first; an event
// that is not legal in the current state is refused (PSTAR_ERR_INVALID_STATE)
// before anything changes.
#pragma once

#include <cstdint>

namespace pstar::chunk {

enum class TensorState : uint8_t {
  kFree = 0,          // before the engine is built: no memory
  kHold = 1,          // weights in place, not in use
  kCompute = 2,       // acquired: pointer handed out
  kHoldAfterFwd = 3,  // used in forward, backward uses still to come
  kHoldAfterBwd = 4,  // all backward uses done: the slot holds its gradient
};
constexpr int kTensorStateCount = 5;

enum class TensorEvent : uint8_t {
  kBuild = 0,
  kAcquireForward = 1,
  kAcquireRecompute = 2,
  kAcquireBackward = 3,
  kAcquireEval = 4,
  kReleaseForward = 5,       // end of a FORWARD or RECOMPUTE use
  kReleaseBackward = 6,      // end of a backward use, more to come
  kReleaseBackwardLast = 7,  // end of the last backward use
  kReleaseEval = 8,
  kStep = 9,  // end of a TRAIN iteration
  // First forward use of a new micro-batch, after the parameter's backward
  // in the previous one (gradient accumulation only).
  kAcquireNextMicroBatch = 10,
  // End of an abandoned iteration (pstar_iteration_abort): from any state
  // of a built engine back to HOLD, the parameter released if acquired.
  kAbort = 11,
};
constexpr int kTensorEventCount = 12;

// Sentinel: the event is illegal in that state.
constexpr int8_t kIllegal = -1;

// kTransitions[state][event] = new state, or kIllegal.
// clang-format off
constexpr int8_t kTransitions[kTensorStateCount][kTensorEventCount] = {
  //            build  acqF  acqR  acqB  acqE  relF  relB  relBL relE  step  acqN  abort
  /* Free  */ { 1,     -1,   -1,   -1,   -1,   -1,   -1,   -1,   -1,   -1,   -1,   -1 },
  /* Hold  */ { -1,    2,    -1,   -1,   2,    -1,   -1,   -1,   -1,   1,    -1,   1  },
  /* Comp  */ { -1,    -1,   -1,   -1,   -1,   3,    3,    4,    1,    -1,   -1,   1  },
  /* HFwd  */ { -1,    2,    2,    2,    -1,   -1,   -1,   -1,   -1,   1,    -1,   1  },
  /* HBwd  */ { -1,    -1,   -1,   -1,   -1,   -1,   -1,   -1,   -1,   1,    2,    1  },
};
// clang-format on

inline bool transition(TensorState from, TensorEvent event, TensorState* to) {
  const int8_t next = kTransitions[static_cast<int>(from)][static_cast<int>(event)];
  if (next == kIllegal) return false;
  *to = static_cast<TensorState>(next);
  return true;
}

const char* state_name(TensorState s);
const char* event_name(TensorEvent e);

}  // namespace pstar::chunk
