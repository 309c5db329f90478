// The placement optimum of bench/placement_optimum.h: hand-made traces with
// answers worked out below, and seeded random traces on which Belady, the
// exhaustive search, a brute force over every schedule (prefetches
// included), the fractional lower bound and an LRU simulation must agree or
// bracket one another.
#include <criterion/criterion.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../bench/placement_optimum.h"

using namespace pstar::bench;

namespace {

constexpr uint64_t kInf = std::numeric_limits<uint64_t>::max();

PlacementProblem make(std::vector<uint32_t> chunk_at, std::vector<uint64_t> budget_at, std::vector<uint64_t> bytes,
                      std::vector<uint32_t> init = {}) {
  PlacementProblem p;
  p.chunk_at = std::move(chunk_at);
  p.budget_at = std::move(budget_at);
  p.bytes = std::move(bytes);
  p.initially_resident = std::move(init);
  return p;
}

PlacementProblem constant_budget(std::vector<uint32_t> chunk_at, uint64_t budget, std::vector<uint64_t> bytes,
                                 std::vector<uint32_t> init = {}) {
  std::vector<uint64_t> budget_at(chunk_at.size(), budget);
  return make(std::move(chunk_at), std::move(budget_at), std::move(bytes), std::move(init));
}

uint64_t exhaustive(const PlacementProblem& p, size_t limit = 50'000'000) {
  uint64_t out = kInf;
  cr_assert(exhaustive_optimum(p, limit, &out), "exhaustive search over its state limit");
  return out;
}

// Every schedule, in the most general model: after moment t any set holding
// chunk_at[t] within the budget, paying for every chunk it adds (so fetching
// ahead of need and evicting early are allowed).  For <= ~8 chunks.
uint64_t brute_force(const PlacementProblem& p) {
  const size_t k = p.bytes.size();
  const size_t sets = size_t{1} << k;
  std::vector<uint64_t> set_bytes(sets, 0);
  for (size_t s = 0; s < sets; ++s)
    for (size_t i = 0; i < k; ++i)
      if (s >> i & 1) set_bytes[s] += p.bytes[i];
  std::vector<uint64_t> cost(sets, kInf), next(sets);
  size_t init = 0;
  for (uint32_t c : p.initially_resident) init |= size_t{1} << c;
  cost[init] = 0;
  for (size_t t = 0; t < p.chunk_at.size(); ++t) {
    std::fill(next.begin(), next.end(), kInf);
    for (size_t from = 0; from < sets; ++from) {
      if (cost[from] == kInf) continue;
      for (size_t to = 0; to < sets; ++to) {
        if (!(to >> p.chunk_at[t] & 1) || set_bytes[to] > p.budget_at[t]) continue;
        next[to] = std::min(next[to], cost[from] + set_bytes[to & ~from]);
      }
    }
    cost.swap(next);
  }
  return *std::min_element(cost.begin(), cost.end());
}

// LRU: fetch on a miss, then evict the least recently used other chunk while
// over budget (initially resident chunks count as used before moment 0, in
// list order).  A feasible schedule, so an upper bound on the optimum.
uint64_t lru(const PlacementProblem& p) {
  std::vector<uint32_t> order;  // resident, least recently used first
  for (uint32_t c : p.initially_resident)
    if (std::find(order.begin(), order.end(), c) == order.end()) order.push_back(c);
  uint64_t total = 0, fetched = 0;
  for (uint32_t c : order) total += p.bytes[c];
  for (size_t t = 0; t < p.chunk_at.size(); ++t) {
    const uint32_t c = p.chunk_at[t];
    const auto it = std::find(order.begin(), order.end(), c);
    if (it == order.end()) {
      fetched += p.bytes[c];
      total += p.bytes[c];
    } else {
      order.erase(it);
    }
    while (total > p.budget_at[t]) {
      total -= p.bytes[order.front()];
      order.erase(order.begin());
    }
    order.push_back(c);
  }
  return fetched;
}

// A random problem: `chunks` chunks of sizes in [1, max_size] (or all
// `max_size` when uniform), `moments` moments, budgets between the needed
// chunk and `slack` times the largest size, varying per moment or not, and a
// random initial set.
PlacementProblem random_problem(std::mt19937_64& rng, uint32_t chunks, size_t moments, uint64_t max_size,
                                bool uniform, bool varying, uint64_t slack) {
  PlacementProblem p;
  for (uint32_t c = 0; c < chunks; ++c) p.bytes.push_back(uniform ? max_size : 1 + rng() % max_size);
  const uint64_t largest = *std::max_element(p.bytes.begin(), p.bytes.end());
  const uint64_t fixed = largest + rng() % (slack * largest);
  for (size_t t = 0; t < moments; ++t) {
    const uint32_t c = static_cast<uint32_t>(rng() % chunks);
    p.chunk_at.push_back(c);
    p.budget_at.push_back(varying ? p.bytes[c] + rng() % (slack * largest) : fixed);
  }
  for (uint32_t c = 0; c < chunks; ++c)
    if (rng() % 4 == 0) p.initially_resident.push_back(c);
  return p;
}

}  // namespace

