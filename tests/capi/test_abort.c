/*
 * pstar_iteration_abort: an iteration abandoned part way (forward uses, some
 * backward uses with gradients, parameters left acquired) ends without a
 * step, and training after it reaches the same parameters and optimizer
 * state, bit for bit, as training in which that iteration never began: on
 * the emulated device in strict mode at a capacity that evicts, with and
 * without gradient accumulation, with hybrid optimizer placement, during
 * warm-up and after it.  Also: the refusals (no iteration, not built), an
 * aborted EVAL iteration, the release of what is still acquired, the trace
 * (warm-up and following), dry runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capi_test_util.h"
#include "ckpt_test_util.h"

enum { CHUNK = 2048, NP = 24, FROZEN = 7, STEPS = 6, WARMUP = 2, MAXN = 800 };

/* 400..799 elements: three or four parameters per chunk of 2048. */
static int64_t numel_of(int k) { return 400 + (k * 137) % 400; }

static uint64_t chunk_bytes(void) { return (uint64_t)CHUNK * 2u; /* F16 */ }

/* Three chunks and two of the largest gradient buffers: about half of the
 * compute list, so every pass evicts and refetches. */
static uint64_t tight_capacity(void) { return 3 * chunk_bytes() + 2u * 4u * MAXN; }

typedef struct cfg {
  int accumulation;  /* options.grad_accumulation: two micro-batches per step */
  int hybrid;        /* options.hybrid_optimizer */
  uint64_t capacity; /* device_capacity_bytes */
  int strict;
  int abort_before;  /* an aborted TRAIN iteration before step index abort_before; -1: none */
  int eval_abort;    /* and an aborted EVAL iteration after it */
} cfg;

typedef struct run_out {
  float *params[NP];
  pstar_stats stats;
  double step, loss_scale;
  char ckpt[512]; /* the checkpoint directory LATEST names */
} run_out;

static void free_out(run_out *r) {
  for (int k = 0; k < NP; ++k) free(r->params[k]);
}

static pstar_engine *make_engine(const cfg *c, uint32_t *ids) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, CHUNK);
  o.device_capacity_bytes = c->capacity;
  o.strict = c->strict;
  o.strict_seed = 0xab047;
  o.lr = 1e-2f;
  o.weight_decay = 0.01f;
  o.loss_scale_initial = 1024.0f;
  o.loss_scale_growth_interval = 2; /* the scaler moves during the run */
  o.warmup_iterations = WARMUP;
  o.grad_accumulation = c->accumulation;
  o.hybrid_optimizer = c->hybrid;
  pstar_engine *e = t_create(&o);
  for (int k = 0; k < NP; ++k) {
    char name[32];
    snprintf(name, sizeof name, "layer%02d.weight", k);
    ids[k] = t_register(e, name, numel_of(k), k == FROZEN ? PSTAR_PARAM_FROZEN : 0);
  }
  T_OK(pstar_engine_build(e));
  float v[MAXN];
  for (int k = 0; k < NP; ++k) {
    t_fill(v, (size_t)numel_of(k), (uint32_t)(500 + k), 1.0f);
    t_write_f32(e, ids[k], v, (uint64_t)numel_of(k));
  }
  return e;
}

/* A scalar "activation" from the weights a forward use sees. */
static float activation(const void *w, int64_t n) {
  float a = 0.0f;
  for (int64_t j = 0; j < n; j += 5) a += t_load(w, PSTAR_DTYPE_F16, (size_t)j);
  return a / (float)n;
}

static void forward_all(pstar_engine *e, const uint32_t *ids, float *act) {
  for (int k = 0; k < NP; ++k) {
    const void *w = t_acquire(e, ids[k], PSTAR_STAGE_FORWARD);
    act[k] = activation(w, numel_of(k));
    T_OK(pstar_param_release(e, ids[k], NULL));
  }
}

/* Gradient of parameter k: depends on the weights seen in backward, on the
 * forward activation and on (step, micro-batch, k, j), times the loss scale. */
static void make_grad(float *g, const void *w, int k, int s, int mb, float act, float scale) {
  const int64_t n = numel_of(k);
  for (int64_t j = 0; j < n; ++j) {
    const float wj = t_load(w, PSTAR_DTYPE_F16, (size_t)j);
    const float noise = 1e-2f * (float)((int)((j * 7 + s * 3 + k * 5 + mb * 11) % 13) - 6);
    g[j] = (0.1f * wj + 0.05f * act + noise) * scale;
  }
}

