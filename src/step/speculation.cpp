// The speculative update: OptimizerStep's part that updates chunks during
// the backward, before the step knows whether it applies them.
//
// Why: with the update after the step, a chunk's first use in the next
// forward waits for its update, and the updates can start only once the
// backward is over; so the whole update stays on the critical path but for
// what hides under the forward (docs/design.md, "What the overlap can
// hide").  A chunk's gradients are final when its backward ends; only the
// step's decision (skip for an inf or NaN, the clipping coefficient) needs
// the complete norm.  Updating the chunk then, as if the step were applied
// with coefficient 1, is right whenever that turns out to be the step, and
// with clipping off it is every step that is not skipped.
//
// How the bits stay those of the synchronous step:
//  - The update is out of place: Adam reads the chunk's fp32 lists and
//    writes buffers of its own (AdamRange's *_in lists), on a copy of the
//    payload (which holds the gradients, and gets the new weights).  The
//    chunk's own buffers are only read, so a discarded result leaves
//    nothing to undo.
//  - Its constants are those begin_step(1.0) returns at that moment, built
//    by the same code for each parameter.  At the step, a result is kept
//    only when the constants the step computes for that chunk are the same
//    (memcmp of every segment): so a clipped step, a changed
//    hyperparameter, a loss scale changed meanwhile, or a parameter without
//    its gradient all fall back to the update in place.  A skipped step
//    discards every result.  Kept, the buffers are swapped into the chunk:
//    the bits are those the update in place would have written, since the
//    kernel is the same function of the same inputs (the kernel tests check
//    out of place against in place).
//  - A hyperparameter set after the hand-over (pstar_hparam_set is legal
//    inside a TRAIN iteration until its step, and waits for nothing there)
//    changes the step's constants, so that chunk is updated again in place:
//    the bits of the value set before the iteration.  Nothing but the
//    caller's thread reads the optimizer's settings; the jobs carry theirs.
//  - Nothing else touches a handed chunk: it is on the host and
//    awaiting_update (placement neither fetches nor prefetches it); an
//    acquire of it, or any call that reads or writes values or state
//    (OptimizerStep::wait), discards the speculation first.
//
// Memory: a handed chunk holds three fp32 lists and a payload more (about
// 14 bytes per fp16 element) until the step.  spec_budget_ bounds them; a
// chunk over the budget, or one the host pool cannot hold while leaving
// room for the chunks still on the device to be evicted, is updated after
// the step as without speculation.
#include <cstring>
#include <utility>
#include <vector>

#include "step/optimizer_step.h"
#include "util/error.h"

