/* Trace-guided placement through the C API: warm-up, OPT against LRU,
 * divergence and re-tracing, and identical training results under every
 * policy and capacity. */
#include <string.h>

#include "capi_test_util.h"

enum { P = 8, N = 1024, CHUNK = 1024 };

typedef struct run_result {
  pstar_stats stats;
  pstar_stats warm; /* after iterations 0 and 1 (warm-up and the first traced one) */
  /* Before the last step, whose prefetch for an iteration that never comes
   * (the next one's first chunks, while the CPU updates) would count too. */
  pstar_stats before_last_step;
  float w[P][N];
} run_result;

/* One TRAIN iteration: forward 0..P-1 (parameter 0 used again at the end, as
 * a tied embedding and head), backward in reverse.  With `swap`, parameters 2
 * and 3 are used in the other order (a dynamic graph). */
static void iteration(pstar_engine *e, const uint32_t *id, int step, int swap, pstar_stats *before_step) {
  int order[P + 1];
  for (int i = 0; i < P; ++i) order[i] = i;
  order[P] = 0;
  if (swap) {
    order[2] = 3;
    order[3] = 2;
  }
  float g[N];
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  for (int i = 0; i <= P; ++i) {
    t_acquire(e, id[order[i]], PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, id[order[i]], NULL));
  }
  for (int i = P; i >= 0; --i) {
    const uint16_t *w = (const uint16_t *)t_acquire(e, id[order[i]], PSTAR_STAGE_BACKWARD);
    for (int j = 0; j < N; ++j) g[j] = t_bf16_to_f32(w[j]) * 0.01f + (float)((j + step + i) % 7 - 3) / 64.0f;
    T_OK(pstar_grad_write(e, id[order[i]], g, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    T_OK(pstar_param_release(e, id[order[i]], NULL));
  }
  if (before_step != NULL) *before_step = t_stats(e);
  T_OK(pstar_step(e, NULL));
}

static void run_p(pstar_policy policy, int prefetch, uint64_t capacity, int strict, int swap_at, run_result *out) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.placement_policy = policy;
  o.prefetch = prefetch;
  o.device_capacity_bytes = capacity;
  o.strict = strict;
  o.strict_seed = 5;
  pstar_engine *e = t_create(&o);
  uint32_t id[P];
  char name[8];
  for (int i = 0; i < P; ++i) {
    name[0] = 'p';
    name[1] = (char)('0' + i);
    name[2] = '\0';
    id[i] = t_register(e, name, N, 0);
  }
  T_OK(pstar_engine_build(e));
  for (int i = 0; i < P; ++i) {
    float w[N];
    t_fill(w, N, (uint32_t)i + 1, 0.5f);
    t_write_f32(e, id[i], w, N);
  }
  for (int s = 0; s < 6; ++s) {
    if (s == 2) out->warm = t_stats(e);
    iteration(e, id, s, s == swap_at, s == 5 ? &out->before_last_step : NULL);
  }
  out->stats = t_stats(e);
  for (int i = 0; i < P; ++i) t_read_f32(e, id[i], out->w[i], N);
  T_OK(pstar_engine_destroy(e));
}

static void run(pstar_policy policy, uint64_t capacity, int strict, int swap_at, run_result *out) {
  run_p(policy, 1, capacity, strict, swap_at, out);
}

/* Capacity for `chunks` bf16 chunks plus two gradient buffers (the tied
 * parameter's accumulator lives from its first backward use to its last). */
static uint64_t capacity_for(int chunks) { return (uint64_t)chunks * CHUNK * 2 + 2 * N * 4; }

