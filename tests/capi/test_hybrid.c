/* Hybrid optimizer placement (options.hybrid_optimizer): when warm-up ends,
 * the optimizer state of the trainable chunks that fit in what the capacity
 * leaves above the peak goes to the accelerator, and their Adam update runs
 * there.
 *
 * The update is the same per-element code wherever it runs, so training
 * results must be bit-identical to hybrid off, under every policy, capacity,
 * dtype, with gradient accumulation, skipped steps and strict mode; a dry
 * run must count exactly what a run with payloads counts; and the device
 * tier must stay within its capacity. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi_test_util.h"

enum { P = 10, CHUNK = 1024, MAXN = 2048, ITERS = 6 };

/* Several parameters per chunk, one that fills a chunk, one jumbo (2048),
 * and a frozen one (index 6) that has no optimizer state. */
static const int64_t kNumel[P] = {512, 500, 1024, 1000, 700, 300, 640, 2048, 900, 256};
static const int kFrozen = 6;

typedef struct hcfg {
  pstar_dtype dtype;
  pstar_policy policy;
  int prefetch;
  uint64_t capacity;
  uint64_t margin;       /* device_margin_bytes */
  int hybrid;
  int strict;
  int virtual_clock;
  int dry_run;
  int grad_accumulation; /* two micro-batches per step */
  int overflow_at;       /* step with an infinite gradient, or -1 */
  int write_at;          /* step after which parameters are rewritten, or -1 */
  int record;            /* keep and export a timeline to trace_path */
  const char *trace_path;
  /* Steps [grow_from, grow_to) report `grow_bytes` more non-model bytes
   * (a longer sequence, say); grow_to 0: none. */
  int grow_from, grow_to;
  uint64_t grow_bytes;
} hcfg;

typedef struct hrun {
  pstar_stats stats;
  uint32_t on_device[ITERS]; /* optimizer_chunks_on_device after each step */
  double now;
  float w[P][MAXN];
} hrun;

static hcfg base_cfg(void) {
  hcfg c;
  memset(&c, 0, sizeof c);
  c.dtype = PSTAR_DTYPE_BF16;
  c.policy = PSTAR_POLICY_OPT;
  c.prefetch = 1;
  c.overflow_at = -1;
  c.write_at = -1;
  return c;
}

/* Non-model bytes after the forward use of layer i. */
static uint64_t activations(int i) { return (uint64_t)(i + 1) * 512u; }

static void *acquire_any(pstar_engine *e, uint32_t id, pstar_stage stage) {
  void *p = (void *)&p;
  T_OK(pstar_param_acquire(e, id, stage, NULL, &p));
  return p;
}

/* One micro-batch: forward 0..P-1 and parameter 0 again (tied), backward in
 * reverse; gradients depend on the weights read from the slot (real runs). */
static void micro_batch(pstar_engine *e, const uint32_t *id, const hcfg *c, int step, int mb) {
  static float g[MAXN];
  const uint64_t extra = step >= c->grow_from && step < c->grow_to ? c->grow_bytes : 0;
  for (int i = 0; i <= P; ++i) {
    const int p = i == P ? 0 : i;
    acquire_any(e, id[p], PSTAR_STAGE_FORWARD);
    if (c->virtual_clock) T_OK(pstar_clock_advance(e, 2e-6));
    T_OK(pstar_param_release(e, id[p], NULL));
    T_OK(pstar_nonmodel_report(e, activations(i) + extra));
  }
  for (int i = P; i >= 0; --i) {
    const int p = i == P ? 0 : i;
    if (p == kFrozen) {
      T_OK(pstar_nonmodel_report(e, i == 0 ? 0 : activations(i - 1)));
      continue;
    }
    const void *w = acquire_any(e, id[p], PSTAR_STAGE_BACKWARD);
    if (c->virtual_clock) T_OK(pstar_clock_advance(e, 4e-6));
    for (int j = 0; j < kNumel[p]; ++j) {
      const float wj = c->dry_run ? 0.0f : t_load(w, c->dtype, (size_t)j);
      g[j] = wj * 0.01f + (float)((j + step + i + mb) % 7 - 3) / 64.0f;
    }
    if (step == c->overflow_at && p == 3) g[5] = INFINITY;
    T_OK(pstar_grad_write(e, id[p], c->dry_run ? NULL : g, (uint64_t)kNumel[p], PSTAR_DTYPE_F32, PSTAR_MEM_HOST,
                          NULL));
    T_OK(pstar_param_release(e, id[p], NULL));
    T_OK(pstar_nonmodel_report(e, i == 0 ? 0 : activations(i - 1) + extra));
  }
}

