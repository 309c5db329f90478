// Hybrid optimizer placement (placement/hybrid.h) on the emulated device in
// strict mode (seeded delays, poisoned buffers while copies run), with the
// placement runtime and without the engine or the C API: which chunks take
// the margin, in what order, and that the lists arrive intact.
#include <criterion/criterion.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "chunk/layout.h"
#include "memory/emulated_device.h"
#include "memory/host_pool.h"
#include "placement/hybrid.h"
#include "placement/runtime.h"

using pstar::chunk::Tier;
using pstar::memory::DeviceTier;
using pstar::placement::HybridOptions;
using pstar::placement::HybridPlacement;
using pstar::placement::Runtime;
using pstar::placement::RuntimeOptions;

namespace {

constexpr uint64_t kElems = 1024;              // chunk_elems
constexpr uint64_t kPayloadBytes = kElems * 2;  // a 2-byte compute dtype

struct Record : pstar::chunk::Chunk, pstar::chunk::Fp32Lists {
  uint64_t elems = 0;     // of each fp32 list
  void* shard = nullptr;  // sharded: the compute shard (elems of the 2-byte dtype)
};

struct Chunks final : pstar::placement::HybridTable {
  std::vector<Record> v;
  size_t chunk_count() const override { return v.size(); }
  pstar::chunk::Chunk& chunk_at(uint32_t k) override { return v[k]; }
  pstar::chunk::Fp32Lists& lists_at(uint32_t k) override { return v[k]; }
  uint64_t list_elems(uint32_t k) const override { return v[k].elems; }
  bool sharded = false;
  void** compute_shard(uint32_t k) override { return sharded ? &v[k].shard : nullptr; }
};

// Byte i of chunk k's compute shard before placement.
unsigned char shard_byte(uint32_t k, uint64_t i) { return static_cast<unsigned char>(0x40 + 7 * k + i % 13); }

// The value of element i of list `list` (0 master, 1 m, 2 v, 3 gradient) of
// chunk k before placement.
float pattern(uint32_t k, int list, uint64_t i) {
  return static_cast<float>(k) * 1000.0f + static_cast<float>(list) * 0.25f + static_cast<float>(i) * 0.5f;
}

// One parameter per chunk; numels[k] > kElems gives chunk k a jumbo chunk.
struct Fixture {
  pstar::memory::EmulatedDevice dev{true, 11};
  pstar::memory::HostPool host{&dev, 0};
  pstar::chunk::ChunkLayout layout;
  Chunks chunks;
  Runtime rt;
  HybridPlacement hy;