/* Backward uses of parameters hi, hi-1, ..., lo, each with its gradient. */
static void backward_range(pstar_engine *e, const uint32_t *ids, int hi, int lo, int s, int mb, const float *act) {
  const float scale = (float)t_hparam(e, PSTAR_HPARAM_LOSS_SCALE);
  float g[MAXN];
  for (int k = hi; k >= lo; --k) {
    const void *w = t_acquire(e, ids[k], PSTAR_STAGE_BACKWARD);
    if (k != FROZEN) {
      make_grad(g, w, k, s, mb, act[k], scale);
      T_OK(pstar_grad_write(e, ids[k], g, (uint64_t)numel_of(k), PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    }
    T_OK(pstar_param_release(e, ids[k], NULL));
  }
}

static void train_step(pstar_engine *e, const uint32_t *ids, const cfg *c, int s) {
  float act[NP];
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  for (int mb = 0; mb < (c->accumulation ? 2 : 1); ++mb) {
    forward_all(e, ids, act);
    backward_range(e, ids, NP - 1, 0, s, mb, act);
  }
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(e, &r));
  cr_assert_eq(r.skipped, 0, "step %d skipped", s);
  cr_assert_eq(r.params_updated, NP - 1);
}

/* The abandoned iteration: every micro-batch but the last complete, then
 * the last one's forward, half its backward (those slots hold gradients
 * without accumulation), a RECOMPUTE use left acquired and a BACKWARD use
 * with a gradient written left acquired; then the abort. */
static void aborted_iteration(pstar_engine *e, const uint32_t *ids, const cfg *c, int s) {
  const pstar_stats before = t_stats(e);
  const double step = t_hparam(e, PSTAR_HPARAM_STEP), scale = t_hparam(e, PSTAR_HPARAM_LOSS_SCALE);
  const int following = before.trace_moments != 0;
  float act[NP], g[MAXN];
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  const int mbs = c->accumulation ? 2 : 1;
  for (int mb = 0; mb < mbs - 1; ++mb) {
    forward_all(e, ids, act);
    backward_range(e, ids, NP - 1, 0, 100 + s, mb, act);
  }
  forward_all(e, ids, act);
  backward_range(e, ids, NP - 1, NP / 2, 100 + s, mbs - 1, act);
  (void)t_acquire(e, ids[2], PSTAR_STAGE_RECOMPUTE);
  const int kb = NP / 2 - 1;
  (void)t_acquire(e, ids[kb], PSTAR_STAGE_BACKWARD);
  for (int j = 0; j < numel_of(kb); ++j) g[j] = 1e4f; /* would dominate the next step if kept */
  T_OK(pstar_grad_write(e, ids[kb], g, (uint64_t)numel_of(kb), PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  if (following) {
    /* The RECOMPUTE use came where the trace has another chunk. */
    cr_assert_eq(t_stats(e).trace_fallbacks, before.trace_fallbacks + 1, "the aborted iteration did not diverge");
  }
  T_OK(pstar_iteration_abort(e));

  const pstar_stats after = t_stats(e);
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), step, "the step count moved");
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_LOSS_SCALE), scale, "the loss scale moved");
  cr_assert_eq(after.steps, before.steps);
  cr_assert_eq(after.skipped_steps, before.skipped_steps);
  cr_assert_eq(after.trace_fallbacks, before.trace_fallbacks, "the aborted iteration counted as a divergence");
  cr_assert_eq(after.trace_moments, before.trace_moments, "the aborted iteration changed the trace");
  cr_assert_eq(after.iterations, before.iterations + 1, "iterations begun");
  /* Both uses left acquired were released by the abort. */
  T_FAIL(pstar_param_release(e, ids[2], NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  T_FAIL(pstar_param_release(e, ids[kb], NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  T_FAIL(pstar_iteration_abort(e), PSTAR_ERR_INVALID_STATE, "no iteration in progress");
  T_FAIL(pstar_step(e, NULL), PSTAR_ERR_INVALID_STATE, "no TRAIN iteration");

  if (c->eval_abort) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
    (void)t_acquire(e, ids[0], PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, ids[0], NULL));
    (void)t_acquire(e, ids[NP - 1], PSTAR_STAGE_FORWARD);
    (void)t_acquire(e, ids[FROZEN], PSTAR_STAGE_FORWARD);
    T_OK(pstar_iteration_abort(e));
    T_FAIL(pstar_iteration_end(e), PSTAR_ERR_INVALID_STATE, "no iteration in progress");
    const pstar_stats ev = t_stats(e);
    cr_assert_eq(ev.trace_fallbacks, after.trace_fallbacks);
    cr_assert_eq(ev.trace_moments, after.trace_moments);
  }
}

static void save_checkpoint(pstar_engine *e, const char *tag, run_out *out) {
  char dir[400];
  snprintf(dir, sizeof dir, "%s/abort-test-%s-%d", PSTAR_TEST_TMP_DIR, tag, (int)getpid());
  char cmd[sizeof dir + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
  T_OK(pstar_checkpoint_save(e, dir));
  char latest[512];
  size_t len;
  snprintf(latest, sizeof latest, "%s/LATEST", dir);
  char *name = (char *)ck_slurp(latest, &len);
  name[strcspn(name, "\n")] = '\0';
  snprintf(out->ckpt, sizeof out->ckpt, "%s/%s", dir, name);
  free(name);
}

static void run(const cfg *c, const char *tag, run_out *out) {
  memset(out, 0, sizeof *out);
  uint32_t ids[NP];
  pstar_engine *e = make_engine(c, ids);
  for (int s = 0; s < STEPS; ++s) {
    if (s == c->abort_before) {
      aborted_iteration(e, ids, c, s);
      if (s < WARMUP) cr_assert_eq(t_stats(e).trace_moments, 0, "warm-up ended early");
      const pstar_stats pre = t_stats(e);
      train_step(e, ids, c, s);
      const pstar_stats post = t_stats(e);
      if (s >= WARMUP && !c->hybrid) {
        /* The next iteration follows the trace again from its start:
         * prefetch runs only while following (with hybrid placement at an
         * unlimited capacity every chunk stays on the device). */
        cr_assert_gt(post.bytes_prefetched, pre.bytes_prefetched, "no prefetch after the abort");
      }
      if (s == WARMUP - 1) cr_assert_gt(post.trace_moments, 0, "warm-up did not end after its iterations");
      continue;
    }
    train_step(e, ids, c, s);
  }
  for (int k = 0; k < NP; ++k) {
    out->params[k] = t_alloc_f((size_t)numel_of(k));
    t_read_f32(e, ids[k], out->params[k], (uint64_t)numel_of(k));
  }
  out->stats = t_stats(e);
  out->step = t_hparam(e, PSTAR_HPARAM_STEP);
  out->loss_scale = t_hparam(e, PSTAR_HPARAM_LOSS_SCALE);
  save_checkpoint(e, tag, out);
  T_OK(pstar_engine_destroy(e));
}

static void check_same_file(const run_out *a, const run_out *b, const char *file) {
  char pa[600], pb[600];
  snprintf(pa, sizeof pa, "%s/%s", a->ckpt, file);
  snprintf(pb, sizeof pb, "%s/%s", b->ckpt, file);
  size_t la, lb;
  unsigned char *da = ck_slurp(pa, &la);
  unsigned char *db = ck_slurp(pb, &lb);
  cr_assert_eq(la, lb, "%s: %zu bytes without the abort, %zu with it", file, la, lb);
  cr_assert_eq(memcmp(da, db, la), 0, "%s differs after an aborted iteration", file);
  free(da);
  free(db);
}

/* Trains STEPS steps, and again with an aborted iteration inserted: equal
 * bits everywhere. */
static void check_abort_is_invisible(cfg c, const char *tag) {
  run_out ref, ab;
  cfg r = c;
  r.abort_before = -1;
  r.eval_abort = 0;
  r.strict = 0;
  char tag_ref[64], tag_ab[64];
  snprintf(tag_ref, sizeof tag_ref, "%s-ref", tag);
  snprintf(tag_ab, sizeof tag_ab, "%s-abort", tag);
  run(&r, tag_ref, &ref);
  run(&c, tag_ab, &ab);
  for (int k = 0; k < NP; ++k) {
    for (int64_t j = 0; j < numel_of(k); ++j) {
      cr_assert_eq(t_f32_bits(ref.params[k][j]), t_f32_bits(ab.params[k][j]),
                   "%s: param %d [%lld]: %.9g without the abort, %.9g with it", tag, k, (long long)j,
                   (double)ref.params[k][j], (double)ab.params[k][j]);
    }
  }
  /* The optimizer state (masters, m, v), the frozen values, the step count,
   * the scaler and the hyperparameters, as the checkpoint holds them. */
  check_same_file(&ref, &ab, "masters.f32");
  check_same_file(&ref, &ab, "exp_avg.f32");
  check_same_file(&ref, &ab, "exp_avg_sq.f32");
  check_same_file(&ref, &ab, "frozen.f32");
  check_same_file(&ref, &ab, "manifest");
  cr_assert_eq(ab.step, (double)STEPS);
  cr_assert_eq(ab.step, ref.step);
  cr_assert_eq(ab.loss_scale, ref.loss_scale);
  cr_assert_gt(ab.loss_scale, 1024.0, "the scaler should have grown");
  cr_assert_eq(ab.stats.steps, ref.stats.steps);
  cr_assert_eq(ab.stats.trace_fallbacks, 0, "%s: %llu fallbacks", tag, (unsigned long long)ab.stats.trace_fallbacks);
  cr_assert_eq(ref.stats.trace_fallbacks, 0);
  cr_assert_eq(ab.stats.trace_moments, ref.stats.trace_moments);
  cr_assert_eq(ab.stats.iterations, ref.stats.iterations + 1 + (c.eval_abort ? 1 : 0));
  if (c.capacity != 0) {
    cr_assert_gt(ab.stats.evictions, 0);
    cr_assert_gt(ref.stats.evictions, 0);
    cr_assert_leq(ab.stats.peak_device_bytes, c.capacity);
  }
  if (c.hybrid) {
    cr_assert_gt(ab.stats.optimizer_chunks_on_device, 0, "no optimizer state on the device");
    cr_assert_eq(ab.stats.optimizer_chunks_on_device, ref.stats.optimizer_chunks_on_device);
  }
  cr_log_info("%s: evictions %llu / %llu, h2d %llu / %llu", tag, (unsigned long long)ref.stats.evictions,
              (unsigned long long)ab.stats.evictions, (unsigned long long)ref.stats.bytes_host_to_device,
              (unsigned long long)ab.stats.bytes_host_to_device);
  free_out(&ref);
  free_out(&ab);
}

static cfg base_cfg(int accumulation, int abort_before) {
  cfg c;
  c.accumulation = accumulation;
  c.hybrid = 0;
  c.capacity = tight_capacity();
  c.strict = 1;
  c.abort_before = abort_before;
  c.eval_abort = 0;
  return c;
}

Test(abort, during_warmup_is_invisible, .timeout = 120) {
  check_abort_is_invisible(base_cfg(0, 1), "warmup");
}

Test(abort, after_warmup_is_invisible, .timeout = 120) {
  cfg c = base_cfg(0, 4);
  c.eval_abort = 1;
  check_abort_is_invisible(c, "after");
}

Test(abort, with_accumulation_during_warmup_is_invisible, .timeout = 120) {
  check_abort_is_invisible(base_cfg(1, 1), "acc-warmup");
}

Test(abort, with_accumulation_after_warmup_is_invisible, .timeout = 120) {
  cfg c = base_cfg(1, 4);
  c.eval_abort = 1;
  check_abort_is_invisible(c, "acc-after");
}

/* Hybrid placement (optimizer state, and with accumulation the gradient
 * list, on the device from the end of warm-up): unlimited capacity, so that
 * the margin takes them. */
Test(abort, with_hybrid_placement_is_invisible, .timeout = 120) {
  cfg c = base_cfg(0, 4);
  c.hybrid = 1;
  c.capacity = 0;
  check_abort_is_invisible(c, "hybrid");
}

Test(abort, with_hybrid_placement_and_accumulation_is_invisible, .timeout = 120) {
  cfg c = base_cfg(1, 4);
  c.hybrid = 1;
  c.capacity = 0;
  check_abort_is_invisible(c, "hybrid-acc");
}

/* ------------------------------------------------------------------------ */
/* Refusals                                                                  */
/* ------------------------------------------------------------------------ */

Test(abort, is_refused_without_an_iteration) {
  T_FAIL(pstar_iteration_abort(NULL), PSTAR_ERR_INVALID_HANDLE, "NULL");
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", 300, 0);
  T_FAIL(pstar_iteration_abort(e), PSTAR_ERR_INVALID_STATE, "not built");
  T_OK(pstar_engine_build(e));
  float v[300], got[300];
  t_fill(v, 300, 9, 1.0f);
  t_write_f32(e, w, v, 300);
  const pstar_stats s0 = t_stats(e);
  T_FAIL(pstar_iteration_abort(e), PSTAR_ERR_INVALID_STATE, "no iteration in progress");
  /* After a step: no iteration either. */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  (void)t_acquire(e, w, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, w, NULL));
  T_OK(pstar_step(e, NULL));
  T_FAIL(pstar_iteration_abort(e), PSTAR_ERR_INVALID_STATE, "no iteration in progress");
  /* After an EVAL iteration's end. */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  T_OK(pstar_iteration_end(e));
  T_FAIL(pstar_iteration_abort(e), PSTAR_ERR_INVALID_STATE, "no iteration in progress");
  const pstar_stats s1 = t_stats(e);
  cr_assert_eq(s1.iterations, s0.iterations + 2, "a refused abort changed the iteration count");
  cr_assert_eq(s1.steps, s0.steps + 1, "the one step");
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), 1.0);
  /* The step without a backward use updated nothing. */
  t_read_f32(e, w, got, 300);
  cr_assert_eq(memcmp(got, v, sizeof v), 0);
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* EVAL iterations and what is still acquired                                */
/* ------------------------------------------------------------------------ */

