// Gathered chunks (src/distributed/chunk_gathering.h) on their own: the emulated
// device in strict mode, the placement runtime, and a scripted communicator
// standing for rank 1 of 2 whose peer's shard of chunk k is all bytes
// 0xA0 + k.  Covered: a gather at the acquire that needs it (own block from
// the shard, the peer's from the all-gather, counted bytes and device use);
// a resident chunk is not gathered again; dropping frees the payload once
// its last use is done and a later acquire gathers anew; a failed all-gather
// frees its buffer and breaks the group; with one process nothing is
// gathered or dropped.
#include <criterion/criterion.h>

#include <cstring>
#include <memory>
#include <vector>

#include "distributed/chunk_gathering.h"
#include "fakes.h"
#include "memory/emulated_device.h"
#include "memory/host_pool.h"
#include "util/error.h"

using pstar::Error;
using pstar::chunk::Tier;
using pstar::distributed::ChunkGathering;
using pstar::distributed::ProcessGroup;
using pstar::distributed::ReduceScatter;
using pstar::memory::DeviceTier;

namespace {

constexpr uint64_t kShardBytes = 2048, kChunkBytes = 2 * kShardBytes;
constexpr uint32_t kChunks = 3;

struct Fixture {
  pstar::memory::EmulatedDevice dev{true, 7};
  pstar::memory::HostPool host{&dev, 0};
  pstar::testing::VectorChunkTable chunks;
  std::vector<std::vector<unsigned char>> shards;  // this rank's: 0x10 + k
  ProcessGroup group;
  int gathering_chunk = 0;  // set before each gather: the peer's block is 0xA0 + it
  bool fail_next = false;   // the next all-gather fails
  int gathers = 0;
  ReduceScatter reduce{&group, ReduceScatter::Actions{}};
  ChunkGathering gathering{&group, &reduce};
  std::unique_ptr<pstar::placement::Runtime> rt;

  explicit Fixture(bool sharded) {
    if (sharded) {
      auto c = std::make_unique<pstar::testing::ScriptedComm>(1, 2);
      // Block 0 is the peer's: the pattern of the chunk being gathered.
      c->on_all_gather = [this](const void*, void* out, size_t shard_bytes) {
        if (fail_next) {
          fail_next = false;
          throw Error(PSTAR_ERR_COMM, "peer 0 gone");
        }
        std::memset(out, 0xA0 + gathering_chunk, shard_bytes);
        ++gathers;
      };
      group.adopt(std::move(c));
    }
    pstar::placement::RuntimeOptions o;
    o.capacity_bytes = 2 * kChunkBytes;
    o.prefetch = false;
    rt = std::make_unique<pstar::placement::Runtime>(&dev, &host, o);
    chunks.v.resize(kChunks);
    shards.resize(kChunks);
    for (uint32_t k = 0; k < kChunks; ++k) {
      chunks.v[k].bytes = kChunkBytes;
      shards[k].assign(kShardBytes, static_cast<unsigned char>(0x10 + k));
      if (sharded) {
        chunks.v[k].tier = Tier::kNotGathered;
      } else {
        chunks.v[k].host = host.acquire(kChunkBytes);
      }
    }
    rt->attach(&chunks);
    gathering.attach(&dev, rt.get(), &chunks,
                     ChunkGathering::Shards{[this](uint32_t k) -> const void* { return shards[k].data(); },
                                            [](uint32_t) { return kShardBytes; }});
  }
  ~Fixture() {
    gathering.drop_all();
    rt->drain();
    for (auto& c : chunks.v) {
      if (c.tier == Tier::kDevice) {
        dev.synchronize(c.last_use);
        dev.deallocate(c.device, c.bytes);
        rt->tier().remove(DeviceTier::Use::kChunks, c.bytes);
      } else if (c.tier == Tier::kHost) {
        host.release(c.host, c.bytes);
      }
    }
  }
  bool acquire(uint32_t k) {
    gathering_chunk = static_cast<int>(k);
    uint64_t critical = 0;
    const bool now = gathering.before_acquire(k, false, &critical);
    cr_assert_eq(critical, 0u);  // no gather ahead: nothing to wait for
    return now;
  }
  // The gathered payload: the peer's block then this rank's.
  void check_payload(uint32_t k) {
    const auto& c = chunks.v[k];
    cr_assert_eq(c.tier, Tier::kDevice);
    const auto* p = static_cast<const unsigned char*>(c.device);
    for (uint64_t i = 0; i < kShardBytes; ++i) {
      cr_assert_eq(p[i], 0xA0 + k, "chunk %u byte %lu", k, static_cast<unsigned long>(i));
      cr_assert_eq(p[kShardBytes + i], 0x10 + k, "chunk %u byte %lu", k, static_cast<unsigned long>(kShardBytes + i));
    }
  }
};

}  // namespace

Test(chunk_gathering, an_acquire_gathers_the_chunk_from_the_shards) {
  Fixture f(true);
  cr_assert(f.acquire(1));
  f.check_payload(1);
  cr_assert_eq(f.gathering.bytes_gathered(), kChunkBytes);
  cr_assert_eq(f.rt->tier().bytes(DeviceTier::Use::kChunks), kChunkBytes);
  cr_assert(!f.acquire(1));  // resident: not gathered again
  cr_assert_eq(f.gathers, 1);
  cr_assert_eq(f.group.collectives(), 1u);
}

Test(chunk_gathering, a_dropped_chunk_frees_its_payload_and_is_gathered_anew) {
  Fixture f(true);
  f.acquire(0);
  f.gathering.drop(0, false);
  cr_assert_eq(f.chunks.v[0].tier, Tier::kNotGathered);
  cr_assert_null(f.chunks.v[0].device);
  f.rt->drain();  // the deferred free completes
  cr_assert_eq(f.rt->tier().bytes(DeviceTier::Use::kChunks), 0u);
  cr_assert(f.acquire(0));
  f.check_payload(0);
  cr_assert_eq(f.gathers, 2);
  cr_assert_eq(f.gathering.bytes_gathered(), 2 * kChunkBytes);
}

Test(chunk_gathering, a_failed_all_gather_frees_its_buffer_and_breaks_the_group) {
  Fixture f(true);
  f.fail_next = true;
  try {
    f.acquire(2);
    cr_assert_fail("no error");
  } catch (const Error& e) {
    cr_assert_eq(e.status(), PSTAR_ERR_COMM);
  }
  cr_assert_eq(f.chunks.v[2].tier, Tier::kNotGathered);
  cr_assert_eq(f.rt->tier().bytes(DeviceTier::Use::kChunks), 0u);
  cr_assert_eq(f.gathering.bytes_gathered(), 0u);
  try {
    f.acquire(2);
    cr_assert_fail("not refused");
  } catch (const Error& e) {
    cr_assert_eq(e.status(), PSTAR_ERR_COMM);
  }
}

Test(chunk_gathering, one_process_gathers_and_drops_nothing) {
  Fixture f(false);
  cr_assert(!f.acquire(0));
  cr_assert_eq(f.chunks.v[0].tier, Tier::kHost);  // placement's fetch is the engine's, not this class's
  f.gathering.drop_all();
  f.gathering.drop(0, true);
  cr_assert_eq(f.chunks.v[0].tier, Tier::kHost);
  cr_assert_not_null(f.chunks.v[0].host);
  cr_assert_eq(f.gathering.bytes_gathered(), 0u);
  cr_assert_eq(f.gathering.depth(), 0u);
  f.gathering.set_depth(2);  // one process: never gathers ahead
  cr_assert_eq(f.gathering.depth(), 0u);
}
