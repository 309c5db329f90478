// pstar-bench comm: all-gather and reduce-scatter bus bandwidth over Gloo on
// loopback, through libpstar's communicator and through Gloo's own API.
//
//   pstar-bench comm [--ranks 2,4] [--bytes 1M,8M] [--reps 7] [--json]
//
// Ranks are threads of this process, each with its own Gloo context (a full
// mesh of TCP pairs on 127.0.0.1), rendezvous through Gloo's in-process
// HashStore.  Per size, each rep times one collective on every rank (after a
// barrier) and takes the slowest rank's time; the median over reps is
// reported.  The same collective runs through Gloo's own API on a second
// context, interleaved rep by rep, and overhead_ratio = libpstar / Gloo:
// all-gather is gloo::allgather both ways (the wrapper's overhead);
// reduce-scatter is libpstar's ring over Gloo's unbound buffers against
// Gloo's ReduceScatterHalvingDoubling (which returned wrong sums
// intermittently at 3-4 ranks when reused; see gloo_communicator.cpp), so
// there the ratio compares algorithms too.
// Bus bandwidth as nccl-tests defines it: all-gather and reduce-scatter move
// (n-1)/n of the full buffer through each rank, so
// busbw = full_bytes / time * (n-1)/n.  `bytes` is the full buffer (n
// shards); reduce-scatter reduces fp32.
#include <CLI/CLI.hpp>
#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "distributed/comm/gloo_communicator.h"

namespace pstar::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct CommOptions {
  std::string ranks = "2,4";
  std::string bytes = "1M,8M";
  int reps = 7;
  bool json = false;
};

std::vector<uint64_t> parse_list(const std::string& s, bool sizes) {
  std::vector<uint64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    uint64_t mul = 1;
    if (sizes && !item.empty() && (item.back() == 'K' || item.back() == 'k')) mul = 1u << 10;
    if (sizes && !item.empty() && (item.back() == 'M' || item.back() == 'm')) mul = 1u << 20;
    if (mul != 1) item.pop_back();
    out.push_back(std::stoull(item) * mul);
  }
  return out;
}

// A reusable barrier for the rank threads (C++17 has none).
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

struct Result {
  double ours_s, gloo_s;
};

// One op at one size and rank count: per rep the slowest rank's time, ours
// and Gloo's interleaved.
Result measure(const std::string& op, int n, uint64_t full_bytes, int reps) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::vector<double>> ours(static_cast<size_t>(n)), direct(static_cast<size_t>(n));
  ThreadBarrier sync(n);
  std::vector<std::thread> threads;
  std::atomic<bool> failed{false};
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        distributed::GlooConfig cfg;
        cfg.rank = r;
        cfg.size = n;
        cfg.prefix = "bench/pstar";
        auto comm = distributed::make_gloo_communicator(cfg, store);
        // Gloo's own context: the same transport and algorithms, no libpstar.
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(r, n);
        gloo::rendezvous::PrefixStore prefixed("bench/gloo", *store);
        ctx->connectFullMesh(prefixed, device);

        const size_t shard = full_bytes / static_cast<size_t>(n);
        std::vector<char> out(shard * static_cast<size_t>(n)), mine(shard, static_cast<char>(r));
        const size_t block = shard / sizeof(float);
        std::vector<float> data(block * static_cast<size_t>(n), 1.0f), reduced(block);
        std::vector<float> gdata(block * static_cast<size_t>(n), 1.0f);
        std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs;
        if (op == "reduce_scatter") {
          std::vector<int> recv(static_cast<size_t>(n), static_cast<int>(block));
          rs = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(ctx, std::vector<float*>{gdata.data()},
                                                                           static_cast<int>(block * n), recv);
        }
        auto run_ours = [&] {
          if (op == "allgather") {
            comm->all_gather(mine.data(), out.data(), shard);
          } else {
            comm->reduce_scatter_sum(data.data(), reduced.data(), block);
          }
        };
        auto run_gloo = [&] {
          if (op == "allgather") {
            std::memcpy(out.data() + static_cast<size_t>(r) * shard, mine.data(), shard);
            gloo::AllgatherOptions opts(ctx);
            opts.setOutput(out.data(), out.size());
            gloo::allgather(opts);
          } else {
            rs->run();
            std::memcpy(reduced.data(), gdata.data(), block * sizeof(float));
          }
        };
        auto timed = [&](const std::function<void()>& f) {
          sync.arrive_and_wait();
          const auto t0 = Clock::now();
          f();
          return std::chrono::duration<double>(Clock::now() - t0).count();
        };
        run_ours();  // warm-up: connections, buffer registration
        run_gloo();
        for (int i = 0; i < reps; ++i) {
          ours[static_cast<size_t>(r)].push_back(timed(run_ours));
          direct[static_cast<size_t>(r)].push_back(timed(run_gloo));
        }
        sync.arrive_and_wait();
      } catch (const std::exception& e) {
        std::cerr << "pstar-bench comm: rank " << r << ": " << e.what() << "\n";
        failed = true;
        std::abort();  // the other ranks would wait for this one
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<double> o, g;
  for (int i = 0; i < reps; ++i) {
    double mo = 0, mg = 0;
    for (int r = 0; r < n; ++r) {
      mo = std::max(mo, ours[static_cast<size_t>(r)][static_cast<size_t>(i)]);
      mg = std::max(mg, direct[static_cast<size_t>(r)][static_cast<size_t>(i)]);
    }
    o.push_back(mo);
    g.push_back(mg);
  }
  return {median(o), median(g)};
}

