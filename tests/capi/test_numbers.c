/* Floating-point settings are checked as the library stores them (issue 18,
 * group 2): every floating field of the options, every hyperparameter of
 * pstar_hparam_set, pstar_param_set_lr_scale, the modelled bandwidths and
 * pstar_clock_advance, walked with values at and around their float
 * limits.  Each value is either refused with PSTAR_ERR_INVALID_ARGUMENT and
 * nothing changed, or accepted and stored as the float it rounds to.
 *
 * The expectations are written out per value and range (the tables below),
 * not computed from the ranges, so that the test does not share the
 * library's arithmetic. */
#define PSTAR_EXPERIMENTAL_API
#include <float.h>
#include <math.h>

#include "capi_test_util.h"

/* Ranges, one column each in the probe table. */
enum {
  R_L, /* [0, 1e30]: lr, weight_decay, clip_norm, lr_scale */
  R_B, /* [0, 1): betas */
  R_E, /* [FLT_MIN, 1e30]: eps */
  R_S, /* [FLT_MIN, FLT_MAX]: loss scales */
  R_G, /* [1, 1e30]: loss_scale_growth_factor */
  R_K, /* (0, 1]: loss_scale_backoff_factor */
  R_COUNT
};

typedef struct probe {
  const char *what;
  double value;
  int ok[R_COUNT]; /* 1: accepted, 0: refused */
} probe;

#define Y 1
#define N 0

/* The double a C cast to float gives, defined for every double: values from
 * FLT_MAX + half its ulp on round to infinity. */
static float t_to_float(double v) {
  const double edge = (double)FLT_MAX + ldexp(1.0, 103);
  if (v >= edge) return INFINITY;
  if (v <= -edge) return -INFINITY;
  return (float)v;
}

static const probe *probes(size_t *count) {
  static probe p[64];
  static size_t n = 0;
  if (n != 0) {
    *count = n;
    return p;
  }
  const double flt_true_min = (double)nextafterf(0.0f, 1.0f);
  const double below_one = 1.0 - ldexp(1.0, -24);
  const double tie_to_one = 1.0 - ldexp(1.0, -25); /* halfway: rounds to even, 1.0f */
  const double max_setting = (double)1e30f;
  const probe table[] = {
      /*                                           L  B  E  S  G  K */
      {"0", 0.0, {Y, Y, N, N, N, N}},
      {"-0", -0.0, {Y, Y, N, N, N, N}},
      {"DBL_TRUE_MIN (rounds to 0)", nextafter(0.0, 1.0), {Y, Y, N, N, N, N}},
      {"1e-60 (rounds to 0)", 1e-60, {Y, Y, N, N, N, N}},
      {"1e-46 (rounds to 0)", 1e-46, {Y, Y, N, N, N, N}},
      {"-1e-46 (rounds to -0)", -1e-46, {Y, Y, N, N, N, N}},
      {"0.6 FLT_TRUE_MIN (rounds up to it)", 0.6 * flt_true_min, {Y, Y, N, N, N, Y}},
      {"FLT_TRUE_MIN", flt_true_min, {Y, Y, N, N, N, Y}},
      {"FLT_MIN / 2 (subnormal)", (double)FLT_MIN / 2, {Y, Y, N, N, N, Y}},
      {"largest subnormal", (double)nextafterf(FLT_MIN, 0.0f), {Y, Y, N, N, N, Y}},
      {"FLT_MIN", (double)FLT_MIN, {Y, Y, Y, Y, N, Y}},
      {"1e-8", 1e-8, {Y, Y, Y, Y, N, Y}},
      {"0.5", 0.5, {Y, Y, Y, Y, N, Y}},
      {"0.99999997 (rounds to 1 - 2^-24)", 0.99999997, {Y, Y, Y, Y, N, Y}},
      {"1 - 2^-24", below_one, {Y, Y, Y, Y, N, Y}},
      {"just below the tie", nextafter(tie_to_one, 0.0), {Y, Y, Y, Y, N, Y}},
      {"1 - 2^-25 (ties to 1)", tie_to_one, {Y, N, Y, Y, Y, Y}},
      {"0.99999999999 (rounds to 1)", 0.99999999999, {Y, N, Y, Y, Y, Y}},
      {"1", 1.0, {Y, N, Y, Y, Y, Y}},
      {"1 + 2^-23", 1.0 + ldexp(1.0, -23), {Y, N, Y, Y, Y, N}},
      {"65536", 65536.0, {Y, N, Y, Y, Y, N}},
      {"1e30 (double)", 1e30, {Y, N, Y, Y, Y, N}},
      {"1e30f", max_setting, {Y, N, Y, Y, Y, N}},
      {"just above 1e30f (rounds to it)", nextafter(max_setting, INFINITY), {Y, N, Y, Y, Y, N}},
      {"the float after 1e30f", (double)nextafterf(1e30f, INFINITY), {N, N, N, Y, N, N}},
      {"1e38", 1e38, {N, N, N, Y, N, N}},
      {"FLT_MAX", (double)FLT_MAX, {N, N, N, Y, N, N}},
      {"FLT_MAX + 2^102 (rounds to FLT_MAX)", (double)FLT_MAX + ldexp(1.0, 102), {N, N, N, Y, N, N}},
      {"FLT_MAX + 2^103 (rounds to inf)", (double)FLT_MAX + ldexp(1.0, 103), {N, N, N, N, N, N}},
      {"1e300", 1e300, {N, N, N, N, N, N}},
      {"DBL_MAX", DBL_MAX, {N, N, N, N, N, N}},
      {"inf", INFINITY, {N, N, N, N, N, N}},
      {"-inf", -INFINITY, {N, N, N, N, N, N}},
      {"NaN", NAN, {N, N, N, N, N, N}},
      {"-NaN", -NAN, {N, N, N, N, N, N}},
      {"-FLT_TRUE_MIN", -flt_true_min, {N, N, N, N, N, N}},
      {"-1e-8", -1e-8, {N, N, N, N, N, N}},
      {"-1", -1.0, {N, N, N, N, N, N}},
      {"-FLT_MAX", -(double)FLT_MAX, {N, N, N, N, N, N}},
  };
  n = sizeof table / sizeof table[0];
  cr_assert(n <= sizeof p / sizeof p[0]);
  memcpy(p, table, sizeof table);
  *count = n;
  return p;
}

