// pstar-bench: benchmarks of libpstar's building blocks.
//
//   pstar-bench adam [--elements 50M] [--threads T] [--reps 9]
//                    [--dtype fp16|bf16|both] [--isa scalar|avx2|avx512|auto]
//                    [--ceiling-isa scalar|avx2|avx512|auto] [--hugepages]
//                    [--samples] [--json]
//   pstar-bench access [--params 64] [--iters 2000] [--reps 7] [--json]
//   pstar-bench nvme [--dir PATH] [--elements 33554432] [--reps 5] [--json]
//
// docs/benchmarks.md describes the output, the JSON keys and the ceiling.
// `access` (bench/access.cpp) times acquire+release of resident parameters
// through the C ABI of libpstar.so.
//
// `adam` times the fused mixed-precision Adam(W) update (optim/adam_kernel.h)
// over one flat range split across threads, and in the same run, on the same
// arrays, threads and partition, the memory ceiling of that update (the same
// in-place 28-byte read-modify-write stream with trivial arithmetic) and the
// STREAM triad for reference.  The three are interleaved rep by rep so that
// drift of the machine affects them alike; medians are reported.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include "bench_util.h"
#include "optim/adam.h"
#include "optim/adam_kernel.h"
#include "stream_kernels.h"
#include "util/dtype.h"
#include "util/thread_pool.h"

namespace pstar::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Bytes moved per element by the fused update with a 2-byte compute dtype:
// read grad (2) + master, m, v (12); write master, m, v (12) + param (2).
constexpr double kAdamBytesPerElem = 28.0;
// STREAM's count for the triad: read b, c, write a.
constexpr double kTriadBytesPerElem = 24.0;

// Parses "50000000", "50M", "1M", "64k", "2G" (decimal multipliers).
size_t parse_count(const std::string& s) {
  if (s.empty()) throw std::invalid_argument("empty element count");
  size_t pos = 0;
  const double v = std::stod(s, &pos);
  double mul = 1.0;
  const std::string rest = s.substr(pos);
  if (rest.empty()) {
    mul = 1.0;
  } else if (rest == "k" || rest == "K") {
    mul = 1e3;
  } else if (rest == "M" || rest == "m") {
    mul = 1e6;
  } else if (rest == "G" || rest == "g") {
    mul = 1e9;
  } else {
    throw std::invalid_argument("bad element count '" + s + "' (use a number with an optional k, M or G)");
  }
  const double n = v * mul;
  if (!(n >= 1.0) || n > 1e12) throw std::invalid_argument("element count out of range: '" + s + "'");
  return static_cast<size_t>(std::llround(n));
}

// A page-aligned array, not touched here (first touch happens in the threads
// that stream it).
template <typename T>
class Array {
 public:
  Array(size_t n, bool huge) {
    constexpr size_t kAlign = size_t{2} << 20;  // 2 MiB: page- and line-aligned, THP-friendly
    bytes_ = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    if (bytes_ == 0) bytes_ = kAlign;
    ptr_ = static_cast<T*>(std::aligned_alloc(kAlign, bytes_));
    if (ptr_ == nullptr) throw std::bad_alloc();
    if (huge) madvise(ptr_, bytes_, MADV_HUGEPAGE);
  }
  ~Array() { std::free(ptr_); }
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Deterministic value in [-1, 1) from an index.
inline float uniform(uint64_t i, uint64_t seed) {
  uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) * (2.0 / 16777216.0) - 1.0);
}

// Every loop runs through the library's thread pool with the same grain, so
// the partition of [0, n) is the same for all of them (a pure function of n,
// the grain and the thread count; block b always on the same thread): each
// array is first touched by the thread that later streams that block.  64
// elements: a whole number of cache lines of the 2- and 4-byte arrays.
constexpr size_t kGrain = 64;

template <typename F>
double timed(ThreadPool& pool, size_t n, F&& fn) {
  const std::function<void(size_t, size_t)> job(std::forward<F>(fn));
  const auto t0 = Clock::now();
  pool.parallel_for(n, kGrain, job);
  const auto t1 = Clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}

struct AdamOptions {
  std::string elements = "50M";
  unsigned threads = 0;
  int reps = 9;
  std::string dtype = "both";
  std::string isa = "auto";
  std::string ceiling_isa = "auto";
  bool hugepages = false;
  bool samples = false;
  bool json = false;
};

