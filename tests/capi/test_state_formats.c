/*
 * Adam's moments in fewer bytes (pstar_engine_options.state_format): the
 * bf16 and int8 formats through the whole engine.
 *
 * For each format the same small model (a tied parameter, a frozen one, odd
 * sizes so that int8 blocks end part way) is trained in several ways that
 * must give the same bits: an unlimited device and a quarter of the compute
 * list in strict mode (evictions, refetches, poisoned copies), the
 * synchronous, the overlapped and the speculative step, and a run resumed
 * from a checkpoint.  The format must be in effect: the host holds fewer
 * bytes by exactly the moments' difference, and the masters differ from the
 * fp32 format's (quantized moments) while staying close to them.
 *
 * bf16 masters (pstar_engine_options.master_format) with each moment format:
 * the same ways (pstar_param_pin is refused, and tested so), reruns with the same seed give
 * the same bits and another seed other bits, every master read is a bf16
 * value, and the host holds exactly 2 bytes per trainable element less.
 */
#define PSTAR_EXPERIMENTAL_API 1
#include <sys/stat.h>
#include <unistd.h>

#include "capi_test_util.h"

enum { CHUNK_ELEMS = 2048, NPARAMS = 8, TIED = 0, FROZEN = 5, ITERS = 6 };

static const int64_t k_numel[NPARAMS] = {384, 1000, 130, 900, 1700, 700, 2500, 257};

typedef struct run_config {
  pstar_state_format format;
  uint64_t capacity; /* device bytes; 0 = unlimited */
  int strict;
  int overlap;        /* pstar_x_engine_set_overlap_step */
  uint64_t speculate; /* pstar_x_engine_set_speculative_update */
  int save_at;        /* save a checkpoint after this many steps, then go on in a new engine (-1: no) */
  uint64_t nvme_host; /* host capacity with an NVMe tier (some lists on the drive); 0: no tier */
  int micro;          /* micro-batches per step: > 1 turns gradient accumulation on */
  int overflow_at;    /* an inf gradient at this iteration: its step is skipped (-1: none) */
  int hybrid;         /* hybrid optimizer placement: state on the (emulated) device, updated there */
  pstar_master_format master;
  uint64_t master_seed;
} run_config;

typedef struct run_result {
  float *params[NPARAMS];
  pstar_stats stats;
  pstar_x_nvme_stats nvme;
} run_result;

static void free_result(run_result *r) {
  for (int i = 0; i < NPARAMS; ++i) free(r->params[i]);
}

static uint32_t flags_of(int k) {
  return k == FROZEN ? PSTAR_PARAM_FROZEN : (k == 3 ? PSTAR_PARAM_NO_WEIGHT_DECAY : 0);
}

static pstar_engine *make_engine(const run_config *c, uint32_t *ids) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK_ELEMS);
  o.device_capacity_bytes = c->capacity;
  o.strict = c->strict;
  o.strict_seed = 7;
  o.lr = 1e-2f;
  o.weight_decay = 0.01f;
  o.state_format = c->format;
  o.host_capacity_bytes = c->nvme_host;
  o.grad_accumulation = c->micro > 1;
  o.hybrid_optimizer = c->hybrid;
  o.master_format = c->master;
  o.master_seed = c->master_seed;
  pstar_engine *e = t_create(&o);
  if (c->nvme_host != 0) {
    pstar_x_nvme_options n;
    T_OK(pstar_x_nvme_options_init(&n));
    n.dir = PSTAR_TEST_TMP_DIR;
    n.staging_buffers = 2;
    n.buffered = 1; /* the build tree's filesystem may refuse O_DIRECT */
    T_OK(pstar_x_engine_set_nvme(e, &n));
  }
  T_OK(pstar_x_engine_set_overlap_step(e, c->overlap));
  T_OK(pstar_x_engine_set_speculative_update(e, c->speculate));
  for (int i = 0; i < NPARAMS; ++i) {
    char name[32];
    snprintf(name, sizeof name, "layer%d.weight", i);
    ids[i] = t_register(e, name, k_numel[i], flags_of(i));
  }
  T_OK(pstar_engine_build(e));
  return e;
}

/* One TRAIN iteration of `micro` micro-batches: forward 0..N-1 then the
 * tied one again, backward in reverse; gradients depend on the weights
 * seen.  `overflow`: an inf in one gradient (the step is skipped). */
