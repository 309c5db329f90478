/*
 * The device budget: out-of-memory when the acquired set does not fit,
 * eviction when it does, non-model memory, and the statistics of moves.
 */
#define PSTAR_EXPERIMENTAL_API 1
#include "capi_test_util.h"

enum { CHUNK = 1024 };

typedef struct budget_model {
  pstar_engine *e;
  pstar_dtype dtype;
  uint64_t chunk_bytes;
  uint32_t n;
  uint32_t ids[16];
  float *init[16];
} budget_model;

/* n parameters of CHUNK elements each: one chunk per parameter. */
static budget_model make_budget(pstar_dtype dtype, uint32_t n, uint64_t capacity) {
  budget_model m;
  memset(&m, 0, sizeof m);
  pstar_engine_options o = t_options(dtype, CHUNK);
  o.device_capacity_bytes = capacity;
  o.lr = 0.01f;
  m.e = t_create(&o);
  m.dtype = dtype;
  m.chunk_bytes = CHUNK * t_dtype_size(dtype);
  m.n = n;
  cr_assert_leq(n, 16);
  for (uint32_t i = 0; i < n; ++i) {
    char name[32];
    snprintf(name, sizeof name, "layer%u.weight", i);
    m.ids[i] = t_register(m.e, name, CHUNK, 0);
  }
  T_OK(pstar_engine_build(m.e));
  const pstar_stats s = t_stats(m.e);
  cr_assert_eq(s.compute_chunks, n);
  cr_assert_eq(s.compute_list_bytes, n * m.chunk_bytes);
  for (uint32_t i = 0; i < n; ++i) {
    m.init[i] = t_alloc_f(CHUNK);
    t_fill(m.init[i], CHUNK, 100 + i, 1.0f);
    t_write_f32(m.e, m.ids[i], m.init[i], CHUNK);
  }
  return m;
}

static void free_budget(budget_model *m) {
  for (uint32_t i = 0; i < m->n; ++i) free(m->init[i]);
  T_OK(pstar_engine_destroy(m->e));
}

static void fwd(pstar_engine *e, uint32_t id) {
  t_acquire(e, id, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, id, NULL));
}

/* The acquired pointer holds the parameter's values in the compute dtype. */
static void check_acquired(const budget_model *m, uint32_t i, const void *p) {
  for (int k = 0; k < CHUNK; ++k) {
    cr_assert_eq(t_f32_bits(t_load(p, m->dtype, k)), t_f32_bits(t_round(m->dtype, m->init[i][k])),
                 "param %u [%d] has wrong contents after moves", i, k);
  }
}

