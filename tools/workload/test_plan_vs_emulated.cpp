// The planner's figures against a run with payloads.
//
// The planner (pstar-plan) replays a workload on a dry-run engine: no
// payloads, a virtual clock, modelled bandwidths.  Here the same workload
// and options run twice, once dry and once on the emulated device with
// payloads (dry_run = 0, virtual_clock = 1: real chunks, real copies, real
// gradients and Adam steps), on two small shapes at a capacity that forces
// evictions, with hybrid optimizer placement off and on, and on the first
// shape also with hybrid placement at a capacity that leaves room for about
// half of the optimizer state.  The predicted bytes moved, peaks, optimizer
// state placed and modelled clock must equal the real run's.  The
// workload's own figures are checked against their closed forms first.
//
// A plain executable: prints what failed and returns 1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "gpt_workload.h"
#include "replay.h"

namespace {

using namespace pstar::workload;

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

template <class T>
void expect_eq(T a, T b, const std::string& what) {
  expect(a == b, what + ": " + std::to_string(a) + " != " + std::to_string(b));
}

void expect_near(double a, double b, const std::string& what) {
  expect(std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(b)),
         what + ": " + std::to_string(a) + " != " + std::to_string(b));
}

// Closed forms of the workload: parameter count, FLOPs (Narayanan et al.
// 2021: 24 N h^2 + 4 b s^2 h per layer forward, plus the head's 2 N V h),
// Korthikanti et al.'s per-layer activations, one moment per acquire, and
// legal use counts (every parameter: backward uses = forward uses).
void check_workload(const GptShape& g) {
  const std::string tag = "shape " + std::to_string(g.layers) + "x" + std::to_string(g.hidden) + ": ";
  const Workload w = make_gpt(g);
  expect_eq<uint64_t>(w.param_elems, gpt_param_count(g), tag + "parameter count");
  expect_eq<size_t>(w.params.size(), size_t(12) * g.layers + 4, tag + "parameters registered");
  const double N = double(g.seq) * g.batch, h = g.hidden, s = g.seq, b = g.batch;
  const double fwd = g.layers * (24.0 * N * h * h + 4.0 * b * s * s * h) + 2.0 * N * g.vocab * h;
  expect_near(w.flops_forward, fwd, tag + "forward FLOPs");
  expect_near(w.flops_backward, 2.0 * fwd, tag + "backward FLOPs");
  expect_near(w.flops_recompute, g.checkpointing ? fwd - 2.0 * N * g.vocab * h : 0.0, tag + "recompute FLOPs");
  if (g.dtype_bytes == 2) {
    const double a = g.heads;
    const double korthikanti = s * b * h * (34.0 + 5.0 * a * s / h);
    expect_near(double(layer_activation_bytes(g)), korthikanti, tag + "per-layer activations (Korthikanti)");
  }
  std::vector<int> fwd_uses(w.params.size()), bwd_uses(w.params.size());
  uint64_t acquires = 0;
  for (const Use& u : w.schedule) {
    acquires += u.params.size();
    for (uint32_t p : u.params) {
      if (u.stage == Stage::Forward) ++fwd_uses[p];
      if (u.stage == Stage::Backward) ++bwd_uses[p];
    }
    expect(u.grad_write == (u.stage == Stage::Backward), tag + "gradients are written in backward only");
  }
  expect_eq<uint64_t>(w.moments, acquires, tag + "moments");
  for (size_t p = 0; p < w.params.size(); ++p) {
    expect_eq(fwd_uses[p], bwd_uses[p], tag + w.params[p].name + " backward uses = forward uses");
    expect_eq(fwd_uses[p], p == 0 ? 2 : 1, tag + w.params[p].name + " forward uses (wte is tied)");
  }
  // The activation peak: with checkpointing, all checkpoints plus one
  // layer's activations and the backward workspace bound it from below.
  const uint64_t T = uint64_t(s * b * h) * g.dtype_bytes;
  if (g.checkpointing)
    expect(w.peak_nonmodel_bytes >= uint64_t(g.layers - 1) * T + layer_activation_bytes(g),
           tag + "checkpointed peak holds the checkpoints and one layer");
  else
    expect(w.peak_nonmodel_bytes >= uint64_t(g.layers) * layer_activation_bytes(g),
           tag + "peak holds every layer's activations");
}

// Capacity: below the model's needs (chunks evicted and fetched every
// iteration), or roomy (everything resident, and room for about half of the
// optimizer state above an unlimited run's peak).
enum class Capacity { kTight, kRoomy };

