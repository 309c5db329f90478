// ChunkGathering: a sharded engine's gathered chunks (docs/distributed.md).
//
// With ZeRO sharding a rank holds, for good, only its shard of each chunk's
// compute payload.  A chunk is gathered (all-gathered from every rank's
// shard into a full payload) when it is used, and dropped again by the
// engine's drop rule; in between the placement runtime moves the gathered
// payload like any other.  This class owns that lifecycle:
//  - gathering at the acquire that needs it, into a buffer placement made
//    room for;
//  - gathering ahead along the recorded schedule (distributed/gather_ahead.h) into
//    the schedule's device slots, on the collective queue, and waiting for
//    such a gather at the chunk's acquire;
//  - dropping a gathered payload wherever placement put it, the memory
//    going back once the queued work that used it is done.
//
// With one process nothing is ever gathered, and every call here does
// nothing: a chunk's payload is the chunk itself, never dropped.
//
// It sees chunks as chunk::Chunk through placement::ChunkTable, and the
// rank's shards through Shards; it knows no parameters or optimizer state.
// Every collective goes through the ProcessGroup; a chunk's pending
// reduce-scatters (ReduceScatter) finish before its shard is read.
//
// Threading: the engine's thread calls everything here; an ahead gather's
// slot is written by the collective queue until its ticket is waited for.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "distributed/gather_ahead.h"
#include "distributed/process_group.h"
#include "distributed/reduce_scatter.h"
#include "memory/device.h"
#include "placement/runtime.h"

namespace pstar::distributed {

class ChunkGathering {
 public:
  // This rank's compute shard of chunk k, its bytes, and where it is.
  struct Shards {
    // This rank's shard of chunk k, ready to be read (with an overlapped
    // step, once the shard's update is done: the call may wait for it).
    std::function<const void*(uint32_t k)> shard;
    std::function<uint64_t(uint32_t k)> shard_bytes;
    // True when the shard is on the device (hybrid placement keeps a
    // placed chunk's compute shard in its device buffer), false on the host.
    std::function<bool(uint32_t k)> on_device;
  };

  ChunkGathering(ProcessGroup* group, ReduceScatter* reduce);
  ChunkGathering(const ChunkGathering&) = delete;
  ChunkGathering& operator=(const ChunkGathering&) = delete;

  // Once the device and the placement runtime exist (the engine's
  // constructor).
  void attach(memory::Device* device, placement::Runtime* placement, placement::ChunkTable* chunks, Shards shards);

  // Gathering ahead: chunks gathered ahead of their use (0: none; one
  // process: always none).  Set before build.
  void set_depth(uint32_t chunks) { ahead_.set_depth(group_->sharded() ? chunks : 0); }
  uint32_t depth() const { return ahead_.depth(); }
  // At build, once every rank agreed that it has room: the slots of
  // `slot_bytes` each and the collective queue.  Nothing without a depth.
  void reserve(uint32_t chunk_count, uint64_t slot_bytes);
  // Stops the queue (its gathers write the slots) and frees the slots.
  void release();

  // A TRAIN iteration begins: the schedule is followed if it is ready.
  void iteration_begin() { ahead_.iteration_begin(group_->has_queue()); }
  // Before chunk k is made resident at an acquire: in a TRAIN iteration the
  // schedule may gather this and later chunks ahead; a chunk not gathered
  // is gathered now, and one gathered ahead is waited for (its bytes added
  // to *critical_bytes when the caller had to wait).  True when it was
  // gathered now.
  // Inline: it runs on every acquire, and with one process it is only the
  // schedule's check.
  bool before_acquire(uint32_t k, bool train, uint64_t* critical_bytes) {
    if (train) ahead_.at_acquire(k);  // may gather this and later chunks
    return group_->sharded() && gather_or_wait(k, critical_bytes);
  }
  // After chunk k's acquire in a TRAIN iteration (the schedule records it).
  void after_acquire(uint32_t k, bool gathered_now) {
    if (group_->has_queue()) ahead_.after_acquire(k, gathered_now);
  }
  // Frees chunk k's gathered payload (its shard stays); `then_ahead`: the
  // schedule may use the freed room to gather the next chunks (the drop
  // rule's drops, not the step's).
  void drop(uint32_t k, bool then_ahead);
  void drop_all();
  // The step: the schedule's iteration is complete; whether it is ready
  // (every rank's answer is exchanged; one rank not ready invalidates all).
  void iteration_end(uint32_t chunk_count) {
    if (group_->has_queue()) ahead_.iteration_end(chunk_count);
  }
  bool schedule_ready() const { return ahead_.ready(); }
  void invalidate_schedule() { ahead_.invalidate(); }

  const GatherAhead& schedule() const { return ahead_; }
  // Bytes gathered into full chunks since the engine was created.
  uint64_t bytes_gathered() const { return bytes_gathered_; }
  // Bytes of this rank's own shards copied host to accelerator by the
  // gathers (1/world of bytes_gathered()).
  uint64_t bytes_shard_to_device() const { return bytes_shard_to_device_; }

 private:
  bool gather_or_wait(uint32_t k, uint64_t* critical_bytes);
  void gather(uint32_t k);
  void gather_into_slot(uint32_t k, uint32_t slot);
  // Waits for chunk k's ahead gather, if one runs.  A failure fails the
  // group and throws, unless `quiet` (the chunk is being dropped; the next
  // collective reports the failure).
  void finish(uint32_t k, bool quiet);
  // This rank's shard of chunk k into its block of `full` (device), waited.
  void* place_own_shard(uint32_t k, void* full);

  ProcessGroup* group_;
  ReduceScatter* reduce_;
  memory::Device* device_ = nullptr;
  placement::Runtime* placement_ = nullptr;
  placement::ChunkTable* chunks_ = nullptr;
  Shards shards_;
  GatherAhead ahead_;
  // Per chunk: the ahead all-gather filling its slot while it runs on the
  // collective queue (null once waited for).
  std::vector<CollectiveQueue::Ticket> gathering_;
  uint64_t bytes_gathered_ = 0;
  uint64_t bytes_shard_to_device_ = 0;
};

}  // namespace pstar::distributed
