// pstar-run: starts N ranks of a program on this host with the torchrun-style
// environment libpstar reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), forwards each rank's output line by line with a
// "[rank k] " prefix, and stops every rank as soon as one fails.  See
// docs/launching.md.  The C++ standard library and POSIX, and CLI11 for the
// command line (tools/common/tool_cli.h).
//
// One thread, one poll loop: the ranks' pipes plus a self-pipe that the
// signal handlers (SIGCHLD, SIGINT, SIGTERM, SIGHUP) write to.  Each rank is
// the leader of its own process group so that stopping it reaches whatever
// it started too.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tool_cli.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using pstar::tools::UsageError;

constexpr int kMaxRanks = 1024;
constexpr size_t kMaxLine = 64 * 1024;  // longer lines are cut into pieces
constexpr double kDrainSeconds = 2.0;   // output still open after every rank exited

[[noreturn]] void fatal(const std::string& message) {
  std::fprintf(stderr, "pstar-run: %s\n", message.c_str());
  std::exit(1);
}

// ---- options ---------------------------------------------------------------

struct Options {
  int nproc = 0;
  std::string master_addr = "127.0.0.1";
  int port = 0;          // 0: pick a free one
  double timeout_s = 0;  // 0: none
  double grace_s = 5;
  std::vector<std::string> program;  // program and its arguments
};

long parse_integer(const std::string& option, const std::string& text, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi ||
      !(std::isdigit(static_cast<unsigned char>(text[0]))))
    throw UsageError(option + " takes an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", not '" +
                     text + "'");
  return v;
}

double parse_seconds(const std::string& option, const std::string& text, bool zero_ok) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < 0 || (v == 0 && !zero_ok) ||
      v > 1e7 || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.'))
    throw UsageError(option + " takes a number of seconds" + (zero_ok ? "" : " above 0") + ", not '" + text + "'");
  return v;
}

// The command line through CLI11 (tools/common/tool_cli.h).  Options end at
// "--" or at the first argument that is not an option (prefix_command): the
// program and its arguments are what CLI11 leaves over, after the "--" if
// one was given.  It leaves over an option it does not know as well, in
// front of them: the leftovers must be the end of argv and start with "-"
// only after "--".
Options parse_options(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Starts N ranks of program on this host with RANK, WORLD_SIZE, LOCAL_RANK,\n"
      "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; prefixes their output\n"
      "with \"[rank k] \"; exits with the first failing rank's status (128+signal\n"
      "for a rank killed by a signal) after stopping the others, 0 when all succeed.",
      "pstar-run"};
  pstar::tools::configure(app, "usage: pstar-run -n N [options] [--] program [args...]");
  app.prefix_command();
  CLI::Option* nproc =
      app.add_option_function<std::string>(
             "-n,--nproc", [&](const std::string& v) { o.nproc = int(parse_integer("-n", v, 1, kMaxRanks)); },
             "number of ranks (1..1024)")
          ->type_name("N");
  app.add_option("--master-addr", o.master_addr, "address of rank 0's rendezvous server (default 127.0.0.1)")
      ->type_name("ADDR");
  app.add_option_function<std::string>(
         "--port", [&](const std::string& v) { o.port = int(parse_integer("--port", v, 1, 65535)); },
         "rendezvous port (default: a free port picked here)")
      ->type_name("P");
  app.add_option_function<std::string>(
         "--timeout", [&](const std::string& v) { o.timeout_s = parse_seconds("--timeout", v, false); },
         "stop every rank after S seconds and exit 124")
      ->type_name("S");
  app.add_option_function<std::string>(
         "--grace", [&](const std::string& v) { o.grace_s = parse_seconds("--grace", v, true); },
         "seconds between SIGTERM and SIGKILL when stopping (default 5)")
      ->type_name("S");
  pstar::tools::parse_or_exit(app, argc, argv, [&] {
    std::vector<std::string> rest = app.remaining();
    const size_t n = rest.size();
    const bool tail = n < size_t(argc) && std::equal(rest.begin(), rest.end(), argv + (argc - n));
    const bool separated = tail && n > 0 && rest[0] == "--";
    if (tail) pstar::tools::reject_empty_values(argv + 1, argv + (argc - n));
    const auto is_option = [](const std::string& a) { return a.size() > 1 && a[0] == '-'; };
    if (!tail || (!separated && n > 0 && is_option(rest[0]))) {
      const auto unknown = std::find_if(rest.begin(), rest.end(), is_option);
      throw UsageError("unknown option '" + (unknown != rest.end() ? *unknown : rest[0]) + "'");
    }
    o.program.assign(rest.begin() + (separated ? 1 : 0), rest.end());
    if (nproc->count() == 0) throw UsageError("-n N is required");
    if (o.master_addr.empty()) throw UsageError("--master-addr needs a non-empty address");
    if (o.program.empty()) throw UsageError("no program given");
  });
  return o;
}

