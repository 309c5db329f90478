/*
 * ZeRO-3 data parallelism through the C API: 2 and 4 ranks as forked
 * processes on loopback (emulated device, Gloo), each holding 1/N of every
 * chunk, against one process given the averaged gradients.
 *
 * The model (chunk_elems 1024, registration order): emb 700 (used first and
 * last in forward: tied), w1 300, b1 37 (no decay), frozen 200 (frozen),
 * w2 900, big 2300 (a jumbo chunk), b2 50.  Chunks: {emb} {w1, b1} {frozen}
 * {w2} {big} {b2}; with 4 ranks the jumbo chunk is padded from 2304 to 2560
 * elements.
 *
 * Gradients depend on the rank, the step, the use, the element and the
 * acquired weight (so a wrong gather changes them); the reference process
 * receives their average over the ranks.  With "exact" gradients (small
 * multiples of 2^-6) every sum and average is exact, so results must be
 * bit-identical; with real-valued ones (F32) the ranks' fp32 sums differ
 * from the reference's in rounding only.
 */
#include <math.h>
#include <sys/stat.h>

#define PSTAR_EXPERIMENTAL_API 1 /* pstar_x_engine_set_gather_ahead */
#include "dist_test_util.h"

enum { N_PARAMS = 7, TOTAL_ELEMS = 700 + 300 + 37 + 200 + 900 + 2300 + 50, MAX_STEPS = 8, CHUNK = 1024 };

static const char *const k_names[N_PARAMS] = {"emb", "w1", "b1", "frozen", "w2", "big", "b2"};
static const int64_t k_numel[N_PARAMS] = {700, 300, 37, 200, 900, 2300, 50};
static const uint32_t k_flags[N_PARAMS] = {0, 0, PSTAR_PARAM_NO_WEIGHT_DECAY, PSTAR_PARAM_FROZEN, 0, 0,
                                           PSTAR_PARAM_NO_WEIGHT_DECAY};
enum { P_EMB, P_W1, P_B1, P_FROZEN, P_W2, P_BIG, P_B2 };

typedef struct scenario {
  int world;               /* ranks (the reference averages over this many) */
  pstar_dtype dtype;
  int exact;               /* exactly representable gradients */
  int steps;
  int micro;               /* micro-batches per step (needs accumulation when > 1) */
  int accumulation;
  int strict;
  float clip;
  int overflow_step;       /* the last rank's w2 gradient gets an inf at this step; 0 none */
  int diverge_step;        /* from this step on, big is used before w2 in forward; 0 never */
  int eval_after_step;     /* an EVAL iteration after this step; 0 none */
  int varied;              /* per-rank capacities, policies and non-model bytes */
  int die_rank, die_step;  /* a rank that _exits after the forward of die_step; -1 none */
  int stall;               /* instead of exiting, that rank stops answering for 5 s */
  int recompute;           /* activation checkpointing: RECOMPUTE before every backward use */
  int b1_no_backward;      /* b1 has forward uses but no backward one: its chunk is reduced at the step */
  int virtual_clock;       /* the emulated device on the modelled clock */
  int from_env;            /* ranks take rank and world from RANK/WORLD_SIZE */
  int mismatch_rank;       /* this rank registers one parameter more; -1 none */
  uint32_t comm_timeout_ms;
  uint64_t tight_capacity; /* device bytes of the tight ranks with `varied` */
  int save_step;           /* ranks (not the reference) save a checkpoint after this step; 0 none */
  int resume_step;         /* every process loads the checkpoint after build and resumes after this step */
  int crash_rank;          /* with save_step: this rank's save stops at durability point crash_point; -1 none */
  int crash_point;
  char ckpt_dir[512];
  uint32_t gather_ahead;    /* pstar_x_engine_set_gather_ahead on every process; 0 none */
  pstar_state_format state_format; /* Adam's moments' format on every process (the reference too) */
  int gather_mismatch_rank; /* this rank asks for one chunk more; -1 none */
  uint64_t slot_short_capacity; /* with gather_ahead: rank 1's device capacity; 0 unlimited */
  uint64_t nvme_host_capacity;  /* ranks (not the reference) get an NVMe tier in a directory of their
                                 * own and this host capacity; 0 none */
  int load_fault_rank;          /* with resume_step: every rank first tries a load that fails on this rank
                                 * (PSTAR_TEST_CHECKPOINT_LOAD_FAULT=load_fault there); -1 none */
  char load_fault[16];
  int sync_step;             /* ranks turn the overlapped step off (pstar_x_engine_set_overlap_step) */
  int hybrid;                /* ranks (not the reference) have hybrid optimizer placement */
  uint64_t hybrid_capacity;  /* ... and odd ranks this device capacity (0: unlimited, every chunk placed) */
  pstar_master_format master_format; /* the masters' format on every process (the reference too) */
} scenario;

typedef struct step_out {
  double grad_norm;
  int32_t skipped;
  uint32_t params_updated;
  float loss_scale;
} step_out;

typedef struct rank_out {
  int32_t status; /* first failing status, PSTAR_OK if none */
  char msg[1024];
  int32_t after_status; /* (failure test) pstar_step after the failure */
  char after_msg[1024];
  int32_t later_status; /* (failure test) an acquire after that */
  int32_t save_status;  /* the checkpoint save's status */
  char save_msg[1024];
  int32_t load_status;  /* (load_fault_rank) the failing load's status */
  char load_msg[1024];
  int32_t load_unchanged;    /* ... every value, hyperparameter and the step as before it */
  int32_t load_after_status; /* ... then pstar_iteration_begin (read faults only) */
  char load_after_msg[1024];
  double fail_seconds;  /* (failure test) from the end of forward to the failure */
  int32_t reported;     /* (failure test) this survivor has recorded its failure */
  pstar_stats stats;
  pstar_x_gather_stats gstats;
  pstar_x_nvme_stats nstats;
  pstar_x_step_stats xstats;
  step_out steps[MAX_STEPS];
  uint64_t use_hash[MAX_STEPS]; /* hash of everything acquired in the step */
  float params[TOTAL_ELEMS];
} rank_out;

typedef struct job {
  const scenario *sc;
  rank_out *out; /* world + 1 entries: ranks, then the reference */
} job;

/* ------------------------------------------------------------------------ */
/* Values                                                                    */
/* ------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

static float f32_load(const void *p, pstar_dtype dt, size_t i) {
  if (dt == PSTAR_DTYPE_F32) return ((const float *)p)[i];
  const uint16_t h = ((const uint16_t *)p)[i];
  if (dt == PSTAR_DTYPE_BF16) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  /* fp16, exact widening */
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (e == 0) return sign * ldexpf((float)m, -24);
  if (e == 31) return m ? NAN : sign * INFINITY;
  return sign * ldexpf((float)(m | 0x400), e - 25);
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Rank r's gradient for element i of parameter pid at (step, micro, use),
 * given the acquired weight w. */
static float grad_of(const scenario *sc, int r, int step, int micro, int use, int pid, size_t i, float w) {
  const uint64_t h = mix64(mix64(mix64(mix64(mix64((uint64_t)r + 1, (uint64_t)step), (uint64_t)micro), (uint64_t)use),
                                 (uint64_t)pid),
                           (uint64_t)i);
  if (sc->exact) {
    int k = (int)(h % 9u) - 4;
    if (f32_bits(w) & 0x10000u) k += 1; /* depends on the gathered weight */
    return ldexpf((float)k, -6);
  }
  const float u = (float)((h >> 11) & 0xffffffu) / 16777216.0f;
  return (2.0f * u - 1.0f) * 0.5f + w * 0.01f;
}

/* The gradient handed over by `rank` (or, for the reference, the average
 * over the scenario's ranks, summed in rank order). */
static void make_grad(const scenario *sc, int ref, int rank, int step, int micro, int use, int pid, const void *w,
                      pstar_dtype dt, float *g, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float wi = f32_load(w, dt, i);
    if (!ref) {
      g[i] = grad_of(sc, rank, step, micro, use, pid, i, wi);
    } else if (sc->exact) {
      double s = 0.0;
      for (int r = 0; r < sc->world; ++r) s += grad_of(sc, r, step, micro, use, pid, i, wi);
      g[i] = (float)(s / sc->world);
    } else {
      float s = 0.0f;
      for (int r = 0; r < sc->world; ++r) s += grad_of(sc, r, step, micro, use, pid, i, wi);
      g[i] = s / (float)sc->world;
    }
  }
  if (pid == P_W2 && step == sc->overflow_step && (ref || rank == sc->world - 1)) g[0] = INFINITY;
}

/* ------------------------------------------------------------------------ */
/* One rank (or the reference)                                               */
/* ------------------------------------------------------------------------ */

#define CK(call)                                                                                     \
  do {                                                                                               \
    const pstar_status st_ = (call);                                                                 \
    if (st_ != PSTAR_OK) {                                                                           \
      if (out->status == PSTAR_OK) {                                                                 \
        out->status = st_;                                                                           \
        snprintf(out->msg, sizeof out->msg, "line %d: %s -> %s: %s", __LINE__, #call,                \
                 pstar_status_name(st_), pstar_last_error_message());                                \
      }                                                                                              \
      goto fail;                                                                                     \
    }                                                                                                \
  } while (0)

typedef struct rank_ctx {
  const scenario *sc;
  int ref, rank;
  pstar_engine *e;
  uint32_t ids[N_PARAMS];
  pstar_dtype dt;
  uint64_t hash;
  float g[2560];
  uint64_t nonmodel;
} rank_ctx;

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

static size_t dt_size(pstar_dtype dt) { return dt == PSTAR_DTYPE_F32 ? 4u : 2u; }

/* Non-model bytes this rank reports (different per rank with `varied`). */
static uint64_t nonmodel_for(const rank_ctx *c, int level) {
  if (!c->sc->varied || c->ref) return 0;
  return (uint64_t)level * (uint64_t)(c->rank * 3 + 1) * 192u;
}

static pstar_status use_param(rank_ctx *c, rank_out *out, int pid, pstar_stage stage, int step, int micro, int use) {
  void *w = NULL;
  pstar_status st = pstar_param_acquire(c->e, c->ids[pid], stage, NULL, &w);
  if (st != PSTAR_OK) return st;
  c->hash = hash_bytes(mix64(c->hash, (uint64_t)pid), w, (size_t)k_numel[pid] * dt_size(c->dt));
  if (stage == PSTAR_STAGE_BACKWARD && !(k_flags[pid] & PSTAR_PARAM_FROZEN)) {
    make_grad(c->sc, c->ref, c->rank, step, micro, use, pid, w, c->dt, c->g, (size_t)k_numel[pid]);
    st = pstar_grad_write(c->e, c->ids[pid], c->g, (uint64_t)k_numel[pid], PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL);
    if (st != PSTAR_OK) return st;
  }
  (void)out;
  return pstar_param_release(c->e, c->ids[pid], NULL);
}

