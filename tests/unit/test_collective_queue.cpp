// The collective queue (src/distributed/collective_queue.h): operations run in
// submission order on one thread other than the caller's; wait() rethrows
// an operation's failure; after one failure every later operation fails
// without running; drain() waits for everything and rethrows the failure;
// the destructor finishes what is queued.
#include <criterion/criterion.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "distributed/collective_queue.h"

using pstar::distributed::CollectiveQueue;

Test(collective_queue, runs_in_order_on_another_thread) {
  CollectiveQueue q;
  std::vector<int> order;  // written by the queue's thread only
  std::thread::id runner;
  std::vector<CollectiveQueue::Ticket> tickets;
  for (int i = 0; i < 50; ++i) {
    tickets.push_back(q.submit([&, i] {
      if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the rest queue up behind it
      runner = std::this_thread::get_id();
      order.push_back(i);
    }));
  }
  q.wait(tickets.back());  // the last one done: all before it are done
  for (const auto& t : tickets) cr_assert(q.done(t));
  cr_assert_eq(order.size(), 50u);
  for (int i = 0; i < 50; ++i) cr_assert_eq(order[static_cast<size_t>(i)], i);
  cr_assert_neq(runner, std::this_thread::get_id());
  q.drain();  // nothing failed: returns
}

Test(collective_queue, a_failure_fails_every_later_operation_without_running_it) {
  CollectiveQueue q;
  std::atomic<int> ran{0};
  auto ok1 = q.submit([&] { ++ran; });
  auto bad = q.submit([&] {
    ++ran;
    throw std::runtime_error("peer gone");
  });
  auto later = q.submit([&] { ++ran; });
  q.wait(ok1);
  try {
    q.wait(bad);
    cr_assert_fail("wait() of the failed operation returned");
  } catch (const std::runtime_error& e) {
    cr_assert_str_eq(e.what(), "peer gone");
  }
  try {
    q.wait(later);
    cr_assert_fail("an operation after a failure ran");
  } catch (const std::runtime_error& e) {
    cr_assert_str_eq(e.what(), "peer gone", "it carries the first failure");
  }
  cr_assert_eq(ran.load(), 2, "the operation after the failure did not run");
  cr_assert_throw(q.drain(), std::runtime_error);
  auto after = q.submit([&] { ++ran; });
  cr_assert_throw(q.wait(after), std::runtime_error);
  cr_assert_eq(ran.load(), 2);
}

Test(collective_queue, drain_waits_and_the_destructor_finishes_the_queue) {
  std::atomic<int> ran{0};
  {
    CollectiveQueue q;
    for (int i = 0; i < 5; ++i) {
      q.submit([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ++ran;
      });
    }
    q.drain();
    cr_assert_eq(ran.load(), 5);
    for (int i = 0; i < 5; ++i) {
      q.submit([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ++ran;
      });
    }
  }  // destroyed with five queued
  cr_assert_eq(ran.load(), 10);
  CollectiveQueue idle;
  cr_assert(idle.done(nullptr));
  idle.wait(nullptr);
  idle.drain();
}
