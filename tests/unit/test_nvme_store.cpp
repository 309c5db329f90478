// The NVMe tier's file store (src/memory/nvme_store.h) in a temporary
// directory under the build tree (PSTAR_TEST_TMP_DIR), in O_DIRECT mode
// where the build's filesystem allows it and in buffered mode.
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "../../bench/nvme_disk.h"
#include "memory/nvme_store.h"
#include "util/error.h"

using pstar::memory::NvmeStore;

namespace {

constexpr size_t kAlign = NvmeStore::kAlignBytes;

// A fresh directory, removed with whatever is left in it.
struct TempDir {
  std::string path;
  TempDir() {
    path = std::string(PSTAR_TEST_TMP_DIR) + "/nvme-XXXXXX";
    cr_assert_not_null(mkdtemp(path.data()), "mkdtemp under %s: %s", PSTAR_TEST_TMP_DIR, std::strerror(errno));
  }
  ~TempDir() {
    for (const std::string& f : entries()) ::unlink((path + "/" + f).c_str());
    ::rmdir(path.c_str());
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    DIR* d = opendir(path.c_str());
    while (const dirent* e = d != nullptr ? readdir(d) : nullptr) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
    }
    if (d != nullptr) closedir(d);
    return names;
  }
};

// Independent of the store: does open(O_DIRECT) plus one aligned write and
// read of a block work in `dir`?
bool direct_works(const std::string& dir) {
  const std::string path = dir + "/probe";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
  bool ok = fd >= 0;
  if (ok) {
    NvmeStore::AlignedBuffer block = NvmeStore::allocate_aligned(kAlign);
    ok = pwrite(fd, block.get(), kAlign, 0) == static_cast<ssize_t>(kAlign) &&
         pread(fd, block.get(), kAlign, 0) == static_cast<ssize_t>(kAlign);
    ::close(fd);
  }
  ::unlink(path.c_str());
  return ok;
}

void fill(uint8_t* p, uint64_t bytes, uint32_t seed) {
  for (uint64_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>((i * 2654435761u + seed) >> 7);
}

bool holds(const uint8_t* p, uint64_t bytes, uint32_t seed) {
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != static_cast<uint8_t>((i * 2654435761u + seed) >> 7)) return false;
  }
  return true;
}

// `f` throws pstar::Error with `status` and a message containing every word.
void expect_error(const std::function<void()>& f, pstar_status status, std::initializer_list<std::string> words) {
  try {
    f();
  } catch (const pstar::Error& e) {
    cr_assert_eq(e.status(), status, "status %d, expected %d: %s", e.status(), status, e.what());
    for (const std::string& w : words) {
      cr_assert(std::string(e.what()).find(w) != std::string::npos, "'%s' not in: %s", w.c_str(), e.what());
    }
    return;
  }
  cr_assert_fail("no error thrown");
}

// Writes then reads back every slot of `sizes` in `store`.
void round_trip(NvmeStore& store, const std::vector<uint64_t>& sizes) {
  std::vector<uint32_t> slots;
  std::vector<NvmeStore::AlignedBuffer> out, in;
  for (size_t k = 0; k < sizes.size(); ++k) {
    slots.push_back(store.add_slot(sizes[k]));
    out.push_back(NvmeStore::allocate_aligned(sizes[k]));
    in.push_back(NvmeStore::allocate_aligned(sizes[k]));
    fill(out[k].get(), sizes[k], static_cast<uint32_t>(k + 1));
    store.write_async(slots[k], out[k].get(), sizes[k]);
  }
  store.wait_all();
  std::vector<NvmeStore::Ticket> reads;
  for (size_t k = 0; k < sizes.size(); ++k) reads.push_back(store.read_async(slots[k], in[k].get(), sizes[k]));
  for (size_t k = 0; k < sizes.size(); ++k) {
    store.wait(reads[k]);
    cr_assert(holds(in[k].get(), sizes[k], static_cast<uint32_t>(k + 1)), "slot %u of %lu bytes differs", slots[k],
              static_cast<unsigned long>(sizes[k]));
  }
}