static void run_cfg(const hcfg *c, hrun *out) {
  pstar_engine_options o = t_options(c->dtype, CHUNK);
  o.threads = 2;
  o.placement_policy = c->policy;
  o.prefetch = c->prefetch;
  o.device_capacity_bytes = c->capacity;
  o.device_margin_bytes = c->margin;
  o.hybrid_optimizer = c->hybrid;
  o.strict = c->strict;
  o.strict_seed = 11;
  o.virtual_clock = c->virtual_clock;
  o.dry_run = c->dry_run;
  o.grad_accumulation = c->grad_accumulation;
  o.record_timeline = c->record;
  o.h2d_bytes_per_s = 1e9;
  o.d2h_bytes_per_s = 2e9;
  o.loss_scale_initial = 1024.0f;
  pstar_engine *e = t_create(&o);
  uint32_t id[P];
  char name[8];
  for (int i = 0; i < P; ++i) {
    snprintf(name, sizeof name, "p%d", i);
    id[i] = t_register(e, name, kNumel[i], i == kFrozen ? PSTAR_PARAM_FROZEN : 0);
  }
  T_OK(pstar_engine_build(e));
  T_OK(pstar_param_set_lr_scale(e, id[4], 0.5f));
  T_OK(pstar_param_set_weight_decay(e, id[1], 0));
  if (!c->dry_run) {
    for (int i = 0; i < P; ++i) {
      t_fill(out->w[i], (size_t)kNumel[i], (uint32_t)i + 3, 0.5f);
      t_write_f32(e, id[i], out->w[i], (uint64_t)kNumel[i]);
    }
  }
  for (int s = 0; s < ITERS; ++s) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    for (int mb = 0; mb < (c->grad_accumulation ? 2 : 1); ++mb) micro_batch(e, id, c, s, mb);
    pstar_step_result r = PSTAR_STEP_RESULT_INIT;
    T_OK(pstar_step(e, &r));
    out->on_device[s] = t_stats(e).optimizer_chunks_on_device;
    cr_assert_eq(r.skipped, s == c->overflow_at, "step %d: skipped %d (hybrid %d, policy %d, capacity %llu, strict %d)",
                 s, r.skipped, c->hybrid, (int)c->policy, (unsigned long long)c->capacity, c->strict);
    if (s == c->write_at && !c->dry_run) {
      /* Values read back after steps, perturbed and written again: the
       * masters of every chunk, wherever they live. */
      static float v[MAXN], back[MAXN];
      for (int i = 0; i < P; ++i) {
        t_read_f32(e, id[i], v, (uint64_t)kNumel[i]);
        for (int j = 0; j < kNumel[i]; ++j) v[j] = v[j] * 0.75f + 0.001f * (float)(j % 5);
        t_write_f32(e, id[i], v, (uint64_t)kNumel[i]);
        t_read_f32(e, id[i], back, (uint64_t)kNumel[i]);
        if (i != kFrozen) {
          cr_assert_eq(memcmp(v, back, (size_t)kNumel[i] * sizeof(float)), 0, "parameter %d: read after write", i);
        }
      }
    }
  }
  out->stats = t_stats(e);
  T_OK(pstar_clock_now(e, &out->now));
  if (!c->dry_run) {
    for (int i = 0; i < P; ++i) t_read_f32(e, id[i], out->w[i], (uint64_t)kNumel[i]);
  }
  if (c->record) T_OK(pstar_trace_export(e, c->trace_path));
  T_OK(pstar_engine_destroy(e));
}

