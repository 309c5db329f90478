// The one accelerator interface of the runtime (DESIGN.md section 1).
//
// The placement runtime and the engine talk to an accelerator only through
// this interface: allocation, ordered queues (streams), asynchronous copies
// between host and device on a stream, events (record, wait, query), the
// few device-side operations the engine needs on gradients, and the
// optimizer update of chunks whose optimizer state lives on the device
// (hybrid placement).  Two
// implementations exist: EmulatedDevice (host memory posing as a device,
// always built) and CudaDevice (built where nvcc exists).
//
// Semantics shared by both implementations:
//  - Work queued on one stream runs in queue order; streams are independent
//    unless ordered by stream_wait().
//  - An event recorded on a stream completes when every item queued on that
//    stream before it has completed.  A default-constructed (null) EventPtr
//    counts as complete.
//  - The source and destination of a queued copy must stay allocated and
//    unmodified until an event recorded after the copy completes.
//  - Threads: the engine's thread makes every call, except that the
//    overlapped step's update thread queues an updated chunk's copy to the
//    device (copy_async and record on the H2D stream) while the engine's
//    thread goes on using the same streams.  Both implementations take
//    those calls from any thread; a thread calls use_on_this_thread() once
//    before its first.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "optim/adam_kernel.h"
#include "optim/adam_states.h"
#include "pstar/pstar.h"

