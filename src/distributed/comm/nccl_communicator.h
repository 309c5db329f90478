// NcclCommunicator: the Communicator over NCCL, for CUDA ranks.
//
// Design.  One NCCL communicator per group, one rank per process and per
// CUDA device.  Rank 0 creates the ncclUniqueId; its bytes reach the other
// ranks through a function the caller supplies (the rendezvous store, an
// MPI broadcast, a file...): the library has no transport of its own for
// it.  With one rank nothing is exchanged.  The communicator is created
// non-blocking (ncclCommInitRankConfig with config.blocking = 0, NCCL >=
// 2.14), so that neither its creation nor any collective can block the
// engine's thread beyond the configured timeout.
//
// NCCL is not linked: its functions come from nccl_api() (nccl_loader.h),
// which loads libnccl.so.2 when the first communicator is created,
// preferring one the process already holds (PyTorch's).
//
// Every collective is enqueued on a CUDA stream the communicator creates
// (non-blocking with respect to the legacy default stream), and the call
// then waits for it by polling cudaStreamQuery together with
// ncclCommGetAsyncError: this is the watchdog.  An asynchronous NCCL error,
// a CUDA error or the timeout aborts the communicator (ncclCommAbort),
// marks it failed and throws Error(PSTAR_ERR_COMM) naming the operation,
// the rank and NCCL's error string; every later call throws at once, as the
// Gloo communicator does.
//
// Buffers: all_gather, reduce_scatter_sum and broadcast take DEVICE
// pointers (memory of this rank's CUDA device).  all_reduce_sum,
// all_reduce_max and barrier take host values, as the interface passes
// them: they are copied through small pinned-host and device staging
// buffers the communicator keeps.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "distributed/comm/communicator.h"

namespace pstar::distributed {

struct NcclConfig {
  int rank = 0;
  int size = 1;
  // CUDA device of this rank; -1 keeps the calling thread's current device.
  int device = -1;
  // Communicator creation and every collective give up after this.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Broadcasts rank 0's bytes to every rank: on rank 0 `id_bytes` holds the
// ncclUniqueId on entry; on the others it must hold the same bytes on
// return.  Called once, by every rank, only when size > 1 (may be empty
// then).
using NcclIdExchange = std::function<void(std::vector<char>& id_bytes)>;

// Creates the communicator; throws Error(PSTAR_ERR_COMM) on an NCCL or CUDA
// failure or timeout, Error(PSTAR_ERR_INVALID_ARGUMENT) for a bad rank/size
// or a missing exchange with several ranks, Error(PSTAR_ERR_UNSUPPORTED) when
// no usable NCCL can be loaded (nccl_loader.h).
std::unique_ptr<Communicator> make_nccl_communicator(const NcclConfig& config, NcclIdExchange exchange);

}  // namespace pstar::distributed