/* Same bits, as doubles (negative zero and NaN included). */
static int same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ------------------------------------------------------------------------ */
/* Options                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct option_field {
  const char *name;
  int range;
  float *(*field)(pstar_engine_options *o);
  pstar_hparam readback; /* PSTAR_HPARAM_STEP: not readable as such */
} option_field;

static float *f_lr(pstar_engine_options *o) { return &o->lr; }
static float *f_beta1(pstar_engine_options *o) { return &o->beta1; }
static float *f_beta2(pstar_engine_options *o) { return &o->beta2; }
static float *f_eps(pstar_engine_options *o) { return &o->eps; }
static float *f_wd(pstar_engine_options *o) { return &o->weight_decay; }
static float *f_clip(pstar_engine_options *o) { return &o->clip_norm; }
static float *f_ls_init(pstar_engine_options *o) { return &o->loss_scale_initial; }
static float *f_ls_min(pstar_engine_options *o) { return &o->loss_scale_min; }
static float *f_ls_growth(pstar_engine_options *o) { return &o->loss_scale_growth_factor; }
static float *f_ls_backoff(pstar_engine_options *o) { return &o->loss_scale_backoff_factor; }

static const option_field k_option_fields[] = {
    {"lr", R_L, f_lr, PSTAR_HPARAM_LR},
    {"beta1", R_B, f_beta1, PSTAR_HPARAM_BETA1},
    {"beta2", R_B, f_beta2, PSTAR_HPARAM_BETA2},
    {"eps", R_E, f_eps, PSTAR_HPARAM_EPS},
    {"weight_decay", R_L, f_wd, PSTAR_HPARAM_WEIGHT_DECAY},
    {"clip_norm", R_L, f_clip, PSTAR_HPARAM_CLIP_NORM},
    {"loss_scale_initial", R_S, f_ls_init, PSTAR_HPARAM_LOSS_SCALE},
    {"loss_scale_min", R_S, f_ls_min, PSTAR_HPARAM_STEP},
    {"loss_scale_growth_factor", R_G, f_ls_growth, PSTAR_HPARAM_STEP},
    {"loss_scale_backoff_factor", R_K, f_ls_backoff, PSTAR_HPARAM_STEP},
};

