/* Handles, registration, lookup, values (write/read) and statistics. */
#include <stddef.h>

#include "capi_test_util.h"

/* ------------------------------------------------------------------------ */
/* Handles                                                                   */
/* ------------------------------------------------------------------------ */

/* Calls every function that takes an engine and expects `expected` with a
 * message that mentions the handle.  Output pointers must stay untouched. */
static void expect_every_call(pstar_engine *e, pstar_status expected) {
  int64_t shape[1] = {4};
  float buf[4] = {1, 2, 3, 4};
  uint32_t id = 77;
  uint64_t n = 77;
  void *p = (void *)(uintptr_t)0x77;
  float *fp = (float *)(uintptr_t)0x77;
  double d = 77.0;
  pstar_stats st;
  pstar_step_result r;
  T_OK(pstar_stats_init(&st));
  T_OK(pstar_step_result_init(&r));

  T_FAIL(pstar_param_register(e, "w", 1, shape, 0, &id), expected, "handle");
  T_FAIL(pstar_engine_build(e), expected, "handle");
  T_FAIL(pstar_param_find(e, "w", &id), expected, "handle");
  T_FAIL(pstar_param_count(e, &id), expected, "handle");
  T_FAIL(pstar_param_numel(e, 0, &n), expected, "handle");
  T_FAIL(pstar_param_write(e, 0, buf, 4, PSTAR_DTYPE_F32), expected, "handle");
  T_FAIL(pstar_param_read(e, 0, buf, 4, PSTAR_DTYPE_F32), expected, "handle");
  T_FAIL(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN), expected, "handle");
  T_FAIL(pstar_iteration_end(e), expected, "handle");
  T_FAIL(pstar_engine_compute_stream(e, &p), expected, "handle");
  T_FAIL(pstar_param_acquire(e, 0, PSTAR_STAGE_FORWARD, NULL, &p), expected, "handle");
  T_FAIL(pstar_param_release(e, 0, NULL), expected, "handle");
  T_FAIL(pstar_grad_write(e, 0, buf, 4, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), expected, "handle");
  T_FAIL(pstar_grad_slot_acquire(e, 0, NULL, &fp), expected, "handle");
  T_FAIL(pstar_nonmodel_report(e, 0), expected, "handle");
  T_FAIL(pstar_step(e, &r), expected, "handle");
  T_FAIL(pstar_step(e, NULL), expected, "handle");
  T_FAIL(pstar_hparam_set(e, PSTAR_HPARAM_LR, 0.1), expected, "handle");
  T_FAIL(pstar_hparam_get(e, PSTAR_HPARAM_LR, &d), expected, "handle");
  T_FAIL(pstar_engine_get_stats(e, &st), expected, "handle");
  /* The handle is checked before the out-pointers. */
  T_FAIL(pstar_param_count(e, NULL), expected, "handle");
  T_FAIL(pstar_param_acquire(e, 0, PSTAR_STAGE_FORWARD, NULL, NULL), expected, "handle");

  cr_assert_eq(id, 77);
  cr_assert_eq(n, 77);
  cr_assert_eq((uintptr_t)p, (uintptr_t)0x77);
  cr_assert_eq((uintptr_t)fp, (uintptr_t)0x77);
  cr_assert_eq(d, 77.0);
  cr_assert_eq(st.steps, 0);
  cr_assert_eq(r.step, 0);
}

Test(handles, null_engine_is_an_invalid_handle_everywhere) {
  expect_every_call(NULL, PSTAR_ERR_INVALID_HANDLE);
}

Test(handles, destroy_null_is_ok) {
  T_OK(pstar_engine_destroy(NULL));
  T_OK(pstar_engine_destroy(NULL));
}

Test(handles, destroyed_engine_is_an_invalid_handle) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  t_register(e, "w", 300, 0);
  T_OK(pstar_engine_build(e));
  T_OK(pstar_engine_destroy(e));
  /* No engine is created from here on, so the address cannot be reused. */
  expect_every_call(e, PSTAR_ERR_INVALID_HANDLE);
  T_FAIL(pstar_engine_destroy(e), PSTAR_ERR_INVALID_HANDLE, "destroyed");
}

Test(handles, forged_handle_is_an_invalid_handle) {
  /* Never dereferenced: the registry is checked first. */
  static char not_an_engine[64];
  expect_every_call((pstar_engine *)(void *)not_an_engine, PSTAR_ERR_INVALID_HANDLE);
  T_FAIL(pstar_engine_destroy((pstar_engine *)(void *)not_an_engine), PSTAR_ERR_INVALID_HANDLE, "live");
}

