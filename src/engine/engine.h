// Engine: one model's chunks, their placement between the accelerator and
// host memory, and the optimizer step.  The C API (capi/) is a thin shim over
// this class; every public method either completes or throws pstar::Error
// having changed no logical state (parameter states, values, counters).
// A failed call may still have moved chunks between tiers: placement is not
// logical state.
//
// Threading: one thread drives an engine.  The device's stream workers run
// queued copies and gradient operations; they touch only memory that the
// engine hands them and that stays allocated until an event says they are
// done (deferred frees).  With gathering ahead, the collective queue's
// thread runs all-gathers into gather slots and reduce-scatters from
// reduce-scatter buffers, each untouched by the engine until its ticket is
// waited for, and the communicator only while the engine's thread does not
// use it (dist/collective_queue.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "chunk/chunk.h"
#include "chunk/layout.h"
#include "dist/collective_queue.h"
#include "dist/comm/communicator.h"
#include "dist/gather_ahead.h"
#include "dist/launch_env.h"
#include "engine/options.h"
#include "chunk/tensor_state.h"
#include "memory/device.h"
#include "memory/device_tier.h"
#include "memory/host_pool.h"
#include "memory/nvme_tier.h"
#include "optim/optimizer.h"
#include "placement/access_trace.h"
#include "placement/runtime.h"
#include "pstar/pstar.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace pstar::engine {

// Most chunks a sharded engine may gather ahead of their use
// (pstar_x_engine_set_gather_ahead): each takes a chunk-sized device slot
// for the engine's life.
constexpr uint32_t kMaxGatherAhead = PSTAR_X_MAX_GATHER_AHEAD;
// Reduce-scatter buffer pairs (a host fp32 chunk and shard) of an engine
// with a collective queue: one reduce-scatter runs on the queue while the
// next chunk's gradients are laid out in the other.
constexpr size_t kAsyncReduceBuffers = 2;

// Most dimensions a parameter may have.
constexpr uint32_t kMaxNdim = 16;
// Largest element count of one parameter (2^48).
constexpr uint64_t kMaxNumel = uint64_t{1} << 48;

class Engine : private placement::ChunkTable {
 public:
  explicit Engine(const EngineOptions& options);
  // Internal (tests, embedders that form their own groups): an engine
  // sharded over `group`, formed by the caller, whatever its size (one rank
  // included: the sharded code paths with a group of one).  The options'
  // rank and world_size are ignored; the group's are used.
  Engine(const EngineOptions& options, std::unique_ptr<dist::Communicator> group);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  uint32_t register_param(const char* name, uint32_t ndim, const int64_t* shape, uint32_t flags);
  void build();
  bool built() const { return layout_ != nullptr; }

  uint32_t find(const char* name) const;
  uint32_t param_count() const { return static_cast<uint32_t>(params_.size()); }
  uint64_t numel(uint32_t id) const;
  void set_lr_scale(uint32_t id, float lr_scale);
  void set_weight_decay(uint32_t id, bool enabled);

  void write(uint32_t id, const void* src, uint64_t count, pstar_dtype dtype);
  void read(uint32_t id, void* dst, uint64_t count, pstar_dtype dtype);
  // Checkpoints: the preconditions here (engine_checkpoint.cpp), the
  // sequences and the format in src/checkpoint/ (docs/checkpoints.md).
  std::string checkpoint_save(const char* dir);
  void checkpoint_load(const char* dir);
  void export_safetensors(const char* path);

  // pstar_param_pin/unpin: the fp32 master in place, pinned.
  float* pin(uint32_t id, bool writable);
  void unpin(uint32_t id);

  void iteration_begin(pstar_iteration_kind kind);
  void iteration_end();
  // pstar_iteration_abort: ends the iteration in progress without a step,
  // as if it had never begun (one process only).
  void iteration_abort();
  void* compute_stream_handle() { return device_->compute_stream_handle(); }

