// GlooCommunicator: the Communicator over Gloo's TCP transport, for CPU and
// emulated-device ranks.
//
// Rendezvous goes through a gloo::rendezvous::Store (the libuv store's
// adapter in a real run; Gloo's in-process HashStore in tests); each rank
// connects a full mesh of TCP pairs.  All-gather, all-reduce, broadcast and
// barrier are Gloo's own collectives; the reduce-scatter is a ring over
// Gloo's unbound buffers (see reduce_scatter_sum in the .cpp for why not
// Gloo's halving-doubling), in fp32 (the Debian 2022 snapshot has no bf16,
// and ZeRO reduces gradients in fp32 anyway).  Once the mesh is up the
// ranks all-gather their pairs' addresses, so that a failure Gloo reports
// with a peer's address ("Connection closed by peer [ip]:port") also names
// the peer's rank.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "distributed/comm/communicator.h"

namespace gloo::rendezvous {
class Store;
}

namespace pstar::distributed {

struct GlooConfig {
  int rank = 0;
  int size = 1;
  // Address this rank listens on for its peers (an interface of this host).
  std::string hostname = "127.0.0.1";
  // Every collective and the connection of the mesh give up after this.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Keys this group uses in the store start with this prefix.
  std::string prefix = "pstar/gloo";
};

// Connects the mesh; throws Error(PSTAR_ERR_COMM) on failure or timeout,
// Error(PSTAR_ERR_INVALID_ARGUMENT) for a bad rank/size.
std::unique_ptr<Communicator> make_gloo_communicator(const GlooConfig& config,
                                                     std::shared_ptr<gloo::rendezvous::Store> store);

}  // namespace pstar::distributed
