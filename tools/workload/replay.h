// Drives a Workload through libpstar's C API: one engine, the workload's
// parameters registered in order, then TRAIN iterations following its
// schedule.  Per use: report the use's non-model bytes, acquire its
// parameters (one moment each), advance the virtual clock by its compute
// time, write each gradient in backward, release.  Before each step the
// clock advances by the optimizer's modelled time (fixed, or a function of
// the engine's statistics at that point, e.g. of the optimizer state that
// hybrid placement moved to the device).
//
// With options.dry_run the engine holds no payloads (acquire yields NULL,
// gradients are written as NULL); otherwise gradients are zeros from a host
// buffer (F32), so a run with payloads and the same options moves the same
// chunks.  The clock calls are made only when options.virtual_clock or
// options.dry_run is set.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "gpt_workload.h"
#include "pstar/pstar.h"

namespace pstar::workload {

struct ReplayConfig {
  pstar_engine_options options;    // used as given
  uint32_t iterations = 2;         // TRAIN iterations (the first is the warm-up)
  double flops_per_s = 0.0;        // > 0: a use's compute takes flops / flops_per_s
  double optimizer_seconds = 0.0;  // > 0: clock advance before each pstar_step
  // Set: replaces optimizer_seconds; called before each pstar_step with the
  // engine's statistics at that point (a result <= 0 advances nothing).
  std::function<double(const pstar_stats&)> optimizer_seconds_fn;
  // > 0 (a clocked replay): the CPU update's modelled rate
  // (pstar_x_engine_set_modelled_host_update): with the overlapped step
  // (options as given: on by default) the updates run beside the next
  // iteration on the clock.
  double host_update_bytes_per_s = 0.0;
  bool build_only = false;  // register and build, run nothing
  // Non-empty (with options.record_timeline): pstar_trace_export() there at the end.
  std::string timeline_path;
  // Set: the engine gets this NVMe tier (experimental API) before build.
  bool use_nvme = false;
  pstar_x_nvme_options nvme{};
  ReplayConfig();  // options = the library's defaults
};

// Counter deltas over one TRAIN iteration (begin to the end of its step).
struct IterationFigures {
  uint64_t bytes_host_to_device = 0;
  uint64_t bytes_device_to_host = 0;
  uint64_t bytes_prefetched = 0;
  uint64_t bytes_critical = 0;
  uint64_t moves_to_device = 0;
  uint64_t evictions = 0;
  uint64_t trace_fallbacks = 0;
  uint64_t budget_overruns = 0;
  double clock_seconds = 0.0;  // modelled on a virtual clock
  double wait_seconds = 0.0;
  uint64_t bytes_moved() const { return bytes_host_to_device + bytes_device_to_host; }
};

struct ReplayResult {
  // PSTAR_OK, or the status of the first call that failed (the replay stops
  // there), with the call and the library's message.
  pstar_status status = PSTAR_OK;
  std::string failed_call;
  std::string message;
  uint32_t iterations_done = 0;
  pstar_stats built;              // right after pstar_engine_build
  pstar_stats final_stats;        // at the end (or at the failure)
  pstar_x_gather_stats gather{};  // at the end of a run that completed (experimental API)
  IterationFigures last;          // the last completed iteration
  double compute_seconds = 0.0;   // per iteration: sum of flops / flops_per_s
  uint64_t peak_nonmodel_reported = 0;
  pstar_x_nvme_stats nvme{};  // at the end, with use_nvme

  bool ok() const { return status == PSTAR_OK; }
  bool out_of_memory() const { return status == PSTAR_ERR_OUT_OF_MEMORY; }
  // The four chunk lists as the layout packed them (compute + master, m, v).
  uint64_t list_bytes() const { return built.compute_list_bytes + 3 * built.optimizer_list_bytes; }
};

ReplayResult replay(const Workload& workload, const ReplayConfig& config);

// Library dtype of a compute dtype size: 2 -> BF16, 4 -> F32.
pstar_dtype compute_dtype_for(uint32_t dtype_bytes);

}  // namespace pstar::workload
