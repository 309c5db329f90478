// The build's layout agreement (docs/distributed.md): every rank of a
// sharded engine must register the same parameters in the same order with
// the options that shape the layout, or the ranks' shards would not line
// up.  Each rank hashes what it registered (LayoutHash); one all-gather
// compares the hashes, the parameter and element counts, and whether each
// rank's device holds the gather-ahead slots, so that every rank fails the
// build with the same message, not only the one that differs or is short.
//
// It knows parameters only as the names, shapes, flags and sizes it is
// given; the engine builds the hash.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace pstar::distributed {

// FNV-1a over the settings and parameters, in the order given.
class LayoutHash {
 public:
  void add(uint64_t setting) { mix(&setting, sizeof setting); }
  void add_param(const std::string& name, const std::vector<int64_t>& shape, uint32_t flags, uint64_t numel);
  uint64_t hash() const { return hash_; }
  uint64_t params() const { return params_; }
  uint64_t elements() const { return elements_; }

 private:
  void mix(const void* data, size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) hash_ = (hash_ ^ b[i]) * 0x100000001B3ull;
  }
  uint64_t hash_ = 0xcbf29ce484222325ull;
  uint64_t params_ = 0, elements_ = 0;
};

// What the agreement also checks: the gather-ahead slots (`depth` slots of
// `slot_bytes`) and whether they fit this rank's free device capacity.
struct SlotNeed {
  uint32_t depth = 0;
  uint64_t slot_bytes = 0;
  bool fits = true;
};

// The collective: throws PSTAR_ERR_INVALID_ARGUMENT on every rank when
// the ranks' layouts differ, PSTAR_ERR_OUT_OF_MEMORY when some rank cannot
// hold the slots (naming those ranks), PSTAR_ERR_COMM when the exchange
// fails.
void check_layout_agrees(ProcessGroup& group, const LayoutHash& mine, const SlotNeed& slots);

}  // namespace pstar::distributed
