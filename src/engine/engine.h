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
// use it (distributed/collective_queue.h).  With the overlapped step the update
// thread runs the CPU updates of the last step on chunks marked
// awaiting_update, which the engine neither moves nor reads until it has
// taken them (step/update_worker.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "chunk/chunk.h"
#include "chunk/layout.h"
#include "chunk/param_table.h"
#include "distributed/chunk_gathering.h"
#include "distributed/drop_rule.h"
#include "distributed/process_group.h"
#include "distributed/reduce_scatter.h"
#include "engine/options.h"
#include "chunk/tensor_state.h"
#include "memory/device.h"
#include "memory/device_tier.h"
#include "memory/host_pool.h"
#include "memory/nvme_tier.h"
#include "optim/optimizer.h"
#include "placement/hybrid.h"
#include "placement/runtime.h"
#include "pstar/pstar.h"
#include "util/error.h"

namespace pstar::values {
class CheckpointLists;
class ParamValues;
struct ValueParts;
}  // namespace pstar::values
namespace pstar::step {
class BackwardGradients;
class OptimizerStep;
}  // namespace pstar::step

namespace pstar::engine {

// Most chunks a sharded engine may gather ahead of their use
// (pstar_x_engine_set_gather_ahead): each takes a chunk-sized device slot
// for the engine's life.
constexpr uint32_t kMaxGatherAhead = PSTAR_X_MAX_GATHER_AHEAD;

class Engine : private placement::HybridTable {
 public:
  explicit Engine(const EngineOptions& options);
  // Internal (tests, embedders that form their own groups): an engine
  // sharded over `group`, formed by the caller, whatever its size (one rank
  // included: the sharded code paths with a group of one).  The options'
  // rank and world_size are ignored; the group's are used.
  Engine(const EngineOptions& options, std::unique_ptr<distributed::Communicator> group);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  uint32_t register_param(const char* name, uint32_t ndim, const int64_t* shape, uint32_t flags);
  void build();
  bool built() const { return layout_ != nullptr; }

  uint32_t find(const char* name) const;
  uint32_t param_count() const { return params_.size(); }
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
  // release_after: pstar_grad_write_release (BackwardGradients::defer_to_slot).
  void grad_write(uint32_t id, const void* grad, uint64_t count, pstar_dtype dtype, pstar_mem_space space, void* stream,
                  bool release_after = false);
  float* grad_slot_acquire(uint32_t id, void* stream);
  void nonmodel_report(uint64_t bytes);

  // The engine's clock (options.virtual_clock: modelled seconds).
  void clock_advance(double seconds);
  double clock_now() const { return device_->clock_seconds(); }
  // Writes the timeline (options.record_timeline) as Chrome-trace JSON.
  void trace_export(const char* path) const;

  pstar_step_result step();

  // pstar_grad_norm: this TRAIN iteration's unscaled global gradient norm,
  // once its backward is complete (step/optimizer_step.h).
  double grad_norm();
  void hparam_set(pstar_hparam which, double value);
  double hparam_get(pstar_hparam which) const;

  void fill_stats(pstar_stats* out) const;

  // The NVMe tier (experimental; memory/nvme_tier.h, docs/nvme.md).
  void set_nvme(const pstar_x_nvme_options& options);
  // Waits for an overlapped step first: its I/O is counted once it is done.
  void fill_nvme_stats(pstar_x_nvme_stats* out) const;

  // Gathering ahead along the recorded schedule (experimental;
  // engine_dist.cpp, docs/distributed.md).
  void set_gather_ahead(uint32_t chunks);

  // The overlapped step (experimental; step/update_worker.h): set before
  // build; on by default.
  void set_overlap_step(bool enabled);
  void set_speculative_update(uint64_t max_bytes);
  // The CPU update's modelled time on the virtual clock (experimental;
  // step::OptimizerStep::set_modelled_update_rate).
  void set_modelled_host_update(double bytes_per_s);
  void fill_step_stats(pstar_x_step_stats* out) const;
  void fill_gather_stats(pstar_x_gather_stats* out) const;

  // Data parallelism (docs/distributed.md): this engine's rank and the
  // number of ranks; sharded() when it has a group (more than one rank, or
  // a group handed to the constructor).
  int rank() const { return group_.rank(); }
  int world() const { return group_.world(); }
  bool sharded() const { return group_.sharded(); }

 private:
  using Tier = chunk::Tier;
  using Use = memory::DeviceTier::Use;

  using Param = chunk::Param;
  using ChunkState = chunk::ChunkState;

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

