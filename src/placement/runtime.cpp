// The placement runtime (placement/runtime.h).
#include "placement/runtime.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "util/error.h"
#include "util/log.h"

namespace pstar::placement {

namespace {
using chunk::Tier;
std::string bytes_str(uint64_t b) { return std::to_string(b) + " bytes"; }
}  // namespace

Runtime::Runtime(memory::Device* device, memory::HostPool* host, const RuntimeOptions& options)
    : options_(options),
      device_(device),
      host_(host),
      tier_(options.capacity_bytes),
      follower_(options.warmup_iterations, TraceFollower::Retrace::kFromDivergence, "placement") {
  if (options.record_timeline) timeline_ = std::make_unique<Timeline>();
}

Runtime::~Runtime() { drain(); }

void Runtime::drain() {
  while (reclaim_deferred(true)) {
  }
}

void Runtime::forget(uint32_t k) {
  lru_.remove(k);
  const uint64_t next = opt_policy_.key(k);
  if (next < prefetch_frontier_) prefetch_frontier_ = next;
  opt_policy_.remove(k);
}

void Runtime::note_device_peak() {
  counters_.peak_device_bytes = std::max(counters_.peak_device_bytes, tier_.used());
  counters_.peak_device_chunk_bytes = std::max(counters_.peak_device_chunk_bytes, tier_.bytes(Use::kChunks));
}

void Runtime::host_wait(memory::Stream* stream, const memory::EventPtr& ready) {
  // Reading the wall clock costs tens of nanoseconds: only when there is
  // something to wait for (the virtual clock is a field).
  if (!options_.payloads || options_.virtual_clock || !device_->query(ready)) {
    const double before = device_->clock_seconds();
    device_->synchronize(stream);
    counters_.wait_seconds += device_->clock_seconds() - before;
  } else {
    device_->synchronize(stream);
  }
}

void Runtime::sample_memory(uint64_t moment) {
  timeline_->sample(placement::Timeline::MemorySample{
      moment, device_->clock_seconds(), tier_.bytes(Use::kChunks), tier_.bytes(Use::kGradients),
      tier_.bytes(Use::kNonModel), tier_.bytes(Use::kDeferred), host_->held_bytes(), tier_.bytes(Use::kOptimizer)});
}

void Runtime::note_move(bool to_device, uint32_t chunk, const memory::EventPtr& start, const memory::EventPtr& done) {
  double t0 = device_->completion_time(start);
  if (std::isnan(t0)) t0 = device_->clock_seconds();  // wall clock: the issue time
  timeline_->note_move(to_device, chunk, at(chunk).bytes, t0, device_->completion_time(done));
}

void Runtime::defer_free_device(memory::EventPtr after, void* ptr, size_t bytes, Use from) {
  tier_.move(from, Use::kDeferred, bytes);  // still occupied until the event passes
  deferred_.push_back(DeferredFree{std::move(after), ptr, bytes, Tier::kDevice});
  reclaim_deferred(false);
}

void Runtime::defer_free_host(memory::EventPtr after, void* ptr, size_t bytes) {
  deferred_.push_back(DeferredFree{std::move(after), ptr, bytes, Tier::kHost});
  reclaim_deferred(false);
}

bool Runtime::reclaim_deferred(bool wait_for_one) {
  bool freed = false;
  for (size_t i = 0; i < deferred_.size();) {
    DeferredFree& d = deferred_[i];
    if (!device_->query(d.after)) {
      if (!wait_for_one || freed) {
        ++i;
        continue;
      }
      device_->synchronize(d.after);
    }
    if (d.tier == Tier::kDevice) {
      device_->deallocate(d.ptr, d.bytes);
      tier_.remove(Use::kDeferred, d.bytes);
    } else {
      host_->release(d.ptr, d.bytes);
    }
    freed = true;
    deferred_[i] = std::move(deferred_.back());
    deferred_.pop_back();
  }
  return freed;
}

void Runtime::make_room(uint64_t bytes, int64_t keep_chunk, const std::string& purpose) {
  reclaim_deferred(false);
  while (!tier_.fits(bytes)) {
    const double before = device_->clock_seconds();
    const bool reclaimed = reclaim_deferred(true);
    counters_.wait_seconds += device_->clock_seconds() - before;
    if (reclaimed) continue;
    if (release_staging_ && release_staging_()) continue;  // e.g. a reduce-scatter's device staging
    uint32_t victim;
    auto movable = [&](uint32_t k) { return static_cast<int64_t>(k) != keep_chunk && at(k).evictable(); };
    bool found;
    if (follower_.following()) {
      found = opt_policy_.victim(movable, &victim);
    } else {
      // The static policy's resident set goes last, when the streaming
      // reserve is exhausted (e.g. by non-model memory).
      found = lru_.victim([&](uint32_t k) { return movable(k) && !at(k).pinned_static; }, &victim) ||
              lru_.victim(movable, &victim);
    }
    if (!found) {
      throw Error(PSTAR_ERR_OUT_OF_MEMORY, "device tier: " + purpose + " needs " + bytes_str(bytes) + " but only " +
                                               bytes_str(tier_.free_bytes()) + " are free of a capacity of " +
                                               bytes_str(tier_.capacity()) + " (" + tier_.describe() +
                                               "); every resident chunk is in use, so nothing can be evicted");
    }
    evict(victim);
  }
}

bool Runtime::fits_after_evicting(uint64_t bytes, int64_t keep_chunk) const {
  if (tier_.fits(bytes)) return true;
  uint64_t movable = tier_.bytes(Use::kDeferred);
  for (uint32_t k = 0; k < chunks_->chunk_count(); ++k) {
    const chunk::Chunk& c = at(k);
    if (static_cast<int64_t>(k) != keep_chunk && c.tier == Tier::kDevice && c.evictable()) movable += c.bytes;
  }
  const uint64_t held = tier_.used() - std::min(movable, tier_.used());
  return held <= tier_.capacity() && bytes <= tier_.capacity() - held;
}

void* Runtime::device_alloc(uint64_t bytes, int64_t keep_chunk, const std::string& purpose) {
  make_room(bytes, keep_chunk, purpose);
  return device_->allocate(bytes);
}

void* Runtime::alloc_staging(uint64_t bytes, const std::string& purpose) {
  void* p = device_alloc(bytes, -1, purpose);
  tier_.add(Use::kStaging, bytes);
  note_device_peak();
  return p;
}

void Runtime::free_staging(void* ptr, uint64_t bytes) {
  device_->deallocate(ptr, bytes);
  tier_.remove(Use::kStaging, bytes);
}

void Runtime::fetch(uint32_t k) {
  chunk::Chunk& c = at(k);
  void* dst = device_alloc(c.bytes, k, "chunk " + std::to_string(k));
  tier_.add(Use::kChunks, c.bytes);
  note_device_peak();
  copy_in(k, dst, nullptr);
}

// Queues chunk k's copy from the host into `dst` on the H2D stream, after
// `after` (the copy out of a previous occupant of dst, or null).
void Runtime::copy_in(uint32_t k, void* dst, const memory::EventPtr& after) {
  chunk::Chunk& c = at(k);
  memory::Stream* s = device_->h2d_stream();
  device_->stream_wait(s, after);
  device_->stream_wait(s, c.ready);
  device_->stream_wait(s, c.last_use);
  memory::EventPtr start = timeline_ ? device_->record(s) : nullptr;
  device_->copy_async(s, dst, c.host, c.bytes, memory::CopyKind::kHostToDevice);
  memory::EventPtr done = device_->record(s);
  if (timeline_) note_move(true, k, start, done);
  become_resident(k, dst, done);
}

void Runtime::become_resident(uint32_t k, void* dst, const memory::EventPtr& done) {
  chunk::Chunk& c = at(k);
  if (keep_clean_host_copies_) {
    c.host_copy = c.host;  // the same bits as the device payload from `done` on
  } else {
    defer_free_host(done, c.host, c.bytes);
  }
  c.host = nullptr;
  c.device = dst;
  c.tier = Tier::kDevice;
  c.ready = done;
  c.last_use = done;
  lru_.touch(k);  // resident from now on, hence evictable
  ++counters_.moves_to_device;
  counters_.bytes_host_to_device += c.bytes;
}

bool Runtime::follow_update(uint32_t k, uint64_t t) {
  chunk::Chunk& c = at(k);
  const size_t bytes = c.bytes;
  void* dst = device_alloc(bytes, k, "chunk " + std::to_string(k));
  tier_.add(Use::kChunks, bytes);
  note_device_peak();
  PendingUpload& u = uploads_[k];
  u = PendingUpload{dst, t, false, nullptr, nullptr};
  ++uploads_pending_;
  // The host payload is the update's output; the engine's thread leaves it
  // (and the chunk) alone until it takes the update's completion.
  const void* src = c.host;
  const bool timeline = timeline_ != nullptr;
  const bool followed = follower_of_updates_.follow(k, [this, k, dst, src, bytes, timeline] {
    PendingUpload& p = uploads_[k];
    device_->use_on_this_thread();
    memory::Stream* s = device_->h2d_stream();
    if (timeline) p.start = device_->record(s);
    device_->copy_async(s, dst, src, bytes, memory::CopyKind::kHostToDevice);
    p.done = device_->record(s);
    p.queued = true;
  });
  if (followed) return true;
  --uploads_pending_;
  device_->deallocate(dst, bytes);
  tier_.remove(Use::kChunks, bytes);
  u = PendingUpload{};
  return false;
}

void Runtime::take_upload(uint32_t k) {
  if (uploads_.empty() || uploads_[k].dst == nullptr) return;
  PendingUpload u = std::move(uploads_[k]);
  uploads_[k] = PendingUpload{};
  --uploads_pending_;
  chunk::Chunk& c = at(k);
  if (!u.queued) {
    // The step failed before the copy was queued, perhaps inside it (a
    // copy that failed to queue may have left work on the stream).
    device_->synchronize(device_->h2d_stream());
    device_->deallocate(u.dst, c.bytes);
    tier_.remove(Use::kChunks, c.bytes);
    return;
  }
  if (timeline_) note_move(true, k, u.start, u.done);
  become_resident(k, u.dst, u.done);
  c.prefetched = true;
  counters_.bytes_prefetched += c.bytes;
  if (follower_.following()) opt_policy_.touch(k, u.moment);  // keyed by its coming use
}

void Runtime::evict(uint32_t k) {
  chunk::Chunk& c = at(k);
  void* buffer = c.device;
  const memory::EventPtr done = copy_out(k);
  defer_free_device(done, buffer, c.bytes, Use::kChunks);
}

// Queues chunk k's copy to a new host buffer on the D2H stream and makes the
// host its tier.  Its device buffer is the caller's to free or reuse once the
// returned event completes.
memory::EventPtr Runtime::copy_out(uint32_t k) {
  chunk::Chunk& c = at(k);
  if (c.compute_refs != 0) internal_error("evicting a chunk in use");
  if (c.opt_device != nullptr) internal_error("evicting a chunk whose optimizer state is on the device");
  if (c.gather_slot >= 0) internal_error("evicting a chunk from its gather slot");
  c.evicted = true;
  c.copy_out_order = ++copies_out_;
  memory::Stream* s = device_->d2h_stream();
  if (c.host_copy != nullptr) {
    // Clean: nothing wrote the device payload since it came from this host
    // buffer.  No copy; the device buffer is free once its uses are done.
    device_->stream_wait(s, c.ready);
    device_->stream_wait(s, c.last_use);
    memory::EventPtr done = device_->record(s);
    c.device = nullptr;
    c.host = c.host_copy;
    c.host_copy = nullptr;
    c.tier = Tier::kHost;
    c.ready = done;
    c.last_use = done;
    leave_device(k);
    ++counters_.clean_drops;
    if (timeline_) {
      const double t = device_->clock_seconds();
      timeline_->note_move(false, k, 0, t, t);
    }
    return done;
  }
  void* dst = host_->acquire(c.bytes);
  device_->stream_wait(s, c.ready);
  device_->stream_wait(s, c.last_use);
  memory::EventPtr start = timeline_ ? device_->record(s) : nullptr;
  device_->copy_async(s, dst, c.device, c.bytes, memory::CopyKind::kDeviceToHost);
  memory::EventPtr done = device_->record(s);
  if (timeline_) note_move(false, k, start, done);
  c.device = nullptr;
  c.host = dst;
  c.tier = Tier::kHost;
  c.ready = done;
  c.last_use = done;
  leave_device(k);
  counters_.bytes_device_to_host += c.bytes;
  return done;
}

// The policies' part of an eviction.
void Runtime::leave_device(uint32_t k) {
  lru_.remove(k);
  // A chunk leaving before a use that prefetch has already passed: scan from
  // that use again.
  const uint64_t next = opt_policy_.key(k);
  if (next < prefetch_frontier_) prefetch_frontier_ = next;
  opt_policy_.remove(k);
  ++counters_.evictions;
}

void Runtime::hold(uint32_t k) {
  chunk::Chunk& c = at(k);
  c.held_bytes = c.gather_slot < 0 && c.opt_device == nullptr ? c.bytes : 0;
  tier_.hold(c.held_bytes);
}

void Runtime::unhold(uint32_t k) {
  chunk::Chunk& c = at(k);
  tier_.unhold(c.held_bytes);
  c.held_bytes = 0;
}

void Runtime::mark_written(uint32_t k) {
  chunk::Chunk& c = at(k);
  if (c.host_copy == nullptr) return;
  // An H2D copy may still read it: freed once the payload it made is valid.
  defer_free_host(c.ready, c.host_copy, c.bytes);
  c.host_copy = nullptr;
}

// The chunk's payload for the engine's own host code (the CPU optimizer,
// value reads and writes of frozen parameters): a chunk on the device is
// evicted first.  On every device, the emulated and modelled ones included:
// they pose as a discrete accelerator, so that tests and the planner see the
// copies (and their bytes and waits) that a GPU needs, not shortcuts through
// memory the host happens to share with them.
chunk::Chunk& Runtime::evict_for_host_view(uint32_t k) {
  chunk::Chunk& c = at(k);
  if (c.tier == Tier::kDevice) {
    if (c.opt_device != nullptr) internal_error("host view of a chunk that stays on the device");
    evict(k);
  }
  return c;
}

void* Runtime::host_view(uint32_t k) {
  chunk::Chunk& c = evict_for_host_view(k);
  const double before = device_->clock_seconds();
  device_->synchronize(c.ready);
  device_->synchronize(c.last_use);
  counters_.wait_seconds += device_->clock_seconds() - before;
  check_ready(c.ready, "chunk payload");
  return c.tier == Tier::kDevice ? c.device : c.host;
}

void* Runtime::host_view_modelled(uint32_t k) {
  if (!options_.virtual_clock && options_.payloads) internal_error("host_view_modelled on the wall clock");
  return evict_for_host_view(k).host;
}

void Runtime::check_ready(const memory::EventPtr& ev, const char* what) const {
  if (!device_->query(ev)) internal_error(std::string(what) + " accessed before the event guarding it completed");
}

void Runtime::iteration_begin() {
  follower_.begin(options_.placement_policy == PSTAR_POLICY_OPT);
  if (follower_.following()) rekey_for_next_iteration();
}

// Placement as at the start of an iteration that follows the trace: moment
// 0, nothing prefetched yet, resident chunks keyed by their first use.
void Runtime::rekey_for_next_iteration() {
  prefetch_frontier_ = 0;
  opt_policy_.reset(2 * follower_.trace().moments() + 1);
  for (uint32_t k = 0; k < chunks_->chunk_count(); ++k) {
    if (at(k).tier != Tier::kDevice) continue;
    const uint64_t first = follower_.trace().first_use(k);
    opt_policy_.touch(k, first == placement::AccessTrace::kNever ? placement::OptPolicy::kNeverKey : first);
  }
}

void Runtime::note_access(uint32_t chunk) {
  if (follower_.following()) opt_policy_.touch(chunk, follower_.trace().next_use(follower_.moment()));
  follower_.note(chunk, tier_.bytes(Use::kNonModel) + tier_.bytes(Use::kGradients));
}

// Fetches the chunks of the next kPrefetchMoments moments ahead of their use,
// in trace order, stopping at the first that cannot be placed:
//  - into free room when it fits beside the largest transient (non-model +
//    gradient buffer) bytes the trace recorded up to that use (the window
//    budget), counting as room the chunks OPT would evict before it (those
//    used after it);
//  - otherwise in place of the resident chunk OPT would evict next (the
//    furthest next use), if that use comes after the prefetched chunk's and
//    the two are the same size: the chunk going out is copied to the host and
//    the one coming in is copied into its buffer once that copy is done,
//    both on the copy streams, without the host waiting.  Evicting exactly
//    the chunk on-demand OPT would evict when the prefetched chunk is needed,
//    for a chunk needed before it, is Cao et al.'s "do no harm" rule: the
//    bytes moved stay those of on-demand OPT, only earlier.
void Runtime::prefetch_ahead(uint64_t now) {
  const placement::AccessTrace& trace = follower_.trace();
  const uint64_t end = std::min<uint64_t>(trace.moments(), now + kPrefetchMoments);
  // Moments before prefetch_frontier_ were placed by earlier calls (an
  // eviction moves the frontier back to the evicted chunk's next use), so
  // each acquire scans about one new moment, not the whole window.
  const uint64_t begin = std::max(now, prefetch_frontier_);
  const uint64_t transient_now = tier_.bytes(Use::kNonModel) + tier_.bytes(Use::kGradients);
  uint64_t transient_peak = transient_now;
  auto movable = [&](uint32_t j) { return at(j).evictable() && !at(j).pinned_static; };
  // True if resident chunks other than `except`, each used after moment t,
  // hold `bytes`: OPT evicts those before a chunk used at t, so transient
  // growth before t can take their room and the prefetched chunk stays.
  auto covered_after = [&](uint64_t bytes, uint64_t t, int64_t except) {
    uint64_t sum = 0;
    bool ok = false;
    uint32_t unused;
    opt_policy_.victim(
        [&](uint32_t j) {
          if (opt_policy_.key(j) <= t) return true;  // nearer uses from here on: stop
          if (static_cast<int64_t>(j) != except && movable(j)) sum += at(j).bytes;
          ok = sum >= bytes;
          return ok;
        },
        &unused);
    return ok;
  };
  // Evicting for a prefetch (directly, or through transient growth while it
  // waits) is harmless only if on-demand OPT would evict at its use too: at
  // moment t the recorded transient bytes leave no room beside today's
  // chunks.  Budgets shrink as well as grow (gradient buffers and
  // activations are freed through backward), and evicting now for room that
  // is free by then moves bytes on-demand OPT does not.
  auto demand_would_evict = [&](uint64_t t, uint64_t bytes) {
    return tier_.limited() && tier_.bytes(Use::kChunks) + tier_.bytes(Use::kOptimizer) +
                                      tier_.bytes(Use::kGatherSlots) + trace.transient_at(t) + bytes >
                                  tier_.capacity();
  };
  for (uint64_t t = now; t < begin; ++t) transient_peak = std::max(transient_peak, trace.transient_at(t));
  for (uint64_t t = begin; t < end; ++t) {
    prefetch_frontier_ = t;
    transient_peak = std::max(transient_peak, trace.transient_at(t));
    const uint32_t k = trace.chunk_at(t);
    chunk::Chunk& c = at(k);
    if (c.tier == Tier::kDevice) continue;
    if (c.tier == Tier::kNotGathered) return;  // world > 1: gathered by its acquire (a collective), never ahead
    if (!uploads_.empty() && uploads_[k].dst != nullptr) continue;  // its copy follows its update
    const bool awaiting = c.awaiting_update;
    // Copies queue on the H2D stream in use order: a fetch now would go
    // ahead of the copy that follows an update of a chunk used before it.
    if (!awaiting && uploads_pending_ != 0) return;
    // In the step: its new values are not written yet.  Room for it is
    // reserved now and its copy follows its update on the update thread,
    // if there is one that has not finished it yet.
    if (awaiting && (!follower_of_updates_.can_follow || !follower_of_updates_.can_follow(k))) return;
    const uint64_t growth = transient_peak - transient_now;
    reclaim_deferred(false);
    const uint64_t free = tier_.free_bytes();
    if (c.bytes <= free) {
      const uint64_t need = c.bytes + growth;
      if (need > free && (!demand_would_evict(t, c.bytes) || !covered_after(need - free, t, -1))) return;
      if (awaiting) {
        if (!follow_update(k, t)) return;
        continue;  // counted as prefetched when it is taken (take_upload)
      }
      fetch(k);
    } else {
      // A chunk awaiting its update goes into free room only: evicting for
      // it would queue the victim's copy out long before the room is used.
      if (awaiting) return;
      // The victim on-demand OPT would take: the furthest next use among all
      // resident chunks, in use or not.  If that one is in use now (say the
      // chunk just acquired), taking the next furthest instead would evict a
      // chunk on-demand OPT keeps: stop.
      uint32_t victim;
      const bool found = opt_policy_.victim([](uint32_t) { return true; }, &victim);
      // The key of a chunk used again in this iteration is that moment; in
      // the next one, moments() + its first use; never, kNeverKey.
      if (!found || !movable(victim) || at(victim).bytes != c.bytes || opt_policy_.key(victim) <= t) return;
      if (!demand_would_evict(t, c.bytes)) return;
      if (growth > free && !covered_after(growth - free, t, victim)) return;
      void* buffer = at(victim).device;
      const memory::EventPtr out = copy_out(victim);
      copy_in(k, buffer, out);
    }
    note_prefetched(k, t);
  }
  prefetch_frontier_ = end;
}

bool Runtime::upload_ahead(uint32_t k, uint64_t reserve) {
  chunk::Chunk& c = at(k);
  if (c.tier != Tier::kHost || c.awaiting_update) return false;
  if (!uploads_.empty() && uploads_[k].dst != nullptr) return false;
  const placement::AccessTrace& trace = follower_.trace();
  const uint64_t first = trace.first_use(k);
  if (first == placement::AccessTrace::kNever) return false;
  const uint64_t transient_now = tier_.bytes(Use::kNonModel) + tier_.bytes(Use::kGradients);
  uint64_t transient_peak = transient_now;
  for (uint64_t t = 0; t <= first; ++t) transient_peak = std::max(transient_peak, trace.transient_at(t));
  reclaim_deferred(false);
  const uint64_t need = c.bytes + (transient_peak - transient_now) + reserve;
  if (need > tier_.free_bytes()) return false;
  fetch(k);
  note_prefetched(k, first);
  return true;
}

void Runtime::note_prefetched(uint32_t k, uint64_t use) {
  chunk::Chunk& c = at(k);
  c.prefetched = true;
  counters_.bytes_prefetched += c.bytes;
  // Keyed by its coming use, so that it is not the next victim.
  opt_policy_.touch(k, use);
}

void Runtime::iteration_end() { follower_.end(static_cast<uint32_t>(chunks_->chunk_count())); }

// An aborted TRAIN iteration leaves the trace as it was (TraceFollower::abort).
void Runtime::iteration_abort() {
  follower_.abort();
  prefetch_frontier_ = 0;
}

// The static policy's resident set: the longest prefix of chunks (layout
// order, which is first-use order) that fits the capacity less a reserve
// through which the other chunks stream.
void Runtime::choose_static_chunks(uint64_t largest_grad) {
  if (options_.placement_policy != PSTAR_POLICY_STATIC || !tier_.limited()) return;
  uint64_t largest_chunk = 0;
  const uint32_t n = static_cast<uint32_t>(chunks_->chunk_count());
  for (uint32_t k = 0; k < n; ++k) largest_chunk = std::max(largest_chunk, at(k).bytes);
  const uint64_t reserve = 2 * largest_chunk + 2 * largest_grad;
  uint64_t used = 0;
  for (uint32_t k = 0; k < n; ++k) {
    chunk::Chunk& c = at(k);
    if (reserve > tier_.capacity() || used + c.bytes > tier_.capacity() - reserve) break;
    used += c.bytes;
    c.pinned_static = true;
  }
}
}  // namespace pstar::placement
