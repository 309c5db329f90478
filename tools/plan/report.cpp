// pstar-plan's report: a plan (search.cpp) as one JSON object (--json; the
// keys docs/planner.md lists, in a fixed order) or as text, and the JSON
// and text forms of one evaluation that both use.  Formatting only: every
// figure comes from the dry runs and the model in evaluate.cpp.
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "plan.h"

namespace pstar::plan {

Json num(double v) {
  if (!std::isfinite(v)) return nullptr;
  if (v == std::floor(v) && std::fabs(v) < 9e15) return static_cast<int64_t>(v);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return std::strtod(buf, nullptr);
}

namespace {

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

}  // namespace

void print_json(const Planner& pl, const Plan& plan) {
  const Args& a = pl.args;
  const Hardware& hw = a.hw;
  const uint64_t chunk = plan.chunk_elems;
  const Evaluation& requested = *plan.requested;
  const Evaluation* requested_host_only = plan.requested_host_only;
  const Evaluation* top = plan.top;
  const Evaluation* top_host_only = plan.top_host_only;
  const Evaluation* top_steady = plan.top_steady;
  const Evaluation* top_margin = plan.top_margin;
  const bool nvme_modelled = plan.nvme_modelled;
  const Evaluation* top_nvme = plan.top_nvme;
  const std::vector<std::string> assumptions = plan_assumptions(a);
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
  // Whether the plan (max_params) runs with hybrid placement: as configured,
  // unless the search without it found the larger model (picked off).
  o["hybrid_optimizer"] = a.hybrid && !plan.hybrid_picked_off;
  o["hybrid_optimizer_picked_off"] = plan.hybrid_picked_off;
  o["max_params_hybrid"] = plan.top_hybrid ? plan.top_hybrid->params : 0;
  // --state-format other than fp32: the format, the four lists' bytes and
  // an update's bytes per parameter, and the engine's
  // own peak host bytes per parameter at the largest model (its dry run: one
  // process holding the whole model).
  if (!a.default_formats()) {
    o["state_format"] = state_format_name(a.state_format);
    if (a.master_format != PSTAR_MASTER_FP32) o["master_format"] = "bf16";
    o["bytes_per_param"] = num(a.state_bytes() + a.shape.dtype_bytes);
    o["adam_bytes_per_elem"] = num(a.adam_bytes(a.shape.dtype_bytes));
    o["max_engine_peak_host_bytes_per_param"] =
        top ? num(double(top->run.final_stats.peak_host_bytes) / double(top->params)) : Json(nullptr);
  }
  o["chunk_elems"] = chunk;
  o["chunk_count"] = requested.run.built.compute_chunks;
  o["fill_ratio"] = num(requested.run.built.fill_ratio);
  if (!plan.chunk_search.empty()) {
    Json search_rows = Json::array();
    for (const ChunkCandidate& c : plan.chunk_search) {
      Json row{{"chunk_elems", c.chunk_elems}, {"fill_ratio", num(c.fill_ratio)}, {"chunks", c.chunks}};
      if (c.evaluated) {
        row["min_device_capacity_bytes"] = or_null(c.device_ok, c.min_device_capacity);
        row["bytes_moved_per_iter"] = or_null(c.device_ok, c.bytes_moved_per_iter);
      }
      search_rows.push_back(std::move(row));
    }
    o["chunk_search"] = std::move(search_rows);
  }
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
    for (const auto& pub : a.preset_def->published)
      pubs.push_back(Json{{"system", pub.system},
                          {"max_params", pub.params > 0 ? num(pub.params) : Json(nullptr)},
                          {"source", pub.note}});
    o["published"] = std::move(pubs);
  }
  o["assumptions"] = assumptions;
  o["not_modelled"] = not_modelled();
  std::printf("%s\n", o.dump().c_str());
}

void print_text(const Planner& pl, const Plan& plan) {
  const Args& a = pl.args;
  const Hardware& hw = a.hw;
  const uint64_t chunk = plan.chunk_elems;
  const Evaluation& requested = *plan.requested;
  const Evaluation* top = plan.top;
  const Evaluation* top_host_only = plan.top_host_only;
  const Evaluation* top_steady = plan.top_steady;
  const Evaluation* top_margin = plan.top_margin;
  const bool nvme_modelled = plan.nvme_modelled;
  const Evaluation* top_nvme = plan.top_nvme;
  const std::vector<std::string> assumptions = plan_assumptions(a);
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
  if (!a.default_formats())
    std::printf("state format: %s (%s masters; %.4g B/param for the four lists, %.4g B per element per Adam update)\n",
                state_format_name(a.state_format), a.master_format == PSTAR_MASTER_BF16 ? "bf16" : "fp32",
                a.state_bytes() + a.shape.dtype_bytes, a.adam_bytes(a.shape.dtype_bytes));
  std::printf("chunks: %" PRIu64 " elements (%u chunks, fill ratio %.3f)%s\n", chunk,
              requested.run.built.compute_chunks, requested.run.built.fill_ratio,
              a.search_chunk ? ", chosen by --search-chunk-size" : "");
  print_evaluation("requested", requested, hw);
  if (a.search) {
    if (top)
      print_evaluation(top->hybrid              ? "largest that fits (hybrid placement)"
                       : plan.hybrid_picked_off ? "largest that fits (without hybrid placement: it fits more here)"
                                                : "largest that fits",
                       *top, hw);
    if (plan.hybrid_picked_off && plan.top_hybrid)
      std::printf("with hybrid placement: %u layers, %.2fB params\n", plan.top_hybrid->shape.layers,
                  plan.top_hybrid->params / 1e9);
    else if (plan.hybrid_picked_off)
      std::printf("with hybrid placement: none\n");
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
    for (const auto& pub : a.preset_def->published)
      std::printf("published: %s: %s (%s)\n", pub.system.c_str(),
                  pub.params > 0 ? (std::to_string(int(pub.params / 1e9 + 0.5)) + "B").c_str() : "-", pub.note.c_str());
  std::printf("assumptions:\n");
  for (const auto& s : assumptions) std::printf("  - %s\n", s.c_str());
  std::printf("not modelled:\n");
  for (const auto& s : not_modelled()) std::printf("  - %s\n", s.c_str());
  std::printf("%u dry runs\n", pl.dry_runs);
}

}  // namespace pstar::plan
