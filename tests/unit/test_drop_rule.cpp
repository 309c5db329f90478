// The drop rule (src/distributed/drop_rule.h) on its own: FORWARD drops a chunk
// once every parameter of it was released in FORWARD and none is
// acquired; RECOMPUTE keeps its own marks; a second release of the same
// parameter counts once; BACKWARD waits for every open backward to close,
// and asks for the reduce-scatter first when gradients are pending; a new
// iteration starts the counts again; a rule never built (one process)
// keeps everything.
#include <criterion/criterion.h>

#include <vector>

#include "distributed/drop_rule.h"

using pstar::distributed::DropRule;
using Action = DropRule::Action;

Test(drop_rule, forward_drops_once_every_parameter_was_released) {
  DropRule r;
  r.build({2, 1}, 3);  // chunk 0: parameters 0 and 1; chunk 1: parameter 2
  r.iteration_begin();
  cr_assert_eq(r.after_release(0, 0, PSTAR_STAGE_FORWARD, 0), Action::kKeep);  // 1 not released yet
  cr_assert_eq(r.after_release(0, 0, PSTAR_STAGE_FORWARD, 0), Action::kKeep);  // counted once
  cr_assert_eq(r.after_release(1, 0, PSTAR_STAGE_FORWARD, 1), Action::kKeep);  // one still acquired
  cr_assert_eq(r.after_release(1, 0, PSTAR_STAGE_FORWARD, 0), Action::kDrop);
  cr_assert_eq(r.after_release(2, 1, PSTAR_STAGE_FORWARD, 0), Action::kDrop);
  // A later use (a tied weight's second one) drops it again after it.
  cr_assert_eq(r.after_release(2, 1, PSTAR_STAGE_FORWARD, 0), Action::kDrop);
}

Test(drop_rule, recompute_keeps_marks_of_its_own) {
  DropRule r;
  r.build({2}, 2);
  r.iteration_begin();
  r.after_release(0, 0, PSTAR_STAGE_FORWARD, 0);
  r.after_release(1, 0, PSTAR_STAGE_FORWARD, 0);
  cr_assert_eq(r.after_release(0, 0, PSTAR_STAGE_RECOMPUTE, 0), Action::kKeep);  // FORWARD marks do not count
  cr_assert_eq(r.after_release(1, 0, PSTAR_STAGE_RECOMPUTE, 0), Action::kDrop);
}

Test(drop_rule, backward_waits_for_open_backwards_and_reduces_first) {
  DropRule r;
  r.build({2}, 2);
  r.iteration_begin();
  r.note_backward_open(0, false, true);  // parameter 0: forward use, backward not done
  r.note_backward_open(0, false, true);  // parameter 1
  r.note_backward_open(0, true, false);  // parameter 0's backward done
  r.note_gradient_pending(0);
  cr_assert_eq(r.gradients_pending(0), 1u);
  cr_assert_eq(r.after_release(0, 0, PSTAR_STAGE_BACKWARD, 0), Action::kKeep);  // parameter 1 still open
  r.note_backward_open(0, true, false);
  cr_assert_eq(r.after_release(1, 0, PSTAR_STAGE_BACKWARD, 1), Action::kKeep);  // one acquired
  cr_assert_eq(r.after_release(1, 0, PSTAR_STAGE_BACKWARD, 0), Action::kReduceThenDrop);
  r.gradients_taken(0);
  cr_assert_eq(r.gradients_pending(0), 0u);
  cr_assert_eq(r.after_release(1, 0, PSTAR_STAGE_BACKWARD, 0), Action::kDrop);  // nothing pending
}

Test(drop_rule, a_new_iteration_counts_again) {
  DropRule r;
  r.build({2}, 2);
  r.iteration_begin();
  r.after_release(0, 0, PSTAR_STAGE_FORWARD, 0);
  cr_assert_eq(r.after_release(1, 0, PSTAR_STAGE_FORWARD, 0), Action::kDrop);
  r.note_backward_open(0, false, true);
  r.close_backward();
  r.iteration_begin();
  cr_assert_eq(r.after_release(1, 0, PSTAR_STAGE_FORWARD, 0), Action::kKeep);  // 0 not released this iteration
  cr_assert_eq(r.after_release(0, 0, PSTAR_STAGE_BACKWARD, 0), Action::kDrop);  // no backward left open
}

Test(drop_rule, never_built_keeps_everything) {
  DropRule r;
  cr_assert(!r.enabled());
  r.iteration_begin();
  r.note_backward_open(0, false, true);
  r.close_backward();
  cr_assert_eq(r.gradients_pending(0), 0u);
  cr_assert_eq(r.after_release(0, 0, PSTAR_STAGE_FORWARD, 0), Action::kKeep);
  cr_assert_eq(r.after_release(0, 0, PSTAR_STAGE_BACKWARD, 0), Action::kKeep);
}
