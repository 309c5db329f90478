/*
 * Training through the C API: tied parameters, gradients (write and slot),
 * frozen parameters, the AdamW update against a reference, overflow and
 * loss scaling, hyperparameter setters and clipping.
 */
#include "capi_test_util.h"

/* ------------------------------------------------------------------------ */
/* Reference optimizer state for one parameter                               */
/* ------------------------------------------------------------------------ */

typedef struct ref_param {
  size_t n;
  int decay;
  float *p, *m, *v;     /* float arithmetic, as documented */
  double *pd, *md, *vd; /* textbook AdamW in double */
} ref_param;

static ref_param ref_new(const float *init, size_t n, int decay) {
  ref_param r;
  r.n = n;
  r.decay = decay;
  r.p = t_alloc_f(n);
  r.m = t_alloc_f(n);
  r.v = t_alloc_f(n);
  r.pd = (double *)calloc(n, sizeof(double));
  r.md = (double *)calloc(n, sizeof(double));
  r.vd = (double *)calloc(n, sizeof(double));
  cr_assert(r.pd && r.md && r.vd);
  memcpy(r.p, init, n * sizeof(float));
  for (size_t i = 0; i < n; ++i) r.pd[i] = init[i];
  return r;
}

static void ref_free(ref_param *r) {
  free(r->p);
  free(r->m);
  free(r->v);
  free(r->pd);
  free(r->md);
  free(r->vd);
}

/* One step with the gradient as stored in the compute slot. */
static void ref_step(ref_param *r, const t_adam_hyper *h, uint64_t step, double grad_mul, const float *g_stored) {
  t_adam_float_update(h, step, grad_mul, r->decay, g_stored, r->p, r->m, r->v, r->n);
  double *gd = (double *)calloc(r->n, sizeof(double));
  cr_assert_not_null(gd);
  for (size_t i = 0; i < r->n; ++i) gd[i] = g_stored[i];
  t_adam_double_update(h, step, grad_mul, r->decay, gd, r->pd, r->md, r->vd, r->n);
  free(gd);
}

/* The library's values equal the float reference bit for bit and the
 * textbook double reference within a tight tolerance. */
static void ref_check(pstar_engine *e, uint32_t id, const ref_param *r, const char *what) {
  float *got = t_alloc_f(r->n);
  t_read_f32(e, id, got, r->n);
  for (size_t i = 0; i < r->n; ++i) {
    cr_assert_eq(t_f32_bits(got[i]), t_f32_bits(r->p[i]), "%s[%zu]: library %.9g, reference %.9g", what, i,
                 (double)got[i], (double)r->p[i]);
    cr_assert(fabs((double)got[i] - r->pd[i]) <= 2e-6 * (1.0 + fabs(r->pd[i])),
              "%s[%zu]: library %.9g, double reference %.12g", what, i, (double)got[i], r->pd[i]);
  }
  free(got);
}

static void fwd(pstar_engine *e, uint32_t id) {
  t_acquire(e, id, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, id, NULL));
}

/* Backward use of `id` with gradient g (F32, host). */
static void bwd(pstar_engine *e, uint32_t id, const float *g, uint64_t n) {
  t_acquire(e, id, PSTAR_STAGE_BACKWARD);
  if (g != NULL) T_OK(pstar_grad_write(e, id, g, n, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, id, NULL));
}

static pstar_step_result do_step(pstar_engine *e) {
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(e, &r));
  return r;
}

static double norm2(const float *g, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += (double)g[i] * (double)g[i];
  return s;
}

static t_adam_hyper hyper_of(const pstar_engine_options *o) {
  t_adam_hyper h;
  h.lr = o->lr;
  h.beta1 = o->beta1;
  h.beta2 = o->beta2;
  h.eps = o->eps;
  h.weight_decay = o->weight_decay;
  h.adamw = o->adamw;
  return h;
}

/* ------------------------------------------------------------------------ */
/* Tied parameters and the AdamW reference                                   */
/* ------------------------------------------------------------------------ */

Test(training, tied_parameter_gradients_sum_and_adamw_matches_reference) {
  enum { NW = 64, NU = 32 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 0.01f;
  o.beta1 = 0.9f;
  o.beta2 = 0.999f;
  o.eps = 1e-8f;
  o.weight_decay = 0.1f;
  o.adamw = 1;
  const t_adam_hyper h = hyper_of(&o);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "tied.weight", NW, 0);
  const uint32_t u = t_register(e, "bias", NU, PSTAR_PARAM_NO_WEIGHT_DECAY);
  T_OK(pstar_engine_build(e));
  float iw[NW], iu[NU];
  t_fill(iw, NW, 1, 1.0f);
  t_fill(iu, NU, 2, 1.0f);
  t_write_f32(e, w, iw, NW);
  t_write_f32(e, u, iu, NU);
  ref_param rw = ref_new(iw, NW, 1), ru = ref_new(iu, NU, 0);

  for (uint64_t s = 1; s <= 3; ++s) {
    float g1[NW], g2[NW], gu[NU], gsum[NW];
    t_fill(g1, NW, (uint32_t)(10 * s + 1), 0.5f);
    t_fill(g2, NW, (uint32_t)(10 * s + 2), 0.5f);
    t_fill(gu, NU, (uint32_t)(10 * s + 3), 0.5f);
    for (int i = 0; i < NW; ++i) gsum[i] = g1[i] + g2[i];

    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    fwd(e, w); /* embedding */
    fwd(e, u);
    fwd(e, w); /* tied output projection */
    bwd(e, w, g1, NW);
    /* One of two backward uses: the step is refused, nothing applied. */
    T_FAIL(pstar_step(e, NULL), PSTAR_ERR_INVALID_STATE, "1 backward uses for 2 forward uses");
    bwd(e, u, gu, NU);
    bwd(e, w, g2, NW);
    const pstar_step_result r = do_step(e);

    cr_assert_eq(r.skipped, 0);
    cr_assert_eq(r.step, s);
    cr_assert_eq(r.params_updated, 2);
    cr_assert_eq(r.loss_scale, 1.0f, "F32 uses a fixed loss scale of 1");
    cr_assert_eq(r.next_loss_scale, 1.0f);
    cr_assert_eq(r.clip_coef, 1.0f);
    const double norm = sqrt(norm2(gsum, NW) + norm2(gu, NU));
    cr_assert(fabs(r.grad_norm - norm) <= 1e-12 * norm, "grad_norm %.17g, expected %.17g (of the summed gradient)",
              r.grad_norm, norm);

    ref_step(&rw, &h, s, 1.0, gsum);
    ref_step(&ru, &h, s, 1.0, gu);
    ref_check(e, w, &rw, "tied.weight");
    ref_check(e, u, &ru, "bias");
    cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), (double)s);
  }
  ref_free(&rw);
  ref_free(&ru);
  T_OK(pstar_engine_destroy(e));
}

