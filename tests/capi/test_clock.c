/* The virtual clock, dry runs, the window budget and the timeline export.
 *
 * A dry run must count exactly what a run with payloads does (bytes, moves,
 * peaks per tier, modelled time): both run the same placement code on the
 * same modelled clock, and the timelines they export must be identical. */
#define PSTAR_EXPERIMENTAL_API 1
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi_test_util.h"

enum { P = 10, CHUNK = 2048, ITERS = 5 };

/* Parameter sizes: several per chunk, one that fills a chunk, one jumbo. */
static const int64_t kNumel[P] = {512, 300, 2048, 1000, 700, 128, 4000, 900, 1500, 256};
/* Bytes per moment of compute on the virtual clock: 2 us per acquire. */
static const double kComputeSeconds = 2e-6;

typedef struct clock_run {
  pstar_stats stats;
  pstar_x_step_stats step_stats;
  double now;
  float w[P][4000];
} clock_run;

typedef struct clock_cfg {
  pstar_policy policy;
  int prefetch;
  int dry_run;
  uint64_t capacity;
  uint64_t margin;
  int record;
  const char *trace_path; /* exported after the run when record != 0 */
  double update_rate;     /* pstar_x_engine_set_modelled_host_update (0: none) */
  int sync_step;          /* pstar_x_engine_set_overlap_step(e, 0) */
  double h2d, d2h;        /* modelled link rates, bytes/s (0: 1e9 up, 2e9 down) */
} clock_cfg;

/* Non-model bytes after the forward use of layer i: activations grow
 * through forward and shrink through backward. */
static uint64_t activations(int i) { return (uint64_t)(i + 1) * 256u; }

/* Acquire that accepts the NULL of a dry run. */
static void *acquire_any(pstar_engine *e, uint32_t id, pstar_stage stage) {
  void *p = (void *)&p;
  T_OK(pstar_param_acquire(e, id, stage, NULL, &p));
  return p;
}

static void iteration(pstar_engine *e, const uint32_t *id, int step, int dry) {
  static float g[4000];
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  for (int i = 0; i <= P; ++i) { /* parameter 0 again at the end: tied */
    const int p = i == P ? 0 : i;
    void *w = acquire_any(e, id[p], PSTAR_STAGE_FORWARD);
    cr_assert_eq(w == NULL, dry != 0, "a dry run yields NULL, a real run an address");
    T_OK(pstar_clock_advance(e, kComputeSeconds));
    T_OK(pstar_param_release(e, id[p], NULL));
    T_OK(pstar_nonmodel_report(e, activations(i)));
  }
  for (int i = P; i >= 0; --i) {
    const int p = i == P ? 0 : i;
    acquire_any(e, id[p], PSTAR_STAGE_BACKWARD);
    T_OK(pstar_clock_advance(e, 2 * kComputeSeconds));
    for (int j = 0; j < kNumel[p]; ++j) g[j] = (float)((j + step + i) % 9 - 4) / 32.0f;
    T_OK(pstar_grad_write(e, id[p], dry ? NULL : g, (uint64_t)kNumel[p], PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    T_OK(pstar_param_release(e, id[p], NULL));
    T_OK(pstar_nonmodel_report(e, i == 0 ? 0 : activations(i - 1)));
  }
  T_OK(pstar_step(e, NULL));
}

static void run_cfg(const clock_cfg *c, clock_run *out) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.virtual_clock = 1;
  o.dry_run = c->dry_run;
  o.placement_policy = c->policy;
  o.prefetch = c->prefetch;
  o.device_capacity_bytes = c->capacity;
  o.device_margin_bytes = c->margin;
  o.record_timeline = c->record;
  o.h2d_bytes_per_s = c->h2d > 0 ? c->h2d : 1e9;
  o.d2h_bytes_per_s = c->d2h > 0 ? c->d2h : 2e9;
  pstar_engine *e = t_create(&o);
  if (c->sync_step) T_OK(pstar_x_engine_set_overlap_step(e, 0));
  if (c->update_rate > 0) T_OK(pstar_x_engine_set_modelled_host_update(e, c->update_rate));
  uint32_t id[P];
  char name[8];
  for (int i = 0; i < P; ++i) {
    snprintf(name, sizeof name, "p%d", i);
    id[i] = t_register(e, name, kNumel[i], 0);
  }
  T_OK(pstar_engine_build(e));
  if (!c->dry_run) {
    for (int i = 0; i < P; ++i) {
      t_fill(out->w[i], (size_t)kNumel[i], (uint32_t)i + 3, 0.5f);
      t_write_f32(e, id[i], out->w[i], (uint64_t)kNumel[i]);
    }
  }
  for (int s = 0; s < ITERS; ++s) iteration(e, id, s, c->dry_run);
  out->stats = t_stats(e);
  T_OK(pstar_x_step_stats_init(&out->step_stats));
  T_OK(pstar_x_step_get_stats(e, &out->step_stats));
  T_OK(pstar_clock_now(e, &out->now));
  if (!c->dry_run) {
    for (int i = 0; i < P; ++i) t_read_f32(e, id[i], out->w[i], (uint64_t)kNumel[i]);
  }
  if (c->record) T_OK(pstar_trace_export(e, c->trace_path));
  T_OK(pstar_engine_destroy(e));
}

/* Whole file into a NUL-terminated buffer (caller frees). */
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

static size_t count_of(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle)) ++n;
  return n;
}

