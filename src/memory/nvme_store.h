// NvmeStore: the NVMe tier's file store.
//
// What: fixed-size byte regions ("slots", one per fp32 optimizer-state chunk
// list: masters, m, v) in one data file that the store creates under a
// directory (pstar-nvme-XXXXXX, unique like mkstemp) and removes when it is
// destroyed.  Slot k starts at a kAlignBytes-aligned offset and spans
// padded(bytes) bytes.  Reads and writes are asynchronous: read_async and
// write_async return a Ticket, done() polls it and wait() retires it.
//
// Why this shape: optimizer state moves between host and disk in whole
// slots, large and aligned, so one file and offset arithmetic are enough,
// and O_DIRECT keeps those moves out of the page cache, which would
// otherwise compete with the host tier for the same memory.
//
// O_DIRECT: used where the filesystem accepts it (probed at construction
// with one aligned write and read; tmpfs on old kernels refuses it), else
// buffered I/O; direct() says which, and one log line says why.  O_DIRECT
// needs aligned buffers, offsets and lengths, so in BOTH modes (code tested
// in one mode must be right in the other) every caller buffer must be
// kAlignBytes-aligned, else Error(PSTAR_ERR_INVALID_ARGUMENT), and must have
// room for padded(bytes): the I/O moves the padded length, so a read
// overwrites the buffer up to padded(bytes) and a write stores whatever the
// buffer holds up to there.  allocate_aligned() makes such buffers.
//
// How: one I/O thread owns a libuv loop.  Submissions queue in order and are
// handed to the loop (uv_async_t), which issues uv_fs_read/uv_fs_write on
// libuv's thread pool, at most max_inflight at once; short transfers are
// continued and EINTR/EAGAIN retried until the padded length is done.
// Requests on one slot where one of them is a write run in submission order
// (a queued request waits at the head of the queue for them), so a read
// after a write sees that write.
//
// Integrity: each write records the XXH3-64 of its `bytes` bytes, hashed
// from the caller's buffer at submission (the buffer must not change until
// wait); each read verifies it after completion, and a mismatch fails with
// PSTAR_ERR_IO "corrupted: slot S of FILE ...".  A failed write leaves its
// slot without valid data: reads fail with PSTAR_ERR_INVALID_STATE until the
// slot is written again.  wait() and check_file() also notice a data file
// removed from its directory (PSTAR_ERR_IO "... removed ...").
//
// Thread safety: one caller thread submits and waits (the engine's); the I/O
// thread completes requests, and one mutex guards what the two share.  Other
// threads may submit too, but a ticket must be waited for by one thread, and
// wait_all(), which retires every ticket, must not overlap another wait.  A
// request's buffer belongs to the store until its ticket is retired, and
// every ticket must be retired (the store keeps each result until then).
//
// Limitation: libuv's thread pool is process-wide (4 threads unless
// UV_THREADPOOL_SIZE says otherwise), so requests beyond it queue in libuv.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

namespace pstar::memory {

class NvmeStore {
 public:
  // O_DIRECT's alignment for buffers, offsets and lengths (the logical block
  // size of common NVMe drives and the page size).
  static constexpr size_t kAlignBytes = 4096;
  static constexpr uint32_t kDefaultMaxInflight = 8;

  // Identifies one request until wait() retires it; never 0.
  using Ticket = uint64_t;

  enum class FaultKind {
    kWriteNoSpace,  // a write fails with ENOSPC (disk full)
    kReadIo,        // a read fails with EIO
    kWriteCorrupt,  // a write succeeds, then its slot's first byte is flipped
  };

  struct Stats {
    uint64_t bytes_read = 0;     // file bytes moved by successful reads (padded)
    uint64_t bytes_written = 0;  // file bytes moved by successful writes (padded)
    uint64_t reads = 0;          // successful reads
    uint64_t writes = 0;         // successful writes
    uint32_t inflight_peak = 0;  // most requests handed to libuv at once (<= max_inflight)
    double busy_seconds = 0;     // wall time with at least one request not yet finished
  };

  struct FreeAligned {
    void operator()(void* p) const { std::free(p); }
  };
  using AlignedBuffer = std::unique_ptr<uint8_t[], FreeAligned>;

  // `dir` must be an existing directory (else PSTAR_ERR_INVALID_ARGUMENT;
  // PSTAR_ERR_IO if the file cannot be created there).  try_direct = false
  // forces buffered I/O.
  explicit NvmeStore(const std::string& dir, uint32_t max_inflight = kDefaultMaxInflight, bool try_direct = true);
  // Waits for every request, then closes and removes the data file.
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  static constexpr uint64_t padded(uint64_t bytes) { return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }
  // A zeroed kAlignBytes-aligned buffer of padded(bytes) bytes; throws
  // PSTAR_ERR_OUT_OF_MEMORY.
  static AlignedBuffer allocate_aligned(uint64_t bytes);

  bool direct() const;
  const std::string& path() const;
  uint32_t max_inflight() const;

  // A new slot of `bytes` (> 0) bytes, at any time; extends the file
  // (PSTAR_ERR_IO "disk full" when the filesystem has no room).
  uint32_t add_slot(uint64_t bytes);
  uint32_t slot_count() const;
  uint64_t slot_bytes(uint32_t slot) const;

  // 0 < bytes <= slot_bytes(slot).  A read must ask for the length of the
  // slot's last write; reading a slot never written is
  // PSTAR_ERR_INVALID_STATE.
  Ticket read_async(uint32_t slot, void* dst, uint64_t bytes);
  Ticket write_async(uint32_t slot, const void* src, uint64_t bytes);
  bool done(Ticket ticket) const;
  // Blocks until the request finished and retires it; throws its failure
  // (PSTAR_ERR_IO naming the file, the slot, the offset and the system
  // error), then checks that the data file is still linked.
  void wait(Ticket ticket);
  // Waits for and retires every request; throws the first failure in
  // submission order once all have finished.
  void wait_all();
  // PSTAR_ERR_IO if the data file has been removed from its directory.
  void check_file() const;

  // Test hook: once `after_ops` more requests of kind's direction (reads or
  // writes) have been handed to libuv, the next one fails as `kind` says;
  // fires once.
  void inject_fault(FaultKind kind, uint64_t after_ops);
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pstar::memory
