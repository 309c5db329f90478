// EngineOptions: an engine's configuration, validated and with every default
// filled in.  The core takes this plain struct and never the ABI's
// pstar_engine_options: capi/options.cpp checks the ABI struct's size and
// version, the ranges and the combinations, and makes one of these (so a
// new ABI version changes capi/, not the engine).  Field meanings are those
// of pstar_engine_options in pstar.h; only the types differ (flags are bool; Adam's and the
// loss scaler's settings are the optimizer's structs).
#pragma once

#include <cstdint>

#include "optim/adam.h"
#include "optim/loss_scaler.h"
#include "pstar/pstar.h"

namespace pstar::engine {

struct EngineOptions {
  // Device and memory.
  pstar_device_kind device = PSTAR_DEVICE_EMULATED;
  int32_t device_ordinal = 0;
  uint64_t device_capacity_bytes = 0;  // 0 = unlimited
  uint64_t device_margin_bytes = 0;    // kept free of the capacity for what is not reported
  uint64_t host_capacity_bytes = 0;    // 0 = unlimited
  uint64_t chunk_elems = 0;            // a multiple of chunk::kAlignElems
  uint32_t threads = 0;                // the CPU optimizer's threads; 0 = hardware concurrency
  bool strict = false;                 // emulated device: checked stream semantics
  uint64_t strict_seed = 0;
  pstar_dtype compute_dtype = PSTAR_DTYPE_BF16;
  // Adam and the loss scaler, in the optimizer's own types.
  optim::AdamHyper adam;
  float clip_norm = 0.0f;              // 0 = off
  optim::LossScalerConfig loss_scale;  // enabled for an f16 compute dtype
  bool grad_accumulation = false;
  pstar_state_format state_format = PSTAR_STATE_FP32;  // Adam's m and v
  pstar_master_format master_format = PSTAR_MASTER_FP32;
  uint64_t master_seed = 0;  // bf16 masters' stochastic rounding
  // Placement.
  pstar_policy placement_policy = PSTAR_POLICY_OPT;
  uint32_t warmup_iterations = 1;  // >= 1
  bool prefetch = true;
  bool hybrid_optimizer = false;
  // The modelled device (emulated only): a virtual clock, dry runs
  // (address space only), and the link's bandwidths (nonzero).
  bool virtual_clock = false;
  bool dry_run = false;  // implies virtual_clock
  double h2d_bytes_per_s = 0.0, d2h_bytes_per_s = 0.0;
  bool record_timeline = false;
  // Data parallelism: world_size 0 = from the launcher's environment.
  int32_t rank = 0;
  int32_t world_size = 0;
  uint32_t comm_timeout_ms = 0;  // nonzero
};

}  // namespace pstar::engine
