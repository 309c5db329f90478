// The engine's NVMe tier (experimental API pstar_x_engine_set_nvme;
// docs/nvme.md).
//
// Where state lives: every compute payload stays in host memory (or on the
// accelerator), and so does the fp32 gradient list of gradient
// accumulation.  The fp32 master, Adam m and v of a trainable chunk are
// placed at build: in host memory while they fit host_capacity_bytes (less
// the staging buffers), else on the drive: the three lists back to back in
// consecutive slots of the NvmeStore's data file, 4 MiB each
// (kNvmePieceBytes), so that one chunk's move keeps several requests in
// flight.
//
// The step streams the chunks on the drive through a ring of S staging
// buffers: chunk j is read into buffer j % S; the reads of chunks
// j+1 .. j+S-2 and the write-back of chunk j-1 are in flight while chunk j
// is updated; before chunk j+S-1 is read into the buffer of chunk j-1, that
// write-back is waited for.  So the step approaches the drive's bound when
// the update is faster than the I/O, and the update's bound otherwise.
//
// Host code outside the step (values, state, checkpoints, a skipped step's
// restore) reaches such a chunk's lists through nvme_access(), which stages
// one chunk at a time into the access buffer and writes it back when it
// changed, before another chunk is staged or at nvme_flush_access().
//
// Failure: an I/O error inside a step leaves some chunks updated and some
// not, so the engine records it (nvme_failed_) and refuses iterations and
// steps until pstar_checkpoint_load() has rewritten every state (no A/B
// slots: a slot is overwritten in place).  An error outside a step (reading
// values or state) changes nothing but is recorded the same way, since the
// drive can no longer be trusted to hold the state.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/engine.h"
#include "util/log.h"

#if PSTAR_HAVE_NVME
#include "memory/nvme_store.h"
#endif

