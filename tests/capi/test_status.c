/* Status codes, versions, the per-thread last error and the log callback. */
#include <pthread.h>

#include "capi_test_util.h"

static const pstar_status k_statuses[] = {
    PSTAR_OK,           PSTAR_ERR_INVALID_ARGUMENT, PSTAR_ERR_INVALID_HANDLE, PSTAR_ERR_INVALID_STATE,
    PSTAR_ERR_NOT_FOUND, PSTAR_ERR_OUT_OF_MEMORY,   PSTAR_ERR_BUSY,           PSTAR_ERR_UNSUPPORTED,
    PSTAR_ERR_DEVICE,   PSTAR_ERR_IO,               PSTAR_ERR_COMM,           PSTAR_ERR_VERSION,
    PSTAR_ERR_INTERNAL};
static const char *const k_names[] = {
    "PSTAR_OK",           "PSTAR_ERR_INVALID_ARGUMENT", "PSTAR_ERR_INVALID_HANDLE", "PSTAR_ERR_INVALID_STATE",
    "PSTAR_ERR_NOT_FOUND", "PSTAR_ERR_OUT_OF_MEMORY",   "PSTAR_ERR_BUSY",           "PSTAR_ERR_UNSUPPORTED",
    "PSTAR_ERR_DEVICE",   "PSTAR_ERR_IO",               "PSTAR_ERR_COMM",           "PSTAR_ERR_VERSION",
    "PSTAR_ERR_INTERNAL"};
#define N_STATUSES (sizeof k_statuses / sizeof k_statuses[0])

Test(status, values_are_pinned) {
  cr_assert_eq(PSTAR_OK, 0);
  cr_assert_eq(PSTAR_ERR_INVALID_ARGUMENT, -1);
  cr_assert_eq(PSTAR_ERR_INVALID_HANDLE, -2);
  cr_assert_eq(PSTAR_ERR_INVALID_STATE, -3);
  cr_assert_eq(PSTAR_ERR_NOT_FOUND, -4);
  cr_assert_eq(PSTAR_ERR_OUT_OF_MEMORY, -5);
  cr_assert_eq(PSTAR_ERR_BUSY, -6);
  cr_assert_eq(PSTAR_ERR_UNSUPPORTED, -7);
  cr_assert_eq(PSTAR_ERR_DEVICE, -8);
  cr_assert_eq(PSTAR_ERR_IO, -9);
  cr_assert_eq(PSTAR_ERR_COMM, -10);
  cr_assert_eq(PSTAR_ERR_VERSION, -11);
  cr_assert_eq(PSTAR_ERR_INTERNAL, -12);
}

Test(status, every_status_has_its_own_name_and_a_description) {
  for (size_t i = 0; i < N_STATUSES; ++i) {
    const char *name = pstar_status_name(k_statuses[i]);
    const char *str = pstar_status_string(k_statuses[i]);
    cr_assert_not_null(name);
    cr_assert_not_null(str);
    cr_assert_str_eq(name, k_names[i], "status %d", (int)k_statuses[i]);
    cr_assert(str[0] != '\0', "status %s has an empty description", name);
    cr_assert_str_neq(str, "unknown status", "status %s", name);
    for (size_t j = 0; j < i; ++j) {
      cr_assert_str_neq(name, pstar_status_name(k_statuses[j]));
      cr_assert_str_neq(str, pstar_status_string(k_statuses[j]), "%s and %s share a description", name,
                        pstar_status_name(k_statuses[j]));
    }
  }
}

Test(status, unknown_values_are_named_unknown) {
  const int unknown[] = {1, 2, -13, -100, 12345, -2147483647};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
    const pstar_status s = (pstar_status)unknown[i];
    cr_assert_str_eq(pstar_status_name(s), "PSTAR_ERR_UNKNOWN", "value %d", unknown[i]);
    const char *str = pstar_status_string(s);
    cr_assert_not_null(str);
    cr_assert(str[0] != '\0');
  }
}

