/* Checkpoints: exact resume, another chunk size, crash points, corruption,
 * safetensors (docs/checkpoints.md). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capi_test_util.h"

enum { P = 4, N = 700 };

typedef struct model {
  pstar_engine *e;
  uint32_t ids[P + 1]; /* the last one frozen */
} model;

static void make(model *m, pstar_dtype dt, uint64_t chunk, uint64_t capacity) {
  pstar_engine_options o = t_options(dt, chunk);
  o.device_capacity_bytes = capacity;
  o.lr = 1e-2f;
  o.loss_scale_initial = 1024.0f;
  o.loss_scale_growth_interval = 3; /* the scaler's state moves during the run */
  m->e = t_create(&o);
  char name[16];
  for (int i = 0; i < P; ++i) {
    snprintf(name, sizeof name, "layer %d", i); /* a space: escaped in the manifest */
    m->ids[i] = t_register(m->e, name, N + 37 * i, 0);
  }
  m->ids[P] = t_register(m->e, "frozen", N, PSTAR_PARAM_FROZEN);
  T_OK(pstar_engine_build(m->e));
  float *v = t_alloc_f(N + 37 * P);
  for (int i = 0; i <= P; ++i) {
    t_fill(v, (size_t)(N + 37 * (i < P ? i : 0)), (uint32_t)(11 + i), 0.5f);
    t_write_f32(m->e, m->ids[i], v, (uint64_t)(N + 37 * (i < P ? i : 0)));
  }
  free(v);
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
    const int n = N + 37 * (i < P ? i : 0);
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
  char p[512];
  snprintf(p, sizeof p, "%s/LATEST", dir);
  FILE *f = fopen(p, "r");
  cr_assert_not_null(f);
  char name[128] = {0};
  cr_assert_not_null(fgets(name, sizeof name, f));
  fclose(f);
  name[strcspn(name, "\n")] = 0;
  snprintf(out, cap, "%s/%s/%s", dir, name, file);
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

static void corrupt_and_expect(const char *tag, void (*damage)(const char *dir), pstar_status expected,
                               const char *needle) {
  const char *dir = tmpdir(tag);
  model a;
  make(&a, PSTAR_DTYPE_BF16, 1024, 0);
  step(&a, 0);
  T_OK(pstar_checkpoint_save(a.e, dir));
  T_OK(pstar_engine_destroy(a.e));
  damage(dir);
  model b;
  make(&b, PSTAR_DTYPE_BF16, 1024, 0);
  static float before[TOTAL], after[TOTAL];
  snapshot(&b, before);
  T_FAIL(pstar_checkpoint_load(b.e, dir), expected, needle);
  snapshot(&b, after);
  cr_assert_eq(memcmp(before, after, sizeof before), 0, "%s: a failed load changed the engine", tag);
  step(&b, 0); /* still usable */
  T_OK(pstar_engine_destroy(b.e));
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
static void rename_a_parameter(const char *dir) {
  char p[600], q[700];
  latest_path(dir, "manifest", p, sizeof p);
  snprintf(q, sizeof q, "sed -i 's/^param layer%%202 /param layer%%209 /' %s", p);
  cr_assert_eq(system(q), 0);
}

Test(checkpoint, a_truncated_file_is_named) { corrupt_and_expect("trunc", truncate_masters, PSTAR_ERR_IO, "masters.f32"); }
Test(checkpoint, a_flipped_byte_fails_the_checksum) { corrupt_and_expect("flip", flip_a_byte, PSTAR_ERR_IO, "exp_avg.f32' is corrupted"); }
Test(checkpoint, a_missing_file_is_named) { corrupt_and_expect("missing", remove_a_file, PSTAR_ERR_IO, "exp_avg_sq.f32"); }
Test(checkpoint, another_format_version_is_refused) { corrupt_and_expect("version", bump_the_version, PSTAR_ERR_IO, "format version 99"); }
Test(checkpoint, another_parameter_set_is_refused) {
  corrupt_and_expect("params", rename_a_parameter, PSTAR_ERR_INVALID_ARGUMENT, "layer 2");
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
