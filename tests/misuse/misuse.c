/*
 * libpstar's misuse suite: what an adversarial caller can do through the
 * public header, and what the library must answer.
 *
 * Every case runs in a forked child with a time limit, so that a crash or
 * a hang is reported as such instead of ending the suite.  Verdicts:
 *   OK        the misuse was refused with a non-OK status and a message,
 *             and whatever the case then checks held (values equal to a
 *             clean run, resources back to baseline, ...);
 *   ACCEPTED  the library answered PSTAR_OK to something it must refuse;
 *   CORRUPT   it refused, but values, hyperparameters or the step count
 *             differ afterwards from a clean run (or a case's own check
 *             failed);
 *   CRASH     the child died by a signal (or a sanitizer report);
 *   HANG      the child did not finish within its time limit.
 *
 * Recoverable cases follow one pattern: train the reference model for a
 * few steps, commit the misuse, train more steps, and compare every
 * parameter (bit for bit), Adam's step count and the hyperparameters with a
 * clean run of the same steps, so that a refusal that changed state is
 * caught.
 *
 * Usage: pstar_misuse [--list] [--verbose] [SUBSTRING...]
 * Runs the cases whose "group/name" contains one of the substrings (all
 * without one).  Exit status: 0 when every case is OK, 1 otherwise.
 * Written against pstar/pstar.h only.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pstar/pstar.h"

#if defined(__SANITIZE_ADDRESS__)
#define MISUSE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MISUSE_ASAN 1
#endif
#endif
#ifndef MISUSE_ASAN
#define MISUSE_ASAN 0
#endif

#ifndef MISUSE_TMP_DIR
#define MISUSE_TMP_DIR "."
#endif

/* Exit codes of a case's child. */
enum { V_OK = 0, V_ACCEPTED = 10, V_CORRUPT = 11, V_SETUP = 12 };

static int g_verbose = 0;
static char g_case_dir[2048];

