// pstar-bench overlap: iterations with the synchronous and the overlapped
// step (pstar_x_engine_set_overlap_step), the caller's compute modelled.
//
//   pstar-bench overlap [--layers 16] [--layer-elems 4194304] [--grad-write]
//                       [--ratios 0.5,1,2,4] [--iters 5] [--reps 5] [--json]
//
// A GPT-shaped replay on the emulated device with unlimited capacity:
// `layers` trainable parameters of `layer-elems` fp16 elements, one chunk
// each.  A TRAIN iteration acquires them in order for FORWARD and in
// reverse for BACKWARD; the caller's compute for each use is the calling
// thread sleeping (as beside a GPU, whose kernels leave the host free; as
// in `pstar-bench gather`); the caller writes no gradient, so each
// parameter's gradient is zero, which the engine writes into the slot at
// the last use without a pass over an accumulator (the update's arithmetic
// does not depend on the values).  With --grad-write the caller hands an
// fp16 gradient from its own device buffer at each BACKWARD use
// (pstar_grad_write, PSTAR_MEM_DEVICE, as pstar.torch does), and the
// engine zeroes an accumulator, adds it and finalizes it.  The
// step moves every trained chunk to the host for the CPU optimizer, as on
// a GPU.
//
// Two engines with the same model, one synchronous and one overlapped, run
// in the same process.  First the Adam time: the synchronous pstar_step's
// median over `iters` iterations without compute (adam_s).  Then, for each
// ratio R, the compute per iteration is R * adam_s, split evenly over the
// 2 * layers uses, and the engines take turns, `reps` times: a block on
// one, then on the next.  A block is the steady state of training: one
// untimed lead-in iteration leaves its step in flight, then `iters`
// iterations are timed from the first one's begin to the last one's
// pstar_step return, so each timed forward waits for the step before it,
// and the block then waits for its last step, untimed, before the next
// engine runs (pstar_x_step_get_stats).  iteration_s_* are the medians
// over the reps of timed block time / iters; speedup is their ratio.
// exposed_optimizer_fraction is what the caller of the overlapped engine
// waits for the optimizer's work per timed iteration, over adam_s, timed
// on the caller's side: the seconds in pstar_step and in FORWARD acquires
// (an acquire waits for its chunk's update and then for the updated
// weights' copy to the device).  optimizer_wait_fraction_sync is the same
// for the synchronous engine (about 1: its whole step).
// step_wait_fraction counts only what the engine's step counter sees
// (pstar_x_step_stats.wait_seconds, less the drain's wall time), not the
// copy after the update; until 2026-12-04 that counter, with the drain in
// it, was reported as exposed_optimizer_fraction.
//
// adam_s is timed with the emulated device idle: each calibration
// iteration sleeps kCalibrationSettleS before its pstar_step, so that the
// step's time is the update (and the last gradient's finalize), not the
// backward's copies still queued on the emulated device's streams when
// the backward has no compute to run beside them.  adam_s_queued is the
// same step timed right after a backward without compute (how adam_s was
// timed until 2026-12-04: up to 1.9x adam_s on this machine, which sized
// every ratio's compute too large and the bounds with it).
//
// A third engine overlaps its step with the speculative update
// (pstar_x_engine_set_speculative_update, no bound on its memory): the
// *_speculative keys, with the share of chunk updates it kept (over every
// iteration of its blocks, lead-ins included) and how many
// it discarded: the replay neither clips nor overflows, so every discard
// is a speculation that had not completed when its step came (the step
// updates that chunk in place instead).
//
// The bounds that come with each line.  ideal_speedup, (1 + R) / max(1, R), is
// the update hidden under the whole compute.  first_use_bound_speedup is
// what the overlapped step can reach here: the updates start once the
// backward's norm decides skip and clip, and a chunk's forward use needs
// its update, so an iteration takes at least the backward's compute (R/2)
// plus the longer of the forward's compute (R/2) and the update (1):
// (1 + R) / (R/2 + max(R/2, 1)), in units of adam_s, the engines' own
// copies and gradient work left out.  engine_overhead_fraction_sync is
// that work as the synchronous engine pays it (its iteration less the
// requested compute and its step, over adam_s), and
// first_use_bound_with_overhead_speedup the first-use bound with it added
// to both engines' iterations.  speculative_bound_speedup: with the
// updates starting as each chunk's backward ends, the backward hides
// min(R/2, 1) of them; when they run in hand-over order (the backward's,
// as until 2026-12-04) the rest, u = max(0, 1 - R/2), belong to the first
// chunks of the forward and gate it: (1 + R) / (R/2 + max(u, u R/2) +
// (1 - u) R/2), 1.6 at R = 1 and 1.5 (the ideal) at R = 2.  The update
// thread now starts the released chunk the forward needs first; that
// schedule, modelled chunk by chunk (speculative_schedule), gives
// speculative_priority_model_speedup and the forward's waits in it,
// speculative_priority_model_exposed (in adam_s); speculative_handover_*
// are the same model in hand-over order.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <pstar/pstar.h>