static void iterate(pstar_engine *e, const uint32_t *ids, int it, int micro, int overflow) {
  void *stream = NULL;
  T_OK(pstar_engine_compute_stream(e, &stream));
  float *g = t_alloc_f(4096);
  T_OK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  for (int mb = 0; mb < micro; ++mb) {
    for (int s = 0; s <= NPARAMS; ++s) {
      const int k = s == NPARAMS ? TIED : s;
      void *w = NULL;
      T_OK(pstar_param_acquire(e, ids[k], PSTAR_STAGE_FORWARD, stream, &w));
      T_OK(pstar_param_release(e, ids[k], stream));
    }
    for (int s = NPARAMS; s >= 0; --s) {
      const int k = s == NPARAMS ? TIED : s;
      void *w = NULL;
      T_OK(pstar_param_acquire(e, ids[k], PSTAR_STAGE_BACKWARD, stream, &w));
      if (k != FROZEN) {
        for (int64_t j = 0; j < k_numel[k]; ++j) {
          const float wj = t_bf16_to_f32(((const uint16_t *)w)[j]);
          /* Magnitudes over several decades, so that the int8 map's decades
           * are all used. */
          const float noise = (float)((int)((j * 7 + it * 3 + k * 5 + mb * 2) % 11) - 5) * (j % 5 == 0 ? 1e-1f : 1e-3f);
          g[j] = 0.1f * wj + noise;
        }
        if (overflow && k == 4 && mb == micro - 1) g[17] = INFINITY;
        T_OK(pstar_grad_write(e, ids[k], g, (uint64_t)k_numel[k], PSTAR_DTYPE_F32, PSTAR_MEM_HOST, stream));
      }
      T_OK(pstar_param_release(e, ids[k], stream));
    }
  }
  pstar_step_result r;
  T_OK(pstar_step_result_init(&r));
  T_OK(pstar_step(e, &r));
  cr_assert_eq(r.skipped, overflow ? 1 : 0, "iteration %d", it);
  if (!overflow) cr_assert_eq(r.params_updated, NPARAMS - 1);
  free(g);
}

static void run(const run_config *c, const char *dir, run_result *out) {
  memset(out, 0, sizeof *out);
  uint32_t ids[NPARAMS];
  pstar_engine *e = make_engine(c, ids);
  for (int i = 0; i < NPARAMS; ++i) {
    float *init = t_alloc_f((size_t)k_numel[i]);
    t_fill(init, (size_t)k_numel[i], (uint32_t)(100 + i), 0.5f);
    t_write_f32(e, ids[i], init, (uint64_t)k_numel[i]);
    free(init);
  }
  for (int it = 0; it < ITERS; ++it) {
    if (it == c->save_at) {
      T_OK(pstar_checkpoint_save(e, dir));
      T_OK(pstar_engine_destroy(e));
      e = make_engine(c, ids);
      T_OK(pstar_checkpoint_load(e, dir));
    }
    iterate(e, ids, it, c->micro > 1 ? c->micro : 1, it == c->overflow_at);
  }
  for (int i = 0; i < NPARAMS; ++i) {
    out->params[i] = t_alloc_f((size_t)k_numel[i]);
    t_read_f32(e, ids[i], out->params[i], (uint64_t)k_numel[i]);
  }
  out->stats = t_stats(e);
  T_OK(pstar_x_nvme_stats_init(&out->nvme));
  if (c->nvme_host != 0) T_OK(pstar_x_nvme_get_stats(e, &out->nvme));
  T_OK(pstar_engine_destroy(e));
}

static void assert_same_bits(const run_result *a, const run_result *b, const char *what) {
  for (int i = 0; i < NPARAMS; ++i) {
    for (int64_t j = 0; j < k_numel[i]; ++j) {
      cr_assert_eq(t_f32_bits(a->params[i][j]), t_f32_bits(b->params[i][j]), "%s: param %d elem %lld: %a vs %a", what,
                   i, (long long)j, (double)a->params[i][j], (double)b->params[i][j]);
    }
  }
}

static char *test_dir(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/state_formats_%s_%d", PSTAR_TEST_TMP_DIR, name, (int)getpid());
  mkdir(buf, 0755);
  return buf;
}

static const run_config k_base = {PSTAR_STATE_FP32, 0, 0, 0, 0, -1, 0, 1, -1, 0, PSTAR_MASTER_FP32, 0};

/* Runs of `base` (unlimited, synchronous) that must give ref's bits: a
 * quarter of the compute list in strict mode (evictions, refetches,
 * poisoned copies), the overlapped step, the speculative step. */
