// pstar-plan --min-capacity: the device floor of known model shapes
// (GPT-2 small and medium, ViT-B/16 and ViT-L/16), the smallest device
// capacity at which the engine's default configuration trains each, by
// bisection over dry runs.  A mode of its own: it shares only the dtype,
// --json and --verbose with the planner's report.
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan.h"

namespace pstar::plan {

namespace {

struct FloorShape {
  const char* model;
  GptShape shape;
  const char* source;
};

std::vector<FloorShape> floor_shapes(uint32_t dtype_bytes) {
  using pstar::workload::ModelKind;
  auto gpt = [&](uint32_t layers, uint32_t hidden, uint32_t heads) {
    GptShape g;
    g.layers = layers;
    g.hidden = hidden;
    g.heads = heads;
    g.vocab = 50257;
    g.seq = 1024;
    g.batch = 1;
    g.dtype_bytes = dtype_bytes;
    return g;
  };
  auto vit = [&](uint32_t layers, uint32_t hidden, uint32_t heads) {
    GptShape g = gpt(layers, hidden, heads);
    g.kind = ModelKind::kVit;
    g.vocab = 0;
    g.seq = 14 * 14 + 1;  // 224 x 224 images in 16 x 16 patches, and the class token
    g.patch = 16;
    g.channels = 3;
    g.classes = 1000;
    return g;
  };
  return {{"gpt2-small", gpt(12, 768, 12), "transformers GPT2Config defaults (tied 50257 x 768 wte, 1024 positions)"},
          {"gpt2-medium", gpt(24, 1024, 16), "GPT-2 medium (Radford et al. 2019): 24 layers, hidden 1024"},
          {"vit-b-16", vit(12, 768, 12), "torchvision vit_b_16 (Dosovitskiy et al. 2021, ViT-B/16)"},
          {"vit-l-16", vit(24, 1024, 16), "torchvision vit_l_16 (ViT-L/16)"}};
}

// The smallest device capacity at which two TRAIN iterations of the shape's
// schedule run without out-of-memory, on the library's default options (the
// default chunk size, OPT placement after the warm-up, prefetch), as a dry
// run.  Model data only: the schedule's non-model reports are left out, as
// when activations are not in the engine's capacity (pstar.torch on the
// emulated device reports none); with them the floor rises by the
// activation peak.  Bisection to kFloorResolution between 0 and the peak of
// an unlimited run.
constexpr uint64_t kFloorResolution = 64 * 1024;  // bytes

}  // namespace

int run_min_capacity(const Args& a) {
  const uint32_t dtype_bytes = a.shape.dtype_bytes;
  for (const FloorShape& f : floor_shapes(dtype_bytes)) {
    Workload w = pstar::workload::make_workload(f.shape);
    for (auto& u : w.schedule) u.nonmodel_bytes = 0;
    uint32_t runs = 0;
    auto trial = [&](uint64_t capacity) {
      ReplayConfig cfg;
      pstar_engine_options_init(&cfg.options);
      cfg.options.dry_run = 1;
      cfg.options.virtual_clock = 1;
      cfg.options.compute_dtype = pstar::workload::compute_dtype_for(dtype_bytes);
      cfg.options.device_capacity_bytes = capacity;
      cfg.options.threads = 1;
      cfg.iterations = 2;
      ++runs;
      ReplayResult r = pstar::workload::replay(w, cfg);
      if (!r.ok() && !r.out_of_memory())
        throw std::runtime_error(std::string(f.model) + ": " + r.failed_call + " failed with " +
                                 pstar_status_name(r.status) + ": " + r.message);
      return r;
    };
    const ReplayResult unlimited = trial(0);
    if (!unlimited.ok()) throw std::runtime_error(std::string(f.model) + ": an unlimited dry run failed");
    const auto trains = [&](uint64_t capacity) {
      const ReplayResult r = trial(capacity);
      return r.ok() && r.final_stats.peak_device_bytes <= capacity;
    };
    uint64_t lo = 0, hi = unlimited.final_stats.peak_device_bytes;  // trains(hi); not trains(lo)
    while (hi - lo > kFloorResolution) {
      const uint64_t mid = lo + (hi - lo) / 2;
      if (trains(mid))
        hi = mid;
      else
        lo = mid;
    }
    const uint64_t chunk_bytes = unlimited.built.compute_list_bytes;
    const double fraction = double(hi) / double(chunk_bytes);
    if (a.json) {
      Json o;
      o["planner"] = "pstar-plan";
      o["mode"] = "min-capacity";
      o["model"] = f.model;
      o["params"] = w.param_elems;
      o["dtype_bytes"] = dtype_bytes;
      o["chunk_elems"] = uint64_t(PSTAR_DEFAULT_CHUNK_ELEMS);
      o["compute_chunks"] = unlimited.built.compute_chunks;
      o["jumbo_chunks"] = unlimited.built.jumbo_chunks;
      o["floor_bytes"] = hi;
      o["compute_chunk_bytes"] = chunk_bytes;
      o["floor_fraction"] = num(fraction);
      o["unlimited_peak_device_bytes"] = unlimited.final_stats.peak_device_bytes;
      o["resolution_bytes"] = kFloorResolution;
      o["dry_runs"] = runs;
      o["source"] = f.source;
      std::printf("%s\n", o.dump().c_str());
    } else {
      std::printf("%-12s %6.1fM params: floor %8.2f MiB of %8.2f MiB compute chunks (%.3f), %u dry runs\n", f.model,
                  double(w.param_elems) / 1e6, double(hi) / (1024.0 * 1024.0), double(chunk_bytes) / (1024.0 * 1024.0),
                  fraction, runs);
    }
  }
  return 0;
}

}  // namespace pstar::plan