// a, b, c of 100 bytes, 200 bytes of budget (two slots), trace a b c a b.
// Belady: fetch a, b; at c evict b (next use 4, after a's 3), fetch c; a
// hits; at b evict c (never used again), fetch b: four fetches, 400 bytes.
// Three distinct chunks cost 300 at least, and the window a b c a holds
// three chunks in two slots, so one more fetch is forced: 400 is optimal.
Test(placement_optimum, uniform_hand_made_trace) {
  const PlacementProblem p = constant_budget({0, 1, 2, 0, 1}, 200, {100, 100, 100});
  cr_assert_eq(belady_uniform(p), 400u);
  cr_assert_eq(exhaustive(p), 400u);
  cr_assert_eq(brute_force(p), 400u);
  const PlacementOptimum r = placement_optimum(p);
  cr_assert(r.feasible && r.exact);
  cr_assert_eq(r.bytes_fetched, 400u);
  cr_assert_eq(r.method, std::string("belady-uniform"));
}

// a, b of 10 bytes, trace a b a b a with budgets 20 20 10 20 20.  At moment
// 2 only a fits, so b (resident since moment 1) is evicted and fetched again
// at moment 3: a, b, b = 30 bytes.  Both must be fetched once (20) and b
// cannot survive moment 2, so 30 is optimal.
Test(placement_optimum, uniform_time_varying_budget) {
  const PlacementProblem p = make({0, 1, 0, 1, 0}, {20, 20, 10, 20, 20}, {10, 10});
  cr_assert_eq(belady_uniform(p), 30u);
  cr_assert_eq(exhaustive(p), 30u);
  cr_assert_eq(brute_force(p), 30u);
  cr_assert_eq(placement_optimum(p).bytes_fetched, 30u);
  // The same budget throughout keeps both: 20.
  cr_assert_eq(belady_uniform(constant_budget({0, 1, 0, 1, 0}, 20, {10, 10})), 20u);
}

// A and B of 2 bytes, 3 bytes of budget, trace A B A B.  Only one fits, so
// every moment fetches: 8.  The fractional relaxation keeps one byte of the
// other chunk: A (2), B (2, A drops to 1 byte), A (1, B drops to 1), B (1) =
// 6 < 8, a strict lower bound.
Test(placement_optimum, fractional_bound_below_the_integral_optimum) {
  const PlacementProblem p = constant_budget({0, 1, 0, 1}, 3, {2, 2});
  cr_assert_eq(belady_uniform(p), 8u);
  cr_assert_eq(exhaustive(p), 8u);
  cr_assert_eq(brute_force(p), 8u);
  cr_assert_eq(fractional_lower_bound(p), 6u);
}