Test(training, plain_adam_with_l2_matches_reference) {
  enum { N = 96 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 0.05f;
  o.beta1 = 0.8f;
  o.beta2 = 0.95f;
  o.eps = 1e-6f;
  o.weight_decay = 0.2f;
  o.adamw = 0;
  const t_adam_hyper h = hyper_of(&o);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float iw[N];
  t_fill(iw, N, 3, 2.0f);
  t_write_f32(e, w, iw, N);
  ref_param rw = ref_new(iw, N, 1);
  for (uint64_t s = 1; s <= 4; ++s) {
    float g[N];
    t_fill(g, N, (uint32_t)(100 + s), 1.0f);
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    fwd(e, w);
    bwd(e, w, g, N);
    const pstar_step_result r = do_step(e);
    cr_assert_eq(r.step, s);
    ref_step(&rw, &h, s, 1.0, g);
    ref_check(e, w, &rw, "w");
  }
  ref_free(&rw);
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Gradients                                                                 */
/* ------------------------------------------------------------------------ */

Test(gradients, bad_grad_writes_are_rejected_and_not_accumulated) {
  enum { N = 64 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 0.01f;
  const t_adam_hyper h = hyper_of(&o);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float iw[N], g[N], junk[N + 1];
  t_fill(iw, N, 4, 1.0f);
  t_fill(g, N, 5, 0.5f);
  t_fill(junk, N + 1, 6, 100.0f);
  t_write_f32(e, w, iw, N);
  ref_param rw = ref_new(iw, N, 1);

  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  fwd(e, w);
  t_acquire(e, w, PSTAR_STAGE_BACKWARD);
  T_FAIL(pstar_grad_write(e, w, junk, N - 1, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_ARGUMENT,
         "count");
  T_FAIL(pstar_grad_write(e, w, junk, N + 1, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_ARGUMENT,
         "count");
  T_FAIL(pstar_grad_write(e, w, junk, 0, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_ARGUMENT,
         "count");
  T_FAIL(pstar_grad_write(e, w, junk, N, (pstar_dtype)3, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_ARGUMENT,
         "dtype");
  T_FAIL(pstar_grad_write(e, w, junk, N, PSTAR_DTYPE_F32, (pstar_mem_space)2, NULL), PSTAR_ERR_INVALID_ARGUMENT,
         "space");
  T_FAIL(pstar_grad_write(e, w, NULL, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_ARGUMENT,
         "NULL");
  T_FAIL(pstar_grad_write(e, 7, junk, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_NOT_FOUND, "7");
  T_OK(pstar_grad_write(e, w, g, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, w, NULL));
  const pstar_step_result r = do_step(e);
  cr_assert(fabs(r.grad_norm - sqrt(norm2(g, N))) <= 1e-12 * r.grad_norm, "failed writes were accumulated");
  ref_step(&rw, &h, 1, 1.0, g);
  ref_check(e, w, &rw, "w");
  ref_free(&rw);
  T_OK(pstar_engine_destroy(e));
}

Test(gradients, source_dtypes_and_memory_spaces) {
  enum { N = 128 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 0.02f;
  o.weight_decay = 0.0f;
  const t_adam_hyper h = hyper_of(&o);
  pstar_engine *e = t_create(&o);
  const uint32_t x = t_register(e, "x", N, 0);
  const uint32_t y = t_register(e, "y", N, 0);
  const uint32_t z = t_register(e, "z", N, 0);
  T_OK(pstar_engine_build(e));
  float ix[N], iy[N], iz[N];
  t_fill(ix, N, 7, 1.0f);
  t_fill(iy, N, 8, 1.0f);
  t_fill(iz, N, 9, 1.0f);
  t_write_f32(e, x, ix, N);
  t_write_f32(e, y, iy, N);
  t_write_f32(e, z, iz, N);
  ref_param rx = ref_new(ix, N, 1), ry = ref_new(iy, N, 1), rz = ref_new(iz, N, 1);

  float base[N], gx[N], gy[N], gz[N];
  uint16_t bx[N], hy[N];
  t_fill(base, N, 10, 0.75f);
  for (int i = 0; i < N; ++i) {
    bx[i] = t_f32_to_bf16(base[i]);
    gx[i] = t_bf16_to_f32(bx[i]);
    hy[i] = t_f32_to_f16(base[N - 1 - i]);
    gy[i] = t_f16_to_f32(hy[i]);
    gz[i] = base[i] * 0.25f;
  }
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  fwd(e, x);
  fwd(e, y);
  fwd(e, z);
  t_acquire(e, z, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(e, z, gz, N, PSTAR_DTYPE_F32, PSTAR_MEM_DEVICE, NULL));
  T_OK(pstar_param_release(e, z, NULL));
  t_acquire(e, y, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(e, y, hy, N, PSTAR_DTYPE_F16, PSTAR_MEM_DEVICE, NULL));
  T_OK(pstar_param_release(e, y, NULL));
  t_acquire(e, x, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(e, x, bx, N, PSTAR_DTYPE_BF16, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, x, NULL));
  const pstar_step_result r = do_step(e);
  cr_assert_eq(r.params_updated, 3);
  ref_step(&rx, &h, 1, 1.0, gx);
  ref_step(&ry, &h, 1, 1.0, gy);
  ref_step(&rz, &h, 1, 1.0, gz);
  ref_check(e, x, &rx, "x (bf16 gradient)");
  ref_check(e, y, &ry, "y (f16 gradient)");
  ref_check(e, z, &rz, "z (f32 gradient)");
  ref_free(&rx);
  ref_free(&ry);
  ref_free(&rz);
  T_OK(pstar_engine_destroy(e));
}

Test(gradients, grad_slot_accumulates_in_place) {
  enum { N = 100 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 0.01f;
  o.weight_decay = 0.0f;
  const t_adam_hyper h = hyper_of(&o);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float iw[N];
  t_fill(iw, N, 11, 1.0f);
  t_write_f32(e, w, iw, N);
  ref_param rw = ref_new(iw, N, 1);

  /* All-positive gradient contributions: every weight must go down. */
  float h1[N], g1[N], h2[N], expect[N];
  for (int i = 0; i < N; ++i) {
    h1[i] = 0.25f + 0.001f * (float)i;
    g1[i] = 0.125f + 0.002f * (float)i;
    h2[i] = 0.0625f + 0.003f * (float)i;
    expect[i] = (h1[i] + g1[i]) + h2[i];
  }
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  fwd(e, w);
  fwd(e, w);
  /* First backward use: slot write, then grad_write on top. */
  t_acquire(e, w, PSTAR_STAGE_BACKWARD);
  float *slot = NULL;
  T_OK(pstar_grad_slot_acquire(e, w, NULL, &slot));
  cr_assert_not_null(slot);
  for (int i = 0; i < N; ++i) cr_assert_eq(slot[i], 0.0f, "the accumulator starts at zero ([%d] = %g)", i, slot[i]);
  for (int i = 0; i < N; ++i) slot[i] += h1[i];
  T_OK(pstar_grad_write(e, w, g1, N, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  float *slot2 = NULL;
  T_OK(pstar_grad_slot_acquire(e, w, NULL, &slot2));
  cr_assert_eq((uintptr_t)slot2, (uintptr_t)slot);
  for (int i = 0; i < N; ++i) cr_assert_eq(slot2[i], h1[i] + g1[i], "slot[%d] after grad_write", i);
  T_OK(pstar_param_release(e, w, NULL));
  /* Second backward use: the same accumulator. */
  t_acquire(e, w, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_slot_acquire(e, w, NULL, &slot));
  for (int i = 0; i < N; ++i) cr_assert_eq(slot[i], h1[i] + g1[i], "slot[%d] in the second backward use", i);
  for (int i = 0; i < N; ++i) slot[i] += h2[i];
  T_OK(pstar_param_release(e, w, NULL));
  const pstar_step_result r = do_step(e);
  cr_assert_eq(r.params_updated, 1);
  cr_assert(fabs(r.grad_norm - sqrt(norm2(expect, N))) <= 1e-12 * r.grad_norm);

  float got[N];
  t_read_f32(e, w, got, N);
  for (int i = 0; i < N; ++i) cr_assert_lt(got[i], iw[i], "[%d] did not move against the gradient", i);
  ref_step(&rw, &h, 1, 1.0, expect);
  ref_check(e, w, &rw, "w");
  ref_free(&rw);
  T_OK(pstar_engine_destroy(e));
}

Test(gradients, parameters_without_backward_use_are_not_updated) {
  enum { N = 50 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 0.01f;
  o.weight_decay = 0.5f; /* decay would show on any parameter that steps */
  const t_adam_hyper h = hyper_of(&o);
  pstar_engine *e = t_create(&o);
  const uint32_t a = t_register(e, "a", N, 0);
  const uint32_t b = t_register(e, "b", N, 0);
  const uint32_t c = t_register(e, "c", N, 0);
  T_OK(pstar_engine_build(e));
  float ia[N], ib[N], ic[N], g[N], got[N];
  t_fill(ia, N, 1, 1.0f);
  t_fill(ib, N, 2, 1.0f);
  t_fill(ic, N, 3, 1.0f);
  t_fill(g, N, 4, 1.0f);
  t_write_f32(e, a, ia, N);
  t_write_f32(e, b, ib, N);
  t_write_f32(e, c, ic, N);
  ref_param ra = ref_new(ia, N, 1), rb = ref_new(ib, N, 1);

  /* a: forward + backward; b: forward only; c: not used. */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  fwd(e, a);
  fwd(e, b);
  bwd(e, a, g, N);
  pstar_step_result r = do_step(e);
  cr_assert_eq(r.params_updated, 1);
  ref_step(&ra, &h, 1, 1.0, g);
  ref_check(e, a, &ra, "a");
  t_read_f32(e, b, got, N);
  cr_assert_eq(memcmp(got, ib, sizeof got), 0, "b had no backward use but changed");
  t_read_f32(e, c, got, N);
  cr_assert_eq(memcmp(got, ic, sizeof got), 0, "c was not used but changed");

  /* Now b only (with a backward use that writes no gradient: a zero
   * gradient, so only the weight decay moves it). */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  fwd(e, b);
  bwd(e, b, NULL, N);
  r = do_step(e);
  cr_assert_eq(r.params_updated, 1);
  cr_assert_eq(r.step, 2);
  float zero[N];
  memset(zero, 0, sizeof zero);
  ref_step(&rb, &h, 2, 1.0, zero);
  ref_check(e, b, &rb, "b");
  ref_check(e, a, &ra, "a (unchanged by the second step)");
  t_read_f32(e, c, got, N);
  cr_assert_eq(memcmp(got, ic, sizeof got), 0);
  ref_free(&ra);
  ref_free(&rb);
  T_OK(pstar_engine_destroy(e));
}

/* The device accumulator is zeroed by its first reader, not at the
 * acquire (engine/engine_grad.cpp): a use that writes nothing, a slot
 * write after such uses, a grad_write after them, and a last use with no
 * gradient at all must give the bits of writing explicit zeros.  Strict
 * mode poisons new device buffers, so a reader that finds the zeroing
 * missing reads NaNs. */
static void deferred_zero_run(int explicit_zeros, pstar_dtype dtype, float *master_out, float *grad_norm_out) {
  enum { N = 300 };
  pstar_engine_options o = t_options(dtype, 512);
  o.strict = 1;
  o.strict_seed = 7;
  o.lr = 0.01f;
  o.weight_decay = 0.25f;
  pstar_engine *e = t_create(&o);
  const uint32_t a = t_register(e, "a", N, 0); /* 3 uses: none, slot, write */
  const uint32_t b = t_register(e, "b", N, 0); /* 2 uses, no gradient */
  const uint32_t c = t_register(e, "c", N, 0); /* 1 use, no gradient */
  T_OK(pstar_engine_build(e));
  float init[N], g[N], zero[N];
  memset(zero, 0, sizeof zero);
  for (uint32_t id = 0; id < 3; ++id) {
    t_fill(init, N, 20 + id, 1.0f);
    t_write_f32(e, id, init, N);
  }
  t_fill(g, N, 30, 0.5f);
  for (int it = 0; it < 2; ++it) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (int u = 0; u < 3; ++u) fwd(e, a);
    for (int u = 0; u < 2; ++u) fwd(e, b);
    fwd(e, c);
    bwd(e, c, explicit_zeros ? zero : NULL, N);
    for (int u = 0; u < 2; ++u) bwd(e, b, explicit_zeros ? zero : NULL, N);
    bwd(e, a, explicit_zeros ? zero : NULL, N);
    t_acquire(e, a, PSTAR_STAGE_BACKWARD);
    float *slot = NULL;
    T_OK(pstar_grad_slot_acquire(e, a, NULL, &slot));
    for (int i = 0; i < N; ++i) cr_assert_eq(t_f32_bits(slot[i]), 0u, "slot[%d] before any write: %g", i, (double)slot[i]);
    for (int i = 0; i < N; ++i) slot[i] += g[i];
    T_OK(pstar_param_release(e, a, NULL));
    bwd(e, a, g, N);
    const pstar_step_result r = do_step(e);
    cr_assert_eq(r.params_updated, 3);
    *grad_norm_out = (float)r.grad_norm;
  }
  for (uint32_t id = 0; id < 3; ++id) t_read_f32(e, id, master_out + id * N, N);
  T_OK(pstar_engine_destroy(e));
}

Test(gradients, deferred_zeroing_gives_the_bits_of_explicit_zeros) {
  enum { N = 300 };
  const pstar_dtype dtypes[3] = {PSTAR_DTYPE_F32, PSTAR_DTYPE_F16, PSTAR_DTYPE_BF16};
  for (int d = 0; d < 3; ++d) {
    float lazy[3 * N], explicit_[3 * N], norm_lazy = 0, norm_explicit = 0;
    deferred_zero_run(0, dtypes[d], lazy, &norm_lazy);
    deferred_zero_run(1, dtypes[d], explicit_, &norm_explicit);
    cr_assert_eq(t_f32_bits(norm_lazy), t_f32_bits(norm_explicit), "dtype %d: grad norm", d);
    cr_assert(norm_lazy > 0.0f);
    for (int i = 0; i < 3 * N; ++i)
      cr_assert_eq(t_f32_bits(lazy[i]), t_f32_bits(explicit_[i]), "dtype %d, value %d: %g vs %g", d, i,
                   (double)lazy[i], (double)explicit_[i]);
  }
}

/* ------------------------------------------------------------------------ */
/* Frozen parameters                                                         */
/* ------------------------------------------------------------------------ */

Test(frozen, no_gradient_no_update_no_optimizer_state) {
  enum { NT = 500, NF = 1024, NT2 = 300 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  o.lr = 0.01f;
  o.weight_decay = 0.1f;
  pstar_engine *e = t_create(&o);
  const uint32_t t1 = t_register(e, "t1", NT, 0);
  const uint32_t f = t_register(e, "frozen", NF, PSTAR_PARAM_FROZEN);
  const uint32_t t2 = t_register(e, "t2", NT2, 0);
  T_OK(pstar_engine_build(e));

  const pstar_stats s = t_stats(e);
  cr_assert_eq(s.compute_chunks, 2, "t1 and t2 share a chunk; the frozen parameter has its own");
  cr_assert_eq(s.optimizer_chunks, 1, "optimizer_chunks %u includes the frozen chunk", s.optimizer_chunks);
  cr_assert_eq(s.compute_list_bytes, 2 * 1024 * 2);
  cr_assert_eq(s.optimizer_list_bytes, 1024 * 4);

  float it1[NT], ifz[NF], it2[NT2], got[NF];
  t_fill(it1, NT, 1, 1.0f);
  t_fill(ifz, NF, 2, 1.0f);
  t_fill(it2, NT2, 3, 1.0f);
  t_write_f32(e, t1, it1, NT);
  t_write_f32(e, f, ifz, NF);
  t_write_f32(e, t2, it2, NT2);
  float frozen_before[NF];
  t_read_f32(e, f, frozen_before, NF);

  float g[NF];
  t_fill(g, NF, 4, 0.5f);
  float *slot = (float *)(uintptr_t)0x9;
  /* Frozen is checked first: refused even outside backward. */
  T_FAIL(pstar_grad_write(e, f, g, NF, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE, "frozen");
  for (int it = 0; it < 3; ++it) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    fwd(e, t1);
    fwd(e, f);
    fwd(e, t2);
    bwd(e, t2, g, NT2);
    /* The frozen weights are still needed in backward (input gradients). */
    t_acquire(e, f, PSTAR_STAGE_BACKWARD);
    T_FAIL(pstar_grad_write(e, f, g, NF, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_INVALID_STATE, "frozen");
    T_FAIL(pstar_grad_slot_acquire(e, f, NULL, &slot), PSTAR_ERR_INVALID_STATE, "frozen");
    T_OK(pstar_param_release(e, f, NULL));
    bwd(e, t1, g, NT);
    const pstar_step_result r = do_step(e);
    cr_assert_eq(r.params_updated, 2, "frozen parameters are not updated");
    cr_assert_eq(r.skipped, 0);
  }
  cr_assert_eq((uintptr_t)slot, (uintptr_t)0x9);
  t_read_f32(e, f, got, NF);
  cr_assert_eq(memcmp(got, frozen_before, sizeof frozen_before), 0, "frozen values changed");
  for (int i = 0; i < NF; ++i) cr_assert_eq(got[i], t_round(PSTAR_DTYPE_BF16, ifz[i]));
  t_read_f32(e, t1, got, NT);
  cr_assert_neq(memcmp(got, it1, NT * sizeof(float)), 0, "trainable t1 did not train");

  /* The compute copy handed out is unchanged too. */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  const uint16_t *pf = (const uint16_t *)t_acquire(e, f, PSTAR_STAGE_FORWARD);
  for (int i = 0; i < NF; ++i) cr_assert_eq(pf[i], t_f32_to_bf16(ifz[i]));
  T_OK(pstar_param_release(e, f, NULL));
  T_OK(pstar_iteration_end(e));
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Overflow and loss scaling                                                 */
/* ------------------------------------------------------------------------ */

/* One iteration over `w` with gradient g (already scaled by the caller). */
static pstar_step_result iterate_once(pstar_engine *e, uint32_t w, const float *g, uint64_t n) {
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  fwd(e, w);
  bwd(e, w, g, n);
  return do_step(e);
}

Test(overflow, f16_inf_gradient_skips_and_backs_off_after_hysteresis) {
  enum { N = 256 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
  o.lr = 0.01f;
  o.weight_decay = 0.0f;
  const t_adam_hyper h = hyper_of(&o);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float iw[N], got[N], g[N];
  t_fill(iw, N, 1, 1.0f);
  t_write_f32(e, w, iw, N);
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_LOSS_SCALE), 65536.0);

  /* 1: an inf in the gradient. */
  t_fill(g, N, 2, 1000.0f);
  g[5] = INFINITY;
  pstar_step_result r = iterate_once(e, w, g, N);
  cr_assert_eq(r.skipped, 1);
  cr_assert_eq(r.step, 0, "a skipped step advanced Adam's step count");
  cr_assert_eq(r.params_updated, 0);
  cr_assert_eq(r.loss_scale, 65536.0f);
  cr_assert_eq(r.next_loss_scale, 65536.0f, "hysteresis 2: one overflow must not back off yet");
  t_read_f32(e, w, got, N);
  cr_assert_eq(memcmp(got, iw, sizeof got), 0, "weights changed by a skipped step");
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), 0.0);

  /* The slot holds the weights again, not the gradient. */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  const uint16_t *pw = (const uint16_t *)t_acquire(e, w, PSTAR_STAGE_FORWARD);
  for (int i = 0; i < N; ++i) cr_assert_eq(pw[i], t_f32_to_f16(iw[i]), "slot [%d] not restored", i);
  T_OK(pstar_param_release(e, w, NULL));
  T_OK(pstar_iteration_end(e));

  /* 2: a finite fp32 gradient that overflows fp16 (> 65504). */
  t_fill(g, N, 3, 1000.0f);
  g[N - 1] = 1.0e5f;
  r = iterate_once(e, w, g, N);
  cr_assert_eq(r.skipped, 1);
  cr_assert_eq(r.step, 0);
  cr_assert_eq(r.loss_scale, 65536.0f);
  cr_assert_eq(r.next_loss_scale, 32768.0f, "second overflow must halve the loss scale");
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_LOSS_SCALE), 32768.0);
  t_read_f32(e, w, got, N);
  cr_assert_eq(memcmp(got, iw, sizeof got), 0);

  pstar_stats s = t_stats(e);
  cr_assert_eq(s.skipped_steps, 2);
  cr_assert_eq(s.steps, 0);

  /* 3: a clean step at the new scale: Adam sees the unscaled gradient. */
  float gtrue[N], gstored[N];
  t_fill(gtrue, N, 4, 0.5f);
  double sumsq = 0.0;
  for (int i = 0; i < N; ++i) {
    g[i] = gtrue[i] * 32768.0f;
    gstored[i] = t_round(PSTAR_DTYPE_F16, g[i]);
    sumsq += (double)gstored[i] * gstored[i];
  }
  r = iterate_once(e, w, g, N);
  cr_assert_eq(r.skipped, 0);
  cr_assert_eq(r.step, 1);
  cr_assert_eq(r.params_updated, 1);
  cr_assert_eq(r.loss_scale, 32768.0f);
  cr_assert_eq(r.next_loss_scale, 32768.0f);
  const double norm = sqrt(sumsq) / 32768.0;
  cr_assert(fabs(r.grad_norm - norm) <= 1e-12 * norm, "grad_norm %.17g is not unscaled (%.17g)", r.grad_norm, norm);
  ref_param rw = ref_new(iw, N, 1);
  ref_step(&rw, &h, 1, 1.0 / 32768.0, gstored);
  ref_check(e, w, &rw, "w");
  ref_free(&rw);
  s = t_stats(e);
  cr_assert_eq(s.skipped_steps, 2);
  cr_assert_eq(s.steps, 1);
  T_OK(pstar_engine_destroy(e));
}

Test(overflow, one_bad_parameter_skips_the_whole_step) {
  enum { N = 64 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t a = t_register(e, "a", N, 0);
  const uint32_t b = t_register(e, "b", N, 0);
  T_OK(pstar_engine_build(e));
  float ia[N], ib[N], ga[N], gb[N], got[N];
  t_fill(ia, N, 1, 1.0f);
  t_fill(ib, N, 2, 1.0f);
  t_fill(ga, N, 3, 100.0f);
  t_fill(gb, N, 4, 100.0f);
  gb[0] = -INFINITY;
  t_write_f32(e, a, ia, N);
  t_write_f32(e, b, ib, N);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  fwd(e, a);
  fwd(e, b);
  bwd(e, b, gb, N);
  bwd(e, a, ga, N);
  const pstar_step_result r = do_step(e);
  cr_assert_eq(r.skipped, 1);
  t_read_f32(e, a, got, N);
  cr_assert_eq(memcmp(got, ia, sizeof got), 0, "a clean parameter was updated in a skipped step");
  t_read_f32(e, b, got, N);
  cr_assert_eq(memcmp(got, ib, sizeof got), 0);
  T_OK(pstar_engine_destroy(e));
}

Test(overflow, bf16_nan_or_inf_gradient_skips) {
  enum { N = 128 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  o.lr = 0.01f;
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float iw[N], got[N], g[N];
  t_fill(iw, N, 1, 1.0f);
  t_write_f32(e, w, iw, N);
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_LOSS_SCALE), 1.0);

  t_fill(g, N, 2, 0.5f);
  g[17] = NAN;
  pstar_step_result r = iterate_once(e, w, g, N);
  cr_assert_eq(r.skipped, 1);
  cr_assert_eq(r.step, 0);
  cr_assert_eq(r.loss_scale, 1.0f);
  cr_assert_eq(r.next_loss_scale, 1.0f, "BF16 has no dynamic loss scale");
  t_read_f32(e, w, got, N);
  cr_assert_eq(memcmp(got, iw, sizeof got), 0);

  t_fill(g, N, 3, 0.5f);
  g[0] = INFINITY;
  r = iterate_once(e, w, g, N);
  cr_assert_eq(r.skipped, 1);
  cr_assert_eq(r.next_loss_scale, 1.0f);
  t_read_f32(e, w, got, N);
  cr_assert_eq(memcmp(got, iw, sizeof got), 0);

  /* Values finite in fp32 but beyond the range of bf16 overflow in the slot. */
  t_fill(g, N, 4, 0.5f);
  g[3] = 3.4e38f;
  g[4] = 3.4e38f;
  pstar_step_result r2 = iterate_once(e, w, g, N);
  cr_assert_eq(r2.skipped, 1, "a gradient beyond the bf16 range was not detected");

  t_fill(g, N, 5, 0.5f);
  r = iterate_once(e, w, g, N);
  cr_assert_eq(r.skipped, 0);
  cr_assert_eq(r.step, 1);
  const pstar_stats s = t_stats(e);
  cr_assert_eq(s.skipped_steps, 3);
  cr_assert_eq(s.steps, 1);
  T_OK(pstar_engine_destroy(e));
}

Test(overflow, f16_loss_scale_growth_backoff_and_minimum) {
  enum { N = 32 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
  o.loss_scale_initial = 1024.0f;
  o.loss_scale_growth_interval = 2;
  o.loss_scale_hysteresis = 1;
  o.loss_scale_min = 256.0f;
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float g[N], bad[N];
  t_fill(g, N, 1, 1.0f);
  t_fill(bad, N, 2, 1.0f);
  bad[1] = INFINITY;

  /* Two clean steps: growth. */
  pstar_step_result r = iterate_once(e, w, g, N);
  cr_assert_eq(r.next_loss_scale, 1024.0f);
  r = iterate_once(e, w, g, N);
  cr_assert_eq(r.loss_scale, 1024.0f);
  cr_assert_eq(r.next_loss_scale, 2048.0f);
  /* Hysteresis 1: every overflow backs off, never below the minimum. */
  const float expected[] = {1024.0f, 512.0f, 256.0f, 256.0f};
  for (int i = 0; i < 4; ++i) {
    r = iterate_once(e, w, bad, N);
    cr_assert_eq(r.skipped, 1);
    cr_assert_eq(r.next_loss_scale, expected[i], "overflow %d: next scale %g", i, (double)r.next_loss_scale);
  }
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_LOSS_SCALE), 256.0);
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), 2.0);
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Hyperparameters                                                           */
/* ------------------------------------------------------------------------ */

Test(hparams, set_get_round_trip) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
  pstar_engine *e = t_create(&o);
  const struct {
    pstar_hparam which;
    double value;
  } cases[] = {
      {PSTAR_HPARAM_LR, 0.5},          {PSTAR_HPARAM_LR, 0.0},          {PSTAR_HPARAM_BETA1, 0.8},
      {PSTAR_HPARAM_BETA1, 0.0},       {PSTAR_HPARAM_BETA2, 0.99},      {PSTAR_HPARAM_EPS, 1e-6},
      {PSTAR_HPARAM_WEIGHT_DECAY, 0.2}, {PSTAR_HPARAM_WEIGHT_DECAY, 0.0}, {PSTAR_HPARAM_CLIP_NORM, 1.5},
      {PSTAR_HPARAM_CLIP_NORM, 0.0},   {PSTAR_HPARAM_LOSS_SCALE, 128.0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    T_OK(pstar_hparam_set(e, cases[i].which, cases[i].value));
    const double got = t_hparam(e, cases[i].which);
    cr_assert_eq(got, (double)(float)cases[i].value, "hparam %d: set %.17g, got %.17g", (int)cases[i].which,
                 cases[i].value, got);
  }
  T_OK(pstar_engine_destroy(e));
}

Test(hparams, invalid_values_are_rejected_and_change_nothing) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
  pstar_engine *e = t_create(&o);
  const struct {
    pstar_hparam which;
    double value;
    const char *needle;
  } cases[] = {
      {PSTAR_HPARAM_LR, -1e-3, "lr"},
      {PSTAR_HPARAM_LR, NAN, "lr"},
      {PSTAR_HPARAM_LR, INFINITY, "lr"},
      {PSTAR_HPARAM_BETA1, 1.0, "beta1"},
      {PSTAR_HPARAM_BETA1, -0.5, "beta1"},
      {PSTAR_HPARAM_BETA1, NAN, "beta1"},
      {PSTAR_HPARAM_BETA2, 1.0, "beta2"},
      {PSTAR_HPARAM_BETA2, 1.5, "beta2"},
      {PSTAR_HPARAM_EPS, 0.0, "eps"},
      {PSTAR_HPARAM_EPS, -1e-8, "eps"},
      {PSTAR_HPARAM_WEIGHT_DECAY, -0.1, "weight_decay"},
      {PSTAR_HPARAM_WEIGHT_DECAY, NAN, "weight_decay"},
      {PSTAR_HPARAM_CLIP_NORM, -1.0, "clip_norm"},
      {PSTAR_HPARAM_CLIP_NORM, INFINITY, "clip_norm"},
      {PSTAR_HPARAM_LOSS_SCALE, 0.0, "loss scale"},
      {PSTAR_HPARAM_LOSS_SCALE, -2.0, "loss scale"},
      {PSTAR_HPARAM_LOSS_SCALE, INFINITY, "loss scale"},
      {PSTAR_HPARAM_STEP, 5.0, "read-only"},
      {(pstar_hparam)99, 1.0, "unknown"},
  };
  const pstar_hparam all[] = {PSTAR_HPARAM_LR,           PSTAR_HPARAM_BETA1,     PSTAR_HPARAM_BETA2,
                              PSTAR_HPARAM_EPS,          PSTAR_HPARAM_WEIGHT_DECAY, PSTAR_HPARAM_CLIP_NORM,
                              PSTAR_HPARAM_LOSS_SCALE,   PSTAR_HPARAM_STEP};
  double before[8];
  for (int j = 0; j < 8; ++j) before[j] = t_hparam(e, all[j]);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    const pstar_status s = pstar_hparam_set(e, cases[i].which, cases[i].value);
    char msg[T_MSG_CAP];
    t_copy_last_error(msg, sizeof msg);
    cr_assert_eq(s, PSTAR_ERR_INVALID_ARGUMENT, "case %zu (hparam %d = %g): %s \"%s\"", i, (int)cases[i].which,
                 cases[i].value, pstar_status_name(s), msg);
    cr_assert(strstr(msg, cases[i].needle) != NULL, "case %zu: \"%s\" does not mention %s", i, msg,
              cases[i].needle);
  }
  for (int j = 0; j < 8; ++j) cr_assert_eq(t_hparam(e, all[j]), before[j], "hparam %d changed", (int)all[j]);
  double v = 42.0;
  T_FAIL(pstar_hparam_get(e, (pstar_hparam)99, &v), PSTAR_ERR_INVALID_ARGUMENT, "unknown");
  T_FAIL(pstar_hparam_get(e, (pstar_hparam)-1, &v), PSTAR_ERR_INVALID_ARGUMENT, "unknown");
  cr_assert_eq(v, 42.0);
  T_OK(pstar_engine_destroy(e));
}

Test(hparams, loss_scale_is_f16_only) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  T_FAIL(pstar_hparam_set(e, PSTAR_HPARAM_LOSS_SCALE, 1024.0), PSTAR_ERR_INVALID_STATE, "F16");
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_LOSS_SCALE), 1.0);
  T_OK(pstar_engine_destroy(e));
  o.compute_dtype = PSTAR_DTYPE_F32;
  e = t_create(&o);
  T_FAIL(pstar_hparam_set(e, PSTAR_HPARAM_LOSS_SCALE, 1024.0), PSTAR_ERR_INVALID_STATE, "F16");
  T_OK(pstar_engine_destroy(e));
}

Test(hparams, set_in_eval_and_in_a_train_iteration_until_its_step) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", 16, 0);
  T_OK(pstar_engine_build(e));
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LR, 0.125));
  T_OK(pstar_iteration_end(e));
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LR, 0.25)); /* before the forward */
  fwd(e, w);
  t_acquire(e, w, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LR, 0.375)); /* with a parameter acquired */
  T_OK(pstar_param_release(e, w, NULL));
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LR, 0.5)); /* after the backward: the step's */
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_LR), 0.5);
  T_OK(pstar_step(e, NULL));
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_LR), 0.5);
  T_OK(pstar_engine_destroy(e));
}

