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
//
// This file holds the command line (its options, their values' parsing and
// checks) and main, which runs the mode asked for.  The rest, by
// responsibility: plan.h (the shared types), presets.cpp (PatrickStar's
// machines), evaluate.cpp (the dry runs and the model over them),
// search.cpp (chunk size, largest models), report.cpp (JSON and text),
// assumptions.cpp (what the report says it assumes), min_capacity.cpp
// (--min-capacity).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "plan.h"
#include "pstar/pstar.h"
#include "tool_cli.h"

namespace pstar::plan {

namespace {

using pstar::tools::UsageError;

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

  option("Engine", "--state-format", "fp32|bf16|int8",
         "Adam's m and v: fp32 (default), bf16, or int8 (blockwise 8-bit, an fp32 maximum per 256 elements);\n"
         "another format than fp32 excludes --nvme (the planner's NVMe model counts fp32 state)",
         [&](const std::string&, const std::string& v) {
           if (v == "fp32")
             a.state_format = PSTAR_STATE_FP32;
           else if (v == "bf16")
             a.state_format = PSTAR_STATE_BF16;
           else if (v == "int8")
             a.state_format = PSTAR_STATE_INT8;
           else
             throw UsageError("--state-format: expected fp32, bf16 or int8, got '" + v + "'");
         });

  option("Engine", "--master-format", "fp32|bf16",
         "the masters: fp32 (default) or bf16 (stochastic rounding); bf16 excludes --nvme, as\n"
         "--state-format does (the planner's NVMe model counts fp32 state)",
         [&](const std::string&, const std::string& v) {
           if (v == "fp32")
             a.master_format = PSTAR_MASTER_FP32;
           else if (v == "bf16")
             a.master_format = PSTAR_MASTER_BF16;
           else
             throw UsageError("--master-format: expected fp32 or bf16, got '" + v + "'");
         });

  const char* search = "Search";
  option(search, "--chunk-elems", "N",
         "elements per chunk, a multiple of 128 (256 with --state-format int8; default: one layer's parameters)",
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
    if (!a.default_formats()) {
      const std::string f = a.master_format == PSTAR_MASTER_BF16 && a.state_format == PSTAR_STATE_FP32
                                ? "fp32 --master-format bf16"
                                : state_format_name(a.state_format);
      if (a.hw.nvme > 0)
        throw UsageError("--nvme with --state-format " + f +
                         ": the planner's NVMe model counts fp32 optimizer state only (the engine's tier takes the "
                         "format; its model here is not written yet)");
      if (a.chunk_elems % layout_align(a.state_format) != 0)
        throw UsageError("--chunk-elems must be a multiple of " + std::to_string(layout_align(a.state_format)) +
                         " with --state-format " + f + " (its block)");
    }
  });
  return a;
}

// The mode asked for: --min-capacity, or the plan and its report.
int run(int argc, char** argv) {
  const std::vector<Preset> known = presets();
  Planner pl;
  pl.args = parse_args(argc, argv, known);
  const Args& a = pl.args;
  if (a.min_capacity) {
    if (!a.verbose) pstar_log_set_callback(nullptr, nullptr, PSTAR_LOG_OFF);
    return run_min_capacity(a);
  }
  if (!a.verbose) pstar_log_set_callback(nullptr, nullptr, PSTAR_LOG_OFF);
  const Plan plan = make_plan(pl);
  if (a.json)
    print_json(pl, plan);
  else
    print_text(pl, plan);
  return 0;
}

}  // namespace

}  // namespace pstar::plan

int main(int argc, char** argv) {
  try {
    return pstar::plan::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pstar-plan: %s\n", e.what());
    return 1;
  }
}