// A of 2 bytes, b and c of 1, 3 bytes of budget, trace A b c b A.  At c the
// furthest next use is A's (moment 4): evicting it costs A again at the end,
// 2 + 1 + 1 + 2 = 6.  Evicting b instead (next use 3) costs b again:
// 2 + 1 + 1 + 1 = 5, the optimum: first fetches cost 4, and at moment 2 the
// 3 bytes cannot hold A and b besides c, and both are needed again.  The
// fractional greedy evicts one byte of A at c and fetches it back:
// 2 + 1 + 1 + 1 = 5 as well.
Test(placement_optimum, mixed_sizes_furthest_next_use_is_not_optimal) {
  const PlacementProblem p = constant_budget({0, 1, 2, 1, 0}, 3, {2, 1, 1});
  cr_assert_eq(furthest_next_use_schedule(p), 6u);
  cr_assert_eq(exhaustive(p), 5u);
  cr_assert_eq(brute_force(p), 5u);
  cr_assert_eq(fractional_lower_bound(p), 5u);
  cr_assert_throw(belady_uniform(p), std::invalid_argument);
  PlacementOptimum r = placement_optimum(p);
  cr_assert(r.feasible && r.exact);
  cr_assert_eq(r.bytes_fetched, 5u);
  cr_assert_eq(r.method, std::string("exhaustive"));
  // Without the exhaustive search: a lower bound (5 < 6, not certified).
  r = placement_optimum(p, 0);
  cr_assert(r.feasible && !r.exact);
  cr_assert_eq(r.bytes_fetched, 5u);
  cr_assert_eq(r.method, std::string("fractional-lower-bound"));
  // A of 2 and b of 1 fit together in 3: the bound (3) equals a schedule's
  // cost, so it is exact even without the search.
  r = placement_optimum(constant_budget({0, 1, 0, 1}, 3, {2, 1}), 0);
  cr_assert(r.exact);
  cr_assert_eq(r.bytes_fetched, 3u);
  cr_assert_eq(r.method, std::string("fractional-tight"));
}

// A of 2 bytes, b of 1, trace A b A b A with budgets 3 3 2 3 3.  At moment 2
// only A fits, so b is evicted and fetched again: 2 + 1 + 1 = 4 for every
// method (the fractional greedy has to drop all of b's single byte too).
Test(placement_optimum, mixed_sizes_time_varying_budget) {
  const PlacementProblem p = make({0, 1, 0, 1, 0}, {3, 3, 2, 3, 3}, {2, 1});
  cr_assert_eq(exhaustive(p), 4u);
  cr_assert_eq(brute_force(p), 4u);
  cr_assert_eq(fractional_lower_bound(p), 4u);
  cr_assert_eq(furthest_next_use_schedule(p), 4u);
  cr_assert_eq(placement_optimum(p).bytes_fetched, 4u);
}

Test(placement_optimum, initial_residency) {
  // a, b, c of 10 bytes, two slots, a resident at first, trace a b a: only b
  // is fetched (10).
  PlacementProblem p = constant_budget({0, 1, 0}, 20, {10, 10, 10}, {0});
  cr_assert_eq(belady_uniform(p), 10u);
  cr_assert_eq(exhaustive(p), 10u);
  cr_assert_eq(brute_force(p), 10u);
  // All three resident but one slot at moment 0: the others go for free, 0.
  p = constant_budget({0}, 10, {10, 10, 10}, {0, 1, 2});
  cr_assert_eq(belady_uniform(p), 0u);
  cr_assert_eq(placement_optimum(p).bytes_fetched, 0u);
  // A chunk the trace never uses, of another size and listed twice, does not
  // break uniformity: a b a b with a resident in one slot costs b, a, b = 30.
  p = constant_budget({0, 1, 0, 1}, 10, {10, 10, 999}, {2, 0, 2});
  PlacementOptimum r = placement_optimum(p);
  cr_assert_eq(r.method, std::string("belady-uniform"));
  cr_assert_eq(r.bytes_fetched, 30u);
  cr_assert_eq(brute_force(p), 30u);
  // A of 2, b and c of 1 resident, 3 bytes, trace A b c.  A needs 2 bytes at
  // moment 0, so one of b, c goes; keeping b (needed first) leaves only c to
  // fetch at moment 2: 2 + 1 = 3.
  p = constant_budget({0, 1, 2}, 3, {2, 1, 1}, {1, 2});
  cr_assert_eq(exhaustive(p), 3u);
  cr_assert_eq(brute_force(p), 3u);
  cr_assert_eq(fractional_lower_bound(p), 3u);
  cr_assert_eq(furthest_next_use_schedule(p), 3u);
}

