/* The overlapped step (pstar_x_engine_set_overlap_step): pstar_step returns
 * before the CPU updates are done, the update thread runs them in the next
 * iteration's order, and each acquire waits for its chunk's update only.
 *
 * Only the timing may differ from the synchronous step: the weights, every
 * step result and the values read between steps must be the same bits,
 * under every policy, with tight and unlimited capacity, prefetch on and
 * off, gradient accumulation, skipped steps, EVAL iterations between
 * steps, reads and writes right after a step, pins, hybrid placement and
 * strict mode.  Where the step cannot overlap (the virtual clock, a dry
 * run) the engine says so in its step statistics. */
#define PSTAR_EXPERIMENTAL_API 1
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capi_test_util.h"

enum { P = 9, CHUNK = 1024, MAXN = 2048, ITERS = 6 };

/* Several parameters per chunk, a jumbo one (2048) and a frozen one. */
static const int64_t kNumel[P] = {512, 500, 1024, 1000, 700, 300, 640, 2048, 900};
static const int kFrozen = 5;

typedef struct ocfg {
  pstar_dtype dtype;
  pstar_policy policy;
  int prefetch;
  uint64_t capacity;
  int overlap;
  int hybrid;
  int strict;
  int virtual_clock;
  int grad_accumulation; /* two micro-batches per step */
  int overflow_at;       /* step with an infinite gradient, or -1 */
  int eval_after;        /* an EVAL iteration after this step, or -1 */
  int rw_after;          /* values read, changed and written after this step, or -1 */
  int pin_after;         /* a read-only pin after this step, or -1 */
  uint64_t speculate;    /* pstar_x_engine_set_speculative_update's bytes */
  float clip_norm;
  int pin_in_backward; /* a read-only pin half way through this step's backward, or -1 */
  /* 0: a fixed learning rate; else it follows lr_of(step), set before the
   * iteration begins (1) or after the backward, inside the iteration, with
   * the norm read there (2: as a torch optimizer's step() does, with
   * pstar_grad_norm as torch's clip_grad_norm_). */
  int late_hparams;
} ocfg;

/* A schedule that changes every second step: the late setting changes
 * the constants of a speculation under way at steps 2 and 4 only. */
static double lr_of(int step) { return 1e-3 * (double)(1 + step / 2); }

typedef struct orun {
  float w[P][MAXN];
  float mid[P][MAXN]; /* values read right after step rw_after */
  double grad_norm[ITERS];
  float loss_scale[ITERS], clip_coef[ITERS];
  int skipped[ITERS];
  pstar_x_step_stats step_stats;
} orun;

static void t_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static ocfg base_cfg(void) {
  ocfg c;
  memset(&c, 0, sizeof c);
  c.dtype = PSTAR_DTYPE_BF16;
  c.policy = PSTAR_POLICY_OPT;
  c.prefetch = 1;
  c.overlap = 1;
  c.overflow_at = -1;
  c.eval_after = -1;
  c.rw_after = -1;
  c.pin_after = -1;
  c.clip_norm = 2.0f;
  c.pin_in_backward = -1;
  return c;
}

