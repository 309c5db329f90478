// checkpoint::EngineState over an engine's chunks (checkpoint_lists.h).
#include "values/checkpoint_lists.h"

#include <algorithm>
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
  if (list == 0 && master_format_ != optim::MasterFormat::kFp32) {
    if (a < b) optim::masters_to_f32(master_format_, src, a - lo, b - a, out);
    return;
  }
  if (list != 0 && list != 3 && src != nullptr && state_format_ != optim::StateFormat::kFp32) {
    if (a < b) moments_out(c, list, a - lo, b - a, out);
    return;
  }
  for (uint64_t i = a; i < b; ++i) {
    // Moments not allocated yet are zeros (chunk::Fp32Lists).
    out[i - a] = list == 3 ? load_as(c.shard, compute_dtype_, i - lo) : src ? src[i - lo] : 0.0f;
  }
}

void CheckpointLists::moments_out(const chunk::ChunkState& c, int list, uint64_t lo, uint64_t n, float* out) const {
  optim::moments_to_f32(state_format_, list == 2, list_base(c, list), c.shard_elems, lo, n, out);
  if (state_format_ != optim::StateFormat::kInt8 || list != 1) return;
  // A checkpoint holds values that encode back to the same codes and block
  // maxima, so that a resumed run has the same bits.  The decoded values
  // are such values but for one case: a block of m whose largest magnitude
  // was negative.  Its element took code 0, whose map value is -0.99297,
  // not -1, so its decoded value is -0.99297 x absmax and the block's
  // maximum would come back smaller.  That element is saved as -absmax
  // (code 0 again, since -1 lies below -0.99297); every other element is
  // its decoded value.  (lo is a block boundary: a parameter's or a
  // shard's start.)
  const optim::ConstMomentList m =
      optim::moment_list_at(state_format_, static_cast<const void*>(list_base(c, list)), c.shard_elems, lo);
  const uint8_t* codes = static_cast<const uint8_t*>(m.values);
  for (uint64_t b = 0; b * optim::kInt8BlockElems < n; ++b) {
    const float absmax = m.absmax[b];
    const uint64_t first = b * optim::kInt8BlockElems;
    const uint64_t end = std::min<uint64_t>(n, first + optim::kInt8BlockElems);
    if (!(absmax > 0.0f)) continue;
    bool exact = false;  // an element decodes to +absmax (code of 1.0)
    for (uint64_t i = first; i < end && !exact; ++i) exact = out[i] == absmax;
    if (exact) continue;
    for (uint64_t i = first; i < end; ++i) {
      if (codes[i] == 0) {
        out[i] = -absmax;
        break;
      }
    }
  }
}

void CheckpointLists::moments_in(chunk::ChunkState& c, int list, uint64_t lo, uint64_t n, const float* in) const {
  optim::moments_from_f32(state_format_, list == 2, list_base(c, list), c.shard_elems, lo, n, in);
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
    ensure_moments(host_, c, moment_bytes(c), true);
    HostLists lists(*parts_.hybrid, place.chunk, HostLists::list_bit(list));  // a shard's state on the device
    float* dst = list_base(c, list);
    const auto [lo, a, b] = shard_span(id, rank());
    if (state_format_ != optim::StateFormat::kFp32) {
      if (a < b) moments_in(c, list, a - lo, b - a, whole + (a - place.offset_elems));
    } else {
      for (uint64_t i = a; i < b; ++i) dst[i - lo] = whole[i - place.offset_elems];
    }
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
    ensure_moments(host_, c, moment_bytes(c), true);
  }
  if (list == 0 && master_format_ != optim::MasterFormat::kFp32) {
    // Read only (values_.write writes masters): their values, wherever they
    // are (host, drive, device).
    read_values(id, out);
    return;
  }
  if (list != 0 && state_format_ != optim::StateFormat::kFp32) {
    // Hybrid placement keeps fp32 state only: these lists are on the host.
    if (into_engine) {
      moments_in(c, list, place.offset_elems, params_[id].numel, in);
    } else {
      moments_out(c, list, place.offset_elems, params_[id].numel, out);
    }
    return;
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