static void check_modes(const run_config *base, const run_result *ref) {
  run_result other;
  run_config c = *base;
  c.capacity = 2 * CHUNK_ELEMS * 2 + 4 * 4096;
  c.strict = 1;
  run(&c, NULL, &other);
  assert_same_bits(ref, &other, "quarter budget, strict");
  free_result(&other);
  c = *base;
  c.overlap = 1;
  run(&c, NULL, &other);
  assert_same_bits(ref, &other, "overlapped step");
  free_result(&other);
  c.speculate = 1u << 24;
  run(&c, NULL, &other);
  assert_same_bits(ref, &other, "speculative step");
  free_result(&other);
}

/* Gradient accumulation over two micro-batches, and a step skipped for an
 * inf gradient: unlimited and a quarter budget in strict mode agree. */
static void check_accumulation_with_a_skip(const run_config *base) {
  run_result a, b;
  run_config c = *base;
  c.micro = 2;
  c.overflow_at = 2;
  run(&c, NULL, &a);
  c.capacity = 2 * CHUNK_ELEMS * 2 + 4 * 4096;
  c.strict = 1;
  run(&c, NULL, &b);
  assert_same_bits(&a, &b, "accumulation with a skipped step");
  cr_assert_eq(a.stats.skipped_steps, 1);
  free_result(&b);
  free_result(&a);
}

/* Hybrid placement with gradient accumulation folds on the device, which
 * the unlimited host reference does not: `hybrid` (run from config c) is
 * compared with the same run without hybrid placement. */
static void assert_same_as_without_hybrid(run_config c, const run_result *hybrid, const char *what) {
  run_result host;
  c.hybrid = 0;
  run(&c, NULL, &host);
  assert_same_bits(&host, hybrid, what);
  free_result(&host);
}

static void check_format(pstar_state_format f) {
  run_config c = k_base;
  c.format = f;
  run_result ref, other;
  run(&c, NULL, &ref);

  check_modes(&c, &ref);

  /* A host capacity that leaves some chunks' lists on the NVMe drive, with
   * the synchronous and the overlapped step: the same bits. */
  for (int overlap = 0; overlap <= 1; ++overlap) {
    c = k_base;
    c.format = f;
    c.overlap = overlap;
    c.nvme_host = ref.stats.peak_host_bytes;
    run(&c, NULL, &other);
    cr_assert_gt(other.nvme.chunks_on_nvme, 0, "format %d: no chunk on the drive", (int)f);
    assert_same_bits(&ref, &other, overlap ? "NVMe tier, overlapped" : "NVMe tier");
    free_result(&other);
  }

  /* Hybrid placement: every chunk's state on the emulated device (an
   * unlimited one places all), updated there by the device's kernel, with
   * the synchronous and the overlapped step; and with gradient accumulation.
   * The same bits. */
  for (int mode = 0; mode < 3; ++mode) {
    c = k_base;
    c.format = f;
    c.hybrid = 1;
    c.overlap = mode == 1;
    c.micro = mode == 2 ? 2 : 1;
    run(&c, NULL, &other);
    cr_assert_gt(other.stats.optimizer_chunks_on_device, 0, "format %d: no state on the device", (int)f);
    if (mode != 2) {
      assert_same_bits(&ref, &other, mode ? "hybrid, overlapped" : "hybrid");
    } else {
      assert_same_as_without_hybrid(c, &other, "hybrid with accumulation");
    }
    free_result(&other);
  }

  c = k_base;
  c.format = f;
  check_accumulation_with_a_skip(&c);

  /* Saved after 3 steps and resumed in a new engine: the same bits. */
  c = k_base;
  c.format = f;
  c.save_at = 3;
  run(&c, test_dir(f == PSTAR_STATE_INT8 ? "int8" : "bf16"), &other);
  assert_same_bits(&ref, &other, "resumed from a checkpoint");
  free_result(&other);

  /* In effect: close to the fp32 format's masters but not the same. */
  run(&k_base, NULL, &other);
  size_t differ = 0, total = 0;
  double worst = 0.0;
  for (int i = 0; i < NPARAMS; ++i) {
    for (int64_t j = 0; j < k_numel[i]; ++j) {
      const float a = ref.params[i][j], b = other.params[i][j];
      differ += t_f32_bits(a) != t_f32_bits(b);
      ++total;
      const double d = fabs((double)a - (double)b);
      if (d > worst) worst = d;
    }
  }
  cr_assert(differ > 0, "format %d gave the fp32 format's bits: not in effect", (int)f);
  /* lr 1e-2 for 6 steps moves a weight by at most about 0.06; moments in
   * fewer bits change the steps by a small fraction of that. */
  cr_assert(worst < 1e-2, "format %d: largest difference from fp32 %g", (int)f, worst);
  /* Fewer host bytes: the moments' storage is smaller. */
  cr_assert_lt(ref.stats.peak_host_bytes, other.stats.peak_host_bytes, "format %d: peak host bytes %llu vs fp32's %llu",
               (int)f, (unsigned long long)ref.stats.peak_host_bytes, (unsigned long long)other.stats.peak_host_bytes);
  free_result(&other);
  free_result(&ref);
}

