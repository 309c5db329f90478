/* libFuzzer harness over the C API (tests/fuzz/README.md).
 *
 * The input is read as a program: one opcode byte, then the bytes its call
 * needs (choices from tables of good, boundary and bad values).  Up to two
 * engines live at a time; destroyed ones stay in the table and keep being
 * used (the library must answer PSTAR_ERR_INVALID_HANDLE).  Every call must
 * return a known status; anything else, or a crash, a leak or a sanitizer
 * report, is a finding.  Memory the harness owns bounds what it passes: a
 * count larger than its buffers is only passed where it cannot match the
 * parameter's element count, so an overflow found is the library's.  Host
 * capacity is always bounded, so a huge registration fails with
 * PSTAR_ERR_OUT_OF_MEMORY instead of exhausting the machine.  The file calls
 * (checkpoints, safetensors, the timeline) and the experimental NVMe tier
 * use a scratch directory of this process, emptied before every input. */
#define _DEFAULT_SOURCE /* mkdtemp */
#define _XOPEN_SOURCE 700 /* nftw */
#define PSTAR_EXPERIMENTAL_API 1
#include <ftw.h>
#include <stdio.h>
#include <unistd.h>
#include <math.h>
#include <pstar/pstar.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { kBufElems = 4096, kEngines = 2 };

typedef struct {
  const uint8_t *p;
  size_t n;
} input;

static uint8_t u8(input *in) {
  if (in->n == 0) return 0;
  --in->n;
  return *in->p++;
}

static uint64_t pick_u64(input *in, const uint64_t *table, size_t n) { return table[u8(in) % n]; }

static void expect_known(pstar_status st) {
  if (st > 0 || st < PSTAR_ERR_INTERNAL) abort();      /* an undocumented status */
  if (st == PSTAR_ERR_INTERNAL) abort();                /* a broken invariant */
}

static void quiet(pstar_log_level level, const char *message, void *user) {
  (void)level;
  (void)message;
  (void)user;
}

/* The scratch directory, and the paths the file calls draw from: good
 * ones, a file where a directory is expected, a directory that cannot be
 * created, empty and NULL. */
static char g_scratch[64];
static char g_paths[5][96];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  if (ftw->level > 0) remove(path);
  return 0;
}

static void remove_scratch(void) {
  nftw(g_scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  rmdir(g_scratch);
}

/* PSTAR_FUZZ_TRACE set: every call's status on stderr (for writing corpus
 * entries by hand). */
static int g_trace;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  g_trace = getenv("PSTAR_FUZZ_TRACE") != NULL;
  pstar_log_set_callback(quiet, NULL, PSTAR_LOG_ERROR);
  const char *tmp = getenv("TMPDIR");
  snprintf(g_scratch, sizeof g_scratch, "%s/pstar-fuzz-XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp");
  if (mkdtemp(g_scratch) == NULL) abort();
  atexit(remove_scratch);
  snprintf(g_paths[0], sizeof g_paths[0], "%s/ckpt", g_scratch);
  snprintf(g_paths[1], sizeof g_paths[1], "%s/file", g_scratch);
  snprintf(g_paths[2], sizeof g_paths[2], "%s/file/below", g_scratch);
  snprintf(g_paths[3], sizeof g_paths[3], "%s", g_scratch);
  g_paths[4][0] = '\0';
  return 0;
}

static const char *pick_path(input *in) {
  const int k = u8(in) % 6;
  return k == 5 ? NULL : g_paths[k];
}

/* Manifest damage for the checkpoint loads (op 23): kind d (1..42) at a
 * place from d and `where`: d % 3 == 0 flips bit d / 3 % 8 of a byte, 1
 * truncates the manifest there, 2 adds 1 to the byte. */
