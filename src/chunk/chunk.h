// Chunk: what the chunk store and the placement runtime know of one chunk:
// where its compute-dtype payload is, when that payload is valid, and who
// uses it.  ChunkState, one rank's record of a chunk, extends it with the
// Fp32Lists and the shard; the placement runtime sees the Chunk part only,
// hybrid placement the Chunk and the lists.
#pragma once

#include <algorithm>
#include <cstdint>

#include "chunk/layout.h"
#include "memory/device.h"

namespace pstar::chunk {

// kNotGathered: a sharded engine's chunk whose full payload does not exist
// (only this rank's shard does), outside the tiers' chunk accounting.
enum class Tier { kHost, kDevice, kNotGathered };

struct Chunk {
  uint64_t bytes = 0;  // compute-dtype payload (the full chunk)
  Tier tier = Tier::kHost;
  void* host = nullptr;    // payload when tier == kHost
  void* device = nullptr;  // payload when tier == kDevice
  // tier == kDevice: the host buffer it was fetched from, kept while it
  // holds the same bits as the device payload (placement/runtime.h, "clean
  // chunks"); null once anything may have written the device payload.
  void* host_copy = nullptr;
  memory::EventPtr ready;     // completes when the payload at its tier is valid
  memory::EventPtr last_use;  // completes when queued work that uses it is done
  uint32_t compute_refs = 0;  // tensors in COMPUTE
  // While compute_refs > 0: the bytes placement::Runtime::hold counted in
  // the device tier's held bytes (its payload, or 0 for one that is in a
  // gather slot or stays on the device with its optimizer state).
  uint64_t held_bytes = 0;
  bool prefetched = false;     // fetched ahead of use, not acquired since
  bool pinned_static = false;  // static policy: never evicted once fetched
  bool evicted = false;        // left the accelerator at least once
  // Its latest copy to the host (placement::Runtime::copy_out) in the order
  // of the device-to-host stream, which completes its work in order: a
  // chunk with a lower number is on the host no later (0: never copied).
  uint64_t copy_out_order = 0;
  // In a step that prefetches for the next iteration: on the host, its CPU
  // update not done yet, so not to be fetched (prefetch stops at it).
  bool awaiting_update = false;
  uint64_t last_acquire = 0;  // 1 + acquires before its latest acquire; 0 = never
  // Hybrid placement: the device buffer holding its optimizer state (null:
  // none).  Such a chunk's payload never leaves the accelerator once placed,
  // so that its gradient is there when the step runs.
  void* opt_device = nullptr;
  // Gathering ahead: the gather slot holding the gathered chunk (-1: none).
  // Such a chunk is never evicted; its bytes are the slot's.
  int32_t gather_slot = -1;

  // May leave the accelerator (eviction, prefetch's swap): not in use, its
  // optimizer state not on the device, not in a gather slot.
  bool evictable() const { return compute_refs == 0 && opt_device == nullptr && gather_slot < 0; }
};

// The fp32 twins of a trainable chunk (chunk/layout.h), null for a frozen
// one: master, Adam's m and v, and the gradient list with gradient
// accumulation.  They live on the host, on the NVMe drive (memory/nvme_tier.h
// points them at its staging buffers while staged in), or with hybrid
// placement (placement/hybrid.h) in the chunk's opt_device buffer for good.
// Adam's moments (exp_avg, exp_avg_sq) are null until the chunk's first
// update, a checkpoint load or its placement on the device, and read as
// zeros until then (values::ensure_moments allocates them): the host holds
// the payload and the master only while warm-up records the trace, and a
// chunk placed on the device at the first step never has them on the host.
// A struct of its own so that hybrid placement can be handed the lists of a
// chunk without the rest of the engine's record.
//
// Adam's moments are stored in the engine's state format
// (optim/adam_states.h: fp32, bf16, or int8 codes with their block maxima),
// optim::moment_list_bytes(format, elems) bytes each, addressed by these
// float pointers whatever the format: only in the fp32 format (the NVMe
// tier's and hybrid placement's, for now) do they point at floats, and
// code reading them as floats must be in a path that format allows.
struct Fp32Lists {
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* grad32 = nullptr;
  // Pinned masters of its parameters (pstar_param_pin): the caller holds
  // pointers into `master`, so the list must not move.
  uint32_t master_pins = 0;
};

// What one rank keeps of one chunk: the chunk store's part (Chunk), the
// fp32 lists, and with world > 1 its shard.
struct ChunkState : Chunk, Fp32Lists {
  // Elements of the full chunk (its layout capacity, padded with world > 1
  // to a multiple of world * kAlignElems) and of one rank's shard (with
  // one process the whole chunk).  Each of the rank's fp32 lists holds
  // shard_elems.
  uint64_t elems = 0;
  uint64_t shard_elems = 0;
  // world > 1: this rank's shard of the compute payload, on the host, for
  // good.  The gathered full chunk is Chunk's payload (tier kNotGathered
  // when not gathered); its Fp32Lists are shards too.
  void* shard = nullptr;
  // One process without gradient accumulation: trainable parameters of the
  // chunk whose gradient this iteration has not yet finalized into its slot.
  // At 0 the chunk's backward is over; unless its optimizer state is on the
  // device, it leaves the device then, not at the step.
  uint32_t grads_to_come = 0;
};

// The elements of a parameter placed at `place` in rank `rank`'s shard of
// its chunk (shard_elems each): [a, b) in chunk coordinates, none when
// a >= b; the shard begins at lo.
struct ShardSpan {
  uint64_t lo, a, b;
};
inline ShardSpan shard_span(const ParamPlacement& place, uint64_t shard_elems, int rank) {
  const uint64_t lo = static_cast<uint64_t>(rank) * shard_elems;
  return {lo, std::max(place.offset_elems, lo), std::min(place.offset_elems + place.numel, lo + shard_elems)};
}

}  // namespace pstar::chunk
