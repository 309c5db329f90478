#include "memory/emulated_device.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>
#include <string>

#include "memory/host_kernels.h"
#include "util/error.h"

namespace pstar::memory {
namespace {

// Allocation alignment: the chunk layout aligns every parameter to 256 bytes.
constexpr size_t kAlignBytes = 256;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// done_ is atomic so that queries (on every acquire) take no lock; the
// mutex and condition variable serve waiting only.  complete() stores under
// the mutex so that a waiter cannot miss the notification.
class EmulatedEvent final : public Event {
 public:
  void complete() {
    std::lock_guard<std::mutex> lock(mu_);
    done_.store(true, std::memory_order_release);
    cv_.notify_all();
  }
  void wait() {
    if (done()) return;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire); });
  }
  bool done() const { return done_.load(std::memory_order_acquire); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
};

// The smallest page the kernel maps (x86-64, arm64 with 4 KiB pages); a
// larger page is touched more than once, which is harmless.
constexpr size_t kHostPageBytes = 4096;

size_t rounded_size(size_t bytes) {
  const size_t rounded = (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  return rounded == 0 ? kAlignBytes : rounded;
}

void* aligned_allocate(size_t bytes) {
  void* p = std::aligned_alloc(kAlignBytes, rounded_size(bytes));
  if (p == nullptr) {
    throw Error(PSTAR_ERR_OUT_OF_MEMORY, "host allocation of " + std::to_string(bytes) + " bytes failed");
  }
  return p;
}

}  // namespace

// A FIFO of work items run in order by one worker thread.
class EmulatedDevice::Queue final : public Stream {
 public:
  Queue(bool strict, uint64_t seed) : strict_(strict), rng_(seed) {
    worker_ = std::thread([this] { run(); });
  }
  ~Queue() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    worker_.join();
  }

  void push(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mu_);
    // The delay is drawn at enqueue time so the sequence depends on the
    // seed and the queue order only, not on thread timing.
    const int delay = strict_ ? static_cast<int>(rng_() % (kStrictMaxDelayMicros + 1)) : 0;
    items_.push_back(Item{std::move(work), delay});
    pending_.fetch_add(1, std::memory_order_relaxed);
    cv_.notify_all();
  }

  // True when every item pushed so far has finished.  Lock-free: it runs
  // several times per acquire.  An idle queue stays idle until a thread
  // pushes again; a thread that pushed sees its own item pending until it
  // has run (the update thread's copies to the device share the H2D queue
  // with the engine's thread: each thread's record() covers at least its
  // own items).
  bool idle() const { return pending_.load(std::memory_order_acquire) == 0; }

  // Runs `work` on the calling thread when the queue is idle (nothing
  // queued, nothing running) and returns true; false, running nothing,
  // otherwise.  Items pushed meanwhile by another thread wait for it, so
  // the stream's order holds.  For work the caller waits for at once
  // anyway: the round trip through the worker is all it would add.
  template <typename Work>
  bool run_if_idle(Work&& work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (strict_ || inline_ || !items_.empty() || pending_.load(std::memory_order_acquire) != 0) return false;
      inline_ = true;
      pending_.fetch_add(1, std::memory_order_relaxed);
    }
    work();
    std::lock_guard<std::mutex> lock(mu_);
    inline_ = false;
    pending_.fetch_sub(1, std::memory_order_release);
    cv_.notify_all();
    return true;
  }

 private:
  struct Item {
    std::function<void()> work;
    int delay_micros;
  };

  void run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return (stopping_ || !items_.empty()) && !inline_; });
        if (items_.empty()) return;  // stopping, and drained
        item = std::move(items_.front());
        items_.pop_front();
      }
      if (item.delay_micros > 0) std::this_thread::sleep_for(std::chrono::microseconds(item.delay_micros));
      item.work();
      pending_.fetch_sub(1, std::memory_order_release);  // publishes the item's effects
    }
  }

  bool strict_;
  std::mt19937_64 rng_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  std::atomic<uint64_t> pending_{0};  // pushed and not yet finished
  bool stopping_ = false;
  bool inline_ = false;  // run_if_idle's work is running on its caller's thread
  std::thread worker_;
};

EmulatedDevice::EmulatedDevice(bool strict, uint64_t seed)
    : strict_(strict),
      caching_(!strict && !kAddressSanitizer),
      adam_isa_(optim::adam_default_isa()),
      compute_(std::make_unique<Queue>(strict, seed * 3 + 1)),
      h2d_(std::make_unique<Queue>(strict, seed * 3 + 2)),
      d2h_(std::make_unique<Queue>(strict, seed * 3 + 3)) {}

EmulatedDevice::~EmulatedDevice() {
  // Queues drain their remaining work as they are destroyed.
  h2d_.reset();
  d2h_.reset();
  compute_.reset();
  for (auto& [size, blocks] : cache_) {
    for (void* p : blocks) std::free(p);
  }
}

