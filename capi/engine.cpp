// C API shims over pstar::engine::Engine: validate handles and pointers,
// call the core, translate errors.  Each function is one guarded call; each
// call on an engine holds it for its duration (EngineCall), which refuses an
// overlapping call and a call from a forked child.
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "engine/engine.h"
#include "errors.h"
#include "options.h"
#include "util/struct_check.h"

struct pstar_engine {
  pstar_engine(const pstar_engine_options& o, pid_t pid) : creator_pid(pid), impl(pstar::capi::engine_options(o)) {}
  // The process that created the engine: its threads exist only there.
  const pid_t creator_pid;
  // The C API function in progress on this engine (a string literal), or
  // nullptr between calls.  Set by a compare-exchange on entry, cleared on
  // exit: the one-thread-at-a-time rule of pstar.h, checked.
  std::atomic<const char*> in_call{nullptr};
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

pstar_engine* live(pstar_engine* e) {
  require(e != nullptr, PSTAR_ERR_INVALID_HANDLE, "engine handle is NULL");
  // Fast path (acquire/release run millions of times per step): the same
  // engine as this thread's last call, and no engine destroyed since.
  const uint64_t gen = g_registry_generation.load(std::memory_order_acquire);
  if (e == t_live_engine && gen == t_live_generation) return e;
  std::lock_guard<std::mutex> lock(registry_mutex());
  require(registry().count(e) != 0, PSTAR_ERR_INVALID_HANDLE, "engine handle is not a live engine (destroyed?)");
  t_live_engine = e;
  t_live_generation = g_registry_generation.load(std::memory_order_relaxed);
  return e;
}

// This process's id, as of the last fork: refreshed in the child by a
// pthread_atfork handler, so that the check on every call is one load (a
// getpid() is a system call).  The prepare/parent/child handlers also hold
// the registry mutex across the fork, so that a child never inherits it
// locked.
std::atomic<pid_t> g_pid{::getpid()};

void fork_prepare() { registry_mutex().lock(); }
void fork_parent() { registry_mutex().unlock(); }
void fork_child() {
  g_pid.store(::getpid(), std::memory_order_relaxed);
  registry_mutex().unlock();
}

struct ForkWatch {
  ForkWatch() {
    registry_mutex();  // constructed before the handlers can use it
    ::pthread_atfork(fork_prepare, fork_parent, fork_child);
  }
};
const ForkWatch g_fork_watch;

[[noreturn]] void throw_forked(const pstar_engine* e, const char* call) {
  throw Error(PSTAR_ERR_INVALID_STATE,
              std::string(call) + ": this engine was created by process " + std::to_string(e->creator_pid) +
                  " and this is process " + std::to_string(g_pid.load(std::memory_order_relaxed)) +
                  ", a fork of it: the engine's threads do not exist here, so no call on it is legal in the "
                  "child except pstar_engine_destroy, which only forgets the handle");
}

[[noreturn]] void throw_busy(const char* call, const char* in_progress) {
  throw Error(PSTAR_ERR_BUSY, std::string(call) + ": refused, " + in_progress +
                                  " is in progress on this engine (on another thread, or this call comes from the "
                                  "log callback during it); an engine is driven by one thread at a time, and "
                                  "nothing was done");
}

// One C API call on an engine, from the handle check to its return.  The
// compare-exchange (acquire) on entry and the store (release) on exit also
// order the calls of threads that hand the engine to each other.
class EngineCall {
 public:
  EngineCall(pstar_engine* handle, const char* call) : e_(live(handle)) {
    if (e_->creator_pid != g_pid.load(std::memory_order_relaxed)) throw_forked(e_, call);
    const char* in_progress = nullptr;
    if (!e_->in_call.compare_exchange_strong(in_progress, call, std::memory_order_acquire, std::memory_order_relaxed)) {
      throw_busy(call, in_progress);
    }
  }
  ~EngineCall() { e_->in_call.store(nullptr, std::memory_order_release); }
  EngineCall(const EngineCall&) = delete;
  EngineCall& operator=(const EngineCall&) = delete;