static void damage_manifest(unsigned d, unsigned where) {
  if (d == 0) return;
  char latest[160], name[96] = {0}, path[300];
  snprintf(latest, sizeof latest, "%s/LATEST", g_paths[0]);
  FILE *f = fopen(latest, "r");
  if (f == NULL) return;
  const int got = fgets(name, sizeof name, f) != NULL;
  fclose(f);
  if (!got) return;
  name[strcspn(name, "\n")] = 0;
  snprintf(path, sizeof path, "%s/%s/manifest", g_paths[0], name);
  static unsigned char text[1 << 16];
  f = fopen(path, "rb");
  if (f == NULL) return;
  size_t len = fread(text, 1, sizeof text, f);
  fclose(f);
  if (len == 0) return;
  const size_t at = ((size_t)where * 977u + (size_t)d * 131u) % len;
  if (d % 3 == 0) text[at] ^= (unsigned char)(1u << (d / 3 % 8));
  if (d % 3 == 1) len = at;
  if (d % 3 == 2) text[at] = (unsigned char)(text[at] + 1);
  f = fopen(path, "wb");
  if (f == NULL) return;
  if (len > 0) fwrite(text, 1, len, f);
  fclose(f);
}

/* What a refused load must leave: the values of parameters 0..5 that can be
 * read, every hyperparameter and the step. */
static float g_snap[6][kBufElems], g_now[kBufElems];
static int g_snapped[6];
static double g_hsnap[8];
static int g_hsnapped[8];

static void snap_values(pstar_engine *e) {
  for (uint32_t id = 0; id < 6; ++id) {
    uint64_t numel = 0;
    g_snapped[id] = pstar_param_numel(e, id, &numel) == PSTAR_OK && numel <= kBufElems &&
                    pstar_param_read(e, id, g_snap[id], numel, PSTAR_DTYPE_F32) == PSTAR_OK;
  }
  for (int h = 0; h < 8; ++h) g_hsnapped[h] = pstar_hparam_get(e, (pstar_hparam)h, &g_hsnap[h]) == PSTAR_OK;
}

static void expect_values_unchanged(pstar_engine *e) {
  for (uint32_t id = 0; id < 6; ++id) {
    uint64_t numel = 0;
    if (!g_snapped[id] || pstar_param_numel(e, id, &numel) != PSTAR_OK) continue;
    if (pstar_param_read(e, id, g_now, numel, PSTAR_DTYPE_F32) != PSTAR_OK) continue;
    if (memcmp(g_now, g_snap[id], numel * sizeof(float)) != 0) abort(); /* a refused load changed a value */
  }
  for (int h = 0; h < 8; ++h) {
    double v = 0;
    if (!g_hsnapped[h] || pstar_hparam_get(e, (pstar_hparam)h, &v) != PSTAR_OK) continue;
    if (memcmp(&v, &g_hsnap[h], sizeof v) != 0) abort(); /* ... or a hyperparameter, the step */
  }
}

