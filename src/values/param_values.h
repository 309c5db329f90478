// ParamValues: a parameter's elements read and written wherever they live.
// A trainable parameter's value is its fp32 master: in host memory, on the
// NVMe drive (staged in through the NVMe tier's access buffer), on the
// device with hybrid placement, or with world > 1 this rank's shard of it.
// Its compute copy (the compute dtype, in the chunk's payload or this
// rank's compute shard) is derived from the master: written with it, and
// restored from it when the slot held a gradient that was not applied (a
// skipped step, an aborted iteration) or after a writable pin.  A frozen
// parameter has no master: its compute copy is its value.
//
// Values never move a chunk: what is on the device is read and written
// there, through host staging (the host's code never dereferences device
// memory, on any device).  Callers check the arguments and the engine's
// state first (Engine::value_access); nothing here is a precondition check.
//
// Reads with world > 1 are collectives (an all-gather of the chunk's master
// shards, or compute shards when frozen): every rank must read the same
// parameters in the same order.  Writes are not: every rank passes the full
// values and keeps its shard.
#pragma once

#include <cstdint>
#include <vector>

#include "chunk/chunk.h"
#include "chunk/layout.h"
#include "chunk/param_table.h"
#include "distributed/process_group.h"
#include "distributed/reduce_scatter.h"
#include "memory/device.h"
#include "memory/host_pool.h"
#include "memory/nvme_tier.h"
#include "optim/adam_masters.h"
#include "placement/hybrid.h"
#include "placement/runtime.h"
#include "pstar/pstar.h"

namespace pstar::values {

// Adam's moments of chunk `c` (its shard with world > 1) on the host, zeros
// where they did not exist yet; a no-op where they do (chunk::Fp32Lists:
// they come with a chunk's first update or load).  `bytes`: each list's
// (optim::moment_list_bytes; all bits clear is zeros in every format).
// `zero_fill` false: a dry run, whose buffers hold nothing.
void ensure_moments(memory::HostPool& host, chunk::ChunkState& c, uint64_t bytes, bool zero_fill);

// The engine's modules values are read from and written into; every
// pointer outlives the ParamValues.
struct ValueParts {
  memory::Device* device = nullptr;
  placement::Runtime* placement = nullptr;
  placement::HybridPlacement* hybrid = nullptr;
  memory::NvmeTier* nvme = nullptr;
  distributed::ProcessGroup* group = nullptr;
  distributed::ReduceScatter* reduce = nullptr;
  const chunk::ParamTable* params = nullptr;
  std::vector<chunk::ChunkState>* chunks = nullptr;
};

class ParamValues {
 public:
  // `payloads`: false in a dry run (nothing is read or written; restore is
  // a no-op).
  // `master_format`: the masters' (optim/adam_masters.h; bf16 masters are
  // read as their exact fp32 values and written rounded to nearest even).
  ParamValues(const ValueParts& parts, pstar_dtype compute_dtype, bool payloads,
              optim::MasterFormat master_format = optim::MasterFormat::kFp32)
      : parts_(parts), compute_dtype_(compute_dtype), payloads_(payloads), master_format_(master_format) {}

  // At build, once the chunks exist.
  void attach(const chunk::ChunkLayout* layout) { layout_ = layout; }

  // `count` elements of parameter `id` (its numel) from or into a host
  // buffer of `dtype`.
  void write(uint32_t id, const void* src, uint64_t count, pstar_dtype dtype);
  void read(uint32_t id, void* dst, uint64_t count, pstar_dtype dtype);

  // The compute copy of trainable parameter `id` written from its master
  // (this rank's part with world > 1).
  void restore_slot(uint32_t id);

  // Bytes all-gathered by reads (world > 1).
  uint64_t bytes_all_gathered() const { return bytes_all_gathered_; }

 private:
  size_t elem_bytes() const;
  chunk::ShardSpan shard_span(uint32_t id) const;
  // Writes `values` (host, fp32) rounded to the compute dtype into the slot
  // of `id`, whose chunk is on the device.
  void write_slot_on_device(uint32_t id, const float* values);
  void write_sharded(uint32_t id, const void* src, pstar_dtype dtype);
  void read_sharded(uint32_t id, void* dst, pstar_dtype dtype);
  void restore_slot_sharded(uint32_t id);
  // Masters [lo, lo + n) of c's list as floats: the list itself (fp32) or
  // `staging` filled with their values (bf16).
  const float* masters_f32(const chunk::ChunkState& c, uint64_t lo, uint64_t n, std::vector<float>& staging) const;
  // Hybrid placement: masters [lo, lo + n) of chunk k's list on the device
  // as floats, or written from floats (bf16: rounded to nearest even, and
  // `values` then holds what the masters hold).
  void read_device_masters(uint32_t k, uint64_t lo, uint64_t n, float* out);
  void write_device_masters(uint32_t k, uint64_t lo, uint64_t n, float* values);

  ValueParts parts_;
  const pstar_dtype compute_dtype_;
  const bool payloads_;
  const optim::MasterFormat master_format_;
  const chunk::ChunkLayout* layout_ = nullptr;  // null until attach
  uint64_t bytes_all_gathered_ = 0;
};

}  // namespace pstar::values
