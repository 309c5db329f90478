/*
 * The device floor: a gradient that does not fit on the device beside the
 * chunks in use accumulates on the host, with the same bits as on the
 * device.  The model has a jumbo embedding used twice (lookup and tied
 * head, as in GPT-2) and four one-chunk layers; it trains at a capacity of
 * exactly the embedding's chunk, where its 4 B/element gradient buffer
 * cannot be on the device, and must match an unlimited engine bit for bit:
 * weights, gradient norms, skipped steps.
 */
#define PSTAR_EXPERIMENTAL_API 1
#include "capi_test_util.h"

enum { CHUNK = 1024, EMB = 3000, EMB_SLOT = 3072, LAYERS = 4, ITERS = 4 };

typedef struct floor_config {
  pstar_dtype dtype;
  int slot_head;      /* the head's gradient through pstar_grad_slot_acquire */
  int device_space;   /* gradients handed over as PSTAR_MEM_DEVICE */
  int micro_batches;  /* > 1: options.grad_accumulation */
  int strict;
  int abort_first;    /* iteration 0 is aborted after the head's backward */
  int inf_at;         /* the iteration whose head gradient has an inf (-1: none) */
} floor_config;

typedef struct floor_run {
  pstar_engine *e;
  uint32_t emb, layer[LAYERS];
  double norms[ITERS];
  int skipped[ITERS];
} floor_run;

static float *emb_init, *layer_init[LAYERS];

static void init_values(void) {
  if (emb_init != NULL) return;
  emb_init = t_alloc_f(EMB);
  t_fill(emb_init, EMB, 11, 0.5f);
  for (int i = 0; i < LAYERS; ++i) {
    layer_init[i] = t_alloc_f(CHUNK);
    t_fill(layer_init[i], CHUNK, 20 + i, 0.5f);
  }
}

static uint64_t emb_chunk_bytes(pstar_dtype dtype) { return EMB_SLOT * t_dtype_size(dtype); }

static floor_run make_run(const floor_config *c, uint64_t capacity) {
  init_values();
  floor_run r;
  memset(&r, 0, sizeof r);
  pstar_engine_options o = t_options(c->dtype, CHUNK);
  o.device_capacity_bytes = capacity;
  o.lr = 0.01f;
  o.grad_accumulation = c->micro_batches > 1;
  o.strict = c->strict;
  o.strict_seed = 7;
  o.clip_norm = 2.0f; /* the host norm feeds the clipping */
  if (c->dtype == PSTAR_DTYPE_F16) o.loss_scale_initial = 1024.0f;
  r.e = t_create(&o);
  r.emb = t_register(r.e, "wte.weight", EMB, 0);
  for (int i = 0; i < LAYERS; ++i) {
    char name[32];
    snprintf(name, sizeof name, "h%d.weight", i);
    r.layer[i] = t_register(r.e, name, CHUNK, 0);
  }
  T_OK(pstar_engine_build(r.e));
  const pstar_stats s = t_stats(r.e);
  cr_assert_eq(s.jumbo_chunks, 1);
  T_OK(pstar_param_write(r.e, r.emb, emb_init, EMB, PSTAR_DTYPE_F32));
  for (int i = 0; i < LAYERS; ++i) T_OK(pstar_param_write(r.e, r.layer[i], layer_init[i], CHUNK, PSTAR_DTYPE_F32));
  return r;
}

static void fwd(pstar_engine *e, uint32_t id) {
  t_acquire(e, id, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, id, NULL));
}

/* One backward use of `id` (n elements): a gradient that depends on the
 * weights the acquire shows, the use and the iteration. */
