#include <criterion/criterion.h>

#include "chunk/tensor_state.h"

using namespace pstar::chunk;

namespace {
struct Row {
  TensorState from;
  TensorEvent event;
  int to;  // -1: illegal
};
}  // namespace

// The whole table, written out once more by hand: any edit to the table in
// tensor_state.h must be deliberate and show up here.
Test(tensor_state, every_transition_matches_the_specification) {
  const TensorState S[] = {TensorState::kFree, TensorState::kHold, TensorState::kCompute, TensorState::kHoldAfterFwd,
                           TensorState::kHoldAfterBwd};
  const int expected[kTensorStateCount][kTensorEventCount] = {
      {1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
      {-1, 2, -1, -1, 2, -1, -1, -1, -1, 1, -1, 1},
      {-1, -1, -1, -1, -1, 3, 3, 4, 1, -1, -1, 1},
      {-1, 2, 2, 2, -1, -1, -1, -1, -1, 1, -1, 1},
      {-1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 2, 1},
  };
  int legal = 0;
  for (int s = 0; s < kTensorStateCount; ++s) {
    for (int e = 0; e < kTensorEventCount; ++e) {
      TensorState to = TensorState::kFree;
      const bool ok = transition(S[s], static_cast<TensorEvent>(e), &to);
      cr_assert_eq(ok, expected[s][e] >= 0, "state %s event %s", state_name(S[s]), event_name(static_cast<TensorEvent>(e)));
      if (ok) {
        cr_assert_eq(static_cast<int>(to), expected[s][e]);
        ++legal;
      } else {
        cr_assert_eq(to, TensorState::kFree, "an illegal transition must not write its output");
      }
    }
  }
  cr_assert_eq(legal, 18);
}

Test(tensor_state, compute_cannot_be_reacquired_or_stepped) {
  TensorState to;
  cr_assert(!transition(TensorState::kCompute, TensorEvent::kAcquireForward, &to));
  cr_assert(!transition(TensorState::kCompute, TensorEvent::kAcquireBackward, &to));
  cr_assert(!transition(TensorState::kCompute, TensorEvent::kStep, &to));
}

Test(tensor_state, gradient_slot_is_not_readable_as_weights) {
  TensorState to;
  cr_assert(!transition(TensorState::kHoldAfterBwd, TensorEvent::kAcquireForward, &to));
  cr_assert(!transition(TensorState::kHoldAfterBwd, TensorEvent::kAcquireRecompute, &to));
  cr_assert(!transition(TensorState::kHoldAfterBwd, TensorEvent::kAcquireBackward, &to));
}

// pstar_iteration_abort: every state of a built engine, an acquired
// parameter included (the abort releases it), goes back to HOLD; an
// unbuilt parameter has nothing to abort.
Test(tensor_state, abort_returns_every_built_state_to_hold) {
  for (TensorState from : {TensorState::kHold, TensorState::kCompute, TensorState::kHoldAfterFwd,
                           TensorState::kHoldAfterBwd}) {
    TensorState to = TensorState::kFree;
    cr_assert(transition(from, TensorEvent::kAbort, &to), "abort from %s", state_name(from));
    cr_assert_eq(to, TensorState::kHold, "abort from %s", state_name(from));
  }
  TensorState to = TensorState::kHold;
  cr_assert(!transition(TensorState::kFree, TensorEvent::kAbort, &to));
  cr_assert_eq(to, TensorState::kHold, "an illegal transition must not write its output");
}

Test(tensor_state, names) {
  cr_assert_str_eq(state_name(TensorState::kHoldAfterBwd), "HOLD_AFTER_BWD");
  cr_assert_str_eq(event_name(TensorEvent::kStep), "step");
  cr_assert_str_eq(event_name(TensorEvent::kAbort), "abort");
}
