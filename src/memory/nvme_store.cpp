#include "memory/nvme_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util/error.h"
#include "util/log.h"

namespace pstar::memory {
namespace {

using Clock = std::chrono::steady_clock;

// Largest piece handed to one uv_fs call: uv_buf_t lengths are 32-bit and
// Linux moves at most 2 GiB - 4 KiB per call anyway; a multiple of
// kAlignBytes so that every continuation stays aligned.
constexpr uint64_t kMaxPieceBytes = uint64_t{1} << 30;

std::string errno_text(int err) { return std::strerror(err) + std::string(err == ENOSPC ? " (disk full)" : ""); }

// 0 when a synchronous pread/pwrite of one block moved all of it, else its
// errno (EIO for a short transfer).
int transfer_errno(ssize_t moved) {
  if (moved == static_cast<ssize_t>(NvmeStore::kAlignBytes)) return 0;
  return moved < 0 ? errno : EIO;
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % NvmeStore::kAlignBytes == 0; }

}  // namespace

struct NvmeStore::Impl {
  struct Slot {
    uint64_t offset = 0;       // kAlignBytes-aligned
    uint64_t bytes = 0;        // as asked; the slot spans padded(bytes)
    uint64_t write_bytes = 0;  // length of the last write submitted; 0: never written
    bool valid = false;        // the last finished write succeeded
    uint64_t hash = 0;         // XXH3-64 of that write (when valid)
    uint32_t reads_inflight = 0;
    uint32_t writes_inflight = 0;
  };

  struct Request {
    Impl* store = nullptr;
    uv_fs_t fs;  // reused for each piece; cleaned up after each
    bool write = false;
    bool corrupt = false;  // kWriteCorrupt fires on this write
    uint32_t slot = 0;
    uint8_t* buf = nullptr;
    uint64_t bytes = 0;     // caller's length (hashed)
    uint64_t io_bytes = 0;  // padded(bytes)
    uint64_t offset = 0;
    uint64_t moved = 0;  // bytes of io_bytes done; invariant: moved <= io_bytes
    uint64_t hash = 0;   // write: of the caller's bytes; read: expected, taken at dispatch
    bool finished = false;
    pstar_status status = PSTAR_OK;
    std::string error;
  };

  struct Fault {
    bool armed = false;
    uint64_t countdown = 0;  // requests of its direction to let through first
  };

  std::string path;
  int fd = -1;
  bool direct = false;
  uint32_t max_inflight = 0;

  uv_loop_t loop;
  uv_async_t wake;  // submitters -> I/O thread: dispatch, or close when stopping
  std::thread io_thread;

  mutable std::mutex mu;
  std::condition_variable cv;  // a request finished
  // Everything below is guarded by mu.
  std::vector<Slot> slots;
  uint64_t file_bytes = 0;                              // invariant: == end of the last slot
  std::map<Ticket, std::unique_ptr<Request>> requests;  // submitted, not yet retired
  std::deque<Request*> queue;                           // submitted, not yet handed to libuv
  uint32_t inflight = 0;                                // invariant: <= max_inflight
  uint32_t unfinished = 0;                              // queued + in flight
  Ticket next_ticket = 1;
  std::array<Fault, 3> faults;  // indexed by FaultKind
  Stats stats;
  Clock::time_point busy_since;  // when unfinished last became non-zero
  bool stopping = false;

  std::string where(const Request& r) const {
    return "nvme store " + path + ": " + (r.write ? "write" : "read") + " of slot " + std::to_string(r.slot) +
           " (offset " + std::to_string(r.offset) + ", " + std::to_string(r.io_bytes) + " bytes)";
  }
  std::string failed(const Request& r, const std::string& why) const { return where(r) + " failed: " + why; }

  bool fault_fires(FaultKind kind) {
    Fault& f = faults[static_cast<size_t>(kind)];
    if (!f.armed) return false;
    if (f.countdown > 0) {
      --f.countdown;
      return false;
    }
    f.armed = false;
    return true;
  }