void* EmulatedDevice::allocate(size_t bytes) {
  if (caching_) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(rounded_size(bytes));
    if (it != cache_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= it->first;
      return p;
    }
  }
  void* p = aligned_allocate(bytes);
  if (strict_) {
    std::memset(p, kPoisonByte, bytes);
    try {
      std::lock_guard<std::mutex> lock(allocations_mu_);
      allocations_[reinterpret_cast<uintptr_t>(p)] = bytes;
    } catch (...) {
      std::free(p);
      throw;
    }
  }
  return p;
}

void EmulatedDevice::deallocate(void* ptr, size_t bytes) {
  if (ptr != nullptr && strict_) {
    std::lock_guard<std::mutex> lock(allocations_mu_);
    const auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    // The cache (non-strict) reuses a buffer by the size its free names:
    // strict mode checks that the size is the allocation's.
    if (it == allocations_.end() || it->second != bytes) {
      internal_error("emulated device: freeing " + std::to_string(bytes) + " bytes that are not one allocation");
    }
    std::memset(ptr, kPoisonByte, bytes);
    allocations_.erase(it);
  }
  if (ptr != nullptr && caching_) {
    const size_t size = rounded_size(bytes);
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cached_bytes_ + size <= kEmulatedCacheBytes) {
      try {
        cache_[size].push_back(ptr);
        cached_bytes_ += size;
        return;
      } catch (const std::bad_alloc&) {
        // no room to remember it: freed below
      }
    }
  }
  std::free(ptr);
}

void EmulatedDevice::check_caller_buffer(const void* ptr, size_t bytes, pstar_mem_space space, const char* what) const {
  if (!strict_ || bytes == 0) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t hi = bytes > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + bytes;
  bool inside = false, overlaps = false;
  {
    std::lock_guard<std::mutex> lock(allocations_mu_);
    auto next = allocations_.upper_bound(lo);  // the first allocation beginning after lo
    if (next != allocations_.begin()) {
      const auto& [base, size] = *std::prev(next);
      inside = hi <= base + size;
      overlaps = lo < base + size;
    }
    if (next != allocations_.end() && next->first < hi) overlaps = true, inside = false;
  }
  char where[64];
  std::snprintf(where, sizeof where, "%zu bytes at %p", bytes, ptr);
  if (space == PSTAR_MEM_DEVICE) {
    require(inside, PSTAR_ERR_INVALID_ARGUMENT, [&] {
      return std::string(what) + ": the buffer is said to be device memory (PSTAR_MEM_DEVICE), but its " + where +
             (overlaps ? " run past the end of" : " are not inside") +
             " a buffer of this emulated device (strict mode checks it: device memory is what the device handed "
             "out, through pstar_param_acquire or pstar_grad_slot_acquire; pass host memory as PSTAR_MEM_HOST)";
    });
  } else {
    require(!overlaps, PSTAR_ERR_INVALID_ARGUMENT, [&] {
      return std::string(what) + ": the buffer is said to be host memory (PSTAR_MEM_HOST), but its " + where +
             " overlap a buffer of this emulated device (strict mode checks it; on CUDA that would be device "
             "memory: pass it as PSTAR_MEM_DEVICE)";
    });
  }
}

// Host ("pinned") memory is resident from its allocation, as cudaHostAlloc's
// page-locked memory is: every page is touched here, on the allocating
// thread.  Left to the C library, a buffer's pages are mapped at their
// first write, wherever that happens: in pstar-bench overlap a speculative
// update's fresh result lists took 12288 page faults (about 10 us each,
// 130-180 ms) inside one chunk's update, which then ran 20x its usual time
// on the update thread while the step waited for it.
void* EmulatedDevice::allocate_host(size_t bytes) {
  void* p = aligned_allocate(bytes);
  volatile char* page = static_cast<char*>(p);
  for (size_t off = 0; off < bytes; off += kHostPageBytes) page[off] = 0;
  return p;
}

void EmulatedDevice::deallocate_host(void* ptr, size_t) { std::free(ptr); }

Stream* EmulatedDevice::compute_stream() { return compute_.get(); }
Stream* EmulatedDevice::h2d_stream() { return h2d_.get(); }
Stream* EmulatedDevice::d2h_stream() { return d2h_.get(); }

Stream* EmulatedDevice::caller_stream(void* handle) {
  if (handle == nullptr || handle == compute_.get()) return compute_.get();
  throw Error(PSTAR_ERR_INVALID_ARGUMENT,
              "stream handle is not this engine's compute stream (use NULL or pstar_engine_compute_stream)");
}

void* EmulatedDevice::compute_stream_handle() { return compute_.get(); }

EmulatedDevice::Queue* EmulatedDevice::queue_of(Stream* stream) {
  // Every Stream this device sees comes from caller_stream() or its own
  // accessors (the engine never mixes devices), so no dynamic_cast on the
  // acquire path.
  if (stream != compute_.get() && stream != h2d_.get() && stream != d2h_.get()) {
    internal_error("stream of another device");
  }
  return static_cast<Queue*>(stream);
}

void EmulatedDevice::enqueue(Stream* stream, std::function<void()> work) { queue_of(stream)->push(std::move(work)); }