/* Capacity in chunk bytes (bf16) plus room for the largest gradient buffer,
 * the tied parameter's (alive through the whole backward) and the largest
 * activations. */
static uint64_t capacity_for(int chunks) {
  return (uint64_t)chunks * CHUNK * 2 + 4000 * 4 + 512 * 4 + activations(P);
}

static void assert_same_counts(const pstar_stats *a, const pstar_stats *b, const char *what) {
  cr_assert_eq(a->bytes_host_to_device, b->bytes_host_to_device, "%s: H2D bytes", what);
  cr_assert_eq(a->bytes_device_to_host, b->bytes_device_to_host, "%s: D2H bytes", what);
  cr_assert_eq(a->moves_to_device, b->moves_to_device, "%s: moves", what);
  cr_assert_eq(a->evictions, b->evictions, "%s: evictions", what);
  cr_assert_eq(a->peak_device_bytes, b->peak_device_bytes, "%s: device peak", what);
  cr_assert_eq(a->peak_device_chunk_bytes, b->peak_device_chunk_bytes, "%s: device chunk peak", what);
  cr_assert_eq(a->peak_host_bytes, b->peak_host_bytes, "%s: host peak", what);
  cr_assert_eq(a->host_bytes, b->host_bytes, "%s: host bytes", what);
  cr_assert_eq(a->bytes_prefetched, b->bytes_prefetched, "%s: prefetched", what);
  cr_assert_eq(a->bytes_critical, b->bytes_critical, "%s: critical", what);
  cr_assert_eq(a->trace_fallbacks, b->trace_fallbacks, "%s: fallbacks", what);
  cr_assert_eq(a->budget_overruns, b->budget_overruns, "%s: overruns", what);
  cr_assert_eq(a->clock_seconds, b->clock_seconds, "%s: modelled time", what);
  cr_assert_eq(a->wait_seconds, b->wait_seconds, "%s: modelled waiting", what);
}