/* One F16 TRAIN iteration of parameter `id` (8 elements) with gradient g
 * (NAN: an overflow), then the step; returns the loss scale after it. */
static double one_step(pstar_engine *e, uint32_t id, float g) {
  float grad[8];
  for (int i = 0; i < 8; ++i) grad[i] = g;
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  t_acquire(e, id, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, id, NULL));
  t_acquire(e, id, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(e, id, grad, 8, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, id, NULL));
  T_OK(pstar_step(e, NULL));
  return t_hparam(e, PSTAR_HPARAM_LOSS_SCALE);
}

/* The loss scaler's settings have no getter: their effect on the scale is
 * read instead.  A floor: an overflow from the floor itself stays there.  A
 * growth factor: one clean step with growth_interval 1 from a scale of 1.  A
 * backoff factor: one overflow from 1 with the floor at FLT_MIN. */
static void check_scaler_setting(const option_field *f, float stored) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
  o.loss_scale_hysteresis = 1;
  o.loss_scale_growth_interval = 1;
  o.loss_scale_initial = 1.0f;
  o.loss_scale_min = FLT_MIN;
  double want;
  int overflow;
  if (f->field == f_ls_min) {
    o.loss_scale_initial = stored;
    o.loss_scale_min = stored;
    want = stored;
    overflow = 1;
  } else if (f->field == f_ls_growth) {
    o.loss_scale_growth_factor = stored;
    want = stored; /* 1 * growth */
    overflow = 0;
  } else {
    o.loss_scale_backoff_factor = stored;
    want = stored < FLT_MIN ? FLT_MIN : stored; /* 1 * backoff, floored */
    overflow = 1;
  }
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", 8, 0);
  T_OK(pstar_engine_build(e));
  const double got = one_step(e, id, overflow ? NAN : 0.5f);
  cr_assert(same_bits(got, want), "%s = %a: loss scale %a after one step, expected %a", f->name, (double)stored,
            got, want);
  T_OK(pstar_engine_destroy(e));
}

