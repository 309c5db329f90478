// OptimizerStep: a TRAIN iteration's gradients, from the end of each
// parameter's backward to the update of its chunk.
//
//   backward  The last backward use of a parameter leaves its gradient in a
//             device fp32 accumulator.  One process without accumulation:
//             the engine finalizes it into the compute slot (norm and
//             overflow known at once).  With gradient accumulation it is
//             folded into the fp32 gradient list here (fold_gradient).  With
//             world > 1 it waits for its chunk's reduce-scatter, whose
//             actions (distributed/reduce_scatter.h) lay the chunk's gradients out
//             and apply this rank's shard of the average (lay_out_gradients,
//             apply_reduced).
//   step      run(): the squared norm and the overflow flag (agreed across
//             ranks with world > 1), the loss scaler's decision, then either
//             the compute copies restored from the masters (a skipped step)
//             or Adam over every trainable chunk where its optimizer state
//             lives: the device (hybrid placement, queued on the compute
//             stream), the host (the CPU, in the order the next iteration
//             uses the chunks, prefetching behind), or the NVMe drive
//             (streamed through the staging ring).
//
// It owns no memory and no per-chunk state of its own: everything it reads
// and writes belongs to the modules in StepParts.  The engine checks the
// step's preconditions, then calls run(), then ends the iteration.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "chunk/chunk.h"
#include "chunk/layout.h"
#include "chunk/param_table.h"
#include "distributed/chunk_gathering.h"
#include "distributed/drop_rule.h"
#include "distributed/process_group.h"
#include "distributed/reduce_scatter.h"
#include "memory/device.h"
#include "memory/host_pool.h"
#include "memory/nvme_tier.h"
#include "optim/optimizer.h"
#include "placement/hybrid.h"
#include "placement/runtime.h"
#include "step/update_worker.h"
#include "pstar/pstar.h"
#include "values/param_values.h"

namespace pstar::step {

// The engine's modules a step works on; each outlives the OptimizerStep.
struct StepParts {
  memory::Device* device = nullptr;
  memory::HostPool* host = nullptr;
  placement::Runtime* placement = nullptr;
  placement::HybridPlacement* hybrid = nullptr;
  memory::NvmeTier* nvme = nullptr;
  optim::Optimizer* optimizer = nullptr;
  values::ParamValues* values = nullptr;
  chunk::ParamTable* params = nullptr;
  std::vector<chunk::ChunkState>* chunks = nullptr;
  distributed::ProcessGroup* group = nullptr;
  distributed::ReduceScatter* reduce = nullptr;
  distributed::ChunkGathering* gathering = nullptr;
  distributed::DropRule* drop_rule = nullptr;
};

struct StepOptions {
  pstar_dtype compute_dtype = PSTAR_DTYPE_F16;
  bool grad_accumulation = false;
  // Placement prefetches along the trace: the CPU update then runs in the
  // next iteration's order, prefetching behind it.
  bool prefetch = false;
  // False in a dry run: chunks are placed, nothing is computed.
  bool payloads = true;
  // The device's clock is modelled (options.virtual_clock): the step stays
  // synchronous, so that what placement does is a function of the calls
  // alone (an overlapped update's end would be the update thread's timing).
  bool virtual_clock = false;
  // Adam's moments' format (optim/adam_states.h; fp32 only with the NVMe
  // tier and hybrid placement).
  optim::StateFormat state_format = optim::StateFormat::kFp32;
  // The masters' format (optim/adam_masters.h) and the seed of bf16
  // masters' stochastic rounding.
  optim::MasterFormat master_format = optim::MasterFormat::kFp32;
  uint64_t master_seed = 0;
};

// Whether Adam's moments wait for a chunk's first update
// (chunk::Fp32Lists).  Not with the NVMe tier, which lays out every list at
// build, nor with a host capacity, so that a budget too small for the lists
// fails at pstar_engine_build rather than at a later step.
inline bool lazy_moments(const memory::NvmeTier& nvme, const memory::HostPool& host) {
  return !nvme.requested() && host.capacity() == 0;
}

// What the steps did (pstar_stats' steps, skipped_steps and
// bytes_reduce_scattered).
struct StepCounters {
  uint64_t steps = 0;          // updates applied
  uint64_t skipped_steps = 0;  // skipped for an inf or NaN gradient
  uint64_t bytes_reduce_scattered = 0;
  // Bytes the reduce-scatters copied from the accelerator to the host: this
  // rank's fp32 block of each sum (a device-memory communicator), or the
  // chunk's fp32 gradient buffers laid out in host staging (a host-memory
  // one).  pstar_x_gather_stats.bytes_reduce_device_to_host.
  uint64_t bytes_reduce_to_host = 0;
  uint64_t steps_overlapped = 0;   // steps whose CPU updates ran on the update thread
  uint64_t chunks_overlapped = 0;  // chunks updated there (kept speculations included)
  uint64_t chunks_speculated = 0;  // speculative updates a step kept
  uint64_t speculations_discarded = 0;
  double wait_seconds = 0.0;  // calls waiting for overlapped updates
};

class OptimizerStep {
 public:
  OptimizerStep(const StepParts& parts, const StepOptions& options);

