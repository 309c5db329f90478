// The collectives a ZeRO-sharded rank issues in one TRAIN iteration of a
// workload, predicted from the engine's rules without running it (a
// sharded engine has no dry run): the chunk layout of N ranks
// (chunk_packing.h) and the drop rule (distributed/drop_rule.h: a chunk is
// all-gathered at a use that finds it dropped, dropped once every one of its
// parameters was released in that FORWARD or RECOMPUTE stage, or in
// BACKWARD once all its gradients are final, which also reduce-scatters
// them).  Assumes no gathered chunk is evicted (an unlimited device): an
// eviction would replace a later all-gather by a fetch from the host.
//
// With it, a sharded rank's own PCIe traffic and device peak: a gather
// copies the rank's shard of the chunk to the device before the collective
// fills the rest; a reduce-scatter copies the rank's fp32 block of the sum
// to the host (a communicator that reduces device memory: NCCL), or the
// chunk's fp32 gradient buffers to host staging (one that reduces host
// memory: Gloo on the emulated device).  The device holds the gathered
// chunks, each parameter's fp32 gradient buffer from its first backward
// acquire until its chunk's reduce-scatter, the use's reported non-model
// bytes and, with NCCL, the reduce-scatter's staging (the chunk's fp32 size
// plus one block) while it runs.  No hybrid placement (placed state comes
// on top) and no gathering ahead (its slots come on top).
//
// And the rank's hybrid placement (placement/hybrid.h), which it decides
// alone from what its warm-up needed: the peak of the device tier's need
// (memory::DeviceTier::need: the chunks held by a use, not those kept
// gathered after it, gradient buffers, staging and non-model bytes) and a
// streaming reserve of two chunks, or the device's peak beside placed
// state (those kept-gathered chunks too) where that is more, and its
// trainable chunks' shards of state, used last first, while they fit.
#pragma once

#include <cstdint>
#include <vector>

#include "gpt_workload.h"

namespace pstar::workload {

struct CollectiveBytes {
  // The engine's counters for one iteration (pstar_stats'
  // bytes_all_gathered and bytes_reduce_scattered): the full chunk's bytes
  // per all-gather (compute dtype) and per reduce-scatter (fp32).
  uint64_t all_gathered = 0;
  uint64_t reduce_scattered = 0;
  uint32_t gathers = 0;
  uint32_t reductions = 0;
  // Host-memory communicator: the fp32 gradient bytes its reduce-scatters
  // copied to host staging (pstar_x_gather_stats.bytes_reduce_device_to_host).
  uint64_t grad_bytes_to_host_staging = 0;
  // The device's peak over the iteration (pstar_stats.peak_device_bytes of
  // an unlimited device without hybrid placement), with a host-memory and
  // with a device-memory communicator.
  uint64_t peak_device_bytes_host_comm = 0;
  uint64_t peak_device_bytes_device_comm = 0;
  // The peak of the device tier's need over the iteration (what hybrid
  // placement sizes its margin from), with either communicator.
  uint64_t need_peak_bytes_host_comm = 0;
  uint64_t need_peak_bytes_device_comm = 0;
  // The largest chunk's payload bytes (compute dtype): the streaming
  // reserve's unit (placement::kStreamingChunks).
  uint64_t largest_chunk_bytes = 0;
  // The chunks hybrid placement considers, in its order (used last first;
  // all of the workload's parameters train), and each one's shard elements.
  std::vector<uint32_t> placement_order;
  std::vector<uint64_t> shard_elems;    // per chunk
  std::vector<uint32_t> chunk_gathers;  // per chunk: its all-gathers in the iteration
  // What one rank copies over PCIe (pstar_x_gather_stats'
  // bytes_shard_host_to_device and, with NCCL, bytes_reduce_device_to_host):
  // its 1/N shard of every gathered chunk, its 1/N block of every sum.
  uint64_t shard_bytes_to_device(uint32_t world) const { return world == 0 ? 0 : all_gathered / world; }
  uint64_t reduced_bytes_to_host(uint32_t world) const { return world == 0 ? 0 : reduce_scattered / world; }
  // What one rank sends (and receives) over its link for them in a ring:
  // (N - 1) / N of each.
  double link_bytes(uint32_t world) const {
    return world <= 1 ? 0.0 : double(all_gathered + reduce_scattered) * double(world - 1) / double(world);
  }
};

// `align`: the layout's alignment in elements (chunk_packing.h: 128, or
// 256 with the int8 state format).
CollectiveBytes predict_collectives(const Workload& w, uint64_t chunk_elems, uint32_t world, uint64_t align = 128);

// What a sharded rank's hybrid placement puts on a device of
// `capacity_bytes` (the placement limit: options' capacity less margin)
// after warm-up: the chunks chosen, and their buffers' bytes
// (pstar_stats.optimizer_device_bytes): per chunk its shard's master, m and
// v in fp32 and its compute shard (and the staging of an fp32 gradient
// with accumulation).
struct ShardedPlacement {
  uint32_t chunks = 0;
  uint64_t state_bytes = 0;  // the buffers' bytes
  uint64_t list_bytes = 0;   // of which fp32 master, m and v
  uint64_t margin = 0;       // capacity less max(need peak + streaming reserve, device peak)
  uint64_t elems = 0;        // the placed shards' elements
  // Per iteration once placed: the placed chunks' compute shards, which
  // their all-gathers copy on the device instead of from the host
  // (pstar_x_gather_stats.bytes_shard_host_to_device leaves them out).
  uint64_t gathered_shard_bytes = 0;
  std::vector<uint32_t> chosen;  // the chunks, in the order taken
};
ShardedPlacement predict_sharded_placement(const CollectiveBytes& c, uint64_t capacity_bytes, bool device_comm,
                                           uint32_t dtype_bytes, bool grad_accumulation = false);

}  // namespace pstar::workload