  void* acquire(uint32_t id, pstar_stage stage, void* stream);
  void release(uint32_t id, void* stream);
  void grad_write(uint32_t id, const void* grad, uint64_t count, pstar_dtype dtype, pstar_mem_space space,
                  void* stream);
  float* grad_slot_acquire(uint32_t id, void* stream);
  void nonmodel_report(uint64_t bytes);

  // The engine's clock (options.virtual_clock: modelled seconds).
  void clock_advance(double seconds);
  double clock_now() const { return device_->clock_seconds(); }
  // Writes the timeline (options.record_timeline) as Chrome-trace JSON.
  void trace_export(const char* path) const;

  pstar_step_result step();

  void hparam_set(pstar_hparam which, double value);
  double hparam_get(pstar_hparam which) const;

  void fill_stats(pstar_stats* out) const;

  // The NVMe tier (experimental; memory/nvme_tier.h, docs/nvme.md).
  void set_nvme(const pstar_x_nvme_options& options);
  void fill_nvme_stats(pstar_x_nvme_stats* out) const { nvme_.fill_stats(out); }

  // Gathering ahead along the recorded schedule (experimental;
  // engine_dist.cpp, docs/distributed.md).
  void set_gather_ahead(uint32_t chunks);
  void fill_gather_stats(pstar_x_gather_stats* out) const;

  // Data parallelism (docs/distributed.md): this engine's rank and the
  // number of ranks; sharded() when it has a group (more than one rank, or
  // a group handed to the constructor).
  int rank() const { return rank_; }
  int world() const { return world_; }
  bool sharded() const { return comm_ != nullptr; }

