/* The versioned-struct rule, both ways (issue 18, group 3), on every struct
 * with `size` and `version`: pstar_engine_options and
 * pstar_x_nvme_options (read), pstar_step_result, pstar_stats,
 * pstar_x_nvme_stats and pstar_x_gather_stats (written).  A struct is
 * accepted when its version is known, its size covers that version's
 * fields and is at most PSTAR_STRUCT_SIZE_MAX, and every byte past the
 * library's struct is zero; anything else is PSTAR_ERR_VERSION with nothing
 * done and nothing written.  Sizes beyond the bound are refused without
 * reading the tail: such structs end where readable memory ends. */
#define _DEFAULT_SOURCE /* mmap's MAP_ANONYMOUS under -std=c99 */
#define PSTAR_EXPERIMENTAL_API
#include <stddef.h>
#include <sys/mman.h>
#include <unistd.h>

#include "capi_test_util.h"

/* A buffer of `bytes` that ends where readable memory ends (the page after
 * it is PROT_NONE), zero-filled.  Freed with guarded_free(). */
typedef struct guarded {
  char *map;
  size_t map_bytes;
  void *at;
} guarded;

static guarded guarded_alloc(size_t bytes) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t data_pages = (bytes + page - 1) / page;
  guarded g;
  g.map_bytes = (data_pages + 1) * page;
  g.map = mmap(NULL, g.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(g.map, MAP_FAILED);
  cr_assert_eq(mprotect(g.map + data_pages * page, page, PROT_NONE), 0);
  /* 8-byte aligned, ending at most 7 bytes before the guard page. */
  g.at = g.map + data_pages * page - ((bytes + 7) / 8) * 8;
  memset(g.at, 0, bytes);
  return g;
}

static void guarded_free(guarded *g) { cr_assert_eq(munmap(g->map, g->map_bytes), 0); }

/* The sizes every struct is tried with, relative to the library's own
 * `known` bytes; `zero_tail` cases are accepted, the others refused. */
typedef struct size_case {
  const char *what;
  uint32_t size;   /* 0: computed from `extra` */
  int64_t extra;   /* bytes past `known` */
  int poke;        /* -1: tail zero; else the byte of the tail set to 1 */
  int accepted;
} size_case;

static const size_case k_sizes[] = {
    {"its own size", 0, 0, -1, 1},
    {"64 more bytes, zero", 0, 64, -1, 1},
    {"64 more bytes, first one not zero", 0, 64, 0, 0},
    {"64 more bytes, last one not zero", 0, 64, 63, 0},
    {"PSTAR_STRUCT_SIZE_MAX, zero", PSTAR_STRUCT_SIZE_MAX, 0, -1, 1},
    {"PSTAR_STRUCT_SIZE_MAX, last byte not zero", PSTAR_STRUCT_SIZE_MAX, 0, -2, 0},
    {"PSTAR_STRUCT_SIZE_MAX + 1, zero", PSTAR_STRUCT_SIZE_MAX + 1, 0, -1, 0},
    {"1 MiB", 1u << 20, 0, -1, 0},
    {"UINT32_MAX", UINT32_MAX, 0, -1, 0},
    {"one byte short of its fields", 0, INT64_MIN + 1, -1, 0},
    {"8 bytes (the header)", 8, 0, -1, 0},
    {"0", 0, INT64_MIN, -1, 0},
};

/* Sets up `buf` (of alloc_bytes(), zero) for case c from `init` (the
 * struct's _init()ed bytes, `known` of them, whose current version's fields
 * end at `fields_end`): returns the size field. */
static uint32_t lay_out(const size_case *c, void *buf, const void *init, size_t known, size_t fields_end) {
  uint32_t size = c->size;
  if (c->extra == INT64_MIN) {
    size = 0;
  } else if (c->extra == INT64_MIN + 1) {
    size = (uint32_t)fields_end - 1;
  } else if (size == 0) {
    size = (uint32_t)((int64_t)known + c->extra);
  }
  memcpy(buf, init, known);
  if (c->poke >= 0) ((unsigned char *)buf)[known + (size_t)c->poke] = 1;
  if (c->poke == -2) ((unsigned char *)buf)[size - 1] = 1;
  memcpy(buf, &size, sizeof size); /* every struct begins with uint32_t size */
  return size;
}

/* Bytes to allocate for case c: what it declares, when the declaration is
 * within bounds (a caller's promise); just the struct when it is not (the
 * library must refuse without reading). */
static size_t alloc_bytes(const size_case *c, size_t known) {
  if (c->size > PSTAR_STRUCT_SIZE_MAX) return known;
  return c->size > known + 64 ? c->size : known + 64;
}

