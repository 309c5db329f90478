// The build's layout agreement (layout_agreement.h).
#include "distributed/layout_agreement.h"

#include "util/error.h"

namespace pstar::distributed {

void LayoutHash::add_param(const std::string& name, const std::vector<int64_t>& shape, uint32_t flags, uint64_t numel) {
  mix(name.c_str(), name.size() + 1);
  add(shape.size());
  for (int64_t e : shape) add(static_cast<uint64_t>(e));
  add(flags);
  ++params_;
  elements_ += numel;
}

void check_layout_agrees(ProcessGroup& group, const LayoutHash& mine, const SlotNeed& slots) {
  const uint64_t own[4] = {mine.hash(), mine.params(), mine.elements(), slots.fits ? 1u : 0u};
  const size_t world = static_cast<size_t>(group.world());
  std::vector<uint64_t> all(4 * world);
  group.all_gather_host("engine_build: layout check", CollectiveKind::kLayout, 0, own, all.data(), sizeof own);
  std::string short_ranks;
  for (size_t r = 0; r < world; ++r) {
    if (all[4 * r + 3] == 0) short_ranks += (short_ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  for (size_t r = 1; r < world; ++r) {
    const uint64_t* o = &all[4 * r];
    if (o[0] == all[0]) continue;
    throw Error(PSTAR_ERR_INVALID_ARGUMENT,
                "engine_build: the ranks' models differ: rank 0 registered " + std::to_string(all[1]) +
                    " parameters of " + std::to_string(all[2]) + " elements, rank " + std::to_string(r) + " " +
                    std::to_string(o[1]) + " of " + std::to_string(o[2]) +
                    (o[1] == all[1] && o[2] == all[2]
                         ? " but with other names, shapes, flags or order, or another chunk_elems, compute_dtype, "
                           "grad_accumulation or gather-ahead depth"
                         : "") +
                    "; every rank must register the same parameters in the same order with the same options");
  }
  if (!short_ranks.empty()) {
    throw Error(PSTAR_ERR_OUT_OF_MEMORY,
                "engine_build: gathering " + std::to_string(slots.depth) + " chunks ahead needs " +
                    std::to_string(slots.depth) + " device slots of " + std::to_string(slots.slot_bytes) +
                    " bytes, more than the free device capacity of rank(s) " + short_ranks +
                    "; lower the depth (pstar_x_engine_set_gather_ahead) or raise device_capacity_bytes");
  }
}

}  // namespace pstar::distributed
