// The engine's data parallelism (world > 1; docs/distributed.md): forming
// the group, gathering chunks from their shards and dropping them again,
// reduce-scattering gradients, values and the step on this rank's shards.
//
// Every collective here is issued at a point fixed by the access sequence
// (acquires, releases and their stages) and the API calls (build, read,
// step): never because of capacity, eviction, prefetch or the placement
// trace.  Gathering ahead follows a schedule recorded from the same calls
// (below).  So every rank issues the same collectives in the same order as
// long as the ranks make the same calls, whatever their capacities and
// non-model bytes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "dist/group.h"
#include "dist/layout_agreement.h"
#include "dist/launch_env.h"
#include "engine/engine.h"
#include "memory/host_kernels.h"
#include "optim/adam_kernel.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/log.h"

namespace pstar::engine {

using chunk::TensorState;

using Kind = dist::CollectiveKind;

// Resolves rank and world size: explicit options, else the launcher's
// environment, else one process.  Runs before the device is made, so that
// what a sharded engine cannot do is refused first.
void Engine::resolve_world() {
  dist::LaunchRequest request;
  if (options_.world_size > 0) {
    request.rank = options_.rank;
    request.world_size = options_.world_size;
  }
  const dist::LaunchInfo launch = dist::resolve_launch(request);
  group_.set_launch(launch);
  if (launch.world_size == 1) return;
  if (options_.device == PSTAR_DEVICE_CUDA) {
    require(dist::cuda_groups_available(), PSTAR_ERR_UNSUPPORTED,
            "options: data parallelism on CUDA devices needs NCCL and libuv, and this libpstar was built without "
            "one or both (install the CUDA toolkit with NCCL and libuv1-dev, then rebuild)");
    // One GPU per rank: the node-local rank picks it unless the caller chose
    // another ordinal than the default.
    if (options_.device_ordinal == 0) options_.device_ordinal = launch.local_rank;
  }
  require(!options_.dry_run, PSTAR_ERR_UNSUPPORTED,
          "options: a dry run has no payloads to exchange; it models one rank (set world_size to 1)");
  require(!options_.hybrid_optimizer, PSTAR_ERR_UNSUPPORTED,
          "options: hybrid_optimizer with world_size > 1 is not supported yet (each rank updates its shards on the "
          "CPU); unset one of them");
  require(options_.device == PSTAR_DEVICE_CUDA || dist::cpu_groups_available(), PSTAR_ERR_UNSUPPORTED,
          "options: data parallelism on the emulated device needs Gloo and libuv, and this libpstar was built "
          "without them (install libgloo-dev and libuv1-dev and rebuild)");
}

// With more than one rank, forms the group (dist/group.h): NCCL for CUDA
// ranks, Gloo for emulated ones.
void Engine::connect_group() {
  group_.connect(options_.device == PSTAR_DEVICE_CUDA ? static_cast<int>(options_.device_ordinal) : -1,
                 std::chrono::milliseconds(options_.comm_timeout_ms));
}

// ---------------------------------------------------------------------------
// Build

// All ranks must register the same parameters in the same order with the
// options that shape the layout: a hash of all that, the parameter count and
// the element count are all-gathered and compared.
void Engine::check_layout_agrees(uint64_t chunk_elems) {
  dist::LayoutHash h;
  h.add(chunk_elems);
  h.add(static_cast<uint64_t>(options_.compute_dtype));
  h.add(options_.grad_accumulation != 0);
  h.add(gathering_.depth());
  for (const Param& p : params_) h.add_param(p.name, p.shape, p.flags, p.numel);
  // Whether this rank's device can hold the gather-ahead slots: exchanged
  // so that every rank fails the build, not the one short of room.
  dist::SlotNeed slots;
  slots.depth = gathering_.depth();
  slots.slot_bytes = chunk_elems * elem_bytes();
  const uint64_t slot_total = slots.depth * slots.slot_bytes;
  slots.fits = slot_total == 0 || placement_->tier().fits(slot_total);
  dist::check_layout_agrees(group_, h, slots);
}

// Reduce-scatters the pending gradients of chunk k (dist/reduce_scatter.h):
// their fp32 buffers are laid out as the chunk (zero elsewhere), summed over
// the ranks, and this rank's shard of the average is applied.  Without
// gradient accumulation the average, rounded to the compute dtype, goes to
// the compute shard (flagged GRAD, as a gradient replaces the weight in one
// process) with its squared norm and overflow flag over the rounded values;
// with accumulation it is added to the fp32 gradient shard.
//
// With a collective queue (gathering ahead) the reduce-scatter runs there
// and its result is applied later (reduce_.finish_through): the release
// that completed the chunk's backward returns to the caller's compute at
// once.
void Engine::reduce_chunk(uint32_t k) {
  const ChunkState& c = chunks_[k];
  reduce_.reduce(k, c.elems, c.shard_elems);
}

// ReduceScatter::Actions::lay_out: chunk k's pending gradients into `data`
// (the device with NCCL, which reduces device memory; the host with Gloo),
// then their device buffers go.
std::vector<uint32_t> Engine::lay_out_gradients(uint32_t k, float* data, uint64_t elems) {
  const auto& info = layout_->chunks()[k];
  if (group_.device_buffers()) {
    memory::Stream* s = device_->compute_stream();
    device_->memset_async(s, data, 0, elems * sizeof(float));
    for (uint32_t id : info.params) {
      const Param& p = params_[id];
      if (!p.grad_pending) continue;
      device_->stream_wait(s, p.grad_ready);
      device_->copy_async(s, data + layout_->param(id).offset_elems, p.grad_acc, p.numel * sizeof(float),
                          memory::CopyKind::kDeviceToDevice);
    }
    device_->synchronize(s);
  } else {
    std::memset(data, 0, elems * sizeof(float));
    for (uint32_t id : info.params) {
      Param& p = params_[id];
      if (!p.grad_pending) continue;
      device_->synchronize(p.grad_ready);
      placement_->check_ready(p.grad_ready, "gradient buffer");
      std::memcpy(data + layout_->param(id).offset_elems, p.grad_acc, p.numel * sizeof(float));
    }
  }
  std::vector<uint32_t> carried;
  for (uint32_t id : info.params) {
    Param& p = params_[id];
    if (!p.grad_pending) continue;
    carried.push_back(id);
    device_->deallocate(p.grad_acc, p.numel * sizeof(float));
    placement_->tier().remove(Use::kGradients, p.numel * sizeof(float));
    p.grad_acc = nullptr;
    p.grad_ready = nullptr;
    p.grad_pending = false;
    p.has_grad = true;
  }
  drop_rule_.gradients_taken(k);
  stats_.bytes_reduce_scattered += elems * sizeof(float);
  return carried;
}

// ReduceScatter::Actions::apply: this rank's shard of the average into the
// compute shard or the fp32 gradient shard of each parameter.
void Engine::apply_reduced(uint32_t k, const std::vector<uint32_t>& params, float* avg_all) {
  ChunkState& c = chunks_[k];
  for (uint32_t id : params) {
    Param& p = params_[id];
    const auto [lo, a, b] = shard_span(id, group_.rank());
    if (a < b) {
      const float* avg = avg_all + (a - lo);
      if (options_.grad_accumulation) {
        float* g = c.grad32 + (a - lo);
        for (uint64_t i = 0; i < b - a; ++i) g[i] += avg[i];
      } else {
        memory::host_grad_finalize(avg, static_cast<char*>(c.shard) + (a - lo) * elem_bytes(), options_.compute_dtype,
                                   b - a, &p.grad_sumsq, &p.grad_nonfinite);
      }
    }
    if (!options_.grad_accumulation) p.slot_is_grad = true;
  }
}

// ---------------------------------------------------------------------------
// Gathering ahead (pstar_x_engine_set_gather_ahead; docs/distributed.md): the
// schedule decides (dist/gather_ahead.h); the engine gathers.

void Engine::set_gather_ahead(uint32_t chunks) {
  require(!built(), PSTAR_ERR_INVALID_STATE, "set_gather_ahead: the engine is built; set the depth before");
  require(chunks <= kMaxGatherAhead, PSTAR_ERR_INVALID_ARGUMENT, [&] {
    return "set_gather_ahead: " + std::to_string(chunks) + " chunks; at most " + std::to_string(kMaxGatherAhead);
  });
  gathering_.set_depth(chunks);
}

void Engine::fill_gather_stats(pstar_x_gather_stats* out) const {
  const dist::GatherAhead& g = gathering_.schedule();
  out->depth = g.depth();
  out->schedule_ready = g.ready() ? 1 : 0;
  out->slot_bytes = placement_->tier().bytes(Use::kGatherSlots);
  out->gathers_ahead = g.gathers_ahead();
  out->gathers_on_demand = g.gathers_on_demand();
  out->gathers_waited = g.gathers_waited();
  out->schedule_fallbacks = g.fallbacks();
  out->wait_seconds = g.wait_seconds();
}

// ---------------------------------------------------------------------------
// Values

// Every rank passes the full values; each keeps its shard (no collective).
void Engine::write_sharded(uint32_t id, const void* src, pstar_dtype dtype) {
  const Param& p = params_[id];
  const auto& place = layout_->param(id);
  reduce_.finish_through(place.chunk);
  if (!p.frozen()) nvme_.access(place.chunk, true);  // the master shard may live on the drive
  ChunkState& c = chunks_[place.chunk];
  const auto [lo, a, b] = shard_span(id, group_.rank());
  for (uint64_t i = a; i < b; ++i) {
    const float v = load_as(src, dtype, i - place.offset_elems);
    if (!p.frozen()) c.master[i - lo] = v;
    store_as(c.shard, options_.compute_dtype, i - lo, v);
  }
}

// Collective: all-gathers the chunk's fp32 masters (a frozen parameter: its
// compute payload) and copies the parameter out.
void Engine::read_sharded(uint32_t id, void* dst, pstar_dtype dtype) {
  group_.require_ok("param_read");
  const Param& p = params_[id];
  const auto& place = layout_->param(id);
  ChunkState& c = chunks_[place.chunk];
  if (!p.frozen()) {
    nvme_.access(place.chunk, false);
    std::vector<float> full(c.elems);
    group_.all_gather_host("param_read: all-gather", Kind::kRead, place.chunk, c.master, full.data(),
                           c.shard_elems * sizeof(float));
    stats_.bytes_all_gathered += c.elems * sizeof(float);
    convert_from_f32(full.data() + place.offset_elems, dst, dtype, place.numel);
    return;
  }
  std::vector<unsigned char> full(c.bytes);
  group_.all_gather_host("param_read: all-gather", Kind::kRead, place.chunk, c.shard, full.data(),
                         c.shard_elems * elem_bytes());
  stats_.bytes_all_gathered += c.bytes;
  for (uint64_t i = 0; i < place.numel; ++i) {
    store_as(dst, dtype, i, load_as(full.data(), options_.compute_dtype, place.offset_elems + i));
  }
}

// The weight back into this rank's part of the compute shard (a skipped
// step), from the master shard.
void Engine::restore_slot_sharded(uint32_t id) {
  nvme_.access(layout_->param(id).chunk, false);
  ChunkState& c = chunks_[layout_->param(id).chunk];
  const auto [lo, a, b] = shard_span(id, group_.rank());
  for (uint64_t i = a; i < b; ++i) store_as(c.shard, options_.compute_dtype, i - lo, c.master[i - lo]);
}

// ---------------------------------------------------------------------------
// Step

// Gradients still pending are reduce-scattered (chunk order), gathered
// buffers dropped (the shards are about to change), the squared norm and
// the overflow flag of this rank's shards exchanged (one all-gather, summed
// in rank order, so every rank computes the same bits and takes the same
// decisions), and each rank updates its shards.
void Engine::step_update_sharded(pstar_step_result& r) {
  device_->synchronize(device_->compute_stream());
  for (uint32_t k = 0; k < chunks_.size(); ++k) {
    if (drop_rule_.gradients_pending(k) != 0) reduce_chunk(k);
  }
  reduce_.finish_through(-1);
  gathering_.drop_all();

  double sumsq_local = 0.0;
  bool overflow_local = false;
  for (uint32_t id = 0; id < params_.size(); ++id) {
    Param& p = params_[id];
    if (!p.has_grad) continue;
    if (options_.grad_accumulation) {
      const ChunkState& c = chunks_[layout_->param(id).chunk];
      const auto [lo, a, b] = shard_span(id, group_.rank());
      p.grad_sumsq = 0.0;
      p.grad_nonfinite = 0;
      if (a < b) memory::host_grad_norm(c.grad32 + (a - lo), b - a, &p.grad_sumsq, &p.grad_nonfinite);
    }
    sumsq_local += p.grad_sumsq;
    overflow_local = overflow_local || p.grad_nonfinite != 0;
  }
  // Also compared: every rank's hash of the collectives it issued since the
  // last step; a difference means the ranks' calls differed.  And agreed:
  // whether the next TRAIN iteration follows the gather schedule (each
  // rank's own decision, taken from the same calls, is confirmed here
  // before any rank acts on it: one rank recording anew makes all do so).
  gathering_.iteration_end(static_cast<uint32_t>(chunks_.size()));
  dist::ProcessGroup::StepVote mine;
  mine.sumsq = sumsq_local;
  mine.overflow = overflow_local;
  mine.schedule_ready = gathering_.schedule_ready();
  const dist::ProcessGroup::StepVote agreed = group_.agree_on_step(mine);
  if (!agreed.schedule_ready) gathering_.invalidate_schedule();
  const double sumsq = agreed.sumsq;
  const bool overflow = agreed.overflow;

  const double clip_coef = unscale_and_clip(sumsq, &r);
  if (overflow) {
    for (uint32_t id = 0; id < params_.size(); ++id) {
      if (params_[id].slot_is_grad) restore_slot_sharded(id);
    }
    note_skipped_step(&r);
  } else {
    optim::SegmentList segments = optimizer_.begin_step(clip_coef);  // spans in the shard
    // Shards whose lists live on the NVMe drive stream through the staging
    // ring (memory/nvme_tier.h); the others are updated in place.
    std::vector<uint32_t> order;
    for (uint32_t k = 0; k < chunks_.size(); ++k) {
      if (!layout_->chunks()[k].frozen) order.push_back(k);
    }
    nvme_.update_chunks(order, [&](uint32_t k) {
      const auto& info = layout_->chunks()[k];
      ChunkState& c = chunks_[k];
      segments.clear();
      for (uint32_t id : info.params) {
        const Param& p = params_[id];
        if (!p.has_grad) continue;
        ++r.params_updated;
        const auto [lo, a, b] = shard_span(id, group_.rank());
        if (a >= b) continue;
        segments.add(a - lo, b - lo, p.lr_scale, p.weight_decay);
      }
      optimizer_.update_chunk(
          c.shard_elems, segments.segments(),
          optim::ChunkLists{c.master, c.exp_avg, c.exp_avg_sq, c.grad32, c.shard, options_.compute_dtype});
    });
    ++stats_.steps;
    optimizer_.end_step(false);
  }
  if (options_.grad_accumulation) {
    // The accumulated gradients are consumed (or discarded by a skip).
    for (uint32_t k = 0; k < chunks_.size(); ++k) {
      if (chunks_[k].grad32 != nullptr) std::memset(chunks_[k].grad32, 0, chunks_[k].shard_elems * sizeof(float));
    }
  }
}

}  // namespace pstar::engine
