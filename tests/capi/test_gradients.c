/* How a gradient is handed over changes no bits.  On the emulated device a
 * parameter's last backward use whose first contribution comes in the
 * compute dtype is finalized at its write (packed, without the fp32 sum:
 * step/backward_gradients.h); any other way sums in fp32 first.  Two
 * engines train the same parameters for a few steps: one is given each
 * gradient in the compute dtype, the other the same values as fp32 (which
 * always takes the fp32 sum).  The weights and the step's gradient norm
 * must be the same bits, with
 *  - a parameter of one use (packed),
 *  - a tied parameter of two uses (the first sums in fp32, the last use's
 *    contribution is not the first: no packing),
 *  - a second write to the same use (packed, then unpacked and added),
 *  - a grad_slot_acquire after a packed write (unpacked, then added to in
 *    place),
 *  - a -0 in the gradient (becomes +0 either way),
 * in bf16, f16 and f32, and in strict mode (every queue item delayed).
 * A third engine is given each use's last gradient with its release
 * (pstar_grad_write_release: straight into the slot where it packs, the
 * two calls elsewhere), in the compute dtype: the same bits again. */
#include "capi_test_util.h"

enum { NUMEL = 1000, PARAMS = 4, STEPS = 3 };

static pstar_engine *engine(pstar_dtype dt, int strict) {
  pstar_engine_options o = t_options(dt, 4096);
  o.strict = strict;
  o.strict_seed = 5;
  pstar_engine *e = t_create(&o);
  for (uint32_t p = 0; p < PARAMS; ++p) {
    char name[8];
    name[0] = (char)('a' + p);
    name[1] = 0;
    t_register(e, name, NUMEL, 0);
  }
  T_OK(pstar_engine_build(e));
  float v[NUMEL];
  for (uint32_t p = 0; p < PARAMS; ++p) {
    t_fill(v, NUMEL, 10 + p, 0.5f);
    t_write_f32(e, p, v, NUMEL);
  }
  return e;
}

/* The gradient of parameter p's use u at iteration it, rounded to the
 * compute dtype (so that both engines are handed the same values). */
static void gradient(float *g, pstar_dtype dt, uint32_t p, int u, int it) {
  t_fill(g, NUMEL, 100u + 17u * p + 5u * (uint32_t)u + 31u * (uint32_t)it, 0.01f);
  for (size_t i = 0; i < NUMEL; ++i) g[i] = t_round(dt, g[i]);
  g[7] = -0.0f;
}

enum { AS_FP32 = 0, NATIVE = 1, NATIVE_WITH_RELEASE = 2 };

/* One write of g: in the compute dtype (`native`) or as fp32; with
 * `release`, by pstar_grad_write_release. */
static void write_g(pstar_engine *e, uint32_t p, const float *g, pstar_dtype dt, int native, int release) {
  uint16_t h[NUMEL];
  const void *src = g;
  pstar_dtype sdt = PSTAR_DTYPE_F32;
  if (native && dt != PSTAR_DTYPE_F32) {
    for (size_t i = 0; i < NUMEL; ++i) t_store(h, dt, i, g[i]);
    src = h;
    sdt = dt;
  }
  if (release)
    T_OK(pstar_grad_write_release(e, p, src, NUMEL, sdt, PSTAR_MEM_HOST, NULL));
  else
    T_OK(pstar_grad_write(e, p, src, NUMEL, sdt, PSTAR_MEM_HOST, NULL));
}

static void write(pstar_engine *e, uint32_t p, const float *g, pstar_dtype dt, int native) {
  write_g(e, p, g, dt, native != AS_FP32, 0);
}

