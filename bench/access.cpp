// pstar-bench access: the engine's overhead for acquire + release of a
// parameter that is already resident, through the public C ABI.
//
//   pstar-bench access [--params 64] [--iters 2000] [--reps 7] [--json]
//
// Everything here goes through the exported pstar_* functions of libpstar.so
// (of libpstar it includes only <pstar/pstar.h>), so the figure includes the ABI
// layer: the handle registry, status and exception translation.
//
// The engine runs on the emulated device with default options, chunks of
// 4096 elements and unlimited capacity, and the parameters are frozen, so
// every parameter stays resident: a trained chunk would go to the host at
// every step for the CPU optimizer (as on a GPU), and with the hybrid
// placement the next forward would wait for the device's Adam instead.
// One TRAIN iteration warms up (and records the engine's access trace);
// then each measured iteration is a TRAIN iteration of its own:
//
//   iteration_begin(TRAIN)
//   [timed]  forward: acquire(FORWARD) + release of every parameter, in order
//   backward: acquire(BACKWARD) + release, in reverse order
//   step (nothing to update)
//
// Only the forward loop is timed, so every timed acquire is one the engine
// checks against its trace (and, with the default OPT policy, re-keys in the
// eviction order and prefetches along), and no gradient or optimizer work is
// counted.  From the engine's statistics: the chunk moves during the forward
// loops must be zero (the parameters were resident), the trace must have 2P
// moments and no timed iteration may fall back from it (trace checking was
// on all along); otherwise the exit status is 1.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <pstar/pstar.h>

#include "bench_util.h"

namespace pstar::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kChunkElems = 4096;

struct AccessOptions {
  int params = 64;
  int iters = 2000;
  int reps = 7;
  bool json = false;
};

#define PSTAR_CHECK(call) check((call), #call)

// Owns an engine handle.
struct EngineHandle {
  pstar_engine* e = nullptr;
  ~EngineHandle() { pstar_engine_destroy(e); }
};

// Elements of parameter i: a few hundred, varied so that parameters straddle
// chunk boundaries at different offsets (256 to 480).
int64_t param_cols(int i) { return 16 + 2 * (i % 8); }
constexpr int64_t kParamRows = 16;

