#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>

#include "chunk/size_search.h"
#include "memory/device_factory.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/struct_check.h"
#include "util/log.h"
#include "util/settings.h"
#include "step/backward_gradients.h"
#include "step/optimizer_step.h"
#include "values/param_values.h"

namespace pstar::engine {

using chunk::TensorEvent;
using chunk::TensorState;

Engine::Engine(const EngineOptions& options) : Engine(options, nullptr) {}

Engine::Engine(const EngineOptions& options, std::unique_ptr<distributed::Communicator> group)
    : options_(options),
      optimizer_(options_.adam, options_.clip_norm, options_.loss_scale, options_.threads),
      reduce_(&group_,
              distributed::ReduceScatter::Actions{
                  [this](uint32_t k, float* data, uint64_t elems) { return step_->lay_out_gradients(k, data, elems); },
                  [this](uint32_t k, const std::vector<uint32_t>& params, float* avg) {
                    step_->apply_reduced(k, params, avg);
                  },
                  [this](uint64_t bytes, uint32_t k) {
                    return placement_->alloc_staging(bytes, "reduce-scatter staging of chunk " + std::to_string(k));
                  },
                  [this](void* p, uint64_t bytes) { placement_->free_staging(p, bytes); },
                  [this](void* dst, const void* src, size_t bytes) {
                    copy_sync(dst, src, bytes, memory::CopyKind::kDeviceToHost);
                    step_->count_reduced_to_host(bytes);
                  }}),
      gathering_(&group_, &reduce_) {
  if (group != nullptr) {
    require(!options_.dry_run, PSTAR_ERR_UNSUPPORTED, "engine: a sharded engine has no dry run yet");
    // A CUDA engine needs a group that takes device memory; the emulated
    // device's memory is host memory, so either kind serves it (tests run
    // the device-buffer code paths there).
    require(options_.device != PSTAR_DEVICE_CUDA || group->device_buffers(), PSTAR_ERR_INVALID_ARGUMENT,
            [&] { return std::string("engine: a ") + group->backend() + " group takes host memory, not CUDA memory"; });
    group_.adopt(std::move(group));
  } else {
    resolve_world();
  }
  memory::DeviceConfig dc;
  dc.kind = options_.device;
  dc.ordinal = options_.device_ordinal;
  dc.strict = options_.strict;
  dc.strict_seed = options_.strict_seed;
  dc.modelled = options_.virtual_clock || options_.dry_run;
  dc.payloads = !options_.dry_run;
  dc.h2d_bytes_per_s = options_.h2d_bytes_per_s;
  dc.d2h_bytes_per_s = options_.d2h_bytes_per_s;
  device_ = memory::make_device(dc);
  host_ = std::make_unique<memory::HostPool>(device_.get(), options_.host_capacity_bytes);
  payloads_ = device_->has_payloads();
  placement::RuntimeOptions po;
  // Placement's limit: the margin stays free for what the caller does not report.
  po.capacity_bytes = options_.device_capacity_bytes - options_.device_margin_bytes;
  po.placement_policy = options_.placement_policy;
  po.warmup_iterations = options_.warmup_iterations;
  po.prefetch = options_.prefetch;
  po.virtual_clock = options_.virtual_clock;
  po.payloads = payloads_;
  po.record_timeline = options_.record_timeline;
  placement_ = std::make_unique<placement::Runtime>(device_.get(), host_.get(), po);
  placement_->attach(this);
  placement::HybridOptions ho;
  ho.enabled = options_.hybrid_optimizer;
  ho.warmup_iterations = options_.warmup_iterations;
  ho.grad_accumulation = options_.grad_accumulation;
  ho.elem_bytes = static_cast<uint32_t>(dtype_size(options_.compute_dtype));
  if (options_.state_format != PSTAR_STATE_FP32) {
    const optim::StateFormat format = state_format();
    ho.moment_bytes = [format](uint64_t n) { return optim::moment_list_bytes(format, n); };
  }
  const optim::MasterFormat masters = master_format();
  if (masters != optim::MasterFormat::kFp32)
    ho.master_bytes = [masters](uint64_t n) { return optim::master_list_bytes(masters, n); };
  hybrid_ = std::make_unique<placement::HybridPlacement>(device_.get(), placement_.get(), ho);
  values_ = std::make_unique<values::ParamValues>(value_parts(), options_.compute_dtype, payloads_, master_format());
  step_ = std::make_unique<step::OptimizerStep>(
      step::StepParts{device_.get(), host_.get(), placement_.get(), hybrid_.get(), &nvme_, &optimizer_, values_.get(),
                      &params_, &chunks_, &group_, &reduce_, &gathering_, &drop_rule_},
      step::StepOptions{options_.compute_dtype, options_.grad_accumulation, options_.prefetch, payloads_,
                        options_.virtual_clock, state_format(), master_format(), options_.master_seed});
  grads_ = std::make_unique<step::BackwardGradients>(
      step::GradientParts{device_.get(), host_.get(), placement_.get(), &params_, &chunks_, &group_},
      options_.compute_dtype, options_.grad_accumulation, payloads_);
  group_.set_device_scratch(distributed::ProcessGroup::DeviceScratch{
      [this](uint64_t bytes) { return placement_->alloc_staging(bytes, "all-gather scratch"); },
      [this](void* p, uint64_t bytes) { placement_->free_staging(p, bytes); },
      [this](void* dst, const void* src, size_t bytes, bool to_device) {
        copy_sync(dst, src, bytes, to_device ? memory::CopyKind::kHostToDevice : memory::CopyKind::kDeviceToHost);
      }});
  gathering_.attach(
      device_.get(), placement_.get(), this,
      distributed::ChunkGathering::Shards{[this](uint32_t k) -> const void* {
                                            step_->before_acquire(k);  // its overlapped update
                                            return chunks_[k].shard;
                                          },
                                          [this](uint32_t k) { return chunks_[k].shard_elems * elem_bytes(); },
                                          [this](uint32_t k) { return hybrid_->shard_on_device(k); }});
  placement_->set_release_staging([this] { return reduce_.release_oldest_stage(); });
  connect_group();
  log::debug("engine created on " + device_->name());
}

Engine::~Engine() {
  step_->discard_speculation();  // the update thread writes buffers of the step's own
  step_->wait_noexcept();        // and chunks' memory
  // Let every queued item finish before memory goes away: ahead gathers
  // first (they write the slots), then the device's streams.
  group_.stop_queue();
  device_->synchronize(device_->compute_stream());
  device_->synchronize(device_->h2d_stream());
  device_->synchronize(device_->d2h_stream());
  placement_->drain();
  grads_->release_all();
  if (layout_) {
    nvme_.release();
    for (size_t i = 0; i < chunks_.size(); ++i) {
      ChunkState& c = chunks_[i];
      if (c.gather_slot >= 0) {
        // The slot's buffer, freed with the slots below.
      } else if (c.tier == Tier::kDevice) {
        device_->deallocate(c.device, c.bytes);
        if (c.host_copy != nullptr) host_->release(c.host_copy, c.bytes);
      } else if (c.tier == Tier::kHost) {
        host_->release(c.host, c.bytes);
      }
      // The lists on the device (and a sharded compute shard: it is in the
      // buffer); the others are the host's.
      if (!hybrid_->shard_on_device(static_cast<uint32_t>(i))) host_->release(c.shard, c.shard_elems * elem_bytes());
      hybrid_->release(static_cast<uint32_t>(i));
      release_optimizer_buffers(c);
    }
  }
  reduce_.release();  // the queue is gone: nothing uses its buffers
  gathering_.release();
  host_.reset();
}

void Engine::release_optimizer_buffers(ChunkState& c) {
  for (float** b : {&c.master, &c.grad32}) {
    host_->release(*b, b == &c.master ? master_bytes(c) : c.shard_elems * sizeof(float));
    *b = nullptr;
  }
  for (float** b : {&c.exp_avg, &c.exp_avg_sq}) {
    host_->release(*b, moment_bytes(c));
    *b = nullptr;
  }
}

uint64_t Engine::moment_bytes(const ChunkState& c) const {
  return optim::moment_list_bytes(state_format(), c.shard_elems);
}

values::ValueParts Engine::value_parts() {
  return {device_.get(), placement_.get(), hybrid_.get(), &nvme_, &group_, &reduce_, &params_, &chunks_};
}

size_t Engine::elem_bytes() const { return dtype_size(options_.compute_dtype); }

// ---------------------------------------------------------------------------
// Registration and layout

uint32_t Engine::register_param(const char* name, uint32_t ndim, const int64_t* shape, uint32_t flags) {
  require(!built(), PSTAR_ERR_INVALID_STATE, "param_register: the engine is built; register before pstar_engine_build");
  return params_.add(name, ndim, shape, flags);
}

void Engine::build() {
  require(!built(), PSTAR_ERR_INVALID_STATE, "engine_build: already built");
  std::vector<uint64_t> numels;
  std::vector<bool> frozen;
  for (const auto& p : params_) {
    numels.push_back(p.numel);
    frozen.push_back(p.frozen());
  }
  // With world > 1 every chunk is split into world equal shards whose
  // boundaries keep the 128-element alignment: capacities are padded to a
  // multiple of world * 128 elements.
  // The int8 state format quantizes each parameter in blocks from its
  // first element: its parameters (and shards) start on block boundaries.
  const uint64_t align = options_.state_format == PSTAR_STATE_INT8 ? PSTAR_STATE_INT8_BLOCK : chunk::kAlignElems;
  const uint64_t shard_unit = align * static_cast<uint64_t>(group_.world());
  if (options_.chunk_elems == PSTAR_CHUNK_ELEMS_AUTO)
    options_.chunk_elems = chunk::search_chunk_elems(numels, frozen, align, PSTAR_DEFAULT_CHUNK_ELEMS);
  const uint64_t chunk_elems = sharded() ? chunk::align_up(options_.chunk_elems, shard_unit) : options_.chunk_elems;
  if (sharded()) check_layout_agrees(chunk_elems);
  auto layout = std::make_unique<chunk::ChunkLayout>(numels, frozen, chunk_elems, align);
  std::vector<ChunkState> chunks(layout->chunks().size());
  uint64_t largest_trainable = 0;
  // Allocate every payload on the host, zero-filled (with world > 1 this
  // rank's shards only); undo on failure.
  try {
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto& info = layout->chunks()[i];
      ChunkState& c = chunks[i];
      c.elems = sharded() ? chunk::align_up(info.capacity_elems, shard_unit) : info.capacity_elems;
      c.shard_elems = c.elems / static_cast<uint64_t>(group_.world());
      c.bytes = c.elems * elem_bytes();
      if (sharded()) {
        c.tier = Tier::kNotGathered;
        c.shard = host_->acquire(c.shard_elems * elem_bytes());
        std::memset(c.shard, 0, c.shard_elems * elem_bytes());
      } else {
        c.host = host_->acquire(c.bytes);
        if (payloads_) std::memset(c.host, 0, c.bytes);
      }
      if (!info.frozen) {
        largest_trainable = std::max(largest_trainable, c.elems);
        for (float** b : {&c.master, &c.grad32}) {
          if (b == &c.grad32 && !options_.grad_accumulation) continue;
          if (b == &c.master && nvme_.requested()) continue;  // placed below, host or drive
          const uint64_t bytes = b == &c.master ? master_bytes(c) : c.shard_elems * sizeof(float);
          *b = static_cast<float*>(host_->acquire(bytes));
          if (payloads_) std::memset(*b, 0, bytes);
        }
        // Adam's moments come with the chunk's first update
        // (chunk::Fp32Lists, step::lazy_moments), or with the NVMe tier's
        // placement below.
        if (!nvme_.requested() && !step::lazy_moments(nvme_, *host_))
          values::ensure_moments(*host_, c, moment_bytes(c), payloads_);
      }
    }
    if (sharded() && largest_trainable != 0) {
      // The reduce-scatter's buffers, held for the engine's life; with a
      // collective queue (gathering ahead) two pairs, so that a
      // reduce-scatter on the queue overlaps the next.
      reduce_.reserve(host_.get(), largest_trainable, gathering_.depth() > 0);
    }
    layout_ = std::move(layout);  // nvme_place_lists reads the layout
    // With world > 1 the fp32 lists are shards: the staging buffers hold one.
    nvme_place_lists(chunks, largest_trainable / static_cast<uint64_t>(group_.world()));
    gathering_.reserve(static_cast<uint32_t>(chunks.size()), layout_->chunk_elems() * elem_bytes());
  } catch (...) {
    gathering_.release();
    nvme_.release();
    for (size_t i = 0; i < chunks.size(); ++i) {
      ChunkState& c = chunks[i];
      host_->release(c.host, c.bytes);
      host_->release(c.shard, c.shard_elems * elem_bytes());
      release_optimizer_buffers(c);
    }
    reduce_.release();
    layout_.reset();
    throw;
  }
  chunks_ = std::move(chunks);
  // Clean chunks are dropped, not copied back, where the host keeps every
  // payload anyway: no host capacity, one process (with world > 1 a rank's
  // host holds shards, and gathered chunks follow the gathering's rule).
  placement_->set_keep_clean_host_copies(options_.host_capacity_bytes == 0 && !sharded());
  if (sharded()) {
    std::vector<uint32_t> params_per_chunk;
    for (const auto& info : layout_->chunks()) params_per_chunk.push_back(static_cast<uint32_t>(info.params.size()));
    drop_rule_.build(params_per_chunk, params_.size());
  }
  hybrid_->attach(this, layout_.get(), sharded());
  values_->attach(layout_.get());
  step_->attach(layout_.get());
  grads_->attach(layout_.get());
  uint64_t largest_grad = 0;
  for (const Param& p : params_) {
    if (!p.frozen()) largest_grad = std::max(largest_grad, p.numel * sizeof(float));
  }
  placement_->choose_static_chunks(largest_grad);
  for (uint32_t id = 0; id < params_.size(); ++id) params_.apply(id, TensorEvent::kBuild);
  count_gradients_to_come();
  log::info("engine built: " + std::to_string(params_.size()) + " parameters in " + std::to_string(chunks_.size()) +
            " chunks");
}

