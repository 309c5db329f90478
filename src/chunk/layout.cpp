#include "chunk/layout.h"

#include "util/error.h"

namespace pstar::chunk {

ChunkLayout::ChunkLayout(const std::vector<uint64_t>& numels, const std::vector<bool>& frozen, uint64_t chunk_elems,
                         uint64_t align_elems)
    : chunk_elems_(chunk_elems), align_elems_(align_elems), params_(numels.size()) {
  require(align_elems > 0 && align_elems % kAlignElems == 0, PSTAR_ERR_INTERNAL,
          "layout: the alignment must be a multiple of kAlignElems");
  require(chunk_elems > 0 && chunk_elems % align_elems == 0, PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return "chunk_elems must be a positive multiple of " + std::to_string(align_elems); });
  require(numels.size() == frozen.size(), PSTAR_ERR_INTERNAL, "layout: numels and frozen differ in size");
  // The chunk currently being filled, per kind (0 trainable, 1 frozen).
  int64_t open[2] = {-1, -1};
  auto new_chunk = [&](bool is_frozen, uint64_t capacity, bool jumbo) {
    ChunkInfo c;
    c.capacity_elems = capacity;
    c.frozen = is_frozen;
    c.jumbo = jumbo;
    if (!is_frozen) c.optimizer_index = optimizer_chunks_++;
    chunks_.push_back(std::move(c));
    return static_cast<uint32_t>(chunks_.size() - 1);
  };
  for (uint32_t id = 0; id < numels.size(); ++id) {
    const uint64_t n = numels[id];
    const int kind = frozen[id] ? 1 : 0;
    ParamPlacement& p = params_[id];
    p.numel = n;
    if (n > chunk_elems) {
      p.chunk = new_chunk(frozen[id], align_up(n, align_elems), true);
      p.offset_elems = 0;
    } else {
      if (open[kind] >= 0) {
        const ChunkInfo& c = chunks_[open[kind]];
        if (align_up(c.used_elems, align_elems) + n > c.capacity_elems) open[kind] = -1;
      }
      if (open[kind] < 0) open[kind] = new_chunk(frozen[id], chunk_elems, false);
      p.chunk = static_cast<uint32_t>(open[kind]);
      p.offset_elems = align_up(chunks_[p.chunk].used_elems, align_elems);
    }
    ChunkInfo& c = chunks_[p.chunk];
    c.used_elems = p.offset_elems + n;
    c.params.push_back(id);
  }
}

uint32_t ChunkLayout::jumbo_chunk_count() const {
  uint32_t k = 0;
  for (const auto& c : chunks_) k += c.jumbo ? 1 : 0;
  return k;
}

uint64_t ChunkLayout::total_capacity_elems() const {
  uint64_t t = 0;
  for (const auto& c : chunks_) t += c.capacity_elems;
  return t;
}

uint64_t ChunkLayout::trainable_capacity_elems() const {
  uint64_t t = 0;
  for (const auto& c : chunks_) t += c.frozen ? 0 : c.capacity_elems;
  return t;
}

double ChunkLayout::fill_ratio() const {
  uint64_t used = 0;
  for (const auto& p : params_) used += p.numel;
  const uint64_t cap = total_capacity_elems();
  return cap == 0 ? 0.0 : static_cast<double>(used) / static_cast<double>(cap);
}

}  // namespace pstar::chunk