int run_access(const AccessOptions& o) {
  if (o.params < 1 || o.iters < 1 || o.reps < 1) {
    std::cerr << "pstar-bench access: --params, --iters and --reps must be at least 1\n";
    return 2;
  }
  const auto P = static_cast<uint32_t>(o.params);

  pstar_engine_options opts;
  PSTAR_CHECK(pstar_engine_options_init(&opts));
  opts.device = PSTAR_DEVICE_EMULATED;
  opts.device_capacity_bytes = 0;  // unlimited: every chunk stays resident
  opts.chunk_elems = kChunkElems;

  EngineHandle h;
  PSTAR_CHECK(pstar_engine_create(&opts, &h.e));
  pstar_engine* e = h.e;

  std::vector<uint32_t> ids(P);
  std::vector<uint64_t> numel(P);
  uint64_t total_elems = 0;
  for (uint32_t i = 0; i < P; ++i) {
    const int64_t shape[2] = {kParamRows, param_cols(static_cast<int>(i))};
    const std::string name = "p" + std::to_string(i);
    PSTAR_CHECK(pstar_param_register(e, name.c_str(), 2, shape, PSTAR_PARAM_FROZEN, &ids[i]));
    numel[i] = static_cast<uint64_t>(shape[0] * shape[1]);
    total_elems += numel[i];
  }
  PSTAR_CHECK(pstar_engine_build(e));

  void* stream = nullptr;
  PSTAR_CHECK(pstar_engine_compute_stream(e, &stream));

  pstar_stats stats;
  PSTAR_CHECK(pstar_stats_init(&stats));
  auto moves_now = [&] {
    PSTAR_CHECK(pstar_engine_get_stats(e, &stats));
    return stats.moves_to_device + stats.evictions;
  };

  uint64_t checksum = 0;  // keeps the returned pointers observable
  uint64_t moves_in_timed = 0;

  // One TRAIN iteration; returns the seconds spent in its forward loop.
  auto train_iteration = [&]() -> double {
    PSTAR_CHECK(pstar_iteration_begin(e, PSTAR_ITERATION_TRAIN));
    const uint64_t m0 = moves_now();
    void* ptr = nullptr;
    const auto t0 = Clock::now();
    for (uint32_t i = 0; i < P; ++i) {
      pstar_status st = pstar_param_acquire(e, ids[i], PSTAR_STAGE_FORWARD, stream, &ptr);
      if (st != PSTAR_OK) check(st, "pstar_param_acquire(FORWARD)");
      checksum += reinterpret_cast<uintptr_t>(ptr);
      st = pstar_param_release(e, ids[i], stream);
      if (st != PSTAR_OK) check(st, "pstar_param_release(FORWARD)");
    }
    const auto t1 = Clock::now();
    moves_in_timed += moves_now() - m0;
    for (uint32_t k = P; k-- > 0;) {
      PSTAR_CHECK(pstar_param_acquire(e, ids[k], PSTAR_STAGE_BACKWARD, stream, &ptr));
      PSTAR_CHECK(pstar_param_release(e, ids[k], stream));
    }
    PSTAR_CHECK(pstar_step(e, nullptr));
    return std::chrono::duration<double>(t1 - t0).count();
  };

  // Warm-up: the engine records its trace in this first TRAIN iteration.
  train_iteration();
  moves_in_timed = 0;  // the warm-up's forward is not measured
  PSTAR_CHECK(pstar_engine_get_stats(e, &stats));
  const uint64_t fallbacks0 = stats.trace_fallbacks;

  std::vector<double> ns_per_pair;
  ns_per_pair.reserve(static_cast<size_t>(o.reps));
  const double pairs = static_cast<double>(o.iters) * static_cast<double>(P);
  for (int r = 0; r < o.reps; ++r) {
    double fwd_s = 0.0;
    for (int it = 0; it < o.iters; ++it) fwd_s += train_iteration();
    ns_per_pair.push_back(fwd_s * 1e9 / pairs);
  }

  const double med = median(ns_per_pair);
  const double mn = *std::min_element(ns_per_pair.begin(), ns_per_pair.end());
  const bool resident = moves_in_timed == 0;
  // Trace checking was on if a trace guided the timed iterations; none of
  // them may have diverged from it (a fallback runs LRU and re-records).
  PSTAR_CHECK(pstar_engine_get_stats(e, &stats));
  const uint64_t trace_moments = stats.trace_moments;
  const uint64_t trace_fallbacks = stats.trace_fallbacks - fallbacks0;
  const bool trace_followed = trace_moments == 2ull * P && trace_fallbacks == 0;

  if (o.json) {
    nlohmann::json j;
    j["bench"] = "access";
    j["params"] = P;
    j["param_elements"] = total_elems;
    j["chunk_elems"] = kChunkElems;
    j["iters"] = o.iters;
    j["reps"] = o.reps;
    j["ns_per_acquire_release"] = med;
    j["min_ns_per_acquire_release"] = mn;
    j["samples_ns"] = ns_per_pair;
    j["moves_during_timing"] = moves_in_timed;
    j["resident"] = resident;
    j["trace_moments"] = trace_moments;
    j["trace_fallbacks"] = trace_fallbacks;
    j["library_version"] = pstar_version_string();
    std::cout << j.dump() << std::endl;
  } else {
    std::printf(
        "pstar-bench access: libpstar %s, emulated device, %u params (%llu elements, chunks of %llu), "
        "%d TRAIN iterations x %d reps after 1 warm-up\n",
        pstar_version_string(), P, static_cast<unsigned long long>(total_elems),
        static_cast<unsigned long long>(kChunkElems), o.iters, o.reps);
    std::printf("access: acquire(FORWARD)+release of a resident parameter: median %.1f ns (min %.1f) per pair%s\n", med,
                mn, resident ? "" : "  (WARNING: chunks moved during the timed loops)");
    std::printf("access: trace of %llu moments, %llu fallbacks during the timed iterations\n",
                static_cast<unsigned long long>(trace_moments), static_cast<unsigned long long>(trace_fallbacks));
  }
  if (checksum == 1) std::fputc('\0', stderr);  // never true; uses the pointers
  if (!resident) {
    std::cerr << "pstar-bench access: " << moves_in_timed
              << " chunk moves during the timed forward loops; the parameters were not resident\n";
    return 1;
  }
  if (!trace_followed) {
    std::cerr << "pstar-bench access: the timed iterations did not follow a trace (" << trace_moments
              << " moments, expected " << 2ull * P << "; " << trace_fallbacks
              << " fallbacks): trace checking was not measured\n";
    return 1;
  }
  return 0;
}

}  // namespace

// Registers the `access` subcommand on `app`; *run runs it once parsed.
CLI::App* add_access_subcommand(CLI::App& app, std::function<int()>* run) {
  auto o = std::make_shared<AccessOptions>();
  CLI::App* sub = app.add_subcommand(
      "access", "acquire+release overhead of resident parameters through the C ABI (inside TRAIN iterations)");
  sub->add_option("--params,-p", o->params, "parameters (a few hundred elements each)")->capture_default_str();
  sub->add_option("--iters,-i", o->iters, "timed TRAIN iterations per rep")->capture_default_str();
  sub->add_option("--reps,-r", o->reps, "repetitions (median and min reported)")->capture_default_str();
  sub->add_flag("--json", o->json, "one JSON object on stdout, nothing else");
  *run = [o] {
    try {
      return run_access(*o);
    } catch (const CallError& err) {
      std::cerr << "pstar-bench access: " << err.what() << "\n";
      return 1;
    }
  };
  return sub;
}

}  // namespace pstar::bench
