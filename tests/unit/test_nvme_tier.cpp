// The NVMe tier (src/memory/nvme_tier.h) without an engine: placement
// against a host budget, the access buffer, the step's ring, failures and
// the rewrite of a checkpoint load, a dry run's clock.  Chunk lists are
// plain per-chunk pointers here, as the engine's chunk states hold them.
#include <criterion/criterion.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "memory/emulated_device.h"
#include "memory/host_pool.h"
#include "memory/modelled_device.h"
#include "memory/nvme_store.h"
#include "memory/nvme_tier.h"
#include "util/error.h"

using pstar::Error;
using pstar::memory::EmulatedDevice;
using pstar::memory::HostPool;
using pstar::memory::ModelledDevice;
using pstar::memory::NvmeStore;
using pstar::memory::NvmeTier;

namespace {

// One list per chunk of kElems floats (4 KiB), so 12 KiB a chunk; a staging
// buffer is that plus the alignment slack.
constexpr uint64_t kElems = 1024;
constexpr uint64_t kChunkBytes = 3 * kElems * sizeof(float);
constexpr uint64_t kStagingBytes = kChunkBytes + NvmeStore::kAlignBytes;
// Adam's moments as fp32 (the tier's layout is then three fp32 lists end to end).
uint64_t fp32_moments(uint64_t elems) { return elems * sizeof(float); }

struct TempDir {
  std::string path;
  TempDir() {
    path = std::string(PSTAR_TEST_TMP_DIR) + "/nvme-tier-XXXXXX";
    cr_assert_not_null(mkdtemp(path.data()), "mkdtemp: %s", std::strerror(errno));
  }
  ~TempDir() { ::rmdir(path.c_str()); }  // the tier removes its data file
};

// The engine's side: where each chunk's lists are.
struct Lists {
  float* m = nullptr;
  float* a = nullptr;
  float* v = nullptr;
};

struct Fixture {
  TempDir dir;
  EmulatedDevice dev{false, 0};
  HostPool host;
  std::vector<Lists> lists;
  NvmeTier tier;
  // `host_chunks` chunks' lists fit in the host budget after the staging
  // buffers (a ring of `ring` and the access buffer).
  Fixture(uint32_t chunks, uint32_t host_chunks, uint32_t ring)
      : host(&dev, (ring + 1) * kStagingBytes + host_chunks * kChunkBytes), lists(chunks) {
    pstar_x_nvme_options o{};
    o.size = sizeof o;
    o.version = PSTAR_X_NVME_OPTIONS_VERSION;
    o.dir = dir.path.c_str();
    o.staging_buffers = ring;
    o.buffered = 1;  // the build tree's filesystem may refuse O_DIRECT
    tier.open(o, true, &dev, &host, [this](uint32_t k, float* m, float* a, float* v) { lists[k] = {m, a, v}; });
    tier.place(std::vector<uint64_t>(chunks, kElems), kElems, fp32_moments,
               [this](uint32_t k, float* m, float* a, float* v) {
                 lists[k] = {m, a, v};
               });
  }
  ~Fixture() {
    tier.release();  // points the staged chunk's lists at null: those left are host lists
    for (uint32_t k = 0; k < lists.size(); ++k) {
      if (lists[k].m == nullptr) continue;
      for (float* p : {lists[k].m, lists[k].a, lists[k].v}) host.release(p, kElems * sizeof(float));
    }
  }
  void fill(uint32_t k, float x) {
    for (uint64_t i = 0; i < kElems; ++i) {
      lists[k].m[i] = x + i;
      lists[k].a[i] = 2 * x;
      lists[k].v[i] = 3 * x;
    }
  }
  bool holds(uint32_t k, float x) const {
    for (uint64_t i = 0; i < kElems; ++i) {
      if (lists[k].m[i] != x + i || lists[k].a[i] != 2 * x || lists[k].v[i] != 3 * x) return false;
    }
    return true;
  }
};

pstar_x_nvme_stats stats(const NvmeTier& t) {
  pstar_x_nvme_stats s{};
  t.fill_stats(&s);
  return s;
}

}  // namespace

