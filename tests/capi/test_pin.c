/* pstar_param_pin / pstar_param_unpin: the fp32 master in place, and what
 * a pin refuses (a step that would update it, hybrid placement). */
#include <string.h>

#include "capi_test_util.h"

enum { N = 512 };

static void train_step(pstar_engine *e, const uint32_t *ids, int n, float g) {
  float grad[N];
  for (int i = 0; i < N; ++i) grad[i] = g * (float)((i % 5) - 2);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  for (int i = 0; i < n; ++i) {
    (void)t_acquire(e, ids[i], PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, ids[i], NULL));
  }
  for (int i = n - 1; i >= 0; --i) {
    (void)t_acquire(e, ids[i], PSTAR_STAGE_BACKWARD);
    T_OK(pstar_grad_write(e, ids[i], grad, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    T_OK(pstar_param_release(e, ids[i], NULL));
  }
}

Test(pin, the_master_in_place_and_a_step_refused_while_pinned) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  uint32_t ids[2];
  ids[0] = t_register(e, "a", N, 0);
  ids[1] = t_register(e, "b", N, 0);
  T_OK(pstar_engine_build(e));
  float init[N];
  t_fill(init, N, 3, 0.5f);
  t_write_f32(e, ids[0], init, N);
  t_write_f32(e, ids[1], init, N);

  void *ptr = NULL;
  pstar_dtype dt = PSTAR_DTYPE_BF16;
  T_OK(pstar_param_pin(e, ids[0], 0, &ptr, &dt));
  cr_assert_eq(dt, PSTAR_DTYPE_F32);
  cr_assert_eq(memcmp(ptr, init, sizeof init), 0, "the pinned master holds the written values");

  /* A step that would update the pinned master: BUSY, nothing changed. */
  train_step(e, ids, 2, 0.25f);
  T_FAIL(pstar_step(e, NULL), PSTAR_ERR_BUSY, "pinned");
  cr_assert_eq(memcmp(ptr, init, sizeof init), 0, "a refused step changed the master");
  cr_assert_eq(t_stats(e).steps, 0u);
  T_OK(pstar_param_unpin(e, ids[0]));
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(e, &r));
  cr_assert_eq(r.params_updated, 2u);

  /* Pinned again: the same memory, the updated values, equal to a read. */
  void *again = NULL;
  T_OK(pstar_param_pin(e, ids[0], 0, &again, &dt));
  cr_assert_eq(again, ptr);
  float back[N];
  t_read_f32(e, ids[0], back, N);
  cr_assert_eq(memcmp(again, back, sizeof back), 0);
  cr_assert_neq(memcmp(again, init, sizeof init), 0, "the step did not update the master");

  /* A step that does not touch the pinned parameter goes through. */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  (void)t_acquire(e, ids[1], PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, ids[1], NULL));
  {
    float grad[N];
    for (int i = 0; i < N; ++i) grad[i] = 0.125f;
    (void)t_acquire(e, ids[1], PSTAR_STAGE_BACKWARD);
    T_OK(pstar_grad_write(e, ids[1], grad, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    T_OK(pstar_param_release(e, ids[1], NULL));
  }
  T_OK(pstar_step(e, NULL));

  /* Pins nest. */
  T_OK(pstar_param_pin(e, ids[0], 0, &again, &dt));
  T_OK(pstar_param_unpin(e, ids[0]));
  T_OK(pstar_param_unpin(e, ids[0]));
  T_FAIL(pstar_param_unpin(e, ids[0]), PSTAR_ERR_INVALID_STATE, "not pinned");
  T_OK(pstar_engine_destroy(e));
}

Test(pin, bad_calls_are_refused_with_a_reason) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  uint32_t w = t_register(e, "w", N, 0);
  uint32_t f = t_register(e, "frozen", N, PSTAR_PARAM_FROZEN);
  void *ptr = NULL;
  pstar_dtype dt;
  T_FAIL(pstar_param_pin(e, w, 0, &ptr, &dt), PSTAR_ERR_INVALID_STATE, "build");
  T_OK(pstar_engine_build(e));
  T_FAIL(pstar_param_pin(e, f, 0, &ptr, &dt), PSTAR_ERR_UNSUPPORTED, "frozen");
  T_FAIL(pstar_param_pin(e, 99, 0, &ptr, &dt), PSTAR_ERR_NOT_FOUND, "99");
  T_FAIL(pstar_param_pin(e, w, 0, NULL, &dt), PSTAR_ERR_INVALID_ARGUMENT, "out_ptr");
  T_FAIL(pstar_param_pin(e, w, 0, &ptr, NULL), PSTAR_ERR_INVALID_ARGUMENT, "out_dtype");
  T_FAIL(pstar_param_unpin(e, w), PSTAR_ERR_INVALID_STATE, "not pinned");
  T_OK(pstar_engine_destroy(e));
  T_FAIL(pstar_param_pin(e, w, 0, &ptr, &dt), PSTAR_ERR_INVALID_HANDLE, "");
}