/* The loss scale scaled this iteration's gradients: not settable inside it. */
Test(hparams, loss_scale_refused_inside_a_train_iteration) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", 16, 0);
  T_OK(pstar_engine_build(e));
  const double before = t_hparam(e, PSTAR_HPARAM_LOSS_SCALE);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  T_FAIL(pstar_hparam_set(e, PSTAR_HPARAM_LOSS_SCALE, 1024.0), PSTAR_ERR_INVALID_STATE, "TRAIN iteration");
  fwd(e, w);
  T_FAIL(pstar_hparam_set(e, PSTAR_HPARAM_LOSS_SCALE, 1024.0), PSTAR_ERR_INVALID_STATE, "between steps");
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_LOSS_SCALE), before);
  T_OK(pstar_step(e, NULL));
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LOSS_SCALE, 1024.0));
  T_OK(pstar_engine_destroy(e));
}

/* A learning rate, betas, eps, weight decay and clipping norm set after the
 * backward give the bits of the same values set before the iteration; the
 * norm read before the step is the step's. */
Test(hparams, set_after_the_backward_is_the_same_as_before_the_iteration) {
  enum { N = 300 };
  float iw[N], g[N], got[2][N];
  double norms[2][3];
  pstar_step_result res[2][3];
  t_fill(iw, N, 1, 1.0f);
  for (int late = 0; late < 2; ++late) {
    pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 128); /* three chunks */
    o.clip_norm = 0.0f;
    pstar_engine *e = t_create(&o);
    const uint32_t a = t_register(e, "a", N / 2, 0), b = t_register(e, "b", N / 2, 0);
    T_OK(pstar_engine_build(e));
    t_write_f32(e, a, iw, N / 2);
    t_write_f32(e, b, iw + N / 2, N / 2);
    for (int s = 0; s < 3; ++s) {
      const double lr = 0.01 * (s + 1), clip = s == 1 ? 0.25 : 0.0;
      if (!late) {
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LR, lr));
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_BETA1, 0.8));
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_BETA2, 0.95));
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_EPS, 1e-6));
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_WEIGHT_DECAY, 0.1));
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_CLIP_NORM, clip));
      }
      T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
      fwd(e, a);
      fwd(e, b);
      t_fill(g, N, (uint32_t)(s + 2), 1.0f);
      /* The norm is refused while a parameter is acquired, and while a
       * parameter's backward is part way (a is used twice below). */
      t_acquire(e, b, PSTAR_STAGE_BACKWARD);
      T_OK(pstar_grad_write(e, b, g + N / 2, N / 2, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      double norm = 0.0;
      T_FAIL(pstar_grad_norm(e, &norm), PSTAR_ERR_INVALID_STATE, "still acquired");
      T_OK(pstar_param_release(e, b, NULL));
      fwd(e, a); /* a second use of a: its backward is part way after one */
      bwd(e, a, g, N / 2);
      T_FAIL(pstar_grad_norm(e, &norm), PSTAR_ERR_INVALID_STATE, "1 backward uses for 2 forward uses");
      bwd(e, a, NULL, 0);
      T_OK(pstar_grad_norm(e, &norms[late][s]));
      T_FAIL(pstar_grad_norm(e, NULL), PSTAR_ERR_INVALID_ARGUMENT, "out_norm");
      if (late) {
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LR, lr));
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_BETA1, 0.8));
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_BETA2, 0.95));
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_EPS, 1e-6));
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_WEIGHT_DECAY, 0.1));
        T_OK(pstar_hparam_set(e, PSTAR_HPARAM_CLIP_NORM, clip));
      }
      res[late][s] = do_step(e);
      cr_assert(memcmp(&norms[late][s], &res[late][s].grad_norm, sizeof(double)) == 0,
                "late %d step %d: pstar_grad_norm %.17g, the step's %.17g", late, s, norms[late][s],
                res[late][s].grad_norm);
    }
    double norm = 0.0;
    T_FAIL(pstar_grad_norm(e, &norm), PSTAR_ERR_INVALID_STATE, "no TRAIN iteration");
    t_read_f32(e, a, got[late], N / 2);
    t_read_f32(e, b, got[late] + N / 2, N / 2);
    T_OK(pstar_engine_destroy(e));
  }
  cr_assert_lt(res[0][1].clip_coef, 1.0f, "step 1 should clip");
  for (int s = 0; s < 3; ++s) {
    cr_assert_eq(res[0][s].clip_coef, res[1][s].clip_coef, "step %d: clip coefficients differ", s);
  }
  cr_assert_eq(memcmp(got[0], got[1], sizeof got[0]), 0, "weights differ between early and late settings");
  /* A control: the late setting reached the step (the weights differ from
   * those of a default learning rate). */
  cr_assert_neq(memcmp(got[0], iw, sizeof iw), 0);
}