  // `sharded`: the lists are a rank's shards with world > 1 (here the
  // whole chunk stands for the shard) and each trainable chunk has a
  // compute shard.
  Fixture(const std::vector<uint64_t>& numels, const std::vector<bool>& frozen, uint64_t capacity_bytes,
          bool grad_accumulation = false, uint32_t warmup = 1, bool sharded = false)
      : layout(numels, frozen, kElems),
        rt(&dev, &host, runtime_options(capacity_bytes)),
        hy(&dev, &rt, HybridOptions{true, warmup, grad_accumulation}) {
    chunks.v.resize(layout.chunks().size());
    for (uint32_t k = 0; k < chunks.v.size(); ++k) {
      const auto& info = layout.chunks()[k];
      Record& c = chunks.v[k];
      c.bytes = info.capacity_elems * 2;
      c.elems = info.capacity_elems;
      c.host = host.acquire(c.bytes);
      std::memset(c.host, 0x20 + static_cast<int>(k), c.bytes);
      if (info.frozen) continue;
      if (sharded) {
        c.shard = host.acquire(c.elems * 2);
        for (uint64_t i = 0; i < c.elems * 2; ++i) static_cast<unsigned char*>(c.shard)[i] = shard_byte(k, i);
      }
      float** lists[] = {&c.master, &c.exp_avg, &c.exp_avg_sq, &c.grad32};
      for (int l = 0; l < (grad_accumulation ? 4 : 3); ++l) {
        *lists[l] = static_cast<float*>(host.acquire(fp32_bytes(k)));
        for (uint64_t i = 0; i < info.capacity_elems; ++i) (*lists[l])[i] = pattern(k, l, i);
      }
    }
    chunks.sharded = sharded;
    rt.attach(&chunks);
    hy.attach(&chunks, &layout, sharded);
  }
  ~Fixture() {
    dev.synchronize(dev.compute_stream());
    dev.synchronize(dev.h2d_stream());
    rt.drain();
    for (uint32_t k = 0; k < chunks.v.size(); ++k) {
      Record& c = chunks.v[k];
      if (!hy.release(k)) {  // (placed: the compute shard was in its buffer)
        for (float* l : {c.master, c.exp_avg, c.exp_avg_sq, c.grad32}) host.release(l, fp32_bytes(k));
        host.release(c.shard, c.elems * 2);
      }
      if (c.tier == Tier::kDevice) {
        dev.deallocate(c.device, c.bytes);
      } else {
        host.release(c.host, c.bytes);
      }
    }
  }
  static RuntimeOptions runtime_options(uint64_t capacity_bytes) {
    RuntimeOptions o;
    o.capacity_bytes = capacity_bytes;
    o.placement_policy = PSTAR_POLICY_LRU;
    o.prefetch = false;
    return o;
  }
  uint64_t fp32_bytes(uint32_t k) const { return layout.chunks()[k].capacity_elems * sizeof(float); }
  // Chunk k's compute shard, read back from wherever it is, equals its
  // pattern.
  bool shard_intact(uint32_t k) {
    const Record& c = chunks.v[k];
    std::vector<unsigned char> got(c.elems * 2);
    if (hy.shard_on_device(k)) {
      dev.copy_sync(got.data(), c.shard, got.size(), pstar::memory::CopyKind::kDeviceToHost);
    } else {
      std::memcpy(got.data(), c.shard, got.size());
    }
    for (uint64_t i = 0; i < got.size(); ++i) {
      if (got[i] != shard_byte(k, i)) return false;
    }
    return true;
  }
  bool placed(uint32_t k) const { return chunks.v[k].opt_device != nullptr; }
  // The acquire order of a finished iteration: order[j] was acquired j-th.
  void used_in_order(const std::vector<uint32_t>& order) {
    for (uint32_t j = 0; j < order.size(); ++j) chunks.v[order[j]].last_acquire = j + 1;
  }
  // List `list` of chunk k, read back from wherever it is, equals its pattern.
  bool list_intact(uint32_t k, int list) {
    const Record& c = chunks.v[k];
    const float* lists[] = {c.master, c.exp_avg, c.exp_avg_sq, c.grad32};
    const uint64_t n = layout.chunks()[k].capacity_elems;
    std::vector<float> got(n);
    hy.read_list(k, lists[list], got.data(), n * sizeof(float));
    for (uint64_t i = 0; i < n; ++i) {
      if (got[i] != pattern(k, list, i)) return false;
    }
    return true;
  }
};

// What one trainable chunk of kElems costs from the host: its three lists
// and its payload.
constexpr uint64_t kCostFromHost = 3 * kElems * sizeof(float) + kPayloadBytes;
// The streaming reserve kept beside the need when every chunk has kElems.
constexpr uint64_t kReserve = pstar::placement::kStreamingChunks * kPayloadBytes;

}  // namespace

Test(placement_hybrid, chunks_used_last_go_first_and_nothing_goes_above_the_margin) {
  // Room for two chunks and a little more beside the streaming reserve.
  Fixture f({kElems, kElems, kElems, kElems}, {false, false, false, false}, 2 * kCostFromHost + kReserve + 100);
  f.used_in_order({0, 2, 3, 1});  // 1 used last, then 3
  f.hy.step_begins();
  cr_assert(f.placed(1) && f.placed(3), "the two chunks used last");
  cr_assert(!f.placed(0) && !f.placed(2));
  cr_assert_eq(f.hy.chunks_on_device(), 2u);
  const DeviceTier& t = f.rt.tier();
  cr_assert_eq(t.bytes(DeviceTier::Use::kOptimizer), 2 * f.hy.state_bytes(1));
  cr_assert_eq(f.rt.counters().bytes_host_to_device, 2 * kCostFromHost, "the states' and the payloads' copies");
  cr_assert_leq(f.rt.counters().peak_device_bytes, t.capacity(), "within the margin");
  // Their payloads stay on the device for good.
  cr_assert(f.chunks.v[1].tier == Tier::kDevice && !f.chunks.v[1].evictable());
  cr_assert(f.chunks.v[0].tier == Tier::kHost);
}