Test(placement, opt_moves_no_more_than_lru_and_results_are_identical) {
  static run_result unlimited, opt, lru;
  run(PSTAR_POLICY_OPT, 0, 0, -1, &unlimited);
  int strictly_better = 0;
  for (int chunks = 2; chunks <= 7; ++chunks) {
    /* Belady's property holds for on-demand fetching: compare without prefetch. */
    run_p(PSTAR_POLICY_OPT, 0, capacity_for(chunks), 0, -1, &opt);
    run(PSTAR_POLICY_LRU, capacity_for(chunks), 0, -1, &lru);
    cr_assert_eq(opt.stats.bytes_prefetched, 0u);
    cr_assert_eq(opt.stats.bytes_critical, opt.stats.bytes_host_to_device, "every on-demand fetch is waited for");
    cr_assert_eq(memcmp(opt.w, unlimited.w, sizeof opt.w), 0, "OPT at %d chunks changed the results", chunks);
    cr_assert_eq(memcmp(lru.w, unlimited.w, sizeof lru.w), 0, "LRU at %d chunks changed the results", chunks);
    cr_assert_leq(opt.stats.bytes_host_to_device, lru.stats.bytes_host_to_device, "capacity %d chunks", chunks);
    strictly_better += opt.stats.bytes_host_to_device < lru.stats.bytes_host_to_device;
    cr_assert_leq(opt.stats.peak_device_bytes, capacity_for(chunks));
    cr_assert_eq(opt.stats.trace_fallbacks, 0u);
    cr_assert_eq(opt.stats.trace_moments, 2u * (P + 1), "one moment per acquire");
    cr_assert_eq(lru.stats.trace_moments, 0u, "LRU records no trace");
  }
  cr_assert_gt(strictly_better, 0, "OPT never moved fewer bytes than LRU");
}

Test(placement, diverging_order_falls_back_retraces_and_keeps_results) {
  static run_result unlimited, diverged;
  /* The same parameters in another order from iteration 3 on: results of an
   * unlimited run with the same order change are the reference. */
  run(PSTAR_POLICY_LRU, 0, 0, 3, &unlimited);
  run(PSTAR_POLICY_OPT, capacity_for(3), 1, 3, &diverged);
  cr_assert_eq(memcmp(diverged.w, unlimited.w, sizeof diverged.w), 0);
  /* Iteration 3 diverges (fallback, re-traced with the swap); iteration 4
   * goes back to the old order and diverges from the new trace. */
  cr_assert_eq(diverged.stats.trace_fallbacks, 2u);
  cr_assert_gt(diverged.stats.evictions, 0u);
}

Test(placement, strict_mode_opt_with_warmup_of_two) {
  static run_result ref, strict;
  run(PSTAR_POLICY_OPT, 0, 0, -1, &ref);
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.warmup_iterations = 2;
  o.placement_policy = (pstar_policy)7;
  pstar_engine *e = NULL;
  T_FAIL(pstar_engine_create(&o, &e), PSTAR_ERR_INVALID_ARGUMENT, "policy");
  run(PSTAR_POLICY_OPT, capacity_for(3), 1, -1, &strict);
  cr_assert_eq(memcmp(strict.w, ref.w, sizeof ref.w), 0);
}

Test(placement, prefetch_moves_ahead_of_use_without_changing_results) {
  static run_result unlimited, pre, lru;
  run(PSTAR_POLICY_OPT, 0, 0, -1, &unlimited);
  int prefetched_somewhere = 0;
  for (int chunks = 2; chunks <= 7; ++chunks) {
    run(PSTAR_POLICY_LRU, capacity_for(chunks), 0, -1, &lru);
    for (int strict = 0; strict <= 1; ++strict) {
      run_p(PSTAR_POLICY_OPT, 1, capacity_for(chunks), strict, -1, &pre);
      cr_assert_leq(pre.before_last_step.bytes_host_to_device, lru.before_last_step.bytes_host_to_device,
                    "OPT with prefetch moved more than LRU at %d chunks (%llu against %llu)", chunks,
                    (unsigned long long)pre.before_last_step.bytes_host_to_device,
                    (unsigned long long)lru.before_last_step.bytes_host_to_device);
      cr_assert_lt(pre.stats.bytes_critical, lru.stats.bytes_critical, "no fewer bytes waited for at %d chunks",
                   chunks);
      cr_assert_eq(memcmp(pre.w, unlimited.w, sizeof pre.w), 0, "prefetch at %d chunks changed the results", chunks);
      cr_assert_leq(pre.stats.peak_device_bytes, capacity_for(chunks), "capacity %d chunks", chunks);
      cr_assert_leq(pre.stats.bytes_prefetched, pre.stats.bytes_host_to_device);
      cr_assert_leq(pre.stats.bytes_critical, pre.stats.bytes_host_to_device);
      prefetched_somewhere += pre.stats.bytes_prefetched > 0;
    }
  }
  cr_assert_gt(prefetched_somewhere, 0, "nothing was ever prefetched");
}

