#include "replay.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace pstar::workload {

ReplayConfig::ReplayConfig() { pstar_engine_options_init(&options); }

pstar_dtype compute_dtype_for(uint32_t dtype_bytes) { return dtype_bytes == 4 ? PSTAR_DTYPE_F32 : PSTAR_DTYPE_BF16; }

namespace {

// Stops the replay at the first failing call.
struct Failure {
  pstar_status status;
  std::string call;
  std::string message;
};

void check(pstar_status st, const char* call) {
  if (st != PSTAR_OK) throw Failure{st, call, pstar_last_error_message()};
}

pstar_stats stats_of(pstar_engine* e) {
  pstar_stats s;
  pstar_stats_init(&s);
  check(pstar_engine_get_stats(e, &s), "pstar_engine_get_stats");
  return s;
}

IterationFigures delta(const pstar_stats& a, const pstar_stats& b) {
  IterationFigures f;
  f.bytes_host_to_device = b.bytes_host_to_device - a.bytes_host_to_device;
  f.bytes_device_to_host = b.bytes_device_to_host - a.bytes_device_to_host;
  f.bytes_prefetched = b.bytes_prefetched - a.bytes_prefetched;
  f.bytes_critical = b.bytes_critical - a.bytes_critical;
  f.moves_to_device = b.moves_to_device - a.moves_to_device;
  f.evictions = b.evictions - a.evictions;
  f.trace_fallbacks = b.trace_fallbacks - a.trace_fallbacks;
  f.budget_overruns = b.budget_overruns - a.budget_overruns;
  f.clock_seconds = b.clock_seconds - a.clock_seconds;
  f.wait_seconds = b.wait_seconds - a.wait_seconds;
  return f;
}

pstar_stage stage_of(Stage s) {
  switch (s) {
    case Stage::Forward: return PSTAR_STAGE_FORWARD;
    case Stage::Backward: return PSTAR_STAGE_BACKWARD;
    case Stage::Recompute: return PSTAR_STAGE_RECOMPUTE;
  }
  return PSTAR_STAGE_FORWARD;
}

}  // namespace

ReplayResult replay(const Workload& w, const ReplayConfig& cfg) {
  ReplayResult r;
  pstar_stats_init(&r.built);
  pstar_stats_init(&r.final_stats);
  const bool dry = cfg.options.dry_run != 0;
  const bool clocked = dry || cfg.options.virtual_clock != 0;
  const bool advance = clocked && cfg.flops_per_s > 0.0;
  for (const Use& u : w.schedule) {
    r.peak_nonmodel_reported = std::max(r.peak_nonmodel_reported, u.nonmodel_bytes);
    if (cfg.flops_per_s > 0.0) r.compute_seconds += u.flops / cfg.flops_per_s;
  }

  pstar_engine* e = nullptr;
  std::vector<float> zeros;  // gradients of a run with payloads
  try {
    check(pstar_engine_create(&cfg.options, &e), "pstar_engine_create");
    if (cfg.use_nvme) check(pstar_x_engine_set_nvme(e, &cfg.nvme), "pstar_x_engine_set_nvme");
    if (cfg.host_update_bytes_per_s > 0.0) {
      check(pstar_x_engine_set_modelled_host_update(e, cfg.host_update_bytes_per_s),
            "pstar_x_engine_set_modelled_host_update");
    }
    std::vector<uint32_t> ids(w.params.size());
    uint64_t max_numel = 0;
    for (size_t i = 0; i < w.params.size(); ++i) {
      const Param& p = w.params[i];
      const uint32_t flags = p.no_weight_decay ? PSTAR_PARAM_NO_WEIGHT_DECAY : PSTAR_PARAM_DEFAULT;
      check(pstar_param_register(e, p.name.c_str(), uint32_t(p.shape.size()), p.shape.data(), flags, &ids[i]),
            "pstar_param_register");
      max_numel = std::max(max_numel, p.numel);
    }
    check(pstar_engine_build(e), "pstar_engine_build");
    r.built = stats_of(e);
    if (cfg.build_only) {
      r.final_stats = r.built;
      pstar_engine_destroy(e);
      return r;
    }
    if (!dry) zeros.assign(max_numel, 0.0f);
    const void* grad = dry ? nullptr : zeros.data();

    for (uint32_t it = 0; it < cfg.iterations; ++it) {
      const pstar_stats before = stats_of(e);
      check(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN), "pstar_iteration_begin");
      for (const Use& u : w.schedule) {
        check(pstar_nonmodel_report(e, u.nonmodel_bytes), "pstar_nonmodel_report");
        const pstar_stage stage = stage_of(u.stage);
        for (uint32_t p : u.params) {
          void* ptr = nullptr;
          check(pstar_param_acquire(e, ids[p], stage, nullptr, &ptr), "pstar_param_acquire");
        }
        if (advance && u.flops > 0.0) check(pstar_clock_advance(e, u.flops / cfg.flops_per_s), "pstar_clock_advance");
        if (u.grad_write)
          for (uint32_t p : u.params)
            check(pstar_grad_write(e, ids[p], grad, w.params[p].numel, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, nullptr),
                  "pstar_grad_write");
        for (uint32_t p : u.params) check(pstar_param_release(e, ids[p], nullptr), "pstar_param_release");
      }
      check(pstar_nonmodel_report(e, 0), "pstar_nonmodel_report");
      if (clocked) {
        const double opt_s = cfg.optimizer_seconds_fn ? cfg.optimizer_seconds_fn(stats_of(e)) : cfg.optimizer_seconds;
        if (opt_s > 0.0) check(pstar_clock_advance(e, opt_s), "pstar_clock_advance");
      }
      check(pstar_step(e, nullptr), "pstar_step");
      const pstar_stats after = stats_of(e);
      r.last = delta(before, after);
      r.iterations_done = it + 1;
    }
    r.final_stats = stats_of(e);
    check(pstar_x_gather_stats_init(&r.gather), "pstar_x_gather_stats_init");
    check(pstar_x_gather_get_stats(e, &r.gather), "pstar_x_gather_get_stats");
    if (cfg.use_nvme) {
      check(pstar_x_nvme_stats_init(&r.nvme), "pstar_x_nvme_stats_init");
      check(pstar_x_nvme_get_stats(e, &r.nvme), "pstar_x_nvme_get_stats");
    }
    if (!cfg.timeline_path.empty()) check(pstar_trace_export(e, cfg.timeline_path.c_str()), "pstar_trace_export");
  } catch (const Failure& f) {
    r.status = f.status;
    r.failed_call = f.call;
    r.message = f.message;
    if (e) {
      pstar_stats s;
      pstar_stats_init(&s);
      if (pstar_engine_get_stats(e, &s) == PSTAR_OK) r.final_stats = s;
    }
  }
  pstar_engine_destroy(e);
  return r;
}

}  // namespace pstar::workload