void Engine::require_built(const char* what) const {
  require(built(), PSTAR_ERR_INVALID_STATE,
          [&] { return std::string(what) + ": the engine is not built (call pstar_engine_build)"; });
}

uint32_t Engine::find(const char* name) const { return params_.find(name); }

uint64_t Engine::numel(uint32_t id) const { return params_.checked(id).numel; }

float* Engine::pin(uint32_t id, bool writable) {
  require_built("param_pin");
  step_->wait();
  Param& p = params_.checked(id);
  require(!writable || !iteration_active_, PSTAR_ERR_INVALID_STATE,
          [&] { return "param_pin of '" + p.name + "': a writable pin is legal only outside iterations"; });
  require(!p.frozen(), PSTAR_ERR_UNSUPPORTED, [&] {
    return "param_pin of '" + p.name + "': a frozen parameter has no fp32 master (read it with pstar_param_read)";
  });
  require(payloads_, PSTAR_ERR_UNSUPPORTED, "param_pin: a dry run holds no values");
  require(!sharded(), PSTAR_ERR_UNSUPPORTED, "param_pin: with world_size > 1 a rank holds only its shard of a master");
  require(options_.master_format == PSTAR_MASTER_FP32, PSTAR_ERR_UNSUPPORTED, "param_pin: bf16 masters have no floats");
  const auto& place = layout_->param(id);
  ChunkState& c = chunks_[place.chunk];
  require(!hybrid_->placed(place.chunk), PSTAR_ERR_UNSUPPORTED, [&] {
    return "param_pin of '" + p.name + "': its optimizer state lives on the accelerator (hybrid placement)";
  });
  require(!nvme_.on_drive(place.chunk), PSTAR_ERR_UNSUPPORTED, [&] {
    return "param_pin of '" + p.name +
           "': its optimizer state lives on the NVMe drive (a pinned master must stay in memory)";
  });
  ++p.pins;
  p.pin_writable.push_back(writable);
  if (writable) ++writable_pins_;
  ++c.master_pins;
  return c.master + place.offset_elems;
}