static const int k_fwd[] = {P_EMB, P_W1, P_B1, P_FROZEN, P_W2, P_BIG, P_B2, P_EMB};
static const int k_fwd_diverged[] = {P_EMB, P_W1, P_B1, P_FROZEN, P_BIG, P_W2, P_B2, P_EMB};
enum { N_USES = 8 };

static pstar_status forward(rank_ctx *c, rank_out *out, int step, int micro, int eval) {
  const int *order = (c->sc->diverge_step && step >= c->sc->diverge_step) ? k_fwd_diverged : k_fwd;
  for (int u = 0; u < N_USES; ++u) {
    pstar_status st = pstar_nonmodel_report(c->e, nonmodel_for(c, u + 1));
    if (st != PSTAR_OK) return st;
    st = use_param(c, out, order[u], PSTAR_STAGE_FORWARD, step, micro, eval ? 100 + u : u);
    if (st != PSTAR_OK) return st;
  }
  return PSTAR_OK;
}

static pstar_status backward(rank_ctx *c, rank_out *out, int step, int micro) {
  const int *order = (c->sc->diverge_step && step >= c->sc->diverge_step) ? k_fwd_diverged : k_fwd;
  for (int u = N_USES - 1; u >= 0; --u) {
    pstar_status st;
    if (c->sc->recompute) {
      st = use_param(c, out, order[u], PSTAR_STAGE_RECOMPUTE, step, micro, 30 + u);
      if (st != PSTAR_OK) return st;
    }
    if (c->sc->b1_no_backward && order[u] == P_B1) continue;
    st = use_param(c, out, order[u], PSTAR_STAGE_BACKWARD, step, micro, 50 + u);
    if (st != PSTAR_OK) return st;
    st = pstar_nonmodel_report(c->e, nonmodel_for(c, u));
    if (st != PSTAR_OK) return st;
  }
  return PSTAR_OK;
}

static void initial_values(int pid, float *v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = mix64(mix64(999, (uint64_t)pid), (uint64_t)i);
    v[i] = ((float)((h >> 11) & 0xffffffu) / 16777216.0f - 0.5f) * 0.2f;
  }
}

/* Runs the scenario on one rank (ref: the one-process reference). */
static int run_one(const scenario *sc, int ref, int rank, rank_out *out) {
  rank_ctx *c = (rank_ctx *)calloc(1, sizeof *c);
  float *vals = (float *)calloc(TOTAL_ELEMS, sizeof(float));
  pstar_engine_options o;
  out->status = PSTAR_OK;
  if (c == NULL || vals == NULL) return 2;
  c->sc = sc;
  c->ref = ref;
  c->rank = rank;
  c->dt = sc->dtype;
  CK(pstar_engine_options_init(&o));
  o.compute_dtype = sc->dtype;
  o.chunk_elems = CHUNK;
  o.threads = 1;
  o.lr = 0.01f;
  o.weight_decay = 0.1f;
  o.adamw = 1;
  o.clip_norm = sc->clip;
  o.grad_accumulation = sc->accumulation;
  o.strict = sc->strict;
  o.strict_seed = 7 + (uint64_t)rank;
  o.comm_timeout_ms = sc->comm_timeout_ms;
  o.virtual_clock = sc->virtual_clock;
  o.state_format = sc->state_format;
  o.master_format = sc->master_format;
  o.master_seed = 77;
  if (ref) {
    o.world_size = 1;
  } else if (sc->from_env) {
    char buf[16];
    snprintf(buf, sizeof buf, "%d", rank);
    setenv("RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", sc->world);
    setenv("WORLD_SIZE", buf, 1);
    o.world_size = 0;
  } else {
    o.rank = rank;
    o.world_size = sc->world;
  }
  if (sc->varied && !ref) {
    /* Ranks differ in capacity, policy and prefetch: placement differs,
     * collectives must not. */
    static const pstar_policy policies[4] = {PSTAR_POLICY_OPT, PSTAR_POLICY_LRU, PSTAR_POLICY_STATIC,
                                             PSTAR_POLICY_OPT};
    o.placement_policy = policies[rank % 4];
    o.prefetch = rank % 4 != 3;
    /* Tight ranks: at big's backward use (non-model bytes then at level
     * 6) the emb chunk must leave for the jumbo chunk and its gradient. */
    o.device_capacity_bytes = rank % 2 == 0 ? 0 : sc->tight_capacity + nonmodel_for(c, 6);
    if (rank % 4 == 2) o.device_capacity_bytes = 2 * sc->tight_capacity;
  }
  if (sc->slot_short_capacity != 0 && rank == 1 && !ref) o.device_capacity_bytes = sc->slot_short_capacity;
  if (sc->nvme_host_capacity != 0 && !ref) o.host_capacity_bytes = sc->nvme_host_capacity;
  if (sc->hybrid && !ref) {
    o.hybrid_optimizer = 1;
    if (rank % 2 == 1) o.device_capacity_bytes = sc->hybrid_capacity;
  }
  CK(pstar_engine_create(&o, &c->e));
  if (sc->sync_step && !ref) CK(pstar_x_engine_set_overlap_step(c->e, 0));
  if (sc->gather_ahead != 0) {
    CK(pstar_x_engine_set_gather_ahead(c->e, sc->gather_ahead + (rank == sc->gather_mismatch_rank && !ref)));
  }
  char nvme_dir[512] = {0};
  if (sc->nvme_host_capacity != 0 && !ref) {
    /* Each rank its own directory (the engine's data file goes in it and
     * is removed when the engine is destroyed). */
    pstar_x_nvme_options n;
    snprintf(nvme_dir, sizeof nvme_dir, "%s/dist-nvme-%d-r%d", PSTAR_TEST_TMP_DIR, (int)getpid(), rank);
    if (mkdir(nvme_dir, 0755) != 0) goto fail;
    CK(pstar_x_nvme_options_init(&n));
    n.dir = nvme_dir;
    CK(pstar_x_engine_set_nvme(c->e, &n));
  }
  for (int p = 0; p < N_PARAMS; ++p) {
    CK(pstar_param_register(c->e, k_names[p], 1, &k_numel[p], k_flags[p], &c->ids[p]));
  }
  if (rank == sc->mismatch_rank && !ref) {
    uint32_t extra;
    const int64_t n = 10;
    CK(pstar_param_register(c->e, "extra", 1, &n, 0, &extra));
  }
  CK(pstar_engine_build(c->e));
  for (int p = 0; p < N_PARAMS; ++p) {
    initial_values(p, vals, (size_t)k_numel[p]);
    CK(pstar_param_write(c->e, c->ids[p], vals, (uint64_t)k_numel[p], PSTAR_DTYPE_F32));
  }
  if (sc->resume_step > 0 && sc->load_fault_rank >= 0 && !ref) {
    /* A load that fails on one rank: every rank fails; after a refusal
     * (before anything is written) every rank's state is as it was; after a
     * failure part way every rank refuses to train until a load completes. */
    float *before = (float *)calloc(2 * TOTAL_ELEMS, sizeof(float));
    double hp[2][8];
    if (before == NULL) goto fail;
    for (int k = 0; k < 2; ++k) {
      if (k == 1) {
        if (rank == sc->load_fault_rank) setenv("PSTAR_TEST_CHECKPOINT_LOAD_FAULT", sc->load_fault, 1);
        out->load_status = pstar_checkpoint_load(c->e, sc->ckpt_dir);
        snprintf(out->load_msg, sizeof out->load_msg, "%s", pstar_last_error_message());
        unsetenv("PSTAR_TEST_CHECKPOINT_LOAD_FAULT");
      }
      size_t off = 0;
      for (int p = 0; p < N_PARAMS; ++p) { /* collective */
        CK(pstar_param_read(c->e, c->ids[p], before + k * TOTAL_ELEMS + off, (uint64_t)k_numel[p], PSTAR_DTYPE_F32));
        off += (size_t)k_numel[p];
      }
      for (int h = 0; h < 8; ++h) CK(pstar_hparam_get(c->e, (pstar_hparam)h, &hp[k][h]));
    }
    out->load_unchanged = memcmp(before, before + TOTAL_ELEMS, TOTAL_ELEMS * sizeof(float)) == 0 &&
                          memcmp(hp[0], hp[1], sizeof hp[0]) == 0;
    free(before);
    if (strncmp(sc->load_fault, "read:", 5) == 0) {
      out->load_after_status = pstar_iteration_begin(c->e, PSTAR_ITERATION_TRAIN);
      snprintf(out->load_after_msg, sizeof out->load_after_msg, "%s", pstar_last_error_message());
    }
  }
  if (sc->resume_step > 0) CK(pstar_checkpoint_load(c->e, sc->ckpt_dir));
  for (int s = sc->resume_step + 1; s <= sc->steps; ++s) {
    pstar_step_result r;
    c->hash = 0;
    CK(pstar_iteration_begin(c->e, PSTAR_ITERATION_TRAIN));
    for (int m = 0; m < sc->micro; ++m) {
      CK(forward(c, out, s, m, 0));
      if (s == sc->die_step && !ref) {
        if (rank == sc->die_rank && sc->stall) {
          sleep(5); /* alive, silent, its connections open */
          _exit(4);
        }
        if (rank == sc->die_rank) _exit(3); /* gone mid-step, without a word */
        const double t0 = d_now();
        pstar_status st = backward(c, out, s, m);
        if (st == PSTAR_OK) {
          pstar_step_result_init(&r);
          st = pstar_step(c->e, &r);
        }
        out->fail_seconds = d_now() - t0;
        out->status = st;
        snprintf(out->msg, sizeof out->msg, "%s", pstar_last_error_message());
        out->after_status = pstar_step(c->e, NULL);
        snprintf(out->after_msg, sizeof out->after_msg, "%s", pstar_last_error_message());
        void *w = NULL;
        out->later_status = pstar_param_acquire(c->e, c->ids[P_W1], PSTAR_STAGE_FORWARD, NULL, &w);
        /* Survivors stay until every survivor has its failure: rank 0
         * serves the store that the others' diagnoses read, and a rank
         * whose collective times out later must still find it (out is
         * this rank's entry of the shared array). */
        __atomic_store_n(&out->reported, 1, __ATOMIC_SEQ_CST);
        const double wait_end = d_now() + 15.0;
        for (int q = 0; q < sc->world && d_now() < wait_end; ++q) {
          if (q == sc->die_rank) continue;
          while (!__atomic_load_n(&(out - rank + q)->reported, __ATOMIC_SEQ_CST) && d_now() < wait_end) usleep(2000);
        }
        pstar_engine_destroy(c->e);
        free(c);
        free(vals);
        return 0;
      }
      CK(backward(c, out, s, m));
    }
    CK(pstar_step_result_init(&r));
    CK(pstar_step(c->e, &r));
    out->steps[s - 1].grad_norm = r.grad_norm;
    out->steps[s - 1].skipped = r.skipped;
    out->steps[s - 1].params_updated = r.params_updated;
    out->steps[s - 1].loss_scale = r.loss_scale;
    out->use_hash[s - 1] = c->hash;
    if (s == sc->save_step && !ref) {
      char point[8];
      snprintf(point, sizeof point, "%d", sc->crash_point);
      if (rank == sc->crash_rank) setenv("PSTAR_TEST_CHECKPOINT_CRASH_AT", point, 1);
      out->save_status = pstar_checkpoint_save(c->e, sc->ckpt_dir);
      snprintf(out->save_msg, sizeof out->save_msg, "%s", pstar_last_error_message());
      unsetenv("PSTAR_TEST_CHECKPOINT_CRASH_AT");
    }
    if (s == sc->eval_after_step) {
      CK(pstar_iteration_begin(c->e, PSTAR_ITERATION_EVAL));
      CK(forward(c, out, s, 0, 1));
      CK(pstar_nonmodel_report(c->e, 0));
      CK(pstar_iteration_end(c->e));
    }
  }
  {
    size_t off = 0;
    for (int p = 0; p < N_PARAMS; ++p) { /* collective with world > 1 */
      CK(pstar_param_read(c->e, c->ids[p], out->params + off, (uint64_t)k_numel[p], PSTAR_DTYPE_F32));
      off += (size_t)k_numel[p];
    }
  }
  CK(pstar_stats_init(&out->stats));
  CK(pstar_engine_get_stats(c->e, &out->stats));
  CK(pstar_x_step_stats_init(&out->xstats));
  CK(pstar_x_step_get_stats(c->e, &out->xstats));
  CK(pstar_x_gather_stats_init(&out->gstats));
  CK(pstar_x_gather_get_stats(c->e, &out->gstats));
  if (nvme_dir[0] != 0) {
    CK(pstar_x_nvme_stats_init(&out->nstats));
    CK(pstar_x_nvme_get_stats(c->e, &out->nstats));
  }
  CK(pstar_engine_destroy(c->e));
  if (nvme_dir[0] != 0) rmdir(nvme_dir);
  free(c);
  free(vals);
  return 0;
fail:
  pstar_engine_destroy(c->e);
  free(c);
  free(vals);
  return 1;
}

