// C API shims over pstar::engine::Engine: validate handles and pointers,
// call the core, translate errors.  Each function is one guarded call.
#include <atomic>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "engine/engine.h"
#include "errors.h"

struct pstar_engine {
  explicit pstar_engine(const pstar_engine_options& o) : impl(o) {}
  pstar::engine::Engine impl;
};

namespace {

using pstar::Error;
using pstar::require;
using pstar::capi::guarded;

// Live engines.  A handle is dereferenced only after it is found here, so a
// call on a destroyed engine fails cleanly instead of touching freed memory.
std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}
std::unordered_set<pstar_engine*>& registry() {
  static std::unordered_set<pstar_engine*> live;
  return live;
}

// Bumped (under the registry mutex) by every destroy: a thread's cached
// "this handle was live" answer holds while the generation it saw is current.
// Creating an engine leaves it: a new engine cannot make a cached handle dead.
std::atomic<uint64_t> g_registry_generation{0};
thread_local pstar_engine* t_live_engine = nullptr;
thread_local uint64_t t_live_generation = 0;

pstar::engine::Engine& live(pstar_engine* e) {
  require(e != nullptr, PSTAR_ERR_INVALID_HANDLE, "engine handle is NULL");
  // Fast path (acquire/release run millions of times per step): the same
  // engine as this thread's last call, and no engine destroyed since.
  const uint64_t gen = g_registry_generation.load(std::memory_order_acquire);
  if (e == t_live_engine && gen == t_live_generation) return e->impl;
  std::lock_guard<std::mutex> lock(registry_mutex());
  require(registry().count(e) != 0, PSTAR_ERR_INVALID_HANDLE, "engine handle is not a live engine (destroyed?)");
  t_live_engine = e;
  t_live_generation = g_registry_generation.load(std::memory_order_relaxed);
  return e->impl;
}

template <class T>
void require_out(T* p, const char* what) {
  require(p != nullptr, PSTAR_ERR_INVALID_ARGUMENT, [&] { return std::string(what) + " is NULL"; });
}

// Output structs carry their size and version: a caller built against an
// older header passes an older version, and its struct must cover the fields
// of that version (sizes[v - 1]); the library fills no more than `size` bytes.
template <class T, size_t kVersions>
void require_struct(const T* s, const size_t (&sizes)[kVersions], const char* what) {
  require(s != nullptr, PSTAR_ERR_INVALID_ARGUMENT, [&] { return std::string(what) + " is NULL"; });
  require(s->version >= 1 && s->version <= kVersions && s->size >= sizes[s->version - 1], PSTAR_ERR_VERSION, [&] {
    return std::string(what) + ": size " + std::to_string(s->size) + " / version " + std::to_string(s->version) +
           " not supported; initialise it with its _init() function";
  });
}

// Bytes each version of the result structs covers.
constexpr size_t kStepResultSizes[PSTAR_STEP_RESULT_VERSION] = {sizeof(pstar_step_result)};
constexpr size_t kStatsSizes[PSTAR_STATS_VERSION] = {offsetof(pstar_stats, trace_fallbacks),
                                                     offsetof(pstar_stats, clock_seconds), sizeof(pstar_stats)};
constexpr size_t kNvmeStatsSizes[PSTAR_X_NVME_STATS_VERSION] = {sizeof(pstar_x_nvme_stats)};
constexpr size_t kGatherStatsSizes[PSTAR_X_GATHER_STATS_VERSION] = {sizeof(pstar_x_gather_stats)};

}  // namespace

