// OPT on hand-made traces: next-use bookkeeping, and a cache simulation
// whose miss count must equal the optimum found by exhaustive search.
#include <criterion/criterion.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "placement/access_trace.h"
#include "placement/lru_policy.h"
#include "placement/opt_policy.h"

using namespace pstar::placement;

Test(access_trace, next_use_wraps_into_the_next_iteration) {
  AccessTrace t;
  for (uint32_t c : {0u, 1u, 2u, 0u, 1u}) t.record(c, 0);
  t.finalize(4);
  cr_assert_eq(t.moments(), 5u);
  cr_assert_eq(t.next_use(0), 3u);      // chunk 0 again at moment 3
  cr_assert_eq(t.next_use(1), 4u);
  cr_assert_eq(t.next_use(2), 5u + 2);  // chunk 2: next iteration's moment 2
  cr_assert_eq(t.next_use(3), 5u + 0);
  cr_assert_eq(t.next_use(4), 5u + 1);
  cr_assert_eq(t.first_use(2), 2u);
  cr_assert_eq(t.first_use(3), AccessTrace::kNever);
  t.truncate(2);
  cr_assert_eq(t.moments(), 2u);
}

Test(opt_policy, victim_is_the_furthest_next_use_among_movable) {
  OptPolicy p;
  p.reset(64);
  p.touch(0, 10);
  p.touch(1, 30);
  p.touch(2, 20);
  uint32_t v = 99;
  cr_assert(p.victim([](uint32_t) { return true; }, &v));
  cr_assert_eq(v, 1u);
  cr_assert(p.victim([](uint32_t k) { return k != 1; }, &v));
  cr_assert_eq(v, 2u);
  p.touch(0, 40);  // re-keyed
  cr_assert(p.victim([](uint32_t) { return true; }, &v));
  cr_assert_eq(v, 0u);
  p.remove(0);
  cr_assert_eq(p.size(), 2u);
  // Chunks the trace never uses go first; a taken or out-of-range key counts
  // as never used.
  p.touch(5, OptPolicy::kNeverKey);
  p.touch(6, 20);   // key of chunk 2
  p.touch(7, 999);  // beyond the limit
  cr_assert_eq(p.size(), 5u);
  cr_assert(p.victim([](uint32_t k) { return k != 5 && k != 6 && k != 7; }, &v));
  cr_assert_eq(v, 1u);
  cr_assert(p.victim([](uint32_t) { return true; }, &v));
  cr_assert(v == 5 || v == 6 || v == 7);
  p.remove(5);
  p.remove(6);
  p.remove(7);
  cr_assert(p.victim([](uint32_t) { return true; }, &v));
  cr_assert_eq(v, 1u);
  p.clear();
  cr_assert(!p.victim([](uint32_t) { return true; }, &v));
  // Keys across several summary words: the highest wins.
  p.reset(20000);
  p.touch(1, 5);
  p.touch(2, 12345);
  p.touch(3, 4096);
  cr_assert(p.victim([](uint32_t) { return true; }, &v));
  cr_assert_eq(v, 2u);
  cr_assert(p.victim([](uint32_t k) { return k != 2; }, &v));
  cr_assert_eq(v, 3u);
}

namespace {

// Fetches on a miss; evicts by `choose` when `capacity` chunks are resident.
// Returns the misses over `iterations` repetitions of the trace.
size_t simulate(const std::vector<uint32_t>& seq, size_t capacity, int iterations, bool opt) {
  AccessTrace t;
  for (uint32_t c : seq) t.record(c, 0);
  t.finalize(16);
  OptPolicy o;
  o.reset(2 * seq.size() + 1);
  LruPolicy l;
  std::vector<bool> resident(16, false);
  size_t count = 0, misses = 0;
  for (int it = 0; it < iterations; ++it) {
    for (size_t m = 0; m < seq.size(); ++m) {
      const uint32_t c = seq[m];
      if (!resident[c]) {
        ++misses;
        if (count == capacity) {
          uint32_t v = 0;
          auto movable = [&](uint32_t k) { return k != c; };
          cr_assert(opt ? o.victim(movable, &v) : l.victim(movable, &v));
          resident[v] = false;
          o.remove(v);
          l.remove(v);
          --count;
        }
        resident[c] = true;
        ++count;
      }
      l.touch(c);
      o.touch(c, t.next_use(m));
    }
  }
  return misses;
}

// The fewest misses any eviction choice achieves (exhaustive search).
size_t optimum(const std::vector<uint32_t>& seq, size_t capacity, int iterations) {
  std::vector<uint32_t> all;
  for (int it = 0; it < iterations; ++it) all.insert(all.end(), seq.begin(), seq.end());
  std::function<size_t(size_t, std::vector<uint32_t>)> best = [&](size_t i, std::vector<uint32_t> cache) -> size_t {
    if (i == all.size()) return 0;
    const uint32_t c = all[i];
    if (std::find(cache.begin(), cache.end(), c) != cache.end()) return best(i + 1, cache);
    if (cache.size() < capacity) {
      cache.push_back(c);
      return 1 + best(i + 1, cache);
    }
    size_t b = SIZE_MAX;
    for (size_t j = 0; j < cache.size(); ++j) {
      std::vector<uint32_t> next = cache;
      next[j] = c;
      b = std::min(b, best(i + 1, next));
    }
    return 1 + b;
  };
  return best(0, {});
}

}  // namespace

Test(opt_policy, matches_the_exhaustive_optimum_on_hand_made_traces) {
  const std::vector<std::vector<uint32_t>> traces = {
      {0, 1, 2, 0, 1, 2},                 // cyclic: LRU's worst case
      {0, 1, 2, 3, 3, 2, 1, 0},           // forward then backward
      {0, 1, 0, 2, 0, 3, 0, 1},           // a tied chunk used throughout
      {0, 1, 2, 3, 4, 0, 4, 3, 2, 1, 0},  // embedding tied with the head
  };
  for (size_t i = 0; i < traces.size(); ++i) {
    for (size_t cap : {size_t{2}, size_t{3}}) {
      const size_t opt = simulate(traces[i], cap, 2, true);
      const size_t lru = simulate(traces[i], cap, 2, false);
      const size_t best = optimum(traces[i], cap, 2);
      cr_assert_eq(opt, best, "trace %zu capacity %zu: OPT %zu misses, optimum %zu", i, cap, opt, best);
      cr_assert_leq(opt, lru);
    }
  }
  // The cyclic trace with two slots: LRU misses every access, OPT does not.
  cr_assert_eq(simulate(traces[0], 2, 2, false), 12u);
  cr_assert_lt(simulate(traces[0], 2, 2, true), 12u);
}