static void micro_batch(pstar_engine *e, const uint32_t *id, const ocfg *c, int step, int mb) {
  static float g[MAXN];
  void *w = NULL;
  for (int i = 0; i <= P; ++i) { /* parameter 0 used again last: a tied weight */
    const int p = i == P ? 0 : i;
    T_OK(pstar_param_acquire(e, id[p], PSTAR_STAGE_FORWARD, NULL, &w));
    T_OK(pstar_param_release(e, id[p], NULL));
  }
  for (int i = P; i >= 0; --i) {
    const int p = i == P ? 0 : i;
    if (p == kFrozen) continue;
    w = t_acquire(e, id[p], PSTAR_STAGE_BACKWARD);
    for (int j = 0; j < kNumel[p]; ++j) {
      g[j] = t_load(w, c->dtype, (size_t)j) * 0.01f + (float)((j + step + i + mb) % 7 - 3) / 64.0f;
    }
    if (step == c->overflow_at && p == 3) g[7] = INFINITY;
    T_OK(pstar_grad_write(e, id[p], g, (uint64_t)kNumel[p], PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    T_OK(pstar_param_release(e, id[p], NULL));
    /* Speculating: time for the copy to the host and the update (the
     * caller's compute), so that the later releases hand chunks over. */
    if (c->speculate != 0) t_sleep_ms(2);
    if (step == c->pin_in_backward && mb == 0 && i == 4) {
      /* The chunks of parameters 4-8 are done: their speculation is under
       * way; a pin reads a master and so discards it. */
      void *m = NULL;
      pstar_dtype dt = PSTAR_DTYPE_F16;
      T_OK(pstar_param_pin(e, id[6], 0, &m, &dt));
      cr_assert(isfinite(((const float *)m)[1]));
      T_OK(pstar_param_unpin(e, id[6]));
    }
  }
}

static void eval_iteration(pstar_engine *e, const uint32_t *id, const ocfg *c, float *sum) {
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  for (int p = P; p-- > 0;) { /* another order than the trace's */
    const void *w = t_acquire(e, id[p], PSTAR_STAGE_FORWARD);
    for (int j = 0; j < kNumel[p]; j += 97) *sum += t_load(w, c->dtype, (size_t)j);
    T_OK(pstar_param_release(e, id[p], NULL));
  }
  T_OK(pstar_iteration_end(e));
}

static void run_cfg(const ocfg *c, orun *out) {
  pstar_engine_options o = t_options(c->dtype, CHUNK);
  o.threads = 2;
  o.placement_policy = c->policy;
  o.prefetch = c->prefetch;
  o.device_capacity_bytes = c->capacity;
  o.hybrid_optimizer = c->hybrid;
  o.strict = c->strict;
  o.strict_seed = 5;
  o.virtual_clock = c->virtual_clock;
  o.grad_accumulation = c->grad_accumulation;
  o.loss_scale_initial = 1024.0f;
  o.clip_norm = c->clip_norm;
  pstar_engine *e = t_create(&o);
  T_OK(pstar_x_engine_set_overlap_step(e, c->overlap));
  T_OK(pstar_x_engine_set_speculative_update(e, c->speculate));
  uint32_t id[P];
  char name[8];
  for (int i = 0; i < P; ++i) {
    snprintf(name, sizeof name, "p%d", i);
    id[i] = t_register(e, name, kNumel[i], i == kFrozen ? PSTAR_PARAM_FROZEN : 0);
  }
  T_OK(pstar_engine_build(e));
  T_OK(pstar_param_set_lr_scale(e, id[4], 0.5f));
  T_OK(pstar_param_set_weight_decay(e, id[1], 0));
  for (int i = 0; i < P; ++i) {
    t_fill(out->w[i], (size_t)kNumel[i], (uint32_t)i + 7, 0.5f);
    t_write_f32(e, id[i], out->w[i], (uint64_t)kNumel[i]);
  }
  float eval_sum = 0.0f;
  for (int s = 0; s < ITERS; ++s) {
    if (c->late_hparams == 1) T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LR, lr_of(s)));
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (int mb = 0; mb < (c->grad_accumulation ? 2 : 1); ++mb) micro_batch(e, id, c, s, mb);
    double norm_before = -1.0;
    if (c->late_hparams == 2) {
      T_OK(pstar_grad_norm(e, &norm_before));
      T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LR, lr_of(s)));
    }
    pstar_step_result r = PSTAR_STEP_RESULT_INIT;
    T_OK(pstar_step(e, &r));
    if (c->late_hparams == 2) {
      const double inf = INFINITY;
      cr_assert(memcmp(&norm_before, r.skipped ? &inf : &r.grad_norm, sizeof norm_before) == 0,
                "step %d: pstar_grad_norm %.17g, the step's %.17g (skipped %d)", s, norm_before, r.grad_norm,
                r.skipped);
    }
    out->grad_norm[s] = r.grad_norm;
    out->loss_scale[s] = r.loss_scale;
    out->clip_coef[s] = r.clip_coef;
    out->skipped[s] = r.skipped;
    if (s == c->eval_after) eval_iteration(e, id, c, &eval_sum);
    if (s == c->rw_after) {
      /* Right after the step: the reads wait for its updates. */
      static float v[MAXN];
      for (int i = 0; i < P; ++i) t_read_f32(e, id[i], out->mid[i], (uint64_t)kNumel[i]);
      for (int i = 0; i < P; ++i) {
        for (int j = 0; j < kNumel[i]; ++j) v[j] = out->mid[i][j] * 0.75f + 0.001f * (float)(j % 5);
        t_write_f32(e, id[i], v, (uint64_t)kNumel[i]);
      }
    }
    if (s == c->pin_after && !c->hybrid) {
      void *m = NULL;
      pstar_dtype dt = PSTAR_DTYPE_F16;
      T_OK(pstar_param_pin(e, id[2], 0, &m, &dt));
      cr_assert_eq(dt, PSTAR_DTYPE_F32);
      out->mid[2][0] = ((const float *)m)[0] + ((const float *)m)[kNumel[2] - 1]; /* the updated master */
      T_OK(pstar_param_unpin(e, id[2]));
    }
  }
  cr_assert(isfinite(eval_sum));
  T_OK(pstar_x_step_stats_init(&out->step_stats));
  T_OK(pstar_x_step_get_stats(e, &out->step_stats));
  for (int i = 0; i < P; ++i) t_read_f32(e, id[i], out->w[i], (uint64_t)kNumel[i]);
  T_OK(pstar_engine_destroy(e));
}

