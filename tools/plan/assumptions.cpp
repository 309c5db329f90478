// pstar-plan's assumptions and omissions, as the report states them: what
// the figures rest on for the given arguments (the workload, the engine's
// configuration, the host and optimizer model, the NVMe tier, a preset's
// sources), and what the model leaves out.  Prose beside the model rather
// than in it, so that it is read and revised in one place.
#include <cstdio>
#include <string>
#include <vector>

#include "plan.h"

namespace pstar::plan {

namespace {

// With --state-format other than fp32: what the format stores.  (fp32 adds
// nothing: its report is today's, word for word.)
std::string format_words(pstar_state_format f) {
  return f == PSTAR_STATE_BF16   ? "m and v in bf16 (2 B each)"
         : f == PSTAR_STATE_INT8 ? "m and v as int8 codes with an fp32 maximum per 256-element block (1.016 B each)"
                                 : "m and v in fp32 (4 B each)";
}
// The masters as the formats' sentences name them.
const char* master_words(pstar_master_format m) {
  return m == PSTAR_MASTER_BF16 ? "the bf16 master (2 B, stochastic rounding)" : "the fp32 master";
}

std::vector<std::string> common_assumptions(const Args& a) {
  const Hardware& hw = a.hw;
  const bool fp32 = a.default_formats();
  const std::string fmt =
      std::string(state_format_name(a.state_format)) + (a.master_format == PSTAR_MASTER_BF16 ? " (bf16 masters)" : "");
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
                           "do not all fit beside its activations, and then nothing is placed; the search runs "
                           "without it too, and where that finds the larger model the plan is that one: "
                           "hybrid_optimizer says which)"
                         : "off (--no-hybrid: all optimizer state on the host)");
  v.push_back(buf);
  if (!fp32) {
    std::snprintf(buf, sizeof buf,
                  "state format %s (options.state_format, options.master_format): %s and %s; every dry run's "
                  "engine holds "
                  "its moments so (its host figures are the format's), int8 aligns parameters and chunks to 256 "
                  "elements; the four lists %.4g B/param, an Adam update moves %.4g B per element (with a %u-byte "
                  "dtype)",
                  fmt.c_str(), master_words(a.master_format), format_words(a.state_format).c_str(),
                  a.state_bytes() + a.shape.dtype_bytes, a.adam_bytes(a.shape.dtype_bytes), a.shape.dtype_bytes);
    v.push_back(buf);
  }
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
  if (fp32)
    std::snprintf(buf, sizeof buf,
                  "host per node = ranks x (share of the four chunk lists (14 B/param with a 2-byte dtype, over all "
                  "%u ranks, as the engine's ZeRO sharding, ZeRO and PatrickStar divide them) + the "
                  "engine's host bytes beyond the lists + %.1f GiB reserved per rank)",
                  hw.world(), hw.host_reserve / kGiB);
  else
    std::snprintf(buf, sizeof buf,
                  "host per node = ranks x (share of the four chunk lists (%.4g B/param with a 2-byte dtype in %s: "
                  "the compute copy, %s, %s; over all %u ranks, as the engine's ZeRO sharding, ZeRO "
                  "and PatrickStar divide them) + the engine's host bytes beyond the lists + %.1f GiB reserved per "
                  "rank)",
                  a.state_bytes() + 2.0, fmt.c_str(), master_words(a.master_format),
                  format_words(a.state_format).c_str(), hw.world(), hw.host_reserve / kGiB);
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
  if (fp32)
    std::snprintf(buf, sizeof buf,
                  "step = modelled compute (FLOPs / sustained FLOP/s) + the engine's modelled waiting for moves + the "
                  "optimizer: 28 B per element (gradient read, master, m, v read and written, weight written) of the "
                  "node's host-held share at the node's host Adam bandwidth, and of each GPU's device-held share at "
                  "%.0f GB/s (the device's memory bandwidth; the engine's modelled device counts that update as no "
                  "time), concurrently, the longer of the two; one micro-batch per step",
                  hw.device_adam / 1e9);
  else
    std::snprintf(buf, sizeof buf,
                  "step = modelled compute (FLOPs / sustained FLOP/s) + the engine's modelled waiting for moves + the "
                  "optimizer: %.4g B per element in %s (gradient read, master, m, v read and written, weight "
                  "written; fp32 moves %.4g) of the node's host-held share at the node's host Adam bandwidth, the "
                  "update being memory-bound (the engine's modelled overlapped update counts fp32's bytes, so it is "
                  "given that bandwidth scaled by %.4g / %.4g); one micro-batch per step",
                  a.adam_bytes(a.shape.dtype_bytes), fmt.c_str(),
                  adam_bytes_per_elem(PSTAR_STATE_FP32, a.shape.dtype_bytes),
                  adam_bytes_per_elem(PSTAR_STATE_FP32, a.shape.dtype_bytes), a.adam_bytes(a.shape.dtype_bytes));
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

}  // namespace

std::vector<std::string> plan_assumptions(const Args& a) {
  std::vector<std::string> v = common_assumptions(a);
  if (a.preset_def) {
    v.push_back("model shape: " + a.preset_def->shape_source +
                ", vocabulary 30522 (transformers' BertConfig default, as PatrickStar's benchmark models), "
                "activation checkpointing on (PatrickStar's benchmark default)");
    for (const auto& s : a.preset_def->assumptions) v.push_back(s);
  }
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

}  // namespace pstar::plan
