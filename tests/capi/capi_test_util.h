/*
 * Helpers shared by the C API tests: status assertions that print the last
 * error message, engine set-up, reference dtype conversions and a reference
 * AdamW written independently of the library.
 *
 * Everything here is `static inline` so that each test file can include it
 * without unused-function warnings.
 */
#ifndef PSTAR_TESTS_CAPI_TEST_UTIL_H
#define PSTAR_TESTS_CAPI_TEST_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pstar/pstar.h"

#define T_MSG_CAP 4096

/* Copy of the last error message, taken right after a call (the message is
 * valid only until the next libpstar call on this thread). */
static inline void t_copy_last_error(char *buf, size_t cap) {
  const char *m = pstar_last_error_message();
  snprintf(buf, cap, "%s", m == NULL ? "(NULL)" : m);
}

/* Asserts that `call` returns `expected`. */
#define T_STATUS(call, expected)                                                                    \
  do {                                                                                              \
    const pstar_status t_got_ = (call);                                                             \
    const pstar_status t_exp_ = (expected);                                                         \
    char t_msg_[T_MSG_CAP];                                                                         \
    t_copy_last_error(t_msg_, sizeof t_msg_);                                                       \
    cr_assert_eq(t_got_, t_exp_, "%s:%d: %s returned %s (%d), expected %s; last error: \"%s\"",     \
                 __FILE__, __LINE__, #call, pstar_status_name(t_got_), (int)t_got_,                 \
                 pstar_status_name(t_exp_), t_msg_);                                                \
  } while (0)

#define T_OK(call) T_STATUS(call, PSTAR_OK)

/* Asserts that `call` fails with `expected` and that the last error message
 * is non-empty and contains `needle`. */
