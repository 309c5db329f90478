#include "distributed/gather_ahead.h"

namespace pstar::distributed {

void GatherAhead::reserve_slots(memory::Device* device, memory::DeviceTier* tier, uint64_t slot_bytes) {
  slot_bytes_ = slot_bytes;
  try {
    for (uint32_t i = 0; i < depth_; ++i) {
      void* buffer = device->allocate(slot_bytes_);
      slots_.push_back(Slot{buffer, -1, nullptr});
      tier->add(memory::DeviceTier::Use::kGatherSlots, slot_bytes_);
    }
  } catch (...) {
    release_slots(device, tier);
    throw;
  }
}

void GatherAhead::release_slots(memory::Device* device, memory::DeviceTier* tier) {
  for (Slot& s : slots_) {
    device->synchronize(s.free_after);
    device->deallocate(s.buffer, slot_bytes_);
    tier->remove(memory::DeviceTier::Use::kGatherSlots, slot_bytes_);
  }
  slots_.clear();
}

void GatherAhead::iteration_begin(bool enabled) {
  next_ = 0;
  follower_.begin(enabled);
  if (follower_.recording()) recording_.clear();
  if (follower_.following()) issue(false);
}

void GatherAhead::issue_at_acquire(uint32_t chunk) {
  issue(true);
  if (follower_.following() && !actions_.gathered(chunk)) follower_.diverge("a gather the schedule does not have");
}

void GatherAhead::after_acquire(uint32_t chunk, bool gathered_now) {
  if (follower_.recording() && gathered_now) recording_.push_back(Entry{follower_.moment(), chunk});
  follower_.note(chunk, 0);
}

void GatherAhead::after_drop() {
  if (follower_.following()) issue(false);
}

void GatherAhead::iteration_end(uint32_t chunk_count) {
  if (follower_.end(chunk_count)) schedule_ = std::move(recording_);
  recording_.clear();
}

void GatherAhead::issue(bool at_acquire) {
  const uint64_t now = follower_.moment();
  size_t due_end = next_;  // entries [.., due_end) are due
  while (due_end < schedule_.size() &&
         (schedule_[due_end].moment < now || (at_acquire && schedule_[due_end].moment == now))) {
    ++due_end;
  }
  while (follower_.following() && next_ < schedule_.size()) {
    const Entry& e = schedule_[next_];
    const bool due = next_ < due_end;
    if (due && e.moment < now) {
      follower_.diverge("a scheduled gather was not issued by its acquire");
      return;
    }
    if (!due && next_ >= due_end + depth_) return;
    if (actions_.gathered(e.chunk)) {
      // Its previous gather is not dropped yet: wait for the drop (a later
      // call), unless the acquire that needs it is now.
      if (due) follower_.diverge("the scheduled chunk is still gathered at its acquire");
      return;
    }
    int64_t free_slot = -1;
    if (actions_.bytes(e.chunk) <= slot_bytes_) {
      for (size_t i = 0; i < slots_.size() && free_slot < 0; ++i) {
        if (slots_[i].chunk < 0) free_slot = static_cast<int64_t>(i);
      }
    }
    if (free_slot < 0) {
      if (!due) return;  // no slot before its acquire: gathered there
      actions_.gather_here(e.chunk);
      ++on_demand_;
    } else {
      actions_.gather_into_slot(e.chunk, static_cast<uint32_t>(free_slot));
      ++ahead_;
    }
    ++next_;
  }
}

}  // namespace pstar::distributed