Test(numbers, every_floating_option_is_checked_as_stored) {
  size_t np;
  const probe *p = probes(&np);
  for (size_t fi = 0; fi < sizeof k_option_fields / sizeof k_option_fields[0]; ++fi) {
    const option_field *f = &k_option_fields[fi];
    for (size_t i = 0; i < np; ++i) {
      pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
      const float v = t_to_float(p[i].value);
      *f->field(&o) = v;
      pstar_engine *e = (pstar_engine *)(uintptr_t)0x42;
      const pstar_status s = pstar_engine_create(&o, &e);
      char msg[T_MSG_CAP];
      t_copy_last_error(msg, sizeof msg);
      if (!p[i].ok[f->range]) {
        cr_assert_eq(s, PSTAR_ERR_INVALID_ARGUMENT, "options.%s = %s (%a): got %s, expected a refusal (\"%s\")",
                     f->name, p[i].what, (double)v, pstar_status_name(s), msg);
        cr_assert(strstr(msg, f->name) != NULL, "options.%s = %s: message does not name the field: \"%s\"", f->name,
                  p[i].what, msg);
        cr_assert_eq((uintptr_t)e, (uintptr_t)0x42, "options.%s = %s: out_engine written on failure", f->name,
                     p[i].what);
        continue;
      }
      cr_assert_eq(s, PSTAR_OK, "options.%s = %s (%a): got %s (\"%s\"), expected it accepted", f->name, p[i].what,
                   (double)v, pstar_status_name(s), msg);
      if (f->readback != PSTAR_HPARAM_STEP) {
        const double got = t_hparam(e, f->readback);
        cr_assert(same_bits(got, (double)v), "options.%s = %s: reads back as %a, stored %a", f->name, p[i].what, got,
                  (double)v);
      }
      T_OK(pstar_engine_destroy(e));
      if (f->readback == PSTAR_HPARAM_STEP) check_scaler_setting(f, v);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Hyperparameters                                                           */
/* ------------------------------------------------------------------------ */

typedef struct hparam_case {
  const char *name;
  pstar_hparam which;
  int range;
} hparam_case;

static const hparam_case k_hparams[] = {
    {"lr", PSTAR_HPARAM_LR, R_L},
    {"beta1", PSTAR_HPARAM_BETA1, R_B},
    {"beta2", PSTAR_HPARAM_BETA2, R_B},
    {"eps", PSTAR_HPARAM_EPS, R_E},
    {"weight_decay", PSTAR_HPARAM_WEIGHT_DECAY, R_L},
    {"clip_norm", PSTAR_HPARAM_CLIP_NORM, R_L},
    {"loss scale", PSTAR_HPARAM_LOSS_SCALE, R_S},
};

Test(numbers, every_hyperparameter_is_checked_as_stored) {
  size_t np;
  const probe *p = probes(&np);
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024); /* F16: the loss scale is settable */
  pstar_engine *e = t_create(&o);
  for (size_t hi = 0; hi < sizeof k_hparams / sizeof k_hparams[0]; ++hi) {
    const hparam_case *h = &k_hparams[hi];
    for (size_t i = 0; i < np; ++i) {
      const double before = t_hparam(e, h->which);
      const pstar_status s = pstar_hparam_set(e, h->which, p[i].value);
      char msg[T_MSG_CAP];
      t_copy_last_error(msg, sizeof msg);
      const double after = t_hparam(e, h->which);
      if (!p[i].ok[h->range]) {
        cr_assert_eq(s, PSTAR_ERR_INVALID_ARGUMENT, "hparam %s = %s (%a): got %s, expected a refusal (\"%s\")",
                     h->name, p[i].what, p[i].value, pstar_status_name(s), msg);
        cr_assert(strstr(msg, h->name) != NULL, "hparam %s = %s: message does not name it: \"%s\"", h->name,
                  p[i].what, msg);
        cr_assert(same_bits(before, after), "hparam %s = %s: refused but changed from %a to %a", h->name, p[i].what,
                  before, after);
        continue;
      }
      cr_assert_eq(s, PSTAR_OK, "hparam %s = %s (%a): got %s (\"%s\"), expected it accepted", h->name, p[i].what,
                   p[i].value, pstar_status_name(s), msg);
      const double stored = (double)t_to_float(p[i].value);
      cr_assert(same_bits(after, stored), "hparam %s = %s: reads back as %a, expected the float %a", h->name,
                p[i].what, after, stored);
    }
  }
  T_OK(pstar_engine_destroy(e));
}

/* The three reports of the issue: each refused, and the next step with a
 * zero gradient keeps every master finite. */
Test(numbers, values_that_round_out_of_range_never_reach_a_step) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, 1024);
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", 8, 0);
  T_OK(pstar_engine_build(e));
  float w[8] = {1, -2, 3, -4, 0.5f, 0.25f, -0.125f, 8};
  t_write_f32(e, id, w, 8);
  T_FAIL(pstar_hparam_set(e, PSTAR_HPARAM_BETA1, 0.99999999999), PSTAR_ERR_INVALID_ARGUMENT, "rounds to 1");
  T_FAIL(pstar_hparam_set(e, PSTAR_HPARAM_BETA2, 0.99999999999), PSTAR_ERR_INVALID_ARGUMENT, "beta2");
  T_FAIL(pstar_hparam_set(e, PSTAR_HPARAM_EPS, 1e-60), PSTAR_ERR_INVALID_ARGUMENT, "rounds to 0");
  T_FAIL(pstar_hparam_set(e, PSTAR_HPARAM_LOSS_SCALE, 1e-60), PSTAR_ERR_INVALID_ARGUMENT, "loss scale");
  one_step(e, id, 0.0f);
  one_step(e, id, 0.0f);
  float got[8];
  t_read_f32(e, id, got, 8);
  for (int i = 0; i < 8; ++i) cr_assert(isfinite(got[i]), "master %d is %a after the refused settings", i, got[i]);
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Per-parameter settings                                                    */
/* ------------------------------------------------------------------------ */

/* Trains one parameter one step with the given learning rate and lr_scale
 * (set only when `set_scale`); returns its masters in out[8]. */
static void train_once(float lr, float lr_scale, int set_scale, float *out) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = lr;
  o.weight_decay = 0.0f;
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", 8, 0);
  T_OK(pstar_engine_build(e));
  const float w[8] = {1, -2, 3, -4, 0.5f, 0.25f, -0.125f, 8};
  t_write_f32(e, id, w, 8);
  if (set_scale) T_OK(pstar_param_set_lr_scale(e, id, lr_scale));
  one_step(e, id, 0.375f);
  t_read_f32(e, id, out, 8);
  T_OK(pstar_engine_destroy(e));
}

