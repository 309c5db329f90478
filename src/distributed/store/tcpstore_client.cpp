#include "distributed/store/tcpstore_client.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "distributed/store/socket_io.h"
#include "distributed/store/store_protocol.h"
#include "util/error.h"
#include "util/log.h"

namespace pstar::distributed {
namespace {

using net::Io;
using net::IoResult;
using std::chrono::milliseconds;
using tcpstore::Query;

// A request under construction: integers little-endian, strings as a u64
// length and their bytes.
class Request {
 public:
  explicit Request(Query q) { bytes_.push_back(static_cast<std::uint8_t>(q)); }
  Request& u32(std::uint32_t v) {
    std::uint8_t b[4];
    wire::store_u32(b, v);
    bytes_.insert(bytes_.end(), b, b + 4);
    return *this;
  }
  Request& u64(std::uint64_t v) {
    std::uint8_t b[8];
    wire::store_u64(b, v);
    bytes_.insert(bytes_.end(), b, b + 8);
    return *this;
  }
  Request& str(const void* data, std::size_t n) {
    u64(n);
    const auto* p = static_cast<const std::uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + n);
    return *this;
  }
  Request& str(const std::string& s) { return str(s.data(), s.size()); }
  const std::vector<std::uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
};

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// What this client speaks, for the errors of a failed handshake.
std::string protocol_description() {
  return "libpstar speaks the c10d TCPStore protocol with validation magic " + hex32(tcpstore::kValidationMagic) +
         " and PING (query 13), as served by " + tcpstore::kCheckedAgainst;
}

net::Attempt try_connect_once(const std::string& host, std::uint16_t port, net::Clock::time_point deadline) {
  const net::Connected c = net::connect_tcp(host, port, deadline);
  if (c.fd < 0) return {-1, false, c.error};
  const std::uint32_t nonce = static_cast<std::uint32_t>(::getpid());
  Request validate(Query::kValidate);
  validate.u32(tcpstore::kValidationMagic);
  Request ping(Query::kPing);
  ping.u32(nonce);
  std::vector<std::uint8_t> hello = validate.bytes();
  hello.insert(hello.end(), ping.bytes().begin(), ping.bytes().end());
  const net::Clock::time_point handshake_start = net::Clock::now();
  const net::Clock::time_point handshake_deadline =
      std::min(deadline, net::deadline_after(tcpstore::kHandshakeTimeout));
  std::uint8_t reply[4];
  IoResult r = net::send_all(c.fd, hello.data(), hello.size(), handshake_deadline);
  if (r.io == Io::kOk) r = net::recv_all(c.fd, reply, sizeof reply, handshake_deadline);
  if (r.io == Io::kOk && wire::load_u32(reply) == nonce) return {c.fd, false, ""};
  ::close(c.fd);
  if (r.io == Io::kOk) {
    const std::uint32_t got = wire::load_u32(reply);
    std::string detail = "the server answered PING(nonce " + std::to_string(nonce) + ") with " + hex32(got);
    if (got == wire::kMagic) detail += ", the magic of libpstar's own store protocol: this is a libpstar store server";
    return {-1, true, detail + "; " + protocol_description()};
  }
  if (r.io == Io::kTimedOut) {
    // Fatal even when the caller's deadline cut the wait short: there is no
    // time left to retry in, and the message says what was seen.
    const auto waited = std::chrono::duration_cast<milliseconds>(net::Clock::now() - handshake_start).count();
    return {-1, true,
            "the server accepted the connection but did not answer the handshake (VALIDATE, PING) within " +
                std::to_string(waited) +
                " ms: it is not a TCPStore of this protocol (a TCPStore of another protocol revision ignores a "
                "wrong magic); " +
                protocol_description()};
  }
  if (r.io == Io::kClosed) {
    return {-1, true,
            "the server closed the connection during the handshake (VALIDATE, PING): it is not a c10d TCPStore "
            "(a libpstar store server closes peers that do not open with its own hello, protocol version " +
                std::to_string(wire::kProtocolVersion) + "); " + protocol_description()};
  }
  return {-1, false, net::io_message(r, tcpstore::kHandshakeTimeout, "during the handshake")};
}

}  // namespace