  pstar::engine::Engine& operator*() const { return e_->impl; }
  pstar::engine::Engine* operator->() const { return &e_->impl; }

 private:
  pstar_engine* e_;
};

template <class T>
void require_out(T* p, const char* what) {
  require(p != nullptr, PSTAR_ERR_INVALID_ARGUMENT, [&] { return std::string(what) + " is NULL"; });
}

// Versioned structs carry their size and version: a caller built against an
// older header passes an older version, and its struct must cover the fields
// of that version (sizes[v - 1]); the rest of the rule is in
// util/struct_check.h.  The library fills no more than `size` bytes.
template <class T, size_t kVersions>
void require_struct(const T* s, const size_t (&sizes)[kVersions], const char* what) {
  require(s != nullptr, PSTAR_ERR_INVALID_ARGUMENT, [&] { return std::string(what) + " is NULL"; });
  pstar::require_versioned_struct(s, s->size, s->version, kVersions, sizes, sizeof(T), what);
}

// Bytes each version of the result structs covers.
constexpr size_t kStepResultSizes[PSTAR_STEP_RESULT_VERSION] = {sizeof(pstar_step_result)};
constexpr size_t kStatsSizes[PSTAR_STATS_VERSION] = {offsetof(pstar_stats, trace_fallbacks),
                                                     offsetof(pstar_stats, clock_seconds), sizeof(pstar_stats)};
constexpr size_t kNvmeStatsSizes[PSTAR_X_NVME_STATS_VERSION] = {sizeof(pstar_x_nvme_stats)};
constexpr size_t kGatherStatsSizes[PSTAR_X_GATHER_STATS_VERSION] = {
    offsetof(pstar_x_gather_stats, bytes_shard_host_to_device), sizeof(pstar_x_gather_stats)};
constexpr size_t kStepStatsSizes[PSTAR_X_STEP_STATS_VERSION] = {offsetof(pstar_x_step_stats, chunks_speculated),
                                                                sizeof(pstar_x_step_stats)};
constexpr size_t kNvmeOptionsSizes[PSTAR_X_NVME_OPTIONS_VERSION] = {sizeof(pstar_x_nvme_options)};

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
    // getpid() here (not the cached id): a process started without fork
    // handlers (_Fork) refreshes the cache at its first engine.
    const pid_t pid = ::getpid();
    g_pid.store(pid, std::memory_order_relaxed);
    auto* e = new pstar_engine(*options, pid);
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
    bool forked = false;
    {
      std::lock_guard<std::mutex> lock(registry_mutex());
      require(registry().count(engine) != 0, PSTAR_ERR_INVALID_HANDLE,
              "engine_destroy: handle is not a live engine (destroyed twice?)");
      // A system call, not the cache: the one call that must never touch a
      // parent's engine in a child, however the child was made.
      forked = engine->creator_pid != ::getpid();
      if (!forked) {
        const char* in_progress = nullptr;
        if (!engine->in_call.compare_exchange_strong(in_progress, "pstar_engine_destroy", std::memory_order_acquire,
                                                     std::memory_order_relaxed)) {
          throw_busy("pstar_engine_destroy", in_progress);
        }
      }
      registry().erase(engine);
      g_registry_generation.fetch_add(1, std::memory_order_acq_rel);
    }
    // In a forked child the engine is the parent's: its destructor would
    // join threads that do not exist here.  Its memory stays (the child's
    // copy of it goes with the child).
    if (!forked) delete engine;
  });
}

pstar_status pstar_param_register(pstar_engine* engine, const char* name, uint32_t ndim, const int64_t* shape,
                                  uint32_t flags, uint32_t* out_id) {
  return guarded([&] {
    EngineCall e(engine, "pstar_param_register");
    require_out(out_id, "out_id");
    *out_id = e->register_param(name, ndim, shape, flags);
  });
}

pstar_status pstar_engine_build(pstar_engine* engine) {
  return guarded([&] { EngineCall(engine, "pstar_engine_build")->build(); });
}

