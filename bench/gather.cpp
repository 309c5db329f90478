// pstar-bench gather: a sharded training iteration with and without
// gathering ahead (pstar_x_engine_set_gather_ahead), ranks over Gloo on
// loopback.
//
//   pstar-bench gather [--ranks 2] [--layers 8] [--chunk-elems 2097152]
//                      [--compute-ms 4] [--depths 0,1,2] [--steps 8] [--json]
//
// The model: `layers` bf16 parameters of chunk_elems elements, one chunk
// each.  An iteration acquires them in order for FORWARD, then in reverse
// for BACKWARD (writing a gradient), each use followed by `compute-ms` of
// modelled compute, then steps.  The compute is the rank's thread sleeping,
// as a thread that launched GPU kernels waits for them: the CPU is free
// meanwhile (for the collective queue's thread and Gloo), as it would be
// beside a GPU.  So this measures how much of the all-gather time the
// engine hides behind compute, not a CPU's compute.
//
// Ranks are forked processes (each engine forms its own group through the
// libpstar store on a free loopback port).  Per depth, every rank runs
// `steps` TRAIN iterations; the first two (recording the schedule, then
// the first that follows it) are not measured.  Rank 0's median iteration
// time is reported, with speedup_vs_depth0 = iter_s(depth 0) / iter_s
// measured in the same run, and the modelled compute per iteration
// (2 x layers x compute-ms) as the floor an iteration cannot go below.
// acquire_s is rank 0's median time inside pstar_param_acquire per
// iteration: at depth 0 mostly the all-gathers, at depth > 0 what is left
// of them (waits for gathers not done yet); acquire_hidden_fraction =
// 1 - acquire_s / acquire_s(depth 0).  release_s, the time inside
// pstar_param_release, holds the gradients' reduce-scatters (issued by the
// release that completes a chunk's backward): blocking at depth 0, queued
// at depth > 0, where the engine has a collective queue.
#define PSTAR_EXPERIMENTAL_API 1
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "pstar/pstar.h"

namespace pstar::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct GatherOptions {
  int ranks = 2;
  int layers = 8;
  double chunk_elems = 2097152;
  double compute_ms = 4.0;
  std::string depths = "0,1,2";
  int steps = 8;
  bool json = false;
};

constexpr int kUnmeasured = 2;  // recording + the first iteration that follows
constexpr int kMaxSteps = 64;

// What a rank reports back through shared memory.
struct RankResult {
  int status;  // 0 ok
  char message[512];
  double iter_s[kMaxSteps];
  double acquire_s[kMaxSteps];  // time inside pstar_param_acquire
  double release_s[kMaxSteps];  // time inside pstar_param_release
  uint64_t gathers_ahead, gathers_on_demand, gathers_waited;
  double wait_s;
};

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    throw std::runtime_error("could not find a free loopback port");
  }
  close(fd);
  return ntohs(a.sin_port);
}