static int rank_main(int rank, void *arg) {
  const job *j = (const job *)arg;
  return run_one(j->sc, 0, rank, &j->out[rank]);
}

static int ref_main(int rank, void *arg) {
  const job *j = (const job *)arg;
  (void)rank;
  return run_one(j->sc, 1, 0, &j->out[j->sc->world]);
}

/* Runs the ranks and the reference; returns the shared results. */
static int g_status[D_MAX_RANKS]; /* wait statuses of the last run's ranks */

static rank_out *run_scenario(const scenario *sc, int expect_ok) {
  rank_out *out = (rank_out *)d_shared((size_t)(sc->world + 1) * sizeof(rank_out));
  job j = {sc, out};
  int *status = g_status;
  const int failed = d_run_ranks(sc->world, rank_main, &j, 60.0, status);
  cr_assert_leq(failed, sc->world, "ranks hung (killed after 60 s)");
  if (expect_ok) {
    for (int r = 0; r < sc->world; ++r) {
      cr_assert_eq(out[r].status, PSTAR_OK, "rank %d: %s", r, out[r].msg);
      cr_assert(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0, "rank %d exited with status %d", r,
                status[r]);
    }
    int rs[1];
    cr_assert_eq(d_run_ranks(1, ref_main, &j, 60.0, rs), 0, "reference: %s", out[sc->world].msg);
  }
  return out;
}

static int ulp_raw(float a, float b);

/* Distance in units in the last place of fp32 at the values' scale: raw
 * ulps, except that values below 1/16 in magnitude count in ulps of 1/16.
 * Parameters start in [-0.1, 0.1] and move by about lr per step, so some
 * pass near zero on the way; there a difference that is a rounding of the
 * operands (ulps of about 0.1) is thousands of ulps of the tiny result. */
static int ulp_distance(float a, float b) {
  const float floor_ = 0.0625f;
  if (fabsf(a) >= floor_ || fabsf(b) >= floor_) return ulp_raw(a, b);
  const double ulp_at_floor = ldexp(1.0, -4 - 23);
  return (int)ceil(fabs((double)a - (double)b) / ulp_at_floor);
}

static int ulp_raw(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, sizeof ia);
  memcpy(&ib, &b, sizeof ib);
  if (ia < 0) ia = INT32_MIN - ia;
  if (ib < 0) ib = INT32_MIN - ib;
  const int64_t d = (int64_t)ia - (int64_t)ib;
  return (int)(d < 0 ? -d : d);
}

/* Every rank's values, step results and acquired contents equal the
 * reference's: bit for bit (max_ulp 0), or within max_ulp of fp32. */
static void expect_equal_to_reference(const scenario *sc, const rank_out *out, int max_ulp) {
  const rank_out *ref = &out[sc->world];
  for (int r = 0; r < sc->world; ++r) {
    int worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < TOTAL_ELEMS; ++i) {
      const int d = ulp_distance(out[r].params[i], ref->params[i]);
      if (d > worst) {
        worst = d;
        worst_i = i;
      }
    }
    cr_assert_leq(worst, max_ulp, "rank %d of %d: element %zu is %d ulp from the reference (%.9g vs %.9g)", r,
                  sc->world, worst_i, worst, (double)out[r].params[worst_i], (double)ref->params[worst_i]);
    for (int s = 0; s < sc->steps; ++s) {
      cr_assert_eq(out[r].steps[s].skipped, ref->steps[s].skipped, "rank %d step %d", r, s + 1);
      cr_assert_eq(out[r].steps[s].params_updated, ref->steps[s].params_updated, "rank %d step %d", r, s + 1);
      cr_assert_eq(out[r].steps[s].loss_scale, ref->steps[s].loss_scale, "rank %d step %d", r, s + 1);
      if (max_ulp == 0) {
        cr_assert_eq(out[r].steps[s].grad_norm, ref->steps[s].grad_norm, "rank %d step %d: norm %.17g vs %.17g", r,
                     s + 1, out[r].steps[s].grad_norm, ref->steps[s].grad_norm);
        cr_assert_eq(out[r].use_hash[s], ref->use_hash[s], "rank %d step %d: acquired contents differ", r, s + 1);
      } else {
        cr_assert(fabs(out[r].steps[s].grad_norm - ref->steps[s].grad_norm) <= 1e-6 * ref->steps[s].grad_norm,
                  "rank %d step %d: norm %.17g vs %.17g", r, s + 1, out[r].steps[s].grad_norm,
                  ref->steps[s].grad_norm);
      }
    }
    /* Every rank issued the same collectives. */
    cr_assert_eq(out[r].stats.collectives, out[0].stats.collectives, "rank %d", r);
    cr_assert_eq(out[r].stats.bytes_all_gathered, out[0].stats.bytes_all_gathered, "rank %d", r);
    cr_assert_eq(out[r].stats.bytes_reduce_scattered, out[0].stats.bytes_reduce_scattered, "rank %d", r);
    cr_assert_eq(out[r].stats.rank, r);
    cr_assert_eq(out[r].stats.world_size, sc->world);
  }
  cr_assert_eq(ref->stats.world_size, 1);
  cr_assert_eq(ref->stats.collectives, 0);
}

static scenario base(int world, pstar_dtype dtype) {
  scenario sc;
  memset(&sc, 0, sizeof sc);
  sc.world = world;
  sc.dtype = dtype;
  sc.exact = 1;
  sc.steps = 4;
  sc.micro = 1;
  sc.die_rank = -1;
  sc.mismatch_rank = -1;
  sc.crash_rank = -1;
  sc.gather_mismatch_rank = -1;
  sc.load_fault_rank = -1;
  sc.comm_timeout_ms = 20000;
  return sc;
}

/* ------------------------------------------------------------------------ */
/* (a) bit-identical to one process on exactly representable gradients       */
/* ------------------------------------------------------------------------ */

Test(dist_engine, two_ranks_bf16_strict_bit_identical) {
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.strict = 1;
  sc.eval_after_step = 2;
  rank_out *out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  for (int s = 0; s < sc.steps; ++s) cr_assert_eq(out[0].steps[s].params_updated, 6);
  /* Per iteration: forward gathers emb twice and every other chunk once,
   * backward every chunk once more; every trainable chunk is reduced once. */
  cr_assert_gt(out[0].stats.bytes_all_gathered, 0);
  cr_assert_gt(out[0].stats.bytes_reduce_scattered, 0);
}

Test(dist_engine, four_ranks_bf16_bit_identical) {
  scenario sc = base(4, PSTAR_DTYPE_BF16);
  sc.eval_after_step = 1;
  expect_equal_to_reference(&sc, run_scenario(&sc, 1), 0);
}

Test(dist_engine, four_ranks_f16_overflow_skips_everywhere_and_clipping) {
  scenario sc = base(4, PSTAR_DTYPE_F16);
  sc.overflow_step = 2;
  sc.clip = 1e-3f; /* the exact norm makes the clip factor exact too */
  rank_out *out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  cr_assert_eq(out[0].steps[1].skipped, 1, "the inf on the last rank skips every rank's step");
  cr_assert_eq(out[1].steps[1].skipped, 1);
}

Test(dist_engine, two_ranks_gradient_accumulation_two_micro_batches) {
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.accumulation = 1;
  sc.micro = 2;
  sc.steps = 3;
  expect_equal_to_reference(&sc, run_scenario(&sc, 1), 0);
}

Test(dist_engine, trace_divergence_changes_placement_not_collectives) {
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.steps = 5;
  sc.diverge_step = 3; /* every rank changes its order at step 3 */
  sc.varied = 1;
  sc.tight_capacity = 18 * 1024;
  rank_out *out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  cr_assert_eq(out[0].stats.trace_fallbacks, 1, "OPT rank 0 falls back once");
}

