// The engine's data parallelism (world > 1; docs/distributed.md): forming
// the group, checking the layout at build, and the reduce-scatter and
// gathering-ahead calls.  The gradients' actions and the sharded step are
// in step/ (sharded_step.cpp), sharded values in values/.
//
// Every collective here is issued at a point fixed by the access sequence
// (acquires, releases and their stages) and the API calls (build, read,
// step): never because of capacity, eviction, prefetch or the placement
// trace.  Gathering ahead follows a schedule recorded from the same calls
// (below).  So every rank issues the same collectives in the same order as
// long as the ranks make the same calls, whatever their capacities and
// non-model bytes.
#include <chrono>
#include <string>

#include "distributed/group.h"
#include "distributed/layout_agreement.h"
#include "distributed/launch_env.h"
#include "engine/engine.h"
#include "step/optimizer_step.h"
#include "util/error.h"
#include "util/struct_check.h"

namespace pstar::engine {

// Resolves rank and world size: explicit options, else the launcher's
// environment, else one process.  Runs before the device is made, so that
// what a sharded engine cannot do is refused first.
void Engine::resolve_world() {
  distributed::LaunchRequest request;
  if (options_.world_size > 0) {
    request.rank = options_.rank;
    request.world_size = options_.world_size;
  }
  const distributed::LaunchInfo launch = distributed::resolve_launch(request);
  group_.set_launch(launch);
  if (launch.world_size == 1) return;
  if (options_.device == PSTAR_DEVICE_CUDA) {
    require(distributed::cuda_groups_available(), PSTAR_ERR_UNSUPPORTED,
            "options: data parallelism on CUDA devices needs NCCL and libuv, and this libpstar was built without "
            "one or both (install the CUDA toolkit with NCCL and libuv1-dev, then rebuild)");
    // One GPU per rank: the node-local rank picks it unless the caller chose
    // another ordinal than the default.
    if (options_.device_ordinal == 0) options_.device_ordinal = launch.local_rank;
  }
  require(!options_.dry_run, PSTAR_ERR_UNSUPPORTED,
          "options: a dry run has no payloads to exchange; it models one rank (set world_size to 1)");
  require(options_.device == PSTAR_DEVICE_CUDA || distributed::cpu_groups_available(), PSTAR_ERR_UNSUPPORTED,
          "options: data parallelism on the emulated device needs Gloo and libuv, and this libpstar was built "
          "without them (install libgloo-dev and libuv1-dev and rebuild)");
}

// With more than one rank, forms the group (distributed/group.h): NCCL for CUDA
// ranks, Gloo for emulated ones.
void Engine::connect_group() {
  group_.connect(options_.device == PSTAR_DEVICE_CUDA ? static_cast<int>(options_.device_ordinal) : -1,
                 std::chrono::milliseconds(options_.comm_timeout_ms));
}

// ---------------------------------------------------------------------------
// Build

// All ranks must register the same parameters in the same order with the
// options that shape the layout: a hash of all that, the parameter count and
// the element count are all-gathered and compared.
void Engine::check_layout_agrees(uint64_t chunk_elems) {
  distributed::LayoutHash h;
  h.add(chunk_elems);
  h.add(static_cast<uint64_t>(options_.compute_dtype));
  h.add(options_.grad_accumulation != 0);
  h.add(static_cast<uint64_t>(options_.state_format) | static_cast<uint64_t>(options_.master_format) << 8);
  h.add(options_.master_seed);
  h.add(gathering_.depth());
  for (const Param& p : params_) h.add_param(p.name, p.shape, p.flags, p.numel);
  // Whether this rank's device can hold the gather-ahead slots: exchanged
  // so that every rank fails the build, not the one short of room.
  distributed::SlotNeed slots;
  slots.depth = gathering_.depth();
  slots.slot_bytes = chunk_elems * elem_bytes();
  const uint64_t slot_total = slots.depth * slots.slot_bytes;
  slots.fits = slot_total == 0 || placement_->tier().fits(slot_total);
  distributed::check_layout_agrees(group_, h, slots);
}

// Reduce-scatters the pending gradients of chunk k (distributed/reduce_scatter.h):
// their fp32 buffers are laid out as the chunk (zero elsewhere), summed over
// the ranks, and this rank's shard of the average is applied.  Without
// gradient accumulation the average, rounded to the compute dtype, goes to
// the compute shard (flagged GRAD, as a gradient replaces the weight in one
// process) with its squared norm and overflow flag over the rounded values;
// with accumulation it is added to the fp32 gradient shard.
//
// With a collective queue (gathering ahead) the reduce-scatter runs there
// and its result is applied later (reduce_.finish_through): the release
// that completed the chunk's backward returns to the caller's compute at
// once.
void Engine::reduce_chunk(uint32_t k) {
  const ChunkState& c = chunks_[k];
  reduce_.reduce(k, c.elems, c.shard_elems);
}

// ---------------------------------------------------------------------------
// Gathering ahead (pstar_x_engine_set_gather_ahead; docs/distributed.md): the
// schedule decides (distributed/gather_ahead.h); the engine gathers.

void Engine::set_gather_ahead(uint32_t chunks) {
  require(!built(), PSTAR_ERR_INVALID_STATE, "set_gather_ahead: the engine is built; set the depth before");
  require(chunks <= kMaxGatherAhead, PSTAR_ERR_INVALID_ARGUMENT, [&] {
    return "set_gather_ahead: " + std::to_string(chunks) + " chunks; at most " + std::to_string(kMaxGatherAhead);
  });
  gathering_.set_depth(chunks);
}

void Engine::set_overlap_step(bool enabled) {
  require(!built(), PSTAR_ERR_INVALID_STATE, "set_overlap_step: the engine is built; set it before");
  step_->set_overlap(enabled);
}

void Engine::set_modelled_host_update(double bytes_per_s) {
  require(!built(), PSTAR_ERR_INVALID_STATE, "set_modelled_host_update: the engine is built; set it before");
  require(options_.virtual_clock || options_.dry_run, PSTAR_ERR_UNSUPPORTED,
          "set_modelled_host_update: the engine runs on the wall clock, where the update's time is its own (set "
          "options.virtual_clock)");
  require(group_.world() == 1, PSTAR_ERR_UNSUPPORTED,
          "set_modelled_host_update: one process only (the sharded step's time is not modelled)");
  step_->set_modelled_update_rate(bytes_per_s);
}

void Engine::set_speculative_update(uint64_t max_bytes) {
  require(!built(), PSTAR_ERR_INVALID_STATE, "set_speculative_update: the engine is built; set it before");
  step_->set_speculation_budget(max_bytes);
}

void Engine::fill_step_stats(pstar_x_step_stats* out) const {
  step_->wait_noexcept();
  const step::StepCounters& c = step_->counters();
  pstar_x_step_stats s{};
  s.overlap = (built() ? step_->overlaps() : step_->overlap_requested()) ? 1 : 0;
  s.steps_overlapped = c.steps_overlapped;
  s.chunks_updated = c.chunks_overlapped;
  s.update_seconds = step_->update_seconds();
  s.wait_seconds = c.wait_seconds;
  s.chunks_speculated = c.chunks_speculated;
  s.speculations_discarded = c.speculations_discarded;
  write_versioned_struct(out, s);  // an older caller's struct is shorter
}

void Engine::fill_gather_stats(pstar_x_gather_stats* out) const {
  const distributed::GatherAhead& g = gathering_.schedule();
  pstar_x_gather_stats s{};
  s.size = out->size;
  s.version = out->version;
  s.depth = g.depth();
  s.schedule_ready = g.ready() ? 1 : 0;
  s.slot_bytes = placement_->tier().bytes(Use::kGatherSlots);
  s.gathers_ahead = g.gathers_ahead();
  s.gathers_on_demand = g.gathers_on_demand();
  s.gathers_waited = g.gathers_waited();
  s.schedule_fallbacks = g.fallbacks();
  s.wait_seconds = g.wait_seconds();
  s.bytes_shard_host_to_device = gathering_.bytes_shard_to_device();
  s.bytes_reduce_device_to_host = step_->counters().bytes_reduce_to_host;
  write_versioned_struct(out, s);  // an older caller's struct is shorter
}

}  // namespace pstar::engine