  // The next piece of `r` (I/O thread).  Returns libuv's synchronous error.
  int submit_piece(Request* r) {
    const uint64_t n = std::min(r->io_bytes - r->moved, kMaxPieceBytes);
    const uv_buf_t buf = uv_buf_init(reinterpret_cast<char*>(r->buf + r->moved), static_cast<unsigned>(n));
    const int64_t off = static_cast<int64_t>(r->offset + r->moved);
    return r->write ? uv_fs_write(&loop, &r->fs, fd, &buf, 1, off, on_fs)
                    : uv_fs_read(&loop, &r->fs, fd, &buf, 1, off, on_fs);
  }

  void finish_locked(Request* r, pstar_status status, std::string error) {
    Slot& slot = slots[r->slot];
    --inflight;
    (r->write ? slot.writes_inflight : slot.reads_inflight)--;
    if (r->write) {
      slot.valid = status == PSTAR_OK;
      slot.hash = r->hash;
    }
    if (status == PSTAR_OK) {
      (r->write ? stats.bytes_written : stats.bytes_read) += r->io_bytes;
      ++(r->write ? stats.writes : stats.reads);
    }
    r->finished = true;
    r->status = status;
    r->error = std::move(error);
    if (--unfinished == 0) stats.busy_seconds += std::chrono::duration<double>(Clock::now() - busy_since).count();
    cv.notify_all();
  }

  void start_locked(Request* r) {
    Slot& slot = slots[r->slot];
    ++inflight;
    stats.inflight_peak = std::max(stats.inflight_peak, inflight);
    (r->write ? slot.writes_inflight : slot.reads_inflight)++;
    if (!r->write && !slot.valid) {
      return finish_locked(r, PSTAR_ERR_INVALID_STATE,
                           where(*r) + ": the slot holds no valid data (its last write failed)");
    }
    if (!r->write) r->hash = slot.hash;
    if (fault_fires(r->write ? FaultKind::kWriteNoSpace : FaultKind::kReadIo)) {
      return finish_locked(r, PSTAR_ERR_IO, failed(*r, errno_text(r->write ? ENOSPC : EIO) + " [injected]"));
    }
    r->corrupt = r->write && fault_fires(FaultKind::kWriteCorrupt);
    const int rc = submit_piece(r);
    if (rc < 0) finish_locked(r, PSTAR_ERR_IO, failed(*r, errno_text(-rc)));
  }

  // Hands queued requests to libuv, in order, while there is room and the
  // head does not have to wait for a request on its slot.
  void dispatch_locked() {
    while (inflight < max_inflight && !queue.empty()) {
      Request* r = queue.front();
      const Slot& slot = slots[r->slot];
      if (slot.writes_inflight > 0 || (r->write && slot.reads_inflight > 0)) break;
      queue.pop_front();
      start_locked(r);
    }
  }

  void complete(Request* r, pstar_status status, std::string error) {
    std::lock_guard<std::mutex> lock(mu);
    finish_locked(r, status, std::move(error));
    dispatch_locked();
  }

  // Test hook kWriteCorrupt: flips the slot's first byte through an aligned
  // read-modify-write, valid in both modes.  Returns 0 or an errno.
  int flip_first_byte(uint64_t offset) const {
    alignas(kAlignBytes) uint8_t block[kAlignBytes];
    if (const int err = transfer_errno(pread(fd, block, kAlignBytes, static_cast<off_t>(offset)))) return err;
    block[0] ^= 0xff;
    return transfer_errno(pwrite(fd, block, kAlignBytes, static_cast<off_t>(offset)));
  }

  // The rest of `r` after a partial or interrupted transfer (I/O thread).
  void resubmit(Request* r) {
    const int rc = submit_piece(r);
    if (rc < 0) complete(r, PSTAR_ERR_IO, failed(*r, errno_text(-rc)));
  }

