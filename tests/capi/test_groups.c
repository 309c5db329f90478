/* Parameter groups (learning-rate multiplier, weight-decay switch) and
 * gradient accumulation over micro-batches (the fp32 gradient list). */
#include <string.h>

#include "capi_test_util.h"

enum { N = 1000 };

static void micro_batch(pstar_engine *e, uint32_t id, const float *g) {
  t_acquire(e, id, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, id, NULL));
  t_acquire(e, id, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(e, id, g, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, id, NULL));
}

/* Trains one parameter for `steps` steps, each of `micro` micro-batches
 * whose gradients sum to the same total; returns the final weights. */
static void run(pstar_dtype dtype, int accumulate, int micro, int steps, float lr_scale, int decay, float *out) {
  pstar_engine_options o = t_options(dtype, 1024);
  o.grad_accumulation = accumulate;
  o.weight_decay = 0.1f;
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float w[N], g[N];
  for (int i = 0; i < N; ++i) w[i] = (float)(i % 37) / 64.0f - 0.25f;
  t_write_f32(e, id, w, N);
  T_OK(pstar_param_set_lr_scale(e, id, lr_scale));
  T_OK(pstar_param_set_weight_decay(e, id, decay));
  for (int s = 0; s < steps; ++s) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (int m = 0; m < micro; ++m) {
      /* Dyadic values: each micro-batch's share and their sum are exact. */
      for (int i = 0; i < N; ++i) g[i] = (float)(((i + 3 * s) % 9) - 4) / (8.0f * (float)micro);
      micro_batch(e, id, g);
    }
    pstar_step_result r;
    T_OK(pstar_step_result_init(&r));
    T_OK(pstar_step(e, &r));
    cr_assert_eq(r.params_updated, 1u);
  }
  t_read_f32(e, id, out, N);
  T_OK(pstar_engine_destroy(e));
}

Test(accumulation, micro_batches_sum_to_the_same_update_bit_for_bit) {
  const pstar_dtype dtypes[3] = {PSTAR_DTYPE_BF16, PSTAR_DTYPE_F16, PSTAR_DTYPE_F32};
  for (int d = 0; d < 3; ++d) {
    float one[N], four[N];
    run(dtypes[d], 1, 1, 4, 1.0f, 1, one);
    run(dtypes[d], 1, 4, 4, 1.0f, 1, four);
    cr_assert_eq(memcmp(one, four, sizeof one), 0, "dtype %d: 4 micro-batches differ from 1", d);
  }
}

Test(accumulation, f32_one_micro_batch_equals_the_14_byte_mode) {
  /* With F32 compute the slot holds the gradient exactly, so both modes see
   * the same gradient and must give the same bits. */
  float acc[N], plain[N];
  run(PSTAR_DTYPE_F32, 1, 1, 3, 1.0f, 1, acc);
  run(PSTAR_DTYPE_F32, 0, 1, 3, 1.0f, 1, plain);
  cr_assert_eq(memcmp(acc, plain, sizeof acc), 0);
}

Test(accumulation, weights_stay_readable_between_micro_batches_and_stats_count_the_list) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  o.grad_accumulation = 1;
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float w[N], g[N];
  for (int i = 0; i < N; ++i) {
    w[i] = 1.0f + (float)i / 1024.0f;
    g[i] = 1.0f;
  }
  t_write_f32(e, id, w, N);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  micro_batch(e, id, g);
  /* The second forward pass sees weights, not the first pass's gradient. */
  const uint16_t *p = (const uint16_t *)t_acquire(e, id, PSTAR_STAGE_FORWARD);
  for (int i = 0; i < N; ++i) cr_assert_eq(p[i], t_f32_to_bf16(w[i]), "element %d", i);
  T_OK(pstar_param_release(e, id, NULL));
  t_acquire(e, id, PSTAR_STAGE_BACKWARD);
  /* A step while a micro-batch's backward holds the parameter is refused. */
  T_FAIL(pstar_step(e, NULL), PSTAR_ERR_INVALID_STATE, "acquired");
  T_OK(pstar_grad_write(e, id, g, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, id, NULL));
  T_OK(pstar_step(e, NULL));
  /* Host memory holds four fp32 lists (master, m, v, gradient) + the slot. */
  const pstar_stats s = t_stats(e);
  cr_assert_geq(s.host_bytes, 4 * s.optimizer_list_bytes + s.compute_list_bytes);
  T_OK(pstar_engine_destroy(e));
}

Test(accumulation, overflow_discards_the_accumulated_gradient) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  o.grad_accumulation = 1;
  o.weight_decay = 0.0f;
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float w[N], g[N], after[N];
  for (int i = 0; i < N; ++i) {
    w[i] = 0.5f;
    g[i] = 0.25f;
  }
  t_write_f32(e, id, w, N);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  micro_batch(e, id, g);
  g[5] = INFINITY;
  micro_batch(e, id, g);
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(e, &r));
  cr_assert_eq(r.skipped, 1);
  t_read_f32(e, id, after, N);
  cr_assert_eq(memcmp(after, w, sizeof w), 0);
  /* The next step starts from a zero gradient: a zero gradient with no decay
   * leaves the weights unchanged. */
  for (int i = 0; i < N; ++i) g[i] = 0.0f;
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  micro_batch(e, id, g);
  T_OK(pstar_step(e, &r));
  cr_assert_eq(r.skipped, 0);
  t_read_f32(e, id, after, N);
  cr_assert_eq(memcmp(after, w, sizeof w), 0);
  T_OK(pstar_engine_destroy(e));
}

