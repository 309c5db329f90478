// pstar-bench nvme: the NVMe tier's step against the drive's bound and
// against the same step with the optimizer state in host memory.
//
//   pstar-bench nvme [--dir PATH] [--elements 33554432] [--chunk-elems 4194304]
//                    [--reps 5] [--disk-bytes 268435456] [--json]
//
// In one run: (1) an engine with everything in host memory; (2) the same
// engine with its optimizer state (master, m, v: 12 bytes per element) on
// the drive, all of it: the host budget holds the compute payloads and the
// staging ring only.  Both train the same parameters with the same
// gradients; each rep times one pstar_step() until its updates are done
// (the forward/backward acquires are outside the timing).  (3) Right before each timed step of (2), the
// drive's sequential write and read bandwidth under --dir with large
// aligned requests (bench/nvme_disk.h), so that a drive whose speed drifts
// (shared or virtual disks do, by 2-3x here) is measured in the state the
// step meets.  Medians are reported.
//
// bound_fraction = median over reps of disk_bound_s / nvme_step_s, where
// disk_bound_s is the time the drive needs, at that rep's measured speed,
// to read and write the optimizer state once each (bytes / read bandwidth
// + bytes / write bandwidth): 1.0 means the step runs at the drive's speed.
// ratio_vs_host = nvme_step_s / host_step_s (medians).
// Where the CPU update is slower than the drive, the step cannot reach the
// disk bound; `update_bound_fraction` = max(disk_bound_s, host_step_s) /
// nvme_step_s says how close it gets to the larger of the two bounds.
// (4) Then (2) again with the synchronous step
// (pstar_x_engine_set_overlap_step(e, 0)), the drive measured before each
// of its steps too: bound_fraction_sync, nvme_step_s_sync.  --sync-first
// runs (4) before (2), to tell the step's mode from the order (the drive,
// and its cache, may be in another state for the engine that runs second).
#define PSTAR_EXPERIMENTAL_API 1
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <limits.h>
#include <unistd.h>

#include "bench_util.h"
#include "nvme_disk.h"
#include "pstar/pstar.h"

namespace pstar::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct NvmeOptions {
  std::string dir;             // empty: a temporary directory beside the build's bin/
  double elements = 33554432;  // 8 chunks of the default size
  double chunk_elems = 4194304;
  int reps = 5;
  bool sync_first = false;  // the synchronous engine (4) before the overlapped one (2)
  double disk_bytes = 268435456;
  uint32_t staging_buffers = 0;  // 0: the engine's default
  uint32_t max_inflight = 0;
  bool json = false;
};

// A temporary directory on the build's filesystem: beside <build>/bin.
std::string default_dir() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string base = ".";
  if (n > 0) {
    exe[n] = '\0';
    base = exe;
    base = base.substr(0, base.rfind('/'));  // <build>/bin
    base = base.substr(0, base.rfind('/'));  // <build>
  }
  std::string tmpl = base + "/nvme-bench-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("cannot create a directory under " + base);
  return buf.data();
}

struct StepTimes {
  std::vector<double> step_s;  // the timed reps
  double median_s = 0;
  pstar_x_nvme_stats nvme{};
  uint64_t peak_host_bytes = 0;
};

