#include <criterion/criterion.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

#include "util/thread_pool.h"

using pstar::ThreadPool;

namespace {

// Runs parallel_for and checks that every index of [0, n) is visited exactly
// once, by blocks that match ThreadPool::partition.
void check_coverage(ThreadPool& pool, size_t n, size_t grain) {
  std::vector<std::atomic<int>> hits(n);
  for (auto& h : hits) h.store(0);
  std::mutex mu;
  std::set<std::pair<size_t, size_t>> blocks;
  pool.parallel_for(n, grain, [&](size_t b, size_t e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      blocks.insert({b, e});
    }
    for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
  });
  // One assertion for the whole range (Criterion reports each assertion).
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; ++i) {
    if (hits[i].load() != 1) bad = i;
  }
  cr_assert(bad == n, "n=%zu grain=%zu threads=%u: index %zu visited %d times", n, grain, pool.size(), bad,
            bad < n ? hits[bad].load() : 0);
  const std::vector<size_t> bounds = ThreadPool::partition(n, grain, pool.size());
  cr_assert_eq(blocks.size(), n == 0 ? 0u : bounds.size() - 1, "n=%zu grain=%zu: %zu blocks", n, grain,
               blocks.size());
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    cr_assert(blocks.count({bounds[k], bounds[k + 1]}) == 1, "block [%zu, %zu) missing", bounds[k], bounds[k + 1]);
  }
}

}  // namespace

Test(thread_pool, size_and_default) {
  ThreadPool one(1), two(2), four(4);
  cr_assert_eq(one.size(), 1u);
  cr_assert_eq(two.size(), 2u);
  cr_assert_eq(four.size(), 4u);
  ThreadPool hw(0);
  const unsigned expect = std::thread::hardware_concurrency() == 0 ? 1u : std::thread::hardware_concurrency();
  cr_assert_eq(hw.size(), expect);
}

Test(thread_pool, every_index_exactly_once_for_1_2_4_threads) {
  for (unsigned threads : {1u, 2u, 4u}) {
    ThreadPool pool(threads);
    for (size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{64}, size_t{100}, size_t{1000},
                     size_t{4097}, size_t{100003}}) {
      for (size_t grain : {size_t{1}, size_t{3}, size_t{16}, size_t{64}, size_t{4096}}) {
        check_coverage(pool, n, grain);
      }
    }
  }
}

Test(thread_pool, partition_is_contiguous_grain_aligned_and_balanced) {
  for (unsigned parts : {1u, 2u, 3u, 4u, 7u}) {
    for (size_t n : {size_t{1}, size_t{5}, size_t{16}, size_t{17}, size_t{1000}, size_t{1000003}}) {
      for (size_t grain : {size_t{1}, size_t{16}, size_t{1000}}) {
        const std::vector<size_t> b = ThreadPool::partition(n, grain, parts);
        const size_t units = (n + grain - 1) / grain;
        const size_t expect_blocks = units < parts ? units : parts;
        cr_assert_eq(b.size(), expect_blocks + 1);
        cr_assert_eq(b.front(), 0u);
        cr_assert_eq(b.back(), n);
        size_t min_units = ~size_t{0}, max_units = 0;
        for (size_t k = 0; k + 1 < b.size(); ++k) {
          cr_assert(b[k] < b[k + 1], "empty block");
          if (k + 2 < b.size()) {
            cr_assert_eq(b[k + 1] % grain, 0u, "inner boundary %zu not a multiple of %zu", b[k + 1], grain);
          }
          const size_t u = (b[k + 1] - b[k] + grain - 1) / grain;
          min_units = u < min_units ? u : min_units;
          max_units = u > max_units ? u : max_units;
        }
        cr_assert(max_units - min_units <= 1, "unbalanced: %zu vs %zu units", min_units, max_units);
      }
    }
  }
  // Deterministic: a pure function of its arguments, the same on every call.
  cr_assert(ThreadPool::partition(1000003, 64, 4) == ThreadPool::partition(1000003, 64, 4));
  const std::vector<size_t> b = ThreadPool::partition(10, 4, 2);  // 3 units: 2 + 1
  cr_assert(b == (std::vector<size_t>{0, 8, 10}));
}