Test(placement_hybrid, the_margin_is_the_capacity_above_the_need_peak_and_the_streaming_reserve) {
  Fixture f({kElems, kElems, kElems}, {false, false, false}, 3 * kCostFromHost + kReserve);
  // A peak of non-model memory that leaves less than two chunks' room.
  f.rt.tier().add(pstar::memory::DeviceTier::Use::kNonModel, kCostFromHost + 1);
  f.rt.tier().remove(pstar::memory::DeviceTier::Use::kNonModel, kCostFromHost + 1);
  f.used_in_order({0, 1, 2});
  f.hy.step_begins();
  cr_assert_eq(f.hy.chunks_on_device(), 1u);
  cr_assert(f.placed(2));
}

Test(placement_hybrid, held_chunks_count_in_the_need_and_cached_ones_do_not) {
  Fixture f(std::vector<uint64_t>(6, kElems), std::vector<bool>(6, false),
            2 * kCostFromHost + kReserve + kPayloadBytes);
  // Chunk 0 held (acquired) at the peak: its payload is part of the need.
  f.rt.fetch(0);
  f.chunks.v[0].compute_refs = 1;
  f.rt.hold(0);
  cr_assert_eq(f.rt.tier().need(), kPayloadBytes);
  f.chunks.v[0].compute_refs = 0;
  f.rt.unhold(0);
  cr_assert_eq(f.rt.tier().need(), 0u);
  cr_assert_eq(f.rt.tier().need_peak(), kPayloadBytes);
  // The others cached, not held: the state takes their room.
  for (uint32_t k = 1; k < 6; ++k) f.rt.fetch(k);
  f.used_in_order({0, 1, 2, 3, 4, 5});
  f.hy.step_begins();
  cr_assert_eq(f.hy.chunks_on_device(), 2u, "two chunks' cost above the held peak and the reserve");
  cr_assert(f.placed(4) && f.placed(5));
  cr_assert_gt(f.rt.counters().evictions, 0u, "cached payloads gave way");
  cr_assert_leq(f.rt.counters().peak_device_bytes, f.rt.tier().capacity());
}

Test(placement_hybrid, a_chunk_that_does_not_fit_is_skipped_and_a_smaller_later_one_may_fit) {
  // Chunk 0 is a jumbo chunk of 4 * kElems (the reserve is two of it).
  Fixture f({4 * kElems, kElems, kElems}, {false, false, false}, 2 * kCostFromHost + 8 * kPayloadBytes);
  f.used_in_order({2, 1, 0});  // the jumbo chunk used last
  f.hy.step_begins();
  cr_assert(!f.placed(0), "too large for the margin");
  cr_assert(f.placed(1) && f.placed(2));
}

Test(placement_hybrid, when_the_need_grows_state_goes_back_to_the_host_intact_and_returns_when_it_shrinks) {
  Fixture f({kElems, kElems, kElems}, {false, false, false}, 3 * kCostFromHost + kReserve);
  f.used_in_order({0, 1, 2});
  f.hy.step_begins();
  cr_assert_eq(f.hy.chunks_on_device(), 3u);
  const uint64_t d2h_before = f.rt.counters().bytes_device_to_host;
  // The next iterations need room for 1.5 chunks more: two states leave,
  // the chunks used first first.
  f.rt.tier().set_nonmodel(kCostFromHost + kCostFromHost / 2);
  f.rt.tier().set_nonmodel(0);
  cr_assert(!f.hy.step_plan().empty());
  f.hy.step_begins();
  cr_assert_eq(f.hy.chunks_on_device(), 1u);
  cr_assert(f.placed(2) && !f.placed(0) && !f.placed(1));
  f.rt.drain();
  cr_assert_eq(f.rt.tier().bytes(DeviceTier::Use::kOptimizer), f.hy.state_bytes(2));
  cr_assert_eq(f.rt.counters().bytes_device_to_host - d2h_before, f.hy.state_bytes(0) + f.hy.state_bytes(1));
  for (uint32_t k = 0; k < 2; ++k) {
    const Record& c = f.chunks.v[k];
    cr_assert(c.evictable(), "its payload may leave again");
    const float* lists[] = {c.master, c.exp_avg, c.exp_avg_sq};
    for (int l = 0; l < 3; ++l) {
      for (uint64_t i = 0; i < kElems; ++i)
        cr_assert_eq(lists[l][i], pattern(k, l, i), "chunk %u list %d element %lu on the host", k, l, i);
    }
  }
  cr_assert_leq(f.rt.counters().peak_device_bytes, f.rt.tier().capacity());
  // The need is back to nothing: they return, with the same bits.
  f.hy.step_begins();
  cr_assert_eq(f.hy.chunks_on_device(), 3u);
  for (uint32_t k = 0; k < 3; ++k)
    for (int l = 0; l < 3; ++l) cr_assert(f.list_intact(k, l), "chunk %u list %d", k, l);
  // A stable need moves nothing.
  cr_assert(f.hy.step_plan().empty());
}