namespace pstar::memory {

// Opaque stream of a device; owned by the device that created it.
class Stream {
 public:
  virtual ~Stream() = default;
};

// Opaque event.  Shared so that a chunk, a deferred free and a stream wait
// can all refer to the same completion.
class Event {
 public:
  virtual ~Event() = default;
};
using EventPtr = std::shared_ptr<Event>;

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class Device {
 public:
  virtual ~Device() = default;

  virtual pstar_device_kind kind() const = 0;
  virtual std::string name() const = 0;
  // True when device pointers may be dereferenced by host code (the emulated
  // device).  Host access still has to wait for the guarding event.
  virtual bool host_accessible() const = 0;
  // Makes this device the current one of the calling thread (CUDA: the
  // runtime's current device is per thread).  Nothing to do elsewhere.
  virtual void use_on_this_thread() {}

  // Raw allocation of `bytes`, aligned to at least 256 bytes.  Capacity is
  // enforced by the caller's tier accounting, not here; throws
  // Error(PSTAR_ERR_OUT_OF_MEMORY or PSTAR_ERR_DEVICE) when the allocator
  // itself fails.  deallocate() must only be called once no queued work uses
  // the memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;

  // Host memory suited to copies with this device (pinned on CUDA).
  virtual void* allocate_host(size_t bytes) = 0;
  virtual void deallocate_host(void* ptr, size_t bytes) = 0;

  // Streams owned by the device: one the caller's compute is ordered on, and
  // the copy streams the runtime moves chunks on.
  virtual Stream* compute_stream() = 0;
  virtual Stream* h2d_stream() = 0;
  virtual Stream* d2h_stream() = 0;
  // Maps the caller's stream handle (NULL = the default) to a stream.
  virtual Stream* caller_stream(void* handle) = 0;
  // The handle the caller should use for compute_stream() (NULL on CUDA).
  virtual void* compute_stream_handle() = 0;

  virtual void copy_async(Stream* stream, void* dst, const void* src, size_t bytes, CopyKind kind) = 0;
  virtual void memset_async(Stream* stream, void* dst, int value, size_t bytes) = 0;
  virtual EventPtr record(Stream* stream) = 0;
  // Work queued on `stream` after this call waits for `event`.
  virtual void stream_wait(Stream* stream, const EventPtr& event) = 0;
  // Host waits.
  virtual void synchronize(const EventPtr& event) = 0;
  virtual void synchronize(Stream* stream) = 0;
  virtual bool query(const EventPtr& event) = 0;
  // A copy between host and device memory for host code that needs it done
  // now (values, checkpoints, collectives' staging): queued on the compute
  // stream, so behind the caller's work, then waited for.
  void copy_sync(void* dst, const void* src, size_t bytes, CopyKind kind) {
    Stream* s = compute_stream();
    copy_async(s, dst, src, bytes, kind);
    synchronize(s);
  }

  // ---- clock -------------------------------------------------------------

  // Seconds since the device was created on its clock: wall time, or the
  // modelled time of a virtual-clock device.
  virtual double clock_seconds() const;
  // Virtual clock only: the caller computes for `seconds`; throws
  // Error(PSTAR_ERR_UNSUPPORTED) on a wall clock.
  virtual void advance_clock(double seconds);
  // Virtual clock only: host work of `seconds` (an overlapped CPU update,
  // modelled) on the device's host-work lane, which runs one item at a
  // time beside the caller: it starts at the latest of now, the lane's
  // previous item and the events in `after`; the returned event completes
  // when it ends.  The caller's clock does not move.  Throws
  // Error(PSTAR_ERR_UNSUPPORTED) on a wall clock.
  virtual EventPtr model_host_work(double seconds, const std::vector<EventPtr>& after);
  // When `event` completes on the clock, if the device knows it ahead (the
  // virtual clock does); NaN otherwise.
  virtual double completion_time(const EventPtr& event) const;
  // The modelled rate of copies of `kind` in bytes per second (a virtual
  // clock's); 0 where the device does not know it ahead.
  virtual double modelled_copy_bytes_per_s(CopyKind kind) const {
    (void)kind;
    return 0.0;
  }
  // False for a dry run: allocations are address space only, copies and
  // gradient operations touch no memory, and no caller may dereference a
  // pointer this device or its host allocator returns.
  virtual bool has_payloads() const { return true; }

  // What a device knows of a caller's buffer said to be in `space` (`bytes`
  // at `ptr`): throws Error(PSTAR_ERR_INVALID_ARGUMENT), the message
  // beginning with `what`, when it knows the buffer is elsewhere.  The
  // default knows nothing (the emulated device outside strict mode, the
  // modelled device, CUDA).
  virtual void check_caller_buffer(const void* ptr, size_t bytes, pstar_mem_space space, const char* what) const;

  // ---- device-side gradient operations, queued on `stream` ---------------

  // acc[i] += src[i] (converted from src_dtype), src in `space`.  With
  // onto_zero, acc holds no sum yet and is not read: acc[i] = +0 + src[i],
  // the bits of a memset to zero followed by the addition, in one pass.
  virtual void grad_accumulate(Stream* stream, float* acc, const void* src, pstar_dtype src_dtype,
                               pstar_mem_space space, size_t n, bool onto_zero) = 0;

  // Writes acc rounded to `dtype` into slot[0..n), then computes over the
  // rounded values the squared sum in fp64, in the order host_kernels.h
  // fixes (blocks of kNormBlockElems in block order, kNormLanes lanes and a
  // tree within a block), and whether any value is not
  // finite.  Results are written to *sumsq and *nonfinite (host memory)
  // once `stream` reaches this point; read them after synchronizing.
  virtual void grad_finalize(Stream* stream, const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq,
                             int* nonfinite) = 0;

  // Whether the device implements grad_pack and grad_unpack (the
  // emulated device; elsewhere a gradient is always summed in fp32 first).
  virtual bool packs_gradients() const { return false; }
  // The finalize of a sum with one contribution, from it directly
  // (memory/host_kernels.h, host_grad_pack): packed[0..n) = src rounded
  // to `dtype` through +0 + src[i], and the squared sum and flag of the
  // rounded values, the bits grad_accumulate onto zero and grad_finalize
  // give.  src is in `dtype`, in `space`; the caller may reuse it once
  // `stream` reaches this point.
  virtual void grad_pack(Stream* stream, void* packed, const void* src, pstar_dtype dtype, pstar_mem_space space,
                         size_t n, double* sumsq, int* nonfinite);
  // A packed sum (n values of `dtype` in acc's first bytes) back to its
  // fp32 sum in place: acc[i] = +0 + packed[i].
  virtual void grad_unpack(Stream* stream, float* acc, pstar_dtype dtype, size_t n);

  // ---- device-side optimizer update, queued on `stream` ------------------

  // The fused Adam update of range `r` (optim/adam_kernel.h): every pointer
  // of `r` is device memory.  Every implementation runs the same
  // per-element code as the CPU paths (adam_element and the conversions of
  // util/dtype.h), so the result is bit-identical to optim::adam_update on
  // the host.  `c` and `r` are copied: they need not outlive the call.
  virtual void adam_update_async(Stream* stream, const optim::AdamStepConstants& c, const optim::AdamRange& r) = 0;
  // The same with Adam's moments in state format `f` (optim/adam_states.h;
  // the range starts on an int8 block boundary): bit-identical to
  // optim::adam_update_states on the host.
  virtual void adam_update_states_async(Stream* stream, optim::StateFormat f, const optim::AdamStepConstants& c,
                                        const optim::AdamStateRange& r) = 0;

 private:
  const std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
};

// Elements per fp64 partial of the gradient norm (independent of threads,
// tiers and arrival order).
constexpr size_t kNormBlockElems = 4096;
// Lanes of a block's partial: value j of a block goes to lane j % kNormLanes,
// and the lanes are added as a halving tree (memory/host_kernels.h).  The
// CUDA finalize kernel runs one thread per lane, so the host and the device
// give the same bits.
constexpr size_t kNormLanes = 256;

}  // namespace pstar::memory