  // At build, once the chunks exist: starts the update thread when the
  // step overlaps.
  void attach(const chunk::ChunkLayout* layout);

  // Gradient accumulation, one process: adds this micro-batch's gradient
  // (the fp32 accumulator on the device) into the parameter's slice of the
  // fp32 gradient list, then frees the accumulator.
  void fold_gradient(uint32_t id, memory::Stream* s);
  // ReduceScatter::Actions::lay_out and ::apply (world > 1).
  std::vector<uint32_t> lay_out_gradients(uint32_t k, float* data, uint64_t elems);
  void apply_reduced(uint32_t k, const std::vector<uint32_t>& params, float* avg);

  // The step's norm, overflow decision and update (one process, or this
  // rank's shards with world > 1), filling `r`.  An error (an NVMe I/O
  // error part way) leaves the chunks' prefetch state as it was.
  void run(pstar_step_result& r);

  // The global L2 norm of this iteration's gradients so far, unscaled, the
  // bits pstar_step_result.grad_norm will hold if nothing changes before
  // the step (pstar_grad_norm); infinity when one holds an inf or NaN.  One
  // process only (PSTAR_ERR_UNSUPPORTED with world > 1: the norm needs the
  // step's reduce-scatter).  The engine checks that the backward is
  // complete.
  double grad_norm();

  const StepCounters& counters() const { return counters_; }
  // A reduce-scatter's block copied to the host (device-memory communicator).
  void count_reduced_to_host(uint64_t bytes) { counters_.bytes_reduce_to_host += bytes; }
  // Seconds the update thread spent updating (0 without one).
  double update_seconds() const { return worker_ ? worker_->busy_seconds() : 0.0; }

  // The overlapped step.  overlaps(): this engine's steps return before
  // their CPU updates are done.  before_acquire(k): chunk k is about to be
  // used; waits for its update if one is in flight.  wait(): waits for the
  // step in flight (every call that reads or writes values, lists,
  // optimizer state or statistics does so first).  Both throw the update
  // thread's failure, which stays until clear_failure() (a checkpoint load
  // that completed rewrote every state).  wait_noexcept(): for the
  // engine's destructor.
  bool overlaps() const { return worker_ != nullptr || modelled_overlap(); }
  // The virtual clock's model of the CPU update (experimental API
  // pstar_x_engine_set_modelled_host_update): a chunk's update takes
  // elements x (2 x the compute dtype's size + 24) / bytes_per_s modelled
  // seconds (kModelledUpdateFp32BytesPerElem).
  // With the overlap requested the updates are applied at pstar_step, as a
  // synchronous step does (the same bits), and their time goes on the
  // device's host-work lane in the step's order, each chunk's payload ready
  // at its end (a fetch, and the acquire, wait for it); without it the
  // step advances the caller's clock by each.  0: the update takes no
  // modelled time (the default).  Before attach.
  void set_modelled_update_rate(double bytes_per_s) { modelled_update_rate_ = bytes_per_s; }
  // The bytes a fused Adam pass moves per element: the compute-dtype
  // gradient read and weight written (2 x its size, added per call), the
  // fp32 master, m and v read and written (24).
  static constexpr double kModelledUpdateFp32BytesPerElem = 24.0;
  // Before attach: whether to overlap (the default) where the step can:
  // with payloads (not a dry run) and the device's own clock.
  void set_overlap(bool on) { overlap_ = on; }
  bool overlap_requested() const { return overlap_; }
  // Throws the update thread's failure, if any (no wait).
  void require_ok() {
    if (worker_) take_done();
  }
  void before_acquire(uint32_t k) {
    if (worker_ == nullptr) return;
    if (spec_state_[k] != SpecState::kNone) discard_speculation();  // used again: its result would be stale
    if (worker_->in_flight()) counters_.wait_seconds += worker_->wait_for(k);
    take_done();
  }
  // wait() also discards the speculation under way (the call may read or
  // write what it read); wait_previous_step() leaves it (pstar_step, which
  // takes its results).
  void wait();
  void wait_previous_step();
  void wait_noexcept() noexcept;