// Every injected fault fails its request with PSTAR_ERR_IO, and the store
// goes on working.
void faults(bool try_direct) {
  TempDir dir;
  NvmeStore store(dir.path, 4, try_direct);
  constexpr uint64_t kBytes = 3 * kAlign + 123;
  const uint32_t a = store.add_slot(kBytes);
  const uint32_t b = store.add_slot(kBytes);
  NvmeStore::AlignedBuffer buf = NvmeStore::allocate_aligned(kBytes);
  NvmeStore::AlignedBuffer back = NvmeStore::allocate_aligned(kBytes);
  fill(buf.get(), kBytes, 7);

  // Disk full on the second write: slot b then holds nothing valid.
  store.inject_fault(NvmeStore::FaultKind::kWriteNoSpace, 1);
  store.wait(store.write_async(a, buf.get(), kBytes));
  const NvmeStore::Ticket full = store.write_async(b, buf.get(), kBytes);
  expect_error([&] { store.wait(full); }, PSTAR_ERR_IO, {"disk full", store.path(), "slot 1", "offset 16384"});
  expect_error([&] { store.wait(store.read_async(b, back.get(), kBytes)); }, PSTAR_ERR_INVALID_STATE, {"slot 1"});
  store.wait(store.read_async(a, back.get(), kBytes));
  cr_assert(holds(back.get(), kBytes, 7));
  store.wait(store.write_async(b, buf.get(), kBytes));

  // A read error leaves the data intact.
  store.inject_fault(NvmeStore::FaultKind::kReadIo, 0);
  std::memset(back.get(), 0, kBytes);
  expect_error([&] { store.wait(store.read_async(b, back.get(), kBytes)); }, PSTAR_ERR_IO,
               {std::strerror(EIO), store.path(), "slot 1"});
  store.wait(store.read_async(b, back.get(), kBytes));
  cr_assert(holds(back.get(), kBytes, 7));

  // A flipped byte on disk is caught by the next read of that slot only,
  // and rewriting the slot repairs it.
  store.inject_fault(NvmeStore::FaultKind::kWriteCorrupt, 0);
  store.wait(store.write_async(a, buf.get(), kBytes));
  expect_error([&] { store.wait(store.read_async(a, back.get(), kBytes)); }, PSTAR_ERR_IO,
               {"corrupted", "slot 0 of " + store.path()});
  store.wait(store.read_async(b, back.get(), kBytes));
  store.wait(store.write_async(a, buf.get(), kBytes));
  std::memset(back.get(), 0, kBytes);
  store.wait(store.read_async(a, back.get(), kBytes));
  cr_assert(holds(back.get(), kBytes, 7));
}

}  // namespace

Test(nvme_store, round_trips_slots_of_several_sizes) {
  TempDir dir;
  NvmeStore store(dir.path);
  round_trip(store, {kAlign, 10000, (1u << 20) + 100, 3u << 20, 1});
  const NvmeStore::Stats st = store.stats();
  cr_assert_eq(st.writes, 5u);
  cr_assert_eq(st.reads, 5u);
  const uint64_t padded = kAlign + 12288 + (1u << 20) + kAlign + (3u << 20) + kAlign;
  cr_assert_eq(st.bytes_written, padded);
  cr_assert_eq(st.bytes_read, padded);
  cr_assert_gt(st.busy_seconds, 0.0);
}

