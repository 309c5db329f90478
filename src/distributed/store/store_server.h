// The rendezvous store's server: a TCP key-value store that rank 0 runs for
// the ranks of a data-parallel run (store_client.h is the other side; the
// wire protocol is in store_protocol.h).
//
// What: one libuv loop on a thread of its own serves every connection: SET,
// GET, ADD, WAIT, CHECK, DELETE, NUM_KEYS on an in-memory map.  A GET of a
// missing key and a WAIT for missing keys are parked on the server and
// answered when a SET or ADD creates the keys; the client bounds the wait
// with its own timeout, and gives up by closing its connection, which the
// server notices and forgets the parked request.
//
// Why libuv: the server must serve many ranks at once, park requests for
// arbitrarily long and still notice peers that go away; one event loop does
// that without a thread per rank.  The loop runs on its own thread so the
// rank hosting it is free to use its own client like every other rank.
//
// A bad peer costs only itself: a wrong magic, a malformed frame, a frame
// announced over the limits, a peer silent for `stall_timeout` in the middle
// of the handshake or of a frame, or one that does not read its responses is
// dropped with the reason logged (pstar::log, warn), and every other
// connection is served as before.  An idle peer between frames is never
// dropped: ranks keep their connection for the whole run.
//
// Invariants (all state belongs to the loop thread; other threads touch only
// the atomics of Stats and the stop handle):
//  - a connection has at most one request parked; frames after it stay
//    buffered until it is answered, so responses leave in request order;
//  - a parked connection is registered under every one of its keys that is
//    missing, and nowhere once answered or closed;
//  - a connection's memory is freed only after libuv closed both its handles
//    (socket, stall timer), so callbacks never see a freed connection.
//
// Lifecycle: the constructor binds and listens on the calling thread (so an
// address in use is reported there, as a pstar::Error) and then starts the
// loop thread; stop() wakes the loop (uv_async), closes every handle and
// joins the thread; the destructor calls stop().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace pstar::distributed {

struct StoreServerOptions {
  // Address to bind: a numeric IPv4/IPv6 address or a host name; "0.0.0.0"
  // serves every interface (what rank 0 of a multi-node run needs).
  std::string host = "0.0.0.0";
  // 0: the system picks a free port; StoreServer::port() reports it.
  std::uint16_t port = 0;
  // A peer that has begun its handshake or a frame and then sends nothing
  // for this long is dropped.  A frame of the maximal size needs well under
  // a second on any link the store is used on; 30 s tolerates a loaded host.
  std::chrono::milliseconds stall_timeout{30000};
  // listen(2) backlog: every rank may connect at the same moment.
  int backlog = 1024;
};

class StoreServer {
 public:
  // Counters for tests and diagnostics, readable from any thread.
  struct Stats {
    std::uint64_t accepted = 0;  // connections accepted
    std::uint64_t dropped = 0;   // connections dropped for misbehaving
    std::uint64_t open = 0;      // connections open now
  };

  // Binds, listens and starts the loop thread.  Throws pstar::Error:
  // PSTAR_ERR_INVALID_ARGUMENT for a host that does not resolve,
  // PSTAR_ERR_COMM when the address cannot be bound or listened on.
  explicit StoreServer(StoreServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // The port bound (the chosen one when options.port was 0).
  std::uint16_t port() const;
  // "host:port" as bound, for messages.
  const std::string& endpoint() const;
  Stats stats() const;

  // Closes every connection (parked clients see the connection close and
  // report an error) and joins the loop thread.  Idempotent; must not be
  // called from the loop thread.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pstar::distributed