void Engine::unpin(uint32_t id) {
  require_built("param_unpin");
  step_->wait();
  Param& p = params_.checked(id);
  require(p.pins > 0, PSTAR_ERR_INVALID_STATE, [&] { return "param_unpin of '" + p.name + "': it is not pinned"; });
  const bool writable = p.pin_writable.back();
  if (writable) values_->restore_slot(id);  // the caller's writes reach the compute copy
  p.pin_writable.pop_back();
  if (writable) --writable_pins_;
  --p.pins;
  --chunks_[layout_->param(id).chunk].master_pins;
}

void Engine::set_lr_scale(uint32_t id, float lr_scale) {
  Param& p = params_.checked(id);
  require(!(iteration_active_ && iteration_kind_ == PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_STATE,
          "param_set_lr_scale: not legal inside a TRAIN iteration");
  settings::require_float(lr_scale, 0.0f, settings::kMax, "param_set_lr_scale: lr_scale", settings::kRangeDecay);
  p.lr_scale = lr_scale;
}

void Engine::set_weight_decay(uint32_t id, bool enabled) {
  Param& p = params_.checked(id);
  require(!(iteration_active_ && iteration_kind_ == PSTAR_ITERATION_TRAIN), PSTAR_ERR_INVALID_STATE,
          "param_set_weight_decay: not legal inside a TRAIN iteration");
  p.weight_decay = enabled;
}

// ---------------------------------------------------------------------------
// Values

// Checks shared by param_write and param_read.
Engine::Param& Engine::value_access(const char* what, uint32_t id, const void* buf, uint64_t count, pstar_dtype dtype) {
  require_built(what);
  Param& p = params_.checked(id);
  require(payloads_, PSTAR_ERR_UNSUPPORTED, [&] { return std::string(what) + ": a dry run holds no values"; });
  step_->wait();
  require(!iteration_active_, PSTAR_ERR_INVALID_STATE,
          [&] { return std::string(what) + ": not legal inside an iteration"; });
  require(dtype_valid(dtype), PSTAR_ERR_INVALID_ARGUMENT, [&] { return std::string(what) + ": unknown dtype"; });
  require(count == p.numel, PSTAR_ERR_INVALID_ARGUMENT, [&] {
    return std::string(what) + ": count " + std::to_string(count) + " differs from the element count " +
           std::to_string(p.numel) + " of '" + p.name + "'";
  });
  require(buf != nullptr || count == 0, PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return std::string(what) + ": buffer is NULL"; });
  return p;
}

