// LruPolicy: chooses which accelerator-resident chunk to evict.
//
// Each resident chunk carries the tick of its last use; the victim is the
// least recently used chunk among those the caller says may move (no tensor
// in COMPUTE, no export pin).  Ordered set: O(log n) per touch and per
// eviction when the oldest chunks are movable.  The placement issue adds OPT
// (Belady) from the warm-up trace behind the same calls.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <unordered_map>
#include <utility>

namespace pstar::placement {

class LruPolicy {
 public:
  // Marks `chunk` resident and used at `tick` (ticks increase).
  void touch(uint32_t chunk, uint64_t tick) {
    remove(chunk);
    order_.emplace(tick, chunk);
    tick_of_[chunk] = tick;
  }

  // Forgets `chunk` (it left the accelerator).
  void remove(uint32_t chunk) {
    auto it = tick_of_.find(chunk);
    if (it == tick_of_.end()) return;
    order_.erase({it->second, chunk});
    tick_of_.erase(it);
  }

  // The least recently used chunk for which movable(chunk) holds; false if none.
  bool victim(const std::function<bool(uint32_t)>& movable, uint32_t* out) const {
    for (const auto& [tick, chunk] : order_) {
      if (movable(chunk)) {
        *out = chunk;
        return true;
      }
    }
    return false;
  }

  size_t size() const { return order_.size(); }

 private:
  std::set<std::pair<uint64_t, uint32_t>> order_;  // (last-use tick, chunk)
  std::unordered_map<uint32_t, uint64_t> tick_of_;
};

}  // namespace pstar::placement