static void bwd(const floor_config *c, pstar_engine *e, uint32_t id, uint64_t n, int use, int it, int inf, int slot) {
  const void *w = t_acquire(e, id, PSTAR_STAGE_BACKWARD);
  float *g = t_alloc_f(n);
  const float scale = c->dtype == PSTAR_DTYPE_F16 ? 1024.0f : 1.0f;
  for (uint64_t j = 0; j < n; ++j)
    g[j] = scale * (0.25f * t_load(w, c->dtype, j) + 0.001f * (float)((j + (uint64_t)use) % 5) - 0.0015f * (float)it);
  if (inf) g[n / 2] = INFINITY;
  if (slot) {
    float *acc = NULL;
    T_OK(pstar_grad_slot_acquire(e, id, NULL, &acc));
    for (uint64_t j = 0; j < n; ++j) acc[j] += g[j];
  } else {
    /* Two writes per use (0.5 g, then 0.75 g): the order of the fp32 sums
     * matters, as with two contributions from one autograd node. */
    for (uint64_t j = 0; j < n; ++j) g[j] *= 0.5f;
    const pstar_mem_space sp = c->device_space ? PSTAR_MEM_DEVICE : PSTAR_MEM_HOST;
    T_OK(pstar_grad_write(e, id, g, n, PSTAR_DTYPE_F32, sp, NULL));
    for (uint64_t j = 0; j < n; ++j) g[j] *= 1.5f;
    T_OK(pstar_grad_write(e, id, g, n, PSTAR_DTYPE_F32, sp, NULL));
  }
  free(g);
  T_OK(pstar_param_release(e, id, NULL));
}

static void train(const floor_config *c, floor_run *r) {
  for (int it = 0; it < ITERS; ++it) {
    T_OK(pstar_iteration_begin(r->e, PSTAR_ITERATION_TRAIN));
    for (int mb = 0; mb < c->micro_batches; ++mb) {
      fwd(r->e, r->emb); /* lookup */
      for (int i = 0; i < LAYERS; ++i) fwd(r->e, r->layer[i]);
      fwd(r->e, r->emb); /* tied head */
      bwd(c, r->e, r->emb, EMB, 0, it, it == c->inf_at && mb == 0, c->slot_head);
      if (it == 0 && c->abort_first) break;
      for (int i = LAYERS; i-- > 0;) bwd(c, r->e, r->layer[i], CHUNK, 1, it, 0, 0);
      bwd(c, r->e, r->emb, EMB, 2, it, 0, 0);
    }
    if (it == 0 && c->abort_first) {
      T_OK(pstar_iteration_abort(r->e));
      r->norms[it] = -1.0;
      continue;
    }
    pstar_step_result res;
    T_OK(pstar_step_result_init(&res));
    T_OK(pstar_step(r->e, &res));
    r->norms[it] = res.grad_norm;
    r->skipped[it] = res.skipped;
  }
}

static void expect_same(const floor_run *a, const floor_run *b) {
  for (int it = 0; it < ITERS; ++it) {
    cr_assert_eq(a->skipped[it], b->skipped[it], "iteration %d: skipped %d vs %d", it, a->skipped[it], b->skipped[it]);
    cr_assert(memcmp(&a->norms[it], &b->norms[it], sizeof(double)) == 0, "iteration %d: grad norm %.17g vs %.17g", it,
              a->norms[it], b->norms[it]);
  }
  float *x = t_alloc_f(EMB), *y = t_alloc_f(EMB);
  t_read_f32(a->e, a->emb, x, EMB);
  t_read_f32(b->e, b->emb, y, EMB);
  for (int j = 0; j < EMB; ++j) cr_assert_eq(t_f32_bits(x[j]), t_f32_bits(y[j]), "wte[%d]: %.9g vs %.9g", j, x[j], y[j]);
  cr_assert_neq(t_f32_bits(x[0]), t_f32_bits(emb_init[0]), "the embedding was not trained");
  for (int i = 0; i < LAYERS; ++i) {
    t_read_f32(a->e, a->layer[i], x, CHUNK);
    t_read_f32(b->e, b->layer[i], y, CHUNK);
    for (int j = 0; j < CHUNK; ++j)
      cr_assert_eq(t_f32_bits(x[j]), t_f32_bits(y[j]), "h%d[%d]: %.9g vs %.9g", i, j, x[j], y[j]);
  }
  free(x);
  free(y);
}

/* Trains at `capacity` and unlimited; same bits.  The limited engine never
 * held the embedding's gradient buffer (its peak is below chunk + buffer),
 * the unlimited one did. */
