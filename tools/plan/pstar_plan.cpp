// pstar-plan: how large a GPT-style model fits a machine, how many bytes the
// engine moves per iteration, and how long a step takes, predicted by running
// libpstar's own placement runtime in dry-run mode (no payloads, a modelled
// clock and modelled link bandwidths) on the model's access trace.
//
//   pstar-plan --preset v100x8 [--json]
//   pstar-plan --layers 48 --hidden 4096 --heads 32 --vocab 50257 --seq 2048
//              --batch 4 --gpu-mem 80GiB --host-mem 1TiB --flops 150T
//              --gpus-per-node 8 [--search-chunk-size] [--json]
//
// docs/planner.md explains the model and its assumptions; the workload
// (parameters, schedule, activation and FLOP formulas) is described in
// tools/workload/gpt_workload.h.  The command line goes through CLI11
// (tools/common/tool_cli.h) and the JSON through nlohmann-json; CMake skips
// the tool where either is missing (tools/CMakeLists.txt).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "chunk_packing.h"
#include "collectives.h"
#include "gpt_workload.h"
#include "pstar/pstar.h"
#include "replay.h"
#include "tool_cli.h"

namespace {

using pstar::workload::GptShape;
using pstar::workload::ReplayConfig;
using pstar::workload::ReplayResult;
using pstar::workload::Workload;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

using pstar::tools::UsageError;

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

// PatrickStar's two single-node experiments (see docs/planner.md for the
// sources).  Model shapes: PatrickStar's benchmark model table
// (examples/model_builder.py: GPT3_18B = 90 layers of hidden 4096, 16 heads;
// GPT_DS_68B = 66 layers of hidden 9216, 16 heads; sequence 1024), built as
// transformers' BertConfig with its default vocabulary of 30522 tokens, with
// activation checkpointing on (examples/run_transformers.sh: CKP=1).
std::vector<Preset> presets() {
  std::vector<Preset> v;
  {
    Preset p;
    p.name = "v100x8";
    p.description = "8 x V100-SXM2-32GB, 240 GB host memory (PatrickStar's WeChat data-center node)";
    p.shape.layers = 90;
    p.shape.hidden = 4096;
    p.shape.heads = 16;
    p.shape.vocab = 30522;
    p.shape.seq = 1024;
    p.shape.batch = 8;
    p.shape.checkpointing = true;
    p.hw.gpus_per_node = 8;
    p.hw.gpu_mem = 32 * kGiB;
    p.hw.host_mem = 240 * kGiB;
    p.hw.h2d = p.hw.d2h = 6e9;
    p.hw.collective = 150e9;
    p.hw.flops = 50e12;
    p.hw.host_adam = 100e9;
    p.hw.device_adam = 900e9;
    p.shape_source = "PatrickStar examples/model_builder.py GPT3_18B";
    p.published = {{"PatrickStar v0.4.3", 18e9, "README: 18B on 8 x V100 with 240 GB host memory"},
                   {"DeepSpeed v0.4.3", 4e9,
                    "4B as given in the planner issue; PatrickStar's README says only that PatrickStar's "
                    "model is over twice as large"}};
    p.assumptions = {"batch 8 per GPU: PatrickStar's sources do not state the batch of the 18B run",
                     "collectives 150 GB/s per GPU each way: NVLink 2.0, six links of 25 GB/s each way (NVIDIA's V100 "
                     "datasheet: 300 GB/s both ways); NCCL reaches less (not modelled)",
                     "link 6 GB/s per GPU each way: PCIe 3.0 x16 (12 GB/s) shared by two GPUs per switch when all "
                     "GPUs copy at once",
                     "50 TFLOP/s sustained per GPU: 40% of the V100's 125 TFLOP/s fp16 tensor-core peak",
                     "host Adam 100 GB/s per node: a two-socket Xeon node (the CPU is not published)",
                     "device Adam 900 GB/s per GPU (hybrid placement): the V100's HBM2 bandwidth"};
    v.push_back(p);
  }
  {
    Preset p;
    p.name = "a100x8";
    p.description = "8 x A100-SXM-80GB, 1 TB host memory (a node of NVIDIA's A100 SuperPOD)";
    p.shape.layers = 66;
    p.shape.hidden = 9216;
    p.shape.heads = 16;
    p.shape.vocab = 30522;
    p.shape.seq = 1024;
    p.shape.batch = 8;
    p.shape.checkpointing = true;
    p.hw.gpus_per_node = 8;
    p.hw.gpu_mem = 80 * kGiB;
    p.hw.host_mem = 1024 * kGiB;
    p.hw.h2d = p.hw.d2h = 12e9;
    p.hw.collective = 300e9;
    p.hw.flops = 125e12;
    p.hw.host_adam = 200e9;
    p.hw.device_adam = 2.0e12;
    p.shape_source = "PatrickStar examples/model_builder.py GPT_DS_68B";
    p.published = {{"PatrickStar v0.4.3", 68e9, "README: 68B on 8 x A100 with 1 TB host memory"},
                   {"DeepSpeed v0.5.7", 0, "README: PatrickStar's 68B is over 6x DeepSpeed's largest"}};
    p.assumptions = {"batch 8 per GPU: PatrickStar's A100 benchmark script sweeps 4, 8 and 16 for its large models",
                     "link 12 GB/s per GPU each way: PCIe 4.0 x16 (24 GB/s) shared by two GPUs per switch",
                     "collectives 300 GB/s per GPU each way: NVLink 3.0, twelve links of 25 GB/s each way (NVIDIA's "
                     "A100 datasheet: 600 GB/s both ways); NCCL reaches less (not modelled)",
                     "125 TFLOP/s sustained per GPU: 40% of the A100's 312 TFLOP/s bf16 tensor-core peak",
                     "host Adam 200 GB/s per node: two AMD EPYC 7742 with 8 DDR4-3200 channels each (409 GB/s peak)",
                     "device Adam 2 TB/s per GPU (hybrid placement): the A100-80GB's HBM2e bandwidth (2.04 TB/s)"};
    v.push_back(p);
  }
  return v;
}

// "32GiB", "240GB", "1.5T", "12e9", "125T": decimal suffixes k M G T P and
// binary Ki Mi Gi Ti; a trailing "B", "B/s" or "/s" is ignored.
double parse_quantity(const std::string& opt, const std::string& text) {
  const char* s = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(s, &end);
  if (end == s || !std::isfinite(value) || value < 0) throw UsageError(opt + ": not a number: '" + text + "'");
  std::string suffix(end);
  for (const char* tail : {"B/s", "/s", "B"}) {
    const size_t n = std::strlen(tail);
    if (suffix.size() >= n && suffix.compare(suffix.size() - n, n, tail) == 0) {
      suffix.erase(suffix.size() - n);
      break;
    }
  }
  static const std::map<std::string, double> scale = {
      {"", 1.0},   {"k", 1e3},     {"K", 1e3},        {"M", 1e6},   {"G", 1e9},           {"T", 1e12},
      {"P", 1e15}, {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", kGiB}, {"Ti", kGiB * 1024.0}};
  const auto it = scale.find(suffix);
  if (it == scale.end()) throw UsageError(opt + ": unknown unit in '" + text + "'");
  return value * it->second;
}

uint32_t parse_count(const std::string& opt, const std::string& text) {
  const double v = parse_quantity(opt, text);
  if (v < 1 || v > 4e9 || v != std::floor(v))
    throw UsageError(opt + ": expected a positive integer, got '" + text + "'");
  return uint32_t(v);
}

bool parse_bool(const std::string& opt, const std::string& text) {
  if (text == "on" || text == "1" || text == "true" || text == "yes") return true;
  if (text == "off" || text == "0" || text == "false" || text == "no") return false;
  throw UsageError(opt + ": expected on or off, got '" + text + "'");
}

struct Args {
  std::string preset;
  GptShape shape;
  Hardware hw;
  uint64_t chunk_elems = 0;
  bool search_chunk = false;
  bool search = true;
  bool hybrid = true;
  bool json = false;
  bool verbose = false;
  bool min_capacity = false;  // --min-capacity: the device floor of known shapes, nothing else
  const Preset* preset_def = nullptr;
};

// The command line through CLI11.  Every option but --preset takes effect in
// its callback, which CLI11 runs once the whole command line is read;
// --preset's runs as soon as it is read (trigger_on_parse), so the options
// override the preset's values wherever they stand.  Values are parsed here
// (sizes with their units, counts, on/off), each error naming its option.
Args parse_args(int argc, char** argv, const std::vector<Preset>& known) {
  Args a;
  CLI::App app{
      "What fits on a machine, the bytes moved per iteration and the step time, from dry runs of the engine\n"
      "(docs/planner.md).",
      "pstar-plan"};
  pstar::tools::configure(app, "usage: pstar-plan [--preset v100x8|a100x8] [options] [--json]");
  app.footer(
      "Sizes take decimal (k M G T) or binary (Ki Mi Gi Ti) suffixes, optionally followed by B or B/s.\n"
      "Presets: v100x8 (8 x V100-SXM2-32GB, 240 GB host), a100x8 (8 x A100-SXM-80GB, 1 TB host).");
  app.add_option_function<std::string>(
         "--preset",
         [&](const std::string& v) {
           const auto it = std::find_if(known.begin(), known.end(), [&](const Preset& p) { return p.name == v; });
           if (it == known.end()) throw UsageError("--preset: unknown preset '" + v + "' (v100x8, a100x8)");
           a.preset = v;
           a.preset_def = &*it;
           a.shape = it->shape;
           a.hw = it->hw;
         },
         "PatrickStar's published hardware and model shape; other options override its values")
      ->type_name("v100x8|a100x8")
      ->trigger_on_parse();

  // An option whose value `set` parses (given the option's name).
  const auto option = [&](const char* group, const char* name, const char* type, const char* help, auto set) {
    return app
        .add_option_function<std::string>(
            name, [name, set](const std::string& v) { set(std::string(name), v); }, help)
        ->type_name(type)
        ->group(group);
  };
  const auto count = [&](const char* group, const char* name, uint32_t& field, const char* help) {
    option(group, name, "N", help, [&field](const std::string& k, const std::string& v) { field = parse_count(k, v); });
  };
  const auto quantity = [&](const char* group, const char* name, const char* type, double& field, const char* help) {
    option(group, name, type, help,
           [&field](const std::string& k, const std::string& v) { field = parse_quantity(k, v); });
  };

  const char* model = "Model (GPT-style; a preset fills all of them)";
  count(model, "--layers", a.shape.layers, "transformer layers");
  count(model, "--hidden", a.shape.hidden, "hidden size (a multiple of --heads)");
  count(model, "--heads", a.shape.heads, "attention heads");
  count(model, "--vocab", a.shape.vocab, "vocabulary");
  count(model, "--seq", a.shape.seq, "sequence length");
  count(model, "--batch", a.shape.batch, "micro-batch per GPU");
  option(model, "--checkpointing", "on|off", "activation checkpointing (default on)",
         [&](const std::string& k, const std::string& v) { a.shape.checkpointing = parse_bool(k, v); });
  option(model, "--dtype", "bf16|f16|f32", "compute dtype (default bf16)",
         [&](const std::string&, const std::string& v) {
           if (v == "bf16" || v == "f16" || v == "fp16")
             a.shape.dtype_bytes = 2;
           else if (v == "f32" || v == "fp32")
             a.shape.dtype_bytes = 4;
           else
             throw UsageError("--dtype: expected bf16, f16 or f32, got '" + v + "'");
         });

  const char* hardware = "Hardware";
  quantity(hardware, "--gpu-mem", "BYTES", a.hw.gpu_mem, "per GPU");
  quantity(hardware, "--gpu-reserve", "BYTES", a.hw.gpu_reserve,
           "per GPU, kept from the engine (default 10% of --gpu-mem)");
  quantity(hardware, "--host-mem", "BYTES", a.hw.host_mem, "per node");
  quantity(hardware, "--host-reserve", "BYTES", a.hw.host_reserve, "per rank, kept from the model data (default 4GiB)");
  quantity(hardware, "--nvme", "BYTES", a.hw.nvme, "per node: the NVMe tier, modelled with one GPU only");
  quantity(hardware, "--nvme-read", "BYTES/S", a.hw.nvme_read, "the drive's read bandwidth (default 3.5GB/s)");
  quantity(hardware, "--nvme-write", "BYTES/S", a.hw.nvme_write, "the drive's write bandwidth (default 3.0GB/s)");
  quantity(hardware, "--h2d", "BYTES/S", a.hw.h2d, "host to device, per GPU (default 12GB/s)");
  quantity(hardware, "--d2h", "BYTES/S", a.hw.d2h, "device to host, per GPU (default 12GB/s)");
  quantity(hardware, "--collective-bytes-per-s", "BYTES/S", a.hw.collective,
           "between GPUs, per GPU each way: the sharded ranks' all-gathers and reduce-scatters");
  quantity(hardware, "--flops", "FLOP/S", a.hw.flops, "sustained per GPU");
  quantity(hardware, "--host-adam-bytes-per-s", "BYTES/S", a.hw.host_adam,
           "the host Adam pass, per node (default 100GB/s)");
  quantity(hardware, "--device-adam-bytes-per-s", "BYTES/S", a.hw.device_adam,
           "hybrid placement's device update, per GPU (default 900GB/s)");
  count(hardware, "--gpus-per-node", a.hw.gpus_per_node, "GPUs (ranks) per node (default 1)");
  count(hardware, "--nodes", a.hw.nodes, "nodes (default 1)");

  const char* search = "Search";
  option(search, "--chunk-elems", "N", "elements per chunk, a multiple of 128 (default: one layer's parameters)",
         [&](const std::string& k, const std::string& v) {
           a.chunk_elems = parse_count(k, v);
           if (a.chunk_elems % 128 != 0) throw UsageError("--chunk-elems must be a multiple of 128");
         });
  app.add_flag("--search-chunk-size", a.search_chunk, "pick the chunk size of best fill, then least device memory")
      ->group(search);
  app.add_flag_callback(
         "--no-search", [&] { a.search = false; }, "evaluate the given shape only (no largest-model search)")
      ->group(search);
  app.add_flag_callback(
         "--no-hybrid", [&] { a.hybrid = false; },
         "all optimizer state on the host (default: hybrid placement,\noptions.hybrid_optimizer = 1)")
      ->group("Engine");
  app.add_flag("--min-capacity", a.min_capacity,
               "the device floor of known model shapes (gpt2-small, gpt2-medium, vit-b-16, vit-l-16):\n"
               "the smallest capacity that trains, model data only; other options but --dtype are ignored")
      ->group("Output");
  app.add_flag("--json", a.json, "one JSON object on stdout (with --min-capacity: one line per shape)")
      ->group("Output");
  app.add_flag("--verbose", a.verbose, "every dry run on stderr")->group("Output");

  pstar::tools::parse_or_exit(app, argc, argv, [&] {
    pstar::tools::reject_empty_values(argv + 1, argv + argc);
    if (a.min_capacity) return;
    std::string missing;
    auto need = [&](bool ok, const char* name) {
      if (!ok) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    need(a.shape.layers > 0, "--layers");
    need(a.shape.hidden > 0, "--hidden");
    need(a.shape.heads > 0, "--heads");
    need(a.shape.vocab > 0, "--vocab");
    need(a.shape.seq > 0, "--seq");
    need(a.shape.batch > 0, "--batch");
    need(a.hw.gpu_mem > 0, "--gpu-mem");
    need(a.hw.host_mem > 0, "--host-mem");
    need(a.hw.flops > 0, "--flops");
    if (!missing.empty()) throw UsageError("missing " + missing + " (or a --preset)");
    const std::string bad = pstar::workload::validate(a.shape);
    if (!bad.empty()) throw UsageError(bad);
    if (a.hw.h2d <= 0 || a.hw.d2h <= 0 || a.hw.host_adam <= 0 || a.hw.device_adam <= 0 || a.hw.nvme_read <= 0 ||
        a.hw.nvme_write <= 0)
      throw UsageError("bandwidths must be positive");
    if (a.hw.device_capacity() == 0) throw UsageError("--gpu-reserve leaves no device memory");
    if (a.search_chunk && a.chunk_elems) throw UsageError("--chunk-elems and --search-chunk-size exclude each other");
  });
  return a;
}

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
  // Optimizer state (fp32 master, m, v: the three optimizer lists) of the
  // whole model, each rank's 1/N share of it, what the engine's dry run
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

constexpr double kOptListsBytesPerElem = 12.0;  // fp32 master, m, v

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
// twice, on the safe side).  Walking the schedule with the compute of each use
// (flops / flops_per_s), the exposed time is how much later the iteration's
// compute ends than it would without waiting.
double exposed_host_update(const Workload& w, uint64_t chunk_elems, uint32_t chunks_on_device, double host_adam_s,
                           double flops_per_s, double h2d_bytes_per_s) {
  const pstar::workload::ChunkPacking packing = pstar::workload::pack_chunks(w, chunk_elems, 1);
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

struct Planner {
  Args args;
  uint32_t dry_runs = 0;
  // (layers, chunk, hybrid) -> result
  std::map<std::tuple<uint32_t, uint64_t, bool>, Evaluation> cache;

  pstar_engine_options options(uint64_t chunk_elems, bool hybrid) const {
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
    return o;
  }

  [[noreturn]] void engine_failure(const ReplayResult& r, const GptShape& g) const {
    throw std::runtime_error(r.failed_call + " failed with " + pstar_status_name(r.status) + " (" +
                             std::to_string(g.layers) + " layers): " + r.message);
  }

  // Register and build only: layout figures (list bytes, fill ratio, chunks).
  ReplayResult layout(const Workload& w, uint64_t chunk_elems) {
    ReplayConfig cfg;
    cfg.options = options(chunk_elems, false);
    cfg.build_only = true;
    ReplayResult r = pstar::workload::replay(w, cfg);
    if (!r.ok()) engine_failure(r, w.shape);
    return r;
  }

  const Evaluation& evaluate(uint32_t layers, uint64_t chunk_elems, bool hybrid) {
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

    const ReplayResult built = layout(w, chunk_elems);
    ev.opt_state_bytes = 3 * built.built.optimizer_list_bytes;
    ev.opt_share_per_rank = (ev.opt_state_bytes + world - 1) / world;
    ev.opt_chunks = built.built.optimizer_chunks;

    // Adam per step, from the optimizer state the engine holds on the device
    // at that step (none until warm-up ends; hybrid: what it placed then).
    // A rank's share of the optimizer elements is split between its GPU
    // (min(placed, share): see opt_device_per_rank) and its node's host
    // pass.  Each element costs 28 bytes with a 2-byte dtype: the gradient
    // read, master, m and v read and written, the weight written.  A node's
    // host pass updates its ranks' host-held elements at the node's
    // bandwidth; each GPU updates its own at the device's, at the same time
    // (the engine queues the device updates, then updates the rest on the
    // CPU), so the optimizer takes the longer of the two.
    const double adam_bytes_per_elem = 2.0 * args.shape.dtype_bytes + 24.0;
    const double share_elems = double(built.built.optimizer_list_bytes) / 4.0 / world;
    const uint64_t share_bytes = ev.opt_share_per_rank;
    auto adam_times = [=](uint64_t placed, double* host_s, double* dev_s) {
      const double dev_elems = double(std::min(placed, share_bytes)) / kOptListsBytesPerElem;
      const double host_elems = std::max(0.0, share_elems - dev_elems);
      *host_s = hw.gpus_per_node * host_elems * adam_bytes_per_elem / hw.host_adam;
      *dev_s = dev_elems * adam_bytes_per_elem / hw.device_adam;
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
    ev.collectives = pstar::workload::predict_collectives(w, chunk_elems, world);
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
      ev.sharded_h2d_bytes = ev.collectives.shard_bytes_to_device(world) - ev.sharded_placement.gathered_shard_bytes +
                             ev.placed_shard_bytes;
      ev.sharded_d2h_bytes = ev.collectives.reduced_bytes_to_host(world);
      ev.sharded_copy_s = double(ev.sharded_h2d_bytes) / hw.h2d + double(ev.sharded_d2h_bytes) / hw.d2h;
      ev.sharded_device_ok = peak <= ev.device_capacity;
    }
    adam_times(ev.opt_device_per_rank, &ev.host_adam_s, &ev.device_adam_s);
    ev.adam_s = std::max(ev.host_adam_s, ev.device_adam_s);

    ev.list_bytes = ev.run.list_bytes();
    ev.share_per_rank = (ev.list_bytes + world - 1) / world;
    const uint64_t warmup_lists = built.built.compute_list_bytes + built.built.optimizer_list_bytes;
    ev.warmup_share_per_rank = (warmup_lists + world - 1) / world;
    // The engine's own host bytes: the dry run's peak beyond what the model
    // above gives for one rank holding the whole model.
    const uint64_t one_rank_lists =
        std::max(warmup_lists, ev.list_bytes - std::min(ev.list_bytes, ev.opt_device_bytes));
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
    // this rank's share of the node's Adam bandwidth) beside the next iteration,
    // a chunk's fetch waiting for its update's end; the device's updates
    // stay on the caller's clock.  Three iterations: the third follows a
    // step taken while following the trace (first-use order).  The
    // analytic walk above is kept as a cross-check.
    ev.step_s_overlap_analytic =
        ev.step_s - ev.adam_s + ev.device_adam_s +
        exposed_host_update(w, chunk_elems, ev.opt_chunks_on_device, ev.host_adam_s, hw.flops, hw.h2d);
    if (ev.run.ok()) {
      ReplayConfig over = cfg;
      over.iterations = 3;
      // The dry run holds every chunk whole; a rank updates its 1/world
      // shard of each: its chunk's update is 1/world as long.
      over.host_update_bytes_per_s = hw.host_adam / hw.gpus_per_node * world;
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
                   ev.collectives.need_peak_bytes_device_comm / kGiB,
                   ev.collectives.peak_device_bytes_device_comm / kGiB, 2.0 * ev.collectives.largest_chunk_bytes / kGiB,
                   ev.sharded_placement.margin / kGiB, ev.sharded_placement.chunks,
                   ev.sharded_placement.state_bytes / kGiB);
    return cache.emplace(key, std::move(ev)).first->second;
  }

  // evaluate() plus the smallest device capacity that runs without
  // out-of-memory, by bisection between the activation peak and the
  // capacity (to 1/256 of the capacity), and the what-if host need if the
  // rest of each device held optimizer state of its rank's share.
  const Evaluation& evaluate_margin(uint32_t layers, uint64_t chunk_elems, bool hybrid) {
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

  // One GPU with the NVMe tier: the same dry run with the host budget
  // enforced by the engine (host memory less the reserve) and the optimizer
  // state that does not fit on the drive (its capacity and bandwidths).  The
  // engine's dry run advances its clock by the drive's time and the replay by
  // the Adam pass, one after the other; the step's ring overlaps them, so
  // the step is the clock less the shorter of the two.
  std::map<std::pair<uint32_t, uint64_t>, Evaluation> nvme_cache;
  const Evaluation& evaluate_nvme(uint32_t layers, uint64_t chunk_elems) {
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

  // Largest layer count in [1, cap] whose evaluation passes `pred`, assuming
  // monotonicity; 0 if even one layer fails.
  template <class Pred>
  uint32_t largest(uint32_t cap, uint64_t chunk_elems, bool hybrid, bool margin, Pred pred) {
    return largest_layers(cap, [&](uint32_t layers) {
      return pred(margin ? evaluate_margin(layers, chunk_elems, hybrid) : evaluate(layers, chunk_elems, hybrid));
    });
  }
};

uint64_t round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

// JSON through nlohmann-json; ordered_json keeps the keys in the order
// written here.
using Json = nlohmann::ordered_json;

// A figure as pstar-plan writes it: an integer where the value is one (below
// 9e15), else the double rounded to 6 significant digits (the precision the
// model has; the JSON has always carried that many), null when not finite.
Json num(double v) {
  if (!std::isfinite(v)) return nullptr;
  if (v == std::floor(v) && std::fabs(v) < 9e15) return static_cast<int64_t>(v);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return std::strtod(buf, nullptr);
}

// `value` where `have`, else null.
template <class T>
Json or_null(bool have, const T& value) {
  return have ? Json(value) : Json(nullptr);
}

Json shape_json(const GptShape& g) {
  return Json{{"layers", g.layers},
              {"hidden", g.hidden},
              {"heads", g.heads},
              {"vocab", g.vocab},
              {"seq", g.seq},
              {"batch", g.batch},
              {"checkpointing", g.checkpointing},
              {"dtype_bytes", g.dtype_bytes}};
}

Json evaluation_json(const Evaluation& e) {
  const pstar_stats& s = e.run.final_stats;
  const auto& it = e.run.last;
  Json j;
  j["shape"] = shape_json(e.shape);
  j["params"] = e.params;
  j["hybrid_optimizer"] = e.hybrid;
  j["fits"] = e.fits();
  j["device_ok"] = e.device_ok;
  j["host_ok"] = e.host_ok;
  j["engine_status"] = pstar_status_name(e.run.status);
  j["bytes_moved_per_iter"] = it.bytes_moved();
  j["bytes_h2d_per_iter"] = it.bytes_host_to_device;
  j["bytes_d2h_per_iter"] = it.bytes_device_to_host;
  j["bytes_prefetched_per_iter"] = it.bytes_prefetched;
  j["bytes_critical_per_iter"] = it.bytes_critical;
  j["evictions_per_iter"] = it.evictions;
  j["flops_per_iter"] = num(e.flops);
  j["step_s"] = num(e.step_s);
  j["step_s_overlap"] = num(e.step_s_overlap);
  j["step_s_overlap_analytic"] = num(e.step_s_overlap_analytic);
  j["exposed_host_adam_s"] = num(e.exposed_host_adam_s);
  j["all_gathered_bytes_per_iter"] = e.collectives.all_gathered;
  j["reduce_scattered_bytes_per_iter"] = e.collectives.reduce_scattered;
  j["collective_link_bytes_per_iter"] = num(e.collective_link_bytes);
  j["collective_s"] = num(e.collective_s);
  j["sharded_h2d_bytes_per_iter"] = e.sharded_h2d_bytes;
  j["sharded_d2h_bytes_per_iter"] = e.sharded_d2h_bytes;
  j["sharded_copy_s"] = num(e.sharded_copy_s);
  j["sharded_peak_device_bytes"] = e.sharded_peak_device;
  j["sharded_device_ok"] = e.sharded_device_ok;
  j["sharded_need_peak_bytes"] = e.collectives.need_peak_bytes_device_comm;
  j["sharded_placed_chunks"] = e.sharded_placement.chunks;
  j["sharded_placed_state_bytes"] = e.sharded_placement.state_bytes;
  j["step_s_sharded"] = num(e.step_s_sharded);
  j["compute_s"] = num(e.run.compute_seconds);
  j["wait_s"] = num(it.wait_seconds);
  j["adam_s"] = num(e.adam_s);
  j["host_adam_s"] = num(e.host_adam_s);
  j["device_adam_s"] = num(e.device_adam_s);
  j["peak_device_bytes"] = s.peak_device_bytes;
  j["peak_device_chunk_bytes"] = s.peak_device_chunk_bytes;
  j["peak_nonmodel_bytes"] = e.run.peak_nonmodel_reported;
  j["device_capacity_bytes"] = e.device_capacity;
  j["optimizer_state_bytes"] = e.opt_state_bytes;
  j["optimizer_share_per_rank_bytes"] = e.opt_share_per_rank;
  j["optimizer_chunks"] = e.opt_chunks;
  j["optimizer_chunks_on_device"] = e.opt_chunks_on_device;
  j["optimizer_device_bytes"] = e.opt_device_bytes;
  j["optimizer_device_bytes_per_rank"] = e.opt_device_per_rank;
  j["list_bytes"] = e.list_bytes;
  j["host_share_per_rank_bytes"] = e.share_per_rank;
  j["host_extra_per_rank_bytes"] = e.extra_per_rank;
  j["host_needed_per_node_bytes"] = e.host_per_node;
  j["host_needed_per_node_after_placement_bytes"] = e.host_per_node_after;
  j["min_device_capacity_bytes"] = or_null(e.min_capacity != 0, e.min_capacity);
  j["host_needed_per_node_with_margin_bytes"] = or_null(e.min_capacity != 0, e.host_per_node_margin);
  j["budget_overruns"] = it.budget_overruns;
  j["trace_fallbacks"] = it.trace_fallbacks;
  return j;
}

std::vector<std::string> common_assumptions(const Args& a) {
  const Hardware& hw = a.hw;
  char buf[1024];
  std::vector<std::string> v;
  v.push_back(
      "GPT-style workload of tools/workload/gpt_workload.h: activations from Korthikanti et al. 2022, "
      "FLOPs 2 per multiply-add on weight matrices and attention scores, element-wise work not timed");
  std::snprintf(buf, sizeof buf,
                "engine: dry run, virtual clock, OPT placement with prefetch, device capacity %.2f GiB per GPU "
                "(%.2f GiB reserved for the CUDA context, libraries and allocator slack), hybrid optimizer "
                "placement %s",
                hw.device_capacity() / kGiB, (hw.gpu_mem - hw.device_capacity()) / kGiB,
                a.hybrid ? "on (options.hybrid_optimizer = 1: when warm-up ends the engine moves, for good, the "
                           "optimizer state of the trainable chunks that fit in the capacity less the warm-up's "
                           "device peak; the warm-up's chunk cache fills the device whenever the model's chunks "
                           "do not all fit beside its activations, and then nothing is placed)"
                         : "off (--no-hybrid: all optimizer state on the host)");
  v.push_back(buf);
  v.push_back(
      "each of a node's ranks runs the same device-side trace with the whole model: the dry run is one "
      "process, so bytes moved and the device peak are one rank's with the full model; with sharding over all "
      "ranks each rank's all-gathers and reduce-scatters are predicted from the layout and the drop rule "
      "(collective_s at --collective-bytes-per-s, ring traffic (N-1)/N, serial with the compute as without "
      "gathering ahead), and so are the sharded rank's own PCIe copies (its shard of each gathered chunk to "
      "the GPU, its fp32 block of each reduce-scatter back: sharded_copy_s at the link's bandwidths, serial) "
      "and its device peak (sharded_peak_device_bytes: gathered chunks, gradient buffers until their "
      "reduce-scatter, its staging, activations, placed state and its staging), which must fit too; "
      "step_s_sharded = compute + device Adam + exposed host Adam + collectives + those copies; the "
      "collectives, copies and peak checked exactly against runs of 2 and 4 ranks (Gloo)");
  std::snprintf(buf, sizeof buf,
                "host per node = ranks x (share of the four chunk lists (14 B/param with a 2-byte dtype, over all "
                "%u ranks, as the engine's ZeRO sharding, ZeRO and PatrickStar divide them) + the "
                "engine's host bytes beyond the lists + %.1f GiB reserved per rank)",
                hw.world(), hw.host_reserve / kGiB);
  v.push_back(buf);
  if (a.hybrid)
    v.push_back(
        "hybrid, per rank: with sharding each rank would own 1/N of the optimizer state (12 B/param) and place "
        "state of its own share in its device margin, so its GPU holds min(the state the single-rank dry run "
        "placed in that margin, its share) and its host the rest of its share; the device peak and bytes moved "
        "are the dry run's, which holds all it placed (a rank holding less peaks lower)");
  if (a.hybrid)
    v.push_back(
        "host need = the larger of the warm-up's and the steady state's: through warm-up the host holds the "
        "compute list and the masters (6 B/param with a 2-byte dtype), Adam's moments come with a chunk's first "
        "update, and the state hybrid placement puts on the device goes there before that update, so its "
        "moments are never on the host; after placement the host holds the share less the state on the device "
        "(host_needed_per_node_after_placement_bytes); max_params is found with the larger, "
        "max_params_hybrid_steady_host with the steady state's alone (what-if)");
  v.push_back(
      "max_params_with_device_margin (what-if, not built): each GPU's memory beyond the smallest capacity that "
      "runs holds optimizer state of its rank's share (min(that room, the share)) instead of cached chunks, and "
      "that state is never on the host; an upper bound (the placed chunks' payloads would have to stay resident "
      "as well)");
  std::snprintf(buf, sizeof buf,
                "step = modelled compute (FLOPs / sustained FLOP/s) + the engine's modelled waiting for moves + the "
                "optimizer: 28 B per element (gradient read, master, m, v read and written, weight written) of the "
                "node's host-held share at the node's host Adam bandwidth, and of each GPU's device-held share at "
                "%.0f GB/s (the device's memory bandwidth; the engine's modelled device counts that update as no "
                "time), concurrently, the longer of the two; one micro-batch per step",
                hw.device_adam / 1e9);
  v.push_back(buf);
  if (hw.nvme > 0 && hw.world() == 1)
    v.push_back(
        "NVMe (max_params_nvme): a dry run of the engine's NVMe tier (docs/nvme.md) with the host budget (host "
        "memory less the reserve) enforced and the optimizer state that does not fit on the drive, up to --nvme; "
        "step = the dry run's clock (compute, waiting, the Adam pass, then the drive reading and writing that "
        "state at --nvme-read/--nvme-write) less the shorter of the Adam pass and the drive time, which the "
        "step's staging ring overlaps");
  if (hw.nvme > 0 && hw.world() > 1)
    v.push_back("NVMe given but not modelled: the engine's NVMe tier runs one process (world_size 1) only");
  return v;
}

std::vector<std::string> not_modelled() {
  return {
      "gathered chunks evicted under a tight capacity (a sharded rank's copies and device peak are predicted "
      "for a device that holds what is in flight; an evicted chunk would be fetched instead of all-gathered "
      "again), gathering ahead (its slots, and copies issued before the use), and the bandwidth NCCL achieves",
      "sharing of a PCIe switch or of host memory bandwidth between copies and the Adam pass",
      "allocator fragmentation on the device (the reserve stands for it)",
      "kernel efficiency of small or element-wise operations (a fixed sustained FLOP/s)",
      "overlap of the host Adam pass with transfers (the step is serial after backward)",
      "CPU contention between ranks, the data loader and the Adam threads",
      "the NVMe tier with more than one GPU (the engine's tier runs one process; docs/nvme.md)"};
}

std::string fmt_bytes(double b) {
  char buf[64];
  if (b >= kGiB)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / kGiB);
  else
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024.0));
  return buf;
}

void print_evaluation(const char* title, const Evaluation& e, const Hardware& hw) {
  const auto& it = e.run.last;
  std::printf("%s: %u layers, %.2fB params: %s\n", title, e.shape.layers, e.params / 1e9,
              e.fits() ? "fits"
                       : (!e.device_ok ? (e.run.out_of_memory() ? "does not fit: device out of memory"
                                                                : "does not fit: device peak over capacity")
                                       : "does not fit: host memory"));
  if (!e.run.ok()) {
    std::printf("  engine: %s in %s: %s\n", pstar_status_name(e.run.status), e.run.failed_call.c_str(),
                e.run.message.c_str());
    std::printf("  host %s per node of %s\n", fmt_bytes(double(e.host_per_node)).c_str(),
                fmt_bytes(hw.host_mem).c_str());
    return;
  }
  std::printf("  per GPU per iteration: %.2f GB moved (H2D %.2f, D2H %.2f), %.2f GB waited for\n",
              it.bytes_moved() / 1e9, it.bytes_host_to_device / 1e9, it.bytes_device_to_host / 1e9,
              it.bytes_critical / 1e9);
  std::printf("  step %.3f s = compute %.3f + waiting %.3f + Adam %.3f (host %.3f, device %.3f, concurrent)\n",
              e.step_s, e.run.compute_seconds, it.wait_seconds, e.adam_s, e.host_adam_s, e.device_adam_s);
  std::printf("  overlapped step %.3f s: the next forward waits %.3f s of the host's %.3f s of Adam\n",
              e.step_s_overlap, e.exposed_host_adam_s, e.host_adam_s);
  if (e.collectives.gathers > 0)
    std::printf(
        "  sharded over %u ranks: %u all-gathers (%.2f GB) and %u reduce-scatters (%.2f GB) per iteration, "
        "%.2f GB over each GPU's link, %.3f s\n",
        hw.world(), e.collectives.gathers, e.collectives.all_gathered / 1e9, e.collectives.reductions,
        e.collectives.reduce_scattered / 1e9, e.collective_link_bytes / 1e9, e.collective_s);
  if (e.collectives.gathers > 0)
    std::printf(
        "  a sharded rank: %.2f GB of shards to its GPU and %.2f GB of gradient blocks back (%.3f s), device peak "
        "%s (%s), step %.3f s\n",
        e.sharded_h2d_bytes / 1e9, e.sharded_d2h_bytes / 1e9, e.sharded_copy_s,
        fmt_bytes(double(e.sharded_peak_device)).c_str(),
        !e.sharded_device_ok ? "over capacity"
        : e.sharded_peak_device <= e.device_capacity
            ? "fits"
            : ("over capacity by " + fmt_bytes(double(e.sharded_peak_device - e.device_capacity)) +
               ": the engine evicts gathered chunks kept between uses to "
               "the host and back, moves not modelled")
                  .c_str(),
        e.step_s_sharded);
  if (e.collectives.gathers > 0 && e.hybrid)
    std::printf(
        "  a sharded rank's hybrid placement: its shards of %u chunks' state (%s), in a margin of %s above "
        "the larger of its need peak of %s with a streaming reserve of %s and its device peak of %s\n",
        e.sharded_placement.chunks, fmt_bytes(double(e.sharded_placement.state_bytes)).c_str(),
        fmt_bytes(double(e.sharded_placement.margin)).c_str(),
        fmt_bytes(double(e.collectives.need_peak_bytes_device_comm)).c_str(),
        fmt_bytes(2.0 * double(e.collectives.largest_chunk_bytes)).c_str(),
        fmt_bytes(double(e.collectives.peak_device_bytes_device_comm)).c_str());
  std::printf("  device peak %s of %s (activations up to %s)",
              fmt_bytes(double(e.run.final_stats.peak_device_bytes)).c_str(),
              fmt_bytes(double(e.device_capacity)).c_str(), fmt_bytes(double(e.run.peak_nonmodel_reported)).c_str());
  if (e.min_capacity) std::printf("; runs in %s", fmt_bytes(double(e.min_capacity)).c_str());
  std::printf("\n");
  if (e.hybrid)
    std::printf(
        "  hybrid: optimizer state of %u of %u chunks on the device (%s in the dry run; %s per rank of its "
        "%s share)\n",
        e.opt_chunks_on_device, e.opt_chunks, fmt_bytes(double(e.opt_device_bytes)).c_str(),
        fmt_bytes(double(e.opt_device_per_rank)).c_str(), fmt_bytes(double(e.opt_share_per_rank)).c_str());
  std::printf("  host %s per node of %s", fmt_bytes(double(e.host_per_node)).c_str(), fmt_bytes(hw.host_mem).c_str());
  if (e.hybrid && e.host_per_node_after != e.host_per_node)
    std::printf(" (peak; %s after placement)", fmt_bytes(double(e.host_per_node_after)).c_str());
  std::printf("\n");
}

// ---------------------------------------------------------------------------
// --min-capacity: the device floor
// ---------------------------------------------------------------------------

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

int run(int argc, char** argv) {
  const std::vector<Preset> known = presets();
  Planner pl;
  pl.args = parse_args(argc, argv, known);
  const Args& a = pl.args;
  if (a.min_capacity) {
    if (!a.verbose) pstar_log_set_callback(nullptr, nullptr, PSTAR_LOG_OFF);
    return run_min_capacity(a);
  }
  const Hardware& hw = a.hw;
  if (!a.verbose) pstar_log_set_callback(nullptr, nullptr, PSTAR_LOG_OFF);

  // Chunk size.  Candidates lie between the largest layer matrix (4h x h:
  // no layer parameter gets a jumbo chunk) and one layer (the default) or,
  // with --search-chunk-size, two layers: the size of every run of
  // consecutive layer parameters (each rounded to 128 elements as the layout
  // aligns them: the sizes that layers fill without waste), and with the
  // search also a grid of at most 64 steps.  Default: the best fill ratio
  // of a layout (build only, no dry run), the smallest on ties.  The search
  // keeps the candidates within 0.5% of the best fill ratio and takes the
  // one whose dry run needs the least device memory (smallest capacity
  // without out-of-memory), then the fewest bytes moved, then the smallest.
  const uint64_t h = a.shape.hidden;
  std::vector<uint64_t> layer_params;  // aligned sizes of one layer's parameters
  uint64_t layer_elems = 0;
  {
    GptShape one = a.shape;
    one.layers = 1;
    const Workload w1 = pstar::workload::make_gpt(one);
    for (size_t i = 2; i < 14; ++i) layer_params.push_back(round_up(w1.params[i].numel, 128));
    for (uint64_t n : layer_params) layer_elems += n;
  }
  uint64_t chunk = a.chunk_elems;
  Json search_rows = Json::array();
  if (!a.chunk_elems) {
    const uint64_t lo = round_up(4 * h * h, 128);
    const uint64_t hi = std::max(lo, (a.search_chunk ? 2 : 1) * layer_elems);
    std::vector<uint64_t> sizes;
    if (a.search_chunk) {
      const uint64_t step =
          std::max(round_up(std::max<uint64_t>(h * h / 2, 1), 128), round_up((hi - lo) / 64 + 1, 128));
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
        Json row{{"chunk_elems", c.chunk}, {"fill_ratio", num(c.fill)}, {"chunks", c.chunks}};
        if (c.fill >= best_fill - 0.005) {
          const Evaluation& e = pl.evaluate_margin(a.shape.layers, c.chunk, a.hybrid);
          const uint64_t need = e.device_ok ? e.min_capacity : UINT64_MAX;
          const uint64_t moved = e.device_ok ? e.run.last.bytes_moved() : UINT64_MAX;
          row["min_device_capacity_bytes"] = or_null(e.device_ok, need);
          row["bytes_moved_per_iter"] = or_null(e.device_ok, moved);
          // Candidates come in increasing size: on ties the smaller wins.
          if (chosen == 0 || need < best_need || (need == best_need && moved < best_moved)) {
            chosen = c.chunk;
            best_need = need;
            best_moved = moved;
          }
        }
        search_rows.push_back(std::move(row));
      }
      chunk = chosen;
    }
  }

  const Evaluation& requested = pl.evaluate_margin(a.shape.layers, chunk, a.hybrid);
  const Evaluation* requested_host_only = a.hybrid ? &pl.evaluate(a.shape.layers, chunk, false) : nullptr;

  // Largest model: binary search over the layer count at this width, for
  // the engine as configured (hybrid placement by default; it must fit the
  // host at its peak, warm-up or after placement), without hybrid
  // placement, and two what-ifs: hybrid placement with the host need after
  // placement alone, and each device's room beyond the smallest capacity
  // that runs holding optimizer state instead of cached chunks.  The host
  // bounds the searches: the four lists (>= 14 B/param) of all ranks'
  // shares fit in the nodes' host memory (plus, where device memory may
  // hold state, the devices' capacity).
  const double bytes_per_param = 12.0 + a.shape.dtype_bytes;
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

  const std::vector<std::string> assumptions = [&] {
    std::vector<std::string> v = common_assumptions(a);
    if (a.preset_def) {
      v.push_back("model shape: " + a.preset_def->shape_source +
                  ", vocabulary 30522 (transformers' BertConfig default, as PatrickStar's benchmark models), "
                  "activation checkpointing on (PatrickStar's benchmark default)");
      for (const auto& s : a.preset_def->assumptions) v.push_back(s);
    }
    return v;
  }();

  if (a.json) {
    Json o;
    o["planner"] = "pstar-plan";
    o["version"] = pstar_version_string();
    o["preset"] = or_null(!a.preset.empty(), a.preset);
    o["hardware"] = Json{{"gpus_per_node", hw.gpus_per_node},
                         {"nodes", hw.nodes},
                         {"gpu_mem_bytes", num(hw.gpu_mem)},
                         {"device_capacity_bytes", hw.device_capacity()},
                         {"host_mem_bytes", num(hw.host_mem)},
                         {"host_reserve_per_rank_bytes", num(hw.host_reserve)},
                         {"nvme_bytes", num(hw.nvme)},
                         {"nvme_read_bytes_per_s", num(hw.nvme_read)},
                         {"nvme_write_bytes_per_s", num(hw.nvme_write)},
                         {"h2d_bytes_per_s", num(hw.h2d)},
                         {"d2h_bytes_per_s", num(hw.d2h)},
                         {"flops_per_s", num(hw.flops)},
                         {"host_adam_bytes_per_s", num(hw.host_adam)}};
    o["hybrid_optimizer"] = a.hybrid;
    o["chunk_elems"] = chunk;
    o["chunk_count"] = requested.run.built.compute_chunks;
    o["fill_ratio"] = num(requested.run.built.fill_ratio);
    if (!search_rows.empty()) o["chunk_search"] = std::move(search_rows);
    o["requested"] = evaluation_json(requested);
    if (requested_host_only) o["requested_host_only"] = evaluation_json(*requested_host_only);
    // The largest model of each kind: its figures where one fits, else 0
    // for counts and null for the rest.
    o["max_params"] = top ? top->params : 0;
    o["max_shape"] = top ? shape_json(top->shape) : Json(nullptr);
    o["bytes_moved_per_iter"] = top ? top->run.last.bytes_moved() : 0;
    o["step_s"] = top ? num(top->step_s) : Json(nullptr);
    o["step_s_overlap"] = top ? num(top->step_s_overlap) : Json(nullptr);
    o["step_s_overlap_analytic"] = top ? num(top->step_s_overlap_analytic) : Json(nullptr);
    o["collective_s"] = top ? num(top->collective_s) : Json(nullptr);
    o["step_s_overlap_with_collectives"] = top ? num(top->step_s_overlap + top->collective_s) : Json(nullptr);
    o["step_s_sharded"] = top && top->step_s_sharded > 0 ? num(top->step_s_sharded) : Json(nullptr);
    o["sharded_peak_device_bytes"] = top ? top->sharded_peak_device : 0;
    o["sharded_device_ok"] = top ? top->sharded_device_ok : false;
    o["peak_device_bytes"] = top ? top->run.final_stats.peak_device_bytes : 0;
    o["host_needed_per_node_bytes"] = top ? top->host_per_node : 0;
    o["optimizer_device_bytes_per_rank"] = top ? top->opt_device_per_rank : 0;
    o["max"] = top ? evaluation_json(*top) : Json(nullptr);
    o["max_params_host_only"] = top_host_only ? top_host_only->params : 0;
    o["max_shape_host_only"] = top_host_only ? shape_json(top_host_only->shape) : Json(nullptr);
    o["bytes_moved_per_iter_host_only"] = top_host_only ? top_host_only->run.last.bytes_moved() : 0;
    o["step_s_host_only"] = top_host_only ? num(top_host_only->step_s) : Json(nullptr);
    o["step_s_overlap_host_only"] = top_host_only ? num(top_host_only->step_s_overlap) : Json(nullptr);
    o["max_host_only"] = top_host_only ? evaluation_json(*top_host_only) : Json(nullptr);
    o["max_params_hybrid_steady_host"] = top_steady ? top_steady->params : 0;
    o["max_shape_hybrid_steady_host"] = top_steady ? shape_json(top_steady->shape) : Json(nullptr);
    o["max_params_with_device_margin"] = top_margin ? top_margin->params : 0;
    o["max_shape_with_device_margin"] = top_margin ? shape_json(top_margin->shape) : Json(nullptr);
    o["nvme_modelled"] = nvme_modelled;
    o["max_params_nvme"] = top_nvme ? top_nvme->params : 0;
    o["max_shape_nvme"] = top_nvme ? shape_json(top_nvme->shape) : Json(nullptr);
    o["step_s_nvme"] = top_nvme ? num(top_nvme->step_s) : Json(nullptr);
    o["nvme_used_bytes"] = top_nvme ? top_nvme->nvme_bytes : 0;
    o["drive_s_nvme"] = top_nvme ? num(top_nvme->drive_s) : Json(nullptr);
    o["dry_runs"] = pl.dry_runs;
    if (a.preset_def) {
      Json pubs = Json::array();
      for (const auto& p : a.preset_def->published)
        pubs.push_back(Json{
            {"system", p.system}, {"max_params", p.params > 0 ? num(p.params) : Json(nullptr)}, {"source", p.note}});
      o["published"] = std::move(pubs);
    }
    o["assumptions"] = assumptions;
    o["not_modelled"] = not_modelled();
    std::printf("%s\n", o.dump().c_str());
    return 0;
  }

  if (a.preset_def) std::printf("pstar-plan: preset %s: %s\n", a.preset.c_str(), a.preset_def->description.c_str());
  std::printf(
      "model: hidden %u, %u heads, vocabulary %u, sequence %u, batch %u per GPU, checkpointing %s, %u-byte dtype\n",
      a.shape.hidden, a.shape.heads, a.shape.vocab, a.shape.seq, a.shape.batch, a.shape.checkpointing ? "on" : "off",
      a.shape.dtype_bytes);
  std::printf(
      "hardware: %u x %u GPUs, %s per GPU (%s for the engine), host %s per node (%s per rank reserved),\n"
      "          links %.1f / %.1f GB/s per GPU, %.0f TFLOP/s per GPU, host Adam %.0f GB/s per node,\n"
      "          device Adam %.0f GB/s per GPU\n",
      hw.nodes, hw.gpus_per_node, fmt_bytes(hw.gpu_mem).c_str(), fmt_bytes(double(hw.device_capacity())).c_str(),
      fmt_bytes(hw.host_mem).c_str(), fmt_bytes(hw.host_reserve).c_str(), hw.h2d / 1e9, hw.d2h / 1e9, hw.flops / 1e12,
      hw.host_adam / 1e9, hw.device_adam / 1e9);
  std::printf("chunks: %" PRIu64 " elements (%u chunks, fill ratio %.3f)%s\n", chunk,
              requested.run.built.compute_chunks, requested.run.built.fill_ratio,
              a.search_chunk ? ", chosen by --search-chunk-size" : "");
  print_evaluation("requested", requested, hw);
  if (a.search) {
    if (top)
      print_evaluation(a.hybrid ? "largest that fits (hybrid placement)" : "largest that fits", *top, hw);
    else
      std::printf("largest that fits: none (not even one layer)\n");
    if (a.hybrid) {
      if (top_host_only)
        std::printf("without hybrid placement (--no-hybrid): %u layers, %.2fB params, %.2f GB moved, step %.3f s\n",
                    top_host_only->shape.layers, top_host_only->params / 1e9,
                    top_host_only->run.last.bytes_moved() / 1e9, top_host_only->step_s);
      else
        std::printf("without hybrid placement (--no-hybrid): none\n");
      if (top_steady)
        std::printf(
            "what-if, hybrid placement counting the host after placement only (the engine holds all state on the "
            "host until warm-up ends): %u layers, %.2fB params\n",
            top_steady->shape.layers, top_steady->params / 1e9);
    }
    if (top_margin)
      std::printf(
          "what-if, each GPU's memory beyond the smallest capacity that runs holding optimizer state of its "
          "rank's share instead of cached chunks, never held on the host (not built: the engine places state only "
          "in room its warm-up left unused, after holding it on the host through warm-up): %u layers, %.2fB "
          "params\n",
          top_margin->shape.layers, top_margin->params / 1e9);
  }
  if (nvme_modelled) {
    if (top_nvme)
      std::printf(
          "with the NVMe tier (%s drive, %.1f / %.1f GB/s): %u layers, %.2fB params, %s of optimizer state on "
          "the drive (%u chunks), drive %.3f s per step, step %.3f s\n",
          fmt_bytes(hw.nvme).c_str(), hw.nvme_read / 1e9, hw.nvme_write / 1e9, top_nvme->shape.layers,
          top_nvme->params / 1e9, fmt_bytes(double(top_nvme->nvme_bytes)).c_str(), top_nvme->nvme_chunks,
          top_nvme->drive_s, top_nvme->step_s);
    else
      std::printf("with the NVMe tier: none\n");
  }
  if (a.preset_def)
    for (const auto& p : a.preset_def->published)
      std::printf("published: %s: %s (%s)\n", p.system.c_str(),
                  p.params > 0 ? (std::to_string(int(p.params / 1e9 + 0.5)) + "B").c_str() : "-", p.note.c_str());
  std::printf("assumptions:\n");
  for (const auto& s : assumptions) std::printf("  - %s\n", s.c_str());
  std::printf("not modelled:\n");
  for (const auto& s : not_modelled()) std::printf("  - %s\n", s.c_str());
  std::printf("%u dry runs\n", pl.dry_runs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pstar-plan: %s\n", e.what());
    return 1;
  }
}