  // The speculative update (pstar_x_engine_set_speculative_update; see
  // step/speculation.cpp): during the backward, each chunk whose gradients
  // have left for the host is updated out of place on the update thread,
  // with the constants of an unclipped, applied step; run() keeps a result
  // whose constants are the step's and discards the others.
  //   set_speculation_budget: before attach; the host bytes of result
  //     buffers held at once (0: none).
  //   gradients_left(k): chunk k's backward is over and it was evicted
  //     (Engine::gradients_leave); it is handed over once its copy to the
  //     host completed.
  //   poll_speculation(): on every acquire and release, hands over the
  //     chunks whose copy completed (a query of one event when none did).
  //   discard_speculation(): ends it and frees the results (anything that
  //     reads or writes values, an abort, destroy).
  void set_speculation_budget(uint64_t bytes) { spec_budget_ = bytes; }
  void gradients_left(uint32_t k);
  void poll_speculation() {
    if (!spec_pending_.empty()) hand_over_speculation();
  }
  void discard_speculation() noexcept;
  void clear_failure() {
    if (worker_) worker_->clear_failure();
  }

 private:
  void run_local(pstar_step_result& r);
  // The synchronous step's fill (optimizer_step.cpp): reorders the update
  // order `order` so that chunks on the host go up while the first one is
  // still coming down; returns that first chunk, or kNoFill.
  static constexpr uint32_t kNoFill = UINT32_MAX;
  uint32_t fill_first(std::vector<uint32_t>& order) const;
  bool modelled_overlap() const { return overlap_ && modelled_update_rate_ > 0.0; }
  // Modelled seconds of chunk k's CPU update (set_modelled_update_rate).
  double modelled_update_seconds(uint64_t elems) const {
    return static_cast<double>(elems) * (2.0 * static_cast<double>(elem_bytes()) + kModelledUpdateFp32BytesPerElem) /
           modelled_update_rate_;
  }
  // world > 1, hybrid placement: queues the device update of chunk k's
  // shard (sharded_step.cpp); returns the event of its last copy.
  memory::EventPtr queue_shard_update(uint32_t k, const std::vector<optim::Segment>& segments);