Test(handles, engines_are_independent) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  pstar_engine *a = t_create(&o);
  pstar_engine *b = t_create(&o);
  cr_assert_neq((uintptr_t)a, (uintptr_t)b);
  t_register(a, "x", 10, 0);
  t_register(b, "y", 20, 0);
  t_register(b, "z", 30, 0);
  T_OK(pstar_engine_destroy(a));
  uint32_t count = 0;
  T_OK(pstar_param_count(b, &count));
  cr_assert_eq(count, 2);
  T_OK(pstar_engine_build(b));
  T_STATUS(pstar_param_count(a, &count), PSTAR_ERR_INVALID_HANDLE);
  T_OK(pstar_engine_destroy(b));
}

Test(handles, destroy_in_the_middle_of_an_iteration) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  o.strict = 1;
  o.strict_seed = 3;
  o.device_capacity_bytes = 4096;
  pstar_engine *e = t_create(&o);
  const uint32_t a = t_register(e, "a", 1024, 0);
  const uint32_t b = t_register(e, "b", 512, 0);
  T_OK(pstar_engine_build(e));
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  t_acquire(e, a, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, a, NULL));
  t_acquire(e, b, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, b, NULL));
  t_acquire(e, b, PSTAR_STAGE_BACKWARD); /* gradient buffer outstanding */
  T_OK(pstar_engine_destroy(e));
}

Test(handles, null_out_pointers_are_invalid_arguments) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  pstar_engine *e = t_create(&o);
  int64_t shape[1] = {8};
  T_FAIL(pstar_param_register(e, "w", 1, shape, 0, NULL), PSTAR_ERR_INVALID_ARGUMENT, "out_id");
  uint32_t count = 99;
  T_OK(pstar_param_count(e, &count));
  cr_assert_eq(count, 0, "a failed register added a parameter");
  const uint32_t w = t_register(e, "w", 8, 0);
  T_OK(pstar_engine_build(e));
  T_FAIL(pstar_param_find(e, "w", NULL), PSTAR_ERR_INVALID_ARGUMENT, "out_id");
  T_FAIL(pstar_param_count(e, NULL), PSTAR_ERR_INVALID_ARGUMENT, "out_count");
  T_FAIL(pstar_param_numel(e, w, NULL), PSTAR_ERR_INVALID_ARGUMENT, "out_numel");
  T_FAIL(pstar_engine_compute_stream(e, NULL), PSTAR_ERR_INVALID_ARGUMENT, "out_stream");
  T_FAIL(pstar_hparam_get(e, PSTAR_HPARAM_LR, NULL), PSTAR_ERR_INVALID_ARGUMENT, "out_value");
  T_FAIL(pstar_engine_get_stats(e, NULL), PSTAR_ERR_INVALID_ARGUMENT, "stats");
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  T_FAIL(pstar_param_acquire(e, w, PSTAR_STAGE_FORWARD, NULL, NULL), PSTAR_ERR_INVALID_ARGUMENT, "out_ptr");
  /* The failed acquire did not acquire: a release is illegal, an acquire works. */
  T_STATUS(pstar_param_release(e, w, NULL), PSTAR_ERR_INVALID_STATE);
  t_acquire(e, w, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, w, NULL));
  t_acquire(e, w, PSTAR_STAGE_BACKWARD);
  T_FAIL(pstar_grad_slot_acquire(e, w, NULL, NULL), PSTAR_ERR_INVALID_ARGUMENT, "out_ptr");
  T_OK(pstar_param_release(e, w, NULL));
  T_OK(pstar_step(e, NULL)); /* result may be NULL */
  T_OK(pstar_engine_destroy(e));
}

Test(handles, compute_stream_is_accepted_and_foreign_streams_rejected) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", 8, 0);
  T_OK(pstar_engine_build(e));
  void *stream = NULL;
  T_OK(pstar_engine_compute_stream(e, &stream));
  cr_assert_not_null(stream, "the emulated device has a compute stream");
  static char foreign[16];
  void *p = NULL;
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  T_FAIL(pstar_param_acquire(e, w, PSTAR_STAGE_FORWARD, foreign, &p), PSTAR_ERR_INVALID_ARGUMENT, "stream");
  cr_assert_null(p);
  T_OK(pstar_param_acquire(e, w, PSTAR_STAGE_FORWARD, stream, &p));
  cr_assert_not_null(p);
  T_FAIL(pstar_param_release(e, w, foreign), PSTAR_ERR_INVALID_ARGUMENT, "stream");
  T_OK(pstar_param_release(e, w, stream));
  T_OK(pstar_param_acquire(e, w, PSTAR_STAGE_BACKWARD, stream, &p));
  float g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  T_FAIL(pstar_grad_write(e, w, g, 8, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, foreign), PSTAR_ERR_INVALID_ARGUMENT,
         "stream");
  float *slot = NULL;
  T_FAIL(pstar_grad_slot_acquire(e, w, foreign, &slot), PSTAR_ERR_INVALID_ARGUMENT, "stream");
  T_OK(pstar_grad_write(e, w, g, 8, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, stream));
  T_OK(pstar_param_release(e, w, stream));
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(e, &r));
  cr_assert_eq(r.params_updated, 1);
  /* The gradient was counted once: its norm is sqrt(8). */
  cr_assert_float_eq(r.grad_norm, sqrt(8.0), 1e-12);
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Registration                                                              */
/* ------------------------------------------------------------------------ */

