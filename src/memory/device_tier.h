// DeviceTier: what the accelerator's memory holds, by use, against the
// placement capacity.
//
// The engine allocates device memory itself (memory::Device) and tells this
// class what each allocation is for; placement asks it whether a request
// fits.  Keeping the uses apart is what lets an out-of-memory error say
// where the bytes went, lets the timeline plot them, and lets the planner's
// predictions be checked against a run, use by use.
//
// Invariant, checked after every change (a failure is an internal error, not
// a user error): used() == the sum of bytes(u) over every Use.  Every change
// is one call, so no caller can update one counter and forget the total.
// Bytes only leave a use they are in: removing more than a use holds is an
// internal error too.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace pstar::memory {

class DeviceTier {
 public:
  enum class Use : int {
    kChunks,       // chunk payloads resident on the device (not in a gather slot)
    kGradients,    // fp32 gradient accumulation buffers of parameters in backward
    kDeferred,     // buffers freed by the engine, still read or written by queued work
    kOptimizer,    // hybrid placement: optimizer state held on the device for good
    kGatherSlots,  // gather-ahead slots (each holds one gathered chunk), held from build
    kStaging,      // transient collective buffers (NCCL's reduce-scatter staging, scratch)
    kNonModel,     // what the caller reported with pstar_nonmodel_report
  };
  static constexpr int kUses = 7;

  // capacity_bytes: the placement limit (the option's capacity less its
  // margin); 0 = unlimited.
  explicit DeviceTier(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  uint64_t capacity() const { return capacity_; }
  bool limited() const { return capacity_ != 0; }
  uint64_t used() const { return used_; }
  uint64_t bytes(Use u) const { return bytes_[index(u)]; }
  // Bytes still free (UINT64_MAX when unlimited; 0 when over capacity).
  uint64_t free_bytes() const;
  // Whether `bytes` more fit now.
  bool fits(uint64_t bytes) const;
  bool over_capacity() const { return limited() && used_ > capacity_; }

  void add(Use u, uint64_t bytes);
  void remove(Use u, uint64_t bytes);
  // Bytes that change use without being freed (a freed buffer still in use
  // by queued work becomes kDeferred).
  void move(Use from, Use to, uint64_t bytes);
  // The caller's non-model bytes are a level, not a delta.
  void set_nonmodel(uint64_t bytes);

  // Chunk payload bytes the caller holds (acquired, not yet released): a
  // part of kChunks (not counted again in used()) that must be resident at
  // this moment whatever placement caches.
  void hold(uint64_t bytes);
  void unhold(uint64_t bytes);
  uint64_t held() const { return held_; }
  // What the device must hold at this moment whatever placement caches or
  // places: held chunks, gradient buffers, gather slots, collective staging
  // and non-model bytes.  Hybrid placement sizes its margin from the peak of
  // this since its last decision (placement/hybrid.h), not from what a
  // chunk cache left free.
  uint64_t need() const;
  uint64_t need_peak() const { return need_peak_; }
  // What the device holds beside placed state (kOptimizer) and deferred
  // frees: the need and the chunks resident without being held (a chunk
  // cache; with sharding, gathered chunks kept between uses), at its peak
  // since the last reset.
  uint64_t resident() const { return used_ - bytes(Use::kOptimizer) - bytes(Use::kDeferred); }
  uint64_t resident_peak() const { return resident_peak_; }
  // Both peaks start again from now.
  void reset_need_peak() {
    need_peak_ = need();
    resident_peak_ = resident();
  }

  // "chunks N bytes, gradient buffers N bytes, ..." for error messages.
  std::string describe() const;

 private:
  static int index(Use u) { return static_cast<int>(u); }
  void check();  // also keeps need_peak_ and resident_peak_

  uint64_t capacity_;
  uint64_t used_ = 0;                    // invariant: sum of bytes_
  std::array<uint64_t, kUses> bytes_{};  // per Use
  uint64_t held_ = 0;                    // held chunks' payload bytes (Runtime::hold)
  uint64_t need_peak_ = 0;               // the peak of need() since reset_need_peak()
  uint64_t resident_peak_ = 0;           // the peak of resident() since reset_need_peak()
};

}  // namespace pstar::memory
