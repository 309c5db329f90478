/* Misuse that the header forbids is detected, not undefined (issue 18,
 * group 4): calls that overlap on one engine (two threads, or a call from
 * the log callback) are refused with PSTAR_ERR_BUSY naming both calls;
 * handing an engine between threads between calls works; a forked child's
 * calls on its parent's engine return PSTAR_ERR_INVALID_STATE at once, and
 * its destroy only forgets the handle. */
#define _DEFAULT_SOURCE /* nanosleep, kill under -std=c99 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "capi_test_util.h"

#if defined(__SANITIZE_THREAD__)
#define T_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define T_TSAN 1
#endif
#endif
#ifndef T_TSAN
#define T_TSAN 0
#endif

enum { NP = 3, NUMEL = 1000 };

static pstar_engine *model(void) {
  pstar_engine_options o = t_options(PSTAR_DTYPE_BF16, 1024);
  o.lr = 1e-2f;
  pstar_engine *e = t_create(&o);
  for (int p = 0; p < NP; ++p) {
    char name[16];
    snprintf(name, sizeof name, "p%d", p);
    t_register(e, name, NUMEL, 0);
  }
  T_OK(pstar_engine_build(e));
  float v[NUMEL];
  for (int p = 0; p < NP; ++p) {
    t_fill(v, NUMEL, (uint32_t)p + 1, 0.5f);
    t_write_f32(e, (uint32_t)p, v, NUMEL);
  }
  return e;
}

static void gradient(float *g, int p, uint64_t step) {
  for (int i = 0; i < NUMEL; ++i) g[i] = (float)((i * 7 + p * 13 + (int)step * 3) % 17 - 8) / 64.0f;
}

/* A call retried while another thread holds the engine: returns when it is
 * not refused with PSTAR_ERR_BUSY, counting refusals in *busy. */
#define RETRY(call, busy)                                 \
  do {                                                    \
    pstar_status r_;                                      \
    while ((r_ = (call)) == PSTAR_ERR_BUSY) {             \
      ++*(busy);                                          \
      sched_yield();                                      \
    }                                                     \
    if (r_ != PSTAR_OK) return r_;                        \
  } while (0)

/* One training step, each call retried while busy; the first other failure
 * is returned.  Touches no pointer the engine hands out. */
static pstar_status train_step(pstar_engine *e, uint64_t step, long *busy) {
  float g[NUMEL];
  void *ptr;
  RETRY(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN), busy);
  for (uint32_t p = 0; p < NP; ++p) {
    RETRY(pstar_param_acquire(e, p, PSTAR_STAGE_FORWARD, NULL, &ptr), busy);
    RETRY(pstar_param_release(e, p, NULL), busy);
  }
  for (int p = NP - 1; p >= 0; --p) {
    RETRY(pstar_param_acquire(e, (uint32_t)p, PSTAR_STAGE_BACKWARD, NULL, &ptr), busy);
    gradient(g, p, step);
    RETRY(pstar_grad_write(e, (uint32_t)p, g, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL), busy);
    RETRY(pstar_param_release(e, (uint32_t)p, NULL), busy);
  }
  RETRY(pstar_step(e, NULL), busy);
  return PSTAR_OK;
}

static void clean_step(pstar_engine *e, uint64_t step) {
  long busy = 0;
  T_OK(train_step(e, step, &busy));
  cr_assert_eq(busy, 0);
}

/* The engine's parameters equal those of a clean run of `steps` steps. */
static void expect_like_clean_run(pstar_engine *e, uint64_t steps, const char *what) {
  pstar_engine *clean = model();
  for (uint64_t s = 0; s < steps; ++s) clean_step(clean, s);
  for (uint32_t p = 0; p < NP; ++p) {
    float a[NUMEL], b[NUMEL];
    t_read_f32(e, p, a, NUMEL);
    t_read_f32(clean, p, b, NUMEL);
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "%s: parameter %u differs from a clean run of %llu steps", what, p,
                 (unsigned long long)steps);
  }
  cr_assert_eq(t_hparam(e, PSTAR_HPARAM_STEP), (double)steps, "%s: step count", what);
  T_OK(pstar_engine_destroy(clean));
}

/* ------------------------------------------------------------------------ */
/* A deterministic overlap: the log callback runs inside a call             */
/* ------------------------------------------------------------------------ */

