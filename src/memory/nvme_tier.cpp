// The NVMe tier (memory/nvme_tier.h; docs/nvme.md).
#include "memory/nvme_tier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "memory/device.h"
#include "memory/host_pool.h"
#include "util/error.h"
#include "util/log.h"

#if PSTAR_HAVE_NVME
#include "memory/nvme_store.h"
#endif

namespace pstar::memory {

namespace {
// Staging buffers of the step's ring when the caller says 0.
constexpr uint32_t kDefaultStagingBuffers = 4;
// Alignment the data file's O_DIRECT I/O needs (NvmeStore::kAlignBytes).
constexpr uint64_t kNvmeAlignBytes = 4096;

#if PSTAR_HAVE_NVME
using Tickets = std::vector<NvmeStore::Ticket>;

// Submits the pieces of a chunk's `bytes` (slots first_slot, first_slot+1,
// ...) between `buf` and the drive; appends their tickets.
void submit_pieces(NvmeStore& store, uint32_t first_slot, uint64_t bytes, float* buf, bool write, Tickets& out) {
  auto* base = reinterpret_cast<char*>(buf);
  for (uint64_t at = 0, i = 0; at < bytes; at += NvmeTier::kPieceBytes, ++i) {
    const uint64_t n = std::min(NvmeTier::kPieceBytes, bytes - at);
    const auto slot = static_cast<uint32_t>(first_slot + i);
    out.push_back(write ? store.write_async(slot, base + at, n) : store.read_async(slot, base + at, n));
  }
}

void wait_tickets(NvmeStore& store, Tickets& tickets) {
  for (auto t : tickets) store.wait(t);
  tickets.clear();
}

// submit_pieces, then waits for them.
void transfer(NvmeStore& store, uint32_t first_slot, uint64_t bytes, float* buf, bool write) {
  Tickets t;
  submit_pieces(store, first_slot, bytes, buf, write, t);
  wait_tickets(store, t);
}
#endif
}  // namespace

void NvmeTier::StoreDeleter::operator()(NvmeStore* s) const {
#if PSTAR_HAVE_NVME
  delete s;
#else
  (void)s;  // never constructed without the store
#endif
}

NvmeTier::NvmeTier() = default;
NvmeTier::~NvmeTier() = default;

void NvmeTier::validate(const pstar_x_nvme_options& in, bool payloads) const {
  require(!requested_, PSTAR_ERR_INVALID_STATE, "set_nvme: the engine has an NVMe tier already");
#if !PSTAR_HAVE_NVME
  (void)in;
  (void)payloads;
  throw Error(PSTAR_ERR_UNSUPPORTED,
              "set_nvme: this libpstar was built without the NVMe tier (needs libuv and xxhash)");
#else
  // Its size and version are checked by the C API (capi/engine.cpp).
  require(!payloads || (in.dir != nullptr && in.dir[0] != '\0'), PSTAR_ERR_INVALID_ARGUMENT,
          "set_nvme: dir is NULL or empty");
  require(std::isfinite(in.read_bytes_per_s) && std::isfinite(in.write_bytes_per_s) && in.read_bytes_per_s >= 0 &&
              in.write_bytes_per_s >= 0,
          PSTAR_ERR_INVALID_ARGUMENT, "set_nvme: read_bytes_per_s and write_bytes_per_s must be finite and >= 0");
  require(in.staging_buffers == 0 || in.staging_buffers >= 2, PSTAR_ERR_INVALID_ARGUMENT,
          "set_nvme: staging_buffers must be 0 (default) or at least 2");
#endif
}

void NvmeTier::open(const pstar_x_nvme_options& in, bool payloads, Device* device, HostPool* host,
                    PointLists point_lists) {
  validate(in, payloads);
#if PSTAR_HAVE_NVME
  opts_ = in;
  if (opts_.read_bytes_per_s == 0) opts_.read_bytes_per_s = PSTAR_X_DEFAULT_NVME_READ_BYTES_PER_S;
  if (opts_.write_bytes_per_s == 0) opts_.write_bytes_per_s = PSTAR_X_DEFAULT_NVME_WRITE_BYTES_PER_S;
  if (opts_.staging_buffers == 0) opts_.staging_buffers = kDefaultStagingBuffers;
  if (opts_.max_inflight == 0) opts_.max_inflight = NvmeStore::kDefaultMaxInflight;
  dir_ = in.dir != nullptr ? in.dir : "";
  opts_.dir = dir_.c_str();
  device_ = device;
  host_ = host;
  point_lists_ = std::move(point_lists);
  // The data file is created now, so that a directory that cannot be used
  // fails here and not at build.  A dry run has no file.
  if (payloads) store_.reset(new NvmeStore(dir_, opts_.max_inflight, opts_.buffered == 0));
  requested_ = true;
#else
  (void)device;
  (void)host;
  (void)point_lists;
#endif
}

void NvmeTier::point_at(uint32_t k, float* base) const {
  if (base == nullptr) {
    point_lists_(k, nullptr, nullptr, nullptr);
    return;
  }
  const uint64_t mb = slots_[k].master_bytes;
  char* bytes = reinterpret_cast<char*>(base);
  point_lists_(k, base, reinterpret_cast<float*>(bytes + m_offset(mb)),
               reinterpret_cast<float*>(bytes + v_offset(mb, slots_[k].moment_bytes)));
}

void NvmeTier::place(const std::vector<uint64_t>& fp32_elems, uint64_t largest_elems, const MomentBytes& moment_bytes,
                     const PointLists& host_lists, const MomentBytes& master_bytes_of) {
#if PSTAR_HAVE_NVME
  if (!requested_ || largest_elems == 0) return;
  auto master_bytes = [&](uint64_t n) { return master_bytes_of ? master_bytes_of(n) : n * sizeof(float); };
  slots_.assign(fp32_elems.size(), ChunkSlots{});
  // The staging buffers first: they are what makes the drive usable at all.
  buffer_bytes_ = NvmeStore::padded(lists_bytes(master_bytes(largest_elems), moment_bytes(largest_elems)));
  auto take = [&](StagingBuffer& b) {
    b.raw = host_->acquire(buffer_bytes_ + kNvmeAlignBytes);
    const auto addr = reinterpret_cast<uintptr_t>(b.raw);
    b.data = reinterpret_cast<float*>((addr + kNvmeAlignBytes - 1) / kNvmeAlignBytes * kNvmeAlignBytes);
  };
  ring_.resize(opts_.staging_buffers);
  for (StagingBuffer& b : ring_) take(b);
  take(access_buf_);
  // A dry run's host buffers are address space only: nothing is written.
  const bool io = store_ != nullptr;
  // Then, in layout order, each trainable chunk's lists on the host while
  // they fit (checked before acquiring: the pool's OOM is for real
  // shortages), else in a slot holding zeros like a fresh host list.
  if (io) std::memset(access_buf_.data, 0, buffer_bytes_);
  Tickets zeroing;
  uint32_t on_drive = 0;
  uint64_t drive_bytes = 0;
  for (uint32_t k = 0; k < fp32_elems.size(); ++k) {
    if (fp32_elems[k] == 0) continue;
    ChunkSlots& c = slots_[k];
    c.fp32_elems = fp32_elems[k];
    c.moment_bytes = moment_bytes(fp32_elems[k]);
    c.master_bytes = master_bytes(fp32_elems[k]);
    // With world > 1 this rank's shards of the lists.
    const uint64_t bytes = chunk_bytes(k);
    if (host_->can_acquire(c.master_bytes + 2 * c.moment_bytes)) {
      float* lists[3] = {nullptr, nullptr, nullptr};
      for (int i = 0; i < 3; ++i) {
        const uint64_t b = i == 0 ? c.master_bytes : c.moment_bytes;
        lists[i] = static_cast<float*>(host_->acquire(b));
        if (io) std::memset(lists[i], 0, b);
        // Handed over at once, so that the caller releases it on an error.
        host_lists(k, lists[0], lists[1], lists[2]);
      }
      continue;
    }
    drive_bytes += NvmeStore::padded(bytes);
    require(opts_.capacity_bytes == 0 || drive_bytes <= opts_.capacity_bytes, PSTAR_ERR_OUT_OF_MEMORY, [&] {
      return "engine_build: the NVMe tier's capacity (" + std::to_string(opts_.capacity_bytes) +
             " bytes) cannot take the optimizer state that does not fit in host memory (" +
             std::to_string(drive_bytes) + " bytes so far)";
    });
    ++on_drive;
    if (!io) {
      c.first_slot = dry_slots_++;
      continue;
    }
    for (uint64_t at = 0; at < bytes; at += kPieceBytes) {
      const uint32_t slot = store_->add_slot(std::min(kPieceBytes, bytes - at));
      if (at == 0) c.first_slot = slot;
    }
    submit_pieces(*store_, c.first_slot, bytes, access_buf_.data, true, zeroing);
  }
  if (io) store_->wait_all();
  if (on_drive == 0) release();  // everything fit: give the staging memory back
  log::info("NVMe tier: optimizer state of " + std::to_string(on_drive) + " chunks on the drive (" +
            (!io ? std::string("dry run") : (store_->direct() ? "O_DIRECT, " : "buffered, ") + store_->path()) + ")");
#else
  (void)fp32_elems;
  (void)largest_elems;
  (void)moment_bytes;
  (void)host_lists;
  (void)master_bytes_of;
#endif
}

void NvmeTier::release() {
#if PSTAR_HAVE_NVME
  // No request may outlive the buffers it reads or writes (a build that
  // failed part way has zero-writes in flight from the access buffer).
  if (store_ != nullptr) {
    try {
      store_->wait_all();
    } catch (const Error&) {
    }
  }
#endif
  // Only the access buffer's chunk is staged between calls.
  if (access_chunk_ >= 0) point_at(static_cast<uint32_t>(access_chunk_), nullptr);
  for (StagingBuffer& b : ring_) host_->release(b.raw, buffer_bytes_ + kNvmeAlignBytes);
  if (access_buf_.raw != nullptr) host_->release(access_buf_.raw, buffer_bytes_ + kNvmeAlignBytes);
  ring_.clear();
  access_buf_ = StagingBuffer{};
  access_chunk_ = -1;
  slots_.clear();
}

void NvmeTier::fail(const std::string& error, const char* what) {
  failure_ = error;
  failed_.store(true, std::memory_order_release);
  log::error(std::string(what) + ": " + failure_);
  throw Error(PSTAR_ERR_IO, std::string(what) + ": " + failure_ +
                                "; the optimizer state on the drive is not trusted any more: training is refused "
                                "until pstar_checkpoint_load() rewrites it");
}

void NvmeTier::require_ok(const char* what) const {
  require(!failed(), PSTAR_ERR_IO, [&] {
    return std::string(what) + ": refused after an NVMe I/O error (" + failure_ +
           "); load a checkpoint (pstar_checkpoint_load) to go on";
  });
}

void NvmeTier::access(uint32_t k, bool write) {
#if PSTAR_HAVE_NVME
  if (!on_drive(k)) return;
  if (store_ == nullptr) internal_error("nvme_access in a dry run");
  if (access_chunk_ != static_cast<int64_t>(k)) {
    flush_access();
    try {
      transfer(*store_, slots_[k].first_slot, chunk_bytes(k), access_buf_.data, false);
    } catch (const Error& e) {
      fail(e.what(), "NVMe read");
    }
    point_at(k, access_buf_.data);
    access_chunk_ = k;
  }
  access_dirty_ = access_dirty_ || write;
#else
  (void)k;
  (void)write;
#endif
}

void NvmeTier::flush_access() {
#if PSTAR_HAVE_NVME
  if (access_chunk_ < 0) return;
  const auto k = static_cast<uint32_t>(access_chunk_);
  access_chunk_ = -1;
  point_at(k, nullptr);
  if (!access_dirty_) return;
  access_dirty_ = false;
  try {
    transfer(*store_, slots_[k].first_slot, chunk_bytes(k), access_buf_.data, true);
  } catch (const Error& e) {
    fail(e.what(), "NVMe write-back");
  }
#endif
}

void NvmeTier::begin_step_io() {
#if PSTAR_HAVE_NVME
  if (ring_.empty() || !store_) return;
  flush_access();
  // Test hook (tests/capi/test_nvme.c): PSTAR_TEST_NVME_FAULT=KIND:N, seen
  // by a step, makes the request after N more of its direction fail
  // (write_nospace, read_eio, write_corrupt).  Read here, on the engine's
  // thread, inside pstar_step.
  if (const char* f = std::getenv("PSTAR_TEST_NVME_FAULT")) {
    const std::string spec(f);
    const size_t colon = spec.find(':');
    const std::string kind = spec.substr(0, colon);
    const uint64_t after = colon == std::string::npos ? 0 : std::strtoull(spec.c_str() + colon + 1, nullptr, 10);
    using K = NvmeStore::FaultKind;
    if (kind == "write_nospace") store_->inject_fault(K::kWriteNoSpace, after);
    if (kind == "read_eio") store_->inject_fault(K::kReadIo, after);
    if (kind == "write_corrupt") store_->inject_fault(K::kWriteCorrupt, after);
  }
#endif
}

void NvmeTier::update_chunks(const std::vector<uint32_t>& order, const std::function<void(uint32_t)>& update) {
  begin_step_io();
  stream_chunks(order, update);
}

void NvmeTier::stream_chunks(const std::vector<uint32_t>& order, const std::function<void(uint32_t)>& update) {
#if PSTAR_HAVE_NVME
  if (ring_.empty()) {
    for (uint32_t k : order) update(k);
    return;
  }
  if (!store_) {
    // Dry run: no file; the clock advances by the drive's time for the
    // step's reads and writes, one after the other (the update's own time
    // is the caller's to model: a dry run computes nothing).
    uint64_t bytes = 0;
    for (uint32_t k : order) {
      if (on_drive(k)) bytes += NvmeStore::padded(chunk_bytes(k));
      update(k);
    }
    step_read_ += bytes;
    step_written_ += bytes;
    const double s = double(bytes) / opts_.read_bytes_per_s + double(bytes) / opts_.write_bytes_per_s;
    device_->advance_clock(s);
    wait_seconds_ += s;
    return;
  }
  std::vector<uint32_t> disk;  // the chunks of `order` on the drive, in order
  for (uint32_t k : order) {
    if (on_drive(k)) disk.push_back(k);
  }
  const size_t ring = ring_.size();
  std::vector<Tickets> reads(disk.size()), writes(disk.size());
  auto timed_wait = [&](Tickets& t) {
    const auto t0 = std::chrono::steady_clock::now();
    wait_tickets(*store_, t);
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto start_read = [&](size_t j) {
    if (j >= disk.size()) return;
    // Buffer j % ring was last used by chunk j - ring: its write-back first.
    if (j >= ring) timed_wait(writes[j - ring]);
    submit_pieces(*store_, slots_[disk[j]].first_slot, chunk_bytes(disk[j]), ring_[j % ring].data, false, reads[j]);
    step_read_ += NvmeStore::padded(chunk_bytes(disk[j]));
  };
  try {
    for (size_t j = 0; j + 1 < ring && j < disk.size(); ++j) start_read(j);
    size_t next = 0;  // index in `disk` of the next chunk on the drive
    for (uint32_t k : order) {
      if (!on_drive(k)) {
        update(k);
        continue;
      }
      const size_t j = next++;
      timed_wait(reads[j]);
      float* buf = ring_[j % ring].data;
      point_at(k, buf);
      update(k);
      point_at(k, nullptr);
      submit_pieces(*store_, slots_[k].first_slot, chunk_bytes(k), buf, true, writes[j]);
      step_written_ += NvmeStore::padded(chunk_bytes(k));
      start_read(j + ring - 1);
    }
    const auto t0 = std::chrono::steady_clock::now();
    store_->wait_all();
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } catch (const Error& e) {
    for (uint32_t k : disk) point_at(k, nullptr);
    try {
      store_->wait_all();  // no request may outlive this call's buffers' use
    } catch (const Error&) {
    }
    fail(e.what(), "step: NVMe I/O");
  }
#else
  for (uint32_t k : order) update(k);
#endif
}

void NvmeTier::begin_rewrite() {
#if PSTAR_HAVE_NVME
  if (ring_.empty() || store_ == nullptr) return;
  if (access_chunk_ >= 0) point_at(static_cast<uint32_t>(access_chunk_), nullptr);
  access_chunk_ = -1;
  access_dirty_ = false;
  std::memset(access_buf_.data, 0, buffer_bytes_);
  try {
    Tickets t;
    for (uint32_t k = 0; k < slots_.size(); ++k) {
      if (on_drive(k)) submit_pieces(*store_, slots_[k].first_slot, chunk_bytes(k), access_buf_.data, true, t);
    }
    store_->wait_all();
  } catch (const Error& e) {
    fail(e.what(), "checkpoint_load: NVMe write");
  }
#endif
}

void NvmeTier::end_rewrite() {
  flush_access();
  failed_.store(false, std::memory_order_release);
  failure_.clear();
}

void NvmeTier::fill_stats(pstar_x_nvme_stats* out) const {
#if PSTAR_HAVE_NVME
  require(requested_, PSTAR_ERR_INVALID_STATE, "nvme_get_stats: the engine has no NVMe tier");
  pstar_x_nvme_stats s{};
  s.size = sizeof s;
  s.version = PSTAR_X_NVME_STATS_VERSION;
  s.direct = store_ != nullptr && store_->direct() ? 1 : 0;
  for (uint32_t k = 0; k < slots_.size(); ++k) {
    if (!on_drive(k)) continue;
    ++s.chunks_on_nvme;
    s.bytes_on_nvme += NvmeStore::padded(chunk_bytes(k));
  }
  if (store_ != nullptr) {
    const auto io = store_->stats();
    s.bytes_read = io.bytes_read;
    s.bytes_written = io.bytes_written;
  }
  s.step_io_wait_seconds = wait_seconds_;
  s.step_bytes_read = step_read_;
  s.step_bytes_written = step_written_;
  *out = s;
#else
  (void)out;
  throw Error(PSTAR_ERR_INVALID_STATE, "nvme_get_stats: the engine has no NVMe tier");
#endif
}

}  // namespace pstar::memory
