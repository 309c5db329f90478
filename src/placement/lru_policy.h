// LruPolicy: chooses which accelerator-resident chunk to evict.
//
// The resident chunks form an intrusive doubly-linked list in order of last
// use (head: least recently used).  touch() moves a chunk to the tail and
// remove() unlinks it, both O(1) without allocation (they run on every
// acquire); victim() walks from the head to the first chunk the caller says
// may move (no tensor in COMPUTE, no export pin), so it is O(1) unless the
// oldest chunks are in use.
#pragma once

#include <cstdint>
#include <vector>

namespace pstar::placement {

class LruPolicy {
 public:
  // Marks `chunk` resident and most recently used.
  void touch(uint32_t chunk) {
    grow(chunk);
    if (linked_[chunk]) {
      if (tail_ == chunk) return;
      unlink(chunk);
    }
    prev_[chunk] = tail_;
    next_[chunk] = kNone;
    if (tail_ != kNone) next_[tail_] = chunk;
    tail_ = chunk;
    if (head_ == kNone) head_ = chunk;
    linked_[chunk] = 1;
    ++size_;
  }

  // Forgets `chunk` (it left the accelerator).
  void remove(uint32_t chunk) {
    if (chunk < linked_.size() && linked_[chunk]) unlink(chunk);
  }

  // The least recently used chunk for which movable(chunk) holds; false if none.
  template <class Movable>
  bool victim(Movable&& movable, uint32_t* out) const {
    for (uint32_t c = head_; c != kNone; c = next_[c]) {
      if (movable(c)) {
        *out = c;
        return true;
      }
    }
    return false;
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;

  void grow(uint32_t chunk) {
    if (chunk >= linked_.size()) {
      prev_.resize(chunk + 1, kNone);
      next_.resize(chunk + 1, kNone);
      linked_.resize(chunk + 1, 0);
    }
  }

  void unlink(uint32_t c) {
    if (prev_[c] != kNone)
      next_[prev_[c]] = next_[c];
    else
      head_ = next_[c];
    if (next_[c] != kNone)
      prev_[next_[c]] = prev_[c];
    else
      tail_ = prev_[c];
    linked_[c] = 0;
    --size_;
  }

  std::vector<uint32_t> prev_, next_;  // links, valid while linked_[c]
  std::vector<uint8_t> linked_;        // 1 while the chunk is in the list
  uint32_t head_ = kNone, tail_ = kNone;
  size_t size_ = 0;  // invariant: number of linked chunks
};

}  // namespace pstar::placement