Test(version, runtime_matches_header) {
  cr_assert_eq(pstar_version(), PSTAR_VERSION_HEX);
  cr_assert_eq(PSTAR_VERSION_HEX,
               ((uint32_t)PSTAR_VERSION_MAJOR << 16) | ((uint32_t)PSTAR_VERSION_MINOR << 8) |
                   (uint32_t)PSTAR_VERSION_PATCH);
  cr_assert_eq(PSTAR_VERSION_PACK(1, 2, 3), 0x010203u);
  cr_assert_eq(PSTAR_VERSION_PACK(255, 0, 7), 0xff0007u);

  char expected[64];
  snprintf(expected, sizeof expected, "%d.%d.%d", PSTAR_VERSION_MAJOR, PSTAR_VERSION_MINOR, PSTAR_VERSION_PATCH);
  cr_assert_not_null(pstar_version_string());
  cr_assert_str_eq(pstar_version_string(), expected);
  cr_assert_str_eq(PSTAR_VERSION_STRING, expected);
}

/* ------------------------------------------------------------------------ */
/* Last error                                                                */
/* ------------------------------------------------------------------------ */

typedef struct thread_report {
  int first_was_null;
  char first[256];     /* last error on entry to the thread */
  pstar_status failed; /* status of a call that fails in the thread */
  char after[512];     /* last error after that failure */
} thread_report;

static void *thread_body(void *arg) {
  thread_report *r = (thread_report *)arg;
  const char *m = pstar_last_error_message();
  r->first_was_null = m == NULL;
  snprintf(r->first, sizeof r->first, "%s", m == NULL ? "" : m);
  uint32_t count = 0;
  r->failed = pstar_param_count(NULL, &count);
  m = pstar_last_error_message();
  snprintf(r->after, sizeof r->after, "%s", m == NULL ? "(NULL)" : m);
  return NULL;
}

static thread_report run_thread(void) {
  thread_report r;
  memset(&r, 0, sizeof r);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, thread_body, &r), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  return r;
}

Test(last_error, empty_on_a_fresh_thread) {
  const thread_report r = run_thread();
  cr_assert_eq(r.first_was_null, 0, "pstar_last_error_message() returned NULL");
  cr_assert_str_eq(r.first, "");
}

Test(last_error, never_null_and_describes_the_failure) {
  cr_assert_not_null(pstar_last_error_message());
  T_FAIL(pstar_engine_create(NULL, NULL), PSTAR_ERR_INVALID_ARGUMENT, "options");
  cr_assert_not_null(pstar_last_error_message());
  /* A successful call leaves it non-NULL. */
  uint32_t v = pstar_version();
  (void)v;
  cr_assert_not_null(pstar_last_error_message());
}

Test(last_error, is_per_thread) {
  /* Fail on the main thread with one message... */
  pstar_engine *e = (pstar_engine *)(uintptr_t)0x1;
  T_FAIL(pstar_engine_create(NULL, &e), PSTAR_ERR_INVALID_ARGUMENT, "options");
  cr_assert_eq((uintptr_t)e, (uintptr_t)0x1, "out_engine written on failure");
  char main_msg[T_MSG_CAP];
  t_copy_last_error(main_msg, sizeof main_msg);

  /* ...another thread starts empty and gets its own message... */
  const thread_report r = run_thread();
  cr_assert_str_eq(r.first, "", "the other thread sees \"%s\"", r.first);
  cr_assert_eq(r.failed, PSTAR_ERR_INVALID_HANDLE);
  cr_assert(strstr(r.after, "handle") != NULL, "thread message: \"%s\"", r.after);
  cr_assert_str_neq(r.after, main_msg);

  /* ...and this thread's message is untouched. */
  cr_assert_str_eq(pstar_last_error_message(), main_msg);
}

/* ------------------------------------------------------------------------ */
/* Log callback                                                              */
/* ------------------------------------------------------------------------ */

typedef struct log_sink {
  pthread_mutex_t mu;
  int calls;
  int error_calls; /* records that mention a status name */
  pstar_log_level last_level;
  char last[1024];
  char matching[1024];
} log_sink;

static log_sink g_sink = {PTHREAD_MUTEX_INITIALIZER, 0, 0, PSTAR_LOG_OFF, "", ""};