Test(dist_engine, recompute_and_a_parameter_without_backward) {
  for (int world = 2; world <= 4; world += 2) {
    scenario sc = base(world, PSTAR_DTYPE_BF16);
    sc.recompute = 1;
    sc.b1_no_backward = 1;
    sc.strict = world == 2;
    rank_out *out = run_scenario(&sc, 1);
    expect_equal_to_reference(&sc, out, 0);
    cr_assert_eq(out[0].steps[0].params_updated, 5, "b1 had no gradient");
  }
  /* With accumulation w1's chunk never completes its backward (b1 has
   * none): w1's gradient waits in its buffer across micro-batches and is
   * reduced at the step.  On the virtual clock. */
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.b1_no_backward = 1;
  sc.accumulation = 1;
  sc.micro = 2;
  sc.virtual_clock = 1;
  rank_out *out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  cr_assert_eq(out[0].steps[0].params_updated, 5);
}

Test(dist_engine, world_from_the_environment) {
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.steps = 2;
  sc.from_env = 1;
  expect_equal_to_reference(&sc, run_scenario(&sc, 1), 0);
}

/* ------------------------------------------------------------------------ */
/* (b) real-valued gradients: within 4 ulp of fp32 after M steps             */
/* ------------------------------------------------------------------------ */

Test(dist_engine, real_gradients_within_4_ulp_two_and_four_ranks) {
  for (int world = 2; world <= 4; world += 2) {
    scenario sc = base(world, PSTAR_DTYPE_F32);
    sc.exact = 0;
    sc.steps = 6;
    rank_out *out = run_scenario(&sc, 1);
    expect_equal_to_reference(&sc, out, 4);
    int differing = 0, raw = 0;
    double worst_abs = 0.0;
    for (size_t i = 0; i < TOTAL_ELEMS; ++i) {
      differing += out[0].params[i] != out[world].params[i];
      const int d = ulp_raw(out[0].params[i], out[world].params[i]);
      raw = d > raw ? d : raw;
      const double a = fabs((double)out[0].params[i] - (double)out[world].params[i]);
      worst_abs = a > worst_abs ? a : worst_abs;
    }
    cr_log_info("%d ranks, real gradients, %d steps: %d of %d elements differ from one process; largest "
                "difference %.3g (raw ulps of the smaller values up to %d)",
                world, sc.steps, differing, TOTAL_ELEMS, worst_abs, raw);
  }
}

/* ------------------------------------------------------------------------ */
/* (c) memory: each rank's peak model-data bytes                             */
/* ------------------------------------------------------------------------ */

/* Host: this rank's shards of every list (compute dtype, fp32 master, m, v,
 * and the fp32 gradient list with accumulation: the full lists / N) plus
 * the reduce-scatter's fp32 staging for the largest trainable chunk C and
 * its output shard (4 C + 4 C / N); gathered chunks stay on the (unlimited)
 * device.  Device chunks: at most the gathered chunks in flight: through
 * backward the tied emb chunk waits for its second backward use while the
 * others pass one at a time, the largest being the jumbo chunk. */
static void expect_memory_formula(int world, int accumulation) {
  scenario sc = base(world, PSTAR_DTYPE_BF16);
  sc.accumulation = accumulation;
  sc.steps = 2;
  rank_out *out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  const uint64_t lists = accumulation ? 4 : 3;
  const uint64_t jumbo = (2300 + 128u * (uint64_t)world - 1) / (128u * (uint64_t)world) * (128u * (uint64_t)world);
  const uint64_t chunk_elems[6] = {CHUNK, CHUNK, CHUNK, CHUNK, jumbo, CHUNK}; /* emb w1b1 frozen w2 big b2 */
  const uint64_t trainable_elems = 4 * CHUNK + jumbo;
  uint64_t all_elems = 0;
  for (int k = 0; k < 6; ++k) all_elems += chunk_elems[k];
  for (int r = 0; r < world; ++r) {
    const pstar_stats *s = &out[r].stats;
    cr_assert_eq(s->compute_list_bytes, all_elems * 2, "rank %d", r);
    cr_assert_eq(s->optimizer_list_bytes, trainable_elems * 4, "rank %d", r);
    const uint64_t shards = (s->compute_list_bytes + lists * s->optimizer_list_bytes) / (uint64_t)world;
    const uint64_t staging = 4 * jumbo + 4 * jumbo / (uint64_t)world;
    cr_assert_eq(s->peak_host_bytes, shards + staging, "rank %d of %d: peak host %llu, formula %llu", r, world,
                 (unsigned long long)s->peak_host_bytes, (unsigned long long)(shards + staging));
    cr_assert_eq(s->host_bytes, shards + staging, "rank %d", r);
    cr_assert_eq(s->peak_device_chunk_bytes, (CHUNK + jumbo) * 2, "rank %d of %d: peak gathered %llu", r, world,
                 (unsigned long long)s->peak_device_chunk_bytes);
    cr_assert_eq(s->evictions, 0);
  }
  const pstar_stats *one = &out[world].stats;
  cr_log_info("%d ranks%s: host model data per rank %llu bytes, one process %llu", world,
              accumulation ? " (accumulation)" : "", (unsigned long long)out[0].stats.peak_host_bytes,
              (unsigned long long)one->peak_host_bytes);
}

Test(dist_engine, memory_formula_two_and_four_ranks) {
  expect_memory_formula(2, 0);
  expect_memory_formula(4, 0);
  expect_memory_formula(2, 1);
}

/* ------------------------------------------------------------------------ */
/* (d) different capacities, policies and non-model reports                  */
/* ------------------------------------------------------------------------ */

Test(dist_engine, ranks_with_different_capacities_agree_and_finish) {
  scenario sc = base(4, PSTAR_DTYPE_BF16);
  sc.varied = 1;
  sc.steps = 5;
  sc.strict = 1;
  sc.tight_capacity = 18 * 1024;
  rank_out *out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  cr_assert_eq(out[0].stats.evictions, 0, "rank 0 has an unlimited device");
  cr_assert_gt(out[1].stats.evictions, 0, "rank 1's gathered chunks are evicted to the host (moved, not dropped)");
  cr_assert_gt(out[3].stats.evictions, 0);
  for (int r = 0; r < 4; ++r) {
    cr_log_info("rank %d: capacity policy %d, evictions %llu, device peak %llu, host peak %llu", r, r % 4,
                (unsigned long long)out[r].stats.evictions, (unsigned long long)out[r].stats.peak_device_bytes,
                (unsigned long long)out[r].stats.peak_host_bytes);
  }
}

/* ------------------------------------------------------------------------ */
/* Gathering ahead (pstar_x_engine_set_gather_ahead)                         */
/* ------------------------------------------------------------------------ */

/* Per TRAIN iteration the model gathers: forward emb, w1b1, frozen, w2, big,
 * b2, emb again (dropped after its first use); backward every chunk once
 * more (emb stays gathered from its second forward use until its backward
 * ends); with RECOMPUTE before every backward use, more.  The first TRAIN
 * iteration records them, the later ones gather ahead. */
static void expect_gathered_ahead(const scenario *sc, const rank_out *out) {
  for (int r = 0; r < sc->world; ++r) {
    const pstar_x_gather_stats *g = &out[r].gstats;
    cr_assert_eq(g->depth, sc->gather_ahead, "rank %d", r);
    cr_assert_eq(g->slot_bytes, (uint64_t)sc->gather_ahead * CHUNK * dt_size(sc->dtype), "rank %d", r);
    cr_assert(g->schedule_ready, "rank %d", r);
    /* Every iteration after the first (but the diverging one) gathers all
     * but the jumbo chunk (too large for a slot) ahead: at least 9 of its
     * 11 gathers (more with RECOMPUTE). */
    const uint64_t following = (uint64_t)(sc->steps - 1 - (sc->diverge_step ? 1 : 0));
    cr_assert_geq(g->gathers_ahead, 9 * following, "rank %d: %llu ahead in %llu following iterations", r,
                  (unsigned long long)g->gathers_ahead, (unsigned long long)following);
    cr_assert_gt(g->gathers_on_demand, 0, "rank %d: the recorded iteration and the jumbo chunk", r);
    cr_assert_eq(g->gathers_ahead, out[0].gstats.gathers_ahead, "every rank issues the same gathers");
    cr_assert_eq(g->gathers_on_demand, out[0].gstats.gathers_on_demand);
    cr_assert_eq(out[r].stats.collectives, out[0].stats.collectives);
    cr_assert_eq(out[r].stats.bytes_all_gathered, out[0].stats.bytes_all_gathered);
  }
  /* One process has no group: the option does nothing there. */
  cr_assert_eq(out[sc->world].gstats.depth, 0);
  cr_assert_eq(out[sc->world].gstats.gathers_ahead, 0);
  cr_log_info("%d ranks, depth %u: %llu gathers ahead (%llu waited for, %.4f s), %llu at the acquire, %llu "
              "fallbacks", sc->world, sc->gather_ahead, (unsigned long long)out[0].gstats.gathers_ahead,
              (unsigned long long)out[0].gstats.gathers_waited, out[0].gstats.wait_seconds,
              (unsigned long long)out[0].gstats.gathers_on_demand,
              (unsigned long long)out[0].gstats.schedule_fallbacks);
}

Test(dist_engine, gathering_ahead_is_bit_identical) {
  /* Two ranks, strict mode, an EVAL iteration between TRAIN ones. */
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.strict = 1;
  sc.eval_after_step = 2;
  sc.gather_ahead = 2;
  rank_out *out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  expect_gathered_ahead(&sc, out);
  for (int r = 0; r < 2; ++r) cr_assert_eq(out[r].gstats.schedule_fallbacks, 0, "rank %d", r);
  /* Host model data: the shards, and two reduce-scatter buffer pairs (one
   * reduce-scatter on the collective queue while the next is laid out):
   * the memory formula's staging term twice. */
  for (int r = 0; r < 2; ++r) {
    const pstar_stats *st = &out[r].stats;
    const uint64_t jumbo = 2304, shards = (st->compute_list_bytes + 3 * st->optimizer_list_bytes) / 2;
    cr_assert_eq(st->host_bytes, shards + 2 * (4 * jumbo + 4 * jumbo / 2), "rank %d: host %llu", r,
                 (unsigned long long)st->host_bytes);
  }
  /* Four ranks, activation checkpointing, one slot. */
  sc = base(4, PSTAR_DTYPE_BF16);
  sc.recompute = 1;
  sc.gather_ahead = 1;
  out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  expect_gathered_ahead(&sc, out);
  /* Two micro-batches per step, fp16, more slots than chunks in flight. */
  sc = base(2, PSTAR_DTYPE_F16);
  sc.accumulation = 1;
  sc.micro = 2;
  sc.steps = 3;
  sc.gather_ahead = 5;
  out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  expect_gathered_ahead(&sc, out);
}

