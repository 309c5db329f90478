// The placement runtime on the emulated device in strict mode (seeded delays,
// poisoned buffers while copies run), without the engine or the C API.
#include <criterion/criterion.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fakes.h"
#include "memory/emulated_device.h"
#include "memory/host_pool.h"
#include "placement/runtime.h"
#include "util/error.h"

using pstar::chunk::Tier;
using pstar::memory::DeviceTier;
using pstar::placement::Runtime;
using pstar::placement::RuntimeOptions;

namespace {

constexpr uint64_t kChunkBytes = 4096;

struct Fixture {
  pstar::memory::EmulatedDevice dev{true, 7};
  pstar::memory::HostPool host{&dev, 0};
  pstar::testing::VectorChunkTable chunks;  // on the host, each filled with its own byte pattern
  Runtime rt;

  Fixture(uint32_t n, uint32_t resident, pstar_policy policy)
      : rt(&dev, &host, options(resident, policy)) {
    chunks.v.resize(n);
    for (uint32_t k = 0; k < n; ++k) {
      auto& c = chunks.v[k];
      c.bytes = kChunkBytes;
      c.host = host.acquire(kChunkBytes);
      std::memset(c.host, 0x10 + static_cast<int>(k), kChunkBytes);
    }
    rt.attach(&chunks);
  }
  ~Fixture() {
    rt.drain();
    for (auto& c : chunks.v) {
      if (c.tier == Tier::kDevice) {
        dev.synchronize(c.last_use);
        dev.deallocate(c.device, c.bytes);
        rt.tier().remove(DeviceTier::Use::kChunks, c.bytes);
      } else {
        host.release(c.host, c.bytes);
      }
    }
  }
  static RuntimeOptions options(uint32_t resident, pstar_policy policy) {
    RuntimeOptions o;
    o.capacity_bytes = resident * kChunkBytes;
    o.placement_policy = policy;
    o.prefetch = false;
    return o;
  }
  // One use of chunk k, as an acquire does it.
  void use(uint32_t k) {
    rt.follower().check(k);
    if (chunks.v[k].tier == Tier::kHost) rt.fetch(k);
    rt.touch(k);
    rt.note_access(k);
  }
  void iteration(const std::vector<uint32_t>& seq) {
    rt.iteration_begin();
    for (uint32_t k : seq) use(k);
    rt.iteration_end();
  }
  // Every chunk's payload is its pattern, wherever it went.
  bool payloads_intact() {
    std::vector<unsigned char> want(kChunkBytes);
    for (uint32_t k = 0; k < chunks.v.size(); ++k) {
      std::memset(want.data(), 0x10 + static_cast<int>(k), kChunkBytes);
      if (std::memcmp(rt.host_view(k), want.data(), kChunkBytes) != 0) return false;
    }
    return true;
  }
};

}  // namespace

Test(placement_runtime, lru_evicts_the_least_recently_used_and_keeps_payloads) {
  Fixture f(4, 2, PSTAR_POLICY_LRU);
  f.iteration({0, 1, 2, 0, 3});
  // 0,1 fetched; 2 evicts 0; 0 evicts 1; 3 evicts 2.
  cr_assert_eq(f.rt.counters().moves_to_device, 5u);
  cr_assert_eq(f.rt.counters().evictions, 3u);
  cr_assert_eq(f.chunks.v[0].tier, Tier::kDevice);
  cr_assert_eq(f.chunks.v[3].tier, Tier::kDevice);
  cr_assert_eq(f.chunks.v[1].tier, Tier::kHost);
  cr_assert_leq(f.rt.counters().peak_device_chunk_bytes, 2 * kChunkBytes, "never above capacity");
  cr_assert(f.payloads_intact());
}

Test(placement_runtime, following_the_trace_evicts_the_furthest_next_use) {
  Fixture f(3, 2, PSTAR_POLICY_OPT);
  f.iteration({0, 1, 2, 0});  // warm-up: recorded, LRU; ends with {2, 0} resident
  cr_assert(f.rt.follower().ready());
  f.rt.iteration_begin();
  cr_assert(f.rt.follower().following());
  f.use(0);
  f.use(1);  // room for 1: OPT takes 0 (next use at moment 3), not 2 (moment 2)
  cr_assert_eq(f.chunks.v[0].tier, Tier::kHost);
  cr_assert_eq(f.chunks.v[2].tier, Tier::kDevice);
  f.use(2);
  f.use(0);
  f.rt.iteration_end();
  cr_assert_eq(f.rt.follower().divergences(), 0u);
  cr_assert(f.payloads_intact());
}

Test(placement_runtime, make_room_refuses_when_every_resident_chunk_is_in_use) {
  Fixture f(3, 2, PSTAR_POLICY_LRU);
  f.rt.iteration_begin();
  f.use(0);
  f.use(1);
  f.chunks.v[0].compute_refs = 1;
  f.chunks.v[1].compute_refs = 1;
  pstar_status st = PSTAR_OK;
  std::string msg;
  try {
    f.rt.fetch(2);
  } catch (const pstar::Error& e) {
    st = e.status();
    msg = e.what();
  }
  cr_assert_eq(st, PSTAR_ERR_OUT_OF_MEMORY);
  cr_assert(msg.find("chunk 2") != std::string::npos, "%s", msg.c_str());
  cr_assert(msg.find("chunks 8192 bytes") != std::string::npos, "%s", msg.c_str());
  cr_assert_eq(f.chunks.v[2].tier, Tier::kHost, "a refused fetch moves nothing");
  f.chunks.v[0].compute_refs = 0;
  f.chunks.v[1].compute_refs = 0;
  f.rt.fetch(2);  // room once one may move
  f.rt.iteration_end();
  cr_assert(f.payloads_intact());
}

Test(placement_runtime, deferred_frees_hold_device_bytes_until_drained) {
  Fixture f(2, 2, PSTAR_POLICY_LRU);
  f.iteration({0, 1});
  f.rt.evict(0);
  const DeviceTier& t = f.rt.tier();
  cr_assert_eq(t.bytes(DeviceTier::Use::kChunks), kChunkBytes);
  cr_assert_eq(t.used(), t.bytes(DeviceTier::Use::kChunks) + t.bytes(DeviceTier::Use::kDeferred));
  f.rt.drain();
  cr_assert_eq(t.bytes(DeviceTier::Use::kDeferred), 0u);
  cr_assert_eq(t.used(), kChunkBytes);
  cr_assert(f.payloads_intact());
}

Test(placement_runtime, static_policy_pins_the_prefix_that_fits_beside_the_reserve) {
  Fixture f(6, 5, PSTAR_POLICY_STATIC);
  f.rt.choose_static_chunks(0);  // reserve: two chunks; 3 of 5 slots stay
  int pinned = 0;
  for (const auto& c : f.chunks.v) pinned += c.pinned_static ? 1 : 0;
  cr_assert_eq(pinned, 3);
  cr_assert(f.chunks.v[0].pinned_static && f.chunks.v[2].pinned_static && !f.chunks.v[3].pinned_static);
}