pstar_status pstar_param_find(pstar_engine* engine, const char* name, uint32_t* out_id) {
  return guarded([&] {
    EngineCall e(engine, "pstar_param_find");
    require_out(out_id, "out_id");
    *out_id = e->find(name);
  });
}

pstar_status pstar_param_count(pstar_engine* engine, uint32_t* out_count) {
  return guarded([&] {
    EngineCall e(engine, "pstar_param_count");
    require_out(out_count, "out_count");
    *out_count = e->param_count();
  });
}

pstar_status pstar_param_numel(pstar_engine* engine, uint32_t id, uint64_t* out_numel) {
  return guarded([&] {
    EngineCall e(engine, "pstar_param_numel");
    require_out(out_numel, "out_numel");
    *out_numel = e->numel(id);
  });
}

pstar_status pstar_param_set_lr_scale(pstar_engine* engine, uint32_t id, float lr_scale) {
  return guarded([&] { EngineCall(engine, "pstar_param_set_lr_scale")->set_lr_scale(id, lr_scale); });
}

pstar_status pstar_param_set_weight_decay(pstar_engine* engine, uint32_t id, int32_t enabled) {
  return guarded([&] { EngineCall(engine, "pstar_param_set_weight_decay")->set_weight_decay(id, enabled != 0); });
}

pstar_status pstar_param_write(pstar_engine* engine, uint32_t id, const void* src, uint64_t count, pstar_dtype dtype) {
  return guarded([&] { EngineCall(engine, "pstar_param_write")->write(id, src, count, dtype); });
}

pstar_status pstar_param_read(pstar_engine* engine, uint32_t id, void* dst, uint64_t count, pstar_dtype dtype) {
  return guarded([&] { EngineCall(engine, "pstar_param_read")->read(id, dst, count, dtype); });
}

pstar_status pstar_param_pin(pstar_engine* engine, uint32_t id, int32_t writable, void** out_ptr,
                             pstar_dtype* out_dtype) {
  return guarded([&] {
    EngineCall e(engine, "pstar_param_pin");
    require_out(out_ptr, "out_ptr");
    require_out(out_dtype, "out_dtype");
    *out_ptr = e->pin(id, writable != 0);
    *out_dtype = PSTAR_DTYPE_F32;
  });
}

pstar_status pstar_param_unpin(pstar_engine* engine, uint32_t id) {
  return guarded([&] { EngineCall(engine, "pstar_param_unpin")->unpin(id); });
}

pstar_status pstar_checkpoint_save(pstar_engine* engine, const char* dir) {
  return guarded([&] { EngineCall(engine, "pstar_checkpoint_save")->checkpoint_save(dir); });
}

pstar_status pstar_checkpoint_load(pstar_engine* engine, const char* dir) {
  return guarded([&] { EngineCall(engine, "pstar_checkpoint_load")->checkpoint_load(dir); });
}

pstar_status pstar_export_safetensors(pstar_engine* engine, const char* path) {
  return guarded([&] { EngineCall(engine, "pstar_export_safetensors")->export_safetensors(path); });
}

pstar_status pstar_iteration_begin(pstar_engine* engine, pstar_iteration_kind kind) {
  return guarded([&] { EngineCall(engine, "pstar_iteration_begin")->iteration_begin(kind); });
}

pstar_status pstar_iteration_end(pstar_engine* engine) {
  return guarded([&] { EngineCall(engine, "pstar_iteration_end")->iteration_end(); });
}

pstar_status pstar_iteration_abort(pstar_engine* engine) {
  return guarded([&] { EngineCall(engine, "pstar_iteration_abort")->iteration_abort(); });
}

pstar_status pstar_engine_compute_stream(pstar_engine* engine, void** out_stream) {
  return guarded([&] {
    EngineCall e(engine, "pstar_engine_compute_stream");
    require_out(out_stream, "out_stream");
    *out_stream = e->compute_stream_handle();
  });
}