Test(dist_engine, gathering_ahead_with_different_capacities_and_a_divergence) {
  /* Ranks differ in capacity, policy and prefetch (rank 1 tight: its
   * gathered chunks are evicted); every rank changes its forward order at
   * step 3, leaving the schedule: it records anew at step 4 and follows it
   * at step 5.  Collectives agree throughout. */
  scenario sc = base(4, PSTAR_DTYPE_BF16);
  sc.varied = 1;
  sc.strict = 1;
  sc.steps = 5;
  sc.diverge_step = 3;
  sc.tight_capacity = 22 * 1024;
  sc.gather_ahead = 2;
  rank_out *out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  for (int r = 0; r < 4; ++r) cr_assert_eq(out[r].gstats.schedule_fallbacks, 1, "rank %d", r);
  cr_assert_gt(out[1].stats.evictions, 0, "rank 1 is tight");
  scenario counted = sc;
  counted.steps = 3; /* steps 2 and 5 follow a schedule */
  counted.diverge_step = 0;
  expect_gathered_ahead(&counted, out);
}

Test(dist_engine, gathering_ahead_depths_and_room_are_checked_on_every_rank) {
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.gather_ahead = 2;
  sc.gather_mismatch_rank = 1;
  rank_out *out = run_scenario(&sc, 0);
  for (int r = 0; r < 2; ++r) {
    cr_assert_eq(out[r].status, PSTAR_ERR_INVALID_ARGUMENT, "rank %d: %s", r, out[r].msg);
    cr_assert(strstr(out[r].msg, "gather-ahead depth") != NULL, "%s", out[r].msg);
  }
  /* Rank 1's device holds one slot less than the two asked for. */
  sc = base(2, PSTAR_DTYPE_BF16);
  sc.gather_ahead = 2;
  sc.slot_short_capacity = 2 * CHUNK * 2 - 1;
  out = run_scenario(&sc, 0);
  for (int r = 0; r < 2; ++r) {
    cr_assert_eq(out[r].status, PSTAR_ERR_OUT_OF_MEMORY, "rank %d: %s", r, out[r].msg);
    cr_assert(strstr(out[r].msg, "rank(s) 1;") != NULL, "%s", out[r].msg);
  }
  /* Before build only, and at most PSTAR_X_MAX_GATHER_AHEAD. */
  pstar_engine_options o;
  pstar_engine *e = NULL;
  pstar_engine_options_init(&o);
  o.world_size = 1;
  cr_assert_eq(pstar_engine_create(&o, &e), PSTAR_OK);
  cr_assert_eq(pstar_x_engine_set_gather_ahead(e, PSTAR_X_MAX_GATHER_AHEAD + 1), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert_eq(pstar_x_engine_set_gather_ahead(e, 3), PSTAR_OK, "no effect with one process");
  cr_assert_eq(pstar_engine_build(e), PSTAR_OK);
  cr_assert_eq(pstar_x_engine_set_gather_ahead(e, 1), PSTAR_ERR_INVALID_STATE);
  pstar_x_gather_stats g;
  cr_assert_eq(pstar_x_gather_stats_init(&g), PSTAR_OK);
  g.version = PSTAR_X_GATHER_STATS_VERSION + 1;
  cr_assert_eq(pstar_x_gather_get_stats(e, &g), PSTAR_ERR_VERSION);
  cr_assert_eq(pstar_x_gather_stats_init(&g), PSTAR_OK);
  cr_assert_eq(pstar_x_gather_get_stats(e, &g), PSTAR_OK);
  cr_assert_eq(g.depth, 0);
  cr_assert_eq(pstar_engine_destroy(e), PSTAR_OK);
}

/* ------------------------------------------------------------------------ */
/* Checkpoint helpers                                                        */
/* ------------------------------------------------------------------------ */

static void remove_checkpoints(const scenario *a) {
  char cmd[sizeof a->ckpt_dir + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", a->ckpt_dir);
  cr_assert_eq(system(cmd), 0);
}

/* Gives `a` a fresh checkpoint directory named after `prefix` and the test
 * process, runs it (its ranks save at a->save_step), checks the run against
 * one process and the saves, and keeps the final parameters. */
static rank_out *run_saving(scenario *a, const char *prefix, float *uninterrupted) {
  snprintf(a->ckpt_dir, sizeof a->ckpt_dir, "%s/%s-%d", PSTAR_TEST_TMP_DIR, prefix, (int)getpid());
  remove_checkpoints(a);
  rank_out *oa = run_scenario(a, 1);
  expect_equal_to_reference(a, oa, 0);
  for (int r = 0; r < a->world; ++r) cr_assert_eq(oa[r].save_status, PSTAR_OK, "rank %d: %s", r, oa[r].save_msg);
  memcpy(uninterrupted, oa[0].params, TOTAL_ELEMS * sizeof(float));
  return oa;
}

/* Resumes `b` (its resume_step and world set) from the checkpoint: equal to
 * one process that loads it too and, when `uninterrupted` is not NULL, bit
 * for bit to the run that saved it. */
static rank_out *run_resuming(const scenario *b, const float *uninterrupted) {
  rank_out *ob = run_scenario(b, 1);
  expect_equal_to_reference(b, ob, 0);
  if (uninterrupted != NULL) {
    for (size_t i = 0; i < TOTAL_ELEMS; ++i) {
      cr_assert_eq(f32_bits(ob[0].params[i]), f32_bits(uninterrupted[i]), "element %zu: %.9g resumed, %.9g not", i,
                   (double)ob[0].params[i], (double)uninterrupted[i]);
    }
  }
  return ob;
}

/* ------------------------------------------------------------------------ */
/* The overlapped step with sharding                                         */
/* ------------------------------------------------------------------------ */

/* Each rank's host shards are updated on its update thread after pstar_step
 * returns, and each acquire waits for its chunk's update before the
 * all-gather reads the shard: parameters, norms and decisions bit-identical
 * to one process and to the synchronous step, at 2 and 3 ranks, with strict
 * mode and an EVAL iteration, fp16 with a skipped step, accumulation, and
 * hybrid placement (its device shards are done when the step returns), and
 * gathering ahead (a gather ahead of use waits for its shard's update). */
static void expect_overlapped(scenario sc, int overlaps) {
  static float sync_params[TOTAL_ELEMS];
  sc.sync_step = 1;
  rank_out *s = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, s, 0);
  memcpy(sync_params, s[0].params, sizeof sync_params);
  for (int r = 0; r < sc.world; ++r) cr_assert_eq(s[r].xstats.steps_overlapped, 0, "rank %d: synchronous", r);
  sc.sync_step = 0;
  rank_out *o = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, o, 0);
  for (size_t i = 0; i < TOTAL_ELEMS; ++i) {
    cr_assert_eq(f32_bits(o[0].params[i]), f32_bits(sync_params[i]), "element %zu: overlapped %.9g, sync %.9g", i,
                 (double)o[0].params[i], (double)sync_params[i]);
  }
  for (int r = 0; r < sc.world; ++r) {
    const pstar_x_step_stats *x = &o[r].xstats;
    cr_log_info("%d ranks%s%s%s: rank %d overlapped %llu of %d steps, %llu shard updates on its update thread",
                sc.world, sc.accumulation ? ", accumulation" : "", sc.overflow_step ? ", a skipped step" : "",
                sc.hybrid ? ", hybrid" : "", r, (unsigned long long)x->steps_overlapped, sc.steps,
                (unsigned long long)x->chunks_updated);
    if (overlaps) {
      cr_assert_eq(x->overlap, 1, "rank %d", r);
      cr_assert_gt(x->steps_overlapped, 0, "rank %d: no step overlapped", r);
    } else {
      cr_assert_eq(x->steps_overlapped, 0, "rank %d: overlapped while gathering ahead", r);
    }
  }
}

Test(dist_engine, overlapped_step_with_sharding_is_bit_identical) {
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.strict = 1;
  sc.eval_after_step = 2;
  expect_overlapped(sc, 1);
  sc = base(3, PSTAR_DTYPE_BF16);
  expect_overlapped(sc, 1);
  sc = base(2, PSTAR_DTYPE_F16);
  sc.overflow_step = 2;
  expect_overlapped(sc, 1);
  sc = base(2, PSTAR_DTYPE_BF16);
  sc.accumulation = 1;
  sc.micro = 2;
  expect_overlapped(sc, 1);
  sc = base(2, PSTAR_DTYPE_BF16);
  sc.hybrid = 1;
  sc.hybrid_capacity = 0;
  expect_overlapped(sc, 0); /* every shard placed: nothing left for the host */
  sc = base(2, PSTAR_DTYPE_BF16);
  sc.strict = 1;
  sc.gather_ahead = 2;
  expect_overlapped(sc, 1); /* the gather ahead waits for its shard's update */
  sc = base(3, PSTAR_DTYPE_BF16);
  sc.recompute = 1;
  sc.gather_ahead = 1;
  expect_overlapped(sc, 1);
}

/* ------------------------------------------------------------------------ */
/* Hybrid optimizer placement with sharding                                  */
/* ------------------------------------------------------------------------ */

/* Each rank places its own shards' optimizer state in its own margin and
 * updates them on the device; odd ranks get a capacity of `room` bytes
 * above their device peak with hybrid off and the streaming reserve (two
 * jumbo chunks), even ranks an unlimited one (room 0: odd ranks too).
 * Parameters, norms and decisions stay bit-identical to one process with
 * everything on the host; each rank's host peak falls by at least the
 * moments of the shards it placed, and its host bytes at the end by the
 * moments and compute shards, against the same run with hybrid off. */