Test(numbers, lr_scale_is_checked_as_given_and_stored_as_given) {
  size_t np;
  const probe *p = probes(&np);
  /* Refused values leave the scale as it was: 0.25 here, which the step
   * must then use. */
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.lr = 1.0f;
  o.weight_decay = 0.0f;
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", 8, 0);
  T_OK(pstar_engine_build(e));
  const float w[8] = {1, -2, 3, -4, 0.5f, 0.25f, -0.125f, 8};
  t_write_f32(e, id, w, 8);
  T_OK(pstar_param_set_lr_scale(e, id, 0.25f));
  for (size_t i = 0; i < np; ++i) {
    if (p[i].ok[R_L]) continue;
    const float v = t_to_float(p[i].value);
    T_FAIL(pstar_param_set_lr_scale(e, id, v), PSTAR_ERR_INVALID_ARGUMENT, "lr_scale");
  }
  one_step(e, id, 0.375f);
  float got[8], want[8];
  t_read_f32(e, id, got, 8);
  T_OK(pstar_engine_destroy(e));
  train_once(0.25f, 1.0f, 0, want); /* lr 1 x scale 0.25 = lr 0.25 x 1 */
  cr_assert_eq(memcmp(got, want, sizeof got), 0, "refused lr_scales changed the stored 0.25");

  /* Accepted values are used as given: lr 1 x scale s trains like lr s. */
  for (size_t i = 0; i < np; ++i) {
    if (!p[i].ok[R_L]) continue;
    const float v = t_to_float(p[i].value);
    train_once(1.0f, v, 1, got);
    train_once(v, 1.0f, 0, want);
    cr_assert_eq(memcmp(got, want, sizeof got), 0, "lr_scale %s (%a) is not used as given", p[i].what, (double)v);
  }
}

/* ------------------------------------------------------------------------ */
/* Doubles kept as doubles: bandwidths and the virtual clock                 */
/* ------------------------------------------------------------------------ */

typedef struct wide_probe {
  const char *what;
  double value;
  int ok;
} wide_probe;

static const wide_probe k_bandwidths[] = {
    {"0 (the default)", 0.0, Y},
    {"-0", -0.0, Y},
    {"DBL_TRUE_MIN", 4.9406564584124654e-324, N},
    {"1e-300", 1e-300, N},
    {"0.5", 0.5, N},
    {"just below 1", 0.99999999999999989, N},
    {"1", 1.0, Y},
    {"12e9", 12e9, Y},
    {"1e18", 1e18, Y},
    {"just above 1e18", 1.0000000000000001e18 + 256.0, N},
    {"FLT_MAX", (double)FLT_MAX, N},
    {"DBL_MAX", DBL_MAX, N},
    {"inf", INFINITY, N},
    {"NaN", NAN, N},
    {"-1", -1.0, N},
    {"-inf", -INFINITY, N},
};

