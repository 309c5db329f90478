#include "memory/device_tier.h"

#include <algorithm>
#include <limits>

#include "util/error.h"

namespace pstar::memory {

namespace {
const char* const kUseNames[DeviceTier::kUses] = {"chunks",          "gradient buffers",   "buffers being freed",
                                                  "optimizer state", "gather-ahead slots", "collective staging",
                                                  "non-model"};
}

uint64_t DeviceTier::free_bytes() const {
  if (!limited()) return std::numeric_limits<uint64_t>::max();
  return used_ >= capacity_ ? 0 : capacity_ - used_;
}

bool DeviceTier::fits(uint64_t bytes) const { return !limited() || (used_ <= capacity_ && bytes <= capacity_ - used_); }

void DeviceTier::add(Use u, uint64_t bytes) {
  bytes_[index(u)] += bytes;
  used_ += bytes;
  check();
}

void DeviceTier::remove(Use u, uint64_t bytes) {
  if (bytes > bytes_[index(u)]) {
    internal_error(std::string("device tier: removing ") + std::to_string(bytes) + " bytes of " + kUseNames[index(u)] +
                   " that holds " + std::to_string(bytes_[index(u)]));
  }
  bytes_[index(u)] -= bytes;
  used_ -= bytes;
  check();
}

void DeviceTier::move(Use from, Use to, uint64_t bytes) {
  if (bytes > bytes_[index(from)]) {
    internal_error(std::string("device tier: moving ") + std::to_string(bytes) + " bytes out of " +
                   kUseNames[index(from)] + " that holds " + std::to_string(bytes_[index(from)]));
  }
  bytes_[index(from)] -= bytes;
  bytes_[index(to)] += bytes;
  check();
}

void DeviceTier::set_nonmodel(uint64_t bytes) {
  uint64_t& n = bytes_[index(Use::kNonModel)];
  used_ = used_ - n + bytes;
  n = bytes;
  check();
}

void DeviceTier::hold(uint64_t bytes) {
  held_ += bytes;
  check();
}

void DeviceTier::unhold(uint64_t bytes) {
  if (bytes > held_) {
    internal_error("device tier: releasing " + std::to_string(bytes) + " held chunk bytes of " + std::to_string(held_));
  }
  held_ -= bytes;
  check();
}

uint64_t DeviceTier::need() const {
  return held_ + bytes(Use::kGradients) + bytes(Use::kGatherSlots) + bytes(Use::kStaging) + bytes(Use::kNonModel);
}

std::string DeviceTier::describe() const {
  std::string s;
  for (int i = 0; i < kUses; ++i) {
    if (i == index(Use::kDeferred) || i == index(Use::kStaging)) {
      if (bytes_[i] == 0) continue;  // transient: named only when present
    }
    if (!s.empty()) s += ", ";
    s += std::string(kUseNames[i]) + " " + std::to_string(bytes_[i]) + " bytes";
  }
  return s;
}

void DeviceTier::check() {
  uint64_t sum = 0;
  for (uint64_t b : bytes_) sum += b;
  if (sum != used_) {
    internal_error("device tier: " + std::to_string(used_) + " bytes used but its uses add up to " +
                   std::to_string(sum) + " (" + describe() + ")");
  }
  need_peak_ = std::max(need_peak_, need());
  resident_peak_ = std::max(resident_peak_, resident());
}

}  // namespace pstar::memory
