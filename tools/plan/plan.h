// pstar-plan's internal header: the types its files share (the hardware,
// presets and arguments it reads; one dry run's evaluation; the planner that
// runs and caches them; the plan the searches produce) and the functions
// one file defines for another.  Not installed; nothing outside
// tools/plan/ includes it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "collectives.h"
#include "gpt_workload.h"
#include "pstar/pstar.h"
#include "replay.h"

namespace pstar::plan {

using pstar::workload::GptShape;
using pstar::workload::ReplayConfig;
using pstar::workload::ReplayResult;
using pstar::workload::Workload;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// ---------------------------------------------------------------------------
// Adam state formats (--state-format; pstar_engine_options.state_format)
// ---------------------------------------------------------------------------

// The format's name on the command line and in the JSON.
inline const char* state_format_name(pstar_state_format f) {
  switch (f) {
    case PSTAR_STATE_BF16: return "bf16";
    case PSTAR_STATE_INT8: return "int8";
    default: return "fp32";
  }
}
// The engine's layout alignment in elements (Engine::build): int8 starts
// every parameter and shard on a block of PSTAR_STATE_INT8_BLOCK elements,
// the other formats on 128 (chunk/layout.h's kAlignElems).
inline uint64_t layout_align(pstar_state_format f) { return f == PSTAR_STATE_INT8 ? PSTAR_STATE_INT8_BLOCK : 128; }
// Bytes of one moment list (m or v) per element: fp32 4, bf16 2, int8 one
// code byte plus one fp32 absmax per block (1 + 4/256 = 1.015625).
inline double moment_bytes_per_elem(pstar_state_format f) {
  switch (f) {
    case PSTAR_STATE_BF16: return 2.0;
    case PSTAR_STATE_INT8: return 1.0 + 4.0 / PSTAR_STATE_INT8_BLOCK;
    default: return 4.0;
  }
}
// Bytes of one moment list of chunks holding `elems` elements in all, as
// the engine allocates them (optim::moment_list_bytes per chunk): int8's
// codes, then its block maxima at a 64-byte boundary, exact here since an
// int8 engine's chunk capacities are multiples of 256 elements.
inline uint64_t moment_list_bytes(pstar_state_format f, uint64_t elems) {
  switch (f) {
    case PSTAR_STATE_BF16: return 2 * elems;
    case PSTAR_STATE_INT8: return elems + 4 * ((elems + PSTAR_STATE_INT8_BLOCK - 1) / PSTAR_STATE_INT8_BLOCK);
    default: return 4 * elems;
  }
}
// A master per element (--master-format; pstar_engine_options.master_format):
// fp32 4 B, bf16 2 B.
inline double master_bytes_per_elem(pstar_master_format m) { return m == PSTAR_MASTER_BF16 ? 2.0 : 4.0; }
// The three optimizer lists (master, m, v) per element: 12 B in fp32.
inline double state_bytes_per_elem(pstar_state_format f, pstar_master_format m = PSTAR_MASTER_FP32) {
  return master_bytes_per_elem(m) + 2.0 * moment_bytes_per_elem(f);
}
// The three optimizer lists' bytes from the engine's pstar_stats
// optimizer_list_bytes (one fp32 list): the master, then m and v.
inline uint64_t state_list_bytes(pstar_state_format f, uint64_t fp32_list_bytes,
                                 pstar_master_format m = PSTAR_MASTER_FP32) {
  const uint64_t master = m == PSTAR_MASTER_BF16 ? fp32_list_bytes / 2 : fp32_list_bytes;
  return master + 2 * moment_list_bytes(f, fp32_list_bytes / 4);
}
// Bytes one Adam update moves per element (optim::adam_state_bytes_per_elem
// with compute-dtype gradients): the gradient read and the weight written
// (the dtype's size each), the master read and written (8 in fp32, 4 in
// bf16), m and v read and written.  A 2-byte dtype and fp32 masters: fp32
// 28, bf16 20, int8 16.0625.
inline double adam_bytes_per_elem(pstar_state_format f, uint32_t dtype_bytes,
                                  pstar_master_format m = PSTAR_MASTER_FP32) {
  return 2.0 * dtype_bytes + 2.0 * master_bytes_per_elem(m) + 4.0 * moment_bytes_per_elem(f);
}

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------

struct Hardware {
  uint32_t gpus_per_node = 1;
  uint32_t nodes = 1;
  double gpu_mem = 0;                                        // bytes per GPU
  double gpu_reserve = -1;                                   // bytes per GPU kept from the engine; < 0: 10% of gpu_mem
  double host_mem = 0;                                       // bytes per node, shared by its ranks
  double host_reserve = 4 * kGiB;                            // bytes per rank kept from the model data
  double nvme = 0;                                           // bytes per node for the NVMe tier (one rank only)
  double nvme_read = PSTAR_X_DEFAULT_NVME_READ_BYTES_PER_S;  // bytes/s of the drive
  double nvme_write = PSTAR_X_DEFAULT_NVME_WRITE_BYTES_PER_S;
  double h2d = PSTAR_DEFAULT_LINK_BYTES_PER_S;  // bytes/s per GPU
  double d2h = PSTAR_DEFAULT_LINK_BYTES_PER_S;
  // bytes/s per GPU each way between GPUs (NVLink, or PCIe peer to peer):
  // the sharded ranks' all-gathers and reduce-scatters (0: not given).
  double collective = 0;
  double flops = 0;          // sustained FLOP/s per GPU
  double host_adam = 100e9;  // bytes/s of the fused Adam pass per node
  // bytes/s of the Adam update of device-held optimizer state per GPU
  // (hybrid placement): the device's memory bandwidth, the kernel being
  // bandwidth-bound.  The engine's modelled device counts it as no time.
  double device_adam = 900e9;

