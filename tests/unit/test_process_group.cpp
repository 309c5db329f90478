// The process group (src/distributed/process_group.h) on its own, over a scripted
// communicator: one process has no communicator; a collective's
// PSTAR_ERR_COMM (or a foreign exception) fails the group for good and
// every later collective is refused with the first failure; other pstar
// errors pass through and fail nothing; the hash depends on the kinds,
// chunks and order of the collectives issued, and take_hash() begins a new
// one; inline collectives drain the queue first; a queued failure is
// reported by wait_failed() and by the next inline collective.
#include <criterion/criterion.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "distributed/process_group.h"
#include "fakes.h"
#include "util/error.h"

using pstar::Error;
using pstar::distributed::CollectiveKind;
using pstar::distributed::ProcessGroup;

namespace {

std::unique_ptr<ProcessGroup> adopted() {
  auto g = std::make_unique<ProcessGroup>();
  g->adopt(std::make_unique<pstar::testing::ScriptedComm>(1, 3));
  return g;
}

// The status and message of what f throws; PSTAR_OK when it throws nothing.
pstar_status status_of(std::string* message, const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    *message = e.what();
    return e.status();
  }
  return PSTAR_OK;
}

}  // namespace

Test(process_group, one_process_has_no_communicator) {
  ProcessGroup g;
  cr_assert(!g.sharded());
  cr_assert_eq(g.rank(), 0);
  cr_assert_eq(g.world(), 1);
  g.connect(-1, std::chrono::milliseconds(10));  // one rank: forms nothing
  cr_assert(!g.sharded());
  cr_assert_eq(g.collectives(), 0u);
}

Test(process_group, adopts_the_rank_and_size_of_its_communicator) {
  auto g = adopted();
  cr_assert(g->sharded());
  cr_assert_eq(g->rank(), 1);
  cr_assert_eq(g->world(), 3);
}

Test(process_group, a_comm_failure_breaks_the_group_for_good) {
  auto g = adopted();
  int runs = 0;
  g->run("first", CollectiveKind::kGather, 4, [&] { ++runs; });
  std::string msg;
  const pstar_status s = status_of(&msg, [&] {
    g->run("all-gather of chunk 5", CollectiveKind::kGather, 5, [] { throw Error(PSTAR_ERR_COMM, "peer 2 gone"); });
  });
  cr_assert_eq(s, PSTAR_ERR_COMM);
  cr_assert(msg.find("all-gather of chunk 5 on rank 1 of 3: peer 2 gone") != std::string::npos, "%s", msg.c_str());
  // Every later collective is refused without running, naming the first failure.
  std::string later;
  cr_assert_eq(status_of(&later, [&] { g->run("step", CollectiveKind::kStep, 0, [&] { ++runs; }); }), PSTAR_ERR_COMM);
  cr_assert(later.find("step: refused") != std::string::npos, "%s", later.c_str());
  cr_assert(later.find("peer 2 gone") != std::string::npos, "%s", later.c_str());
  cr_assert_eq(status_of(&later, [&] { g->require_ok("param_acquire"); }), PSTAR_ERR_COMM);
  cr_assert_eq(runs, 1);
  cr_assert_eq(g->collectives(), 2u);  // the refused one was not issued
}

Test(process_group, a_foreign_exception_is_a_comm_failure) {
  auto g = adopted();
  std::string msg;
  cr_assert_eq(status_of(&msg,
                         [&] {
                           g->run("reduce-scatter", CollectiveKind::kReduce, 0,
                                  [] { throw std::runtime_error("socket closed"); });
                         }),
               PSTAR_ERR_COMM);
  cr_assert_eq(status_of(&msg, [&] { g->require_ok("x"); }), PSTAR_ERR_COMM);
}