TcpStoreClient::TcpStoreClient(StoreClientOptions options) : options_(std::move(options)) {
  endpoint_ = net::endpoint_of(options_.host, options_.port);
  if (options_.protocol != StoreProtocol::kTcpStore) {
    fail(PSTAR_ERR_INVALID_ARGUMENT, "connect", "the options name another protocol than c10d TCPStore");
  }
  if (options_.connect_timeout.count() <= 0 || options_.timeout.count() <= 0) {
    fail(PSTAR_ERR_INVALID_ARGUMENT, "connect", "timeouts must be positive");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  connect_until(net::deadline_after(options_.connect_timeout), "connect");
}

TcpStoreClient::~TcpStoreClient() { close_connection(); }

void TcpStoreClient::close_connection() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void TcpStoreClient::fail(int status, const std::string& what, const std::string& detail) {
  throw Error(static_cast<pstar_status>(status), "TCPStore client " + endpoint_ + ": " + what + ": " + detail);
}

void TcpStoreClient::connect_until(Clock::time_point deadline, const std::string& what) {
  const net::Attempt a =
      net::connect_retrying([this](Clock::time_point d) { return try_connect_once(options_.host, options_.port, d); },
                            deadline, "the TCPStore");
  if (a.fd < 0) fail(PSTAR_ERR_COMM, what, a.error);
  fd_ = a.fd;
  log::debug("TCPStore client " + endpoint_ + ": connected");
}

std::string TcpStoreClient::wire_key(const std::string& key, const std::string& what) const {
  std::string full = "/" + options_.key_prefix + key;
  if (full.size() > wire::kMaxKeyBytes) {
    throw Error(PSTAR_ERR_INVALID_ARGUMENT, "TCPStore client " + endpoint_ + ": " + what + ": key of " +
                                                std::to_string(full.size()) + " bytes exceeds the limit of " +
                                                std::to_string(wire::kMaxKeyBytes));
  }
  return full;
}

TcpStoreClient::Bytes TcpStoreClient::exchange(const std::string& what, const std::vector<std::uint8_t>& request,
                                               long reply_bytes, Clock::time_point deadline, milliseconds timeout) {
  if (fd_ < 0) connect_until(deadline, what);
  IoResult r = net::send_all(fd_, request.data(), request.size(), deadline);
  if (r.io != Io::kOk) {
    close_connection();
    fail(PSTAR_ERR_COMM, what, net::io_message(r, timeout, "sending the request"));
  }
  Bytes reply;
  if (reply_bytes >= 0) {
    reply.resize(static_cast<std::size_t>(reply_bytes));
  } else {
    std::uint8_t len[8];
    r = net::recv_all(fd_, len, sizeof len, deadline);
    if (r.io == Io::kOk) {
      const std::uint64_t n = wire::load_u64(len);
      if (n > wire::kMaxValueBytes) {
        close_connection();
        fail(PSTAR_ERR_COMM, what,
             "protocol error: a value of " + std::to_string(n) + " bytes exceeds the limit of " +
                 std::to_string(wire::kMaxValueBytes));
      }
      reply.resize(static_cast<std::size_t>(n));
    }
  }
  if (r.io == Io::kOk && !reply.empty()) r = net::recv_all(fd_, reply.data(), reply.size(), deadline);
  if (r.io != Io::kOk) {
    // Closing makes the server forget a waiting request and keeps a late
    // answer from being read as the answer to the next request.
    close_connection();
    fail(PSTAR_ERR_COMM, what, net::io_message(r, timeout, "waiting for the response"));
  }
  return reply;
}

void TcpStoreClient::set(const std::string& key, const void* data, std::size_t size) {
  const std::string what = "SET(" + net::quote_key(key) + ")";
  if (size > wire::kMaxValueBytes) {
    fail(PSTAR_ERR_INVALID_ARGUMENT, what,
         "value of " + std::to_string(size) + " bytes exceeds the limit of " + std::to_string(wire::kMaxValueBytes));
  }
  Request req(Query::kSet);
  req.str(wire_key(key, what)).str(data, size);
  std::lock_guard<std::mutex> lock(mutex_);
  exchange(what, req.bytes(), 0, net::deadline_after(options_.timeout), options_.timeout);
}

TcpStoreClient::Bytes TcpStoreClient::get(const std::string& key, milliseconds timeout) {
  const std::string what = "GET(" + net::quote_key(key) + ")";
  if (timeout.count() <= 0) fail(PSTAR_ERR_INVALID_ARGUMENT, what, "the timeout must be positive");
  const std::string k = wire_key(key, what);
  // The server answers GET only for a key that exists: wait for it first,
  // as PyTorch's own client does, both within the one deadline.
  Request wait(Query::kWait);
  wait.u64(1).str(k);
  Request get(Query::kGet);
  get.str(k);
  std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point deadline = net::deadline_after(timeout);
  const Bytes waited = exchange(what, wait.bytes(), 1, deadline, timeout);
  if (waited[0] != tcpstore::kWaitStopWaiting) {
    close_connection();
    fail(PSTAR_ERR_COMM, what, "protocol error: WAIT answered " + std::to_string(waited[0]));
  }
  return exchange(what, get.bytes(), -1, deadline, timeout);
}

std::int64_t TcpStoreClient::add(const std::string& key, std::int64_t delta) {
  const std::string what = "ADD(" + net::quote_key(key) + ")";
  Request req(Query::kAdd);
  req.str(wire_key(key, what)).u64(static_cast<std::uint64_t>(delta));
  std::lock_guard<std::mutex> lock(mutex_);
  const Bytes r = exchange(what, req.bytes(), 8, net::deadline_after(options_.timeout), options_.timeout);
  return static_cast<std::int64_t>(wire::load_u64(r.data()));
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  if (keys.empty()) return;
  const std::string what = "WAIT(" + net::quote_key(keys[0]) + (keys.size() > 1 ? ", ...)" : ")");
  if (timeout.count() <= 0) fail(PSTAR_ERR_INVALID_ARGUMENT, what, "the timeout must be positive");
  Request req(Query::kWait);
  req.u64(keys.size());
  for (const std::string& k : keys) req.str(wire_key(k, what));
  std::lock_guard<std::mutex> lock(mutex_);
  const Bytes r = exchange(what, req.bytes(), 1, net::deadline_after(timeout), timeout);
  if (r[0] != tcpstore::kWaitStopWaiting) {
    close_connection();
    fail(PSTAR_ERR_COMM, what, "protocol error: WAIT answered " + std::to_string(r[0]));
  }
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  const std::string what = "CHECK(" + net::quote_key(keys[0]) + (keys.size() > 1 ? ", ...)" : ")");
  Request req(Query::kCheck);
  req.u64(keys.size());
  for (const std::string& k : keys) req.str(wire_key(k, what));
  std::lock_guard<std::mutex> lock(mutex_);
  const Bytes r = exchange(what, req.bytes(), 1, net::deadline_after(options_.timeout), options_.timeout);
  return r[0] == tcpstore::kCheckReady;
}

bool TcpStoreClient::erase(const std::string& key) {
  const std::string what = "DELETE_KEY(" + net::quote_key(key) + ")";
  Request req(Query::kDeleteKey);
  req.str(wire_key(key, what));
  std::lock_guard<std::mutex> lock(mutex_);
  const Bytes r = exchange(what, req.bytes(), 8, net::deadline_after(options_.timeout), options_.timeout);
  return static_cast<std::int64_t>(wire::load_u64(r.data())) > 0;
}

}  // namespace pstar::distributed