  uint32_t world() const { return gpus_per_node * nodes; }
  uint64_t device_capacity() const {
    const double reserve = gpu_reserve < 0 ? 0.1 * gpu_mem : gpu_reserve;
    return gpu_mem > reserve ? uint64_t(gpu_mem - reserve) : 0;
  }
};

// A published result the preset reproduces the conditions of.
struct Published {
  std::string system;
  double params;  // 0 when the source gives no number
  std::string note;
};

struct Preset {
  std::string name, description;
  GptShape shape;
  Hardware hw;
  std::string shape_source;
  std::vector<Published> published;
  std::vector<std::string> assumptions;
};

// The command line, parsed (command_line.cpp): a preset's values, then the
// options over them.
struct Args {
  std::string preset;
  GptShape shape;
  Hardware hw;
  uint64_t chunk_elems = 0;
  bool search_chunk = false;
  bool search = true;
  bool hybrid = true;
  // --state-format: the Adam moments' format of every dry run.  With
  // another format the planner refuses --nvme (its NVMe model counts fp32
  // state).
  pstar_state_format state_format = PSTAR_STATE_FP32;
  // --master-format: the masters' format of every dry run (as
  // --state-format: --nvme refused with bf16).
  pstar_master_format master_format = PSTAR_MASTER_FP32;
  // fp32 moments and fp32 masters: today's report, word for word.
  bool default_formats() const { return state_format == PSTAR_STATE_FP32 && master_format == PSTAR_MASTER_FP32; }
  double state_bytes() const { return state_bytes_per_elem(state_format, master_format); }
  double adam_bytes(uint32_t dtype_bytes) const {
    return adam_bytes_per_elem(state_format, dtype_bytes, master_format);
  }
  bool json = false;
  bool verbose = false;
  bool min_capacity = false;  // --min-capacity: the device floor of known shapes, nothing else
  const Preset* preset_def = nullptr;
};

// ---------------------------------------------------------------------------
// One dry run of a shape
// ---------------------------------------------------------------------------

struct Evaluation {
  GptShape shape;
  uint64_t chunk_elems = 0;
  bool hybrid = false;  // the dry run had options.hybrid_optimizer = 1
  uint64_t params = 0;
  double flops = 0;  // per iteration per GPU
  ReplayResult run;
  uint64_t device_capacity = 0;
  bool device_ok = false;
  // Optimizer state (fp32 master, m, v in --state-format: the three
  // optimizer lists) of the whole model, each rank's 1/N share of it, what the engine's dry run
  // placed on the device (hybrid), and the per-rank figure the planner takes
  // from that: a rank places state of its own share in its margin, so
  // min(placed, share).
  uint64_t opt_state_bytes = 0;
  uint64_t opt_share_per_rank = 0;
  uint32_t opt_chunks = 0;
  uint32_t opt_chunks_on_device = 0;
  uint64_t opt_device_bytes = 0;
  uint64_t opt_device_per_rank = 0;
  // Host model per node: each rank's share of the four lists, the engine's
  // own host bytes beyond the lists (measured), and the per-rank reserve.
  // Through warm-up the engine holds the compute list and the masters on the
  // host; Adam's moments come with a chunk's first update, and hybrid
  // placement moves its chosen chunks' state to the device before that
  // update, so their moments never exist on the host (chunk::Fp32Lists,
  // placement/hybrid.h).  After placement a rank's host holds its share less
  // the state on its device, or at least the compute list and the masters
  // (the masters placed chunks leave stay in the host pool for the moments
  // of chunks of their size: exactly so for the GPT shapes' chunks of one
  // size).  The peak is the larger of the two.
  uint64_t list_bytes = 0;
  uint64_t share_per_rank = 0;
  uint64_t warmup_share_per_rank = 0;  // compute list and masters
  uint64_t extra_per_rank = 0;
  uint64_t host_per_node = 0;        // the peak, what must fit
  uint64_t host_per_node_after = 0;  // after hybrid placement (steady state)
  bool host_ok = false;
  bool host_ok_after = false;
  // The smallest device capacity at which the dry run raises no
  // out-of-memory (found by bisection; 0 until evaluate_margin()), and the
  // what-if host need if each rank's device memory beyond it held
  // optimizer state of its share instead of caching chunks.
  uint64_t min_capacity = 0;
  uint64_t margin_per_rank = 0;
  uint64_t host_per_node_margin = 0;
  bool host_ok_margin = false;
  // Adam per step: the host pass of a node over its ranks' host-held state,
  // and each GPU's update of its device-held state, concurrently.
  double host_adam_s = 0;
  double device_adam_s = 0;
  double adam_s = 0;
  double step_s = 0;
  // The overlapped step (pstar_x_engine_set_overlap_step, the default with
  // payloads): the host updates run during the next forward, so only the
  // part the forward waits for is exposed (overlap_model()); the device
  // updates stay in the step, ahead of the next forward's kernels.
  double exposed_host_adam_s = 0;
  double step_s_overlap = 0;           // on the dry run's clock (modelled host updates)
  double step_s_overlap_analytic = 0;  // exposed_host_update's walk, a cross-check
  bool overlap_on_clock = false;       // step_s_overlap is the clock's (else the walk's)
  // ZeRO sharding over all ranks (world > 1): one rank's all-gathers and
  // reduce-scatters per iteration (predict_collectives(), checked against
  // runs of 2 and 4 ranks by test_plan_collectives), the bytes its link
  // carries for them in a ring, and their time at --collective-bytes-per-s,
  // issued at the acquire and the backward's end without gathering ahead,
  // so serial with the compute (0 without a collective bandwidth).
  pstar::workload::CollectiveBytes collectives;
  double collective_link_bytes = 0;
  double collective_s = 0;
  // The sharded rank's own side (world > 1; same prediction and test):
  // its PCIe copies per iteration (its shard of each gathered chunk to the
  // GPU, its fp32 block of each reduce-scatter back, NCCL's data path),
  // their time at the link's bandwidths (the engine issues both
  // synchronously at the acquire and at the reduce-scatter: serial with the
  // compute), its device peak (gathered chunks, gradient buffers until
  // their reduce-scatter, the reduce-scatter's staging, activations; plus
  // the state it placed), and its step: compute, device Adam, the host Adam
  // the overlapped step exposes, the collectives and these copies.
  uint64_t sharded_h2d_bytes = 0;
  uint64_t sharded_d2h_bytes = 0;
  double sharded_copy_s = 0;
  uint64_t sharded_peak_device = 0;
  pstar::workload::ShardedPlacement sharded_placement;  // world > 1: the rank's hybrid placement
  uint64_t placed_shard_bytes = 0;                      // its compute shards, on the device only
  bool sharded_device_ok = false;
  double step_s_sharded = 0;
  // With the NVMe tier (evaluate_nvme): the optimizer state the engine put
  // on the drive, and the drive's time for reading and writing it once.
  uint64_t nvme_bytes = 0;
  uint32_t nvme_chunks = 0;
  double drive_s = 0;