pstar_status pstar_param_acquire(pstar_engine* engine, uint32_t id, pstar_stage stage, void* stream, void** out_ptr) {
  return guarded([&] {
    EngineCall e(engine, "pstar_param_acquire");
    require_out(out_ptr, "out_ptr");
    *out_ptr = e->acquire(id, stage, stream);
  });
}

pstar_status pstar_param_release(pstar_engine* engine, uint32_t id, void* stream) {
  return guarded([&] { EngineCall(engine, "pstar_param_release")->release(id, stream); });
}

pstar_status pstar_grad_write(pstar_engine* engine, uint32_t id, const void* grad, uint64_t count, pstar_dtype dtype,
                              pstar_mem_space space, void* stream) {
  return guarded([&] { EngineCall(engine, "pstar_grad_write")->grad_write(id, grad, count, dtype, space, stream); });
}

pstar_status pstar_grad_write_release(pstar_engine* engine, uint32_t id, const void* grad, uint64_t count,
                                      pstar_dtype dtype, pstar_mem_space space, void* stream) {
  return guarded(
      [&] { EngineCall(engine, "pstar_grad_write_release")->grad_write(id, grad, count, dtype, space, stream, true); });
}

pstar_status pstar_grad_slot_acquire(pstar_engine* engine, uint32_t id, void* stream, float** out_ptr) {
  return guarded([&] {
    EngineCall e(engine, "pstar_grad_slot_acquire");
    require_out(out_ptr, "out_ptr");
    *out_ptr = e->grad_slot_acquire(id, stream);
  });
}

pstar_status pstar_nonmodel_report(pstar_engine* engine, uint64_t bytes) {
  return guarded([&] { EngineCall(engine, "pstar_nonmodel_report")->nonmodel_report(bytes); });
}

pstar_status pstar_clock_advance(pstar_engine* engine, double seconds) {
  return guarded([&] { EngineCall(engine, "pstar_clock_advance")->clock_advance(seconds); });
}

pstar_status pstar_clock_now(pstar_engine* engine, double* out_seconds) {
  return guarded([&] {
    require_out(out_seconds, "out_seconds");
    *out_seconds = EngineCall(engine, "pstar_clock_now")->clock_now();
  });
}

pstar_status pstar_trace_export(pstar_engine* engine, const char* path) {
  return guarded([&] { EngineCall(engine, "pstar_trace_export")->trace_export(path); });
}

pstar_status pstar_step(pstar_engine* engine, pstar_step_result* result) {
  return guarded([&] {
    EngineCall e(engine, "pstar_step");
    if (result != nullptr) {
      require_struct(result, kStepResultSizes, "result");
    }
    pstar_step_result r = e->step();
    if (result != nullptr) {
      const uint32_t size = result->size;
      r.size = size;
      std::memcpy(result, &r, std::min<size_t>(size, sizeof r));
    }
  });
}

pstar_status pstar_hparam_set(pstar_engine* engine, pstar_hparam which, double value) {
  return guarded([&] { EngineCall(engine, "pstar_hparam_set")->hparam_set(which, value); });
}

pstar_status pstar_grad_norm(pstar_engine* engine, double* out_norm) {
  return guarded([&] {
    EngineCall e(engine, "pstar_grad_norm");
    require_out(out_norm, "out_norm");
    *out_norm = e->grad_norm();
  });
}

pstar_status pstar_hparam_get(pstar_engine* engine, pstar_hparam which, double* out_value) {
  return guarded([&] {
    EngineCall e(engine, "pstar_hparam_get");
    require_out(out_value, "out_value");
    *out_value = e->hparam_get(which);
  });
}

pstar_status pstar_engine_get_stats(pstar_engine* engine, pstar_stats* stats) {
  return guarded([&] {
    EngineCall e(engine, "pstar_engine_get_stats");
    require_struct(stats, kStatsSizes, "stats");
    e->fill_stats(stats);
  });
}

// ---------------------------------------------------------------------------
// Experimental tier (docs/api-stability.md)