/* The least device capacity the model trains in: the jumbo chunk, its fp32
 * gradient buffer and one regular chunk. */
static uint64_t least_capacity(pstar_dtype d) { return (2048 + CHUNK) * t_dtype_size(d) + 2048 * 4; }

static void check_identical(ocfg c, const char *what) {
  static orun ref, r;
  ocfg sync = c;
  sync.overlap = 0;
  sync.speculate = 0;
  if (sync.late_hparams == 2) sync.late_hparams = 1;
  const uint64_t least = least_capacity(c.dtype);
  const uint64_t caps[3] = {0, least + CHUNK * t_dtype_size(c.dtype), least}; /* all chunks fit, or evictions */
  uint64_t kept = 0, discarded = 0;
  int want_kept = 0, want_discarded = 0;
  for (int pi = 0; pi < 3; ++pi) {
    for (int k = 0; k < 3; ++k) {
      sync.policy = c.policy = (pstar_policy)pi;
      sync.capacity = c.capacity = caps[k];
      memset(&ref, 0, sizeof ref);
      memset(&r, 0, sizeof r);
      run_cfg(&sync, &ref);
      run_cfg(&c, &r);
      cr_assert_eq(ref.step_stats.overlap, 0, "%s: the synchronous engine says it overlaps", what);
      if (!c.virtual_clock) {
        cr_assert_eq(r.step_stats.overlap, 1, "%s: policy %d, capacity %d: no overlap", what, pi, k);
        if (!c.hybrid) cr_assert_gt(r.step_stats.steps_overlapped, 0u, "%s: no step overlapped", what);
      }
      cr_assert_eq(memcmp(r.w, ref.w, sizeof r.w), 0, "%s: policy %d, capacity %d: weights differ", what, pi, k);
      cr_assert_eq(memcmp(r.mid, ref.mid, sizeof r.mid), 0, "%s: policy %d, capacity %d: values read differ", what,
                   pi, k);
      cr_assert_eq(memcmp(r.grad_norm, ref.grad_norm, sizeof r.grad_norm), 0, "%s: gradient norms differ", what);
      cr_assert_eq(memcmp(r.loss_scale, ref.loss_scale, sizeof r.loss_scale), 0, "%s: loss scales differ", what);
      cr_assert_eq(memcmp(r.clip_coef, ref.clip_coef, sizeof r.clip_coef), 0, "%s: clip coefficients differ", what);
      cr_assert_eq(memcmp(r.skipped, ref.skipped, sizeof r.skipped), 0, "%s: skipped steps differ", what);
      for (int s = 0; s < ITERS; ++s) cr_assert_eq(r.skipped[s], s == c.overflow_at, "%s: step %d", what, s);
      if (c.speculate == 0 || c.virtual_clock || c.grad_accumulation) {
        cr_assert_eq(r.step_stats.chunks_speculated + r.step_stats.speculations_discarded, 0u,
                     "%s: speculation without being asked for or possible", what);
        continue;
      }
      /* A step applied with coefficient 1 keeps the speculated chunks; a
       * clipped or skipped one discards them. */
      int applied_unclipped = 0, clipped_or_skipped = 0;
      for (int s = 0; s < ITERS; ++s) {
        if (!ref.skipped[s] && ref.clip_coef[s] == 1.0f) {
          ++applied_unclipped;
        } else {
          ++clipped_or_skipped;
        }
      }
      if (applied_unclipped == 0) {
        cr_assert_eq(r.step_stats.chunks_speculated, 0u, "%s: kept a speculation of a clipped step", what);
      }
      /* Whether a speculation completes before its step is timing: counted
       * over the nine runs of this configuration. */
      kept += r.step_stats.chunks_speculated;
      discarded += r.step_stats.speculations_discarded;
      want_kept = want_kept || applied_unclipped > 0;
      want_discarded = want_discarded || clipped_or_skipped > 0 || c.pin_in_backward >= 0 || c.late_hparams == 2;
    }
  }
  if (want_kept) cr_assert_gt(kept, 0u, "%s: no speculation kept in any run", what);
  if (want_discarded) cr_assert_gt(discarded, 0u, "%s: no speculation discarded in any run", what);
}