#include "bench_util.h"

namespace pstar::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds a calibration iteration sleeps before its pstar_step, for the
// emulated device's queued copies and gradient work to finish (16 chunks
// of 4M elements take about 0.06 s of it here).
constexpr double kCalibrationSettleS = 0.1;

struct OverlapOptions {
  int layers = 16;
  double layer_elems = 4194304;
  std::string ratios = "0.5,1,2,4";
  int iters = 5;
  int reps = 5;
  int threads = 1;
  bool grad_write = false;
  bool json = false;
};

#define PSTAR_CHECK(call) check((call), #call)

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The speculative engine's schedule as a model, in units of adam_s: n
// chunks, each update 1/n, each use R/(2n) of compute; the backward
// releases chunks n-1 .. 0 (chunk j at the end of its use), the update
// thread runs one update at a time, starting among the released chunks not
// yet updated the one the forward uses first (Job::priority), idle until
// the next release when none is; the forward starts when the backward ends
// (the step returns at once) and each use waits for its chunk's update.
// Returns the iteration time and sets *forward_wait to the forward's
// waits.  The engines' own copies and gradient work are left out.
// by_priority false: the released chunks in hand-over order instead (the
// update thread's order until 2026-12-04) until the backward ends; the
// step's own jobs then run in first-use order either way.
double speculative_schedule(double ratio, int n, bool by_priority, double* forward_wait) {
  const double use = ratio / (2.0 * n), update = 1.0 / n;
  std::vector<double> released(n), done(n, -1.0);
  for (int i = 0; i < n; ++i) released[n - 1 - i] = (i + 1) * use;  // backward order n-1 .. 0
  const double backward_end = n * use;
  double t = 0.0;
  for (int left = n; left > 0; --left) {
    int pick = -1;
    double next_release = 1e300;
    for (int j = 0; j < n; ++j) {
      if (done[j] >= 0) continue;
      if (released[j] <= t + 1e-12) {
        // The least index is the forward's first use; the greatest, the
        // earliest handed over.
        // After the backward the step's jobs run in first-use order.
        if (pick < 0 || (!by_priority && t < backward_end - 1e-12)) pick = j;
      } else {
        next_release = std::min(next_release, released[j]);
      }
    }
    if (pick < 0) {
      t = next_release;
      ++left;
      continue;
    }
    t += update;
    done[pick] = t;
  }
  double f = backward_end;
  *forward_wait = 0.0;
  for (int j = 0; j < n; ++j) {
    if (done[j] > f) {
      *forward_wait += done[j] - f;
      f = done[j];
    }
    f += use;
  }
  return f;
}

