// pstar-bench: benchmarks of libpstar's building blocks.
//
//   pstar-bench adam [--elements 50M] [--threads T] [--reps 9]
//                    [--dtype fp16|bf16|both] [--isa scalar|avx2|avx512|auto]
//                    [--ceiling-isa scalar|avx2|avx512|auto] [--hugepages]
//                    [--state-formats fp32,bf16,int8|none] [--samples] [--json]
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
//
// Then one line per Adam state format (issue 45, optim/adam_states.h; bf16
// compute dtype): the update with the moments in that format, its memory
// ceiling (an in-place stream over that format's own bytes, bench/
// state_streams.h) and its compute ceiling (the same kernel repeating over
// a 1024-element range per thread, which stays in L1, at a learning rate
// too small to move the masters, so that the range stays as it was: see
// compute_once), all formats
// interleaved rep by rep on the same threads and partition; the bound
// fraction is against the lower of the two ceilings, and vs_fp32 compares
// with the fp32 format measured in the same run.
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
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include "bench_util.h"
#include "optim/adam.h"
#include "optim/adam_kernel.h"
#include "optim/adam_states.h"
#include "state_streams.h"
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
  std::string state_formats = "fp32,bf16,int8";
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

// ---- per state format (issue 45) -------------------------------------------------

// The formats of --state-formats ("none": no lines); false on a bad name.
bool parse_state_formats(const std::string& s, std::vector<optim::StateFormat>* out) {
  out->clear();
  if (s == "none") return true;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    const std::string name = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    optim::StateFormat f{};
    if (!optim::parse_state_format(name.c_str(), &f)) return false;
    if (std::find(out->begin(), out->end(), f) == out->end()) out->push_back(f);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return !out->empty();
}

// Elements per unit of the formats' partition: whole int8 blocks (ranges
// start on a block boundary, as the engine's do).
constexpr size_t kStateGrain = optim::kInt8BlockElems;
// Elements per thread of the compute ceiling's range: 14 KiB of fp32 state
// (master, m and v, and the bf16 slot), 10 KiB in bf16, 8 KiB in int8
// (plus the kernel's 2 KiB block buffer), inside a 32 KiB L1.  (At 512
// elements the per-call cost of the fp32 path shows: 0.48 against 0.42 ns
// per element on one thread here.)
constexpr size_t kComputeElems = 1024;
// Elements per thread of one timed compute-ceiling run.
constexpr size_t kComputeWork = size_t{4} << 20;

// The moment lists of one format over n elements, and a small private set
// per thread for the compute ceiling.
struct FormatLists {
  optim::StateFormat f;
  size_t n;
  Array<uint8_t> m, v;
  FormatLists(optim::StateFormat fmt, size_t elems, bool huge)
      : f(fmt),
        n(elems),
        m(optim::moment_list_bytes(fmt, elems), huge),
        v(optim::moment_list_bytes(fmt, elems), huge) {}
  optim::MomentList m_at(size_t off) { return optim::moment_list_at(f, m.get(), n, off); }
  optim::MomentList v_at(size_t off) { return optim::moment_list_at(f, v.get(), n, off); }
};

struct SmallState {
  std::vector<float> master;
  std::vector<uint16_t> slot;
  std::vector<uint8_t> m, v;
};

