/* The NVMe tier (experimental API; docs/nvme.md): training with optimizer
 * state on the drive gives the parameters of training with everything in
 * memory, bit for bit; I/O errors stop training until a checkpoint is
 * loaded; misuse is refused. */
#define PSTAR_EXPERIMENTAL_API 1
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "capi_test_util.h"
#include "ckpt_test_util.h"

/* Six trainable parameters of about one 1024-element chunk each, and a
 * frozen one. */
enum { P = 6, N = 900, CHUNK = 1024 };

typedef struct model {
  pstar_engine *e;
  uint32_t ids[P + 1];
} model;

static int numel_of(int i) { return i < P ? N + 17 * i : N; }

static char g_dir[512];

/* A fresh directory under the test's own directory in the build tree (a real
 * filesystem, where O_DIRECT usually works; tmpfs refuses it), wherever the
 * test is started from. */
static void remove_dir(void) {
  if (g_dir[0] == '\0') return;
  char cmd[sizeof g_dir + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

/* The directory goes when the test's process exits (the tests that make
 * two reuse one path, emptied in between). */
static const char *fresh_dir(const char *tag) {
  static int registered = 0;
  if (!registered) {
    atexit(remove_dir);
    registered = 1;
  }
  snprintf(g_dir, sizeof g_dir, "%s/nvme-test-%s-%d", PSTAR_TEST_TMP_DIR, tag, (int)getpid());
  char cmd[2 * sizeof g_dir + 32];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", g_dir, g_dir);
  if (system(cmd) != 0) cr_assert_fail("mkdir");
  return g_dir;
}

/* The data file the engine made in `dir` (pstar-nvme-*), or "" if none. */
static void data_file(const char *dir, char *out, size_t cap) {
  out[0] = '\0';
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  struct dirent *ent;
  while ((ent = readdir(d)) != NULL) {
    if (strncmp(ent->d_name, "pstar-nvme-", 11) == 0) snprintf(out, cap, "%s/%s", dir, ent->d_name);
  }
  closedir(d);
}

typedef struct config {
  const char *nvme_dir; /* NULL: no NVMe tier */
  uint64_t host_capacity;
  int buffered;
  int grad_accumulation;
  int synchronous; /* pstar_x_engine_set_overlap_step(e, 0) */
} config;

/* Host bytes that leave about half of the trainable chunks' optimizer state
 * for the drive: the payloads, the staging buffers (4 + 1 of 12 KiB plus
 * alignment) and two chunks' lists. */
static const uint64_t kTightHost = 7 * CHUNK * 2 + 5 * (3 * CHUNK * 4 + 4096) + 2 * 3 * CHUNK * 4 + 4096;

/* Registers the model's parameters (the frozen one too when `frozen`). */
static void register_params(pstar_engine *e, uint32_t *ids, int frozen) {
  char name[16];
  for (int i = 0; i < P + (frozen ? 1 : 0); ++i) {
    snprintf(name, sizeof name, "p%d", i);
    ids[i] = t_register(e, name, numel_of(i), i == P ? PSTAR_PARAM_FROZEN : 0);
  }
}

static void make(model *m, const config *c) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, CHUNK);
  o.lr = 1e-2f;
  o.loss_scale_initial = 1024.0f;
  o.loss_scale_growth_interval = 3;
  /* The fp32 gradient lists of accumulation stay in host memory. */
  o.host_capacity_bytes = c->host_capacity + (c->host_capacity && c->grad_accumulation ? P * CHUNK * 4 : 0);
  o.grad_accumulation = c->grad_accumulation;
  m->e = t_create(&o);
  if (c->synchronous) T_OK(pstar_x_engine_set_overlap_step(m->e, 0));
  if (c->nvme_dir != NULL) {
    pstar_x_nvme_options n;
    T_OK(pstar_x_nvme_options_init(&n));
    n.dir = c->nvme_dir;
    n.buffered = c->buffered;
    T_OK(pstar_x_engine_set_nvme(m->e, &n));
  }
  register_params(m->e, m->ids, 1);
  T_OK(pstar_engine_build(m->e));
  float *v = t_alloc_f(N + 17 * P);
  for (int i = 0; i <= P; ++i) {
    t_fill(v, (size_t)numel_of(i), (uint32_t)(5 + i), 0.5f);
    t_write_f32(m->e, m->ids[i], v, (uint64_t)numel_of(i));
  }
  free(v);
}

