#include "memory/host_pool.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace pstar::memory {

HostPool::HostPool(Device* device, uint64_t capacity_bytes) : device_(device), capacity_(capacity_bytes) {}

HostPool::~HostPool() {
  for (auto& [size, list] : free_) {
    for (void* p : list) device_->deallocate_host(p, size);
  }
}

bool HostPool::can_acquire(size_t bytes) const {
  if (capacity_ == 0) return true;
  auto it = free_.find(bytes);
  if (it != free_.end() && !it->second.empty()) return true;
  return in_use_ + bytes <= capacity_;
}

void HostPool::drop_cached(size_t keep_size) {
  for (auto it = free_.begin(); it != free_.end() && capacity_ != 0;) {
    if (it->first == keep_size) {
      ++it;
      continue;
    }
    while (!it->second.empty() && held_ + keep_size > capacity_) {
      device_->deallocate_host(it->second.back(), it->first);
      it->second.pop_back();
      held_ -= it->first;
    }
    it = it->second.empty() ? free_.erase(it) : std::next(it);
  }
}

void HostPool::trim(size_t bytes) {
  auto it = free_.find(bytes);
  if (it == free_.end()) return;
  for (void* p : it->second) {
    device_->deallocate_host(p, bytes);
    held_ -= bytes;
  }
  free_.erase(it);
}

void* HostPool::acquire(size_t bytes) {
  auto it = free_.find(bytes);
  if (it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    in_use_ += bytes;
    return p;
  }
  if (capacity_ != 0 && held_ + bytes > capacity_) drop_cached(bytes);
  if (capacity_ != 0 && held_ + bytes > capacity_) {
    throw Error(PSTAR_ERR_OUT_OF_MEMORY, "host tier: request of " + std::to_string(bytes) +
                                             " bytes does not fit; capacity " + std::to_string(capacity_) +
                                             ", in use " + std::to_string(in_use_) + ", free " +
                                             std::to_string(capacity_ - std::min<uint64_t>(capacity_, held_)));
  }
  void* p = device_->allocate_host(bytes);
  held_ += bytes;
  in_use_ += bytes;
  peak_ = std::max(peak_, held_);
  return p;
}

void HostPool::release(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  in_use_ -= bytes;
  free_[bytes].push_back(ptr);
}

}  // namespace pstar::memory