static const uint64_t kCapacities[] = {0, 1, 64, 4096, 1u << 14, 1u << 16, 1u << 20};
static const uint64_t kHostCapacities[] = {1, 4096, 1u << 16, 1u << 20, 1u << 22};
static const uint64_t kChunkElems[] = {0, 1, 127, 128, 1024, 4096};
static const int64_t kDims[] = {0, 1, 3, 64, 100, -1, (int64_t)1 << 40};
static const double kValues[] = {0.0, 1e-3, 0.5, 1.0, -1.0, 1e30, -1e30, INFINITY, NAN, 65536.0};
static const uint64_t kBytes[] = {0, 1, 4096, 1u << 20, UINT64_MAX};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  input in = {data, size};
  pstar_engine *engines[kEngines] = {NULL, NULL};
  int live[kEngines] = {0, 0};
  static float buf[kBufElems];
  static uint16_t half[kBufElems];
  for (int i = 0; i < kBufElems; ++i) {
    buf[i] = (float)(i % 13) * 0.25f - 1.0f;
    half[i] = (uint16_t)(0x3c00u + (unsigned)(i % 7));
  }
  /* A fresh scratch directory: a plain file among its entries. */
  nftw(g_scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  FILE *f = fopen(g_paths[1], "w");
  if (f != NULL) fclose(f);
  int ops = 0;
  while (in.n > 0 && ops++ < 200) {
    const uint8_t op = u8(&in) % 27;
    const int w = u8(&in) % kEngines;
    pstar_engine *e = engines[w];
    const uint8_t id_byte = u8(&in);
    const uint32_t id = id_byte % 7; /* ids 0..5 may exist; 6 never does */
    pstar_status st = PSTAR_OK;
    switch (op) {
      case 0: { /* create (destroying the slot's engine first) */
        if (live[w]) {
          expect_known(pstar_engine_destroy(e));
          live[w] = 0;
        }
        pstar_engine_options o;
        pstar_engine_options_init(&o);
        o.device = PSTAR_DEVICE_EMULATED;
        o.device_capacity_bytes = pick_u64(&in, kCapacities, sizeof kCapacities / sizeof *kCapacities);
        o.host_capacity_bytes = pick_u64(&in, kHostCapacities, sizeof kHostCapacities / sizeof *kHostCapacities);
        o.chunk_elems = pick_u64(&in, kChunkElems, sizeof kChunkElems / sizeof *kChunkElems);
        const uint8_t f = u8(&in);
        o.compute_dtype = (pstar_dtype)(f % 4);
        o.strict = (f >> 2) & 1;
        o.placement_policy = (pstar_policy)((f >> 3) % 4);
        o.prefetch = (f >> 5) & 1;
        o.grad_accumulation = (f >> 6) & 1;
        o.hybrid_optimizer = (f >> 7) & 1;
        const uint8_t g = u8(&in);
        o.threads = g % 3;
        o.virtual_clock = (g >> 2) & 1;
        o.dry_run = (g >> 3) & 1;
        o.warmup_iterations = (g >> 4) % 3;
        o.lr = (float)kValues[u8(&in) % 10];
        if (u8(&in) == 0xff) o.size = 3; /* a struct of an unknown size */
        pstar_engine *ne = NULL;
        st = pstar_engine_create(u8(&in) == 0xfe ? NULL : &o, &ne);
        if (st == PSTAR_OK) {
          engines[w] = ne;
          live[w] = 1;
        }
        break;
      }
      case 1: /* destroy: the pointer stays, and keeps being used */
        st = pstar_engine_destroy(e);
        live[w] = 0;
        break;
      case 2: { /* register */
        static const char *names[] = {"a", "b", "c", "", "a b%c", NULL};
        char longname[300];
        memset(longname, 'x', sizeof longname - 1);
        longname[sizeof longname - 1] = 0;
        const uint8_t k = u8(&in);
        const char *name = k == 6 ? longname : names[k % 6];
        int64_t shape[5];
        const uint32_t ndim = u8(&in) % 6;
        for (uint32_t i = 0; i < 5; ++i) shape[i] = kDims[u8(&in) % 7];
        uint32_t out = 0;
        st = pstar_param_register(e, name, ndim, u8(&in) == 0xff ? NULL : shape, u8(&in) % 8, &out);
        break;
      }
      case 3:
        st = pstar_engine_build(e);
        break;
      case 4: case 5: { /* write / read, counts matching only within the buffer */
        uint64_t numel = 0;
        const pstar_status q = pstar_param_numel(e, id, &numel);
        expect_known(q);
        uint64_t count = (q == PSTAR_OK && numel <= kBufElems) ? numel : (uint64_t)u8(&in);
        if (q == PSTAR_OK && numel > kBufElems && count == numel) count = 0;
        const pstar_dtype dt = (pstar_dtype)(u8(&in) % 4);
        void *mem = (dt == PSTAR_DTYPE_F32) ? (void *)buf : (void *)half;
        st = op == 4 ? pstar_param_write(e, id, mem, count, dt) : pstar_param_read(e, id, mem, count, dt);
        break;
      }
      case 6:
        st = pstar_iteration_begin(e, (pstar_iteration_kind)(u8(&in) % 3));
        break;
      case 7:
        st = pstar_iteration_end(e);
        break;
      case 8: {
        void *p = NULL;
        st = pstar_param_acquire(e, id, (pstar_stage)(u8(&in) % 4), NULL, &p);
        break;
      }
      case 9:
        st = pstar_param_release(e, id, NULL);
        break;
      case 10: { /* a gradient from host memory, counts as for values */
        uint64_t numel = 0;
        const pstar_status q = pstar_param_numel(e, id, &numel);
        expect_known(q);
        uint64_t count = (q == PSTAR_OK && numel <= kBufElems) ? numel : (uint64_t)u8(&in);
        if (q == PSTAR_OK && numel > kBufElems && count == numel) count = 0;
        const pstar_dtype dt = (pstar_dtype)(u8(&in) % 3);
        st = pstar_grad_write(e, id, dt == PSTAR_DTYPE_F32 ? (void *)buf : (void *)half, count, dt,
                              (pstar_mem_space)(u8(&in) % 2), NULL);
        break;
      }
      case 11: {
        float *slot = NULL;
        st = pstar_grad_slot_acquire(e, id, NULL, &slot);
        if (st == PSTAR_OK && slot != NULL) slot[0] += 1.0f;
        break;
      }
      case 12: {
        pstar_step_result r;
        pstar_step_result_init(&r);
        st = pstar_step(e, u8(&in) & 1 ? &r : NULL);
        break;
      }
      case 13:
        st = pstar_hparam_set(e, (pstar_hparam)(u8(&in) % 9), kValues[u8(&in) % 10]);
        break;
      case 14: {
        double v = 0;
        st = pstar_hparam_get(e, (pstar_hparam)(u8(&in) % 9), &v);
        break;
      }
      case 15: {
        pstar_stats s;
        pstar_stats_init(&s);
        if (u8(&in) == 0xff) s.version = 99;
        st = pstar_engine_get_stats(e, &s);
        break;
      }
      case 16:
        st = pstar_nonmodel_report(e, kBytes[u8(&in) % 5]);
        break;
      case 17:
        st = pstar_clock_advance(e, kValues[u8(&in) % 10]);
        break;
      case 18: {
        void *p = NULL;
        pstar_dtype dt;
        st = pstar_param_pin(e, id, u8(&in) & 1, &p, &dt);
        break;
      }
      case 19:
        st = pstar_param_unpin(e, id);
        break;
      case 20: {
        uint32_t found = 0;
        st = pstar_param_find(e, u8(&in) & 1 ? "a" : "zz", &found);
        break;
      }
      case 21:
        st = pstar_param_set_lr_scale(e, id, (float)kValues[u8(&in) % 10]);
        break;
      case 22:
        st = pstar_checkpoint_save(e, pick_path(&in));
        break;
      case 23: {
        /* The path byte's quotient by 6 (pick_path keeps the remainder)
         * damages the manifest of the checkpoint under g_paths[0] first (0:
         * not at all), at a place the id byte's quotient by 7 also moves;
         * inputs written before this read the same. */
        const uint8_t path_byte = in.n > 0 ? in.p[0] : 0;
        damage_manifest(path_byte / 6, id_byte / 7);
        snap_values(e);
        st = pstar_checkpoint_load(e, pick_path(&in));
        if (st != PSTAR_OK && strstr(pstar_last_error_message(), "holds part of the checkpoint") == NULL) {
          expect_values_unchanged(e); /* a refused load changes nothing */
        }
        break;
      }
      case 24:
        st = pstar_export_safetensors(e, pick_path(&in));
        break;
      case 25:
        st = pstar_trace_export(e, pick_path(&in));
        break;
      case 26: { /* the NVMe tier: a directory, capacities and buffers from the tables */
        pstar_x_nvme_options n;
        st = pstar_x_nvme_options_init(&n);
        expect_known(st);
        n.dir = pick_path(&in);
        n.staging_buffers = u8(&in) % 4;
        n.capacity_bytes = kBytes[u8(&in) % 5];
        n.buffered = u8(&in) & 1;
        st = pstar_x_engine_set_nvme(e, &n);
        break;
      }
      default:
        break;
    }
    expect_known(st);
    if (g_trace) fprintf(stderr, "op %2d engine %d id %u: %s\n", op, w, id, pstar_status_name(st));
  }
  for (int i = 0; i < kEngines; ++i) {
    if (live[i]) expect_known(pstar_engine_destroy(engines[i]));
  }
  return 0;
}