  static void on_fs(uv_fs_t* fs) {
    Request* r = static_cast<Request*>(fs->data);
    Impl& s = *r->store;
    const ssize_t result = fs->result;
    uv_fs_req_cleanup(fs);
    if (result == UV_EINTR || result == UV_EAGAIN) return s.resubmit(r);
    if (result < 0) return s.complete(r, PSTAR_ERR_IO, s.failed(*r, errno_text(static_cast<int>(-result))));
    if (result == 0) {
      const std::string why = r->write ? "no progress" : "unexpected end of file";
      return s.complete(r, PSTAR_ERR_IO, s.failed(*r, why + " after " + std::to_string(r->moved) + " bytes"));
    }
    r->moved += static_cast<uint64_t>(result);
    if (r->moved < r->io_bytes) return s.resubmit(r);
    // Hashing and the fault hook run here, outside the lock.
    if (!r->write && XXH3_64bits(r->buf, r->bytes) != r->hash) {
      return s.complete(r, PSTAR_ERR_IO,
                        "nvme store: corrupted: slot " + std::to_string(r->slot) + " of " + s.path + " (offset " +
                            std::to_string(r->offset) + ", " + std::to_string(r->bytes) +
                            " bytes): the data read differs from the last write (XXH3-64 mismatch)");
    }
    if (r->corrupt) {
      if (const int err = s.flip_first_byte(r->offset)) {
        return s.complete(r, PSTAR_ERR_IO, s.where(*r) + ": injected corruption failed: " + errno_text(err));
      }
    }
    s.complete(r, PSTAR_OK, {});
  }

  static void on_wake(uv_async_t* async) {
    Impl& s = *static_cast<Impl*>(async->data);
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopping) return uv_close(reinterpret_cast<uv_handle_t*>(&s.wake), nullptr);
    s.dispatch_locked();
  }

  Ticket submit(uint32_t slot_index, void* buf, uint64_t bytes, bool write) {
    {
      std::lock_guard<std::mutex> lock(mu);
      require(slot_index < slots.size(), PSTAR_ERR_INVALID_ARGUMENT, [&] {
        return "nvme store " + path + ": slot " + std::to_string(slot_index) + " does not exist (" +
               std::to_string(slots.size()) + " slots)";
      });
      const Slot& slot = slots[slot_index];
      require(bytes > 0 && bytes <= slot.bytes, PSTAR_ERR_INVALID_ARGUMENT, [&] {
        return "nvme store " + path + ": " + std::to_string(bytes) + " bytes for slot " + std::to_string(slot_index) +
               " of " + std::to_string(slot.bytes) + " bytes";
      });
      require(aligned(buf), PSTAR_ERR_INVALID_ARGUMENT, [&] {
        return "nvme store " + path + ": the buffer for slot " + std::to_string(slot_index) + " is not " +
               std::to_string(kAlignBytes) + "-byte aligned (O_DIRECT needs it; see NvmeStore::allocate_aligned)";
      });
      if (!write) {
        require(slot.write_bytes != 0, PSTAR_ERR_INVALID_STATE, [&] {
          return "nvme store " + path + ": read of slot " + std::to_string(slot_index) + ", which was never written";
        });
        require(bytes == slot.write_bytes, PSTAR_ERR_INVALID_ARGUMENT, [&] {
          return "nvme store " + path + ": read of " + std::to_string(bytes) + " bytes of slot " +
                 std::to_string(slot_index) + ", whose last write stored " + std::to_string(slot.write_bytes);
        });
      }
    }
    // Hashed once validated (the length is then known to be sane) and outside
    // the lock, so completions are not held up.
    const uint64_t hash = write ? XXH3_64bits(buf, bytes) : 0;
    Ticket ticket;
    {
      std::lock_guard<std::mutex> lock(mu);
      Slot& slot = slots[slot_index];
      if (write) slot.write_bytes = bytes;
      auto r = std::make_unique<Request>();
      r->store = this;
      r->fs.data = r.get();
      ticket = next_ticket++;
      r->write = write;
      r->slot = slot_index;
      r->buf = static_cast<uint8_t*>(buf);
      r->bytes = bytes;
      r->io_bytes = padded(bytes);
      r->offset = slot.offset;
      r->hash = hash;
      queue.push_back(r.get());
      requests.emplace(ticket, std::move(r));
      if (unfinished++ == 0) busy_since = Clock::now();
    }
    uv_async_send(&wake);
    return ticket;
  }