Test(state_formats, bf16_moments_agree_across_placements_steps_and_resume, .timeout = 120) {
  check_format(PSTAR_STATE_BF16);
}

Test(state_formats, int8_moments_agree_across_placements_steps_and_resume, .timeout = 120) {
  check_format(PSTAR_STATE_INT8);
}

/* The host's bytes are the fp32 format's less exactly the moments' savings:
 * per trainable chunk of E elements, 2 x (4E - the format's list bytes). */
Test(state_formats, host_bytes_shrink_by_the_moments_difference, .timeout = 60) {
  run_result r[3];
  const pstar_state_format formats[3] = {PSTAR_STATE_FP32, PSTAR_STATE_BF16, PSTAR_STATE_INT8};
  for (int i = 0; i < 3; ++i) {
    run_config c = k_base;
    c.format = formats[i];
    run(&c, NULL, &r[i]);
  }
  /* The layout of this model in both alignments (128 and the int8 block of
   * 256): trainable chunks of CHUNK_ELEMS elements, and the jumbo parameter
   * 6 (2500 elements: 2560 rounded to 128 and to 256 alike). */
  const uint32_t chunks = r[0].stats.optimizer_chunks;
  cr_assert_eq(r[1].stats.optimizer_chunks, chunks);
  cr_assert_eq(r[2].stats.optimizer_chunks, chunks);
  const uint64_t elems = r[0].stats.optimizer_list_bytes / 4; /* every trainable chunk's capacity */
  cr_assert_eq(r[2].stats.optimizer_list_bytes / 4, elems, "int8 packs this model into the same capacity");
  const uint64_t fp32 = r[0].stats.host_bytes, bf16 = r[1].stats.host_bytes, int8 = r[2].stats.host_bytes;
  cr_assert_eq(fp32 - bf16, 2 * 2 * elems, "bf16 saves 2 x 2 bytes per element: %llu vs %llu", (unsigned long long)fp32,
               (unsigned long long)bf16);
  /* int8: per list, 3 bytes per element less the block maxima (a float per
   * 256 elements after the codes, at a 64-byte boundary) per chunk. */
  cr_assert_lt(int8, bf16);
  cr_assert_geq(fp32 - int8, 2 * (3 * elems - (elems / 256) * 4 - 64 * chunks));
  for (int i = 0; i < 3; ++i) free_result(&r[i]);
}

/* Hybrid placement on an unlimited device places every chunk's state, so
 * the host holds none of the optimizer's lists after the first step: the
 * host bytes are the host run's less at least the masters and the moments
 * (their codes, for int8).  The lists the placement frees are of sizes the
 * host pool is asked for again only with fp32 moments and fp32 masters, so
 * the pool gives them back (placement/hybrid.cpp, trim_unwanted) rather than
 * holding them for good. */
Test(state_formats, hybrid_placement_leaves_no_optimizer_list_on_the_host, .timeout = 60) {
  const pstar_state_format formats[3] = {PSTAR_STATE_FP32, PSTAR_STATE_BF16, PSTAR_STATE_INT8};
  const uint64_t moment_elem_bytes[3] = {4, 2, 1};
  for (int m = 0; m < 2; ++m) {
    for (int i = 0; i < 3; ++i) {
      run_result host, hyb;
      run_config c = k_base;
      c.format = formats[i];
      c.master = m ? PSTAR_MASTER_BF16 : PSTAR_MASTER_FP32;
      run(&c, NULL, &host);
      c.hybrid = 1;
      run(&c, NULL, &hyb);
      cr_assert_eq(hyb.stats.optimizer_chunks_on_device, hyb.stats.optimizer_chunks, "every chunk's state placed");
      const uint64_t elems = host.stats.optimizer_list_bytes / 4;
      const uint64_t lists = elems * (m ? 2 : 4) + 2 * elems * moment_elem_bytes[i];
      cr_assert_geq(host.stats.host_bytes, hyb.stats.host_bytes + lists,
                    "state format %d, %s masters: host %llu bytes with hybrid placement, %llu without; the "
                    "optimizer's host lists are at least %llu",
                    (int)formats[i], m ? "bf16" : "fp32", (unsigned long long)hyb.stats.host_bytes,
                    (unsigned long long)host.stats.host_bytes, (unsigned long long)lists);
      free_result(&hyb);
      free_result(&host);
    }
  }
}