/* ------------------------------------------------------------------------ */
/* Structs the library reads                                                 */
/* ------------------------------------------------------------------------ */

Test(structs, engine_options_sizes) {
  pstar_engine_options init = t_options(PSTAR_DTYPE_F32, 1024);
  for (size_t i = 0; i < sizeof k_sizes / sizeof k_sizes[0]; ++i) {
    const size_case *c = &k_sizes[i];
    guarded g = guarded_alloc(alloc_bytes(c, sizeof init));
    lay_out(c, g.at, &init, sizeof init, offsetof(pstar_engine_options, comm_timeout_ms) + sizeof(uint32_t));
    pstar_engine *e = (pstar_engine *)(uintptr_t)0x42;
    const pstar_status s = pstar_engine_create((const pstar_engine_options *)g.at, &e);
    char msg[T_MSG_CAP];
    t_copy_last_error(msg, sizeof msg);
    if (c->accepted) {
      cr_assert_eq(s, PSTAR_OK, "options, %s: got %s (\"%s\")", c->what, pstar_status_name(s), msg);
      T_OK(pstar_engine_destroy(e));
    } else {
      cr_assert_eq(s, PSTAR_ERR_VERSION, "options, %s: got %s (\"%s\")", c->what, pstar_status_name(s), msg);
      cr_assert(strstr(msg, "options") != NULL && strstr(msg, "size") != NULL, "options, %s: \"%s\"", c->what, msg);
      cr_assert_eq((uintptr_t)e, (uintptr_t)0x42, "options, %s: out_engine written", c->what);
    }
    guarded_free(&g);
  }
}

Test(structs, engine_options_versions) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  const uint32_t bad[] = {0, PSTAR_ENGINE_OPTIONS_VERSION + 1, 1000, UINT32_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    o.version = bad[i];
    pstar_engine *e = NULL;
    T_FAIL(pstar_engine_create(&o, &e), PSTAR_ERR_VERSION, "version");
    cr_assert_null(e);
  }
  /* Every older version with its own size, and with the current size (the
   * later versions' fields are the library's to ignore). */
  const size_t v_end[] = {offsetof(pstar_engine_options, loss_scale_min) + sizeof(float),
                          offsetof(pstar_engine_options, grad_accumulation) + sizeof(int32_t),
                          offsetof(pstar_engine_options, prefetch) + sizeof(int32_t)};
  for (uint32_t v = 1; v <= 3; ++v) {
    pstar_engine_options old = t_options(PSTAR_DTYPE_F32, 1024);
    old.version = v;
    old.size = (uint32_t)v_end[v - 1];
    pstar_engine *e = t_create(&old);
    T_OK(pstar_engine_destroy(e));
    old.size = sizeof old;
    e = t_create(&old);
    T_OK(pstar_engine_destroy(e));
    old.size = (uint32_t)v_end[v - 1] - 1;
    T_FAIL(pstar_engine_create(&old, &e), PSTAR_ERR_VERSION, "smaller");
  }
}

Test(structs, nvme_options_sizes) {
  pstar_x_nvme_options init;
  T_OK(pstar_x_nvme_options_init(&init));
  for (size_t i = 0; i < sizeof k_sizes / sizeof k_sizes[0]; ++i) {
    const size_case *c = &k_sizes[i];
    pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
    o.dry_run = 1; /* no directory needed */
    pstar_engine *e = t_create(&o);
    guarded g = guarded_alloc(alloc_bytes(c, sizeof init));
    lay_out(c, g.at, &init, sizeof init, sizeof init);
    const pstar_status s = pstar_x_engine_set_nvme(e, (const pstar_x_nvme_options *)g.at);
    char msg[T_MSG_CAP];
    t_copy_last_error(msg, sizeof msg);
    if (c->accepted) {
      /* UNSUPPORTED: a build without the NVMe tier. */
      cr_assert(s == PSTAR_OK || s == PSTAR_ERR_UNSUPPORTED, "nvme options, %s: got %s (\"%s\")", c->what,
                pstar_status_name(s), msg);
    } else {
      cr_assert_eq(s, PSTAR_ERR_VERSION, "nvme options, %s: got %s (\"%s\")", c->what, pstar_status_name(s), msg);
      /* Nothing happened: the tier can still be given once. */
      const pstar_status again = pstar_x_engine_set_nvme(e, &init);
      cr_assert(again == PSTAR_OK || again == PSTAR_ERR_UNSUPPORTED, "nvme options after %s: %s", c->what,
                pstar_status_name(again));
    }
    guarded_free(&g);
    T_OK(pstar_engine_destroy(e));
  }
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.dry_run = 1;
  pstar_engine *e = t_create(&o);
  init.version = 0;
  T_FAIL(pstar_x_engine_set_nvme(e, &init), PSTAR_ERR_VERSION, "version");
  init.version = PSTAR_X_NVME_OPTIONS_VERSION + 1;
  T_FAIL(pstar_x_engine_set_nvme(e, &init), PSTAR_ERR_VERSION, "version");
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Structs the library writes                                                */
/* ------------------------------------------------------------------------ */

/* A built engine with one trainable parameter of 8 elements. */
static pstar_engine *small_engine(uint32_t *id) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  pstar_engine *e = t_create(&o);
  *id = t_register(e, "w", 8, 0);
  T_OK(pstar_engine_build(e));
  const float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  t_write_f32(e, *id, w, 8);
  return e;
}