  // Probes O_DIRECT on the open file (F_SETFL O_DIRECT fails exactly where
  // open(O_DIRECT) would, e.g. EINVAL on tmpfs before Linux 6.6) and keeps it
  // if one aligned write and read of kAlignBytes succeed.  Returns why
  // buffered I/O is used, empty when direct.
  std::string probe_direct() {
    const int flags = fcntl(fd, F_GETFL);
    if (fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) {
      const int err = errno;
      return "the filesystem refuses O_DIRECT (" + errno_text(err) + ")";
    }
    alignas(kAlignBytes) uint8_t block[kAlignBytes] = {};
    int err = transfer_errno(pwrite(fd, block, kAlignBytes, 0));
    if (err == 0) err = transfer_errno(pread(fd, block, kAlignBytes, 0));
    if (err == 0) return {};
    fcntl(fd, F_SETFL, flags);
    return "an O_DIRECT write and read of " + std::to_string(kAlignBytes) + " bytes failed (" + errno_text(err) + ")";
  }
};

NvmeStore::AlignedBuffer NvmeStore::allocate_aligned(uint64_t bytes) {
  const uint64_t n = padded(bytes == 0 ? 1 : bytes);
  AlignedBuffer p(static_cast<uint8_t*>(std::aligned_alloc(kAlignBytes, n)));
  require(p != nullptr, PSTAR_ERR_OUT_OF_MEMORY,
          [&] { return "nvme store: cannot allocate an aligned buffer of " + std::to_string(n) + " bytes"; });
  std::memset(p.get(), 0, n);
  return p;
}

NvmeStore::NvmeStore(const std::string& dir, uint32_t max_inflight, bool try_direct) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  require(max_inflight > 0, PSTAR_ERR_INVALID_ARGUMENT, "nvme store: max_inflight must be positive");
  s.max_inflight = max_inflight;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    throw Error(err == ENOENT || err == ENOTDIR ? PSTAR_ERR_INVALID_ARGUMENT : PSTAR_ERR_IO,
                "nvme store: directory '" + dir + "': " + errno_text(err));
  }
  require(S_ISDIR(st.st_mode), PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return "nvme store: '" + dir + "' is not a directory"; });
  std::string name = dir + "/pstar-nvme-XXXXXX";
  s.fd = mkostemp(name.data(), O_CLOEXEC);
  if (s.fd < 0) {
    const int err = errno;
    throw Error(PSTAR_ERR_IO, "nvme store: cannot create a data file in '" + dir + "': " + errno_text(err));
  }
  s.path = name;
  try {
    const std::string why = try_direct ? s.probe_direct() : "O_DIRECT not requested";
    s.direct = why.empty();
    if (s.direct) {
      log::info("nvme store " + s.path + ": O_DIRECT I/O (the page cache is bypassed)");
    } else {
      // A fallback the caller did not ask for is worth a warning.
      (try_direct ? log::warn : log::info)("nvme store " + s.path + ": buffered I/O through the page cache: " + why);
    }
    const int rc = uv_loop_init(&s.loop);
    if (rc < 0) throw Error(PSTAR_ERR_IO, "nvme store " + s.path + ": uv_loop_init: " + uv_strerror(rc));
  } catch (...) {
    ::close(s.fd);
    ::unlink(s.path.c_str());
    throw;
  }
  uv_async_init(&s.loop, &s.wake, Impl::on_wake);
  s.wake.data = &s;
  s.io_thread = std::thread([&s] { uv_run(&s.loop, UV_RUN_DEFAULT); });
}

NvmeStore::~NvmeStore() {
  Impl& s = *impl_;
  {
    // libuv may still be writing into caller buffers: finish everything.
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.unfinished == 0; });
    s.stopping = true;
  }
  uv_async_send(&s.wake);
  s.io_thread.join();
  const int rc = uv_loop_close(&s.loop);
  if (rc < 0) log::error("nvme store " + s.path + ": uv_loop_close: " + uv_strerror(rc));
  ::close(s.fd);
  const int err = ::unlink(s.path.c_str()) == 0 ? 0 : errno;
  if (err != 0 && err != ENOENT) log::warn("nvme store: cannot remove " + s.path + ": " + errno_text(err));
}

