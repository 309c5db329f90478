// CheckpointLists: checkpoint::EngineState over an engine's chunks, the one
// place that knows where each list of a parameter lives when a checkpoint
// reads or writes it: the host, the device copies of the optimizer lists
// (hybrid placement), the NVMe tier's staging, this rank's shards.  The
// order of a save and a load, the ranks' agreement and the format are
// src/checkpoint/'s (checkpoint/engine_state.h), which sees plain values
// only.
//
// Made for one save, load or export and dropped after it; the engine has
// checked the call's preconditions (built, between iterations, with
// values, the update thread waited for).
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/engine_state.h"
#include "chunk/chunk.h"
#include "chunk/layout.h"
#include "chunk/param_table.h"
#include "memory/host_pool.h"
#include "optim/adam_states.h"
#include "optim/optimizer.h"
#include "values/param_values.h"

namespace pstar::values {

class CheckpointLists final : public checkpoint::EngineState {
 public:
  // `parts` as the engine's ParamValues has them; `params` the same table,
  // writable (a load sets parameter groups); `chunk_elems` the options'
  // (the compute layout a checkpoint records); `state_format` Adam's
  // moments' and `master_format` the masters' (a checkpoint holds both as
  // fp32 values in every format).
  CheckpointLists(const ValueParts& parts, chunk::ParamTable& params, memory::HostPool& host, ParamValues& values,
                  optim::Optimizer& optimizer, const chunk::ChunkLayout& layout, pstar_dtype compute_dtype,
                  uint64_t chunk_elems, optim::StateFormat state_format,
                  optim::MasterFormat master_format = optim::MasterFormat::kFp32)
      : parts_(parts),
        params_(params),
        host_(host),
        values_(values),
        optimizer_(optimizer),
        layout_(layout),
        compute_dtype_(compute_dtype),
        chunk_elems_(chunk_elems),
        state_format_(state_format),
        master_format_(master_format) {}

  uint32_t param_count() const override { return params_.size(); }
  checkpoint::ParamView param(uint32_t id) const override;
  int rank() const override { return parts_.group->rank(); }
  int world() const override { return parts_.group->world(); }
  bool sharded() const override { return parts_.group->sharded(); }
  checkpoint::Part part(uint32_t id, int rank) const override;
  void all_gather(const void* mine, void* all, size_t bytes) override;

  void read_list(uint32_t id, int list, float* out) override;
  void read_values(uint32_t id, float* out) override;
  void write_list(uint32_t id, int list, const float* whole) override;
  void set_param_group(uint32_t id, float lr_scale, bool weight_decay) override;
  void begin_rewrite() override { parts_.nvme->begin_rewrite(); }
  void end_rewrite() override { parts_.nvme->end_rewrite(); }

  optim::Optimizer& optimizer() override { return optimizer_; }
  pstar_dtype compute_dtype() const override { return compute_dtype_; }
  uint64_t chunk_elems() const override { return chunk_elems_; }
  const char* state_format() const override { return optim::state_format_name(state_format_); }
  const char* master_format() const override { return optim::master_format_name(master_format_); }

 private:
  chunk::ShardSpan shard_span(uint32_t id, int rank) const;
  // One process: list `list` of a trainable parameter copied into the
  // engine (from `in`) or out of it (into `out`), wherever it lives.
  void copy_list(uint32_t id, int list, bool into_engine, float* out, const float* in);
  // Moments of chunk c's list `list` (1 m, 2 v), elements [lo, lo + n) of
  // its (shard's) list, as fp32 values, out of or into the format's storage.
  void moments_out(const chunk::ChunkState& c, int list, uint64_t lo, uint64_t n, float* out) const;
  void moments_in(chunk::ChunkState& c, int list, uint64_t lo, uint64_t n, const float* in) const;
  uint64_t moment_bytes(const chunk::ChunkState& c) const {
    return optim::moment_list_bytes(state_format_, c.shard_elems);
  }

  const ValueParts parts_;
  chunk::ParamTable& params_;
  memory::HostPool& host_;
  ParamValues& values_;
  optim::Optimizer& optimizer_;
  const chunk::ChunkLayout& layout_;
  const pstar_dtype compute_dtype_;
  const uint64_t chunk_elems_;
  const optim::StateFormat state_format_;
  const optim::MasterFormat master_format_;
};

}  // namespace pstar::values
