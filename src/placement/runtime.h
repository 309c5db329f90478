// Runtime: the placement runtime.  It decides where each chunk's payload is
// (host memory or the device) and moves it: make room, fetch, evict, the
// copies in and out on the copy streams, prefetch along the recorded trace,
// the static policy's resident set, and the frees deferred until queued
// work is done with a buffer.  It keeps the device tier's accounting
// (memory/device_tier.h) and the timeline (placement/timeline.h).
//
// What it knows: the chunks' placement state (chunk::Chunk, through a
// ChunkTable the engine provides), the device and the host pool.  What it
// must not know: parameters, tensor states, shards, optimizer state.  The
// engine tells it what it allocates for those (as DeviceTier uses) and calls
// it at fixed points: iteration begin and end, each acquire, the step.
//
// Policies: LRU always; OPT (Belady's, keyed by next use) while a TRAIN
// iteration follows the recorded trace (placement::TraceFollower); the
// static policy pins the longest prefix of chunks that fits beside a
// streaming reserve.
//
// Threading: the engine's thread only, as the engine, with one exception:
// a chunk's copy to the device that follows its overlapped update is
// queued by the update thread (follow_update / take_upload below), into a
// buffer the engine's thread reserved and adopts afterwards.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "chunk/chunk.h"
#include "memory/device.h"
#include "memory/device_tier.h"
#include "memory/host_pool.h"
#include "placement/lru_policy.h"
#include "placement/opt_policy.h"
#include "placement/timeline.h"
#include "placement/trace_follower.h"
#include "pstar/pstar.h"

namespace pstar::placement {

// How many moments ahead of the current one the trace is scanned for chunks
// to prefetch: about three GPT layers with activation checkpointing (12
// parameters per layer).  Measured with `pstar-bench placement`: 4 or 8
// moments left 30-70% of the moved bytes on the critical path, 32 under 10%
// wherever the link has room, with the same bytes moved.
constexpr uint64_t kPrefetchMoments = 32;

// The chunks, as placement sees them (the engine's records extend
// chunk::Chunk).
class ChunkTable {
 public:
  virtual size_t chunk_count() const = 0;
  virtual chunk::Chunk& chunk_at(uint32_t k) = 0;

 protected:
  ~ChunkTable() = default;
};

struct RuntimeOptions {
  uint64_t capacity_bytes = 0;  // the placement limit (capacity less margin); 0 = unlimited
  pstar_policy placement_policy = PSTAR_POLICY_OPT;
  uint32_t warmup_iterations = 1;
  bool prefetch = true;
  bool virtual_clock = false;  // waits are read off the modelled clock
  bool payloads = true;        // false: a dry run (address space only)
  bool record_timeline = false;
};

// What placement moved and waited for since the engine was created; the
// engine reports them as pstar_stats's fields of the same names.
struct MoveCounters {
  uint64_t moves_to_device = 0;  // chunks copied to the device
  uint64_t evictions = 0;        // chunks that left the device (copied back, or dropped clean)
  uint64_t clean_drops = 0;      // of evictions, dropped: the host copy was still valid
  uint64_t bytes_host_to_device = 0;
  uint64_t bytes_device_to_host = 0;
  uint64_t bytes_prefetched = 0;         // of bytes_host_to_device, moved ahead of use
  uint64_t peak_device_bytes = 0;        // the device tier's peak (all uses)
  uint64_t peak_device_chunk_bytes = 0;  // the peak of its chunk payloads
  double wait_seconds = 0.0;             // the caller waited for copies
};

class Runtime {
 public:
  using Use = memory::DeviceTier::Use;