Test(numbers, modelled_bandwidths_are_zero_or_at_least_one_byte_per_second) {
  for (size_t i = 0; i < sizeof k_bandwidths / sizeof k_bandwidths[0]; ++i) {
    for (int which = 0; which < 2; ++which) {
      pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
      o.virtual_clock = 1;
      if (which == 0) {
        o.h2d_bytes_per_s = k_bandwidths[i].value;
      } else {
        o.d2h_bytes_per_s = k_bandwidths[i].value;
      }
      pstar_engine *e = NULL;
      const pstar_status s = pstar_engine_create(&o, &e);
      char msg[T_MSG_CAP];
      t_copy_last_error(msg, sizeof msg);
      if (k_bandwidths[i].ok) {
        cr_assert_eq(s, PSTAR_OK, "%s_bytes_per_s = %s: got %s (\"%s\")", which ? "d2h" : "h2d", k_bandwidths[i].what,
                     pstar_status_name(s), msg);
        T_OK(pstar_engine_destroy(e));
      } else {
        cr_assert_eq(s, PSTAR_ERR_INVALID_ARGUMENT, "%s_bytes_per_s = %s: got %s", which ? "d2h" : "h2d",
                     k_bandwidths[i].what, pstar_status_name(s));
        cr_assert(strstr(msg, "bytes_per_s") != NULL, "message: \"%s\"", msg);
        cr_assert_null(e);
      }
    }
  }
}

Test(numbers, nvme_bandwidths_are_zero_or_at_least_one_byte_per_second) {
  for (size_t i = 0; i < sizeof k_bandwidths / sizeof k_bandwidths[0]; ++i) {
    for (int which = 0; which < 2; ++which) {
      pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
      o.dry_run = 1; /* no file needed */
      pstar_engine *e = t_create(&o);
      pstar_x_nvme_options n;
      T_OK(pstar_x_nvme_options_init(&n));
      if (which == 0) {
        n.read_bytes_per_s = k_bandwidths[i].value;
      } else {
        n.write_bytes_per_s = k_bandwidths[i].value;
      }
      const pstar_status s = pstar_x_engine_set_nvme(e, &n);
      char msg[T_MSG_CAP];
      t_copy_last_error(msg, sizeof msg);
      if (k_bandwidths[i].ok) {
        /* UNSUPPORTED: a build without the NVMe tier. */
        cr_assert(s == PSTAR_OK || s == PSTAR_ERR_UNSUPPORTED, "nvme %s = %s: got %s (\"%s\")",
                  which ? "write" : "read", k_bandwidths[i].what, pstar_status_name(s), msg);
      } else {
        cr_assert_eq(s, PSTAR_ERR_INVALID_ARGUMENT, "nvme %s = %s: got %s", which ? "write" : "read",
                     k_bandwidths[i].what, pstar_status_name(s));
        cr_assert(strstr(msg, "bytes_per_s") != NULL, "message: \"%s\"", msg);
      }
      T_OK(pstar_engine_destroy(e));
    }
  }
}

Test(numbers, the_virtual_clock_stays_finite) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  o.virtual_clock = 1;
  pstar_engine *e = t_create(&o);
  double now = -1;
  T_OK(pstar_clock_advance(e, 0.0));
  T_OK(pstar_clock_advance(e, -0.0));
  T_OK(pstar_clock_advance(e, 4.9406564584124654e-324));
  const double refused[] = {-1e-300, -1.0, INFINITY, -INFINITY, NAN};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; ++i) {
    T_OK(pstar_clock_now(e, &now));
    T_FAIL(pstar_clock_advance(e, refused[i]), PSTAR_ERR_INVALID_ARGUMENT, "seconds");
    double again = -1;
    T_OK(pstar_clock_now(e, &again));
    cr_assert(same_bits(now, again), "a refused advance moved the clock");
  }
  T_OK(pstar_clock_advance(e, DBL_MAX));
  T_OK(pstar_clock_now(e, &now));
  cr_assert(isfinite(now));
  T_FAIL(pstar_clock_advance(e, DBL_MAX), PSTAR_ERR_INVALID_ARGUMENT, "clock");
  double again = -1;
  T_OK(pstar_clock_now(e, &again));
  cr_assert(same_bits(now, again), "a refused advance moved the clock");
  T_OK(pstar_engine_destroy(e));
}
