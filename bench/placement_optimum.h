// The fewest bytes any placement could fetch on a trace, computed
// independently of the runtime (its own simulation, no engine code), so that
// `pstar-bench placement` can report how far a policy is from the optimum.
//
// Model.  At moment t chunk chunk_at[t] must be resident on the accelerator,
// and the resident chunks may then take at most budget_at[t] bytes.  Before
// moment 0 the chunks in initially_resident are resident (with no budget
// constraint: they may be evicted at moment 0).  Fetching chunk c costs
// bytes[c]; evictions are free and may happen at any time.  The trace is
// played once (no wrap-around).  Chunks in initially_resident that the trace
// never uses are irrelevant (evicting them is free) and are ignored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pstar::bench {

struct PlacementProblem {
  std::vector<uint32_t> chunk_at;            // chunk needed at each moment
  std::vector<uint64_t> budget_at;           // bytes available for chunks at each moment
  std::vector<uint64_t> bytes;               // size of each chunk (indexed by chunk id)
  std::vector<uint32_t> initially_resident;  // chunk ids resident before moment 0
  // Fetches at moments < free_moments cost nothing.  A prefix of free
  // moments that visits every chunk (in first-use order, with a budget of
  // budget_at[0] plus the largest chunk) lets the schedule start from any
  // resident set that fits: the optimum of a steady-state iteration whose
  // starting content is the best possible (see steady_state_problem()).
  size_t free_moments = 0;
};

// The problem of `repetitions` back-to-back iterations of `chunk_at` that may
// start with any resident set fitting budget_at[0]: a free prefix visits each
// chunk in first-use order, with room for one more chunk than budget_at[0] so
// that every set that fits is reachable (the extra is evicted, free, at
// moment 0).  Its optimum divided by `repetitions` is a lower bound on the
// bytes per iteration of any schedule that repeats every iteration (a steady
// state: repeated `repetitions` times it is one of the schedules searched),
// and it grows towards the best such schedule as `repetitions` grows.  With
// one repetition it bounds a single iteration from any starting content.
PlacementProblem steady_state_problem(const std::vector<uint32_t>& chunk_at, const std::vector<uint64_t>& budget_at,
                                      const std::vector<uint64_t>& bytes, size_t repetitions = 1);

struct PlacementOptimum {
  uint64_t bytes_fetched = 0;  // exact minimum when exact == true, else a lower bound
  bool exact = false;
  bool feasible = true;  // false if some moment's chunk alone exceeds its budget
  // "belady-uniform", "exhaustive", "fractional-tight" (the lower bound is
  // met by a schedule, so it is exact), "fractional-lower-bound", "infeasible".
  std::string method;
};

// Exact where that is cheap, else a lower bound:
//   1. some moment's chunk alone exceeds its budget: feasible = false,
//      bytes_fetched = 0, method "infeasible";
//   2. all chunks the trace uses have the same size: belady_uniform, exact;
//   3. exhaustive_optimum within exact_state_limit: exact;
//   4. otherwise fractional_lower_bound, exact only when the furthest-next-use
//      schedule (an upper bound) fetches the same bytes ("fractional-tight").
// Throws std::invalid_argument on malformed input (see validate_problem).
PlacementOptimum placement_optimum(const PlacementProblem& p, size_t exact_state_limit = 2'000'000);

// Throws std::invalid_argument if chunk_at and budget_at differ in length or
// a chunk id (in chunk_at or initially_resident) is not below bytes.size().
void validate_problem(const PlacementProblem& p);

// The individual methods, for tests.  Each validates its input and throws
// std::invalid_argument on malformed input or an infeasible moment
// (placement_optimum reports the latter as feasible = false instead).

// Belady: evict the chunk with the furthest next use.  Optimal when all
// chunks the trace uses have one size s (budget_at[t] / s slots at moment t);
// throws std::invalid_argument otherwise.
uint64_t belady_uniform(const PlacementProblem& p);

// The same schedule for any sizes: fetch on a miss, then while over budget
// evict the resident chunk (other than the needed one) with the furthest
// next use.  A feasible schedule, hence an upper bound on the optimum; not
// optimal in general when sizes differ.
uint64_t furthest_next_use_schedule(const PlacementProblem& p);

// Exact optimum by dynamic programming over resident sets, with a bound from
// furthest_next_use_schedule.  Returns false, leaving *out alone, when the
// trace uses more than 64 distinct chunks or the search would examine more
// than state_limit (moment, resident set) states and candidate sets.
bool exhaustive_optimum(const PlacementProblem& p, size_t state_limit, uint64_t* out);

// A lower bound on the bytes fetched by every feasible schedule: the optimum
// of the relaxation in which any fraction of a chunk's bytes may be kept.
uint64_t fractional_lower_bound(const PlacementProblem& p);

}  // namespace pstar::bench