/* With an inf in a gradient the norm before the step is infinite. */
Test(hparams, grad_norm_of_an_overflowing_iteration_is_infinite) {
  enum { N = 16 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float g[N];
  t_fill(g, N, 2, 1.0f);
  g[3] = INFINITY;
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  fwd(e, w);
  bwd(e, w, g, N);
  double norm = 0.0;
  T_OK(pstar_grad_norm(e, &norm));
  cr_assert(isinf(norm) && norm > 0, "norm %g", norm);
  const pstar_step_result r = do_step(e);
  cr_assert_eq(r.skipped, 1);
  T_OK(pstar_engine_destroy(e));
}

Test(hparams, loss_scale_override_is_used_by_the_next_step) {
  enum { N = 32 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
  o.weight_decay = 0.0f;
  const t_adam_hyper h = hyper_of(&o);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float iw[N], g[N], gstored[N];
  t_fill(iw, N, 1, 1.0f);
  t_write_f32(e, w, iw, N);
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LOSS_SCALE, 1024.0));
  t_fill(g, N, 2, 512.0f); /* as computed with a loss scale of 1024 */
  for (int i = 0; i < N; ++i) gstored[i] = t_round(PSTAR_DTYPE_F16, g[i]);
  const pstar_step_result r = iterate_once(e, w, g, N);
  cr_assert_eq(r.loss_scale, 1024.0f);
  cr_assert_eq(r.next_loss_scale, 1024.0f);
  cr_assert(fabs(r.grad_norm - sqrt(norm2(gstored, N)) / 1024.0) <= 1e-12 * r.grad_norm);
  ref_param rw = ref_new(iw, N, 1);
  ref_step(&rw, &h, 1, 1.0 / 1024.0, gstored);
  ref_check(e, w, &rw, "w");
  ref_free(&rw);
  T_OK(pstar_engine_destroy(e));
}