Test(registration, ids_lookup_count_and_numel) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  const int64_t s2[2] = {3, 5};
  const int64_t s4[4] = {2, 3, 4, 5};
  const int64_t s0[1] = {0};
  uint32_t id_matrix = 99, id_scalar = 99, id_t4 = 99, id_empty = 99;
  T_OK(pstar_param_register(e, "layer.weight", 2, s2, PSTAR_PARAM_DEFAULT, &id_matrix));
  T_OK(pstar_param_register(e, "layer.scale", 0, NULL, PSTAR_PARAM_NO_WEIGHT_DECAY, &id_scalar));
  T_OK(pstar_param_register(e, "t4", 4, s4, PSTAR_PARAM_FROZEN | PSTAR_PARAM_NO_WEIGHT_DECAY, &id_t4));
  T_OK(pstar_param_register(e, "empty", 1, s0, 0, &id_empty));
  cr_assert_eq(id_matrix, 0);
  cr_assert_eq(id_scalar, 1);
  cr_assert_eq(id_t4, 2);
  cr_assert_eq(id_empty, 3);

  uint32_t count = 0;
  T_OK(pstar_param_count(e, &count));
  cr_assert_eq(count, 4);
  uint64_t n = 0;
  T_OK(pstar_param_numel(e, id_matrix, &n));
  cr_assert_eq(n, 15);
  T_OK(pstar_param_numel(e, id_scalar, &n));
  cr_assert_eq(n, 1, "ndim 0 is a scalar");
  T_OK(pstar_param_numel(e, id_t4, &n));
  cr_assert_eq(n, 120);
  T_OK(pstar_param_numel(e, id_empty, &n));
  cr_assert_eq(n, 0);

  uint32_t found = 99;
  T_OK(pstar_param_find(e, "layer.scale", &found));
  cr_assert_eq(found, id_scalar);
  T_OK(pstar_param_find(e, "t4", &found));
  cr_assert_eq(found, id_t4);
  found = 99;
  T_FAIL(pstar_param_find(e, "layer", &found), PSTAR_ERR_NOT_FOUND, "layer");
  T_FAIL(pstar_param_find(e, "no.such.param", &found), PSTAR_ERR_NOT_FOUND, "no.such.param");
  cr_assert_eq(found, 99, "out_id written on failure");
  T_FAIL(pstar_param_find(e, NULL, &found), PSTAR_ERR_INVALID_ARGUMENT, "name");

  /* Lookups work after build too. */
  T_OK(pstar_engine_build(e));
  T_OK(pstar_param_find(e, "layer.weight", &found));
  cr_assert_eq(found, id_matrix);
  T_OK(pstar_param_count(e, &count));
  cr_assert_eq(count, 4);
  T_OK(pstar_engine_destroy(e));
}

Test(registration, invalid_registrations_change_nothing) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  const int64_t ok_shape[2] = {4, 4};
  uint32_t id = 99;
  T_OK(pstar_param_register(e, "w", 2, ok_shape, 0, &id));
  cr_assert_eq(id, 0);

  id = 99;
  T_FAIL(pstar_param_register(e, "w", 2, ok_shape, 0, &id), PSTAR_ERR_INVALID_ARGUMENT, "'w'");
  T_FAIL(pstar_param_register(e, "", 2, ok_shape, 0, &id), PSTAR_ERR_INVALID_ARGUMENT, "name");
  T_FAIL(pstar_param_register(e, NULL, 2, ok_shape, 0, &id), PSTAR_ERR_INVALID_ARGUMENT, "name");
  const int64_t neg[3] = {4, -1, 2};
  T_FAIL(pstar_param_register(e, "neg", 3, neg, 0, &id), PSTAR_ERR_INVALID_ARGUMENT, "negative");
  T_FAIL(pstar_param_register(e, "flags", 2, ok_shape, 1u << 2, &id), PSTAR_ERR_INVALID_ARGUMENT, "flag");
  T_FAIL(pstar_param_register(e, "flags2", 2, ok_shape, 0x80000000u | PSTAR_PARAM_FROZEN, &id),
         PSTAR_ERR_INVALID_ARGUMENT, "flag");
  int64_t many[17];
  for (int i = 0; i < 17; ++i) many[i] = 1;
  T_FAIL(pstar_param_register(e, "ndim17", 17, many, 0, &id), PSTAR_ERR_INVALID_ARGUMENT, "ndim");
  T_FAIL(pstar_param_register(e, "noshape", 2, NULL, 0, &id), PSTAR_ERR_INVALID_ARGUMENT, "shape");
  const int64_t huge[2] = {(int64_t)1 << 30, (int64_t)1 << 30};
  T_FAIL(pstar_param_register(e, "huge", 2, huge, 0, &id), PSTAR_ERR_INVALID_ARGUMENT, "huge");
  cr_assert_eq(id, 99, "out_id written on failure");

  /* None of them was registered: the count is 1 and the names are free. */
  uint32_t count = 0;
  T_OK(pstar_param_count(e, &count));
  cr_assert_eq(count, 1);
  uint32_t found = 99;
  T_STATUS(pstar_param_find(e, "neg", &found), PSTAR_ERR_NOT_FOUND);
  T_STATUS(pstar_param_find(e, "ndim17", &found), PSTAR_ERR_NOT_FOUND);

  /* 16 dimensions is the limit, and is fine. */
  T_OK(pstar_param_register(e, "ndim16", 16, many, 0, &id));
  cr_assert_eq(id, 1, "ids are dense: failed registrations consumed none");
  /* Names rejected above can now be used. */
  T_OK(pstar_param_register(e, "neg", 2, ok_shape, 0, &id));
  cr_assert_eq(id, 2);
  T_OK(pstar_engine_destroy(e));
}