bool parse_adam_isa(const std::string& s, optim::AdamIsa* out) {
  if (s == "auto") {
    *out = optim::adam_default_isa();
    return true;
  }
  for (optim::AdamIsa isa : {optim::AdamIsa::kScalar, optim::AdamIsa::kAvx2, optim::AdamIsa::kAvx512}) {
    if (s == optim::adam_isa_name(isa)) {
      *out = isa;
      return true;
    }
  }
  return false;
}

bool parse_stream_isa(const std::string& s, StreamIsa* out) {
  if (s == "auto") {
    *out = best_stream_isa();
    return true;
  }
  for (StreamIsa isa : {StreamIsa::kScalar, StreamIsa::kAvx2, StreamIsa::kAvx512}) {
    if (s == stream_isa_name(isa)) {
      *out = isa;
      return true;
    }
  }
  return false;
}

int run_adam(const AdamOptions& o) {
  const size_t n = parse_count(o.elements);
  const unsigned threads = o.threads != 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const int reps = std::max(1, o.reps);

  optim::AdamIsa isa{};
  if (!parse_adam_isa(o.isa, &isa)) {
    std::cerr << "pstar-bench: unknown --isa '" << o.isa << "'\n";
    return 2;
  }
  if (!optim::adam_isa_supported(isa)) {
    std::cerr << "pstar-bench: the Adam path '" << optim::adam_isa_name(isa)
              << "' is not available on this CPU or in this build\n";
    return 2;
  }
  StreamIsa cisa{};
  if (!parse_stream_isa(o.ceiling_isa, &cisa)) {
    std::cerr << "pstar-bench: unknown --ceiling-isa '" << o.ceiling_isa << "'\n";
    return 2;
  }
  if (!stream_isa_supported(cisa)) {
    std::cerr << "pstar-bench: ceiling path '" << stream_isa_name(cisa) << "' is not supported by this CPU\n";
    return 2;
  }

  std::vector<pstar_dtype> dtypes;
  if (o.dtype == "fp16" || o.dtype == "both") dtypes.push_back(PSTAR_DTYPE_F16);
  if (o.dtype == "bf16" || o.dtype == "both") dtypes.push_back(PSTAR_DTYPE_BF16);

  ThreadPool pool(threads);

  // The triad's arrays, shared by both dtypes.
  Array<float> ta(n, o.hugepages), tb(n, o.hugepages), tc(n, o.hugepages);
  pool.parallel_for(n, kGrain, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      ta.get()[i] = 0.0f;
      tb.get()[i] = uniform(i, 1);
      tc.get()[i] = uniform(i, 2);
    }
  });

  if (!o.json) {
    std::printf("pstar-bench adam: %zu elements, %u threads, %d reps (median), adam isa %s, ceiling isa %s\n", n,
                threads, reps, optim::adam_isa_name(isa), stream_isa_name(cisa));
  }

  bool all_finite = true;
  for (pstar_dtype dtype : dtypes) {
    const char* dname = dtype == PSTAR_DTYPE_F16 ? "fp16" : "bf16";
    Array<uint16_t> slot(n, o.hugepages);
    Array<float> master(n, o.hugepages), m(n, o.hugepages), v(n, o.hugepages);
    // First touch, each range by the thread that updates it.  The slot holds
    // the gradient (small values around the weights' scale).
    pool.parallel_for(n, kGrain, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        master.get()[i] = uniform(i, 3);
        m.get()[i] = 0.0f;
        v.get()[i] = 0.0f;
        store_as(slot.get(), dtype, i, 0.01f * uniform(i, 4));
      }
    });

    optim::AdamHyper h;
    h.lr = 1e-4f;
    h.weight_decay = 0.01f;
    h.adamw = true;
    uint64_t step = 0;

    auto adam_once = [&] {
      const optim::AdamStepConstants c = optim::adam_constants(h, ++step, 1.0, true);
      return timed(pool, n, [&](size_t b, size_t e) {
        optim::AdamRange r;
        r.master = master.get() + b;
        r.exp_avg = m.get() + b;
        r.exp_avg_sq = v.get() + b;
        r.slot = slot.get() + b;
        r.dtype = dtype;
        r.n = e - b;
        optim::adam_update(isa, c, r);
      });
    };
    // k0 = 0 leaves the masters as they are, k1 = 0.5 keeps m and v bounded;
    // both are run-time values, so the arithmetic is really done.
    volatile float k0v = 0.0f, k1v = 0.5f;
    const float k0 = k0v, k1 = k1v;
    auto ceiling_once = [&] {
      return timed(pool, n, [&](size_t b, size_t e) {
        rmw_stream(cisa, dtype, slot.get() + b, master.get() + b, m.get() + b, v.get() + b, e - b, k0, k1);
      });
    };
    auto triad_once = [&] {
      return timed(pool, n,
                   [&](size_t b, size_t e) { triad(cisa, ta.get() + b, tb.get() + b, tc.get() + b, 0.5f, e - b); });
    };

    // Warm-up (page tables, caches, frequency), then interleaved reps.
    adam_once();
    ceiling_once();
    triad_once();
    std::vector<double> ta_s, tc_s, tt_s;
    for (int r = 0; r < reps; ++r) {
      ta_s.push_back(adam_once());
      tc_s.push_back(ceiling_once());
      tt_s.push_back(triad_once());
    }

    // Everything the update wrote must still be finite.
    std::atomic<size_t> bad{0};
    pool.parallel_for(n, kGrain, [&](size_t b, size_t e) {
      size_t k = 0;
      for (size_t i = b; i < e; ++i) {
        k += !std::isfinite(master.get()[i]) || !std::isfinite(m.get()[i]) || !std::isfinite(v.get()[i]) ||
             !std::isfinite(load_as(slot.get(), dtype, i));
      }
      bad += k;
    });
    const size_t nonfinite = bad.load();
    all_finite = all_finite && nonfinite == 0;

    const double step_s = median(ta_s);
    const double ceil_s = median(tc_s);
    const double triad_s = median(tt_s);
    const double elems_per_s = static_cast<double>(n) / step_s;
    const double achieved_gbs = kAdamBytesPerElem * elems_per_s / 1e9;
    const double ceiling_gbs = kAdamBytesPerElem * static_cast<double>(n) / ceil_s / 1e9;
    const double triad_gbs = kTriadBytesPerElem * static_cast<double>(n) / triad_s / 1e9;
    const double fraction = achieved_gbs / ceiling_gbs;

    if (o.json) {
      nlohmann::json j;
      j["bench"] = "adam";
      j["dtype"] = dname;
      j["isa"] = optim::adam_isa_name(isa);
      j["ceiling_isa"] = stream_isa_name(cisa);
      j["threads"] = threads;
      j["elements"] = n;
      j["reps"] = reps;
      j["median_s"] = step_s;
      j["min_s"] = *std::min_element(ta_s.begin(), ta_s.end());
      j["elems_per_s"] = elems_per_s;
      j["bytes_per_elem"] = kAdamBytesPerElem;
      j["achieved_gbs"] = achieved_gbs;
      j["ceiling_s"] = ceil_s;
      j["ceiling_gbs"] = ceiling_gbs;
      j["triad_gbs"] = triad_gbs;
      j["bound_fraction"] = fraction;
      j["finite"] = nonfinite == 0;
      if (o.samples) {
        j["step_samples_s"] = ta_s;
        j["ceiling_samples_s"] = tc_s;
        j["triad_samples_s"] = tt_s;
      }
      std::cout << j.dump() << std::endl;
    } else {
      std::printf("%s: %zu elements  step median %.3f ms (min %.3f)  %.3f G elem/s  %.0f B/elem  %.1f GB/s\n", dname, n,
                  step_s * 1e3, *std::min_element(ta_s.begin(), ta_s.end()) * 1e3, elems_per_s / 1e9, kAdamBytesPerElem,
                  achieved_gbs);
      std::printf("%s: ceiling (in-place 28 B/elem RMW) median %.3f ms  %.1f GB/s  |  triad %.1f GB/s (24 B/elem)\n",
                  dname, ceil_s * 1e3, ceiling_gbs, triad_gbs);
      std::printf("%s: bound fraction %.3f%s\n", dname, fraction,
                  nonfinite == 0 ? "" : "  (WARNING: non-finite values after the run)");
      if (o.samples) {
        for (int r = 0; r < reps; ++r) {
          std::printf("%s:   rep %2d  step %.3f ms  ceiling %.3f ms  triad %.3f ms\n", dname, r, ta_s[r] * 1e3,
                      tc_s[r] * 1e3, tt_s[r] * 1e3);
        }
      }
    }
  }
  if (!all_finite) {
    std::cerr << "pstar-bench: non-finite values after the Adam runs\n";
    return 1;
  }
  return 0;
}

}  // namespace