extern "C" {

pstar_status pstar_engine_options_init(pstar_engine_options* options) {
  return guarded([&] {
    require_out(options, "options");
    const pstar_engine_options defaults = PSTAR_ENGINE_OPTIONS_INIT;
    *options = defaults;
  });
}

pstar_status pstar_step_result_init(pstar_step_result* result) {
  return guarded([&] {
    require_out(result, "result");
    const pstar_step_result init = PSTAR_STEP_RESULT_INIT;
    *result = init;
  });
}

pstar_status pstar_stats_init(pstar_stats* stats) {
  return guarded([&] {
    require_out(stats, "stats");
    const pstar_stats init = PSTAR_STATS_INIT;
    *stats = init;
  });
}

pstar_status pstar_engine_create(const pstar_engine_options* options, pstar_engine** out_engine) {
  return guarded([&] {
    require_out(options, "options");
    require_out(out_engine, "out_engine");
    auto* e = new pstar_engine(*options);
    std::lock_guard<std::mutex> lock(registry_mutex());
    try {
      registry().insert(e);
    } catch (...) {
      delete e;
      throw;
    }
    *out_engine = e;
  });
}

pstar_status pstar_engine_destroy(pstar_engine* engine) {
  if (engine == nullptr) return PSTAR_OK;
  return guarded([&] {
    {
      std::lock_guard<std::mutex> lock(registry_mutex());
      require(registry().erase(engine) != 0, PSTAR_ERR_INVALID_HANDLE,
              "engine_destroy: handle is not a live engine (destroyed twice?)");
      g_registry_generation.fetch_add(1, std::memory_order_acq_rel);
    }
    delete engine;
  });
}

pstar_status pstar_param_register(pstar_engine* engine, const char* name, uint32_t ndim, const int64_t* shape,
                                  uint32_t flags, uint32_t* out_id) {
  return guarded([&] {
    auto& e = live(engine);
    require_out(out_id, "out_id");
    *out_id = e.register_param(name, ndim, shape, flags);
  });
}

pstar_status pstar_engine_build(pstar_engine* engine) {
  return guarded([&] { live(engine).build(); });
}

pstar_status pstar_param_find(pstar_engine* engine, const char* name, uint32_t* out_id) {
  return guarded([&] {
    auto& e = live(engine);
    require_out(out_id, "out_id");
    *out_id = e.find(name);
  });
}

pstar_status pstar_param_count(pstar_engine* engine, uint32_t* out_count) {
  return guarded([&] {
    auto& e = live(engine);
    require_out(out_count, "out_count");
    *out_count = e.param_count();
  });
}

pstar_status pstar_param_numel(pstar_engine* engine, uint32_t id, uint64_t* out_numel) {
  return guarded([&] {
    auto& e = live(engine);
    require_out(out_numel, "out_numel");
    *out_numel = e.numel(id);
  });
}

pstar_status pstar_param_set_lr_scale(pstar_engine* engine, uint32_t id, float lr_scale) {
  return guarded([&] { live(engine).set_lr_scale(id, lr_scale); });
}

pstar_status pstar_param_set_weight_decay(pstar_engine* engine, uint32_t id, int32_t enabled) {
  return guarded([&] { live(engine).set_weight_decay(id, enabled != 0); });
}

pstar_status pstar_param_write(pstar_engine* engine, uint32_t id, const void* src, uint64_t count,
                               pstar_dtype dtype) {
  return guarded([&] { live(engine).write(id, src, count, dtype); });
}

pstar_status pstar_param_read(pstar_engine* engine, uint32_t id, void* dst, uint64_t count, pstar_dtype dtype) {
  return guarded([&] { live(engine).read(id, dst, count, dtype); });
}

pstar_status pstar_param_pin(pstar_engine* engine, uint32_t id, int32_t writable, void** out_ptr,
                             pstar_dtype* out_dtype) {
  return guarded([&] {
    auto& e = live(engine);
    require_out(out_ptr, "out_ptr");
    require_out(out_dtype, "out_dtype");
    *out_ptr = e.pin(id, writable != 0);
    *out_dtype = PSTAR_DTYPE_F32;
  });
}

pstar_status pstar_param_unpin(pstar_engine* engine, uint32_t id) {
  return guarded([&] { live(engine).unpin(id); });
}

pstar_status pstar_checkpoint_save(pstar_engine* engine, const char* dir) {
  return guarded([&] { live(engine).checkpoint_save(dir); });
}

pstar_status pstar_checkpoint_load(pstar_engine* engine, const char* dir) {
  return guarded([&] { live(engine).checkpoint_load(dir); });
}

pstar_status pstar_export_safetensors(pstar_engine* engine, const char* path) {
  return guarded([&] { live(engine).export_safetensors(path); });
}

pstar_status pstar_iteration_begin(pstar_engine* engine, pstar_iteration_kind kind) {
  return guarded([&] { live(engine).iteration_begin(kind); });
}

pstar_status pstar_iteration_end(pstar_engine* engine) {
  return guarded([&] { live(engine).iteration_end(); });
}

pstar_status pstar_iteration_abort(pstar_engine* engine) {
  return guarded([&] { live(engine).iteration_abort(); });
}

pstar_status pstar_engine_compute_stream(pstar_engine* engine, void** out_stream) {
  return guarded([&] {
    auto& e = live(engine);
    require_out(out_stream, "out_stream");
    *out_stream = e.compute_stream_handle();
  });
}

pstar_status pstar_param_acquire(pstar_engine* engine, uint32_t id, pstar_stage stage, void* stream,
                                 void** out_ptr) {
  return guarded([&] {
    auto& e = live(engine);
    require_out(out_ptr, "out_ptr");
    *out_ptr = e.acquire(id, stage, stream);
  });
}

pstar_status pstar_param_release(pstar_engine* engine, uint32_t id, void* stream) {
  return guarded([&] { live(engine).release(id, stream); });
}

pstar_status pstar_grad_write(pstar_engine* engine, uint32_t id, const void* grad, uint64_t count,
                              pstar_dtype dtype, pstar_mem_space space, void* stream) {
  return guarded([&] { live(engine).grad_write(id, grad, count, dtype, space, stream); });
}

pstar_status pstar_grad_slot_acquire(pstar_engine* engine, uint32_t id, void* stream, float** out_ptr) {
  return guarded([&] {
    auto& e = live(engine);
    require_out(out_ptr, "out_ptr");
    *out_ptr = e.grad_slot_acquire(id, stream);
  });
}

pstar_status pstar_nonmodel_report(pstar_engine* engine, uint64_t bytes) {
  return guarded([&] { live(engine).nonmodel_report(bytes); });
}

pstar_status pstar_clock_advance(pstar_engine* engine, double seconds) {
  return guarded([&] { live(engine).clock_advance(seconds); });
}

pstar_status pstar_clock_now(pstar_engine* engine, double* out_seconds) {
  return guarded([&] {
    require_out(out_seconds, "out_seconds");
    *out_seconds = live(engine).clock_now();
  });
}

pstar_status pstar_trace_export(pstar_engine* engine, const char* path) {
  return guarded([&] { live(engine).trace_export(path); });
}

pstar_status pstar_step(pstar_engine* engine, pstar_step_result* result) {
  return guarded([&] {
    auto& e = live(engine);
    if (result != nullptr) {
      require_struct(result, kStepResultSizes, "result");
    }
    pstar_step_result r = e.step();
    if (result != nullptr) {
      const uint32_t size = result->size;
      r.size = size;
      std::memcpy(result, &r, std::min<size_t>(size, sizeof r));
    }
  });
}

pstar_status pstar_hparam_set(pstar_engine* engine, pstar_hparam which, double value) {
  return guarded([&] { live(engine).hparam_set(which, value); });
}

pstar_status pstar_hparam_get(pstar_engine* engine, pstar_hparam which, double* out_value) {
  return guarded([&] {
    auto& e = live(engine);
    require_out(out_value, "out_value");
    *out_value = e.hparam_get(which);
  });
}

pstar_status pstar_engine_get_stats(pstar_engine* engine, pstar_stats* stats) {
  return guarded([&] {
    auto& e = live(engine);
    require_struct(stats, kStatsSizes, "stats");
    e.fill_stats(stats);
  });
}

// ---------------------------------------------------------------------------
// Experimental tier (docs/api-stability.md)

pstar_status pstar_x_nvme_options_init(pstar_x_nvme_options* options) {
  return guarded([&] {
    require_out(options, "options");
    *options = pstar_x_nvme_options{sizeof(pstar_x_nvme_options), PSTAR_X_NVME_OPTIONS_VERSION, nullptr, 0, 0, 0, 0,
                                    PSTAR_X_DEFAULT_NVME_READ_BYTES_PER_S, PSTAR_X_DEFAULT_NVME_WRITE_BYTES_PER_S};
  });
}

pstar_status pstar_x_engine_set_nvme(pstar_engine* engine, const pstar_x_nvme_options* options) {
  return guarded([&] {
    auto& e = live(engine);
    require_out(options, "options");
    e.set_nvme(*options);
  });
}

pstar_status pstar_x_nvme_stats_init(pstar_x_nvme_stats* stats) {
  return guarded([&] {
    require_out(stats, "stats");
    *stats = pstar_x_nvme_stats{};
    stats->size = sizeof(pstar_x_nvme_stats);
    stats->version = PSTAR_X_NVME_STATS_VERSION;
  });
}

pstar_status pstar_x_nvme_get_stats(pstar_engine* engine, pstar_x_nvme_stats* stats) {
  return guarded([&] {
    auto& e = live(engine);
    require_struct(stats, kNvmeStatsSizes, "nvme stats");
    e.fill_nvme_stats(stats);
  });
}

pstar_status pstar_x_engine_set_gather_ahead(pstar_engine* engine, uint32_t chunks) {
  return guarded([&] { live(engine).set_gather_ahead(chunks); });
}

pstar_status pstar_x_gather_stats_init(pstar_x_gather_stats* stats) {
  return guarded([&] {
    require_out(stats, "stats");
    *stats = pstar_x_gather_stats{};
    stats->size = sizeof(pstar_x_gather_stats);
    stats->version = PSTAR_X_GATHER_STATS_VERSION;
  });
}

pstar_status pstar_x_gather_get_stats(pstar_engine* engine, pstar_x_gather_stats* stats) {
  return guarded([&] {
    auto& e = live(engine);
    require_struct(stats, kGatherStatsSizes, "gather stats");
    e.fill_gather_stats(stats);
  });
}

}  // extern "C"