Test(nvme_tier, places_lists_on_the_host_while_they_fit_then_on_the_drive) {
  Fixture f(5, 2, 2);
  for (uint32_t k = 0; k < 5; ++k) {
    cr_assert_eq(f.tier.on_drive(k), k >= 2, "chunk %u", k);
    // Host lists are handed over zero-filled; drive lists are not staged.
    if (k < 2) {
      cr_assert_not_null(f.lists[k].v);
      cr_assert_eq(f.lists[k].m[kElems - 1], 0.0f);
    } else {
      cr_assert_null(f.lists[k].m);
    }
  }
  const auto s = stats(f.tier);
  cr_assert_eq(s.chunks_on_nvme, 3u);
  cr_assert_eq(s.bytes_on_nvme, 3 * NvmeStore::padded(kChunkBytes));
  cr_assert_eq(s.bytes_written, 3 * NvmeStore::padded(kChunkBytes));  // zeros written at place
}

Test(nvme_tier, everything_on_the_host_gives_the_staging_buffers_back) {
  Fixture f(3, 3, 2);
  for (uint32_t k = 0; k < 3; ++k) cr_assert(!f.tier.on_drive(k));
  cr_assert_eq(f.host.in_use_bytes(), 3 * kChunkBytes);
  cr_assert_eq(stats(f.tier).chunks_on_nvme, 0u);
}

Test(nvme_tier, the_access_buffer_stages_one_chunk_and_writes_it_back_when_changed) {
  Fixture f(4, 0, 2);
  f.tier.access(1, true);
  cr_assert_not_null(f.lists[1].m);
  cr_assert_eq(f.lists[1].a, f.lists[1].m + kElems);
  cr_assert_eq(f.lists[1].m[0], 0.0f);  // fresh state is zeros
  f.fill(1, 7.0f);
  const uint64_t written = stats(f.tier).bytes_written;
  f.tier.access(2, false);  // chunk 1 goes back to the drive
  cr_assert_null(f.lists[1].m);
  cr_assert_not_null(f.lists[2].m);
  cr_assert_eq(stats(f.tier).bytes_written, written + NvmeStore::padded(kChunkBytes));
  f.tier.access(1, false);  // chunk 2 unchanged: no write-back
  cr_assert_null(f.lists[2].m);
  cr_assert_eq(stats(f.tier).bytes_written, written + NvmeStore::padded(kChunkBytes));
  cr_assert(f.holds(1, 7.0f));
  f.tier.flush_access();
  cr_assert_null(f.lists[1].m);
}

Test(nvme_tier, the_step_streams_drive_chunks_through_the_ring_in_order) {
  Fixture f(7, 2, 3);
  for (uint32_t k = 0; k < 7; ++k) {
    f.tier.access(k, true);
    f.fill(k, float(k));
  }
  f.tier.flush_access();
  const auto before = stats(f.tier);
  std::vector<uint32_t> order = {6, 0, 3, 1, 5, 2, 4}, seen;
  f.tier.update_chunks(order, [&](uint32_t k) {
    seen.push_back(k);
    cr_assert(f.holds(k, float(k)), "chunk %u staged in", k);
    for (uint64_t i = 0; i < kElems; ++i) f.lists[k].v[i] += 1.0f;
  });
  cr_assert(seen == order);
  for (uint32_t k = 2; k < 7; ++k) cr_assert_null(f.lists[k].m, "chunk %u not staged after the step", k);
  const auto s = stats(f.tier);
  cr_assert_eq(s.step_bytes_read, 5 * NvmeStore::padded(kChunkBytes));
  cr_assert_eq(s.step_bytes_written, 5 * NvmeStore::padded(kChunkBytes));
  cr_assert_eq(s.bytes_read - before.bytes_read, 5 * NvmeStore::padded(kChunkBytes));
  for (uint32_t k = 0; k < 7; ++k) {
    f.tier.access(k, false);
    cr_assert_eq(f.lists[k].v[0], 3.0f * k + 1.0f, "chunk %u updated once", k);
    cr_assert_eq(f.lists[k].m[kElems - 1], float(k) + (kElems - 1), "chunk %u master kept", k);
  }
}