// bench/access.cpp: registers the `access` subcommand.
CLI::App* add_access_subcommand(CLI::App& app, std::function<int()>* run);
// bench/placement.cpp: registers the `placement` subcommand.
CLI::App* add_placement_subcommand(CLI::App& app, std::function<int()>* run);
#if defined(PSTAR_HAVE_GLOO)
// bench/comm.cpp: registers the `comm` subcommand (builds with Gloo only).
CLI::App* add_comm_subcommand(CLI::App& app, std::function<int()>* run);
#endif
#if defined(PSTAR_HAVE_GLOO) && defined(PSTAR_HAVE_LIBUV)
// bench/gather.cpp: registers the `gather` subcommand (needs groups: Gloo and libuv).
CLI::App* add_gather_subcommand(CLI::App& app, std::function<int()>* run);
// bench/overlap.cpp: registers the `overlap` subcommand.
CLI::App* add_overlap_subcommand(CLI::App& app, std::function<int()>* run);
#endif
#if defined(PSTAR_HAVE_NVME)
// bench/nvme.cpp: registers the `nvme` subcommand (builds with the NVMe tier only).
CLI::App* add_nvme_subcommand(CLI::App& app, std::function<int()>* run);
#endif

}  // namespace pstar::bench

int main(int argc, char** argv) {
  using pstar::bench::AdamOptions;
  CLI::App app{"pstar-bench: benchmarks of libpstar's building blocks"};
  app.require_subcommand(1);

  AdamOptions ao;
  CLI::App* adam = app.add_subcommand("adam", "fused mixed-precision Adam step vs. the memory ceiling");
  adam->add_option("--elements,-n", ao.elements, "elements (suffixes k, M, G: 1e3, 1e6, 1e9)")->capture_default_str();
  adam->add_option("--threads,-t", ao.threads, "threads (default: hardware concurrency)");
  adam->add_option("--reps,-r", ao.reps, "measured repetitions (median reported)")->capture_default_str();
  adam->add_option("--dtype", ao.dtype, "compute dtype")
      ->check(CLI::IsMember({"fp16", "bf16", "both"}))
      ->capture_default_str();
  adam->add_option("--isa", ao.isa, "Adam kernel path (auto: best supported, or PSTAR_ADAM_ISA)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512", "auto"}))
      ->capture_default_str();
  adam->add_option("--ceiling-isa", ao.ceiling_isa, "vector width of the ceiling and triad loops")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512", "auto"}))
      ->capture_default_str();
  adam->add_flag("--hugepages", ao.hugepages, "madvise(MADV_HUGEPAGE) on the arrays");
  adam->add_flag("--samples", ao.samples, "also print every rep's times");
  adam->add_flag("--json", ao.json, "one JSON object per line per dtype");

  std::function<int()> run_access;
  CLI::App* access = pstar::bench::add_access_subcommand(app, &run_access);

  std::function<int()> run_placement;
  CLI::App* placement = pstar::bench::add_placement_subcommand(app, &run_placement);

