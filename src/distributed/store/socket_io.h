// Blocking socket I/O bounded by a deadline, shared by the two store clients
// (store_client.h: libpstar's own protocol; tcpstore_client.h: PyTorch's
// c10d TCPStore protocol).  Sockets are non-blocking; every wait is a
// poll(2) that ends at the caller's deadline, so a call never blocks longer
// than the timeout its caller was given.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace pstar::distributed::net {

using Clock = std::chrono::steady_clock;

// now + timeout, saturating at time_point::max().
Clock::time_point deadline_after(std::chrono::milliseconds timeout);

enum class Io { kOk, kTimedOut, kClosed, kFailed };

struct IoResult {
  Io io = Io::kOk;
  int err = 0;  // errno for kFailed (and for kClosed when the kernel gave one)
};

// Sends or receives exactly n bytes before the deadline.  A peer that closed
// (EOF, EPIPE, ECONNRESET) is kClosed; SIGPIPE is never raised.
IoResult send_all(int fd, const void* data, std::size_t n, Clock::time_point deadline);
IoResult recv_all(int fd, void* data, std::size_t n, Clock::time_point deadline);

// What went wrong while `doing` ("sending the request"), for messages.
std::string io_message(const IoResult& r, std::chrono::milliseconds timeout, const char* doing);

// A key as messages show it: quoted, non-printable bytes escaped, cut after
// kKeyShownBytes.
std::string quote_key(const std::string& key);

// "host:port", with brackets around an IPv6 literal.
std::string endpoint_of(const std::string& host, std::uint16_t port);

// One TCP connection attempt to host:port (every address it resolves to,
// in order) before the deadline: a connected non-blocking socket with
// TCP_NODELAY (requests and responses are small and alternate), or fd -1
// and what failed.
struct Connected {
  int fd = -1;
  std::string error;
};
Connected connect_tcp(const std::string& host, std::uint16_t port, Clock::time_point deadline);

// One attempt to connect and complete a client's handshake.
struct Attempt {
  int fd = -1;
  bool fatal = false;  // the peer answered but cannot be this client's server: do not retry
  std::string error;
};

// Repeats `attempt` (given the deadline) until it yields a socket or a
// fatal error, or the deadline passes, pausing between tries from 10 ms
// growing to 1 s (the server is usually about to come up; a missing one
// then costs little).  A result without a socket carries the error: the
// fatal one, or "could not reach <server> within N ms (last error: ...)".
Attempt connect_retrying(const std::function<Attempt(Clock::time_point)>& attempt, Clock::time_point deadline,
                         const std::string& server);

}  // namespace pstar::distributed::net