void Engine::write(uint32_t id, const void* src, uint64_t count, pstar_dtype dtype) {
  value_access("param_write", id, src, count, dtype);
  values_->write(id, src, count, dtype);
}

void Engine::read(uint32_t id, void* dst, uint64_t count, pstar_dtype dtype) {
  value_access("param_read", id, dst, count, dtype);
  values_->read(id, dst, count, dtype);
}

// ---------------------------------------------------------------------------
// Iterations, acquire and release

void Engine::iteration_begin(pstar_iteration_kind kind) {
  require_built("iteration_begin");
  require(kind == PSTAR_ITERATION_TRAIN || kind == PSTAR_ITERATION_EVAL, PSTAR_ERR_INVALID_ARGUMENT,
          "iteration_begin: unknown iteration kind");
  require(!iteration_active_, PSTAR_ERR_INVALID_STATE,
          "iteration_begin: an iteration is in progress (end it with pstar_step or pstar_iteration_end, or "
          "abandon it with pstar_iteration_abort)");
  require_nvme_ok("iteration_begin");
  step_->require_ok();
  nvme_.flush_access();  // values written between iterations reach the drive now
  require(writable_pins_ == 0, PSTAR_ERR_INVALID_STATE,
          "iteration_begin: a parameter is pinned writable (pstar_param_pin); unpin it first, which refreshes its "
          "compute copy");
  group_.require_ok("iteration_begin");
  drop_rule_.iteration_begin();
  iteration_active_ = true;
  iteration_kind_ = kind;
  ++stats_.iterations;
  if (kind == PSTAR_ITERATION_TRAIN) {
    placement_->iteration_begin();
    // The overlapped step: the chunks whose update is done may come back
    // now, ahead of their first use.
    if (step_->overlaps() && !sharded() && options_.prefetch && placement_->follower().following()) {
      placement_->prefetch_ahead(0);
    }
    gathering_.iteration_begin();
  }
}

void Engine::iteration_end() {
  require_built("iteration_end");
  require(iteration_active_, PSTAR_ERR_INVALID_STATE, "iteration_end: no iteration in progress");
  require(iteration_kind_ == PSTAR_ITERATION_EVAL, PSTAR_ERR_INVALID_STATE,
          "iteration_end: a TRAIN iteration ends with pstar_step");
  params_.require_none_acquired("iteration_end");
  gathering_.drop_all();  // world > 1: the gathered chunks go
  iteration_active_ = false;
}

// The end of an iteration, by a step (kStep) or an abort (kAbort): every
// parameter leaves its iteration state (use counts, gradient flags and
// norm) through `ev`, and with grad_accumulation the fp32 gradient lists
// are cleared: a host list per parameter that had a gradient (at once), a
// device-resident list (hybrid placement) on the compute stream.
void Engine::reset_iteration_state(TensorEvent ev) {
  for (uint32_t id = 0; id < params_.size(); ++id) {
    Param& p = params_[id];
    if (p.has_grad && options_.grad_accumulation && payloads_ && !sharded()) {
      const auto& place = layout_->param(id);
      // A chunk still awaiting its overlapped update: the update thread
      // clears its gradient list after the update.
      if (chunks_[place.chunk].opt_device == nullptr && !chunks_[place.chunk].awaiting_update) {
        std::memset(chunks_[place.chunk].grad32 + place.offset_elems, 0, p.numel * sizeof(float));
      }
    }
    p.has_grad = false;
    params_.apply(id, ev);
    p.forward_uses = 0;
    p.backward_uses = 0;
    p.slot_is_grad = false;
    p.grad_sumsq = 0.0;
    p.grad_nonfinite = 0;
  }
  drop_rule_.close_backward();
  if (options_.grad_accumulation) hybrid_->clear_gradients();
  count_gradients_to_come();
}

