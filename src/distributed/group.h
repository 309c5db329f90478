// Forming a group of data-parallel ranks for an engine (world_size > 1):
// the rendezvous store and a communicator over it (DESIGN.md section 2,
// docs/distributed.md).
//
// Under torchrun with TORCHELASTIC_USE_AGENT_STORE=True the agent already
// serves a c10d TCPStore on MASTER_PORT: every rank joins it as a client
// (TcpStoreClient) with libpstar's keys under LaunchInfo::store_key_prefix,
// and no server is started.  Otherwise:
// rank 0 serves the store (StoreServer) on MASTER_PORT; the server lives
// from the first group this process forms on that port until the process
// exits, so that a rank creating its next engine never reaches a server that
// rank 0 is about to stop with its previous one.  Every rank connects a
// client and rendezvous a Gloo communicator under a key prefix of its own:
// the n-th group a process forms uses prefix n, so ranks must form their
// groups (create their engines with world_size > 1) in the same order.  The
// group is complete once every rank passed a barrier on the communicator.
//
// Gloo needs an address this rank listens on for its peers: 127.0.0.1 when
// the master address is a loopback address, else the address of the local
// interface that routes to the master (found by connecting a UDP socket to
// it, which sends nothing), or PSTAR_GLOO_ADDR when set.
//
// Forming a group sets SIGPIPE to "ignore" if it is at its default action:
// Gloo writes to its sockets without MSG_NOSIGNAL, and a peer that dies
// would otherwise kill this rank instead of failing the collective.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "distributed/comm/communicator.h"
#include "distributed/launch_env.h"

namespace pstar::distributed {

struct GroupOptions {
  LaunchInfo launch;  // rank, world size and the rendezvous address
  // Bounds the rendezvous (connecting to the store, every store call, the
  // mesh) and, in the communicator, every collective.
  std::chrono::milliseconds timeout{60000};
};

// True when this build can form groups of CPU or emulated-device ranks
// (built with Gloo and libuv).
bool cpu_groups_available();

// Forms the group; throws pstar::Error: PSTAR_ERR_COMM when a rank, the
// store or a peer cannot be reached in time, PSTAR_ERR_UNSUPPORTED without
// Gloo or libuv, PSTAR_ERR_INVALID_ARGUMENT for a bad launch description.
std::unique_ptr<Communicator> form_cpu_group(const GroupOptions& options);

// True when this build can form groups of CUDA ranks (built with NCCL and
// libuv: the store carries rank 0's ncclUniqueId to the others).
bool cuda_groups_available();

// Forms a group of CUDA ranks: the same store as form_cpu_group (rank 0
// serves it), through which rank 0's ncclUniqueId reaches the others, then an
// NCCL communicator on CUDA device `device` (distributed/comm/nccl_communicator.h)
// and a barrier.  Throws as form_cpu_group; PSTAR_ERR_UNSUPPORTED without
// NCCL or libuv.
std::unique_ptr<Communicator> form_cuda_group(const GroupOptions& options, int device);

}  // namespace pstar::distributed
