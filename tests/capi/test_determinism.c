/*
 * End-to-end determinism: the same small model trained with an unlimited
 * device and with a device of about a quarter of its compute list (forcing
 * evictions and refetches in every pass), the latter in strict mode (poisoned
 * copy destinations, seeded random delays on the device streams), must end
 * with bit-identical parameters.
 *
 * Gradients are synthetic but depend on the weights read through the
 * acquired pointers (in forward and backward), so stale or poisoned data
 * anywhere changes the result.
 */
#include "capi_test_util.h"

enum { CHUNK_ELEMS = 2048, NPARAMS = 20, TIED = 0, FROZEN = 9, ITERS = 5 };

/* Element counts, in use order.  Parameter 0 is tied (used first and last in
 * forward, so its gradient buffer is live during the whole backward). */
static const int64_t k_numel[NPARAMS] = {384, 1000, 130,  900, 1000, 700,  640, 1000, 1024, 1200,
                                         960, 512,  1000, 800, 300,  1000, 880, 1000, 600,  1000};
static const uint32_t k_flags[NPARAMS] = {0, 0, PSTAR_PARAM_NO_WEIGHT_DECAY, 0, 0, 0, 0, 0, 0, PSTAR_PARAM_FROZEN,
                                          0, 0, 0, 0, PSTAR_PARAM_NO_WEIGHT_DECAY, 0, 0, 0, 0, 0};

typedef struct run_result {
  float *params[NPARAMS]; /* final values, fp32 */
  pstar_stats stats;
  double final_step;
  double final_loss_scale;
  uint64_t skipped;
  float *init[NPARAMS];
} run_result;

static void free_result(run_result *r) {
  for (int i = 0; i < NPARAMS; ++i) {
    free(r->params[i]);
    free(r->init[i]);
  }
}

/* Bytes of device memory needed by the largest set acquired at once: a
 * backward use holds the parameter's chunk, its fp32 gradient buffer and the
 * tied parameter's gradient buffer (live from its first to its last backward
 * use). */
static uint64_t largest_acquired_set(pstar_dtype dtype) {
  uint64_t worst = 0;
  for (int i = 0; i < NPARAMS; ++i) {
    uint64_t need = CHUNK_ELEMS * t_dtype_size(dtype);
    if (k_flags[i] & PSTAR_PARAM_FROZEN) {
      need += 4u * (uint64_t)k_numel[TIED];
    } else {
      need += 4u * (uint64_t)k_numel[i];
      if (i != TIED) need += 4u * (uint64_t)k_numel[TIED];
    }
    if (need > worst) worst = need;
  }
  return worst;
}

/* A scalar "activation" from the weights a forward use sees. */
static float activation(const void *w, pstar_dtype dt, int64_t n) {
  float a = 0.0f;
  for (int64_t j = 0; j < n; j += 3) a += t_load(w, dt, (size_t)j);
  return a / (float)n;
}

/* Gradient of parameter k at iteration `it`: depends on the weights seen in
 * backward, on the activations of forward, and on (k, it, j). */
static void make_grad(float *g, const void *w, pstar_dtype dt, int64_t n, int k, int it, float act, float scale) {
  for (int64_t j = 0; j < n; ++j) {
    const float wj = t_load(w, dt, (size_t)j);
    const float noise = 1e-2f * (float)((int)((j * 7 + it * 3 + k * 5) % 11) - 5);
    g[j] = (0.1f * wj + 0.05f * act + noise) * scale;
  }
}

