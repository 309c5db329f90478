// pstar-plan's searches: the chunk size (the best fill ratio of a layout,
// or with --search-chunk-size the least device memory among the best
// fills), then the largest model of each kind by bisection over the layer
// count at the given width: the engine as configured, without hybrid
// placement, the two what-ifs and the NVMe tier.  The dry runs themselves
// are evaluate.cpp's; the result is a Plan for report.cpp.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "plan.h"

namespace pstar::plan {

namespace {

uint64_t round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

// Chunk size.  Candidates lie between the largest layer matrix (4h x h:
// no layer parameter gets a jumbo chunk) and one layer (the default) or,
// with --search-chunk-size, two layers: the size of every run of
// consecutive layer parameters (each rounded to 128 elements as the layout
// aligns them, 256 with the int8 state format: the sizes that layers fill
// without waste; every candidate is a multiple of that alignment, as the
// engine requires), and with the search also a grid of at most 64 steps.
// Default: the best fill ratio of a layout (build only, no dry run), the
// smallest on ties.  The search keeps the candidates within 0.5% of the
// best fill ratio and takes the one whose dry run needs the least device
// memory (smallest capacity without out-of-memory), then the fewest bytes
// moved, then the smallest.
uint64_t choose_chunk(Planner& pl, std::vector<ChunkCandidate>* searched) {
  const Args& a = pl.args;
  const uint64_t h = a.shape.hidden;
  const uint64_t align = layout_align(a.state_format);
  std::vector<uint64_t> layer_params;  // aligned sizes of one layer's parameters
  uint64_t layer_elems = 0;
  {
    GptShape one = a.shape;
    one.layers = 1;
    const Workload w1 = pstar::workload::make_gpt(one);
    for (size_t i = 2; i < 14; ++i) layer_params.push_back(round_up(w1.params[i].numel, align));
    for (uint64_t n : layer_params) layer_elems += n;
  }
  uint64_t chunk = a.chunk_elems;
  if (!a.chunk_elems) {
    const uint64_t lo = round_up(4 * h * h, align);
    const uint64_t hi = std::max(lo, (a.search_chunk ? 2 : 1) * layer_elems);
    std::vector<uint64_t> sizes;
    if (a.search_chunk) {
      const uint64_t step =
          std::max(round_up(std::max<uint64_t>(h * h / 2, 1), align), round_up((hi - lo) / 64 + 1, align));
      for (uint64_t c = lo; c <= hi; c += step) sizes.push_back(c);
    }
    const size_t np = layer_params.size();
    for (size_t i = 0; i < np; ++i) {
      uint64_t run = 0;
      for (size_t k = 0; k < 2 * np; ++k) {
        run += layer_params[(i + k) % np];
        if (run >= lo && run <= hi) sizes.push_back(run);
      }
    }
    if (sizes.empty()) sizes.push_back(layer_elems);
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    const Workload w = pstar::workload::make_gpt(a.shape);
    struct Cand {
      uint64_t chunk;
      double fill;
      uint32_t chunks;
    };
    std::vector<Cand> cands;
    for (uint64_t c : sizes) {
      const ReplayResult r = pl.layout(w, c);
      cands.push_back({c, r.built.fill_ratio, r.built.compute_chunks});
    }
    if (!a.search_chunk) {
      Cand best = cands.front();
      for (const Cand& c : cands)
        if (c.fill > best.fill) best = c;
      chunk = best.chunk;
    } else {
      double best_fill = 0;
      for (const Cand& c : cands) best_fill = std::max(best_fill, c.fill);
      uint64_t chosen = 0, best_need = UINT64_MAX, best_moved = UINT64_MAX;
      for (const Cand& c : cands) {
        ChunkCandidate row;
        row.chunk_elems = c.chunk;
        row.fill_ratio = c.fill;
        row.chunks = c.chunks;
        if (c.fill >= best_fill - 0.005) {
          const Evaluation& e = pl.evaluate_margin(a.shape.layers, c.chunk, a.hybrid);
          const uint64_t need = e.device_ok ? e.min_capacity : UINT64_MAX;
          const uint64_t moved = e.device_ok ? e.run.last.bytes_moved() : UINT64_MAX;
          row.evaluated = true;
          row.device_ok = e.device_ok;
          row.min_device_capacity = need;
          row.bytes_moved_per_iter = moved;
          // Candidates come in increasing size: on ties the smaller wins.
          if (chosen == 0 || need < best_need || (need == best_need && moved < best_moved)) {
            chosen = c.chunk;
            best_need = need;
            best_moved = moved;
          }
        }
        searched->push_back(row);
      }
      chunk = chosen;
    }
  }
  return chunk;
}

}  // namespace

Plan make_plan(Planner& pl) {
  const Args& a = pl.args;
  const Hardware& hw = a.hw;
  Plan p;
  const uint64_t chunk = choose_chunk(pl, &p.chunk_search);
  const uint64_t h = a.shape.hidden;

  const Evaluation& requested = pl.evaluate_margin(a.shape.layers, chunk, a.hybrid);
  const Evaluation* requested_host_only = a.hybrid ? &pl.evaluate(a.shape.layers, chunk, false) : nullptr;

  // Largest model: binary search over the layer count at this width, for
  // the engine as configured (hybrid placement by default; it must fit the
  // host at its peak, warm-up or after placement), without hybrid
  // placement, and two what-ifs: hybrid placement with the host need after
  // placement alone, and each device's room beyond the smallest capacity
  // that runs holding optimizer state instead of cached chunks.  The host
  // bounds the searches: the four lists (>= 14 B/param in fp32, 10 in bf16,
  // 8.03 in int8, with a 2-byte dtype) of all ranks' shares fit in the
  // nodes' host memory (plus, where device memory may hold state, the
  // devices' capacity).
  const double bytes_per_param = a.state_bytes() + a.shape.dtype_bytes;
  const double per_layer = 12.0 * double(h) * double(h);
  const double host_total = hw.host_mem * hw.nodes;
  const double dev_total = double(hw.device_capacity()) * hw.world();
  const uint32_t cap = uint32_t(std::min(1e6, host_total / (bytes_per_param * per_layer))) + 1;
  const uint32_t cap_dev = uint32_t(std::min(1e6, (host_total + dev_total) / (bytes_per_param * per_layer))) + 1;
  uint32_t best = 0, best_host_only = 0, best_steady = 0, best_margin = 0;
  if (a.search) {
    auto fits = [](const Evaluation& e) { return e.fits(); };
    best = pl.largest(a.hybrid ? cap_dev : cap, chunk, a.hybrid, false, fits);
    best_host_only = a.hybrid ? pl.largest(cap, chunk, false, false, fits) : best;
    if (a.hybrid)
      best_steady =
          pl.largest(cap_dev, chunk, true, false, [](const Evaluation& e) { return e.fits_after_placement(); });
    best_margin = pl.largest(cap_dev, chunk, a.hybrid, true, [](const Evaluation& e) { return e.fits_with_margin(); });
  }
  const Evaluation* top = best ? &pl.evaluate_margin(best, chunk, a.hybrid) : nullptr;
  const Evaluation* top_host_only = best_host_only ? &pl.evaluate_margin(best_host_only, chunk, false) : nullptr;
  const Evaluation* top_steady = best_steady ? &pl.evaluate(best_steady, chunk, true) : nullptr;
  const Evaluation* top_margin = best_margin ? &pl.evaluate_margin(best_margin, chunk, a.hybrid) : nullptr;
  // The NVMe tier (one GPU: the engine's tier runs one process): the largest
  // model whose optimizer state fits host memory and the drive together.
  const bool nvme_modelled = hw.nvme > 0 && hw.world() == 1;
  const Evaluation* top_nvme = nullptr;
  if (nvme_modelled && a.search) {
    const uint32_t cap_nvme = uint32_t(std::min(1e6, (host_total + hw.nvme) / (bytes_per_param * per_layer))) + 1;
    const uint32_t n =
        largest_layers(cap_nvme, [&](uint32_t layers) { return pl.evaluate_nvme(layers, chunk).fits(); });
    if (n) top_nvme = &pl.evaluate_nvme(n, chunk);
  } else if (nvme_modelled) {
    const Evaluation& e = pl.evaluate_nvme(a.shape.layers, chunk);
    top_nvme = e.fits() ? &e : nullptr;
  }
  if (!a.search) {
    top = requested.fits() ? &requested : nullptr;
    const Evaluation& r0 = a.hybrid ? *requested_host_only : requested;
    top_host_only = r0.fits() ? &r0 : nullptr;
  }

  p.chunk_elems = chunk;
  p.requested = &requested;
  p.requested_host_only = requested_host_only;
  // Per shape, the better of the two: hybrid placement adds device-side
  // constraints (its placed state beside the warm-up's peak, the sharded
  // rank's device), so where the host-only search finds a larger model
  // (2026-12-05, int8 on v100x8: 27.72B against 24.90B with it) the plan
  // runs without it.
  p.top_hybrid = a.hybrid ? top : nullptr;
  if (a.hybrid && a.search && top_host_only && (!top || top_host_only->params > top->params)) {
    top = top_host_only;
    p.hybrid_picked_off = true;
  }
  p.top = top;
  p.top_host_only = top_host_only;
  p.top_steady = top_steady;
  p.top_margin = top_margin;
  p.nvme_modelled = nvme_modelled;
  p.top_nvme = top_nvme;
  return p;
}

}  // namespace pstar::plan
