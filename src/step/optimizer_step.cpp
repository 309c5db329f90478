#include "step/optimizer_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "memory/host_kernels.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/log.h"

namespace pstar::step {

using chunk::Tier;
using ChunkState = chunk::ChunkState;
using Param = chunk::Param;
using Use = memory::DeviceTier::Use;

OptimizerStep::OptimizerStep(const StepParts& parts, const StepOptions& options)
    : device_(parts.device),
      host_(parts.host),
      placement_(parts.placement),
      hybrid_(parts.hybrid),
      nvme_(*parts.nvme),
      optimizer_(*parts.optimizer),
      values_(*parts.values),
      params_(*parts.params),
      chunks_(*parts.chunks),
      group_(*parts.group),
      reduce_(*parts.reduce),
      gathering_(*parts.gathering),
      drop_rule_(*parts.drop_rule),
      options_(options) {}

size_t OptimizerStep::elem_bytes() const { return dtype_size(options_.compute_dtype); }

optim::ChunkLists OptimizerStep::chunk_lists(const ChunkState& c, void* payload) const {
  optim::ChunkLists lists{c.master, c.exp_avg, c.exp_avg_sq, c.grad32, payload, options_.compute_dtype};
  lists.format = options_.state_format;
  lists.elems = c.shard_elems;
  lists.master_format = options_.master_format;
  lists.master_seed = options_.master_seed;
  lists.chunk_offset = static_cast<uint64_t>(group_.rank()) * c.shard_elems;
  return lists;
}

void OptimizerStep::attach(const chunk::ChunkLayout* layout) {
  layout_ = layout;
  // With world > 1 a gather, ahead of use too, reads a shard on the
  // engine's thread after waiting for its update (the engine's
  // ChunkGathering::Shards).
  if (overlap_ && options_.payloads && !options_.virtual_clock) {
    // With the NVMe tier, the jobs of chunks whose lists live on the drive
    // run inside the tier's ring (the lists are staged in around each), on
    // the update thread; begin_step_io() ran on the engine's thread.
    UpdateWorker::RunSequence sequence;
    if (nvme_.requested()) {
      sequence = [this](const std::vector<UpdateWorker::Job>& jobs, const std::function<void(size_t)>& run_one) {
        std::vector<uint32_t> order;
        order.reserve(jobs.size());
        for (const UpdateWorker::Job& job : jobs) order.push_back(job.chunk);
        size_t next = 0;
        nvme_.stream_chunks(order, [&](uint32_t) { run_one(next++); });
      };
    }
    // A job is the synchronous step's update of one chunk, later.
    worker_ = std::make_unique<UpdateWorker>(
        [this](const UpdateWorker::Job& job) {
          // A speculative job works on a copy of the payload (the gradients
          // in the chunk's own stay for a discarded result).
          if (job.copy_slot_from != nullptr) std::memcpy(job.lists.slot, job.copy_slot_from, job.slot_bytes);
          optim::ChunkLists lists = job.lists;
          if (nvme_.on_drive(job.chunk)) {
            // Staged in now (the tier pointed the chunk's lists at its buffer).
            const ChunkState& c = chunks_[job.chunk];
            lists.master = c.master;
            lists.exp_avg = c.exp_avg;
            lists.exp_avg_sq = c.exp_avg_sq;
          }
          optimizer_.update_chunk(job.elems, job.segments, lists);
          if (!job.clear_gradients) return;
          for (const optim::Segment& sg : job.segments) {
            std::memset(const_cast<float*>(job.lists.grad_f32) + sg.begin, 0, (sg.end - sg.begin) * sizeof(float));
          }
        },
        static_cast<uint32_t>(layout->chunks().size()), std::move(sequence));
    // One process: an updated chunk's copy to the device is queued by the
    // update thread right after its update (placement::Runtime's
    // UpdateFollower).  Sharded, a chunk's compute payload is gathered by
    // its acquire instead.
    if (!group_.sharded()) {
      placement_->set_update_follower(
          placement::Runtime::UpdateFollower{
              [this](uint32_t k) { return worker_->can_follow(k); },
              [this](uint32_t k, std::function<void()> after) { return worker_->follow(k, std::move(after)); }},
          layout->chunks().size());
    }
    spec_state_.assign(layout->chunks().size(), SpecState::kNone);
    spec_pos_.assign(layout->chunks().size(), 0);
    if (speculates()) reserve_speculation();
  }
}

void OptimizerStep::take_done() {
  if (worker_->in_flight()) {
    worker_->take_done([this](uint32_t k) {
      chunks_[k].awaiting_update = false;
      placement_->take_upload(k);
    });
  }
  if (!worker_->failed()) return;
  // The chunks after the failed one keep their old values: the step is
  // half applied, so training stays refused until a checkpoint is loaded.
  try {
    std::rethrow_exception(worker_->error());
  } catch (const Error& e) {
    throw Error(e.status(), std::string("the overlapped step failed on the update thread: ") + e.what() +
                                "; load a checkpoint to go on");
  } catch (const std::exception& e) {
    throw Error(PSTAR_ERR_INTERNAL, std::string("the overlapped step failed on the update thread: ") + e.what() +
                                        "; load a checkpoint to go on");
  }
}

void OptimizerStep::wait() {
  if (worker_ == nullptr) return;
  discard_speculation();
  wait_previous_step();
}

void OptimizerStep::wait_previous_step() {
  if (worker_ == nullptr) return;
  if (worker_->in_flight()) counters_.wait_seconds += worker_->wait_all();
  take_done();
}

void OptimizerStep::wait_noexcept() noexcept {
  if (worker_ == nullptr) return;
  worker_->wait_all();
  worker_->take_done([this](uint32_t k) {
    chunks_[k].awaiting_update = false;
    try {
      placement_->take_upload(k);
    } catch (...) {
      // Only a device error while freeing a reservation that was never
      // used; this caller (the destructor, the statistics) cannot report
      // it, and the buffer stays held and counted until the engine goes.
    }
  });
}

void OptimizerStep::run(pstar_step_result& r) {
  if (group_.sharded()) {
    run_sharded(r);
  } else {
    run_local(r);
  }
}

// Gradient accumulation: adds this micro-batch's gradient (the fp32
// accumulator on the device) into the parameter's slice of the fp32 gradient
// list on the host, then frees the accumulator.  Host-synchronous: the next
// micro-batch may reuse the memory at once.
void OptimizerStep::fold_gradient(uint32_t id, memory::Stream* s) {
  Param& p = params_[id];
  const auto& place = layout_->param(id);
  const size_t bytes = p.numel * sizeof(float);
  ChunkState& c = chunks_[place.chunk];
  if (p.grad_host != nullptr) {
    // Accumulated on the host (step/backward_gradients.h): added from there,
    // as the staged copy below would be.
    float* dst = c.grad32 + place.offset_elems;
    if (options_.payloads) {
      for (uint64_t i = 0; i < p.numel; ++i) dst[i] += p.grad_host[i];
    }
    host_->release(p.grad_host, bytes);
    p.grad_host = nullptr;
    p.has_grad = true;
    return;
  }
  if (c.opt_device != nullptr) {
    // The gradient list is on the device too: added there, asynchronously;
    // the accumulator is freed once the addition is done.
    hybrid_->fold_gradient(place.chunk, s, place.offset_elems, p.grad_acc, p.numel);
    p.grad_acc = nullptr;
    p.has_grad = true;
    return;
  }
  float* staging = static_cast<float*>(host_->acquire(bytes));
  device_->copy_async(s, staging, p.grad_acc, bytes, memory::CopyKind::kDeviceToHost);
  const float* src = staging;
  device_->synchronize(s);
  float* dst = chunks_[place.chunk].grad32 + place.offset_elems;
  if (options_.payloads) {
    for (uint64_t i = 0; i < p.numel; ++i) dst[i] += src[i];
  }
  host_->release(staging, bytes);
  device_->deallocate(p.grad_acc, bytes);
  placement_->tier().remove(Use::kGradients, bytes);
  p.grad_acc = nullptr;
  p.has_grad = true;
}

// The fill (the synchronous step, following the trace): while the chunk
// the next iteration needs first is still on its way to the host (the last
// backward's gradients), the chunks after it that are on the host by then
// are updated first and go up at once, out of use order, instead of the
// host-to-device link idling until it is there.  At most the bytes the link
// up carries in the time that chunk takes to come down (its bytes, scaled
// by the ratio of the two rates where the device models them, else a link
// as fast each way, as PCIe), so that they are up about when it is ready
// to follow them.  Reorders `order` (first-use order) and returns that
// first chunk when some went ahead of it (kNoFill: none); the chunks
// updated while it is still awaiting its update are the ones ahead.  The
// order of the updates changes no bits: each chunk's update reads and
// writes its own lists only.
uint32_t OptimizerStep::fill_first(std::vector<uint32_t>& order) const {
  if (order.empty()) return kNoFill;
  const uint32_t first = order[0];
  const ChunkState& f = chunks_[first];
  if (f.tier != Tier::kHost || device_->query(f.ready)) return kNoFill;
  const double up = device_->modelled_copy_bytes_per_s(memory::CopyKind::kHostToDevice);
  const double down = device_->modelled_copy_bytes_per_s(memory::CopyKind::kDeviceToHost);
  uint64_t budget = f.bytes;
  if (up > 0.0 && down > 0.0) budget = static_cast<uint64_t>(static_cast<double>(budget) * (up / down));
  std::vector<uint32_t> out;
  size_t i = 1;
  for (; i < order.size(); ++i) {
    const ChunkState& c = chunks_[order[i]];
    // On the host by the time the first is: its copy down done, or queued
    // before the first's on the in-order stream.
    const bool down_first = device_->query(c.ready) || c.copy_out_order < f.copy_out_order;
    if (c.tier != Tier::kHost || c.bytes > budget || !down_first) break;
    budget -= c.bytes;
    out.push_back(order[i]);
  }
  if (out.empty()) return kNoFill;
  out.push_back(first);
  out.insert(out.end(), order.begin() + static_cast<std::ptrdiff_t>(i), order.end());
  order = std::move(out);
  return first;
}

// The squared norm of the scaled gradients of this iteration, summed in
// parameter order (deterministic), and whether one holds an inf or NaN.
// With gradient accumulation the sum over micro-batches is complete only
// when this is called, so each parameter's norm is computed here from the
// fp32 gradient list; otherwise the finalize computed it.  The caller has
// waited for the compute stream (the finalizes' results).
double OptimizerStep::local_grad_sumsq(bool* overflow) {
  double sumsq = 0.0;
  *overflow = false;
  std::vector<float> staging;  // CUDA: a device-resident gradient list read on the host
  for (uint32_t id = 0; id < params_.size(); ++id) {
    Param& p = params_[id];
    if (!p.has_grad) continue;
    if (options_.grad_accumulation) {
      const auto& place = layout_->param(id);
      const ChunkState& c = chunks_[place.chunk];
      const float* grad = c.grad32 + place.offset_elems;
      if (c.opt_device != nullptr) {
        if (options_.payloads) staging.resize(p.numel);  // a dry run copies into no memory
        hybrid_->read_gradient(place.chunk, grad, staging.data(), p.numel);
        grad = staging.data();
      }
      if (options_.payloads) memory::host_grad_norm(grad, p.numel, &p.grad_sumsq, &p.grad_nonfinite);
    }
    sumsq += p.grad_sumsq;
    *overflow = *overflow || p.grad_nonfinite != 0;
  }
  return sumsq;
}

double OptimizerStep::grad_norm() {
  require(!group_.sharded(), PSTAR_ERR_UNSUPPORTED,
          "grad_norm: with world_size > 1 the norm is known only in pstar_step (after the gradients' "
          "reduce-scatter); read pstar_step_result.grad_norm");
  device_->synchronize(device_->compute_stream());
  bool overflow = false;
  const double sumsq = local_grad_sumsq(&overflow);
  if (overflow) return std::numeric_limits<double>::infinity();
  return unscaled_norm(sumsq);
}

double OptimizerStep::unscaled_norm(double sumsq) const {
  return std::sqrt(sumsq) / static_cast<double>(optimizer_.scaler().scale());
}

void OptimizerStep::run_local(pstar_step_result& r) {
  // Every finalize has been queued; wait for their results.
  device_->synchronize(device_->compute_stream());
  // The speculative updates stop here: the one running completes; those
  // completed are kept below where their constants are the step's.  Any
  // left when this returns or throws are discarded.
  const std::vector<bool> speculated = end_speculation();
  struct DiscardLeft {
    OptimizerStep* step;
    ~DiscardLeft() { step->discard_speculation(); }
  } discard_left{this};

  bool overflow = false;
  const double sumsq = local_grad_sumsq(&overflow);
  const double clip_coef = unscale_and_clip(sumsq, &r);
  if (overflow) {
    skip_step(&r);
  } else {
    // A chunk's parameters with a gradient, each with its own constants
    // (parameter groups).
    optim::SegmentList segments = optimizer_.begin_step(clip_coef);
    auto segments_of = [&](uint32_t k) {
      segments.clear();
      add_segments(k, segments);
      r.params_updated += segments.segments().size();
      return !segments.empty();
    };
    // Chunks whose optimizer state is on the device: the update is queued on
    // the compute stream (same kernel code, same constants, same bits), and
    // runs while the host updates the other chunks.
    std::vector<uint32_t> host_chunks;
    memory::Stream* cs = device_->compute_stream();
    for (uint32_t k = 0; k < chunks_.size(); ++k) {
      if (layout_->chunks()[k].frozen) continue;
      ChunkState& c = chunks_[k];
      if (c.opt_device == nullptr) {
        host_chunks.push_back(k);
        continue;
      }
      if (!segments_of(k)) continue;
      if (c.tier != Tier::kDevice) internal_error("a chunk with device optimizer state left the device");
      device_->stream_wait(cs, hybrid_->state_ready(k));
      device_->stream_wait(cs, c.ready);
      device_->stream_wait(cs, c.last_use);
      placement_->mark_written(k);
      const optim::ChunkLists lists = chunk_lists(c, c.device);
      for (const optim::Segment& sg : segments.segments()) {
        if (lists.fp32_only()) {
          device_->adam_update_async(cs, sg.constants, lists.range(sg.begin, sg.end));
        } else {
          device_->adam_update_states_async(cs, lists.format, sg.constants, lists.state_range(sg.begin, sg.end, &sg));
        }
      }
      const memory::EventPtr done = device_->record(cs);
      c.ready = done;
      c.last_use = done;
    }
    // The other chunks are updated by the CPU.  The host's code never
    // touches device memory (see host_view), so every such chunk still on the
    // device goes to the host first: all copies are queued at once, so that
    // the update of one chunk overlaps the copies of the next ones.  They are
    // evictions, not round trips: which chunks come back before their next
    // use, and when, is placement's decision (on-demand fetches, or
    // prefetch along the trace from the next iteration's first acquire);
    // copying every one back at once would move bytes for chunks evicted
    // again before they are used.
    for (uint32_t k : host_chunks) {
      if (chunks_[k].tier != Tier::kDevice) continue;
      bool any = false;
      for (uint32_t id : layout_->chunks()[k].params) any = any || params_[id].has_grad;
      if (any) placement_->evict(k);
    }
    // When this iteration followed the trace to its end, the next one will
    // too: the CPU updates the chunks in the order of their first use in it,
    // and after each update prefetch runs along the next iteration's trace
    // (it stops at a chunk still waiting for its update), so the chunks the
    // forward needs first come back while the CPU updates the others.
    const placement::AccessTrace& trace = placement_->follower().trace();
    const bool ahead = options_.prefetch && placement_->follower().following() &&
                       placement_->follower().moment() == trace.moments() && trace.moments() > 0;
    if (ahead) {
      std::stable_sort(host_chunks.begin(), host_chunks.end(),
                       [&](uint32_t a, uint32_t b) { return trace.first_use(a) < trace.first_use(b); });
      for (uint32_t k : host_chunks) chunks_[k].awaiting_update = chunks_[k].tier != Tier::kDevice;
      placement_->rekey_for_next_iteration();
    }
    if (worker_ != nullptr) {
      // The overlapped step: each chunk's segments, constants and host
      // buffers are fixed now; the update thread runs them in this order
      // (the next iteration's, when it follows the trace) after the step
      // returns.  Until its update is done a chunk is awaiting_update:
      // placement neither fetches nor prefetches it, and its acquire waits
      // for it (before_acquire).
      std::vector<UpdateWorker::Job> jobs;
      bool kept_any = false;
      for (uint32_t k : host_chunks) {
        ChunkState& c = chunks_[k];
        c.awaiting_update = false;
        if (!segments_of(k)) continue;
        if (keep_speculated(k, speculated, segments.segments())) {
          ++counters_.chunks_overlapped;
          kept_any = true;
          continue;
        }
        if (lazy_moments(nvme_, *host_)) values::ensure_moments(*host_, c, moment_bytes(c), options_.payloads);
        jobs.push_back(UpdateWorker::Job{k, layout_->chunks()[k].used_elems, segments.segments(),
                                         chunk_lists(c, placement_->host_view(k)), options_.grad_accumulation});
        c.awaiting_update = true;
      }
      // Kept speculations ran on the update thread too (during the backward).
      if (!jobs.empty() || kept_any) ++counters_.steps_overlapped;
      counters_.chunks_overlapped += jobs.size();
      if (!jobs.empty()) nvme_.begin_step_io();
      worker_->start(std::move(jobs));
      if (ahead) placement_->prefetch_ahead(0);  // the chunks that need no update
    } else {
      // Chunks whose optimizer state is on the NVMe drive stream through the
      // staging ring (memory/nvme_tier.h); the others are updated in place.  An
      // I/O error ends the update part way (the engine then refuses training
      // until a checkpoint is loaded): the prefetch state is put back first.
      // On the virtual clock with a modelled update rate, each update's
      // time is modelled (set_modelled_update_rate): on the host-work lane
      // when the step overlaps, else on the caller's clock.
      const bool modelled = modelled_overlap();
      bool any_modelled = false;
      // The fill: chunks go up while this one is still coming down.
      const uint32_t filled_for = ahead && !modelled && !nvme_.requested() ? fill_first(host_chunks) : kNoFill;
      try {
        nvme_.update_chunks(host_chunks, [&](uint32_t k) {
          ChunkState& c = chunks_[k];
          if (segments_of(k)) {
            if (lazy_moments(nvme_, *host_)) values::ensure_moments(*host_, c, moment_bytes(c), options_.payloads);
            void* payload = modelled ? placement_->host_view_modelled(k) : placement_->host_view(k);
            const uint64_t elems = layout_->chunks()[k].used_elems;
            if (options_.payloads) {  // a dry run places chunks; it computes nothing
              // One parallel pass over the chunk (optim/chunk_update.h).
              optimizer_.update_chunk(elems, segments.segments(), chunk_lists(c, payload));
            }
            if (modelled) {
              c.ready = device_->model_host_work(modelled_update_seconds(elems), {c.ready, c.last_use});
              c.last_use = c.ready;
              ++counters_.chunks_overlapped;
              any_modelled = true;
            } else if (modelled_update_rate_ > 0.0) {
              device_->advance_clock(modelled_update_seconds(elems));
            }
          }
          if (ahead) {
            c.awaiting_update = false;
            if (filled_for != kNoFill && chunks_[filled_for].awaiting_update) {
              placement_->upload_ahead(k, chunks_[filled_for].bytes);  // its room left free
            } else {
              placement_->prefetch_ahead(0);  // from the next iteration's start
            }
          }
        });
      } catch (const Error&) {
        for (uint32_t k : host_chunks) chunks_[k].awaiting_update = false;
        throw;
      }
      if (any_modelled) ++counters_.steps_overlapped;
    }
    ++counters_.steps;
    optimizer_.end_step(false);
  }
}

// Fills the result's loss scale, gradient norm (unscaled) and clipping
// coefficient from the squared norm of the scaled gradients; returns the
// coefficient.  Shared by the one-process and the sharded step.
double OptimizerStep::unscale_and_clip(double sumsq, pstar_step_result* r) const {
  r->loss_scale = optimizer_.scaler().scale();
  r->grad_norm = unscaled_norm(sumsq);
  const double clip_coef = optimizer_.clip_coef(r->grad_norm);
  r->clip_coef = static_cast<float>(clip_coef);
  return clip_coef;
}

void OptimizerStep::skip_step(pstar_step_result* r) {
  for (uint32_t id = 0; id < params_.size(); ++id) {
    if (params_[id].slot_is_grad) values_.restore_slot(id);
  }
  r->skipped = 1;
  ++counters_.skipped_steps;
  optimizer_.end_step(true);
  log::info("step skipped: inf or NaN in a gradient; loss scale now " + std::to_string(optimizer_.scaler().scale()));
}

}  // namespace pstar::step