static void run_model(pstar_dtype dt, uint64_t capacity, int strict, uint64_t seed, int inject_overflow,
                      run_result *out) {
  memset(out, 0, sizeof *out);
  pstar_engine_options o = t_options(dt, CHUNK_ELEMS);
  o.device_capacity_bytes = capacity;
  o.strict = strict;
  o.strict_seed = seed;
  o.lr = 1e-2f;
  o.weight_decay = 0.01f;
  o.loss_scale_initial = 4096.0f;
  pstar_engine *e = t_create(&o);
  uint32_t ids[NPARAMS];
  for (int i = 0; i < NPARAMS; ++i) {
    char name[32];
    snprintf(name, sizeof name, "block%02d.weight", i);
    ids[i] = t_register(e, name, k_numel[i], k_flags[i]);
  }
  T_OK(pstar_engine_build(e));
  for (int i = 0; i < NPARAMS; ++i) {
    out->init[i] = t_alloc_f((size_t)k_numel[i]);
    t_fill(out->init[i], (size_t)k_numel[i], (uint32_t)(1000 + i), 1.0f);
    t_write_f32(e, ids[i], out->init[i], (uint64_t)k_numel[i]);
  }
  void *stream = NULL;
  T_OK(pstar_engine_compute_stream(e, &stream));

  float *g = t_alloc_f(CHUNK_ELEMS);
  for (int it = 0; it < ITERS; ++it) {
    const float scale = (float)t_hparam(e, PSTAR_HPARAM_LOSS_SCALE);
    float act[NPARAMS + 1];
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    /* Forward: 0, 1, ..., NPARAMS-1, then the tied parameter again. */
    for (int s = 0; s <= NPARAMS; ++s) {
      const int k = s == NPARAMS ? TIED : s;
      void *w = NULL;
      T_OK(pstar_param_acquire(e, ids[k], PSTAR_STAGE_FORWARD, stream, &w));
      act[s] = activation(w, dt, k_numel[k]);
      T_OK(pstar_param_release(e, ids[k], stream));
      /* Activation memory is small next to the budget; report it anyway. */
      T_OK(pstar_nonmodel_report(e, 64u * (uint64_t)(s + 1)));
    }
    /* Backward in reverse, with a recompute of every fourth parameter. */
    for (int s = NPARAMS; s >= 0; --s) {
      const int k = s == NPARAMS ? TIED : s;
      const int64_t n = k_numel[k];
      if (k % 4 == 1) {
        void *r = NULL;
        T_OK(pstar_param_acquire(e, ids[k], PSTAR_STAGE_RECOMPUTE, stream, &r));
        cr_assert_eq(activation(r, dt, n), act[s], "recompute of %d saw other weights than forward", k);
        T_OK(pstar_param_release(e, ids[k], stream));
      }
      void *w = NULL;
      T_OK(pstar_param_acquire(e, ids[k], PSTAR_STAGE_BACKWARD, stream, &w));
      if (!(k_flags[k] & PSTAR_PARAM_FROZEN)) {
        make_grad(g, w, dt, n, k, it, act[s], scale);
        if (inject_overflow && it == 2 && k == 5) g[n / 2] = INFINITY;
        const int how = (s == NPARAMS) ? 0 : (k == TIED ? 2 : k % 3);
        if (how == 0) {
          T_OK(pstar_grad_write(e, ids[k], g, (uint64_t)n, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, stream));
        } else if (how == 1) {
          /* In the compute dtype, from "device" memory: a host buffer,
           * which only the non-strict emulated device takes as device
           * memory (strict mode refuses it: test_memspace.c). */
          uint16_t *h = (uint16_t *)calloc((size_t)n, sizeof(uint16_t));
          cr_assert_not_null(h);
          for (int64_t j = 0; j < n; ++j) t_store(h, dt, (size_t)j, g[j]);
          T_OK(pstar_grad_write(e, ids[k], h, (uint64_t)n, dt, strict ? PSTAR_MEM_HOST : PSTAR_MEM_DEVICE, stream));
          free(h);
        } else {
          float *slot = NULL;
          T_OK(pstar_grad_slot_acquire(e, ids[k], stream, &slot));
          for (int64_t j = 0; j < n; ++j) slot[j] += g[j];
        }
      }
      T_OK(pstar_param_release(e, ids[k], stream));
    }
    T_OK(pstar_nonmodel_report(e, 0));
    pstar_step_result r;
    T_OK(pstar_step_result_init(&r));
    T_OK(pstar_step(e, &r));
    if (inject_overflow && it == 2) {
      cr_assert_eq(r.skipped, 1, "the injected overflow was not detected");
    } else {
      cr_assert_eq(r.skipped, 0, "iteration %d skipped (grad norm %g)", it, r.grad_norm);
      cr_assert_eq(r.params_updated, NPARAMS - 1);
    }
  }
  free(g);

  for (int i = 0; i < NPARAMS; ++i) {
    out->params[i] = t_alloc_f((size_t)k_numel[i]);
    t_read_f32(e, ids[i], out->params[i], (uint64_t)k_numel[i]);
  }
  out->stats = t_stats(e);
  out->final_step = t_hparam(e, PSTAR_HPARAM_STEP);
  out->final_loss_scale = t_hparam(e, PSTAR_HPARAM_LOSS_SCALE);
  out->skipped = out->stats.skipped_steps;
  T_OK(pstar_engine_destroy(e));
}