static void note(const char *fmt, ...) {
  if (!g_verbose) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "    ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

/* Failures inside a child: say why, exit with the verdict. */
#define FAIL(verdict, ...)                                          \
  do {                                                              \
    fprintf(stderr, "    %s:%d: ", __FILE__, __LINE__);             \
    fprintf(stderr, __VA_ARGS__);                                   \
    fprintf(stderr, " (last error: %s)\n", pstar_last_error_message()); \
    exit(verdict);                                                  \
  } while (0)

/* A call that must succeed (set-up). */
#define MUST(call)                                                                 \
  do {                                                                             \
    pstar_status s_ = (call);                                                      \
    if (s_ != PSTAR_OK) FAIL(V_SETUP, "%s returned %s", #call, pstar_status_name(s_)); \
  } while (0)

/* A misuse that must be refused: a non-OK status (any, or `want` when it is
 * not PSTAR_OK) and a non-empty message. */
static void refused_(pstar_status got, pstar_status want, const char *what, const char *file, int line) {
  if (got == PSTAR_OK) {
    fprintf(stderr, "    %s:%d: %s was accepted\n", file, line, what);
    exit(V_ACCEPTED);
  }
  const char *msg = pstar_last_error_message();
  if (want != PSTAR_OK && got != want) {
    fprintf(stderr, "    %s:%d: %s returned %s, expected %s (%s)\n", file, line, what, pstar_status_name(got),
            pstar_status_name(want), msg);
    exit(V_CORRUPT);
  }
  if (msg == NULL || msg[0] == '\0') {
    fprintf(stderr, "    %s:%d: %s returned %s without a message\n", file, line, what, pstar_status_name(got));
    exit(V_CORRUPT);
  }
  note("%s -> %s: %s", what, pstar_status_name(got), msg);
}
#define REFUSED(call) refused_((call), PSTAR_OK, #call, __FILE__, __LINE__)
#define REFUSED_AS(call, want) refused_((call), (want), #call, __FILE__, __LINE__)

/* ------------------------------------------------------------------------ */
/* The reference model: three parameters (one frozen), an emulated device   */
/* smaller than the chunks, so that chunks move; deterministic gradients.   */
/* ------------------------------------------------------------------------ */

enum { P_A = 0, P_B = 1, P_FROZEN = 2, N_PARAMS = 3 };
static const int64_t k_shape_a[2] = {64, 48};
static const int64_t k_shape_b[1] = {1000};
static const int64_t k_shape_f[2] = {16, 16};
static const uint64_t k_numel[N_PARAMS] = {64 * 48, 1000, 256};

static void ref_options(pstar_engine_options *o) {
  MUST(pstar_engine_options_init(o));
  o->device = PSTAR_DEVICE_EMULATED;
  o->compute_dtype = PSTAR_DTYPE_F16;
  o->chunk_elems = 2048;
  o->device_capacity_bytes = 3 * 2048 * 2 + 64 * 48 * 4 + 4096; /* about two chunks and a gradient buffer */
  o->threads = 1;
  o->lr = 1e-2f;
  o->clip_norm = 5.0f;
  o->loss_scale_initial = 1024.0f;
}

static pstar_engine *ref_engine_with(const pstar_engine_options *o) {
  pstar_engine *e = NULL;
  uint32_t id;
  MUST(pstar_engine_create(o, &e));
  MUST(pstar_param_register(e, "a", 2, k_shape_a, PSTAR_PARAM_DEFAULT, &id));
  MUST(pstar_param_register(e, "b", 1, k_shape_b, PSTAR_PARAM_NO_WEIGHT_DECAY, &id));
  MUST(pstar_param_register(e, "frozen", 2, k_shape_f, PSTAR_PARAM_FROZEN, &id));
  MUST(pstar_engine_build(e));
  for (uint32_t p = 0; p < N_PARAMS; ++p) {
    float *v = malloc(k_numel[p] * sizeof(float));
    for (uint64_t i = 0; i < k_numel[p]; ++i) v[i] = (float)sin((double)(i + 1) * (p + 1) * 0.37) * 0.5f;
    MUST(pstar_param_write(e, p, v, k_numel[p], PSTAR_DTYPE_F32));
    free(v);
  }
  return e;
}

static pstar_engine *ref_engine(void) {
  pstar_engine_options o;
  ref_options(&o);
  return ref_engine_with(&o);
}

/* One TRAIN iteration with gradients that depend on the step and on the
 * weights (so that a changed weight changes later steps). */
static void train_step(pstar_engine *e, uint64_t step) {
  static float grad[64 * 48];
  double scale = 1.0;
  MUST(pstar_hparam_get(e, PSTAR_HPARAM_LOSS_SCALE, &scale));
  MUST(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  void *ptr;
  for (uint32_t p = 0; p < N_PARAMS; ++p) {
    MUST(pstar_param_acquire(e, p, PSTAR_STAGE_FORWARD, NULL, &ptr));
    MUST(pstar_param_release(e, p, NULL));
  }
  for (int p = N_PARAMS - 1; p >= 0; --p) {
    MUST(pstar_param_acquire(e, (uint32_t)p, PSTAR_STAGE_BACKWARD, NULL, &ptr));
    if (p != P_FROZEN) {
      const uint16_t *w = ptr; /* f16 bits of the weights: the gradient follows them */
      for (uint64_t i = 0; i < k_numel[p]; ++i) {
        grad[i] = (float)(((w[i] & 0xff) / 255.0 - 0.5) + cos((double)(i + step * 7 + (uint64_t)p))) *
                  (float)scale * 0.01f;
      }
      MUST(pstar_grad_write(e, (uint32_t)p, grad, k_numel[p], PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    }
    MUST(pstar_param_release(e, (uint32_t)p, NULL));
  }
  MUST(pstar_step(e, NULL));
}

/* Everything a refusal must leave as it was. */
typedef struct snapshot {
  float *values[N_PARAMS];
  double hparams[8];
} snapshot;

static void take(pstar_engine *e, snapshot *s) {
  for (uint32_t p = 0; p < N_PARAMS; ++p) {
    s->values[p] = malloc(k_numel[p] * sizeof(float));
    MUST(pstar_param_read(e, p, s->values[p], k_numel[p], PSTAR_DTYPE_F32));
  }
  for (int h = 0; h <= PSTAR_HPARAM_STEP; ++h) MUST(pstar_hparam_get(e, (pstar_hparam)h, &s->hparams[h]));
}

static void drop(snapshot *s) {
  for (uint32_t p = 0; p < N_PARAMS; ++p) free(s->values[p]);
}

static int same(const snapshot *a, const snapshot *b, const char **what) {
  for (uint32_t p = 0; p < N_PARAMS; ++p) {
    if (memcmp(a->values[p], b->values[p], k_numel[p] * sizeof(float)) != 0) {
      *what = p == P_A ? "values of a" : p == P_B ? "values of b" : "values of frozen";
      return 0;
    }
  }
  for (int h = 0; h <= PSTAR_HPARAM_STEP; ++h) {
    if (memcmp(&a->hparams[h], &b->hparams[h], sizeof(double)) != 0) {
      *what = "a hyperparameter or the step count";
      return 0;
    }
  }
  return 1;
}

/* The engine's state must equal `before` (taken before the misuse). */
static void expect_unchanged(pstar_engine *e, snapshot *before, const char *after_what) {
  snapshot now;
  const char *what = "";
  take(e, &now);
  if (!same(before, &now, &what)) FAIL(V_CORRUPT, "after %s: %s changed", after_what, what);
  drop(&now);
}

/* Training on from here must reach what a clean run of `total` steps
 * reaches. */
static void expect_clean_after(pstar_engine *e, uint64_t done, uint64_t total, const char *after_what) {
  for (uint64_t s = done; s < total; ++s) train_step(e, s);
  pstar_engine *clean = ref_engine();
  for (uint64_t s = 0; s < total; ++s) train_step(clean, s);
  snapshot a, b;
  const char *what = "";
  take(e, &a);
  take(clean, &b);
  if (!same(&a, &b, &what)) FAIL(V_CORRUPT, "after %s, training on: %s differ from a clean run", after_what, what);
  drop(&a);
  drop(&b);
  MUST(pstar_engine_destroy(clean));
}

/* The usual recoverable case: 2 steps, the misuse (with its own checks),
 * the state unchanged, then 2 more steps equal to a clean run. */
#define RECOVERABLE(label, ...)                 \
  do {                                          \
    pstar_engine *e = ref_engine();             \
    train_step(e, 0);                           \
    train_step(e, 1);                           \
    snapshot before_;                           \
    take(e, &before_);                          \
    __VA_ARGS__;                                \
    expect_unchanged(e, &before_, label);       \
    drop(&before_);                             \
    expect_clean_after(e, 2, 4, label);         \
    MUST(pstar_engine_destroy(e));              \
  } while (0)

static void path_in_case_dir(char *out, size_t cap, const char *name) {
  if ((size_t)snprintf(out, cap, "%s/%s", g_case_dir, name) >= cap) FAIL(V_SETUP, "path too long");
}

/* ------------------------------------------------------------------------ */
/* Options                                                                   */
/* ------------------------------------------------------------------------ */

static pstar_status create_with(void (*edit)(pstar_engine_options *)) {
  pstar_engine_options o;
  ref_options(&o);
  edit(&o);
  pstar_engine *e = NULL;
  pstar_status s = pstar_engine_create(&o, &e);
  if (s == PSTAR_OK) pstar_engine_destroy(e);
  if (s != PSTAR_OK && e != NULL) FAIL(V_CORRUPT, "a refused create left an engine in *out_engine");
  return s;
}

#define OPTION_CASE(fname, body)                                    \
  static void edit_##fname(pstar_engine_options *o) { body; }       \
  static void case_options_##fname(void) { REFUSED(create_with(edit_##fname)); }

OPTION_CASE(beta1_one, o->beta1 = 1.0f)
OPTION_CASE(beta1_nan, o->beta1 = NAN)
OPTION_CASE(beta2_negative, o->beta2 = -0.1f)
OPTION_CASE(eps_zero, o->eps = 0.0f)
OPTION_CASE(eps_negative_zero, o->eps = -0.0f)
OPTION_CASE(lr_inf, o->lr = INFINITY)
OPTION_CASE(lr_negative, o->lr = -1e-3f)
OPTION_CASE(weight_decay_nan, o->weight_decay = NAN)
OPTION_CASE(clip_norm_negative, o->clip_norm = -1.0f)
OPTION_CASE(loss_scale_zero, o->loss_scale_initial = 0.0f)
OPTION_CASE(growth_factor_below_one, o->loss_scale_growth_factor = 0.5f)
OPTION_CASE(backoff_factor_above_one, o->loss_scale_backoff_factor = 1.5f)
OPTION_CASE(device_kind_unknown, o->device = (pstar_device_kind)7)
OPTION_CASE(compute_dtype_unknown, o->compute_dtype = (pstar_dtype)99)
OPTION_CASE(policy_unknown, o->placement_policy = (pstar_policy)42)
OPTION_CASE(margin_over_capacity, o->device_margin_bytes = o->device_capacity_bytes)
OPTION_CASE(world_size_negative, o->world_size = -1)
OPTION_CASE(rank_out_of_world, (o->world_size = 2, o->rank = 5))
OPTION_CASE(rank_without_world, o->rank = 1)
OPTION_CASE(size_zero, o->size = 0)
OPTION_CASE(size_too_small, o->size = 8)
OPTION_CASE(version_zero, o->version = 0)
OPTION_CASE(version_future, o->version = PSTAR_ENGINE_OPTIONS_VERSION + 1)
OPTION_CASE(size_max, o->size = UINT32_MAX)
OPTION_CASE(bandwidth_negative, (o->virtual_clock = 1, o->h2d_bytes_per_s = -1.0))
OPTION_CASE(bandwidth_nan, (o->virtual_clock = 1, o->d2h_bytes_per_s = NAN))

/* A larger struct than the library knows, with a garbage tail. */
static void case_options_garbage_tail(void) {
  unsigned char buf[sizeof(pstar_engine_options) + 64];
  pstar_engine_options o;
  ref_options(&o);
  memcpy(buf, &o, sizeof o);
  memset(buf + sizeof o, 0xA5, 64);
  ((pstar_engine_options *)(void *)buf)->size = (uint32_t)sizeof buf;
  pstar_engine *e = NULL;
  REFUSED(pstar_engine_create((const pstar_engine_options *)(void *)buf, &e));
}

static void case_options_null(void) {
  pstar_engine *e = NULL;
  REFUSED_AS(pstar_engine_create(NULL, &e), PSTAR_ERR_INVALID_ARGUMENT);
  pstar_engine_options o;
  ref_options(&o);
  REFUSED_AS(pstar_engine_create(&o, NULL), PSTAR_ERR_INVALID_ARGUMENT);
  REFUSED_AS(pstar_engine_options_init(NULL), PSTAR_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------------------------------------ */
/* Hyperparameters and per-parameter settings                               */
/* ------------------------------------------------------------------------ */

static void case_hparams_rounding_and_range(void) {
  RECOVERABLE("refused hyperparameters", {
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_BETA1, 0.99999999999));  /* rounds to 1.0f */
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_BETA2, 1.0));
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_EPS, 1e-60));            /* rounds to 0 */
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_EPS, 0.0));
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_LR, NAN));
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_LR, 1e300));             /* overflows float */
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_WEIGHT_DECAY, INFINITY));
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_CLIP_NORM, -1.0));
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_LOSS_SCALE, 1e-60));     /* rounds to 0 (fp16) */
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_LOSS_SCALE, 0.0));
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_STEP, 3.0));             /* read-only */
    REFUSED(pstar_hparam_set(e, (pstar_hparam)99, 1.0));
    double v;
    REFUSED(pstar_hparam_get(e, (pstar_hparam)99, &v));
    REFUSED(pstar_hparam_get(e, PSTAR_HPARAM_LR, NULL));
  });
}