namespace pstar::step {

using chunk::ChunkState;
using chunk::Tier;
using Use = memory::DeviceTier::Use;

namespace {
// The host bytes of one chunk's speculative result: its three fp32 lists
// and a payload.
}  // namespace

// The bytes of chunk c's result buffers: a master, the two moment lists
// and a payload.
uint64_t OptimizerStep::result_bytes(const ChunkState& c) const {
  return master_bytes(c) + 2 * moment_bytes(c) + c.bytes;
}

void OptimizerStep::add_segments(uint32_t k, optim::SegmentList& list) const {
  for (uint32_t id : layout_->chunks()[k].params) {
    if (!params_[id].has_grad) continue;
    const auto& place = layout_->param(id);
    list.add(place.offset_elems, place.offset_elems + place.numel, params_[id].lr_scale, params_[id].weight_decay, id,
             place.offset_elems);
  }
}

// The buffers a backward's speculation holds at most (the trainable chunks
// in chunk order, up to the budget) are obtained from the host pool at
// build, written once, and given back to it, so that its free lists hold
// them.  Without this, the pool grew by one chunk's buffers per iteration
// for as many iterations as there are chunks: each job that got a new
// buffer paid the kernel's first-touch page clearing (about 0.13 s for a
// 4M-element chunk here, 25x its update), and it was always the job the
// step then waited for.  An allocation that fails ends the reserve (the
// speculation then takes what the pool has when it runs).
void OptimizerStep::reserve_speculation() {
  std::vector<std::pair<void*, uint64_t>> taken;
  uint64_t bytes = 0;
  try {
    for (uint32_t k = 0; k < chunks_.size(); ++k) {
      const ChunkState& c = chunks_[k];
      if (layout_->chunks()[k].frozen || nvme_.on_drive(k)) continue;
      const uint64_t fp32_bytes = c.shard_elems * sizeof(float);
      if (result_bytes(c) > spec_budget_ - bytes) break;
      for (uint64_t b : {fp32_bytes, moment_bytes(c), moment_bytes(c), c.bytes}) {
        void* p = host_->acquire(b);
        taken.emplace_back(p, b);
        std::memset(p, 0, b);
      }
      bytes += result_bytes(c);
    }
  } catch (const Error&) {
    // out of host memory: what was taken is reserve enough
  }
  for (const auto& [p, b] : taken) host_->release(p, b);
}

void OptimizerStep::gradients_left(uint32_t k) {
  if (!speculates() || spec_state_[k] != SpecState::kNone) return;
  const ChunkState& c = chunks_[k];
  // Not a chunk whose lists live on the NVMe drive: they are staged in only
  // inside the step's ring.
  if (c.tier != Tier::kHost || c.opt_device != nullptr || c.master_pins != 0 || nvme_.on_drive(k)) return;
  spec_state_[k] = SpecState::kPending;
  spec_pending_.push_back(k);
  hand_over_speculation();
}

// In order: a chunk is handed over once its copy to the host completed; a
// later one waits behind an earlier one still copying (the D2H stream
// completes them in order anyway).
void OptimizerStep::hand_over_speculation() {
  while (!spec_pending_.empty()) {
    const uint32_t k = spec_pending_.front();
    ChunkState& c = chunks_[k];
    if (!device_->query(c.ready)) return;  // the next acquire or release looks again
    spec_pending_.pop_front();
    spec_state_[k] = SpecState::kNone;
    optim::SegmentList list = optimizer_.next_step_segments(1.0);
    add_segments(k, list);
    if (list.empty()) continue;
    const uint64_t need = result_bytes(c);
    if (need > spec_budget_ - spec_bytes_) continue;
    // With a host capacity: room left for every chunk still on the device
    // to be evicted, so that speculation never makes placement fail.
    if (host_->capacity() != 0 && !host_->can_acquire(need + placement_->tier().bytes(Use::kChunks))) continue;
    Speculated s;
    s.chunk = k;
    s.segments = list.segments();
    try {
      s.master = static_cast<float*>(host_->acquire(master_bytes(c)));
      s.exp_avg = static_cast<float*>(host_->acquire(moment_bytes(c)));
      s.exp_avg_sq = static_cast<float*>(host_->acquire(moment_bytes(c)));
      s.payload = host_->acquire(c.bytes);
    } catch (const Error&) {
      release_speculated(s);
      continue;
    }
    optim::ChunkLists lists = chunk_lists(c, s.payload);
    lists.master = s.master;
    lists.exp_avg = s.exp_avg;
    lists.exp_avg_sq = s.exp_avg_sq;
    lists.grad_f32 = nullptr;
    lists.master_in = c.master;
    lists.exp_avg_in = c.exp_avg;
    lists.exp_avg_sq_in = c.exp_avg_sq;
    if (c.exp_avg == nullptr) {
      // The chunk's first update: its moments are zeros not yet allocated
      // (chunk::Fp32Lists); the result's own buffers start as them and are
      // updated in place (element-wise, so reading and writing one buffer
      // is the out-of-place update's arithmetic).
      std::memset(s.exp_avg, 0, moment_bytes(c));
      std::memset(s.exp_avg_sq, 0, moment_bytes(c));
      lists.exp_avg_in = s.exp_avg;
      lists.exp_avg_sq_in = s.exp_avg_sq;
    }
    UpdateWorker::Job job{k, layout_->chunks()[k].used_elems, s.segments, lists, false, c.host, c.bytes};
    // The update thread starts the queued chunk the next forward needs
    // first (the step's own order: first use when following the trace).
    const placement::TraceFollower& follower = placement_->follower();
    const uint64_t first = follower.following() ? follower.trace().first_use(k) : placement::AccessTrace::kNever;
    job.priority = first == placement::AccessTrace::kNever ? (uint64_t{1} << 62) + k : first;
    spec_bytes_ += need;
    spec_state_[k] = SpecState::kHanded;
    spec_pos_[k] = static_cast<uint32_t>(spec_.size());
    spec_.push_back(std::move(s));
    c.awaiting_update = true;
    worker_->speculate(std::move(job));
  }
}

void OptimizerStep::release_speculated(Speculated& s) noexcept {
  const ChunkState& c = chunks_[s.chunk];
  host_->release(s.master, master_bytes(c));
  s.master = nullptr;
  for (float** b : {&s.exp_avg, &s.exp_avg_sq}) {
    host_->release(*b, moment_bytes(c));
    *b = nullptr;
  }
  if (s.payload != nullptr) host_->release(s.payload, c.bytes);
  s.payload = nullptr;
}

std::vector<bool> OptimizerStep::end_speculation() {
  for (uint32_t k : spec_pending_) spec_state_[k] = SpecState::kNone;
  spec_pending_.clear();
  if (spec_.empty()) return {};
  return worker_->end_speculation();
}

bool OptimizerStep::keep_speculated(uint32_t k, const std::vector<bool>& completed,
                                    const std::vector<optim::Segment>& segments) {
  if (spec_state_[k] != SpecState::kHanded) return false;
  Speculated& s = spec_[spec_pos_[k]];
  bool same = spec_pos_[k] < completed.size() && completed[spec_pos_[k]] && s.segments.size() == segments.size();
  for (size_t i = 0; same && i < segments.size(); ++i) {
    const optim::Segment& a = segments[i];
    const optim::Segment& b = s.segments[i];
    same = a.begin == b.begin && a.end == b.end && std::memcmp(&a.constants, &b.constants, sizeof a.constants) == 0;
  }
  spec_state_[k] = SpecState::kNone;
  spec_bytes_ -= result_bytes(chunks_[k]);
  if (!same) {
    // The chunk is updated in place after this (its awaiting_update is the
    // caller's).
    release_speculated(s);
    ++counters_.speculations_discarded;
    return false;
  }
  ChunkState& c = chunks_[k];
  if (c.tier != Tier::kHost) internal_error("a speculated chunk left the host");
  // The result becomes the chunk's; its old lists and payload (the
  // gradients) are released with the record below.
  std::swap(c.master, s.master);
  std::swap(c.exp_avg, s.exp_avg);
  std::swap(c.exp_avg_sq, s.exp_avg_sq);
  std::swap(c.host, s.payload);
  c.awaiting_update = false;
  release_speculated(s);
  ++counters_.chunks_speculated;
  return true;
}

void OptimizerStep::discard_speculation() noexcept {
  if (worker_ == nullptr) return;
  for (uint32_t k : spec_pending_) spec_state_[k] = SpecState::kNone;
  spec_pending_.clear();
  if (spec_.empty()) return;
  worker_->end_speculation();
  for (Speculated& s : spec_) {
    if (spec_state_[s.chunk] != SpecState::kHanded) continue;  // kept, or discarded by the step
    spec_state_[s.chunk] = SpecState::kNone;
    chunks_[s.chunk].awaiting_update = false;
    release_speculated(s);
    ++counters_.speculations_discarded;
  }
  spec_.clear();
  spec_bytes_ = 0;
}

}  // namespace pstar::step