static void oom_third_chunk(pstar_dtype dtype, pstar_iteration_kind kind) {
  budget_model m = make_budget(dtype, 4, 2 * CHUNK * t_dtype_size(dtype));
  char cap[64];
  snprintf(cap, sizeof cap, "%llu", (unsigned long long)(2 * m.chunk_bytes));

  T_OK(pstar_iteration_begin(m.e, kind));
  const void *p0 = t_acquire(m.e, m.ids[0], PSTAR_STAGE_FORWARD);
  const void *p1 = t_acquire(m.e, m.ids[1], PSTAR_STAGE_FORWARD);
  check_acquired(&m, 0, p0);
  check_acquired(&m, 1, p1);
  void *p2 = (void *)(uintptr_t)0x9;
  T_FAIL(pstar_param_acquire(m.e, m.ids[2], PSTAR_STAGE_FORWARD, NULL, &p2), PSTAR_ERR_OUT_OF_MEMORY, "device");
  T_FAIL(pstar_param_acquire(m.e, m.ids[2], PSTAR_STAGE_FORWARD, NULL, &p2), PSTAR_ERR_OUT_OF_MEMORY, cap);
  cr_assert_eq((uintptr_t)p2, (uintptr_t)0x9, "out_ptr written on failure");
  /* The acquired data is intact and the engine still works. */
  check_acquired(&m, 0, p0);
  check_acquired(&m, 1, p1);
  T_OK(pstar_param_release(m.e, m.ids[0], NULL));
  p2 = t_acquire(m.e, m.ids[2], PSTAR_STAGE_FORWARD);
  check_acquired(&m, 2, p2);
  T_OK(pstar_param_release(m.e, m.ids[1], NULL));
  T_OK(pstar_param_release(m.e, m.ids[2], NULL));
  const void *p3 = t_acquire(m.e, m.ids[3], PSTAR_STAGE_FORWARD);
  check_acquired(&m, 3, p3);
  T_OK(pstar_param_release(m.e, m.ids[3], NULL));
  if (kind == PSTAR_ITERATION_EVAL) {
    T_OK(pstar_iteration_end(m.e));
  } else {
    /* ids 0..3 each had one forward use (the failed acquire did not count):
     * one backward use each makes a complete step. */
    for (int i = 3; i >= 0; --i) {
      if (dtype == PSTAR_DTYPE_F32) {
        /* chunk + fp32 gradient buffer = 2 chunks: fits alone. */
        t_acquire(m.e, m.ids[i], PSTAR_STAGE_BACKWARD);
        float g[CHUNK];
        t_fill(g, CHUNK, 7, 1.0f);
        T_OK(pstar_grad_write(m.e, m.ids[i], g, CHUNK, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
        T_OK(pstar_param_release(m.e, m.ids[i], NULL));
      }
    }
    if (dtype == PSTAR_DTYPE_F32) {
      pstar_step_result r;
      T_OK(pstar_step_result_init(&r));
      T_OK(pstar_step(m.e, &r));
      cr_assert_eq(r.params_updated, 4);
    } else {
      T_OK(pstar_step(m.e, NULL)); /* no backward uses: nothing to update */
    }
  }
  const pstar_stats s = t_stats(m.e);
  cr_assert_leq(s.peak_device_bytes, 2 * m.chunk_bytes);
  cr_assert_gt(s.evictions, 0);
  free_budget(&m);
}

Test(budget, third_chunk_is_out_of_memory_f32_eval) { oom_third_chunk(PSTAR_DTYPE_F32, PSTAR_ITERATION_EVAL); }
Test(budget, third_chunk_is_out_of_memory_f32_train) { oom_third_chunk(PSTAR_DTYPE_F32, PSTAR_ITERATION_TRAIN); }
Test(budget, third_chunk_is_out_of_memory_bf16_eval) { oom_third_chunk(PSTAR_DTYPE_BF16, PSTAR_ITERATION_EVAL); }
Test(budget, third_chunk_is_out_of_memory_bf16_train) { oom_third_chunk(PSTAR_DTYPE_BF16, PSTAR_ITERATION_TRAIN); }

/* Trains `iters` iterations: forward 0..n-1, backward n-1..0. */
static void train(budget_model *m, int iters) {
  for (int it = 0; it < iters; ++it) {
    T_OK(pstar_iteration_begin(m->e, PSTAR_ITERATION_TRAIN));
    for (uint32_t i = 0; i < m->n; ++i) {
      const void *p = t_acquire(m->e, m->ids[i], PSTAR_STAGE_FORWARD);
      if (it == 0) check_acquired(m, i, p);
      T_OK(pstar_param_release(m->e, m->ids[i], NULL));
    }
    for (uint32_t k = m->n; k-- > 0;) {
      const void *p = t_acquire(m->e, m->ids[k], PSTAR_STAGE_BACKWARD);
      float g[CHUNK];
      /* A gradient that depends on the weights the pointer shows. */
      for (int j = 0; j < CHUNK; ++j) g[j] = 0.5f * t_load(p, m->dtype, j) + 0.001f * (float)(j % 7) - 0.002f;
      T_OK(pstar_grad_write(m->e, m->ids[k], g, CHUNK, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      T_OK(pstar_param_release(m->e, m->ids[k], NULL));
    }
    pstar_step_result r;
    T_OK(pstar_step_result_init(&r));
    T_OK(pstar_step(m->e, &r));
    cr_assert_eq(r.params_updated, m->n);
    cr_assert_eq(r.skipped, 0);
  }
}

Test(budget, sequential_use_of_many_chunks_evicts_and_matches_unlimited) {
  enum { NP = 8, ITERS = 3 };
  budget_model big = make_budget(PSTAR_DTYPE_F32, NP, 0);
  budget_model small = make_budget(PSTAR_DTYPE_F32, NP, 2 * CHUNK * 4);
  train(&big, ITERS);
  train(&small, ITERS);

  for (uint32_t i = 0; i < NP; ++i) {
    float a[CHUNK], b[CHUNK];
    t_read_f32(big.e, big.ids[i], a, CHUNK);
    t_read_f32(small.e, small.ids[i], b, CHUNK);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "param %u differs between unlimited and 2-chunk budgets", i);
    cr_assert_neq(memcmp(a, big.init[i], sizeof a), 0, "param %u did not train", i);
  }
  const pstar_stats sb = t_stats(big.e), ss = t_stats(small.e);
  /* Unlimited: no eviction for room; each chunk goes to the host once per
   * step (the CPU optimizer updates it there) and comes back once per
   * iteration, as on a GPU.  With the synchronous step, from the first
   * traced iteration on, it comes back in the step itself (prefetch for the
   * next iteration), so the last step brings every chunk back once more;
   * the overlapped step (the default) brings a chunk back once its update
   * is done: right after it where the step's prefetch reserved room while
   * the update still ran (the update thread queues the copy), else in the
   * next iteration; so after the last step anywhere from none to every
   * chunk, by timing. */
  pstar_x_step_stats st;
  T_OK(pstar_x_step_stats_init(&st));
  T_OK(pstar_x_step_get_stats(big.e, &st));
  cr_assert_eq(sb.evictions, NP * ITERS, "unlimited: %llu evictions", (unsigned long long)sb.evictions);
  cr_assert_eq(sb.bytes_host_to_device % big.chunk_bytes, 0, "unlimited: %llu bytes in",
               (unsigned long long)sb.bytes_host_to_device);
  const uint64_t chunks_in = sb.bytes_host_to_device / big.chunk_bytes;
  cr_assert_leq(chunks_in, NP * ITERS + NP, "unlimited: %llu chunks in", (unsigned long long)chunks_in);
  cr_assert_geq(chunks_in, st.overlap ? NP * ITERS : NP * ITERS + NP, "unlimited: %llu chunks in (overlap %d)",
                (unsigned long long)chunks_in, st.overlap);
  cr_assert_eq(sb.bytes_device_to_host, NP * ITERS * big.chunk_bytes, "unlimited: %llu bytes out",
               (unsigned long long)sb.bytes_device_to_host);
  cr_assert_gt(ss.evictions, 0);
  cr_assert_gt(ss.bytes_device_to_host, 0);
  cr_assert_leq(ss.peak_device_bytes, 2 * small.chunk_bytes, "peak %llu over the capacity",
                (unsigned long long)ss.peak_device_bytes);
  cr_assert_leq(ss.device_bytes, 2 * small.chunk_bytes);
  /* Every iteration touches 8 chunks twice (forward then backward in reverse)
   * with room for at most 2 (or 1 beside a gradient buffer): at least 6
   * fetches in forward and 6 in backward per iteration. */
  cr_assert_geq(ss.bytes_host_to_device, (uint64_t)ITERS * 12 * small.chunk_bytes, "h2d %llu",
                (unsigned long long)ss.bytes_host_to_device);
  cr_assert_eq(ss.bytes_host_to_device, ss.moves_to_device * small.chunk_bytes);
  free_budget(&big);
  free_budget(&small);
}

Test(budget, bf16_eval_data_survives_eviction) {
  enum { NP = 8 };
  budget_model m = make_budget(PSTAR_DTYPE_BF16, NP, 2 * CHUNK * 2);
  for (int it = 0; it < 3; ++it) {
    T_OK(pstar_iteration_begin(m.e, PSTAR_ITERATION_EVAL));
    for (uint32_t i = 0; i < NP; ++i) {
      const uint32_t k = (it % 2) ? NP - 1 - i : i;
      const void *p = t_acquire(m.e, m.ids[k], PSTAR_STAGE_FORWARD);
      check_acquired(&m, k, p);
      T_OK(pstar_param_release(m.e, m.ids[k], NULL));
    }
    T_OK(pstar_iteration_end(m.e));
  }
  const pstar_stats s = t_stats(m.e);
  cr_assert_gt(s.evictions, 0);
  cr_assert_gt(s.bytes_host_to_device, 0);
  cr_assert_leq(s.peak_device_bytes, 2 * m.chunk_bytes);
  /* Values read back after all the moves are the written ones. */
  for (uint32_t i = 0; i < NP; ++i) {
    float a[CHUNK];
    t_read_f32(m.e, m.ids[i], a, CHUNK);
    cr_assert_eq(memcmp(a, m.init[i], sizeof a), 0);
  }
  free_budget(&m);
}

Test(budget, capacity_below_one_chunk) {
  budget_model m = make_budget(PSTAR_DTYPE_BF16, 2, CHUNK * 2 - 1);
  void *p = (void *)(uintptr_t)0x9;
  T_OK(pstar_iteration_begin(m.e, PSTAR_ITERATION_EVAL));
  T_FAIL(pstar_param_acquire(m.e, m.ids[0], PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_OUT_OF_MEMORY, "device");
  T_FAIL(pstar_param_acquire(m.e, m.ids[1], PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_OUT_OF_MEMORY, "2048");
  cr_assert_eq((uintptr_t)p, (uintptr_t)0x9);
  T_OK(pstar_iteration_end(m.e));
  const pstar_stats s = t_stats(m.e);
  cr_assert_eq(s.device_bytes, 0);
  cr_assert_eq(s.moves_to_device, 0);
  free_budget(&m);
}

Test(budget, gradient_buffer_counts_against_capacity) {
  /* F32: exactly one chunk of room.  Forward fits; backward has no room for
   * an fp32 gradient buffer of the chunk's size beside the chunk, so the
   * gradient accumulates on the host (tests/capi/test_floor.c checks the
   * bits) and the device holds the chunk alone. */
  budget_model m = make_budget(PSTAR_DTYPE_F32, 1, CHUNK * 4);
  T_OK(pstar_iteration_begin(m.e, PSTAR_ITERATION_TRAIN));
  fwd(m.e, m.ids[0]);
  t_acquire(m.e, m.ids[0], PSTAR_STAGE_BACKWARD);
  cr_assert_eq(t_stats(m.e).device_bytes, CHUNK * 4);
  float g[CHUNK];
  t_fill(g, CHUNK, 3, 1.0f);
  T_OK(pstar_grad_write(m.e, m.ids[0], g, CHUNK, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(m.e, m.ids[0], NULL));
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(m.e, &r));
  cr_assert_eq(r.params_updated, 1);
  cr_assert_eq(t_stats(m.e).peak_device_bytes, CHUNK * 4);
  free_budget(&m);

  /* With room for both, the peak is exactly chunk + gradient buffer. */
  m = make_budget(PSTAR_DTYPE_BF16, 1, 0);
  T_OK(pstar_iteration_begin(m.e, PSTAR_ITERATION_TRAIN));
  fwd(m.e, m.ids[0]);
  t_acquire(m.e, m.ids[0], PSTAR_STAGE_BACKWARD);
  pstar_stats s = t_stats(m.e);
  cr_assert_eq(s.device_bytes, CHUNK * 2 + CHUNK * 4, "device_bytes %llu", (unsigned long long)s.device_bytes);
  T_OK(pstar_param_release(m.e, m.ids[0], NULL));
  T_OK(pstar_step(m.e, NULL));
  s = t_stats(m.e);
  cr_assert_eq(s.peak_device_bytes, CHUNK * 2 + CHUNK * 4);
  free_budget(&m);
}

Test(budget, jumbo_parameter_needs_its_whole_chunk) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, CHUNK);
  o.device_capacity_bytes = 2 * CHUNK * 4;
  pstar_engine *e = t_create(&o);
  const uint32_t big = t_register(e, "embedding", 3000, 0);
  T_OK(pstar_engine_build(e));
  const pstar_stats s = t_stats(e);
  cr_assert_eq(s.jumbo_chunks, 1);
  cr_assert_eq(s.compute_list_bytes, 3072 * 4);
  void *p = NULL;
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  T_FAIL(pstar_param_acquire(e, big, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_OUT_OF_MEMORY, "12288");
  T_OK(pstar_iteration_end(e));
  T_OK(pstar_engine_destroy(e));
}

Test(nonmodel, report_reduces_room_and_is_replaced_by_the_next) {
  budget_model m = make_budget(PSTAR_DTYPE_F32, 3, 2 * CHUNK * 4);
  const uint64_t cb = m.chunk_bytes;
  T_OK(pstar_nonmodel_report(m.e, cb));
  pstar_stats s = t_stats(m.e);
  cr_assert_eq(s.device_bytes, cb);
  void *p = NULL;
  T_OK(pstar_iteration_begin(m.e, PSTAR_ITERATION_EVAL));
  t_acquire(m.e, m.ids[0], PSTAR_STAGE_FORWARD);
  T_FAIL(pstar_param_acquire(m.e, m.ids[1], PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_OUT_OF_MEMORY, "non-model");
  /* Activations freed: the next report replaces the previous one. */
  T_OK(pstar_nonmodel_report(m.e, 0));
  t_acquire(m.e, m.ids[1], PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(m.e, m.ids[0], NULL));
  T_OK(pstar_param_release(m.e, m.ids[1], NULL));
  T_OK(pstar_iteration_end(m.e));
  s = t_stats(m.e);
  cr_assert_eq(s.device_bytes, 2 * cb);
  cr_assert_leq(s.peak_device_bytes, 2 * cb);

  /* A report over what is free evicts the chunks that may move. */
  const uint64_t ev = s.evictions;
  T_OK(pstar_nonmodel_report(m.e, 2 * cb));
  s = t_stats(m.e);
  cr_assert_eq(s.evictions, ev + 2, "evictions %llu -> %llu", (unsigned long long)ev,
               (unsigned long long)s.evictions);
  cr_assert_eq(s.device_bytes, 2 * cb, "only the non-model bytes remain");
  cr_assert_leq(s.peak_device_bytes, 2 * cb, "the peak counted chunks that the report evicted");
  T_OK(pstar_iteration_begin(m.e, PSTAR_ITERATION_EVAL));
  T_FAIL(pstar_param_acquire(m.e, m.ids[2], PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_OUT_OF_MEMORY, "device");
  T_OK(pstar_nonmodel_report(m.e, 0));
  p = t_acquire(m.e, m.ids[2], PSTAR_STAGE_FORWARD);
  check_acquired(&m, 2, p);
  T_OK(pstar_param_release(m.e, m.ids[2], NULL));
  T_OK(pstar_iteration_end(m.e));

  T_FAIL(pstar_nonmodel_report(m.e, (uint64_t)1 << 62), PSTAR_ERR_INVALID_ARGUMENT, "nonmodel");
  s = t_stats(m.e);
  cr_assert_eq(s.device_bytes, cb, "a rejected report changed the accounting");
  free_budget(&m);
}

Test(nonmodel, report_before_build_is_accepted) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.device_capacity_bytes = 4 * CHUNK * 2;
  pstar_engine *e = t_create(&o);
  T_OK(pstar_nonmodel_report(e, 1000));
  const uint32_t w = t_register(e, "w", CHUNK, 0);
  T_OK(pstar_engine_build(e));
  pstar_stats s = t_stats(e);
  cr_assert_eq(s.device_bytes, 1000);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  fwd(e, w);
  T_OK(pstar_iteration_end(e));
  s = t_stats(e);
  cr_assert_eq(s.device_bytes, 1000 + CHUNK * 2);
  T_OK(pstar_engine_destroy(e));
}

Test(host, host_capacity_too_small_for_build) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.host_capacity_bytes = CHUNK * 2 + CHUNK * 4; /* compute chunk + master only */
  pstar_engine *e = t_create(&o);
  t_register(e, "w", CHUNK, 0);
  T_FAIL(pstar_engine_build(e), PSTAR_ERR_OUT_OF_MEMORY, "host");
  /* Still not built, still usable. */
  uint32_t count = 0;
  T_OK(pstar_param_count(e, &count));
  cr_assert_eq(count, 1);
  T_FAIL(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL), PSTAR_ERR_INVALID_STATE, "build");
  T_OK(pstar_engine_destroy(e));

  o.host_capacity_bytes = CHUNK * 2 + 3 * CHUNK * 4; /* exactly enough */
  e = t_create(&o);
  const uint32_t w = t_register(e, "w", CHUNK, 0);
  T_OK(pstar_engine_build(e));
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  fwd(e, w);
  T_OK(pstar_iteration_end(e));
  T_OK(pstar_engine_destroy(e));
}

/* Regression: a chunk fetched by a BACKWARD acquire that then found no
 * room for the gradient buffer must stay evictable.  (Found failing against
 * commit 74c2b72, where fetch() did not register the chunk with the LRU
 * policy, and the acquire failed with PSTAR_ERR_OUT_OF_MEMORY; fixed in
 * 7aebfc2.  Since the gradient accumulates on the host when its buffer has
 * no room, the acquire succeeds.) */
Test(budget, chunk_fetched_by_a_backward_acquire_without_room_stays_evictable) {
  budget_model m = make_budget(PSTAR_DTYPE_F32, 3, 2 * CHUNK * 4);
  const uint32_t A = m.ids[0], B = m.ids[1], C = m.ids[2];
  void *p = NULL;
  T_OK(pstar_iteration_begin(m.e, PSTAR_ITERATION_TRAIN));
  fwd(m.e, A);
  fwd(m.e, B);
  fwd(m.e, C); /* resident: B, C */
  t_acquire(m.e, B, PSTAR_STAGE_FORWARD);
  /* Fetches A (evicting C); no room for A's gradient buffer beside A and B. */
  p = t_acquire(m.e, A, PSTAR_STAGE_BACKWARD);
  check_acquired(&m, 0, p);
  cr_assert_eq(t_stats(m.e).device_bytes, 2 * m.chunk_bytes);
  float g[CHUNK];
  t_fill(g, CHUNK, 5, 1.0f);
  T_OK(pstar_grad_write(m.e, A, g, CHUNK, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(m.e, A, NULL));
  T_OK(pstar_param_release(m.e, B, NULL));
  /* Nothing is in use from here: A's and B's chunks may both move. */
  p = t_acquire(m.e, C, PSTAR_STAGE_FORWARD);
  check_acquired(&m, 2, p);
  T_STATUS(pstar_param_acquire(m.e, B, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_OK);
  check_acquired(&m, 1, p);
  T_OK(pstar_param_release(m.e, B, NULL));
  T_OK(pstar_param_release(m.e, C, NULL));
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(m.e, &r));
  cr_assert_eq(r.params_updated, 1);
  free_budget(&m);
}

Test(budget, acquired_pointers_are_256_byte_aligned) {
  const pstar_dtype dts[] = {PSTAR_DTYPE_F32, PSTAR_DTYPE_F16, PSTAR_DTYPE_BF16};
  const int64_t sizes[] = {1, 100, 129, 300, 1000, 5, 2000};
  for (int d = 0; d < 3; ++d) {
    pstar_engine_options o = t_options(dts[d], CHUNK);
    o.device_capacity_bytes = 5 * CHUNK * 4; /* the jumbo p6 needs 8192 + 8000 in backward */
    pstar_engine *e = t_create(&o);
    uint32_t ids[7];
    for (int i = 0; i < 7; ++i) {
      char name[16];
      snprintf(name, sizeof name, "p%d", i);
      ids[i] = t_register(e, name, sizes[i], 0);
    }
    T_OK(pstar_engine_build(e));
    for (int it = 0; it < 2; ++it) {
      T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
      for (int i = 0; i < 7; ++i) {
        const void *p = t_acquire(e, ids[i], PSTAR_STAGE_FORWARD);
        cr_assert_eq((uintptr_t)p % 256, 0, "dtype %d, param %d: %p is not 256-byte aligned", (int)dts[d], i, p);
        T_OK(pstar_param_release(e, ids[i], NULL));
      }
      for (int i = 6; i >= 0; --i) {
        t_acquire(e, ids[i], PSTAR_STAGE_BACKWARD);
        float *slot = NULL;
        T_OK(pstar_grad_slot_acquire(e, ids[i], NULL, &slot));
        cr_assert_eq((uintptr_t)slot % 256, 0, "gradient slot %p is not 256-byte aligned", (void *)slot);
        T_OK(pstar_param_release(e, ids[i], NULL));
      }
      T_OK(pstar_step(e, NULL));
    }
    T_OK(pstar_engine_destroy(e));
  }
}

Test(budget, writes_between_iterations_under_eviction_strict) {
  /* Strict mode: poisoned copy destinations and random stream delays.  New
   * values written between iterations, wherever the chunk is at that moment,
   * must be what the next acquire shows. */
  enum { NP = 5 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.device_capacity_bytes = 2 * CHUNK * 2;
  o.strict = 1;
  o.strict_seed = 99;
  pstar_engine *e = t_create(&o);
  uint32_t ids[NP];
  for (int i = 0; i < NP; ++i) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    ids[i] = t_register(e, name, CHUNK, i == 3 ? PSTAR_PARAM_FROZEN : 0);
  }
  T_OK(pstar_engine_build(e));
  static float vals[NP][CHUNK];
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < NP; ++i) {
      if ((i + round) % 2 == 0 || round == 0) {
        t_fill(vals[i], CHUNK, (uint32_t)(round * 10 + i), 1.0f + (float)round);
        t_write_f32(e, ids[i], vals[i], CHUNK);
      }
    }
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
    for (int s = 0; s < NP; ++s) {
      const int i = (round % 2) ? NP - 1 - s : s;
      const void *p = t_acquire(e, ids[i], PSTAR_STAGE_FORWARD);
      for (int k = 0; k < CHUNK; ++k) {
        cr_assert_eq(((const uint16_t *)p)[k], t_f32_to_bf16(vals[i][k]), "round %d, param %d [%d]", round, i, k);
      }
      T_OK(pstar_param_release(e, ids[i], NULL));
    }
    T_OK(pstar_iteration_end(e));
    for (int i = 0; i < NP; ++i) {
      float got[CHUNK];
      t_read_f32(e, ids[i], got, CHUNK);
      for (int k = 0; k < CHUNK; ++k) {
        const float want = i == 3 ? t_round(PSTAR_DTYPE_BF16, vals[i][k]) : vals[i][k];
        cr_assert_eq(got[k], want, "read back: round %d, param %d [%d]", round, i, k);
      }
    }
  }
  const pstar_stats s = t_stats(e);
  cr_assert_gt(s.evictions, 0);
  T_OK(pstar_engine_destroy(e));
}

Test(host, exact_host_capacity_with_device_evictions_strict) {
  /* Moving chunks between tiers must not need more host memory than the
   * lists themselves: the host buffer a fetch frees is the one an eviction
   * reuses. */
  enum { NP = 4 };
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.device_capacity_bytes = 2 * CHUNK * 2;
  o.host_capacity_bytes = NP * (CHUNK * 2 + 3 * CHUNK * 4);
  o.strict = 1;
  o.strict_seed = 5;
  pstar_engine *e = t_create(&o);
  uint32_t ids[NP];
  for (int i = 0; i < NP; ++i) {
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    ids[i] = t_register(e, name, CHUNK, 0);
  }
  T_OK(pstar_engine_build(e));
  for (int it = 0; it < 3; ++it) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
    for (int i = 0; i < NP; ++i) fwd(e, ids[(i + it) % NP]);
    T_OK(pstar_iteration_end(e));
  }
  const pstar_stats s = t_stats(e);
  cr_assert_gt(s.evictions, 0);
  cr_assert_leq(s.peak_host_bytes, o.host_capacity_bytes);
  T_OK(pstar_engine_destroy(e));
}