/* Peak of the accelerator tier with unlimited capacity and hybrid off. */
static uint64_t unlimited_peak(const hcfg *like) {
  static hrun r;
  hcfg c = *like;
  c.capacity = 0;
  c.margin = 0;
  c.hybrid = 0;
  c.virtual_clock = 1;
  c.dry_run = 1;
  c.strict = 0;
  c.record = 0;
  c.overflow_at = -1; /* a dry run has no values to overflow */
  run_cfg(&c, &r);
  return r.stats.peak_device_bytes;
}

/* Optimizer state of one regular chunk, bytes. */
static uint64_t opt_chunk_bytes(int grad_accumulation) { return (uint64_t)CHUNK * (grad_accumulation ? 16u : 12u); }

static void assert_same_counts(const pstar_stats *a, const pstar_stats *b, const char *what) {
  cr_assert_eq(a->bytes_host_to_device, b->bytes_host_to_device, "%s: H2D bytes", what);
  cr_assert_eq(a->bytes_device_to_host, b->bytes_device_to_host, "%s: D2H bytes", what);
  cr_assert_eq(a->moves_to_device, b->moves_to_device, "%s: moves", what);
  cr_assert_eq(a->evictions, b->evictions, "%s: evictions", what);
  cr_assert_eq(a->peak_device_bytes, b->peak_device_bytes, "%s: device peak", what);
  cr_assert_eq(a->peak_device_chunk_bytes, b->peak_device_chunk_bytes, "%s: device chunk peak", what);
  cr_assert_eq(a->device_bytes, b->device_bytes, "%s: device bytes", what);
  cr_assert_eq(a->peak_host_bytes, b->peak_host_bytes, "%s: host peak", what);
  cr_assert_eq(a->host_bytes, b->host_bytes, "%s: host bytes", what);
  cr_assert_eq(a->bytes_prefetched, b->bytes_prefetched, "%s: prefetched", what);
  cr_assert_eq(a->bytes_critical, b->bytes_critical, "%s: critical", what);
  cr_assert_eq(a->trace_fallbacks, b->trace_fallbacks, "%s: fallbacks", what);
  cr_assert_eq(a->budget_overruns, b->budget_overruns, "%s: overruns", what);
  cr_assert_eq(a->clock_seconds, b->clock_seconds, "%s: modelled time", what);
  cr_assert_eq(a->wait_seconds, b->wait_seconds, "%s: modelled waiting", what);
  cr_assert_eq(a->optimizer_chunks_on_device, b->optimizer_chunks_on_device, "%s: optimizer chunks", what);
  cr_assert_eq(a->optimizer_device_bytes, b->optimizer_device_bytes, "%s: optimizer bytes", what);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

Test(hybrid, margin_decides_how_many_chunks_go_to_the_device) {
  static hrun r;
  hcfg c = base_cfg();
  c.virtual_clock = 1;
  c.dry_run = 1;
  const uint64_t peak = unlimited_peak(&c);
  const uint64_t one = opt_chunk_bytes(0);

  /* Hybrid off: nothing on the device, whatever the room. */
  c.capacity = peak + 10 * one;
  run_cfg(&c, &r);
  cr_assert_eq(r.stats.optimizer_chunks_on_device, 0u);
  cr_assert_eq(r.stats.optimizer_device_bytes, 0u);
  const uint32_t trainable = r.stats.optimizer_chunks;
  cr_assert_gt(trainable, 3u);

  c.hybrid = 1;
  /* Unlimited capacity: every trainable chunk. */
  c.capacity = 0;
  run_cfg(&c, &r);
  cr_assert_eq(r.stats.optimizer_chunks_on_device, trainable);
  cr_assert_eq(r.stats.optimizer_device_bytes, r.stats.optimizer_list_bytes * 3);

  /* Room above the peak for 2.5 regular chunks' state: 2 of them (the
   * chunks used last in backward are regular chunks). */
  c.capacity = peak + one * 5 / 2;
  run_cfg(&c, &r);
  cr_assert_eq(r.stats.optimizer_chunks_on_device, 2u);
  cr_assert_eq(r.stats.optimizer_device_bytes, 2 * one);
  cr_assert_leq(r.stats.peak_device_bytes, c.capacity);
  cr_assert_eq(r.stats.peak_device_bytes, peak + 2 * one, "the state sits in the margin, nothing else changes");

  /* The same room, taken by device_margin_bytes: none. */
  c.margin = one * 5 / 2;
  run_cfg(&c, &r);
  cr_assert_eq(r.stats.optimizer_chunks_on_device, 0u);
  c.margin = 0;

  /* Some but not all. */
  c.capacity = peak + one * 6;
  run_cfg(&c, &r);
  cr_assert_gt(r.stats.optimizer_chunks_on_device, 2u);
  cr_assert_lt(r.stats.optimizer_chunks_on_device, trainable);
  cr_assert_leq(r.stats.optimizer_device_bytes, 6 * one);

  /* No margin: capacities at and below the peak place nothing (down to just
   * above half the peak: at half of it the jumbo parameter's backward, its
   * chunk with its gradient buffer and the activations, no longer fits). */
  for (uint64_t cap = peak; cap > peak / 2; cap -= CHUNK * 2) {
    c.capacity = cap;
    for (int pi = 0; pi < 3; ++pi) {
      c.policy = (pstar_policy)pi;
      run_cfg(&c, &r);
      cr_assert_eq(r.stats.optimizer_chunks_on_device, 0u, "capacity %llu, policy %d", (unsigned long long)cap, pi);
      cr_assert_leq(r.stats.peak_device_bytes, cap);
    }
  }

  /* With gradient accumulation the state is 16 bytes per element. */
  c = base_cfg();
  c.virtual_clock = 1;
  c.dry_run = 1;
  c.grad_accumulation = 1;
  c.hybrid = 1;
  c.capacity = unlimited_peak(&c) + opt_chunk_bytes(1) * 3 / 2;
  run_cfg(&c, &r);
  cr_assert_eq(r.stats.optimizer_chunks_on_device, 1u);
  cr_assert_eq(r.stats.optimizer_device_bytes, opt_chunk_bytes(1));
}

/* Adam's moments exist from a chunk's first update, and the state placed on
 * the device goes there before that update (the first step): a placed
 * chunk's moments never exist on the host.  So the host peak is lower than
 * with hybrid off by at least the moments of the placed chunks (more where
 * the masters they leave in the host pool are taken again by moments of
 * chunks of their size). */
Test(hybrid, placed_chunks_never_have_moments_on_the_host) {
  static hrun off, on;
  hcfg c = base_cfg();
  c.virtual_clock = 1;
  const uint64_t peak = unlimited_peak(&c);
  const uint64_t caps[3] = {0, peak + opt_chunk_bytes(0) * 3, peak + opt_chunk_bytes(0) * 7};
  for (int i = 0; i < 3; ++i) {
    c.capacity = caps[i];
    c.hybrid = 0;
    run_cfg(&c, &off);
    c.hybrid = 1;
    run_cfg(&c, &on);
    const uint64_t placed = on.stats.optimizer_device_bytes;
    const uint64_t lower = placed / 3 * 2; /* master, m, v: the moments of the placed chunks */
    cr_assert_gt(placed, 0u, "capacity %llu: some state placed", (unsigned long long)caps[i]);
    cr_assert_eq(on.on_device[0], on.stats.optimizer_chunks_on_device, "placed at the first step, kept");
    cr_assert_leq(on.stats.peak_host_bytes + lower, off.stats.peak_host_bytes,
                  "capacity %llu: host peak %llu with %llu bytes of state placed, %llu with hybrid off",
                  (unsigned long long)caps[i], (unsigned long long)on.stats.peak_host_bytes,
                  (unsigned long long)placed, (unsigned long long)off.stats.peak_host_bytes);
    for (int p = 0; p < P; ++p) {
      cr_assert_eq(memcmp(on.w[p], off.w[p], (size_t)kNumel[p] * sizeof(float)), 0, "capacity %llu: parameter %d",
                   (unsigned long long)caps[i], p);
    }
  }
}

/* Capacities with room above the peak and without, for a configuration. */
static void capacities_of(const hcfg *c, uint64_t caps[5]) {
  const uint64_t peak = unlimited_peak(c);
  const uint64_t one = opt_chunk_bytes(c->grad_accumulation);
  caps[0] = 0;                 /* unlimited: every chunk */
  caps[1] = peak + one * 3;    /* a few */
  caps[2] = peak + one * 7;    /* most */
  caps[3] = peak;              /* none */
  caps[4] = peak * 2 / 3;      /* none, with evictions */
}

static void check_identical(hcfg c, const char *what) {
  static hrun ref, r;
  hcfg off = c;
  off.hybrid = 0;
  off.capacity = 0;
  off.strict = 0;
  run_cfg(&off, &ref);
  uint64_t caps[5];
  capacities_of(&c, caps);
  int placed = 0;
  for (int pi = 0; pi < 3; ++pi) {
    for (int k = 0; k < 5; ++k) {
      c.policy = (pstar_policy)pi;
      c.capacity = caps[k];
      c.hybrid = 1;
      run_cfg(&c, &r);
      cr_assert_eq(memcmp(r.w, ref.w, sizeof r.w), 0, "%s: policy %d, capacity %llu: results differ from hybrid off",
                   what, pi, (unsigned long long)caps[k]);
      if (caps[k] != 0) {
        cr_assert_leq(r.stats.peak_device_bytes, caps[k], "%s: policy %d: peak over the capacity", what, pi);
      }
      if (k <= 2) cr_assert_gt(r.stats.optimizer_chunks_on_device, 0u, "%s: policy %d, capacity %d", what, pi, k);
      if (k >= 3) cr_assert_eq(r.stats.optimizer_chunks_on_device, 0u, "%s: policy %d, capacity %d", what, pi, k);
      placed += r.stats.optimizer_chunks_on_device > 0;
      /* The same configuration without hybrid placement gives the same. */
      if (k == 1 || k == 4) {
        static hrun plain;
        hcfg p = c;
        p.hybrid = 0;
        run_cfg(&p, &plain);
        cr_assert_eq(memcmp(plain.w, ref.w, sizeof plain.w), 0, "%s: policy %d without hybrid", what, pi);
      }
    }
  }
  cr_assert_gt(placed, 0);
}

/* Re-decided each step: a need that grows moves state back to the host, a
 * need that shrinks brings it back, never above the capacity, and the
 * results are those of hybrid off with the same reports. */
Test(hybrid, the_placement_follows_the_need_step_by_step_with_the_same_bits) {
  static hrun ref, r;
  hcfg c = base_cfg();
  const uint64_t one = opt_chunk_bytes(0);
  /* The capacity at which one more chunk's state just fits (found with dry
   * runs, 256 bytes at a time): its margin is used up to less than 256
   * bytes.  A need grown by 4096 bytes then still runs (the streaming
   * reserve is two 2048-element chunks, 8192 bytes) but leaves the placed
   * state over the margin at the next decision.  The growth is reported
   * during the iterations: state moves only between them. */
  const uint64_t peak = unlimited_peak(&c);
  hcfg probe = c;
  probe.dry_run = 1;
  probe.hybrid = 1;
  probe.capacity = peak;
  run_cfg(&probe, &r);
  const uint32_t base = r.on_device[1];
  while (r.on_device[1] == base && probe.capacity < peak + 6 * one) {
    probe.capacity += 256;
    run_cfg(&probe, &r);
  }
  cr_assert_gt(r.on_device[1], base, "one more chunk's state fits at some capacity");
  c.capacity = probe.capacity;
  c.grow_from = 2;
  c.grow_to = 4;
  c.grow_bytes = 4096;
  hcfg off = c;
  off.capacity = 0;
  run_cfg(&off, &ref);
  for (int pi = 0; pi < 3; ++pi) {
    for (int strict = 0; strict < 2; ++strict) {
      c.policy = (pstar_policy)pi;
      c.strict = strict;
      c.hybrid = 1;
      run_cfg(&c, &r);
      const uint32_t steady = r.on_device[1];
      cr_assert_gt(steady, 0u, "policy %d: placed after warm-up", pi);
      cr_assert_eq(r.on_device[0], steady, "policy %d: placed at the end of warm-up", pi);
      cr_assert_lt(r.on_device[2], steady, "policy %d: the grown need sends state back (%u of %u)", pi,
                   r.on_device[2], steady);
      cr_assert_eq(r.on_device[3], r.on_device[2], "policy %d: a stable need moves nothing", pi);
      cr_assert_eq(r.on_device[4], steady, "policy %d: the need shrank, the state returns", pi);
      cr_assert_eq(r.on_device[5], steady, "policy %d", pi);
      cr_assert_leq(r.stats.peak_device_bytes, c.capacity, "policy %d: peak over the capacity", pi);
      cr_assert_eq(memcmp(r.w, ref.w, sizeof r.w), 0, "policy %d, strict %d: results differ from hybrid off", pi,
                   strict);
    }
  }
}

Test(hybrid, results_are_bit_identical_bf16) {
  hcfg c = base_cfg();
  check_identical(c, "bf16");
  c.prefetch = 0;
  check_identical(c, "bf16, no prefetch");
}

Test(hybrid, results_are_bit_identical_f16_f32) {
  hcfg c = base_cfg();
  c.dtype = PSTAR_DTYPE_F16;
  check_identical(c, "f16");
  c.dtype = PSTAR_DTYPE_F32;
  check_identical(c, "f32");
}

Test(hybrid, results_are_bit_identical_with_gradient_accumulation) {
  hcfg c = base_cfg();
  c.grad_accumulation = 1;
  check_identical(c, "accumulation");
}

Test(hybrid, skipped_steps_and_rewritten_values) {
  hcfg c = base_cfg();
  c.dtype = PSTAR_DTYPE_F16;
  c.overflow_at = 3; /* after placement (warm-up is one iteration) */
  c.write_at = 2;
  check_identical(c, "f16, overflow and rewrite");
  c.grad_accumulation = 1;
  check_identical(c, "f16, accumulation, overflow and rewrite");
}

Test(hybrid, strict_mode, .timeout = 120) {
  hcfg c = base_cfg();
  c.strict = 1;
  c.write_at = 2;
  c.overflow_at = 4;
  check_identical(c, "strict");
  c.grad_accumulation = 1;
  c.dtype = PSTAR_DTYPE_F16;
  check_identical(c, "strict, accumulation");
}

Test(hybrid, virtual_clock_results_are_identical) {
  hcfg c = base_cfg();
  c.virtual_clock = 1;
  check_identical(c, "virtual clock");
}

Test(hybrid, dry_run_counts_exactly_what_a_real_run_does) {
  static hrun real, dry;
  for (int acc = 0; acc <= 1; ++acc) {
    hcfg c = base_cfg();
    c.virtual_clock = 1;
    c.grad_accumulation = acc;
    c.hybrid = 1;
    c.record = 1;
    uint64_t caps[5];
    capacities_of(&c, caps);
    for (int pi = 0; pi < 3; ++pi) {
      for (int prefetch = 0; prefetch <= 1; ++prefetch) {
        for (int k = 0; k < 5; ++k) {
          c.policy = (pstar_policy)pi;
          c.prefetch = prefetch;
          c.capacity = caps[k];
          c.dry_run = 0;
          c.trace_path = PSTAR_TEST_TMP_DIR "/hybrid_real.json";
          run_cfg(&c, &real);
          c.dry_run = 1;
          c.trace_path = PSTAR_TEST_TMP_DIR "/hybrid_dry.json";
          run_cfg(&c, &dry);
          char what[128];
          snprintf(what, sizeof what, "accumulation %d, policy %d, prefetch %d, capacity %llu", acc, pi, prefetch,
                   (unsigned long long)caps[k]);
          assert_same_counts(&real.stats, &dry.stats, what);
          cr_assert_eq(real.now, dry.now, "%s", what);
          char *a = slurp(PSTAR_TEST_TMP_DIR "/hybrid_real.json"), *b = slurp(PSTAR_TEST_TMP_DIR "/hybrid_dry.json");
          cr_assert_str_eq(a, b, "%s: the timelines differ", what);
          /* Every moment within capacity, optimizer state included. */
          const char *rows = strstr(a, "\"rows\":[");
          cr_assert_not_null(rows);
          for (const char *p = strchr(rows + 8, '['); p != NULL && caps[k] != 0; p = strchr(p + 1, '[')) {
            unsigned long long m, ch, gr, nm, fr, host, opt;
            double sec;
            cr_assert_eq(sscanf(p, "[%llu,%lf,%llu,%llu,%llu,%llu,%llu,%llu]", &m, &sec, &ch, &gr, &nm, &fr, &host, &opt),
                         8);
            cr_assert_leq(ch + gr + nm + fr + opt, caps[k], "%s: moment %llu over the capacity", what, m);
          }
          free(a);
          free(b);
        }
      }
    }
  }
  remove(PSTAR_TEST_TMP_DIR "/hybrid_real.json");
  remove(PSTAR_TEST_TMP_DIR "/hybrid_dry.json");
}

Test(hybrid, warmup_of_two_and_eval_iterations) {
  /* Placement waits for the end of warm-up; EVAL iterations in between do
   * not count. */
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.hybrid_optimizer = 1;
  o.warmup_iterations = 2;
  pstar_engine *e = t_create(&o);
  const uint32_t a = t_register(e, "a", 1000, 0), b = t_register(e, "b", 3000, 0);
  T_OK(pstar_engine_build(e));
  float g[3000];
  for (int i = 0; i < 3000; ++i) g[i] = 0.01f * (float)(i % 13 - 6);
  for (int it = 0; it < 3; ++it) {
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
    t_acquire(e, a, PSTAR_STAGE_FORWARD);
    T_OK(pstar_param_release(e, a, NULL));
    T_OK(pstar_iteration_end(e));
    T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    const uint32_t ids[2] = {a, b};
    const uint64_t n[2] = {1000, 3000};
    for (int k = 0; k < 2; ++k) {
      t_acquire(e, ids[k], PSTAR_STAGE_FORWARD);
      T_OK(pstar_param_release(e, ids[k], NULL));
    }
    for (int k = 1; k >= 0; --k) {
      t_acquire(e, ids[k], PSTAR_STAGE_BACKWARD);
      T_OK(pstar_grad_write(e, ids[k], g, n[k], PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      T_OK(pstar_param_release(e, ids[k], NULL));
    }
    T_OK(pstar_step(e, NULL));
    const pstar_stats s = t_stats(e);
    cr_assert_eq(s.optimizer_chunks_on_device, it == 0 ? 0u : 2u, "after step %d", it);
  }
  T_OK(pstar_engine_destroy(e));
}

Test(hybrid, options_and_errors) {
  pstar_engine_options o;
  T_OK(pstar_engine_options_init(&o));
  cr_assert_eq(o.hybrid_optimizer, 0, "off by default");
  const pstar_engine_options m = PSTAR_ENGINE_OPTIONS_INIT;
  cr_assert_eq(m.hybrid_optimizer, 0);
  pstar_stats s = PSTAR_STATS_INIT;
  cr_assert_eq(s.optimizer_chunks_on_device, 0u);
  cr_assert_eq(s.optimizer_device_bytes, 0u);

  /* On CUDA the margin needs a capacity (checked before any device is
   * opened, so on every machine). */
  pstar_engine *e = NULL;
  o.device = PSTAR_DEVICE_CUDA;
  o.hybrid_optimizer = 1;
  T_FAIL(pstar_engine_create(&o, &e), PSTAR_ERR_INVALID_ARGUMENT, "hybrid_optimizer");

  /* A version-3 struct keeps the default (off). */
  T_OK(pstar_engine_options_init(&o));
  o.version = 3;
  o.size = (uint32_t)offsetof(pstar_engine_options, prefetch) + (uint32_t)sizeof(int32_t);
  o.hybrid_optimizer = 1; /* beyond the caller's struct: not read */
  e = t_create(&o);
  const uint32_t id = t_register(e, "w", 100, 0);
  T_OK(pstar_engine_build(e));
  float g[100] = {0};
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  t_acquire(e, id, PSTAR_STAGE_FORWARD);
  T_OK(pstar_param_release(e, id, NULL));
  t_acquire(e, id, PSTAR_STAGE_BACKWARD);
  T_OK(pstar_grad_write(e, id, g, 100, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, id, NULL));
  T_OK(pstar_step(e, NULL));
  cr_assert_eq(t_stats(e).optimizer_chunks_on_device, 0u);
  T_OK(pstar_engine_destroy(e));
}