Test(clock, dry_run_counts_exactly_what_a_real_run_does) {
  static clock_run real, dry;
  const pstar_policy policies[] = {PSTAR_POLICY_OPT, PSTAR_POLICY_LRU, PSTAR_POLICY_STATIC};
  for (size_t pi = 0; pi < 3; ++pi) {
    for (int chunks = 3; chunks <= 9; chunks += 3) {
      for (int prefetch = 0; prefetch <= 1; ++prefetch) {
        clock_cfg c = {policies[pi], prefetch, 0, capacity_for(chunks), 0, 1, PSTAR_TEST_TMP_DIR "/clock_real.json", 0.0, 0, 0.0, 0.0};
        run_cfg(&c, &real);
        c.dry_run = 1;
        c.trace_path = PSTAR_TEST_TMP_DIR "/clock_dry.json";
        run_cfg(&c, &dry);
        char what[96];
        snprintf(what, sizeof what, "policy %d, %d chunks, prefetch %d", (int)policies[pi], chunks, prefetch);
        assert_same_counts(&real.stats, &dry.stats, what);
        cr_assert_gt(real.stats.bytes_host_to_device, 0u, "%s: something moved", what);
        cr_assert_gt(real.stats.peak_host_bytes, 0u, "%s", what);
        char *a = slurp(PSTAR_TEST_TMP_DIR "/clock_real.json"), *b = slurp(PSTAR_TEST_TMP_DIR "/clock_dry.json");
        cr_assert_str_eq(a, b, "%s: the timelines differ", what);
        free(a);
        free(b);
      }
    }
  }
  remove(PSTAR_TEST_TMP_DIR "/clock_real.json");
  remove(PSTAR_TEST_TMP_DIR "/clock_dry.json");
}

Test(clock, modelled_copy_time_is_bytes_over_bandwidth) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.virtual_clock = 1;
  o.h2d_bytes_per_s = 1e6;
  o.d2h_bytes_per_s = 4e6;
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", CHUNK, 0);
  T_OK(pstar_engine_build(e));
  double t = -1.0;
  T_OK(pstar_clock_now(e, &t));
  cr_assert_eq(t, 0.0);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_EVAL));
  t_acquire(e, id, PSTAR_STAGE_FORWARD);
  T_OK(pstar_clock_now(e, &t));
  /* One on-demand fetch of CHUNK bf16 elements: the caller waits for it. */
  const double copy = (double)(CHUNK * 2) / 1e6;
  cr_assert_float_eq(t, copy, 1e-15);
  pstar_stats s = t_stats(e);
  cr_assert_float_eq(s.wait_seconds, copy, 1e-15);
  cr_assert_eq(s.bytes_critical, (uint64_t)CHUNK * 2);
  T_OK(pstar_clock_advance(e, 0.5));
  T_OK(pstar_param_release(e, id, NULL));
  T_OK(pstar_iteration_end(e));
  s = t_stats(e);
  cr_assert_float_eq(s.clock_seconds, copy + 0.5, 1e-12);
  T_FAIL(pstar_clock_advance(e, -1.0), PSTAR_ERR_INVALID_ARGUMENT, "seconds");
  T_FAIL(pstar_clock_advance(e, NAN), PSTAR_ERR_INVALID_ARGUMENT, "seconds");
  T_FAIL(pstar_clock_now(e, NULL), PSTAR_ERR_INVALID_ARGUMENT, "NULL");
  T_OK(pstar_engine_destroy(e));
}

Test(clock, prefetch_hides_copies_behind_compute) {
  static clock_run demand, pre;
  clock_cfg c = {PSTAR_POLICY_OPT, 0, 1, capacity_for(3), 0, 0, NULL, 0.0, 0, 0.0, 0.0};
  run_cfg(&c, &demand);
  c.prefetch = 1;
  run_cfg(&c, &pre);
  cr_assert_lt(pre.stats.wait_seconds, demand.stats.wait_seconds, "prefetch did not reduce modelled waiting");
  cr_assert_lt(pre.now, demand.now, "prefetch did not shorten the modelled run");
  cr_assert_lt(pre.stats.bytes_critical, demand.stats.bytes_critical);
  cr_assert_gt(pre.stats.bytes_prefetched, 0u);
  /* The same inputs give the same modelled figures, run after run. */
  static clock_run again;
  run_cfg(&c, &again);
  cr_assert_eq(again.stats.clock_seconds, pre.stats.clock_seconds);
  cr_assert_eq(again.stats.wait_seconds, pre.stats.wait_seconds);
}

