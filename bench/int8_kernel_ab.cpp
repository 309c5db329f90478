// Timing harness of bench/int8_kernel_ab.py: several builds of the AVX-512
// (or AVX2) int8 kernel (optim/adam_states_avx512.cpp or adam_states_avx2.cpp,
// each compiled with its exported functions renamed to
// adam_states_int8_avx512_<name> or adam_states_int8_avx2_<name>) linked
// into this one program, and timed in alternation on one thread.
//
// Why one program: pstar-bench links the kernels statically (libpstar_core),
// so two of its runs compare two binaries run minutes apart, and on a shared
// 2-core machine the int8 kernel's speed moves by 10-20% from minute to
// minute.  Here every round times each variant once, in a shuffled order,
// so they see the same machine.
//
// Each variant updates its own 1024-element range (the size of pstar-bench's
// compute ceiling: bf16 slot, fp32 masters, int8 moments, 64-byte aligned,
// inside L1) `calls` times per sample, at a learning rate of 1e-20, so that
// the range does not drift (see main).  After a warm-up every variant's
// lists are compared with the first variant's: "same bits" or "differ" (an
// ablation differs by design).
//
// Usage: int8_kernel_ab ROUNDS CALLS SEED
// Output: one JSON object per variant on stdout.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "optim/adam.h"
#include "optim/adam_kernel.h"
#include "optim/adam_states.h"
#include "util/dtype.h"

#ifndef PSTAR_AB_VARIANTS
#error "define PSTAR_AB_VARIANTS as X(name) X(name) ..."
#endif

// PSTAR_AB_AVX2 set: the variants are builds of adam_states_avx2.cpp
// (adam_states_int8_avx2, which takes no CPU flags); else of
// adam_states_avx512.cpp.
namespace pstar::optim {
#ifdef PSTAR_AB_AVX2
#define X(v) void adam_states_int8_avx2_##v(const AdamStepConstants&, const AdamStateRange&);
#else
#define X(v) void adam_states_int8_avx512_##v(const AdamStepConstants&, const AdamStateRange&, bool, bool);
#endif
PSTAR_AB_VARIANTS
#undef X
}  // namespace pstar::optim

namespace {
#ifdef PSTAR_AB_AVX2
#define X(v)                                                                                                   \
  void call_##v(const pstar::optim::AdamStepConstants& c, const pstar::optim::AdamStateRange& r, bool, bool) { \
    pstar::optim::adam_states_int8_avx2_##v(c, r);                                                             \
  }
#else
#define X(v)                                                                                                \
  void call_##v(const pstar::optim::AdamStepConstants& c, const pstar::optim::AdamStateRange& r, bool bf16, \
                bool vbmi) {                                                                                \
    pstar::optim::adam_states_int8_avx512_##v(c, r, bf16, vbmi);                                            \
  }
#endif
PSTAR_AB_VARIANTS
#undef X
constexpr pstar::optim::AdamIsa kIsa =
#ifdef PSTAR_AB_AVX2
    pstar::optim::AdamIsa::kAvx2;
#else
    pstar::optim::AdamIsa::kAvx512;
#endif
}  // namespace

namespace {

using namespace pstar;
using namespace pstar::optim;
using Kernel = void (*)(const AdamStepConstants&, const AdamStateRange&, bool, bool);

constexpr size_t kElems = 1024;
constexpr size_t kListBytes = 65536;  // per list, room for any offset

float pseudo_uniform(size_t i, uint32_t salt) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u + salt * 97531u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return static_cast<float>(x & 0xffffffu) / static_cast<float>(1u << 24) - 0.5f;
}

struct Range {
  std::vector<char> storage;
  char* base = nullptr;
  AdamStateRange r;
};

void init_range(Range& s) {
  s.storage.assign(4 * kListBytes + 64, 0);
  s.base = s.storage.data() + (64 - reinterpret_cast<uintptr_t>(s.storage.data()) % 64) % 64;
  float* master = reinterpret_cast<float*>(s.base);
  uint16_t* slot = reinterpret_cast<uint16_t*>(s.base + kListBytes);
  for (size_t i = 0; i < kElems; ++i) {
    master[i] = pseudo_uniform(i, 5);
    slot[i] = f32_to_bf16(0.01f * pseudo_uniform(i, 6));
  }
  s.r.master = master;
  s.r.exp_avg = moment_list_at(StateFormat::kInt8, s.base + 2 * kListBytes, kElems, 0);
  s.r.exp_avg_sq = moment_list_at(StateFormat::kInt8, s.base + 3 * kListBytes, kElems, 0);
  s.r.slot = slot;
  s.r.dtype = PSTAR_DTYPE_BF16;
  s.r.n = kElems;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ROUNDS CALLS SEED\n", argv[0]);
    return 2;
  }
  const int rounds = std::atoi(argv[1]);
  const int calls = std::atoi(argv[2]);
  const unsigned seed = static_cast<unsigned>(std::atoi(argv[3]));
  std::vector<std::string> names;
  std::vector<Kernel> kernels;
#define X(v)           \
  names.push_back(#v); \
  kernels.push_back(&call_##v);
  PSTAR_AB_VARIANTS
#undef X
  const size_t n = kernels.size();
  if (!adam_isa_supported(kIsa)) {
    std::fprintf(stderr, "int8_kernel_ab: this CPU lacks the instruction set of the kernel compared here\n");
    return 77;
  }
  const bool bf16 = cpu_has_avx512bf16(), vbmi = cpu_has_avx512vbmi();
  // A learning rate too small to move the masters (pstar-bench's compute
  // ceiling does the same): each call's weights are the next call's
  // gradients, and at 1e-4 they drove the moments toward subnormals over
  // the thousands of calls of a run, differently in variants of different
  // bits.  Not 0: a zero dividend speeds up the division.
  AdamHyper h;
  h.lr = 1e-20f;
  h.weight_decay = 0.01f;
  const AdamStepConstants c = adam_constants(h, 10, 1.0, true);

  std::vector<Range> ranges(n);
  for (auto& s : ranges) init_range(s);
  for (int i = 0; i < 64; ++i) {
    for (size_t k = 0; k < n; ++k) kernels[k](c, ranges[k].r, bf16, vbmi);
  }
  std::vector<bool> same(n, true);
  for (size_t k = 1; k < n; ++k) {
    same[k] = std::memcmp(ranges[0].base, ranges[k].base, 4 * kListBytes) == 0;
  }

  std::vector<std::vector<double>> ns(n);
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = k;
  std::mt19937 rng(seed);
  for (int round = 0; round < rounds; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t k : order) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) kernels[k](c, ranges[k].r, bf16, vbmi);
      const double t = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      ns[k].push_back(t / (static_cast<double>(calls) * kElems));
    }
  }
  for (size_t k = 0; k < n; ++k) {
    std::vector<double> s = ns[k];
    std::sort(s.begin(), s.end());
    std::printf(
        "{\"variant\":\"%s\",\"same_bits_as_first\":%s,\"ns_per_elem_min\":%.5f,\"ns_per_elem_median\":%.5f,"
        "\"samples\":%zu,\"vbmi\":%s,\"avx512bf16\":%s}\n",
        names[k].c_str(), same[k] ? "true" : "false", s.front(), s[s.size() / 2], s.size(), vbmi ? "true" : "false",
        bf16 ? "true" : "false");
  }
  return 0;
}