Test(process_group, other_errors_pass_through_and_fail_nothing) {
  auto g = adopted();
  std::string msg;
  cr_assert_eq(status_of(&msg,
                         [&] {
                           g->run("read", CollectiveKind::kRead, 0,
                                  [] { throw Error(PSTAR_ERR_OUT_OF_MEMORY, "no room for the scratch"); });
                         }),
               PSTAR_ERR_OUT_OF_MEMORY);
  cr_assert_str_eq(msg.c_str(), "no room for the scratch");
  g->require_ok("after");  // not failed
  g->run("again", CollectiveKind::kRead, 0, [] {});
}

Test(process_group, the_hash_follows_kind_chunk_and_order) {
  auto a = adopted(), b = adopted(), c = adopted(), d = adopted();
  a->run("x", CollectiveKind::kGather, 1, [] {});
  a->run("x", CollectiveKind::kGather, 2, [] {});
  b->run("x", CollectiveKind::kGather, 1, [] {});
  b->run("x", CollectiveKind::kGather, 2, [] {});
  c->run("x", CollectiveKind::kGather, 2, [] {});  // the same two, the other order
  c->run("x", CollectiveKind::kGather, 1, [] {});
  d->run("x", CollectiveKind::kRead, 1, [] {});  // another kind
  d->run("x", CollectiveKind::kGather, 2, [] {});
  const uint64_t ha = a->take_hash(), hb = b->take_hash(), hc = c->take_hash(), hd = d->take_hash();
  cr_assert_eq(ha, hb);
  cr_assert_neq(ha, hc);
  cr_assert_neq(ha, hd);
  cr_assert_neq(ha, 0u);
  cr_assert_eq(a->take_hash(), 0u);  // a new hash begun
  a->run("x", CollectiveKind::kGather, 1, [] {});
  b->run("x", CollectiveKind::kGather, 1, [] {});
  cr_assert_eq(a->take_hash(), b->take_hash());
}

Test(process_group, inline_collectives_drain_the_queue_first) {
  auto g = adopted();
  g->start_queue();
  std::vector<int> order;  // the queued operation writes it before the inline one runs
  auto t = g->submit("ahead", CollectiveKind::kGather, 0, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    order.push_back(1);
  });
  g->run("inline", CollectiveKind::kRead, 0, [&] { order.push_back(2); });
  cr_assert_eq(order.size(), 2u);
  cr_assert_eq(order[0], 1);
  cr_assert_eq(order[1], 2);
  std::string failure;
  cr_assert(!g->wait_failed(t, &failure));
  cr_assert_eq(g->collectives(), 2u);
}

Test(process_group, a_queued_failure_is_reported_by_the_wait_and_the_next_inline_collective) {
  auto g = adopted();
  g->start_queue();
  auto t = g->submit("ahead", CollectiveKind::kGather, 3, [] { throw Error(PSTAR_ERR_COMM, "timed out"); });
  std::string failure;
  cr_assert(g->wait_failed(t, &failure));
  cr_assert(failure.find("timed out") != std::string::npos);
  g->require_ok("not yet failed");  // the caller decides when to fail()
  std::string msg;
  cr_assert_eq(status_of(&msg, [&] { g->run("inline", CollectiveKind::kStep, 0, [] {}); }), PSTAR_ERR_COMM);
  cr_assert(msg.find("timed out") != std::string::npos, "%s", msg.c_str());
  cr_assert_eq(status_of(&msg, [&] { g->require_ok("later"); }), PSTAR_ERR_COMM);
}

namespace {
// The step exchange's layout on the wire (ProcessGroup::agree_on_step): the
// scripted peers write theirs in it.
struct WireVote {
  double sumsq;
  uint64_t overflow;
  uint64_t hash;
  uint64_t schedule_ready;
};

// Rank 1 of 3 whose peers vote `peer0` and `peer2`, each with this rank's
// hash unless `hash_of_2` is set.
std::unique_ptr<ProcessGroup> voting(WireVote peer0, WireVote peer2, bool other_hash_on_2) {
  auto c = std::make_unique<pstar::testing::ScriptedComm>(1, 3);
  c->on_all_gather = [=](const void* mine, void* out, size_t bytes) {
    cr_assert_eq(bytes, sizeof(WireVote));
    auto* all = static_cast<WireVote*>(out);
    std::memcpy(&all[1], mine, bytes);
    all[0] = peer0;
    all[2] = peer2;
    all[0].hash = all[1].hash;
    all[2].hash = other_hash_on_2 ? all[1].hash + 1 : all[1].hash;
  };
  auto g = std::make_unique<ProcessGroup>();
  g->adopt(std::move(c));
  return g;
}
}  // namespace