static void expect_hybrid_shards(scenario sc, uint64_t room) {
  static rank_out off[5];
  sc.hybrid = 0;
  rank_out *o = run_scenario(&sc, 1);
  memcpy(off, o, (size_t)(sc.world + 1) * sizeof(rank_out));
  const int all_placed_on_odd = room == 0;
  const uint64_t capacity = room == 0 ? 0 : off[1].stats.peak_device_bytes + 2 * 2304 * 2 + room;
  sc.hybrid = 1;
  sc.hybrid_capacity = capacity;
  rank_out *out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  for (int r = 0; r < sc.world; ++r) {
    const pstar_stats *s = &out[r].stats;
    cr_log_info("%d ranks%s%s: rank %d placed %u of %u trainable shards (%llu bytes), host peak %llu (hybrid off: "
                "%llu), host at the end %llu (hybrid off: %llu), moved %llu + %llu bytes", sc.world,
                sc.accumulation ? ", accumulation" : "", sc.overflow_step ? ", a skipped step" : "", r,
                s->optimizer_chunks_on_device, s->optimizer_chunks, (unsigned long long)s->optimizer_device_bytes,
                (unsigned long long)s->peak_host_bytes, (unsigned long long)off[r].stats.peak_host_bytes,
                (unsigned long long)s->host_bytes, (unsigned long long)off[r].stats.host_bytes,
                (unsigned long long)s->bytes_host_to_device, (unsigned long long)s->bytes_device_to_host);
    if (r % 2 == 0 || all_placed_on_odd) {
      cr_assert_eq(s->optimizer_chunks_on_device, s->optimizer_chunks, "rank %d: every trainable shard placed", r);
    } else {
      cr_assert_gt(s->optimizer_chunks_on_device, 0, "rank %d: some placed", r);
      cr_assert_lt(s->optimizer_chunks_on_device, s->optimizer_chunks, "rank %d: not all placed", r);
      cr_assert_leq(s->peak_device_bytes, capacity, "rank %d: within its capacity", r);
    }
    /* m and v of the placed shards never on the host: 8 of each shard's
     * 12 + staging bytes per element are the moments' (state_bytes =
     * n (12 + 2 [+ 4 with accumulation])). */
    const uint64_t per_elem = 12 + 2 + (sc.accumulation ? 4 : 0);
    const uint64_t moments = s->optimizer_device_bytes / per_elem * 8;
    cr_assert_leq(s->peak_host_bytes + moments, off[r].stats.peak_host_bytes,
                  "rank %d: host peak %llu with %llu bytes of moments placed, %llu with hybrid off", r,
                  (unsigned long long)s->peak_host_bytes, (unsigned long long)moments,
                  (unsigned long long)off[r].stats.peak_host_bytes);
    /* Once placed, a shard's compute slot is on the device only (its host
     * copy goes for good): the host holds at least the moments and the
     * compute shard (2 bytes per element) of the placed shards less. */
    const uint64_t left_host = s->optimizer_device_bytes / per_elem * (8 + 2);
    cr_assert_leq(s->host_bytes + left_host, off[r].stats.host_bytes,
                  "rank %d: host %llu at the end with %llu bytes of moments and compute shards placed, %llu with "
                  "hybrid off", r, (unsigned long long)s->host_bytes, (unsigned long long)left_host,
                  (unsigned long long)off[r].stats.host_bytes);
    /* Nothing is copied back at the step: the weights stay in the slot. */
    cr_assert_eq(s->bytes_device_to_host, off[r].stats.bytes_device_to_host, "rank %d: no copy back", r);
    cr_assert_gt(s->bytes_host_to_device, off[r].stats.bytes_host_to_device, "rank %d: the shards' copies count", r);
  }
}

Test(dist_engine, hybrid_placement_with_sharding_is_bit_identical) {
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.strict = 1;
  sc.eval_after_step = 2;
  expect_hybrid_shards(sc, 0);
  sc = base(3, PSTAR_DTYPE_BF16);
  expect_hybrid_shards(sc, 0);
}

Test(dist_engine, hybrid_placement_with_sharding_skipped_steps_and_accumulation) {
  scenario sc = base(2, PSTAR_DTYPE_F16);
  sc.overflow_step = 2;
  expect_hybrid_shards(sc, 0);
  sc = base(2, PSTAR_DTYPE_BF16);
  sc.accumulation = 1;
  sc.micro = 2;
  expect_hybrid_shards(sc, 0);
}

/* Gathering ahead copies a placed shard's compute slot into a gather slot
 * on the device, and the overlapped step's host updates run beside it. */
Test(dist_engine, hybrid_placement_with_sharding_and_gathering_ahead) {
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.strict = 1;
  sc.gather_ahead = 2;
  expect_hybrid_shards(sc, 0);
  sc = base(2, PSTAR_DTYPE_BF16);
  sc.gather_ahead = 1;
  expect_hybrid_shards(sc, 512 * 14 * 5 / 2);
}

/* A rank whose capacity holds some of its shards' state but not all. */
Test(dist_engine, hybrid_placement_with_sharding_in_a_small_margin) {
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.strict = 1;
  expect_hybrid_shards(sc, 512 * 14 * 5 / 2); /* two and a half regular shards' state */
}

/* A checkpoint saved by ranks with state on their devices resumes bit for
 * bit, at 2 ranks with hybrid placement again and at 3 without. */
Test(dist_engine, hybrid_placement_with_sharding_checkpoints_resume_exactly) {
  static float uninterrupted[TOTAL_ELEMS];
  scenario a = base(2, PSTAR_DTYPE_BF16);
  a.steps = 5;
  a.save_step = 2;
  a.hybrid = 1;
  rank_out *oa = run_saving(&a, "dist-hybrid-ckpt", uninterrupted);
  for (int r = 0; r < 2; ++r) {
    cr_assert_eq(oa[r].stats.optimizer_chunks_on_device, oa[r].stats.optimizer_chunks, "rank %d", r);
  }
  for (int world = 2; world <= 3; ++world) {
    scenario b = a;
    b.world = world;
    b.save_step = 0;
    b.resume_step = 2;
    b.hybrid = world == 2;
    run_resuming(&b, world == 2 ? uninterrupted : NULL);
  }
  remove_checkpoints(&a);
}

/* ------------------------------------------------------------------------ */
/* The NVMe tier with sharding                                               */
/* ------------------------------------------------------------------------ */

/* Each rank keeps its shards of some chunks' optimizer lists on the drive
 * (host capacity below what they all need): the steps stream them through
 * the staging ring; values, reads and the skipped step's restore stage them
 * in.  Parameters stay bit-identical to one process in memory, with fp16
 * loss scaling and an overflow step, also when gathering ahead. */
/* `host`: bytes for a rank's compute shards, reduce-scatter buffers and
 * staging ring (5 buffers of its largest shard's three lists) and some but
 * not all of its optimizer shards. */
static void expect_nvme_shards(int world, uint32_t gather_ahead, uint64_t host) {
  scenario sc = base(world, PSTAR_DTYPE_F16);
  sc.overflow_step = 2;
  sc.steps = 4;
  sc.gather_ahead = gather_ahead;
  sc.nvme_host_capacity = host;
  rank_out *out = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, out, 0);
  for (int r = 0; r < world; ++r) {
    const pstar_x_nvme_stats *n = &out[r].nstats;
    cr_log_info("%d ranks%s: rank %d has %u of 5 trainable chunks' shards on the drive (%llu bytes), steps read "
                "%llu bytes", world, gather_ahead ? " gathering ahead" : "", r, n->chunks_on_nvme,
                (unsigned long long)n->bytes_on_nvme, (unsigned long long)n->step_bytes_read);
    cr_assert_gt(n->chunks_on_nvme, 0, "rank %d: nothing on the drive", r);
    cr_assert_lt(n->chunks_on_nvme, 5, "rank %d: everything on the drive", r);
    cr_assert_gt(n->step_bytes_read, 0, "rank %d", r);
    cr_assert_leq(out[r].stats.peak_host_bytes, host, "rank %d", r);
  }
}

Test(dist_engine, nvme_tier_holds_each_ranks_shards) {
  expect_nvme_shards(2, 0, 136 * 1024);
  expect_nvme_shards(3, 0, 100 * 1024);
  expect_nvme_shards(2, 2, 150 * 1024); /* a second reduce-scatter buffer pair */
}

/* The overlapped step with each rank's shards partly on the drive: the
 * update thread streams them through the tier's ring; bit-identical to the
 * synchronous step and to one process, with a skipped fp16 step, at 2 and 3
 * ranks and gathering ahead. */
Test(dist_engine, overlapped_step_with_the_nvme_tier_is_bit_identical) {
  const struct {
    int world;
    uint32_t gather_ahead;
    uint64_t host;
  } cases[] = {{2, 0, 136 * 1024}, {3, 0, 100 * 1024}, {2, 2, 150 * 1024}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    scenario sc = base(cases[i].world, PSTAR_DTYPE_F16);
    sc.overflow_step = 2;
    sc.steps = 4;
    sc.gather_ahead = cases[i].gather_ahead;
    sc.nvme_host_capacity = cases[i].host;
    expect_overlapped(sc, 1);
  }
}

/* A sharded checkpoint saved by ranks whose shards partly live on the drive
 * resumes them bit for bit, on the drive again, at 2 and at 3 ranks. */
Test(dist_engine, nvme_tier_sharded_checkpoints_resume_exactly) {
  static float uninterrupted[TOTAL_ELEMS];
  scenario a = base(2, PSTAR_DTYPE_BF16);
  a.steps = 5;
  a.save_step = 2;
  a.nvme_host_capacity = 136 * 1024;
  rank_out *oa = run_saving(&a, "dist-nvme-ckpt", uninterrupted);
  for (int r = 0; r < 2; ++r) cr_assert_gt(oa[r].nstats.chunks_on_nvme, 0, "rank %d", r);
  for (int world = 2; world <= 3; ++world) {
    scenario b = a;
    b.world = world;
    b.save_step = 0;
    b.resume_step = 2;
    b.nvme_host_capacity = world == 2 ? 136 * 1024 : 100 * 1024;
    rank_out *ob = run_resuming(&b, world == 2 ? uninterrupted : NULL);
    for (int r = 0; r < world; ++r) cr_assert_gt(ob[r].nstats.chunks_on_nvme, 0, "%d ranks: rank %d", world, r);
  }
  remove_checkpoints(&a);
}

/* ------------------------------------------------------------------------ */
/* Sharded checkpoints                                                       */
/* ------------------------------------------------------------------------ */

/* Two ranks save after step 3 and train on to 6.  Loading that checkpoint
 * and resuming from step 3 gives, bit for bit: with two ranks, their
 * uninterrupted parameters; with three ranks and with one process (each
 * scenario's reference loads it too), the same as each other.  A save that
 * fails on one rank at any durability point before LATEST moves fails on
 * every rank and leaves the previous checkpoint current (the resumes run
 * after the failed saves). */
