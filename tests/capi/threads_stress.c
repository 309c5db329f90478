/* Two threads on one engine, as a plain program (no Criterion: its runner
 * cannot start under ThreadSanitizer, packaging/ci-sanitizers.sh), for the
 * TSan stage and CTest: a trainer and a reader, then two trainers, then a
 * hand-off between threads.  Every call either succeeds or is refused with
 * PSTAR_ERR_BUSY (two trainers: also PSTAR_ERR_INVALID_STATE, from the
 * interleaving); the trainer that retries reaches a clean run's values.
 * The same cases with more checks: test_threads.c.
 *
 * Usage: pstar_threads_stress [STEPS]; exit 0 when every check holds. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pstar/pstar.h"

enum { NP = 3, NUMEL = 1000 };

static int g_failed = 0;

#define CHECK(cond, ...)                                                \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "threads_stress:%d: ", __LINE__);                 \
      fprintf(stderr, __VA_ARGS__);                                     \
      fprintf(stderr, " (last error: %s)\n", pstar_last_error_message()); \
      g_failed = 1;                                                     \
    }                                                                   \
  } while (0)

static pstar_engine *model(void) {
  pstar_engine_options o;
  pstar_engine *e = NULL;
  pstar_engine_options_init(&o);
  o.compute_dtype = PSTAR_DTYPE_BF16;
  o.chunk_elems = 1024;
  o.threads = 1;
  o.lr = 1e-2f;
  if (pstar_engine_create(&o, &e) != PSTAR_OK) {
    fprintf(stderr, "threads_stress: create: %s\n", pstar_last_error_message());
    exit(1);
  }
  for (int p = 0; p < NP; ++p) {
    char name[16];
    int64_t shape[1] = {NUMEL};
    uint32_t id;
    snprintf(name, sizeof name, "p%d", p);
    pstar_param_register(e, name, 1, shape, 0, &id);
  }
  pstar_engine_build(e);
  for (int p = 0; p < NP; ++p) {
    float v[NUMEL];
    for (int i = 0; i < NUMEL; ++i) v[i] = (float)((i * 31 + p * 7) % 101 - 50) / 128.0f;
    pstar_param_write(e, (uint32_t)p, v, NUMEL, PSTAR_DTYPE_F32);
  }
  return e;
}

static void gradient(float *g, int p, long step) {
  for (int i = 0; i < NUMEL; ++i) g[i] = (float)((i * 7 + p * 13 + (int)step * 3) % 17 - 8) / 64.0f;
}

/* Each call retried while busy; the first other status ends the iteration. */
#define TRY(call)                                \
  do {                                           \
    if (s == PSTAR_OK) {                         \
      while ((s = (call)) == PSTAR_ERR_BUSY) {   \
        ++*busy;                                 \
        sched_yield();                           \
      }                                          \
    }                                            \
  } while (0)

