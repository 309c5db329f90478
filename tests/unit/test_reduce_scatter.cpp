// The gradient reduce-scatter (src/distributed/reduce_scatter.h) on its own, over
// a scripted communicator standing for rank 1 of 3 whose peers hold the same
// gradients: the sum is three times this rank's block, so the average handed
// to apply() is the block itself.  Covered: the average, inline and queued
// runs, the pair rotation (a third reduce-scatter finishes the oldest),
// finishing through one chunk only, device staging freed once and only once
// (finished, failed, laid out wrongly, or never finished), and a failure
// on the queue breaking the group.
#include <criterion/criterion.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/reduce_scatter.h"
#include "fakes.h"
#include "memory/emulated_device.h"
#include "memory/host_pool.h"
#include "util/error.h"

using pstar::Error;
using pstar::distributed::ProcessGroup;
using pstar::distributed::ReduceScatter;

namespace {

constexpr int kRank = 1, kWorld = 3;

// An engine stand-in: chunk k's gradient element i is k * 1000 + i; it
// records what was applied, and the staging bytes alive.
struct Harness {
  explicit Harness(bool device_buffers, bool queue) {
    auto c = std::make_unique<pstar::testing::ScriptedComm>(kRank, kWorld, device_buffers);
    // The peers hold the same gradients: the sum is kWorld times this
    // rank's block.
    c->on_reduce_scatter = [this](float* data, float* out, size_t block) {
      if (fail_next) {
        fail_next = false;
        throw Error(PSTAR_ERR_COMM, "peer 0 gone");
      }
      for (size_t i = 0; i < block; ++i) out[i] = kWorld * data[kRank * block + i];
    };
    group.adopt(std::move(c));
    if (queue) group.start_queue();
    host = std::make_unique<pstar::memory::HostPool>(&dev, 0);
    rs = std::make_unique<ReduceScatter>(
        &group, ReduceScatter::Actions{[this](uint32_t k, float* data, uint64_t elems) {
                                         if (fail_lay_out) throw Error(PSTAR_ERR_OUT_OF_MEMORY, "lay out");
                                         for (uint64_t i = 0; i < elems; ++i)
                                           data[i] = static_cast<float>(k * 1000 + i);
                                         return std::vector<uint32_t>{k * 10, k * 10 + 1};
                                       },
                                       [this](uint32_t k, const std::vector<uint32_t>& params, float* avg) {
                                         cr_assert_eq(params.size(), 2u);
                                         cr_assert_eq(params[0], k * 10);
                                         applied.push_back(k);
                                         averages[k].assign(avg, avg + shard);
                                       },
                                       [this](uint64_t bytes, uint32_t) {
                                         staged += bytes;
                                         ++stages;
                                         return static_cast<void*>(new float[bytes / sizeof(float)]);
                                       },
                                       [this](void* p, uint64_t bytes) {
                                         staged -= bytes;
                                         delete[] static_cast<float*>(p);
                                       },
                                       [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }});
    rs->reserve(host.get(), kElems, queue);
  }
  ~Harness() {
    group.stop_queue();
    rs->release();
  }

  static constexpr uint64_t kElems = 12, shard = kElems / kWorld;
  pstar::memory::EmulatedDevice dev{true, 7};
  ProcessGroup group;
  bool fail_next = false;  // the next reduce-scatter fails
  std::unique_ptr<pstar::memory::HostPool> host;
  std::unique_ptr<ReduceScatter> rs;
  bool fail_lay_out = false;
  std::vector<uint32_t> applied;
  std::map<uint32_t, std::vector<float>> averages;
  uint64_t staged = 0;
  int stages = 0;
};

void check_average(Harness& h, uint32_t k) {
  const std::vector<float>& avg = h.averages.at(k);
  for (uint64_t i = 0; i < Harness::shard; ++i) {
    // (3 * x) / 3 is x exactly for these small integers.
    cr_assert_eq(avg[i], static_cast<float>(k * 1000 + kRank * Harness::shard + i), "chunk %u element %lu", k,
                 static_cast<unsigned long>(i));
  }
}

}  // namespace