void run_state_formats(const AdamOptions& o, ThreadPool& pool, size_t n, unsigned threads, int reps, optim::AdamIsa isa,
                       StreamIsa cisa, const std::vector<optim::StateFormat>& formats, bool* all_finite) {
  Array<uint16_t> slot(n, o.hugepages);
  Array<float> master(n, o.hugepages);
  std::vector<std::unique_ptr<FormatLists>> lists;
  for (optim::StateFormat f : formats) lists.push_back(std::make_unique<FormatLists>(f, n, o.hugepages));
  // First touch, each range by the thread that later streams it.  All-zero
  // moment lists are a zero state in every format.
  pool.parallel_for(n, kStateGrain, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      master.get()[i] = uniform(i, 3);
      slot.get()[i] = f32_to_bf16(0.01f * uniform(i, 4));
    }
    for (auto& l : lists) {
      const size_t es = l->f == optim::StateFormat::kFp32 ? 4 : l->f == optim::StateFormat::kBf16 ? 2 : 1;
      std::memset(l->m.get() + b * es, 0, (e - b) * es);
      std::memset(l->v.get() + b * es, 0, (e - b) * es);
      if (l->f == optim::StateFormat::kInt8) {
        const size_t b0 = b / kStateGrain, b1 = optim::int8_blocks(e);
        std::memset(l->m_at(b).absmax, 0, (b1 - b0) * sizeof(float));
        std::memset(l->v_at(b).absmax, 0, (b1 - b0) * sizeof(float));
      }
    }
  });
  // The compute ceiling's private ranges, made by their threads.
  std::vector<std::vector<SmallState>> small(formats.size(), std::vector<SmallState>(threads));
  pool.parallel_for(threads, 1, [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      for (size_t k = 0; k < formats.size(); ++k) {
        SmallState& s = small[k][t];
        s.master.resize(kComputeElems);
        s.slot.resize(kComputeElems);
        for (size_t i = 0; i < kComputeElems; ++i) {
          s.master[i] = uniform(i + t * kComputeElems, 5);
          s.slot[i] = f32_to_bf16(0.01f * uniform(i, 6));
        }
        s.m.assign(optim::moment_list_bytes(formats[k], kComputeElems), 0);
        s.v.assign(optim::moment_list_bytes(formats[k], kComputeElems), 0);
      }
    }
  });

  optim::AdamHyper h;
  h.lr = 1e-4f;
  h.weight_decay = 0.01f;
  h.adamw = true;
  std::vector<uint64_t> step(formats.size(), 0);
  volatile float k0v = 0.0f, k1v = 0.5f, k1a = 1.0f;
  const float k0 = k0v, k1 = k1v, k1abs = k1a;

  auto kernel_once = [&](size_t k) {
    FormatLists& l = *lists[k];
    const optim::AdamStepConstants c = optim::adam_constants(h, ++step[k], 1.0, true);
    const std::function<void(size_t, size_t)> job = [&](size_t b, size_t e) {
      optim::AdamStateRange r;
      r.master = master.get() + b;
      r.exp_avg = l.m_at(b);
      r.exp_avg_sq = l.v_at(b);
      r.slot = slot.get() + b;
      r.dtype = PSTAR_DTYPE_BF16;
      r.n = e - b;
      optim::adam_update_states(isa, l.f, c, r);
    };
    const auto t0 = Clock::now();
    pool.parallel_for(n, kStateGrain, job);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto memory_once = [&](size_t k, StreamPrefetch pf) {
    FormatLists& l = *lists[k];
    const std::function<void(size_t, size_t)> job = [&](size_t b, size_t e) {
      switch (l.f) {
        case optim::StateFormat::kFp32:
          rmw_stream(cisa, PSTAR_DTYPE_BF16, slot.get() + b, master.get() + b, static_cast<float*>(l.m_at(b).values),
                     static_cast<float*>(l.v_at(b).values), e - b, k0, k1, pf);
          break;
        case optim::StateFormat::kBf16:
          rmw_stream_bf16(cisa, slot.get() + b, master.get() + b, static_cast<uint16_t*>(l.m_at(b).values),
                          static_cast<uint16_t*>(l.v_at(b).values), e - b, k0, k1, pf);
          break;
        case optim::StateFormat::kInt8: {
          const optim::MomentList ml = l.m_at(b), vl = l.v_at(b);
          rmw_stream_int8(cisa, slot.get() + b, master.get() + b, static_cast<uint8_t*>(ml.values),
                          static_cast<uint8_t*>(vl.values), ml.absmax, vl.absmax, e - b, k0, k1abs, pf);
          break;
        }
      }
    };
    const auto t0 = Clock::now();
    pool.parallel_for(n, kStateGrain, job);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // The compute ceiling at a learning rate of 1e-20: every step is below
  // half an ulp of its master, so the masters keep their values, each call
  // writes the same weight into the slot that the next reads as its
  // gradient, and the moments settle at normal values.  At the update's own
  // rate (1e-4) the weights fed back as gradients drove m and v into
  // subnormals within about 10^4 calls on one range, and the ceiling with
  // them: the fp32 kernel 1.8x (AVX-512) and 2.9x (AVX2) slower than on
  // fresh values, below what it streams from memory.  Not 0: a zero
  // dividend made the fp32 kernel's division about 20% faster on Zen 4
  // (2026-12-06), which no real step sees.
  optim::AdamHyper hc = h;
  hc.lr = 1e-20f;
  const size_t calls = kComputeWork / kComputeElems;
  auto compute_once = [&](size_t k) {
    const optim::StateFormat f = formats[k];
    const optim::AdamStepConstants c = optim::adam_constants(hc, 10, 1.0, true);
    const std::function<void(size_t, size_t)> job = [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) {
        SmallState& s = small[k][t];
        optim::AdamStateRange r;
        r.master = s.master.data();
        r.exp_avg = optim::moment_list_at(f, s.m.data(), kComputeElems, 0);
        r.exp_avg_sq = optim::moment_list_at(f, s.v.data(), kComputeElems, 0);
        r.slot = s.slot.data();
        r.dtype = PSTAR_DTYPE_BF16;
        r.n = kComputeElems;
        for (size_t i = 0; i < calls; ++i) optim::adam_update_states(isa, f, c, r);
      }
    };
    const auto t0 = Clock::now();
    pool.parallel_for(threads, 1, job);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };

  const size_t nf = formats.size();
  std::vector<std::vector<double>> ts(nf), tm_off(nf), tm_on(nf), tc(nf);
  for (size_t k = 0; k < nf; ++k) {  // warm-up
    kernel_once(k);
    memory_once(k, StreamPrefetch::kOff);
    memory_once(k, StreamPrefetch::kOn);
    compute_once(k);
  }
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t k = 0; k < nf; ++k) {
      ts[k].push_back(kernel_once(k));
      tm_off[k].push_back(memory_once(k, StreamPrefetch::kOff));
      tm_on[k].push_back(memory_once(k, StreamPrefetch::kOn));
      tc[k].push_back(compute_once(k));
    }
  }
  // Each memory ceiling is the faster way of streaming its bytes: with the
  // kernels' software prefetch or without it.
  std::vector<std::vector<double>> tm(nf);
  std::vector<bool> mem_pf(nf);
  for (size_t k = 0; k < nf; ++k) {
    mem_pf[k] = median(tm_on[k]) < median(tm_off[k]);
    tm[k] = mem_pf[k] ? tm_on[k] : tm_off[k];
  }

  // Finite: the masters, the slot, and the moments' scale (int8 absmax,
  // bf16 and fp32 values).
  std::vector<bool> finite(nf, true);
  for (size_t k = 0; k < nf; ++k) {
    FormatLists& l = *lists[k];
    std::atomic<size_t> bad{0};
    pool.parallel_for(n, kStateGrain, [&](size_t b, size_t e) {
      size_t cnt = 0;
      std::vector<float> mv(e - b), vv(e - b);
      optim::moments_to_f32(l.f, false, l.m.get(), n, b, e - b, mv.data());
      optim::moments_to_f32(l.f, true, l.v.get(), n, b, e - b, vv.data());
      for (size_t i = b; i < e; ++i) {
        cnt += !std::isfinite(master.get()[i]) || !std::isfinite(bf16_to_f32(slot.get()[i])) ||
               !std::isfinite(mv[i - b]) || !std::isfinite(vv[i - b]);
      }
      bad += cnt;
    });
    finite[k] = bad.load() == 0;
    *all_finite = *all_finite && finite[k];
  }

  double fp32_eps = 0;
  for (size_t k = 0; k < nf; ++k) {
    if (formats[k] == optim::StateFormat::kFp32) fp32_eps = static_cast<double>(n) / median(ts[k]);
  }
  for (size_t k = 0; k < nf; ++k) {
    const optim::StateFormat f = formats[k];
    const double bytes = optim::adam_state_bytes_per_elem(f, PSTAR_DTYPE_BF16, false);
    const double step_s = median(ts[k]);
    const double eps = static_cast<double>(n) / step_s;
    const double mem_eps = static_cast<double>(n) / median(tm[k]);
    const double comp_eps = static_cast<double>(threads) * static_cast<double>(calls * kComputeElems) / median(tc[k]);
    const bool memory_bound = mem_eps <= comp_eps;
    const double fraction = eps / std::min(mem_eps, comp_eps);
    if (o.json) {
      nlohmann::json j;
      j["bench"] = "adam_states";
      j["state_format"] = optim::state_format_name(f);
      j["dtype"] = "bf16";
      j["isa"] = optim::adam_isa_name(isa);
      j["ceiling_isa"] = stream_isa_name(cisa);
      j["threads"] = threads;
      j["elements"] = n;
      j["reps"] = reps;
      j["median_s"] = step_s;
      j["min_s"] = *std::min_element(ts[k].begin(), ts[k].end());
      j["elems_per_s"] = eps;
      j["bytes_per_elem"] = bytes;
      j["achieved_gbs"] = bytes * eps / 1e9;
      j["memory_ceiling_eps"] = mem_eps;
      j["memory_ceiling_gbs"] = bytes * mem_eps / 1e9;
      j["memory_ceiling_prefetch"] = static_cast<bool>(mem_pf[k]);
      j["memory_ceiling_eps_prefetch_off"] = static_cast<double>(n) / median(tm_off[k]);
      j["memory_ceiling_eps_prefetch_on"] = static_cast<double>(n) / median(tm_on[k]);
      j["compute_ceiling_eps"] = comp_eps;
      j["limit"] = memory_bound ? "memory" : "compute";
      j["bound_fraction"] = fraction;
      if (fp32_eps > 0) {
        j["vs_fp32"] = eps / fp32_eps;
      } else {
        j["vs_fp32"] = nullptr;
      }
      j["finite"] = finite[k];
      if (o.samples) {
        j["step_samples_s"] = ts[k];
        j["memory_ceiling_samples_s"] = tm[k];
        j["compute_ceiling_samples_s"] = tc[k];
      }
      std::cout << j.dump() << std::endl;
    } else {
      const char* name = optim::state_format_name(f);
      std::printf("state %s: %zu elements  step median %.3f ms  %.3f G elem/s  %.4g B/elem  %.1f GB/s%s\n", name, n,
                  step_s * 1e3, eps / 1e9, bytes, bytes * eps / 1e9,
                  fp32_eps > 0 ? ("  " + std::to_string(eps / fp32_eps).substr(0, 5) + "x fp32").c_str() : "");
      std::printf("state %s: memory ceiling %.3f G elem/s (%.1f GB/s)  compute ceiling %.3f G elem/s  -> %s-bound\n",
                  name, mem_eps / 1e9, bytes * mem_eps / 1e9, comp_eps / 1e9, memory_bound ? "memory" : "compute");
      std::printf("state %s: bound fraction %.3f%s\n", name, fraction,
                  finite[k] ? "" : "  (WARNING: non-finite values after the run)");
    }
  }
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

  std::vector<optim::StateFormat> formats;
  if (!parse_state_formats(o.state_formats, &formats)) {
    std::cerr << "pstar-bench: bad --state-formats '" << o.state_formats
              << "' (a comma-separated list of fp32, bf16, int8, or none)\n";
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
    auto ceiling_once = [&](StreamPrefetch pf) {
      return timed(pool, n, [&](size_t b, size_t e) {
        rmw_stream(cisa, dtype, slot.get() + b, master.get() + b, m.get() + b, v.get() + b, e - b, k0, k1, pf);
      });
    };
    auto triad_once = [&] {
      return timed(pool, n,
                   [&](size_t b, size_t e) { triad(cisa, ta.get() + b, tb.get() + b, tc.get() + b, 0.5f, e - b); });
    };

    // Warm-up (page tables, caches, frequency), then interleaved reps.
    adam_once();
    ceiling_once(StreamPrefetch::kOff);
    ceiling_once(StreamPrefetch::kOn);
    triad_once();
    std::vector<double> ta_s, tc_off, tc_on, tt_s;
    for (int r = 0; r < reps; ++r) {
      ta_s.push_back(adam_once());
      tc_off.push_back(ceiling_once(StreamPrefetch::kOff));
      tc_on.push_back(ceiling_once(StreamPrefetch::kOn));
      tt_s.push_back(triad_once());
    }
    // The ceiling is the faster way of streaming the bytes: with the
    // kernels' software prefetch or without it.
    const bool ceil_pf = median(tc_on) < median(tc_off);
    const std::vector<double>& tc_s = ceil_pf ? tc_on : tc_off;

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
      j["ceiling_prefetch"] = ceil_pf;
      j["ceiling_gbs_prefetch_off"] = kAdamBytesPerElem * static_cast<double>(n) / median(tc_off) / 1e9;
      j["ceiling_gbs_prefetch_on"] = kAdamBytesPerElem * static_cast<double>(n) / median(tc_on) / 1e9;
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
      std::printf(
          "%s: ceiling (in-place 28 B/elem RMW, %s software prefetch) median %.3f ms  %.1f GB/s  |  triad %.1f GB/s "
          "(24 B/elem)\n",
          dname, ceil_pf ? "with" : "without", ceil_s * 1e3, ceiling_gbs, triad_gbs);
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
  if (!formats.empty()) run_state_formats(o, pool, n, threads, reps, isa, cisa, formats, &all_finite);
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
  adam->add_flag("--json", ao.json, "one JSON object per line per dtype, then per state format");
  adam->add_option("--state-formats", ao.state_formats,
                   "Adam state formats measured after the dtypes (bf16 compute dtype): comma-separated fp32, bf16, "
                   "int8, or none")
      ->capture_default_str();

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
