// Sequential bandwidth of the disk under a directory, measured through the
// NVMe tier's store (src/memory/nvme_store.h) the way the engine will use
// it: large aligned requests, several in flight, XXH3 on each write and read.
//
// The store uses O_DIRECT where the filesystem accepts it, so the numbers
// are the disk's; where it falls back to buffered I/O they are mostly the
// page cache's, and `direct` says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pstar::bench {

struct DiskBandwidth {
  double write_gbps = 0;       // sequential writes, 1e9 bytes per second
  double read_gbps = 0;        // sequential reads of the same data, verified
  uint64_t bytes = 0;          // bytes moved each way (whole requests)
  bool direct = false;         // false: buffered I/O, i.e. the page cache was measured
  uint32_t inflight_peak = 0;  // most requests in flight at once
};

// Writes then reads about `total_bytes` (rounded up to whole requests of
// `io_bytes`, each padded to NvmeStore::kAlignBytes) in a fresh data file
// under `dir`, with `queue_depth` requests in flight; removes the file.
// Throws pstar::Error as NvmeStore does.
DiskBandwidth measure_disk_bandwidth(const std::string& dir, uint64_t total_bytes, size_t io_bytes,
                                     uint32_t queue_depth);

}  // namespace pstar::bench