Test(nvme_tier, an_io_error_in_the_step_is_recorded_until_a_rewrite_completes) {
  Fixture f(4, 0, 2);
  setenv("PSTAR_TEST_NVME_FAULT", "read_eio:1", 1);
  bool threw = false;
  try {
    f.tier.update_chunks({0, 1, 2, 3}, [](uint32_t) {});
  } catch (const Error& e) {
    threw = true;
    cr_assert_eq(e.status(), PSTAR_ERR_IO);
  }
  unsetenv("PSTAR_TEST_NVME_FAULT");
  cr_assert(threw);
  cr_assert(f.tier.failed());
  for (uint32_t k = 0; k < 4; ++k) cr_assert_null(f.lists[k].m);
  threw = false;
  try {
    f.tier.require_ok("step");
  } catch (const Error& e) {
    threw = e.status() == PSTAR_ERR_IO;
  }
  cr_assert(threw);
  f.tier.begin_rewrite();
  f.tier.access(3, true);
  f.fill(3, 5.0f);
  f.tier.end_rewrite();  // writes chunk 3 back
  cr_assert(!f.tier.failed());
  f.tier.require_ok("step");
  f.tier.access(3, false);
  cr_assert(f.holds(3, 5.0f));
}

Test(nvme_tier, a_dry_run_advances_the_clock_by_the_drive_time) {
  ModelledDevice dev(false, 1e9, 1e9);
  HostPool host(&dev, 3 * kStagingBytes);
  NvmeTier tier;
  pstar_x_nvme_options o{};
  o.size = sizeof o;
  o.version = PSTAR_X_NVME_OPTIONS_VERSION;
  o.staging_buffers = 2;
  o.read_bytes_per_s = 1e6;
  o.write_bytes_per_s = 2e6;
  std::vector<Lists> lists(2);
  auto point = [&](uint32_t k, float* m, float* a, float* v) { lists[k] = {m, a, v}; };
  tier.open(o, false, &dev, &host, point);               // no directory: no file
  tier.place({kElems, 0}, kElems, fp32_moments, point);  // chunk 1 frozen
  cr_assert(tier.on_drive(0));
  cr_assert(!tier.on_drive(1));
  const double t0 = dev.clock_seconds();
  tier.update_chunks({0, 1}, [](uint32_t) {});
  const double bytes = double(NvmeStore::padded(kChunkBytes));
  cr_assert_float_eq(dev.clock_seconds() - t0, bytes / 1e6 + bytes / 2e6, 1e-12);
  const auto s = stats(tier);
  cr_assert_eq(s.direct, 0u);
  cr_assert_eq(s.step_bytes_read, NvmeStore::padded(kChunkBytes));
  cr_assert_float_eq(s.step_io_wait_seconds, bytes / 1e6 + bytes / 2e6, 1e-12);
  tier.release();
  cr_assert_eq(host.in_use_bytes(), 0u);
}

Test(nvme_tier, refuses_bad_options_and_a_second_tier) {
  TempDir dir;
  EmulatedDevice dev(false, 0);
  HostPool host(&dev, 0);
  NvmeTier tier;
  pstar_x_nvme_options o{};
  o.size = sizeof o;
  o.version = PSTAR_X_NVME_OPTIONS_VERSION;
  auto status = [&](bool payloads) {
    try {
      tier.validate(o, payloads);
    } catch (const Error& e) {
      return e.status();
    }
    return PSTAR_OK;
  };
  cr_assert_eq(status(true), PSTAR_ERR_INVALID_ARGUMENT);  // no directory
  cr_assert_eq(status(false), PSTAR_OK);                   // a dry run needs none
  o.staging_buffers = 1;
  cr_assert_eq(status(false), PSTAR_ERR_INVALID_ARGUMENT);
  o.staging_buffers = 0;
  o.read_bytes_per_s = -1;
  cr_assert_eq(status(false), PSTAR_ERR_INVALID_ARGUMENT);
  o.read_bytes_per_s = 0;
  o.dir = dir.path.c_str();
  o.buffered = 1;
  cr_assert(!tier.requested());
  tier.open(o, true, &dev, &host, [](uint32_t, float*, float*, float*) {});
  cr_assert(tier.requested());
  cr_assert_eq(status(true), PSTAR_ERR_INVALID_STATE);
}
