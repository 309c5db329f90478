// EmulatedDevice: host memory posing as an accelerator.
//
// Each stream is a FIFO queue run by its own worker thread; copies are
// memcpy on that thread; an event completes when its stream's worker reaches
// it.  The caller's compute runs on its own host thread, so acquire waits on
// the host for the data (the compute stream still exists, so ordering through
// it is exercised like on CUDA).
//
// Strict mode, for tests, makes ordering bugs visible on a machine without a
// GPU: a copy or memset poison-fills its destination (0xFF bytes: NaN in
// every float format) when it starts on its stream, a gradient finalize when
// it is queued; every queue item is preceded by a seeded random delay; and the
// engine checks with query() that the event guarding data has completed
// before it touches the data.  It also keeps a map of its allocations, so
// that a caller's buffer said to be device memory must lie inside one of
// them and one said to be host memory must not overlap one
// (check_caller_buffer).
//
// Host allocations (allocate_host: the host pool's buffers) have every page
// touched when they are made, as page-locked memory from cudaHostAlloc is
// resident from its allocation: a first write elsewhere (the update
// thread's) would otherwise pay the page faults there.
//
// Device allocations are cached, as a GPU's caching allocator does (and
// for the same reason): a freed buffer goes to a free list keyed by its
// rounded size and the next allocation of that size takes it.  Without
// the cache, every gradient accumulator and chunk buffer is a fresh mmap of
// zero pages, and the kernel's page clearing was most of the emulated
// backward's CPU time (62% of perf samples in pstar-bench overlap).  The
// cache holds at most kEmulatedCacheBytes; a buffer freed beyond it goes
// back to the C library.  Strict mode and AddressSanitizer builds do not
// cache: every free is a real free, so a use after it is caught.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "memory/device.h"

namespace pstar::memory {

// Byte used to poison copy destinations in strict mode.
constexpr int kPoisonByte = 0xFF;
// Upper bound of the random delay before each queue item in strict mode.
constexpr int kStrictMaxDelayMicros = 200;
// Bytes of freed device buffers the emulated device keeps for reuse.
constexpr uint64_t kEmulatedCacheBytes = uint64_t{4} << 30;  // 4 GiB

class EmulatedDevice final : public Device {
 public:
  EmulatedDevice(bool strict, uint64_t seed);
  ~EmulatedDevice() override;

  pstar_device_kind kind() const override { return PSTAR_DEVICE_EMULATED; }
  std::string name() const override { return strict_ ? "emulated device (strict)" : "emulated device"; }
  bool host_accessible() const override { return true; }
  bool strict() const { return strict_; }
  void check_caller_buffer(const void* ptr, size_t bytes, pstar_mem_space space, const char* what) const override;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  void* allocate_host(size_t bytes) override;
  void deallocate_host(void* ptr, size_t bytes) override;

  Stream* compute_stream() override;
  Stream* h2d_stream() override;
  Stream* d2h_stream() override;
  Stream* caller_stream(void* handle) override;
  void* compute_stream_handle() override;

  void copy_async(Stream* stream, void* dst, const void* src, size_t bytes, CopyKind kind) override;
  void memset_async(Stream* stream, void* dst, int value, size_t bytes) override;
  EventPtr record(Stream* stream) override;
  void stream_wait(Stream* stream, const EventPtr& event) override;
  void synchronize(const EventPtr& event) override;
  void synchronize(Stream* stream) override;
  bool query(const EventPtr& event) override;

  void grad_accumulate(Stream* stream, float* acc, const void* src, pstar_dtype src_dtype, pstar_mem_space space,
                       size_t n, bool onto_zero) override;
  void grad_finalize(Stream* stream, const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq,
                     int* nonfinite) override;
  // Packing: the host kernels, on the calling thread when the stream is
  // idle (the caller waits for it at once, as for grad_accumulate).
  bool packs_gradients() const override { return true; }
  void grad_pack(Stream* stream, void* packed, const void* src, pstar_dtype dtype, pstar_mem_space space, size_t n,
                 double* sumsq, int* nonfinite) override;
  void grad_unpack(Stream* stream, float* acc, pstar_dtype dtype, size_t n) override;
  // The CPU kernel (optim::adam_update with the default instruction set) on
  // the stream's worker thread.
  void adam_update_async(Stream* stream, const optim::AdamStepConstants& c, const optim::AdamRange& r) override;
  void adam_update_states_async(Stream* stream, optim::StateFormat f, const optim::AdamStepConstants& c,
                                const optim::AdamStateRange& r) override;

  class Queue;

 private:
  Queue* queue_of(Stream* stream);
  void enqueue(Stream* stream, std::function<void()> work);

  bool strict_;
  // Strict mode: live allocations, address -> bytes.
  mutable std::mutex allocations_mu_;
  std::map<uintptr_t, size_t> allocations_;
  // The allocation cache (see the top of this file): free buffers by
  // rounded size; cached_bytes_ is their sum, at most kEmulatedCacheBytes.
  const bool caching_;
  std::mutex cache_mu_;
  std::map<size_t, std::vector<void*>> cache_;
  uint64_t cached_bytes_ = 0;
  optim::AdamIsa adam_isa_;
  std::unique_ptr<Queue> compute_;
  std::unique_ptr<Queue> h2d_;
  std::unique_ptr<Queue> d2h_;
};

}  // namespace pstar::memory
