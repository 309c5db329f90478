// The step with world > 1 (docs/distributed.md): the gradients'
// reduce-scatter actions and the update of this rank's shards.  Every
// collective here is issued at a point fixed by the calls (a release that
// completes a chunk's backward, the step), never by placement.
#include <algorithm>
#include <cstring>
#include <vector>

#include "memory/host_kernels.h"
#include "step/optimizer_step.h"
#include "util/dtype.h"
#include "util/error.h"

namespace pstar::step {

using ChunkState = chunk::ChunkState;
using Param = chunk::Param;
using Use = memory::DeviceTier::Use;

// ReduceScatter::Actions::lay_out: chunk k's pending gradients into `data`
// (the device with NCCL, which reduces device memory; the host with Gloo),
// then their device buffers go.
std::vector<uint32_t> OptimizerStep::lay_out_gradients(uint32_t k, float* data, uint64_t elems) {
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
      counters_.bytes_reduce_to_host += p.numel * sizeof(float);
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
  counters_.bytes_reduce_scattered += elems * sizeof(float);
  return carried;
}

// ReduceScatter::Actions::apply: this rank's shard of the average into the
// compute shard or the fp32 gradient shard of each parameter.  A compute
// shard on the device (hybrid placement) gets the gradient in the compute
// dtype, finalized on the host as for a host shard (the same bits and
// norm partials), then copied in on the compute stream (after the work
// that read the weights there).
void OptimizerStep::apply_reduced(uint32_t k, const std::vector<uint32_t>& params, float* avg_all) {
  ChunkState& c = chunks_[k];
  const bool shard_on_device = !options_.grad_accumulation && hybrid_->shard_on_device(k);
  std::vector<unsigned char> finalized;
  for (uint32_t id : params) {
    Param& p = params_[id];
    const auto [lo, a, b] = shard_span(id);
    if (a < b) {
      const float* avg = avg_all + (a - lo);
      if (options_.grad_accumulation) {
        float* g = c.grad32 + (a - lo);
        for (uint64_t i = 0; i < b - a; ++i) g[i] += avg[i];
      } else if (shard_on_device) {
        finalized.resize((b - a) * elem_bytes());
        memory::host_grad_finalize(avg, finalized.data(), options_.compute_dtype, b - a, &p.grad_sumsq,
                                   &p.grad_nonfinite);
        device_->copy_sync(static_cast<char*>(c.shard) + (a - lo) * elem_bytes(), finalized.data(), finalized.size(),
                           memory::CopyKind::kHostToDevice);
        placement_->count_host_to_device(finalized.size());
      } else {
        memory::host_grad_finalize(avg, static_cast<char*>(c.shard) + (a - lo) * elem_bytes(), options_.compute_dtype,
                                   b - a, &p.grad_sumsq, &p.grad_nonfinite);
      }
    }
    if (!options_.grad_accumulation) p.slot_is_grad = true;
  }
}

// Hybrid placement with world > 1: the update of chunk k's shard, whose
// master, m and v are on the device with its compute shard, the buffer's
// slot (the gradient where the step finalized it there, the weights
// elsewhere).  With accumulation its fp32 gradient goes into the buffer's
// staging region on the H2D stream.  Adam runs on the compute stream with
// the same constants as the host (same kernel code, same bits), writing
// the weights into the slot, where the next all-gathers copy them from (on
// the compute stream).  Returns the event of the update; the previous
// step's is done (the host waited for it), so the staging region is free.
memory::EventPtr OptimizerStep::queue_shard_update(uint32_t k, const std::vector<optim::Segment>& segments) {
  ChunkState& c = chunks_[k];
  const uint64_t n = c.shard_elems;
  void* slot = hybrid_->slot_staging(k);
  if (slot != c.shard) internal_error("a placed chunk's compute shard is not in its device buffer");
  float* grad = hybrid_->grad_staging(k);
  memory::Stream* h2d = device_->h2d_stream();
  memory::Stream* cs = device_->compute_stream();
  if (grad != nullptr) {
    device_->copy_async(h2d, grad, c.grad32, n * sizeof(float), memory::CopyKind::kHostToDevice);
    placement_->count_host_to_device(n * sizeof(float));
    device_->stream_wait(cs, device_->record(h2d));
  }
  device_->stream_wait(cs, hybrid_->state_ready(k));
  optim::ChunkLists lists = chunk_lists(c, slot);
  lists.grad_f32 = grad;
  for (const optim::Segment& sg : segments) {
    if (lists.fp32_only()) {
      device_->adam_update_async(cs, sg.constants, lists.range(sg.begin, sg.end));
    } else {
      device_->adam_update_states_async(cs, lists.format, sg.constants, lists.state_range(sg.begin, sg.end, &sg));
    }
  }
  return device_->record(cs);
}

// Gradients still pending are reduce-scattered (chunk order), gathered
// buffers dropped (the shards are about to change), the squared norm and
// the overflow flag of this rank's shards exchanged (one all-gather, summed
// in rank order, so every rank computes the same bits and takes the same
// decisions), and each rank updates its shards.
void OptimizerStep::run_sharded(pstar_step_result& r) {
  device_->synchronize(device_->compute_stream());
  for (uint32_t k = 0; k < chunks_.size(); ++k) {
    if (drop_rule_.gradients_pending(k) != 0) reduce_.reduce(k, chunks_[k].elems, chunks_[k].shard_elems);
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
      const auto [lo, a, b] = shard_span(id);
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
  distributed::ProcessGroup::StepVote mine;
  mine.sumsq = sumsq_local;
  mine.overflow = overflow_local;
  mine.schedule_ready = gathering_.schedule_ready();
  const distributed::ProcessGroup::StepVote agreed = group_.agree_on_step(mine);
  if (!agreed.schedule_ready) gathering_.invalidate_schedule();
  const double sumsq = agreed.sumsq;
  const bool overflow = agreed.overflow;

  const double clip_coef = unscale_and_clip(sumsq, &r);
  if (overflow) {
    skip_step(&r);
  } else {
    optim::SegmentList segments = optimizer_.begin_step(clip_coef);  // spans in the shard
    // Chunk k's parameters with a gradient as spans of this rank's shard;
    // false when none of them had one (the shard of a chunk that had one
    // may still hold no span of it: padding only).
    auto shard_segments = [&](uint32_t k) {
      segments.clear();
      bool updated = false;
      for (uint32_t id : layout_->chunks()[k].params) {
        const Param& p = params_[id];
        if (!p.has_grad) continue;
        ++r.params_updated;
        updated = true;
        const auto [lo, a, b] = shard_span(id);
        if (a >= b) continue;
        segments.add(a - lo, b - lo, p.lr_scale, p.weight_decay, id, layout_->param(id).offset_elems);
      }
      return updated;
    };
    // A host shard's lists for its update.  Every rank's shard of an
    // updated chunk has its moments (a shard of padding only too), so that
    // ranks hold the same host bytes.
    auto host_lists = [&](ChunkState& c) {
      if (lazy_moments(nvme_, *host_)) values::ensure_moments(*host_, c, moment_bytes(c), options_.payloads);
      return chunk_lists(c, c.shard);
    };
    // Shards whose optimizer state is on the device (hybrid placement) are
    // updated there first, queued, while the host updates the others.
    std::vector<uint32_t> order;
    memory::EventPtr device_done;
    for (uint32_t k = 0; k < chunks_.size(); ++k) {
      if (layout_->chunks()[k].frozen) continue;
      if (!hybrid_->placed(k)) {
        order.push_back(k);
      } else if (shard_segments(k)) {
        device_done = queue_shard_update(k, segments.segments());
      }
    }
    if (worker_ != nullptr) {
      // The overlapped step (optimizer_step.h): the host shards' updates run
      // on the update thread after the step returns, in the order the next
      // iteration first uses the chunks (chunk order before a trace
      // exists); a chunk's acquire waits for its own update before its
      // all-gather reads the shard.  The device shards above are done when
      // the step returns.
      const placement::AccessTrace& trace = placement_->follower().trace();
      if (trace.moments() > 0) {
        std::stable_sort(order.begin(), order.end(),
                         [&](uint32_t a, uint32_t b) { return trace.first_use(a) < trace.first_use(b); });
      }
      std::vector<UpdateWorker::Job> jobs;
      for (uint32_t k : order) {
        ChunkState& c = chunks_[k];
        if (!shard_segments(k)) continue;
        jobs.push_back(
            UpdateWorker::Job{k, c.shard_elems, segments.segments(), host_lists(c), options_.grad_accumulation});
        c.awaiting_update = true;
      }
      if (!jobs.empty()) ++counters_.steps_overlapped;
      counters_.chunks_overlapped += jobs.size();
      if (!jobs.empty()) nvme_.begin_step_io();
      worker_->start(std::move(jobs));
    } else {
      // Shards whose lists live on the NVMe drive stream through the staging
      // ring (memory/nvme_tier.h); the others are updated in place.
      nvme_.update_chunks(order, [&](uint32_t k) {
        ChunkState& c = chunks_[k];
        if (!shard_segments(k)) return;
        optimizer_.update_chunk(c.shard_elems, segments.segments(), host_lists(c));
      });
    }
    if (device_done) {
      // The device's updates are done when the step returns (the next
      // iteration's all-gathers read those compute shards on the device).
      placement_->host_wait(device_->compute_stream(), device_done);
      placement_->check_ready(device_done, "compute shard updated on the device");
    }
    ++counters_.steps;
    optimizer_.end_step(false);
  }
  if (options_.grad_accumulation) {
    // The accumulated gradients are consumed (or discarded by a skip); a
    // shard awaiting its overlapped update has its gradient spans cleared
    // by the update thread after it (the others hold zeros).
    for (uint32_t k = 0; k < chunks_.size(); ++k) {
      if (chunks_[k].grad32 != nullptr && !chunks_[k].awaiting_update) {
        std::memset(chunks_[k].grad32, 0, chunks_[k].shard_elems * sizeof(float));
      }
    }
  }
}

}  // namespace pstar::step