// Abandons the iteration in progress (pstar_iteration_abort), typically from
// the caller's exception path: releases what is still acquired, discards the
// iteration's gradients and use counts, and leaves every parameter, the
// optimizer state, the step count, the loss scaler and the trace as the step
// before the iteration left them.  Chunks stay where they are.  With a group
// (world > 1) the ranks would have to agree on abandoning the iteration (its
// reduce-scatters and gathers are collectives): refused.
void Engine::iteration_abort() {
  require_built("iteration_abort");
  require(!sharded(), PSTAR_ERR_UNSUPPORTED,
          "iteration_abort: not with a data-parallel group (world_size > 1): an abandoned iteration in a group "
          "would need every rank to agree on it; rebuild the group's engines from a checkpoint "
          "(pstar_checkpoint_load) instead");
  require(iteration_active_, PSTAR_ERR_INVALID_STATE, "iteration_abort: no iteration in progress");
  // The slots are restored from the masters.  A failure of the step in
  // flight (an acquire of this iteration may have reported it) is not
  // thrown here: it stays held, so that the abort ends the iteration and
  // the next iteration_begin refuses until a checkpoint load clears it.
  step_->discard_speculation();
  step_->wait_noexcept();
  // The caller's work on what it acquired and the gradient finalizes its
  // releases queued (which write grad_sumsq and grad_nonfinite) are done
  // before anything below reads, restores or frees their memory.
  memory::Stream* s = device_->compute_stream();
  device_->synchronize(s);
  // Slots holding a gradient get their weight back from the master, as in a
  // skipped step (nothing in a dry run).  The only part that may fail, so it
  // comes first: an NVMe read of a master still ends the abort, then is
  // reported (training is refused until a checkpoint is loaded, as after a
  // failed step); any other error (a device failure) leaves the iteration in
  // progress with slot_is_grad as it was, and a repeated abort restores the
  // slots again (restoring is idempotent).
  std::exception_ptr nvme_error;
  for (uint32_t id = 0; id < params_.size(); ++id) {
    if (!params_[id].slot_is_grad) continue;
    try {
      values_->restore_slot(id);
    } catch (const Error&) {
      if (!nvme_.failed()) throw;
      if (!nvme_error) nvme_error = std::current_exception();
    }
  }
  const memory::EventPtr done = device_->record(s);
  for (uint32_t id = 0; id < params_.size(); ++id) {
    const auto& place = layout_->param(id);
    ChunkState& c = chunks_[place.chunk];
    if (params_[id].state == TensorState::kCompute) {
      // Released here, as by pstar_param_release on the default stream,
      // without its gradient work.
      c.last_use = done;
      if (--c.compute_refs == 0) placement_->unhold(place.chunk);
    }
  }
  grads_->discard(done);
  // The micro-batches' gradients folded so far are discarded, as a step
  // consumes them.
  reset_iteration_state(TensorEvent::kAbort);
  if (iteration_kind_ == PSTAR_ITERATION_TRAIN) placement_->iteration_abort();
  iteration_active_ = false;
  log::info(std::string("iteration aborted (") + (iteration_kind_ == PSTAR_ITERATION_TRAIN ? "TRAIN" : "EVAL") +
            "): no step, its gradients discarded");
  if (nvme_error) std::rethrow_exception(nvme_error);
}