Test(abort, an_eval_iteration_is_aborted_and_its_parameters_released) {
  enum { K = 5, N = 900 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  /* Three chunks at once fit, four do not (each parameter has its chunk). */
  o.device_capacity_bytes = 2 * 1024 * 2 + N * 4;
  pstar_engine *e = t_create(&o);
  uint32_t ids[K];
  float v[K][N], got[N];
  for (int k = 0; k < K; ++k) {
    char name[8];
    snprintf(name, sizeof name, "p%d", k);
    ids[k] = t_register(e, name, N, 0);
  }
  T_OK(pstar_engine_build(e));
  for (int k = 0; k < K; ++k) {
    t_fill(v[k], N, (uint32_t)(20 + k), 1.0f);
    t_write_f32(e, ids[k], v[k], N);
  }
  const pstar_stats s0 = t_stats(e);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  (void)t_acquire(e, ids[0], PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, ids[0], NULL));
  (void)t_acquire(e, ids[0], PSTAR_STAGE_FORWARD);
  (void)t_acquire(e, ids[1], PSTAR_STAGE_FORWARD);
  T_FAIL(pstar_iteration_end(e), PSTAR_ERR_INVALID_STATE, "still acquired");
  T_OK(pstar_iteration_abort(e));
  T_FAIL(pstar_param_release(e, ids[0], NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  T_FAIL(pstar_param_release(e, ids[1], NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  T_FAIL(pstar_iteration_end(e), PSTAR_ERR_INVALID_STATE, "no iteration in progress");
  T_FAIL(pstar_iteration_abort(e), PSTAR_ERR_INVALID_STATE, "no iteration in progress");
  const pstar_stats s1 = t_stats(e);
  cr_assert_eq(s1.iterations, s0.iterations + 1);
  cr_assert_eq(s1.steps, 0);
  cr_assert_eq(s1.trace_moments, 0);
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), 0.0);
  /* Values between iterations, unchanged (bf16 masters are fp32). */
  for (int k = 0; k < K; ++k) {
    t_read_f32(e, ids[k], got, N);
    cr_assert_eq(memcmp(got, v[k], sizeof got), 0, "p%d changed", k);
  }
  /* Three other chunks at once fit only if the two released may leave. */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  for (int k = 2; k < K; ++k) (void)t_acquire(e, ids[k], PSTAR_STAGE_FORWARD);
  for (int k = 2; k < K; ++k) T_OK(pstar_param_release(e, ids[k], NULL));
  T_OK(pstar_iteration_end(e));
  /* And a TRAIN iteration after it trains. */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  (void)t_acquire(e, ids[0], PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, ids[0], NULL));
  (void)t_acquire(e, ids[0], PSTAR_STAGE_BACKWARD);
  float g[N];
  t_fill(g, N, 5, 0.5f);
  T_OK(pstar_grad_write(e, ids[0], g, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, ids[0], NULL));
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(e, &r));
  cr_assert_eq(r.step, 1);
  cr_assert_eq(r.params_updated, 1);
  cr_assert_leq(t_stats(e).peak_device_bytes, o.device_capacity_bytes);
  T_OK(pstar_engine_destroy(e));
}