Test(placement_optimum, infeasible_moment) {
  // b (20 bytes) alone exceeds the 15 bytes of moment 1.
  const PlacementProblem p = make({0, 1}, {30, 15}, {10, 20});
  const PlacementOptimum r = placement_optimum(p);
  cr_assert(!r.feasible);
  cr_assert(!r.exact);
  cr_assert_eq(r.bytes_fetched, 0u);
  cr_assert_eq(r.method, std::string("infeasible"));
  uint64_t out = 0;
  cr_assert_throw(exhaustive_optimum(p, 1000, &out), std::invalid_argument);
  cr_assert_throw(fractional_lower_bound(p), std::invalid_argument);
  cr_assert_throw(furthest_next_use_schedule(p), std::invalid_argument);
  const PlacementProblem u = make({0, 1}, {30, 5}, {10, 10});
  cr_assert(!placement_optimum(u).feasible);
  cr_assert_throw(belady_uniform(u), std::invalid_argument);
  // Exactly the chunk's size is feasible.
  cr_assert(placement_optimum(make({0, 1}, {10, 20}, {10, 20})).feasible);
}

Test(placement_optimum, invalid_input) {
  // chunk_at and budget_at differ in length.
  cr_assert_throw(placement_optimum(make({0, 1}, {10}, {5, 5})), std::invalid_argument);
  // Chunk ids out of range, in the trace and in the initial set.
  cr_assert_throw(placement_optimum(make({0, 2}, {10, 10}, {5, 5})), std::invalid_argument);
  cr_assert_throw(placement_optimum(make({0, 1}, {10, 10}, {5, 5}, {7})), std::invalid_argument);
  cr_assert_throw(fractional_lower_bound(make({3}, {10}, {5})), std::invalid_argument);
  uint64_t out = 0;
  cr_assert_throw(exhaustive_optimum(make({0}, {10, 10}, {5}), 1000, &out), std::invalid_argument);
  cr_assert_throw(belady_uniform(make({1}, {10}, {5})), std::invalid_argument);
  try {
    placement_optimum(make({0, 2}, {10, 10}, {5, 5}));
  } catch (const std::invalid_argument& e) {
    cr_assert(std::string(e.what()).find("chunk_at[1] = 2") != std::string::npos, "message: %s", e.what());
  }
  // The empty trace costs nothing.
  const PlacementOptimum r = placement_optimum(PlacementProblem{});
  cr_assert(r.feasible && r.exact);
  cr_assert_eq(r.bytes_fetched, 0u);
}

Test(placement_optimum, exhaustive_gives_up_past_its_state_limit) {
  uint64_t out = 12345;
  const PlacementProblem p = constant_budget({0, 1, 2, 1, 0}, 3, {2, 1, 1});
  cr_assert(!exhaustive_optimum(p, 2, &out));
  cr_assert_eq(out, 12345u);
  // More than 64 distinct chunks: out of reach at any limit.
  PlacementProblem big;
  for (uint32_t c = 0; c < 65; ++c) {
    big.chunk_at.push_back(c);
    big.budget_at.push_back(100);
    big.bytes.push_back(1 + c % 2);
  }
  cr_assert(!exhaustive_optimum(big, 1'000'000, &out));
  const PlacementOptimum r = placement_optimum(big);
  cr_assert_eq(r.method, std::string("fractional-tight"));  // everything fits
  cr_assert_eq(r.bytes_fetched, 65u + 32u);
}

