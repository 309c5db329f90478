/* Gradients from the wrong memory (issue 18, group 4): the emulated device
 * in strict mode knows its own allocations, so it refuses a gradient said
 * to be device memory that is not inside one of them, and one said to be
 * host memory that overlaps one; nothing is accumulated by a refused
 * write.  Outside strict mode nothing is checked (pstar.h,
 * pstar_grad_write). */
#include "capi_test_util.h"

enum { NUMEL = 64 };

static pstar_engine *engine(int strict) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.strict = strict;
  o.strict_seed = 17;
  pstar_engine *e = t_create(&o);
  t_register(e, "a", NUMEL, 0);
  t_register(e, "b", NUMEL, 0);
  T_OK(pstar_engine_build(e));
  float v[NUMEL];
  t_fill(v, NUMEL, 1, 0.5f);
  t_write_f32(e, 0, v, NUMEL);
  t_fill(v, NUMEL, 2, 0.5f);
  t_write_f32(e, 1, v, NUMEL);
  return e;
}

static void forward(pstar_engine *e) {
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  for (uint32_t p = 0; p < 2; ++p) {
    t_acquire(e, p, PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, p, NULL));
  }
}

Test(memspace, strict_mode_refuses_gradients_from_the_wrong_memory) {
  pstar_engine *e = engine(1);
  float ga[NUMEL], gb_host[NUMEL];
  t_fill(ga, NUMEL, 3, 0.25f);
  forward(e);
  /* b: every wrong kind of buffer first, then its own weights (device
   * memory the device handed out) as its gradient. */
  float *wb = t_acquire(e, 1, PSTAR_STAGE_BACKWARD);
  memcpy(gb_host, wb, sizeof gb_host);
  float *malloced = t_alloc_f(NUMEL);
  memcpy(malloced, gb_host, sizeof gb_host);
  T_FAIL(pstar_grad_write(e, 1, malloced, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_DEVICE, NULL), PSTAR_ERR_INVALID_ARGUMENT,
         "PSTAR_MEM_DEVICE");
  T_FAIL(pstar_grad_write(e, 1, gb_host, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_DEVICE, NULL), PSTAR_ERR_INVALID_ARGUMENT,
         "not inside");
  T_FAIL(pstar_grad_write(e, 1, wb, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_ARGUMENT,
         "PSTAR_MEM_HOST");
  float *slot = NULL;
  T_OK(pstar_grad_slot_acquire(e, 1, NULL, &slot));
  /* Starts inside the accumulator and runs 4 bytes past its end. */
  T_FAIL(pstar_grad_write(e, 1, slot + 1, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_DEVICE, NULL),
         PSTAR_ERR_INVALID_ARGUMENT, "run past the end");
  T_FAIL(pstar_grad_write(e, 1, slot + 1, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_ARGUMENT,
         "PSTAR_MEM_HOST");
  T_OK(pstar_grad_write(e, 1, wb, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_DEVICE, NULL));
  T_OK(pstar_param_release(e, 1, NULL));
  t_acquire(e, 0, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(e, 0, ga, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, 0, NULL));
  T_OK(pstar_step(e, NULL));

  /* The same step with host gradients: the refused writes added nothing. */
  pstar_engine *ref = engine(0);
  forward(ref);
  t_acquire(ref, 1, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(ref, 1, gb_host, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(ref, 1, NULL));
  t_acquire(ref, 0, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(ref, 0, ga, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(ref, 0, NULL));
  T_OK(pstar_step(ref, NULL));
  for (uint32_t p = 0; p < 2; ++p) {
    float got[NUMEL], want[NUMEL];
    t_read_f32(e, p, got, NUMEL);
    t_read_f32(ref, p, want, NUMEL);
    cr_assert_eq(memcmp(got, want, sizeof got), 0, "parameter %u differs from the host-gradient run", p);
  }
  free(malloced);
  T_OK(pstar_engine_destroy(ref));
  T_OK(pstar_engine_destroy(e));
}

Test(memspace, outside_strict_mode_the_emulated_device_does_not_check) {
  pstar_engine *e = engine(0);
  float g[NUMEL];
  t_fill(g, NUMEL, 4, 0.25f);
  forward(e);
  float *w = t_acquire(e, 1, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(e, 1, g, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_DEVICE, NULL));
  T_OK(pstar_grad_write(e, 1, w, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, 1, NULL));
  T_OK(pstar_iteration_abort(e));
  T_OK(pstar_engine_destroy(e));
}