Test(dist_engine, sharded_checkpoints_resume_exactly_at_other_world_sizes) {
  static float uninterrupted[TOTAL_ELEMS];
  scenario a = base(2, PSTAR_DTYPE_BF16);
  a.steps = 6;
  a.save_step = 3;
  run_saving(&a, "dist-ckpt", uninterrupted);
  {
    /* One file per list and rank, a manifest with a piece per (parameter,
     * rank) that holds some of it. */
    char path[sizeof a.ckpt_dir + 128], name[64] = {0}, line[256];
    snprintf(path, sizeof path, "%s/LATEST", a.ckpt_dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(name, sizeof name, f));
    fclose(f);
    name[strcspn(name, "\n")] = 0;
    for (int r = 0; r < 2; ++r) {
      snprintf(path, sizeof path, "%s/%s/masters.r%d.f32", a.ckpt_dir, name, r);
      cr_assert_eq(access(path, R_OK), 0, "%s", path);
    }
    snprintf(path, sizeof path, "%s/%s/manifest", a.ckpt_dir, name);
    f = fopen(path, "r");
    cr_assert_not_null(f);
    int sharded = 0, pieces = 0;
    while (fgets(line, sizeof line, f) != NULL) {
      sharded += strcmp(line, "sharded 1\n") == 0;
      pieces += strncmp(line, "piece ", 6) == 0;
    }
    fclose(f);
    cr_assert_eq(sharded, 1);
    cr_assert_geq(pieces, N_PARAMS, "%d pieces", pieces);
  }

  /* Saves that fail at each durability point before LATEST moves: rank 0
   * at points 1-7 (its four files, the manifest, the directory's fsync,
   * LATEST.tmp), rank 1 at points 1-4 (its four files). */
  int crashes[11][2];
  for (int k = 0; k < 11; ++k) {
    crashes[k][0] = k < 7 ? 0 : 1;
    crashes[k][1] = k < 7 ? k + 1 : k - 6;
  }
  for (int k = 0; k < 11; ++k) {
    scenario f = a;
    f.steps = 4;
    f.save_step = 4;
    f.crash_rank = crashes[k][0];
    f.crash_point = crashes[k][1];
    rank_out *of = run_scenario(&f, 1);
    for (int r = 0; r < 2; ++r) {
      cr_assert_eq(of[r].save_status, PSTAR_ERR_IO, "crash on rank %d at point %d: rank %d: %s", f.crash_rank,
                   f.crash_point, r, of[r].save_msg);
    }
  }

  for (int world = 2; world <= 3; ++world) {
    scenario b = a;
    b.world = world;
    b.save_step = 0;
    b.resume_step = 3;
    run_resuming(&b, world == 2 ? uninterrupted : NULL);
  }
  remove_checkpoints(&a);
}

/* The ranks of `sc` match one process: in strict mode at two ranks, and
 * with hybrid placement on the ranks (their shards' state on the emulated
 * device, updated there in the formats). */
static void check_strict_and_hybrid(scenario sc) {
  sc.strict = sc.world == 2;
  expect_equal_to_reference(&sc, run_scenario(&sc, 1), 0);
  sc.strict = 0;
  sc.hybrid = 1;
  sc.hybrid_capacity = 0;
  rank_out *oh = run_scenario(&sc, 1);
  expect_equal_to_reference(&sc, oh, 0);
  for (int r = 0; r < sc.world; ++r) cr_assert_gt(oh[r].stats.optimizer_chunks_on_device, 0, "rank %d", r);
}

/* Two ranks of `a` train 5 steps and save after step 2; the checkpoint
 * resumes at two ranks (the same bits as the uninterrupted run) and at
 * three (as one process). */
static void check_resumed_at_two_and_three(scenario a, const char *name) {
  static float uninterrupted[TOTAL_ELEMS];
  a.steps = 5;
  a.save_step = 2;
  run_saving(&a, name, uninterrupted);
  for (int world = 2; world <= 3; ++world) {
    scenario b = a;
    b.world = world;
    b.save_step = 0;
    b.resume_step = 2;
    run_resuming(&b, world == 2 ? uninterrupted : NULL);
  }
  remove_checkpoints(&a);
}

/* Adam's moments in bf16 and int8 (pstar_engine_options.state_format):
 * sharded ranks update their shards with the same kernels as one process,
 * and with int8 every shard boundary is a block boundary (the layout aligns
 * to 256 elements), so the ranks match one process bit for bit; a
 * checkpoint saved by two ranks resumes exactly at two and at three ranks
 * and in one process. */
Test(dist_engine, state_formats_sharded_and_hybrid_bit_identical_and_resumed_at_other_world_sizes) {
  const pstar_state_format formats[2] = {PSTAR_STATE_BF16, PSTAR_STATE_INT8};
  for (int i = 0; i < 2; ++i) {
    for (int world = 2; world <= 3; ++world) {
      scenario sc = base(world, PSTAR_DTYPE_BF16);
      sc.state_format = formats[i];
      check_strict_and_hybrid(sc);
    }
    scenario a = base(2, PSTAR_DTYPE_BF16);
    a.state_format = formats[i];
    check_resumed_at_two_and_three(a, i == 0 ? "dist-ckpt-bf16" : "dist-ckpt-int8");
  }
}

/* bf16 masters (pstar_engine_options.master_format) with int8 and fp32
 * moments: the stochastic rounding's bits depend on the element's place in
 * its parameter, not on the chunk layout (3 ranks pad chunks to 1152
 * elements, which packs parameters otherwise than one process) or the rank
 * that holds it, so 2 and 3 ranks match one process bit for bit, and a
 * 2-rank checkpoint resumes exactly at 2 and 3 ranks. */
Test(dist_engine, bf16_masters_sharded_bit_identical_and_resumed_at_other_world_sizes) {
  for (int fp32_moments = 0; fp32_moments <= 1; ++fp32_moments) {
    for (int world = 2; world <= 3; ++world) {
      scenario sc = base(world, PSTAR_DTYPE_BF16);
      sc.state_format = fp32_moments ? PSTAR_STATE_FP32 : PSTAR_STATE_INT8;
      sc.master_format = PSTAR_MASTER_BF16;
      check_strict_and_hybrid(sc);
    }
  }
  scenario a = base(2, PSTAR_DTYPE_BF16);
  a.state_format = PSTAR_STATE_INT8;
  a.master_format = PSTAR_MASTER_BF16;
  check_resumed_at_two_and_three(a, "dist-ckpt-m16");
}

/* A load that fails on one rank of a group fails on every rank: refused
 * after every check on that rank (nothing written anywhere: every rank's
 * values, hyperparameters and step as before), or failing part way there
 * (every rank then refuses to train until a load completes).  The load that
 * follows resumes bit for bit: a 2-rank checkpoint at 2 ranks (against the
 * uninterrupted run) and at 3 (against one process); with shards on the
 * NVMe drive at 2. */
static void expect_failed_load(scenario b, int rank, const char *fault, const float *uninterrupted) {
  b.load_fault_rank = rank;
  snprintf(b.load_fault, sizeof b.load_fault, "%s", fault);
  rank_out *ob = run_resuming(&b, uninterrupted);
  const int part_way = strncmp(fault, "read:", 5) == 0;
  for (int r = 0; r < b.world; ++r) {
    const char *m = ob[r].load_msg;
    cr_log_info("%d ranks, %s on rank %d: rank %d: %s", b.world, fault, rank, r, m);
    cr_assert_eq(ob[r].load_status, PSTAR_ERR_IO, "%s on rank %d: rank %d: %s", fault, rank, r, m);
    if (r == rank) {
      cr_assert_not_null(strstr(m, part_way ? "simulated I/O error" : "simulated refusal"), "rank %d: %s", r, m);
    } else {
      char who[64];
      snprintf(who, sizeof who, "rank %d %s", rank, part_way ? "could not finish loading" : "refused the checkpoint");
      cr_assert_not_null(strstr(m, who), "rank %d: \"%s\" lacks \"%s\"", r, m, who);
    }
    if (part_way) {
      cr_assert_eq(ob[r].load_after_status, PSTAR_ERR_IO, "rank %d: %s", r, ob[r].load_after_msg);
      cr_assert_not_null(strstr(ob[r].load_after_msg, "failed part way"), "rank %d: %s", r, ob[r].load_after_msg);
    } else {
      cr_assert(ob[r].load_unchanged, "rank %d: a refused load changed its state", r);
    }
  }
}

Test(dist_engine, a_load_that_fails_on_one_rank_fails_on_every_rank) {
  static float uninterrupted[TOTAL_ELEMS];
  scenario a = base(2, PSTAR_DTYPE_BF16);
  a.steps = 5;
  a.save_step = 2;
  run_saving(&a, "dist-ckpt-fault", uninterrupted);
  scenario b = a;
  b.save_step = 0;
  b.resume_step = 2;
  expect_failed_load(b, 1, "check", uninterrupted);
  expect_failed_load(b, 0, "read:4", uninterrupted);
  b.world = 3;
  expect_failed_load(b, 2, "check", NULL);
  expect_failed_load(b, 1, "read:9", NULL);
  remove_checkpoints(&a);
  /* With each rank's shards partly on its NVMe drive. */
  a.nvme_host_capacity = 136 * 1024;
  run_saving(&a, "dist-nvme-ckpt-fault", uninterrupted);
  b = a;
  b.save_step = 0;
  b.resume_step = 2;
  expect_failed_load(b, 0, "check", uninterrupted);
  expect_failed_load(b, 1, "read:6", uninterrupted);
  remove_checkpoints(&a);
}

/* ------------------------------------------------------------------------ */
/* Out of memory in a gather                                                 */
/* ------------------------------------------------------------------------ */

/* Every rank with the same device capacity and the same non-model report:
 * the acquire that must gather a chunk finds no room on every rank, before
 * any collective (so no rank waits for another), and returns
 * PSTAR_ERR_OUT_OF_MEMORY; once the caller reports less, the same acquire
 * gathers and the step completes. */
typedef struct oom_out {
  int32_t oom_status;
  char oom_msg[512];
  int32_t status; /* PSTAR_OK if everything after the OOM worked */
  char msg[512];
  float w[64];
} oom_out;