int run_comm(const CommOptions& o) {
  for (uint64_t n : parse_list(o.ranks, false)) {
    if (n < 2 || n > 16) throw std::invalid_argument("--ranks: each between 2 and 16");
    for (uint64_t bytes : parse_list(o.bytes, true)) {
      const uint64_t full = bytes / (n * sizeof(float)) * (n * sizeof(float));  // whole fp32 shards
      for (const char* op : {"allgather", "reduce_scatter"}) {
        const Result r = measure(op, static_cast<int>(n), full, o.reps);
        const double factor = static_cast<double>(n - 1) / static_cast<double>(n);
        nlohmann::ordered_json j;
        j["bench"] = "comm";
        j["backend"] = "gloo";
        j["op"] = op;
        j["ranks"] = n;
        j["bytes"] = full;
        j["time_us"] = r.ours_s * 1e6;
        j["gloo_time_us"] = r.gloo_s * 1e6;
        j["busbw_gbs"] = static_cast<double>(full) / r.ours_s * factor / 1e9;
        j["gloo_busbw_gbs"] = static_cast<double>(full) / r.gloo_s * factor / 1e9;
        j["overhead_ratio"] = r.ours_s / r.gloo_s;
        j["gloo_reference"] = std::string(op) == "allgather" ? "gloo::allgather" : "gloo::ReduceScatterHalvingDoubling";
        j["reps"] = o.reps;
        std::cout << (o.json ? j.dump() : j.dump(1)) << std::endl;
      }
    }
  }
  return 0;
}

}  // namespace

CLI::App* add_comm_subcommand(CLI::App& app, std::function<int()>* run) {
  auto o = std::make_shared<CommOptions>();
  CLI::App* sub = app.add_subcommand("comm", "all-gather and reduce-scatter over Gloo on loopback vs Gloo's own API");
  sub->add_option("--ranks", o->ranks, "comma-separated rank counts")->capture_default_str();
  sub->add_option("--bytes", o->bytes, "comma-separated full buffer sizes (suffixes K, M)")->capture_default_str();
  sub->add_option("--reps", o->reps, "timed repetitions (median reported)")->capture_default_str();
  sub->add_flag("--json", o->json, "one JSON object per line");
  *run = [o] { return run_comm(*o); };
  return sub;
}

}  // namespace pstar::bench