/* The CPU update's modelled time (pstar_x_engine_set_modelled_host_update):
 * about the compute of an iteration.  28 bytes per bf16 element. */
static const double kUpdateBytesPerS = 5e9;

/* With the overlapped step the modelled updates run beside the next
 * iteration (a chunk's fetch waits for its own); the synchronous step
 * waits for all of them.  Same bits either way and without the model; a
 * dry run counts the same modelled time as a real run. */
Test(clock, modelled_updates_overlap_the_next_iteration) {
  static clock_run none, sync, over, dry;
  const pstar_policy policies[] = {PSTAR_POLICY_OPT, PSTAR_POLICY_LRU, PSTAR_POLICY_STATIC};
  double total_elems = 0;
  for (int i = 0; i < P; ++i) total_elems += (double)kNumel[i];
  const double update_s = total_elems * 28.0 / kUpdateBytesPerS;
  for (size_t pi = 0; pi < 3; ++pi) {
    for (int chunks = 3; chunks <= 9; chunks += 3) {
      char what[96];
      snprintf(what, sizeof what, "policy %d, %d chunks", (int)policies[pi], chunks);
      clock_cfg c = {policies[pi], 1, 0, capacity_for(chunks), 0, 0, NULL, 0.0, 0, 0.0, 0.0};
      run_cfg(&c, &none);
      c.update_rate = kUpdateBytesPerS;
      c.sync_step = 1;
      run_cfg(&c, &sync);
      c.sync_step = 0;
      run_cfg(&c, &over);
      c.dry_run = 1;
      run_cfg(&c, &dry);
      cr_assert_eq(memcmp(sync.w, none.w, sizeof sync.w), 0, "%s: the synchronous step changed the results", what);
      cr_assert_eq(memcmp(over.w, none.w, sizeof over.w), 0, "%s: the overlapped step changed the results", what);
      cr_log_info("%s: modelled run %.1f us without the update's time, %.1f us synchronous, %.1f us overlapped "
                  "(updates %.1f us per step)",
                  what, none.now * 1e6, sync.now * 1e6, over.now * 1e6, update_s * 1e6);
      /* The synchronous step spends the updates on the caller's clock (a
       * copy may progress meanwhile); the overlap hides part of them. */
      cr_assert_gt(sync.now, none.now + 0.5 * ITERS * update_s, "%s", what);
      cr_assert_lt(over.now, sync.now, "%s: the overlap hid nothing", what);
      cr_assert_geq(over.now, none.now, "%s: the modelled update made the run faster than a free one", what);
      cr_assert_eq(sync.step_stats.steps_overlapped, 0, "%s", what);
      cr_assert_eq(over.step_stats.overlap, 1, "%s", what);
      cr_assert_eq(over.step_stats.steps_overlapped, (uint64_t)ITERS, "%s", what);
      cr_assert_eq(dry.now, over.now, "%s: dry run %.9g s, real run %.9g s", what, dry.now, over.now);
      assert_same_counts(&over.stats, &dry.stats, what);
    }
  }
}

Test(clock, modelled_host_update_errors) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  pstar_engine *e = t_create(&o);
  T_FAIL(pstar_x_engine_set_modelled_host_update(e, 1e9), PSTAR_ERR_UNSUPPORTED, "wall clock");
  T_OK(pstar_engine_destroy(e));
  o.virtual_clock = 1;
  e = t_create(&o);
  T_FAIL(pstar_x_engine_set_modelled_host_update(e, -1.0), PSTAR_ERR_INVALID_ARGUMENT, "bytes_per_s");
  T_FAIL(pstar_x_engine_set_modelled_host_update(e, NAN), PSTAR_ERR_INVALID_ARGUMENT, "bytes_per_s");
  T_FAIL(pstar_x_engine_set_modelled_host_update(e, 0.5), PSTAR_ERR_INVALID_ARGUMENT, "bytes_per_s");
  T_OK(pstar_x_engine_set_modelled_host_update(e, 0.0));
  (void)t_register(e, "w", CHUNK, 0);
  T_OK(pstar_engine_build(e));
  T_FAIL(pstar_x_engine_set_modelled_host_update(e, 1e9), PSTAR_ERR_INVALID_STATE, "built");
  T_OK(pstar_engine_destroy(e));
}