void run_rank(const GatherOptions& o, uint32_t depth, int rank, RankResult* out) {
  pstar_engine_options eo;
  check(pstar_engine_options_init(&eo), "pstar_engine_options_init");
  eo.rank = rank;
  eo.world_size = o.ranks;
  eo.compute_dtype = PSTAR_DTYPE_BF16;
  eo.chunk_elems = static_cast<uint64_t>(o.chunk_elems);
  eo.threads = 1;
  pstar_engine* e = nullptr;
  check(pstar_engine_create(&eo, &e), "pstar_engine_create");
  std::unique_ptr<pstar_engine, decltype(&pstar_engine_destroy)> guard(e, &pstar_engine_destroy);
  check(pstar_x_engine_set_gather_ahead(e, depth), "pstar_x_engine_set_gather_ahead");
  // One chunk per layer: the parameter fills its chunk (less the padding
  // sharding adds to a multiple of ranks x 128 elements).
  const int64_t n = static_cast<int64_t>(eo.chunk_elems);
  std::vector<uint32_t> ids(static_cast<size_t>(o.layers));
  for (int l = 0; l < o.layers; ++l) {
    const std::string name = "layer" + std::to_string(l);
    check(pstar_param_register(e, name.c_str(), 1, &n, 0, &ids[static_cast<size_t>(l)]), "pstar_param_register");
  }
  check(pstar_engine_build(e), "pstar_engine_build");
  std::vector<float> values(static_cast<size_t>(n));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97) / 97.0f - 0.5f;
  for (uint32_t id : ids)
    check(pstar_param_write(e, id, values.data(), values.size(), PSTAR_DTYPE_F32), "pstar_param_write");
  std::vector<float> grad(static_cast<size_t>(n), 1.0f / 64.0f);
  const auto compute = std::chrono::microseconds(static_cast<int64_t>(o.compute_ms * 1000.0));
  for (int s = 0; s < o.steps; ++s) {
    const auto t0 = Clock::now();
    check(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN), "pstar_iteration_begin");
    double acquiring = 0.0, releasing = 0.0;
    auto release = [&](uint32_t id) {
      const auto r0 = Clock::now();
      check(pstar_param_release(e, id, nullptr), "pstar_param_release");
      releasing += std::chrono::duration<double>(Clock::now() - r0).count();
    };
    auto acquire = [&](uint32_t id, pstar_stage stage) {
      void* w = nullptr;
      const auto a0 = Clock::now();
      check(pstar_param_acquire(e, id, stage, nullptr, &w), "pstar_param_acquire");
      acquiring += std::chrono::duration<double>(Clock::now() - a0).count();
    };
    for (uint32_t id : ids) {
      acquire(id, PSTAR_STAGE_FORWARD);
      std::this_thread::sleep_for(compute);
      release(id);
    }
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
      acquire(*it, PSTAR_STAGE_BACKWARD);
      std::this_thread::sleep_for(compute);
      check(pstar_grad_write(e, *it, grad.data(), grad.size(), PSTAR_DTYPE_F32, PSTAR_MEM_HOST, nullptr),
            "pstar_grad_write");
      release(*it);
    }
    check(pstar_step(e, nullptr), "pstar_step");
    out->iter_s[s] = std::chrono::duration<double>(Clock::now() - t0).count();
    out->acquire_s[s] = acquiring;
    out->release_s[s] = releasing;
  }
  pstar_x_gather_stats g;
  check(pstar_x_gather_stats_init(&g), "pstar_x_gather_stats_init");
  check(pstar_x_gather_get_stats(e, &g), "pstar_x_gather_get_stats");
  out->gathers_ahead = g.gathers_ahead;
  out->gathers_on_demand = g.gathers_on_demand;
  out->gathers_waited = g.gathers_waited;
  out->wait_s = g.wait_seconds;
  check(pstar_engine_destroy(guard.release()), "pstar_engine_destroy");
}

// Forks the ranks for one depth and waits for them (bounded).
void run_depth(const GatherOptions& o, uint32_t depth, RankResult* results) {
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "SLURM_PROCID", "SLURM_NTASKS"}) {
        unsetenv(v);
      }
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      RankResult* out = &results[r];
      try {
        run_rank(o, depth, r, out);
        out->status = 0;
      } catch (const std::exception& e) {
        out->status = 1;
        std::snprintf(out->message, sizeof out->message, "%s", e.what());
      }
      std::fflush(nullptr);
      _exit(out->status);
    }
    pids.push_back(pid);
  }
  for (int r = 0; r < o.ranks; ++r) {
    int ws = 0;
    while (waitpid(pids[static_cast<size_t>(r)], &ws, 0) < 0 && errno == EINTR) {
    }
    // A rank that died (a signal, a sanitizer's exit code) fails the run
    // whatever it wrote.
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
      if (results[r].status == 0) results[r].status = 1;
      if (results[r].message[0] == '\0') {
        std::snprintf(results[r].message, sizeof results[r].message, "exited abnormally (wait status %d)", ws);
      }
    }
  }
  for (int r = 0; r < o.ranks; ++r) {
    if (results[r].status != 0) {
      throw std::runtime_error("rank " + std::to_string(r) + " at depth " + std::to_string(depth) + ": " +
                               (results[r].message[0] != '\0' ? results[r].message : "exited abnormally"));
    }
  }
}

