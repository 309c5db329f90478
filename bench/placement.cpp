// pstar-bench placement: bytes moved by each placement policy on GPT traces,
// against an optimum computed independently of the runtime.
//
//   pstar-bench placement [--models tiny,small,medium] [--fractions 0.1,...]
//                         [--iterations 4] [--tflops 20] [--h2d-gbps 25]
//                         [--host-update-gbps 0] [--json]
//
// For each GPT shape (tools/workload/gpt_workload.h) and each device capacity
// (budget_fraction f: the chunks may use f x the compute-dtype chunk bytes
// at the moment when activations and gradient buffers take the most; the
// capacity is that plus this peak), the schedule of TRAIN iterations is
// replayed through the C API on the dry-run engine (virtual clock: a copy
// takes bytes / the modelled bandwidth, a use's compute takes its FLOPs /
// --tflops) under each policy: opt (trace-guided, with prefetch),
// opt_noprefetch, lru and static.  Reported per iteration, from the last
// (steady-state) iteration of --iterations:
//   bytes_moved     host-to-device bytes (what placement decides; the bytes
//                   going back are reported apart as bytes_d2h)
//   critical_bytes  bytes an acquire waited for
//   stall_seconds   the caller's time outside its compute (iteration_seconds
//                   - compute_seconds: acquires and the step waiting), and
//                   stall_seconds_lower_bound, the least any schedule
//                   without speculation can have on this link (see
//                   stall_lower_bound: the chunks the forward needs first
//                   come back only after the step; where the forward
//                   computes for less time than its chunks take to copy,
//                   waiting is forced, and critical_bytes counts every
//                   chunk whose copy was still in flight, however briefly)
//   lower_bound_bytes  the least host-to-device bytes any schedule can move
//                   in one iteration that starts from an empty device: every
//                   chunk of these models is trained, and the step sends each
//                   one to the host for the CPU optimizer
//                   (bench/placement_optimum.h: exact by Belady or exhaustive
//                   search where possible, else the fractional relaxation).
//                   It is computed from the workload, the chunk layout and
//                   the per-moment budget (capacity - activations - live
//                   gradient buffers), never from the runtime's decisions.
//                   Parameters acquired together are treated as successive
//                   moments (a relaxation), so it stays a lower bound.
// --host-update-gbps models the CPU update (off by default: it takes no
// time, so the figures are placement's alone); with it, the updates run
// beside the next iteration on the clock, and the forward waits for them.
// A row whose capacity cannot hold the chunks a moment needs reports
// "feasible": false and no figures.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "chunk/layout.h"
#include "gpt_workload.h"
#include "placement_optimum.h"
#include "replay.h"