class Model {
 public:
  // speculate: pstar_x_engine_set_speculative_update with no bound.
  Model(const OverlapOptions& o, bool overlap, bool speculate = false)
      : layers_(static_cast<uint32_t>(o.layers)), layer_elems_(static_cast<uint64_t>(o.layer_elems)) {
    pstar_engine_options opts;
    PSTAR_CHECK(pstar_engine_options_init(&opts));
    opts.device = PSTAR_DEVICE_EMULATED;
    opts.device_capacity_bytes = 0;  // unlimited
    opts.compute_dtype = PSTAR_DTYPE_F16;
    opts.chunk_elems = static_cast<uint64_t>(o.layer_elems);
    opts.threads = static_cast<uint32_t>(o.threads);
    PSTAR_CHECK(pstar_engine_create(&opts, &e_));
    PSTAR_CHECK(pstar_x_engine_set_overlap_step(e_, overlap ? 1 : 0));
    PSTAR_CHECK(pstar_x_engine_set_speculative_update(e_, speculate ? UINT64_MAX : 0));
    const int64_t shape[1] = {static_cast<int64_t>(o.layer_elems)};
    ids_.resize(layers_);
    for (uint32_t i = 0; i < layers_; ++i) {
      const std::string name = "layer" + std::to_string(i);
      PSTAR_CHECK(pstar_param_register(e_, name.c_str(), 1, shape, 0, &ids_[i]));
    }
    PSTAR_CHECK(pstar_engine_build(e_));
    PSTAR_CHECK(pstar_engine_compute_stream(e_, &stream_));
    // The caller's gradient (fp16 1/1024, bits 0x1400): the emulated
    // device's memory is host memory.
    if (o.grad_write) grad_.assign(layer_elems_, uint16_t{0x1400});
  }
  ~Model() { pstar_engine_destroy(e_); }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // One TRAIN iteration with `use_s` seconds of compute per use and
  // `settle_s` more before pstar_step; returns the seconds pstar_step took.
  double iteration(double use_s, double settle_s = 0) {
    PSTAR_CHECK(pstar_iteration_begin(e_, PSTAR_ITERATION_TRAIN));
    void* ptr = nullptr;
    for (uint32_t i = 0; i < layers_; ++i) {
      auto t = Clock::now();
      PSTAR_CHECK(pstar_param_acquire(e_, ids_[i], PSTAR_STAGE_FORWARD, stream_, &ptr));
      optimizer_wait_s_ += lap(&t, kForwardAcquire);
      compute(use_s);
      lap(&t, kCompute);
      PSTAR_CHECK(pstar_param_release(e_, ids_[i], stream_));
      lap(&t, kForwardRelease);
    }
    for (uint32_t i = layers_; i-- > 0;) {
      auto t = Clock::now();
      PSTAR_CHECK(pstar_param_acquire(e_, ids_[i], PSTAR_STAGE_BACKWARD, stream_, &ptr));
      lap(&t, kBackwardAcquire);
      compute(use_s);
      lap(&t, kCompute);
      if (!grad_.empty()) {
        PSTAR_CHECK(
            pstar_grad_write(e_, ids_[i], grad_.data(), layer_elems_, PSTAR_DTYPE_F16, PSTAR_MEM_DEVICE, stream_));
        lap(&t, kGradWrite);
      }
      PSTAR_CHECK(pstar_param_release(e_, ids_[i], stream_));
      lap(&t, kBackwardRelease);
    }
    compute(settle_s);
    auto t0 = Clock::now();
    pstar_step_result r;
    PSTAR_CHECK(pstar_step_result_init(&r));
    PSTAR_CHECK(pstar_step(e_, &r));
    const double step_s = lap(&t0, kStep);
    optimizer_wait_s_ += step_s;
    return step_s;
  }
  // Seconds the caller spent in pstar_step and in FORWARD acquires, summed
  // since the engine was built: what it waited for the optimizer's work
  // (the update, and the updated weights' copy to the device), measured on
  // the caller's side.
  double optimizer_wait_seconds() const { return optimizer_wait_s_; }
  // Where the caller's time went, summed since the engine was built, by
  // part (Part): the compute's sleeps (with their overshoot) and each kind
  // of engine call.
  enum Part {
    kCompute,
    kForwardAcquire,
    kForwardRelease,
    kBackwardAcquire,
    kGradWrite,
    kBackwardRelease,
    kStep,
    kParts
  };
  static const char* part_name(int part) {
    static const char* const names[kParts] = {
        "compute", "forward_acquire", "forward_release", "backward_acquire", "grad_write", "backward_release", "step"};
    return names[part];
  }
  std::vector<double> caller_seconds() const { return std::vector<double>(parts_s_, parts_s_ + kParts); }
  // Waits for the step in flight; returns the step statistics.
  pstar_x_step_stats stats() {
    pstar_x_step_stats s;
    PSTAR_CHECK(pstar_x_step_stats_init(&s));
    PSTAR_CHECK(pstar_x_step_get_stats(e_, &s));
    return s;
  }