/* Repeated aborts with two chunks and a gradient buffer held each time, at
 * a capacity of exactly that: any chunk left pinned or gradient buffer left
 * counted would make a later round run out of memory. */
Test(abort, acquired_parameters_and_gradient_buffers_are_released, .timeout = 60) {
  enum { K = 8, N = 1000 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  o.device_capacity_bytes = 2 * 1024 * 2 + N * 4;
  o.strict = 1;
  o.strict_seed = 3;
  pstar_engine *e = t_create(&o);
  uint32_t ids[K];
  for (int k = 0; k < K; ++k) {
    char name[8];
    snprintf(name, sizeof name, "p%d", k);
    ids[k] = t_register(e, name, N, 0);
  }
  T_OK(pstar_engine_build(e));
  float g[N], v[N];
  t_fill(g, N, 4, 0.25f);
  for (int k = 0; k < K; ++k) {
    t_fill(v, N, (uint32_t)(40 + k), 1.0f);
    t_write_f32(e, ids[k], v, N);
  }
  for (int round = 0; round < 2 * K; ++round) {
    const int a = round % K, b = (round + 3) % K;
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (int k = 0; k < K; ++k) {
      (void)t_acquire(e, ids[k], PSTAR_STAGE_FORWARD);
      T_OK(pstar_param_release(e, ids[k], NULL));
    }
    /* A finished backward (its slot holds the gradient), then two left
     * acquired, one with its gradient buffer. */
    const int c = (round + 5) % K;
    (void)t_acquire(e, ids[c], PSTAR_STAGE_BACKWARD);
    T_OK(pstar_grad_write(e, ids[c], g, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    T_OK(pstar_param_release(e, ids[c], NULL));
    (void)t_acquire(e, ids[a], PSTAR_STAGE_RECOMPUTE);
    (void)t_acquire(e, ids[b], PSTAR_STAGE_BACKWARD);
    T_OK(pstar_grad_write(e, ids[b], g, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    T_OK(pstar_iteration_abort(e));
  }
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), 0.0);
  /* Nothing trained: every master is as written. */
  for (int k = 0; k < K; ++k) {
    float got[N];
    t_fill(v, N, (uint32_t)(40 + k), 1.0f);
    t_read_f32(e, ids[k], got, N);
    cr_assert_eq(memcmp(got, v, sizeof got), 0, "p%d changed", k);
  }
  /* And every weight slot holds the weight again (a forward use reads it). */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  for (int k = 0; k < K; ++k) {
    const void *w = t_acquire(e, ids[k], PSTAR_STAGE_FORWARD);
    t_fill(v, N, (uint32_t)(40 + k), 1.0f);
    for (int j = 0; j < N; ++j) {
      cr_assert_eq(t_load(w, PSTAR_DTYPE_BF16, (size_t)j), t_round(PSTAR_DTYPE_BF16, v[j]), "p%d [%d]", k, j);
    }
    T_OK(pstar_param_release(e, ids[k], NULL));
  }
  T_OK(pstar_iteration_end(e));
  const pstar_stats s = t_stats(e);
  cr_assert_leq(s.peak_device_bytes, o.device_capacity_bytes);
  cr_assert_gt(s.evictions, 0);
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* The trace                                                                 */
/* ------------------------------------------------------------------------ */

static void trace_iteration(pstar_engine *e, const uint32_t *ids, int n, int reversed, int stop_after) {
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  int uses = 0;
  for (int i = 0; i < n; ++i) {
    const int k = reversed ? n - 1 - i : i;
    (void)t_acquire(e, ids[k], PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, ids[k], NULL));
    if (++uses == stop_after) {
      T_OK(pstar_iteration_abort(e));
      return;
    }
  }
  T_OK(pstar_step(e, NULL));
}

Test(abort, leaves_the_trace_as_if_the_iteration_never_began) {
  enum { K = 6 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  o.device_capacity_bytes = 3 * 1024 * 2;
  o.warmup_iterations = 2;
  pstar_engine *e = t_create(&o);
  uint32_t ids[K];
  for (int k = 0; k < K; ++k) {
    char name[8];
    snprintf(name, sizeof name, "p%d", k);
    ids[k] = t_register(e, name, 1000, 0);
  }
  T_OK(pstar_engine_build(e));
  trace_iteration(e, ids, K, 0, -1);  /* warm-up 1 of 2 */
  trace_iteration(e, ids, K, 0, 3);   /* aborted: not a warm-up iteration */
  cr_assert_eq(t_stats(e).trace_moments, 0, "the aborted iteration ended warm-up");
  trace_iteration(e, ids, K, 0, -1);  /* warm-up 2 of 2: the trace */
  cr_assert_eq(t_stats(e).trace_moments, K, "the trace holds %llu moments",
               (unsigned long long)t_stats(e).trace_moments);
  trace_iteration(e, ids, K, 0, 2);   /* following, aborted: fewer acquires, no divergence */
  cr_assert_eq(t_stats(e).trace_fallbacks, 0);
  trace_iteration(e, ids, K, 1, 4);   /* diverges, then aborted: not counted, the trace kept */
  cr_assert_eq(t_stats(e).trace_fallbacks, 0);
  cr_assert_eq(t_stats(e).trace_moments, K);
  trace_iteration(e, ids, K, 0, -1);  /* follows from its start, matches */
  cr_assert_eq(t_stats(e).trace_fallbacks, 0);
  trace_iteration(e, ids, K, 1, -1);  /* checked against the trace again: a divergence */
  cr_assert_eq(t_stats(e).trace_fallbacks, 1);
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Dry runs                                                                  */
/* ------------------------------------------------------------------------ */

Test(abort, works_in_a_dry_run) {
  enum { K = 6, N = 1000 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  o.dry_run = 1;
  o.device_capacity_bytes = 3 * 1024 * 2 + 2 * N * 4;
  o.grad_accumulation = 1;
  pstar_engine *e = t_create(&o);
  uint32_t ids[K];
  for (int k = 0; k < K; ++k) {
    char name[8];
    snprintf(name, sizeof name, "p%d", k);
    ids[k] = t_register(e, name, N, 0);
  }
  T_OK(pstar_engine_build(e));
  void *p;
  for (int it = 0; it < 4; ++it) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (int k = 0; k < K; ++k) {
      T_OK(pstar_param_acquire(e, ids[k], PSTAR_STAGE_FORWARD, NULL, &p));
      T_OK(pstar_param_release(e, ids[k], NULL));
    }
    const int last = it == 1 ? K / 2 : 0; /* iteration 1 stops half way */
    for (int k = K - 1; k >= last; --k) {
      T_OK(pstar_param_acquire(e, ids[k], PSTAR_STAGE_BACKWARD, NULL, &p));
      T_OK(pstar_grad_write(e, ids[k], NULL, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      T_OK(pstar_param_release(e, ids[k], NULL));
    }
    if (it == 1) {
      T_OK(pstar_param_acquire(e, ids[0], PSTAR_STAGE_BACKWARD, NULL, &p));
      T_OK(pstar_grad_write(e, ids[0], NULL, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      T_OK(pstar_iteration_abort(e));
      continue;
    }
    T_OK(pstar_step(e, NULL));
  }
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  T_OK(pstar_param_acquire(e, ids[1], PSTAR_STAGE_FORWARD, NULL, &p));
  T_OK(pstar_iteration_abort(e));
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), 3.0);
  const pstar_stats s = t_stats(e);
  cr_assert_eq(s.steps, 3);
  cr_assert_eq(s.trace_fallbacks, 0);
  cr_assert_leq(s.peak_device_bytes, o.device_capacity_bytes);
  T_OK(pstar_engine_destroy(e));
}
