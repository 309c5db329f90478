// Timeline: what the placement runtime did, kept for pstar_trace_export
// (options.record_timeline) and written as Chrome-trace JSON, which
// chrome://tracing and Perfetto open.
//
// Two kinds of record: each chunk move between the tiers (start and end on
// the engine's clock, as spans on a "host to device" and a "device to host"
// track; a clean chunk dropped from the device is a span of 0 bytes and no
// length on the second: it left, nothing was copied), and after each acquire a sample of the device tier's uses and of
// the host pool (as counters).  The samples are also written as a plain
// table ("pstarMoments": one row per acquire) for scripts such as
// bench/plot_trace.py, which viewers ignore.
//
// It knows nothing of chunks beyond their index and size: the engine hands
// it numbers.  Memory grows by one record per move and per acquire, which is
// why it exists only when the option asks for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pstar::placement {

class Timeline {
 public:
  struct MemorySample {
    uint64_t moment;                                              // acquires since the engine was created
    double time;                                                  // seconds on the engine's clock
    uint64_t chunks, grads, nonmodel, deferred, host, optimizer;  // bytes
  };

  // `end` NaN: the completion time is unknown (the wall clock records
  // issue times only).
  void note_move(bool to_device, uint32_t chunk, uint64_t bytes, double start, double end);
  void sample(const MemorySample& s) { samples_.push_back(s); }

  // Writes the JSON file; `clock` says "virtual" or "wall".  Throws
  // pstar::Error (PSTAR_ERR_IO) when the file cannot be written.
  void write(const std::string& path, const char* clock) const;

 private:
  struct MoveRecord {
    bool to_device;
    uint32_t chunk;
    uint64_t bytes;
    double start, end;
  };
  std::vector<MoveRecord> moves_;
  std::vector<MemorySample> samples_;
};

}  // namespace pstar::placement