  void require_built(const char* what) const;
  void require_file_call(const char* what, const char* path) const;
  void require_load_complete(const char* what) const;
  // checkpoint::EngineState over this engine's chunks, for one save, load
  // or export (values/checkpoint_lists.h).
  values::CheckpointLists checkpoint_lists();
  // The modules values are read from and written into.
  values::ValueParts value_parts();
  Param& value_access(const char* what, uint32_t id, const void* buf, uint64_t count, pstar_dtype dtype);
  Param& backward_param(const char* what, uint32_t id);
  size_t elem_bytes() const;

  // placement::HybridTable: the chunks, as the placement runtime (a
  // ChunkTable) and hybrid placement see them.
  size_t chunk_count() const override { return chunks_.size(); }
  chunk::Chunk& chunk_at(uint32_t k) override { return chunks_[k]; }
  chunk::Fp32Lists& lists_at(uint32_t k) override { return chunks_[k]; }
  uint64_t list_elems(uint32_t k) const override { return chunks_[k].shard_elems; }
  void** compute_shard(uint32_t k) override { return sharded() ? &chunks_[k].shard : nullptr; }

  void reset_iteration_state(chunk::TensorEvent ev);
  void count_gradients_to_come();
  void gradients_leave(uint32_t k);

  void release_optimizer_buffers(ChunkState& c);
  // Each moment list's bytes of chunk c (its shard), in the state format.
  uint64_t moment_bytes(const ChunkState& c) const;
  optim::StateFormat state_format() const { return optim::state_format_of(options_.state_format); }
  optim::MasterFormat master_format() const { return optim::master_format_of(options_.master_format); }
  uint64_t master_bytes(const ChunkState& c) const { return optim::master_list_bytes(master_format(), c.shard_elems); }

  // Data parallelism (world > 1).
  void resolve_world();
  void connect_group();
  void check_layout_agrees(uint64_t chunk_elems);
  // The elements of parameter `id` in rank `rank`'s shard of its chunk.
  chunk::ShardSpan shard_span(uint32_t id, int rank) const {
    const auto& place = layout_->param(id);
    return chunk::shard_span(place, chunks_[place.chunk].shard_elems, rank);
  }
  // Reduce-scatters chunk k's pending gradients (engine_dist.cpp).
  void reduce_chunk(uint32_t k);

  // Copies between host memory and device memory on the compute stream and
  // waits for the copy (memory::Device::copy_sync).
  void copy_sync(void* dst, const void* src, size_t bytes, memory::CopyKind kind) {
    device_->copy_sync(dst, src, bytes, kind);
  }

  EngineOptions options_;  // the ordinal resolved for a rank (resolve_world)
  std::unique_ptr<memory::Device> device_;
  std::unique_ptr<memory::HostPool> host_;
  chunk::ParamTable params_;
  std::unique_ptr<chunk::ChunkLayout> layout_;
  std::vector<ChunkState> chunks_;
  // The placement runtime (placement/runtime.h): tiers, moves, policies,
  // the trace, the device tier's accounting, the timeline.
  std::unique_ptr<placement::Runtime> placement_;

  // Hybrid optimizer placement (placement/hybrid.h): fp32 optimizer state
  // of some trainable chunks on the device once warm-up ends.
  std::unique_ptr<placement::HybridPlacement> hybrid_;

  // Reads and writes of parameter values wherever they live, and the
  // compute copy restored from the master (values/param_values.h).
  std::unique_ptr<values::ParamValues> values_;
  // The gradients from backward to the update, and the step's sequence
  // (step/optimizer_step.h).
  std::unique_ptr<step::OptimizerStep> step_;
  // Each parameter's gradient during its backward, on the device or the
  // host (step/backward_gradients.h).
  std::unique_ptr<step::BackwardGradients> grads_;

  bool iteration_active_ = false;
  pstar_iteration_kind iteration_kind_ = PSTAR_ITERATION_TRAIN;

  // Adam's hyperparameters, clipping, the loss scaler, the step count and
  // the CPU update's threads (optim/optimizer.h).
  optim::Optimizer optimizer_;
  uint32_t writable_pins_ = 0;  // outstanding writable pins (no iteration may begin)

  pstar_stats stats_ = PSTAR_STATS_INIT;

  // Data parallelism: the group (one process: no communicator), its
  // failure state and collective hash, the collective queue
  // (distributed/process_group.h); the gradients' reduce-scatters, their buffers
  // and those in flight (distributed/reduce_scatter.h).
  distributed::ProcessGroup group_;
  distributed::ReduceScatter reduce_;

  // world > 1: the gathered chunks, gathering ahead along the schedule
  // into its device slots, and dropping (distributed/chunk_gathering.h).
  distributed::ChunkGathering gathering_;
  distributed::DropRule drop_rule_;  // when gathered chunks go (world > 1)

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
