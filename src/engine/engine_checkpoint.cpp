// The engine's side of checkpoints and the safetensors export
// (docs/checkpoints.md): the calls' preconditions, and checkpoint::
// EngineState over this engine's chunks, through which the sequences in
// src/checkpoint/ (save.cpp, load.cpp) read and write each parameter's
// values and lists wherever they live (host, device copies of the
// optimizer lists, the NVMe tier, this rank's shards).  The order of a save
// and a load, the ranks' agreement and the format are src/checkpoint/'s.
#include <cstring>
#include <string>

#include "checkpoint/engine_state.h"
#include "engine/engine.h"
#include "step/optimizer_step.h"
#include "values/param_values.h"
#include "util/dtype.h"
#include "util/error.h"

namespace pstar::engine {
using HostLists = placement::HybridPlacement::HostLists;

// A nested class (not a base of Engine, as placement::ChunkTable is): its
// methods' names (param_count, rank, read_list...) would otherwise become
// Engine's, some of them virtual overrides of Engine's public ones.
class Engine::CheckpointState final : public checkpoint::EngineState {
 public:
  explicit CheckpointState(Engine& e) : e_(e) {}

  uint32_t param_count() const override { return e_.param_count(); }
  checkpoint::ParamView param(uint32_t id) const override {
    const Param& p = e_.params_[id];
    return {p.name, p.shape, p.numel, p.frozen(), p.lr_scale, p.weight_decay, p.pins != 0};
  }
  int rank() const override { return e_.group_.rank(); }
  int world() const override { return e_.group_.world(); }
  bool sharded() const override { return e_.sharded(); }
  checkpoint::Part part(uint32_t id, int rank) const override {
    if (!e_.sharded()) return {0, e_.params_[id].numel};
    const chunk::ShardSpan s = e_.shard_span(id, rank);
    if (s.a >= s.b) return {};
    return {s.a - e_.layout_->param(id).offset_elems, s.b - s.a};
  }
  void all_gather(const void* mine, void* all, size_t bytes) override {
    e_.group_.all_gather_host("checkpoint: all-gather", distributed::CollectiveKind::kCheckpoint, 0, mine, all, bytes);
  }

  void read_list(uint32_t id, int list, float* out) override {
    if (!e_.sharded()) {
      if (list == 3) {
        read_values(id, out);
      } else {
        copy_list(id, list, false, out, nullptr);
      }
      return;
    }
    // This rank's shard of the chunk: the fp32 list, or the compute payload
    // of a frozen parameter.
    const auto& place = e_.layout_->param(id);
    if (list != 3) e_.nvme_.access(place.chunk, false);
    const HostLists lists(*e_.hybrid_, place.chunk, HostLists::list_bit(list));  // a shard's state on the device
    const ChunkState& c = e_.chunks_[place.chunk];
    const auto [lo, a, b] = e_.shard_span(id, e_.group_.rank());
    const float* src = list == 3 ? nullptr : list_base(c, list);
    for (uint64_t i = a; i < b; ++i) {
      // Moments not allocated yet are zeros (chunk::Fp32Lists).
      out[i - a] = list == 3 ? load_as(c.shard, e_.options_.compute_dtype, i - lo) : src ? src[i - lo] : 0.0f;
    }
  }
  // Straight to the values (not Engine::read/write, whose checks the
  // callers have made, and whose wait would throw the update thread's
  // failure that the load is about to clear).
  void read_values(uint32_t id, float* out) override {
    e_.values_->read(id, out, e_.params_[id].numel, PSTAR_DTYPE_F32);
  }
  void write_list(uint32_t id, int list, const float* whole) override {
    if (list == 0 || list == 3) {
      e_.values_->write(id, whole, e_.params_[id].numel, PSTAR_DTYPE_F32);
    } else if (!e_.sharded()) {
      copy_list(id, list, true, nullptr, whole);
    } else {
      const auto& place = e_.layout_->param(id);
      e_.nvme_.access(place.chunk, true);
      step::ensure_moments(*e_.host_, e_.chunks_[place.chunk], true);
      HostLists lists(*e_.hybrid_, place.chunk, HostLists::list_bit(list));  // a shard's state on the device
      float* dst = list_base(e_.chunks_[place.chunk], list);
      const auto [lo, a, b] = e_.shard_span(id, e_.group_.rank());
      for (uint64_t i = a; i < b; ++i) dst[i - lo] = whole[i - place.offset_elems];
      lists.write_back();
    }
  }
  void set_param_group(uint32_t id, float lr_scale, bool weight_decay) override {
    e_.params_[id].lr_scale = lr_scale;
    e_.params_[id].weight_decay = weight_decay;
  }
  void begin_rewrite() override { e_.nvme_.begin_rewrite(); }
  void end_rewrite() override { e_.nvme_.end_rewrite(); }