void* Engine::acquire(uint32_t id, pstar_stage stage, void* stream) {
  require_built("param_acquire");
  Param& p = params_.checked(id);
  require(stage == PSTAR_STAGE_FORWARD || stage == PSTAR_STAGE_BACKWARD || stage == PSTAR_STAGE_RECOMPUTE,
          PSTAR_ERR_INVALID_ARGUMENT, "param_acquire: unknown stage");
  require(iteration_active_, PSTAR_ERR_INVALID_STATE, "param_acquire: no iteration in progress");
  group_.require_ok("param_acquire");
  memory::Stream* s = device_->caller_stream(stream);

  TensorEvent ev;
  if (iteration_kind_ == PSTAR_ITERATION_EVAL) {
    require(stage == PSTAR_STAGE_FORWARD, PSTAR_ERR_INVALID_STATE,
            "param_acquire: an EVAL iteration has FORWARD uses only");
    ev = TensorEvent::kAcquireEval;
  } else if (stage == PSTAR_STAGE_FORWARD && options_.grad_accumulation && p.state == TensorState::kHoldAfterBwd) {
    ev = TensorEvent::kAcquireNextMicroBatch;  // its gradient is folded into the fp32 list
  } else if (stage == PSTAR_STAGE_FORWARD) {
    require(p.backward_uses == 0, PSTAR_ERR_INVALID_STATE, [&] {
      return "param_acquire(FORWARD) of '" + p.name + "' after its backward began in this iteration" +
             (options_.grad_accumulation ? "" : " (several micro-batches per step need options.grad_accumulation)");
    });
    ev = TensorEvent::kAcquireForward;
  } else if (stage == PSTAR_STAGE_RECOMPUTE) {
    ev = TensorEvent::kAcquireRecompute;
  } else {
    require(p.backward_uses < p.forward_uses, PSTAR_ERR_INVALID_STATE, [&] {
      return "param_acquire(BACKWARD) of '" + p.name + "': " + std::to_string(p.backward_uses) +
             " backward uses already match its " + std::to_string(p.forward_uses) + " forward uses";
    });
    ev = TensorEvent::kAcquireBackward;
  }
  // Checked now, applied once the placement work below has succeeded.
  const TensorState next = params_.next_state(id, ev);

  const auto& place = layout_->param(id);
  ChunkState& c = chunks_[place.chunk];
  const bool train = iteration_kind_ == PSTAR_ITERATION_TRAIN;
  if (train) placement_->follower().check(place.chunk);
  step_->before_acquire(place.chunk);  // its overlapped update, if still running
  // world > 1: gathers the chunk, or waits for its gather ahead.
  const bool gathered_now = gathering_.before_acquire(place.chunk, train, &stats_.bytes_critical);
  if (c.tier == Tier::kHost) {
    placement_->fetch(place.chunk);
    stats_.bytes_critical += c.bytes;  // the caller waits for this copy
  } else if (!device_->query(c.ready) && c.prefetched) {
    stats_.bytes_critical += c.bytes;  // a prefetch still in flight
  }
  c.prefetched = false;
  if (ev == TensorEvent::kAcquireBackward && !p.frozen() && p.grad_acc == nullptr && p.grad_host == nullptr)
    grads_->open(id);
  device_->stream_wait(s, c.ready);
  if (device_->host_accessible()) {
    // The caller's compute runs on the host: the data must be there now.
    placement_->host_wait(s, c.ready);
    placement_->check_ready(c.ready, "acquired chunk");
  }
  p.state = next;
  p.acquired_stage = stage;
  const bool was_open = p.backward_uses != p.forward_uses;
  if (ev == TensorEvent::kAcquireNextMicroBatch) {
    p.forward_uses = 0;
    p.backward_uses = 0;
    ev = TensorEvent::kAcquireForward;
  }
  if (ev == TensorEvent::kAcquireForward) ++p.forward_uses;
  if (ev == TensorEvent::kAcquireBackward) ++p.backward_uses;
  drop_rule_.note_backward_open(place.chunk, was_open, p.backward_uses != p.forward_uses);
  if (c.compute_refs++ == 0) placement_->hold(place.chunk);
  // The backward writes the gradient into the slot: the host copy goes.
  if (ev == TensorEvent::kAcquireBackward && !p.frozen()) placement_->mark_written(place.chunk);
  ++acquires_;
  c.last_acquire = acquires_;
  placement_->touch(place.chunk);
  if (iteration_kind_ == PSTAR_ITERATION_TRAIN) {
    gathering_.after_acquire(place.chunk, gathered_now);
    placement_->note_access(place.chunk);
    if (placement_->follower().following() && options_.prefetch)
      placement_->prefetch_ahead(placement_->follower().moment());
  }
  if (placement_->tier().over_capacity()) ++stats_.budget_overruns;
  if (placement_->timeline() != nullptr) placement_->sample_memory(acquires_);
  if (!payloads_) return nullptr;
  return static_cast<char*>(c.device) + place.offset_elems * elem_bytes();
}

void Engine::release(uint32_t id, void* stream) {
  require_built("param_release");
  Param& p = params_.checked(id);
  require(p.state == TensorState::kCompute, PSTAR_ERR_INVALID_STATE,
          [&] { return "param_release of '" + p.name + "': not acquired (state " + chunk::state_name(p.state) + ")"; });
  group_.require_ok("param_release");
  memory::Stream* s = device_->caller_stream(stream);
  TensorEvent ev;
  if (iteration_kind_ == PSTAR_ITERATION_EVAL) {
    ev = TensorEvent::kReleaseEval;
  } else if (p.acquired_stage != PSTAR_STAGE_BACKWARD) {
    ev = TensorEvent::kReleaseForward;
  } else {
    ev = p.backward_uses == p.forward_uses ? TensorEvent::kReleaseBackwardLast : TensorEvent::kReleaseBackward;
  }
  const auto& place = layout_->param(id);
  ChunkState& c = chunks_[place.chunk];
  bool finalized = false;
  grads_->end_use(p, ev == TensorEvent::kReleaseBackwardLast, s);
  if (ev == TensorEvent::kReleaseBackwardLast && !p.frozen() && sharded()) {
    // world > 1: the gradient stays in its fp32 buffer until the chunk's
    // reduce-scatter (the drop rule below), the slot keeps the weight.
    if (!p.grad_pending) drop_rule_.note_gradient_pending(place.chunk);
    grads_->zero_pending(p, s);
    p.grad_pending = true;
    p.grad_ready = device_->record(s);
  } else if (ev == TensorEvent::kReleaseBackwardLast && !p.frozen() && options_.grad_accumulation) {
    grads_->zero_pending(p, s);
    step_->fold_gradient(id, s);
  } else if (ev == TensorEvent::kReleaseBackwardLast && !p.frozen()) {
    // The gradient replaces the weight in the slot (backward_gradients.h).
    c.ready = grads_->finalize_into_slot(id, s);
    finalized = true;
  }
  c.last_use = device_->record(s);
  params_.apply(id, ev);
  if (--c.compute_refs == 0) placement_->unhold(place.chunk);
  if (finalized && c.grads_to_come > 0 && --c.grads_to_come == 0) gradients_leave(place.chunk);
  // world > 1: the drop rule (distributed/drop_rule.h).
  switch (drop_rule_.after_release(id, place.chunk, p.acquired_stage, c.compute_refs)) {
    case distributed::DropRule::Action::kReduceThenDrop: reduce_chunk(place.chunk); [[fallthrough]];
    case distributed::DropRule::Action::kDrop: gathering_.drop(place.chunk, true); break;
    case distributed::DropRule::Action::kKeep: break;
  }
  step_->poll_speculation();  // chunks whose copy to the host completed go to the update thread
}

