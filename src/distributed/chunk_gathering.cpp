// ChunkGathering (chunk_gathering.h): gathering, gathering ahead, waiting
// and dropping.
#include "distributed/chunk_gathering.h"

#include <chrono>
#include <string>
#include <utility>

#include "util/error.h"

namespace pstar::distributed {

using chunk::Tier;
using Use = memory::DeviceTier::Use;

ChunkGathering::ChunkGathering(ProcessGroup* group, ReduceScatter* reduce)
    : group_(group),
      reduce_(reduce),
      ahead_(GatherAhead::Actions{[this](uint32_t k) { return chunks_->chunk_at(k).tier != Tier::kNotGathered; },
                                  [this](uint32_t k) { return chunks_->chunk_at(k).bytes; },
                                  [this](uint32_t k) { gather(k); },
                                  [this](uint32_t k, uint32_t slot) { gather_into_slot(k, slot); }}) {}

void ChunkGathering::attach(memory::Device* device, placement::Runtime* placement, placement::ChunkTable* chunks,
                            Shards shards) {
  device_ = device;
  placement_ = placement;
  chunks_ = chunks;
  shards_ = std::move(shards);
}

void ChunkGathering::reserve(uint32_t chunk_count, uint64_t slot_bytes) {
  if (ahead_.depth() == 0 || !group_->sharded()) return;
  gathering_.assign(chunk_count, nullptr);
  ahead_.reserve_slots(device_, &placement_->tier(), slot_bytes);
  try {
    group_->start_queue();
  } catch (...) {
    release();
    throw;
  }
  placement_->note_device_peak();
}

void ChunkGathering::release() {
  group_->stop_queue();  // its thread finishes the gathers writing the slots
  ahead_.release_slots(device_, &placement_->tier());
}

void* ChunkGathering::place_own_shard(uint32_t k, void* full) {
  const uint64_t shard_bytes = shards_.shard_bytes(k);
  void* mine = static_cast<char*>(full) + static_cast<size_t>(group_->rank()) * shard_bytes;
  if (shards_.on_device && shards_.on_device(k)) {
    device_->copy_sync(mine, shards_.shard(k), shard_bytes, memory::CopyKind::kDeviceToDevice);
  } else {
    device_->copy_sync(mine, shards_.shard(k), shard_bytes, memory::CopyKind::kHostToDevice);
    bytes_shard_to_device_ += shard_bytes;
  }
  return mine;
}

// All-gathers the compute-dtype shards of chunk k into a full buffer on the
// accelerator tier (room made by the placement policy, as for a fetch).
void ChunkGathering::gather(uint32_t k) {
  chunk::Chunk& c = chunks_->chunk_at(k);
  group_->require_ok("param_acquire");
  reduce_->finish_through(k);  // its shard takes the reduced gradient first
  void* dst = placement_->device_alloc(c.bytes, k, "gathered chunk " + std::to_string(k));
  try {
    // This rank's shard goes to its block of the buffer (a host-to-device
    // copy), then the all-gather fills the other blocks in place: the same
    // steps for Gloo on the emulated device and NCCL on a GPU.
    void* mine = place_own_shard(k, dst);
    const uint64_t shard_bytes = shards_.shard_bytes(k);
    group_->run("param_acquire: all-gather", CollectiveKind::kGather, k,
                [&] { group_->comm().all_gather(mine, dst, shard_bytes); });
  } catch (...) {
    device_->deallocate(dst, c.bytes);
    throw;
  }
  bytes_gathered_ += c.bytes;
  placement_->tier().add(Use::kChunks, c.bytes);
  placement_->note_device_peak();
  c.device = dst;
  c.tier = Tier::kDevice;
  c.ready = nullptr;  // written by the host, complete
  c.last_use = nullptr;
  c.prefetched = false;
  placement_->touch(k);
}

// Starts chunk k's all-gather into a slot on the collective queue: this
// rank's shard is copied into its block first, on this thread.
void ChunkGathering::gather_into_slot(uint32_t k, uint32_t s) {
  chunk::Chunk& c = chunks_->chunk_at(k);
  GatherAhead::Slot& slot = ahead_.slot(s);
  group_->require_ok("param_acquire");
  reduce_->finish_through(k);             // its shard takes the reduced gradient first
  device_->synchronize(slot.free_after);  // the slot's last chunk is unused
  slot.free_after = nullptr;
  void* dst = slot.buffer;
  void* mine = place_own_shard(k, dst);
  const uint64_t shard_bytes = shards_.shard_bytes(k);
  Communicator* comm = &group_->comm();
  gathering_[k] = group_->submit("param_acquire: all-gather ahead", CollectiveKind::kGather, k,
                                 [comm, mine, dst, shard_bytes] { comm->all_gather(mine, dst, shard_bytes); });
  slot.chunk = k;
  bytes_gathered_ += c.bytes;
  c.gather_slot = static_cast<int32_t>(s);
  c.device = dst;
  c.tier = Tier::kDevice;
  c.ready = nullptr;  // valid once its gather is waited for
  c.last_use = nullptr;
  c.prefetched = false;
}

void ChunkGathering::finish(uint32_t k, bool quiet) {
  if (k >= gathering_.size() || gathering_[k] == nullptr) return;
  CollectiveQueue::Ticket t = std::move(gathering_[k]);
  gathering_[k] = nullptr;
  std::string failure;
  const bool failed = group_->wait_failed(t, &failure);
  if (failed && !quiet) group_->fail("param_acquire: all-gather ahead", failure);
}

bool ChunkGathering::gather_or_wait(uint32_t k, uint64_t* critical_bytes) {
  chunk::Chunk& c = chunks_->chunk_at(k);
  if (c.tier == Tier::kNotGathered) {
    gather(k);
    if (group_->has_queue()) ahead_.note_on_demand();
    return true;
  }
  if (k < gathering_.size() && gathering_[k] != nullptr) {
    // Gathered ahead: wait for the all-gather.
    const bool waited = !group_->done(gathering_[k]);
    if (waited) *critical_bytes += c.bytes;
    const auto before = std::chrono::steady_clock::now();
    finish(k, false);
    ahead_.note_wait(waited, std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count());
  }
  return false;
}

// Frees chunk k's gathered buffer, wherever placement put it (its shards
// stay).  The memory goes back once queued work that used it is done.
void ChunkGathering::drop(uint32_t k, bool then_ahead) {
  if (!group_->sharded()) return;  // one process: payloads are the chunks themselves
  chunk::Chunk& c = chunks_->chunk_at(k);
  if (c.tier != Tier::kNotGathered) {
    if (c.compute_refs != 0) internal_error("dropping a gathered chunk in use");
    finish(k, true);  // a failure surfaces at the next collective
    const memory::EventPtr after = c.last_use != nullptr ? c.last_use : c.ready;
    if (c.gather_slot >= 0) {
      // The slot is free for the next ahead gather once the queued work
      // that used this chunk is done.
      GatherAhead::Slot& slot = ahead_.slot(static_cast<size_t>(c.gather_slot));
      slot.chunk = -1;
      slot.free_after = after;
      c.gather_slot = -1;
      c.device = nullptr;
    } else if (c.tier == Tier::kDevice) {
      placement_->defer_free_device(after, c.device, c.bytes, Use::kChunks);
      c.device = nullptr;
    } else {
      placement_->defer_free_host(after, c.host, c.bytes);
      c.host = nullptr;
    }
    c.tier = Tier::kNotGathered;
    c.ready = nullptr;
    c.last_use = nullptr;
    c.prefetched = false;
    placement_->forget(k);
  }
  if (then_ahead) ahead_.after_drop();
}

void ChunkGathering::drop_all() {
  if (!group_->sharded()) return;
  for (uint32_t k = 0; k < chunks_->chunk_count(); ++k) drop(k, false);
}

}  // namespace pstar::distributed