// ---- the port --------------------------------------------------------------

// Binds port 0 on the master address, reads the port the kernel chose and
// closes the socket.  Another process may take the port before rank 0 binds
// it (docs/launching.md): --port avoids the race where that matters.
int pick_free_port(const std::string& addr) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(addr.c_str(), "0", &hints, &found);
  if (rc != 0) fatal("cannot resolve master address '" + addr + "': " + gai_strerror(rc));
  std::string last_error = "no address";
  int port = 0;
  for (addrinfo* a = found; a != nullptr && port == 0; a = a->ai_next) {
    const int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (s < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (bind(s, a->ai_addr, a->ai_addrlen) == 0 && getsockname(s, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      if (bound.ss_family == AF_INET)
        port = ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      else if (bound.ss_family == AF_INET6)
        port = ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
    } else {
      last_error = std::strerror(errno);
    }
    close(s);
  }
  freeaddrinfo(found);
  if (port == 0)
    fatal("cannot bind a port on master address '" + addr + "': " + last_error +
          " (the ranks run on this host, so the address must be one of its own)");
  return port;
}

// ---- output forwarding -----------------------------------------------------

bool g_stdout_ok = true, g_stderr_ok = true;

void write_all(int fd, const std::string& data) {
  bool& ok = fd == STDOUT_FILENO ? g_stdout_ok : g_stderr_ok;
  size_t done = 0;
  while (ok && done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ok = false;  // the reader went away (EPIPE): drop this stream's output
      break;
    }
    done += static_cast<size_t>(n);
  }
}

// One of a rank's output streams: the read end of its pipe, the part of a
// line not yet written, and where its lines go.
struct Stream {
  int fd = -1;
  int out_fd = STDOUT_FILENO;
  std::string pending;
};

struct Rank {
  int index = 0;
  std::string prefix;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
  bool output_open() const { return out.fd >= 0 || err.fd >= 0; }
};

// Writes every complete line of `s` (all of it when `flush_all`), each with
// the prefix and as one write, so lines from different ranks never mix.
void emit_lines(const std::string& prefix, Stream& s, bool flush_all) {
  size_t start = 0;
  std::string line;
  while (start < s.pending.size()) {
    const size_t nl = s.pending.find('\n', start);
    size_t end;  // one past the line's last character, newline excluded
    size_t next;
    if (nl != std::string::npos && nl - start <= kMaxLine) {
      end = nl;
      next = nl + 1;
    } else if (s.pending.size() - start > kMaxLine) {
      end = next = start + kMaxLine;
    } else if (flush_all) {
      end = next = s.pending.size();
    } else {
      break;
    }
    line.assign(prefix);
    line.append(s.pending, start, end - start);
    line.push_back('\n');
    write_all(s.out_fd, line);
    start = next;
  }
  s.pending.erase(0, start);
}

// Reads what is there; at end of file writes the partial last line too.
void read_stream(const std::string& prefix, Stream& s) {
  char buf[65536];
  const ssize_t n = read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    emit_lines(prefix, s, true);
    close(s.fd);
    s.fd = -1;
    return;
  }
  s.pending.append(buf, static_cast<size_t>(n));
  emit_lines(prefix, s, false);
}

// ---- signals ---------------------------------------------------------------

int g_signal_pipe[2] = {-1, -1};
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};

extern "C" void on_signal(int signo) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : kForwarded) sigaddset(&set, s);
  return set;
}

// Installs the handlers, and unblocks their signals in case the parent left
// them blocked (the ranks inherit this mask).
void install_handlers() {
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) fatal(std::string("pipe: ") + std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, nullptr);
  for (int s : kForwarded) sigaction(s, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  const sigset_t handled = handled_signals();
  sigprocmask(SIG_UNBLOCK, &handled, nullptr);
}

// ---- starting ranks --------------------------------------------------------

bool is_executable_file(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

// Fails early, once, when the program cannot be found on PATH (instead of N
// identical errors from the ranks).
void check_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return;  // exec reports it
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    if (is_executable_file(dir + "/" + program)) return;
    start = end + 1;
  }
  std::fprintf(stderr, "pstar-run: %s: command not found\n", program.c_str());
  std::exit(127);
}

