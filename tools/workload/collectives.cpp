// Predicted collectives of a sharded rank (collectives.h).
#include "collectives.h"

#include <vector>

#include "chunk_packing.h"

namespace pstar::workload {

CollectiveBytes predict_collectives(const Workload& w, uint64_t chunk_elems, uint32_t world) {
  CollectiveBytes out;
  if (world <= 1) return out;
  const ChunkPacking packing = pack_chunks(w, chunk_elems, world);
  const std::vector<uint32_t>& chunk_of = packing.chunk_of;
  const std::vector<uint64_t>& elems = packing.elems;
  const std::vector<uint32_t>& params_in = packing.params_in;
  const size_t chunks = elems.size();
  const uint64_t dtype = w.shape.dtype_bytes;
  // The drop rule's counts (dist/drop_rule.h), from an iteration's start.
  std::vector<bool> gathered(chunks, false);
  std::vector<uint32_t> refs(chunks, 0), open_backward(chunks, 0);
  std::vector<uint32_t> unreleased_fwd(params_in), unreleased_rec(params_in);
  std::vector<uint8_t> released(w.params.size(), 0);  // bit 0 FORWARD, bit 1 RECOMPUTE
  std::vector<uint32_t> fwd_uses(w.params.size(), 0), bwd_uses(w.params.size(), 0);
  std::vector<bool> pending(chunks, false);
  for (const Use& u : w.schedule) {
    for (uint32_t p : u.params) {
      const uint32_t k = chunk_of[p];
      if (!gathered[k]) {
        gathered[k] = true;
        out.all_gathered += elems[k] * dtype;
        ++out.gathers;
      }
      ++refs[k];
      const bool was_open = bwd_uses[p] != fwd_uses[p];
      if (u.stage == Stage::Forward) ++fwd_uses[p];
      if (u.stage == Stage::Backward) ++bwd_uses[p];
      const bool now_open = bwd_uses[p] != fwd_uses[p];
      if (was_open != now_open) open_backward[k] += now_open ? 1 : uint32_t(-1);
      if (u.stage == Stage::Backward && u.grad_write && !now_open) pending[k] = true;
    }
    for (uint32_t p : u.params) {
      const uint32_t k = chunk_of[p];
      --refs[k];
      bool drop = false;
      if (u.stage == Stage::Backward) {
        drop = refs[k] == 0 && open_backward[k] == 0;
        if (drop && pending[k]) {
          out.reduce_scattered += elems[k] * sizeof(float);
          ++out.reductions;
          pending[k] = false;
        }
      } else {
        const uint8_t bit = u.stage == Stage::Recompute ? 2 : 1;
        std::vector<uint32_t>& unreleased = u.stage == Stage::Recompute ? unreleased_rec : unreleased_fwd;
        if ((released[p] & bit) == 0) {
          released[p] |= bit;
          --unreleased[k];
        }
        drop = refs[k] == 0 && unreleased[k] == 0;
      }
      if (drop) gathered[k] = false;
    }
  }
  // Chunks whose gradients are still pending are reduce-scattered at the
  // step.
  for (size_t k = 0; k < chunks; ++k) {
    if (pending[k]) {
      out.reduce_scattered += elems[k] * sizeof(float);
      ++out.reductions;
    }
  }
  return out;
}

}  // namespace pstar::workload