namespace pstar::bench {
namespace {

using workload::GptShape;
using workload::Stage;
using workload::Workload;

struct ModelPreset {
  std::string name;
  GptShape shape;
  uint64_t chunk_elems;
};

// Four GPT shapes: small enough to replay in seconds; the three smaller ones
// have few enough chunks (<= 64) for an exact optimum.
std::vector<ModelPreset> model_presets() {
  auto shape = [](uint32_t layers, uint32_t hidden, uint32_t heads, uint32_t vocab, uint32_t seq, uint32_t batch) {
    GptShape s;
    s.layers = layers;
    s.hidden = hidden;
    s.heads = heads;
    s.vocab = vocab;
    s.seq = seq;
    s.batch = batch;
    s.checkpointing = true;
    return s;
  };
  // Chunks hold at least the largest layer matrix (4 h^2), as PatrickStar
  // sizes them, so only the token embedding is a jumbo chunk.
  return {{"gpt-4l-256h", shape(4, 256, 4, 2048, 128, 4), uint64_t{1} << 18},
          {"gpt-8l-512h", shape(8, 512, 8, 8192, 256, 4), uint64_t{1} << 20},
          {"gpt-24l-768h", shape(24, 768, 12, 16384, 512, 2), uint64_t{4} << 20},
          // Over 64 chunks: the fractional lower bound.
          {"gpt-48l-1024h", shape(48, 1024, 16, 32768, 512, 2), uint64_t{4} << 20}};
}

struct PlacementOptions {
  std::string models = "all";
  std::string fractions = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9";
  uint32_t iterations = 4;
  double tflops = 20.0;
  // PCIe 4.0 x16 from pinned memory (~25 GB/s each way): a link that leaves
  // room, next to --tflops of compute, for the shapes here.
  double h2d_gbps = 25.0;
  // 0: the CPU update takes no modelled time.  Else its rate in GB/s of
  // the bytes a fused Adam pass moves (pstar_x_engine_set_modelled_host_update),
  // the updates overlapping the next iteration on the clock.
  double host_update_gbps = 0.0;
  bool json = false;
};

// Moments of one iteration as the optimum sees them: the chunk each acquire
// needs and the transient bytes (activations + live gradient buffers) then.
struct MomentModel {
  std::vector<uint32_t> chunk_at;
  // Every gradient buffer on the device (the most the engine can hold):
  // sizes the capacity of each budget.
  std::vector<uint64_t> transient_at;
  std::vector<uint64_t> chunk_bytes;
  uint64_t compute_chunk_bytes = 0;
  uint64_t peak_transient = 0;
};

// The engine's layout of the workload's parameters (all trained).
chunk::ChunkLayout packed_layout(const Workload& w, uint64_t chunk_elems) {
  std::vector<uint64_t> numels;
  std::vector<bool> frozen;
  for (const auto& p : w.params) {
    numels.push_back(p.numel);
    frozen.push_back(false);
  }
  return chunk::ChunkLayout(numels, frozen, chunk_elems);
}

// The transient bytes per moment at `capacity`: activations, and only the
// gradient buffers the engine is certain to place on the device (a buffer
// lives from its parameter's first backward acquire to the release that
// makes its backward uses equal its forward uses).  At an unlimited
// capacity every buffer is on the device: the most the engine can hold,
// which sizes each budget's capacity; at a budget's capacity, what the
// lower bound may assume.  The engine keeps a parameter's fp32
// buffer on the host when it does not fit beside what cannot move
// (Engine::open_accumulator: the buffer, plus room for one more chunk and
// its buffer when more backward uses are to come, against the capacity
// less the activations, the other gradient buffers and the chunks in use),
// and a buffer on the host leaves the chunks more room than a model that
// counts every buffer.  So a buffer counts here only when it fits even
// beside every live buffer and every chunk of its use; where the engine
// might have put it on the host, the bound assumes it did, and stays a
// lower bound (at budget 0.04 of gpt-48l it was not one before).
std::vector<uint64_t> transient_at_capacity(const Workload& w, const chunk::ChunkLayout& layout, size_t elem_bytes,
                                            uint64_t capacity) {
  std::vector<uint32_t> forward_uses(w.params.size(), 0), backward_uses(w.params.size(), 0);
  for (const auto& u : w.schedule)
    if (u.stage == Stage::Forward)
      for (uint32_t p : u.params) ++forward_uses[p];
  std::vector<bool> live(w.params.size(), false), on_device(w.params.size(), false);
  uint64_t live_bytes = 0, device_bytes = 0;  // every live buffer; those certainly on the device
  std::vector<uint64_t> out;
  for (const auto& u : w.schedule) {
    uint64_t use_chunks = 0;
    std::vector<uint32_t> seen;
    for (uint32_t p : u.params) {
      const uint32_t k = layout.param(p).chunk;
      if (std::find(seen.begin(), seen.end(), k) != seen.end()) continue;
      seen.push_back(k);
      use_chunks += layout.chunks()[k].capacity_elems * elem_bytes;
    }
    for (uint32_t p : u.params) {
      if (u.stage == Stage::Backward && !live[p]) {
        const uint64_t bytes = w.params[p].numel * sizeof(float);
        const bool more_to_come = forward_uses[p] - backward_uses[p] > 1;
        const uint64_t need = bytes + (more_to_come ? layout.chunk_elems() * (elem_bytes + sizeof(float)) : 0);
        const uint64_t held = u.nonmodel_bytes + live_bytes + use_chunks;
        live[p] = true;
        live_bytes += bytes;
        if (held <= capacity && need <= capacity - held) {
          on_device[p] = true;
          device_bytes += bytes;
        }
      }
      out.push_back(u.nonmodel_bytes + device_bytes);
    }
    if (u.stage != Stage::Backward) continue;
    for (uint32_t p : u.params) {
      if (++backward_uses[p] == forward_uses[p]) {
        const uint64_t bytes = w.params[p].numel * sizeof(float);
        live[p] = false;
        live_bytes -= bytes;
        if (on_device[p]) device_bytes -= bytes;
        on_device[p] = false;
      }
    }
  }
  return out;
}

MomentModel moment_model(const Workload& w, const chunk::ChunkLayout& layout, size_t elem_bytes) {
  MomentModel m;
  for (const auto& c : layout.chunks()) m.chunk_bytes.push_back(c.capacity_elems * elem_bytes);
  for (uint64_t b : m.chunk_bytes) m.compute_chunk_bytes += b;
  for (const auto& u : w.schedule)
    for (uint32_t p : u.params) m.chunk_at.push_back(layout.param(p).chunk);
  m.transient_at = transient_at_capacity(w, layout, elem_bytes, UINT64_MAX);
  for (uint64_t t : m.transient_at) m.peak_transient = std::max(m.peak_transient, t);
  return m;
}

// The least time, per iteration, the caller of any schedule spends outside
// its compute (waiting in acquires and in pstar_step), on the virtual clock,
// when the step sends every trained chunk to the host for the CPU optimizer
// and applies no update before it knows the step's decision (no
// speculation).  Time 0 is the end of the backward's last compute; the
// next forward's moment t starts, at the earliest, at C(t) (the compute of
// the uses before it) plus that non-compute time W.  By then every chunk
// first used at or before t (the set S_t) has come back over the one
// host-to-device link (`bytes_per_s`).  Chunk k's copy back starts no
// earlier than r_k = max(0, e_k + d_k): its gradient is final at e_k <= 0
// (the end of its last backward use's compute), takes d_k to go down, and
// the update needs the decision, which needs the whole backward.  One link
// serving jobs released at r_k finishes those released at or after any
// time x no sooner than x plus their copy times; so
//   W >= max over t and over x in {0, r_k} of
//        x + sum over k in S_t with r_k >= x of bytes_k / bytes_per_s - C(t).
// It leaves out chunks fetched more than once and queueing on the link
// down (it stays a lower bound), and depends on the model, not the budget.
double stall_lower_bound(const Workload& w, const chunk::ChunkLayout& layout, size_t elem_bytes, double flops_per_s,
                         double bytes_per_s) {
  const size_t n = layout.chunks().size();
  auto copy_s = [&](uint32_t k) {
    return static_cast<double>(layout.chunks()[k].capacity_elems * elem_bytes) / bytes_per_s;
  };
  // The compute up to the end of each chunk's last backward use.
  std::vector<double> grad_final(n, -1.0);
  double compute_s = 0.0;
  for (const auto& u : w.schedule) {
    compute_s += u.flops / flops_per_s;
    if (u.stage != Stage::Backward) continue;
    for (uint32_t p : u.params) grad_final[layout.param(p).chunk] = compute_s;
  }
  std::vector<double> release(n, 0.0);
  for (uint32_t k = 0; k < n; ++k)
    if (grad_final[k] >= 0.0) release[k] = std::max(0.0, grad_final[k] - compute_s + copy_s(k));
  // Forward order: the release times of S_t, and the bound at each new chunk.
  std::vector<bool> seen(n, false);
  std::vector<std::pair<double, double>> released;  // (r_k, copy time) of S_t
  double forward_compute_s = 0.0, bound = 0.0;
  for (const auto& u : w.schedule) {
    for (uint32_t p : u.params) {
      const uint32_t k = layout.param(p).chunk;
      if (seen[k]) continue;
      seen[k] = true;
      released.emplace_back(release[k], copy_s(k));
      for (const auto& [x, unused] : released) {
        double finish = x;
        for (const auto& [r, c] : released)
          if (r >= x) finish += c;
        bound = std::max(bound, finish - forward_compute_s);
      }
    }
    forward_compute_s += u.flops / flops_per_s;
  }
  return bound;
}

struct PolicyRun {
  const char* name;
  pstar_policy policy;
  bool prefetch;
  // options.hybrid_optimizer: the chunks placed keep their payload on the
  // device across the step, so an iteration no longer starts from an empty
  // device and the lower bound (which assumes it does) does not apply; the
  // row is reported beside the others, outside the bound's check and the
  // policies' comparison.
  bool hybrid = false;
};

constexpr PolicyRun kPolicies[] = {{"opt", PSTAR_POLICY_OPT, true},
                                   {"opt_noprefetch", PSTAR_POLICY_OPT, false},
                                   {"lru", PSTAR_POLICY_LRU, false},
                                   {"static", PSTAR_POLICY_STATIC, false},
                                   {"opt_hybrid", PSTAR_POLICY_OPT, true, true}};

std::vector<double> parse_fractions(const std::string& s) {
  std::vector<double> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    const double f = std::stod(item);
    if (!(f > 0.0 && f <= 1.0)) throw std::invalid_argument("--fractions: each must be in (0, 1]");
    out.push_back(f);
  }
  return out;
}

int run_placement(const PlacementOptions& o) {
  const std::vector<double> fractions = parse_fractions(o.fractions);
  std::vector<ModelPreset> models;
  for (const auto& m : model_presets()) {
    if (o.models == "all" || ("," + o.models + ",").find("," + m.name + ",") != std::string::npos) {
      models.push_back(m);
    }
  }
  if (models.empty()) throw std::invalid_argument("--models: none of the names matched (see --help)");
  if (o.iterations < 2) throw std::invalid_argument("--iterations must be >= 2 (warm-up + measured)");
  int failures = 0;
  for (const auto& model : models) {
    const Workload w = workload::make_gpt(model.shape);
    const chunk::ChunkLayout layout = packed_layout(w, model.chunk_elems);
    const MomentModel mm = moment_model(w, layout, model.shape.dtype_bytes);
    struct Row {
      double fraction;
      std::map<std::string, uint64_t> moved;
      uint64_t bound;
      double critical_fraction_opt;
      double stall_ratio_opt = 0.0;
      double critical_fraction_hybrid = -1.0;  // -1: infeasible
    };
    const double stall_bound = stall_lower_bound(w, layout, model.shape.dtype_bytes, o.tflops * 1e12, o.h2d_gbps * 1e9);
    std::vector<Row> rows;
    for (double f : fractions) {
      const uint64_t capacity =
          mm.peak_transient + static_cast<uint64_t>(f * static_cast<double>(mm.compute_chunk_bytes));
      std::vector<uint64_t> budget_at;
      for (uint64_t t : transient_at_capacity(w, layout, model.shape.dtype_bytes, capacity))
        budget_at.push_back(capacity > t ? capacity - t : 0);
      // One iteration from an empty device: the step before it sent every
      // (trained) chunk to the host for the CPU optimizer.
      PlacementProblem problem;
      problem.chunk_at = mm.chunk_at;
      problem.budget_at = budget_at;
      problem.bytes = mm.chunk_bytes;
      const PlacementOptimum best = placement_optimum(problem);
      Row row{f, {}, best.bytes_fetched, 0.0};
      if (const char* dir = std::getenv("PSTAR_BENCH_TIMELINES")) {
        nlohmann::json d;
        d["chunk_at"] = mm.chunk_at;
        d["budget_at"] = budget_at;
        d["chunk_bytes"] = mm.chunk_bytes;
        std::ofstream(std::string(dir) + "/" + model.name + "-" + std::to_string(f) + "-problem.json") << d.dump();
      }
      for (const PolicyRun& pr : kPolicies) {
        nlohmann::ordered_json j;
        j["bench"] = "placement";
        j["model"] = model.name;
        j["budget_fraction"] = f;
        j["policy"] = pr.name;
        j["params"] = w.param_elems;
        j["chunk_elems"] = model.chunk_elems;
        j["chunks"] = mm.chunk_bytes.size();
        j["compute_chunk_bytes"] = mm.compute_chunk_bytes;
        j["device_capacity"] = capacity;
        j["moments"] = mm.chunk_at.size();
        workload::ReplayConfig cfg;
        cfg.options.dry_run = 1;
        cfg.options.compute_dtype = workload::compute_dtype_for(model.shape.dtype_bytes);
        cfg.options.chunk_elems = model.chunk_elems;
        cfg.options.device_capacity_bytes = capacity;
        cfg.options.placement_policy = pr.policy;
        cfg.options.prefetch = pr.prefetch ? 1 : 0;
        cfg.options.hybrid_optimizer = pr.hybrid ? 1 : 0;
        cfg.options.h2d_bytes_per_s = o.h2d_gbps * 1e9;
        cfg.options.d2h_bytes_per_s = o.h2d_gbps * 1e9;
        cfg.iterations = o.iterations;
        cfg.flops_per_s = o.tflops * 1e12;
        cfg.host_update_bytes_per_s = o.host_update_gbps * 1e9;
        if (const char* dir = std::getenv("PSTAR_BENCH_TIMELINES")) {
          // Debugging aid: one Chrome trace per row.
          cfg.options.record_timeline = 1;
          cfg.timeline_path = std::string(dir) + "/" + model.name + "-" + std::to_string(f) + "-" + pr.name + ".json";
        }
        const workload::ReplayResult r = workload::replay(w, cfg);
        const bool feasible = best.feasible && r.ok();
        j["feasible"] = feasible;
        if (!feasible) {
          j["reason"] = !best.feasible ? "a moment's chunk exceeds its budget" : r.failed_call + ": " + r.message;
          std::cout << (o.json ? j.dump() : j.dump(1)) << "\n";
          continue;
        }
        const auto& it = r.last;
        j["bytes_moved"] = it.bytes_host_to_device;
        j["bytes_d2h"] = it.bytes_device_to_host;
        j["critical_bytes"] = it.bytes_critical;
        j["prefetched_bytes"] = it.bytes_prefetched;
        j["lower_bound_bytes"] = best.bytes_fetched;
        j["lower_bound_exact"] = best.exact;
        j["lower_bound_method"] = best.method;
        j["ratio_to_lower_bound"] = best.bytes_fetched > 0 ? static_cast<double>(it.bytes_host_to_device) /
                                                                 static_cast<double>(best.bytes_fetched)
                                                           : (it.bytes_host_to_device == 0 ? 1.0 : -1.0);
        j["critical_fraction"] = it.bytes_host_to_device > 0 ? static_cast<double>(it.bytes_critical) /
                                                                   static_cast<double>(it.bytes_host_to_device)
                                                             : 0.0;
        j["iteration_seconds"] = it.clock_seconds;
        // Share of the iteration the host-to-device link was busy.
        j["link_busy_fraction"] = it.clock_seconds > 0.0 ? static_cast<double>(it.bytes_host_to_device) /
                                                               (o.h2d_gbps * 1e9) / it.clock_seconds
                                                         : 0.0;
        j["wait_seconds"] = it.wait_seconds;
        // The caller's time outside its compute, and the least any schedule
        // without speculation can have (stall_lower_bound).
        const double stall = it.clock_seconds - r.compute_seconds;
        j["stall_seconds"] = stall;
        j["stall_seconds_lower_bound"] = stall_bound;
        j["stall_ratio_to_lower_bound"] = stall_bound > 0.0 ? stall / stall_bound : -1.0;
        j["compute_seconds"] = r.compute_seconds;
        j["trace_fallbacks"] = it.trace_fallbacks;
        j["budget_overruns"] = it.budget_overruns;
        j["peak_device_bytes"] = r.final_stats.peak_device_bytes;
        if (pr.hybrid) {
          j["optimizer_chunks_on_device"] = r.final_stats.optimizer_chunks_on_device;
          row.critical_fraction_hybrid = j["critical_fraction"].get<double>();
          std::cout << (o.json ? j.dump() : j.dump(1)) << "\n";
          continue;
        }
        if (it.bytes_host_to_device < best.bytes_fetched) {
          // Nothing can beat a true lower bound: a bug in one of the two.
          std::cerr << "pstar-bench placement: " << model.name << " at " << f << ", " << pr.name
                    << " moved fewer bytes than the lower bound\n";
          ++failures;
        }
        if (stall < stall_bound * (1.0 - 1e-9)) {
          std::cerr << "pstar-bench placement: " << model.name << " at " << f << ", " << pr.name
                    << " stalled less than the lower bound (" << stall << " s < " << stall_bound << " s)\n";
          ++failures;
        }
        row.moved[pr.name] = it.bytes_host_to_device;
        if (std::string(pr.name) == "opt") {
          row.critical_fraction_opt = j["critical_fraction"].get<double>();
          if (stall_bound > 0.0) row.stall_ratio_opt = stall / stall_bound;
        }
        std::cout << (o.json ? j.dump() : j.dump(1)) << "\n";
      }
      if (row.moved.size() == 4) rows.push_back(row);
    }
    // The targets, evaluated on this run (reported, not asserted).
    double worst_ratio = 0.0, worst_critical = 0.0, worst_critical_hybrid = 0.0, worst_stall_ratio = 0.0;
    bool never_above = true, below_lru = false, below_static = false;
    // Whether any schedule could move fewer bytes than static at all: every
    // schedule fetches whole chunks, so its bytes are a multiple of the
    // chunks' common divisor (granule); one below static moves at most
    // static - granule, which is impossible where that is under the lower
    // bound.  Such a budget is one where static is already the least any
    // schedule can move, so no policy can be strictly below it there.
    uint64_t granule = 0;
    for (uint64_t b : mm.chunk_bytes) granule = std::gcd(granule, b);
    std::vector<double> static_least;
    for (const Row& row : rows) {
      const uint64_t opt = row.moved.at("opt");
      if (row.bound > 0) worst_ratio = std::max(worst_ratio, static_cast<double>(opt) / static_cast<double>(row.bound));
      never_above = never_above && opt <= row.moved.at("lru") && opt <= row.moved.at("static");
      below_lru = below_lru || opt < row.moved.at("lru");
      below_static = below_static || opt < row.moved.at("static");
      worst_critical = std::max(worst_critical, row.critical_fraction_opt);
      worst_stall_ratio = std::max(worst_stall_ratio, row.stall_ratio_opt);
      worst_critical_hybrid = std::max(worst_critical_hybrid, row.critical_fraction_hybrid);
      const uint64_t st = row.moved.at("static");
      if (st < granule || st - granule < row.bound) static_least.push_back(row.fraction);
    }
    nlohmann::ordered_json s;
    s["bench"] = "placement_summary";
    s["model"] = model.name;
    s["feasible_fractions"] = rows.size();
    s["opt_worst_ratio_to_lower_bound"] = worst_ratio;
    s["opt_never_above_lru_or_static"] = never_above;
    s["opt_strictly_below_lru_somewhere"] = below_lru;
    s["opt_strictly_below_static_somewhere"] = below_static;
    s["chunk_bytes_granule"] = granule;
    // Budgets at which static moves the least any schedule can (above).
    s["static_least_possible_fractions"] = static_least;
    s["opt_worst_critical_fraction"] = worst_critical;
    s["opt_hybrid_worst_critical_fraction"] = worst_critical_hybrid;
    s["stall_seconds_lower_bound"] = stall_bound;
    s["opt_worst_stall_ratio_to_lower_bound"] = worst_stall_ratio;
    std::cout << (o.json ? s.dump() : s.dump(1)) << "\n";
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

// Registers the `placement` subcommand on `app`; *run runs it once parsed.
CLI::App* add_placement_subcommand(CLI::App& app, std::function<int()>* run) {
  auto o = std::make_shared<PlacementOptions>();
  std::string names;
  for (const auto& m : model_presets()) names += (names.empty() ? "" : ", ") + m.name;
  CLI::App* sub = app.add_subcommand(
      "placement", "bytes moved per policy on GPT traces (dry run, virtual clock) vs an independent optimum");
  sub->add_option("--models", o->models, "comma-separated model names, or all (" + names + ")")->capture_default_str();
  sub->add_option("--fractions", o->fractions, "budgets as fractions of the compute-dtype chunk bytes")
      ->capture_default_str();
  sub->add_option("--iterations", o->iterations, "TRAIN iterations replayed (the last is reported)")
      ->capture_default_str();
  sub->add_option("--tflops", o->tflops, "modelled compute throughput, TFLOP/s")->capture_default_str();
  sub->add_option("--h2d-gbps", o->h2d_gbps, "modelled link bandwidth each way, GB/s")->capture_default_str();
  sub->add_option("--host-update-gbps", o->host_update_gbps,
                  "modelled CPU update rate, GB/s of Adam's traffic (0: the update takes no time)")
      ->capture_default_str();
  sub->add_flag("--json", o->json, "one JSON object per line");
  *run = [o] { return run_placement(*o); };
  return sub;
}

}  // namespace pstar::bench