namespace pstar::engine {

namespace {
// Staging buffers of the step's ring when the caller says 0.
constexpr uint32_t kDefaultStagingBuffers = 4;
// Alignment the data file's O_DIRECT I/O needs (NvmeStore::kAlignBytes).
constexpr uint64_t kNvmeAlignBytes = 4096;
// A chunk's lists move in pieces of this many bytes, one slot each, so that
// several requests of one chunk are in flight at once (the drive's
// bandwidth in `pstar-bench nvme` is measured with the same request size).
constexpr uint64_t kNvmePieceBytes = uint64_t{4} << 20;

#if PSTAR_HAVE_NVME
using Tickets = std::vector<memory::NvmeStore::Ticket>;

// Submits the pieces of a chunk's `bytes` (slots first_slot, first_slot+1,
// ...) between `buf` and the drive; appends their tickets.
void submit_pieces(memory::NvmeStore& store, uint32_t first_slot, uint64_t bytes, float* buf, bool write,
                   Tickets& out) {
  auto* base = reinterpret_cast<char*>(buf);
  for (uint64_t at = 0, i = 0; at < bytes; at += kNvmePieceBytes, ++i) {
    const uint64_t n = std::min(kNvmePieceBytes, bytes - at);
    const auto slot = static_cast<uint32_t>(first_slot + i);
    out.push_back(write ? store.write_async(slot, base + at, n) : store.read_async(slot, base + at, n));
  }
}

void wait_tickets(memory::NvmeStore& store, Tickets& tickets) {
  for (auto t : tickets) store.wait(t);
  tickets.clear();
}

// submit_pieces, then waits for them.
void transfer(memory::NvmeStore& store, uint32_t first_slot, uint64_t bytes, float* buf, bool write) {
  Tickets t;
  submit_pieces(store, first_slot, bytes, buf, write, t);
  wait_tickets(store, t);
}
#endif
}  // namespace

void Engine::NvmeDeleter::operator()(memory::NvmeStore* s) const {
#if PSTAR_HAVE_NVME
  delete s;
#else
  (void)s;  // never constructed without the store
#endif
}

void Engine::set_nvme(const pstar_x_nvme_options& in) {
  require(!built(), PSTAR_ERR_INVALID_STATE,
          "set_nvme: the engine is built; give it an NVMe tier before pstar_engine_build");
  require(!nvme_requested_, PSTAR_ERR_INVALID_STATE, "set_nvme: the engine has an NVMe tier already");
#if !PSTAR_HAVE_NVME
  (void)in;
  throw Error(PSTAR_ERR_UNSUPPORTED,
              "set_nvme: this libpstar was built without the NVMe tier (needs libuv and xxhash)");
#else
  // Its size and version are checked by the C API (capi/engine.cpp).
  require(!payloads_ || (in.dir != nullptr && in.dir[0] != '\0'), PSTAR_ERR_INVALID_ARGUMENT,
          "set_nvme: dir is NULL or empty");
  require(std::isfinite(in.read_bytes_per_s) && std::isfinite(in.write_bytes_per_s) && in.read_bytes_per_s >= 0 &&
              in.write_bytes_per_s >= 0,
          PSTAR_ERR_INVALID_ARGUMENT, "set_nvme: read_bytes_per_s and write_bytes_per_s must be finite and >= 0");
  require(in.staging_buffers == 0 || in.staging_buffers >= 2, PSTAR_ERR_INVALID_ARGUMENT,
          "set_nvme: staging_buffers must be 0 (default) or at least 2");
  require(!options_.hybrid_optimizer, PSTAR_ERR_UNSUPPORTED, "set_nvme: not available with hybrid optimizer placement");
  nvme_opts_ = in;
  if (nvme_opts_.read_bytes_per_s == 0) nvme_opts_.read_bytes_per_s = PSTAR_X_DEFAULT_NVME_READ_BYTES_PER_S;
  if (nvme_opts_.write_bytes_per_s == 0) nvme_opts_.write_bytes_per_s = PSTAR_X_DEFAULT_NVME_WRITE_BYTES_PER_S;
  if (nvme_opts_.staging_buffers == 0) nvme_opts_.staging_buffers = kDefaultStagingBuffers;
  if (nvme_opts_.max_inflight == 0) nvme_opts_.max_inflight = memory::NvmeStore::kDefaultMaxInflight;
  nvme_dir_ = in.dir != nullptr ? in.dir : "";
  nvme_opts_.dir = nvme_dir_.c_str();
  // The data file is created now, so that a directory that cannot be used
  // fails here and not at build.  A dry run has no file.
  if (payloads_) nvme_.reset(new memory::NvmeStore(nvme_dir_, nvme_opts_.max_inflight, nvme_opts_.buffered == 0));
  nvme_requested_ = true;
#endif
}

uint64_t Engine::nvme_slot_bytes(uint32_t k) const { return 3 * fp32_bytes_held(k); }

void Engine::stage_pointers(ChunkState& c, float* base, uint64_t fp32_elems) {
  c.master = base;
  c.exp_avg = base == nullptr ? nullptr : base + fp32_elems;
  c.exp_avg_sq = base == nullptr ? nullptr : base + 2 * fp32_elems;
}

void Engine::nvme_place_lists(std::vector<ChunkState>& chunks, uint64_t largest_trainable_elems) {
#if PSTAR_HAVE_NVME
  if (!nvme_requested_ || largest_trainable_elems == 0) return;
  // The staging buffers first: they are what makes the drive usable at all.
  nvme_buffer_bytes_ = memory::NvmeStore::padded(3 * largest_trainable_elems * sizeof(float));
  auto take = [&](StagingBuffer& b) {
    b.raw = host_->acquire(nvme_buffer_bytes_ + kNvmeAlignBytes);
    const auto addr = reinterpret_cast<uintptr_t>(b.raw);
    b.data = reinterpret_cast<float*>((addr + kNvmeAlignBytes - 1) / kNvmeAlignBytes * kNvmeAlignBytes);
  };
  nvme_ring_.resize(nvme_opts_.staging_buffers);
  for (StagingBuffer& b : nvme_ring_) take(b);
  take(nvme_access_buf_);
  // A dry run's host buffers are address space only: nothing is written.
  const bool io = nvme_ != nullptr;
  // Then, in layout order, each trainable chunk's lists on the host while
  // they fit (checked before acquiring: the pool's OOM is for real
  // shortages), else in a slot holding zeros like a fresh host list.
  if (io) std::memset(nvme_access_buf_.data, 0, nvme_buffer_bytes_);
  Tickets zeroing;
  uint32_t on_drive = 0;
  uint64_t drive_bytes = 0;
  for (uint32_t k = 0; k < chunks.size(); ++k) {
    const auto& info = layout_->chunks()[k];
    if (info.frozen) continue;
    ChunkState& c = chunks[k];
    // With world > 1 this rank's shards of the lists.
    const uint64_t fp32_bytes = (sharded() ? c.shard_elems : info.capacity_elems) * sizeof(float);
    if (host_->can_acquire(3 * fp32_bytes)) {
      for (float** b : {&c.master, &c.exp_avg, &c.exp_avg_sq}) {
        *b = static_cast<float*>(host_->acquire(fp32_bytes));
        if (io) std::memset(*b, 0, fp32_bytes);
      }
      continue;
    }
    drive_bytes += memory::NvmeStore::padded(3 * fp32_bytes);
    require(nvme_opts_.capacity_bytes == 0 || drive_bytes <= nvme_opts_.capacity_bytes, PSTAR_ERR_OUT_OF_MEMORY, [&] {
      return "engine_build: the NVMe tier's capacity (" + std::to_string(nvme_opts_.capacity_bytes) +
             " bytes) cannot take the optimizer state that does not fit in host memory (" +
             std::to_string(drive_bytes) + " bytes so far)";
    });
    ++on_drive;
    if (!io) {
      c.nvme_slot = nvme_dry_slots_++;
      continue;
    }
    for (uint64_t at = 0; at < 3 * fp32_bytes; at += kNvmePieceBytes) {
      const uint32_t slot = nvme_->add_slot(std::min(kNvmePieceBytes, 3 * fp32_bytes - at));
      if (at == 0) c.nvme_slot = slot;
    }
    submit_pieces(*nvme_, c.nvme_slot, 3 * fp32_bytes, nvme_access_buf_.data, true, zeroing);
  }
  if (io) nvme_->wait_all();
  if (on_drive == 0) nvme_release(chunks);  // everything fit: give the staging memory back
  log::info("NVMe tier: optimizer state of " + std::to_string(on_drive) + " chunks on the drive (" +
            (!io ? std::string("dry run") : (nvme_->direct() ? "O_DIRECT, " : "buffered, ") + nvme_->path()) + ")");
#else
  (void)chunks;
  (void)largest_trainable_elems;
#endif
}

void Engine::nvme_release(std::vector<ChunkState>& chunks) {
#if PSTAR_HAVE_NVME
  // No request may outlive the buffers it reads or writes (a build that
  // failed part way has zero-writes in flight from the access buffer).
  if (nvme_ != nullptr) {
    try {
      nvme_->wait_all();
    } catch (const Error&) {
    }
  }
#endif
  for (ChunkState& c : chunks) {
    if (c.nvme_slot != kNoSlot) stage_pointers(c, nullptr, 0);
  }
  for (StagingBuffer& b : nvme_ring_) host_->release(b.raw, nvme_buffer_bytes_ + kNvmeAlignBytes);
  if (nvme_access_buf_.raw != nullptr) host_->release(nvme_access_buf_.raw, nvme_buffer_bytes_ + kNvmeAlignBytes);
  nvme_ring_.clear();
  nvme_access_buf_ = StagingBuffer{};
  nvme_access_chunk_ = -1;
}

void Engine::nvme_fail(const Error& e, const char* what) {
  nvme_failed_ = true;
  nvme_failure_ = e.what();
  log::error(std::string(what) + ": " + nvme_failure_);
  throw Error(PSTAR_ERR_IO, std::string(what) + ": " + nvme_failure_ +
                                "; the optimizer state on the drive is not trusted any more: training is refused "
                                "until pstar_checkpoint_load() rewrites it");
}

void Engine::require_nvme_ok(const char* what) const {
  require(!nvme_failed_, PSTAR_ERR_IO, [&] {
    return std::string(what) + ": refused after an NVMe I/O error (" + nvme_failure_ +
           "); load a checkpoint (pstar_checkpoint_load) to go on";
  });
  require_load_complete(what);  // the other way the state can be half-written
}

void Engine::nvme_access(uint32_t k, bool write) {
#if PSTAR_HAVE_NVME
  ChunkState& c = chunks_[k];
  if (c.nvme_slot == kNoSlot) return;
  if (nvme_ == nullptr) internal_error("nvme_access in a dry run");
  if (nvme_access_chunk_ != static_cast<int64_t>(k)) {
    nvme_flush_access();
    try {
      transfer(*nvme_, c.nvme_slot, nvme_slot_bytes(k), nvme_access_buf_.data, false);
    } catch (const Error& e) {
      nvme_fail(e, "NVMe read");
    }
    stage_pointers(c, nvme_access_buf_.data, fp32_bytes_held(k) / sizeof(float));
    nvme_access_chunk_ = k;
  }
  nvme_access_dirty_ = nvme_access_dirty_ || write;
#else
  (void)k;
  (void)write;
#endif
}

void Engine::nvme_flush_access() {
#if PSTAR_HAVE_NVME
  if (nvme_access_chunk_ < 0) return;
  const auto k = static_cast<uint32_t>(nvme_access_chunk_);
  ChunkState& c = chunks_[k];
  nvme_access_chunk_ = -1;
  stage_pointers(c, nullptr, 0);
  if (!nvme_access_dirty_) return;
  nvme_access_dirty_ = false;
  try {
    transfer(*nvme_, c.nvme_slot, nvme_slot_bytes(k), nvme_access_buf_.data, true);
  } catch (const Error& e) {
    nvme_fail(e, "NVMe write-back");
  }
#endif
}

void Engine::nvme_update_chunks(const std::vector<uint32_t>& order, const std::function<void(uint32_t)>& update) {
#if PSTAR_HAVE_NVME
  if (nvme_ring_.empty()) {
    for (uint32_t k : order) update(k);
    return;
  }
  if (!nvme_) {
    // Dry run: no file; the clock advances by the drive's time for the
    // step's reads and writes, one after the other (the update's own time
    // is the caller's to model: a dry run computes nothing).
    uint64_t bytes = 0;
    for (uint32_t k : order) {
      if (chunks_[k].nvme_slot != kNoSlot) bytes += memory::NvmeStore::padded(nvme_slot_bytes(k));
      update(k);
    }
    nvme_step_read_ += bytes;
    nvme_step_written_ += bytes;
    const double s = double(bytes) / nvme_opts_.read_bytes_per_s + double(bytes) / nvme_opts_.write_bytes_per_s;
    device_->advance_clock(s);
    nvme_wait_seconds_ += s;
    return;
  }
  nvme_flush_access();
  // Test hook (tests/capi/test_nvme.c): PSTAR_TEST_NVME_FAULT=KIND:N, seen
  // by a step, makes the request after N more of its direction fail
  // (write_nospace, read_eio, write_corrupt).
  if (const char* f = std::getenv("PSTAR_TEST_NVME_FAULT")) {
    const std::string spec(f);
    const size_t colon = spec.find(':');
    const std::string kind = spec.substr(0, colon);
    const uint64_t after = colon == std::string::npos ? 0 : std::strtoull(spec.c_str() + colon + 1, nullptr, 10);
    using K = memory::NvmeStore::FaultKind;
    if (kind == "write_nospace") nvme_->inject_fault(K::kWriteNoSpace, after);
    if (kind == "read_eio") nvme_->inject_fault(K::kReadIo, after);
    if (kind == "write_corrupt") nvme_->inject_fault(K::kWriteCorrupt, after);
  }
  std::vector<uint32_t> disk;  // the chunks of `order` on the drive, in order
  for (uint32_t k : order) {
    if (chunks_[k].nvme_slot != kNoSlot) disk.push_back(k);
  }
  const size_t ring = nvme_ring_.size();
  std::vector<Tickets> reads(disk.size()), writes(disk.size());
  auto timed_wait = [&](Tickets& t) {
    const auto t0 = std::chrono::steady_clock::now();
    wait_tickets(*nvme_, t);
    nvme_wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto start_read = [&](size_t j) {
    if (j >= disk.size()) return;
    // Buffer j % ring was last used by chunk j - ring: its write-back first.
    if (j >= ring) timed_wait(writes[j - ring]);
    submit_pieces(*nvme_, chunks_[disk[j]].nvme_slot, nvme_slot_bytes(disk[j]), nvme_ring_[j % ring].data, false,
                  reads[j]);
    nvme_step_read_ += memory::NvmeStore::padded(nvme_slot_bytes(disk[j]));
  };
  try {
    for (size_t j = 0; j + 1 < ring && j < disk.size(); ++j) start_read(j);
    size_t next = 0;  // index in `disk` of the next chunk on the drive
    for (uint32_t k : order) {
      ChunkState& c = chunks_[k];
      if (c.nvme_slot == kNoSlot) {
        update(k);
        continue;
      }
      const size_t j = next++;
      timed_wait(reads[j]);
      float* buf = nvme_ring_[j % ring].data;
      stage_pointers(c, buf, fp32_bytes_held(k) / sizeof(float));
      update(k);
      stage_pointers(c, nullptr, 0);
      submit_pieces(*nvme_, c.nvme_slot, nvme_slot_bytes(k), buf, true, writes[j]);
      nvme_step_written_ += memory::NvmeStore::padded(nvme_slot_bytes(k));
      start_read(j + ring - 1);
    }
    const auto t0 = std::chrono::steady_clock::now();
    nvme_->wait_all();
    nvme_wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } catch (const Error& e) {
    for (uint32_t k : disk) stage_pointers(chunks_[k], nullptr, 0);
    try {
      nvme_->wait_all();  // no request may outlive this call's buffers' use
    } catch (const Error&) {
    }
    nvme_fail(e, "step: NVMe I/O");
  }
#else
  for (uint32_t k : order) update(k);
#endif
}

void Engine::nvme_begin_rewrite() {
#if PSTAR_HAVE_NVME
  if (nvme_ring_.empty() || nvme_ == nullptr) return;
  if (nvme_access_chunk_ >= 0) stage_pointers(chunks_[static_cast<uint32_t>(nvme_access_chunk_)], nullptr, 0);
  nvme_access_chunk_ = -1;
  nvme_access_dirty_ = false;
  std::memset(nvme_access_buf_.data, 0, nvme_buffer_bytes_);
  try {
    Tickets t;
    for (uint32_t k = 0; k < chunks_.size(); ++k) {
      if (chunks_[k].nvme_slot != kNoSlot)
        submit_pieces(*nvme_, chunks_[k].nvme_slot, nvme_slot_bytes(k), nvme_access_buf_.data, true, t);
    }
    nvme_->wait_all();
  } catch (const Error& e) {
    nvme_fail(e, "checkpoint_load: NVMe write");
  }
#endif
}

void Engine::nvme_end_rewrite() {
  nvme_flush_access();
  nvme_failed_ = false;
  nvme_failure_.clear();
}

void Engine::fill_nvme_stats(pstar_x_nvme_stats* out) const {
#if PSTAR_HAVE_NVME
  require(nvme_requested_, PSTAR_ERR_INVALID_STATE, "nvme_get_stats: the engine has no NVMe tier");
  pstar_x_nvme_stats s{};
  s.size = sizeof s;
  s.version = PSTAR_X_NVME_STATS_VERSION;
  s.direct = nvme_ != nullptr && nvme_->direct() ? 1 : 0;
  if (built()) {
    for (uint32_t k = 0; k < chunks_.size(); ++k) {
      if (chunks_[k].nvme_slot == kNoSlot) continue;
      ++s.chunks_on_nvme;
      s.bytes_on_nvme += memory::NvmeStore::padded(nvme_slot_bytes(k));
    }
  }
  if (nvme_ != nullptr) {
    const auto io = nvme_->stats();
    s.bytes_read = io.bytes_read;
    s.bytes_written = io.bytes_written;
  }
  s.step_io_wait_seconds = nvme_wait_seconds_;
  s.step_bytes_read = nvme_step_read_;
  s.step_bytes_written = nvme_step_written_;
  *out = s;
#else
  (void)out;
  throw Error(PSTAR_ERR_INVALID_STATE, "nvme_get_stats: the engine has no NVMe tier");
#endif
}

}  // namespace pstar::engine
