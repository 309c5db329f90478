// NvmeTier: the third tier of the optimizer state (experimental API
// pstar_x_engine_set_nvme; docs/nvme.md).  It owns the data file
// (NvmeStore), the staging buffers taken from the host pool, the slot of
// each chunk whose fp32 master, Adam m and v live on the drive, and the
// failure that stops training until a checkpoint is loaded.
//
// Placement (place): every trainable chunk's three fp32 lists, in layout
// order, go to host memory while they fit the host pool (less the staging
// buffers), else to the drive: back to back in consecutive slots of the
// data file, 4 MiB each (kPieceBytes), so that one chunk's move keeps
// several requests in flight.
//
// The step (update_chunks) streams the chunks on the drive through a ring
// of S staging buffers: chunk j is read into buffer j % S; the reads of
// chunks j+1 .. j+S-2 and the write-back of chunk j-1 are in flight while
// chunk j is updated; before chunk j+S-1 is read into the buffer of chunk
// j-1, that write-back is waited for.  So the step approaches the drive's
// bound when the update is faster than the I/O, and the update's bound
// otherwise.
//
// Host code outside the step (values, state, checkpoints, a skipped step's
// restore) reaches such a chunk's lists through access(), which stages one
// chunk at a time into the access buffer and writes it back when it
// changed, before another chunk is staged or at flush_access().
//
// Failure: an I/O error inside a step leaves some chunks updated and some
// not, so the tier records it (failed()) and the engine refuses iterations
// and steps until a checkpoint load has rewritten every state (no A/B
// slots: a slot is overwritten in place; begin_rewrite/end_rewrite).  An
// error outside a step (reading values or state) changes nothing but is
// recorded the same way, since the drive can no longer be trusted to hold
// the state.
//
// What it must not know: the engine, its chunk states, parameters or
// iterations.  It sees chunks as indices with a number of elements per
// list and the bytes of a moment list of so many elements (given at place:
// Adam's moments may be stored in fewer bytes than fp32), and tells the engine where a drive chunk's lists
// are through the PointLists callback given at open (the staging buffer
// while staged, null otherwise); the engine's per-chunk pointers are its
// own.  Dependencies point one way: engine -> NvmeTier -> NvmeStore,
// HostPool, Device.
//
// Threading: the engine's thread (NvmeStore's I/O thread aside), except
// that an overlapped step's stream_chunks() runs on the update thread while
// the engine's thread waits for it before touching the tier (see
// stream_chunks); failed() may be read from either.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pstar/pstar.h"

namespace pstar::memory {

class Device;
class HostPool;
class NvmeStore;

class NvmeTier {
 public:
  // Chunk `chunk`'s three lists now lie at master, exp_avg, exp_avg_sq
  // (all null: not staged).
  using PointLists = std::function<void(uint32_t chunk, float* master, float* exp_avg, float* exp_avg_sq)>;

  NvmeTier();
  ~NvmeTier();
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  // set_nvme, in two parts so that the caller may add its own checks in
  // between: validate() refuses a second tier, a build without NVMe support
  // and bad options (a dry run, payloads false, needs no directory);
  // open() takes the options (defaults filled in) and creates the data file
  // (none in a dry run), so that a directory that cannot be used fails here
  // and not at build.  `device` (the dry run's clock) and `host` (the
  // staging buffers and host-resident lists) must outlive the tier's use.
  void validate(const pstar_x_nvme_options& options, bool payloads) const;
  void open(const pstar_x_nvme_options& options, bool payloads, Device* device, HostPool* host, PointLists point_lists);
  bool requested() const { return requested_; }

  // At build: fp32_elems[k] is the element count of each of chunk k's three
  // lists (0: frozen, no lists), largest_elems the largest of them, and
  // moment_bytes(n) the bytes of one moment list of n elements (4n for
  // fp32 moments), master_bytes(n) those of the master list (null: 4n,
  // fp32 masters; 2n for bf16 masters).  Lists that fit in host
  // memory are acquired from the host pool, zero-filled (with payloads),
  // and handed to `host_lists`; the others get slots holding zeros.  On an
  // error the caller releases what `host_lists` got, and calls release().
  // Without a tier, nothing.
  using MomentBytes = std::function<uint64_t(uint64_t elems)>;
  void place(const std::vector<uint64_t>& fp32_elems, uint64_t largest_elems, const MomentBytes& moment_bytes,
             const PointLists& host_lists, const MomentBytes& master_bytes = nullptr);
  // Gives the staging buffers back (waiting for requests in flight) and
  // forgets the slots; the staged chunk's lists are pointed at null.
  void release();

