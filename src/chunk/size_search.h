// The chunk size of a model, when the options leave it to the engine
// (PSTAR_CHUNK_ELEMS_AUTO).
//
// Why: a fixed size wastes the tail of every chunk that the next parameter
// does not fit.  A 5.3M-parameter GPT-2 in chunks of 2^22 elements fills
// 63% of them: every chunk copy, on every step, moves 37% padding, and the
// first chunk the next forward needs is larger than it has to be.  PatrickStar
// and Colossal-AI's Gemini search the size for the same reason (best
// utilisation over a range of sizes).
//
// How: the candidates are the lengths of runs of consecutive parameters
// (aligned, in registration order: the packing order of ChunkLayout), since
// a chunk that ends exactly at a parameter's end wastes nothing, plus both
// ends of the range.  Each candidate is laid out with ChunkLayout itself
// (no second model of the packing), and the one of least cost wins: the
// capacity of its chunks, a trainable chunk's element counted
// kTrainableWeight times (its fp32 master and moments beside the compute
// copy).  Candidates within kTieFraction of the least cost count as ties,
// and the smallest of those wins (finer placement, an earlier first
// chunk).
//
// The range: at most max(ceiling_elems, the largest parameter), so that a
// chunk is never larger than the fixed default would make it, nor a
// parameter jumbo that was not; at least a quarter of that (or the largest
// parameter), so that a model of small parameters does not become
// thousands of small chunks, unless all of one kind of parameters fits in
// less (a small model: one chunk of each kind, of the larger kind's size).
//
// Why the candidates hold a size of least capacity: take any size c in the
// range and its packing.  Each chunk holds a run of consecutive parameters
// of its kind and needs the run's aligned length; the largest need R <= c
// packs the same way (every run still fits, every parameter that did not
// fit the next chunk still does not, every jumbo parameter stays jumbo),
// at no more capacity.  R is a run length, or below the range, where the
// range's low end packs the same way too.  (Past kMaxRunLengths runs the
// first parameters are sampled, and a size of least cost may be missed.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pstar::chunk {

// Run lengths gathered at most (about): bounds the enumeration for a
// model of many small parameters.
constexpr uint64_t kMaxRunLengths = uint64_t{1} << 20;

// Candidate sizes laid out at most (evenly spaced in sorted order above
// it): bounds the search to kMaxCandidates layouts of the model.
constexpr size_t kMaxCandidates = 512;

// Costs within this fraction of the least tie.
constexpr double kTieFraction = 0.005;

// What an element of a trainable chunk costs over one of a frozen chunk:
// 14 bytes (a bf16 compute copy, fp32 master, m and v) over 2.
constexpr uint64_t kTrainableWeight = 7;

class ChunkLayout;
// The search's cost of a layout: frozen capacity + kTrainableWeight x
// trainable capacity, in elements.
uint64_t search_cost(const ChunkLayout& layout);

// The range searched (both ends multiples of align_elems, lo <= hi).
struct SearchRange {
  uint64_t lo = 0;
  uint64_t hi = 0;
};
SearchRange search_range(const std::vector<uint64_t>& numels, const std::vector<bool>& frozen, uint64_t align_elems,
                         uint64_t ceiling_elems);

// The chunk size for parameters of `numels` elements (frozen[i]: packed
// apart, as ChunkLayout does), a multiple of align_elems (itself a
// multiple of kAlignElems); ceiling_elems as above.  Depends on its
// arguments alone, so every rank of a group computes the same size.
uint64_t search_chunk_elems(const std::vector<uint64_t>& numels, const std::vector<bool>& frozen, uint64_t align_elems,
                            uint64_t ceiling_elems);

}  // namespace pstar::chunk
