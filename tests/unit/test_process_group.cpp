// The process group (src/dist/process_group.h) on its own, over a scripted
// communicator: one process has no communicator; a collective's
// PSTAR_ERR_COMM (or a foreign exception) fails the group for good and
// every later collective is refused with the first failure; other pstar
// errors pass through and fail nothing; the hash depends on the kinds,
// chunks and order of the collectives issued, and take_hash() begins a new
// one; inline collectives drain the queue first; a queued failure is
// reported by wait_failed() and by the next inline collective.
#include <criterion/criterion.h>

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dist/process_group.h"
#include "fakes.h"
#include "util/error.h"

using pstar::Error;
using pstar::dist::CollectiveKind;
using pstar::dist::ProcessGroup;

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
