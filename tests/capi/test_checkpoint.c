/* Checkpoints: exact resume, another chunk size, crash points, corruption
 * of every byte of the manifest and of the data files, loads that fail
 * before and after they begin writing, safetensors (docs/checkpoints.md). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capi_test_util.h"
#include "ckpt_test_util.h"

enum { P = 4, N = 700 };

typedef struct model {
  pstar_engine *e;
  uint32_t ids[P + 1]; /* the last one frozen */
  int variant;         /* make_variant's */
} model;

/* `variant` 1: "layer 2" is called "layer 9"; 2: "layer 2" has one element
 * more (another parameter set than the checkpoints' tests save). */
static void make_variant(model *m, pstar_dtype dt, uint64_t chunk, uint64_t capacity, int variant) {
  pstar_engine_options o = t_options(dt, chunk);
  o.device_capacity_bytes = capacity;
  o.lr = 1e-2f;
  o.loss_scale_initial = 1024.0f;
  o.loss_scale_growth_interval = 3; /* the scaler's state moves during the run */
  m->e = t_create(&o);
  m->variant = variant;
  char name[16];
  for (int i = 0; i < P; ++i) {
    snprintf(name, sizeof name, "layer %d", i == 2 && variant == 1 ? 9 : i); /* a space: escaped in the manifest */
    m->ids[i] = t_register(m->e, name, N + 37 * i + (i == 2 && variant == 2), 0);
  }
  m->ids[P] = t_register(m->e, "frozen", N, PSTAR_PARAM_FROZEN);
  T_OK(pstar_engine_build(m->e));
  float *v = t_alloc_f(N + 37 * P);
  for (int i = 0; i <= P; ++i) {
    const int n = N + 37 * (i < P ? i : 0) + (i == 2 && variant == 2);
    t_fill(v, (size_t)n, (uint32_t)(11 + i), 0.5f);
    t_write_f32(m->e, m->ids[i], v, (uint64_t)n);
  }
  free(v);
}

static void make(model *m, pstar_dtype dt, uint64_t chunk, uint64_t capacity) {
  make_variant(m, dt, chunk, capacity, 0);
}