Test(process_group, the_step_vote_sums_in_rank_order_and_agrees_on_every_flag) {
  auto g = voting({1.5, 0, 0, 1}, {4.0, 1, 0, 0}, false);
  g->run("x", CollectiveKind::kGather, 0, [] {});  // a hash to compare
  ProcessGroup::StepVote mine;
  mine.sumsq = 2.25;
  mine.schedule_ready = true;
  const ProcessGroup::StepVote agreed = g->agree_on_step(mine);
  cr_assert_eq(agreed.sumsq, (1.5 + 2.25) + 4.0);
  cr_assert(agreed.overflow);         // rank 2's
  cr_assert(!agreed.schedule_ready);  // not ready on rank 2
  cr_assert_eq(g->collectives(), 2u);
  auto ready = voting({0.0, 0, 0, 1}, {0.0, 0, 0, 1}, false);
  mine.schedule_ready = true;
  const ProcessGroup::StepVote all_ready = ready->agree_on_step(mine);
  cr_assert(all_ready.schedule_ready);
  cr_assert(!all_ready.overflow);
}

Test(process_group, ranks_that_issued_other_collectives_fail_the_step_for_good) {
  auto g = voting({0.0, 0, 0, 1}, {0.0, 0, 0, 1}, true);
  std::string msg;
  cr_assert_eq(status_of(&msg, [&] { g->agree_on_step(ProcessGroup::StepVote{}); }), PSTAR_ERR_COMM);
  cr_assert(msg.find("rank 0 and rank 2 differ") != std::string::npos, "%s", msg.c_str());
  cr_assert_eq(status_of(&msg, [&] { g->require_ok("next"); }), PSTAR_ERR_COMM);
}

Test(process_group, host_all_gathers_go_through_device_scratch_when_the_communicator_needs_it) {
  auto c = std::make_unique<pstar::testing::ScriptedComm>(1, 3, true);
  // "Device" memory is host memory here: the script fills the peers' blocks.
  c->on_all_gather = [](const void* own, void* out, size_t bytes) {
    auto* all = static_cast<unsigned char*>(out);
    cr_assert_eq(std::memcmp(all + bytes, own, bytes), 0);  // this rank's block, copied in
    std::memset(all, 0x11, bytes);
    std::memset(all + 2 * bytes, 0x33, bytes);
  };
  ProcessGroup g;
  g.adopt(std::move(c));
  uint64_t live = 0;
  int copies = 0;
  g.set_device_scratch(ProcessGroup::DeviceScratch{
      [&](uint64_t bytes) {
        live += bytes;
        return static_cast<void*>(new unsigned char[bytes]);
      },
      [&](void* p, uint64_t bytes) {
        live -= bytes;
        delete[] static_cast<unsigned char*>(p);
      },
      [&](void* dst, const void* src, size_t bytes, bool) {
        ++copies;
        std::memcpy(dst, src, bytes);
      }});
  const unsigned char mine[4] = {0x22, 0x22, 0x22, 0x22};
  unsigned char all[12] = {0};
  g.all_gather_host("read", CollectiveKind::kRead, 3, mine, all, sizeof mine);
  for (int i = 0; i < 12; ++i) cr_assert_eq(all[i], i < 4 ? 0x11 : i < 8 ? 0x22 : 0x33, "byte %d", i);
  cr_assert_eq(live, 0u);
  cr_assert_eq(copies, 2);  // in, then out
  cr_assert_eq(g.collectives(), 1u);
}
