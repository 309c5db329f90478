// DropRule (drop_rule.h): the counts and the rule.
#include "distributed/drop_rule.h"

#include <algorithm>

namespace pstar::distributed {

void DropRule::build(const std::vector<uint32_t>& params_per_chunk, size_t param_count) {
  chunks_.assign(params_per_chunk.size(), ChunkCounts{});
  for (size_t k = 0; k < params_per_chunk.size(); ++k) {
    chunks_[k].params = params_per_chunk[k];
    chunks_[k].unreleased[0] = chunks_[k].unreleased[1] = params_per_chunk[k];
  }
  released_in_.assign(param_count, 0);
}

void DropRule::iteration_begin() {
  std::fill(released_in_.begin(), released_in_.end(), uint8_t{0});
  for (ChunkCounts& c : chunks_) c.unreleased[0] = c.unreleased[1] = c.params;
}

void DropRule::close_backward() {
  for (ChunkCounts& c : chunks_) c.backward_open = 0;
}

DropRule::Action DropRule::apply(uint32_t id, uint32_t k, pstar_stage stage, uint32_t compute_refs) {
  ChunkCounts& c = chunks_[k];
  if (stage == PSTAR_STAGE_BACKWARD) {
    if (compute_refs != 0 || c.backward_open != 0) return Action::kKeep;
    return c.gradients_pending != 0 ? Action::kReduceThenDrop : Action::kDrop;
  }
  const int b = stage == PSTAR_STAGE_RECOMPUTE ? 1 : 0;
  const auto bit = static_cast<uint8_t>(1u << b);
  if ((released_in_[id] & bit) == 0) {
    released_in_[id] |= bit;
    --c.unreleased[b];
  }
  return compute_refs == 0 && c.unreleased[b] == 0 ? Action::kDrop : Action::kKeep;
}

}  // namespace pstar::distributed