  // Whether chunk k's lists live on the drive.
  bool on_drive(uint32_t k) const { return k < slots_.size() && slots_[k].first_slot != kNoSlot; }
  // Host code about to read (or write) the fp32 lists of chunk k: stages
  // them in through the access buffer (one chunk at a time; a write-back
  // follows when another chunk is staged in or at flush_access()).  Nothing
  // for a chunk in host memory.
  void access(uint32_t k, bool write);
  void flush_access();
  // The CPU update of `order` in order: those on the drive stream through
  // the ring (reads ahead, write-backs behind); `update(k)` runs with the
  // chunk's lists staged in.  It is begin_step_io() then stream_chunks().
  //
  // The overlapped step (step/update_worker.h) calls the two apart:
  // begin_step_io() (flushes the access buffer, arms the test hook) on the
  // engine's thread at pstar_step, then stream_chunks() on its update
  // thread; until that returns the tier is the update thread's: the
  // engine's thread calls nothing here but failed(), require_ok() and
  // flush_access() (a no-op then: the access buffer was flushed and host
  // code that stages a chunk waits for the step first).
  void update_chunks(const std::vector<uint32_t>& order, const std::function<void(uint32_t)>& update);
  void begin_step_io();
  void stream_chunks(const std::vector<uint32_t>& order, const std::function<void(uint32_t)>& update);
  // A checkpoint load is about to rewrite every state: drops the access
  // buffer and writes zeros to every slot; end_rewrite() (the load
  // completed) writes the last staged chunk back and trusts the drive again.
  void begin_rewrite();
  void end_rewrite();

  // After an NVMe I/O error, until end_rewrite(): the stored state is not
  // trusted.  require_ok refuses (PSTAR_ERR_IO) then.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  void require_ok(const char* what) const;

  void fill_stats(pstar_x_nvme_stats* out) const;

  // A chunk's lists move in pieces of this many bytes, one slot each (the
  // drive's bandwidth in `pstar-bench nvme` is measured with the same
  // request size).
  static constexpr uint64_t kPieceBytes = uint64_t{4} << 20;

 private:
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  struct StagingBuffer {
    void* raw = nullptr;    // from the host pool (pinned on CUDA)
    float* data = nullptr;  // raw aligned up to NvmeStore::kAlignBytes
  };
  struct ChunkSlots {
    uint32_t first_slot = kNoSlot;  // of the consecutive slots holding master, m, v; kNoSlot: in host memory
    uint64_t fp32_elems = 0;        // of each list
    uint64_t moment_bytes = 0;      // of m and of v each
    uint64_t master_bytes = 0;      // of the master list
  };
  // A chunk's lists staged back to back: the master, then m and v, each at
  // a kListAlignBytes boundary (fp32 lists of whole 128-element units end
  // on one: the layout is the same as three fp32 lists end to end).
  static constexpr uint64_t kListAlignBytes = 256;
  static uint64_t list_align(uint64_t b) { return (b + kListAlignBytes - 1) / kListAlignBytes * kListAlignBytes; }
  static uint64_t m_offset(uint64_t master_bytes) { return list_align(master_bytes); }
  static uint64_t v_offset(uint64_t master_bytes, uint64_t moment_bytes) {
    return m_offset(master_bytes) + list_align(moment_bytes);
  }
  static uint64_t lists_bytes(uint64_t master_bytes, uint64_t moment_bytes) {
    return v_offset(master_bytes, moment_bytes) + moment_bytes;
  }
  struct StoreDeleter {
    void operator()(NvmeStore* s) const;
  };
  uint64_t chunk_bytes(uint32_t k) const { return lists_bytes(slots_[k].master_bytes, slots_[k].moment_bytes); }
  void point_at(uint32_t k, float* base) const;
  [[noreturn]] void fail(const std::string& error, const char* what);

  // Set by open; never reset.  opts_.dir points into dir_; its defaults are
  // filled in.
  bool requested_ = false;
  pstar_x_nvme_options opts_{};
  std::string dir_;
  Device* device_ = nullptr;
  HostPool* host_ = nullptr;
  PointLists point_lists_;
  // The data file: null without a tier and in a dry run.
  std::unique_ptr<NvmeStore, StoreDeleter> store_;
  // Per chunk from place on (empty before and after release()).  A chunk
  // with a slot has its lists pointed (point_lists_) at a staging buffer
  // while it is staged in (access_chunk_ or inside update_chunks), at null
  // otherwise.
  std::vector<ChunkSlots> slots_;
  // The step's ring and the access buffer: allocated when some chunk's
  // lists live on the drive (else none), each buffer_bytes_ of data (one
  // chunk's master, m, v, padded).
  std::vector<StagingBuffer> ring_;
  StagingBuffer access_buf_;
  uint64_t buffer_bytes_ = 0;
  // The chunk staged in the access buffer (-1: none) and whether host code
  // changed it since it was staged.
  int64_t access_chunk_ = -1;
  bool access_dirty_ = false;
  // An I/O error and its message; cleared only by end_rewrite().  failure_
  // is written before failed_ is set (release), and read only once it is.
  std::atomic<bool> failed_{false};
  std::string failure_;
  // Step figures for the stats: seconds waited for I/O, bytes the steps
  // moved (padded).
  double wait_seconds_ = 0.0;
  uint64_t step_read_ = 0;
  uint64_t step_written_ = 0;
  uint32_t dry_slots_ = 0;  // a dry run's slot numbers (no file)
};

}  // namespace pstar::memory