// The parent's environment without the variables pstar-run sets, and
// without torchrun's claim to serve the store (pstar-run started inside a
// torchrun worker: its ranks meet at pstar-run's port, where rank 0 serves
// libpstar's store, not at torchrun's).
std::vector<std::string> inherited_environment() {
  static const char* const kOwn[] = {"RANK",
                                     "WORLD_SIZE",
                                     "LOCAL_RANK",
                                     "LOCAL_WORLD_SIZE",
                                     "MASTER_ADDR",
                                     "MASTER_PORT",
                                     "TORCHELASTIC_USE_AGENT_STORE"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (std::none_of(std::begin(kOwn), std::end(kOwn), [&](const char* o) { return name == o; })) env.push_back(entry);
  }
  return env;
}

// Starts one rank; false (with a message written) when it cannot.
bool start_rank(Rank& r, const Options& o, int port, const std::vector<std::string>& base_env) {
  std::vector<std::string> env = base_env;
  const std::string n = std::to_string(o.nproc);
  env.push_back("RANK=" + std::to_string(r.index));
  env.push_back("WORLD_SIZE=" + n);
  env.push_back("LOCAL_RANK=" + std::to_string(r.index));
  env.push_back("LOCAL_WORLD_SIZE=" + n);
  env.push_back("MASTER_ADDR=" + o.master_addr);
  env.push_back("MASTER_PORT=" + std::to_string(port));
  std::vector<char*> envp, argv;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o.program;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "pstar-run: cannot start rank %d: pipe: %s\n", r.index, std::strerror(errno));
    for (int fd : {out[0], out[1]})
      if (fd >= 0) close(fd);
    return false;
  }

  // Signals stay blocked across fork so that the child never runs the
  // parent's handlers (which write to the parent's self-pipe).
  const sigset_t handled = handled_signals();
  sigset_t old;
  sigprocmask(SIG_BLOCK, &handled, &old);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "pstar-run: cannot start rank %d: fork: %s\n", r.index, std::strerror(errno));
    sigprocmask(SIG_SETMASK, &old, nullptr);
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    return false;
  }
  if (pid == 0) {
    setpgid(0, 0);
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // pstar-run killed outright: so are the ranks
    if (getppid() != parent) _exit(1);
#endif
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGCHLD, &dfl, nullptr);
    sigaction(SIGPIPE, &dfl, nullptr);
    for (int s : kForwarded) sigaction(s, &dfl, nullptr);
    sigprocmask(SIG_SETMASK, &old, nullptr);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0 && devnull != STDIN_FILENO) {
      dup2(devnull, STDIN_FILENO);
      close(devnull);
    }
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    environ = envp.data();
    execvp(argv[0], argv.data());
    const int e = errno;
    const std::string msg = "pstar-run: cannot execute " + o.program[0] + ": " + std::strerror(e) + "\n";
    [[maybe_unused]] const ssize_t w = write(STDERR_FILENO, msg.data(), msg.size());
    _exit(e == ENOENT ? 127 : 126);
  }
  setpgid(pid, pid);  // also here: no window in which the group does not exist
  sigprocmask(SIG_SETMASK, &old, nullptr);
  close(out[1]);
  close(err[1]);
  r.pid = pid;
  r.running = true;
  r.out = Stream{out[0], STDOUT_FILENO, {}};
  r.err = Stream{err[0], STDERR_FILENO, {}};
  return true;
}

