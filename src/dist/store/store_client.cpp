#include "dist/store/store_client.h"

#include <errno.h>
#include <fcntl.h>
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

#include "util/error.h"
#include "util/log.h"

namespace pstar::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Pauses between connection attempts: short at first (the server is usually
// about to come up), growing to a ceiling so a missing server costs little.
constexpr milliseconds kFirstRetryPause{10};
constexpr milliseconds kMaxRetryPause{1000};
// How much of a key a message shows.
constexpr std::size_t kKeyShownBytes = 64;

Clock::time_point deadline_after(milliseconds timeout) {
  const Clock::time_point now = Clock::now();
  const auto room = std::chrono::duration_cast<milliseconds>(Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + timeout;
}

// poll(2)'s timeout for a deadline: milliseconds rounded up (never 0 before
// the deadline, or we would spin), clamped to int.
int poll_timeout_ms(Clock::time_point deadline) {
  const Clock::time_point now = Clock::now();
  if (now >= deadline) return 0;
  const auto left = std::chrono::ceil<milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<long long>(left, INT_MAX));
}

enum class Io { kOk, kTimedOut, kClosed, kFailed };

struct IoResult {
  Io io = Io::kOk;
  int err = 0;  // errno for kFailed
};

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
    case Io::kTimedOut:
      return "timed out after " + std::to_string(timeout.count()) + " ms while " + doing;
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

// One connection attempt's outcome.
struct Attempt {
  int fd = -1;
  bool fatal = false;  // do not retry
  std::string error;
};

Attempt try_connect_once(const std::string& host, std::uint16_t port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int gai = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (gai != 0) return {-1, false, std::string("cannot resolve the host: ") + gai_strerror(gai)};
  Attempt result{-1, false, "no address"};
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
  if (result.fd < 0) return result;

  const int fd = result.fd;
  // Small requests and responses that alternate: Nagle's algorithm would
  // hold each back for a delayed ACK.
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const std::vector<std::uint8_t> hello = wire::encode_hello();
  std::uint8_t reply[wire::kHelloBytes];
  IoResult r = send_all(fd, hello.data(), hello.size(), deadline);
  if (r.io == Io::kOk) r = recv_all(fd, reply, sizeof reply, deadline);
  if (r.io != Io::kOk) {
    ::close(fd);
    const char* what = r.io == Io::kTimedOut ? "timed out during the handshake"
                       : r.io == Io::kClosed ? "the server closed the connection during the handshake"
                                             : "handshake failed";
    return {-1, false, r.io == Io::kFailed ? std::string(what) + ": " + std::strerror(r.err) : what};
  }
  const std::uint32_t magic = wire::load_u32(reply);
  const std::uint32_t version = wire::load_u32(reply + 4);
  if (magic != wire::kMagic) {
    ::close(fd);
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08x", magic);
    return {-1, true, std::string("the peer is not a libpstar store (magic ") + hex + ")"};
  }
  if (version != wire::kProtocolVersion) {
    ::close(fd);
    return {-1, true,
            "the server speaks store protocol version " + std::to_string(version) + ", this client version " +
                std::to_string(wire::kProtocolVersion)};
  }
  return result;
}

}  // namespace

StoreClient::StoreClient(StoreClientOptions options) : options_(std::move(options)) {
  const bool ipv6_literal = options_.host.find(':') != std::string::npos;
  endpoint_ = (ipv6_literal ? "[" + options_.host + "]" : options_.host) + ":" + std::to_string(options_.port);
  if (options_.connect_timeout.count() <= 0 || options_.timeout.count() <= 0) {
    fail(PSTAR_ERR_INVALID_ARGUMENT, "connect", "timeouts must be positive");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  connect_until(deadline_after(options_.connect_timeout), "connect");
}

StoreClient::~StoreClient() { close_connection(); }

void StoreClient::close_connection() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void StoreClient::fail(int status, const std::string& what, const std::string& detail) {
  throw Error(static_cast<pstar_status>(status), "store client " + endpoint_ + ": " + what + ": " + detail);
}

void StoreClient::connect_until(Clock::time_point deadline, const std::string& what) {
  const Clock::time_point started = Clock::now();
  milliseconds pause = kFirstRetryPause;
  for (;;) {
    Attempt a = try_connect_once(options_.host, options_.port, deadline);
    if (a.fd >= 0) {
      fd_ = a.fd;
      log::debug("store client " + endpoint_ + ": connected");
      return;
    }
    if (a.fatal) fail(PSTAR_ERR_COMM, what, a.error);
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      const auto waited = std::chrono::duration_cast<milliseconds>(now - started).count();
      fail(PSTAR_ERR_COMM, what,
           "could not reach the store server within " + std::to_string(waited) + " ms (last error: " + a.error + ")");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, kMaxRetryPause);
  }
}

std::string StoreClient::describe(wire::Op op, const std::vector<std::string>& keys) const {
  std::string s = std::string(wire::op_name(op)) + "(";
  constexpr std::size_t kShownKeys = 3;
  for (std::size_t i = 0; i < keys.size() && i < kShownKeys; ++i) {
    if (i > 0) s += ", ";
    s += quote_key(keys[i]);
  }
  if (keys.size() > kShownKeys) s += ", ... " + std::to_string(keys.size()) + " keys";
  return s + ")";
}