 private:
  static void compute(double s) {
    if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
  }
  // Adds the seconds since *t to `part`, sets *t to now, returns them.
  double lap(Clock::time_point* t, Part part) {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - *t).count();
    parts_s_[part] += s;
    *t = now;
    return s;
  }
  uint32_t layers_;
  uint64_t layer_elems_;
  std::vector<uint16_t> grad_;  // --grad-write: the caller's fp16 gradient
  double optimizer_wait_s_ = 0.0;
  double parts_s_[kParts] = {};
  pstar_engine* e_ = nullptr;
  void* stream_ = nullptr;
  std::vector<uint32_t> ids_;
};

std::vector<double> parse_ratios(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    const double r = std::stod(item, &used);
    if (used != item.size() || !(r > 0)) throw std::invalid_argument("ratio '" + item + "'");
    out.push_back(r);
  }
  if (out.empty()) throw std::invalid_argument("no ratio");
  return out;
}

int run_overlap(const OverlapOptions& o) {
  std::vector<double> ratios;
  try {
    ratios = parse_ratios(o.ratios);
  } catch (const std::exception& e) {
    std::cerr << "pstar-bench overlap: --ratios: " << e.what() << "\n";
    return 2;
  }
  if (o.layers < 1 || o.iters < 1 || o.reps < 1 || !(o.layer_elems >= 1024)) {
    std::cerr << "pstar-bench overlap: --layers, --iters and --reps must be at least 1, --layer-elems 1024\n";
    return 2;
  }
  Model sync(o, false), overlap(o, true), speculative(o, true, true);
  const pstar_x_step_stats probe = overlap.stats();
  if (probe.overlap == 0) {
    std::cerr << "pstar-bench overlap: the engine does not overlap its step here\n";
    return 1;
  }
  // Warm-up: two iterations each record the trace and reach steady state.
  for (int i = 0; i < 2; ++i) {
    sync.iteration(0);
    overlap.iteration(0);
    speculative.iteration(0);
  }
  overlap.stats();
  speculative.stats();
  std::vector<double> steps, steps_queued;
  for (int i = 0; i < o.iters; ++i) {
    steps.push_back(sync.iteration(0, kCalibrationSettleS));
    steps_queued.push_back(sync.iteration(0));
  }
  const double adam_s = median(steps);
  const double adam_s_queued = median(steps_queued);
  const double uses = 2.0 * o.layers;

  for (double ratio : ratios) {
    const double use_s = ratio * adam_s / uses;
    // One block (see the top of this file), per timed iteration.
    struct Block {
      double iteration_s;
      double optimizer_wait_s;  // caller side: Model::optimizer_wait_seconds
      double step_wait_s;       // engine side: pstar_x_step_stats.wait_seconds less the drain
      double update_s;          // pstar_x_step_stats.update_seconds, per step
      uint64_t speculated, discarded;
      std::vector<double> caller_s;  // Model::caller_seconds per timed iteration
    };
    auto block = [&](Model& m) {
      const pstar_x_step_stats before = m.stats();
      m.iteration(use_s);  // lead-in: its step stays in flight
      const double waited0 = m.optimizer_wait_seconds();
      const std::vector<double> parts0 = m.caller_seconds();
      const auto t0 = Clock::now();
      for (int i = 0; i < o.iters; ++i) m.iteration(use_s);
      Block b{};
      b.caller_s = m.caller_seconds();
      for (size_t k = 0; k < b.caller_s.size(); ++k) b.caller_s[k] = (b.caller_s[k] - parts0[k]) / o.iters;
      b.iteration_s = seconds_since(t0) / o.iters;
      b.optimizer_wait_s = (m.optimizer_wait_seconds() - waited0) / o.iters;
      const auto drain0 = Clock::now();
      const pstar_x_step_stats after = m.stats();  // waits for the last step
      const double drain_s = seconds_since(drain0);
      b.step_wait_s = std::max(0.0, after.wait_seconds - before.wait_seconds - drain_s) / o.iters;
      b.update_s = (after.update_seconds - before.update_seconds) / (o.iters + 1);
      b.speculated = after.chunks_speculated - before.chunks_speculated;
      b.discarded = after.speculations_discarded - before.speculations_discarded;
      return b;
    };
    std::vector<double> t_sync, serial_sync, t_overlap, exposed, step_wait, update_s, t_spec, exposed_spec;
    uint64_t kept = 0, discarded = 0;
    // caller[engine][part]: one sample per rep, in adam_s.
    std::vector<std::vector<double>> caller[3];
    for (auto& c : caller) c.assign(Model::kParts, {});
    auto note_caller = [&](int engine, const Block& b) {
      for (int k = 0; k < Model::kParts; ++k) caller[engine][k].push_back(b.caller_s[k] / adam_s);
    };
    for (int rep = 0; rep < o.reps; ++rep) {
      const Block bs = block(sync);
      note_caller(0, bs);
      t_sync.push_back(bs.iteration_s);
      serial_sync.push_back(bs.optimizer_wait_s / adam_s);
      const Block bo = block(overlap);
      t_overlap.push_back(bo.iteration_s);
      exposed.push_back(bo.optimizer_wait_s / adam_s);
      step_wait.push_back(bo.step_wait_s / adam_s);
      update_s.push_back(bo.update_s);
      note_caller(1, bo);
      const Block bp = block(speculative);
      note_caller(2, bp);
      t_spec.push_back(bp.iteration_s);
      exposed_spec.push_back(bp.optimizer_wait_s / adam_s);
      kept += bp.speculated;
      discarded += bp.discarded;
    }
    const double s = median(t_sync), v = median(t_overlap), x = median(exposed);
    const double vs = median(t_spec), xs = median(exposed_spec);
    // Speculation: the updates run from the first chunk's end of backward,
    // so the backward's compute (R/2) hides min(R/2, 1) of them; the rest,
    // a fraction u of the chunks, the first ones of the forward, gate it.
    const double u = std::max(0.0, 1.0 - ratio / 2);
    const double speculative_bound = (1.0 + ratio) / (ratio / 2 + std::max(u, u * ratio / 2) + (1 - u) * ratio / 2);
    double priority_wait = 0.0, handover_wait = 0.0;
    const double priority_iteration = speculative_schedule(ratio, o.layers, true, &priority_wait);
    const double handover_iteration = speculative_schedule(ratio, o.layers, false, &handover_wait);
    const double ideal = (1.0 + ratio) / std::max(1.0, ratio);
    const double first_use_bound = (1.0 + ratio) / (ratio / 2 + std::max(ratio / 2, 1.0));
    // The synchronous engine's iteration outside the requested compute and
    // its step, in adam_s: the engine's own per-use work (on the emulated
    // device the gradient finalize and the copies run on this machine's
    // cores) and the sleeps' overshoot.  The first-use bound with it added
    // to both sides assumes the overlapped engine pays the same.
    const double overhead = std::max(0.0, s / adam_s - ratio - median(serial_sync));
    const double first_use_bound_with_overhead = (s / adam_s) / (ratio / 2 + std::max(ratio / 2, 1.0) + overhead);
    if (o.json) {
      nlohmann::json j;
      j["bench"] = "overlap";
      j["compute_to_adam"] = ratio;
      j["layers"] = o.layers;
      j["layer_elems"] = static_cast<uint64_t>(o.layer_elems);
      j["adam_s"] = adam_s;
      j["adam_s_queued"] = adam_s_queued;
      j["update_s_overlap"] = median(update_s);
      j["iteration_s_sync"] = s;
      j["iteration_s_overlap"] = v;
      j["speedup"] = s / v;
      j["exposed_optimizer_fraction"] = x;
      j["step_wait_fraction"] = median(step_wait);
      j["optimizer_wait_fraction_sync"] = median(serial_sync);
      j["ideal_speedup"] = ideal;
      j["first_use_bound_speedup"] = first_use_bound;
      j["engine_overhead_fraction_sync"] = overhead;
      j["first_use_bound_with_overhead_speedup"] = first_use_bound_with_overhead;
      j["iteration_s_speculative"] = vs;
      j["speedup_speculative"] = s / vs;
      j["exposed_optimizer_fraction_speculative"] = xs;
      j["speculative_bound_speedup"] = speculative_bound;
      j["speculative_priority_model_speedup"] = (1.0 + ratio) / priority_iteration;
      j["speculative_priority_model_exposed"] = priority_wait;
      j["speculative_handover_model_speedup"] = (1.0 + ratio) / handover_iteration;
      j["speculative_handover_model_exposed"] = handover_wait;
      j["chunks_speculated_fraction"] =
          static_cast<double>(kept) / (static_cast<double>(o.reps) * (o.iters + 1) * static_cast<double>(o.layers));
      j["speculations_discarded"] = discarded;
      j["samples_speculative_s"] = t_spec;
      // Where each engine's caller spent a timed iteration, by part, in
      // adam_s (medians over the reps; the parts' medians need not add up
      // to the iteration's).
      const char* const engine_names[3] = {"caller_sync", "caller_overlap", "caller_speculative"};
      for (int engine = 0; engine < 3; ++engine) {
        nlohmann::json parts;
        for (int k = 0; k < Model::kParts; ++k) parts[Model::part_name(k)] = median(caller[engine][k]);
        j[engine_names[engine]] = parts;
      }
      j["iters"] = o.iters;
      j["threads"] = o.threads;
      j["grad_write"] = o.grad_write;
      j["reps"] = o.reps;
      j["samples_sync_s"] = t_sync;
      j["samples_overlap_s"] = t_overlap;
      j["library_version"] = pstar_version_string();
      std::cout << j.dump() << std::endl;
    } else {
      std::printf(
          "overlap: compute/adam %.2f: iteration %.4f s sync, %.4f s overlapped: speedup %.3f (ideal %.3f, "
          "first-use bound %.3f), exposed optimizer %.3f of adam_s %.4f s; speculative %.4f s: speedup %.3f "
          "(bound %.3f), exposed %.3f\n",
          ratio, s, v, s / v, ideal, first_use_bound, x, adam_s, vs, s / vs, speculative_bound, xs);
    }
  }
  return 0;
}

}  // namespace

