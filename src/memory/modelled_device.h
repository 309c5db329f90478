// ModelledDevice: the emulated accelerator on a virtual clock, with or
// without payloads (DESIGN.md section 1, "Virtual clock" and "Dry-run mode").
//
// Time is modelled, not measured, so that overlap and waiting figures are
// the same on every machine and every run:
//  - The host (the caller, and the engine on its thread) is at `now`.  Its
//    compute advances `now` by what the caller says it took
//    (advance_clock); waiting for an event advances `now` to the event's
//    completion time.
//  - Each stream is at the time its last queued item completes.  An item
//    starts when it is queued (now), when its stream is free and after the
//    events the stream was told to wait for; a copy lasts bytes / bandwidth
//    of its direction; memsets and gradient operations take no time (the
//    caller's compute time covers them), and neither does the optimizer
//    update of chunks whose optimizer state is on the device: the model has
//    no kernel times, so it counts that update as free (the planner's step
//    time adds the optimizer separately).
//  - An event completes at its stream's time when it was recorded; query()
//    is "completion time <= now".
//  - Host work that runs beside the caller (an overlapped step's CPU
//    updates, modelled: model_host_work) goes on a lane of its own, one
//    item at a time, each for the seconds it is given.
//
// Execution is eager: every queued item runs at once on the calling thread,
// in queue order.  That order respects every dependency the engine can
// express (an event is recorded before anything waits for it), so payloads
// end up exactly as on a device that ran the items at their modelled times.
//
// Without payloads (dry run), allocate() and allocate_host() hand out
// addresses from a range that no process maps (from 2^55 up: non-canonical
// on x86-64 with 4-level paging, above every user mapping Linux makes
// without an explicit hint elsewhere): distinct, aligned, and faulting if
// anything dereferences them; copies and gradient operations change only the
// clock.  Nothing is reserved, so a dry run of a model of any size costs only
// its bookkeeping.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "memory/device.h"

namespace pstar::memory {

// Alignment of the addresses of a dry run, bytes (as real allocations).
constexpr size_t kModelledAlignBytes = 256;
// First address of a dry run's allocations, and the size of their range
// (16 PiB: the host and accelerator data of any model a planner may ask for).
constexpr uint64_t kDryRunBaseAddress = uint64_t{1} << 55;
constexpr uint64_t kDryRunAddressSpaceBytes = uint64_t{1} << 54;

class ModelledDevice final : public Device {
 public:
  // Bandwidths in bytes per second (> 0).
  ModelledDevice(bool payloads, double h2d_bytes_per_s, double d2h_bytes_per_s);
  ~ModelledDevice() override;

  pstar_device_kind kind() const override { return PSTAR_DEVICE_EMULATED; }
  std::string name() const override;
  bool host_accessible() const override { return true; }
  bool has_payloads() const override { return payloads_; }

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

  double clock_seconds() const override { return now_; }
  void advance_clock(double seconds) override;
  double completion_time(const EventPtr& event) const override;
  double modelled_copy_bytes_per_s(CopyKind kind) const override {
    return kind == CopyKind::kHostToDevice   ? h2d_bytes_per_s_
           : kind == CopyKind::kDeviceToHost ? d2h_bytes_per_s_
                                             : 0.0;
  }
  EventPtr model_host_work(double seconds, const std::vector<EventPtr>& after) override;

  void grad_accumulate(Stream* stream, float* acc, const void* src, pstar_dtype src_dtype, pstar_mem_space space,
                       size_t n, bool onto_zero) override;
  void grad_finalize(Stream* stream, const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq,
                     int* nonfinite) override;
  // Runs the CPU kernel at once when the device has payloads, nothing in a
  // dry run; zero modelled time (see above).
  void adam_update_async(Stream* stream, const optim::AdamStepConstants& c, const optim::AdamRange& r) override;
  void adam_update_states_async(Stream* stream, optim::StateFormat f, const optim::AdamStepConstants& c,
                                const optim::AdamStateRange& r) override;

  class ModelledStream;

 private:
  ModelledStream* stream_of(Stream* stream);
  // Start of an item queued now on `s` (the stream is busy until then).
  double start_on(ModelledStream* s) const;
  void* dry_allocate(size_t bytes);
  void dry_deallocate(void* ptr, size_t bytes);

  bool payloads_;
  optim::AdamIsa adam_isa_;
  double h2d_bytes_per_s_;
  double d2h_bytes_per_s_;
  double now_ = 0.0;  // the host's time; invariant: never decreases
  // When the host-work lane's last item ends (model_host_work); never
  // decreases.
  double host_lane_until_ = 0.0;
  std::unique_ptr<ModelledStream> compute_;
  std::unique_ptr<ModelledStream> h2d_;
  std::unique_ptr<ModelledStream> d2h_;
  // Dry run: the bump pointer over the range, and freed blocks by size.
  uint64_t dry_used_ = 0;
  std::map<size_t, std::vector<void*>> dry_free_;
};

}  // namespace pstar::memory