Test(thread_pool, n_zero_calls_nothing) {
  for (unsigned threads : {1u, 2u, 4u}) {
    ThreadPool pool(threads);
    std::atomic<int> calls{0};
    pool.parallel_for(0, 16, [&](size_t, size_t) { calls.fetch_add(1); });
    cr_assert_eq(calls.load(), 0);
  }
}

Test(thread_pool, n_below_grain_is_one_block_on_the_caller) {
  ThreadPool pool(4);
  std::atomic<int> calls{0};
  std::thread::id who;
  pool.parallel_for(10, 64, [&](size_t b, size_t e) {
    cr_assert_eq(b, 0u);
    cr_assert_eq(e, 10u);
    who = std::this_thread::get_id();
    calls.fetch_add(1);
  });
  cr_assert_eq(calls.load(), 1);
  cr_assert(who == std::this_thread::get_id());
  check_coverage(pool, 10, 64);
  check_coverage(pool, 1, 1000000);
}

Test(thread_pool, grain_zero_is_taken_as_one) {
  ThreadPool pool(2);
  check_coverage(pool, 5, 0);
}

Test(thread_pool, uses_the_caller_and_other_threads) {
  ThreadPool pool(4);
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.parallel_for(4, 1, [&](size_t b, size_t) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
    (void)b;
  });
  cr_assert_eq(ids.size(), 4u);
  cr_assert(ids.count(std::this_thread::get_id()) == 1);
}

Test(thread_pool, exception_in_a_worker_is_rethrown_in_the_caller) {
  for (unsigned threads : {1u, 2u, 4u}) {
    ThreadPool pool(threads);
    std::atomic<size_t> done{0};
    bool caught = false;
    try {
      pool.parallel_for(400, 1, [&](size_t b, size_t e) {
        if (b <= 399 && 399 < e) throw std::runtime_error("last block");
        done.fetch_add(e - b);
      });
    } catch (const std::runtime_error& err) {
      caught = std::string(err.what()) == "last block";
    }
    cr_assert(caught, "threads=%u: the exception did not reach the caller", threads);
    // The other blocks ran to completion.
    const std::vector<size_t> b = ThreadPool::partition(400, 1, threads);
    cr_assert_eq(done.load(), b[b.size() - 2], "threads=%u", threads);
    // The pool still works afterwards.
    check_coverage(pool, 1000, 7);
  }
}

Test(thread_pool, lowest_block_exception_wins) {
  ThreadPool pool(4);
  for (int round = 0; round < 50; ++round) {
    try {
      pool.parallel_for(4, 1, [&](size_t b, size_t) { throw static_cast<int>(b); });
      cr_assert_fail("no exception");
    } catch (int b) {
      cr_assert_eq(b, 0);
    }
  }
}

Test(thread_pool, many_calls_in_a_row) {
  ThreadPool pool(4);
  std::atomic<uint64_t> sum{0};
  for (int round = 0; round < 2000; ++round) {
    pool.parallel_for(64, 8, [&](size_t b, size_t e) {
      uint64_t s = 0;
      for (size_t i = b; i < e; ++i) s += i;
      sum.fetch_add(s);
    });
  }
  cr_assert_eq(sum.load(), 2000u * (63u * 64u / 2u));
}

Test(thread_pool, nested_call_runs_inline) {
  ThreadPool pool(2);
  std::atomic<size_t> total{0};
  pool.parallel_for(2, 1, [&](size_t, size_t) {
    pool.parallel_for(100, 1, [&](size_t b, size_t e) { total.fetch_add(e - b); });
  });
  cr_assert_eq(total.load(), 200u);
}

Test(thread_pool, concurrent_callers_are_serialized) {
  ThreadPool pool(2);
  std::atomic<size_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int round = 0; round < 200; ++round) {
        pool.parallel_for(1000, 10, [&](size_t b, size_t e) { total.fetch_add(e - b); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  cr_assert_eq(total.load(), 3u * 200u * 1000u);
}

Test(thread_pool, destruction_joins_idle_workers) {
  for (int round = 0; round < 20; ++round) {
    ThreadPool pool(4);
    if (round % 2 == 0) check_coverage(pool, 100, 1);
  }
}
