/* Training-step time of the engine on the CUDA device, three placements of
 * one model measured in the same run, each with the synchronous and with the
 * overlapped step (pstar_x_engine_set_overlap_step; the engine's default),
 * and with the overlapped step and the speculative update
 * (pstar_x_engine_set_speculative_update, no bound), run one after the other:
 *   - roomy: the device holds every compute chunk (nothing moves after the
 *     first iteration; the baseline);
 *   - constrained: the device holds half of the compute chunks, so chunks move
 *     over PCIe every iteration (the placement runtime's prefetch and OPT);
 *   - roomy + hybrid: the roomy device with room for the optimizer state of
 *     three chunks more, which the hybrid placement keeps and updates on the
 *     GPU (the rest is updated by the CPU).
 * Prints the median iteration time of each, the ratios, the overlapped
 * step's speedup and the time its caller waited for updates, and writes
 * cuda_engine_bench.json into the folder given as the first argument.  A
 * benchmark, not a test: it asserts nothing about time.  Exits 77 with
 * "skipped: no CUDA device" where CUDA cannot be used. */
#define PSTAR_EXPERIMENTAL_API 1
#include <pstar/pstar.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kParams = 48, kElems = 1 << 20, kChunkElems = 4 << 20, kIterations = 7 };

typedef struct {
  double median_s;
  double bytes_moved_per_iteration;
  uint32_t optimizer_chunks_on_device;
  uint64_t evictions;
  double update_wait_s; /* overlapped: the caller's wait for updates per iteration */
  double kept_per_iteration; /* speculative: chunk updates kept from the backward */
} result;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static pstar_status run(uint64_t capacity, int hybrid, int overlap, int speculate, result *r) {
  static float buf[kElems];
  double t[kIterations];
  pstar_engine_options o;
  pstar_engine *e = NULL;
  pstar_stats s0, s1;
  pstar_x_step_stats x0, x1;
  uint32_t id[kParams];
  int64_t shape[1] = {kElems};
  pstar_status st;
  int i, p, it;
  pstar_engine_options_init(&o);
  o.device = PSTAR_DEVICE_CUDA;
  o.device_capacity_bytes = capacity;
  o.chunk_elems = kChunkElems;
  o.compute_dtype = PSTAR_DTYPE_BF16;
  o.hybrid_optimizer = hybrid;
  if ((st = pstar_engine_create(&o, &e)) != PSTAR_OK) return st;
#define TRY(call) do { if ((st = (call)) != PSTAR_OK) goto done; } while (0)
  TRY(pstar_x_engine_set_overlap_step(e, overlap));
  TRY(pstar_x_engine_set_speculative_update(e, speculate ? UINT64_MAX : 0));
  for (p = 0; p < kParams; ++p) {
    char name[16];
    sprintf(name, "w%d", p);
    TRY(pstar_param_register(e, name, 1, shape, 0, &id[p]));
  }
  TRY(pstar_engine_build(e));
  for (i = 0; i < kElems; ++i) buf[i] = (float)(i % 97) / 97.0f - 0.5f;
  for (p = 0; p < kParams; ++p) TRY(pstar_param_write(e, id[p], buf, kElems, PSTAR_DTYPE_F32));
  for (i = 0; i < kElems; ++i) buf[i] = (float)((i % 13) - 6) / 1024.0f;
  for (it = 0; it < kIterations; ++it) {
    void *w;
    double t0;
    if (it == 2) {
      pstar_stats_init(&s0);
      TRY(pstar_engine_get_stats(e, &s0));
      pstar_x_step_stats_init(&x0);
      TRY(pstar_x_step_get_stats(e, &x0));
    }
    t0 = now_s();
    TRY(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (p = 0; p < kParams; ++p) {
      TRY(pstar_param_acquire(e, id[p], PSTAR_STAGE_FORWARD, NULL, &w));
      TRY(pstar_param_release(e, id[p], NULL));
    }
    for (p = kParams - 1; p >= 0; --p) {
      TRY(pstar_param_acquire(e, id[p], PSTAR_STAGE_BACKWARD, NULL, &w));
      TRY(pstar_grad_write(e, id[p], buf, kElems, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      TRY(pstar_param_release(e, id[p], NULL));
    }
    TRY(pstar_step(e, NULL));
    /* An overlapped iteration's time is counted up to its step's return;
     * its updates run under the next iteration, whose acquires wait for
     * them.  The last one is waited for below, outside the medians. */
    t[it] = now_s() - t0;
  }
  pstar_x_step_stats_init(&x1);
  TRY(pstar_x_step_get_stats(e, &x1));
  r->update_wait_s = (x1.wait_seconds - x0.wait_seconds) / (kIterations - 2);
  r->kept_per_iteration = (double)(x1.chunks_speculated - x0.chunks_speculated) / (kIterations - 2);
  pstar_stats_init(&s1);
  TRY(pstar_engine_get_stats(e, &s1));
  /* Iterations 0 and 1 are warm-up (the trace, the first placement). */
  qsort(t + 2, kIterations - 2, sizeof(double), cmp_double);
  r->median_s = t[2 + (kIterations - 2) / 2];
  r->bytes_moved_per_iteration = (double)(s1.bytes_host_to_device + s1.bytes_device_to_host -
                                          s0.bytes_host_to_device - s0.bytes_device_to_host) /
                                 (kIterations - 2);
  r->optimizer_chunks_on_device = s1.optimizer_chunks_on_device;
  r->evictions = s1.evictions;
done:
  pstar_engine_destroy(e);
  return st;
#undef TRY
}

int main(int argc, char **argv) {
  const char *out_dir = argc > 1 ? argv[1] : ".";
  const uint64_t compute_bytes = (uint64_t)kParams * kElems * 2;
  /* Gradient buffers (fp32 per parameter in flight) and slack beside the chunks. */
  const uint64_t room = (uint64_t)8 * kElems * 4;
  const char *names[3] = {"roomy", "constrained", "roomy_hybrid"};
  uint64_t caps[3];
  result r[3], sync[3], spec[3];
  int k;
  char path[4096];
  FILE *f;
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
  pstar_engine_destroy(probe);
  caps[0] = 2 * compute_bytes + room;
  caps[1] = compute_bytes / 2 + room;
  /* Room for the optimizer state (12 B/element) and payload of 3 chunks more. */
  caps[2] = caps[0] + (uint64_t)3 * kChunkElems * 14;
  for (k = 0; k < 3; ++k) {
    int mode;
    for (mode = 0; mode < 3; ++mode) {
      static const char *const modes[3] = {"synchronous", "overlapped", "speculative"};
      result *out = mode == 0 ? &sync[k] : mode == 1 ? &r[k] : &spec[k];
      st = run(caps[k], k == 2, mode != 0, mode == 2, out);
      if (st != PSTAR_OK) {
        fprintf(stderr, "%s (%s step): %s: %s\n", names[k], modes[mode], pstar_status_name(st),
                pstar_last_error_message());
        return 1;
      }
    }
    printf("%-19s capacity %6.1f MiB: %8.2f ms/iteration overlapped, %8.2f synchronous (speedup %.3f, update wait "
           "%.2f ms), %7.1f MiB moved/iteration, %llu evictions, %u optimizer chunks on GPU\n",
           names[k], caps[k] / 1048576.0, r[k].median_s * 1e3, sync[k].median_s * 1e3,
           sync[k].median_s / r[k].median_s, r[k].update_wait_s * 1e3, r[k].bytes_moved_per_iteration / 1048576.0,
           (unsigned long long)r[k].evictions, r[k].optimizer_chunks_on_device);
    printf("%-19s speculative: %8.2f ms/iteration (speedup %.3f over synchronous), %.1f chunk updates kept per "
           "iteration\n",
           names[k], spec[k].median_s * 1e3, sync[k].median_s / spec[k].median_s, spec[k].kept_per_iteration);
  }
  printf("ratio constrained/roomy %.3f, roomy_hybrid/roomy %.3f (overlapped)\n", r[1].median_s / r[0].median_s,
         r[2].median_s / r[0].median_s);
  snprintf(path, sizeof path, "%s/cuda_engine_bench.json", out_dir);
  if ((f = fopen(path, "w")) != NULL) {
    fprintf(f, "{\"bench\":\"cuda_engine\",\"params\":%d,\"elements\":%d,\"chunk_elems\":%d", kParams, kElems,
            kChunkElems);
    for (k = 0; k < 3; ++k) {
      fprintf(f, ",\"%s_ms\":%.3f,\"%s_sync_ms\":%.3f,\"%s_overlap_speedup\":%.4f,\"%s_update_wait_ms\":%.3f",
              names[k], r[k].median_s * 1e3, names[k], sync[k].median_s * 1e3, names[k],
              sync[k].median_s / r[k].median_s, names[k], r[k].update_wait_s * 1e3);
      fprintf(f, ",\"%s_mib_moved\":%.1f,\"%s_sync_mib_moved\":%.1f", names[k],
              r[k].bytes_moved_per_iteration / 1048576.0, names[k], sync[k].bytes_moved_per_iteration / 1048576.0);
      fprintf(f, ",\"%s_spec_ms\":%.3f,\"%s_spec_speedup\":%.4f,\"%s_spec_kept\":%.2f", names[k],
              spec[k].median_s * 1e3, names[k], sync[k].median_s / spec[k].median_s, names[k],
              spec[k].kept_per_iteration);
    }
    fprintf(f, ",\"ratio_constrained_roomy\":%.4f,\"ratio_hybrid_roomy\":%.4f}\n",
            r[1].median_s / r[0].median_s, r[2].median_s / r[0].median_s);
    fclose(f);
  }
  return 0;
}
