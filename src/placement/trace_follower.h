// TraceFollower: the record / follow / diverge automaton over the chunk
// access sequence of TRAIN iterations.  Two users share it: trace-guided
// placement (OPT eviction and prefetch follow the recorded trace) and the
// gather-ahead schedule of a sharded engine (all-gathers issued ahead along
// the recorded acquires).
//
// An iteration either records (warm-up, or no trace yet), or follows the
// trace: each acquire is checked against the trace's chunk at that moment,
// and the first mismatch (another chunk, more acquires, fewer at the end, or
// a reason the user finds itself) diverges.  What a divergence does depends
// on the user, because what the trace is for differs:
//  - Retrace::kFromDivergence (placement): the iteration records from there
//    on, keeping the matched prefix, and its recording becomes the trace at
//    its end.  Placement falls back to LRU for the rest of the iteration.
//  - Retrace::kNextIteration (gather schedule): the trace is dropped and the
//    next TRAIN iteration records anew from its start.  The schedule pairs
//    each moment with the gathers it caused, which a part-way recording
//    could not know (gathers issued ahead happened before the divergence).
//
// Each decision depends only on the sequence of calls, never on memory, so
// that ranks making the same calls decide the same (the gather schedule's
// collective order depends on it).
#pragma once

#include <cstdint>
#include <string>

#include "placement/access_trace.h"

namespace pstar::placement {

class TraceFollower {
 public:
  enum class Retrace { kFromDivergence, kNextIteration };

  // `warmup_iterations` (>= 1): TRAIN iterations recorded before the first
  // that follows.  `label` prefixes the log line of a divergence.
  TraceFollower(uint32_t warmup_iterations, Retrace retrace, std::string label)
      : warmup_left_(warmup_iterations), retrace_(retrace), label_(std::move(label)) {}

  // A TRAIN iteration begins; `enabled` false: it neither records nor
  // follows (the feature is off for it).
  void begin(bool enabled);
  // Before the acquire of `chunk`: when following, checks it against the
  // trace and diverges on a mismatch.
  void check(uint32_t chunk) {  // inline: on every acquire
    if (following_ && (moment_ >= trace_.moments() || trace_.chunk_at(moment_) != chunk)) diverge_at_check();
  }
  // After the acquire of `chunk` (`transient_bytes`: the device bytes other
  // than chunks at this moment, kept with the recording): records it when
  // recording, and advances the moment.
  void note(uint32_t chunk, uint64_t transient_bytes) {  // inline: on every acquire
    if (recording_now_) recording_.record(chunk, transient_bytes);
    ++moment_;
  }
  // The iteration ends: fewer acquires than the trace diverges; a completed
  // recording past warm-up becomes the trace over `chunk_count` chunks.
  // Returns whether it did (the user adopts what it recorded beside it).
  bool end(uint32_t chunk_count);
  // The iteration is abandoned: the trace stays as it was, a partial
  // recording is dropped (warm-up still needs as many iterations), and a
  // divergence in it is not counted.
  void abort();
  // Leaves the trace for this iteration (see Retrace).
  void diverge(const char* why);
  // Drops the trace: the next iteration records anew (e.g. when another
  // rank does).
  void invalidate() { ready_ = false; }

  bool following() const { return following_; }
  bool recording() const { return recording_now_; }
  bool ready() const { return ready_; }
  // Acquires so far in this iteration.
  uint64_t moment() const { return moment_; }
  const AccessTrace& trace() const { return trace_; }
  // Divergences so far (TRAIN iterations that left the trace).
  uint64_t divergences() const { return divergences_; }

 private:
  void diverge_at_check();

  AccessTrace trace_;      // valid once ready_
  AccessTrace recording_;  // the iteration being recorded
  bool ready_ = false;
  bool recording_now_ = false;  // this iteration is recorded
  bool following_ = false;      // this iteration matches trace_ so far
  uint32_t warmup_left_;        // iterations to record before following
  uint64_t moment_ = 0;
  uint64_t divergences_ = 0;
  uint64_t divergences_at_begin_ = 0;  // restored by abort()
  Retrace retrace_;
  std::string label_;
};

}  // namespace pstar::placement