  Runtime(memory::Device* device, memory::HostPool* host, const RuntimeOptions& options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // At build, before any other call that names a chunk.
  void attach(ChunkTable* chunks) { chunks_ = chunks; }
  // Clean chunks (before any move): a fetched chunk keeps its host buffer
  // until its device payload may be written (mark_written), and an
  // eviction before that drops the device copy instead of copying it back.
  // The engine turns it on for one process without a host capacity: host
  // memory then holds every chunk's payload for good, as at build.
  void set_keep_clean_host_copies(bool on) { keep_clean_host_copies_ = on; }
  const MoveCounters& counters() const { return counters_; }
  // Host-to-device bytes copied by others on placement's behalf (hybrid
  // placement's lists).
  void count_host_to_device(uint64_t bytes) { counters_.bytes_host_to_device += bytes; }
  void count_device_to_host(uint64_t bytes) { counters_.bytes_device_to_host += bytes; }
  // A host buffer from the host pool (hybrid placement's lists coming back);
  // freed with defer_free_host.
  void* host_alloc(size_t bytes) { return host_->acquire(bytes); }
  // The host pool's cached buffers of exactly `bytes` go back for good
  // (memory::HostPool::trim).
  void trim_host_cache(size_t bytes) { host_->trim(bytes); }
  // Called when room is short and nothing deferred can be freed: frees
  // transient device memory the engine holds (a reduce-scatter's staging),
  // returning whether it freed any.
  void set_release_staging(std::function<bool()> f) { release_staging_ = std::move(f); }

  // The overlapped step's update thread (step::UpdateWorker), where there
  // is one.  can_follow(k): chunk k's update is in flight and not finished;
  // follow(k, f): f runs on the update thread right after that update,
  // before the engine learns that it is done (false: it will not run).
  // prefetch_ahead then reserves room for a chunk still awaiting its
  // update and has the update thread queue its copy to the device as soon
  // as the new values are written, instead of at the caller's next engine
  // call after that: an acquire that would have waited for the update and
  // then for the copy waits for the update only (pstar-bench overlap).
  struct UpdateFollower {
    std::function<bool(uint32_t)> can_follow;
    std::function<bool(uint32_t, std::function<void()>)> follow;
  };
  // `chunks`: the engine's chunk count.
  void set_update_follower(UpdateFollower f, size_t chunks) {
    follower_of_updates_ = std::move(f);
    uploads_.assign(chunks, PendingUpload{});
  }
  // Chunk k's overlapped update is over and the engine's thread took it
  // (every take of the update worker calls this, after awaiting_update
  // went): a copy the update thread queued becomes the chunk's device
  // payload, as a prefetch; a buffer reserved for a copy that was never
  // queued (the step failed at or before that chunk) is freed.
  void take_upload(uint32_t k);

  memory::DeviceTier& tier() { return tier_; }
  const memory::DeviceTier& tier() const { return tier_; }
  TraceFollower& follower() { return follower_; }
  const TraceFollower& follower() const { return follower_; }
  Timeline* timeline() const { return timeline_.get(); }

  // Room and buffers.  make_room evicts (policy order) until `bytes` fit,
  // never chunk `keep_chunk`; throws PSTAR_ERR_OUT_OF_MEMORY naming
  // `purpose` and the tier's uses when nothing more can move.
  void make_room(uint64_t bytes, int64_t keep_chunk, const std::string& purpose);
  void* device_alloc(uint64_t bytes, int64_t keep_chunk, const std::string& purpose);
  // Whether make_room(bytes, keep_chunk) would succeed: `bytes` fit once
  // every deferred free is done and every evictable resident chunk but
  // `keep_chunk` has left.  Moves nothing.  Conservative: transient
  // staging that release_staging could free counts as held.
  bool fits_after_evicting(uint64_t bytes, int64_t keep_chunk) const;
  // A transient device buffer for a collective (Use::kStaging): made room
  // for like a chunk and counted while it lives; freed at once by
  // free_staging, which the caller calls when nothing queued uses it.
  void* alloc_staging(uint64_t bytes, const std::string& purpose);
  void free_staging(void* ptr, uint64_t bytes);
  // Frees a buffer once `after` completes; a device buffer's bytes move from
  // `from` to the tier's deferred use until then.
  void defer_free_device(memory::EventPtr after, void* ptr, size_t bytes, Use from);
  void defer_free_host(memory::EventPtr after, void* ptr, size_t bytes);
  // Frees the deferred buffers whose events passed; with `wait_for_one`,
  // waits for one if none has.  Returns whether it freed any.
  bool reclaim_deferred(bool wait_for_one);
  // Waits for every deferred free (the engine's destruction).
  void drain();

  // Moves.  fetch: chunk k to the device (room made, the copy queued).
  void fetch(uint32_t k);
  // Queues chunk k's copy from the host into `dst` on the H2D stream after
  // `after` (the copy out of a previous occupant of dst, or null).
  void copy_in(uint32_t k, void* dst, const memory::EventPtr& after);
  void evict(uint32_t k);
  // Queues chunk k's copy to a new host buffer on the D2H stream and makes
  // the host its tier; its device buffer is the caller's to free or reuse
  // once the returned event completes.
  memory::EventPtr copy_out(uint32_t k);
  // The payload for host code now (a device chunk is evicted first).
  void* host_view(uint32_t k);
  // host_view for host work modelled on the virtual clock's host-work lane
  // (memory::Device::model_host_work) after the chunk's ready and last_use
  // events: a device chunk is evicted first; nothing is waited for (the
  // modelled device executes eagerly: the bytes are in place already).
  void* host_view_modelled(uint32_t k);
  // Chunk k's device payload is about to be written (a BACKWARD acquire,
  // a value written on the device, an update there): its host copy is no
  // longer the same bits, so it goes, and the next eviction copies back.
  void mark_written(uint32_t k);
  // A chunk whose payload was dropped (world > 1) leaves the policies.
  void forget(uint32_t k);
  // Chunk k is resident and was just used.
  void touch(uint32_t k) { lru_.touch(k); }
  // Chunk k's compute_refs went from 0 to 1 (hold) or from 1 to 0 (unhold):
  // its payload counts in the device tier's need (DeviceTier::need) while
  // held, unless it is counted otherwise (a gather slot, hybrid state).
  void hold(uint32_t k);
  void unhold(uint32_t k);

  // Waiting and accounting.
  void note_device_peak();
  // The caller waits on the host for `stream`, which waits for `ready`;
  // the time it takes counts as waiting.
  void host_wait(memory::Stream* stream, const memory::EventPtr& ready);
  void check_ready(const memory::EventPtr& ev, const char* what) const;
  // Timeline (when kept): a memory sample at acquire number `moment`.
  void sample_memory(uint64_t moment);

  // Trace-guided placement, at fixed points of TRAIN iterations.
  void iteration_begin();
  // After the acquire of chunk `chunk` (its use is now).
  void note_access(uint32_t chunk);
  void iteration_end();
  // An aborted TRAIN iteration leaves the trace as it was.
  void iteration_abort();
  // Placement as at the start of an iteration that follows the trace:
  // nothing prefetched yet, resident chunks keyed by their first use.
  void rekey_for_next_iteration();
  // From moment `now` of the trace (0: the next iteration's start).
  void prefetch_ahead(uint64_t now);
  // The synchronous step's fill (step/optimizer_step.cpp): chunk k, updated
  // while a chunk the next iteration needs before it is still on its way to
  // the host, goes to the device now, out of use order, into free room that
  // leaves `reserve` bytes (the room of the chunks used before it that are
  // still awaiting their update) beside the largest transient bytes the
  // trace recorded up to k's first use.  No eviction.  True if queued.
  bool upload_ahead(uint32_t k, uint64_t reserve);
  // The static policy's resident set (`largest_grad`: the largest gradient
  // buffer, part of the streaming reserve).  Does nothing for other
  // policies or an unlimited device.
  void choose_static_chunks(uint64_t largest_grad);

 private:
  // A copy to the device that follows chunk k's update (follow_update):
  // dst is reserved (counted as chunk bytes) by the engine's thread before
  // the update thread may write the rest; `queued`, `start` and `done` are
  // written by the update thread, and read by the engine's thread only
  // after it took the chunk's completion (published after them).
  struct PendingUpload {
    void* dst = nullptr;
    uint64_t moment = 0;  // the trace moment of its use, OPT's key once resident
    bool queued = false;
    memory::EventPtr start;  // timeline only
    memory::EventPtr done;
  };
  // Reserves room for chunk k, still awaiting its update, whose next use is
  // at moment t, and has the update thread queue its copy; false (nothing
  // held) when the update thread will not.
  bool follow_update(uint32_t k, uint64_t t);
  // copy_in's bookkeeping once chunk k's copy into dst is queued: the
  // payload is on the device from `done` on.
  void become_resident(uint32_t k, void* dst, const memory::EventPtr& done);
  struct DeferredFree {
    memory::EventPtr after;
    void* ptr;
    size_t bytes;
    chunk::Tier tier;
  };
  chunk::Chunk& at(uint32_t k) const { return chunks_->chunk_at(k); }
  void note_move(bool to_device, uint32_t chunk, const memory::EventPtr& start, const memory::EventPtr& done);
  // host_view's and host_view_modelled's first part: chunk k on the host
  // (evicted if it is on the device; never one whose state stays there).
  chunk::Chunk& evict_for_host_view(uint32_t k);
  // Chunk k's copy to the device, just queued ahead of its use at trace
  // moment `use`: counted as prefetched and keyed by that use.
  void note_prefetched(uint32_t k, uint64_t use);

  const RuntimeOptions options_;
  uint64_t copies_out_ = 0;  // copy_out calls so far (chunk::Chunk::copy_out_order)
  memory::Device* device_;   // not owned
  memory::HostPool* host_;   // not owned
  void leave_device(uint32_t k);

  bool keep_clean_host_copies_ = false;
  MoveCounters counters_;
  ChunkTable* chunks_ = nullptr;
  std::function<bool()> release_staging_;
  UpdateFollower follower_of_updates_;
  std::vector<PendingUpload> uploads_;  // per chunk; empty without an update follower
  size_t uploads_pending_ = 0;          // of uploads_, reserved and not yet taken
  memory::DeviceTier tier_;
  std::vector<DeferredFree> deferred_;
  LruPolicy lru_;
  OptPolicy opt_policy_;  // OPT: keyed by next use; valid while following
  TraceFollower follower_;
  uint64_t prefetch_frontier_ = 0;      // first moment prefetch_ahead() has not placed
  std::unique_ptr<Timeline> timeline_;  // options.record_timeline only
};

}  // namespace pstar::placement