// One size: Belady equals the exhaustive search and the brute force over
// every schedule, with fixed and varying budgets and random initial sets.
Test(placement_optimum, uniform_random_belady_is_exact) {
  std::mt19937_64 rng(20240611);
  for (int i = 0; i < 400; ++i) {
    const uint32_t chunks = 2 + static_cast<uint32_t>(rng() % 5);
    const PlacementProblem p =
        random_problem(rng, chunks, 1 + rng() % 24, 1 + rng() % 6, true, i % 2 == 1, chunks);
    const uint64_t belady = belady_uniform(p);
    cr_assert_eq(belady, exhaustive(p), "case %d", i);
    cr_assert_eq(belady, brute_force(p), "case %d", i);
    cr_assert_leq(fractional_lower_bound(p), belady, "case %d", i);
    cr_assert_leq(belady, lru(p), "case %d", i);
    const PlacementOptimum r = placement_optimum(p);
    cr_assert(r.exact && r.bytes_fetched == belady, "case %d", i);
  }
}

// Mixed sizes, small enough for the brute force: exhaustive == brute force,
// fractional <= exhaustive <= LRU and the furthest-next-use schedule.
Test(placement_optimum, mixed_random_small_matches_brute_force) {
  std::mt19937_64 rng(7);
  int strict_bound = 0, greedy_worse = 0;
  for (int i = 0; i < 400; ++i) {
    const uint32_t chunks = 2 + static_cast<uint32_t>(rng() % 5);
    // Sizes 1..2 every third case: many chunks of one size.
    const PlacementProblem p = random_problem(rng, chunks, 1 + rng() % 20, i % 3 == 0 ? 2 : 8, false, i % 2 == 1, 3);
    const uint64_t best = exhaustive(p);
    cr_assert_eq(best, brute_force(p), "case %d", i);
    const uint64_t lower = fractional_lower_bound(p);
    const uint64_t greedy = furthest_next_use_schedule(p);
    cr_assert_leq(lower, best, "case %d", i);
    cr_assert_leq(best, greedy, "case %d", i);
    cr_assert_leq(best, lru(p), "case %d", i);
    strict_bound += lower < best;
    greedy_worse += best < greedy;
    const PlacementOptimum r = placement_optimum(p);
    cr_assert(r.exact && r.bytes_fetched == best, "case %d", i);
  }
  // The cases tell the methods apart.
  cr_assert_gt(strict_bound, 0);
  cr_assert_gt(greedy_worse, 0);
}

// Mixed sizes with up to 16 chunks and 200 moments: the bounds bracket the
// exhaustive optimum.
Test(placement_optimum, mixed_random_larger_bounds_bracket_the_optimum) {
  std::mt19937_64 rng(99);
  int solved = 0;
  for (int i = 0; i < 60; ++i) {
    const uint32_t chunks = 6 + static_cast<uint32_t>(rng() % 11);
    const PlacementProblem p = random_problem(rng, chunks, 50 + rng() % 151, 16, false, i % 2 == 1, 4);
    uint64_t best = 0;
    if (!exhaustive_optimum(p, 2'000'000, &best)) continue;
    ++solved;
    cr_assert_leq(fractional_lower_bound(p), best, "case %d", i);
    cr_assert_leq(best, furthest_next_use_schedule(p), "case %d", i);
    cr_assert_leq(best, lru(p), "case %d", i);
  }
  cr_assert_geq(solved, 30);
}

// Chunks of one size but for a larger first and a smaller last one (as a
// model's chunk list), 40 of them, forward and backward three times: the
// exhaustive search stays exact, between the bounds.
Test(placement_optimum, near_uniform_many_chunks_is_exact) {
  PlacementProblem p;
  const uint32_t chunks = 40;
  for (uint32_t c = 0; c < chunks; ++c) p.bytes.push_back(c == 0 ? 100 : c == chunks - 1 ? 20 : 64);
  for (int it = 0; it < 3; ++it) {
    for (uint32_t c = 0; c < chunks; ++c) p.chunk_at.push_back(c);
    for (uint32_t c = chunks; c-- > 0;) {
      p.chunk_at.push_back(c);
      if (c % 5 == 0) p.chunk_at.push_back(0);  // a tied embedding
    }
  }
  std::mt19937_64 rng(11);
  for (size_t t = 0; t < p.chunk_at.size(); ++t) p.budget_at.push_back(1000 + rng() % 64);
  const PlacementOptimum r = placement_optimum(p);
  cr_assert(r.exact);
  cr_assert_eq(r.method, std::string("exhaustive"));
  cr_assert_leq(fractional_lower_bound(p), r.bytes_fetched);
  cr_assert_leq(r.bytes_fetched, furthest_next_use_schedule(p));
  cr_assert_leq(r.bytes_fetched, lru(p));
}