Test(placement_hybrid, warm_up_steps_place_nothing_and_a_stable_need_moves_nothing) {
  Fixture f({kElems, kElems}, {false, false}, 0, false, 2);  // unlimited device
  f.hy.step_begins();
  cr_assert_eq(f.hy.chunks_on_device(), 0u, "still warming up");
  f.hy.step_begins();
  cr_assert_eq(f.hy.chunks_on_device(), 2u, "unlimited: every trainable chunk");
  f.hy.step_begins();
  cr_assert_eq(f.hy.chunks_on_device(), 2u);
  cr_assert_eq(f.rt.counters().bytes_host_to_device, 2 * kCostFromHost, "moved once");
}

Test(placement_hybrid, pinned_masters_and_frozen_chunks_stay_on_the_host) {
  Fixture f({kElems, kElems, kElems}, {false, true, false}, 0);
  f.chunks.v[2].master_pins = 1;
  f.used_in_order({0, 1, 2});
  const float* pinned_master = f.chunks.v[2].master;
  f.hy.step_begins();
  cr_assert(f.placed(0));
  cr_assert(!f.placed(1), "frozen: no optimizer state");
  cr_assert(!f.placed(2), "a pinned master must not move");
  cr_assert_eq(f.chunks.v[2].master, pinned_master);
  cr_assert_null(f.chunks.v[1].master);
}

Test(placement_hybrid, lists_are_copied_back_to_back_and_read_and_written_on_the_device) {
  Fixture f({kElems, 2 * kElems}, {false, false}, 0, true);
  f.hy.step_begins();
  for (uint32_t k = 0; k < 2; ++k) {
    const Record& c = f.chunks.v[k];
    const uint64_t n = f.layout.chunks()[k].capacity_elems;
    cr_assert_eq(c.master, static_cast<float*>(c.opt_device));
    cr_assert(c.exp_avg == c.master + n && c.exp_avg_sq == c.master + 2 * n && c.grad32 == c.master + 3 * n);
    cr_assert_eq(f.hy.state_bytes(k), 4 * n * sizeof(float), "with accumulation the gradient list moves too");
    for (int l = 0; l < 4; ++l) cr_assert(f.list_intact(k, l), "chunk %u list %d", k, l);
  }
  // The host lists (and payloads) go back to the pool once their copies
  // are done.
  f.rt.drain();
  cr_assert_eq(f.host.in_use_bytes(), 0u);
  // A write reaches the device list.
  std::vector<float> in(8, 3.5f), out(8, 0.0f);
  f.hy.write_list(1, f.chunks.v[1].exp_avg + 16, in.data(), in.size() * sizeof(float));
  f.hy.read_list(1, f.chunks.v[1].exp_avg + 16, out.data(), out.size() * sizeof(float));
  cr_assert_eq(std::memcmp(in.data(), out.data(), in.size() * sizeof(float)), 0);
}

Test(placement_hybrid, gradients_fold_into_the_device_list_and_are_cleared) {
  Fixture f({kElems}, {false}, 0, true);
  f.hy.step_begins();
  const uint64_t n = 256, offset = 128;
  auto* acc = static_cast<float*>(f.dev.allocate(n * sizeof(float)));
  std::vector<float> ones(n, 1.0f);
  f.dev.copy_sync(acc, ones.data(), n * sizeof(float), pstar::memory::CopyKind::kHostToDevice);
  f.rt.tier().add(DeviceTier::Use::kGradients, n * sizeof(float));
  f.hy.fold_gradient(0, f.dev.compute_stream(), offset, acc, n);  // frees acc once done
  f.chunks.v[0].last_use = f.dev.record(f.dev.compute_stream());
  std::vector<float> got(n);
  f.hy.read_gradient(0, f.chunks.v[0].grad32 + offset, got.data(), n);
  for (uint64_t i = 0; i < n; ++i) cr_assert_eq(got[i], pattern(0, 3, offset + i) + 1.0f, "element %lu", i);
  f.rt.drain();
  cr_assert_eq(f.rt.tier().bytes(DeviceTier::Use::kGradients), 0u, "the accumulator is freed");
  f.hy.clear_gradients();
  f.hy.read_gradient(0, f.chunks.v[0].grad32, got.data(), n);
  for (uint64_t i = 0; i < n; ++i) cr_assert_eq(got[i], 0.0f);
  cr_assert(f.list_intact(0, 0), "the master is untouched");
}

