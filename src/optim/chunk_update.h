// The Adam update of one chunk (or one rank's shard of it): the parameter
// spans it holds, each with its own constants (parameter groups), and the
// one loop that runs the kernel over them on the thread pool.  The
// one-process step, the sharded step and the device update of hybrid
// placement all build their spans here; the CPU ones run update_chunk().
//
// The split across threads is a pure function of the element count, the
// grain and the pool's size (ThreadPool::partition): blocks of whole
// grains, each updating the part of every span it overlaps.  Since the
// kernel is elementwise, the bits do not depend on the split either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optim/adam.h"
#include "optim/adam_kernel.h"
#include "optim/adam_states.h"
#include "pstar/pstar.h"
#include "util/thread_pool.h"

namespace pstar::optim {

// The C API's format as the kernels name it.
inline StateFormat state_format_of(pstar_state_format f) {
  switch (f) {
    case PSTAR_STATE_BF16: return StateFormat::kBf16;
    case PSTAR_STATE_INT8: return StateFormat::kInt8;
    default: return StateFormat::kFp32;
  }
}

// Elements per unit of the optimizer's split of a chunk across threads: a
// multiple of every vector width and of the 128-element parameter alignment.
constexpr size_t kAdamGrainElems = 1024;

// One parameter's elements [begin, end) in the coordinates of the lists
// (the chunk's, or the shard's), with the step's constants for it.
struct Segment {
  uint64_t begin, end;
  AdamStepConstants constants;
  uint64_t step = 0;  // the 1-based step count of the constants
  // The parameter (its index) and where its element 0 lies in chunk
  // coordinates: bf16 masters' rounding bits follow the element's place in
  // its parameter, which no layout, shard or placement changes.
  uint32_t param = 0;
  uint64_t param_start = 0;
};

// The buffers of one chunk's (or shard's) update, all indexed from the same
// element 0: the fp32 master (and gradient) lists, Adam's moments in the
// engine's state format, and the compute-dtype payload.
struct ChunkLists {
  float* master = nullptr;
  // The moment lists' storage in `format` (optim/adam_states.h:
  // moment_list_bytes(format, elems) bytes each; fp32 floats in kFp32).
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  const float* grad_f32 = nullptr;  // separate fp32 gradient list, or null
  void* slot = nullptr;             // the compute-dtype payload
  pstar_dtype dtype = PSTAR_DTYPE_BF16;
  // Out of place (AdamRange): the lists read, null to update master,
  // exp_avg and exp_avg_sq in place.
  const float* master_in = nullptr;
  const void* exp_avg_in = nullptr;
  const void* exp_avg_sq_in = nullptr;
  StateFormat format = StateFormat::kFp32;
  // Elements of each list (a chunk's or a shard's): where an int8 list's
  // block maxima begin.  Needed by the formats other than kFp32.
  uint64_t elems = 0;
  // bf16 masters (adam_masters.h): `master` and `master_in` point at bf16
  // lists; the stochastic rounding's bits come from master_seed and each
  // segment's step, parameter and element offsets (list element 0 lies at
  // `chunk_offset` in chunk coordinates: a shard's first element).
  MasterFormat master_format = MasterFormat::kFp32;
  uint64_t master_seed = 0;
  uint64_t chunk_offset = 0;

  // kFp32: the kernel's range for elements [lo, hi).
  AdamRange range(uint64_t lo, uint64_t hi) const;
  // Any format: the range [lo, hi), lo on a block boundary
  // (adam_states.h's contract), inside segment `sg` (whose step and
  // parameter bf16 masters need; may be null for other masters).
  AdamStateRange state_range(uint64_t lo, uint64_t hi, const Segment* sg = nullptr) const;
  // Whether adam_update() (range()) serves these lists.
  bool fp32_only() const { return format == StateFormat::kFp32 && master_format == MasterFormat::kFp32; }
};

// The segments of one chunk for one step: every parameter's constants come
// from the step's hyperparameters with the parameter's learning-rate scale
// and weight-decay choice.
class SegmentList {
 public:
  // `step`: the 1-based step count after this update; `grad_mul` folds the
  // unscale and the clipping coefficient.
  SegmentList(const AdamHyper& hyper, uint64_t step, double grad_mul)
      : hyper_(hyper), step_(step), grad_mul_(grad_mul) {}

  void clear() { segments_.clear(); }
  // `param` and `param_start`: Segment's.
  void add(uint64_t begin, uint64_t end, float lr_scale, bool weight_decay, uint32_t param = 0,
           uint64_t param_start = 0);
  bool empty() const { return segments_.empty(); }
  const std::vector<Segment>& segments() const { return segments_; }

 private:
  AdamHyper hyper_;
  uint64_t step_;
  double grad_mul_;
  std::vector<Segment> segments_;
};

// Updates elements [0, elems) of `lists` where the segments cover them: one
// parallel pass on `pool`, split into blocks of whole kAdamGrainElems
// grains, each block running the update of the lists' format with `isa`
// on the part of every segment it overlaps.  A grain is a whole number of
// int8 blocks, and the layout starts every parameter on a block boundary
// in that format, so every range starts on one.
void update_chunk(ThreadPool& pool, AdamIsa isa, uint64_t elems, const std::vector<Segment>& segments,
                  const ChunkLists& lists);

}  // namespace pstar::optim