int run_gather(const GatherOptions& o) {
  if (o.ranks < 2 || o.ranks > 8) throw std::runtime_error("--ranks: 2 to 8");
  if (o.layers < 1 || o.steps <= kUnmeasured || o.steps > kMaxSteps) {
    throw std::runtime_error("--layers at least 1, --steps " + std::to_string(kUnmeasured + 1) + " to " +
                             std::to_string(kMaxSteps));
  }
  std::vector<uint32_t> depths;
  {
    std::stringstream in(o.depths);
    std::string item;
    while (std::getline(in, item, ',')) depths.push_back(static_cast<uint32_t>(std::stoul(item)));
  }
  if (depths.empty() || depths.front() != 0) throw std::runtime_error("--depths must start with 0 (the baseline)");
  const size_t bytes = sizeof(RankResult) * static_cast<size_t>(o.ranks);
  void* shared = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) throw std::runtime_error("mmap failed");
  auto* results = static_cast<RankResult*>(shared);
  double baseline = 0.0, baseline_acquire = 0.0;
  const double compute_s = 2.0 * o.layers * o.compute_ms / 1000.0;
  for (uint32_t depth : depths) {
    std::memset(shared, 0, bytes);
    run_depth(o, depth, results);
    const RankResult& r0 = results[0];
    const std::vector<double> measured(r0.iter_s + kUnmeasured, r0.iter_s + o.steps);
    const double iter_s = median(measured);
    const double acquire_s = median(std::vector<double>(r0.acquire_s + kUnmeasured, r0.acquire_s + o.steps));
    const double release_s = median(std::vector<double>(r0.release_s + kUnmeasured, r0.release_s + o.steps));
    if (depth == 0) {
      baseline = iter_s;
      baseline_acquire = acquire_s;
    }
    // The share of depth 0's acquire time (its gathers) no longer spent
    // in acquires.
    const double hidden = baseline_acquire > 0.0 ? 1.0 - acquire_s / baseline_acquire : 0.0;
    const int following = o.steps - 1;
    const double chunk_bytes = o.chunk_elems * 2.0;
    if (o.json) {
      nlohmann::json j = {{"bench", "gather"},
                          {"ranks", o.ranks},
                          {"depth", depth},
                          {"layers", o.layers},
                          {"chunk_bytes", chunk_bytes},
                          {"compute_ms", o.compute_ms},
                          {"iter_s", iter_s},
                          {"compute_s", compute_s},
                          {"speedup_vs_depth0", baseline / iter_s},
                          {"acquire_s", acquire_s},
                          {"acquire_hidden_fraction", hidden},
                          {"release_s", release_s},
                          {"gathers_ahead", r0.gathers_ahead},
                          {"gathers_on_demand", r0.gathers_on_demand},
                          {"gathers_waited", r0.gathers_waited},
                          {"wait_s_per_iter", r0.wait_s / following}};
      std::cout << j.dump() << std::endl;
    } else {
      std::printf(
          "gather: %d ranks, %d layers of %.1f MiB, %.1f ms compute per use; depth %u: iteration %.2f ms "
          "(modelled compute %.1f ms), %.3fx depth 0; acquires %.2f ms (%.0f%% of depth 0's hidden), releases "
          "%.2f ms; %llu "
          "gathers ahead (%llu waited for, %.2f ms per iteration), %llu at the acquire\n",
          o.ranks, o.layers, chunk_bytes / 1048576.0, o.compute_ms, depth, iter_s * 1e3, compute_s * 1e3,
          baseline / iter_s, acquire_s * 1e3, hidden * 100.0, release_s * 1e3,
          static_cast<unsigned long long>(r0.gathers_ahead), static_cast<unsigned long long>(r0.gathers_waited),
          r0.wait_s / following * 1e3, static_cast<unsigned long long>(r0.gathers_on_demand));
    }
  }
  munmap(shared, bytes);
  return 0;
}

}  // namespace

CLI::App* add_gather_subcommand(CLI::App& app, std::function<int()>* run) {
  auto o = std::make_shared<GatherOptions>();
  CLI::App* cmd = app.add_subcommand("gather", "sharded iterations with and without gathering ahead (Gloo, loopback)");
  cmd->add_option("--ranks", o->ranks, "ranks (forked processes)")->capture_default_str();
  cmd->add_option("--layers", o->layers, "parameters, one chunk each")->capture_default_str();
  cmd->add_option("--chunk-elems", o->chunk_elems, "elements per chunk (bf16)")->capture_default_str();
  cmd->add_option("--compute-ms", o->compute_ms, "modelled compute per use, milliseconds")->capture_default_str();
  cmd->add_option("--depths", o->depths, "gather-ahead depths, comma-separated, 0 first")->capture_default_str();
  cmd->add_option("--steps", o->steps, "TRAIN iterations per depth (the first two unmeasured)")->capture_default_str();
  cmd->add_flag("--json", o->json, "one JSON object per line per depth");
  *run = [o] { return run_gather(*o); };
  return cmd;
}

}  // namespace pstar::bench