void StoreClient::check_key(const std::string& key, const std::string& what) const {
  if (key.size() > wire::kMaxKeyBytes) {
    throw Error(PSTAR_ERR_INVALID_ARGUMENT, "store client " + endpoint_ + ": " + what + ": key of " +
                                                std::to_string(key.size()) + " bytes exceeds the limit of " +
                                                std::to_string(wire::kMaxKeyBytes));
  }
}

StoreClient::Bytes StoreClient::call(wire::Op op, const std::vector<std::string>& keys, const void* value,
                                     std::size_t value_bytes, milliseconds timeout, long expected_payload) {
  const std::string what = describe(op, keys);
  for (const std::string& k : keys) check_key(k, what);
  if (value_bytes > wire::kMaxValueBytes) {
    fail(PSTAR_ERR_INVALID_ARGUMENT, what,
         "value of " + std::to_string(value_bytes) + " bytes exceeds the limit of " +
             std::to_string(wire::kMaxValueBytes));
  }
  const std::size_t body_bytes = wire::request_body_bytes(keys, value_bytes);
  if (body_bytes > wire::kMaxRequestBodyBytes) {
    fail(PSTAR_ERR_INVALID_ARGUMENT, what,
         "request of " + std::to_string(body_bytes) + " bytes exceeds the frame limit of " +
             std::to_string(wire::kMaxRequestBodyBytes));
  }
  if (timeout.count() <= 0) fail(PSTAR_ERR_INVALID_ARGUMENT, what, "the timeout must be positive");

  std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point deadline = deadline_after(timeout);
  if (fd_ < 0) connect_until(deadline, what);

  const std::vector<std::uint8_t> head = wire::encode_request_head(op, keys, value_bytes);
  IoResult r = send_all(fd_, head.data(), head.size(), deadline);
  if (r.io == Io::kOk && value_bytes > 0) r = send_all(fd_, value, value_bytes, deadline);
  if (r.io != Io::kOk) {
    close_connection();
    fail(PSTAR_ERR_COMM, what, io_message(r, timeout, "sending the request"));
  }
  std::uint8_t response_head[wire::kLengthPrefixBytes + wire::kResponseFixedBytes];
  r = recv_all(fd_, response_head, sizeof response_head, deadline);
  if (r.io != Io::kOk) {
    // Closing makes the server forget a parked request and keeps a late
    // answer from being read as the answer to the next request.
    close_connection();
    fail(PSTAR_ERR_COMM, what, io_message(r, timeout, "waiting for the response"));
  }
  const std::uint32_t body = wire::load_u32(response_head);
  const std::uint8_t status = response_head[4];
  if (body < wire::kResponseFixedBytes || body > wire::kMaxResponseBodyBytes) {
    close_connection();
    fail(PSTAR_ERR_COMM, what, "protocol error: response of " + std::to_string(body) + " bytes");
  }
  Bytes payload(body - wire::kResponseFixedBytes);
  r = recv_all(fd_, payload.data(), payload.size(), deadline);
  if (r.io != Io::kOk) {
    close_connection();
    fail(PSTAR_ERR_COMM, what, io_message(r, timeout, "receiving the response"));
  }
  switch (static_cast<wire::ResponseStatus>(status)) {
    case wire::ResponseStatus::kOk:
      break;
    case wire::ResponseStatus::kNotANumber:
      fail(PSTAR_ERR_INVALID_ARGUMENT, what, "the stored value is not an int64 in decimal text");
    case wire::ResponseStatus::kOverflow:
      fail(PSTAR_ERR_INVALID_ARGUMENT, what, "the sum overflows int64");
    default:
      close_connection();
      fail(PSTAR_ERR_COMM, what, "protocol error: unknown response status " + std::to_string(status));
  }
  if (expected_payload >= 0 && payload.size() != static_cast<std::size_t>(expected_payload)) {
    close_connection();
    fail(PSTAR_ERR_COMM, what,
         "protocol error: response payload of " + std::to_string(payload.size()) + " bytes, expected " +
             std::to_string(expected_payload));
  }
  return payload;
}

void StoreClient::set(const std::string& key, const void* data, std::size_t size) {
  call(wire::Op::kSet, {key}, data, size, options_.timeout, 0);
}

StoreClient::Bytes StoreClient::get(const std::string& key) { return get(key, options_.timeout); }

StoreClient::Bytes StoreClient::get(const std::string& key, milliseconds timeout) {
  return call(wire::Op::kGet, {key}, nullptr, 0, timeout, -1);
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t delta) {
  std::uint8_t bytes[8];
  wire::store_u64(bytes, static_cast<std::uint64_t>(delta));
  const Bytes reply = call(wire::Op::kAdd, {key}, bytes, sizeof bytes, options_.timeout, 8);
  return static_cast<std::int64_t>(wire::load_u64(reply.data()));
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, options_.timeout); }

void StoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  if (keys.empty()) return;
  call(wire::Op::kWait, keys, nullptr, 0, timeout, 0);
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  return call(wire::Op::kCheck, keys, nullptr, 0, options_.timeout, 1)[0] != 0;
}

bool StoreClient::erase(const std::string& key) {
  return call(wire::Op::kDelete, {key}, nullptr, 0, options_.timeout, 1)[0] != 0;
}

std::uint64_t StoreClient::num_keys() {
  return wire::load_u64(call(wire::Op::kNumKeys, {}, nullptr, 0, options_.timeout, 8).data());
}

}  // namespace pstar::dist