Test(nvme_store, queues_requests_beyond_max_inflight_in_order) {
  TempDir dir;
  constexpr uint32_t kMaxInflight = 3;
  constexpr uint32_t kSlots = 40;
  constexpr uint64_t kBytes = 256 << 10;
  NvmeStore store(dir.path, kMaxInflight);
  std::vector<NvmeStore::AlignedBuffer> bufs;
  for (uint32_t k = 0; k < kSlots; ++k) {
    store.add_slot(kBytes);
    bufs.push_back(NvmeStore::allocate_aligned(kBytes));
    fill(bufs[k].get(), kBytes, k);
    store.write_async(k, bufs[k].get(), kBytes);
  }
  // Write, write again and read one slot without waiting: per-slot order
  // makes the read see the second write.
  NvmeStore::AlignedBuffer second = NvmeStore::allocate_aligned(kBytes);
  fill(second.get(), kBytes, 1000);
  store.write_async(0, second.get(), kBytes);
  NvmeStore::AlignedBuffer first_back = NvmeStore::allocate_aligned(kBytes);
  const NvmeStore::Ticket reread = store.read_async(0, first_back.get(), kBytes);
  store.wait(reread);
  cr_assert(holds(first_back.get(), kBytes, 1000));
  store.wait_all();
  std::vector<NvmeStore::Ticket> tickets;
  for (uint32_t k = 1; k < kSlots; ++k) {
    std::memset(bufs[k].get(), 0, kBytes);
    tickets.push_back(store.read_async(k, bufs[k].get(), kBytes));
  }
  for (uint32_t k = 1; k < kSlots; ++k) {
    store.wait(tickets[k - 1]);
    cr_assert(holds(bufs[k].get(), kBytes, k), "slot %u", k);
  }
  const NvmeStore::Stats st = store.stats();
  cr_assert_eq(st.writes, kSlots + 1);
  cr_assert_eq(st.reads, kSlots);
  cr_assert(st.inflight_peak >= 1 && st.inflight_peak <= kMaxInflight, "peak %u", st.inflight_peak);
}

Test(nvme_store, adds_slots_while_io_is_in_flight) {
  TempDir dir;
  NvmeStore store(dir.path, 2);
  const uint32_t a = store.add_slot(1 << 20);
  NvmeStore::AlignedBuffer buf = NvmeStore::allocate_aligned(1 << 20);
  fill(buf.get(), 1 << 20, 3);
  const NvmeStore::Ticket t = store.write_async(a, buf.get(), 1 << 20);
  const uint32_t b = store.add_slot(5000);
  cr_assert_eq(b, a + 1);
  cr_assert_eq(store.slot_count(), 2u);
  cr_assert_eq(store.slot_bytes(b), 5000u);
  NvmeStore::AlignedBuffer small = NvmeStore::allocate_aligned(5000);
  fill(small.get(), 5000, 4);
  store.wait(store.write_async(b, small.get(), 5000));
  store.wait(t);
  std::memset(small.get(), 0, 5000);
  store.wait(store.read_async(b, small.get(), 5000));
  cr_assert(holds(small.get(), 5000, 4));
}

Test(nvme_store, direct_mode_matches_the_probe_and_buffered_mode_works) {
  TempDir dir;
  {
    NvmeStore store(dir.path);
    cr_assert_eq(store.direct(), direct_works(dir.path), "build tree: store direct=%d", store.direct());
    round_trip(store, {kAlign, 70000});
  }
  {
    NvmeStore store(dir.path, 4, false);
    cr_assert(!store.direct());
    round_trip(store, {kAlign, 70000});
  }
  // tmpfs: refuses O_DIRECT before Linux 6.6, accepts it since; either way
  // the store must agree with the probe.
  struct stat st{};
  if (::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && ::access("/dev/shm", W_OK) == 0) {
    NvmeStore store("/dev/shm");
    cr_assert_eq(store.direct(), direct_works("/dev/shm"), "/dev/shm: store direct=%d", store.direct());
    round_trip(store, {kAlign, 70000});
  }
}

Test(nvme_store, injected_faults_fail_with_io_errors_direct) { faults(true); }

Test(nvme_store, injected_faults_fail_with_io_errors_buffered) { faults(false); }

