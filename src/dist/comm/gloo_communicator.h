// GlooCommunicator: the Communicator over Gloo's TCP transport, for CPU and
// emulated-device ranks.
//
// Rendezvous goes through a gloo::rendezvous::Store (the libuv store's
// adapter in a real run; Gloo's in-process HashStore in tests); each rank
// connects a full mesh of TCP pairs.  The collectives are Gloo's own: ring
// all-gather, halving-doubling reduce-scatter (the Debian 2022 snapshot has
// no bf16, so gradients are reduced in fp32, as ZeRO wants anyway), ring
// all-reduce, one-to-all broadcast, barrier.  The reduce-scatter algorithm
// object, which registers its buffers with every pair, is kept for the last
// (buffer, size) used: the engine reduces every chunk through one staging
// buffer, so it is built once.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "dist/comm/communicator.h"

namespace gloo::rendezvous {
class Store;
}

namespace pstar::dist {

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

}  // namespace pstar::dist