static void log_fn(pstar_log_level level, const char *message, void *user) {
  log_sink *s = (log_sink *)user;
  pthread_mutex_lock(&s->mu);
  ++s->calls;
  s->last_level = level;
  snprintf(s->last, sizeof s->last, "%s", message == NULL ? "(NULL)" : message);
  if (message != NULL && strstr(message, "PSTAR_ERR_") != NULL) {
    ++s->error_calls;
    snprintf(s->matching, sizeof s->matching, "%s", message);
  }
  pthread_mutex_unlock(&s->mu);
}

static int sink_error_calls(void) {
  pthread_mutex_lock(&g_sink.mu);
  const int n = g_sink.error_calls;
  pthread_mutex_unlock(&g_sink.mu);
  return n;
}

Test(log, debug_callback_receives_failures) {
  T_OK(pstar_log_set_callback(log_fn, &g_sink, PSTAR_LOG_DEBUG));
  const int before = sink_error_calls();
  uint32_t count = 0;
  T_FAIL(pstar_param_count(NULL, &count), PSTAR_ERR_INVALID_HANDLE, "handle");
  cr_assert_eq(sink_error_calls(), before + 1, "the callback did not receive the failure");
  pthread_mutex_lock(&g_sink.mu);
  cr_assert(strstr(g_sink.matching, "PSTAR_ERR_INVALID_HANDLE") != NULL, "record: \"%s\"", g_sink.matching);
  cr_assert(strstr(g_sink.matching, "handle") != NULL, "record: \"%s\"", g_sink.matching);
  pthread_mutex_unlock(&g_sink.mu);

  /* Engine creation logs at debug level too. */
  pstar_engine_options o = t_options(PSTAR_DTYPE_F32, 1024);
  pthread_mutex_lock(&g_sink.mu);
  const int calls_before = g_sink.calls;
  pthread_mutex_unlock(&g_sink.mu);
  pstar_engine *e = t_create(&o);
  pthread_mutex_lock(&g_sink.mu);
  cr_assert_gt(g_sink.calls, calls_before, "no debug record for engine creation");
  pthread_mutex_unlock(&g_sink.mu);
  T_OK(pstar_engine_destroy(e));

  /* Reset: NULL restores the default sink; our callback is no longer called. */
  T_OK(pstar_log_set_callback(NULL, NULL, PSTAR_LOG_OFF));
  const int after_reset = sink_error_calls();
  T_FAIL(pstar_param_count(NULL, &count), PSTAR_ERR_INVALID_HANDLE, "handle");
  cr_assert_eq(sink_error_calls(), after_reset, "callback called after reset");
}

Test(log, level_filters_records) {
  T_OK(pstar_log_set_callback(log_fn, &g_sink, PSTAR_LOG_ERROR));
  const int before = sink_error_calls();
  uint32_t count = 0;
  T_FAIL(pstar_param_count(NULL, &count), PSTAR_ERR_INVALID_HANDLE, "handle");
  cr_assert_eq(sink_error_calls(), before, "a debug record passed a minimum level of ERROR");
  T_OK(pstar_log_set_callback(log_fn, &g_sink, PSTAR_LOG_DEBUG));
  T_FAIL(pstar_param_count(NULL, &count), PSTAR_ERR_INVALID_HANDLE, "handle");
  cr_assert_eq(sink_error_calls(), before + 1);
  T_OK(pstar_log_set_callback(NULL, NULL, PSTAR_LOG_WARN));
}

Test(log, unknown_level_is_rejected) {
  T_FAIL(pstar_log_set_callback(log_fn, &g_sink, (pstar_log_level)5), PSTAR_ERR_INVALID_ARGUMENT, "level");
  T_FAIL(pstar_log_set_callback(log_fn, &g_sink, (pstar_log_level)-1), PSTAR_ERR_INVALID_ARGUMENT, "level");
  /* The rejected call did not install the callback. */
  const int before = sink_error_calls();
  uint32_t count = 0;
  T_STATUS(pstar_param_count(NULL, &count), PSTAR_ERR_INVALID_HANDLE);
  cr_assert_eq(sink_error_calls(), before);
}

Test(memory, free_null_is_a_no_op) {
  pstar_free(NULL);
  cr_assert_not_null(pstar_last_error_message());
}