static void case_hparams_lr_scale(void) {
  RECOVERABLE("refused lr scales", {
    REFUSED(pstar_param_set_lr_scale(e, P_A, NAN));
    REFUSED(pstar_param_set_lr_scale(e, P_A, -1.0f));
    REFUSED(pstar_param_set_lr_scale(e, P_A, INFINITY));
    REFUSED(pstar_param_set_lr_scale(e, 77, 1.0f));
    REFUSED(pstar_param_set_weight_decay(e, 77, 1));
  });
}

/* ------------------------------------------------------------------------ */
/* Handles                                                                   */
/* ------------------------------------------------------------------------ */

static void case_handles_null(void) {
  void *ptr;
  uint32_t id;
  uint64_t n;
  double d;
  REFUSED_AS(pstar_engine_build(NULL), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_param_register(NULL, "x", 0, NULL, 0, &id), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_param_find(NULL, "x", &id), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_param_numel(NULL, 0, &n), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_iteration_begin(NULL, PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_param_acquire(NULL, 0, PSTAR_STAGE_FORWARD, NULL, &ptr), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_step(NULL, NULL), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_hparam_get(NULL, PSTAR_HPARAM_LR, &d), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_checkpoint_save(NULL, g_case_dir), PSTAR_ERR_INVALID_HANDLE);
  if (pstar_engine_destroy(NULL) != PSTAR_OK) FAIL(V_CORRUPT, "pstar_engine_destroy(NULL) is not a no-op");
}

static void case_handles_destroyed(void) {
  pstar_engine *e = ref_engine();
  train_step(e, 0);
  MUST(pstar_engine_destroy(e));
  void *ptr;
  double d;
  REFUSED_AS(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_param_acquire(e, 0, PSTAR_STAGE_FORWARD, NULL, &ptr), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_hparam_get(e, PSTAR_HPARAM_LR, &d), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_engine_destroy(e), PSTAR_ERR_INVALID_HANDLE); /* twice */
}

static void case_handles_garbage(void) {
  uint64_t junk[64];
  memset(junk, 0x5a, sizeof junk);
  pstar_engine *fake = (pstar_engine *)(void *)junk;
  double d;
  REFUSED_AS(pstar_hparam_get(fake, PSTAR_HPARAM_LR, &d), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_engine_destroy(fake), PSTAR_ERR_INVALID_HANDLE);
  REFUSED_AS(pstar_step(fake, NULL), PSTAR_ERR_INVALID_HANDLE);
}

/* ------------------------------------------------------------------------ */
/* Registration                                                              */
/* ------------------------------------------------------------------------ */

static void case_registration(void) {
  pstar_engine_options o;
  ref_options(&o);
  pstar_engine *e = NULL;
  uint32_t id;
  MUST(pstar_engine_create(&o, &e));
  const int64_t ok_shape[1] = {8};
  const int64_t negative[2] = {4, -1};
  const int64_t overflow[2] = {INT64_MAX / 2, 4};
  REFUSED(pstar_param_register(e, "", 1, ok_shape, 0, &id));
  REFUSED(pstar_param_register(e, NULL, 1, ok_shape, 0, &id));
  REFUSED(pstar_param_register(e, "neg", 2, negative, 0, &id));
  REFUSED(pstar_param_register(e, "overflow", 2, overflow, 0, &id));
  REFUSED(pstar_param_register(e, "ndim", UINT32_MAX, NULL, 0, &id));
  REFUSED(pstar_param_register(e, "noshape", 2, NULL, 0, &id));
  REFUSED(pstar_param_register(e, "flags", 1, ok_shape, 1u << 20, &id));
  REFUSED(pstar_param_register(e, "noid", 1, ok_shape, 0, NULL));
  MUST(pstar_param_register(e, "w", 1, ok_shape, 0, &id));
  REFUSED(pstar_param_register(e, "w", 1, ok_shape, 0, &id)); /* duplicate */
  uint32_t count = 0;
  MUST(pstar_param_count(e, &count));
  if (count != 1) FAIL(V_CORRUPT, "refused registrations left %u parameters, expected 1", count);
  MUST(pstar_engine_build(e));
  REFUSED(pstar_engine_build(e)); /* twice */
  REFUSED(pstar_param_register(e, "late", 1, ok_shape, 0, &id));
  REFUSED_AS(pstar_param_find(e, "missing", &id), PSTAR_ERR_NOT_FOUND);
  float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  REFUSED(pstar_param_write(e, 0, v, 7, PSTAR_DTYPE_F32)); /* wrong count */
  REFUSED(pstar_param_write(e, 0, NULL, 8, PSTAR_DTYPE_F32));
  REFUSED(pstar_param_write(e, 0, v, 8, (pstar_dtype)9));
  REFUSED(pstar_param_write(e, 5, v, 8, PSTAR_DTYPE_F32));
  REFUSED(pstar_param_read(e, 0, v, 9, PSTAR_DTYPE_F32));
  MUST(pstar_engine_destroy(e));
}

static void case_registration_before_build(void) {
  pstar_engine_options o;
  ref_options(&o);
  pstar_engine *e = NULL;
  MUST(pstar_engine_create(&o, &e));
  void *ptr;
  float v[4] = {0};
  REFUSED(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  REFUSED(pstar_param_acquire(e, 0, PSTAR_STAGE_FORWARD, NULL, &ptr));
  REFUSED(pstar_param_write(e, 0, v, 4, PSTAR_DTYPE_F32));
  REFUSED(pstar_step(e, NULL));
  REFUSED(pstar_checkpoint_save(e, g_case_dir));
  MUST(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Iteration order                                                           */
/* ------------------------------------------------------------------------ */

static void case_order_outside_iterations(void) {
  RECOVERABLE("calls outside an iteration", {
    void *ptr;
    REFUSED(pstar_param_acquire(e, P_A, PSTAR_STAGE_FORWARD, NULL, &ptr));
    REFUSED(pstar_param_release(e, P_A, NULL));
    REFUSED(pstar_step(e, NULL));
    REFUSED(pstar_iteration_end(e));
    REFUSED(pstar_iteration_abort(e));
    double norm = 0.0;
    REFUSED(pstar_grad_norm(e, &norm));
  });
}

static void case_order_inside_train(void) {
  RECOVERABLE("wrong order inside a TRAIN iteration", {
    void *ptr;
    float v[1000] = {0};
    MUST(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    REFUSED(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));           /* twice */
    REFUSED(pstar_iteration_end(e));                                    /* TRAIN ends with a step */
    REFUSED(pstar_param_release(e, P_A, NULL));                         /* not acquired */
    REFUSED(pstar_param_acquire(e, P_A, PSTAR_STAGE_BACKWARD, NULL, &ptr)); /* no forward use */
    REFUSED(pstar_param_acquire(e, P_A, (pstar_stage)7, NULL, &ptr));
    REFUSED(pstar_param_acquire(e, 9999, PSTAR_STAGE_FORWARD, NULL, &ptr));
    REFUSED(pstar_param_acquire(e, P_A, PSTAR_STAGE_FORWARD, NULL, NULL));
    REFUSED(pstar_param_write(e, P_B, v, 1000, PSTAR_DTYPE_F32));      /* values inside an iteration */
    REFUSED(pstar_param_read(e, P_B, v, 1000, PSTAR_DTYPE_F32));
    REFUSED(pstar_checkpoint_save(e, g_case_dir));
    REFUSED(pstar_hparam_set(e, PSTAR_HPARAM_LOSS_SCALE, 1024.0));      /* inside TRAIN */
    double norm = 0.0;
    REFUSED(pstar_grad_norm(e, NULL));
    MUST(pstar_param_acquire(e, P_A, PSTAR_STAGE_FORWARD, NULL, &ptr));
    REFUSED(pstar_grad_norm(e, &norm));                                 /* still acquired */
    MUST(pstar_param_release(e, P_A, NULL));
    MUST(pstar_param_acquire(e, P_A, PSTAR_STAGE_FORWARD, NULL, &ptr)); /* a second use */
    MUST(pstar_param_release(e, P_A, NULL));
    MUST(pstar_param_acquire(e, P_A, PSTAR_STAGE_BACKWARD, NULL, &ptr));
    MUST(pstar_param_release(e, P_A, NULL));
    REFUSED(pstar_grad_norm(e, &norm));                                 /* 1 backward use of 2 */
    MUST(pstar_param_acquire(e, P_A, PSTAR_STAGE_BACKWARD, NULL, &ptr));
    MUST(pstar_param_release(e, P_A, NULL));
    REFUSED(pstar_param_acquire(e, P_A, PSTAR_STAGE_FORWARD, NULL, &ptr)); /* forward after backward */
    REFUSED(pstar_param_acquire(e, P_A, PSTAR_STAGE_BACKWARD, NULL, &ptr)); /* more backward than forward */
    MUST(pstar_iteration_abort(e));
  });
}

static void case_order_eval(void) {
  RECOVERABLE("wrong order inside an EVAL iteration", {
    void *ptr;
    MUST(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
    REFUSED(pstar_param_acquire(e, P_A, PSTAR_STAGE_BACKWARD, NULL, &ptr));
    REFUSED(pstar_step(e, NULL));
    MUST(pstar_param_acquire(e, P_B, PSTAR_STAGE_FORWARD, NULL, &ptr));
    REFUSED(pstar_iteration_end(e)); /* still acquired */
    MUST(pstar_param_release(e, P_B, NULL));
    MUST(pstar_iteration_end(e));
  });
}

static void case_order_abort_with_acquired(void) {
  RECOVERABLE("an abort with parameters acquired", {
    void *ptr;
    float g[1000];
    for (int i = 0; i < 1000; ++i) g[i] = 100.0f;
    MUST(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    MUST(pstar_param_acquire(e, P_B, PSTAR_STAGE_FORWARD, NULL, &ptr));
    MUST(pstar_param_release(e, P_B, NULL));
    MUST(pstar_param_acquire(e, P_A, PSTAR_STAGE_FORWARD, NULL, &ptr));
    MUST(pstar_param_acquire(e, P_B, PSTAR_STAGE_BACKWARD, NULL, &ptr));
    MUST(pstar_grad_write(e, P_B, g, 1000, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    MUST(pstar_iteration_abort(e));
  });
}

/* ------------------------------------------------------------------------ */
/* Gradients                                                                 */
/* ------------------------------------------------------------------------ */

static void case_gradients(void) {
  RECOVERABLE("refused gradients", {
    void *ptr;
    float g[64 * 48];
    for (int i = 0; i < 64 * 48; ++i) g[i] = 0.25f;
    REFUSED(pstar_grad_write(e, P_B, g, 1000, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL)); /* no iteration */
    MUST(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (uint32_t p = 0; p < N_PARAMS; ++p) {
      MUST(pstar_param_acquire(e, p, PSTAR_STAGE_FORWARD, NULL, &ptr));
      REFUSED(pstar_grad_write(e, p, g, k_numel[p], PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL)); /* forward */
      MUST(pstar_param_release(e, p, NULL));
    }
    MUST(pstar_param_acquire(e, P_FROZEN, PSTAR_STAGE_BACKWARD, NULL, &ptr));
    REFUSED(pstar_grad_write(e, P_FROZEN, g, 256, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    float *slot;
    REFUSED(pstar_grad_slot_acquire(e, P_FROZEN, NULL, &slot));
    MUST(pstar_param_release(e, P_FROZEN, NULL));
    MUST(pstar_param_acquire(e, P_B, PSTAR_STAGE_BACKWARD, NULL, &ptr));
    REFUSED(pstar_grad_write(e, P_B, g, 999, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    REFUSED(pstar_grad_write(e, P_B, NULL, 1000, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    REFUSED(pstar_grad_write(e, P_B, g, 1000, (pstar_dtype)5, PSTAR_MEM_HOST, NULL));
    REFUSED(pstar_grad_write(e, P_B, g, 1000, PSTAR_DTYPE_F32, (pstar_mem_space)3, NULL));
    MUST(pstar_param_release(e, P_B, NULL));
    MUST(pstar_iteration_abort(e));
  });
}

/* A gradient said to be in device memory that is a host buffer: on the
 * emulated device in strict mode, memory the device did not hand out. */
static void case_gradients_wrong_memory(void) {
  pstar_engine_options o;
  ref_options(&o);
  o.strict = 1;
  o.strict_seed = 3;
  pstar_engine *e = ref_engine_with(&o);
  void *ptr;
  float *host = malloc(1000 * sizeof(float));
  for (int i = 0; i < 1000; ++i) host[i] = 0.5f;
  MUST(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  MUST(pstar_param_acquire(e, P_B, PSTAR_STAGE_FORWARD, NULL, &ptr));
  MUST(pstar_param_release(e, P_B, NULL));
  MUST(pstar_param_acquire(e, P_B, PSTAR_STAGE_BACKWARD, NULL, &ptr));
  REFUSED(pstar_grad_write(e, P_B, host, 1000, PSTAR_DTYPE_F32, PSTAR_MEM_DEVICE, NULL));
  MUST(pstar_param_release(e, P_B, NULL));
  MUST(pstar_iteration_abort(e));
  free(host);
  MUST(pstar_engine_destroy(e));
}

/* A NaN gradient is not a misuse: the step is skipped and nothing moves. */
static void case_gradients_nonfinite_skip(void) {
  pstar_engine *e = ref_engine();
  train_step(e, 0);
  snapshot before;
  take(e, &before);
  void *ptr;
  float g[1000];
  for (int i = 0; i < 1000; ++i) g[i] = i == 500 ? NAN : 0.1f;
  MUST(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  MUST(pstar_param_acquire(e, P_B, PSTAR_STAGE_FORWARD, NULL, &ptr));
  MUST(pstar_param_release(e, P_B, NULL));
  MUST(pstar_param_acquire(e, P_B, PSTAR_STAGE_BACKWARD, NULL, &ptr));
  MUST(pstar_grad_write(e, P_B, g, 1000, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  MUST(pstar_param_release(e, P_B, NULL));
  pstar_step_result r;
  MUST(pstar_step_result_init(&r));
  MUST(pstar_step(e, &r));
  if (!r.skipped) FAIL(V_CORRUPT, "a NaN gradient did not skip the step");
  snapshot after;
  take(e, &after);
  const char *what = "";
  for (uint32_t p = 0; p < N_PARAMS; ++p) {
    if (memcmp(before.values[p], after.values[p], k_numel[p] * sizeof(float)) != 0) {
      FAIL(V_CORRUPT, "a skipped step changed parameter %u", p);
    }
  }
  (void)what;
  drop(&before);
  drop(&after);
  MUST(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Result and stats structs                                                  */
/* ------------------------------------------------------------------------ */

static void case_structs(void) {
  RECOVERABLE("refused result structs", {
    pstar_step_result r;
    MUST(pstar_step_result_init(&r));
    r.size = 1u << 20; /* 1 MiB */
    MUST(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    REFUSED(pstar_step(e, &r));
    r.size = 4;
    REFUSED(pstar_step(e, &r));
    MUST(pstar_step_result_init(&r));
    r.version = 0;
    REFUSED(pstar_step(e, &r));
    MUST(pstar_iteration_abort(e));
    pstar_stats st;
    MUST(pstar_stats_init(&st));
    st.size = UINT32_MAX;
    REFUSED(pstar_engine_get_stats(e, &st));
    MUST(pstar_stats_init(&st));
    st.version = PSTAR_STATS_VERSION + 7;
    REFUSED(pstar_engine_get_stats(e, &st));
    REFUSED(pstar_engine_get_stats(e, NULL));
  });
}

/* ------------------------------------------------------------------------ */
/* Checkpoints                                                               */
/* ------------------------------------------------------------------------ */

static int read_file(const char *path, unsigned char **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *data = malloc((size_t)n + 1);
  *len = fread(*data, 1, (size_t)n, f);
  fclose(f);
  return 0;
}

static void write_file(const char *path, const unsigned char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (f == NULL) FAIL(V_SETUP, "cannot write %s", path);
  fwrite(data, 1, len, f);
  fclose(f);
}

/* The directory LATEST names, under dir. */
static void latest_dir(const char *dir, char *out, size_t cap) {
  char path[8192];
  unsigned char *data;
  size_t len;
  snprintf(path, sizeof path, "%s/LATEST", dir);
  if (read_file(path, &data, &len) != 0) FAIL(V_SETUP, "no LATEST in %s", dir);
  while (len > 0 && (data[len - 1] == '\n' || data[len - 1] == '\r')) --len;
  data[len] = 0;
  if ((size_t)snprintf(out, cap, "%s/%s", dir, (char *)data) >= cap) FAIL(V_SETUP, "path too long");
  free(data);
}

static void save_reference_checkpoint(char *dir, size_t cap) {
  path_in_case_dir(dir, cap, "ckpt");
  pstar_engine *saver = ref_engine();
  train_step(saver, 0);
  train_step(saver, 1);
  train_step(saver, 2);
  MUST(pstar_checkpoint_save(saver, dir));
  MUST(pstar_engine_destroy(saver));
}

static void case_checkpoints_bad_paths(void) {
  char dir[4096];
  save_reference_checkpoint(dir, sizeof dir);
  RECOVERABLE("refused checkpoint paths", {
    char missing[4096], file_as_dir[4096];
    path_in_case_dir(missing, sizeof missing, "does-not-exist");
    REFUSED(pstar_checkpoint_load(e, missing));
    REFUSED(pstar_checkpoint_load(e, NULL));
    path_in_case_dir(file_as_dir, sizeof file_as_dir, "a-file");
    write_file(file_as_dir, (const unsigned char *)"x", 1);
    REFUSED(pstar_checkpoint_save(e, file_as_dir));
    REFUSED(pstar_checkpoint_save(e, NULL));
    REFUSED(pstar_export_safetensors(e, "/proc/version/x.safetensors")); /* under a file */
    REFUSED(pstar_export_safetensors(e, NULL));
  });
}

static void case_checkpoints_other_model(void) {
  char dir[4096];
  save_reference_checkpoint(dir, sizeof dir);
  pstar_engine_options o;
  ref_options(&o);
  pstar_engine *e = NULL;
  uint32_t id;
  MUST(pstar_engine_create(&o, &e));
  const int64_t shape[1] = {1000};
  MUST(pstar_param_register(e, "a", 1, shape, 0, &id)); /* another shape */
  MUST(pstar_engine_build(e));
  REFUSED(pstar_checkpoint_load(e, dir));
  MUST(pstar_engine_destroy(e));
}

/* Corruptions of a saved checkpoint: each must be refused with the engine
 * as it was (then training on equals a clean run). */
typedef enum { K_LATEST_GARBAGE, K_MANIFEST_TRUNCATED, K_MANIFEST_OFFSET, K_MANIFEST_LR, K_DATA_TRUNCATED,
               K_DATA_FLIPPED, K_MANIFEST_STEP } corruption;

static void corrupt(const char *dir, corruption k) {
  char sub[4096], path[8192];
  latest_dir(dir, sub, sizeof sub);
  unsigned char *data;
  size_t len;
  if (k == K_LATEST_GARBAGE) {
    snprintf(path, sizeof path, "%s/LATEST", dir);
    write_file(path, (const unsigned char *)"../../etc\n", 10);
    return;
  }
  if (k == K_DATA_TRUNCATED || k == K_DATA_FLIPPED) {
    snprintf(path, sizeof path, "%s/masters.f32", sub);
    if (read_file(path, &data, &len) != 0) FAIL(V_SETUP, "no %s", path);
    if (k == K_DATA_TRUNCATED) {
      len /= 2;
    } else {
      data[len / 3] ^= 0x01;
    }
    write_file(path, data, len);
    free(data);
    return;
  }
  snprintf(path, sizeof path, "%s/manifest", sub);
  if (read_file(path, &data, &len) != 0) FAIL(V_SETUP, "no %s", path);
  data[len] = 0;
  char *text = (char *)data;
  char *hit = NULL;
  switch (k) {
    case K_MANIFEST_TRUNCATED:
      len = len * 2 / 3;
      break;
    case K_MANIFEST_OFFSET:
      hit = strstr(text, "offset=0");
      if (hit != NULL) hit[7] = '1';
      break;
    case K_MANIFEST_LR:
      hit = strstr(text, "lr ");
      if (hit != NULL) {
        char *digit = hit + 3;
        while (*digit != 0 && (*digit < '1' || *digit > '8')) ++digit;
        if (*digit != 0) *digit = (char)(*digit + 1);
      }
      break;
    case K_MANIFEST_STEP:
      hit = strstr(text, "step ");
      if (hit != NULL) hit[5] = hit[5] == '9' ? '1' : (char)(hit[5] + 1);
      break;
    default:
      break;
  }
  if (k != K_MANIFEST_TRUNCATED && hit == NULL) FAIL(V_SETUP, "the manifest has no field to corrupt for case %d", k);
  write_file(path, data, len);
  free(data);
}

static void checkpoint_corruption(corruption k, const char *label) {
  char dir[4096];
  save_reference_checkpoint(dir, sizeof dir);
  corrupt(dir, k);
  RECOVERABLE(label, { REFUSED(pstar_checkpoint_load(e, dir)); });
}

static void case_checkpoints_latest_garbage(void) { checkpoint_corruption(K_LATEST_GARBAGE, "LATEST naming elsewhere"); }
static void case_checkpoints_manifest_truncated(void) {
  checkpoint_corruption(K_MANIFEST_TRUNCATED, "a truncated manifest");
}
static void case_checkpoints_manifest_offset(void) {
  checkpoint_corruption(K_MANIFEST_OFFSET, "offset=0 edited to offset=1");
}
static void case_checkpoints_manifest_lr(void) { checkpoint_corruption(K_MANIFEST_LR, "a digit of lr edited"); }
static void case_checkpoints_manifest_step(void) { checkpoint_corruption(K_MANIFEST_STEP, "the step edited"); }
static void case_checkpoints_data_truncated(void) {
  checkpoint_corruption(K_DATA_TRUNCATED, "a truncated data file");
}
static void case_checkpoints_data_flipped(void) { checkpoint_corruption(K_DATA_FLIPPED, "a flipped data bit"); }

/* ------------------------------------------------------------------------ */
/* Threads and fork                                                          */
/* ------------------------------------------------------------------------ */

typedef struct hammer {
  pstar_engine *e;
  uint32_t param;
  int uses;
  int busy;
  int other;
  pstar_status other_status;
  pthread_barrier_t *start;
} hammer;

static void *hammer_main(void *arg) {
  hammer *h = arg;
  void *ptr;
  pthread_barrier_wait(h->start);
  for (int i = 0; i < 20000; ++i) {
    /* One use of this thread's parameter in the EVAL iteration the main
     * thread opened, while the other thread uses its own: the calls overlap
     * (chunks move: the device holds about two).  Each call either works or
     * is refused with BUSY; a refused release is retried. */
    pstar_status s = pstar_param_acquire(h->e, h->param, PSTAR_STAGE_FORWARD, NULL, &ptr);
    if (s == PSTAR_OK) {
      ++h->uses;
      while ((s = pstar_param_release(h->e, h->param, NULL)) == PSTAR_ERR_BUSY) ++h->busy;
    }
    if (s == PSTAR_ERR_BUSY) {
      ++h->busy;
    } else if (s != PSTAR_OK) {
      ++h->other;
      h->other_status = s;
    }
  }
  return NULL;
}

/* Two threads using one engine at once: every call works or is refused
 * with BUSY, nothing crashes, and training on equals a clean run (an EVAL
 * iteration changes no value). */
static void case_threads_two_at_once(void) {
  pstar_engine *e = ref_engine();
  train_step(e, 0);
  for (int round = 0; round < 5; ++round) {
  MUST(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, 2);
  hammer h[2] = {{e, P_A, 0, 0, 0, PSTAR_OK, &start}, {e, P_B, 0, 0, 0, PSTAR_OK, &start}};
  pthread_t t[2];
  for (int i = 0; i < 2; ++i) pthread_create(&t[i], NULL, hammer_main, &h[i]);
  for (int i = 0; i < 2; ++i) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&start);
  note("thread a: %d uses, %d busy; thread b: %d uses, %d busy", h[0].uses, h[0].busy, h[1].uses, h[1].busy);
  for (int i = 0; i < 2; ++i) {
    if (h[i].other != 0) {
      FAIL(V_CORRUPT, "thread %d got %s %d times", i, pstar_status_name(h[i].other_status), h[i].other);
    }
  }
  MUST(pstar_iteration_end(e));
  }
  expect_clean_after(e, 1, 3, "two threads at once");
  MUST(pstar_engine_destroy(e));
}

typedef struct handoff {
  pstar_engine *e;
  uint64_t step;
} handoff;

static void *handoff_main(void *arg) {
  handoff *h = arg;
  train_step(h->e, h->step);
  return NULL;
}

/* One engine handed from thread to thread between calls: legal. */
static void case_threads_handoff(void) {
  pstar_engine *e = ref_engine();
  for (uint64_t s = 0; s < 3; ++s) {
    handoff h = {e, s};
    pthread_t t;
    pthread_create(&t, NULL, handoff_main, &h);
    pthread_join(t, NULL);
  }
  expect_clean_after(e, 3, 4, "a hand-off between threads");
  MUST(pstar_engine_destroy(e));
}

/* A forked child using its parent's engine gets an error at once instead of
 * blocking; the parent's engine is unaffected. */
static void case_threads_fork(void) {
  pstar_engine *e = ref_engine();
  train_step(e, 0);
  pid_t pid = fork();
  if (pid == 0) {
    double d;
    pstar_status s1 = pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN);
    pstar_status s2 = pstar_hparam_get(e, PSTAR_HPARAM_LR, &d);
    _exit(s1 != PSTAR_OK && s2 != PSTAR_OK ? 0 : 1);
  }
  int st = 0;
  for (int i = 0; i < 100; ++i) { /* 10 s */
    if (waitpid(pid, &st, WNOHANG) == pid) break;
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
    if (i == 99) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      FAIL(V_CORRUPT, "a forked child using its parent's engine hung");
    }
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) FAIL(V_ACCEPTED, "a forked child's calls on its parent's engine were accepted");
  expect_clean_after(e, 1, 3, "a child's refused calls");
  MUST(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Leaks                                                                     */
/* ------------------------------------------------------------------------ */

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (f == NULL) return -1;
  if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
  fclose(f);
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  if (d == NULL) return -1;
  while (readdir(d) != NULL) ++n;
  closedir(d);
  return n;
}

static void one_engine_lifetime(int i) {
  pstar_engine *e = ref_engine();
  if (i % 10 == 0) train_step(e, 0);
  MUST(pstar_engine_destroy(e));
}

static void case_leaks_engines(void) {
  const int total = MISUSE_ASAN ? 300 : 2000;
  for (int i = 0; i < 50; ++i) one_engine_lifetime(i); /* warm-up: allocator pools, thread stacks */
  const long rss0 = rss_kib();
  const int fds0 = open_fds();
  for (int i = 0; i < total; ++i) one_engine_lifetime(i);
  const long rss1 = rss_kib();
  const int fds1 = open_fds();
  note("%d engines: RSS %ld -> %ld KiB, descriptors %d -> %d%s", total, rss0, rss1, fds0, fds1,
       MISUSE_ASAN ? " (ASan: RSS not compared; LeakSanitizer checks the heap)" : "");
  if (fds1 != fds0) FAIL(V_CORRUPT, "descriptors %d -> %d after %d engines", fds0, fds1, total);
  if (!MISUSE_ASAN && rss1 - rss0 > 8 * 1024) FAIL(V_CORRUPT, "RSS grew by %ld KiB over %d engines", rss1 - rss0, total);
}

/* ------------------------------------------------------------------------ */
/* Log callbacks                                                             */
/* ------------------------------------------------------------------------ */

static int g_log_calls = 0;

static void log_reentrant(pstar_log_level level, const char *message, void *user) {
  (void)level;
  (void)user;
  ++g_log_calls;
  /* Calls that any thread may make, from inside the callback. */
  if (pstar_status_name(PSTAR_ERR_BUSY) == NULL || pstar_version_string() == NULL || message == NULL) abort();
  (void)pstar_last_error_message();
  pstar_engine_options o;
  (void)pstar_engine_options_init(&o);
  /* Replacing the callback from inside it must not deadlock. */
  (void)pstar_log_set_callback(log_reentrant, NULL, PSTAR_LOG_DEBUG);
}

static void case_logs(void) {
  REFUSED(pstar_log_set_callback(log_reentrant, NULL, (pstar_log_level)17));
  MUST(pstar_log_set_callback(log_reentrant, NULL, PSTAR_LOG_DEBUG));
  pstar_engine *e = ref_engine();
  train_step(e, 0);
  MUST(pstar_engine_destroy(e));
  MUST(pstar_log_set_callback(NULL, NULL, PSTAR_LOG_WARN));
  if (g_log_calls == 0) FAIL(V_CORRUPT, "the log callback was never called at level debug");
  note("%d log records through a re-entrant callback", g_log_calls);
}

/* ------------------------------------------------------------------------ */
/* The runner                                                                */
/* ------------------------------------------------------------------------ */

/* Groups with one case: the table's names. */
static void case_registration_registration(void) { case_registration(); }
static void case_gradients_gradients(void) { case_gradients(); }
static void case_structs_structs(void) { case_structs(); }
static void case_logs_logs(void) { case_logs(); }

typedef struct misuse_case {
  const char *group;
  const char *name;
  void (*fn)(void);
  int timeout_s;
} misuse_case;

#define C(group, name, timeout) {#group, #name, case_##group##_##name, timeout}
static const misuse_case k_cases[] = {
    C(options, null, 10), C(options, beta1_one, 10), C(options, beta1_nan, 10), C(options, beta2_negative, 10),
    C(options, eps_zero, 10), C(options, eps_negative_zero, 10), C(options, lr_inf, 10),
    C(options, lr_negative, 10), C(options, weight_decay_nan, 10), C(options, clip_norm_negative, 10),
    C(options, loss_scale_zero, 10), C(options, growth_factor_below_one, 10),
    C(options, backoff_factor_above_one, 10), C(options, device_kind_unknown, 10), C(options, compute_dtype_unknown, 10),
    C(options, policy_unknown, 10), C(options, margin_over_capacity, 10), C(options, world_size_negative, 10),
    C(options, rank_out_of_world, 10), C(options, rank_without_world, 10), C(options, size_zero, 10),
    C(options, size_too_small, 10), C(options, version_zero, 10), C(options, version_future, 10),
    C(options, size_max, 10), C(options, garbage_tail, 10), C(options, bandwidth_negative, 10),
    C(options, bandwidth_nan, 10),
    C(hparams, rounding_and_range, 30), C(hparams, lr_scale, 30),
    C(handles, null, 10), C(handles, destroyed, 10), C(handles, garbage, 10),
    C(registration, registration, 10), C(registration, before_build, 10),
    C(order, outside_iterations, 30), C(order, inside_train, 30), C(order, eval, 30),
    C(order, abort_with_acquired, 30),
    C(gradients, gradients, 30), C(gradients, wrong_memory, 30), C(gradients, nonfinite_skip, 30),
    C(structs, structs, 30),
    C(checkpoints, bad_paths, 30), C(checkpoints, other_model, 30), C(checkpoints, latest_garbage, 30),
    C(checkpoints, manifest_truncated, 30), C(checkpoints, manifest_offset, 30), C(checkpoints, manifest_lr, 30),
    C(checkpoints, manifest_step, 30), C(checkpoints, data_truncated, 30), C(checkpoints, data_flipped, 30),
    C(threads, two_at_once, 60), C(threads, handoff, 30), C(threads, fork, 30),
    C(leaks, engines, 240),
    C(logs, logs, 30),
};
#define N_CASES (sizeof k_cases / sizeof k_cases[0])


static const char *run_case(const misuse_case *c, double *seconds) {
  snprintf(g_case_dir, sizeof g_case_dir, "%s/misuse-%s-%s-%d", MISUSE_TMP_DIR, c->group, c->name, (int)getpid());
  mkdir(g_case_dir, 0755);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return "CRASH";
  if (pid == 0) {
    c->fn();
    fflush(NULL);
    _exit(V_OK);
  }
  int st = 0;
  const char *verdict = NULL;
  for (;;) {
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) break;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) > c->timeout_s) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      verdict = "HANG";
      break;
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  char rm[8192];
  snprintf(rm, sizeof rm, "rm -rf '%s'", g_case_dir);
  if (system(rm) != 0) fprintf(stderr, "misuse: could not remove %s\n", g_case_dir);
  if (verdict != NULL) return verdict;
  if (WIFSIGNALED(st)) return "CRASH";
  switch (WEXITSTATUS(st)) {
    case V_OK: return "OK";
    case V_ACCEPTED: return "ACCEPTED";
    case V_CORRUPT: return "CORRUPT";
    case V_SETUP: return "SETUP";
    default: return "CRASH"; /* a sanitizer's exit code */
  }
}

int main(int argc, char **argv) {
  int list = 0;
  const char *filters[64];
  int n_filters = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--list") == 0) {
      list = 1;
    } else if (strcmp(argv[i], "--verbose") == 0) {
      g_verbose = 1;
    } else if (n_filters < 64) {
      filters[n_filters++] = argv[i];
    }
  }
  unsigned counts[6] = {0};
  const char *names[6] = {"OK", "ACCEPTED", "CORRUPT", "CRASH", "HANG", "SETUP"};
  unsigned run = 0;
  for (size_t i = 0; i < N_CASES; ++i) {
    const misuse_case *c = &k_cases[i];
    char full[256];
    snprintf(full, sizeof full, "%s/%s", c->group, c->name);
    int wanted = n_filters == 0;
    for (int f = 0; f < n_filters; ++f) wanted = wanted || strstr(full, filters[f]) != NULL;
    if (!wanted) continue;
    if (list) {
      printf("%s\n", full);
      continue;
    }
    double seconds = 0.0;
    const char *v = run_case(c, &seconds);
    for (int k = 0; k < 6; ++k) {
      if (strcmp(v, names[k]) == 0) ++counts[k];
    }
    ++run;
    printf("%-9s %-40s %6.2f s\n", v, full, seconds);
    fflush(stdout);
  }
  if (list) return 0;
  printf("misuse: %u cases: %u OK, %u ACCEPTED, %u CORRUPT, %u CRASH, %u HANG, %u SETUP%s\n", run, counts[0],
         counts[1], counts[2], counts[3], counts[4], counts[5], MISUSE_ASAN ? " (ASan build)" : "");
  return counts[0] == run ? 0 : 1;
}
