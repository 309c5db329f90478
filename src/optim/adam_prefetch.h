// Software prefetch for the vector Adam kernels (fp32, bf16 and int8 state
// formats, AVX2 and AVX-512).
//
// Why: a kernel step reads four or five lists (master, m, v, the slot or an
// fp32 gradient) and the hardware prefetchers alone leave DRAM latency
// exposed.  On the Intel Xeon dev machine of 2026-12-06 (AVX-512 with VBMI,
// BF16 and FP16; 2 cores), one thread over 25 M elements (400 MB of int8
// state, far past the caches) ran the AVX-512 int8 kernel at 1.72 ns per
// element without software prefetch, 1.28 with it at 512 elements ahead,
// the same as over 1 M elements held in the last-level cache (1.26); fp32
// went from 1.15 to 1.03 ns.  Two blocks (of 256) prefetched at once per
// block reached only 1.43: a burst of 32 line prefetches stalls on the
// line-fill buffers, so each step prefetches just the lines of its own
// width.  Distances of 256 to 1024 elements were within 2% of each other;
// 2048 was worse.  On a Zen 4 machine (2026-12-06) prefetching ahead made no
// measurable difference to the int8 kernel.
//
// A prefetch never faults and never changes a result: the kernels' bits are
// the same with and without it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pstar/pstar.h"

namespace pstar::optim {

// How far ahead of the elements being updated the kernels prefetch, in
// elements of the range (the same for every list, whatever its width).
inline constexpr size_t kPrefetchAheadElems = 512;

// The AVX-512 int8 kernel's distance: a block and a half of 256.  Its pass
// 1A (optim/adam_states_avx512.cpp) prefetches, and a distance of whole
// blocks ran slower on the Intel dev machine (2026-12-06, pstar-bench adam
// --state-formats int8, two threads, two or three runs each): 512 gave
// 1.70-1.76 G elements/s at 20M, 50M and 100M elements where 384 gave
// 1.80-1.87 and 320 and 640 1.76-1.89 (768 1.71-1.74); one thread over 25M,
// 0.83-0.86 against 0.90-0.91.  The fp32 and bf16 kernels measured the same
// at 384 and 512 and keep 512.
inline constexpr size_t kInt8PrefetchAheadElems = 384;

// Always inlined: a function holding only prefetches has no effect GCC can
// see, so GCC 12 marks it const and deletes its calls as dead code before
// its inliner would have put them into the kernels (target-attributed
// functions inline plain ones late).  The prefetches then vanished from the
// kernels without a warning.
#define PSTAR_PREFETCH_INLINE __attribute__((always_inline)) inline

// Bytes per cache line on every x86-64 CPU the vector kernels run on.
inline constexpr size_t kCacheLineBytes = 64;

// Prefetches, for reading into L1, the lines of [p, p + bytes).  Called once
// per kernel step with that step's bytes at a fixed distance ahead, so the
// calls of consecutive steps cover every line of the list.
PSTAR_PREFETCH_INLINE void prefetch_span(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t o = 0; o < bytes; o += kCacheLineBytes) __builtin_prefetch(c + o, 0, 3);
}

// The compute-dtype slot, which a kernel step writes and, unless kGradF32,
// reads its gradient from; and the fp32 gradient list when kGradF32.
template <pstar_dtype D, bool kGradF32>
PSTAR_PREFETCH_INLINE void prefetch_grad(const float* g32, const void* slot, size_t at, size_t elems) {
  const size_t w = D == PSTAR_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
  prefetch_span(static_cast<const char*>(slot) + at * w, elems * w);
  if (kGradF32) prefetch_span(g32 + at, elems * sizeof(float));
}

// One step's prefetch of a kernel's inputs: `elems` elements at `at +
// kAhead` of the master list, both moment lists (`moment_width`
// bytes per element: 4, 2 or 1) and the gradient, when that lies inside the
// range of n elements.
template <pstar_dtype D, bool kGradF32, size_t kAhead = kPrefetchAheadElems>
PSTAR_PREFETCH_INLINE void prefetch_step(const float* master, const void* m, const void* v, size_t moment_width,
                                         const float* g32, const void* slot, size_t at, size_t elems, size_t n) {
  const size_t ahead = at + kAhead;
  if (ahead >= n) return;
  prefetch_span(master + ahead, elems * sizeof(float));
  prefetch_span(static_cast<const char*>(m) + ahead * moment_width, elems * moment_width);
  prefetch_span(static_cast<const char*>(v) + ahead * moment_width, elems * moment_width);
  prefetch_grad<D, kGradF32>(g32, slot, ahead, elems);
}

}  // namespace pstar::optim