  // One chunk handed to the update thread for a speculative update: the
  // constants it used and its result buffers (the chunk's lists' and
  // payload's sizes).  Owned here until kept (swapped into the chunk) or
  // discarded (released).
  struct Speculated {
    uint32_t chunk = 0;
    std::vector<optim::Segment> segments;
    float* master = nullptr;
    float* exp_avg = nullptr;  // the moments in the state format (chunk::Fp32Lists)
    float* exp_avg_sq = nullptr;
    void* payload = nullptr;
  };
  uint64_t result_bytes(const chunk::ChunkState& c) const;
  enum class SpecState : uint8_t { kNone, kPending, kHanded };
  bool speculates() const { return worker_ != nullptr && spec_budget_ > 0 && !options_.grad_accumulation; }
  void hand_over_speculation();
  // At attach: the result buffers, touched once and left in the host pool.
  void reserve_speculation();
  // The chunks' parameters with a gradient as segments of `list`.
  void add_segments(uint32_t k, optim::SegmentList& list) const;
  void release_speculated(Speculated& s) noexcept;
  // run_local: ends the speculation; returns, by index of spec_, which completed.
  std::vector<bool> end_speculation();
  // run_local: chunk k's completed speculative result, when its constants
  // are `segments`, becomes the chunk's lists and payload; true if kept.
  bool keep_speculated(uint32_t k, const std::vector<bool>& completed, const std::vector<optim::Segment>& segments);
  // The chunks whose overlapped update is done leave awaiting_update; the
  // update thread's failure is thrown.
  void take_done();
  void run_sharded(pstar_step_result& r);
  // Fills the result's loss scale, gradient norm (unscaled) and clipping
  // coefficient from the squared norm of the scaled gradients; returns the
  // coefficient.
  double unscale_and_clip(double sumsq, pstar_step_result* r) const;
  // sqrt(sumsq) over the loss scale: the one formula of the reported norm.
  double unscaled_norm(double sumsq) const;
  // One process: this iteration's squared norm of the scaled gradients
  // (parameter order) and the overflow flag.
  double local_grad_sumsq(bool* overflow);
  // A step skipped for an inf or NaN gradient: every slot holding a
  // gradient gets its weight back from the master; the scaler backs off.
  void skip_step(pstar_step_result* r);
  size_t elem_bytes() const;
  // Bytes of each of chunk c's moment lists (its shard's with world > 1).
  uint64_t moment_bytes(const chunk::ChunkState& c) const {
    return optim::moment_list_bytes(options_.state_format, c.shard_elems);
  }
  // Chunk c's lists for its update, wherever they are (host, or the device
  // with hybrid placement), in the state format, with `payload` the
  // compute-dtype slot (the chunk's, or this rank's shard).
  optim::ChunkLists chunk_lists(const chunk::ChunkState& c, void* payload) const;
  // Bytes of chunk c's master list (its shard's with world > 1).
  uint64_t master_bytes(const chunk::ChunkState& c) const {
    return optim::master_list_bytes(options_.master_format, c.shard_elems);
  }
  chunk::ShardSpan shard_span(uint32_t id) const {
    const auto& place = layout_->param(id);
    return chunk::shard_span(place, chunks_[place.chunk].shard_elems, group_.rank());
  }

  // The parts, named as the engine names them.
  memory::Device* const device_;
  memory::HostPool* const host_;
  placement::Runtime* const placement_;
  placement::HybridPlacement* const hybrid_;
  memory::NvmeTier& nvme_;
  optim::Optimizer& optimizer_;
  values::ParamValues& values_;
  chunk::ParamTable& params_;
  std::vector<chunk::ChunkState>& chunks_;
  distributed::ProcessGroup& group_;
  distributed::ReduceScatter& reduce_;
  distributed::ChunkGathering& gathering_;
  distributed::DropRule& drop_rule_;
  const StepOptions options_;
  const chunk::ChunkLayout* layout_ = nullptr;  // null until attach
  StepCounters counters_;
  bool overlap_ = true;
  double modelled_update_rate_ = 0.0;     // bytes/s; 0: none (set_modelled_update_rate)
  std::unique_ptr<UpdateWorker> worker_;  // the overlapped step's thread (null: synchronous)
  // Speculation (engine thread).  Invariants: spec_state_[k] is kPending
  // exactly for the chunks in spec_pending_ and kHanded exactly for those
  // in spec_ (at spec_pos_[k]); a handed chunk is on the host and
  // awaiting_update; spec_bytes_ is the bytes of spec_'s buffers and never
  // exceeds spec_budget_.
  uint64_t spec_budget_ = 0;
  uint64_t spec_bytes_ = 0;
  std::deque<uint32_t> spec_pending_;  // evicted, their D2H copy maybe running
  std::vector<Speculated> spec_;       // handed over, in order
  std::vector<SpecState> spec_state_;  // per chunk
  std::vector<uint32_t> spec_pos_;     // per chunk: index in spec_ when kHanded
};

}  // namespace pstar::step