  optim::Optimizer& optimizer() override { return e_.optimizer_; }
  pstar_dtype compute_dtype() const override { return e_.options_.compute_dtype; }
  uint64_t chunk_elems() const override { return e_.options_.chunk_elems; }

 private:
  static float* list_base(const ChunkState& c, int list) {
    return list == 0 ? c.master : list == 1 ? c.exp_avg : c.exp_avg_sq;
  }
  // One process: list `list` of a trainable parameter copied into the
  // engine (from `in`) or out of it (into `out`), wherever it lives.
  void copy_list(uint32_t id, int list, bool into_engine, float* out, const float* in) {
    const auto& place = e_.layout_->param(id);
    const uint64_t bytes = e_.params_[id].numel * sizeof(float);
    if (bytes == 0) return;  // `out` or `in` may be NULL (an empty vector's data())
    e_.nvme_.access(place.chunk, into_engine);
    ChunkState& c = e_.chunks_[place.chunk];
    if (list_base(c, list) == nullptr) {
      // Moments not allocated yet are zeros (chunk::Fp32Lists): read as
      // such, allocated to be written.
      if (!into_engine) {
        std::memset(out, 0, bytes);
        return;
      }
      step::ensure_moments(*e_.host_, c, true);
    }
    float* at = list_base(c, list) + place.offset_elems;
    if (c.opt_device != nullptr) {
      e_.sync_optimizer(place.chunk);
      if (into_engine) {
        e_.copy_sync(at, in, bytes, memory::CopyKind::kHostToDevice);
      } else {
        e_.copy_sync(out, at, bytes, memory::CopyKind::kDeviceToHost);
      }
    } else if (into_engine) {
      std::memcpy(at, in, bytes);
    } else {
      std::memcpy(out, at, bytes);
    }
  }

  Engine& e_;
};

// What save, load and export need: a path, a built engine with values,
// between iterations (sharded engines too: the sequences are collective).
void Engine::require_file_call(const char* what, const char* path) const {
  require(path != nullptr && path[0] != '\0', PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return std::string(what) + ": the path is NULL or empty"; });
  require_built(what);
  require(!iteration_active_, PSTAR_ERR_INVALID_STATE,
          [&] { return std::string(what) + ": legal only between iterations"; });
  require(payloads_, PSTAR_ERR_UNSUPPORTED, [&] { return std::string(what) + ": a dry run holds no values"; });
}

// After a load that failed part way (checkpoint/load.cpp).
void Engine::require_load_complete(const char* what) const {
  require(load_incomplete_.empty(), PSTAR_ERR_IO, [&] {
    return std::string(what) + ": refused after a checkpoint load that failed part way (" + load_incomplete_ +
           "); load a checkpoint (pstar_checkpoint_load) to go on";
  });
}

std::string Engine::checkpoint_save(const char* dir) {
  require_file_call("checkpoint_save", dir);
  step_->wait();
  require_load_complete("checkpoint_save");
  CheckpointState state(*this);
  return checkpoint::save(state, dir);
}

void Engine::checkpoint_load(const char* dir) {
  require_file_call("checkpoint_load", dir);
  // The load rewrites every state: a failure of the update thread is
  // cleared by it, so the step in flight is waited for without rethrowing.
  step_->wait_noexcept();
  CheckpointState state(*this);
  checkpoint::load(state, dir, load_incomplete_);
  step_->clear_failure();
}

void Engine::export_safetensors(const char* path) {
  require_file_call("export_safetensors", path);
  step_->wait();
  require_load_complete("export_safetensors");
  CheckpointState state(*this);
  checkpoint::export_safetensors(state, path);
}

}  // namespace pstar::engine