Test(nvme_store, notices_a_removed_data_file) {
  TempDir dir;
  NvmeStore store(dir.path);
  const uint32_t s = store.add_slot(kAlign);
  NvmeStore::AlignedBuffer buf = NvmeStore::allocate_aligned(kAlign);
  store.check_file();
  cr_assert_eq(::unlink(store.path().c_str()), 0);
  expect_error([&] { store.check_file(); }, PSTAR_ERR_IO, {"removed", store.path()});
  expect_error([&] { store.wait(store.write_async(s, buf.get(), kAlign)); }, PSTAR_ERR_IO, {"removed"});
}

Test(nvme_store, rejects_bad_directories_and_misuse) {
  TempDir dir;
  const std::string missing = dir.path + "/missing";
  expect_error([&] { NvmeStore store(missing); }, PSTAR_ERR_INVALID_ARGUMENT, {missing});
  const std::string file = dir.path + "/file";
  ::close(::open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  expect_error([&] { NvmeStore store(file); }, PSTAR_ERR_INVALID_ARGUMENT, {file, "not a directory"});
  ::unlink(file.c_str());

  NvmeStore store(dir.path);
  const uint32_t s = store.add_slot(10000);
  NvmeStore::AlignedBuffer buf = NvmeStore::allocate_aligned(10000 + 64);
  expect_error([&] { store.write_async(s, buf.get() + 64, 10000); }, PSTAR_ERR_INVALID_ARGUMENT, {"aligned"});
  expect_error([&] { store.read_async(s, buf.get(), 10000); }, PSTAR_ERR_INVALID_STATE, {"never written"});
  expect_error([&] { store.write_async(s, buf.get(), 10001); }, PSTAR_ERR_INVALID_ARGUMENT, {"slot 0"});
  expect_error([&] { store.write_async(s + 1, buf.get(), 1); }, PSTAR_ERR_INVALID_ARGUMENT, {"does not exist"});
  const NvmeStore::Ticket t = store.write_async(s, buf.get(), 10000);
  expect_error([&] { store.read_async(s, buf.get() + 64, 10000); }, PSTAR_ERR_INVALID_ARGUMENT, {"aligned"});
  expect_error([&] { store.read_async(s, buf.get(), 9999); }, PSTAR_ERR_INVALID_ARGUMENT, {"last write"});
  store.wait(t);
  expect_error([&] { store.done(t); }, PSTAR_ERR_INVALID_ARGUMENT, {"ticket"});
  expect_error([&] { store.add_slot(0); }, PSTAR_ERR_INVALID_ARGUMENT, {"slot"});
  // More than any test filesystem holds or allows in one file: ENOSPC or
  // EFBIG; the store is unchanged and goes on.
  expect_error([&] { store.add_slot(uint64_t{1} << 60); }, PSTAR_ERR_IO, {store.path(), "slot 1"});
  cr_assert_eq(store.add_slot(kAlign), 1u);
}

Test(nvme_store, destructor_removes_the_data_file) {
  TempDir dir;
  std::string path;
  {
    NvmeStore store(dir.path);
    path = store.path();
    cr_assert_eq(path.rfind(dir.path + "/pstar-nvme-", 0), 0u, "%s", path.c_str());
    round_trip(store, {kAlign});
    cr_assert_eq(dir.entries().size(), 1u);
  }
  struct stat st{};
  cr_assert_neq(::stat(path.c_str(), &st), 0);
  cr_assert(dir.entries().empty());
}

Test(nvme_store, measures_disk_bandwidth) {
  TempDir dir;
  const pstar::bench::DiskBandwidth bw = pstar::bench::measure_disk_bandwidth(dir.path, 8u << 20, 1u << 20, 4);
  cr_assert_eq(bw.bytes, 8u << 20);
  cr_assert_gt(bw.write_gbps, 0.0);
  cr_assert_gt(bw.read_gbps, 0.0);
  cr_assert_eq(bw.direct, direct_works(dir.path));
  cr_assert(bw.inflight_peak >= 1 && bw.inflight_peak <= 4);
  cr_assert(dir.entries().empty());
}
