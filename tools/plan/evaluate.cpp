// pstar-plan's dry runs: the engine options for the machine, one
// evaluation of a shape (the dry runs of the engine, and the model of the
// host, the Adam pass, the overlapped step and the sharded ranks built on
// them), the bisection for the smallest device capacity that runs, and the
// NVMe tier.  The Planner caches each result, since the searches
// (search.cpp) come back to the same shapes.
#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "chunk_packing.h"
#include "plan.h"

namespace pstar::plan {

namespace {

// The overlapped step's exposed host update, in seconds.  The engine's
// update thread updates the host-held chunks one after the other, in the
// next iteration's first-use order, from the moment pstar_step returns;
// the next iteration's first use of a chunk waits until that chunk is
// updated.  Chunks are packed from the parameters as the engine does
// (chunk_packing.h); registration order is the workload's first-use
// order.  Hybrid
// placement puts the chunks used last in backward, the first ones in
// forward, on the device: the first `chunks_on_device` chunks need no host
// update.  The host pass's time is spread over the host chunks by their
// elements, and an updated chunk reaches the device its payload's copy
// later (bytes / h2d: the copy starts when its update ends; the dry run's
// waiting counts the synchronous step's own, so this counts such a wait
// twice, on the safe side).  Walking the schedule with the compute of each
// use (flops / flops_per_s), the exposed time is how much later the
// iteration's compute ends than it would without waiting.  `align`: the
// layout's alignment (layout_align()).
double exposed_host_update(const Workload& w, uint64_t chunk_elems, uint64_t align, uint32_t chunks_on_device,
                           double host_adam_s, double flops_per_s, double h2d_bytes_per_s) {
  const pstar::workload::ChunkPacking packing = pstar::workload::pack_chunks(w, chunk_elems, 1, align);
  const std::vector<uint32_t>& chunk_of = packing.chunk_of;
  const std::vector<uint64_t>& elems = packing.elems;
  uint64_t host_elems = 0;
  for (size_t k = chunks_on_device; k < elems.size(); ++k) host_elems += elems[k];
  std::vector<double> done(elems.size(), 0.0);  // when each chunk's update ends
  double t = 0;
  for (size_t k = chunks_on_device; k < elems.size() && host_elems > 0; ++k) {
    t += host_adam_s * double(elems[k]) / double(host_elems);
    done[k] = t + double(elems[k]) * w.shape.dtype_bytes / h2d_bytes_per_s;
  }
  std::vector<bool> used(elems.size(), false);
  double clock = 0, compute = 0;
  for (const auto& use : w.schedule) {
    for (uint32_t p : use.params) {
      const uint32_t k = chunk_of[p];
      if (used[k]) continue;
      used[k] = true;
      clock = std::max(clock, done[k]);
    }
    clock += use.flops / flops_per_s;
    compute += use.flops / flops_per_s;
  }
  return clock - compute;
}

}  // namespace

pstar_engine_options Planner::options(uint64_t chunk_elems, bool hybrid) const {
  pstar_engine_options o;
  pstar_engine_options_init(&o);
  o.device = PSTAR_DEVICE_EMULATED;
  o.dry_run = 1;
  o.virtual_clock = 1;
  o.device_capacity_bytes = args.hw.device_capacity();
  o.host_capacity_bytes = 0;  // the host is checked by the model below, per node
  o.chunk_elems = chunk_elems;
  o.threads = 1;
  o.compute_dtype = pstar::workload::compute_dtype_for(args.shape.dtype_bytes);
  o.placement_policy = PSTAR_POLICY_OPT;
  o.prefetch = 1;
  o.h2d_bytes_per_s = args.hw.h2d;
  o.d2h_bytes_per_s = args.hw.d2h;
  o.hybrid_optimizer = hybrid ? 1 : 0;
  o.state_format = args.state_format;
  o.master_format = args.master_format;
  o.master_seed = 45;
  return o;
}

void Planner::engine_failure(const ReplayResult& r, const GptShape& g) const {
  throw std::runtime_error(r.failed_call + " failed with " + pstar_status_name(r.status) + " (" +
                           std::to_string(g.layers) + " layers): " + r.message);
}

ReplayResult Planner::layout(const Workload& w, uint64_t chunk_elems) {
  ReplayConfig cfg;
  cfg.options = options(chunk_elems, false);
  cfg.build_only = true;
  ReplayResult r = pstar::workload::replay(w, cfg);
  if (!r.ok()) engine_failure(r, w.shape);
  return r;
}

const Evaluation& Planner::evaluate(uint32_t layers, uint64_t chunk_elems, bool hybrid) {
  const auto key = std::make_tuple(layers, chunk_elems, hybrid);
  const auto hit = cache.find(key);
  if (hit != cache.end()) return hit->second;
  const Hardware& hw = args.hw;
  const uint32_t world = hw.world();
  Evaluation ev;
  ev.shape = args.shape;
  ev.shape.layers = layers;
  ev.chunk_elems = chunk_elems;
  ev.hybrid = hybrid;
  const Workload w = pstar::workload::make_gpt(ev.shape);
  ev.params = w.param_elems;
  ev.flops = w.flops_total();

  const pstar_state_format fmt = args.state_format;
  const uint64_t align = layout_align(fmt);
  const ReplayResult built = layout(w, chunk_elems);
  ev.opt_state_bytes = state_list_bytes(fmt, built.built.optimizer_list_bytes, args.master_format);
  ev.opt_share_per_rank = (ev.opt_state_bytes + world - 1) / world;
  ev.opt_chunks = built.built.optimizer_chunks;

  // Adam per step, from the optimizer state the engine holds on the device
  // at that step (none until warm-up ends; hybrid: what it placed then).
  // A rank's share of the optimizer elements is split between its GPU
  // (min(placed, share): see opt_device_per_rank) and its node's host
  // pass.  Each element costs 28 bytes with a 2-byte dtype in fp32 (20 in
  // bf16, 16.0625 in int8: adam_bytes_per_elem()): the gradient read,
  // master, m and v read and written, the weight written.  A node's
  // host pass updates its ranks' host-held elements at the node's
  // bandwidth; each GPU updates its own at the device's, at the same time
  // (the engine queues the device updates, then updates the rest on the
  // CPU), so the optimizer takes the longer of the two.
  const double update_bytes_per_elem = args.adam_bytes(args.shape.dtype_bytes);
  const double state_bytes = args.state_bytes();
  const double share_elems = double(built.built.optimizer_list_bytes) / 4.0 / world;
  const uint64_t share_bytes = ev.opt_share_per_rank;
  auto adam_times = [=](uint64_t placed, double* host_s, double* dev_s) {
    const double dev_elems = double(std::min(placed, share_bytes)) / state_bytes;
    const double host_elems = std::max(0.0, share_elems - dev_elems);
    *host_s = hw.gpus_per_node * host_elems * update_bytes_per_elem / hw.host_adam;
    *dev_s = dev_elems * update_bytes_per_elem / hw.device_adam;
  };

  ReplayConfig cfg;
  cfg.options = options(chunk_elems, hybrid);
  cfg.iterations = 2;  // warm-up (records the trace; hybrid placement at its end) + one traced iteration
  cfg.flops_per_s = hw.flops;
  cfg.optimizer_seconds_fn = [=](const pstar_stats& s) {
    double host_s = 0, dev_s = 0;
    adam_times(s.optimizer_device_bytes, &host_s, &dev_s);
    return std::max(host_s, dev_s);
  };
  ev.run = pstar::workload::replay(w, cfg);
  ++dry_runs;
  if (!ev.run.ok() && !ev.run.out_of_memory()) engine_failure(ev.run, ev.shape);
  ev.device_capacity = hw.device_capacity();
  ev.device_ok = ev.run.ok() && ev.run.final_stats.peak_device_bytes <= ev.device_capacity;

  const pstar_stats& fs = ev.run.final_stats;
  ev.opt_chunks_on_device = fs.optimizer_chunks_on_device;
  ev.opt_device_bytes = fs.optimizer_device_bytes;
  ev.opt_device_per_rank = std::min(ev.opt_device_bytes, ev.opt_share_per_rank);
  ev.collectives = pstar::workload::predict_collectives(w, chunk_elems, world, align);
  ev.collective_link_bytes = ev.collectives.link_bytes(world);
  ev.collective_s = hw.collective > 0 ? ev.collective_link_bytes / hw.collective : 0.0;
  if (world > 1) {
    // The rank's own hybrid placement (placement/hybrid.h), which it
    // decides alone from its warm-up's need peak, not the one-process dry
    // run's: predicted from the layout and the drop rule, as the engine
    // chooses (checked against runs of 2 and 4 ranks by
    // test_plan_collectives).  Its share bounds it.
    const uint64_t peak = ev.collectives.peak_device_bytes_device_comm;
    if (hybrid)
      ev.sharded_placement = pstar::workload::predict_sharded_placement(ev.collectives, ev.device_capacity,
                                                                        /*device_comm=*/true, w.shape.dtype_bytes);
    ev.opt_device_per_rank = std::min(ev.sharded_placement.list_bytes, ev.opt_share_per_rank);
    ev.sharded_peak_device = peak + ev.sharded_placement.state_bytes;
    // A placed chunk's compute shard lives in its device buffer only: its
    // gathers copy it on the device, its gradient goes in once (the
    // compute dtype) when its reduce-scatter is applied, nothing comes
    // back at the step, and the host holds no copy of it.
    ev.placed_shard_bytes = ev.sharded_placement.elems * w.shape.dtype_bytes;
    ev.sharded_h2d_bytes =
        ev.collectives.shard_bytes_to_device(world) - ev.sharded_placement.gathered_shard_bytes + ev.placed_shard_bytes;
    ev.sharded_d2h_bytes = ev.collectives.reduced_bytes_to_host(world);
    ev.sharded_copy_s = double(ev.sharded_h2d_bytes) / hw.h2d + double(ev.sharded_d2h_bytes) / hw.d2h;
    ev.sharded_device_ok = peak <= ev.device_capacity;
  }
  adam_times(ev.opt_device_per_rank, &ev.host_adam_s, &ev.device_adam_s);
  ev.adam_s = std::max(ev.host_adam_s, ev.device_adam_s);

  // The four lists: the compute list, and the three optimizer lists in the
  // state format (fp32: ReplayResult::list_bytes()).
  ev.list_bytes = built.built.compute_list_bytes + ev.opt_state_bytes;
  ev.share_per_rank = (ev.list_bytes + world - 1) / world;
  // Through warm-up: the compute list and the masters in their format (the
  // stats' optimizer_list_bytes is one fp32 list; bf16 masters are half).
  const uint64_t master_list_bytes =
      args.master_format == PSTAR_MASTER_BF16 ? built.built.optimizer_list_bytes / 2 : built.built.optimizer_list_bytes;
  const uint64_t warmup_lists = built.built.compute_list_bytes + master_list_bytes;
  ev.warmup_share_per_rank = (warmup_lists + world - 1) / world;
  // The engine's own host bytes: the dry run's peak beyond what the model
  // above gives for one rank holding the whole model.
  const uint64_t one_rank_lists = std::max(warmup_lists, ev.list_bytes - std::min(ev.list_bytes, ev.opt_device_bytes));
  const uint64_t peak_host = fs.peak_host_bytes;
  ev.extra_per_rank = peak_host > one_rank_lists ? peak_host - one_rank_lists : 0;
  const uint64_t reserve = uint64_t(hw.host_reserve);
  const uint64_t after_share =
      ev.share_per_rank - std::min(ev.share_per_rank, ev.opt_device_per_rank + ev.placed_shard_bytes);
  ev.host_per_node =
      uint64_t(hw.gpus_per_node) * (std::max(ev.warmup_share_per_rank, after_share) + ev.extra_per_rank + reserve);
  ev.host_per_node_after = uint64_t(hw.gpus_per_node) * (after_share + ev.extra_per_rank + reserve);
  ev.host_ok = double(ev.host_per_node) <= hw.host_mem;
  ev.host_ok_after = double(ev.host_per_node_after) <= hw.host_mem;
  ev.step_s = ev.run.last.clock_seconds;
  // The overlapped step on the dry run's clock: the engine models each
  // host chunk's update (its shard's elements x (2 x dtype + 24) bytes at
  // this rank's share of the node's Adam bandwidth; the engine's model
  // counts fp32's bytes, so with another format the rate given is scaled
  // by fp32's bytes over the format's, and the time is the format's bytes
  // at the node's bandwidth) beside the next iteration,
  // a chunk's fetch waiting for its update's end; the device's updates
  // stay on the caller's clock.  Three iterations: the third follows a
  // step taken while following the trace (first-use order).  The
  // analytic walk above is kept as a cross-check.
  ev.step_s_overlap_analytic =
      ev.step_s - ev.adam_s + ev.device_adam_s +
      exposed_host_update(w, chunk_elems, align, ev.opt_chunks_on_device, ev.host_adam_s, hw.flops, hw.h2d);
  if (ev.run.ok()) {
    ReplayConfig over = cfg;
    over.iterations = 3;
    // The dry run holds every chunk whole; a rank updates its 1/world
    // shard of each: its chunk's update is 1/world as long.
    over.host_update_bytes_per_s =
        hw.host_adam / hw.gpus_per_node * world *
        (adam_bytes_per_elem(PSTAR_STATE_FP32, args.shape.dtype_bytes) / update_bytes_per_elem);
    over.optimizer_seconds_fn = [=](const pstar_stats& s) {
      double host_s = 0, dev_s = 0;
      adam_times(s.optimizer_device_bytes, &host_s, &dev_s);
      return dev_s;
    };
    const ReplayResult ro = pstar::workload::replay(w, over);
    ++dry_runs;
    if (!ro.ok() && !ro.out_of_memory()) engine_failure(ro, ev.shape);
    ev.step_s_overlap = ro.ok() ? ro.last.clock_seconds : ev.step_s_overlap_analytic;
    ev.overlap_on_clock = ro.ok();
    if (!ro.ok() && args.verbose)
      std::fprintf(stderr, "pstar-plan: overlap dry run: %s: %s\n", ro.failed_call.c_str(), ro.message.c_str());
  } else {
    ev.step_s_overlap = ev.step_s_overlap_analytic;
  }
  ev.exposed_host_adam_s = std::max(0.0, ev.step_s_overlap - (ev.step_s - ev.adam_s + ev.device_adam_s));
  if (world > 1)
    ev.step_s_sharded =
        ev.run.compute_seconds + ev.device_adam_s + ev.exposed_host_adam_s + ev.collective_s + ev.sharded_copy_s;
  if (args.verbose)
    std::fprintf(stderr,
                 "pstar-plan: dry run %u: %u layers, %.3fB params, chunk %" PRIu64
                 "%s: device %s (peak %.2f GiB of %.2f), optimizer state on the device %.2f GiB "
                 "(%u of %u chunks), host %.1f GiB/node of %.1f (%.1f after placement), moved %.2f GB, "
                 "step %.3f s, overlapped %.6f s (%s; walk %.6f s)\n",
                 dry_runs, layers, ev.params / 1e9, chunk_elems, hybrid ? ", hybrid" : "",
                 ev.device_ok ? "ok" : (ev.run.out_of_memory() ? "out of memory" : "over capacity"),
                 fs.peak_device_bytes / kGiB, ev.device_capacity / kGiB, ev.opt_device_bytes / kGiB,
                 ev.opt_chunks_on_device, ev.opt_chunks, ev.host_per_node / kGiB, hw.host_mem / kGiB,
                 ev.host_per_node_after / kGiB, ev.run.last.bytes_moved() / 1e9, ev.step_s, ev.step_s_overlap,
                 ev.overlap_on_clock ? "clock" : "analytic", ev.step_s_overlap_analytic);
  if (args.verbose && world > 1)
    std::fprintf(stderr,
                 "pstar-plan:   sharded rank: need peak %.2f GiB, gathered peak %.2f GiB, streaming reserve %.2f "
                 "GiB, margin %.2f GiB, %u chunks' shards placed (%.2f GiB)\n",
                 ev.collectives.need_peak_bytes_device_comm / kGiB, ev.collectives.peak_device_bytes_device_comm / kGiB,
                 2.0 * ev.collectives.largest_chunk_bytes / kGiB, ev.sharded_placement.margin / kGiB,
                 ev.sharded_placement.chunks, ev.sharded_placement.state_bytes / kGiB);
  return cache.emplace(key, std::move(ev)).first->second;
}

const Evaluation& Planner::evaluate_margin(uint32_t layers, uint64_t chunk_elems, bool hybrid) {
  evaluate(layers, chunk_elems, hybrid);
  Evaluation& ev = cache.at(std::make_tuple(layers, chunk_elems, hybrid));
  if (ev.min_capacity != 0 || !ev.device_ok) return ev;
  const Workload w = pstar::workload::make_gpt(ev.shape);
  uint64_t lo = ev.run.peak_nonmodel_reported, hi = ev.device_capacity;
  const uint64_t tol = std::max<uint64_t>(hi / 256, 1 << 20);
  while (hi - lo > tol) {
    const uint64_t mid = lo + (hi - lo) / 2;
    ReplayConfig cfg;
    cfg.options = options(chunk_elems, hybrid);
    cfg.options.device_capacity_bytes = mid;
    cfg.iterations = 2;
    const ReplayResult r = pstar::workload::replay(w, cfg);
    ++dry_runs;
    if (!r.ok() && !r.out_of_memory()) engine_failure(r, ev.shape);
    if (r.ok() && r.final_stats.peak_device_bytes <= mid)
      hi = mid;
    else
      lo = mid;
  }
  ev.min_capacity = hi;
  ev.margin_per_rank = ev.device_capacity - hi;
  const uint64_t off_host = std::min(ev.margin_per_rank, ev.opt_share_per_rank);
  ev.host_per_node_margin =
      uint64_t(args.hw.gpus_per_node) * (std::max(ev.warmup_share_per_rank, ev.share_per_rank - off_host) +
                                         ev.extra_per_rank + uint64_t(args.hw.host_reserve));
  ev.host_ok_margin = double(ev.host_per_node_margin) <= args.hw.host_mem;
  return ev;
}

const Evaluation& Planner::evaluate_nvme(uint32_t layers, uint64_t chunk_elems) {
  const auto key = std::make_pair(layers, chunk_elems);
  const auto hit = nvme_cache.find(key);
  if (hit != nvme_cache.end()) return hit->second;
  const Hardware& hw = args.hw;
  Evaluation ev = evaluate(layers, chunk_elems, false);  // shape, layout, Adam time
  const Workload w = pstar::workload::make_gpt(ev.shape);
  ReplayConfig cfg;
  cfg.options = options(chunk_elems, false);
  cfg.options.host_capacity_bytes = hw.host_mem > hw.host_reserve ? uint64_t(hw.host_mem - hw.host_reserve) : 1;
  cfg.use_nvme = true;
  pstar_x_nvme_options_init(&cfg.nvme);
  cfg.nvme.capacity_bytes = uint64_t(hw.nvme);
  cfg.nvme.read_bytes_per_s = hw.nvme_read;
  cfg.nvme.write_bytes_per_s = hw.nvme_write;
  cfg.iterations = 2;
  cfg.flops_per_s = hw.flops;
  const double adam_s = ev.host_adam_s;
  cfg.optimizer_seconds_fn = [=](const pstar_stats&) { return adam_s; };
  ev.run = pstar::workload::replay(w, cfg);
  ++dry_runs;
  if (!ev.run.ok() && !ev.run.out_of_memory()) engine_failure(ev.run, ev.shape);
  ev.device_ok = ev.run.ok() && ev.run.final_stats.peak_device_bytes <= ev.device_capacity;
  ev.host_ok = ev.run.ok();  // the engine kept the host budget, or failed the build
  ev.host_per_node = ev.run.final_stats.peak_host_bytes + uint64_t(hw.host_reserve);
  ev.nvme_bytes = ev.run.nvme.bytes_on_nvme;
  ev.nvme_chunks = ev.run.nvme.chunks_on_nvme;
  ev.drive_s = double(ev.nvme_bytes) / hw.nvme_read + double(ev.nvme_bytes) / hw.nvme_write;
  ev.step_s = ev.run.last.clock_seconds - std::min(ev.adam_s, ev.drive_s);
  if (args.verbose)
    std::fprintf(stderr,
                 "pstar-plan: dry run %u (NVMe): %u layers, %.3fB params: %s, %u chunks (%.1f GiB) on the "
                 "drive, step %.3f s\n",
                 dry_runs, layers, ev.params / 1e9, ev.fits() ? "fits" : ev.run.message.c_str(), ev.nvme_chunks,
                 ev.nvme_bytes / kGiB, ev.step_s);
  return nvme_cache.emplace(key, std::move(ev)).first->second;
}

}  // namespace pstar::plan
