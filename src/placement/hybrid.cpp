// Hybrid optimizer placement (placement/hybrid.h).
#include "placement/hybrid.h"

#include <algorithm>
#include <limits>
#include <string>

#include "util/error.h"
#include "util/log.h"

namespace pstar::placement {

namespace {
using chunk::Tier;
using Use = memory::DeviceTier::Use;
std::string bytes_str(uint64_t b) { return std::to_string(b) + " bytes"; }
}  // namespace

void HybridPlacement::attach(HybridTable* chunks, const chunk::ChunkLayout* layout, bool sharded) {
  chunks_ = chunks;
  layout_ = layout;
  sharded_ = sharded;
  base_.assign(chunks->chunk_count(), nullptr);
  bytes_.assign(chunks->chunk_count(), 0);
  ready_.assign(chunks->chunk_count(), nullptr);
}

void HybridPlacement::step_begins(const Plan& p) {
  ++train_steps_;
  if (!options_.enabled || train_steps_ < options_.warmup_iterations) return;  // the need peak spans warm-up
  for (uint32_t k : p.out) move_out(k);
  // The sizes of the host buffers the moves in free.
  std::vector<uint64_t> freed;
  for (uint32_t k : p.in) {
    const chunk::Fp32Lists& l = chunks_->lists_at(k);
    const float* const lists[] = {l.master, l.exp_avg, l.exp_avg_sq, l.grad32};
    for (size_t slot = 0; slot < device_lists(); ++slot)
      if (lists[slot] != nullptr) freed.push_back(list_bytes(k, slot));
    if (sharded_) freed.push_back(shard_bytes(k));
  }
  for (uint32_t k : p.in) move(k);
  if (!p.in.empty()) {
    // The host lists the copies read go back to the host pool now, not at
    // some later reclaim: the update about to run takes Adam's moments of
    // host chunks from it, and the host's peak stays that of the placement.
    memory::Stream* s = device_->h2d_stream();
    runtime_->host_wait(s, device_->record(s));
    runtime_->reclaim_deferred(false);
    trim_unwanted(freed);
  }
  const memory::DeviceTier& tier = runtime_->tier();
  if (!p.empty()) {
    log::info("hybrid optimizer placement: " + std::to_string(chunks_on_device_) + " optimizer chunks on the device (" +
              std::to_string(p.in.size()) + " in, " + std::to_string(p.out.size()) + " out; " +
              bytes_str(tier.bytes(Use::kOptimizer)) +
              (tier.limited()
                   ? " in a margin of " + bytes_str(p.margin) + " above a need peak of " + bytes_str(tier.need_peak()) +
                         (sharded_ ? " and a resident peak of " + bytes_str(tier.resident_peak()) : std::string())
                   : std::string()) +
              ")");
  }
  runtime_->tier().reset_need_peak();
}

void HybridPlacement::trim_unwanted(std::vector<uint64_t> freed) {
  // What the host pool will be asked for next: the moment lists (and the
  // gradient list) of host chunks that do not have them yet.  With fp32
  // moments a freed master is exactly such a buffer; with another state
  // or master format, and for a sharded rank's compute shards, the freed
  // sizes match nothing the pool will give out, and without a host
  // capacity to press them out they would stay held for good (the planner
  // measured 9.1 GB per rank held so with int8 moments on v100x8).
  std::vector<uint64_t> wanted;
  for (uint32_t k = 0; k < chunks_->chunk_count(); ++k) {
    if (placed(k) || layout_->chunks()[k].frozen) continue;
    const chunk::Fp32Lists& l = chunks_->lists_at(k);
    if (l.exp_avg == nullptr) wanted.push_back(list_bytes(k, 1));
    if (l.exp_avg_sq == nullptr) wanted.push_back(list_bytes(k, 2));
    if (device_lists() == 4 && l.grad32 == nullptr) wanted.push_back(list_bytes(k, 3));
  }
  std::sort(wanted.begin(), wanted.end());
  std::sort(freed.begin(), freed.end());
  freed.erase(std::unique(freed.begin(), freed.end()), freed.end());
  for (uint64_t b : freed)
    if (!std::binary_search(wanted.begin(), wanted.end(), b)) runtime_->trim_host_cache(b);
}

HybridPlacement::Plan HybridPlacement::step_plan() const {
  if (!options_.enabled || train_steps_ + 1 < options_.warmup_iterations) return Plan{};
  return plan();
}

uint64_t HybridPlacement::state_bytes(uint32_t k) const {
  const uint64_t lists = list_offset(k, device_lists());
  if (!sharded_) return lists;
  // The compute slot, and the fp32 gradient's staging with accumulation.
  return lists + shard_bytes(k) + (options_.grad_accumulation ? list_bytes(k) : 0);
}

void* HybridPlacement::slot_staging(uint32_t k) const { return list_at(k, device_lists()); }

float* HybridPlacement::grad_staging(uint32_t k) const {
  if (!options_.grad_accumulation) return nullptr;
  return reinterpret_cast<float*>(static_cast<char*>(slot_staging(k)) + shard_bytes(k));
}

uint64_t HybridPlacement::margin() const {
  const memory::DeviceTier& tier = runtime_->tier();
  if (!tier.limited()) return std::numeric_limits<uint64_t>::max();
  // What the iterations since the last decision needed on the device
  // whatever was cached (DeviceTier::need: held chunks, gradient buffers,
  // non-model bytes, at their peak), and a streaming reserve through which
  // the other chunks are fetched and prefetched.  The chunk cache gives way
  // to the state.
  uint64_t largest_chunk = 0;
  for (uint32_t k = 0; k < chunks_->chunk_count(); ++k)
    largest_chunk = std::max(largest_chunk, chunks_->chunk_at(k).bytes);
  uint64_t need = tier.need_peak() + kStreamingChunks * largest_chunk;
  // With sharding nothing streams but gathered chunks, and those the drop
  // rule keeps gathered between uses stay resident without being held:
  // where they exceed the reserve, state placed in their room would make
  // the rank evict them (whole chunks to the host and back) instead.
  if (sharded_) need = std::max(need, tier.resident_peak());
  return tier.capacity() > need ? tier.capacity() - need : 0;
}

HybridPlacement::Plan HybridPlacement::plan() const {
  Plan p;
  std::vector<uint32_t> order;
  for (uint32_t k = 0; k < chunks_->chunk_count(); ++k) {
    if (!layout_->chunks()[k].frozen) order.push_back(k);
  }
  // Used last first; chunks never acquired keep layout order at the end.
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return chunks_->chunk_at(a).last_acquire > chunks_->chunk_at(b).last_acquire;
  });
  p.margin = margin();
  uint64_t left = p.margin;
  for (uint32_t k : order) {
    const chunk::Chunk& c = chunks_->chunk_at(k);
    const bool placed = this->placed(k);
    // Exported masters stay where they are (they are never on the device:
    // pstar_param_pin refuses state there).
    if (!placed && chunks_->lists_at(k).master_pins != 0) continue;
    // The state, and (one process) the payload: pinned resident while the
    // state is there.
    const uint64_t cost = state_bytes(k) + (sharded_ ? 0 : c.bytes);
    if (cost <= left) {
      left -= cost;
      if (!placed) p.in.push_back(k);
    } else if (placed) {
      p.out.push_back(k);
    }
  }
  return p;
}