static void begin_with_gradient(pstar_engine *e, uint32_t id) {
  const float g[8] = {0.5f, -0.5f, 0.25f, -0.25f, 1, -1, 2, -2};
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  t_acquire(e, id, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, id, NULL));
  t_acquire(e, id, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(e, id, g, 8, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, id, NULL));
}

/* Checks one output struct call over every size case: `call` fills the
 * struct at `buf`; a refused case must leave every byte of the buffer as it
 * was; an accepted one must leave the tail (past `known`) untouched. */
typedef pstar_status (*fill_fn)(pstar_engine *e, void *buf, void *ctx);

static void check_output_struct(const char *name, pstar_engine *e, const void *init, size_t known, fill_fn call,
                                void *ctx, void (*after_refusal)(pstar_engine *e, void *ctx)) {
  for (size_t i = 0; i < sizeof k_sizes / sizeof k_sizes[0]; ++i) {
    const size_case *c = &k_sizes[i];
    const size_t bytes = alloc_bytes(c, known);
    guarded g = guarded_alloc(bytes);
    const uint32_t size = lay_out(c, g.at, init, known, known);
    unsigned char *before = malloc(bytes);
    cr_assert_not_null(before);
    memcpy(before, g.at, bytes);
    const pstar_status s = call(e, g.at, ctx);
    char msg[T_MSG_CAP];
    t_copy_last_error(msg, sizeof msg);
    if (c->accepted) {
      cr_assert_eq(s, PSTAR_OK, "%s, %s: got %s (\"%s\")", name, c->what, pstar_status_name(s), msg);
      uint32_t size_after;
      memcpy(&size_after, g.at, sizeof size_after);
      cr_assert_eq(size_after, size, "%s, %s: size field changed to %u", name, c->what, size_after);
      if (bytes > known) {
        cr_assert_eq(memcmp((char *)g.at + known, before + known, bytes - known), 0,
                     "%s, %s: bytes past the library's struct written", name, c->what);
      }
    } else {
      cr_assert_eq(s, PSTAR_ERR_VERSION, "%s, %s: got %s (\"%s\")", name, c->what, pstar_status_name(s), msg);
      cr_assert(strstr(msg, "size") != NULL, "%s, %s: \"%s\"", name, c->what, msg);
      cr_assert_eq(memcmp(g.at, before, bytes), 0, "%s, %s: refused but written", name, c->what);
      if (after_refusal != NULL) after_refusal(e, ctx);
    }
    free(before);
    guarded_free(&g);
  }
}

typedef struct step_ctx {
  uint32_t id;
  uint64_t steps;
} step_ctx;

static pstar_status call_step(pstar_engine *e, void *buf, void *ctx) {
  step_ctx *c = ctx;
  begin_with_gradient(e, c->id);
  const pstar_status s = pstar_step(e, (pstar_step_result *)buf);
  if (s == PSTAR_OK) ++c->steps;
  return s;
}

/* A refused step did nothing: the iteration is still open, the step count
 * unchanged; a step without a result completes it. */
static void step_refused(pstar_engine *e, void *ctx) {
  step_ctx *c = ctx;
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), (double)c->steps, "a refused step counted");
  T_FAIL(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_STATE, "");
  T_OK(pstar_step(e, NULL));
  ++c->steps;
}

Test(structs, step_result_sizes) {
  step_ctx c;
  pstar_engine *e = small_engine(&c.id);
  c.steps = 0;
  pstar_step_result init;
  T_OK(pstar_step_result_init(&init));
  check_output_struct("step result", e, &init, sizeof init, call_step, &c, step_refused);
  /* Versions. */
  const uint32_t bad[] = {0, PSTAR_STEP_RESULT_VERSION + 1, UINT32_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    pstar_step_result r = init;
    r.version = bad[i];
    begin_with_gradient(e, c.id);
    T_FAIL(pstar_step(e, &r), PSTAR_ERR_VERSION, "version");
    step_refused(e, &c);
  }
  T_OK(pstar_engine_destroy(e));
}