typedef struct overlap {
  pstar_engine *e;
  pstar_engine *other; /* another engine: not busy */
  int armed;
  int seen;
  pstar_status from_thread[3];
  char thread_msg[T_MSG_CAP];
  pstar_status same_thread;
  char same_msg[T_MSG_CAP];
  pstar_status other_engine;
} overlap;

static void *overlapping_caller(void *arg) {
  overlap *o = arg;
  double v;
  uint32_t n;
  o->from_thread[0] = pstar_hparam_get(o->e, PSTAR_HPARAM_LR, &v);
  t_copy_last_error(o->thread_msg, sizeof o->thread_msg);
  o->from_thread[1] = pstar_param_count(o->e, &n);
  o->from_thread[2] = pstar_engine_destroy(o->e);
  return NULL;
}

/* During pstar_engine_build ("engine built" is logged inside it): another
 * thread's calls and this thread's own call on the engine are refused; a
 * call on another engine is not. */
static void log_during_build(pstar_log_level level, const char *message, void *user) {
  (void)level;
  overlap *o = user;
  if (!o->armed || strstr(message, "engine built") == NULL) return;
  o->armed = 0;
  ++o->seen;
  pthread_t t;
  if (pthread_create(&t, NULL, overlapping_caller, o) == 0) pthread_join(t, NULL);
  uint32_t n;
  o->same_thread = pstar_param_count(o->e, &n);
  t_copy_last_error(o->same_msg, sizeof o->same_msg);
  o->other_engine = pstar_param_count(o->other, &n);
}

Test(threads, an_overlapping_call_is_busy_and_names_both_calls) {
  overlap o;
  memset(&o, 0, sizeof o);
  pstar_engine_options opt = t_options(PSTAR_DTYPE_BF16, 1024);
  o.e = t_create(&opt);
  o.other = t_create(&opt);
  t_register(o.e, "w", 16, 0);
  T_OK(pstar_log_set_callback(log_during_build, &o, PSTAR_LOG_INFO));
  o.armed = 1;
  T_OK(pstar_engine_build(o.e));
  T_OK(pstar_log_set_callback(NULL, NULL, PSTAR_LOG_WARN));
  cr_assert_eq(o.seen, 1, "the build did not log \"engine built\" at level info");
  for (int i = 0; i < 3; ++i) {
    cr_assert_eq(o.from_thread[i], PSTAR_ERR_BUSY, "call %d from another thread: %s", i,
                 pstar_status_name(o.from_thread[i]));
  }
  cr_assert(strstr(o.thread_msg, "pstar_hparam_get") != NULL && strstr(o.thread_msg, "pstar_engine_build") != NULL,
            "the message names both calls: \"%s\"", o.thread_msg);
  cr_assert_eq(o.same_thread, PSTAR_ERR_BUSY, "a call from the log callback: %s", pstar_status_name(o.same_thread));
  cr_assert(strstr(o.same_msg, "pstar_param_count") != NULL && strstr(o.same_msg, "pstar_engine_build") != NULL,
            "\"%s\"", o.same_msg);
  cr_assert_eq(o.other_engine, PSTAR_OK, "a call on another engine from the callback: %s",
               pstar_status_name(o.other_engine));
  /* Nothing was done by the refused calls (the destroy included): the
   * engine is built once and trains. */
  T_FAIL(pstar_engine_build(o.e), PSTAR_ERR_INVALID_STATE, "");
  uint32_t n = 0;
  T_OK(pstar_param_count(o.e, &n));
  cr_assert_eq(n, 1u);
  T_OK(pstar_iteration_begin(o.e, PSTAR_ITERATION_EVAL));
  T_OK(pstar_iteration_end(o.e));
  T_OK(pstar_engine_destroy(o.e));
  T_OK(pstar_engine_destroy(o.other));
}

/* ------------------------------------------------------------------------ */
/* Two threads at once                                                       */
/* ------------------------------------------------------------------------ */

typedef struct reader {
  pstar_engine *e;
  volatile int stop;
  long rounds; /* loops done, read atomically by the trainer */
  long ok, busy, other;
  pstar_status other_status;
} reader;

/* Calls that are legal in every state of the engine, in a loop: each must
 * succeed or be refused as busy. */