CLI::App* add_overlap_subcommand(CLI::App& app, std::function<int()>* run) {
  auto o = std::make_shared<OverlapOptions>();
  CLI::App* cmd =
      app.add_subcommand("overlap", "iterations with the synchronous and the overlapped step, compute modelled");
  cmd->add_option("--layers", o->layers, "trainable parameters, one chunk each")->capture_default_str();
  cmd->add_option("--layer-elems", o->layer_elems, "elements per parameter (fp16)")->capture_default_str();
  cmd->add_option("--ratios", o->ratios, "compute per iteration over Adam time, comma-separated")
      ->capture_default_str();
  cmd->add_option("--iters", o->iters, "TRAIN iterations per block")->capture_default_str();
  cmd->add_option("--reps", o->reps, "blocks per engine and ratio (medians reported)")->capture_default_str();
  cmd->add_option("--threads", o->threads, "the CPU update's threads (options.threads; 0: one per core)")
      ->capture_default_str();
  cmd->add_flag("--grad-write", o->grad_write,
                "the caller writes an fp16 device gradient at each BACKWARD use (pstar_grad_write)");
  cmd->add_flag("--json", o->json, "one JSON object on stdout per ratio");
  *run = [o] {
    try {
      return run_overlap(*o);
    } catch (const CallError& e) {
      std::cerr << "pstar-bench overlap: " << e.what() << "\n";
      return 1;
    }
  };
  return cmd;
}

}  // namespace pstar::bench