void HybridPlacement::move(uint32_t k) {
  chunk::Chunk& c = chunks_->chunk_at(k);
  chunk::Fp32Lists& l = chunks_->lists_at(k);
  if (!sharded_ && c.tier != Tier::kDevice) runtime_->fetch(k);
  const uint64_t bytes = state_bytes(k);
  float* base = static_cast<float*>(runtime_->device_alloc(bytes, k, "optimizer state of chunk " + std::to_string(k)));
  auto at = [&](size_t i) { return reinterpret_cast<float*>(reinterpret_cast<char*>(base) + list_offset(k, i)); };
  runtime_->tier().add(Use::kOptimizer, bytes);
  runtime_->note_device_peak();
  // The host lists are current: the previous step's update is done.  The
  // lists sit at fixed slots (master, m, v, then the gradient list with
  // accumulation); moments not yet allocated (chunk::Fp32Lists: zeros) are
  // zero-filled on the device instead of copied.
  memory::Stream* s = device_->h2d_stream();
  float** lists[] = {&l.master, &l.exp_avg, &l.exp_avg_sq, &l.grad32};
  const size_t slots = device_lists();
  uint64_t copied = 0;
  for (size_t slot = 0; slot < slots; ++slot) {
    float* dst = at(slot);
    const uint64_t list = list_bytes(k, slot);
    if (*lists[slot] == nullptr) {
      device_->memset_async(s, dst, 0, list);
    } else {
      device_->copy_async(s, dst, *lists[slot], list, memory::CopyKind::kHostToDevice);
      copied += list;
    }
  }
  // With world > 1 the compute shard (weights, or the gradient its applied
  // reduce-scatter left) moves into the slot after the lists, for good.
  void** shard = sharded_ ? chunks_->compute_shard(k) : nullptr;
  void* slot = at(slots);
  if (shard != nullptr) {
    device_->copy_async(s, slot, *shard, shard_bytes(k), memory::CopyKind::kHostToDevice);
    copied += shard_bytes(k);
  }
  const memory::EventPtr done = device_->record(s);
  for (size_t slot = 0; slot < slots; ++slot) {
    if (*lists[slot] != nullptr) runtime_->defer_free_host(done, *lists[slot], list_bytes(k, slot));
    *lists[slot] = at(slot);
  }
  if (shard != nullptr) {
    runtime_->defer_free_host(done, *shard, shard_bytes(k));
    *shard = slot;
  }
  if (!sharded_) c.opt_device = base;
  base_[k] = base;
  bytes_[k] = bytes;
  ready_[k] = done;
  runtime_->count_host_to_device(copied);
  ++chunks_on_device_;
}