static void check_floor(const floor_config *c, uint64_t capacity) {
  floor_run unlimited = make_run(c, 0);
  floor_run limited = make_run(c, capacity);
  train(c, &unlimited);
  train(c, &limited);
  expect_same(&unlimited, &limited);
  const uint64_t emb_with_buffer = emb_chunk_bytes(c->dtype) + EMB * sizeof(float);
  const pstar_stats su = t_stats(unlimited.e), sl = t_stats(limited.e);
  cr_assert_geq(su.peak_device_bytes, emb_with_buffer, "unlimited peak %llu", (unsigned long long)su.peak_device_bytes);
  cr_assert_leq(sl.peak_device_bytes, capacity, "limited peak %llu", (unsigned long long)sl.peak_device_bytes);
  cr_assert_lt(sl.peak_device_bytes, emb_with_buffer);
  cr_assert_eq(sl.budget_overruns, 0);
  cr_assert_gt(sl.evictions, 0);
  T_OK(pstar_engine_destroy(unlimited.e));
  T_OK(pstar_engine_destroy(limited.e));
}

static floor_config base(pstar_dtype dtype) {
  floor_config c = {dtype, 0, 0, 1, 0, 0, -1};
  return c;
}

/* The capacity is exactly the embedding's chunk: every layer's chunk and
 * its gradient buffer fit in it too (1024 x (2 + 4) or (4 + 4) bytes). */
Test(floor, tied_jumbo_embedding_trains_at_its_chunk_f32) {
  floor_config c = base(PSTAR_DTYPE_F32);
  check_floor(&c, emb_chunk_bytes(c.dtype));
}

Test(floor, tied_jumbo_embedding_trains_at_its_chunk_bf16) {
  floor_config c = base(PSTAR_DTYPE_BF16);
  check_floor(&c, emb_chunk_bytes(c.dtype));
}

Test(floor, tied_jumbo_embedding_trains_at_its_chunk_f16_strict) {
  floor_config c = base(PSTAR_DTYPE_F16);
  c.strict = 1;
  check_floor(&c, emb_chunk_bytes(c.dtype));
}

Test(floor, device_space_gradients_are_staged_through_the_host) {
  floor_config c = base(PSTAR_DTYPE_BF16);
  c.device_space = 1;
  check_floor(&c, emb_chunk_bytes(c.dtype));
}

Test(floor, overflow_skips_the_step_and_abort_discards_the_host_sum) {
  floor_config c = base(PSTAR_DTYPE_F16);
  c.abort_first = 1;
  c.inf_at = 2;
  check_floor(&c, emb_chunk_bytes(c.dtype));
}

Test(floor, gradient_accumulation_over_micro_batches) {
  floor_config c = base(PSTAR_DTYPE_BF16);
  c.micro_batches = 2;
  check_floor(&c, emb_chunk_bytes(c.dtype));
}

/* The head's use adds in place through pstar_grad_slot_acquire: it borrows
 * a device buffer holding the host sum for that use.  The capacity holds
 * the embedding's chunk and that buffer, but not also the room a buffer
 * held across the layers' uses would need, so the sum lives on the host
 * between uses. */
Test(floor, grad_slot_acquire_borrows_a_device_buffer_for_its_use) {
  floor_config c = base(PSTAR_DTYPE_F16);
  c.slot_head = 1;
  const uint64_t capacity = emb_chunk_bytes(c.dtype) + EMB * sizeof(float);
  for (c.strict = 0; c.strict <= 1; ++c.strict) {
    floor_run unlimited = make_run(&c, 0);
    floor_run limited = make_run(&c, capacity + 256);
    train(&c, &unlimited);
    train(&c, &limited);
    expect_same(&unlimited, &limited);
    T_OK(pstar_engine_destroy(unlimited.e));
    T_OK(pstar_engine_destroy(limited.e));
  }
}

/* Below the embedding's chunk nothing can train: the acquire says why. */
Test(floor, below_the_largest_chunk_is_out_of_memory) {
  floor_config c = base(PSTAR_DTYPE_F32);
  floor_run r = make_run(&c, emb_chunk_bytes(c.dtype) - 256);
  void *p = NULL;
  T_OK(pstar_iteration_begin(r.e, PSTAR_ITERATION_TRAIN));
  T_FAIL(pstar_param_acquire(r.e, r.emb, PSTAR_STAGE_FORWARD, NULL, &p), PSTAR_ERR_OUT_OF_MEMORY, "chunk 0");
  T_OK(pstar_iteration_abort(r.e));
  T_OK(pstar_engine_destroy(r.e));
}