static void step(model *m, int s) {
  float *g = t_alloc_f(N + 37 * P);
  const float scale = (float)t_hparam(m->e, PSTAR_HPARAM_LOSS_SCALE);
  T_OK(pstar_iteration_begin(m->e, PSTAR_ITERATION_TRAIN));
  for (int i = 0; i <= P; ++i) {
    (void)t_acquire(m->e, m->ids[i], PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(m->e, m->ids[i], NULL));
  }
  for (int i = P; i >= 0; --i) {
    (void)t_acquire(m->e, m->ids[i], PSTAR_STAGE_BACKWARD);
    if (i < P) {
      const int n = N + 37 * i;
      for (int j = 0; j < n; ++j) g[j] = scale * (float)(((j * 7 + s * 13 + i) % 29) - 14) / 256.0f;
      T_OK(pstar_grad_write(m->e, m->ids[i], g, (uint64_t)n, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    }
    T_OK(pstar_param_release(m->e, m->ids[i], NULL));
  }
  T_OK(pstar_step(m->e, NULL));
  free(g);
}

static void snapshot(model *m, float *out) {
  size_t at = 0;
  for (int i = 0; i <= P; ++i) {
    const int n = N + 37 * (i < P ? i : 0) + (i == 2 && m->variant == 2);
    t_read_f32(m->e, m->ids[i], out + at, (uint64_t)n);
    at += (size_t)n;
  }
}

enum { TOTAL = P * N + 37 * (0 + 1 + 2 + 3) + N };

static char *tmpdir(const char *tag) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/ckpt-test-%s-%d", PSTAR_TEST_TMP_DIR, tag, (int)getpid());
  char cmd[sizeof buf + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", buf);
  if (system(cmd) != 0) cr_assert_fail("rm");
  return buf;
}

static void latest_path(const char *dir, const char *file, char *out, size_t cap) {
  ck_latest_path(dir, file, out, cap);
}

static void check_resume(pstar_dtype dt, uint64_t chunk_after) {
  static float full[TOTAL], resumed[TOTAL];
  const char *dir = tmpdir(dt == PSTAR_DTYPE_F16 ? "f16" : "bf16");
  model a;
  make(&a, dt, 1024, 0);
  for (int s = 0; s < 5; ++s) step(&a, s);
  T_OK(pstar_checkpoint_save(a.e, dir));
  for (int s = 5; s < 9; ++s) step(&a, s);
  snapshot(&a, full);
  const double scale_full = t_hparam(a.e, PSTAR_HPARAM_LOSS_SCALE);
  T_OK(pstar_engine_destroy(a.e));

  model b; /* fresh values: all overwritten by the load */
  make(&b, dt, chunk_after, 3 * chunk_after * 2);
  T_OK(pstar_checkpoint_load(b.e, dir));
  cr_assert_eq(t_hparam(b.e, PSTAR_HPARAM_STEP), 5.0);
  for (int s = 5; s < 9; ++s) step(&b, s);
  snapshot(&b, resumed);
  for (int i = 0; i < TOTAL; ++i) {
    cr_assert_eq(t_f32_bits(full[i]), t_f32_bits(resumed[i]), "element %d: %.9g uninterrupted, %.9g resumed", i,
                 (double)full[i], (double)resumed[i]);
  }
  cr_assert_eq(t_hparam(b.e, PSTAR_HPARAM_LOSS_SCALE), scale_full);
  T_OK(pstar_engine_destroy(b.e));
}

Test(checkpoint, resume_is_bit_exact_bf16) { check_resume(PSTAR_DTYPE_BF16, 1024); }
Test(checkpoint, resume_is_bit_exact_f16_with_loss_scaling_and_another_chunk_size) {
  check_resume(PSTAR_DTYPE_F16, 2048);
}

/* Adam's moments exist from a chunk's first update (chunk::Fp32Lists): a
 * checkpoint saved before any step holds zeros for them, and loading it
 * into a fresh engine, or into one that has trained (its moments exist),
 * resumes exactly as the uninterrupted run. */
Test(checkpoint, a_checkpoint_before_the_first_step_holds_zero_moments_and_resumes_exactly) {
  static float full[TOTAL], resumed[TOTAL];
  const char *dir = tmpdir("before-step");
  model a;
  make(&a, PSTAR_DTYPE_BF16, 1024, 0);
  T_OK(pstar_checkpoint_save(a.e, dir));
  for (int s = 0; s < 4; ++s) step(&a, s);
  snapshot(&a, full);
  T_OK(pstar_engine_destroy(a.e));
  for (int f = 0; f < 2; ++f) {
    char path[1024];
    latest_path(dir, f == 0 ? "exp_avg.f32" : "exp_avg_sq.f32", path, sizeof path);
    size_t len = 0;
    unsigned char *data = ck_slurp(path, &len);
    cr_assert_eq(len, (size_t)(P * N + 37 * (0 + 1 + 2 + 3)) * sizeof(float), "%s: %zu bytes", path, len);
    for (size_t i = 0; i < len; ++i) cr_assert_eq(data[i], 0, "%s: byte %zu is %d", path, i, data[i]);
    free(data);
  }
  for (int trained_first = 0; trained_first < 2; ++trained_first) {
    model b;
    make(&b, PSTAR_DTYPE_BF16, 1024, 0);
    if (trained_first) {
      for (int s = 0; s < 2; ++s) step(&b, s + 7);
    }
    T_OK(pstar_checkpoint_load(b.e, dir));
    cr_assert_eq(t_hparam(b.e, PSTAR_HPARAM_STEP), 0.0);
    for (int s = 0; s < 4; ++s) step(&b, s);
    snapshot(&b, resumed);
    for (int i = 0; i < TOTAL; ++i) {
      cr_assert_eq(t_f32_bits(full[i]), t_f32_bits(resumed[i]), "%s: element %d: %.9g uninterrupted, %.9g resumed",
                   trained_first ? "after training" : "fresh", i, (double)full[i], (double)resumed[i]);
    }
    T_OK(pstar_engine_destroy(b.e));
  }
}

Test(checkpoint, a_crash_at_any_point_leaves_the_previous_checkpoint) {
  static float first[TOTAL], after[TOTAL];
  const char *dir = tmpdir("crash");
  for (int point = 1; point <= 8; ++point) {
    model a;
    make(&a, PSTAR_DTYPE_BF16, 1024, 0);
    step(&a, 0);
    unsetenv("PSTAR_TEST_CHECKPOINT_CRASH_AT");
    T_OK(pstar_checkpoint_save(a.e, dir));
    snapshot(&a, first);
    step(&a, 1);
    char v[8];
    snprintf(v, sizeof v, "%d", point);
    setenv("PSTAR_TEST_CHECKPOINT_CRASH_AT", v, 1);
    pstar_status st = pstar_checkpoint_save(a.e, dir);
    unsetenv("PSTAR_TEST_CHECKPOINT_CRASH_AT");
    T_OK(pstar_engine_destroy(a.e));
    model b;
    make(&b, PSTAR_DTYPE_BF16, 1024, 0);
    T_OK(pstar_checkpoint_load(b.e, dir));
    snapshot(&b, after);
    if (point < 8) {
      cr_assert_eq(st, PSTAR_ERR_IO, "point %d", point);
      cr_assert_eq(memcmp(first, after, sizeof first), 0, "a crash at point %d lost the previous checkpoint", point);
    } else {
      /* After the rename the new checkpoint is the one (the crash came
       * after it was made current). */
      cr_assert_eq(st, PSTAR_ERR_IO);
      cr_assert_neq(memcmp(first, after, sizeof first), 0, "point 8: the new checkpoint is current");
    }
    T_OK(pstar_engine_destroy(b.e));
  }
}

/* What a load may change and the C API can see: every parameter's value
 * (pstar_param_read), every hyperparameter, the loss scale and the step. */
enum { NH = 8 };
typedef struct state {
  float v[TOTAL + 1]; /* + 1: make_variant 2 */
  double h[NH];
} state;

static void capture(model *m, state *s) {
  snapshot(m, s->v);
  for (int i = 0; i < NH; ++i) s->h[i] = t_hparam(m->e, (pstar_hparam)i);
}

/* 1 when a and b hold the same bits. */
static int same_state(const state *a, const state *b) {
  return memcmp(a->v, b->v, sizeof a->v) == 0 && memcmp(a->h, b->h, sizeof a->h) == 0;
}

/* The first difference, for a failure message. */
static const char *state_diff(const state *a, const state *b) {
  static char buf[256];
  for (int i = 0; i < TOTAL; ++i) {
    if (t_f32_bits(a->v[i]) != t_f32_bits(b->v[i])) {
      snprintf(buf, sizeof buf, "element %d: %.9g, then %.9g", i, (double)a->v[i], (double)b->v[i]);
      return buf;
    }
  }
  for (int i = 0; i < NH; ++i) {
    if (memcmp(&a->h[i], &b->h[i], sizeof a->h[i]) != 0) {
      snprintf(buf, sizeof buf, "%s: %.17g, then %.17g", i == 7 ? "step" : "hyperparameter", a->h[i], b->h[i]);
      return buf;
    }
  }
  return "no difference";
}

static void corrupt_and_expect_into(const char *tag, void (*damage)(const char *dir), pstar_status expected,
                                    const char *needle, int variant) {
  const char *dir = tmpdir(tag);
  model a;
  make(&a, PSTAR_DTYPE_BF16, 1024, 0);
  step(&a, 0);
  T_OK(pstar_checkpoint_save(a.e, dir));
  T_OK(pstar_engine_destroy(a.e));
  if (damage != NULL) damage(dir);
  model b;
  make_variant(&b, PSTAR_DTYPE_BF16, 1024, 0, variant);
  T_OK(pstar_hparam_set(b.e, PSTAR_HPARAM_LR, 3e-3)); /* differs from the checkpoint's */
  static state before, after;
  capture(&b, &before);
  T_FAIL(pstar_checkpoint_load(b.e, dir), expected, needle);
  capture(&b, &after);
  cr_assert(same_state(&before, &after), "%s: a failed load changed the engine (%s)", tag, state_diff(&before, &after));
  if (variant == 0) step(&b, 0); /* still usable */
  T_OK(pstar_engine_destroy(b.e));
}

static void corrupt_and_expect(const char *tag, void (*damage)(const char *dir), pstar_status expected,
                               const char *needle) {
  corrupt_and_expect_into(tag, damage, expected, needle, 0);
}

static void truncate_masters(const char *dir) {
  char p[600];
  latest_path(dir, "masters.f32", p, sizeof p);
  cr_assert_eq(truncate(p, 100), 0);
}
static void flip_a_byte(const char *dir) {
  char p[600];
  latest_path(dir, "exp_avg.f32", p, sizeof p);
  FILE *f = fopen(p, "r+b");
  cr_assert_not_null(f);
  fseek(f, 123, SEEK_SET);
  int c = fgetc(f);
  fseek(f, 123, SEEK_SET);
  fputc(c ^ 0x40, f);
  fclose(f);
}
static void remove_a_file(const char *dir) {
  char p[600];
  latest_path(dir, "exp_avg_sq.f32", p, sizeof p);
  cr_assert_eq(unlink(p), 0);
}
static void bump_the_version(const char *dir) {
  char p[600], q[700];
  latest_path(dir, "manifest", p, sizeof p);
  snprintf(q, sizeof q, "sed -i '1s/.*/pstar-checkpoint 99/' %s", p);
  cr_assert_eq(system(q), 0);
}
/* A version 1 manifest: no checksum line. */
static void make_it_version_1(const char *dir) {
  char p[600];
  latest_path(dir, "manifest", p, sizeof p);
  size_t len = 0;
  unsigned char *text = ck_slurp(p, &len);
  const size_t at = ck_checksum_line(text, len);
  text[strlen("pstar-checkpoint ")] = '1';
  ck_spit(p, text, at);
  free(text);
}

Test(checkpoint, a_truncated_file_is_named) { corrupt_and_expect("trunc", truncate_masters, PSTAR_ERR_IO, "masters.f32"); }
Test(checkpoint, a_flipped_byte_fails_the_checksum) { corrupt_and_expect("flip", flip_a_byte, PSTAR_ERR_IO, "exp_avg.f32' is corrupted"); }
Test(checkpoint, a_missing_file_is_named) { corrupt_and_expect("missing", remove_a_file, PSTAR_ERR_IO, "exp_avg_sq.f32"); }
Test(checkpoint, another_format_version_is_refused) { corrupt_and_expect("version", bump_the_version, PSTAR_ERR_IO, "format version 99"); }
Test(checkpoint, a_version_1_manifest_without_a_checksum_is_refused) {
  corrupt_and_expect("version1", make_it_version_1, PSTAR_ERR_IO, "format version 1, this library reads version 2 only");
}
Test(checkpoint, another_parameter_set_is_refused) {
  corrupt_and_expect_into("params", NULL, PSTAR_ERR_INVALID_ARGUMENT, "layer 9", 1);
  corrupt_and_expect_into("shape", NULL, PSTAR_ERR_INVALID_ARGUMENT, "'layer 2'", 2);
}

/* ------------------------------------------------------------------------ */
/* Every byte of the manifest, the data files, failures after the checks     */
/* ------------------------------------------------------------------------ */

/* The engine every damaged checkpoint is tried on: trained on its own (two
 * steps of other gradients, another lr), so that a load that changed
 * anything shows in its values, hyperparameters, loss scale or step. */
static void make_target(model *b) {
  make(b, PSTAR_DTYPE_F16, 1024, 0);
  step(b, 7);
  step(b, 8);
  T_OK(pstar_hparam_set(b->e, PSTAR_HPARAM_LR, 3e-3));
}

/* A checkpoint of three f16 steps (the loss scaler's state has moved) in
 * `dir`; *loaded: a fresh target after loading it; *trained: that target
 * after two more steps. */
static void save_three_steps(const char *dir, state *loaded, state *trained) {
  model a;
  make(&a, PSTAR_DTYPE_F16, 1024, 0);
  for (int s = 0; s < 3; ++s) step(&a, s);
  T_OK(pstar_checkpoint_save(a.e, dir));
  T_OK(pstar_engine_destroy(a.e));
  model r;
  make_target(&r);
  T_OK(pstar_checkpoint_load(r.e, dir));
  capture(&r, loaded);
  step(&r, 3);
  step(&r, 4);
  capture(&r, trained);
  T_OK(pstar_engine_destroy(r.e));
}

typedef struct tally {
  int refused;   /* refused, the engine as it was */
  int unchanged; /* loaded: exactly the checkpoint, training on bit-identical */
  int accepted;  /* (resealed edits) loaded a checkpoint that says something else */
} tally;

/* Loads `dir` into *b after an edit described by `what`.  Refused: every
 * value, hyperparameter and the step must be as before.  Loaded: the engine
 * must hold exactly the pristine checkpoint (*loaded) and train on to
 * *trained; unless `any_ok` (a resealed edit, a different but well-formed
 * checkpoint), then it only counts.  A target that loaded is made afresh. */
static void try_load(model *b, const char *dir, const state *loaded, const state *trained, int any_ok, tally *t,
                     const char *what) {
  static state before, now;
  capture(b, &before);
  const pstar_status st = pstar_checkpoint_load(b->e, dir);
  char msg[T_MSG_CAP];
  t_copy_last_error(msg, sizeof msg);
  capture(b, &now);
  if (st != PSTAR_OK) {
    cr_assert(st == PSTAR_ERR_IO || st == PSTAR_ERR_INVALID_ARGUMENT, "%s: %s (%s)", what, pstar_status_name(st), msg);
    cr_assert(msg[0] != '\0', "%s: refused without a message", what);
    cr_assert(same_state(&before, &now), "%s: refused (%s) but the engine changed: %s", what, msg,
              state_diff(&before, &now));
    ++t->refused;
    return;
  }
  if (any_ok) {
    if (getenv("CK_VERBOSE") != NULL) fprintf(stderr, "accepted: %s\n", what);
    ++t->accepted;
  } else {
    cr_assert(same_state(loaded, &now), "%s: loaded something else than the checkpoint: %s", what,
              state_diff(loaded, &now));
    step(b, 3);
    step(b, 4);
    capture(b, &now);
    cr_assert(same_state(trained, &now), "%s: training after the load differs: %s", what, state_diff(trained, &now));
    ++t->unchanged;
  }
  T_OK(pstar_engine_destroy(b->e));
  make_target(b);
}

Test(checkpoint, every_one_byte_edit_and_truncation_of_the_manifest_is_refused_or_changes_nothing) {
  static state loaded, trained;
  const char *dir = tmpdir("edits");
  save_three_steps(dir, &loaded, &trained);
  char path[600], what[128];
  latest_path(dir, "manifest", path, sizeof path);
  size_t len = 0;
  unsigned char *pristine = ck_slurp(path, &len);
  unsigned char *copy = (unsigned char *)malloc(len + 64);
  cr_assert_not_null(copy);
  model b;
  make_target(&b);
  tally edits = {0, 0, 0}, cuts = {0, 0, 0}, more = {0, 0, 0};
  for (size_t i = 0; i < len; ++i) {
    for (int d = -1; d <= 1; d += 2) { /* together: a flip of the lowest bit, and one more neighbour */
      memcpy(copy, pristine, len);
      copy[i] = (unsigned char)(copy[i] + d);
      ck_spit(path, copy, len);
      snprintf(what, sizeof what, "byte %zu ('%c') %+d", i, pristine[i] >= ' ' ? pristine[i] : '?', d);
      try_load(&b, dir, &loaded, &trained, 0, &edits, what);
    }
  }
  for (size_t n = 0; n < len; ++n) {
    ck_spit(path, pristine, n);
    snprintf(what, sizeof what, "truncated to %zu of %zu bytes", n, len);
    try_load(&b, dir, &loaded, &trained, 0, &cuts, what);
  }
  /* Bytes after the checksum line, and a byte dropped at every place. */
  static const char *const tails[] = {"\n", "x", "checksum 0000000000000000\n", "step 9\n"};
  for (size_t k = 0; k < sizeof tails / sizeof tails[0]; ++k) {
    memcpy(copy, pristine, len);
    memcpy(copy + len, tails[k], strlen(tails[k]));
    ck_spit(path, copy, len + strlen(tails[k]));
    try_load(&b, dir, &loaded, &trained, 0, &more, "bytes appended");
  }
  for (size_t i = 0; i < len; ++i) {
    memcpy(copy, pristine, i);
    memcpy(copy + i, pristine + i + 1, len - i - 1);
    ck_spit(path, copy, len - 1);
    snprintf(what, sizeof what, "byte %zu dropped", i);
    try_load(&b, dir, &loaded, &trained, 0, &more, what);
  }
  cr_log_info("manifest of %zu bytes: %d one-byte edits refused (engine unchanged), %d loaded the same checkpoint; "
              "%d truncations refused, %d loaded; %d drops and appends refused, %d loaded",
              len, edits.refused, edits.unchanged, cuts.refused, cuts.unchanged, more.refused, more.unchanged);
  fprintf(stderr,
          "capi_checkpoint: manifest of %zu bytes: one-byte edits: %d refused with the engine unchanged, %d loaded "
          "the same checkpoint; truncations: %d refused, %d loaded; dropped or appended bytes: %d refused, %d loaded\n",
          len, edits.refused, edits.unchanged, cuts.refused, cuts.unchanged, more.refused, more.unchanged);
  cr_assert_eq(edits.refused + edits.unchanged, (int)(2 * len));
  /* The pristine manifest again: loads, and trains on exactly. */
  ck_spit(path, pristine, len);
  tally ok = {0, 0, 0};
  try_load(&b, dir, &loaded, &trained, 0, &ok, "the pristine manifest");
  cr_assert_eq(ok.unchanged, 1);
  T_OK(pstar_engine_destroy(b.e));
  free(copy);
  free(pristine);
}

#if CK_HAVE_XXHASH
/* Edits with the checksum recomputed (as someone who edits on purpose
 * would): what the strict reading refuses.  Every byte before the checksum
 * line +1 and -1: each is refused with the engine unchanged, or is a
 * well-formed checkpoint and loads whole (counted).  Then the cases that
 * must be refused by name: an offset moved by one element, offsets and
 * sizes past the end of a file, values out of range, unknown and repeated
 * entries. */
static void reseal_edit(const char *path, const unsigned char *pristine, size_t len, const char *find,
                        const char *replace) {
  const char *hit = strstr((const char *)pristine, find);
  cr_assert_not_null(hit, "the manifest has no \"%s\"", find);
  const size_t at = (size_t)(hit - (const char *)pristine);
  const size_t n = len - strlen(find) + strlen(replace);
  unsigned char *copy = (unsigned char *)malloc(n + 1);
  cr_assert_not_null(copy);
  memcpy(copy, pristine, at);
  memcpy(copy + at, replace, strlen(replace));
  memcpy(copy + at + strlen(replace), pristine + at + strlen(find), len - at - strlen(find));
  ck_reseal(copy, n);
  ck_spit(path, copy, n);
  free(copy);
}

Test(checkpoint, resealed_edits_are_refused_by_the_strict_reading_or_load_whole) {
  static state loaded, trained;
  const char *dir = tmpdir("reseal");
  save_three_steps(dir, &loaded, &trained);
  char path[600], what[128];
  latest_path(dir, "manifest", path, sizeof path);
  size_t len = 0;
  unsigned char *pristine = ck_slurp(path, &len);
  const size_t body = ck_checksum_line(pristine, len);
  unsigned char *copy = (unsigned char *)malloc(len + 1);
  cr_assert_not_null(copy);
  model b;
  make_target(&b);
  tally t = {0, 0, 0};
  for (size_t i = 0; i < body; ++i) {
    for (int d = -1; d <= 1; d += 2) {
      memcpy(copy, pristine, len);
      copy[i] = (unsigned char)(copy[i] + d);
      ck_reseal_at(copy, body);
      ck_spit(path, copy, len);
      snprintf(what, sizeof what, "resealed: byte %zu ('%c') %+d", i, pristine[i] >= ' ' ? pristine[i] : '?', d);
      try_load(&b, dir, &loaded, &trained, 1, &t, what);
    }
  }
  cr_log_info("resealed one-byte edits of %zu bytes: %d refused, %d well-formed (loaded)", body, t.refused, t.accepted);
  fprintf(stderr, "capi_checkpoint: resealed one-byte edits of the %zu bytes before the checksum line: %d refused "
                  "with the engine unchanged, %d well-formed checkpoints (loaded whole)\n",
          body, t.refused, t.accepted);
  static const struct {
    const char *find, *replace, *needle;
  } cases[] = {
      {"offset=0 ", "offset=1 ", "overlap, leave a gap or run past its end"},
      {"offset=0 ", "offset=99999 ", "overlap, leave a gap or run past its end"},
      {"numel=700 ", "numel=701 ", "not the product of shape"},
      {"shape=700 ", "shape=699 ", "not the product of shape"},
      {"file masters.f32 bytes=", "file masters.f32 bytes=4", "is said to hold"},
      {"lr_scale=0x1p+0", "lr_scale=-0x1p+0", "negative lr_scale"},
      {"\nbeta1 ", "\nbeta1 0x1p+0\nbeta1_was ", "not an entry"},
      {"\nstep ", "\nstep 1\nstep ", "appears twice"},
      {"\neps ", "\neps 0x0p+0\nunused ", "not an entry"},
      {"\nworld_size 1\n", "\nworld_size 2\n", "without 'sharded 1'"},
      {"\nclip_norm 0x0p+0\n", "\nclip_norm -0x1p+0\n", "out of range"},
      {"\nadamw ", "\nadamw 2\nx ", "not an entry"},
      {"\nloss_scale ", "\nloss_scale -", "out of range"},
      {"\nloss_scale_clean_steps ", "\nloss_scale_clean_steps 99999999999", "malformed"},
      {"frozen=0", "frozen=0 frozen=0", "given twice"},
      {"param layer%202 ", "param layer%2 ", "malformed parameter name"},
      {"param layer%202 ", "param layer%207 ", "no parameter 'layer 2'"},
      {"param layer%202 ", "param layer%200 ", "parameter 'layer 0' appears twice"},
      {"\nlr ", "\nlr  ", "empty field"},
      {"file exp_avg.f32 bytes=", "piece 0 rank=0 start=0 count=1 offset=0\nfile exp_avg.f32 bytes=", "piece entries"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    reseal_edit(path, pristine, len, cases[k].find, cases[k].replace);
    static state before, now;
    capture(&b, &before);
    const pstar_status st = pstar_checkpoint_load(b.e, dir);
    char msg[T_MSG_CAP];
    t_copy_last_error(msg, sizeof msg);
    capture(&b, &now);
    cr_assert_neq(st, PSTAR_OK, "\"%s\" -> \"%s\" was accepted", cases[k].find, cases[k].replace);
    cr_assert(strstr(msg, cases[k].needle) != NULL, "\"%s\" -> \"%s\": \"%s\", expected \"%s\"", cases[k].find,
              cases[k].replace, msg, cases[k].needle);
    cr_assert(same_state(&before, &now), "\"%s\": refused but changed: %s", cases[k].find, state_diff(&before, &now));
  }
  /* The data files' checksums in the manifest resealed to another value:
   * the data check still refuses. */
  reseal_edit(path, pristine, len, "xxh3=", "xxh3=0");
  {
    /* (that made the hex one digit too long: malformed) */
    static state before, now;
    capture(&b, &before);
    T_FAIL(pstar_checkpoint_load(b.e, dir), PSTAR_ERR_IO, "malformed file entry");
    capture(&b, &now);
    cr_assert(same_state(&before, &now));
  }
  ck_spit(path, pristine, len);
  T_OK(pstar_engine_destroy(b.e));
  free(copy);
  free(pristine);
}
#endif

/* Truncated, extended and flipped data files; every one refused with the
 * engine unchanged (offsets that point past the end of a file cannot be
 * reached once the sizes are checked against the manifest). */
Test(checkpoint, damaged_data_files_are_refused_with_the_engine_unchanged) {
  static state loaded, trained;
  const char *dir = tmpdir("data");
  save_three_steps(dir, &loaded, &trained);
  static const char *const files[] = {"masters.f32", "exp_avg.f32", "exp_avg_sq.f32", "frozen.f32"};
  model b;
  make_target(&b);
  tally t = {0, 0, 0};
  char path[600], what[160];
  for (size_t f = 0; f < 4; ++f) {
    latest_path(dir, files[f], path, sizeof path);
    size_t len = 0;
    unsigned char *pristine = ck_slurp(path, &len);
    unsigned char *copy = (unsigned char *)malloc(len + 8);
    cr_assert_not_null(copy);
    const size_t cuts[] = {0, 1, 3, 4, len / 2, len - 4, len - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; ++k) {
      ck_spit(path, pristine, cuts[k]);
      snprintf(what, sizeof what, "%s truncated to %zu bytes", files[f], cuts[k]);
      try_load(&b, dir, &loaded, &trained, 0, &t, what);
    }
    for (size_t extra = 1; extra <= 4; extra += 3) {
      memcpy(copy, pristine, len);
      memset(copy + len, 0, extra);
      ck_spit(path, copy, len + extra);
      snprintf(what, sizeof what, "%s extended by %zu bytes", files[f], extra);
      try_load(&b, dir, &loaded, &trained, 0, &t, what);
    }
    const size_t flips[] = {0, len / 3, len - 1};
    for (size_t k = 0; k < 3; ++k) {
      memcpy(copy, pristine, len);
      copy[flips[k]] ^= 0x01;
      ck_spit(path, copy, len);
      snprintf(what, sizeof what, "%s: a bit of byte %zu flipped", files[f], flips[k]);
      try_load(&b, dir, &loaded, &trained, 0, &t, what);
    }
    cr_assert_eq(unlink(path), 0);
    try_load(&b, dir, &loaded, &trained, 0, &t, "a data file removed");
    ck_spit(path, pristine, len);
    free(copy);
    free(pristine);
  }
  cr_assert_eq(t.unchanged, 0);
  tally ok = {0, 0, 0};
  try_load(&b, dir, &loaded, &trained, 0, &ok, "the pristine files");
  cr_assert_eq(ok.unchanged, 1);
  T_OK(pstar_engine_destroy(b.e));
}

/* The test hook PSTAR_TEST_CHECKPOINT_LOAD_FAULT: "check" refuses once
 * every check has passed (nothing written: the engine as it was); "read:N"
 * fails the N-th data read after the load began writing (13 reads here:
 * three lists of four trainable parameters, one frozen).  Such a load
 * returns PSTAR_ERR_IO; iterations, saves and exports are refused until a
 * load completes, and then training is bit-identical to a clean load. */
Test(checkpoint, a_failure_after_the_checks_stops_training_until_a_load_completes) {
  static state loaded, trained, before, now;
  const char *dir = tmpdir("fault");
  save_three_steps(dir, &loaded, &trained);
  model b;
  make_target(&b);
  capture(&b, &before);
  setenv("PSTAR_TEST_CHECKPOINT_LOAD_FAULT", "check", 1);
  T_FAIL(pstar_checkpoint_load(b.e, dir), PSTAR_ERR_IO, "simulated refusal after every check");
  unsetenv("PSTAR_TEST_CHECKPOINT_LOAD_FAULT");
  capture(&b, &now);
  cr_assert(same_state(&before, &now), "%s", state_diff(&before, &now));
  step(&b, 9); /* trains */
  T_OK(pstar_engine_destroy(b.e));
  char other[600], export_path[600];
  snprintf(other, sizeof other, "%s-other", dir);
  snprintf(export_path, sizeof export_path, "%s.safetensors", dir);
  for (int n = 1; n <= 14; ++n) {
    make_target(&b);
    char v[16];
    snprintf(v, sizeof v, "read:%d", n);
    setenv("PSTAR_TEST_CHECKPOINT_LOAD_FAULT", v, 1);
    const pstar_status st = pstar_checkpoint_load(b.e, dir);
    unsetenv("PSTAR_TEST_CHECKPOINT_LOAD_FAULT");
    if (n == 14) { /* past the last read: no fault */
      T_STATUS(st, PSTAR_OK);
    } else {
      char msg[T_MSG_CAP];
      t_copy_last_error(msg, sizeof msg);
      cr_assert_eq(st, PSTAR_ERR_IO, "read %d: %s", n, msg);
      cr_assert(strstr(msg, "simulated I/O error") != NULL && strstr(msg, "refused until a load completes") != NULL,
                "read %d: %s", n, msg);
      T_FAIL(pstar_iteration_begin(b.e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_IO, "failed part way");
      T_FAIL(pstar_iteration_begin(b.e, PSTAR_ITERATION_EVAL), PSTAR_ERR_IO, "failed part way");
      T_FAIL(pstar_checkpoint_save(b.e, other), PSTAR_ERR_IO, "failed part way");
      T_FAIL(pstar_export_safetensors(b.e, export_path), PSTAR_ERR_IO, "failed part way");
      /* A refused load leaves it so. */
      T_FAIL(pstar_checkpoint_load(b.e, "no-such-dir-pstar"), PSTAR_ERR_IO, "LATEST");
      T_FAIL(pstar_iteration_begin(b.e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_IO, "failed part way");
      T_OK(pstar_checkpoint_load(b.e, dir));
    }
    capture(&b, &now);
    cr_assert(same_state(&loaded, &now), "read %d: %s", n, state_diff(&loaded, &now));
    step(&b, 3);
    step(&b, 4);
    capture(&b, &now);
    cr_assert(same_state(&trained, &now), "read %d: %s", n, state_diff(&trained, &now));
    T_OK(pstar_checkpoint_save(b.e, other)); /* saves again */
    T_OK(pstar_engine_destroy(b.e));
  }
}

Test(checkpoint, no_checkpoint_and_bad_calls) {
  model a;
  make(&a, PSTAR_DTYPE_BF16, 1024, 0);
  T_FAIL(pstar_checkpoint_load(a.e, "no-such-dir-pstar"), PSTAR_ERR_IO, "LATEST");
  T_FAIL(pstar_checkpoint_save(a.e, NULL), PSTAR_ERR_INVALID_ARGUMENT, "path");
  T_OK(pstar_iteration_begin(a.e, PSTAR_ITERATION_EVAL));
  T_FAIL(pstar_checkpoint_save(a.e, "x"), PSTAR_ERR_INVALID_STATE, "between iterations");
  T_OK(pstar_iteration_end(a.e));
  T_OK(pstar_engine_destroy(a.e));
}

Test(checkpoint, safetensors_holds_every_parameter_in_fp32) {
  static float values[TOTAL];
  model a;
  make(&a, PSTAR_DTYPE_BF16, 1024, 0);
  step(&a, 0);
  snapshot(&a, values);
  char path[512];
  snprintf(path, sizeof path, "%s/ckpt-test-%d.safetensors", PSTAR_TEST_TMP_DIR, (int)getpid());
  T_OK(pstar_export_safetensors(a.e, path));
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f);
  unsigned char len8[8];
  cr_assert_eq(fread(len8, 1, 8, f), 8u);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len8[i];
  cr_assert_eq(len % 8, 0u);
  char *header = (char *)calloc(len + 1, 1);
  cr_assert_eq(fread(header, 1, len, f), len);
  cr_assert_not_null(strstr(header, "\"layer 3\":{\"dtype\":\"F32\",\"shape\":[811]"), "%s", header);
  cr_assert_not_null(strstr(header, "\"frozen\":{\"dtype\":\"F32\""));
  /* The data: the parameters in registration order. */
  float *data = t_alloc_f(TOTAL);
  cr_assert_eq(fread(data, sizeof(float), TOTAL, f), (size_t)TOTAL);
  cr_assert_eq(memcmp(data, values, sizeof values), 0);
  fclose(f);
  free(header);
  free(data);
  remove(path);
  T_OK(pstar_engine_destroy(a.e));
}

/* A safetensors header is JSON: names with control characters get JSON's
 * escapes; a name that is not UTF-8 (JSON cannot hold it, and readers
 * refuse such a file) or "__metadata__" is refused before any file is
 * written. */
Test(checkpoint, safetensors_names_are_json) {
  char path[512], tmp[520];
  snprintf(path, sizeof path, "%s/ckpt-test-names-%d.safetensors", PSTAR_TEST_TMP_DIR, (int)getpid());
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  for (int bad = 0; bad <= 2; ++bad) {
    pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
    pstar_engine *e = t_create(&o);
    (void)t_register(e, "tab\there\x01", 3, 0);
    (void)t_register(e, bad == 1 ? "bad\xff" : bad == 2 ? "__metadata__" : "fine", 2, 0);
    T_OK(pstar_engine_build(e));
    remove(path);
    if (bad) {
      T_FAIL(pstar_export_safetensors(e, path), PSTAR_ERR_INVALID_ARGUMENT, bad == 1 ? "not UTF-8" : "metadata");
      cr_assert(access(path, F_OK) != 0 && access(tmp, F_OK) != 0, "a refused export left a file");
    } else {
      T_OK(pstar_export_safetensors(e, path));
      size_t len = 0;
      unsigned char *bytes = ck_slurp(path, &len);
      cr_assert_not_null(strstr((const char *)bytes + 8, "\"tab\\there\\u0001\":{\"dtype\":\"F32\",\"shape\":[3]"),
                         "%s", (const char *)bytes + 8);
      free(bytes);
      remove(path);
    }
    T_OK(pstar_engine_destroy(e));
  }
}