// Trains `params` parameters of `per_param` elements for 1 + reps steps and
// returns the median time of pstar_step() over the last reps.
// `before_step` runs before each timed step.
StepTimes time_steps(const NvmeOptions& o, const std::string& nvme_dir, uint32_t params, uint64_t per_param,
                     const std::function<void()>& before_step, bool synchronous = false) {
  pstar_engine_options eo;
  check(pstar_engine_options_init(&eo), "options_init");
  eo.compute_dtype = PSTAR_DTYPE_BF16;
  eo.chunk_elems = static_cast<uint64_t>(o.chunk_elems);
  eo.lr = 1e-4f;
  const uint64_t payload_bytes = static_cast<uint64_t>(params) * eo.chunk_elems * 2;
  pstar_x_nvme_options no;
  check(pstar_x_nvme_options_init(&no), "nvme_options_init");
  no.staging_buffers = o.staging_buffers;
  no.max_inflight = o.max_inflight;
  if (!nvme_dir.empty()) {
    // The payloads, the staging ring (4 + 1 buffers of one chunk's master,
    // m, v) and 1 MiB: every chunk's optimizer state goes to the drive.
    const uint64_t ring = o.staging_buffers == 0 ? 4 : o.staging_buffers;
    const uint64_t staging = (ring + 1) * (3 * eo.chunk_elems * 4 + 2 * 4096);
    eo.host_capacity_bytes = payload_bytes + staging + (1u << 20);
  }
  pstar_engine* e = nullptr;
  check(pstar_engine_create(&eo, &e), "engine_create");
  StepTimes out;
  try {
    if (synchronous) check(pstar_x_engine_set_overlap_step(e, 0), "set_overlap_step");
    if (!nvme_dir.empty()) {
      no.dir = nvme_dir.c_str();
      check(pstar_x_engine_set_nvme(e, &no), "set_nvme");
    }
    std::vector<uint32_t> ids(params);
    for (uint32_t i = 0; i < params; ++i) {
      const int64_t shape[1] = {static_cast<int64_t>(per_param)};
      check(pstar_param_register(e, ("w" + std::to_string(i)).c_str(), 1, shape, PSTAR_PARAM_DEFAULT, &ids[i]),
            "register");
    }
    check(pstar_engine_build(e), "build");
    std::vector<float> g(per_param);
    for (uint64_t j = 0; j < per_param; ++j) g[j] = static_cast<float>((j % 17) - 8) * 1e-3f;
    std::vector<double> times;
    for (int rep = 0; rep <= o.reps; ++rep) {
      check(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN), "iteration_begin");
      void* p = nullptr;
      for (uint32_t id : ids) {
        check(pstar_param_acquire(e, id, PSTAR_STAGE_FORWARD, nullptr, &p), "acquire");
        check(pstar_param_release(e, id, nullptr), "release");
      }
      for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
        check(pstar_param_acquire(e, *it, PSTAR_STAGE_BACKWARD, nullptr, &p), "acquire");
        check(pstar_grad_write(e, *it, g.data(), per_param, PSTAR_DTYPE_F32, PSTAR_MEM_HOST, nullptr), "grad_write");
        check(pstar_param_release(e, *it, nullptr), "release");
      }
      if (rep > 0) before_step();
      const auto t0 = Clock::now();
      check(pstar_step(e, nullptr), "step");
      // The whole update: both engines' steps overlap (the CPU updates, and
      // with the tier the drive's reads and write-backs, run on the update
      // thread after pstar_step returns), and getting the step statistics
      // waits for them.
      pstar_x_step_stats st;
      check(pstar_x_step_stats_init(&st), "step_stats_init");
      check(pstar_x_step_get_stats(e, &st), "step_get_stats");
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep > 0) times.push_back(s);  // the first step is warm-up
    }
    out.step_s = times;
    out.median_s = median(times);
    if (!nvme_dir.empty()) {
      check(pstar_x_nvme_stats_init(&out.nvme), "nvme_stats_init");
      check(pstar_x_nvme_get_stats(e, &out.nvme), "nvme_get_stats");
    }
    pstar_stats st;
    check(pstar_stats_init(&st), "stats_init");
    check(pstar_engine_get_stats(e, &st), "get_stats");
    out.peak_host_bytes = st.peak_host_bytes;
  } catch (...) {
    pstar_engine_destroy(e);
    throw;
  }
  check(pstar_engine_destroy(e), "engine_destroy");
  return out;
}

