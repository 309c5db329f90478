/*
 * Helpers for the data-parallel engine tests: ranks as forked child
 * processes of the test, results in shared memory, a free loopback port for
 * the rendezvous.
 *
 * Children never use Criterion's assertions (they are separate processes):
 * they record statuses and messages in their rank_out and exit; the parent
 * asserts.  The parent creates no engine before forking, so children start
 * without the library's threads.
 */
#ifndef PSTAR_TESTS_DIST_TEST_UTIL_H
#define PSTAR_TESTS_DIST_TEST_UTIL_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pstar/pstar.h"

#define D_MAX_RANKS 8

/* A port the kernel reports free on 127.0.0.1 (bind to 0, read, close).
 * Another process may take it before rank 0 binds it; rare on a test host. */
static inline int d_free_port(void) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert(fd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t len = sizeof a;
  cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return (int)ntohs(a.sin_port);
}

/* Shared memory for `bytes`, zero-filled, visible to forked children. */
static inline void *d_shared(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert(p != MAP_FAILED);
  memset(p, 0, bytes);
  return p;
}

static inline double d_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The launcher variables a child must not inherit from the test's own
 * environment. */
static inline void d_clear_launch_env(void) {
  static const char *const names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
                                      "SLURM_TASKS_PER_NODE", "SLURM_NODEID", "MASTER_ADDR", "MASTER_PORT"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) unsetenv(names[i]);
}

/* Runs fn(rank, arg) in `n` forked children with MASTER_ADDR=127.0.0.1 and
 * MASTER_PORT set to a free port (children exit with fn's value), and waits
 * for all of them until `deadline_s`; then kills what is left.  Writes each
 * child's wait status into status[] (-1 if it had to be killed) and returns
 * the number of children that did not exit 0. */
typedef int (*d_rank_fn)(int rank, void *arg);

static inline int d_run_ranks(int n, d_rank_fn fn, void *arg, double deadline_s, int *status) {
  char port[16];
  pid_t pids[D_MAX_RANKS];
  cr_assert(n >= 1 && n <= D_MAX_RANKS);
  snprintf(port, sizeof port, "%d", d_free_port());
  fflush(NULL);
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    cr_assert(pid >= 0, "fork failed");
    if (pid == 0) {
      d_clear_launch_env();
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port, 1);
      const int rc = fn(r, arg);
      _exit(rc);
    }
    pids[r] = pid;
    status[r] = -1;
  }
  const double end = d_now() + deadline_s;
  int left = n, failed = 0;
  while (left > 0) {
    int ws = 0;
    const pid_t got = waitpid(-1, &ws, WNOHANG);
    if (got > 0) {
      for (int r = 0; r < n; ++r) {
        if (pids[r] == got) {
          status[r] = ws;
          if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) ++failed;
          --left;
        }
      }
      continue;
    }
    if (got < 0 && errno != EINTR) break;
    if (d_now() > end) {
      for (int r = 0; r < n; ++r) {
        if (status[r] == -1) kill(pids[r], SIGKILL);
      }
      while (waitpid(-1, &ws, 0) > 0) {
      }
      return n + 1; /* a hang: more than every rank failing */
    }
    usleep(2000);
  }
  return failed;
}

#endif /* PSTAR_TESTS_DIST_TEST_UTIL_H */
