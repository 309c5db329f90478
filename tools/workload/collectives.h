// The collectives a ZeRO-sharded rank issues in one TRAIN iteration of a
// workload, predicted from the engine's rules without running it (a
// sharded engine has no dry run): the chunk layout of N ranks
// (chunk_packing.h) and the drop rule (dist/drop_rule.h: a chunk is
// all-gathered at a use that finds it dropped, dropped once every one of its
// parameters was released in that FORWARD or RECOMPUTE stage, or in
// BACKWARD once all its gradients are final, which also reduce-scatters
// them).  Assumes no gathered chunk is evicted (an unlimited device): an
// eviction would replace a later all-gather by a fetch from the host.
#pragma once

#include <cstdint>

#include "gpt_workload.h"

namespace pstar::workload {

struct CollectiveBytes {
  // The engine's counters for one iteration (pstar_stats'
  // bytes_all_gathered and bytes_reduce_scattered): the full chunk's bytes
  // per all-gather (compute dtype) and per reduce-scatter (fp32).
  uint64_t all_gathered = 0;
  uint64_t reduce_scattered = 0;
  uint32_t gathers = 0;
  uint32_t reductions = 0;
  // What one rank sends (and receives) over its link for them in a ring:
  // (N - 1) / N of each.
  double link_bytes(uint32_t world) const {
    return world <= 1 ? 0.0 : double(all_gathered + reduce_scattered) * double(world - 1) / double(world);
  }
};

CollectiveBytes predict_collectives(const Workload& w, uint64_t chunk_elems, uint32_t world);

}  // namespace pstar::workload