void compare(const GptShape& g, uint64_t chunk_elems, bool hybrid, Capacity mode) {
  const std::string tag = "shape " + std::to_string(g.layers) + "x" + std::to_string(g.hidden) +
                          (g.checkpointing ? " checkpointed" : "") + (hybrid ? ", hybrid" : "") +
                          (mode == Capacity::kRoomy ? ", roomy" : "") + ": ";
  const Workload w = make_gpt(g);

  ReplayConfig cfg;
  cfg.options.device = PSTAR_DEVICE_EMULATED;
  cfg.options.chunk_elems = chunk_elems;
  cfg.options.compute_dtype = compute_dtype_for(g.dtype_bytes);
  cfg.options.threads = 1;
  cfg.options.h2d_bytes_per_s = 1e9;
  cfg.options.d2h_bytes_per_s = 0.8e9;
  cfg.iterations = 3;  // warm-up, then two traced iterations
  cfg.flops_per_s = 1e12;
  // The planner's form: host time for the state left on the host, as a
  // function of the state the engine holds on the device at the step.
  const double host_s_per_byte = 1e-4 / 1e6;
  cfg.optimizer_seconds_fn = [host_s_per_byte](const pstar_stats& s) {
    const double on_host = double(3 * s.optimizer_list_bytes - s.optimizer_device_bytes);
    return on_host * host_s_per_byte;
  };
  cfg.options.hybrid_optimizer = hybrid ? 1 : 0;

  // Capacity: what an unlimited dry run peaks at, less room for all but a
  // few chunks, so that chunks are evicted and fetched every iteration.
  ReplayConfig probe = cfg;
  probe.options.dry_run = 1;
  probe.options.hybrid_optimizer = 0;
  const ReplayResult unlimited = replay(w, probe);
  expect(unlimited.ok(), tag + "unlimited dry run: " + unlimited.message);
  const uint64_t chunk_bytes = chunk_elems * g.dtype_bytes;
  const uint64_t list = unlimited.built.compute_list_bytes;
  const uint64_t opt_state = 3 * unlimited.built.optimizer_list_bytes;
  const uint64_t capacity = mode == Capacity::kTight ? unlimited.final_stats.peak_device_bytes - list + 4 * chunk_bytes
                                                     : unlimited.final_stats.peak_device_bytes + opt_state / 2;
  cfg.options.device_capacity_bytes = capacity;

  ReplayConfig dry = cfg;
  dry.options.dry_run = 1;
  ReplayConfig real = cfg;
  real.options.dry_run = 0;
  real.options.virtual_clock = 1;
  const ReplayResult p = replay(w, dry);
  const ReplayResult r = replay(w, real);
  expect(p.ok(), tag + "dry run failed: " + p.failed_call + ": " + p.message);
  expect(r.ok(), tag + "run with payloads failed: " + r.failed_call + ": " + r.message);
  if (!p.ok() || !r.ok()) return;

  if (mode == Capacity::kTight) expect(r.last.evictions > 0, tag + "the capacity forces evictions");
  const pstar_stats& ps = p.final_stats;
  const pstar_stats& rs = r.final_stats;
  expect_eq(ps.optimizer_chunks_on_device, rs.optimizer_chunks_on_device, tag + "optimizer chunks on the device");
  expect_eq(ps.optimizer_device_bytes, rs.optimizer_device_bytes, tag + "optimizer bytes on the device");
  expect_eq(ps.host_bytes, rs.host_bytes, tag + "host bytes at the end");
  if (!hybrid) {
    expect_eq<uint64_t>(rs.optimizer_device_bytes, 0, tag + "no optimizer state on the device without hybrid");
  } else if (mode == Capacity::kTight) {
    // Four chunks above the device's need leave less than one chunk's
    // state beside the need peak and the streaming reserve: nothing placed.
    expect_eq<uint32_t>(rs.optimizer_chunks_on_device, 0, tag + "nothing placed when the cache fills the device");
  } else {
    expect(rs.optimizer_chunks_on_device > 0 && rs.optimizer_chunks_on_device < rs.optimizer_chunks,
           tag + "some but not all optimizer chunks placed (" + std::to_string(rs.optimizer_chunks_on_device) + " of " +
               std::to_string(rs.optimizer_chunks) + ")");
    // The margin is sized from the need, not from what the cache left:
    // more state than the room above the unlimited peak, within capacity.
    expect(rs.optimizer_device_bytes > opt_state / 2, tag + "cached chunks gave way to the state");
    expect(rs.peak_device_bytes <= capacity, tag + "the device peak within the capacity");
    // The chunks whose state stays on the host go there, once, for the CPU
    // optimizer; the cached chunks that gave way to the state leave too.
    expect(r.last.evictions >= rs.optimizer_chunks - rs.optimizer_chunks_on_device,
           tag + "evicted at least for the CPU optimizer");
    // The planner's host model: the host holds the compute list and the
    // masters through warm-up; Adam's moments come with a chunk's first
    // update, and the chunks placed at that step (before it) never have them
    // there.  So the peak is the larger of the warm-up's and the steady
    // state's (the masters placed chunks left stay cached in the host pool,
    // which counts them), below that of hybrid off.
    const uint64_t one_list = unlimited.built.optimizer_list_bytes;
    const uint64_t placed = rs.optimizer_device_bytes;
    const uint64_t steady = 3 * one_list > placed ? 3 * one_list - placed : 0;
    expect(rs.peak_host_bytes >= list + std::max(one_list, steady),
           tag + "the host peak holds the masters, and the moments of the chunks on the host");
    expect(rs.peak_host_bytes < unlimited.final_stats.peak_host_bytes, tag + "the placement lowers the host peak");
  }
  expect_eq<uint64_t>(r.last.trace_fallbacks, 0, tag + "no trace fallback");
  expect_eq(p.last.bytes_host_to_device, r.last.bytes_host_to_device, tag + "bytes host to device");
  expect_eq(p.last.bytes_device_to_host, r.last.bytes_device_to_host, tag + "bytes device to host");
  expect_eq(p.last.bytes_prefetched, r.last.bytes_prefetched, tag + "bytes prefetched");
  expect_eq(p.last.bytes_critical, r.last.bytes_critical, tag + "bytes on the critical path");
  expect_eq(p.last.moves_to_device, r.last.moves_to_device, tag + "moves to device");
  expect_eq(p.last.evictions, r.last.evictions, tag + "evictions");
  expect_eq(p.final_stats.bytes_host_to_device, r.final_stats.bytes_host_to_device, tag + "total bytes to device");
  expect_eq(p.final_stats.peak_device_bytes, r.final_stats.peak_device_bytes, tag + "peak device bytes");
  expect_eq(p.final_stats.peak_device_chunk_bytes, r.final_stats.peak_device_chunk_bytes,
            tag + "peak device chunk bytes");
  expect_eq(p.final_stats.peak_host_bytes, r.final_stats.peak_host_bytes, tag + "peak host bytes");
  expect_near(p.last.clock_seconds, r.last.clock_seconds, tag + "modelled iteration seconds");
  expect_near(p.last.wait_seconds, r.last.wait_seconds, tag + "modelled wait seconds");
  expect(p.final_stats.peak_device_bytes <= capacity, tag + "device peak within capacity");
  // The modelled iteration is at least its compute and optimizer time.
  const double opt_s = cfg.optimizer_seconds_fn(ps);
  expect(p.last.clock_seconds >= p.compute_seconds + opt_s - 1e-12,
         tag + "iteration time covers compute and the optimizer");
  std::printf(
      "%smoved %llu bytes per iteration (%llu evictions), device peak %llu of %llu, optimizer state on the device "
      "%llu bytes (%u of %u chunks), iteration %.6f s\n",
      tag.c_str(), (unsigned long long)p.last.bytes_moved(), (unsigned long long)p.last.evictions,
      (unsigned long long)ps.peak_device_bytes, (unsigned long long)capacity,
      (unsigned long long)ps.optimizer_device_bytes, ps.optimizer_chunks_on_device, ps.optimizer_chunks,
      p.last.clock_seconds);
}

}  // namespace

int main() {
  pstar_log_set_callback(nullptr, nullptr, PSTAR_LOG_ERROR);
  GptShape a;
  a.layers = 3;
  a.hidden = 64;
  a.heads = 4;
  a.vocab = 256;
  a.seq = 32;
  a.batch = 2;
  a.checkpointing = true;
  GptShape b;
  b.layers = 2;
  b.hidden = 96;
  b.heads = 3;
  b.vocab = 200;
  b.seq = 16;
  b.batch = 3;
  b.checkpointing = false;
  b.dtype_bytes = 4;
  check_workload(a);
  check_workload(b);
  for (bool hybrid : {false, true}) {
    compare(a, 16384, hybrid, Capacity::kTight);
    compare(b, 4 * 96 * 96, hybrid, Capacity::kTight);
  }
  compare(a, 16384, true, Capacity::kRoomy);
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("planner figures equal the emulated run's\n");
  return 0;
}
