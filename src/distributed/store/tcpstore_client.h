// A client of PyTorch's c10d TCPStore: how libpstar's ranks join the store
// torchrun's agent already serves (TORCHELASTIC_USE_AGENT_STORE=True), the
// same store torch.distributed in those processes uses.
//
// The wire protocol (PyTorch's torch/csrc/distributed/c10d/TCPStoreBackend,
// unversioned; checked here against the server of PyTorch 2.15): every
// integer is sent in the host's byte order (little-endian on every platform
// libpstar builds for; this client writes little-endian explicitly), a
// string is a u64 length and its bytes.  A request is a one-byte query type
// and its fields; responses have fixed shapes per query:
//
//   VALIDATE (0)  u32 magic 0x3C85F7CE                 -> nothing
//   SET (1)       key, value                           -> nothing
//   GET (3)       key (must exist)                     -> value
//   ADD (4)       key, i64 delta                       -> i64 new value
//   CHECK (5)     u64 n, n keys                        -> u8 0 ready, 1 not
//   WAIT (6)      u64 n, n keys                        -> u8 0 once all exist
//   DELETE_KEY (8) key                                 -> i64 keys deleted
//   PING (13)     u32 nonce                            -> u32 the same nonce
//
// Handshake: VALIDATE, then PING with this process's id; the server must
// echo the nonce within kHandshakeTimeout.  A server that closes the
// connection, stays silent or answers something else is not a TCPStore of
// this protocol, and the error says what it did (a libpstar StoreServer
// closes at once; a TCPStore given a wrong magic stays silent): there is no
// protocol version number to compare, so the message names the magic and
// query codes this client speaks and the PyTorch release it was checked
// against.
//
// Keys: every key is sent as "/" + key_prefix + key: the "/" is what
// PyTorch's own TCPStore client prepends, so a key libpstar sets reads
// back in Python as TCPStore(...).get(key_prefix + key).  ADD stores the
// counter as decimal text, as libpstar's own store does.
//
// Timeouts, failures and threads behave as in StoreClient (store_client.h):
// a call bounded by its timeout (get is a WAIT then a GET, both within it),
// a transport failure or timeout closes the connection and throws
// PSTAR_ERR_COMM, the next call reconnects, a request is never re-sent,
// calls are serialised by a mutex.  Limits on key and value sizes are
// store_protocol.h's.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/store/store.h"

namespace pstar::distributed {

namespace tcpstore {
// The validation magic of PyTorch's TCPStore protocol.
constexpr std::uint32_t kValidationMagic = 0x3C85F7CEu;
enum class Query : std::uint8_t {
  kValidate = 0,
  kSet = 1,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kDeleteKey = 8,
  kPing = 13,
};
constexpr std::uint8_t kCheckReady = 0;
constexpr std::uint8_t kWaitStopWaiting = 0;
// How long the PING of the handshake may take: a TCPStore answers in
// milliseconds; silence longer than this is a server of another kind.
constexpr std::chrono::milliseconds kHandshakeTimeout{10000};
// The PyTorch release whose TCPStore server this client was tested against.
constexpr const char* kCheckedAgainst = "PyTorch 2.15";
}  // namespace tcpstore

class TcpStoreClient final : public Store {
 public:
  // Connects and performs the handshake, retrying a refused or reset
  // connection until connect_timeout.  Throws PSTAR_ERR_COMM (unreachable,
  // timed out, not a TCPStore) or PSTAR_ERR_INVALID_ARGUMENT (non-positive
  // timeouts, a protocol other than kTcpStore).
  explicit TcpStoreClient(StoreClientOptions options);
  ~TcpStoreClient() override;
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  using Store::set;
  void set(const std::string& key, const void* data, std::size_t size) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool erase(const std::string& key) override;
  const std::string& endpoint() const override { return endpoint_; }

 private:
  using Clock = std::chrono::steady_clock;
  // Sends `request` and receives exactly `reply_bytes` (a fixed-size
  // reply), or with reply_bytes -1 a u64 length and that many bytes.
  Bytes exchange(const std::string& what, const std::vector<std::uint8_t>& request, long reply_bytes,
                 Clock::time_point deadline, std::chrono::milliseconds timeout);
  void connect_until(Clock::time_point deadline, const std::string& what);
  void close_connection();
  [[noreturn]] void fail(int status, const std::string& what, const std::string& detail);
  std::string wire_key(const std::string& key, const std::string& what) const;

  StoreClientOptions options_;
  std::string endpoint_;
  std::mutex mutex_;
  int fd_ = -1;
};

}  // namespace pstar::distributed