pstar_status pstar_x_nvme_options_init(pstar_x_nvme_options* options) {
  return guarded([&] {
    require_out(options, "options");
    *options = pstar_x_nvme_options{
        sizeof(pstar_x_nvme_options),          PSTAR_X_NVME_OPTIONS_VERSION,          nullptr, 0, 0, 0, 0,
        PSTAR_X_DEFAULT_NVME_READ_BYTES_PER_S, PSTAR_X_DEFAULT_NVME_WRITE_BYTES_PER_S};
  });
}

pstar_status pstar_x_engine_set_nvme(pstar_engine* engine, const pstar_x_nvme_options* options) {
  return guarded([&] {
    EngineCall e(engine, "pstar_x_engine_set_nvme");
    require_out(options, "options");
    require_struct(options, kNvmeOptionsSizes, "set_nvme: options");
    // The modelled bandwidths divide byte counts: 0 (the default) or at
    // least one byte per second, like the options' h2d/d2h_bytes_per_s.
    auto bandwidth_ok = [](double v) { return v == 0.0 || (v >= 1.0 && v <= 1e18); };
    require(bandwidth_ok(options->read_bytes_per_s) && bandwidth_ok(options->write_bytes_per_s),
            PSTAR_ERR_INVALID_ARGUMENT,
            "set_nvme: read_bytes_per_s and write_bytes_per_s must be 0 (the default) or in [1, 1e18]");
    e->set_nvme(*options);
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
    EngineCall e(engine, "pstar_x_nvme_get_stats");
    require_struct(stats, kNvmeStatsSizes, "nvme stats");
    // Filled through a copy: the caller's size is kept, and no more than
    // the library's struct is written.
    pstar_x_nvme_stats s{};
    e->fill_nvme_stats(&s);
    s.size = stats->size;
    std::memcpy(stats, &s, std::min<size_t>(stats->size, sizeof s));
  });
}

pstar_status pstar_x_engine_set_gather_ahead(pstar_engine* engine, uint32_t chunks) {
  return guarded([&] { EngineCall(engine, "pstar_x_engine_set_gather_ahead")->set_gather_ahead(chunks); });
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
    EngineCall e(engine, "pstar_x_gather_get_stats");
    require_struct(stats, kGatherStatsSizes, "gather stats");
    e->fill_gather_stats(stats);
  });
}

pstar_status pstar_x_engine_set_overlap_step(pstar_engine* engine, int enabled) {
  return guarded([&] { EngineCall(engine, "pstar_x_engine_set_overlap_step")->set_overlap_step(enabled != 0); });
}

pstar_status pstar_x_engine_set_modelled_host_update(pstar_engine* engine, double bytes_per_s) {
  return guarded([&] {
    EngineCall e(engine, "pstar_x_engine_set_modelled_host_update");
    require(bytes_per_s == 0.0 || (bytes_per_s >= 1.0 && bytes_per_s <= 1e18), PSTAR_ERR_INVALID_ARGUMENT,
            "set_modelled_host_update: bytes_per_s must be 0 or in [1, 1e18]");
    e->set_modelled_host_update(bytes_per_s);
  });
}

pstar_status pstar_x_engine_set_speculative_update(pstar_engine* engine, uint64_t max_bytes) {
  return guarded(
      [&] { EngineCall(engine, "pstar_x_engine_set_speculative_update")->set_speculative_update(max_bytes); });
}

pstar_status pstar_x_step_stats_init(pstar_x_step_stats* stats) {
  return guarded([&] {
    require_out(stats, "stats");
    *stats = pstar_x_step_stats{};
    stats->size = sizeof(pstar_x_step_stats);
    stats->version = PSTAR_X_STEP_STATS_VERSION;
  });
}

pstar_status pstar_x_step_get_stats(pstar_engine* engine, pstar_x_step_stats* stats) {
  return guarded([&] {
    EngineCall e(engine, "pstar_x_step_get_stats");
    require_struct(stats, kStepStatsSizes, "step stats");
    e->fill_step_stats(stats);
  });
}

}  // extern "C"