static void check_determinism(pstar_dtype dt, int inject_overflow) {
  run_result free_run, tight_run;
  run_model(dt, 0, 0, 0, inject_overflow, &free_run);
  const pstar_stats *fs = &free_run.stats;
  const uint64_t list = fs->compute_list_bytes;
  cr_assert_gt(fs->compute_chunks, 8, "the model should span several chunks (%u)", fs->compute_chunks);
  /* Unlimited device: no eviction for room, only at each step (the CPU
   * optimizer updates the chunks on the host): each chunk moves in at most
   * once per iteration (the last step's prefetch for a next iteration
   * included), and the first iteration fetches the whole list. */
  cr_assert_leq(fs->evictions, (uint64_t)ITERS * fs->compute_chunks, "unlimited device: %llu evictions",
                (unsigned long long)fs->evictions);
  cr_assert_leq(fs->bytes_host_to_device, (uint64_t)(ITERS + 1) * list, "unlimited device: %llu bytes in",
                (unsigned long long)fs->bytes_host_to_device);
  cr_assert_geq(fs->bytes_host_to_device, list);

  /* About a quarter of the compute list, but never less than what must be
   * resident at once. */
  uint64_t capacity = list / 4;
  const uint64_t need = largest_acquired_set(dt) + 64u * (NPARAMS + 1);
  if (capacity < need) capacity = need;
  cr_assert_leq(capacity, list / 3, "capacity %llu is not much of a constraint for a list of %llu",
                (unsigned long long)capacity, (unsigned long long)list);

  run_model(dt, capacity, 1, 0x5eed, inject_overflow, &tight_run);
  const pstar_stats *ts = &tight_run.stats;

  for (int i = 0; i < NPARAMS; ++i) {
    const size_t bytes = (size_t)k_numel[i] * sizeof(float);
    if (memcmp(free_run.params[i], tight_run.params[i], bytes) != 0) {
      for (int64_t j = 0; j < k_numel[i]; ++j) {
        cr_assert_eq(t_f32_bits(free_run.params[i][j]), t_f32_bits(tight_run.params[i][j]),
                     "param %d [%lld]: unlimited %.9g, capacity %llu strict %.9g", i, (long long)j,
                     (double)free_run.params[i][j], (unsigned long long)capacity, (double)tight_run.params[i][j]);
      }
    }
    if (k_flags[i] & PSTAR_PARAM_FROZEN) {
      for (int64_t j = 0; j < k_numel[i]; ++j) {
        cr_assert_eq(tight_run.params[i][j], t_round(dt, free_run.init[i][j]), "frozen param changed");
      }
    } else {
      cr_assert_neq(memcmp(tight_run.params[i], tight_run.init[i], bytes), 0, "param %d did not train", i);
    }
  }
  cr_assert_eq(tight_run.final_step, free_run.final_step);
  cr_assert_eq(tight_run.final_step, (double)(ITERS - (inject_overflow ? 1 : 0)));
  cr_assert_eq(tight_run.final_loss_scale, free_run.final_loss_scale);
  cr_assert_eq(tight_run.skipped, free_run.skipped);
  cr_assert_eq(ts->compute_list_bytes, list);

  cr_assert_gt(ts->evictions, 0);
  cr_assert_gt(ts->bytes_device_to_host, 0);
  cr_assert_leq(ts->peak_device_bytes, capacity, "peak %llu over capacity %llu",
                (unsigned long long)ts->peak_device_bytes, (unsigned long long)capacity);
  /* Each forward and each backward pass touches every chunk, and at the
   * start of a pass at most `capacity` bytes of chunks are resident: every
   * pass but the first fetches at least list - capacity bytes, the first
   * fetches the whole list. */
  const uint64_t bound = list + (uint64_t)(2 * ITERS - 1) * (list - capacity);
  cr_assert_geq(ts->bytes_host_to_device, bound, "h2d %llu below the bound %llu (list %llu, capacity %llu)",
                (unsigned long long)ts->bytes_host_to_device, (unsigned long long)bound, (unsigned long long)list,
                (unsigned long long)capacity);
  cr_log_info("%s: list %llu, capacity %llu, h2d %llu (bound %llu), evictions %llu, peak %llu",
              dt == PSTAR_DTYPE_F16 ? "f16" : "bf16", (unsigned long long)list, (unsigned long long)capacity,
              (unsigned long long)ts->bytes_host_to_device, (unsigned long long)bound,
              (unsigned long long)ts->evictions, (unsigned long long)ts->peak_device_bytes);
  free_result(&free_run);
  free_result(&tight_run);
}

Test(determinism, bf16_unlimited_vs_quarter_budget_strict, .timeout = 60) {
  check_determinism(PSTAR_DTYPE_BF16, 0);
}

Test(determinism, f16_unlimited_vs_quarter_budget_strict, .timeout = 60) {
  check_determinism(PSTAR_DTYPE_F16, 0);
}

Test(determinism, f16_with_a_skipped_step, .timeout = 60) {
  check_determinism(PSTAR_DTYPE_F16, 1);
}
