// The rendezvous store's client: what every rank (rank 0 included) uses to
// talk to the StoreServer on rank 0 (store_server.h; wire protocol in
// store_protocol.h).
//
// What: blocking calls, each bounded by a timeout: set, get (waits for the
// key), add (an int64 counter), wait (for keys), check, erase (the
// protocol's DELETE), num_keys.  Errors are pstar::Error whose message
// names the server's host:port, the operation and its key.
//
// Why a plain socket and not a libuv loop: the client makes one request at
// a time from the caller's thread and blocks until its response or its
// deadline; poll(2) with a deadline is exactly that, with no loop to own,
// no thread to hand results across and nothing to tear down.  (The server
// is the side that needs an event loop.)
//
// Connecting: the constructor retries (refused, unreachable, reset during
// the handshake) with a growing pause until connect_timeout, since rank 0
// may start its server after the other ranks start their clients.  A
// protocol version mismatch is not retried.
//
// Failure: a call that times out or fails on the transport closes the
// connection (a late response would otherwise be read as the answer to the
// next request; the server forgets a parked request when its connection
// closes) and throws PSTAR_ERR_COMM.  The next call reconnects, retrying up
// to its own deadline.  A request is never re-sent: ADD is not idempotent.
// Limits (key and value sizes) are checked before anything is sent and
// violations throw PSTAR_ERR_INVALID_ARGUMENT, leaving the connection as it
// was.  There is no status of its own for a timeout: it is PSTAR_ERR_COMM
// with "timed out" in the message.
//
// Keys: options.key_prefix is prepended to every key before it is checked
// against the limits and sent (messages show the full key).
//
// Thread safety: calls are serialised by a mutex; a caller blocked in get or
// wait holds it, so threads that must not wait for each other use clients of
// their own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/store/store.h"
#include "distributed/store/store_protocol.h"

namespace pstar::distributed {

class StoreClient final : public Store {
 public:
  // Connects and performs the handshake, retrying until connect_timeout.
  // Throws PSTAR_ERR_COMM (unreachable, timed out, version mismatch) or
  // PSTAR_ERR_INVALID_ARGUMENT (non-positive timeouts).
  explicit StoreClient(StoreClientOptions options);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  using Store::set;
  // Stores (replaces) the value of `key`.
  void set(const std::string& key, const void* data, std::size_t size) override;
  // The value of `key`, waiting until some client sets it.
  Bytes get(const std::string& key);
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  // Adds `delta` to the counter `key` (missing: 0) and returns the new
  // value.  The counter is stored as decimal text; PSTAR_ERR_INVALID_ARGUMENT
  // if the stored value is not an int64 in decimal or the sum overflows.
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  // Returns once every key exists (an empty list returns at once).
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  // Whether every key exists now (true for an empty list).
  bool check(const std::vector<std::string>& keys) override;
  // Removes `key`; whether it existed.
  bool erase(const std::string& key) override;
  // How many keys the store holds.
  std::uint64_t num_keys();

  // "host:port" of the server, as messages name it.
  const std::string& endpoint() const override { return endpoint_; }

 private:
  using Clock = std::chrono::steady_clock;

  // Sends one request and returns its response payload; validates the
  // status (throwing for the error statuses) and that the payload has
  // `expected_payload` bytes (unless it is -1: any size up to the limit).
  Bytes call(wire::Op op, const std::vector<std::string>& keys, const void* value, std::size_t value_bytes,
             std::chrono::milliseconds timeout, long expected_payload);
  void connect_until(Clock::time_point deadline, const std::string& what);
  void close_connection();
  [[noreturn]] void fail(int status, const std::string& what, const std::string& detail);
  void check_key(const std::string& key, const std::string& what) const;
  std::string describe(wire::Op op, const std::vector<std::string>& keys) const;

  StoreClientOptions options_;
  std::string endpoint_;
  std::mutex mutex_;
  int fd_ = -1;
};

}  // namespace pstar::distributed
