// GatherAhead: a sharded engine's schedule of all-gathers issued ahead of
// their acquires (pstar_x_engine_set_gather_ahead; docs/distributed.md), and
// the chunk-sized device slots the gathered chunks land in.
//
// Every rank records one TRAIN iteration's acquires (the chunk of each
// "moment") and the gathers they caused.  A later TRAIN iteration whose
// acquires repeat them issues the scheduled gathers in schedule order:
// entry j once fewer than depth() entries separate it from the last one due,
// its chunk is not gathered (its previous gather dropped) and a slot is
// free.  Those conditions, and the points where they are evaluated
// (iteration begin, each acquire, each release that drops a chunk), follow
// from the calls the ranks make and the agreed depth, never from capacity,
// eviction or placement policy: so the ranks issue the same collectives in
// the same order.  Leaving the schedule (another chunk, an entry whose
// moment passed unissued, a gather it does not have) is a function of the
// calls too; the iteration stops issuing, and the next TRAIN iteration
// records anew (placement::TraceFollower, Retrace::kNextIteration).
//
// This class decides; the engine acts, through the Actions it is given (it
// owns the chunks, the communicator and the collective queue).  It knows
// nothing of chunk payloads or shards.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "memory/device.h"
#include "memory/device_tier.h"
#include "placement/trace_follower.h"

namespace pstar::distributed {

class GatherAhead {
 public:
  struct Slot {
    void* buffer = nullptr;       // slot_bytes() of device memory
    int64_t chunk = -1;           // the chunk in it, -1: free
    memory::EventPtr free_after;  // queued work that used its last chunk
  };
  // What the engine does for the schedule.
  struct Actions {
    std::function<bool(uint32_t chunk)> gathered;                         // the chunk is gathered now
    std::function<uint64_t(uint32_t chunk)> bytes;                        // its gathered payload's bytes
    std::function<void(uint32_t chunk)> gather_here;                      // gathers it now, at its acquire
    std::function<void(uint32_t chunk, uint32_t slot)> gather_into_slot;  // starts its gather into a slot
  };

  explicit GatherAhead(Actions actions) : actions_(std::move(actions)) {}
  GatherAhead(const GatherAhead&) = delete;
  GatherAhead& operator=(const GatherAhead&) = delete;

  void set_depth(uint32_t chunks) { depth_ = chunks; }
  uint32_t depth() const { return depth_; }

  // At build: depth() slots of `slot_bytes` each, counted in `tier` as
  // gather slots.  Throws (having released what it took) when the device
  // refuses.  release_slots waits for each slot's last use.
  void reserve_slots(memory::Device* device, memory::DeviceTier* tier, uint64_t slot_bytes);
  void release_slots(memory::Device* device, memory::DeviceTier* tier);
  uint64_t slot_bytes() const { return slot_bytes_; }
  Slot& slot(size_t i) { return slots_[i]; }
  size_t slot_count() const { return slots_.size(); }

  // A TRAIN iteration: `enabled` false when the engine gathers at acquires
  // only (no collective queue).
  void iteration_begin(bool enabled);
  // Before the acquire of `chunk`: may issue it and later gathers.
  void at_acquire(uint32_t chunk) {  // inline: on every acquire, mostly not following
    follower_.check(chunk);
    if (follower_.following()) issue_at_acquire(chunk);
  }
  // After a successful acquire of `chunk`; `gathered_now`: it gathered it.
  void after_acquire(uint32_t chunk, bool gathered_now);
  // After a release that dropped a chunk (its slot, or its turn, is free).
  void after_drop();
  void iteration_end(uint32_t chunk_count);

  // Whether a complete schedule is recorded; invalidate() drops it (another
  // rank records anew, agreed in the step's exchange).
  bool ready() const { return follower_.ready(); }
  void invalidate() { follower_.invalidate(); }

  // Counters for pstar_x_gather_stats.
  void note_on_demand() { ++on_demand_; }
  void note_wait(bool waited, double seconds) {
    if (waited) ++waited_;
    wait_seconds_ += seconds;
  }
  uint64_t gathers_ahead() const { return ahead_; }
  uint64_t gathers_on_demand() const { return on_demand_; }
  uint64_t gathers_waited() const { return waited_; }
  uint64_t fallbacks() const { return follower_.divergences(); }
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Entry {
    uint64_t moment;  // the acquire that needed it
    uint32_t chunk;
  };
  // Issues the entries due, and those within depth_ of the last one due.
  // `at_acquire`: called by the acquire of the current moment, whose
  // entries are due now (else only earlier ones are, and none should be
  // left).
  void issue(bool at_acquire);
  void issue_at_acquire(uint32_t chunk);

  Actions actions_;
  uint32_t depth_ = 0;
  uint64_t slot_bytes_ = 0;
  std::vector<Slot> slots_;  // depth_ of them once reserved
  placement::TraceFollower follower_{1, placement::TraceFollower::Retrace::kNextIteration, "gather ahead"};
  std::vector<Entry> schedule_;   // valid once follower_.ready()
  std::vector<Entry> recording_;  // while follower_.recording()
  size_t next_ = 0;               // first entry of schedule_ not issued this iteration
  uint64_t ahead_ = 0, on_demand_ = 0, waited_ = 0;
  double wait_seconds_ = 0.0;
};

}  // namespace pstar::distributed