// A large trace (300 chunks, 20000 moments) takes the lower bound, which
// stays below LRU and the furthest-next-use schedule.
Test(placement_optimum, large_trace_uses_the_lower_bound) {
  std::mt19937_64 rng(3);
  const PlacementProblem p = random_problem(rng, 300, 20000, 1000, false, true, 40);
  const PlacementOptimum r = placement_optimum(p);
  cr_assert(r.feasible);
  cr_assert_eq(r.method, std::string("fractional-lower-bound"));
  cr_assert_leq(r.bytes_fetched, furthest_next_use_schedule(p));
  cr_assert_leq(r.bytes_fetched, lru(p));
  // Uniform sizes at the same scale stay exact.
  const PlacementProblem u = random_problem(rng, 300, 20000, 1000, true, true, 40);
  const PlacementOptimum ru = placement_optimum(u);
  cr_assert(ru.exact);
  cr_assert_leq(ru.bytes_fetched, lru(u));
  cr_assert_leq(fractional_lower_bound(u), ru.bytes_fetched);
}

// Steady state: a b c a b c in two slots of one byte.  From empty: a, b, c
// (evicting b), a hits, b (evicting a), c hits: 4.  From the best start {a,
// b}: a, b hit, c (evicting b: next use 4 after a's 3), a hits, b (evicting
// a), c hits: 2.
Test(placement_optimum, steady_state_starts_from_the_best_resident_set) {
  const std::vector<uint32_t> trace = {0, 1, 2, 0, 1, 2};
  const std::vector<uint64_t> budget(trace.size(), 2);
  const std::vector<uint64_t> bytes = {1, 1, 1};
  cr_assert_eq(placement_optimum(constant_budget(trace, 2, bytes)).bytes_fetched, 4u);
  const PlacementProblem s = steady_state_problem(trace, budget, bytes);
  cr_assert_eq(s.free_moments, 3u);
  cr_assert_eq(s.chunk_at.size(), 9u);
  const PlacementOptimum r = placement_optimum(s);
  cr_assert(r.exact);
  cr_assert_eq(r.bytes_fetched, 2u);
  cr_assert_eq(fractional_lower_bound(s), 2u);
}

// The steady-state optimum equals the best cold optimum over every starting
// set that fits budget_at[0] (found by enumerating the sets), for uniform and
// mixed sizes on random traces.
Test(placement_optimum, steady_state_equals_the_best_start) {
  std::mt19937_64 rng(23);
  for (int round = 0; round < 300; ++round) {
    const bool uniform = round % 2 == 0;
    PlacementProblem p = random_problem(rng, 6, 5 + rng() % 20, 8, uniform, round % 3 == 0, 3);
    p.initially_resident.clear();
    if (placement_optimum(p).feasible == false) continue;
    uint64_t best = kInf;
    for (uint32_t mask = 0; mask < (1u << 6); ++mask) {
      PlacementProblem q = p;
      uint64_t held = 0;
      for (uint32_t c = 0; c < 6; ++c)
        if (mask >> c & 1) {
          q.initially_resident.push_back(c);
          held += p.bytes[c];
        }
      if (held > p.budget_at[0]) continue;
      best = std::min(best, exhaustive(q));
    }
    const PlacementProblem s = steady_state_problem(p.chunk_at, p.budget_at, p.bytes);
    cr_assert_eq(exhaustive(s), best, "round %d", round);
    cr_assert_leq(fractional_lower_bound(s), best, "round %d", round);
    if (uniform) cr_assert_eq(belady_uniform(s), best, "round %d", round);
  }
}