static void *reader_main(void *arg) {
  reader *r = arg;
  while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
    double v;
    uint32_t n;
    uint64_t numel;
    pstar_stats st;
    pstar_stats_init(&st);
    const pstar_status s[4] = {pstar_hparam_get(r->e, PSTAR_HPARAM_STEP, &v), pstar_param_count(r->e, &n),
                               pstar_param_numel(r->e, 1, &numel), pstar_engine_get_stats(r->e, &st)};
    for (int i = 0; i < 4; ++i) {
      if (s[i] == PSTAR_OK) {
        ++r->ok;
      } else if (s[i] == PSTAR_ERR_BUSY) {
        ++r->busy;
      } else {
        ++r->other;
        r->other_status = s[i];
      }
    }
    __atomic_add_fetch(&r->rounds, 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

Test(threads, a_trainer_and_a_reader_on_one_engine_get_ok_or_busy_only, .timeout = 120) {
  enum { STEPS = 40 };
  pstar_engine *e = model();
  reader r;
  memset(&r, 0, sizeof r);
  r.e = e;
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, reader_main, &r), 0);
  /* The reader runs before training starts: on a loaded machine it could
   * otherwise first be scheduled after the last step and test nothing. */
  while (__atomic_load_n(&r.rounds, __ATOMIC_ACQUIRE) == 0) sched_yield();
  long trainer_busy = 0;
  for (uint64_t s = 0; s < STEPS; ++s) {
    const pstar_status st = train_step(e, s, &trainer_busy);
    cr_assert_eq(st, PSTAR_OK, "step %llu: %s (%s)", (unsigned long long)s, pstar_status_name(st),
                 pstar_last_error_message());
  }
  __atomic_store_n(&r.stop, 1, __ATOMIC_RELEASE);
  pthread_join(t, NULL);
  cr_log_info("trainer: %ld busy refusals; reader: %ld calls ok, %ld busy", trainer_busy, r.ok, r.busy);
  cr_assert_eq(r.other, 0, "the reader got %s %ld times", pstar_status_name(r.other_status), r.other);
  cr_assert_gt(r.ok, 0);
  /* Refused calls did nothing: the result is the clean run's. */
  expect_like_clean_run(e, STEPS, "trainer with a reader");
  T_OK(pstar_engine_destroy(e));
}

typedef struct trainer {
  pstar_engine *e;
  int id;
  long steps, busy, state, other;
  pstar_status other_status;
} trainer;

/* Whole training iterations from two threads, each call retried while
 * busy, so that the two threads' calls interleave: besides busy refusals
 * the engine legitimately answers INVALID_STATE (an iteration the other
 * thread began, a parameter it acquired or released); nothing else, and no
 * crash.  The iteration a failure leaves open is abandoned. */
#define TRY(call)                                         \
  do {                                                    \
    if (s == PSTAR_OK) {                                  \
      while ((s = (call)) == PSTAR_ERR_BUSY) {            \
        ++t->busy;                                        \
        sched_yield();                                    \
      }                                                   \
    }                                                     \
  } while (0)

static void *trainer_main(void *arg) {
  trainer *t = arg;
  float g[NUMEL];
  void *ptr;
  for (int it = 0; it < 200; ++it) {
    pstar_status s = PSTAR_OK;
    TRY(pstar_iteration_begin(t->e, PSTAR_ITERATION_TRAIN));
    for (uint32_t p = 0; p < NP; ++p) {
      TRY(pstar_param_acquire(t->e, p, PSTAR_STAGE_FORWARD, NULL, &ptr));
      TRY(pstar_param_release(t->e, p, NULL));
    }
    for (int p = NP - 1; p >= 0; --p) {
      TRY(pstar_param_acquire(t->e, (uint32_t)p, PSTAR_STAGE_BACKWARD, NULL, &ptr));
      gradient(g, p, (uint64_t)it);
      TRY(pstar_grad_write(t->e, (uint32_t)p, g, NUMEL, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL));
      TRY(pstar_param_release(t->e, (uint32_t)p, NULL));
    }
    TRY(pstar_step(t->e, NULL));
    if (s == PSTAR_OK) {
      ++t->steps;
      continue;
    }
    if (s == PSTAR_ERR_INVALID_STATE) {
      ++t->state;
    } else {
      ++t->other;
      t->other_status = s;
    }
    s = PSTAR_OK;
    TRY(pstar_iteration_abort(t->e));
    if (s != PSTAR_OK && s != PSTAR_ERR_INVALID_STATE) {
      ++t->other;
      t->other_status = s;
    }
  }
  return NULL;
}
#undef TRY

