#include "distributed/store/store_client.h"

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

#include "distributed/store/socket_io.h"
#include "util/error.h"
#include "util/log.h"

namespace pstar::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using net::deadline_after;
using net::Io;
using net::io_message;
using net::IoResult;
using net::quote_key;
using net::recv_all;
using net::send_all;
using std::chrono::milliseconds;

net::Attempt try_connect_once(const std::string& host, std::uint16_t port, Clock::time_point deadline) {
  const net::Connected c = net::connect_tcp(host, port, deadline);
  if (c.fd < 0) return {-1, false, c.error};
  net::Attempt result{c.fd, false, ""};
  const int fd = result.fd;
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
  endpoint_ = net::endpoint_of(options_.host, options_.port);
  if (options_.protocol != StoreProtocol::kLibpstar) {
    fail(PSTAR_ERR_INVALID_ARGUMENT, "connect", "the options name another protocol than libpstar's own");
  }
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
  const net::Attempt a =
      net::connect_retrying([this](Clock::time_point d) { return try_connect_once(options_.host, options_.port, d); },
                            deadline, "the store server");
  if (a.fd < 0) fail(PSTAR_ERR_COMM, what, a.error);
  fd_ = a.fd;
  log::debug("store client " + endpoint_ + ": connected");
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

StoreClient::Bytes StoreClient::call(wire::Op op, const std::vector<std::string>& given_keys, const void* value,
                                     std::size_t value_bytes, milliseconds timeout, long expected_payload) {
  std::vector<std::string> keys = given_keys;
  if (!options_.key_prefix.empty()) {
    for (std::string& k : keys) k.insert(0, options_.key_prefix);
  }
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
    case wire::ResponseStatus::kOk: break;
    case wire::ResponseStatus::kNotANumber:
      fail(PSTAR_ERR_INVALID_ARGUMENT, what, "the stored value is not an int64 in decimal text");
    case wire::ResponseStatus::kOverflow: fail(PSTAR_ERR_INVALID_ARGUMENT, what, "the sum overflows int64");
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

}  // namespace pstar::distributed
