// The engine's glue to its NVMe tier (memory/nvme_tier.h; experimental API
// pstar_x_engine_set_nvme; docs/nvme.md): the checks that need the engine,
// and the chunk lists the tier places and points at its staging buffers.
#include "engine/engine.h"

#include "step/optimizer_step.h"

namespace pstar::engine {

void Engine::set_nvme(const pstar_x_nvme_options& in) {
  require(!built(), PSTAR_ERR_INVALID_STATE,
          "set_nvme: the engine is built; give it an NVMe tier before pstar_engine_build");
  nvme_.validate(in, payloads_);
  require(!options_.hybrid_optimizer, PSTAR_ERR_UNSUPPORTED, "set_nvme: not available with hybrid optimizer placement");
  nvme_.open(in, payloads_, device_.get(), host_.get(), [this](uint32_t k, float* m, float* a, float* v) {
    ChunkState& c = chunks_[k];
    c.master = m;
    c.exp_avg = a;
    c.exp_avg_sq = v;
  });
}

void Engine::nvme_place_lists(std::vector<ChunkState>& chunks, uint64_t largest_trainable_elems) {
  // With world > 1 this rank's shards of the lists.
  std::vector<uint64_t> fp32_elems(chunks.size(), 0);
  for (uint32_t k = 0; k < chunks.size(); ++k) {
    const auto& info = layout_->chunks()[k];
    if (!info.frozen) fp32_elems[k] = chunks[k].shard_elems;
  }
  const optim::StateFormat format = state_format();
  auto moment_bytes = [format](uint64_t elems) { return optim::moment_list_bytes(format, elems); };
  const optim::MasterFormat masters = master_format();
  auto master_bytes = [masters](uint64_t elems) { return optim::master_list_bytes(masters, elems); };
  nvme_.place(
      fp32_elems, largest_trainable_elems, moment_bytes,
      [&chunks](uint32_t k, float* m, float* a, float* v) {
        ChunkState& c = chunks[k];
        c.master = m;
        c.exp_avg = a;
        c.exp_avg_sq = v;
      },
      master_bytes);
}

void Engine::fill_nvme_stats(pstar_x_nvme_stats* out) const {
  step_->wait_noexcept();
  nvme_.fill_stats(out);
}

}  // namespace pstar::engine