#define T_FAIL(call, expected, needle)                                                              \
  do {                                                                                              \
    T_STATUS(call, expected);                                                                       \
    char t_m2_[T_MSG_CAP];                                                                          \
    t_copy_last_error(t_m2_, sizeof t_m2_);                                                         \
    cr_assert(t_m2_[0] != '\0', "%s:%d: %s failed with an empty last error message", __FILE__,      \
              __LINE__, #call);                                                                     \
    cr_assert(strstr(t_m2_, (needle)) != NULL,                                                      \
              "%s:%d: last error of %s does not mention \"%s\": \"%s\"", __FILE__, __LINE__, #call, \
              (needle), t_m2_);                                                                     \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Engine set-up                                                             */
/* ------------------------------------------------------------------------ */

static inline pstar_engine_options t_options(pstar_dtype compute, uint64_t chunk_elems) {
  pstar_engine_options o;
  cr_assert_eq(pstar_engine_options_init(&o), PSTAR_OK);
  o.compute_dtype = compute;
  o.chunk_elems = chunk_elems;
  o.threads = 1;
  return o;
}

static inline pstar_engine *t_create(const pstar_engine_options *o) {
  pstar_engine *e = NULL;
  T_OK(pstar_engine_create(o, &e));
  cr_assert_not_null(e);
  return e;
}

static inline uint32_t t_register(pstar_engine *e, const char *name, int64_t numel, uint32_t flags) {
  int64_t shape[1];
  uint32_t id = UINT32_MAX;
  shape[0] = numel;
  T_OK(pstar_param_register(e, name, 1, shape, flags, &id));
  return id;
}

static inline pstar_stats t_stats(pstar_engine *e) {
  pstar_stats s;
  T_OK(pstar_stats_init(&s));
  T_OK(pstar_engine_get_stats(e, &s));
  return s;
}

static inline double t_hparam(pstar_engine *e, pstar_hparam which) {
  double v = -12345.0;
  T_OK(pstar_hparam_get(e, which, &v));
  return v;
}

static inline size_t t_dtype_size(pstar_dtype d) { return d == PSTAR_DTYPE_F32 ? 4u : 2u; }

/* Deterministic values in [-scale, scale] with all mantissa bits in use, so
 * that they are not representable in fp16 or bf16. */
static inline void t_fill(float *x, size_t n, uint32_t seed, float scale) {
  uint32_t s = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const float u = (float)((s >> 8) & 0xffffffu) / 16777216.0f; /* [0,1) */
    x[i] = (2.0f * u - 1.0f) * scale;
    if (x[i] == 0.0f) x[i] = scale * 0.5f;
  }
}

static inline float *t_alloc_f(size_t n) {
  float *p = (float *)calloc(n == 0 ? 1 : n, sizeof(float));
  cr_assert_not_null(p);
  return p;
}

static inline void t_write_f32(pstar_engine *e, uint32_t id, const float *v, uint64_t n) {
  T_OK(pstar_param_write(e, id, v, n, PSTAR_DTYPE_F32));
}

static inline void t_read_f32(pstar_engine *e, uint32_t id, float *v, uint64_t n) {
  T_OK(pstar_param_read(e, id, v, n, PSTAR_DTYPE_F32));
}

/* Acquires, checks the pointer is non-NULL, returns it. */
static inline void *t_acquire(pstar_engine *e, uint32_t id, pstar_stage stage) {
  void *p = NULL;
  T_OK(pstar_param_acquire(e, id, stage, NULL, &p));
  cr_assert_not_null(p);
  return p;
}

/* ------------------------------------------------------------------------ */
/* Reference conversions (round to nearest even), written independently     */
/* ------------------------------------------------------------------------ */

static inline uint32_t t_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float t_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* fp16 -> fp32, exact. */
static inline float t_f16_to_f32(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return (float)(sign * ldexp((double)m, -24));
  if (e == 31) return m == 0 ? (float)(sign * INFINITY) : NAN;
  return (float)(sign * ldexp((double)(m | 0x400), e - 25));
}

/* fp32 -> fp16, round to nearest even, computed through doubles and an
 * exhaustive neighbour comparison (slow but obviously right). */
static inline uint16_t t_f32_to_f16(float f) {
  if (isnan(f)) return 0x7e00;
  const uint16_t sign = signbit(f) ? 0x8000 : 0;
  const double a = fabs((double)f);
  if (a >= 65520.0) return (uint16_t)(sign | 0x7c00); /* rounds to inf */
  /* Find the largest non-negative fp16 magnitude <= a by binary search. */
  uint16_t lo = 0, hi = 0x7bff;
  while (lo < hi) {
    const uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
    if ((double)t_f16_to_f32(mid) <= a) {
      lo = mid;
    } else {
      hi = (uint16_t)(mid - 1);
    }
  }
  const double below = t_f16_to_f32(lo);
  if (below == a) return (uint16_t)(sign | lo);
  const double above = t_f16_to_f32((uint16_t)(lo + 1)); /* may be inf for lo 0x7bff */
  const double d_lo = a - below, d_hi = above - a;
  uint16_t r;
  if (d_lo < d_hi) {
    r = lo;
  } else if (d_hi < d_lo) {
    r = (uint16_t)(lo + 1);
  } else {
    r = (lo & 1) ? (uint16_t)(lo + 1) : lo;
  }
  return (uint16_t)(sign | r);
}

static inline float t_bf16_to_f32(uint16_t b) { return t_f32_from_bits((uint32_t)b << 16); }

/* fp32 -> bf16, round to nearest even; fp32 subnormals become signed zero
 * (the library's documented policy). */
static inline uint16_t t_f32_to_bf16(float f) {
  uint32_t x = t_f32_bits(f);
  if (isnan(f)) return (uint16_t)((x >> 16) | 0x40);
  if ((x & 0x7f800000u) == 0) return (uint16_t)((x >> 16) & 0x8000u);
  const uint32_t upper = x >> 16;
  const uint32_t rest = x & 0xffffu;
  uint32_t r = upper;
  if (rest > 0x8000u || (rest == 0x8000u && (upper & 1u))) r = upper + 1u;
  return (uint16_t)r;
}

/* Rounds v through `dtype` and back to fp32. */
static inline float t_round(pstar_dtype dtype, float v) {
  if (dtype == PSTAR_DTYPE_F16) return t_f16_to_f32(t_f32_to_f16(v));
  if (dtype == PSTAR_DTYPE_BF16) return t_bf16_to_f32(t_f32_to_bf16(v));
  return v;
}

/* Element i of a compute-dtype buffer, widened to fp32. */
static inline float t_load(const void *buf, pstar_dtype dtype, size_t i) {
  if (dtype == PSTAR_DTYPE_F32) return ((const float *)buf)[i];
  if (dtype == PSTAR_DTYPE_F16) return t_f16_to_f32(((const uint16_t *)buf)[i]);
  return t_bf16_to_f32(((const uint16_t *)buf)[i]);
}

static inline void t_store(void *buf, pstar_dtype dtype, size_t i, float v) {
  if (dtype == PSTAR_DTYPE_F32) {
    ((float *)buf)[i] = v;
  } else if (dtype == PSTAR_DTYPE_F16) {
    ((uint16_t *)buf)[i] = t_f32_to_f16(v);
  } else {
    ((uint16_t *)buf)[i] = t_f32_to_bf16(v);
  }
}

/* ------------------------------------------------------------------------ */
/* Reference AdamW                                                           */
/* ------------------------------------------------------------------------ */

/* Per-parameter state of the reference optimizer. */
typedef struct t_adam_hyper {
  float lr, beta1, beta2, eps, weight_decay;
  int adamw;
} t_adam_hyper;

/* The documented float arithmetic (DESIGN.md section 5): constants per step
 * in double rounded to float, then one fmaf-based update per element.  The
 * test files are compiled with -ffp-contract=off. */
static inline void t_adam_float_update(const t_adam_hyper *h, uint64_t step, double grad_mul, int decay,
                                       const float *g_stored, float *p, float *m, float *v, size_t n) {
  const double t = (double)step;
  const double bc1 = 1.0 - pow((double)h->beta1, t);
  const double bc2 = 1.0 - pow((double)h->beta2, t);
  const float gm = (float)grad_mul;
  const float b1 = h->beta1, b2 = h->beta2;
  const float omb1 = (float)(1.0 - (double)h->beta1);
  const float omb2 = (float)(1.0 - (double)h->beta2);
  const float step_size = (float)((double)h->lr / bc1);
  const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
  const float wd = decay ? h->weight_decay : 0.0f;
  const float l2 = h->adamw ? 0.0f : wd;
  const float decay_mul = h->adamw ? (float)(1.0 - (double)h->lr * (double)wd) : 1.0f;
  for (size_t i = 0; i < n; ++i) {
    float g = g_stored[i] * gm;
    g = fmaf(l2, p[i], g);
    m[i] = fmaf(b1, m[i], omb1 * g);
    v[i] = fmaf(b2, v[i], (omb2 * g) * g);
    const float denom = fmaf(sqrtf(v[i]), inv_sqrt_bc2, h->eps);
    p[i] = p[i] * decay_mul;
    p[i] = fmaf(-step_size, m[i] / denom, p[i]);
  }
}

/* Textbook AdamW (Loshchilov & Hutter) in double, for an independent check
 * within a tolerance. */
static inline void t_adam_double_update(const t_adam_hyper *h, uint64_t step, double grad_mul, int decay,
                                        const double *g_stored, double *p, double *m, double *v, size_t n) {
  const double lr = h->lr, b1 = h->beta1, b2 = h->beta2, eps = h->eps;
  const double wd = decay ? h->weight_decay : 0.0;
  const double bc1 = 1.0 - pow(b1, (double)step);
  const double bc2 = 1.0 - pow(b2, (double)step);
  for (size_t i = 0; i < n; ++i) {
    double g = g_stored[i] * grad_mul;
    if (!h->adamw) g += wd * p[i];
    m[i] = b1 * m[i] + (1.0 - b1) * g;
    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
    const double mhat = m[i] / bc1;
    const double vhat = v[i] / bc2;
    if (h->adamw) p[i] -= lr * wd * p[i];
    p[i] -= lr * mhat / (sqrt(vhat) + eps);
  }
}

#endif /* PSTAR_TESTS_CAPI_TEST_UTIL_H */