Test(state_formats, a_checkpoint_of_another_format_is_refused, .timeout = 60) {
  run_config c = k_base;
  c.format = PSTAR_STATE_INT8;
  char *dir = test_dir("refused");
  uint32_t ids[NPARAMS];
  pstar_engine *a = make_engine(&c, ids);
  iterate(a, ids, 0, 1, 0);
  T_OK(pstar_checkpoint_save(a, dir));
  T_OK(pstar_engine_destroy(a));
  const pstar_state_format others[2] = {PSTAR_STATE_FP32, PSTAR_STATE_BF16};
  for (int i = 0; i < 2; ++i) {
    c.format = others[i];
    pstar_engine *b = make_engine(&c, ids);
    T_FAIL(pstar_checkpoint_load(b, dir), PSTAR_ERR_INVALID_ARGUMENT, "int8 format");
    T_OK(pstar_engine_destroy(b));
  }
}

static run_config masters_config(pstar_state_format f) {
  run_config c = k_base;
  c.format = f;
  c.master = PSTAR_MASTER_BF16;
  c.master_seed = 1234;
  return c;
}

static void check_bf16_masters(pstar_state_format f) {
  run_config c = masters_config(f);
  run_result ref, other;
  run(&c, NULL, &ref);
  /* Every master is a bf16 value. */
  for (int i = 0; i < NPARAMS; ++i) {
    for (int64_t j = 0; j < k_numel[i]; ++j) {
      cr_assert_eq(t_f32_bits(ref.params[i][j]) & 0xffffu, 0u, "param %d elem %lld: %a is not a bf16 value", i,
                   (long long)j, (double)ref.params[i][j]);
    }
  }
  /* Rerun: the same bits; another seed: other bits. */
  run(&c, NULL, &other);
  assert_same_bits(&ref, &other, "rerun");
  free_result(&other);
  c.master_seed = 99;
  run(&c, NULL, &other);
  size_t differ = 0;
  for (int i = 0; i < NPARAMS; ++i) {
    for (int64_t j = 0; j < k_numel[i]; ++j) differ += t_f32_bits(ref.params[i][j]) != t_f32_bits(other.params[i][j]);
  }
  cr_assert_gt(differ, 100, "another seed changed only %zu masters", differ);
  free_result(&other);

  c = masters_config(f);
  check_modes(&c, &ref);
  check_accumulation_with_a_skip(&c);

  /* Some chunks' lists on the NVMe drive (the master list at 2 bytes per
   * element there too), synchronous and overlapped: the same bits. */
  for (int overlap = 0; overlap <= 1; ++overlap) {
    c = masters_config(f);
    c.overlap = overlap;
    /* The unlimited run's peak and a quarter more: room for the staging
     * buffers, which take a larger share beside these smaller lists. */
    c.nvme_host = ref.stats.peak_host_bytes + ref.stats.peak_host_bytes / 4;
    run(&c, NULL, &other);
    cr_assert_gt(other.nvme.chunks_on_nvme, 0, "bf16 masters, format %d: no chunk on the drive", (int)f);
    assert_same_bits(&ref, &other, overlap ? "bf16 masters, NVMe tier, overlapped" : "bf16 masters, NVMe tier");
    free_result(&other);
  }

  /* Hybrid placement: the masters (2 bytes each) and moments on the
   * emulated device, updated there; synchronous, overlapped, saved and
   * resumed (the checkpoint reads the masters from the device), and with
   * accumulation (against the same without hybrid placement). */
  for (int mode = 0; mode < 4; ++mode) {
    c = masters_config(f);
    c.hybrid = 1;
    c.overlap = mode == 1;
    c.micro = mode == 2 ? 2 : 1;
    c.save_at = mode == 3 ? 4 : -1;
    run(&c, mode == 3 ? test_dir(f == PSTAR_STATE_INT8 ? "m16h_int8" : f == PSTAR_STATE_BF16 ? "m16h_bf16" : "m16h_fp32")
                      : NULL,
        &other);
    cr_assert_gt(other.stats.optimizer_chunks_on_device, 0, "bf16 masters, format %d: no state on the device", (int)f);
    if (mode != 2) {
      assert_same_bits(&ref, &other,
                       mode == 0   ? "bf16 masters, hybrid"
                       : mode == 1 ? "bf16 masters, hybrid, overlapped"
                                   : "bf16 masters, hybrid, resumed from a checkpoint");
    } else {
      assert_same_as_without_hybrid(c, &other, "bf16 masters, hybrid with accumulation");
    }
    free_result(&other);
  }

  /* Saved after 3 steps and resumed: the same bits. */
  c = masters_config(f);
  c.save_at = 3;
  run(&c, test_dir(f == PSTAR_STATE_INT8 ? "m16_int8" : f == PSTAR_STATE_BF16 ? "m16_bf16" : "m16_fp32"), &other);
  assert_same_bits(&ref, &other, "bf16 masters, resumed from a checkpoint");
  free_result(&other);

  /* Close to fp32 masters of the same moment format; 2 bytes less per
   * trainable element on the host. */
  c = k_base;
  c.format = f;
  run(&c, NULL, &other);
  double worst = 0.0;
  for (int i = 0; i < NPARAMS; ++i) {
    for (int64_t j = 0; j < k_numel[i]; ++j) {
      const double d = fabs((double)ref.params[i][j] - (double)other.params[i][j]);
      if (d > worst) worst = d;
    }
  }
  /* Weights of magnitude up to 0.5: a bf16 ulp there is 2^-9; six steps of
   * stochastic rounding stay within a few ulps. */
  cr_assert(worst < 8.0 / 512.0, "bf16 masters: largest difference from fp32 masters %g", worst);
  const uint64_t elems = other.stats.optimizer_list_bytes / 4;
  cr_assert_eq(other.stats.host_bytes - ref.stats.host_bytes, 2 * elems,
               "bf16 masters save 2 bytes per element: %llu vs %llu", (unsigned long long)other.stats.host_bytes,
               (unsigned long long)ref.stats.host_bytes);
  free_result(&other);
  free_result(&ref);
}

