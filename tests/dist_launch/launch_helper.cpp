// A rank for pstar-run's tests.  Resolves its launch information from the
// environment the way libpstar does and prints it, then behaves as told:
//   --lines K --width W   print K numbered lines of W characters on stdout
//   --partial             end stdout and stderr with a line without newline
//   --exit R CODE         rank R (or "all") exits with CODE after --delay-ms
//   --raise R SIG         rank R (or "all") kills itself with signal SIG
//   --sleep R             rank R (or "all") sleeps until killed
//   --ignore-term         ignore SIGTERM (only SIGKILL ends the rank)
//   --delay-ms MS         wait before --exit / --raise (default 0)
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "distributed/launch_env.h"
#include "util/error.h"

namespace {

bool applies(const char* who, int rank) {
  return std::strcmp(who, "all") == 0 || std::atoi(who) == rank;
}

}  // namespace

int main(int argc, char** argv) {
  pstar::distributed::LaunchInfo info;
  try {
    info = pstar::distributed::resolve_launch();
  } catch (const pstar::Error& e) {
    std::fprintf(stderr, "launch error: %s\n", e.what());
    return 3;
  }
  const int rank = info.rank;
  std::printf("rank=%d world=%d local_rank=%d local_world=%d addr=%s port=%u source=%s pid=%ld\n",
              rank, info.world_size, info.local_rank, info.local_world_size,
              info.master_addr.c_str(), static_cast<unsigned>(info.master_port),
              info.source.c_str(), static_cast<long>(getpid()));
  std::fflush(stdout);
  std::fprintf(stderr, "stderr of rank=%d\n", rank);
  std::fflush(stderr);

  long lines = 0, width = 16, delay_ms = 0;
  bool partial = false, sleep = false;
  int exit_code = -1, raise_signal = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "helper: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--lines") {
      lines = std::atol(next());
    } else if (a == "--width") {
      width = std::atol(next());
    } else if (a == "--partial") {
      partial = true;
    } else if (a == "--exit") {
      const char* who = next();
      const int code = std::atoi(next());
      if (applies(who, rank)) exit_code = code;
    } else if (a == "--raise") {
      const char* who = next();
      const int sig = std::atoi(next());
      if (applies(who, rank)) raise_signal = sig;
    } else if (a == "--sleep") {
      if (applies(next(), rank)) sleep = true;
    } else if (a == "--ignore-term") {
      signal(SIGTERM, SIG_IGN);
    } else if (a == "--delay-ms") {
      delay_ms = std::atol(next());
    } else {
      std::fprintf(stderr, "helper: unknown argument %s\n", a.c_str());
      return 2;
    }
  }

  const std::string fill(static_cast<size_t>(width), static_cast<char>('a' + rank % 26));
  for (long i = 0; i < lines; ++i) std::printf("rank=%d line=%ld %s\n", rank, i, fill.c_str());
  std::fflush(stdout);
  if (partial) {
    std::printf("tail of rank=%d", rank);
    std::fflush(stdout);
    std::fprintf(stderr, "error tail of rank=%d", rank);
    std::fflush(stderr);
  }
  if (exit_code >= 0 || raise_signal > 0) {
    if (delay_ms > 0) usleep(static_cast<useconds_t>(delay_ms) * 1000);
    if (raise_signal > 0) {
      signal(raise_signal, SIG_DFL);
      raise(raise_signal);
    }
    return exit_code >= 0 ? exit_code : 0;
  }
  if (sleep) {
    std::printf("sleeping rank=%d\n", rank);
    std::fflush(stdout);
    for (;;) pause();
  }
  return 0;
}