// Signals a rank's process group (the rank and what it started).  Only while
// the rank runs or still holds its pipes open: a reaped leader's group id
// must not be reused blindly.
void signal_rank(const Rank& r, int signo) {
  if (r.pid <= 0 || (!r.running && !r.output_open())) return;
  if (kill(-r.pid, signo) != 0 && r.running) kill(r.pid, signo);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// ---- the supervisor --------------------------------------------------------

class Supervisor {
 public:
  Supervisor(const Options& o, std::vector<Rank>& ranks) : o_(o), ranks_(ranks) {}

  // A rank could not be started: stop those that were, fail with status 1.
  void abort_start() {
    record(1);
    terminate(SIGTERM);
  }

  int run() {
    const Clock::time_point start = Clock::now();
    std::optional<Clock::time_point> timeout_at;
    if (o_.timeout_s > 0) timeout_at = start + seconds(o_.timeout_s);
    std::optional<Clock::time_point> drain_until;
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    std::vector<const Rank*> owners;
    while (true) {
      reap();
      const Clock::time_point now = Clock::now();
      if (timeout_at && now >= *timeout_at && !terminating_) {
        std::fprintf(stderr, "pstar-run: timeout after %g s; stopping the ranks\n", o_.timeout_s);
        record(124);
        terminate(SIGTERM);
      }
      if (kill_at_ && now >= *kill_at_) {
        for (const Rank& r : ranks_) signal_rank(r, SIGKILL);
        kill_at_.reset();
      }
      const bool all_exited = std::none_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
      if (all_exited) {
        if (!drain_until) drain_until = now + seconds(kDrainSeconds);
        const bool open = std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.output_open(); });
        if (!open || now >= *drain_until) break;
      }

      fds.clear();
      streams.clear();
      owners.clear();
      fds.push_back({g_signal_pipe[0], POLLIN, 0});
      streams.push_back(nullptr);
      owners.push_back(nullptr);
      for (Rank& r : ranks_)
        for (Stream* s : {&r.out, &r.err})
          if (s->fd >= 0) {
            fds.push_back({s->fd, POLLIN, 0});
            streams.push_back(s);
            owners.push_back(&r);
          }
      std::optional<Clock::time_point> wake;
      const auto earliest = [&](const std::optional<Clock::time_point>& t) {
        if (t && (!wake || *t < *wake)) wake = t;
      };
      if (!terminating_) earliest(timeout_at);
      earliest(kill_at_);
      if (all_exited) earliest(drain_until);
      int wait_ms = -1;
      if (wake) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*wake - now).count();
        wait_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, 60 * 60 * 1000));
      }
      const int rc = poll(fds.data(), fds.size(), wait_ms);
      if (rc < 0) {
        if (errno == EINTR) continue;
        fatal(std::string("poll: ") + std::strerror(errno));
      }
      if (fds[0].revents & POLLIN) handle_signals();
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_stream(owners[i]->prefix, *streams[i]);
    }
    // Output still open after the drain period (something a rank started
    // keeps its pipe): write what was read, stop listening.
    for (Rank& r : ranks_)
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) {
          emit_lines(r.prefix, *s, true);
          close(s->fd);
          s->fd = -1;
        }
    if (exit_code_) return *exit_code_;
    if (interrupted_) return 128 + interrupted_;
    return 0;
  }

 private:
  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  void record(int code) {
    if (!exit_code_) exit_code_ = code;
  }

  // Sends `signo` to every rank, then SIGKILL after the grace period.
  void terminate(int signo) {
    for (const Rank& r : ranks_) signal_rank(r, signo);
    if (!terminating_) kill_at_ = Clock::now() + seconds(o_.grace_s);
    terminating_ = true;
  }

  void reap() {
    while (true) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      for (Rank& r : ranks_) {
        if (r.pid != pid) continue;
        r.running = false;
        const int code = exit_code_of(status);
        if (code != 0 && !terminating_) {
          std::fprintf(stderr, "pstar-run: rank %d %s; stopping the other ranks\n", r.index,
                       describe_status(status).c_str());
          record(code);
          terminate(SIGTERM);
        } else if (code != 0) {
          record(code);  // e.g. the ranks' answer to a forwarded SIGINT
        }
      }
    }
  }

  void handle_signals() {
    unsigned char buf[64];
    ssize_t n;
    while ((n = read(g_signal_pipe[0], buf, sizeof buf)) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        const int signo = buf[i];
        if (signo == SIGCHLD) continue;  // reap() runs every turn
        if (interrupted_) {
          std::fprintf(stderr, "pstar-run: second signal; killing the ranks\n");
          for (const Rank& r : ranks_) signal_rank(r, SIGKILL);
          continue;
        }
        interrupted_ = signo;
        std::fprintf(stderr, "pstar-run: got signal %d (%s); forwarding it to the ranks\n", signo, strsignal(signo));
        terminating_ = false;  // forward this signal even after a SIGTERM went out
        terminate(signo);
      }
    }
  }

  const Options& o_;
  std::vector<Rank>& ranks_;
  bool terminating_ = false;
  std::optional<Clock::time_point> kill_at_;
  std::optional<int> exit_code_;
  int interrupted_ = 0;
};

// Makes sure descriptors 0-2 exist, so that no pipe lands on them.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd)
    if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) < 0) std::exit(1);
}

// Two pipes a rank: raise the soft open-file limit as far as allowed.
void raise_fd_limit(int nproc) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = static_cast<rlim_t>(4 * nproc + 64);
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
    lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min(want, lim.rlim_max);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ensure_standard_fds();
  const Options o = parse_options(argc, argv);
  check_program(o.program[0]);
  raise_fd_limit(o.nproc);
  const int port = o.port != 0 ? o.port : pick_free_port(o.master_addr);
  install_handlers();
  const std::vector<std::string> base_env = inherited_environment();
  std::vector<Rank> ranks(static_cast<size_t>(o.nproc));
  for (int k = 0; k < o.nproc; ++k) {
    ranks[k].index = k;
    ranks[k].prefix = "[rank " + std::to_string(k) + "] ";
  }
  Supervisor supervisor(o, ranks);
  for (Rank& r : ranks)
    if (!start_rank(r, o, port, base_env)) {
      supervisor.abort_start();
      break;
    }
  return supervisor.run();
}