  // With world > 1 the sharded rank must fit its device too (its peak is
  // predicted, not dry-run; so is what it places: sharded_placement).
  bool fits() const { return device_ok && host_ok && (collectives.gathers == 0 || sharded_device_ok); }
  bool fits_after_placement() const { return device_ok && host_ok_after; }
  bool fits_with_margin() const { return device_ok && host_ok_margin; }
};

// Largest layer count in [1, cap] for which fits(layers) holds, by
// bisection (assuming monotonicity); 0 if even one layer fails.
template <class Fits>
uint32_t largest_layers(uint32_t cap, Fits&& fits) {
  uint32_t lo = 0, hi = cap + 1;  // fits(lo) holds (vacuously for 0), fits(hi) fails
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Runs the dry runs (evaluate.cpp) and keeps their results: the searches
// evaluate a shape more than once.
struct Planner {
  Args args;
  uint32_t dry_runs = 0;
  // (layers, chunk, hybrid) -> result
  std::map<std::tuple<uint32_t, uint64_t, bool>, Evaluation> cache;
  // (layers, chunk) -> result with the NVMe tier
  std::map<std::pair<uint32_t, uint64_t>, Evaluation> nvme_cache;

  // The engine's options for a dry run of args' hardware.
  pstar_engine_options options(uint64_t chunk_elems, bool hybrid) const;
  [[noreturn]] void engine_failure(const ReplayResult& r, const GptShape& g) const;
  // Register and build only: layout figures (list bytes, fill ratio, chunks).
  ReplayResult layout(const Workload& w, uint64_t chunk_elems);
  // The dry runs of args' shape at `layers` layers, and the host, Adam,
  // overlap and sharding model over them.
  const Evaluation& evaluate(uint32_t layers, uint64_t chunk_elems, bool hybrid);
  // evaluate() plus the smallest device capacity that runs without
  // out-of-memory, by bisection between the activation peak and the
  // capacity (to 1/256 of the capacity), and the what-if host need if the
  // rest of each device held optimizer state of its rank's share.
  const Evaluation& evaluate_margin(uint32_t layers, uint64_t chunk_elems, bool hybrid);
  // One GPU with the NVMe tier: the same dry run with the host budget
  // enforced by the engine (host memory less the reserve) and the optimizer
  // state that does not fit on the drive (its capacity and bandwidths).  The
  // engine's dry run advances its clock by the drive's time and the replay by
  // the Adam pass, one after the other; the step's ring overlaps them, so
  // the step is the clock less the shorter of the two.
  const Evaluation& evaluate_nvme(uint32_t layers, uint64_t chunk_elems);

  // Largest layer count in [1, cap] whose evaluation passes `pred`, assuming
  // monotonicity; 0 if even one layer fails.
  template <class Pred>
  uint32_t largest(uint32_t cap, uint64_t chunk_elems, bool hybrid, bool margin, Pred pred) {
    return largest_layers(cap, [&](uint32_t layers) {
      return pred(margin ? evaluate_margin(layers, chunk_elems, hybrid) : evaluate(layers, chunk_elems, hybrid));
    });
  }
};

// ---------------------------------------------------------------------------
// The plan (search.cpp)
// ---------------------------------------------------------------------------

// A chunk size --search-chunk-size considered: its layout, and for the
// candidates within 0.5% of the best fill ratio, its dry run's figures.
struct ChunkCandidate {
  uint64_t chunk_elems = 0;
  double fill_ratio = 0;
  uint32_t chunks = 0;
  bool evaluated = false;             // within 0.5% of the best fill: dry run
  bool device_ok = false;             // that dry run fits the device
  uint64_t min_device_capacity = 0;   // where device_ok
  uint64_t bytes_moved_per_iter = 0;  // where device_ok
};

// What the report prints: the chunk size, the shape asked for and the
// largest model of each kind (null where none fits).  The evaluations live
// in the planner's caches.
struct Plan {
  uint64_t chunk_elems = 0;
  std::vector<ChunkCandidate> chunk_search;  // --search-chunk-size, in increasing size
  const Evaluation* requested = nullptr;
  const Evaluation* requested_host_only = nullptr;  // hybrid: the same shape without it
  // The plan: the engine as configured, except that with hybrid placement
  // on, a search whose largest model without it is larger picks that one
  // (hybrid_picked_off; top_hybrid keeps the hybrid search's).
  const Evaluation* top = nullptr;
  const Evaluation* top_hybrid = nullptr;
  bool hybrid_picked_off = false;
  const Evaluation* top_host_only = nullptr;  // without hybrid placement
  const Evaluation* top_steady = nullptr;     // what-if: host after placement only
  const Evaluation* top_margin = nullptr;     // what-if: state in the device margin
  bool nvme_modelled = false;
  const Evaluation* top_nvme = nullptr;  // with the NVMe tier
};

// ---------------------------------------------------------------------------
// What each file defines for the others
// ---------------------------------------------------------------------------

// presets.cpp: PatrickStar's two machines and model shapes.
std::vector<Preset> presets();

// search.cpp: the chunk size, then the largest model of each kind.
Plan make_plan(Planner& pl);

// assumptions.cpp: what the figures assume (for these arguments) and what
// the model leaves out.
std::vector<std::string> plan_assumptions(const Args& a);
std::vector<std::string> not_modelled();

// report.cpp: the plan as one JSON object or as text, on stdout.
// JSON through nlohmann-json; ordered_json keeps the keys in the order
// they are written.
using Json = nlohmann::ordered_json;
// A figure as pstar-plan writes it: an integer where the value is one (below
// 9e15), else the double rounded to 6 significant digits (the precision the
// model has; the JSON has always carried that many), null when not finite.
Json num(double v);
void print_json(const Planner& pl, const Plan& plan);
void print_text(const Planner& pl, const Plan& plan);

// min_capacity.cpp: --min-capacity, the device floor of known shapes.
int run_min_capacity(const Args& a);

}  // namespace pstar::plan