Test(threads, two_threads_training_one_engine_never_crash, .timeout = 120) {
  pstar_engine *e = model();
  trainer t[2];
  pthread_t th[2];
  for (int i = 0; i < 2; ++i) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].e = e;
    t[i].id = i;
    cr_assert_eq(pthread_create(&th[i], NULL, trainer_main, &t[i]), 0);
  }
  for (int i = 0; i < 2; ++i) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; ++i) {
    cr_log_info("thread %d: %ld steps, %ld busy, %ld invalid state", i, t[i].steps, t[i].busy, t[i].state);
    cr_assert_eq(t[i].other, 0, "thread %d got %s %ld times", i, pstar_status_name(t[i].other_status), t[i].other);
  }
  /* The engine is still sound: whatever iteration is open is abandoned,
   * then it trains, and its values are finite. */
  const pstar_status a = pstar_iteration_abort(e);
  cr_assert(a == PSTAR_OK || a == PSTAR_ERR_INVALID_STATE, "%s", pstar_status_name(a));
  clean_step(e, 0);
  for (uint32_t p = 0; p < NP; ++p) {
    float v[NUMEL];
    t_read_f32(e, p, v, NUMEL);
    for (int i = 0; i < NUMEL; ++i) cr_assert(isfinite(v[i]), "parameter %u [%d] = %a", p, i, v[i]);
  }
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* Hand-off between calls                                                    */
/* ------------------------------------------------------------------------ */

typedef struct handoff {
  pstar_engine *e;
  uint64_t step;
  pstar_status status;
} handoff;

static void *handoff_main(void *arg) {
  handoff *h = arg;
  long busy = 0;
  h->status = train_step(h->e, h->step, &busy);
  if (busy != 0) h->status = PSTAR_ERR_BUSY;
  return NULL;
}

Test(threads, an_engine_handed_between_threads_between_calls_trains_like_one_thread) {
  enum { STEPS = 6 };
  pstar_engine *e = model();
  for (uint64_t s = 0; s < STEPS; ++s) {
    handoff h = {e, s, PSTAR_ERR_INTERNAL};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, handoff_main, &h), 0);
    pthread_join(t, NULL);
    cr_assert_eq(h.status, PSTAR_OK, "step %llu on thread %llu: %s", (unsigned long long)s, (unsigned long long)s,
                 pstar_status_name(h.status));
  }
  expect_like_clean_run(e, STEPS, "hand-off");
  T_OK(pstar_engine_destroy(e));
}

/* ------------------------------------------------------------------------ */
/* fork()                                                                    */
/* ------------------------------------------------------------------------ */

/* Waits up to `seconds` for the child; kills it after that.  Returns its
 * wait status, or -1 if it had to be killed. */