Test(placement, static_policy_keeps_a_prefix_resident_and_opt_moves_no_more) {
  static run_result unlimited, st, opt;
  run(PSTAR_POLICY_OPT, 0, 0, -1, &unlimited);
  /* No "OPT strictly better" here: the step sends every trained chunk to the
   * host (the CPU optimizer), so each iteration starts from an empty device,
   * and on this access sequence a resident prefix is then already optimal.
   * OPT's advantage over LRU is checked above. */
  for (int chunks = 4; chunks <= 8; ++chunks) {
    run_p(PSTAR_POLICY_STATIC, 0, capacity_for(chunks), chunks == 6, -1, &st);
    run_p(PSTAR_POLICY_OPT, 0, capacity_for(chunks), 0, -1, &opt);
    cr_assert_eq(memcmp(st.w, unlimited.w, sizeof st.w), 0, "static at %d chunks changed the results", chunks);
    cr_assert_leq(st.stats.peak_device_bytes, capacity_for(chunks));
    /* After warm-up (where OPT has no trace yet and falls back). */
    const uint64_t opt_bytes = opt.stats.bytes_host_to_device - opt.warm.bytes_host_to_device;
    const uint64_t st_bytes = st.stats.bytes_host_to_device - st.warm.bytes_host_to_device;
    cr_assert_leq(opt_bytes, st_bytes, "capacity %d chunks: OPT moved %llu bytes to the device after warm-up, static %llu",
                  chunks, (unsigned long long)opt_bytes, (unsigned long long)st_bytes);
  }
}

/* Gradients leave during backward: once every trainable parameter of a chunk
 * has its gradient (its last backward use released), the chunk goes to the
 * host for the CPU optimizer then, not at the step.  Three chunks, the
 * first holding two parameters and a frozen one; unlimited capacity, so no
 * eviction is placement's.  With gradient accumulation the chunks stay
 * until the step (the gradient is already on the host, folded; the slot
 * still holds the weight). */