Test(overlap, bits_as_the_synchronous_step_bf16) {
  ocfg c = base_cfg();
  check_identical(c, "bf16");
  c.prefetch = 0;
  check_identical(c, "bf16, no prefetch");
}

Test(overlap, bits_as_the_synchronous_step_f16_f32) {
  ocfg c = base_cfg();
  c.dtype = PSTAR_DTYPE_F16;
  check_identical(c, "f16");
  c.dtype = PSTAR_DTYPE_F32;
  check_identical(c, "f32");
}

Test(overlap, gradient_accumulation_and_skipped_steps) {
  ocfg c = base_cfg();
  c.grad_accumulation = 1;
  check_identical(c, "accumulation");
  c.overflow_at = 3;
  check_identical(c, "accumulation, overflow");
  c.grad_accumulation = 0;
  c.dtype = PSTAR_DTYPE_F16;
  check_identical(c, "f16, overflow");
}

Test(overlap, eval_iterations_values_and_pins_between_steps) {
  ocfg c = base_cfg();
  c.eval_after = 1;
  c.rw_after = 2;
  c.pin_after = 3;
  check_identical(c, "eval, read/write, pin");
  c.grad_accumulation = 1;
  check_identical(c, "eval, read/write, pin, accumulation");
}

Test(overlap, hybrid_placement) {
  ocfg c = base_cfg();
  c.hybrid = 1;
  c.overflow_at = 4;
  check_identical(c, "hybrid");
  c.grad_accumulation = 1;
  check_identical(c, "hybrid, accumulation");
}

Test(overlap, strict_mode, .timeout = 120) {
  ocfg c = base_cfg();
  c.strict = 1;
  c.eval_after = 2;
  c.rw_after = 3;
  c.overflow_at = 4;
  check_identical(c, "strict");
  c.grad_accumulation = 1;
  check_identical(c, "strict, accumulation");
}

/* The speculative update: chunks updated during the backward, kept by an
 * unclipped applied step, discarded by a clipped or skipped one, by a pin
 * in the backward, or never started for want of budget; always the bits of
 * the synchronous step. */
Test(overlap, speculative_update_kept_or_discarded, .timeout = 120) {
  ocfg c = base_cfg();
  c.speculate = UINT64_MAX;
  c.clip_norm = 1e6f; /* never clips: every applied step keeps */
  check_identical(c, "speculation, no clipping");
  c.prefetch = 0;
  check_identical(c, "speculation, no clipping, no prefetch");
  c.prefetch = 1;
  c.dtype = PSTAR_DTYPE_F16;
  c.overflow_at = 2;
  check_identical(c, "speculation, f16, overflow");
  c.dtype = PSTAR_DTYPE_BF16;
  c.overflow_at = -1;
  c.clip_norm = 2.0f;
  check_identical(c, "speculation, clipping at 2");
  c.clip_norm = 0.0f; /* clipping off */
  c.eval_after = 1;
  c.rw_after = 2;
  c.pin_after = 3;
  c.pin_in_backward = 4;
  check_identical(c, "speculation, eval, read/write, pins");
}

/* A learning rate set after the backward, inside the iteration: the bits of
 * the same schedule set before each iteration, synchronously; a speculation
 * made with the old rate is discarded, one whose rate did not change is
 * kept; the norm read before the step is the step's. */
