// HostPool: the host tier's chunk buffers.
//
// Chunk moves never allocate: a buffer freed by a move goes back to a free
// list keyed by its size (almost all buffers are chunk-sized, so reuse is
// exact), and the next move of a chunk of that size takes it.  Memory is
// obtained from the device's host allocator (pinned memory on CUDA).
//
// Capacity accounting counts bytes held by the pool, in use or cached, since
// both are real memory.  When a new buffer does not fit, cached buffers of
// other sizes are released first; only then does the request fail with
// PSTAR_ERR_OUT_OF_MEMORY.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "memory/device.h"

namespace pstar::memory {

class HostPool {
 public:
  // capacity_bytes: 0 = unlimited.
  HostPool(Device* device, uint64_t capacity_bytes);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A buffer of exactly `bytes` (256-byte aligned); throws on OOM.
  void* acquire(size_t bytes);
  void release(void* ptr, size_t bytes);

  // True if `bytes` more could be obtained now (reusing or dropping cache).
  bool can_acquire(size_t bytes) const;
  // Gives the cached buffers of exactly `bytes` back to the device's host
  // allocator: buffers of a size nothing will ask for again soon (a
  // sharded rank's compute shards that hybrid placement moved to the
  // device), which would otherwise stay held with no capacity to press.
  void trim(size_t bytes);

  uint64_t capacity() const { return capacity_; }
  uint64_t held_bytes() const { return held_; }      // in use + cached
  uint64_t in_use_bytes() const { return in_use_; }  // handed out
  uint64_t peak_bytes() const { return peak_; }      // peak of held

 private:
  void drop_cached(size_t keep_size);

  Device* device_;
  uint64_t capacity_;
  uint64_t held_ = 0;  // invariant: held_ == in_use_ + bytes in free_
  uint64_t in_use_ = 0;
  uint64_t peak_ = 0;  // invariant: peak_ >= held_
  std::map<size_t, std::vector<void*>> free_;
};

}  // namespace pstar::memory