void EmulatedDevice::copy_async(Stream* stream, void* dst, const void* src, size_t bytes, CopyKind) {
  // Zero bytes touch no memory, and their pointers may be NULL (an empty
  // parameter's buffers), which memcpy does not allow.
  if (bytes == 0) return;
  if (!strict_) {
    enqueue(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
    return;
  }
  // Strict: the destination is undefined from the moment the copy starts on
  // its stream (not when it is queued: earlier work on this stream, or that
  // it waits for, may still read the old content, e.g. a chunk copied out of
  // the buffer this copy fills).  Poison, then a seeded pause in which a
  // reader that did not wait for the copy's event sees NaNs, then the data.
  enqueue(stream, [dst, bytes] { std::memset(dst, kPoisonByte, bytes); });
  enqueue(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
}

void EmulatedDevice::memset_async(Stream* stream, void* dst, int value, size_t bytes) {
  // Strict: poisoned when the memset starts on its stream, as a copy's
  // destination (earlier work on the stream may still read the old content,
  // e.g. the optimizer update reading a gradient list cleared after it).
  if (bytes == 0) return;  // as in copy_async
  if (strict_) enqueue(stream, [dst, bytes] { std::memset(dst, kPoisonByte, bytes); });
  enqueue(stream, [dst, value, bytes] { std::memset(dst, value, bytes); });
}

EventPtr EmulatedDevice::record(Stream* stream) {
  // On an idle queue the event would complete at once: skip the round trip
  // through the worker and return the null event, which counts as complete
  // and costs no reference counting (acquire/release on resident data).
  if (queue_of(stream)->idle()) return EventPtr();
  auto ev = std::make_shared<EmulatedEvent>();
  enqueue(stream, [ev] { ev->complete(); });
  return ev;
}

void EmulatedDevice::stream_wait(Stream* stream, const EventPtr& event) {
  if (!event || static_cast<EmulatedEvent*>(event.get())->done()) return;
  auto ev = std::static_pointer_cast<EmulatedEvent>(event);
  enqueue(stream, [ev] { ev->wait(); });
}

void EmulatedDevice::synchronize(const EventPtr& event) {
  if (!event) return;
  static_cast<EmulatedEvent*>(event.get())->wait();
}

void EmulatedDevice::synchronize(Stream* stream) {
  if (queue_of(stream)->idle()) return;
  synchronize(record(stream));
}

bool EmulatedDevice::query(const EventPtr& event) {
  if (!event) return true;
  return static_cast<EmulatedEvent*>(event.get())->done();
}

// The caller waits for an accumulation at once (pstar_grad_write returns
// once its source may be reused, and the caller's compute is host code):
// on an idle stream it runs on the calling thread, without the round trip
// through the worker (about 50 us a call here, most of a small gradient's
// write).  Strict mode always queues, so its delays still reorder threads.
void EmulatedDevice::grad_accumulate(Stream* stream, float* acc, const void* src, pstar_dtype src_dtype,
                                     pstar_mem_space, size_t n, bool onto_zero) {
  auto work = [=] { host_grad_accumulate(acc, src, src_dtype, n, onto_zero); };
  if (queue_of(stream)->run_if_idle(work)) return;
  enqueue(stream, work);
}

void EmulatedDevice::grad_finalize(Stream* stream, const float* acc, void* slot, pstar_dtype dtype, size_t n,
                                   double* sumsq, int* nonfinite) {
  if (strict_) std::memset(slot, kPoisonByte, n * (dtype == PSTAR_DTYPE_F32 ? 4u : 2u));
  enqueue(stream, [=] { host_grad_finalize(acc, slot, dtype, n, sumsq, nonfinite); });
}

void EmulatedDevice::grad_pack(Stream* stream, void* packed, const void* src, pstar_dtype dtype, pstar_mem_space,
                               size_t n, double* sumsq, int* nonfinite) {
  if (strict_) std::memset(packed, kPoisonByte, n * dtype_size(dtype));
  auto work = [=] { host_grad_pack(packed, src, dtype, n, sumsq, nonfinite); };
  if (queue_of(stream)->run_if_idle(work)) return;
  enqueue(stream, work);
}

void EmulatedDevice::grad_unpack(Stream* stream, float* acc, pstar_dtype dtype, size_t n) {
  enqueue(stream, [=] { host_grad_unpack(acc, dtype, n); });
}

void EmulatedDevice::adam_update_states_async(Stream* stream, optim::StateFormat f, const optim::AdamStepConstants& c,
                                              const optim::AdamStateRange& r) {
  const optim::AdamIsa isa = adam_isa_;
  enqueue(stream, [isa, f, c, r] { optim::adam_update_states(isa, f, c, r); });
}

void EmulatedDevice::adam_update_async(Stream* stream, const optim::AdamStepConstants& c, const optim::AdamRange& r) {
  const optim::AdamIsa isa = adam_isa_;
  enqueue(stream, [isa, c, r] { optim::adam_update(isa, c, r); });
}

}  // namespace pstar::memory