Test(hparams, lr_change_applies_to_the_next_step) {
  enum { N = 64 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 0.01f;
  o.weight_decay = 0.01f;
  o.adamw = 1;
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float iw[N], g[N], got[N];
  t_fill(iw, N, 1, 1.0f);
  t_write_f32(e, w, iw, N);
  ref_param rw = ref_new(iw, N, 1);
  t_adam_hyper h = hyper_of(&o);

  /* lr 0 under AdamW: no update, no decay (the moments still advance). */
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LR, 0.0));
  h.lr = 0.0f;
  t_fill(g, N, 2, 1.0f);
  pstar_step_result r = iterate_once(e, w, g, N);
  cr_assert_eq(r.params_updated, 1);
  cr_assert_eq(r.step, 1);
  t_read_f32(e, w, got, N);
  cr_assert_eq(memcmp(got, iw, sizeof got), 0, "lr = 0 changed the weights");
  ref_step(&rw, &h, 1, 1.0, g);

  /* Back to a learning rate: the next step moves. */
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_LR, 0.05));
  h.lr = (float)0.05;
  t_fill(g, N, 3, 1.0f);
  r = iterate_once(e, w, g, N);
  cr_assert_eq(r.step, 2);
  t_read_f32(e, w, got, N);
  cr_assert_neq(memcmp(got, iw, sizeof got), 0);
  ref_step(&rw, &h, 2, 1.0, g);
  ref_check(e, w, &rw, "w");

  /* Betas, eps and weight decay are taken from the setters too. */
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_BETA1, 0.5));
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_BETA2, 0.9));
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_EPS, 1e-3));
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_WEIGHT_DECAY, 0.5));
  h.beta1 = 0.5f;
  h.beta2 = 0.9f;
  h.eps = (float)1e-3;
  h.weight_decay = 0.5f;
  t_fill(g, N, 4, 1.0f);
  r = iterate_once(e, w, g, N);
  cr_assert_eq(r.step, 3);
  ref_step(&rw, &h, 3, 1.0, g);
  ref_check(e, w, &rw, "w after changing betas, eps and weight decay");
  ref_free(&rw);
  T_OK(pstar_engine_destroy(e));
}

