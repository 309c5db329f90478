/*
 * The parameter state machine through the C API: every legal and illegal
 * transition of acquire/release/step/iteration calls.
 *
 * Each test drives a small model through a fixed, legal training script and
 * injects illegal calls at chosen points.  Every illegal call must fail with
 * the exact status and a message, and must change nothing: the script then
 * completes, and the final parameters and step results are bit-identical to
 * those of a second engine that ran the script without the illegal calls.
 */
#include "capi_test_util.h"

enum { NA = 200, NB = 300, NF = 100 };

typedef struct model {
  pstar_engine *e;
  uint32_t a; /* trainable, used twice per forward (tied) */
  uint32_t b; /* trainable, used once */
  uint32_t f; /* frozen, used once */
  pstar_step_result last;
} model;

static model make_model(void) {
  model m;
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 0.01f;
  o.weight_decay = 0.05f;
  m.e = t_create(&o);
  m.a = t_register(m.e, "a", NA, 0);
  m.b = t_register(m.e, "b", NB, PSTAR_PARAM_NO_WEIGHT_DECAY);
  m.f = t_register(m.e, "f", NF, PSTAR_PARAM_FROZEN);
  T_OK(pstar_engine_build(m.e));
  float va[NA], vb[NB], vf[NF];
  t_fill(va, NA, 11, 1.0f);
  t_fill(vb, NB, 12, 1.0f);
  t_fill(vf, NF, 13, 1.0f);
  t_write_f32(m.e, m.a, va, NA);
  t_write_f32(m.e, m.b, vb, NB);
  t_write_f32(m.e, m.f, vf, NF);
  T_OK(pstar_step_result_init(&m.last));
  return m;
}

static void fwd(model *m, uint32_t id) {
  t_acquire(m->e, id, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(m->e, id, NULL));
}