Test(clock, results_do_not_depend_on_the_clock_policy_or_capacity) {
  static clock_run ref, r;
  clock_cfg c = {PSTAR_POLICY_OPT, 1, 0, 0, 0, 0, NULL, 0.0, 0, 0.0, 0.0};
  run_cfg(&c, &ref);
  const pstar_policy policies[] = {PSTAR_POLICY_OPT, PSTAR_POLICY_LRU, PSTAR_POLICY_STATIC};
  for (size_t pi = 0; pi < 3; ++pi) {
    for (int chunks = 3; chunks <= 9; chunks += 2) {
      clock_cfg k = {policies[pi], (int)pi == 0, 0, capacity_for(chunks), 0, 0, NULL, 0.0, 0, 0.0, 0.0};
      run_cfg(&k, &r);
      cr_assert_eq(memcmp(r.w, ref.w, sizeof r.w), 0, "policy %d at %d chunks changed the results", (int)policies[pi],
                   chunks);
    }
  }
}

/* Every moment of the exported timeline stays within capacity - margin:
 * chunks + gradient buffers + non-model + buffers still being freed. */
Test(clock, window_budget_holds_at_every_moment) {
  static clock_run r;
  const uint64_t margin = 3000;
  for (int chunks = 3; chunks <= 8; ++chunks) {
    for (int prefetch = 0; prefetch <= 1; ++prefetch) {
      const uint64_t capacity = capacity_for(chunks) + margin;
      clock_cfg c = {PSTAR_POLICY_OPT, prefetch, 1, capacity, margin, 1, PSTAR_TEST_TMP_DIR "/clock_budget.json", 0.0, 0, 0.0, 0.0};
      run_cfg(&c, &r);
      cr_assert_eq(r.stats.budget_overruns, 0u);
      cr_assert_leq(r.stats.peak_device_bytes, capacity - margin, "%d chunks: peak over the budget", chunks);
      char *text = slurp(PSTAR_TEST_TMP_DIR "/clock_budget.json");
      const char *rows = strstr(text, "\"rows\":[");
      cr_assert_not_null(rows);
      size_t moments = 0;
      for (const char *p = strchr(rows + 8, '['); p != NULL; p = strchr(p + 1, '[')) {
        unsigned long long m, ch, gr, nm, fr, host;
        double sec;
        cr_assert_eq(sscanf(p, "[%llu,%lf,%llu,%llu,%llu,%llu,%llu]", &m, &sec, &ch, &gr, &nm, &fr, &host), 7);
        cr_assert_leq(ch + gr + nm + fr, capacity - margin, "%d chunks: moment %llu over the budget", chunks, m);
        ++moments;
      }
      cr_assert_eq(moments, (size_t)ITERS * 2 * (P + 1), "one row per acquire");
      free(text);
    }
  }
  remove(PSTAR_TEST_TMP_DIR "/clock_budget.json");
}

Test(clock, trace_export_writes_every_move) {
  static clock_run r;
  clock_cfg c = {PSTAR_POLICY_LRU, 0, 1, capacity_for(4), 0, 1, PSTAR_TEST_TMP_DIR "/clock_moves.json", 0.0, 0, 0.0, 0.0};
  run_cfg(&c, &r);
  char *text = slurp(PSTAR_TEST_TMP_DIR "/clock_moves.json");
  cr_assert_not_null(strstr(text, "\"traceEvents\":["));
  cr_assert_eq(count_of(text, "\"ph\":\"X\""), r.stats.moves_to_device + r.stats.evictions);
  cr_assert_eq(count_of(text, "\"tid\":1,\"args\":{\"bytes\""), r.stats.moves_to_device);
  cr_assert_eq(count_of(text, "\"clock\":\"virtual\""), 1u);
  free(text);
  remove(PSTAR_TEST_TMP_DIR "/clock_moves.json");
}

