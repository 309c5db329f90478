#include "distributed/store/socket_io.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>

namespace pstar::distributed::net {

using std::chrono::milliseconds;

namespace {

// Pauses between connection attempts (connect_retrying).
constexpr milliseconds kFirstRetryPause{10};
constexpr milliseconds kMaxRetryPause{1000};
// How much of a key a message shows.
constexpr std::size_t kKeyShownBytes = 64;

// poll(2)'s timeout for a deadline: milliseconds rounded up (never 0 before
// the deadline, or we would spin), clamped to int.
int poll_timeout_ms(Clock::time_point deadline) {
  const Clock::time_point now = Clock::now();
  if (now >= deadline) return 0;
  const auto left = std::chrono::ceil<milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<long long>(left, INT_MAX));
}

IoResult wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const int ms = poll_timeout_ms(deadline);
    if (ms == 0) return {Io::kTimedOut, 0};
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return {Io::kFailed, errno};
    }
    // Readiness, an error or a hang-up: the next send or recv tells which.
    if (rc > 0) return {};
  }
}

}  // namespace

Clock::time_point deadline_after(milliseconds timeout) {
  const Clock::time_point now = Clock::now();
  const auto room = std::chrono::duration_cast<milliseconds>(Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + timeout;
}

IoResult send_all(int fd, const void* data, std::size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (n > 0) {
    // MSG_NOSIGNAL: a closed peer must give EPIPE, not kill the process.
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const IoResult r = wait_ready(fd, POLLOUT, deadline);
      if (r.io != Io::kOk) return r;
    } else if (k < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return {Io::kClosed, errno};
    } else {
      return {Io::kFailed, errno};
    }
  }
  return {};
}

IoResult recv_all(int fd, void* data, std::size_t n, Clock::time_point deadline) {
  auto* p = static_cast<std::uint8_t*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
    } else if (k == 0) {
      return {Io::kClosed, 0};
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const IoResult r = wait_ready(fd, POLLIN, deadline);
      if (r.io != Io::kOk) return r;
    } else if (errno == ECONNRESET) {
      return {Io::kClosed, errno};
    } else {
      return {Io::kFailed, errno};
    }
  }
  return {};
}

// What went wrong during `doing` ("sending the request", ...).
std::string io_message(const IoResult& r, milliseconds timeout, const char* doing) {
  switch (r.io) {
    case Io::kOk: return "ok";
    case Io::kTimedOut: return "timed out after " + std::to_string(timeout.count()) + " ms while " + doing;
    case Io::kClosed: return std::string("the server closed the connection while ") + doing;
    case Io::kFailed: return std::string(doing) + ": " + std::strerror(r.err);
  }
  return "?";
}

std::string quote_key(const std::string& key) {
  std::string out = "\"";
  const std::size_t shown = std::min(key.size(), kKeyShownBytes);
  for (std::size_t i = 0; i < shown; ++i) {
    const unsigned char ch = static_cast<unsigned char>(key[i]);
    if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') {
      out += static_cast<char>(ch);
    } else {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", ch);
      out += esc;
    }
  }
  out += "\"";
  if (key.size() > shown) out += "... (" + std::to_string(key.size()) + " bytes)";
  return out;
}

std::string endpoint_of(const std::string& host, std::uint16_t port) {
  const bool ipv6_literal = host.find(':') != std::string::npos;
  return (ipv6_literal ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Connected connect_tcp(const std::string& host, std::uint16_t port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int gai = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (gai != 0) return {-1, std::string("cannot resolve the host: ") + gai_strerror(gai)};
  Connected result{-1, "no address"};
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      result.error = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
      const IoResult r = wait_ready(fd, POLLOUT, deadline);
      if (r.io == Io::kOk) {
        int err = 0;
        socklen_t len = sizeof err;
        rc = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 ? 0 : -1;
        errno = err;
      } else {
        rc = -1;
        errno = r.io == Io::kTimedOut ? ETIMEDOUT : r.err;
      }
    }
    if (rc == 0) {
      result.fd = fd;
      break;
    }
    result.error = std::string("connect: ") + std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(found);
  if (result.fd >= 0) {
    // Small requests and responses that alternate: Nagle's algorithm would
    // hold each back for a delayed ACK.
    const int one = 1;
    setsockopt(result.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return result;
}

Attempt connect_retrying(const std::function<Attempt(Clock::time_point)>& attempt, Clock::time_point deadline,
                         const std::string& server) {
  const Clock::time_point started = Clock::now();
  milliseconds pause = kFirstRetryPause;
  for (;;) {
    Attempt a = attempt(deadline);
    if (a.fd >= 0 || a.fatal) return a;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      const auto waited = std::chrono::duration_cast<milliseconds>(now - started).count();
      a.error = "could not reach " + server + " within " + std::to_string(waited) + " ms (last error: " + a.error + ")";
      return a;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, kMaxRetryPause);
  }
}

}  // namespace pstar::distributed::net
