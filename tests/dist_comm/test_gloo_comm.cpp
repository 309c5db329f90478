// The Gloo communicator with 1 to 4 ranks as threads of one process: every
// collective's result, in-place use, and failure handling (a timeout, a peer
// that leaves) without hangs.
#include <criterion/criterion.h>

#include <gloo/rendezvous/hash_store.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "distributed/comm/gloo_communicator.h"
#include "util/error.h"

using namespace pstar;
using namespace pstar::distributed;

namespace {

// Runs body(comm) on `ranks` threads, one communicator each; returns the
// number of ranks whose body threw (messages in *errors).
int run_ranks(int ranks, const std::function<void(Communicator&)>& body, std::vector<std::string>* errors = nullptr,
              std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::atomic<int> failures{0};
  std::vector<std::string> msgs(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooConfig cfg;
        cfg.rank = r;
        cfg.size = ranks;
        cfg.timeout = timeout;
        auto comm = make_gloo_communicator(cfg, store);
        body(*comm);
      } catch (const std::exception& e) {
        msgs[static_cast<size_t>(r)] = e.what();
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  if (errors != nullptr) *errors = msgs;
  return failures.load();
}

}  // namespace

Test(gloo_comm, all_gather_in_place_and_out_of_place) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const size_t shard = 1000;  // bytes: not a multiple of 8 on purpose
    const int failed = run_ranks(ranks, [&](Communicator& c) {
      std::vector<unsigned char> mine(shard), out(shard * static_cast<size_t>(c.size()));
      for (size_t i = 0; i < shard; ++i) mine[i] = static_cast<unsigned char>((c.rank() * 31 + i) & 0xff);
      c.all_gather(mine.data(), out.data(), shard);
      for (int r = 0; r < c.size(); ++r)
        for (size_t i = 0; i < shard; ++i)
          cr_assert_eq(out[static_cast<size_t>(r) * shard + i], static_cast<unsigned char>((r * 31 + i) & 0xff));
      // In place: this rank's block already holds its shard.
      std::vector<unsigned char> inplace(shard * static_cast<size_t>(c.size()), 0);
      std::memcpy(inplace.data() + static_cast<size_t>(c.rank()) * shard, mine.data(), shard);
      c.all_gather(inplace.data() + static_cast<size_t>(c.rank()) * shard, inplace.data(), shard);
      cr_assert(inplace == out);
    });
    cr_assert_eq(failed, 0, "%d ranks", ranks);
  }
}

Test(gloo_comm, reduce_scatter_sums_each_block_exactly) {
  std::vector<std::string> errors;
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const size_t block = 4099;
    const int failed = run_ranks(ranks, [&](Communicator& c) {
      std::vector<float> data(block * static_cast<size_t>(c.size())), out(block);
      for (int step = 0; step < 3; ++step) {  // the cached algorithm is reused
        for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>((c.rank() + 1) * (i % 97) + step);
        c.reduce_scatter_sum(data.data(), out.data(), block);
        const size_t off = static_cast<size_t>(c.rank()) * block;
        const int n = c.size();
        for (size_t i = 0; i < block; ++i) {
          // sum over r of (r + 1) * x + step = x * n (n + 1) / 2 + n * step
          const float x = static_cast<float>((off + i) % 97);
          cr_assert_eq(out[i], x * static_cast<float>(n * (n + 1) / 2) + static_cast<float>(n * step), "%d ranks, rank %d, element %zu", n, c.rank(), i);
        }
      }
    }, &errors);
    cr_assert_eq(failed, 0, "%d ranks: %s | %s | %s | %s", ranks, errors[0].c_str(), errors.size() > 1 ? errors[1].c_str() : "",
                 errors.size() > 2 ? errors[2].c_str() : "", errors.size() > 3 ? errors[3].c_str() : "");
  }
}

Test(gloo_comm, all_reduce_broadcast_and_barrier) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const int failed = run_ranks(ranks, [&](Communicator& c) {
      double sums[2] = {static_cast<double>(c.rank()) + 0.5, 1.0};
      c.all_reduce_sum(sums, 2);
      const int n = c.size();
      cr_assert_eq(sums[0], n * (n - 1) / 2.0 + 0.5 * n);
      cr_assert_eq(sums[1], static_cast<double>(n));
      int64_t flags[2] = {c.rank() == n - 1 ? 7 : 0, -c.rank()};
      c.all_reduce_max(flags, 2);
      cr_assert_eq(flags[0], 7);
      cr_assert_eq(flags[1], 0);
      std::vector<char> msg(300, 0);
      if (c.rank() == n / 2) std::memcpy(msg.data(), "from the root", 14);
      c.broadcast(msg.data(), msg.size(), n / 2);
      cr_assert_str_eq(msg.data(), "from the root");
      c.barrier();
      cr_assert_str_eq(c.backend(), "gloo");
      cr_assert_not(c.failed());
    });
    cr_assert_eq(failed, 0, "%d ranks", ranks);
  }
}

// Rank 1 skips the collective the others enter: they time out with
// PSTAR_ERR_COMM, are marked failed, and refuse the next call at once.
Test(gloo_comm, a_missing_peer_times_out_and_poisons_the_communicator) {
  std::atomic<int> comm_errors{0}, refused{0};
  std::vector<std::string> errors;
  run_ranks(
      3,
      [&](Communicator& c) {
        if (c.rank() == 1) return;  // leaves: its pairs close when it is destroyed
        std::vector<float> data(3 * 64, 1.0f), out(64);
        try {
          c.reduce_scatter_sum(data.data(), out.data(), 64);
        } catch (const Error& e) {
          if (e.status() == PSTAR_ERR_COMM) ++comm_errors;
        }
        cr_assert(c.failed());
        try {
          c.barrier();
        } catch (const Error& e) {
          if (e.status() == PSTAR_ERR_COMM && std::string(e.what()).find("earlier collective failed") != std::string::npos)
            ++refused;
        }
      },
      &errors, std::chrono::milliseconds(2000));
  cr_assert_eq(comm_errors.load(), 2);
  cr_assert_eq(refused.load(), 2);
}

Test(gloo_comm, bad_arguments) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  GlooConfig cfg;
  cfg.rank = 2;
  cfg.size = 2;
  try {
    make_gloo_communicator(cfg, store);
    cr_assert_fail("rank 2 of 2 accepted");
  } catch (const Error& e) {
    cr_assert_eq(e.status(), PSTAR_ERR_INVALID_ARGUMENT);
  }
}