static int wait_child(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    int st = 0;
    const pid_t got = waitpid(pid, &st, WNOHANG);
    if (got == pid) return st;
    cr_assert(got == 0 || errno == EINTR, "waitpid: %s", strerror(errno));
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

/* In the child: the checks, as an exit code (1 + the first failing check). */
static int child_checks(pstar_engine *parent_engine, int own_engine) {
  void *ptr;
  double v;
  uint32_t n;
  pstar_stats st;
  pstar_stats_init(&st);
  /* A time limit of its own, in case a call blocks. */
  alarm(10);
  const pstar_status s[] = {
      pstar_iteration_begin(parent_engine, PSTAR_ITERATION_TRAIN),
      pstar_param_acquire(parent_engine, 0, PSTAR_STAGE_FORWARD, NULL, &ptr),
      pstar_hparam_get(parent_engine, PSTAR_HPARAM_LR, &v),
      pstar_param_count(parent_engine, &n),
      pstar_engine_get_stats(parent_engine, &st),
      pstar_step(parent_engine, NULL),
  };
  for (size_t i = 0; i < sizeof s / sizeof s[0]; ++i) {
    if (s[i] != PSTAR_ERR_INVALID_STATE) return 1;
  }
  if (strstr(pstar_last_error_message(), "fork") == NULL) return 2;
  if (pstar_engine_destroy(parent_engine) != PSTAR_OK) return 3;
  if (pstar_param_count(parent_engine, &n) != PSTAR_ERR_INVALID_HANDLE) return 4;
  if (pstar_engine_destroy(parent_engine) != PSTAR_ERR_INVALID_HANDLE) return 5;
  if (own_engine) {
    /* An engine of the child's own has its threads here: it trains. */
    pstar_engine_options o;
    pstar_engine_options_init(&o);
    o.threads = 1;
    o.chunk_elems = 1024;
    pstar_engine *mine = NULL;
    if (pstar_engine_create(&o, &mine) != PSTAR_OK) return 6;
    int64_t shape[1] = {8};
    uint32_t id;
    float g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    if (pstar_param_register(mine, "w", 1, shape, 0, &id) != PSTAR_OK) return 7;
    if (pstar_engine_build(mine) != PSTAR_OK) return 8;
    if (pstar_iteration_begin(mine, PSTAR_ITERATION_TRAIN) != PSTAR_OK) return 9;
    if (pstar_param_acquire(mine, id, PSTAR_STAGE_FORWARD, NULL, &ptr) != PSTAR_OK) return 10;
    if (pstar_param_release(mine, id, NULL) != PSTAR_OK) return 11;
    if (pstar_param_acquire(mine, id, PSTAR_STAGE_BACKWARD, NULL, &ptr) != PSTAR_OK) return 12;
    if (pstar_grad_write(mine, id, g, 8, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, NULL) != PSTAR_OK) return 13;
    if (pstar_param_release(mine, id, NULL) != PSTAR_OK) return 14;
    if (pstar_step(mine, NULL) != PSTAR_OK) return 15;
    if (pstar_engine_destroy(mine) != PSTAR_OK) return 16;
  }
  return 0;
}

static void expect_child_ok(pid_t pid, const char *what) {
  const int st = wait_child(pid, 20);
  cr_assert_neq(st, -1, "%s: the child hung (killed after 20 s)", what);
  cr_assert(WIFEXITED(st), "%s: the child died by signal %d%s", what, WIFSIGNALED(st) ? WTERMSIG(st) : 0,
            WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM ? " (its 10 s alarm: a call blocked)" : "");
  cr_assert_eq(WEXITSTATUS(st), 0, "%s: the child's check %d failed", what, WEXITSTATUS(st) - 1);
}

Test(threads, a_forked_child_gets_invalid_state_at_once_and_may_forget_the_handle, .timeout = 60) {
  pstar_engine *e = model();
  clean_step(e, 0);
  /* Between calls, with no step in flight: the overlapped step's updates
   * run after pstar_step returns, and the statistics wait for them.  (A
   * fork while the update thread works is not covered here: one ASan run
   * of this test in CI timed out in the child, not reproduced since.) */
  pstar_stats idle;
  pstar_stats_init(&idle);
  T_OK(pstar_engine_get_stats(e, &idle));
  fflush(NULL);
  const pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) _exit(child_checks(e, !T_TSAN)); /* TSan: no new threads after a multithreaded fork */
  expect_child_ok(pid, "fork between calls");
  /* The parent's engine is unaffected. */
  clean_step(e, 1);
  expect_like_clean_run(e, 2, "after a child's calls");
  T_OK(pstar_engine_destroy(e));
}

/* A fork during a call on the engine (from the log callback, while the
 * parent is inside pstar_iteration_abort): the child still gets
 * INVALID_STATE, not BUSY and not a hang. */
typedef struct fork_in_call {
  pstar_engine *e;
  int armed;
  pid_t child;
} fork_in_call;

static void log_fork(pstar_log_level level, const char *message, void *user) {
  (void)level;
  fork_in_call *f = user;
  if (!f->armed || strstr(message, "iteration aborted") == NULL) return;
  f->armed = 0;
  fflush(NULL);
  f->child = fork();
  if (f->child == 0) _exit(child_checks(f->e, 0));
}

Test(threads, a_child_forked_during_a_call_gets_invalid_state_too, .timeout = 60) {
  fork_in_call f;
  memset(&f, 0, sizeof f);
  f.e = model();
  f.child = -1;
  clean_step(f.e, 0);
  T_OK(pstar_iteration_begin(f.e, PSTAR_ITERATION_TRAIN));
  T_OK(pstar_log_set_callback(log_fork, &f, PSTAR_LOG_INFO));
  f.armed = 1;
  T_OK(pstar_iteration_abort(f.e));
  T_OK(pstar_log_set_callback(NULL, NULL, PSTAR_LOG_WARN));
  cr_assert_gt(f.child, 0, "the abort did not log \"iteration aborted\" at level info, or fork failed");
  expect_child_ok(f.child, "fork during pstar_iteration_abort");
  clean_step(f.e, 1);
  expect_like_clean_run(f.e, 2, "after a child forked during a call");
  T_OK(pstar_engine_destroy(f.e));
}