static void train(pstar_engine *e, pstar_dtype dt, int native, double norms[STEPS]) {
  float g[NUMEL];
  for (int it = 0; it < STEPS; ++it) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    /* Forward: b (tied) is used twice. */
    const uint32_t order[] = {0, 1, 2, 3, 1};
    for (int k = 0; k < 5; ++k) {
      t_acquire(e, order[k], PSTAR_STAGE_FORWARD);
      T_OK(pstar_param_release(e, order[k], NULL));
    }
    /* Backward, in reverse. */
    for (int k = 4; k >= 0; --k) {
      const uint32_t p = order[k];
      t_acquire(e, p, PSTAR_STAGE_BACKWARD);
      gradient(g, dt, p, k, it);
      if (native == NATIVE_WITH_RELEASE && p != 2 && p != 3) {
        write_g(e, p, g, dt, 1, 1); /* the tied b's: the two calls */
        continue;
      }
      write(e, p, g, dt, native);
      if (p == 2) {
        /* A second write to the same use. */
        gradient(g, dt, p, 9, it);
        if (native == NATIVE_WITH_RELEASE) {
          write_g(e, p, g, dt, 1, 1);
          continue;
        }
        write(e, p, g, dt, native);
      } else if (p == 3) {
        /* Then the fp32 sum itself, added to in place. */
        float *slot = NULL;
        T_OK(pstar_grad_slot_acquire(e, p, NULL, &slot));
        gradient(g, dt, p, 8, it);
        for (size_t i = 0; i < NUMEL; ++i) slot[i] += g[i];
      }
      T_OK(pstar_param_release(e, p, NULL));
    }
    pstar_step_result r;
    T_OK(pstar_step_result_init(&r));
    T_OK(pstar_step(e, &r));
    cr_assert_eq(r.skipped, 0);
    norms[it] = r.grad_norm;
  }
}

static void check(pstar_dtype dt, int strict) {
  pstar_engine *summed = engine(dt, strict);
  double norms_summed[STEPS];
  train(summed, dt, AS_FP32, norms_summed);
  for (int mode = NATIVE; mode <= NATIVE_WITH_RELEASE; ++mode) {
    pstar_engine *packed = engine(dt, strict);
    double norms_packed[STEPS];
    train(packed, dt, mode, norms_packed);
    for (int it = 0; it < STEPS; ++it) {
      cr_assert(memcmp(&norms_packed[it], &norms_summed[it], sizeof(double)) == 0,
                "dtype %d strict %d mode %d step %d: gradient norm %.17g, summed in fp32 %.17g", dt, strict, mode,
                it, norms_packed[it], norms_summed[it]);
    }
    for (uint32_t p = 0; p < PARAMS; ++p) {
      float a[NUMEL], b[NUMEL];
      t_read_f32(packed, p, a, NUMEL);
      t_read_f32(summed, p, b, NUMEL);
      cr_assert(memcmp(a, b, sizeof a) == 0, "dtype %d strict %d mode %d: parameter %u differs", dt, strict, mode,
                p);
    }
    T_OK(pstar_engine_destroy(packed));
  }
  T_OK(pstar_engine_destroy(summed));
}

/* A refused pstar_grad_write_release adds nothing and releases nothing. */
Test(gradients, write_release_refused_releases_nothing) {
  pstar_engine *e = engine(PSTAR_DTYPE_BF16, 0);
  uint16_t h[NUMEL] = {0};
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  for (uint32_t p = 0; p < PARAMS; ++p) {
    t_acquire(e, p, PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, p, NULL));
  }
  t_acquire(e, 3, PSTAR_STAGE_BACKWARD);
  T_FAIL(pstar_grad_write_release(e, 3, h, NUMEL - 1, PSTAR_DTYPE_BF16, PSTAR_MEM_HOST, NULL),
         PSTAR_ERR_INVALID_ARGUMENT, "grad_write_release: count");
  T_FAIL(pstar_grad_write_release(e, 3, NULL, NUMEL, PSTAR_DTYPE_BF16, PSTAR_MEM_HOST, NULL),
         PSTAR_ERR_INVALID_ARGUMENT, "grad is NULL");
  /* Still acquired: the release is the caller's, and works. */
  T_OK(pstar_param_release(e, 3, NULL));
  /* Not acquired for BACKWARD now: refused. */
  T_FAIL(pstar_grad_write_release(e, 3, h, NUMEL, PSTAR_DTYPE_BF16, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE,
         "not acquired for BACKWARD");
  T_OK(pstar_iteration_abort(e));
  T_OK(pstar_engine_destroy(e));
}

Test(gradients, bf16_in_the_compute_dtype_is_the_fp32_sum) { check(PSTAR_DTYPE_BF16, 0); }
Test(gradients, f16_in_the_compute_dtype_is_the_fp32_sum) { check(PSTAR_DTYPE_F16, 0); }
Test(gradients, f32_is_the_same_either_way) { check(PSTAR_DTYPE_F32, 0); }
Test(gradients, bf16_in_strict_mode, .timeout = 60) { check(PSTAR_DTYPE_BF16, 1); }