Test(overlap, hyperparameters_set_after_the_backward, .timeout = 120) {
  ocfg c = base_cfg();
  c.late_hparams = 2;
  check_identical(c, "late lr");
  c.dtype = PSTAR_DTYPE_F16;
  c.overflow_at = 2;
  c.grad_accumulation = 1;
  check_identical(c, "late lr, f16, overflow, accumulation");
  c.dtype = PSTAR_DTYPE_BF16;
  c.overflow_at = -1;
  c.grad_accumulation = 0;
  c.speculate = UINT64_MAX;
  c.clip_norm = 1e6f;
  check_identical(c, "late lr, speculation");
}

Test(overlap, speculative_update_budget_hybrid_strict, .timeout = 120) {
  ocfg c = base_cfg();
  c.clip_norm = 0.0f;
  c.speculate = 3 * CHUNK * 4 + CHUNK * 2; /* one regular bf16 chunk at a time */
  check_identical(c, "speculation, budget of one chunk");
  c.speculate = UINT64_MAX;
  c.hybrid = 1;
  check_identical(c, "speculation, hybrid");
  c.hybrid = 0;
  c.strict = 1;
  c.overflow_at = 3;
  check_identical(c, "speculation, strict");
  c.strict = 0;
  c.overflow_at = -1;
  c.grad_accumulation = 1; /* no speculation: the gradients are complete at the step only */
  check_identical(c, "speculation asked, accumulation");
}

Test(overlap, virtual_clock_stays_synchronous) {
  ocfg c = base_cfg();
  c.virtual_clock = 1;
  check_identical(c, "virtual clock");
  static orun r;
  run_cfg(&c, &r);
  cr_assert_eq(r.step_stats.overlap, 0, "on the virtual clock the step is synchronous");
  cr_assert_eq(r.step_stats.steps_overlapped, 0u);
}

Test(overlap, the_setting_and_its_statistics) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  pstar_engine *e = t_create(&o);
  pstar_x_step_stats s;
  T_OK(pstar_x_step_stats_init(&s));
  cr_assert_eq(s.size, sizeof s);
  cr_assert_eq(s.version, PSTAR_X_STEP_STATS_VERSION);
  T_OK(pstar_x_step_get_stats(e, &s));
  cr_assert_eq(s.overlap, 1, "on by default");
  T_OK(pstar_x_engine_set_overlap_step(e, 0));
  T_OK(pstar_x_step_get_stats(e, &s));
  cr_assert_eq(s.overlap, 0);
  T_OK(pstar_x_engine_set_overlap_step(e, 1));
  t_register(e, "w", 100, 0);
  T_OK(pstar_engine_build(e));
  T_FAIL(pstar_x_engine_set_overlap_step(e, 0), PSTAR_ERR_INVALID_STATE, "before");
  T_FAIL(pstar_x_step_get_stats(e, NULL), PSTAR_ERR_INVALID_ARGUMENT, "");
  s.size = 4;
  T_FAIL(pstar_x_step_get_stats(e, &s), PSTAR_ERR_VERSION, "step stats");
  T_FAIL(pstar_x_engine_set_overlap_step(NULL, 1), PSTAR_ERR_INVALID_HANDLE, "NULL");
  T_FAIL(pstar_x_engine_set_speculative_update(e, 1), PSTAR_ERR_INVALID_STATE, "before");
  T_FAIL(pstar_x_engine_set_speculative_update(NULL, 1), PSTAR_ERR_INVALID_HANDLE, "NULL");
  /* A version-1 caller's struct (before the speculation counters). */
  pstar_x_step_stats v1;
  memset(&v1, 0xab, sizeof v1);
  v1.size = (uint32_t)offsetof(pstar_x_step_stats, chunks_speculated);
  v1.version = 1;
  T_OK(pstar_x_step_get_stats(e, &v1));
  cr_assert_eq(v1.overlap, 1);
  cr_assert_eq(v1.chunks_speculated, 0xababababababababull, "written past a version-1 struct");
  T_OK(pstar_engine_destroy(e));

  o.dry_run = 1;
  o.virtual_clock = 1;
  e = t_create(&o);
  t_register(e, "w", 100, 0);
  T_OK(pstar_engine_build(e));
  T_OK(pstar_x_step_stats_init(&s));
  T_OK(pstar_x_step_get_stats(e, &s));
  cr_assert_eq(s.overlap, 0, "a dry run computes nothing: no update thread");
  T_OK(pstar_engine_destroy(e));
}