int run_nvme(const NvmeOptions& o) {
  const bool own_dir = o.dir.empty();
  const std::string dir = own_dir ? default_dir() : o.dir;
  int rc = 0;
  try {
    const uint64_t chunk = static_cast<uint64_t>(o.chunk_elems);
    const uint32_t params = static_cast<uint32_t>(std::max<double>(1.0, o.elements / o.chunk_elems));
    // One parameter per chunk, filling it (the chunk capacity is the unit
    // the drive moves).
    const uint64_t per_param = chunk;
    const uint64_t disk = static_cast<uint64_t>(o.disk_bytes);
    const StepTimes host = time_steps(o, "", params, per_param, [] {});
    std::vector<DiskBandwidth> disks, disks_sync;
    StepTimes nvme, nvme_sync;
    auto run_overlapped = [&] {
      nvme = time_steps(o, dir, params, per_param,
                        [&] { disks.push_back(measure_disk_bandwidth(dir, disk, 4u << 20, 8)); });
    };
    // (4) The same as (2) with the synchronous step, the drive measured
    // before each of its steps too: the overlapped step's cost or gain
    // against the drive, each fraction against its own rep's bound.
    auto run_synchronous = [&] {
      nvme_sync = time_steps(
          o, dir, params, per_param, [&] { disks_sync.push_back(measure_disk_bandwidth(dir, disk, 4u << 20, 8)); },
          true);
    };
    if (o.sync_first) {
      run_synchronous();
      run_overlapped();
    } else {
      run_overlapped();
      run_synchronous();
    }
    const double state_bytes = static_cast<double>(nvme.nvme.bytes_on_nvme);
    // The state read once and written once at a rep's measured speeds.
    auto disk_bound = [&](const DiskBandwidth& d) {
      return state_bytes / (d.read_gbps * 1e9) + state_bytes / (d.write_gbps * 1e9);
    };
    std::vector<double> fractions_sync;
    for (size_t i = 0; i < disks_sync.size(); ++i)
      fractions_sync.push_back(disk_bound(disks_sync[i]) / nvme_sync.step_s[i]);
    const double bound_fraction_sync = median(fractions_sync);
    std::vector<double> reads, writes, bounds, fractions, update_fractions;
    for (size_t i = 0; i < disks.size(); ++i) {
      reads.push_back(disks[i].read_gbps);
      writes.push_back(disks[i].write_gbps);
      const double bound = disk_bound(disks[i]);
      bounds.push_back(bound);
      fractions.push_back(bound / nvme.step_s[i]);
      update_fractions.push_back(std::max(bound, host.median_s) / nvme.step_s[i]);
    }
    const bool direct = disks.front().direct && nvme.nvme.direct != 0;
    const double read_gbs = median(reads), write_gbs = median(writes), disk_bound_s = median(bounds);
    const double bound_fraction = median(fractions), update_bound_fraction = median(update_fractions);
    const double ratio = nvme.median_s / host.median_s;
    if (o.json) {
      nlohmann::json j = {{"bench", "nvme"},
                          {"direct", direct},
                          {"disk_read_gbs", read_gbs},
                          {"disk_write_gbs", write_gbs},
                          {"disk_read_gbs_runs", reads},
                          {"disk_write_gbs_runs", writes},
                          {"bound_fraction_runs", fractions},
                          {"nvme_step_s_runs", nvme.step_s},
                          {"elements", static_cast<uint64_t>(params) * per_param},
                          {"chunks_on_nvme", nvme.nvme.chunks_on_nvme},
                          {"state_bytes_on_nvme", nvme.nvme.bytes_on_nvme},
                          {"disk_bound_s", disk_bound_s},
                          {"nvme_step_s", nvme.median_s},
                          {"host_step_s", host.median_s},
                          {"step_io_wait_s_total", nvme.nvme.step_io_wait_seconds},
                          {"bound_fraction", bound_fraction},
                          {"bound_fraction_sync", bound_fraction_sync},
                          {"bound_fraction_sync_runs", fractions_sync},
                          {"nvme_step_s_sync", nvme_sync.median_s},
                          {"sync_first", o.sync_first},
                          {"update_bound_fraction", update_bound_fraction},
                          {"ratio_vs_host", ratio},
                          {"peak_host_bytes_nvme", nvme.peak_host_bytes},
                          {"peak_host_bytes_host", host.peak_host_bytes},
                          {"reps", o.reps}};
      std::cout << j.dump() << "\n";
    } else {
      std::printf("drive under %s (%s): write %.2f GB/s, read %.2f GB/s (medians of %zu, measured before each step)\n",
                  dir.c_str(), direct ? "O_DIRECT" : "buffered: the page cache is measured", write_gbs, read_gbs,
                  disks.size());
      std::printf("optimizer state on the drive: %u chunks, %.1f MB; host peak %.1f MB (all in memory: %.1f MB)\n",
                  nvme.nvme.chunks_on_nvme, state_bytes / 1e6, static_cast<double>(nvme.peak_host_bytes) / 1e6,
                  static_cast<double>(host.peak_host_bytes) / 1e6);
      std::printf("step (median of %d): NVMe %.3f s, host memory %.3f s, ratio %.2f\n", o.reps, nvme.median_s,
                  host.median_s, ratio);
      std::printf("disk bound %.3f s: fraction reached %.2f (of max(disk, update) bound: %.2f); per step:",
                  disk_bound_s, bound_fraction, update_bound_fraction);
      for (double f : fractions) std::printf(" %.2f", f);
      std::printf("\n");
      std::printf("synchronous step on the drive: %.3f s, fraction reached %.2f; per step:", nvme_sync.median_s,
                  bound_fraction_sync);
      for (double f : fractions_sync) std::printf(" %.2f", f);
      std::printf("\n");
    }
  } catch (...) {
    if (own_dir) rmdir(dir.c_str());
    throw;
  }
  if (own_dir) rmdir(dir.c_str());
  return rc;
}

}  // namespace

CLI::App* add_nvme_subcommand(CLI::App& app, std::function<int()>* run) {
  auto o = std::make_shared<NvmeOptions>();
  CLI::App* c =
      app.add_subcommand("nvme", "Adam step with optimizer state on the drive vs. the disk bound and host memory");
  c->add_option("--dir", o->dir, "directory on the drive (default: a temporary one on the build's filesystem)");
  c->add_option("--elements", o->elements, "trainable elements (one parameter per chunk)")->capture_default_str();
  c->add_option("--chunk-elems", o->chunk_elems, "elements per chunk")->capture_default_str();
  c->add_option("--reps", o->reps, "timed steps (after one warm-up step; median reported)")->capture_default_str();
  c->add_flag("--sync-first", o->sync_first, "run the synchronous engine before the overlapped one (order check)");
  c->add_option("--disk-bytes", o->disk_bytes, "bytes written and read by each disk measurement")
      ->capture_default_str();
  c->add_option("--staging-buffers", o->staging_buffers, "the step's ring of staging buffers (0: default)");
  c->add_option("--max-inflight", o->max_inflight, "requests in flight (0: default)");
  c->add_flag("--json", o->json, "one JSON object");
  *run = [o] { return run_nvme(*o); };
  return c;
}

}  // namespace pstar::bench
