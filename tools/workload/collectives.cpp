// Predicted collectives of a sharded rank (collectives.h).
#include "collectives.h"

#include <algorithm>
#include <vector>

#include "chunk_packing.h"

namespace pstar::workload {

CollectiveBytes predict_collectives(const Workload& w, uint64_t chunk_elems, uint32_t world, uint64_t align) {
  CollectiveBytes out;
  if (world <= 1) return out;
  const ChunkPacking packing = pack_chunks(w, chunk_elems, world, align);
  const std::vector<uint32_t>& chunk_of = packing.chunk_of;
  const std::vector<uint64_t>& elems = packing.elems;
  const std::vector<uint32_t>& params_in = packing.params_in;
  const size_t chunks = elems.size();
  const uint64_t dtype = w.shape.dtype_bytes;
  std::vector<std::vector<uint32_t>> params_of(chunks);
  for (uint32_t p = 0; p < w.params.size(); ++p) params_of[chunk_of[p]].push_back(p);
  // The drop rule's counts (distributed/drop_rule.h), from an iteration's start.
  std::vector<bool> gathered(chunks, false);
  std::vector<uint32_t> refs(chunks, 0), open_backward(chunks, 0);
  std::vector<uint32_t> unreleased_fwd(params_in), unreleased_rec(params_in);
  std::vector<uint8_t> released(w.params.size(), 0);  // bit 0 FORWARD, bit 1 RECOMPUTE
  std::vector<uint32_t> fwd_uses(w.params.size(), 0), bwd_uses(w.params.size(), 0);
  std::vector<bool> pending(chunks, false);
  // The device: gathered chunks' bytes, live fp32 gradient buffers (per
  // parameter and per chunk), the use's non-model report.
  // Held: the chunks a use holds (acquired, not yet released).
  uint64_t gathered_bytes = 0, grad_bytes = 0, nonmodel = 0, held_bytes = 0;
  std::vector<bool> has_buffer(w.params.size(), false);
  std::vector<uint64_t> chunk_grad_bytes(chunks, 0);
  auto note_peak = [&](uint64_t staging) {
    const uint64_t now = gathered_bytes + grad_bytes + nonmodel;
    out.peak_device_bytes_host_comm = std::max(out.peak_device_bytes_host_comm, now);
    out.peak_device_bytes_device_comm = std::max(out.peak_device_bytes_device_comm, now + staging);
    const uint64_t need = held_bytes + grad_bytes + nonmodel;
    out.need_peak_bytes_host_comm = std::max(out.need_peak_bytes_host_comm, need);
    out.need_peak_bytes_device_comm = std::max(out.need_peak_bytes_device_comm, need + staging);
  };
  std::vector<uint64_t> last_use(chunks, 0);  // 1 + the index of the chunk's last use, 0: none
  uint64_t use_index = 0;
  for (size_t k = 0; k < chunks; ++k) out.largest_chunk_bytes = std::max(out.largest_chunk_bytes, elems[k] * dtype);
  out.shard_elems.resize(chunks);
  out.chunk_gathers.assign(chunks, 0);
  for (size_t k = 0; k < chunks; ++k) out.shard_elems[k] = elems[k] / world;
  // Chunk k's reduce-scatter: its gradient buffers go to the host or through
  // the device staging (the chunk's fp32 size plus one block), then go.
  auto reduce = [&](size_t k) {
    out.reduce_scattered += elems[k] * sizeof(float);
    ++out.reductions;
    out.grad_bytes_to_host_staging += chunk_grad_bytes[k];
    note_peak((elems[k] + elems[k] / world) * sizeof(float));
    grad_bytes -= chunk_grad_bytes[k];
    chunk_grad_bytes[k] = 0;
    pending[k] = false;
  };
  for (const Use& u : w.schedule) {
    nonmodel = u.nonmodel_bytes;
    ++use_index;
    for (uint32_t p : u.params) {
      const uint32_t k = chunk_of[p];
      last_use[k] = use_index;
      if (refs[k] == 0) held_bytes += elems[k] * dtype;
      if (!gathered[k]) {
        gathered[k] = true;
        gathered_bytes += elems[k] * dtype;
        out.all_gathered += elems[k] * dtype;
        ++out.gathers;
        ++out.chunk_gathers[k];
      }
      if (u.stage == Stage::Backward && !has_buffer[p]) {
        has_buffer[p] = true;
        grad_bytes += w.params[p].numel * sizeof(float);
        chunk_grad_bytes[k] += w.params[p].numel * sizeof(float);
      }
      note_peak(0);
      ++refs[k];
      const bool was_open = bwd_uses[p] != fwd_uses[p];
      if (u.stage == Stage::Forward) ++fwd_uses[p];
      if (u.stage == Stage::Backward) ++bwd_uses[p];
      const bool now_open = bwd_uses[p] != fwd_uses[p];
      if (was_open != now_open) open_backward[k] += now_open ? 1 : uint32_t(-1);
      if (u.stage == Stage::Backward && u.grad_write && !now_open) pending[k] = true;
    }
    for (uint32_t p : u.params) {
      const uint32_t k = chunk_of[p];
      --refs[k];
      if (refs[k] == 0) held_bytes -= elems[k] * dtype;
      bool drop = false;
      if (u.stage == Stage::Backward) {
        drop = refs[k] == 0 && open_backward[k] == 0;
        if (drop && pending[k]) {
          reduce(k);
          for (uint32_t q : params_of[k]) has_buffer[q] = false;
        }
      } else {
        const uint8_t bit = u.stage == Stage::Recompute ? 2 : 1;
        std::vector<uint32_t>& unreleased = u.stage == Stage::Recompute ? unreleased_rec : unreleased_fwd;
        if ((released[p] & bit) == 0) {
          released[p] |= bit;
          --unreleased[k];
        }
        drop = refs[k] == 0 && unreleased[k] == 0;
      }
      if (drop) {
        gathered[k] = false;
        gathered_bytes -= elems[k] * dtype;
      }
    }
  }
  nonmodel = 0;  // the replay reports none at the step
  // Chunks whose gradients are still pending are reduce-scattered at the
  // step.
  for (size_t k = 0; k < chunks; ++k) {
    if (pending[k]) reduce(k);
  }
  // Used last first; chunks never used keep layout order at the end.
  for (uint32_t k = 0; k < chunks; ++k) out.placement_order.push_back(k);
  std::stable_sort(out.placement_order.begin(), out.placement_order.end(),
                   [&](uint32_t a, uint32_t b) { return last_use[a] > last_use[b]; });
  return out;
}

ShardedPlacement predict_sharded_placement(const CollectiveBytes& c, uint64_t capacity_bytes, bool device_comm,
                                           uint32_t dtype_bytes, bool grad_accumulation) {
  // placement::HybridPlacement::margin and plan, for a sharded rank.
  constexpr uint64_t kStreamingChunks = 2;
  constexpr uint64_t kLists = 3;  // master, m, v
  ShardedPlacement out;
  // The need peak and the streaming reserve, or what the device held
  // beside them at its peak (chunks kept gathered between uses), if more.
  const uint64_t need = std::max((device_comm ? c.need_peak_bytes_device_comm : c.need_peak_bytes_host_comm) +
                                     kStreamingChunks * c.largest_chunk_bytes,
                                 device_comm ? c.peak_device_bytes_device_comm : c.peak_device_bytes_host_comm);
  out.margin = capacity_bytes > need ? capacity_bytes - need : 0;
  uint64_t left = out.margin;
  for (uint32_t k : c.placement_order) {
    const uint64_t n = c.shard_elems[k];
    const uint64_t lists = kLists * n * sizeof(float);  // the gradient list stays on the host
    const uint64_t cost = lists + n * dtype_bytes + (grad_accumulation ? n * sizeof(float) : 0);
    if (cost > left) continue;
    left -= cost;
    ++out.chunks;
    out.state_bytes += cost;
    out.list_bytes += kLists * n * sizeof(float);
    out.elems += n;
    out.gathered_shard_bytes += uint64_t(c.chunk_gathers[k]) * n * dtype_bytes;
    out.chosen.push_back(k);
  }
  return out;
}

}  // namespace pstar::workload