void HybridPlacement::move_out(uint32_t k) {
  chunk::Chunk& c = chunks_->chunk_at(k);
  chunk::Fp32Lists& l = chunks_->lists_at(k);
  const uint64_t bytes = bytes_[k];
  void* base = base_[k];
  // After the chunk's queued work (its device update on the compute stream).
  memory::Stream* s = device_->d2h_stream();
  device_->stream_wait(s, ready_[k]);
  device_->stream_wait(s, device_->record(device_->compute_stream()));
  device_->stream_wait(s, c.last_use);
  float** lists[] = {&l.master, &l.exp_avg, &l.exp_avg_sq, &l.grad32};
  uint64_t moved = 0;
  for (size_t slot = 0; slot < device_lists(); ++slot) {
    float** list = lists[slot];
    const uint64_t b = list_bytes(k, slot);
    float* host = static_cast<float*>(runtime_->host_alloc(b));
    device_->copy_async(s, host, *list, b, memory::CopyKind::kDeviceToHost);
    *list = host;
    moved += b;
  }
  // With world > 1 the compute shard comes back to the host with them.
  void** shard = sharded_ ? chunks_->compute_shard(k) : nullptr;
  if (shard != nullptr) {
    void* host = runtime_->host_alloc(shard_bytes(k));
    device_->copy_async(s, host, *shard, shard_bytes(k), memory::CopyKind::kDeviceToHost);
    *shard = host;
  }
  const memory::EventPtr done = device_->record(s);
  runtime_->host_wait(s, done);
  runtime_->check_ready(done, "optimizer state moved to the host");
  runtime_->defer_free_device(done, base, bytes, Use::kOptimizer);
  runtime_->count_device_to_host(moved + (shard != nullptr ? shard_bytes(k) : 0));
  c.opt_device = nullptr;
  base_[k] = nullptr;
  bytes_[k] = 0;
  ready_[k] = nullptr;
  --chunks_on_device_;
}

void HybridPlacement::sync(uint32_t k) {
  const chunk::Chunk& c = chunks_->chunk_at(k);
  device_->synchronize(ready_[k]);
  device_->synchronize(device_->compute_stream());
  device_->synchronize(c.last_use);
  runtime_->check_ready(ready_[k], "optimizer state");
}

void HybridPlacement::read_list(uint32_t k, const void* on_device, void* out, uint64_t bytes) {
  sync(k);
  device_->copy_sync(out, on_device, bytes, memory::CopyKind::kDeviceToHost);
}

void HybridPlacement::write_list(uint32_t k, void* on_device, const void* in, uint64_t bytes) {
  sync(k);
  device_->copy_sync(on_device, in, bytes, memory::CopyKind::kHostToDevice);
}

void HybridPlacement::write_shard(uint32_t k, uint64_t offset_elems, const void* in, uint64_t bytes) {
  if (!shard_on_device(k))
    internal_error("write_shard: the compute shard of chunk " + std::to_string(k) + " is not on the device");
  sync(k);
  void* dst = static_cast<char*>(*chunks_->compute_shard(k)) + offset_elems * options_.elem_bytes;
  device_->copy_sync(dst, in, bytes, memory::CopyKind::kHostToDevice);
}

void HybridPlacement::read_gradient(uint32_t k, const float* on_device, float* out, uint64_t n) {
  device_->stream_wait(device_->compute_stream(), chunks_->chunk_at(k).last_use);
  device_->copy_sync(out, on_device, n * sizeof(float), memory::CopyKind::kDeviceToHost);
}

