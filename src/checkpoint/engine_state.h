// The checkpoint sequences (docs/checkpoints.md): saving, the all-or-nothing
// load, the safetensors export, and EngineState, what they see of an engine.
//
// This module owns the order of a save and of a load: which values go to
// which file, when the ranks of a sharded engine agree (an all-gather of a
// few bytes), what a load checks before it writes anything, and how a load
// that fails part way is reported.  It must not know how the engine stores
// its state (chunks, shards, tiers, the NVMe tier's staging, device copies
// of the optimizer lists): EngineState reads and writes one parameter's
// values and lists, and the engine implements it over its chunks.  Plain
// values cross the interface, never an Engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "pstar/pstar.h"

namespace pstar::checkpoint {

// A registered parameter, as a checkpoint describes it.
struct ParamView {
  const std::string& name;
  const std::vector<int64_t>& shape;
  uint64_t numel;
  bool frozen;
  float lr_scale;
  bool weight_decay;
  bool pinned;  // its master is exported (pstar_param_pin): a load is refused
};

// The elements [start, start + count) of a parameter that one rank holds.
struct Part {
  uint64_t start = 0, count = 0;
};

// An engine, built, with values, between iterations.  Lists are numbered as
// the list files (manifest.h kListFiles): 0 masters, 1 Adam's m, 2 Adam's
// v, 3 a frozen parameter's values (its compute copy, as fp32).
class EngineState {
 public:
  virtual uint32_t param_count() const = 0;
  virtual ParamView param(uint32_t id) const = 0;

  // The group: a sharded engine holds part of every chunk; world() ranks
  // (one, sharded, is a group of one).
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual bool sharded() const = 0;
  // What rank `rank` holds of parameter `id`: all of it in one process;
  // in a sharded engine the elements in that rank's shard of its chunk
  // (count 0: none).  A function of the layout, so every rank knows every
  // rank's part.
  virtual Part part(uint32_t id, int rank) const = 0;
  // All-gather of `bytes` host bytes from every rank (sharded only): rank
  // r's into all + r * bytes.
  virtual void all_gather(const void* mine, void* all, size_t bytes) = 0;

  // This rank's part (part(id, rank())) of list `list` of parameter `id`.
  virtual void read_list(uint32_t id, int list, float* out) = 0;
  // The fp32 values of the whole parameter (masters; a frozen one's from
  // its compute copy): numel floats, in any engine.
  virtual void read_values(uint32_t id, float* out) = 0;
  // From `whole` (numel floats of the whole parameter), what this engine
  // holds of list `list`: 0 or 3 the values (masters and compute copies),
  // 1 or 2 Adam's m or v.
  virtual void write_list(uint32_t id, int list, const float* whole) = 0;
  virtual void set_param_group(uint32_t id, float lr_scale, bool weight_decay) = 0;
  // A load rewrites every state between these two (the NVMe tier's slots
  // start from zeros, and are trusted again after an I/O error).
  virtual void begin_rewrite() = 0;
  virtual void end_rewrite() = 0;

  // The scalars a checkpoint saves and restores: the step count,
  // hyperparameters and loss scaler, and the compute layout's.
  virtual optim::Optimizer& optimizer() = 0;
  virtual pstar_dtype compute_dtype() const = 0;
  virtual uint64_t chunk_elems() const = 0;
  // Adam's moments' format: "fp32", "bf16" or "int8" (Settings).
  virtual const char* state_format() const = 0;
  // The masters' format: "fp32" or "bf16" (Settings).
  virtual const char* master_format() const = 0;

 protected:
  ~EngineState() = default;
};

// Saves a new checkpoint under `dir` and returns its name (the
// subdirectory LATEST names now).  Every rank of a sharded engine calls it;
// all return the same status, and a failure anywhere leaves the previous
// checkpoint current.
std::string save(EngineState& s, const std::string& dir);

// Loads dir/LATEST, all or nothing: every check first, with nothing written;
// a sharded engine's ranks agree before any writes.  A failure once writing
// has begun cannot be undone: `incomplete` then says why (and stays so
// until a load completes), and the caller refuses training meanwhile.
void load(EngineState& s, const std::string& dir, std::string& incomplete);

// Every parameter's fp32 values as safetensors at `path` (safetensors.h).
void export_safetensors(EngineState& s, const std::string& path);

}  // namespace pstar::checkpoint