static pstar_status call_stats(pstar_engine *e, void *buf, void *ctx) {
  (void)ctx;
  return pstar_engine_get_stats(e, (pstar_stats *)buf);
}

Test(structs, stats_sizes) {
  uint32_t id;
  pstar_engine *e = small_engine(&id);
  pstar_stats init;
  T_OK(pstar_stats_init(&init));
  check_output_struct("stats", e, &init, sizeof init, call_stats, NULL, NULL);
  const uint32_t bad[] = {0, PSTAR_STATS_VERSION + 1, PSTAR_STATS_VERSION + 7, UINT32_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    pstar_stats s = init;
    s.version = bad[i];
    T_FAIL(pstar_engine_get_stats(e, &s), PSTAR_ERR_VERSION, "version");
  }
  /* An older version gets no more than its size. */
  guarded g = guarded_alloc(offsetof(pstar_stats, trace_fallbacks));
  pstar_stats v1 = init;
  v1.version = 1;
  v1.size = (uint32_t)offsetof(pstar_stats, trace_fallbacks);
  memcpy(g.at, &v1, v1.size);
  T_OK(pstar_engine_get_stats(e, (pstar_stats *)g.at));
  guarded_free(&g);
  T_OK(pstar_engine_destroy(e));
}

static pstar_status call_gather_stats(pstar_engine *e, void *buf, void *ctx) {
  (void)ctx;
  return pstar_x_gather_get_stats(e, (pstar_x_gather_stats *)buf);
}

Test(structs, gather_stats_sizes) {
  uint32_t id;
  pstar_engine *e = small_engine(&id);
  pstar_x_gather_stats init;
  T_OK(pstar_x_gather_stats_init(&init));
  check_output_struct("gather stats", e, &init, sizeof init, call_gather_stats, NULL, NULL);
  /* A version-1 caller's struct ends before the shard-copy counters: filled
   * up to there, nothing past it written. */
  const size_t v1_size = offsetof(pstar_x_gather_stats, bytes_shard_host_to_device);
  guarded g = guarded_alloc(v1_size);
  pstar_x_gather_stats v1 = init;
  v1.version = 1;
  v1.size = (uint32_t)v1_size;
  memcpy(g.at, &v1, v1_size);
  T_OK(pstar_x_gather_get_stats(e, (pstar_x_gather_stats *)g.at));
  guarded_free(&g);
  v1.size = (uint32_t)v1_size - 8; /* short of version 1's fields */
  T_FAIL(pstar_x_gather_get_stats(e, &v1), PSTAR_ERR_VERSION, "size");
  init.version = PSTAR_X_GATHER_STATS_VERSION + 1;
  T_FAIL(pstar_x_gather_get_stats(e, &init), PSTAR_ERR_VERSION, "version");
  T_OK(pstar_engine_destroy(e));
}

static pstar_status call_nvme_stats(pstar_engine *e, void *buf, void *ctx) {
  (void)ctx;
  return pstar_x_nvme_get_stats(e, (pstar_x_nvme_stats *)buf);
}

Test(structs, nvme_stats_sizes) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.dry_run = 1;
  pstar_engine *e = t_create(&o);
  pstar_x_nvme_options n;
  T_OK(pstar_x_nvme_options_init(&n));
  const pstar_status s = pstar_x_engine_set_nvme(e, &n);
  pstar_x_nvme_stats init;
  T_OK(pstar_x_nvme_stats_init(&init));
  if (s == PSTAR_ERR_UNSUPPORTED) {
    /* No NVMe tier in this build: the struct is still checked first. */
    init.size = UINT32_MAX;
    T_FAIL(pstar_x_nvme_get_stats(e, &init), PSTAR_ERR_VERSION, "size");
    T_OK(pstar_x_nvme_stats_init(&init));
    T_FAIL(pstar_x_nvme_get_stats(e, &init), PSTAR_ERR_INVALID_STATE, "NVMe");
  } else {
    T_OK(s);
    check_output_struct("nvme stats", e, &init, sizeof init, call_nvme_stats, NULL, NULL);
    init.version = 2;
    T_FAIL(pstar_x_nvme_get_stats(e, &init), PSTAR_ERR_VERSION, "version");
  }
  T_OK(pstar_engine_destroy(e));
}
