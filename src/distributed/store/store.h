// The rendezvous store as the rest of libpstar sees it: a key-value store
// shared by the ranks of a job, reached through one of two clients.
//
//  - StoreClient (store_client.h) speaks libpstar's own protocol
//    (store_protocol.h) to the StoreServer that rank 0 starts: pstar-run,
//    mpirun, srun, explicit ranks, any launcher that serves no store.
//  - TcpStoreClient (tcpstore_client.h) speaks PyTorch's c10d TCPStore
//    protocol, to join a store a launcher already serves: torchrun's agent
//    store (TORCHELASTIC_USE_AGENT_STORE=True), which its workers'
//    torch.distributed uses too.
//
// connect_store() picks the client the options name.  Both take a key prefix
// that namespaces every key, so that libpstar's keys never meet another
// user's in a shared store.  Errors are pstar::Error: PSTAR_ERR_COMM for the
// transport (unreachable, timed out, protocol mismatch) and
// PSTAR_ERR_INVALID_ARGUMENT for requests over the limits of
// store_protocol.h, which both clients enforce.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pstar::distributed {

enum class StoreProtocol {
  kLibpstar,  // store_protocol.h, served by StoreServer
  kTcpStore,  // PyTorch's c10d TCPStore (torchrun's agent store)
};

// "libpstar" or "c10d TCPStore", for messages.
const char* store_protocol_name(StoreProtocol protocol);

struct StoreClientOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  StoreProtocol protocol = StoreProtocol::kLibpstar;
  // Prepended to every key the client is given (not to what messages show).
  std::string key_prefix;
  // How long the constructor keeps trying to reach the server.
  std::chrono::milliseconds connect_timeout{300000};
  // Default bound of every call, from sending the request to the end of its
  // response (connecting again first if the connection was closed); get and
  // wait also take one per call.  Five minutes: ranks of a large job start
  // minutes apart.
  std::chrono::milliseconds timeout{300000};
};

class Store {
 public:
  using Bytes = std::vector<std::uint8_t>;
  virtual ~Store() = default;

  // Stores (replaces) the value of `key`.
  virtual void set(const std::string& key, const void* data, std::size_t size) = 0;
  void set(const std::string& key, const Bytes& value) { set(key, value.data(), value.size()); }
  // The value of `key`, waiting up to `timeout` until some client sets it.
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Adds `delta` to the counter `key` (missing: 0) and returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Returns once every key exists (an empty list returns at once).
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Whether every key exists now (true for an empty list).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Removes `key`; whether it existed.
  virtual bool erase(const std::string& key) = 0;
  // "host:port" of the server, as messages name it.
  virtual const std::string& endpoint() const = 0;
};

// Connects the client `options.protocol` names (its constructor's errors).
std::unique_ptr<Store> connect_store(const StoreClientOptions& options);

}  // namespace pstar::distributed
