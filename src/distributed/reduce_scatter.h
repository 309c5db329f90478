// ReduceScatter: a sharded engine's gradient reduce-scatters, chunk by
// chunk (docs/distributed.md).  A chunk's final gradients, laid out as the
// chunk in fp32 (zeros where no gradient is), are summed over the ranks;
// this rank's shard of the sum, divided by the world size (the average, as
// PyTorch's DDP), is handed back to the engine to apply.
//
// It owns the buffers and their rotation:
//  - pairs of host buffers, held from build to destroy: a staging buffer of
//    one whole chunk (communicators that take host memory: Gloo) and an
//    output of one shard.  Communicators that take device memory (NCCL)
//    stage on the device instead, in a buffer made room for (like a chunk)
//    for the reduce-scatter's life;
//  - with a collective queue, kAsyncPairs pairs: a reduce-scatter runs on
//    the queue while the next chunk's gradients are laid out in the other
//    pair; the results are applied later (finish_*), oldest first, when the
//    buffer is needed, the chunk is gathered or written, room is short, or
//    at the step.  Without a queue, one pair and each reduce-scatter is
//    applied at once.
//
// It must not know parameters, chunks' payloads or the placement policy:
// the engine lays the gradients out, applies the average, and provides the
// device staging through Actions.
//
// Threading: the engine's thread calls everything here; the queued
// reduce-scatter touches only its pair (or device stage) until finished.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "distributed/process_group.h"
#include "memory/host_pool.h"

namespace pstar::distributed {

class ReduceScatter {
 public:
  // Buffer pairs with a collective queue.
  static constexpr size_t kAsyncPairs = 2;

  struct Actions {
    // Lays out chunk k's final gradients as the chunk into `data` (fp32,
    // `elems` elements; device memory when the communicator takes device
    // memory, else host), zero elsewhere, and frees their buffers: the
    // data is complete in `data` when it returns.  Returns the parameters
    // whose gradients it carries.
    std::function<std::vector<uint32_t>(uint32_t k, float* data, uint64_t elems)> lay_out;
    // Applies this rank's shard of the average, `avg` (host, the chunk's
    // shard elements), to the gradients of `params` in chunk k.
    std::function<void(uint32_t k, const std::vector<uint32_t>& params, float* avg)> apply;
    // Device staging (device-memory communicators): made room for and
    // counted, then freed once nothing queued uses it.
    std::function<void*(uint64_t bytes, uint32_t k)> stage_alloc;
    std::function<void(void* p, uint64_t bytes)> stage_free;
    // Copies device memory to the host and waits.
    std::function<void(void* dst, const void* src, size_t bytes)> copy_to_host;
  };

  ReduceScatter(ProcessGroup* group, Actions actions) : group_(group), actions_(std::move(actions)) {}
  ReduceScatter(const ReduceScatter&) = delete;
  ReduceScatter& operator=(const ReduceScatter&) = delete;
  // Frees what is held; the collective queue must be stopped first.
  ~ReduceScatter() { release(); }

  // At build: the pairs, from `host`, for chunks of at most `largest_elems` fp32
  // elements (a multiple of the world size); kAsyncPairs when
  // `asynchronous` (a collective queue will run them), else one.  Throws
  // PSTAR_ERR_OUT_OF_MEMORY from the host pool, holding nothing.
  void reserve(memory::HostPool* host, uint64_t largest_elems, bool asynchronous);
  // Frees the device stages of reduce-scatters never finished (the queue
  // is gone: nothing uses them) and the pairs.
  void release();

  // Reduce-scatters chunk k (`elems` elements, shards of `shard_elems`):
  // lays it out (Actions::lay_out), then runs the collective inline and
  // applies it, or queues it.
  void reduce(uint32_t k, uint64_t elems, uint64_t shard_elems);
  // Finishes the queued reduce-scatters up to the last one of chunk k
  // (none queued: nothing), or all of them when k < 0.
  void finish_through(int64_t k);
  // Finishes the oldest queued reduce-scatter if it holds a device stage,
  // freeing it (room is short); false when there is none.
  bool release_oldest_stage();

 private:
  // One pair of buffers.
  struct Pair {
    float* staging = nullptr;  // host fp32 chunk (null: staged on the device)
    uint64_t staging_bytes = 0;
    float* out = nullptr;  // host fp32 shard
    uint64_t out_bytes = 0;
  };
  // A reduce-scatter laid out and issued whose result is not applied yet.
  struct Pending {
    uint32_t chunk = 0;
    uint64_t elems = 0, shard_elems = 0;
    size_t pair = 0;               // index into pairs_
    std::vector<uint32_t> params;  // whose gradients it carries
    void* device_stage = nullptr;  // device-memory communicators: chunk then shard
    uint64_t device_stage_bytes = 0;
    CollectiveQueue::Ticket ticket;  // null when run inline
  };

  void finish(Pending& p);
  void finish_oldest();
  void free_stage(Pending& p);

  ProcessGroup* group_;
  memory::HostPool* host_ = nullptr;  // the pairs' pool, set by reserve()
  Actions actions_;
  std::vector<Pair> pairs_;     // empty before reserve()
  std::deque<Pending> queued_;  // oldest first; at most pairs_.size()
};

}  // namespace pstar::distributed