bool NvmeStore::direct() const { return impl_->direct; }
const std::string& NvmeStore::path() const { return impl_->path; }
uint32_t NvmeStore::max_inflight() const { return impl_->max_inflight; }

uint32_t NvmeStore::add_slot(uint64_t bytes) {
  Impl& s = *impl_;
  require(bytes > 0, PSTAR_ERR_INVALID_ARGUMENT, "nvme store: a slot needs at least one byte");
  std::lock_guard<std::mutex> lock(s.mu);
  const uint64_t offset = s.file_bytes;
  const auto index = static_cast<uint32_t>(s.slots.size());
  // fallocate reserves the blocks, so a full disk shows here rather than at
  // a later write; filesystems without it get a sparse extension.
  int err = ::fallocate(s.fd, 0, static_cast<off_t>(offset), static_cast<off_t>(padded(bytes))) == 0 ? 0 : errno;
  if (err == EOPNOTSUPP) err = ::ftruncate(s.fd, static_cast<off_t>(offset + padded(bytes))) == 0 ? 0 : errno;
  require(err == 0, PSTAR_ERR_IO, [&] {
    return "nvme store " + s.path + ": cannot extend the file by " + std::to_string(padded(bytes)) +
           " bytes for slot " + std::to_string(index) + ": " + errno_text(err);
  });
  Impl::Slot slot;
  slot.offset = offset;
  slot.bytes = bytes;
  s.slots.push_back(slot);
  s.file_bytes = offset + padded(bytes);
  return index;
}

uint32_t NvmeStore::slot_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<uint32_t>(impl_->slots.size());
}

uint64_t NvmeStore::slot_bytes(uint32_t slot) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  require(slot < impl_->slots.size(), PSTAR_ERR_INVALID_ARGUMENT, "nvme store: no such slot");
  return impl_->slots[slot].bytes;
}

NvmeStore::Ticket NvmeStore::read_async(uint32_t slot, void* dst, uint64_t bytes) {
  return impl_->submit(slot, dst, bytes, false);
}

NvmeStore::Ticket NvmeStore::write_async(uint32_t slot, const void* src, uint64_t bytes) {
  // libuv's write path takes a non-const uv_buf_t but only reads it.
  return impl_->submit(slot, const_cast<void*>(src), bytes, true);
}

bool NvmeStore::done(Ticket ticket) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto it = impl_->requests.find(ticket);
  require(it != impl_->requests.end(), PSTAR_ERR_INVALID_ARGUMENT, "nvme store: unknown or retired ticket");
  return it->second->finished;
}

void NvmeStore::wait(Ticket ticket) {
  Impl& s = *impl_;
  std::unique_ptr<Impl::Request> r;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    const auto it = s.requests.find(ticket);
    require(it != s.requests.end(), PSTAR_ERR_INVALID_ARGUMENT, "nvme store: unknown or retired ticket");
    // std::map: `it` survives insertions by submitters while we wait.
    s.cv.wait(lock, [&] { return it->second->finished; });
    r = std::move(it->second);
    s.requests.erase(it);
  }
  if (r->status != PSTAR_OK) throw Error(r->status, r->error);
  check_file();
}

void NvmeStore::wait_all() {
  Impl& s = *impl_;
  std::map<Ticket, std::unique_ptr<Impl::Request>> retired;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.unfinished == 0; });
    retired.swap(s.requests);
  }
  for (const auto& [ticket, r] : retired) {
    if (r->status != PSTAR_OK) throw Error(r->status, r->error);
  }
  check_file();
}

void NvmeStore::check_file() const {
  struct stat st {};
  const int err = ::fstat(impl_->fd, &st) == 0 ? 0 : errno;
  require(err == 0, PSTAR_ERR_IO, [&] { return "nvme store " + impl_->path + ": fstat: " + errno_text(err); });
  require(st.st_nlink > 0, PSTAR_ERR_IO,
          [&] { return "nvme store: the data file " + impl_->path + " was removed from its directory"; });
}

void NvmeStore::inject_fault(FaultKind kind, uint64_t after_ops) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->faults[static_cast<size_t>(kind)] = Impl::Fault{true, after_ops};
}

NvmeStore::Stats NvmeStore::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace pstar::memory