// pstar_grad_write and pstar_grad_slot_acquire: the checks here, the
// gradient's sum in step/backward_gradients.h.
void Engine::grad_write(uint32_t id, const void* grad, uint64_t count, pstar_dtype dtype, pstar_mem_space space,
                        void* stream, bool release_after) {
  const char* what = release_after ? "grad_write_release" : "grad_write";
  Param& p = backward_param(what, id);
  group_.require_ok(what);
  grads_->check_write(what, p, grad, count, dtype, space);
  if (!release_after || !grads_->defer_to_slot(id, grad, dtype, space))
    grads_->write(id, grad, count, dtype, space, device_->caller_stream(stream));
  step::BackwardGradients::DeferredScope scope(*grads_);  // forgotten whether the release takes it or fails
  if (release_after) release(id, stream);
}

float* Engine::grad_slot_acquire(uint32_t id, void* stream) {
  backward_param("grad_slot_acquire", id);
  require(payloads_, PSTAR_ERR_UNSUPPORTED, "grad_slot_acquire: a dry run has no gradient buffers to write");
  return grads_->slot_acquire(id, device_->caller_stream(stream));
}

// Chunk k's backward is over: every trainable parameter's gradient is in
// its slot.  Its optimizer state on the host, the step would evict it for
// the CPU update; it leaves now instead, the copy queued behind the
// finalize on the D2H stream, so that it runs under the rest of the
// backward and the device memory is free from here on.  A chunk whose state
// is on the device (hybrid) stays: its update runs there.  Placement only:
// the bytes and the values are those of an eviction at the step.
void Engine::gradients_leave(uint32_t k) {
  ChunkState& c = chunks_[k];
  if (c.tier == Tier::kDevice && c.evictable()) placement_->evict(k);
  step_->gradients_left(k);  // the speculative update, once it is on the host
}

// Each chunk's trainable parameters, the gradients its backward finalizes
// (world 1, no accumulation; otherwise no chunk leaves early).  The layout
// packs trainable and frozen parameters into separate chunks, so that is
// every parameter of a trainable chunk.
void Engine::count_gradients_to_come() {
  const bool leave_early = !sharded() && !options_.grad_accumulation;
  for (uint32_t k = 0; k < chunks_.size(); ++k) {
    const auto& info = layout_->chunks()[k];
    chunks_[k].grads_to_come = leave_early && !info.frozen ? static_cast<uint32_t>(info.params.size()) : 0;
  }
}

// A trainable parameter acquired for BACKWARD in a TRAIN iteration: the
// only state in which a gradient may be handed over.
Engine::Param& Engine::backward_param(const char* what, uint32_t id) {
  require_built(what);
  Param& p = params_.checked(id);
  require(!p.frozen(), PSTAR_ERR_INVALID_STATE,
          [&] { return std::string(what) + ": '" + p.name + "' is frozen and takes no gradient"; });
  require(iteration_active_ && iteration_kind_ == PSTAR_ITERATION_TRAIN && p.state == TensorState::kCompute &&
              p.acquired_stage == PSTAR_STAGE_BACKWARD,
          PSTAR_ERR_INVALID_STATE,
          [&] { return std::string(what) + ": '" + p.name + "' is not acquired for BACKWARD in a TRAIN iteration"; });
  return p;
}

void Engine::nonmodel_report(uint64_t bytes) {
  require(bytes <= chunk::kMaxNumel * 16, PSTAR_ERR_INVALID_ARGUMENT, "nonmodel_report: implausible byte count");
  placement_->tier().set_nonmodel(bytes);
  // The caller holds this memory now: make room by evicting what may move.
  // Whatever cannot move stays; later requests fail instead.  The peak is
  // taken after eviction, so it exceeds the capacity only when nothing could
  // move.
  if (built() && placement_->tier().over_capacity()) {
    try {
      placement_->make_room(0, -1, "non-model memory");
    } catch (const Error& e) {
      log::warn(std::string("nonmodel_report: over capacity after evicting all movable chunks: ") + e.what());
    }
  }
  placement_->note_device_peak();
}

// ---------------------------------------------------------------------------
// Placement

void Engine::clock_advance(double seconds) { device_->advance_clock(seconds); }

void Engine::trace_export(const char* path) const {
  require(path != nullptr && path[0] != '\0', PSTAR_ERR_INVALID_ARGUMENT, "trace_export: path is NULL or empty");
  require(placement_->timeline() != nullptr, PSTAR_ERR_INVALID_STATE,
          "trace_export: no timeline was kept (set options.record_timeline)");
  placement_->timeline()->write(path, options_.virtual_clock ? "virtual" : "wall");
}

// ---------------------------------------------------------------------------
// Trace-guided placement
//
// TRAIN iterations are recorded (one moment per acquire) until warm-up ends;
// then each TRAIN iteration follows the trace: every acquire is checked
// against the recorded chunk, and evictions take the resident chunk whose
// next use is furthest (OPT).  On the first mismatch the iteration falls back
// to LRU and is recorded from there on (the matched prefix is the trace's),
// and at its end that recording becomes the new trace.  EVAL iterations
// neither record nor check: they use LRU and leave the trace alone.

// ---------------------------------------------------------------------------
// Optimizer step

