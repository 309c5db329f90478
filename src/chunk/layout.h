// ChunkLayout: where every parameter lives in the chunk lists.
//
// Parameters are packed in registration order (the order the model first
// uses them), so the chunk a layer needs also holds its neighbours.  Every
// parameter starts at a multiple of kAlignElems elements: 256 bytes in the
// 2-byte compute dtypes, 512 in fp32, so aligned in every list.
//
// Trainable and frozen parameters are packed into separate chunks.  The
// compute-dtype list holds both kinds; the three fp32 optimizer lists (master,
// m, v) hold a twin of every trainable chunk only, with the same element
// offsets, so a chunk's Adam update is one flat loop over matching buffers
// and frozen parameters cost their compute copy alone (2 bytes each).
//
// A parameter larger than chunk_elems gets a "jumbo" chunk of its own,
// rounded up to kAlignElems, instead of failing.
//
// A layout may align to a multiple of kAlignElems instead (align_elems):
// the int8 optimizer state format quantizes each parameter in blocks from
// its first element, so its parameters start on block boundaries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pstar::chunk {

// Alignment of every parameter inside its chunk, in elements.
constexpr uint64_t kAlignElems = 128;

inline uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

struct ParamPlacement {
  uint32_t chunk = 0;         // index into ChunkLayout::chunks()
  uint64_t offset_elems = 0;  // multiple of the layout's alignment
  uint64_t numel = 0;
};

struct ChunkInfo {
  uint64_t capacity_elems = 0;  // chunk_elems, or the jumbo size
  uint64_t used_elems = 0;      // end of the last parameter
  bool frozen = false;          // holds frozen parameters only
  bool jumbo = false;
  // Index among trainable chunks (its optimizer twins), or -1 when frozen.
  int64_t optimizer_index = -1;
  std::vector<uint32_t> params;  // ids, in offset order
};

class ChunkLayout {
 public:
  // numels[i] and frozen[i] describe parameter i; chunk_elems > 0, a
  // multiple of align_elems, itself a multiple of kAlignElems.
  ChunkLayout(const std::vector<uint64_t>& numels, const std::vector<bool>& frozen, uint64_t chunk_elems,
              uint64_t align_elems = kAlignElems);

  uint64_t chunk_elems() const { return chunk_elems_; }
  uint64_t align_elems() const { return align_elems_; }
  const std::vector<ChunkInfo>& chunks() const { return chunks_; }
  const ParamPlacement& param(uint32_t id) const { return params_[id]; }
  size_t param_count() const { return params_.size(); }
  uint32_t optimizer_chunk_count() const { return optimizer_chunks_; }
  uint32_t jumbo_chunk_count() const;

  // Elements of all chunks' capacity, of all chunks or trainable ones only.
  uint64_t total_capacity_elems() const;
  uint64_t trainable_capacity_elems() const;
  // Sum of parameter element counts over total capacity (0..1).
  double fill_ratio() const;

 private:
  uint64_t chunk_elems_;
  uint64_t align_elems_;
  std::vector<ChunkInfo> chunks_;
  std::vector<ParamPlacement> params_;
  uint32_t optimizer_chunks_ = 0;
};

}  // namespace pstar::chunk