// With world > 1: a placed chunk's compute shard moves into its buffer's
// slot (the host copy goes back to the allocator for good), the lists and
// the slot cost 14 bytes per element with no payload pinned, and moving the
// state out brings the shard back with the same bits.
Test(placement_hybrid, sharded_compute_shards_move_into_the_slot_and_back_intact) {
  constexpr uint64_t kShardState = 3 * kElems * sizeof(float) + kElems * 2;
  Fixture f({kElems, kElems}, {false, false}, 2 * kShardState + kReserve, false, 1, true);
  f.used_in_order({0, 1});
  const uint64_t held_before = f.host.held_bytes();
  f.hy.step_begins();
  cr_assert_eq(f.hy.chunks_on_device(), 2u);
  for (uint32_t k = 0; k < 2; ++k) {
    cr_assert(f.hy.placed(k) && f.hy.shard_on_device(k));
    cr_assert_eq(f.hy.state_bytes(k), kShardState);
    cr_assert_eq(f.chunks.v[k].shard, f.hy.slot_staging(k), "chunk %u: the compute shard is the slot", k);
    cr_assert(f.shard_intact(k), "chunk %u: its compute shard on the device", k);
    cr_assert(f.chunks.v[k].evictable(), "no payload pinned with sharding");
  }
  cr_assert_leq(f.host.held_bytes() + 2 * kElems * 2, held_before, "the host shards went back for good");
  cr_assert_eq(f.rt.counters().bytes_host_to_device, 2 * kShardState, "the lists and the shards");
  // The need grows past everything: both go back, the shards intact.
  f.rt.tier().set_nonmodel(2 * kShardState + 1);
  f.rt.tier().set_nonmodel(0);
  f.hy.step_begins();
  cr_assert_eq(f.hy.chunks_on_device(), 0u);
  for (uint32_t k = 0; k < 2; ++k) {
    cr_assert(!f.hy.shard_on_device(k));
    cr_assert(f.shard_intact(k), "chunk %u: its compute shard back on the host", k);
    for (int l = 0; l < 3; ++l) {
      for (uint64_t i = 0; i < kElems; ++i) {
        const float* lists[] = {f.chunks.v[k].master, f.chunks.v[k].exp_avg, f.chunks.v[k].exp_avg_sq};
        cr_assert_eq(lists[l][i], pattern(k, l, i), "chunk %u list %d element %lu", k, l, i);
      }
    }
  }
}

// With world > 1 chunks kept gathered between uses are resident without
// being held: beyond the streaming reserve they take room from the margin
// (one process: a chunk cache, which gives way to the state).
Test(placement_hybrid, sharded_chunks_kept_gathered_beyond_the_reserve_shrink_the_margin) {
  constexpr uint64_t kShardState = 3 * kElems * sizeof(float) + kElems * 2;
  static_assert(kShardState == kCostFromHost, "one process's cost (state and payload) is the same here");
  const uint64_t capacity = 2 * kShardState + kReserve + kPayloadBytes / 2;
  for (bool sharded : {false, true}) {
    Fixture f({kElems, kElems, kElems}, {false, false, false}, capacity, false, 1, sharded);
    // Three chunks' payloads resident at once, none held.
    f.rt.tier().add(DeviceTier::Use::kChunks, 3 * kPayloadBytes);
    f.rt.tier().remove(DeviceTier::Use::kChunks, 3 * kPayloadBytes);
    cr_assert_eq(f.rt.tier().need_peak(), 0u);
    cr_assert_eq(f.rt.tier().resident_peak(), 3 * kPayloadBytes);
    f.used_in_order({0, 1, 2});
    const HybridPlacement::Plan p = f.hy.step_plan();
    if (sharded) {
      cr_assert_eq(p.margin, capacity - 3 * kPayloadBytes, "the resident peak binds");
      cr_assert_eq(p.in.size(), 1u);
    } else {
      cr_assert_eq(p.margin, capacity - kReserve, "the need peak and the reserve");
      cr_assert_eq(p.in.size(), 2u);
    }
  }
}