Test(hparams, gradient_clipping) {
  enum { N = 200 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 0.01f;
  o.weight_decay = 0.0f;
  o.clip_norm = 0.5f;
  const t_adam_hyper h = hyper_of(&o);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float iw[N], g[N];
  t_fill(iw, N, 1, 1.0f);
  t_fill(g, N, 2, 1.0f);
  t_write_f32(e, w, iw, N);
  ref_param rw = ref_new(iw, N, 1);

  const double norm = sqrt(norm2(g, N));
  cr_assert_gt(norm, 0.5);
  pstar_step_result r = iterate_once(e, w, g, N);
  cr_assert(fabs(r.grad_norm - norm) <= 1e-12 * norm, "grad_norm is reported before clipping");
  const double coef = 0.5 / (r.grad_norm + 1e-6);
  cr_assert(fabs((double)r.clip_coef - coef) <= 1e-6 * coef, "clip_coef %.9g, expected %.9g", (double)r.clip_coef,
            coef);
  ref_step(&rw, &h, 1, coef, g);
  ref_check(e, w, &rw, "w (clipped)");

  /* A threshold above the norm does not clip. */
  T_OK(pstar_hparam_set(e, PSTAR_HPARAM_CLIP_NORM, 1e6));
  r = iterate_once(e, w, g, N);
  cr_assert_eq(r.clip_coef, 1.0f);
  ref_step(&rw, &h, 2, 1.0, g);
  ref_check(e, w, &rw, "w (not clipped)");
  ref_free(&rw);
  T_OK(pstar_engine_destroy(e));
}

/* LIBRARY BUG (undefined behaviour, visible with -fsanitize=undefined only):
 * pstar_param_write/read with count 0 and a NULL buffer (documented as
 * legal) reach memcpy(dst, NULL, 0) / memcpy(NULL, src, 0) in
 * src/util/dtype.cpp (convert_to_f32 line 16, convert_from_f32 line 24);
 * memcpy with a NULL pointer is undefined even for 0 bytes. */
Test(training, scalar_and_empty_parameters) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 128);
  o.lr = 0.5f;
  o.weight_decay = 0.0f;
  const t_adam_hyper h = hyper_of(&o);
  pstar_engine *e = t_create(&o);
  const int64_t full[1] = {128};
  const int64_t none[2] = {4, 0};
  uint32_t f = 0, z = 0, s = 0;
  T_OK(pstar_param_register(e, "full", 1, full, 0, &f)); /* fills its chunk exactly */
  T_OK(pstar_param_register(e, "empty", 2, none, 0, &z));
  T_OK(pstar_param_register(e, "scale", 0, NULL, 0, &s));
  T_OK(pstar_engine_build(e));
  const float one = 2.0f;
  T_OK(pstar_param_write(e, s, &one, 1, PSTAR_DTYPE_F32));
  T_OK(pstar_param_write(e, z, NULL, 0, PSTAR_DTYPE_F32));
  float got = 0.0f;
  T_OK(pstar_param_read(e, z, NULL, 0, PSTAR_DTYPE_F32));

  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  fwd(e, f);
  fwd(e, z);
  fwd(e, s);
  t_acquire(e, s, PSTAR_STAGE_BACKWARD);
  const float gs = 0.25f;
  T_OK(pstar_grad_write(e, s, &gs, 1, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, s, NULL));
  void *pz = NULL;
  T_OK(pstar_param_acquire(e, z, PSTAR_STAGE_BACKWARD, NULL, &pz));
  T_OK(pstar_grad_write(e, z, NULL, 0, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  float *slot = NULL;
  T_OK(pstar_grad_slot_acquire(e, z, NULL, &slot));
  T_OK(pstar_param_release(e, z, NULL));
  const pstar_step_result r = do_step(e);
  cr_assert_eq(r.params_updated, 2);
  cr_assert_eq(r.grad_norm, 0.25);

  ref_param rs = ref_new(&one, 1, 1);
  ref_step(&rs, &h, 1, 1.0, &gs);
  ref_check(e, s, &rs, "scale");
  ref_free(&rs);
  T_OK(pstar_param_read(e, s, &got, 1, PSTAR_DTYPE_F32));
  cr_assert_lt(got, 2.0f);
  T_OK(pstar_engine_destroy(e));
}

Test(overflow, f32_inf_gradient_skips_too) {
  enum { N = 16 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float iw[N], g[N], got[N];
  t_fill(iw, N, 1, 1.0f);
  t_fill(g, N, 2, 1.0f);
  t_write_f32(e, w, iw, N);
  g[3] = -INFINITY;
  const pstar_step_result r = iterate_once(e, w, g, N);
  cr_assert_eq(r.skipped, 1);
  cr_assert_eq(r.step, 0);
  cr_assert_eq(r.next_loss_scale, 1.0f);
  t_read_f32(e, w, got, N);
  cr_assert_eq(memcmp(got, iw, sizeof got), 0);
  T_OK(pstar_engine_destroy(e));
}

Test(overflow, f16_hysteresis_counts_overflows_since_the_last_change) {
  enum { N = 16 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
  o.loss_scale_initial = 4096.0f;
  o.loss_scale_hysteresis = 2;
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float g[N], bad[N];
  t_fill(g, N, 1, 1.0f);
  t_fill(bad, N, 2, 1.0f);
  bad[0] = NAN;
  /* overflow, clean, overflow: two overflows since the last change. */
  cr_assert_eq(iterate_once(e, w, bad, N).next_loss_scale, 4096.0f);
  cr_assert_eq(iterate_once(e, w, g, N).next_loss_scale, 4096.0f);
  cr_assert_eq(iterate_once(e, w, bad, N).next_loss_scale, 2048.0f);
  /* The count starts again after a back-off. */
  cr_assert_eq(iterate_once(e, w, bad, N).next_loss_scale, 2048.0f);
  cr_assert_eq(iterate_once(e, w, bad, N).next_loss_scale, 1024.0f);
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), 1.0);
  const pstar_stats s = t_stats(e);
  cr_assert_eq(s.skipped_steps, 4);
  cr_assert_eq(s.steps, 1);
  T_OK(pstar_engine_destroy(e));
}
