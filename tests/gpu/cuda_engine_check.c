/* CUDA tier check, a plain C program (the GPU machine has no Criterion).
 * Trains the same small model on the CUDA device (capacity-constrained) and
 * on the emulated device and requires bit-identical parameters.  The model
 * has a frozen parameter; values are read and rewritten between steps (a
 * trained and the frozen one: written where their chunks are), and one step
 * is skipped for an overflowing gradient (weights restored in place).  Exits 77
 * (CTest's skip code) with "skipped: no CUDA device" where CUDA cannot be
 * used, so a skip is never counted as a pass.  Prints "N passed, N failed". */
#include <math.h>
#include <pstar/pstar.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kParams = 5, kElems = 3000, kSteps = 6, kFrozen = 2, kOverflowStep = 3, kRewriteStep = 2 };

static int failures = 0, passes = 0;

static void expect(int ok, const char *what) {
  if (ok) {
    ++passes;
  } else {
    ++failures;
    fprintf(stderr, "FAIL: %s\n", what);
  }
}

static pstar_status train(pstar_device_kind device, uint64_t capacity, pstar_dtype dtype, int hybrid, float *out,
                          pstar_stats *stats) {
  pstar_engine_options o;
  pstar_engine *e = NULL;
  uint32_t id[kParams];
  int64_t shape[1] = {kElems};
  static float buf[kElems];
  pstar_status st;
  int i, p, s;
  pstar_engine_options_init(&o);
  o.device = device;
  o.device_capacity_bytes = capacity;
  o.chunk_elems = 4096;
  o.compute_dtype = dtype;
  o.lr = 1e-2f;
  o.hybrid_optimizer = hybrid;
  if ((st = pstar_engine_create(&o, &e)) != PSTAR_OK) return st;
#define TRY(call) do { if ((st = (call)) != PSTAR_OK) goto done; } while (0)
  for (p = 0; p < kParams; ++p) {
    char name[16];
    sprintf(name, "p%d", p);
    TRY(pstar_param_register(e, name, 1, shape, p == kFrozen ? PSTAR_PARAM_FROZEN : 0, &id[p]));
  }
  TRY(pstar_engine_build(e));
  for (p = 0; p < kParams; ++p) {
    for (i = 0; i < kElems; ++i) buf[i] = (float)((i * 7 + p * 13) % 101) / 101.0f - 0.5f;
    TRY(pstar_param_write(e, id[p], buf, kElems, PSTAR_DTYPE_F32));
  }
  for (s = 0; s < kSteps; ++s) {
    void *w;
    TRY(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (p = 0; p < kParams; ++p) {
      TRY(pstar_param_acquire(e, id[p], PSTAR_STAGE_FORWARD, NULL, &w));
      TRY(pstar_param_release(e, id[p], NULL));
    }
    for (p = kParams - 1; p >= 0; --p) {
      TRY(pstar_param_acquire(e, id[p], PSTAR_STAGE_BACKWARD, NULL, &w));
      if (p != kFrozen) {
        for (i = 0; i < kElems; ++i) buf[i] = (float)(((i + s * 31 + p) % 17) - 8) / 64.0f;
        if (s == kOverflowStep && p == 4) buf[5] = INFINITY;
        TRY(pstar_grad_write(e, id[p], buf, kElems, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      }
      TRY(pstar_param_release(e, id[p], NULL));
    }
    TRY(pstar_step(e, NULL));
    if (s == kRewriteStep) {
      /* Read, change and write back a trained and the frozen parameter. */
      int q;
      for (q = 1; q <= kFrozen; ++q) {
        TRY(pstar_param_read(e, id[q], buf, kElems, PSTAR_DTYPE_F32));
        for (i = 0; i < kElems; ++i) buf[i] = buf[i] * 0.5f + 0.125f;
        TRY(pstar_param_write(e, id[q], buf, kElems, PSTAR_DTYPE_F32));
      }
    }
  }
  for (p = 0; p < kParams; ++p) TRY(pstar_param_read(e, id[p], out + (size_t)p * kElems, kElems, PSTAR_DTYPE_F32));
  pstar_stats_init(stats);
  TRY(pstar_engine_get_stats(e, stats));
done:
  pstar_engine_destroy(e);
  return st;
#undef TRY
}

int main(void) {
  static float cuda_out[kParams * kElems], emu_out[kParams * kElems];
  pstar_stats cs, es;
  const pstar_dtype dtypes[2] = {PSTAR_DTYPE_BF16, PSTAR_DTYPE_F16};
  int d;
  pstar_engine_options o;
  pstar_engine *probe = NULL;
  pstar_status st;
  pstar_engine_options_init(&o);
  o.device = PSTAR_DEVICE_CUDA;
  st = pstar_engine_create(&o, &probe);
  if (st == PSTAR_ERR_UNSUPPORTED || st == PSTAR_ERR_DEVICE) {
    printf("skipped: no CUDA device (%s: %s)\n", pstar_status_name(st), pstar_last_error_message());
    return 77;
  }
  expect(st == PSTAR_OK, "create a CUDA engine");
  pstar_engine_destroy(probe);
  for (d = 0; d < 2; ++d) {
    /* Two chunks of 4096 bf16/f16 elements fit; the model has five. */
    const uint64_t cap = 2 * 4096 * 2 + 2 * kElems * 4;
    /* Hybrid: room for two more chunks' optimizer state (12 bytes per
     * element) and their pinned payloads beside the streaming room. */
    const uint64_t cap_hybrid = cap + 2 * 4096 * (12 + 2);
    st = train(PSTAR_DEVICE_CUDA, cap, dtypes[d], 0, cuda_out, &cs);
    if (st != PSTAR_OK) fprintf(stderr, "cuda run: %s: %s\n", pstar_status_name(st), pstar_last_error_message());
    expect(st == PSTAR_OK, "train on CUDA");
    st = train(PSTAR_DEVICE_EMULATED, 0, dtypes[d], 0, emu_out, &es);
    expect(st == PSTAR_OK, "train on the emulated device");
    expect(memcmp(cuda_out, emu_out, sizeof cuda_out) == 0, "CUDA and emulated parameters bit-identical");
    expect(cs.skipped_steps == 1 && es.skipped_steps == 1, "the overflowing step skipped on both devices");
    expect(cs.evictions > 0, "constrained CUDA run evicted chunks");
    expect(cs.peak_device_bytes <= cap, "CUDA peak within capacity");
    /* Hybrid placement: some optimizer state updated by the CUDA kernel,
     * the rest on the CPU; the same bits. */
    st = train(PSTAR_DEVICE_CUDA, cap_hybrid, dtypes[d], 1, cuda_out, &cs);
    if (st != PSTAR_OK) fprintf(stderr, "cuda hybrid run: %s: %s\n", pstar_status_name(st), pstar_last_error_message());
    expect(st == PSTAR_OK, "train on CUDA with hybrid optimizer placement");
    expect(cs.optimizer_chunks_on_device > 0, "hybrid placed optimizer state on the GPU");
    expect(cs.optimizer_chunks_on_device < cs.optimizer_chunks, "hybrid left some optimizer state on the host");
    expect(memcmp(cuda_out, emu_out, sizeof cuda_out) == 0, "CUDA hybrid and emulated parameters bit-identical");
    expect(cs.peak_device_bytes <= cap_hybrid, "CUDA hybrid peak within capacity");
  }
  printf("%d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}