Test(registration, register_after_build_and_build_twice) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  t_register(e, "a", 100, 0);
  T_OK(pstar_engine_build(e));
  int64_t shape[1] = {10};
  uint32_t id = 99;
  T_FAIL(pstar_param_register(e, "b", 1, shape, 0, &id), PSTAR_ERR_INVALID_STATE, "build");
  cr_assert_eq(id, 99);
  T_FAIL(pstar_engine_build(e), PSTAR_ERR_INVALID_STATE, "built");
  uint32_t count = 0;
  T_OK(pstar_param_count(e, &count));
  cr_assert_eq(count, 1);
  T_OK(pstar_engine_destroy(e));
}

Test(registration, build_with_no_parameters) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  T_OK(pstar_engine_build(e));
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(e, &r));
  cr_assert_eq(r.params_updated, 0);
  cr_assert_eq(r.skipped, 0);
  T_OK(pstar_engine_destroy(e));
}

Test(registration, calls_before_build_are_invalid_state) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t a = t_register(e, "a", 4, 0);
  float v[4] = {0};
  void *p = NULL;
  T_FAIL(pstar_param_write(e, a, v, 4, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_STATE, "build");
  T_FAIL(pstar_param_read(e, a, v, 4, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_STATE, "build");
  T_FAIL(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_STATE, "build");
  T_FAIL(pstar_param_acquire(e, a, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_INVALID_STATE, "build");
  T_FAIL(pstar_param_release(e, a, NULL), PSTAR_ERR_INVALID_STATE, "build");
  T_FAIL(pstar_step(e, NULL), PSTAR_ERR_INVALID_STATE, "build");
  T_FAIL(pstar_iteration_end(e), PSTAR_ERR_INVALID_STATE, "build");
  /* Numel works before build. */
  uint64_t n = 0;
  T_OK(pstar_param_numel(e, a, &n));
  cr_assert_eq(n, 4);
  T_OK(pstar_engine_destroy(e));
}

Test(registration, unknown_ids_are_not_found) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t a = t_register(e, "a", 4, 0);
  uint64_t n = 7;
  T_FAIL(pstar_param_numel(e, 1, &n), PSTAR_ERR_NOT_FOUND, "id 1");
  T_OK(pstar_engine_build(e));
  float v[4] = {0};
  void *p = (void *)(uintptr_t)0x1;
  float *fp = (float *)(uintptr_t)0x1;
  const uint32_t bad[] = {1, 2, 1000, UINT32_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    const uint32_t id = bad[i];
    T_FAIL(pstar_param_numel(e, id, &n), PSTAR_ERR_NOT_FOUND, "id");
    T_FAIL(pstar_param_write(e, id, v, 4, PSTAR_DTYPE_F32), PSTAR_ERR_NOT_FOUND, "id");
    T_FAIL(pstar_param_read(e, id, v, 4, PSTAR_DTYPE_F32), PSTAR_ERR_NOT_FOUND, "id");
    T_FAIL(pstar_param_acquire(e, id, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_NOT_FOUND, "id");
    T_FAIL(pstar_param_release(e, id, NULL), PSTAR_ERR_NOT_FOUND, "id");
  }
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    const uint32_t id = bad[i];
    T_FAIL(pstar_param_acquire(e, id, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_NOT_FOUND, "id");
    T_FAIL(pstar_param_acquire(e, id, PSTAR_STAGE_BACKWARD, NULL, &p), PSTAR_ERR_NOT_FOUND, "id");
    T_FAIL(pstar_param_release(e, id, NULL), PSTAR_ERR_NOT_FOUND, "id");
    T_FAIL(pstar_grad_write(e, id, v, 4, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), PSTAR_ERR_NOT_FOUND, "id");
    T_FAIL(pstar_grad_slot_acquire(e, id, NULL, &fp), PSTAR_ERR_NOT_FOUND, "id");
  }
  cr_assert_eq(n, 7, "out_numel written on failure");
  cr_assert_eq((uintptr_t)p, (uintptr_t)0x1);
  cr_assert_eq((uintptr_t)fp, (uintptr_t)0x1);
  /* The real parameter still works. */
  t_acquire(e, a, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, a, NULL));
  T_OK(pstar_step(e, NULL));
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Values: write and read                                                    */
/* ------------------------------------------------------------------------ */

static void roundtrip_for(pstar_dtype compute) {
  enum { N = 300, NF = 200 };
  pstar_engine_options o = t_options(compute, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  const uint32_t f = t_register(e, "frozen", NF, PSTAR_PARAM_FROZEN);
  T_OK(pstar_engine_build(e));

  /* Freshly built parameters are zero. */
  float *got = t_alloc_f(N);
  for (int i = 0; i < N; ++i) got[i] = 1.0f;
  t_read_f32(e, w, got, N);
  for (int i = 0; i < N; ++i) cr_assert_eq(got[i], 0.0f);

  float *val = t_alloc_f(N);
  float *fval = t_alloc_f(NF);
  t_fill(val, N, 1, 2.0f);
  t_fill(fval, NF, 2, 2.0f);
  t_write_f32(e, w, val, N);
  t_write_f32(e, f, fval, NF);

  /* Trainable: the fp32 master, exactly. */
  t_read_f32(e, w, got, N);
  cr_assert_eq(memcmp(got, val, N * sizeof(float)), 0, "trainable read differs from the written fp32 values");

  /* Frozen: kept in the compute dtype only, so read gives the rounded value. */
  float *fgot = t_alloc_f(NF);
  t_read_f32(e, f, fgot, NF);
  int differs = 0;
  for (int i = 0; i < NF; ++i) {
    const float r = t_round(compute, fval[i]);
    cr_assert_eq(t_f32_bits(fgot[i]), t_f32_bits(r), "frozen[%d]: read %a, expected %a (written %a)", i,
                 (double)fgot[i], (double)r, (double)fval[i]);
    differs |= fgot[i] != fval[i];
  }
  cr_assert_eq(differs != 0, compute != PSTAR_DTYPE_F32, "rounding to the compute dtype was not observable");

  /* Read converted to 16-bit dtypes: the master rounded. */
  uint16_t *h = (uint16_t *)calloc(N, sizeof(uint16_t));
  T_OK(pstar_param_read(e, w, h, N, PSTAR_DTYPE_BF16));
  for (int i = 0; i < N; ++i) cr_assert_eq(h[i], t_f32_to_bf16(val[i]), "bf16 read [%d]", i);
  T_OK(pstar_param_read(e, w, h, N, PSTAR_DTYPE_F16));
  for (int i = 0; i < N; ++i) cr_assert_eq(h[i], t_f32_to_f16(val[i]), "f16 read [%d]", i);

  /* What the model computes with: the compute-dtype copy of the master. */
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  const void *pw = t_acquire(e, w, PSTAR_STAGE_FORWARD);
  for (int i = 0; i < N; ++i) {
    cr_assert_eq(t_f32_bits(t_load(pw, compute, i)), t_f32_bits(t_round(compute, val[i])), "acquired w[%d]", i);
  }
  T_OK(pstar_param_release(e, w, NULL));
  const void *pf = t_acquire(e, f, PSTAR_STAGE_FORWARD);
  for (int i = 0; i < NF; ++i) {
    cr_assert_eq(t_f32_bits(t_load(pf, compute, i)), t_f32_bits(t_round(compute, fval[i])), "acquired f[%d]", i);
  }
  T_OK(pstar_param_release(e, f, NULL));
  T_OK(pstar_iteration_end(e));

  /* Writing from a 16-bit source: the master takes the exact widened values. */
  for (int i = 0; i < N; ++i) h[i] = t_f32_to_bf16(val[N - 1 - i]);
  T_OK(pstar_param_write(e, w, h, N, PSTAR_DTYPE_BF16));
  t_read_f32(e, w, got, N);
  for (int i = 0; i < N; ++i) cr_assert_eq(got[i], t_bf16_to_f32(h[i]));
  for (int i = 0; i < N; ++i) h[i] = t_f32_to_f16(val[i] * 0.5f);
  T_OK(pstar_param_write(e, w, h, N, PSTAR_DTYPE_F16));
  t_read_f32(e, w, got, N);
  for (int i = 0; i < N; ++i) cr_assert_eq(got[i], t_f16_to_f32(h[i]));

  /* A chunk resident on the device after an iteration reads the same. */
  t_write_f32(e, w, val, N);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  t_acquire(e, w, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, w, NULL));
  T_OK(pstar_iteration_end(e));
  t_read_f32(e, w, got, N);
  cr_assert_eq(memcmp(got, val, N * sizeof(float)), 0);

  free(h);
  free(got);
  free(fgot);
  free(val);
  free(fval);
  T_OK(pstar_engine_destroy(e));
}

Test(values, roundtrip_f32) { roundtrip_for(PSTAR_DTYPE_F32); }
Test(values, roundtrip_f16) { roundtrip_for(PSTAR_DTYPE_F16); }
Test(values, roundtrip_bf16) { roundtrip_for(PSTAR_DTYPE_BF16); }

Test(values, bad_writes_and_reads_change_nothing) {
  enum { N = 64 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  T_OK(pstar_engine_build(e));
  float val[N], other[N], got[N];
  t_fill(val, N, 5, 1.0f);
  t_fill(other, N, 6, 1.0f);
  t_write_f32(e, w, val, N);

  T_FAIL(pstar_param_write(e, w, other, N - 1, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_ARGUMENT, "count");
  T_FAIL(pstar_param_write(e, w, other, N + 1, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_ARGUMENT, "count");
  T_FAIL(pstar_param_write(e, w, other, 0, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_ARGUMENT, "count");
  T_FAIL(pstar_param_write(e, w, NULL, N, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_ARGUMENT, "NULL");
  T_FAIL(pstar_param_write(e, w, other, N, (pstar_dtype)3), PSTAR_ERR_INVALID_ARGUMENT, "dtype");
  T_FAIL(pstar_param_read(e, w, got, N - 1, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_ARGUMENT, "count");
  T_FAIL(pstar_param_read(e, w, NULL, N, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_ARGUMENT, "NULL");
  T_FAIL(pstar_param_read(e, w, got, N, (pstar_dtype)-1), PSTAR_ERR_INVALID_ARGUMENT, "dtype");

  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  T_FAIL(pstar_param_write(e, w, other, N, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_STATE, "iteration");
  T_FAIL(pstar_param_read(e, w, got, N, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_STATE, "iteration");
  T_OK(pstar_iteration_end(e));
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  T_FAIL(pstar_param_write(e, w, other, N, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_STATE, "iteration");
  T_FAIL(pstar_param_read(e, w, got, N, PSTAR_DTYPE_F32), PSTAR_ERR_INVALID_STATE, "iteration");
  T_OK(pstar_step(e, NULL));

  t_read_f32(e, w, got, N);
  cr_assert_eq(memcmp(got, val, sizeof got), 0, "a failed write changed the values");
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Statistics                                                                */
/* ------------------------------------------------------------------------ */

Test(stats, struct_version_and_size_are_checked) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);
  pstar_stats s;
  T_OK(pstar_stats_init(&s));
  s.version = 0;
  T_FAIL(pstar_engine_get_stats(e, &s), PSTAR_ERR_VERSION, "stats");
  s.version = PSTAR_STATS_VERSION + 1;
  T_FAIL(pstar_engine_get_stats(e, &s), PSTAR_ERR_VERSION, "stats");
  T_OK(pstar_stats_init(&s));
  s.size = (uint32_t)sizeof(pstar_stats) - 8;
  T_FAIL(pstar_engine_get_stats(e, &s), PSTAR_ERR_VERSION, "stats");
  s.size = 0;
  T_FAIL(pstar_engine_get_stats(e, &s), PSTAR_ERR_VERSION, "stats");

  /* A caller built against version 1: only the version-1 fields are written. */
  {
    pstar_stats v1;
    memset(&v1, 0xCD, sizeof v1);
    v1.version = 1;
    v1.size = (uint32_t)offsetof(pstar_stats, trace_fallbacks);
    T_OK(pstar_engine_get_stats(e, &v1));
    cr_assert_eq(v1.version, 1u);
    cr_assert_eq(v1.compute_chunks, 0u);
    cr_assert_eq(v1.trace_fallbacks, 0xCDCDCDCDCDCDCDCDull, "a field beyond a version-1 struct was written");
    v1.size -= 8;
    T_FAIL(pstar_engine_get_stats(e, &v1), PSTAR_ERR_VERSION, "stats");
  }

  /* A caller with a larger struct: accepted when the bytes the library does
   * not know are zero (the versioned-struct rule of pstar.h); the known
   * part is filled, the rest is left alone.  A nonzero tail is refused and
   * nothing is written (test_structs.c walks every struct). */
  struct {
    pstar_stats s;
    unsigned char tail[32];
  } big;
  memset(&big, 0, sizeof big);
  T_OK(pstar_stats_init(&big.s));
  big.s.size = (uint32_t)sizeof big;
  T_OK(pstar_engine_get_stats(e, &big.s));
  cr_assert_eq(big.s.size, sizeof big);
  cr_assert_eq(big.s.version, PSTAR_STATS_VERSION);
  cr_assert_eq(big.s.steps, 0);
  for (size_t i = 0; i < sizeof big.tail; ++i) cr_assert_eq(big.tail[i], 0, "tail byte %zu written", i);
  memset(big.tail, 0xCD, sizeof big.tail);
  big.s.steps = 12345;
  T_FAIL(pstar_engine_get_stats(e, &big.s), PSTAR_ERR_VERSION, "not zero");
  cr_assert_eq(big.s.steps, 12345, "a refused struct was written");
  T_OK(pstar_engine_destroy(e));
}

Test(stats, step_result_version_is_checked_and_changes_nothing) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", 16, 0);
  T_OK(pstar_engine_build(e));
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  t_acquire(e, w, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, w, NULL));
  t_acquire(e, w, PSTAR_STAGE_BACKWARD);
  float g[16];
  t_fill(g, 16, 9, 1.0f);
  T_OK(pstar_grad_write(e, w, g, 16, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, w, NULL));
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  r.version = 0;
  T_FAIL(pstar_step(e, &r), PSTAR_ERR_VERSION, "result");
  T_OK(pstar_step_result_init(&r));
  r.size = 4;
  T_FAIL(pstar_step(e, &r), PSTAR_ERR_VERSION, "result");
  /* The iteration is still in progress and nothing stepped. */
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), 0.0);
  T_STATUS(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_STATE);
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(e, &r));
  cr_assert_eq(r.size, sizeof r);
  cr_assert_eq(r.version, PSTAR_STEP_RESULT_VERSION);
  cr_assert_eq(r.step, 1);
  cr_assert_eq(r.params_updated, 1);
  cr_assert_eq(r.skipped, 0);
  T_OK(pstar_engine_destroy(e));
}

Test(stats, chunk_counts_jumbo_and_fill_ratio) {
  /* chunk_elems 1024, BF16.  Trainable: a (600) + b (300) share chunk 0
   * (b at offset 640); c (1000) gets chunk 1; big (3000 > 1024) gets a jumbo
   * chunk of 3072.  Frozen: f (500) in a frozen chunk of its own. */
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  pstar_engine *e = t_create(&o);

  pstar_stats s = t_stats(e);
  cr_assert_eq(s.compute_chunks, 0, "an unbuilt engine has no chunks");
  cr_assert_eq(s.compute_list_bytes, 0);

  t_register(e, "a", 600, 0);
  t_register(e, "b", 300, 0);
  t_register(e, "f", 500, PSTAR_PARAM_FROZEN);
  t_register(e, "c", 1000, 0);
  t_register(e, "big", 3000, 0);
  T_OK(pstar_engine_build(e));
  s = t_stats(e);
  cr_assert_eq(s.size, sizeof s);
  cr_assert_eq(s.version, PSTAR_STATS_VERSION);
  cr_assert_eq(s.compute_chunks, 4, "compute_chunks %u", s.compute_chunks);
  cr_assert_eq(s.optimizer_chunks, 3, "optimizer_chunks %u (the frozen chunk has no optimizer state)",
               s.optimizer_chunks);
  cr_assert_eq(s.jumbo_chunks, 1);
  cr_assert_eq(s.compute_list_bytes, (uint64_t)(1024 + 1024 + 1024 + 3072) * 2);
  cr_assert_eq(s.optimizer_list_bytes, (uint64_t)(1024 + 1024 + 3072) * 4);
  const double fill = (600.0 + 300 + 500 + 1000 + 3000) / (1024.0 * 3 + 3072);
  cr_assert_float_eq(s.fill_ratio, fill, 1e-12);
  cr_assert_gt(s.fill_ratio, 0.0);
  cr_assert_leq(s.fill_ratio, 1.0);
  cr_assert_eq(s.steps, 0);
  cr_assert_eq(s.iterations, 0);
  cr_assert_eq(s.bytes_host_to_device, 0, "nothing moves at build");
  cr_assert_eq(s.device_bytes, 0);
  cr_assert_gt(s.host_bytes, 0);
  cr_assert_geq(s.peak_host_bytes, s.host_bytes);
  /* The host holds the compute list and the fp32 masters; Adam's moments
     come with each chunk's first update (no host capacity set). */
  cr_assert_geq(s.host_bytes, s.compute_list_bytes + s.optimizer_list_bytes);
  cr_assert_lt(s.host_bytes, s.compute_list_bytes + 3 * s.optimizer_list_bytes);
  T_OK(pstar_engine_destroy(e));
}

Test(stats, exact_fit_fill_ratio_is_one) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 256);
  pstar_engine *e = t_create(&o);
  t_register(e, "a", 128, 0);
  t_register(e, "b", 128, 0);
  t_register(e, "c", 256, 0);
  T_OK(pstar_engine_build(e));
  pstar_stats s = t_stats(e);
  cr_assert_eq(s.compute_chunks, 2);
  cr_assert_eq(s.jumbo_chunks, 0);
  cr_assert_eq(s.fill_ratio, 1.0);
  cr_assert_eq(s.compute_list_bytes, 512 * 4);
  T_OK(pstar_engine_destroy(e));
}

Test(stats, iterations_and_steps_are_counted) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", 16, 0);
  T_OK(pstar_engine_build(e));
  for (int it = 0; it < 3; ++it) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    t_acquire(e, w, PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, w, NULL));
    T_OK(pstar_step(e, NULL));
  }
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  T_OK(pstar_iteration_end(e));
  pstar_stats s = t_stats(e);
  cr_assert_eq(s.iterations, 4);
  cr_assert_eq(s.steps, 3);
  cr_assert_eq(s.skipped_steps, 0);
  cr_assert_eq(s.moves_to_device, 1, "an unlimited device keeps the chunk resident");
  cr_assert_eq(s.bytes_host_to_device, 1024 * 4);
  cr_assert_eq(s.evictions, 0);
  cr_assert_eq(s.device_bytes, 1024 * 4);
  cr_assert_eq(s.peak_device_bytes, 1024 * 4);
  T_OK(pstar_engine_destroy(e));
}

/* Rounding to the compute dtype at the edges: ties to even, fp16 subnormals
 * and overflow to inf, bf16 flushing fp32 subnormals to signed zero, signed
 * zeros and infinities.  Trainable parameters keep the exact fp32 bits. */
static void special_values_for(pstar_dtype compute) {
  const float v[] = {0.0f,
                     -0.0f,
                     1.0f,
                     -1.0f,
                     1.00390625f,     /* 1 + 2^-8: bf16 tie, to even (1) */
                     1.01171875f,     /* 1 + 3 * 2^-8: bf16 tie, to even (up) */
                     1.00048828125f,  /* 1 + 2^-11: fp16 tie, to even (1) */
                     1.00146484375f,  /* 1 + 3 * 2^-11: fp16 tie, to even (up) */
                     65504.0f,        /* fp16 max */
                     65519.99f,       /* rounds down to fp16 max */
                     65520.0f,        /* fp16 tie at the top: inf */
                     1.0e5f,          /* fp16 overflow */
                     -1.0e5f,
                     5.9604645e-8f,   /* fp16 smallest subnormal */
                     2.9802322e-8f,   /* half of it: tie, to even (0) */
                     3.0e-8f,         /* just above half: rounds up */
                     1.0e-6f,         /* fp16 subnormal */
                     1.0e-40f,        /* fp32 subnormal: bf16 gives +0 */
                     -1.0e-40f,       /* -0 */
                     3.4028235e38f,   /* FLT_MAX: bf16 rounds to inf */
                     3.3895314e38f,   /* bf16 max */
                     INFINITY,
                     -INFINITY,
                     0.1f,
                     -3.14159274f};
  enum { N = sizeof v / sizeof v[0] };
  pstar_engine_options o = t_options(compute, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t w = t_register(e, "w", N, 0);
  const uint32_t f = t_register(e, "f", N, PSTAR_PARAM_FROZEN);
  T_OK(pstar_engine_build(e));
  t_write_f32(e, w, v, N);
  t_write_f32(e, f, v, N);
  float got[N];
  t_read_f32(e, w, got, N);
  for (int i = 0; i < N; ++i) cr_assert_eq(t_f32_bits(got[i]), t_f32_bits(v[i]), "trainable [%d] = %a", i, (double)v[i]);
  t_read_f32(e, f, got, N);
  for (int i = 0; i < N; ++i) {
    const float want = t_round(compute, v[i]);
    cr_assert_eq(t_f32_bits(got[i]), t_f32_bits(want), "frozen [%d]: %a -> %a, expected %a", i, (double)v[i],
                 (double)got[i], (double)want);
  }
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  const void *pw = t_acquire(e, w, PSTAR_STAGE_FORWARD);
  for (int i = 0; i < N; ++i) {
    const float want = t_round(compute, v[i]);
    const float have = t_load(pw, compute, i);
    cr_assert_eq(t_f32_bits(have), t_f32_bits(want), "compute copy [%d]: %a -> %a, expected %a", i, (double)v[i],
                 (double)have, (double)want);
  }
  T_OK(pstar_param_release(e, w, NULL));
  T_OK(pstar_iteration_end(e));
  T_OK(pstar_engine_destroy(e));
}

Test(values, special_values_f16) { special_values_for(PSTAR_DTYPE_F16); }
Test(values, special_values_bf16) { special_values_for(PSTAR_DTYPE_BF16); }
Test(values, special_values_f32) { special_values_for(PSTAR_DTYPE_F32); }