#if defined(PSTAR_HAVE_GLOO)
  std::function<int()> run_comm;
  CLI::App* comm = pstar::bench::add_comm_subcommand(app, &run_comm);
#endif
#if defined(PSTAR_HAVE_GLOO) && defined(PSTAR_HAVE_LIBUV)
  std::function<int()> run_gather;
  CLI::App* gather = pstar::bench::add_gather_subcommand(app, &run_gather);
#endif
#if defined(PSTAR_HAVE_NVME)
  std::function<int()> run_nvme;
  CLI::App* nvme = pstar::bench::add_nvme_subcommand(app, &run_nvme);
#endif

  std::function<int()> run_overlap;
  CLI::App* overlap = pstar::bench::add_overlap_subcommand(app, &run_overlap);

  CLI11_PARSE(app, argc, argv);
  try {
    if (overlap->parsed()) return run_overlap();
#if defined(PSTAR_HAVE_GLOO)
    if (comm->parsed()) return run_comm();
#endif
#if defined(PSTAR_HAVE_GLOO) && defined(PSTAR_HAVE_LIBUV)
    if (gather->parsed()) return run_gather();
#endif
#if defined(PSTAR_HAVE_NVME)
    if (nvme->parsed()) return run_nvme();
#endif
    if (adam->parsed()) return pstar::bench::run_adam(ao);
    if (access->parsed()) return run_access();
    if (placement->parsed()) return run_placement();
  } catch (const std::exception& e) {
    std::cerr << "pstar-bench: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