static pstar_status train_step(pstar_engine *e, long step, long *busy) {
  float g[NUMEL];
  void *ptr;
  pstar_status s = PSTAR_OK;
  TRY(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
  for (uint32_t p = 0; p < NP; ++p) {
    TRY(pstar_param_acquire(e, p, PSTAR_STAGE_FORWARD, NULL, &ptr));
    TRY(pstar_param_release(e, p, NULL));
  }
  for (int p = NP - 1; p >= 0; --p) {
    TRY(pstar_param_acquire(e, (uint32_t)p, PSTAR_STAGE_BACKWARD, NULL, &ptr));
    gradient(g, p, step);
    TRY(pstar_grad_write(e, (uint32_t)p, g, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
    TRY(pstar_param_release(e, (uint32_t)p, NULL));
  }
  TRY(pstar_step(e, NULL));
  return s;
}

typedef struct worker {
  pstar_engine *e;
  long steps, busy, state, other, ok;
  pstar_status other_status;
  int stop;
} worker;

static void *reader_main(void *arg) {
  worker *w = arg;
  while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
    double v;
    uint32_t n;
    pstar_stats st;
    pstar_stats_init(&st);
    const pstar_status s[3] = {pstar_hparam_get(w->e, PSTAR_HPARAM_STEP, &v), pstar_param_count(w->e, &n),
                               pstar_engine_get_stats(w->e, &st)};
    for (int i = 0; i < 3; ++i) {
      if (s[i] == PSTAR_OK) {
        ++w->ok;
      } else if (s[i] == PSTAR_ERR_BUSY) {
        ++w->busy;
      } else {
        ++w->other;
        w->other_status = s[i];
      }
    }
  }
  return NULL;
}

static void *trainer_main(void *arg) {
  worker *w = arg;
  for (long it = 0; it < w->steps; ++it) {
    const pstar_status s = train_step(w->e, it, &w->busy);
    if (s == PSTAR_OK) {
      ++w->ok;
      continue;
    }
    if (s == PSTAR_ERR_INVALID_STATE) {
      ++w->state;
    } else {
      ++w->other;
      w->other_status = s;
    }
    pstar_status a;
    while ((a = pstar_iteration_abort(w->e)) == PSTAR_ERR_BUSY) sched_yield();
    if (a != PSTAR_OK && a != PSTAR_ERR_INVALID_STATE) {
      ++w->other;
      w->other_status = a;
    }
  }
  return NULL;
}

static void *handoff_main(void *arg) {
  worker *w = arg;
  const pstar_status s = train_step(w->e, w->steps, &w->busy);
  if (s != PSTAR_OK) w->other_status = s;
  return NULL;
}

static int same_as_clean_run(pstar_engine *e, long steps) {
  pstar_engine *clean = model();
  long busy = 0;
  int same = 1;
  for (long s = 0; s < steps; ++s) CHECK(train_step(clean, s, &busy) == PSTAR_OK, "clean step %ld", s);
  for (uint32_t p = 0; p < NP; ++p) {
    float a[NUMEL], b[NUMEL];
    pstar_param_read(e, p, a, NUMEL, PSTAR_DTYPE_F32);
    pstar_param_read(clean, p, b, NUMEL, PSTAR_DTYPE_F32);
    if (memcmp(a, b, sizeof a) != 0) same = 0;
  }
  pstar_engine_destroy(clean);
  return same;
}

int main(int argc, char **argv) {
  const long steps = argc > 1 ? atol(argv[1]) : 30;

  /* A trainer that retries, and a reader. */
  pstar_engine *e = model();
  worker r;
  memset(&r, 0, sizeof r);
  r.e = e;
  pthread_t t;
  pthread_create(&t, NULL, reader_main, &r);
  long busy = 0;
  for (long s = 0; s < steps; ++s) CHECK(train_step(e, s, &busy) == PSTAR_OK, "trainer step %ld", s);
  __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
  pthread_join(t, NULL);
  CHECK(r.other == 0, "the reader got %s %ld times", pstar_status_name(r.other_status), r.other);
  CHECK(same_as_clean_run(e, steps), "the trainer's values differ from a clean run");
  printf("trainer and reader: %ld trainer refusals; reader %ld ok, %ld busy\n", busy, r.ok, r.busy);
  pstar_engine_destroy(e);

  /* Two trainers. */
  e = model();
  worker w[2];
  pthread_t th[2];
  for (int i = 0; i < 2; ++i) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].e = e;
    w[i].steps = steps;
    pthread_create(&th[i], NULL, trainer_main, &w[i]);
  }
  for (int i = 0; i < 2; ++i) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; ++i) {
    CHECK(w[i].other == 0, "trainer %d got %s %ld times", i, pstar_status_name(w[i].other_status), w[i].other);
    printf("trainer %d: %ld steps, %ld busy, %ld invalid state\n", i, w[i].ok, w[i].busy, w[i].state);
  }
  pstar_iteration_abort(e);
  CHECK(train_step(e, 0, &busy) == PSTAR_OK, "a step after two trainers");
  pstar_engine_destroy(e);

  /* Hand-off: each step on a new thread. */
  e = model();
  for (long s = 0; s < steps; ++s) {
    worker h;
    memset(&h, 0, sizeof h);
    h.e = e;
    h.steps = s;
    h.other_status = PSTAR_OK;
    pthread_create(&t, NULL, handoff_main, &h);
    pthread_join(t, NULL);
    CHECK(h.other_status == PSTAR_OK && h.busy == 0, "hand-off step %ld: %s", s, pstar_status_name(h.other_status));
  }
  CHECK(same_as_clean_run(e, steps), "the handed-off engine's values differ from a clean run");
  pstar_engine_destroy(e);

  printf("threads_stress: %s\n", g_failed ? "FAILED" : "ok");
  return g_failed;
}
