// OptPolicy: Belady's OPT eviction from the warm-up trace.
//
// Each resident chunk is keyed by the moment of its next use (from
// AccessTrace::next_use); the victim is the movable chunk used furthest in
// the future.  An ordered set gives O(log n) per access and per eviction;
// re-keying moves the set's node (extract and reinsert) instead of
// allocating, since it runs on every acquire.  With chunks of equal size OPT
// moves the fewest bytes of any policy that fetches on demand; jumbo chunks
// make it a heuristic.
#pragma once

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

namespace pstar::placement {

class OptPolicy {
 public:
  // Sets the next use of resident `chunk` (inserting it if absent).
  void touch(uint32_t chunk, uint64_t next_use) {
    if (chunk >= key_.size()) key_.resize(chunk + 1, kAbsent);
    if (key_[chunk] != kAbsent) {
      auto node = order_.extract({key_[chunk], chunk});
      node.value() = {next_use, chunk};
      order_.insert(std::move(node));
    } else {
      order_.emplace(next_use, chunk);
    }
    key_[chunk] = next_use;
  }

  void remove(uint32_t chunk) {
    if (chunk < key_.size() && key_[chunk] != kAbsent) {
      order_.erase({key_[chunk], chunk});
      key_[chunk] = kAbsent;
    }
  }

  void clear() {
    order_.clear();
    key_.assign(key_.size(), kAbsent);
  }

  // The movable chunk whose next use is furthest away; false if none.
  template <class Movable>
  bool victim(Movable&& movable, uint32_t* out) const {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      if (movable(it->second)) {
        *out = it->second;
        return true;
      }
    }
    return false;
  }

  size_t size() const { return order_.size(); }

 private:
  // Key value of a chunk not in the set.  Real keys never reach it: they
  // are moments (or AccessTrace::kNever - 1 at most, see the engine).
  static constexpr uint64_t kAbsent = UINT64_MAX;

  std::set<std::pair<uint64_t, uint32_t>> order_;  // (next use, chunk)
  std::vector<uint64_t> key_;                      // per chunk, or kAbsent
};

}  // namespace pstar::placement