/* An updated chunk's copy to the device follows its update on the update
 * thread (placement::Runtime::UpdateFollower), not the caller's next engine
 * call.  Four chunks of 1M elements (an update of a few milliseconds each)
 * and 30 ms of compute per forward use: the first forward acquire waits for
 * chunk 0's update and may wait for its copy; the others find their chunk
 * on the device, its copy done during the compute before.  Without the
 * follow-up copy, chunk 1's update would still be running at the first
 * acquire's prefetch and chunk 1 would be fetched on demand by its own
 * acquire: at least two chunks on the critical path per iteration.
 * Strict mode (poisoned copies, seeded delays) must give the synchronous
 * step's bits. */
enum { FP = 4, FOLLOW_ELEMS = 1 << 20, FOLLOW_ITERS = 7, FOLLOW_WARM = 3 };

static uint64_t run_follow(int overlap, int strict, float *weights /* FP x FOLLOW_ELEMS */) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, FOLLOW_ELEMS);
  o.strict = strict;
  o.strict_seed = 11;
  pstar_engine *e = t_create(&o);
  T_OK(pstar_x_engine_set_overlap_step(e, overlap));
  uint32_t id[FP];
  char name[8];
  for (int i = 0; i < FP; ++i) {
    snprintf(name, sizeof name, "f%d", i);
    id[i] = t_register(e, name, FOLLOW_ELEMS, 0);
  }
  T_OK(pstar_engine_build(e));
  float *g = malloc(sizeof(float) * FOLLOW_ELEMS);
  cr_assert_not_null(g);
  for (int i = 0; i < FP; ++i) {
    t_fill(g, FOLLOW_ELEMS, (uint32_t)i + 3, 0.5f);
    t_write_f32(e, id[i], g, FOLLOW_ELEMS);
  }
  uint64_t critical = 0, before = 0;
  for (int s = 0; s < FOLLOW_ITERS; ++s) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    void *w = NULL;
    for (int i = 0; i < FP; ++i) {
      T_OK(pstar_param_acquire(e, id[i], PSTAR_STAGE_FORWARD, NULL, &w));
      t_sleep_ms(30);
      T_OK(pstar_param_release(e, id[i], NULL));
    }
    for (int i = FP; i-- > 0;) {
      w = t_acquire(e, id[i], PSTAR_STAGE_BACKWARD);
      for (int j = 0; j < FOLLOW_ELEMS; ++j) g[j] = (float)((j + s + i) % 9 - 4) / 128.0f;
      T_OK(pstar_grad_write(e, id[i], g, FOLLOW_ELEMS, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      T_OK(pstar_param_release(e, id[i], NULL));
    }
    /* No step in flight here (every chunk's update was waited for by its
     * forward acquire): the statistics do not move the next forward. */
    const uint64_t now = t_stats(e).bytes_critical;
    if (s >= FOLLOW_WARM) critical += now - before;
    before = now;
    pstar_step_result r = PSTAR_STEP_RESULT_INIT;
    T_OK(pstar_step(e, &r));
  }
  for (int i = 0; i < FP; ++i) t_read_f32(e, id[i], weights + (size_t)i * FOLLOW_ELEMS, FOLLOW_ELEMS);
  free(g);
  T_OK(pstar_engine_destroy(e));
  return critical;
}

Test(overlap, updated_chunks_follow_their_update_to_the_device, .timeout = 120) {
  float *sync = malloc(sizeof(float) * FP * FOLLOW_ELEMS);
  float *over = malloc(sizeof(float) * FP * FOLLOW_ELEMS);
  cr_assert(sync != NULL && over != NULL);
  run_follow(0, 0, sync);
  const uint64_t critical = run_follow(1, 0, over);
  cr_assert_eq(memcmp(sync, over, sizeof(float) * FP * FOLLOW_ELEMS), 0, "overlapped bits differ");
  const uint64_t chunk_bytes = (uint64_t)FOLLOW_ELEMS * 2;
  const uint64_t iters = FOLLOW_ITERS - FOLLOW_WARM;
  cr_assert_leq(critical, iters * chunk_bytes + chunk_bytes,
                "%llu critical bytes over %llu iterations: more than chunk 0's copy per iteration",
                (unsigned long long)critical, (unsigned long long)iters);
  run_follow(1, 1, over);
  cr_assert_eq(memcmp(sync, over, sizeof(float) * FP * FOLLOW_ELEMS), 0, "strict overlapped bits differ");
  free(sync);
  free(over);
}