/* One move of the exported timeline. */
typedef struct move {
  unsigned chunk;
  int to_device;
  double start_us, end_us;
} move;

/* The moves of a timeline export, in the order they were queued. */
static size_t read_moves(const char *text, move *out, size_t max) {
  size_t n = 0;
  for (const char *p = strstr(text, "{\"name\":\"chunk "); p != NULL && n < max;
       p = strstr(p + 1, "{\"name\":\"chunk ")) {
    move m;
    int tid = 0;
    double dur = 0.0;
    if (sscanf(p, "{\"name\":\"chunk %u\",\"cat\":\"move\",\"ph\":\"X\",\"ts\":%lf,\"dur\":%lf,\"pid\":1,\"tid\":%d",
               &m.chunk, &m.start_us, &dur, &tid) != 4)
      continue;
    m.to_device = tid == 1;
    m.end_us = m.start_us + dur;
    out[n++] = m;
  }
  return n;
}

/* The synchronous step's fill: parameter 0 is used first in the forward
 * and last in the backward (tied), so its chunk is the last to go down and
 * the first the next forward needs.  While it goes down, the chunks after
 * it that are on the host already go up (out of use order), as many bytes
 * as the link up carries in the time chunk 0 takes to come down (here the
 * link up is twice as fast: two chunks), so the link up is busy during
 * that copy; without the fill it idles until chunk 0 is down and updated.
 * With the link up slower than the link down, even one chunk would delay
 * chunk 0's copy up: nothing goes ahead.  Same bits as a run with room for
 * everything. */
static size_t steps_that_fill(double h2d, double d2h) {
  static clock_run r;
  static move moves[4096];
  clock_cfg c = {PSTAR_POLICY_OPT, 1, 1, capacity_for(9), 0, 1, PSTAR_TEST_TMP_DIR "/clock_fill.json", 0.0, 1, h2d,
                 d2h};
  run_cfg(&c, &r);
  char *text = slurp(PSTAR_TEST_TMP_DIR "/clock_fill.json");
  const size_t n = read_moves(text, moves, sizeof moves / sizeof moves[0]);
  free(text);
  cr_assert_gt(n, 0u, "no moves read from the timeline");
  size_t downs = 0, filled = 0;
  for (size_t i = 0; i < n; ++i) {
    if (moves[i].chunk != 0 || moves[i].to_device || moves[i].end_us <= moves[i].start_us) continue;
    ++downs;
    for (size_t j = 0; j < n; ++j) {
      if (moves[j].to_device && moves[j].chunk != 0 && moves[j].start_us >= moves[i].start_us &&
          moves[j].start_us < moves[i].end_us) {
        ++filled;
        break;
      }
    }
  }
  cr_assert_eq(downs, (size_t)ITERS, "chunk 0 goes down once per step (%zu copies)", downs);
  remove(PSTAR_TEST_TMP_DIR "/clock_fill.json");
  return filled;
}

Test(clock, the_step_sends_chunks_up_while_the_first_comes_down) {
  /* The first step has no trace to follow yet; each later one fills. */
  cr_assert_eq(steps_that_fill(2e9, 1e9), (size_t)ITERS - 1, "the link up idled while chunk 0 came down");
  cr_assert_eq(steps_that_fill(1e9, 2e9), 0u, "chunks went ahead of chunk 0 over a slower link up");
  /* With payloads: the bits of a run with room for everything. */
  static clock_run ref, r;
  clock_cfg k = {PSTAR_POLICY_OPT, 1, 0, 0, 0, 0, NULL, 0.0, 1, 2e9, 1e9};
  run_cfg(&k, &ref);
  k.capacity = capacity_for(9);
  run_cfg(&k, &r);
  cr_assert_eq(memcmp(r.w, ref.w, sizeof r.w), 0, "the fill changed the results");
}

