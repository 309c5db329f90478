// Options validation: pstar_engine_options (the ABI struct) into the
// core's engine::EngineOptions.  The struct's size and version are checked
// here (util/struct_check.h's rule: a caller built against an older header
// passes an older version, whose later fields keep their defaults), then
// every range and combination; the core only ever sees the result.
#include "options.h"

#include <cfloat>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>

#include "chunk/layout.h"
#include "engine/engine.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/settings.h"
#include "util/struct_check.h"

namespace pstar::capi {

namespace {
// Modelled bandwidths divide byte counts: 0 (the default) or at least one
// byte per second.
bool bandwidth_ok(double v) { return v == 0.0 || (v >= 1.0 && v <= 1e18); }

engine::EngineOptions converted(const pstar_engine_options& o) {
  engine::EngineOptions e;
  e.device = o.device;
  e.device_ordinal = o.device_ordinal;
  e.device_capacity_bytes = o.device_capacity_bytes;
  e.device_margin_bytes = o.device_margin_bytes;
  e.host_capacity_bytes = o.host_capacity_bytes;
  e.chunk_elems = o.chunk_elems;
  e.threads = o.threads;
  e.strict = o.strict != 0;
  e.strict_seed = o.strict_seed;
  e.compute_dtype = o.compute_dtype;
  e.adam.lr = o.lr;
  e.adam.beta1 = o.beta1;
  e.adam.beta2 = o.beta2;
  e.adam.eps = o.eps;
  e.adam.weight_decay = o.weight_decay;
  e.adam.adamw = o.adamw != 0;
  e.clip_norm = o.clip_norm;
  e.loss_scale.enabled = o.compute_dtype == PSTAR_DTYPE_F16;
  e.loss_scale.initial = o.loss_scale_initial;
  e.loss_scale.growth_factor = o.loss_scale_growth_factor;
  e.loss_scale.backoff_factor = o.loss_scale_backoff_factor;
  e.loss_scale.growth_interval = o.loss_scale_growth_interval;
  e.loss_scale.hysteresis = o.loss_scale_hysteresis;
  e.loss_scale.min_scale = o.loss_scale_min;
  e.grad_accumulation = o.grad_accumulation != 0;
  e.placement_policy = o.placement_policy;
  e.warmup_iterations = o.warmup_iterations;
  e.prefetch = o.prefetch != 0;
  e.hybrid_optimizer = o.hybrid_optimizer != 0;
  e.virtual_clock = o.virtual_clock != 0;
  e.dry_run = o.dry_run != 0;
  e.h2d_bytes_per_s = o.h2d_bytes_per_s;
  e.d2h_bytes_per_s = o.d2h_bytes_per_s;
  e.record_timeline = o.record_timeline != 0;
  e.rank = o.rank;
  e.world_size = o.world_size;
  e.comm_timeout_ms = o.comm_timeout_ms;
  e.state_format = o.state_format;
  e.master_format = o.master_format;
  e.master_seed = o.master_seed;
  return e;
}
}  // namespace

engine::EngineOptions engine_options(const pstar_engine_options& in) {
  pstar_engine_options o = PSTAR_ENGINE_OPTIONS_INIT;
  // Bytes that each version of the struct covers: fields are only appended.
  const size_t covered_by_version[PSTAR_ENGINE_OPTIONS_VERSION] = {
      offsetof(pstar_engine_options, loss_scale_min) + sizeof(float),
      offsetof(pstar_engine_options, grad_accumulation) + sizeof(int32_t),
      offsetof(pstar_engine_options, prefetch) + sizeof(int32_t),
      offsetof(pstar_engine_options, comm_timeout_ms) + sizeof(uint32_t),
      offsetof(pstar_engine_options, state_format) + sizeof(pstar_state_format),
      offsetof(pstar_engine_options, master_seed) + sizeof(uint64_t),
  };
  require_versioned_struct(&in, in.size, in.version, PSTAR_ENGINE_OPTIONS_VERSION, covered_by_version,
                           sizeof(pstar_engine_options), "options");
  const size_t covered = covered_by_version[in.version - 1];
  // Fields of later versions than the caller's keep their defaults.
  std::memcpy(&o, &in, covered);
  o.size = sizeof o;
  o.version = PSTAR_ENGINE_OPTIONS_VERSION;

  require(o.device == PSTAR_DEVICE_EMULATED || o.device == PSTAR_DEVICE_CUDA, PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return "options: unknown device kind " + std::to_string(static_cast<int>(o.device)); });
  require(!(o.strict && o.device != PSTAR_DEVICE_EMULATED), PSTAR_ERR_INVALID_ARGUMENT,
          "options: strict mode exists on the emulated device only");
  if (o.dry_run) o.virtual_clock = 1;
  require(!(o.virtual_clock && o.device != PSTAR_DEVICE_EMULATED), PSTAR_ERR_INVALID_ARGUMENT,
          "options: the virtual clock and dry runs exist on the emulated device only");
  require(!(o.virtual_clock && o.strict), PSTAR_ERR_INVALID_ARGUMENT,
          "options: strict mode needs the wall clock (its delays are real time); unset virtual_clock or strict");
  require(bandwidth_ok(o.h2d_bytes_per_s) && bandwidth_ok(o.d2h_bytes_per_s), PSTAR_ERR_INVALID_ARGUMENT,
          "options: h2d_bytes_per_s and d2h_bytes_per_s must be 0 (the default) or in [1, 1e18]");
  if (o.h2d_bytes_per_s == 0.0) o.h2d_bytes_per_s = PSTAR_DEFAULT_LINK_BYTES_PER_S;
  if (o.d2h_bytes_per_s == 0.0) o.d2h_bytes_per_s = PSTAR_DEFAULT_LINK_BYTES_PER_S;
  require(o.device_margin_bytes == 0 || o.device_margin_bytes < o.device_capacity_bytes, PSTAR_ERR_INVALID_ARGUMENT,
          [&] {
            return "options: device_margin_bytes (" + std::to_string(o.device_margin_bytes) +
                   ") must be below a nonzero device_capacity_bytes (" + std::to_string(o.device_capacity_bytes) + ")";
          });
  require(!(o.hybrid_optimizer && o.device == PSTAR_DEVICE_CUDA && o.device_capacity_bytes == 0),
          PSTAR_ERR_INVALID_ARGUMENT,
          "options: hybrid_optimizer on CUDA needs a nonzero device_capacity_bytes (the optimizer state goes into "
          "what the warm-up leaves free of that capacity)");
  require(o.world_size >= 0, PSTAR_ERR_INVALID_ARGUMENT, [&] {
    return "options: world_size " + std::to_string(o.world_size) + " is negative (0 = from the environment)";
  });
  require(o.world_size == 0 ? o.rank == 0 : (o.rank >= 0 && o.rank < o.world_size), PSTAR_ERR_INVALID_ARGUMENT, [&] {
    return o.world_size == 0
               ? "options: rank " + std::to_string(o.rank) +
                     " given without world_size (set both, or neither to read the environment)"
               : "options: rank " + std::to_string(o.rank) + " is not in 0.." + std::to_string(o.world_size - 1) +
                     " (world_size " + std::to_string(o.world_size) + ")";
  });
  if (o.comm_timeout_ms == 0) o.comm_timeout_ms = 60000;
  if (o.chunk_elems == 0) o.chunk_elems = PSTAR_DEFAULT_CHUNK_ELEMS;
  // PSTAR_CHUNK_ELEMS_AUTO stays as it is until the build sizes it.
  const bool auto_chunk = o.chunk_elems == PSTAR_CHUNK_ELEMS_AUTO;
  require(auto_chunk || o.chunk_elems % chunk::kAlignElems == 0, PSTAR_ERR_INVALID_ARGUMENT, [&] {
    return "options: chunk_elems (" + std::to_string(o.chunk_elems) + ") must be a multiple of " +
           std::to_string(chunk::kAlignElems);
  });
  require(
      o.state_format == PSTAR_STATE_FP32 || o.state_format == PSTAR_STATE_BF16 || o.state_format == PSTAR_STATE_INT8,
      PSTAR_ERR_INVALID_ARGUMENT,
      [&] { return "options: unknown state format " + std::to_string(static_cast<int>(o.state_format)); });
  require(auto_chunk || o.state_format != PSTAR_STATE_INT8 || o.chunk_elems % PSTAR_STATE_INT8_BLOCK == 0,
          PSTAR_ERR_INVALID_ARGUMENT, [&] {
            return "options: chunk_elems (" + std::to_string(o.chunk_elems) + ") must be a multiple of " +
                   std::to_string(PSTAR_STATE_INT8_BLOCK) + " with the int8 state format (its block)";
          });
  require(o.master_format == PSTAR_MASTER_FP32 || o.master_format == PSTAR_MASTER_BF16, PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return "options: unknown master format " + std::to_string(static_cast<int>(o.master_format)); });
  require(o.chunk_elems <= chunk::kMaxNumel, PSTAR_ERR_INVALID_ARGUMENT, "options: chunk_elems is too large");
  require(o.placement_policy == PSTAR_POLICY_OPT || o.placement_policy == PSTAR_POLICY_LRU ||
              o.placement_policy == PSTAR_POLICY_STATIC,
          PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return "options: unknown placement policy " + std::to_string(static_cast<int>(o.placement_policy)); });
  if (o.warmup_iterations == 0) o.warmup_iterations = 1;
  require(dtype_valid(o.compute_dtype), PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return "options: unknown compute dtype " + std::to_string(static_cast<int>(o.compute_dtype)); });
  settings::require_float(o.lr, 0.0f, settings::kMax, "options: lr", settings::kRangeLr);
  settings::require_float(o.beta1, 0.0f, settings::kBelowOne, "options: beta1", settings::kRangeBeta);
  settings::require_float(o.beta2, 0.0f, settings::kBelowOne, "options: beta2", settings::kRangeBeta);
  settings::require_float(o.eps, FLT_MIN, settings::kMax, "options: eps", settings::kRangeEps);
  settings::require_float(o.weight_decay, 0.0f, settings::kMax, "options: weight_decay", "finite and in [0, 1e30]");
  settings::require_float(o.clip_norm, 0.0f, settings::kMax, "options: clip_norm", "in [0, 1e30] (0 = off)");
  settings::require_float(o.loss_scale_initial, FLT_MIN, FLT_MAX, "options: loss_scale_initial", settings::kRangeScale);
  settings::require_float(o.loss_scale_growth_factor, 1.0f, settings::kMax, "options: loss_scale_growth_factor",
                          "in [1, 1e30]");
  settings::require_float(o.loss_scale_backoff_factor, std::numeric_limits<float>::denorm_min(), 1.0f,
                          "options: loss_scale_backoff_factor", "in (0, 1]");
  require(o.loss_scale_growth_interval >= 1, PSTAR_ERR_INVALID_ARGUMENT,
          "options: loss_scale_growth_interval must be >= 1");
  require(o.loss_scale_hysteresis >= 1, PSTAR_ERR_INVALID_ARGUMENT, "options: loss_scale_hysteresis must be >= 1");
  settings::require_float(o.loss_scale_min, FLT_MIN, FLT_MAX, "options: loss_scale_min", settings::kRangeScale);
  return converted(o);
}

}  // namespace pstar::capi