static void bwd(model *m, uint32_t id, uint64_t n, uint32_t seed) {
  t_acquire(m->e, id, PSTAR_STAGE_BACKWARD);
  if (id != m->f) {
    float g[NB];
    t_fill(g, n, seed, 0.5f);
    T_OK(pstar_grad_write(m->e, id, g, n, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  }
  T_OK(pstar_param_release(m->e, id, NULL));
}

/* The script of iteration `it`, steps [from, to):
 *  0 begin(TRAIN)  1 F a  2 F b  3 F f  4 F a
 *  5 B a  6 B f  7 B b  8 B a  9 step */
static void run_steps(model *m, int it, int from, int to) {
  for (int k = from; k < to; ++k) {
    switch (k) {
      case 0: T_OK(pstar_iteration_begin(m->e, PSTAR_ITERATION_TRAIN)); break;
      case 1: fwd(m, m->a); break;
      case 2: fwd(m, m->b); break;
      case 3: fwd(m, m->f); break;
      case 4: fwd(m, m->a); break;
      case 5: bwd(m, m->a, NA, (uint32_t)(100 * it + 1)); break;
      case 6: bwd(m, m->f, NF, 0); break;
      case 7: bwd(m, m->b, NB, (uint32_t)(100 * it + 2)); break;
      case 8: bwd(m, m->a, NA, (uint32_t)(100 * it + 3)); break;
      case 9:
        T_OK(pstar_step_result_init(&m->last));
        T_OK(pstar_step(m->e, &m->last));
        cr_assert_eq(m->last.skipped, 0);
        cr_assert_eq(m->last.params_updated, 2);
        break;
      default: cr_assert_fail("bad script step %d", k);
    }
  }
}

/* Runs `iterations` clean iterations on a fresh engine and compares with m. */
static void assert_matches_clean_run(model *m, int iterations) {
  model ref = make_model();
  for (int it = 0; it < iterations; ++it) run_steps(&ref, it, 0, 10);
  const uint32_t ids[3] = {m->a, m->b, m->f};
  const uint64_t ns[3] = {NA, NB, NF};
  for (int i = 0; i < 3; ++i) {
    float x[NB], y[NB];
    t_read_f32(m->e, ids[i], x, ns[i]);
    t_read_f32(ref.e, ids[i], y, ns[i]);
    cr_assert_eq(memcmp(x, y, ns[i] * sizeof(float)), 0, "parameter %u differs from the clean run", ids[i]);
  }
  cr_assert_eq(m->last.step, ref.last.step);
  cr_assert_eq(m->last.params_updated, ref.last.params_updated);
  cr_assert_eq(m->last.grad_norm, ref.last.grad_norm, "grad norm %.17g vs %.17g", m->last.grad_norm,
               ref.last.grad_norm);
  const pstar_stats s = t_stats(m->e), r = t_stats(ref.e);
  cr_assert_eq(s.steps, r.steps);
  cr_assert_eq(s.skipped_steps, 0);
  cr_assert_eq(t_hparam(m->e, PSTAR_HPARAM_STEP), (double)iterations);
  T_OK(pstar_engine_destroy(ref.e));
}

static void finish(model *m, int iterations) {
  assert_matches_clean_run(m, iterations);
  T_OK(pstar_engine_destroy(m->e));
}

/* The clean script itself is legal and trains. */
Test(state, clean_script_trains) {
  model m = make_model();
  float before[NA], after[NA];
  t_read_f32(m.e, m.a, before, NA);
  run_steps(&m, 0, 0, 10);
  cr_assert_eq(m.last.step, 1);
  t_read_f32(m.e, m.a, after, NA);
  cr_assert_neq(memcmp(before, after, sizeof before), 0, "the step did not change the weights");
  finish(&m, 1);
}

Test(state, acquire_and_release_outside_an_iteration) {
  model m = make_model();
  void *p = (void *)(uintptr_t)0x9;
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "iteration");
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_BACKWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "iteration");
  T_FAIL(pstar_param_acquire(m.e, m.f, PSTAR_STAGE_RECOMPUTE, NULL, &p), PSTAR_ERR_INVALID_STATE, "iteration");
  cr_assert_eq((uintptr_t)p, (uintptr_t)0x9, "out_ptr written on failure");
  T_FAIL(pstar_param_release(m.e, m.a, NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  T_FAIL(pstar_step(m.e, NULL), PSTAR_ERR_INVALID_STATE, "TRAIN");
  T_FAIL(pstar_iteration_end(m.e), PSTAR_ERR_INVALID_STATE, "iteration");
  run_steps(&m, 0, 0, 10);
  /* And again once the iteration is over. */
  T_FAIL(pstar_param_acquire(m.e, m.b, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "iteration");
  T_FAIL(pstar_param_release(m.e, m.b, NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  T_FAIL(pstar_step(m.e, NULL), PSTAR_ERR_INVALID_STATE, "TRAIN");
  run_steps(&m, 1, 0, 10);
  finish(&m, 2);
}

Test(state, release_without_acquire) {
  model m = make_model();
  run_steps(&m, 0, 0, 1);
  T_FAIL(pstar_param_release(m.e, m.a, NULL), PSTAR_ERR_INVALID_STATE, "'a'");
  T_FAIL(pstar_param_release(m.e, m.f, NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  run_steps(&m, 0, 1, 3);
  /* a and b are released (HOLD_AFTER_FWD): a second release is illegal. */
  T_FAIL(pstar_param_release(m.e, m.a, NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  T_FAIL(pstar_param_release(m.e, m.b, NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  run_steps(&m, 0, 3, 6);
  T_FAIL(pstar_param_release(m.e, m.a, NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  run_steps(&m, 0, 6, 9);
  /* All backward uses done (HOLD_AFTER_BWD). */
  T_FAIL(pstar_param_release(m.e, m.a, NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  T_FAIL(pstar_param_release(m.e, m.b, NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  run_steps(&m, 0, 9, 10);
  finish(&m, 1);
}

Test(state, double_acquire_without_release) {
  model m = make_model();
  void *p = NULL, *q = (void *)(uintptr_t)0x9;
  run_steps(&m, 0, 0, 1);
  /* Replaces script step 1 (F a). */
  T_OK(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_FORWARD, NULL, &p));
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_FORWARD, NULL, &q), PSTAR_ERR_INVALID_STATE, "COMPUTE");
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_RECOMPUTE, NULL, &q), PSTAR_ERR_INVALID_STATE, "COMPUTE");
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_BACKWARD, NULL, &q), PSTAR_ERR_INVALID_STATE, "COMPUTE");
  cr_assert_eq((uintptr_t)q, (uintptr_t)0x9);
  T_OK(pstar_param_release(m.e, m.a, NULL));
  T_FAIL(pstar_param_release(m.e, m.a, NULL), PSTAR_ERR_INVALID_STATE, "not acquired");
  run_steps(&m, 0, 2, 5);
  /* Replaces script step 5 (B a) with a double acquire inside. */
  t_acquire(m.e, m.a, PSTAR_STAGE_BACKWARD);
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_BACKWARD, NULL, &q), PSTAR_ERR_INVALID_STATE, "COMPUTE");
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_FORWARD, NULL, &q), PSTAR_ERR_INVALID_STATE, "a");
  float g[NA];
  t_fill(g, NA, 1, 0.5f);
  T_OK(pstar_grad_write(m.e, m.a, g, NA, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(m.e, m.a, NULL));
  /* If the failed acquires had counted as uses, the step below would fail. */
  run_steps(&m, 0, 6, 10);
  finish(&m, 1);
}

Test(state, backward_acquire_without_forward_use) {
  model m = make_model();
  void *p = (void *)(uintptr_t)0x9;
  float *slot = (float *)(uintptr_t)0x9;
  float g[NA] = {0};
  run_steps(&m, 0, 0, 1);
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_BACKWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "backward");
  T_FAIL(pstar_param_acquire(m.e, m.b, PSTAR_STAGE_BACKWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "'b'");
  T_FAIL(pstar_param_acquire(m.e, m.f, PSTAR_STAGE_BACKWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "'f'");
  T_FAIL(pstar_grad_write(m.e, m.a, g, NA, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE,
         "BACKWARD");
  T_FAIL(pstar_grad_slot_acquire(m.e, m.a, NULL, &slot), PSTAR_ERR_INVALID_STATE, "BACKWARD");
  cr_assert_eq((uintptr_t)p, (uintptr_t)0x9);
  cr_assert_eq((uintptr_t)slot, (uintptr_t)0x9);
  /* A step now has no gradients: the failed backward acquires left none. */
  run_steps(&m, 0, 1, 10);
  finish(&m, 1);
}

Test(state, more_backward_uses_than_forward_uses) {
  model m = make_model();
  void *p = NULL;
  run_steps(&m, 0, 0, 9);
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_BACKWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "2 forward");
  T_FAIL(pstar_param_acquire(m.e, m.b, PSTAR_STAGE_BACKWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "1 forward");
  T_FAIL(pstar_param_acquire(m.e, m.f, PSTAR_STAGE_BACKWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "'f'");
  run_steps(&m, 0, 9, 10);
  finish(&m, 1);
}

Test(state, forward_acquire_after_backward_began) {
  model m = make_model();
  void *p = NULL;
  run_steps(&m, 0, 0, 6); /* a: 2 forward uses, 1 backward use */
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_INVALID_STATE,
         "after its backward began");
  run_steps(&m, 0, 6, 9);
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "backward");
  T_FAIL(pstar_param_acquire(m.e, m.b, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "backward");
  T_FAIL(pstar_param_acquire(m.e, m.f, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "backward");
  run_steps(&m, 0, 9, 10);
  finish(&m, 1);
}

Test(state, recompute_is_legal_after_forward_and_does_not_count) {
  model m = make_model();
  void *p = NULL;
  run_steps(&m, 0, 0, 1);
  /* Before any forward use, nothing to recompute. */
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_RECOMPUTE, NULL, &p), PSTAR_ERR_INVALID_STATE, "HOLD");
  run_steps(&m, 0, 1, 5);
  /* Activation checkpointing: forward re-run inside backward, several times. */
  for (int r = 0; r < 3; ++r) {
    t_acquire(m.e, m.a, PSTAR_STAGE_RECOMPUTE);
    float g[NA] = {0};
    T_FAIL(pstar_grad_write(m.e, m.a, g, NA, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE,
           "BACKWARD");
    T_OK(pstar_param_release(m.e, m.a, NULL));
    t_acquire(m.e, m.b, PSTAR_STAGE_RECOMPUTE);
    T_OK(pstar_param_release(m.e, m.b, NULL));
    t_acquire(m.e, m.f, PSTAR_STAGE_RECOMPUTE);
    T_OK(pstar_param_release(m.e, m.f, NULL));
  }
  run_steps(&m, 0, 5, 6);
  /* Between a tied parameter's backward uses, recompute is still legal. */
  t_acquire(m.e, m.a, PSTAR_STAGE_RECOMPUTE);
  T_OK(pstar_param_release(m.e, m.a, NULL));
  run_steps(&m, 0, 6, 9);
  /* After the last backward use the slot holds the gradient: illegal. */
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_RECOMPUTE, NULL, &p), PSTAR_ERR_INVALID_STATE,
         "HOLD_AFTER_BWD");
  T_FAIL(pstar_param_acquire(m.e, m.b, PSTAR_STAGE_RECOMPUTE, NULL, &p), PSTAR_ERR_INVALID_STATE,
         "HOLD_AFTER_BWD");
  /* Had the recomputes counted as forward uses, this step would be refused. */
  run_steps(&m, 0, 9, 10);
  finish(&m, 1);
}

Test(state, eval_iteration_has_forward_uses_only) {
  model m = make_model();
  void *p = (void *)(uintptr_t)0x9;
  T_OK(pstar_iteration_begin(m.e, PSTAR_ITERATION_EVAL));
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_BACKWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "EVAL");
  T_FAIL(pstar_param_acquire(m.e, m.a, PSTAR_STAGE_RECOMPUTE, NULL, &p), PSTAR_ERR_INVALID_STATE, "EVAL");
  cr_assert_eq((uintptr_t)p, (uintptr_t)0x9);
  /* Several forward uses are fine, one at a time. */
  for (int r = 0; r < 2; ++r) {
    t_acquire(m.e, m.a, PSTAR_STAGE_FORWARD);
    float g[NA] = {0};
    float *slot = NULL;
    T_FAIL(pstar_grad_write(m.e, m.a, g, NA, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE,
           "TRAIN");
    T_FAIL(pstar_grad_slot_acquire(m.e, m.a, NULL, &slot), PSTAR_ERR_INVALID_STATE, "TRAIN");
    T_FAIL(pstar_iteration_end(m.e), PSTAR_ERR_INVALID_STATE, "still acquired");
    T_OK(pstar_param_release(m.e, m.a, NULL));
  }
  fwd(&m, m.f);
  T_FAIL(pstar_step(m.e, NULL), PSTAR_ERR_INVALID_STATE, "TRAIN");
  T_OK(pstar_iteration_end(m.e));
  T_FAIL(pstar_iteration_end(m.e), PSTAR_ERR_INVALID_STATE, "no iteration");
  /* The EVAL uses did not count: the TRAIN script works as usual. */
  run_steps(&m, 0, 0, 10);
  T_OK(pstar_iteration_begin(m.e, PSTAR_ITERATION_EVAL));
  fwd(&m, m.a);
  T_OK(pstar_iteration_end(m.e));
  run_steps(&m, 1, 0, 10);
  finish(&m, 2);
}

Test(state, iteration_end_on_a_train_iteration) {
  model m = make_model();
  run_steps(&m, 0, 0, 1);
  T_FAIL(pstar_iteration_end(m.e), PSTAR_ERR_INVALID_STATE, "pstar_step");
  run_steps(&m, 0, 1, 6);
  T_FAIL(pstar_iteration_end(m.e), PSTAR_ERR_INVALID_STATE, "pstar_step");
  run_steps(&m, 0, 6, 9);
  T_FAIL(pstar_iteration_end(m.e), PSTAR_ERR_INVALID_STATE, "pstar_step");
  run_steps(&m, 0, 9, 10);
  finish(&m, 1);
}

Test(state, step_while_a_parameter_is_acquired) {
  model m = make_model();
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  run_steps(&m, 0, 0, 2);
  /* Replaces script step 2 (F b). */
  t_acquire(m.e, m.b, PSTAR_STAGE_FORWARD);
  T_FAIL(pstar_step(m.e, &r), PSTAR_ERR_INVALID_STATE, "still acquired");
  cr_assert_eq(r.step, 0, "result written on failure");
  T_OK(pstar_param_release(m.e, m.b, NULL));
  run_steps(&m, 0, 3, 8);
  /* Replaces script step 8 (the last B a). */
  t_acquire(m.e, m.a, PSTAR_STAGE_BACKWARD);
  float g[NA];
  t_fill(g, NA, 3, 0.5f);
  T_OK(pstar_grad_write(m.e, m.a, g, NA, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_FAIL(pstar_step(m.e, &r), PSTAR_ERR_INVALID_STATE, "'a') is still acquired");
  T_OK(pstar_param_release(m.e, m.a, NULL));
  run_steps(&m, 0, 9, 10);
  finish(&m, 1);
}

Test(state, step_with_partial_backward) {
  model m = make_model();
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  run_steps(&m, 0, 0, 6); /* a: 1 of 2 backward uses */
  T_FAIL(pstar_step(m.e, &r), PSTAR_ERR_INVALID_STATE, "1 backward uses for 2 forward uses");
  cr_assert_eq(t_hparam(m.e, PSTAR_HPARAM_STEP), 0.0, "a refused step advanced the step count");
  run_steps(&m, 0, 6, 8);
  T_FAIL(pstar_step(m.e, &r), PSTAR_ERR_INVALID_STATE, "'a'");
  cr_assert_eq(r.step, 0);
  pstar_stats s = t_stats(m.e);
  cr_assert_eq(s.steps, 0);
  cr_assert_eq(s.skipped_steps, 0);
  run_steps(&m, 0, 8, 10);
  finish(&m, 1);
}

Test(state, iteration_begin_twice) {
  model m = make_model();
  run_steps(&m, 0, 0, 1);
  T_FAIL(pstar_iteration_begin(m.e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_STATE, "in progress");
  T_FAIL(pstar_iteration_begin(m.e, PSTAR_ITERATION_EVAL), PSTAR_ERR_INVALID_STATE, "in progress");
  run_steps(&m, 0, 1, 6);
  T_FAIL(pstar_iteration_begin(m.e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_STATE, "in progress");
  run_steps(&m, 0, 6, 10);
  T_OK(pstar_iteration_begin(m.e, PSTAR_ITERATION_EVAL));
  T_FAIL(pstar_iteration_begin(m.e, PSTAR_ITERATION_EVAL), PSTAR_ERR_INVALID_STATE, "in progress");
  T_FAIL(pstar_iteration_begin(m.e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_STATE, "in progress");
  T_OK(pstar_iteration_end(m.e));
  /* Failed begins are not counted as iterations. */
  pstar_stats s = t_stats(m.e);
  cr_assert_eq(s.iterations, 2);
  finish(&m, 1);
}

Test(state, unknown_kind_and_stage_are_invalid_arguments) {
  model m = make_model();
  void *p = (void *)(uintptr_t)0x9;
  T_FAIL(pstar_iteration_begin(m.e, (pstar_iteration_kind)2), PSTAR_ERR_INVALID_ARGUMENT, "kind");
  T_FAIL(pstar_iteration_begin(m.e, (pstar_iteration_kind)-1), PSTAR_ERR_INVALID_ARGUMENT, "kind");
  run_steps(&m, 0, 0, 1);
  T_FAIL(pstar_param_acquire(m.e, m.a, (pstar_stage)3, NULL, &p), PSTAR_ERR_INVALID_ARGUMENT, "stage");
  T_FAIL(pstar_param_acquire(m.e, m.a, (pstar_stage)-1, NULL, &p), PSTAR_ERR_INVALID_ARGUMENT, "stage");
  cr_assert_eq((uintptr_t)p, (uintptr_t)0x9);
  run_steps(&m, 0, 1, 10);
  finish(&m, 1);
}

Test(state, gradients_only_in_backward) {
  model m = make_model();
  float g[NA];
  float *slot = (float *)(uintptr_t)0x9;
  t_fill(g, NA, 77, 1.0f);
  run_steps(&m, 0, 0, 1);
  /* Replaces script step 1 (F a). */
  t_acquire(m.e, m.a, PSTAR_STAGE_FORWARD);
  T_FAIL(pstar_grad_write(m.e, m.a, g, NA, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE,
         "BACKWARD");
  T_FAIL(pstar_grad_slot_acquire(m.e, m.a, NULL, &slot), PSTAR_ERR_INVALID_STATE, "BACKWARD");
  T_OK(pstar_param_release(m.e, m.a, NULL));
  /* Released after forward: no gradient either. */
  T_FAIL(pstar_grad_write(m.e, m.a, g, NA, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE,
         "BACKWARD");
  run_steps(&m, 0, 2, 6);
  /* Between two backward uses (not acquired): no gradient. */
  T_FAIL(pstar_grad_write(m.e, m.a, g, NA, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE,
         "BACKWARD");
  T_FAIL(pstar_grad_slot_acquire(m.e, m.a, NULL, &slot), PSTAR_ERR_INVALID_STATE, "BACKWARD");
  run_steps(&m, 0, 6, 10);
  /* Outside any iteration. */
  T_FAIL(pstar_grad_write(m.e, m.a, g, NA, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE,
         "BACKWARD");
  cr_assert_eq((uintptr_t)slot, (uintptr_t)0x9);
  finish(&m, 1);
}

Test(state, many_illegal_calls_in_one_iteration_change_nothing) {
  model m = make_model();
  void *p = NULL;
  float g[NB] = {0};
  for (int it = 0; it < 3; ++it) {
    for (int k = 0; k < 10; ++k) {
      /* Before each script step, a volley of calls that are illegal at
       * every point of the script. */
      T_STATUS(pstar_param_release(m.e, m.f, NULL), PSTAR_ERR_INVALID_STATE);
      T_STATUS(pstar_param_acquire(m.e, 99, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_NOT_FOUND);
      T_STATUS(pstar_grad_write(m.e, m.b, g, NB, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE);
      T_STATUS(pstar_iteration_end(m.e), PSTAR_ERR_INVALID_STATE);
      if (k > 0) {
        T_STATUS(pstar_iteration_begin(m.e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_STATE);
      } else {
        T_STATUS(pstar_step(m.e, NULL), PSTAR_ERR_INVALID_STATE);
      }
      /* Partial backward of the tied parameter a. */
      if (k >= 6 && k <= 8) T_STATUS(pstar_step(m.e, NULL), PSTAR_ERR_INVALID_STATE);
      run_steps(&m, it, k, k + 1);
    }
  }
  finish(&m, 3);
}