pstar_step_result Engine::step() {
  require_built("step");
  require(iteration_active_ && iteration_kind_ == PSTAR_ITERATION_TRAIN, PSTAR_ERR_INVALID_STATE,
          "step: no TRAIN iteration in progress");
  group_.require_ok("step");
  require_nvme_ok("step");
  step_->wait_previous_step();  // its updates (chunks this iteration did not use); speculation goes on
  params_.require_none_acquired("step");
  params_.require_backward_complete("step");
  // A pinned master the step would update: refuse before anything changes.
  for (uint32_t id = 0; id < params_.size(); ++id) {
    const Param& p = params_[id];
    require(p.pins == 0 || !p.has_grad, PSTAR_ERR_BUSY, [&] {
      return "step: parameter '" + p.name +
             "' has a gradient to apply but its master is pinned (pstar_param_pin); "
             "unpin it and call pstar_step again";
    });
  }
  // After warm-up: decides again where the optimizer state is, before the
  // update, so that chunks placed now are updated on the device
  // (placement/hybrid.h).  A speculative update reads the host lists that
  // move: it stops first.
  const placement::HybridPlacement::Plan plan = hybrid_->step_plan();
  if (!plan.empty()) step_->wait();
  hybrid_->step_begins(plan);
  pstar_step_result r = PSTAR_STEP_RESULT_INIT;
  // An NVMe I/O error inside the update still ends the iteration (so that a
  // checkpoint can be loaded), then is reported.
  std::exception_ptr nvme_error;
  try {
    step_->run(r);
  } catch (const Error&) {
    if (!nvme_.failed()) throw;
    nvme_error = std::current_exception();
  }
  // The accumulated gradients are consumed (or discarded by a skip).
  reset_iteration_state(TensorEvent::kStep);
  iteration_active_ = false;
  placement_->iteration_end();
  if (nvme_error) std::rethrow_exception(nvme_error);
  r.step = optimizer_.step();
  r.next_loss_scale = optimizer_.scaler().scale();
  return r;
}

// ---------------------------------------------------------------------------
// Hyperparameters and statistics

// Inside a TRAIN iteration: for this iteration's step, without a wait (the
// updates in flight carry their constants: step/speculation.cpp).
void Engine::hparam_set(pstar_hparam which, double v) {
  const bool in_train = iteration_active_ && iteration_kind_ == PSTAR_ITERATION_TRAIN;
  require(!(in_train && which == PSTAR_HPARAM_LOSS_SCALE), PSTAR_ERR_INVALID_STATE,
          "hparam_set: the loss scale is not settable inside a TRAIN iteration (this iteration's gradients "
          "were scaled by the current one); set it between steps");
  if (!in_train) step_->wait();
  optimizer_.set_hparam(which, v);
}

double Engine::grad_norm() {
  require_built("grad_norm");
  require(iteration_active_ && iteration_kind_ == PSTAR_ITERATION_TRAIN, PSTAR_ERR_INVALID_STATE,
          "grad_norm: no TRAIN iteration in progress");
  require_nvme_ok("grad_norm");
  params_.require_none_acquired("grad_norm");
  params_.require_backward_complete("grad_norm");
  return step_->grad_norm();
}

double Engine::hparam_get(pstar_hparam which) const { return optimizer_.hparam(which); }

void Engine::fill_stats(pstar_stats* out) const {
  step_->wait_noexcept();  // statistics stay readable after a failure
  pstar_stats s = stats_;
  const placement::MoveCounters& moved = placement_->counters();
  s.moves_to_device = moved.moves_to_device;
  s.evictions = moved.evictions;
  s.bytes_host_to_device = moved.bytes_host_to_device;
  s.bytes_device_to_host = moved.bytes_device_to_host;
  s.bytes_prefetched = moved.bytes_prefetched;
  s.peak_device_bytes = moved.peak_device_bytes;
  s.peak_device_chunk_bytes = moved.peak_device_chunk_bytes;
  s.steps = step_->counters().steps;
  s.skipped_steps = step_->counters().skipped_steps;
  s.bytes_reduce_scattered = step_->counters().bytes_reduce_scattered;
  s.wait_seconds = moved.wait_seconds;
  s.device_bytes = placement_->tier().used();
  s.host_bytes = host_->held_bytes();
  s.peak_host_bytes = host_->peak_bytes();
  s.trace_moments = placement_->follower().ready() ? placement_->follower().trace().moments() : 0;
  s.trace_fallbacks = placement_->follower().divergences();
  s.clock_seconds = device_->clock_seconds();
  if (built()) {
    s.compute_chunks = static_cast<uint32_t>(layout_->chunks().size());
    s.optimizer_chunks = layout_->optimizer_chunk_count();
    s.jumbo_chunks = layout_->jumbo_chunk_count();
    s.compute_list_bytes = layout_->total_capacity_elems() * elem_bytes();
    s.optimizer_list_bytes = layout_->trainable_capacity_elems() * sizeof(float);
    s.fill_ratio = layout_->fill_ratio();
    if (sharded()) {
      // The full lists with their chunks padded for sharding; each rank
      // holds 1/world of them.
      uint64_t all = 0, trainable = 0, used = 0;
      for (uint32_t k = 0; k < chunks_.size(); ++k) {
        all += chunks_[k].elems;
        if (!layout_->chunks()[k].frozen) trainable += chunks_[k].elems;
      }
      for (const Param& p : params_) used += p.numel;
      s.compute_list_bytes = all * elem_bytes();
      s.optimizer_list_bytes = trainable * sizeof(float);
      s.fill_ratio = all == 0 ? 0.0 : static_cast<double>(used) / static_cast<double>(all);
    }
  }
  s.rank = group_.rank();
  s.collectives = group_.collectives();
  s.bytes_all_gathered += gathering_.bytes_gathered() + values_->bytes_all_gathered();
  s.world_size = group_.world();
  s.optimizer_chunks_on_device = hybrid_->chunks_on_device();
  s.optimizer_device_bytes = placement_->tier().bytes(Use::kOptimizer);
  write_versioned_struct(out, s);
}

}  // namespace pstar::engine