Test(pin, hybrid_placement_leaves_a_pinned_master_on_the_host) {
  for (int pinned = 0; pinned <= 1; ++pinned) {
    pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
    o.hybrid_optimizer = 1;
    pstar_engine *e = t_create(&o);  /* unlimited: every state fits */
    uint32_t ids[2];
    ids[0] = t_register(e, "a", N, 0);
    ids[1] = t_register(e, "b", 1024, 0);
    T_OK(pstar_engine_build(e));
    void *ptr = NULL;
    pstar_dtype dt;
    if (pinned) T_OK(pstar_param_pin(e, ids[0], 0, &ptr, &dt));
    /* The warm-up iteration (b only) ends with the placement. */
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    (void)t_acquire(e, ids[1], PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, ids[1], NULL));
    T_OK(pstar_step(e, NULL));
    const pstar_stats s = t_stats(e);
    cr_assert_eq(s.optimizer_chunks_on_device, pinned ? 1u : 2u, "pinned %d: %u chunks placed", pinned,
                 s.optimizer_chunks_on_device);
    if (!pinned) {
      /* Placed state cannot be pinned. */
      T_FAIL(pstar_param_pin(e, ids[0], 0, &ptr, &dt), PSTAR_ERR_UNSUPPORTED, "accelerator");
    } else {
      T_OK(pstar_param_unpin(e, ids[0]));
    }
    T_OK(pstar_engine_destroy(e));
  }
}

Test(pin, a_writable_pin_lands_in_the_compute_copy_at_unpin) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float init[N];
  t_fill(init, N, 5, 0.5f);
  t_write_f32(e, w, init, N);
  void *ptr = NULL;
  pstar_dtype dt;
  T_OK(pstar_param_pin(e, w, 1, &ptr, &dt));
  float *m = (float *)ptr;
  for (int i = 0; i < N; ++i) m[i] = (float)i / 64.0f - 3.0f;
  /* No iteration while a writable pin is held. */
  T_FAIL(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL), PSTAR_ERR_INVALID_STATE, "writable");
  T_OK(pstar_param_unpin(e, w));
  /* The master holds the writes; the compute copy holds them rounded. */
  float back[N];
  t_read_f32(e, w, back, N);
  for (int i = 0; i < N; ++i) cr_assert_eq(back[i], (float)i / 64.0f - 3.0f);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  const uint16_t *c = (const uint16_t *)t_acquire(e, w, PSTAR_STAGE_FORWARD);
  for (int i = 0; i < N; ++i) cr_assert_eq(t_bf16_to_f32(c[i]), t_round(PSTAR_DTYPE_BF16, (float)i / 64.0f - 3.0f));
  T_OK(pstar_param_release(e, w, NULL));
  /* Inside an iteration a writable pin is refused, a read-only one is not. */
  T_FAIL(pstar_param_pin(e, w, 1, &ptr, &dt), PSTAR_ERR_INVALID_STATE, "outside iterations");
  T_OK(pstar_param_pin(e, w, 0, &ptr, &dt));
  T_OK(pstar_param_unpin(e, w));
  T_OK(pstar_iteration_end(e));
  T_OK(pstar_engine_destroy(e));
}