/* Acquires for the iteration in progress; a failure of the overlapped step
 * before it (an NVMe I/O error on the update thread surfaces at the first
 * acquire that waits for an update) abandons the iteration and is
 * returned. */
static char g_failure[T_MSG_CAP]; /* the message of the last failure train_step returned */

static pstar_status acquire_or_abort(model *m, int i, pstar_stage stage) {
  void *p = NULL;
  const pstar_status st = pstar_param_acquire(m->e, m->ids[i], stage, NULL, &p);
  if (st == PSTAR_OK) {
    cr_assert_not_null(p);
    return st;
  }
  t_copy_last_error(g_failure, sizeof g_failure);
  T_OK(pstar_iteration_abort(m->e)); /* nothing is held: each use is released before the next */
  return st;
}

/* One TRAIN iteration; step 3 has an inf gradient (a skipped step, whose
 * restore reads the masters).  The step overlaps: its I/O runs after
 * pstar_step returns, so an error in it is returned by a later call (see
 * settled_step). */
static pstar_status train_step(model *m, int s) {
  float *g = t_alloc_f(N + 17 * P);
  const float scale = (float)t_hparam(m->e, PSTAR_HPARAM_LOSS_SCALE);
  pstar_status st = pstar_iteration_begin(m->e, PSTAR_ITERATION_TRAIN);
  if (st != PSTAR_OK) {
    t_copy_last_error(g_failure, sizeof g_failure);
    free(g);
    return st;
  }
  for (int i = 0; i <= P; ++i) {
    if ((st = acquire_or_abort(m, i, PSTAR_STAGE_FORWARD)) != PSTAR_OK) {
      free(g);
      return st;
    }
    T_OK(pstar_param_release(m->e, m->ids[i], NULL));
  }
  for (int i = P; i >= 0; --i) {
    (void)t_acquire(m->e, m->ids[i], PSTAR_STAGE_BACKWARD);
    if (i < P) {
      const int n = numel_of(i);
      for (int j = 0; j < n; ++j) g[j] = scale * (float)(((j * 5 + s * 11 + i) % 31) - 15) / 512.0f;
      if (s == 3 && i == 1) g[7] = INFINITY;
      T_OK(pstar_grad_write(m->e, m->ids[i], g, (uint64_t)n, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    }
    T_OK(pstar_param_release(m->e, m->ids[i], NULL));
  }
  st = pstar_step(m->e, NULL);
  if (st != PSTAR_OK) t_copy_last_error(g_failure, sizeof g_failure);
  free(g);
  return st;
}

/* train_step, then a call that waits for the step's updates and reports
 * their failure (pstar_param_read). */
static pstar_status settled_step(model *m, int s) {
  pstar_status st = train_step(m, s);
  if (st != PSTAR_OK) return st;
  float v[N];
  st = pstar_param_read(m->e, m->ids[0], v, N, PSTAR_DTYPE_F32);
  if (st != PSTAR_OK) t_copy_last_error(g_failure, sizeof g_failure);
  return st;
}

enum { TOTAL = P * N + 17 * (0 + 1 + 2 + 3 + 4 + 5) + N };

static void snapshot(model *m, float *out) {
  size_t at = 0;
  for (int i = 0; i <= P; ++i) {
    t_read_f32(m->e, m->ids[i], out + at, (uint64_t)numel_of(i));
    at += (size_t)numel_of(i);
  }
}

static void assert_same(const float *a, const float *b, const char *what) {
  for (int i = 0; i < TOTAL; ++i) {
    cr_assert_eq(t_f32_bits(a[i]), t_f32_bits(b[i]), "%s: element %d: %.9g in memory, %.9g via NVMe", what, i,
                 (double)a[i], (double)b[i]);
  }
}

static pstar_x_nvme_stats nvme_stats(model *m) {
  pstar_x_nvme_stats s;
  T_OK(pstar_x_nvme_stats_init(&s));
  T_OK(pstar_x_nvme_get_stats(m->e, &s));
  return s;
}

static void run(const config *c, int steps, float *out) {
  model m;
  make(&m, c);
  for (int s = 0; s < steps; ++s) T_OK(train_step(&m, s));
  snapshot(&m, out);
  if (c->nvme_dir != NULL) {
    const pstar_x_nvme_stats ns = nvme_stats(&m);
    cr_assert(ns.chunks_on_nvme > 0 && ns.chunks_on_nvme < P, "chunks on the drive: %u of %d", ns.chunks_on_nvme, P);
    cr_assert_eq(ns.bytes_on_nvme, (uint64_t)ns.chunks_on_nvme * 3 * CHUNK * 4);
    cr_assert(ns.bytes_read >= (uint64_t)(steps - 1) * ns.bytes_on_nvme, "read %llu", (unsigned long long)ns.bytes_read);
    cr_assert(ns.bytes_written >= (uint64_t)steps * ns.bytes_on_nvme);
    cr_assert_eq(ns.direct, c->buffered ? 0 : ns.direct);
    /* The steps overlapped (all but the skipped one), the drive's chunks
     * streamed through the ring on the update thread. */
    pstar_x_step_stats ss;
    T_OK(pstar_x_step_stats_init(&ss));
    T_OK(pstar_x_step_get_stats(m.e, &ss));
    cr_assert_eq(ss.overlap, c->synchronous ? 0 : 1);
    cr_assert_eq(ss.steps_overlapped, c->synchronous ? 0 : (uint64_t)(steps > 3 ? steps - 1 : steps),
                 "steps overlapped: %llu", (unsigned long long)ss.steps_overlapped);
    const pstar_stats st = t_stats(m.e);
    cr_assert(st.peak_host_bytes <= kTightHost + (c->grad_accumulation ? P * CHUNK * 4 : 0),
              "host peak %llu over the budget", (unsigned long long)st.peak_host_bytes);
  }
  T_OK(pstar_engine_destroy(m.e));
  if (c->nvme_dir != NULL) {
    char f[512];
    data_file(c->nvme_dir, f, sizeof f);
    cr_assert_str_empty(f, "the data file %s outlived its engine", f);
  }
}

/* The drive, overlapped (the default) and synchronous, against memory
 * with the synchronous step: the same bits. */
static void check_same_as_memory(int buffered, int accumulation) {
  static float mem[TOTAL], disk[TOTAL];
  const config in_memory = {NULL, 0, 0, accumulation, 1};
  run(&in_memory, 8, mem);
  for (int synchronous = 0; synchronous <= 1; ++synchronous) {
    const config on_drive = {fresh_dir(buffered ? "buf" : "direct"), kTightHost, buffered, accumulation, synchronous};
    run(&on_drive, 8, disk);
    assert_same(mem, disk, synchronous ? "on the drive, synchronous step" : "on the drive, overlapped step");
  }
}

Test(nvme, same_parameters_as_in_memory) { check_same_as_memory(0, 0); }
Test(nvme, same_parameters_as_in_memory_buffered) { check_same_as_memory(1, 0); }
Test(nvme, same_parameters_as_in_memory_with_gradient_accumulation) { check_same_as_memory(0, 1); }

Test(nvme, without_the_drive_the_host_budget_is_out_of_memory) {
  /* The payloads and two chunks' lists (the tight budget less the staging
   * buffers): without an NVMe tier the optimizer state does not fit. */
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, CHUNK);
  o.host_capacity_bytes = kTightHost - 5 * (3 * CHUNK * 4 + 4096);
  pstar_engine *e = t_create(&o);
  uint32_t ids[P + 1];
  register_params(e, ids, 0);
  T_FAIL(pstar_engine_build(e), PSTAR_ERR_OUT_OF_MEMORY, "");
  T_OK(pstar_engine_destroy(e));
}

Test(nvme, checkpoints_move_state_between_the_drive_and_memory) {
  static float full[TOTAL], resumed[TOTAL];
  char ckpt[600];
  const config on_drive = {fresh_dir("ckpt"), kTightHost, 0, 0, 0};
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", on_drive.nvme_dir);
  model a;
  make(&a, &on_drive);
  for (int s = 0; s < 4; ++s) T_OK(train_step(&a, s));
  T_OK(pstar_checkpoint_save(a.e, ckpt));
  for (int s = 4; s < 8; ++s) T_OK(train_step(&a, s));
  snapshot(&a, full);
  T_OK(pstar_engine_destroy(a.e));
  /* Resumed in memory, and on the drive again. */
  for (int again_on_drive = 0; again_on_drive <= 1; ++again_on_drive) {
    const config in_memory = {NULL, 0, 0, 0, 0};
    model b;
    make(&b, again_on_drive ? &on_drive : &in_memory);
    T_OK(pstar_checkpoint_load(b.e, ckpt));
    for (int s = 4; s < 8; ++s) T_OK(train_step(&b, s));
    snapshot(&b, resumed);
    assert_same(full, resumed, again_on_drive ? "resumed on the drive" : "resumed in memory");
    T_OK(pstar_engine_destroy(b.e));
  }
}

/* A fault in some step: that step fails with PSTAR_ERR_IO and `needle`;
 * training is refused; loading the checkpoint made before it repairs the
 * engine, and training then matches an engine that never failed. */
static void check_fault_in(const char *fault, void (*damage)(const char *dir), const char *needle, int synchronous) {
  static float expect[TOTAL], got[TOTAL];
  char ckpt[600];
  const config on_drive = {fresh_dir("fault"), kTightHost, 0, 0, synchronous};
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", on_drive.nvme_dir);
  const config in_memory = {NULL, 0, 0, 0, 0};
  run(&in_memory, 6, expect);

  model m;
  make(&m, &on_drive);
  T_OK(train_step(&m, 0));
  T_OK(pstar_checkpoint_save(m.e, ckpt));
  if (damage != NULL) damage(on_drive.nvme_dir);
  pstar_status st = PSTAR_OK;
  int failed_at = -1;
  for (int s = 1; s < 4 && st == PSTAR_OK; ++s) {
    /* The hook arms the fault at the step that sees it. */
    if (s == 1 && fault != NULL) setenv("PSTAR_TEST_NVME_FAULT", fault, 1);
    st = train_step(&m, s);
    unsetenv("PSTAR_TEST_NVME_FAULT");
    failed_at = s;
  }
  cr_assert_eq(st, PSTAR_ERR_IO, "no step failed (%s)", pstar_status_name(st));
  cr_assert(strstr(g_failure, needle) != NULL, "step %d failed with \"%s\", expected \"%s\"", failed_at, g_failure,
            needle);
  T_FAIL(pstar_iteration_begin(m.e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_IO, "checkpoint");
  if (damage == NULL) {
    /* The drive is fine again: loading rewrites every state. */
    T_OK(pstar_checkpoint_load(m.e, ckpt));
    for (int s = 1; s < 6; ++s) T_OK(train_step(&m, s));
    snapshot(&m, got);
    assert_same(expect, got, fault);
  }
  T_OK(pstar_engine_destroy(m.e));
}

/* With the overlapped step the error surfaces at a later call than the
 * step that met it (the first acquire waiting for an update, or the next
 * iteration_begin); with the synchronous step, at that step. */
static void check_fault(const char *fault, void (*damage)(const char *dir), const char *needle) {
  check_fault_in(fault, damage, needle, 0);
  check_fault_in(fault, damage, needle, 1);
}

Test(nvme, disk_full_stops_training_until_a_checkpoint_is_loaded) { check_fault("write_nospace:1", NULL, "disk full"); }
Test(nvme, read_error_stops_training_until_a_checkpoint_is_loaded) { check_fault("read_eio:1", NULL, "Input/output error"); }
Test(nvme, silent_corruption_is_detected_and_repaired_by_a_checkpoint) {
  check_fault("write_corrupt:0", NULL, "corrupted");
}

static void flip_a_byte(const char *dir) {
  char f[512];
  data_file(dir, f, sizeof f);
  cr_assert_str_not_empty(f);
  int fd = open(f, O_RDWR);
  cr_assert_geq(fd, 0);
  unsigned char b = 0;
  cr_assert_eq(pread(fd, &b, 1, 100), 1);
  b ^= 0x40;
  cr_assert_eq(pwrite(fd, &b, 1, 100), 1);
  cr_assert_eq(fsync(fd), 0);
  close(fd);
}

static void remove_file(const char *dir) {
  char f[512];
  data_file(dir, f, sizeof f);
  cr_assert_str_not_empty(f);
  cr_assert_eq(unlink(f), 0);
}

Test(nvme, a_byte_flipped_in_the_file_is_detected) { check_fault(NULL, flip_a_byte, "corrupted"); }
Test(nvme, a_removed_file_is_detected) { check_fault(NULL, remove_file, "removed"); }

/* Checkpoint loads with optimizer state on the drive (docs/checkpoints.md,
 * "What a failed load leaves").  A refused load (every byte of the manifest
 * edited, a truncated data file, an offset past the end of a file with the
 * manifest's checksum recomputed) writes nothing to the drive: training on
 * equals an engine that never tried.  A load that fails after the checks
 * (the test hook's read error) stops training until a load completes, then
 * matches.  After an NVMe I/O error in a step, a refused load leaves
 * training refused; a good one repairs it. */
static void expect_refused_unchanged(model *m, const char *ckpt, const char *what) {
  static float before[TOTAL], after[TOTAL];
  snapshot(m, before);
  const double step_before = t_hparam(m->e, PSTAR_HPARAM_STEP);
  const pstar_status st = pstar_checkpoint_load(m->e, ckpt);
  char msg[T_MSG_CAP];
  t_copy_last_error(msg, sizeof msg);
  cr_assert(st == PSTAR_ERR_IO || st == PSTAR_ERR_INVALID_ARGUMENT, "%s: %s (%s)", what, pstar_status_name(st), msg);
  snapshot(m, after);
  assert_same(before, after, what);
  cr_assert_eq(t_hparam(m->e, PSTAR_HPARAM_STEP), step_before, "%s", what);
}

Test(nvme, refused_checkpoint_loads_leave_the_drive_as_it_was) {
  static float expect[TOTAL], got[TOTAL];
  char ckpt[600], manifest[700], masters[700], what[96];
  const config on_drive = {fresh_dir("refused"), kTightHost, 0, 0, 0};
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", on_drive.nvme_dir);
  const config in_memory = {NULL, 0, 0, 0, 0};
  run(&in_memory, 6, expect);

  model m;
  make(&m, &on_drive);
  cr_assert_gt(nvme_stats(&m).chunks_on_nvme, 0);
  T_OK(train_step(&m, 0));
  T_OK(pstar_checkpoint_save(m.e, ckpt));
  T_OK(train_step(&m, 1));
  T_OK(train_step(&m, 2));
  ck_latest_path(ckpt, "manifest", manifest, sizeof manifest);
  ck_latest_path(ckpt, "masters.f32", masters, sizeof masters);
  size_t len = 0, mlen = 0;
  unsigned char *pristine = ck_slurp(manifest, &len);
  unsigned char *copy = (unsigned char *)malloc(len + 16);
  cr_assert_not_null(copy);
  for (size_t i = 0; i < len; ++i) {
    memcpy(copy, pristine, len);
    copy[i] = (unsigned char)(copy[i] + 1);
    ck_spit(manifest, copy, len);
    snprintf(what, sizeof what, "manifest byte %zu + 1", i);
    expect_refused_unchanged(&m, ckpt, what);
  }
  ck_spit(manifest, pristine, len);
  unsigned char *data = ck_slurp(masters, &mlen);
  ck_spit(masters, data, mlen / 2);
  expect_refused_unchanged(&m, ckpt, "masters.f32 truncated");
  ck_spit(masters, data, mlen);
#if CK_HAVE_XXHASH
  {
    /* p1's offset (after p0's 900 elements) past the end of the files. */
    const char *hit = strstr((const char *)pristine, "offset=900 ");
    cr_assert_not_null(hit);
    const size_t at = (size_t)(hit - (const char *)pristine);
    memcpy(copy, pristine, at);
    memcpy(copy + at, "offset=90000 ", 13);
    memcpy(copy + at + 13, pristine + at + 11, len - at - 11);
    ck_reseal(copy, len + 2);
    ck_spit(manifest, copy, len + 2);
    expect_refused_unchanged(&m, ckpt, "an offset past the end, resealed");
    ck_spit(manifest, pristine, len);
  }
#endif
  for (int s = 3; s < 6; ++s) T_OK(train_step(&m, s));
  snapshot(&m, got);
  assert_same(expect, got, "training on after refused loads");

  /* A failure after the checks: training stops until a load completes. */
  setenv("PSTAR_TEST_CHECKPOINT_LOAD_FAULT", "read:5", 1);
  const pstar_status st = pstar_checkpoint_load(m.e, ckpt);
  unsetenv("PSTAR_TEST_CHECKPOINT_LOAD_FAULT");
  T_STATUS(st, PSTAR_ERR_IO);
  T_FAIL(pstar_iteration_begin(m.e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_IO, "failed part way");
  T_OK(pstar_checkpoint_load(m.e, ckpt));
  for (int s = 1; s < 6; ++s) T_OK(train_step(&m, s));
  snapshot(&m, got);
  assert_same(expect, got, "resumed after a load that failed part way");

  /* An NVMe read error in a step, then a refused load: still refused. */
  T_OK(pstar_checkpoint_load(m.e, ckpt));
  setenv("PSTAR_TEST_NVME_FAULT", "read_eio:1", 1);
  T_STATUS(settled_step(&m, 1), PSTAR_ERR_IO);
  unsetenv("PSTAR_TEST_NVME_FAULT");
  memcpy(copy, pristine, len);
  copy[len / 2] ^= 0x01;
  ck_spit(manifest, copy, len);
  T_FAIL(pstar_checkpoint_load(m.e, ckpt), PSTAR_ERR_IO, "corrupted");
  T_FAIL(pstar_iteration_begin(m.e, PSTAR_ITERATION_TRAIN), PSTAR_ERR_IO, "NVMe I/O error");
  ck_spit(manifest, pristine, len);
  T_OK(pstar_checkpoint_load(m.e, ckpt));
  for (int s = 1; s < 6; ++s) T_OK(train_step(&m, s));
  snapshot(&m, got);
  assert_same(expect, got, "resumed after an NVMe error and a refused load");
  T_OK(pstar_engine_destroy(m.e));
  free(data);
  free(copy);
  free(pristine);
}

Test(nvme, misuse_is_refused) {
  pstar_x_nvme_options n;
  T_OK(pstar_x_nvme_options_init(&n));
  cr_assert_eq(n.size, sizeof n);
  cr_assert_eq(n.version, PSTAR_X_NVME_OPTIONS_VERSION);
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  pstar_engine *e = t_create(&o);
  T_FAIL(pstar_x_engine_set_nvme(e, &n), PSTAR_ERR_INVALID_ARGUMENT, "dir");
  T_FAIL(pstar_x_engine_set_nvme(e, NULL), PSTAR_ERR_INVALID_ARGUMENT, "options");
  n.dir = "/nonexistent/pstar";
  T_FAIL(pstar_x_engine_set_nvme(e, &n), PSTAR_ERR_INVALID_ARGUMENT, "/nonexistent/pstar");
  n.dir = fresh_dir("misuse");
  n.staging_buffers = 1;
  T_FAIL(pstar_x_engine_set_nvme(e, &n), PSTAR_ERR_INVALID_ARGUMENT, "staging_buffers");
  n.staging_buffers = 0;
  n.version = 99;
  T_FAIL(pstar_x_engine_set_nvme(e, &n), PSTAR_ERR_VERSION, "");
  n.version = PSTAR_X_NVME_OPTIONS_VERSION;
  pstar_x_nvme_stats s;
  T_OK(pstar_x_nvme_stats_init(&s));
  cr_assert_eq(s.size, sizeof s);
  cr_assert_eq(s.version, PSTAR_X_NVME_STATS_VERSION);
  T_FAIL(pstar_x_nvme_get_stats(e, &s), PSTAR_ERR_INVALID_STATE, "no NVMe tier");
  s.version = 0;
  T_FAIL(pstar_x_nvme_get_stats(e, &s), PSTAR_ERR_VERSION, "");
  s.version = PSTAR_X_NVME_STATS_VERSION;
  T_OK(pstar_x_engine_set_nvme(e, &n));
  T_FAIL(pstar_x_engine_set_nvme(e, &n), PSTAR_ERR_INVALID_STATE, "already");
  (void)t_register(e, "w", 100, 0);
  T_OK(pstar_engine_build(e));
  T_FAIL(pstar_x_engine_set_nvme(e, &n), PSTAR_ERR_INVALID_STATE, "built");
  T_OK(pstar_engine_destroy(e));

  /* Not with hybrid placement; no negative or NaN bandwidths. */
  o.hybrid_optimizer = 1;
  e = t_create(&o);
  T_FAIL(pstar_x_engine_set_nvme(e, &n), PSTAR_ERR_UNSUPPORTED, "hybrid");
  T_OK(pstar_engine_destroy(e));
  o.hybrid_optimizer = 0;
  e = t_create(&o);
  n.read_bytes_per_s = -1.0;
  T_FAIL(pstar_x_engine_set_nvme(e, &n), PSTAR_ERR_INVALID_ARGUMENT, "read_bytes_per_s");
  n.read_bytes_per_s = NAN;
  T_FAIL(pstar_x_engine_set_nvme(e, &n), PSTAR_ERR_INVALID_ARGUMENT, "read_bytes_per_s");
  T_OK(pstar_engine_destroy(e));
}

Test(nvme, the_drive_capacity_is_a_limit) {
  const config on_drive = {fresh_dir("cap"), kTightHost, 0, 0, 0};
  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, CHUNK);
  o.host_capacity_bytes = on_drive.host_capacity;
  pstar_engine *e = t_create(&o);
  pstar_x_nvme_options n;
  T_OK(pstar_x_nvme_options_init(&n));
  n.dir = on_drive.nvme_dir;
  n.capacity_bytes = 3 * CHUNK * 4; /* one chunk's state; several must go */
  T_OK(pstar_x_engine_set_nvme(e, &n));
  uint32_t ids[P + 1];
  register_params(e, ids, 0);
  T_FAIL(pstar_engine_build(e), PSTAR_ERR_OUT_OF_MEMORY, "NVMe tier's capacity");
  T_OK(pstar_engine_destroy(e));
}

/* A dry run with an NVMe tier places the same chunks on the drive, counts
 * the same step traffic as a run with payloads, and advances its clock by
 * the modelled drive time. */
Test(nvme, a_dry_run_places_and_counts_like_a_real_run) {
  const config on_drive = {fresh_dir("dry"), kTightHost, 0, 0, 0};
  model real;
  make(&real, &on_drive);
  for (int s = 0; s < 3; ++s) T_OK(train_step(&real, s));
  const pstar_x_nvme_stats want = nvme_stats(&real);
  T_OK(pstar_engine_destroy(real.e));

  pstar_engine_options o = t_options(PSTAR_DTYPE_F16, CHUNK);
  o.host_capacity_bytes = kTightHost;
  o.dry_run = 1;
  model dry;
  dry.e = t_create(&o);
  pstar_x_nvme_options n;
  T_OK(pstar_x_nvme_options_init(&n));
  n.read_bytes_per_s = 2e9;
  n.write_bytes_per_s = 1e9;
  T_OK(pstar_x_engine_set_nvme(dry.e, &n)); /* no directory: no file */
  register_params(dry.e, dry.ids, 1);
  T_OK(pstar_engine_build(dry.e));
  double before = 0, after = 0;
  for (int s = 0; s < 3; ++s) {
    void *p;
    T_OK(pstar_iteration_begin(dry.e, PSTAR_ITERATION_TRAIN));
    for (int i = 0; i <= P; ++i) {
      T_OK(pstar_param_acquire(dry.e, dry.ids[i], PSTAR_STAGE_FORWARD, NULL, &p));
      T_OK(pstar_param_release(dry.e, dry.ids[i], NULL));
    }
    for (int i = P; i >= 0; --i) {
      T_OK(pstar_param_acquire(dry.e, dry.ids[i], PSTAR_STAGE_BACKWARD, NULL, &p));
      if (i < P) T_OK(pstar_grad_write(dry.e, dry.ids[i], NULL, (uint64_t)numel_of(i), PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      T_OK(pstar_param_release(dry.e, dry.ids[i], NULL));
    }
    T_OK(pstar_clock_now(dry.e, &before));
    T_OK(pstar_step(dry.e, NULL));
    T_OK(pstar_clock_now(dry.e, &after));
  }
  const pstar_x_nvme_stats got = nvme_stats(&dry);
  cr_assert_eq(got.chunks_on_nvme, want.chunks_on_nvme);
  cr_assert_eq(got.bytes_on_nvme, want.bytes_on_nvme);
  cr_assert_eq(got.step_bytes_read, want.step_bytes_read);
  cr_assert_eq(got.step_bytes_written, want.step_bytes_written);
  cr_assert_eq(got.step_bytes_read, 3 * want.bytes_on_nvme);
  cr_assert_eq(got.bytes_read, 0);
  const double drive_s = (double)want.bytes_on_nvme / 2e9 + (double)want.bytes_on_nvme / 1e9;
  /* The step's modelled time: the drive's, plus the copies of its evictions. */
  cr_assert(after - before >= drive_s - 1e-12, "the last step took %.9g modelled s, the drive alone %.9g",
            after - before, drive_s);
  cr_assert_float_eq(got.step_io_wait_seconds, 3 * drive_s, 1e-12);
  T_OK(pstar_engine_destroy(dry.e));
}

Test(nvme, a_master_on_the_drive_cannot_be_pinned) {
  const config on_drive = {fresh_dir("pin"), kTightHost, 0, 0, 0};
  model m;
  make(&m, &on_drive);
  int refused = 0, pinned = 0;
  for (int i = 0; i < P; ++i) {
    float *ptr = NULL;
    pstar_dtype dt;
    pstar_status st = pstar_param_pin(m.e, m.ids[i], 0, (void **)&ptr, &dt);
    if (st == PSTAR_OK) {
      ++pinned;
      T_OK(pstar_param_unpin(m.e, m.ids[i]));
    } else {
      cr_assert_eq(st, PSTAR_ERR_UNSUPPORTED);
      ++refused;
    }
  }
  cr_assert_eq((uint32_t)refused, nvme_stats(&m).chunks_on_nvme);
  cr_assert_gt(pinned, 0);
  T_OK(pstar_engine_destroy(m.e));
}