 private:
  using Tier = chunk::Tier;
  using Use = memory::DeviceTier::Use;

  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t numel = 0;
    uint32_t flags = 0;
    float lr_scale = 1.0f;     // parameter group: learning-rate multiplier
    bool weight_decay = true;  // parameter group: takes weight decay
    chunk::TensorState state = chunk::TensorState::kFree;
    pstar_stage acquired_stage = PSTAR_STAGE_FORWARD;  // meaningful in kCompute
    uint32_t forward_uses = 0;                         // this iteration
    uint32_t backward_uses = 0;                        // this iteration; <= forward_uses
    bool slot_is_grad = false;                         // the compute slot holds the gradient
    bool has_grad = false;                             // a gradient arrived this iteration
    // world > 1: the gradient in grad_acc is final for this (micro-)batch
    // and waits for its chunk's reduce-scatter; grad_ready completes when
    // the queued work writing grad_acc is done.
    bool grad_pending = false;
    memory::EventPtr grad_ready;
    // world > 1: stages (bit 0 FORWARD or EVAL, bit 1 RECOMPUTE) whose use
    // of this parameter has been released this iteration (drop rule).
    uint8_t used_marks = 0;
    float* grad_acc = nullptr;  // device fp32 accumulator during backward
    // Written by the device when the gradient is finalized.
    double grad_sumsq = 0.0;
    int grad_nonfinite = 0;
    uint32_t pins = 0;               // outstanding pstar_param_pin exports of the master
    std::vector<bool> pin_writable;  // per outstanding pin, oldest first
    bool frozen() const { return (flags & PSTAR_PARAM_FROZEN) != 0; }
  };

  // The chunk store's part (chunk/chunk.h: tier, payload, readiness, uses)
  // and what the engine's other modules keep per chunk.
  struct ChunkState : chunk::Chunk {
    // Elements of the full chunk (its layout capacity, padded with world > 1
    // to a multiple of world * kAlignElems) and of one rank's shard.
    uint64_t elems = 0;
    uint64_t shard_elems = 0;
    // world > 1: this rank's shard of the compute payload, on the host, for
    // good.  The gathered full chunk is chunk::Chunk's payload (tier
    // kNotGathered when not gathered); the fp32 lists below are shards too.
    void* shard = nullptr;
    // world > 1, this iteration: parameters not yet released in stage
    // FORWARD (or EVAL) [0] and RECOMPUTE [1]; parameters whose backward
    // uses differ from their forward uses; parameters whose gradient waits
    // for the chunk's reduce-scatter.
    uint32_t unmarked[2] = {0, 0};
    uint32_t bwd_open = 0;
    uint32_t grads_pending = 0;
    uint32_t master_pins = 0;  // pinned masters of its parameters (pstar_param_pin)
    // fp32 optimizer twins (trainable chunks only): on the host, or with
    // hybrid placement in one device buffer (opt_device), for good.  With
    // the NVMe tier, lists on the drive: in a staging buffer while staged
    // in (nvme_.access or the step's ring), null otherwise.
    float* master = nullptr;
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    // fp32 gradient list twin (gradient accumulation only).
    float* grad32 = nullptr;
    // Hybrid placement: opt_device (in chunk::Chunk) holds master, m, v (and
    // grad32) back to back; its size, and the event after which it is valid
    // (the copy from the host).
    uint64_t opt_device_bytes = 0;
    memory::EventPtr opt_ready;
    // world > 1, gathering ahead: the all-gather filling its gather slot
    // (chunk::Chunk::gather_slot) while it runs on the collective queue (null
    // once waited for).
    dist::CollectiveQueue::Ticket gathering;
    // Reduce-scatters of its gradients queued and not finished yet.
    uint32_t reducing = 0;
  };

  // NVMe tier (engine_nvme.cpp: glue; memory/nvme_tier.h).  At build: the
  // optimizer lists of trainable chunks on the host while they fit
  // host_capacity_bytes less the staging buffers, the others on the drive.
  void nvme_place_lists(std::vector<ChunkState>& chunks, uint64_t largest_trainable_elems);
  // Refuses (PSTAR_ERR_IO) while the stored state is not trusted: after an
  // NVMe I/O error, or after a checkpoint load that failed once it had
  // begun writing (load_incomplete_; checkpoint/load.cpp).  Both end with
  // a load that completes.
  void require_nvme_ok(const char* what) const {
    nvme_.require_ok(what);
    require_load_complete(what);
  }

  // One pair of reduce-scatter buffers; kAsyncReduceBuffers with a
  // collective queue, whose reduce-scatters run while the next ones are
  // laid out.
  struct ReduceBuffers {
    float* staging = nullptr;  // host fp32 chunk (Gloo; NCCL stages on the device)
    uint64_t staging_bytes = 0;
    float* out = nullptr;  // host fp32 shard
    uint64_t out_bytes = 0;
  };
  // Reduce-scatters queued on the collective queue, oldest first, whose
  // results are not applied yet (reduce_finish).
  struct PendingReduce {
    uint32_t chunk = 0;
    size_t buffer = 0;             // index into rs_bufs_
    std::vector<uint32_t> params;  // whose gradients it carries
    void* device_stage = nullptr;  // NCCL: the device staging buffer, counted
    uint64_t device_stage_bytes = 0;
    dist::CollectiveQueue::Ticket ticket;
  };

  Param& param_checked(uint32_t id);
  const Param& param_checked(uint32_t id) const;
  void require_built(const char* what) const;
  void require_file_call(const char* what, const char* path, bool one_process) const;
  void require_load_complete(const char* what) const;
  // checkpoint::EngineState over this engine (engine_checkpoint.cpp), and
  // the collective of sharded checkpoints (engine_dist.cpp).
  class CheckpointState;
  void checkpoint_all_gather(const void* mine, void* all, size_t bytes);
  Param& value_access(const char* what, uint32_t id, const void* buf, uint64_t count, pstar_dtype dtype);
  Param& backward_param(const char* what, uint32_t id);
  chunk::TensorState checked_transition(const Param& p, uint32_t id, chunk::TensorEvent ev) const;
  void apply(Param& p, uint32_t id, chunk::TensorEvent ev);
  size_t elem_bytes() const;

  // placement::ChunkTable: the chunks, as the placement runtime sees them.
  size_t chunk_count() const override { return chunks_.size(); }
  chunk::Chunk& chunk_at(uint32_t k) override { return chunks_[k]; }

  void restore_slot(uint32_t id);
  void reset_iteration_state(chunk::TensorEvent ev);
  double unscale_and_clip(double sumsq, pstar_step_result* r) const;
  void note_skipped_step(pstar_step_result* r);

  void fold_gradient(uint32_t id, memory::Stream* s);
  void release_optimizer_buffers(ChunkState& c, uint64_t fp32_bytes);
  // Bytes of one of chunk k's fp32 buffers this rank holds (a shard with
  // world > 1).
  uint64_t fp32_bytes_held(uint32_t k) const;
  // The step's norm, overflow decision and update: one process, or this
  // rank's shards (world > 1).
  void step_update_local(pstar_step_result& r);

  // Data parallelism (world > 1).
  void resolve_world();
  void connect_group();
  void check_layout_agrees(uint64_t chunk_elems);
  // Runs a collective: refused after a failure; a PSTAR_ERR_COMM marks the
  // engine failed for good.  Counts it and folds (kind, chunk) into the
  // iteration's collective hash.
  template <class F>
  void collective(const char* what, uint32_t kind, uint64_t chunk, F&& f);
  void require_comm_ok(const char* what) const {
    if (comm_failed_) throw_comm_refused(what);
  }
  [[noreturn]] void throw_comm_refused(const char* what) const;
  // The owned range of chunk k: [lo, lo + shard_elems).
  uint64_t shard_lo(uint32_t k) const { return static_cast<uint64_t>(rank_) * chunks_[k].shard_elems; }
  // The elements of parameter `id` in rank `rank`'s shard of its chunk:
  // [a, b) in chunk coordinates, none when a >= b; the shard begins at lo.
  struct ShardSpan {
    uint64_t lo, a, b;
  };
  ShardSpan shard_span(uint32_t id, int rank) const {
    const auto& place = layout_->param(id);
    const uint64_t n = chunks_[place.chunk].shard_elems, lo = static_cast<uint64_t>(rank) * n;
    return {lo, std::max(place.offset_elems, lo), std::min(place.offset_elems + place.numel, lo + n)};
  }
  void gather(uint32_t k);
  [[noreturn]] void fail_collective(const char* what, const std::string& failure);
  // Counts a collective and folds (kind, chunk) into the step's hash.
  void note_collective(uint32_t kind, uint64_t chunk);
  // Queues a collective on the collective queue, counted and hashed now
  // (issue order); refused after a failure.
  dist::CollectiveQueue::Ticket collective_async(const char* what, uint32_t kind, uint64_t chunk,
                                                 std::function<void()> op);
  void drain_collectives(const char* what);
  // Gathering ahead (engine_dist.cpp).
  void reserve_gather_slots();
  void release_gather_slots();
  void gather_into_slot(uint32_t k, uint32_t slot);
  void finish_gather(uint32_t k, bool quiet);
  void all_gather_host(const void* mine, void* all, size_t bytes);
  void drop_gathered(uint32_t k);
  void drop_all_gathered();
  void after_release_sharded(uint32_t id, uint32_t k, pstar_stage stage);
  void reduce_chunk(uint32_t k);
  void reduce_finish(PendingReduce& pr);
  void reduce_finish_oldest();
  // Finishes the queued reduce-scatters up to the last one of `chunk`
  // (all of them when chunk < 0).
  void reduce_finish_all(int64_t chunk);
  void release_device_stage(PendingReduce& pr);
  void release_reduce_buffers();
  void write_sharded(uint32_t id, const void* src, pstar_dtype dtype);
  void read_sharded(uint32_t id, void* dst, pstar_dtype dtype);
  void restore_slot_sharded(uint32_t id);
  void step_update_sharded(pstar_step_result& r);

  // Hybrid optimizer placement (options.hybrid_optimizer).
  uint64_t optimizer_state_bytes(uint32_t chunk) const;
  void place_optimizer_state();
  void move_optimizer_state(uint32_t chunk);
  // Host waits until the fp32 lists of `chunk` may be read or written by
  // host code (emulated device) or copied (CUDA).
  void sync_optimizer(uint32_t chunk);
  // Copies between host memory and device memory on the compute stream and
  // waits for the copy (CUDA staging of device-resident optimizer state).
  void copy_sync(void* dst, const void* src, size_t bytes, memory::CopyKind kind);
  // Writes `values` (host, fp32) rounded to the compute dtype into the slot
  // of `id`, which lives on the device (a chunk with device optimizer state).
  void write_slot_on_device(uint32_t id, const float* values);

  EngineOptions options_;  // the ordinal resolved for a rank (resolve_world)
  std::unique_ptr<memory::Device> device_;
  std::unique_ptr<memory::HostPool> host_;
  std::vector<Param> params_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::unique_ptr<chunk::ChunkLayout> layout_;
  std::vector<ChunkState> chunks_;
  // The placement runtime (placement/runtime.h): tiers, moves, policies,
  // the trace, the device tier's accounting, the timeline.
  std::unique_ptr<placement::Runtime> placement_;

  // Hybrid placement: TRAIN iterations ended so far, and whether the
  // optimizer state has been placed (once, when warm-up ends).
  uint64_t train_iterations_ = 0;
  bool hybrid_placed_ = false;
  uint32_t optimizer_chunks_on_device_ = 0;

  bool iteration_active_ = false;
  pstar_iteration_kind iteration_kind_ = PSTAR_ITERATION_TRAIN;

  // Adam's hyperparameters, clipping, the loss scaler, the step count and
  // the CPU update's threads (optim/optimizer.h).
  optim::Optimizer optimizer_;
  uint32_t writable_pins_ = 0;  // outstanding writable pins (no iteration may begin)

  pstar_stats stats_ = PSTAR_STATS_INIT;

  // Data parallelism (world > 1): the group's communicator; whether a
  // collective failed (then every call of the training loop is refused)
  // and why; the reduce-scatter's staging (fp32, the largest trainable
  // chunk) and output (its shard), host-pool buffers held from build on;
  // a hash of the collectives issued since the last step, compared across
  // ranks at the step.
  int rank_ = 0;
  int world_ = 1;
  dist::LaunchInfo launch_;
  std::unique_ptr<dist::Communicator> comm_;
  bool comm_failed_ = false;
  std::string comm_failure_;
  std::vector<ReduceBuffers> rs_bufs_;  // kAsyncReduceBuffers with a collective queue, else 1
  std::deque<PendingReduce> reduces_;   // queued reduce-scatters, oldest first
  uint64_t collective_hash_ = 0;

  // Gathering ahead (world > 1, depth > 0; docs/distributed.md): the
  // schedule and its device slots.
  dist::GatherAhead gather_;
  // Runs the ahead gathers; declared after comm_ so that it is destroyed
  // (its thread finished) first.
  std::unique_ptr<dist::CollectiveQueue> cqueue_;

  // NVMe tier: its options (set before build), the data file, the staging
  // buffers, which chunks' lists live on the drive, and the failure that
  // stops training until a checkpoint is loaded (memory/nvme_tier.h).  It
  // points chunks_' fp32 lists at its staging buffers while they are staged.
  memory::NvmeTier nvme_;

  // A checkpoint load that failed after its first write into the engine
  // (an I/O error once every check had passed): why, empty otherwise.
  // Iterations, steps, saves and exports are refused until a load completes.
  std::string load_incomplete_;

  // False in a dry run: buffers are address space only; nothing is read,
  // written or computed.
  bool payloads_ = true;

  // Acquires since the engine was created (chunks' last_acquire).
  uint64_t acquires_ = 0;
};

}  // namespace pstar::engine