Test(clock, errors_are_clear) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  pstar_engine *e = t_create(&o);
  T_FAIL(pstar_clock_advance(e, 1.0), PSTAR_ERR_UNSUPPORTED, "virtual_clock");
  double t = -1.0;
  T_OK(pstar_clock_now(e, &t));
  cr_assert_geq(t, 0.0, "the wall clock counts from creation");
  T_FAIL(pstar_trace_export(e, "never.json"), PSTAR_ERR_INVALID_STATE, "record_timeline");
  T_OK(pstar_engine_destroy(e));

  o.record_timeline = 1;
  e = t_create(&o);
  T_FAIL(pstar_trace_export(e, NULL), PSTAR_ERR_INVALID_ARGUMENT, "path");
  T_FAIL(pstar_trace_export(e, "no-such-dir/x/trace.json"), PSTAR_ERR_IO, "no-such-dir");
  T_OK(pstar_engine_destroy(e));

  pstar_engine_options bad = t_options(PSTAR_DTYPE_BF16, CHUNK);
  bad.virtual_clock = 1;
  bad.strict = 1;
  T_FAIL(pstar_engine_create(&bad, &e), PSTAR_ERR_INVALID_ARGUMENT, "strict");
  bad = t_options(PSTAR_DTYPE_BF16, CHUNK);
  bad.dry_run = 1;
  bad.device = PSTAR_DEVICE_CUDA;
  T_FAIL(pstar_engine_create(&bad, &e), PSTAR_ERR_INVALID_ARGUMENT, "emulated device only");
  bad = t_options(PSTAR_DTYPE_BF16, CHUNK);
  bad.h2d_bytes_per_s = -1.0;
  T_FAIL(pstar_engine_create(&bad, &e), PSTAR_ERR_INVALID_ARGUMENT, "h2d_bytes_per_s");
  bad = t_options(PSTAR_DTYPE_BF16, CHUNK);
  bad.device_capacity_bytes = 4096;
  bad.device_margin_bytes = 4096;
  T_FAIL(pstar_engine_create(&bad, &e), PSTAR_ERR_INVALID_ARGUMENT, "device_margin_bytes");
}

Test(clock, dry_run_refuses_value_access) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK);
  o.dry_run = 1;
  pstar_engine *e = t_create(&o);
  const uint32_t id = t_register(e, "w", 100, 0);
  T_OK(pstar_engine_build(e));
  float v[100] = {0};
  T_FAIL(pstar_param_write(e, id, v, 100, PSTAR_DTYPE_F32), PSTAR_ERR_UNSUPPORTED, "dry run");
  T_FAIL(pstar_param_read(e, id, v, 100, PSTAR_DTYPE_F32), PSTAR_ERR_UNSUPPORTED, "dry run");
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  void *p = (void *)1;
  T_OK(pstar_param_acquire(e, id, PSTAR_STAGE_FORWARD, NULL, &p));
  cr_assert_null(p);
  T_OK(pstar_param_release(e, id, NULL));
  T_OK(pstar_param_acquire(e, id, PSTAR_STAGE_BACKWARD, NULL, &p));
  float *slot = NULL;
  T_FAIL(pstar_grad_slot_acquire(e, id, NULL, &slot), PSTAR_ERR_UNSUPPORTED, "dry run");
  T_OK(pstar_grad_write(e, id, NULL, 100, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
  T_OK(pstar_param_release(e, id, NULL));
  pstar_step_result r = PSTAR_STEP_RESULT_INIT;
  T_OK(pstar_step(e, &r));
  cr_assert_eq(r.params_updated, 1u, "the step runs its bookkeeping");
  T_OK(pstar_engine_destroy(e));
}
