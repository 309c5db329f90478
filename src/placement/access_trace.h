// AccessTrace: the chunk access sequence of one TRAIN iteration, recorded
// during warm-up (one entry per acquire: a "moment"), with what the OPT
// policy needs precomputed.
//
// Iterations are assumed to repeat: the use after the last one of a chunk in
// the trace is its first use in the next iteration.  So next_use(t) is the
// moment of the next access, after moment t, to the chunk accessed at t,
// counted on a timeline where iteration i's moment t is i * moments() + t.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace pstar::placement {

class AccessTrace {
 public:
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

  void clear() {
    chunks_.clear();
    transient_.clear();
    next_use_.clear();
    first_use_.clear();
  }

  // `transient_bytes`: accelerator bytes other than chunks at this moment
  // (non-model memory and gradient buffers).
  void record(uint32_t chunk, uint64_t transient_bytes) {
    chunks_.push_back(chunk);
    transient_.push_back(transient_bytes);
  }

  // Keeps the first `moments` entries only.
  void truncate(size_t moments) {
    if (moments < chunks_.size()) {
      chunks_.resize(moments);
      transient_.resize(moments);
    }
  }

  // Computes next_use() and first_use() over `chunk_count` chunks.
  void finalize(uint32_t chunk_count) {
    const size_t n = chunks_.size();
    first_use_.assign(chunk_count, kNever);
    for (size_t t = 0; t < n; ++t) {
      if (first_use_[chunks_[t]] == kNever) first_use_[chunks_[t]] = t;
    }
    std::vector<uint64_t> seen(chunk_count, kNever);
    next_use_.assign(n, kNever);
    for (size_t t = n; t-- > 0;) {
      const uint32_t c = chunks_[t];
      next_use_[t] = seen[c] != kNever ? seen[c] : n + first_use_[c];
      seen[c] = t;
    }
  }

  size_t moments() const { return chunks_.size(); }
  bool empty() const { return chunks_.empty(); }
  uint32_t chunk_at(size_t t) const { return chunks_[t]; }
  uint64_t transient_at(size_t t) const { return transient_[t]; }
  uint64_t next_use(size_t t) const { return next_use_[t]; }
  // First moment that accesses `chunk`, or kNever.
  uint64_t first_use(uint32_t chunk) const { return chunk < first_use_.size() ? first_use_[chunk] : kNever; }

 private:
  std::vector<uint32_t> chunks_;     // chunk accessed at each moment
  std::vector<uint64_t> transient_;  // non-chunk accelerator bytes at each moment
  std::vector<uint64_t> next_use_;   // see next_use()
  std::vector<uint64_t> first_use_;  // per chunk
};

}  // namespace pstar::placement