Test(groups, lr_scale_zero_without_decay_freezes_and_two_doubles_the_lr) {
  float frozen[N], w0[N];
  run(PSTAR_DTYPE_F32, 0, 1, 3, 0.0f, 0, frozen);
  for (int i = 0; i < N; ++i) w0[i] = (float)(i % 37) / 64.0f - 0.25f;
  cr_assert_eq(memcmp(frozen, w0, sizeof w0), 0);

  /* lr_scale 2 on lr 1e-3 against an engine with lr 2e-3 and scale 1. */
  float scaled[N], doubled[N];
  run(PSTAR_DTYPE_F32, 0, 1, 3, 2.0f, 1, scaled);
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 2e-3f;
  o.weight_decay = 0.1f;
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  t_write_f32(e, id, w0, N);
  float g[N];
  for (int s = 0; s < 3; ++s) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (int i = 0; i < N; ++i) g[i] = (float)(((i + 3 * s) % 9) - 4) / 8.0f;
    micro_batch(e, id, g);
    T_OK(pstar_step(e, NULL));
  }
  t_read_f32(e, id, doubled, N);
  T_OK(pstar_engine_destroy(e));
  cr_assert_eq(memcmp(scaled, doubled, sizeof scaled), 0);
}

Test(groups, weight_decay_switch_changes_the_update) {
  float with[N], without[N];
  run(PSTAR_DTYPE_F32, 0, 1, 2, 1.0f, 1, with);
  run(PSTAR_DTYPE_F32, 0, 1, 2, 1.0f, 0, without);
  cr_assert_neq(memcmp(with, without, sizeof with), 0);
}

Test(groups, setters_validate) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", 8, 0);
  T_FAIL(pstar_param_set_lr_scale(e, id, -1.0f), PSTAR_ERR_INVALID_ARGUMENT, "lr_scale");
  T_FAIL(pstar_param_set_lr_scale(e, id, NAN), PSTAR_ERR_INVALID_ARGUMENT, "lr_scale");
  T_FAIL(pstar_param_set_lr_scale(e, id + 1, 1.0f), PSTAR_ERR_NOT_FOUND, "id");
  T_FAIL(pstar_param_set_weight_decay(NULL, id, 1), PSTAR_ERR_INVALID_HANDLE, "NULL");
  T_OK(pstar_engine_build(e));
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  T_FAIL(pstar_param_set_lr_scale(e, id, 2.0f), PSTAR_ERR_INVALID_STATE, "TRAIN");
  T_FAIL(pstar_param_set_weight_decay(e, id, 0), PSTAR_ERR_INVALID_STATE, "TRAIN");
  T_OK(pstar_engine_destroy(e));
}

/* The optimizer's thread count splits chunks differently but must not change
 * a single bit (element-wise update; the norm does not depend on threads). */
static void train_threads(unsigned threads, float *out, size_t n, double *norm) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 65536);
  o.threads = threads;
  o.clip_norm = 1.0f;
  pstar_engine *e = t_create(&o);
  const uint32_t a = t_register(e, "a", (int64_t)n, 0);
  const uint32_t b = t_register(e, "b", 777, PSTAR_PARAM_NO_WEIGHT_DECAY);
  T_OK(pstar_engine_build(e));
  float *w = t_alloc_f(n), *g = t_alloc_f(n);
  t_fill(w, n, 1, 0.5f);
  t_write_f32(e, a, w, n);
  t_write_f32(e, b, w, 777);
  for (int s = 0; s < 3; ++s) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    t_acquire(e, a, PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, a, NULL));
    t_acquire(e, b, PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, b, NULL));
    t_fill(g, n, 10 + (uint32_t)s, 0.01f);
    t_acquire(e, b, PSTAR_STAGE_BACKWARD);
    T_OK(pstar_grad_write(e, b, g, 777, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    T_OK(pstar_param_release(e, b, NULL));
    t_acquire(e, a, PSTAR_STAGE_BACKWARD);
    T_OK(pstar_grad_write(e, a, g, n, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    T_OK(pstar_param_release(e, a, NULL));
    pstar_step_result r;
    T_OK(pstar_step_result_init(&r));
    T_OK(pstar_step(e, &r));
    *norm = r.grad_norm;
  }
  t_read_f32(e, a, out, n);
  T_OK(pstar_engine_destroy(e));
  free(w);
  free(g);
}

Test(threads, results_and_norm_are_independent_of_the_thread_count) {
  const size_t n = 60000; /* ragged: not a multiple of the 1024-element grain */
  float *r1 = t_alloc_f(n), *r2 = t_alloc_f(n), *r4 = t_alloc_f(n);
  double n1, n2, n4;
  train_threads(1, r1, n, &n1);
  train_threads(2, r2, n, &n2);
  train_threads(4, r4, n, &n4);
  cr_assert_eq(memcmp(r1, r2, n * sizeof(float)), 0);
  cr_assert_eq(memcmp(r1, r4, n * sizeof(float)), 0);
  cr_assert_eq(n1, n2);
  cr_assert_eq(n1, n4);
  free(r1);
  free(r2);
  free(r4);
}
