#include <criterion/criterion.h>

#include <cstdint>
#include <vector>

#include "placement/trace_follower.h"

using pstar::placement::TraceFollower;
using Retrace = TraceFollower::Retrace;

namespace {
// One TRAIN iteration acquiring `seq`; returns whether its recording became the trace.
bool run(TraceFollower& f, const std::vector<uint32_t>& seq) {
  f.begin(true);
  for (uint32_t k : seq) {
    f.check(k);
    f.note(k, 0);
  }
  return f.end(8);
}
}  // namespace

Test(trace_follower, records_through_warmup_then_follows) {
  TraceFollower f(2, Retrace::kFromDivergence, "test");
  cr_assert(!run(f, {0, 1, 2}), "the first warm-up iteration is not the trace yet");
  cr_assert(!f.ready());
  cr_assert(run(f, {0, 1, 2}));
  cr_assert(f.ready());
  cr_assert_eq(f.trace().moments(), 3u);
  f.begin(true);
  cr_assert(f.following());
  cr_assert(!f.recording());
  f.check(0);
  f.note(0, 0);
  cr_assert_eq(f.moment(), 1u);
  f.check(1);
  f.note(1, 0);
  f.check(2);
  f.note(2, 0);
  cr_assert(!f.end(8), "a followed iteration changes nothing");
  cr_assert_eq(f.divergences(), 0u);
}

Test(trace_follower, diverging_retraces_from_the_divergence) {
  TraceFollower f(1, Retrace::kFromDivergence, "test");
  run(f, {0, 1, 2});
  f.begin(true);
  f.check(0);
  f.note(0, 0);
  f.check(2);  // the trace has 1 here
  cr_assert(!f.following());
  cr_assert(f.recording(), "records from the divergence on");
  f.note(2, 0);
  cr_assert(f.end(8), "the re-traced iteration becomes the trace");
  cr_assert_eq(f.divergences(), 1u);
  cr_assert_eq(f.trace().moments(), 2u);
  cr_assert_eq(f.trace().chunk_at(0), 0u, "the matched prefix is kept");
  cr_assert_eq(f.trace().chunk_at(1), 2u);
}

Test(trace_follower, diverging_records_anew_in_the_next_iteration) {
  TraceFollower f(1, Retrace::kNextIteration, "test");
  run(f, {0, 1});
  f.begin(true);
  f.check(0);
  f.note(0, 0);
  f.check(1);
  f.note(1, 0);
  f.check(1);  // more acquires than the trace has
  cr_assert(!f.following());
  cr_assert(!f.recording());
  cr_assert(!f.ready(), "the trace is dropped");
  f.note(1, 0);
  cr_assert(!f.end(8));
  f.begin(true);
  cr_assert(f.recording(), "the next iteration records from its start");
}

Test(trace_follower, fewer_acquires_diverge_at_the_end) {
  TraceFollower f(1, Retrace::kFromDivergence, "test");
  run(f, {0, 1, 2});
  cr_assert(run(f, {0, 1}));
  cr_assert_eq(f.divergences(), 1u);
  cr_assert_eq(f.trace().moments(), 2u);
}

Test(trace_follower, abort_leaves_the_trace_and_counts_as_before) {
  TraceFollower f(1, Retrace::kFromDivergence, "test");
  run(f, {0, 1, 2});
  f.begin(true);
  f.check(3);
  cr_assert_eq(f.divergences(), 1u);
  f.abort();
  cr_assert_eq(f.divergences(), 0u, "an abandoned iteration's divergence is not counted");
  cr_assert_eq(f.trace().moments(), 3u);
  cr_assert(run(f, {0, 1, 2}) == false && f.divergences() == 0u, "the next iteration follows from its start");

  TraceFollower w(2, Retrace::kFromDivergence, "test");
  w.begin(true);
  w.note(0, 0);
  w.abort();  // a partial warm-up recording is dropped; warm-up still needs two
  cr_assert(!run(w, {0}));
  cr_assert(run(w, {0}));
}

Test(trace_follower, disabled_iterations_neither_record_nor_follow) {
  TraceFollower f(1, Retrace::kFromDivergence, "test");
  f.begin(false);
  cr_assert(!f.recording() && !f.following());
  f.note(0, 0);
  cr_assert(!f.end(8));
  cr_assert(!f.ready());
}