Test(reduce_scatter, inline_applies_this_ranks_block_of_the_average_at_once) {
  for (bool device : {false, true}) {
    Harness h(device, false);
    h.rs->reduce(4, Harness::kElems, Harness::shard);
    cr_assert_eq(h.applied.size(), 1u);
    check_average(h, 4);
    cr_assert_eq(h.staged, 0u);
    cr_assert_eq(h.stages, device ? 1 : 0);
    cr_assert_eq(h.group.collectives(), 1u);
  }
}

Test(reduce_scatter, queued_ones_finish_oldest_first_when_a_pair_is_needed) {
  for (bool device : {false, true}) {
    Harness h(device, true);
    h.rs->reduce(0, Harness::kElems, Harness::shard);
    h.rs->reduce(1, Harness::kElems, Harness::shard);
    cr_assert(h.applied.empty());  // both in flight: two pairs
    h.rs->reduce(2, Harness::kElems, Harness::shard);  // needs a pair: chunk 0 finishes
    cr_assert_eq(h.applied.size(), 1u);
    cr_assert_eq(h.applied[0], 0u);
    h.rs->finish_through(2);
    cr_assert_eq(h.applied.size(), 3u);
    cr_assert_eq(h.applied[1], 1u);
    cr_assert_eq(h.applied[2], 2u);
    for (uint32_t k = 0; k < 3; ++k) check_average(h, k);
    cr_assert_eq(h.staged, 0u);
  }
}

Test(reduce_scatter, finishing_through_a_chunk_leaves_later_ones_in_flight) {
  Harness h(false, true);
  h.rs->reduce(5, Harness::kElems, Harness::shard);
  h.rs->reduce(6, Harness::kElems, Harness::shard);
  h.rs->finish_through(5);
  cr_assert_eq(h.applied.size(), 1u);
  h.rs->finish_through(9);  // none of chunk 9 queued: nothing
  cr_assert_eq(h.applied.size(), 1u);
  h.rs->finish_through(-1);
  cr_assert_eq(h.applied.size(), 2u);
}

Test(reduce_scatter, short_room_finishes_the_oldest_device_stage) {
  Harness h(true, true);
  cr_assert(!h.rs->release_oldest_stage());  // nothing queued
  h.rs->reduce(3, Harness::kElems, Harness::shard);
  cr_assert_neq(h.staged, 0u);
  cr_assert(h.rs->release_oldest_stage());
  cr_assert_eq(h.staged, 0u);
  cr_assert_eq(h.applied.size(), 1u);
  check_average(h, 3);
  Harness host(false, true);  // host staging: nothing to free
  host.rs->reduce(3, Harness::kElems, Harness::shard);
  cr_assert(!host.rs->release_oldest_stage());
}

Test(reduce_scatter, a_failed_lay_out_frees_its_stage_and_issues_nothing) {
  Harness h(true, false);
  h.fail_lay_out = true;
  try {
    h.rs->reduce(1, Harness::kElems, Harness::shard);
    cr_assert_fail("no error");
  } catch (const Error& e) {
    cr_assert_eq(e.status(), PSTAR_ERR_OUT_OF_MEMORY);
  }
  cr_assert_eq(h.staged, 0u);
  cr_assert_eq(h.group.collectives(), 0u);
  h.group.require_ok("after");  // not a collective's failure
}

Test(reduce_scatter, a_failure_inline_or_queued_breaks_the_group_and_frees_the_stage) {
  for (bool queue : {false, true}) {
    Harness h(true, queue);
    h.fail_next = true;
    try {
      h.rs->reduce(2, Harness::kElems, Harness::shard);  // inline: fails here
      cr_assert(queue, "no error inline");
      h.rs->finish_through(-1);  // queued: fails here
      cr_assert_fail("no error");
    } catch (const Error& e) {
      cr_assert_eq(e.status(), PSTAR_ERR_COMM);
    }
    cr_assert(h.applied.empty());
    cr_assert_eq(h.staged, 0u);
    try {
      h.group.require_ok("next");
      cr_assert_fail("not failed");
    } catch (const Error& e) {
      cr_assert(std::string(e.what()).find("peer 0 gone") != std::string::npos, "%s", e.what());
    }
  }
}

Test(reduce_scatter, release_frees_stages_never_finished) {
  Harness h(true, true);
  h.rs->reduce(0, Harness::kElems, Harness::shard);
  h.group.stop_queue();  // as the engine's destructor: the queue's work done
  h.rs->release();
  cr_assert_eq(h.staged, 0u);
  cr_assert(h.applied.empty());
}
