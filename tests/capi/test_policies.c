/* Each placement policy on hand-made traces whose steady-state fetch counts
 * are worked out by hand below.  Parameters are frozen and one chunk each,
 * so no gradient buffer takes room and the capacity is a whole number of
 * chunk slots.
 *
 * Trace A (3 chunks a b c, 2 slots): forward a b c a b c, backward
 * c b a c b a (12 moments).  Each iteration starts with {a, b} resident (the
 * last two used).
 *   OPT:  a, b hit; c misses and evicts b (next use 4, after a's 3); a hits;
 *         b misses and evicts a (8, after c's 5); c, c, b hit; a misses and
 *         evicts b (10, after c's 9); c hits; b misses and evicts c (next
 *         iteration's moment 2, after a's 11); a hits: 4 fetches.
 *   LRU:  a, b hit; then c a b c miss (each evicts the least recent); c, b
 *         hit; then a c b a miss: 8 fetches.
 *   static with 2 slots: the reserve (two chunks) leaves no resident prefix,
 *         so it streams through LRU order: 8 fetches.
 *
 * Trace B (4 chunks a b c d, 3 slots): forward a b c d a b c d, backward
 * d c b a d c b a (16 moments).
 *   static: a is the resident prefix (3 slots less a reserve of 2); b c d
 *         stream through 2 slots in LRU order.  The non-a accesses are
 *         b c d b c d d c b d c b, starting with {c, b}: b, c hit; d b c d
 *         miss; d, c hit; b d c b miss: 8 fetches. */
#include <stdio.h>
#include <string.h>

#include "capi_test_util.h"

enum { CHUNK = 1024 };

typedef struct trace {
  int chunks;
  int forward[16];
  int forward_len;
} trace;

static const trace kTraceA = {3, {0, 1, 2, 0, 1, 2}, 6};
static const trace kTraceB = {4, {0, 1, 2, 3, 0, 1, 2, 3}, 8};

/* Chunk fetches in the last of `iters` iterations. */
static uint64_t steady_fetches(const trace *tr, pstar_policy policy, int prefetch, int slots, int dry) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.placement_policy = policy;
  o.prefetch = prefetch;
  o.device_capacity_bytes = (uint64_t)slots * CHUNK * 2;
  o.dry_run = dry;
  pstar_engine *e = t_create(&o);
  uint32_t id[8];
  char name[8];
  for (int i = 0; i < tr->chunks; ++i) {
    snprintf(name, sizeof name, "p%d", i);
    id[i] = t_register(e, name, CHUNK, PSTAR_PARAM_FROZEN);
  }
  T_OK(pstar_engine_build(e));
  pstar_stats before = t_stats(e);
  for (int it = 0; it < 5; ++it) {
    before = t_stats(e);
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    void *p = NULL;
    for (int i = 0; i < tr->forward_len; ++i) {
      T_OK(pstar_param_acquire(e, id[tr->forward[i]], PSTAR_STAGE_FORWARD, NULL, &p));
      T_OK(pstar_param_release(e, id[tr->forward[i]], NULL));
    }
    for (int i = tr->forward_len - 1; i >= 0; --i) {
      T_OK(pstar_param_acquire(e, id[tr->forward[i]], PSTAR_STAGE_BACKWARD, NULL, &p));
      T_OK(pstar_param_release(e, id[tr->forward[i]], NULL));
    }
    T_OK(pstar_step(e, NULL));
  }
  const pstar_stats after = t_stats(e);
  cr_assert_leq(after.peak_device_bytes, o.device_capacity_bytes);
  cr_assert_eq(after.trace_fallbacks, 0u);
  T_OK(pstar_engine_destroy(e));
  const uint64_t bytes = after.bytes_host_to_device - before.bytes_host_to_device;
  cr_assert_eq(bytes % (CHUNK * 2), 0u);
  return bytes / (CHUNK * 2);
}

Test(policies, opt_on_trace_a_fetches_four_chunks_per_iteration) {
  for (int dry = 0; dry <= 1; ++dry) {
    cr_assert_eq(steady_fetches(&kTraceA, PSTAR_POLICY_OPT, 0, 2, dry), 4u, "dry %d", dry);
    /* Prefetch moves the same chunks, earlier. */
    cr_assert_eq(steady_fetches(&kTraceA, PSTAR_POLICY_OPT, 1, 2, dry), 4u, "dry %d", dry);
  }
}

Test(policies, lru_on_trace_a_fetches_eight_chunks_per_iteration) {
  cr_assert_eq(steady_fetches(&kTraceA, PSTAR_POLICY_LRU, 0, 2, 0), 8u);
  cr_assert_eq(steady_fetches(&kTraceA, PSTAR_POLICY_LRU, 0, 2, 1), 8u);
}

Test(policies, static_without_room_for_a_prefix_streams_like_lru) {
  cr_assert_eq(steady_fetches(&kTraceA, PSTAR_POLICY_STATIC, 0, 2, 0), 8u);
}

Test(policies, static_keeps_its_prefix_and_streams_the_rest) {
  cr_assert_eq(steady_fetches(&kTraceB, PSTAR_POLICY_STATIC, 0, 3, 0), 8u);
  /* OPT never does worse than the static plan on the same trace. */
  cr_assert_leq(steady_fetches(&kTraceB, PSTAR_POLICY_OPT, 0, 3, 0), 8u);
}

Test(policies, everything_fits_nothing_moves) {
  const pstar_policy all[] = {PSTAR_POLICY_OPT, PSTAR_POLICY_LRU, PSTAR_POLICY_STATIC};
  for (int i = 0; i < 3; ++i) cr_assert_eq(steady_fetches(&kTraceB, all[i], 1, 4, 1), 0u, "policy %d", (int)all[i]);
}