static int oom_rank(int rank, void *arg) {
  oom_out *out = (oom_out *)arg + rank;
  pstar_engine_options o;
  pstar_engine *e = NULL;
  uint32_t id;
  const int64_t n = 64;
  float vals[64], g[64];
  void *p;
  out->status = PSTAR_ERR_INTERNAL;
  pstar_engine_options_init(&o);
  o.rank = rank;
  o.world_size = 2;
  o.chunk_elems = 1024;
  o.compute_dtype = PSTAR_DTYPE_F32;
  o.device_capacity_bytes = 64 * 1024;
  o.comm_timeout_ms = 20000;
  if (pstar_engine_create(&o, &e) != PSTAR_OK) goto fail;
  if (pstar_param_register(e, "w", 1, &n, 0, &id) != PSTAR_OK) goto fail;
  if (pstar_engine_build(e) != PSTAR_OK) goto fail;
  for (int i = 0; i < 64; ++i) vals[i] = (float)i / 64.0f;
  if (pstar_param_write(e, id, vals, 64, PSTAR_DTYPE_F32) != PSTAR_OK) goto fail;
  if (pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN) != PSTAR_OK) goto fail;
  /* Non-model bytes leave less than the gathered chunk (4 KiB). */
  if (pstar_nonmodel_report(e, 62 * 1024) != PSTAR_OK) goto fail;
  out->oom_status = pstar_param_acquire(e, id, PSTAR_STAGE_FORWARD, NULL, &p);
  snprintf(out->oom_msg, sizeof out->oom_msg, "%s", pstar_last_error_message());
  if (pstar_nonmodel_report(e, 0) != PSTAR_OK) goto fail;
  if (pstar_param_acquire(e, id, PSTAR_STAGE_FORWARD, NULL, &p) != PSTAR_OK) goto fail;
  if (pstar_param_release(e, id, NULL) != PSTAR_OK) goto fail;
  if (pstar_param_acquire(e, id, PSTAR_STAGE_BACKWARD, NULL, &p) != PSTAR_OK) goto fail;
  for (int i = 0; i < 64; ++i) g[i] = 1.0f;
  if (pstar_grad_write(e, id, g, 64, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL) != PSTAR_OK) goto fail;
  if (pstar_param_release(e, id, NULL) != PSTAR_OK) goto fail;
  if (pstar_step(e, NULL) != PSTAR_OK) goto fail;
  if (pstar_param_read(e, id, out->w, 64, PSTAR_DTYPE_F32) != PSTAR_OK) goto fail;
  out->status = PSTAR_OK;
  pstar_engine_destroy(e);
  return 0;
fail:
  snprintf(out->msg, sizeof out->msg, "%s", pstar_last_error_message());
  pstar_engine_destroy(e);
  return 1;
}

Test(dist_engine, out_of_memory_in_a_gather_then_room) {
  oom_out *out = (oom_out *)d_shared(2 * sizeof(oom_out));
  int status[2];
  const double t0 = d_now();
  cr_assert_eq(d_run_ranks(2, oom_rank, out, 60.0, status), 0, "rank 0: %s; rank 1: %s", out[0].msg, out[1].msg);
  for (int r = 0; r < 2; ++r) {
    cr_assert_eq(out[r].oom_status, PSTAR_ERR_OUT_OF_MEMORY, "rank %d: %s (%s)", r,
                 pstar_status_name(out[r].oom_status), out[r].oom_msg);
    cr_assert(strstr(out[r].oom_msg, "bytes") != NULL, "rank %d: %s", r, out[r].oom_msg);
    cr_log_info("rank %d: %s", r, out[r].oom_msg);
    cr_assert_eq(out[r].status, PSTAR_OK, "rank %d: %s", r, out[r].msg);
    for (int i = 0; i < 64; ++i) {
      cr_assert_eq(f32_bits(out[r].w[i]), f32_bits(out[0].w[i]), "rank %d element %d", r, i);
      cr_assert(out[r].w[i] < (float)i / 64.0f, "rank %d element %d did not move", r, i);
    }
  }
  /* No rank waited for a collective the other never issued. */
  cr_assert_lt(d_now() - t0, 15.0);
}

/* ------------------------------------------------------------------------ */
/* (e) a rank gone mid-step                                                  */
/* ------------------------------------------------------------------------ */

static void expect_failure_reported(int world, int die_rank, int stall, uint32_t gather_ahead) {
  scenario sc = base(world, PSTAR_DTYPE_BF16);
  sc.gather_ahead = gather_ahead;
  sc.die_rank = die_rank;
  sc.stall = stall;
  sc.die_step = 2;
  sc.steps = 3;
  sc.comm_timeout_ms = 3000;
  const double t0 = d_now();
  rank_out *out = run_scenario(&sc, 0);
  const double took = d_now() - t0;
  for (int r = 0; r < world; ++r) {
    if (r == die_rank) continue;
    cr_assert_eq(out[r].status, PSTAR_ERR_COMM, "rank %d: %s (%s), wait status %d", r,
                 pstar_status_name(out[r].status), out[r].msg, g_status[r]);
    cr_assert(strstr(out[r].msg, "rank") != NULL, "rank %d: the message names the ranks: %s", r, out[r].msg);
    /* The peer is named whatever the world and whoever died: by the
     * heartbeats (distributed/liveness.h), a silent one as alive but behind. */
    char peer[96];
    if (die_rank == 0 && !stall)
      snprintf(peer, sizeof peer, "rank 0, which serves it, is gone");
    else
      snprintf(peer, sizeof peer, stall ? "rank %d is alive but has not reached" : "rank %d is gone", die_rank);
    cr_assert(strstr(out[r].msg, peer) != NULL, "rank %d: the message names the peer (\"%s\"): %s", r, peer,
              out[r].msg);
    cr_assert_leq(out[r].fail_seconds, 3.0 + 2.0, "rank %d took %.1f s to report", r, out[r].fail_seconds);
    cr_assert_eq(out[r].after_status, PSTAR_ERR_COMM, "rank %d: step after the failure: %s", r, out[r].after_msg);
    cr_assert(strstr(out[r].after_msg, "refused") != NULL, "%s", out[r].after_msg);
    cr_assert_eq(out[r].later_status, PSTAR_ERR_COMM);
    cr_log_info("%d ranks, rank %d %s%s: rank %d reported after %.3f s: %s", world, die_rank,
                stall ? "silent" : "gone", gather_ahead ? " (gathering ahead)" : "", r, out[r].fail_seconds,
                out[r].msg);
  }
  cr_assert_leq(took, 20.0, "the whole run took %.1f s", took);
}

Test(dist_engine, rank_gone_mid_step_others_report_comm_error) {
  expect_failure_reported(2, 1, 0, 0);
  expect_failure_reported(3, 1, 0, 0);
  expect_failure_reported(3, 0, 0, 0); /* rank 0, the store's host */
  /* With gathers ahead in flight on the collective queue when it goes. */
  expect_failure_reported(2, 1, 0, 2);
}

Test(dist_engine, silent_rank_mid_step_others_time_out) {
  expect_failure_reported(2, 1, 1, 0); /* within comm_timeout_ms (3 s) plus slack */
  expect_failure_reported(3, 2, 1, 0); /* a timeout names nobody: the heartbeats do */
  expect_failure_reported(3, 2, 1, 3);
}

/* ------------------------------------------------------------------------ */
/* Options and mismatches                                                    */
/* ------------------------------------------------------------------------ */

Test(dist_engine, models_that_differ_fail_the_build_on_every_rank) {
  scenario sc = base(2, PSTAR_DTYPE_BF16);
  sc.mismatch_rank = 1;
  rank_out *out = run_scenario(&sc, 0);
  for (int r = 0; r < 2; ++r) {
    cr_assert_eq(out[r].status, PSTAR_ERR_INVALID_ARGUMENT, "rank %d: %s", r, out[r].msg);
    cr_assert(strstr(out[r].msg, "models differ") != NULL, "%s", out[r].msg);
  }
}

Test(dist_engine, option_checks) {
  pstar_engine_options o;
  pstar_engine *e = NULL;
  pstar_engine_options_init(&o);
  cr_assert_eq(o.world_size, 0);
  cr_assert_eq(o.rank, 0);
  cr_assert_eq(o.comm_timeout_ms, 0);
  o.world_size = 2;
  o.rank = 2;
  cr_assert_eq(pstar_engine_create(&o, &e), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(pstar_last_error_message(), "rank 2") != NULL, "%s", pstar_last_error_message());
  o.world_size = 0;
  o.rank = 1;
  cr_assert_eq(pstar_engine_create(&o, &e), PSTAR_ERR_INVALID_ARGUMENT);
  o.world_size = -1;
  o.rank = 0;
  cr_assert_eq(pstar_engine_create(&o, &e), PSTAR_ERR_INVALID_ARGUMENT);
  /* More than one rank without a rendezvous address. */
  d_clear_launch_env();
  o.world_size = 2;
  cr_assert_eq(pstar_engine_create(&o, &e), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(pstar_last_error_message(), "MASTER_ADDR") != NULL, "%s", pstar_last_error_message());
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "1", 1);
  /* CUDA ranks: refused by a build without NCCL or libuv; with them, no
   * GPU here fails the device, and with a GPU rank 1 finds no store on port
   * 1 (the short timeout bounds the wait). */
  o.device = PSTAR_DEVICE_CUDA;
  o.rank = 1;
  o.comm_timeout_ms = 300;
  {
    const pstar_status st = pstar_engine_create(&o, &e);
    cr_assert(st == PSTAR_ERR_UNSUPPORTED || st == PSTAR_ERR_DEVICE || st == PSTAR_ERR_COMM, "%s: %s",
              pstar_status_name(st), pstar_last_error_message());
    if (st == PSTAR_ERR_UNSUPPORTED) {
      cr_assert(strstr(pstar_last_error_message(), "NCCL") != NULL, "%s", pstar_last_error_message());
    }
  }
  o.rank = 0;
  o.comm_timeout_ms = 0;
  o.device = PSTAR_DEVICE_EMULATED;
  o.dry_run = 1;
  cr_assert_eq(pstar_engine_create(&o, &e), PSTAR_ERR_UNSUPPORTED);
  /* An explicit world of 1 ignores a launcher's environment. */
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "4", 1);
  pstar_engine_options_init(&o);
  o.world_size = 1;
  cr_assert_eq(pstar_engine_create(&o, &e), PSTAR_OK, "%s", pstar_last_error_message());
  pstar_stats s;
  pstar_stats_init(&s);
  cr_assert_eq(pstar_engine_get_stats(e, &s), PSTAR_OK);
  cr_assert_eq(s.world_size, 1);
  cr_assert_eq(s.rank, 0);
  cr_assert_eq(pstar_engine_destroy(e), PSTAR_OK);
}
