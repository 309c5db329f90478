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

void HybridPlacement::attach(HybridTable* chunks, const chunk::ChunkLayout* layout) {
  chunks_ = chunks;
  layout_ = layout;
  bytes_.assign(chunks->chunk_count(), 0);
  ready_.assign(chunks->chunk_count(), nullptr);
}

void HybridPlacement::step_ended() {
  ++train_steps_;
  if (options_.enabled && !placed_ && train_steps_ >= options_.warmup_iterations) place();
}

uint64_t HybridPlacement::state_bytes(uint32_t k) const {
  const uint64_t lists = options_.grad_accumulation ? 4 : 3;
  return lists * layout_->chunks()[k].capacity_elems * sizeof(float);
}

void HybridPlacement::place() {
  placed_ = true;
  std::vector<uint32_t> order;
  for (uint32_t k = 0; k < chunks_->chunk_count(); ++k) {
    if (!layout_->chunks()[k].frozen) order.push_back(k);
  }
  // Used last first; chunks never acquired keep layout order at the end.
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return chunks_->chunk_at(a).last_acquire > chunks_->chunk_at(b).last_acquire;
  });
  uint64_t margin = std::numeric_limits<uint64_t>::max();
  const memory::DeviceTier& tier = runtime_->tier();
  if (tier.limited()) {
    margin = tier.capacity() > runtime_->counters().peak_device_bytes
                 ? tier.capacity() - runtime_->counters().peak_device_bytes
                 : 0;
  }
  const uint64_t initial_margin = margin;
  for (uint32_t k : order) {
    const chunk::Chunk& c = chunks_->chunk_at(k);
    if (chunks_->lists_at(k).master_pins != 0) continue;  // exported masters stay where they are
    // The payload is pinned resident from now on: it costs room unless it
    // has stayed on the device since it first arrived.
    const uint64_t cost = state_bytes(k) + (c.tier == Tier::kDevice && !c.evicted ? 0 : c.bytes);
    if (cost > margin) continue;
    margin -= cost;
    move(k);
  }
  log::info("hybrid optimizer placement: " + std::to_string(chunks_on_device_) + " of " + std::to_string(order.size()) +
            " optimizer chunks on the device (" + bytes_str(tier.bytes(Use::kOptimizer)) +
            (tier.limited() ? " of a margin of " + bytes_str(initial_margin) : std::string()) + ")");
}

void HybridPlacement::move(uint32_t k) {
  chunk::Chunk& c = chunks_->chunk_at(k);
  chunk::Fp32Lists& l = chunks_->lists_at(k);
  if (c.tier != Tier::kDevice) runtime_->fetch(k);
  const uint64_t fp32_bytes = layout_->chunks()[k].capacity_elems * sizeof(float);
  const uint64_t bytes = state_bytes(k);
  float* base = static_cast<float*>(runtime_->device_alloc(bytes, k, "optimizer state of chunk " + std::to_string(k)));
  runtime_->tier().add(Use::kOptimizer, bytes);
  runtime_->note_device_peak();
  // The host lists are current: the host update of this step has returned.
  memory::Stream* s = device_->h2d_stream();
  float** lists[] = {&l.master, &l.exp_avg, &l.exp_avg_sq, &l.grad32};
  size_t slot = 0;
  for (float** list : lists) {
    if (*list == nullptr) continue;
    device_->copy_async(s, base + slot * (fp32_bytes / sizeof(float)), *list, fp32_bytes,
                        memory::CopyKind::kHostToDevice);
    ++slot;
  }
  const memory::EventPtr done = device_->record(s);
  slot = 0;
  for (float** list : lists) {
    if (*list == nullptr) continue;
    runtime_->defer_free_host(done, *list, fp32_bytes);
    *list = base + slot * (fp32_bytes / sizeof(float));
    ++slot;
  }
  c.opt_device = base;
  bytes_[k] = bytes;
  ready_[k] = done;
  runtime_->count_host_to_device(bytes);
  ++chunks_on_device_;
}

void HybridPlacement::sync(uint32_t k) {
  const chunk::Chunk& c = chunks_->chunk_at(k);
  device_->synchronize(ready_[k]);
  device_->synchronize(device_->compute_stream());
  device_->synchronize(c.last_use);
  runtime_->check_ready(ready_[k], "optimizer state");
}

void HybridPlacement::read_list(uint32_t k, const float* on_device, float* out, uint64_t n) {
  sync(k);
  device_->copy_sync(out, on_device, n * sizeof(float), memory::CopyKind::kDeviceToHost);
}

void HybridPlacement::write_list(uint32_t k, float* on_device, const float* in, uint64_t n) {
  sync(k);
  device_->copy_sync(on_device, in, n * sizeof(float), memory::CopyKind::kHostToDevice);
}

void HybridPlacement::read_gradient(uint32_t k, const float* on_device, float* out, uint64_t n) {
  device_->stream_wait(device_->compute_stream(), chunks_->chunk_at(k).last_use);
  device_->copy_sync(out, on_device, n * sizeof(float), memory::CopyKind::kDeviceToHost);
}

void HybridPlacement::fold_gradient(uint32_t k, memory::Stream* stream, uint64_t offset_elems, float* acc, uint64_t n) {
  device_->stream_wait(stream, ready_[k]);
  device_->grad_accumulate(stream, chunks_->lists_at(k).grad32 + offset_elems, acc, PSTAR_DTYPE_F32, PSTAR_MEM_DEVICE,
                           n);
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
  chunk::Chunk& c = chunks_->chunk_at(k);
  if (c.opt_device == nullptr) return false;
  device_->deallocate(c.opt_device, bytes_[k]);
  c.opt_device = nullptr;
  chunk::Fp32Lists& l = chunks_->lists_at(k);
  l.master = l.exp_avg = l.exp_avg_sq = l.grad32 = nullptr;
  bytes_[k] = 0;
  ready_[k] = nullptr;
  return true;
}

}  // namespace pstar::placement
