// OptPolicy: Belady's OPT eviction from the warm-up trace.
//
// Each resident chunk is keyed by the moment of its next use (from
// AccessTrace::next_use); the victim is the movable chunk used furthest in
// the future.  With chunks of equal size OPT moves the fewest bytes of any
// policy that fetches on demand; jumbo chunks make it a heuristic.
//
// Keys are moments below a limit set by reset() (twice the trace length: a
// next use lies at most one iteration ahead), and no two resident chunks
// share one (a moment accesses one chunk), so a key indexes a two-level
// bitset and an owner table: touch() and remove() are O(1) without
// allocation (they run on every acquire), and victim() finds the highest
// set key with one scan of the summary word level, O(limit / 4096).  Chunks
// never used by the trace share kNeverKey; they are kept apart and are
// evicted first.  A key that is out of range or already taken (only possible
// with a trace that does not describe the chunk set) is treated as never.
#pragma once

#include <cstdint>
#include <vector>

namespace pstar::placement {

class OptPolicy {
 public:
  static constexpr uint64_t kNeverKey = UINT64_MAX - 1;
  static constexpr uint64_t kAbsent = UINT64_MAX;

  // Forgets every chunk; keys from now on are below `key_limit`.
  void reset(uint64_t key_limit) {
    bits_.assign((key_limit + 63) / 64, 0);
    summary_.assign((bits_.size() + 63) / 64, 0);
    owner_.assign(key_limit, 0);
    for (auto& k : key_) k = kAbsent;
    never_.clear();
    size_ = 0;
  }

  void clear() { reset(owner_.size()); }

  // Sets the next use of resident `chunk` (inserting it if absent).
  void touch(uint32_t chunk, uint64_t next_use) {
    if (chunk >= key_.size()) {
      key_.resize(chunk + 1, kAbsent);
      never_pos_.resize(chunk + 1, 0);
    }
    remove(chunk);
    if (next_use >= owner_.size() || test(next_use)) next_use = kNeverKey;
    key_[chunk] = next_use;
    ++size_;
    if (next_use == kNeverKey) {
      never_pos_[chunk] = static_cast<uint32_t>(never_.size());
      never_.push_back(chunk);
      return;
    }
    owner_[next_use] = chunk;
    bits_[next_use / 64] |= uint64_t{1} << (next_use % 64);
    summary_[next_use / 4096] |= uint64_t{1} << ((next_use / 64) % 64);
  }

  void remove(uint32_t chunk) {
    if (chunk >= key_.size() || key_[chunk] == kAbsent) return;
    const uint64_t k = key_[chunk];
    key_[chunk] = kAbsent;
    --size_;
    if (k == kNeverKey) {
      const uint32_t pos = never_pos_[chunk];
      never_[pos] = never_.back();
      never_pos_[never_[pos]] = pos;
      never_.pop_back();
      return;
    }
    bits_[k / 64] &= ~(uint64_t{1} << (k % 64));
    if (bits_[k / 64] == 0) summary_[k / 4096] &= ~(uint64_t{1} << ((k / 64) % 64));
  }

  // The movable chunk whose next use is furthest away; false if none.
  // The chunk's key (its next use), kNeverKey, or kAbsent if not resident.
  uint64_t key(uint32_t chunk) const { return chunk < key_.size() ? key_[chunk] : kAbsent; }

  template <class Movable>
  bool victim(Movable&& movable, uint32_t* out) const {
    for (uint32_t c : never_) {
      if (movable(c)) {
        *out = c;
        return true;
      }
    }
    for (size_t s = summary_.size(); s-- > 0;) {
      for (uint64_t sw = summary_[s]; sw != 0;) {
        const int sb = 63 - __builtin_clzll(sw);
        sw &= ~(uint64_t{1} << sb);
        const size_t w = s * 64 + static_cast<size_t>(sb);
        for (uint64_t bw = bits_[w]; bw != 0;) {
          const int b = 63 - __builtin_clzll(bw);
          bw &= ~(uint64_t{1} << b);
          const uint32_t c = owner_[w * 64 + static_cast<size_t>(b)];
          if (movable(c)) {
            *out = c;
            return true;
          }
        }
      }
    }
    return false;
  }

  size_t size() const { return size_; }

 private:
  bool test(uint64_t k) const { return (bits_[k / 64] >> (k % 64)) & 1u; }

  std::vector<uint64_t> bits_;       // bit k: some chunk is keyed k
  std::vector<uint64_t> summary_;    // bit w: bits_[w] != 0
  std::vector<uint32_t> owner_;      // chunk keyed k, valid where bit k is set
  std::vector<uint64_t> key_;        // per chunk: its key, or kAbsent
  std::vector<uint32_t> never_;      // chunks keyed kNeverKey
  std::vector<uint32_t> never_pos_;  // index in never_, valid while keyed kNeverKey
  size_t size_ = 0;                  // resident chunks keyed
};

}  // namespace pstar::placement
