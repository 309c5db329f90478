// Communicator: the collectives ZeRO sharding needs, over one group of ranks
// (DESIGN.md section 2).
//
// One interface, two implementations: Gloo (CPU and emulated-device ranks,
// TCP) and NCCL (CUDA ranks).  The engine calls these from its one thread;
// every rank must issue the same collectives in the same order with the same
// sizes (the engine derives the order from the access trace only), or the
// group deadlocks until the timeout.
//
// Buffers are host memory for Gloo and device memory for NCCL; sizes are in
// elements of the stated type.  Every call blocks until the collective is
// complete on this rank.  A failure (a peer gone, a timeout, a transport
// error) throws Error(PSTAR_ERR_COMM) naming the operation and, where known,
// the peer; after one the communicator is unusable (`failed()`), and every
// later call throws at once, so that no rank waits on a broken group.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace pstar::distributed {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo" or "nccl".
  virtual const char* backend() const = 0;
  // True once a collective has failed; every call throws from then on.
  virtual bool failed() const = 0;
  // True when all_gather, reduce_scatter_sum and broadcast take device
  // memory (NCCL: the rank's CUDA device); false for host memory (Gloo,
  // whose ranks' "device" is the emulated one, host memory too).
  virtual bool device_buffers() const { return false; }

  // Every rank contributes `shard_bytes` bytes; `out` (size() * shard_bytes)
  // receives them in rank order.  `shard` may point into `out` at this
  // rank's block (in place).
  virtual void all_gather(const void* shard, void* out, size_t shard_bytes) = 0;

  // `data` holds size() blocks of `block_elems` floats in rank order; `out`
  // (block_elems floats, not inside `data`) receives the sum over all ranks
  // of block rank().  `data` is scratch afterwards.  fp32: a sum of fp16
  // gradients can overflow where no single one did.
  virtual void reduce_scatter_sum(float* data, float* out, size_t block_elems) = 0;

  // Element-wise sum over ranks of a few values (the squared gradient norm).
  virtual void all_reduce_sum(double* values, size_t n) = 0;
  // Element-wise maximum over ranks (the overflow flag, agreed decisions).
  virtual void all_reduce_max(int64_t* values, size_t n) = 0;

  // `bytes` bytes from `root` into every rank's `data`.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;

  virtual void barrier() = 0;
};

}  // namespace pstar::distributed