void HybridPlacement::fold_gradient(uint32_t k, memory::Stream* stream, uint64_t offset_elems, float* acc, uint64_t n) {
  device_->stream_wait(stream, ready_[k]);
  device_->grad_accumulate(stream, chunks_->lists_at(k).grad32 + offset_elems, acc, PSTAR_DTYPE_F32, PSTAR_MEM_DEVICE,
                           n, false);
  runtime_->defer_free_device(device_->record(stream), acc, n * sizeof(float), Use::kGradients);
}

void HybridPlacement::clear_gradients() {
  memory::Stream* cs = device_->compute_stream();
  for (uint32_t k = 0; k < chunks_->chunk_count(); ++k) {
    chunk::Chunk& c = chunks_->chunk_at(k);
    if (c.opt_device == nullptr) continue;
    device_->stream_wait(cs, ready_[k]);
    device_->stream_wait(cs, c.last_use);
    device_->memset_async(cs, chunks_->lists_at(k).grad32, 0, layout_->chunks()[k].capacity_elems * sizeof(float));
    c.last_use = device_->record(cs);
  }
}

bool HybridPlacement::release(uint32_t k) {
  if (!placed(k)) return false;
  device_->deallocate(base_[k], bytes_[k]);
  chunks_->chunk_at(k).opt_device = nullptr;
  chunk::Fp32Lists& l = chunks_->lists_at(k);
  l.master = l.exp_avg = l.exp_avg_sq = nullptr;
  if (device_lists() == 4) l.grad32 = nullptr;
  if (sharded_) *chunks_->compute_shard(k) = nullptr;  // it was in the buffer
  base_[k] = nullptr;
  bytes_[k] = 0;
  ready_[k] = nullptr;
  return true;
}

HybridPlacement::HostLists::HostLists(HybridPlacement& hybrid, uint32_t k, unsigned which) : hybrid_(hybrid), k_(k) {
  if (!hybrid.placed(k)) return;
  hybrid.sync(k);
  chunk::Fp32Lists& l = hybrid.chunks_->lists_at(k);
  float** lists[] = {&l.master, &l.exp_avg, &l.exp_avg_sq};
  try {
    for (size_t i = 0; i < 3; ++i) {
      if ((which & (1u << i)) == 0) continue;
      const uint64_t bytes = hybrid.list_bytes(k, i);
      float* host = static_cast<float*>(hybrid.runtime_->host_alloc(bytes));
      device_[i] = *lists[i];
      *lists[i] = host;
      hybrid.device_->copy_sync(host, device_[i], bytes, memory::CopyKind::kDeviceToHost);
    }
    if ((which & kComputeShard) != 0 && hybrid.shard_on_device(k)) {
      void** shard = hybrid.chunks_->compute_shard(k);
      void* host = hybrid.runtime_->host_alloc(hybrid.shard_bytes(k));
      device_shard_ = *shard;
      *shard = host;
      hybrid.device_->copy_sync(host, device_shard_, hybrid.shard_bytes(k), memory::CopyKind::kDeviceToHost);
    }
  } catch (...) {
    restore();
    throw;
  }
}

void HybridPlacement::HostLists::write_back() {
  chunk::Fp32Lists& l = hybrid_.chunks_->lists_at(k_);
  const float* lists[] = {l.master, l.exp_avg, l.exp_avg_sq};
  for (size_t i = 0; i < 3; ++i) {
    if (device_[i] == nullptr) continue;
    hybrid_.device_->copy_sync(device_[i], lists[i], hybrid_.list_bytes(k_, i), memory::CopyKind::kHostToDevice);
  }
  if (device_shard_ != nullptr) {
    hybrid_.device_->copy_sync(device_shard_, *hybrid_.chunks_->compute_shard(k_), hybrid_.shard_bytes(k_),
                               memory::CopyKind::kHostToDevice);
  }
}

HybridPlacement::HostLists::~HostLists() { restore(); }

void HybridPlacement::HostLists::restore() noexcept {
  chunk::Fp32Lists& l = hybrid_.chunks_->lists_at(k_);
  float** lists[] = {&l.master, &l.exp_avg, &l.exp_avg_sq};
  for (size_t i = 0; i < 3; ++i) {
    if (device_[i] == nullptr) continue;
    hybrid_.runtime_->defer_free_host(memory::EventPtr(), *lists[i], hybrid_.list_bytes(k_, i));
    *lists[i] = device_[i];
    device_[i] = nullptr;
  }
  if (device_shard_ != nullptr) {
    void** shard = hybrid_.chunks_->compute_shard(k_);
    hybrid_.runtime_->defer_free_host(memory::EventPtr(), *shard, hybrid_.shard_bytes(k_));
    *shard = device_shard_;
    device_shard_ = nullptr;
  }
}

}  // namespace pstar::placement