Test(state_formats, bf16_masters_with_fp32_moments, .timeout = 120) { check_bf16_masters(PSTAR_STATE_FP32); }
Test(state_formats, bf16_masters_with_bf16_moments, .timeout = 120) { check_bf16_masters(PSTAR_STATE_BF16); }
Test(state_formats, bf16_masters_with_int8_moments, .timeout = 120) { check_bf16_masters(PSTAR_STATE_INT8); }

Test(state_formats, bf16_masters_refusals, .timeout = 60) {
  /* An unknown format; pinning (not yet carried: a pin hands out fp32). */
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, CHUNK_ELEMS);
  pstar_engine *e = NULL;
  o.master_format = (pstar_master_format)7;
  T_FAIL(pstar_engine_create(&o, &e), PSTAR_ERR_INVALID_ARGUMENT, "master format");
  o.master_format = PSTAR_MASTER_BF16;
  e = t_create(&o);
  const uint32_t id = t_register(e, "w", 300, 0);
  T_OK(pstar_engine_build(e));
  void *p = NULL;
  pstar_dtype dt;
  T_FAIL(pstar_param_pin(e, id, 0, &p, &dt), PSTAR_ERR_UNSUPPORTED, "bf16 masters");
  T_OK(pstar_engine_destroy(e));

  /* A checkpoint of bf16 masters into an fp32-master engine and back. */
  run_config c = masters_config(PSTAR_STATE_FP32);
  char *dir = test_dir("m16_refused");
  uint32_t ids[NPARAMS];
  pstar_engine *a = make_engine(&c, ids);
  iterate(a, ids, 0, 1, 0);
  T_OK(pstar_checkpoint_save(a, dir));
  T_OK(pstar_engine_destroy(a));
  c.master = PSTAR_MASTER_FP32;
  pstar_engine *b = make_engine(&c, ids);
  T_FAIL(pstar_checkpoint_load(b, dir), PSTAR_ERR_INVALID_ARGUMENT, "bf16 masters");
  T_OK(pstar_checkpoint_save(b, dir));
  T_OK(pstar_engine_destroy(b));
  c.master = PSTAR_MASTER_BF16;
  b = make_engine(&c, ids);
  T_FAIL(pstar_checkpoint_load(b, dir), PSTAR_ERR_INVALID_ARGUMENT, "fp32 masters");
  T_OK(pstar_engine_destroy(b));
}