static void gradients_leave_run(int grad_accumulation) {
  enum { M = 512 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 2 * M);
  o.grad_accumulation = grad_accumulation;
  pstar_engine *e = t_create(&o);
  /* chunk 0: a, b (M each); chunk 1: frozen f and c; chunk 2: d (2M) */
  const uint32_t a = t_register(e, "a", M, 0), b = t_register(e, "b", M, 0);
  const uint32_t f = t_register(e, "f", M, PSTAR_PARAM_FROZEN), c = t_register(e, "c", M, 0);
  const uint32_t d = t_register(e, "d", 2 * M, 0);
  T_OK(pstar_engine_build(e));
  const uint32_t fwd[] = {a, b, f, c, d};
  const uint32_t bwd[] = {d, c, b, a}; /* f takes no gradient */
  const uint64_t chunk_bytes = 2 * M * 2;
  float g[2 * M];
  for (int j = 0; j < 2 * M; ++j) g[j] = (float)(j % 5 - 2) / 32.0f;
  for (int it = 0; it < 3; ++it) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (int i = 0; i < 5; ++i) {
      t_acquire(e, fwd[i], PSTAR_STAGE_FORWARD);
      T_OK(pstar_param_release(e, fwd[i], NULL));
    }
    const pstar_stats start = t_stats(e);
    /* evictions expected after each backward release */
    const uint64_t leave[] = {1, 2, 2, 3};
    for (int i = 0; i < 4; ++i) {
      const uint32_t p = bwd[i];
      t_acquire(e, p, PSTAR_STAGE_BACKWARD);
      T_OK(pstar_grad_write(e, p, g, p == d ? 2 * M : M, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      T_OK(pstar_param_release(e, p, NULL));
      const pstar_stats now = t_stats(e);
      const uint64_t want = grad_accumulation ? 0 : leave[i];
      cr_assert_eq(now.evictions - start.evictions, want, "iteration %d, after the backward of parameter %d: %llu",
                   it, i, (unsigned long long)(now.evictions - start.evictions));
      cr_assert_eq(now.bytes_device_to_host - start.bytes_device_to_host, want * chunk_bytes);
    }
    T_OK(pstar_step(e, NULL));
    const pstar_stats after = t_stats(e);
    /* The step evicts only what had not left: with accumulation all three. */
    cr_assert_eq(after.evictions - start.evictions, 3, "iteration %d: %llu evictions in backward and step", it,
                 (unsigned long long)(after.evictions - start.evictions));
  }
  pstar_engine_destroy(e);
}

Test(placement, gradients_leave_when_their_chunks_backward_ends) { gradients_leave_run(0); }
Test(placement, with_gradient_accumulation_chunks_leave_at_the_step) { gradients_leave_run(1); }

/* Clean chunks: a chunk evicted before anything wrote it on the device
 * (forward and EVAL uses) is dropped, its host copy still the same bits; a
 * chunk acquired for BACKWARD is copied back.  With a host capacity the
 * host copy is not kept: every eviction copies. */
static void clean_run(uint64_t host_capacity) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.device_capacity_bytes = capacity_for(3);
  o.host_capacity_bytes = host_capacity;
  o.placement_policy = PSTAR_POLICY_LRU;
  pstar_engine *e = t_create(&o);
  uint32_t id[P];
  char name[8];
  for (int i = 0; i < P; ++i) {
    snprintf(name, sizeof name, "p%d", i);
    id[i] = t_register(e, name, N, 0);
  }
  T_OK(pstar_engine_build(e));
  float w[P][N], back[N];
  for (int i = 0; i < P; ++i) {
    t_fill(w[i], N, (uint32_t)i + 3, 0.5f);
    t_write_f32(e, id[i], w[i], N);
  }
  const uint64_t chunk_bytes = CHUNK * 2;
  for (int it = 0; it < 3; ++it) {
    const pstar_stats before = t_stats(e);
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
    for (int i = 0; i < P; ++i) {
      const uint16_t *v = (const uint16_t *)t_acquire(e, id[i], PSTAR_STAGE_FORWARD);
      cr_assert_eq(t_bf16_to_f32(v[5]), t_bf16_to_f32(t_f32_to_bf16(w[i][5])), "EVAL %d: parameter %d", it, i);
      T_OK(pstar_param_release(e, id[i], NULL));
    }
    T_OK(pstar_iteration_end(e));
    const pstar_stats after = t_stats(e);
    const uint64_t evictions = after.evictions - before.evictions;
    cr_assert_gt(evictions, 0u, "3 chunks of room for %d: chunks leave", P);
    const uint64_t out = after.bytes_device_to_host - before.bytes_device_to_host;
    if (host_capacity == 0) {
      cr_assert_eq(out, 0u, "EVAL iteration %d: %llu bytes copied back for chunks nothing wrote", it,
                   (unsigned long long)out);
    } else {
      cr_assert_eq(out, evictions * chunk_bytes, "with a host capacity every eviction copies");
    }
  }
  /* A TRAIN iteration writes gradients: those chunks are copied back. */
  const pstar_stats before = t_stats(e);
  iteration(e, id, 0, 0, NULL);
  const pstar_stats after = t_stats(e);
  cr_assert_geq(after.bytes_device_to_host - before.bytes_device_to_host, (uint64_t)P * chunk_bytes,
                "every trained chunk goes to the host for the CPU update");
  for (int i = 0; i < P; ++i) {
    t_read_f32(e, id[i], back, N);
    cr_assert_neq(memcmp(back, w[i], sizeof back), 0, "parameter %d was not updated", i);
  }
  T_OK(pstar_engine_destroy(e));
}

Test(placement, clean_chunks_are_dropped_not_copied_back) {
  clean_run(0);
  clean_run(64u << 20);
}
