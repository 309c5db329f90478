// checkpoint::EngineState over an engine's chunks (checkpoint_lists.h).
#include "values/checkpoint_lists.h"

#include <cstring>

#include "util/dtype.h"

namespace pstar::values {

namespace {
using HostLists = placement::HybridPlacement::HostLists;

float* list_base(const chunk::ChunkState& c, int list) {
  return list == 0 ? c.master : list == 1 ? c.exp_avg : c.exp_avg_sq;
}
}  // namespace

checkpoint::ParamView CheckpointLists::param(uint32_t id) const {
  const chunk::Param& p = params_[id];
  return {p.name, p.shape, p.numel, p.frozen(), p.lr_scale, p.weight_decay, p.pins != 0};
}

chunk::ShardSpan CheckpointLists::shard_span(uint32_t id, int rank) const {
  const auto& place = layout_.param(id);
  return chunk::shard_span(place, (*parts_.chunks)[place.chunk].shard_elems, rank);
}

checkpoint::Part CheckpointLists::part(uint32_t id, int rank) const {
  if (!sharded()) return {0, params_[id].numel};
  const chunk::ShardSpan s = shard_span(id, rank);
  if (s.a >= s.b) return {};
  return {s.a - layout_.param(id).offset_elems, s.b - s.a};
}

void CheckpointLists::all_gather(const void* mine, void* all, size_t bytes) {
  parts_.group->all_gather_host("checkpoint: all-gather", distributed::CollectiveKind::kCheckpoint, 0, mine, all,
                                bytes);
}

void CheckpointLists::read_list(uint32_t id, int list, float* out) {
  if (!sharded()) {
    if (list == 3) {
      read_values(id, out);
    } else {
      copy_list(id, list, false, out, nullptr);
    }
    return;
  }
  // This rank's shard of the chunk: the fp32 list, or the compute payload
  // of a frozen parameter.
  const auto& place = layout_.param(id);
  if (list != 3) parts_.nvme->access(place.chunk, false);
  const HostLists lists(*parts_.hybrid, place.chunk, HostLists::list_bit(list));  // a shard's state on the device
  const chunk::ChunkState& c = (*parts_.chunks)[place.chunk];
  const auto [lo, a, b] = shard_span(id, rank());
  const float* src = list == 3 ? nullptr : list_base(c, list);
  for (uint64_t i = a; i < b; ++i) {
    // Moments not allocated yet are zeros (chunk::Fp32Lists).
    out[i - a] = list == 3 ? load_as(c.shard, compute_dtype_, i - lo) : src ? src[i - lo] : 0.0f;
  }
}

// Straight to the values (not Engine::read/write, whose checks the callers
// have made, and whose wait would throw the update thread's failure that
// the load is about to clear).
void CheckpointLists::read_values(uint32_t id, float* out) {
  values_.read(id, out, params_[id].numel, PSTAR_DTYPE_F32);
}

void CheckpointLists::write_list(uint32_t id, int list, const float* whole) {
  if (list == 0 || list == 3) {
    values_.write(id, whole, params_[id].numel, PSTAR_DTYPE_F32);
  } else if (!sharded()) {
    copy_list(id, list, true, nullptr, whole);
  } else {
    const auto& place = layout_.param(id);
    parts_.nvme->access(place.chunk, true);
    chunk::ChunkState& c = (*parts_.chunks)[place.chunk];
    ensure_moments(host_, c, true);
    HostLists lists(*parts_.hybrid, place.chunk, HostLists::list_bit(list));  // a shard's state on the device
    float* dst = list_base(c, list);
    const auto [lo, a, b] = shard_span(id, rank());
    for (uint64_t i = a; i < b; ++i) dst[i - lo] = whole[i - place.offset_elems];
    lists.write_back();
  }
}

void CheckpointLists::set_param_group(uint32_t id, float lr_scale, bool weight_decay) {
  params_[id].lr_scale = lr_scale;
  params_[id].weight_decay = weight_decay;
}

void CheckpointLists::copy_list(uint32_t id, int list, bool into_engine, float* out, const float* in) {
  const auto& place = layout_.param(id);
  const uint64_t bytes = params_[id].numel * sizeof(float);
  if (bytes == 0) return;  // `out` or `in` may be NULL (an empty vector's data())
  parts_.nvme->access(place.chunk, into_engine);
  chunk::ChunkState& c = (*parts_.chunks)[place.chunk];
  if (list_base(c, list) == nullptr) {
    // Moments not allocated yet are zeros (chunk::Fp32Lists): read as
    // such, allocated to be written.
    if (!into_engine) {
      std::memset(out, 0, bytes);
      return;
    }
    ensure_moments(host_, c, true);
  }
  float* at = list_base(c, list) + place.offset_elems;
  if (c.opt_device != nullptr) {
    // Host waits until the device copy of the lists may be copied
    // (placement/hybrid.h), then copies on the compute stream.
    parts_.hybrid->sync(place.chunk);
    if (into_engine) {
      parts_.device->copy_sync(at, in, bytes, memory::CopyKind::kHostToDevice);
    } else {
      parts_.device->copy_sync(out, at, bytes, memory::CopyKind::kDeviceToHost);
    }
  } else if (into_engine) {
    std::memcpy(at, in, bytes);
  } else {
    std::memcpy(out, at, bytes);
  }
}

}  // namespace pstar::values
