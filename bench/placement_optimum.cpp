// The fewest bytes any placement could fetch on a trace; see
// placement_optimum.h for the model.
//
// Why the methods are right.  Write c_t = chunk_at[t].  A schedule is a
// sequence of resident sets O_t (after moment t) with c_t in O_t and
// bytes(O_t) <= budget_at[t]; it costs the bytes of the chunks it fetches.
//
// (L) Lazy fetches.  Every schedule can be made to fetch a chunk only at a
//     moment that needs it, at no extra cost: delaying a fetch to the chunk's
//     next use (or dropping it if there is none) only shrinks the resident
//     sets in between.  So O_t is a subset of O_{t-1} + {c_t}, and it costs
//     bytes[c_t] when c_t is not in O_{t-1}.
//
// (B) Belady is optimal for one size s, also with a varying budget.  With one
//     size the budget is a slot count k_t = floor(budget_at[t] / s).  Let S
//     be a lazy schedule that agrees with Belady before moment t, and let
//     R = O_{t-1} + {c_t}.  Belady keeps B: c_t and the min(|R|, k_t) - 1
//     other chunks of R with the nearest next uses (a chunk never used again
//     counts as used at infinity).  S keeps some O within R.  We turn S into
//     a schedule that keeps B at moment t and costs no more; induction on t
//     then shows Belady costs no more than any schedule.
//     - Superset: if a schedule S' keeps a superset of S's set at some moment
//       (within the budget), S' can take S's set exactly at the next moment
//       (it is within S''s set plus the needed chunk) and fetches only if S
//       does; from then on they coincide.  So while |O| < |B| we may add a
//       chunk of B \ O to O at no cost.
//     - Swap: now |O| = |B|; if O != B take q in O \ B, p in B \ O, so
//       next(p) <= next(q).  If equal, both are never used again and swapping
//       them changes nothing.  Else S' keeps O - q + p and mirrors S: at each
//       later moment before next(p), if S evicts q, S' takes S's set and they
//       coincide at the same cost; otherwise S' holds S's set with q replaced
//       by p (S, being lazy, does not hold p, which is not needed before
//       next(p)).  Neither p nor q is needed before next(p), so both fetch the
//       same chunks.  At next(p) S fetches p (cost s) and S' does not; S' then
//       takes S's set minus q, a subset, and later fetches q at most once
//       where S would hit it (cost s), after which they coincide.  Sets of S'
//       are never larger than those of S, so the slot counts hold, and S'
//       costs no more than S.  Repeating the swap reaches O = B.
//     The swap is where one size matters: with sizes, S' saves bytes[p] and
//     may pay bytes[q], hence the exhaustive search for mixed sizes.
//     Evicting when the budget shrinks below the resident bytes is covered by
//     the same argument: B is then the k_t nearest chunks and the superset
//     and swap steps hold at any k_t.
//
// (F) The fractional relaxation is a lower bound.  Let a schedule keep any
//     number x_c in [0, bytes[c]] of chunk c's bytes, with x_{c_t} = bytes[c_t]
//     at moment t and sum x_c <= budget_at[t], paying for every byte it
//     brings in.  An integral schedule is such a schedule (x_c is 0 or
//     bytes[c]) at the same cost, so the relaxation's optimum is <= the
//     optimum of every integral schedule.  The relaxation is paging with
//     one-byte pages in which moment t requests all bytes[c_t] pages of c_t
//     at once, with a budget_at[t]-page cache.  Argument (B) holds verbatim for
//     one-byte pages and such batched requests (p and q are single bytes of
//     different chunks, as the bytes of one chunk are interchangeable, so
//     next(p) != next(q) unless neither is used again; at next(p) S fetches
//     byte p at cost 1, and S' later pays at most 1 for byte q).  So the
//     greedy that keeps the bytes with the nearest next use is optimal for
//     the relaxation, and its cost is a lower bound for every feasible
//     integral schedule.
//
// (E) Exhaustive search over maximal sets.  Given any lazy schedule S, let
//     S'_t be a maximal subset of S'_{t-1} + {c_t} (nothing more fits in
//     budget_at[t]) that contains O_t; by induction O_{t-1} is in S'_{t-1},
//     so O_t (within O_{t-1} + {c_t}) is too, and S' fetches c_t only if S
//     does.  So the dynamic program may step only to maximal sets, and it may
//     drop chunks that are never used again (keeping them saves nothing).
//     Among chunks of one size the swap of (B) applies as it stands (same
//     bytes, so the set stays within budget and maximal, and the bytes saved
//     equal the bytes paid): a set may keep a chunk of size s only if it also
//     keeps every chunk of size s in R with a nearer next use.  Applying these
//     swaps at moment t and then the maximal form from t + 1 on, for t = 0, 1,
//     ..., turns an optimal schedule into one the search explores.
#include "placement_optimum.h"

#include <algorithm>
#include <limits>
#include <set>
#include <stdexcept>
#include <utility>

namespace pstar::bench {

namespace {

constexpr size_t kNever = std::numeric_limits<size_t>::max();

// next_at[t]: the next moment after t that needs chunk_at[t] (kNever if none).
std::vector<size_t> next_uses(const PlacementProblem& p) {
  const size_t n = p.chunk_at.size();
  std::vector<size_t> next_at(n, kNever);
  std::vector<size_t> upcoming(p.bytes.size(), kNever);
  for (size_t t = n; t-- > 0;) {
    next_at[t] = upcoming[p.chunk_at[t]];
    upcoming[p.chunk_at[t]] = t;
  }
  return next_at;
}

// first_use[c]: the first moment that needs chunk c (kNever if none).
std::vector<size_t> first_uses(const PlacementProblem& p) {
  std::vector<size_t> first(p.bytes.size(), kNever);
  for (size_t t = p.chunk_at.size(); t-- > 0;) first[p.chunk_at[t]] = t;
  return first;
}

// The first moment whose chunk alone exceeds its budget, or kNever.
size_t first_infeasible_moment(const PlacementProblem& p) {
  for (size_t t = 0; t < p.chunk_at.size(); ++t)
    if (p.bytes[p.chunk_at[t]] > p.budget_at[t]) return t;
  return kNever;
}

void require_feasible(const PlacementProblem& p, const char* who) {
  const size_t t = first_infeasible_moment(p);
  if (t != kNever)
    throw std::invalid_argument(std::string(who) + ": infeasible: chunk " + std::to_string(p.chunk_at[t]) + " (" +
                                std::to_string(p.bytes[p.chunk_at[t]]) + " bytes) exceeds the budget of " +
                                std::to_string(p.budget_at[t]) + " bytes at moment " + std::to_string(t));
}

// Whether every chunk the trace uses has the same size.
bool uniform_sizes(const PlacementProblem& p) {
  for (uint32_t c : p.chunk_at)
    if (p.bytes[c] != p.bytes[p.chunk_at[0]]) return false;
  return true;
}

// Initially resident chunks the trace uses, without duplicates.
std::vector<uint32_t> useful_initial(const PlacementProblem& p, const std::vector<size_t>& first) {
  std::vector<uint32_t> init;
  for (uint32_t c : p.initially_resident)
    if (first[c] != kNever) init.push_back(c);
  std::sort(init.begin(), init.end());
  init.erase(std::unique(init.begin(), init.end()), init.end());
  return init;
}

// Fetch on a miss, then evict the furthest next use while over budget.  With
// whole == false, evicts only the bytes needed (the fractional greedy of (F)).
uint64_t furthest_next_use(const PlacementProblem& p, bool whole) {
  const std::vector<size_t> next_at = next_uses(p);
  const std::vector<size_t> first = first_uses(p);
  std::vector<uint64_t> held(p.bytes.size(), 0);  // resident bytes of each chunk
  std::vector<size_t> key(p.bytes.size(), kNever);
  // Resident chunks by next use.  Chunks never used again are dropped at
  // once, so keys are distinct moments.
  std::set<std::pair<size_t, uint32_t>> by_next;
  uint64_t total = 0, fetched = 0;
  for (uint32_t c : useful_initial(p, first)) {
    held[c] = p.bytes[c];
    key[c] = first[c];
    by_next.emplace(first[c], c);
    total += p.bytes[c];
  }
  for (size_t t = 0; t < p.chunk_at.size(); ++t) {
    const uint32_t c = p.chunk_at[t];
    if (key[c] != kNever) by_next.erase({key[c], c});
    if (t >= p.free_moments) fetched += p.bytes[c] - held[c];
    total += p.bytes[c] - held[c];
    held[c] = p.bytes[c];
    while (total > p.budget_at[t]) {
      // Feasible moments leave another resident chunk to evict.
      const auto furthest = std::prev(by_next.end());
      const uint32_t v = furthest->second;
      const uint64_t drop = whole ? held[v] : std::min(held[v], total - p.budget_at[t]);
      held[v] -= drop;
      total -= drop;
      if (held[v] == 0) {
        by_next.erase(furthest);
        key[v] = kNever;
      }
    }
    if (next_at[t] == kNever) {
      total -= held[c];
      held[c] = 0;
      key[c] = kNever;
    } else {
      key[c] = next_at[t];
      by_next.emplace(key[c], c);
    }
  }
  return fetched;
}

// Enumerates the maximal subsets of `items` that fit in `room` (nothing left
// out would still fit) and, within each size, keep a prefix of `items`,
// calling emit(mask) for each.  `items` are sorted by size, then by next use.
// Counts every node of the search in *work and gives up (returns false) past
// `limit`.
class MaximalSubsets {
 public:
  MaximalSubsets(const std::vector<int>& items, const std::vector<uint64_t>& size, size_t* work, size_t limit)
      : items_(items), size_(size), work_(work), limit_(limit), suffix_(items.size() + 1, 0) {
    for (size_t i = items.size(); i-- > 0;) suffix_[i] = suffix_[i + 1] + size_[items[i]];
  }

  template <class Emit>
  bool run(uint64_t room, Emit&& emit) {
    return step(0, room, 0, std::numeric_limits<uint64_t>::max(), emit);
  }

 private:
  template <class Emit>
  bool step(size_t i, uint64_t room, uint64_t mask, uint64_t min_left_out, Emit& emit) {
    if (++*work_ > limit_) return false;
    if (suffix_[i] <= room) {
      // Everything that remains fits, so a maximal set takes all of it; it is
      // maximal if nothing left out earlier fits in what is then left.
      for (size_t j = i; j < items_.size(); ++j) mask |= uint64_t{1} << items_[j];
      if (room - suffix_[i] < min_left_out) emit(mask);
      return true;
    }
    const uint64_t s = size_[items_[i]];
    if (s <= room && !step(i + 1, room - s, mask | (uint64_t{1} << items_[i]), min_left_out, emit)) return false;
    // Leaving this chunk out leaves out the rest of its size too.
    size_t j = i + 1;
    while (j < items_.size() && size_[items_[j]] == s) ++j;
    return step(j, room, mask, std::min(min_left_out, s), emit);
  }

  const std::vector<int>& items_;
  const std::vector<uint64_t>& size_;
  size_t* work_;
  size_t limit_;
  std::vector<uint64_t> suffix_;  // suffix_[i]: bytes of items_[i..]
};

}  // namespace

void validate_problem(const PlacementProblem& p) {
  if (p.chunk_at.size() != p.budget_at.size())
    throw std::invalid_argument("placement problem: chunk_at has " + std::to_string(p.chunk_at.size()) +
                                " moments but budget_at has " + std::to_string(p.budget_at.size()));
  for (size_t t = 0; t < p.chunk_at.size(); ++t)
    if (p.chunk_at[t] >= p.bytes.size())
      throw std::invalid_argument("placement problem: chunk_at[" + std::to_string(t) +
                                  "] = " + std::to_string(p.chunk_at[t]) + " is out of range (" +
                                  std::to_string(p.bytes.size()) + " chunks)");
  for (size_t i = 0; i < p.initially_resident.size(); ++i)
    if (p.initially_resident[i] >= p.bytes.size())
      throw std::invalid_argument("placement problem: initially_resident[" + std::to_string(i) +
                                  "] = " + std::to_string(p.initially_resident[i]) + " is out of range (" +
                                  std::to_string(p.bytes.size()) + " chunks)");
}

uint64_t belady_uniform(const PlacementProblem& p) {
  validate_problem(p);
  if (!uniform_sizes(p)) throw std::invalid_argument("belady_uniform: the chunks the trace uses differ in size");
  require_feasible(p, "belady_uniform");
  // With one size s, resident bytes <= budget exactly when the resident
  // count <= floor(budget / s), so this is Belady over slots; see (B).
  return furthest_next_use(p, true);
}

uint64_t furthest_next_use_schedule(const PlacementProblem& p) {
  validate_problem(p);
  require_feasible(p, "furthest_next_use_schedule");
  return furthest_next_use(p, true);
}

uint64_t fractional_lower_bound(const PlacementProblem& p) {
  validate_problem(p);
  require_feasible(p, "fractional_lower_bound");
  return furthest_next_use(p, false);  // see (F)
}

bool exhaustive_optimum(const PlacementProblem& p, size_t state_limit, uint64_t* out) {
  validate_problem(p);
  require_feasible(p, "exhaustive_optimum");
  const size_t n = p.chunk_at.size();
  const std::vector<size_t> first = first_uses(p);
  // Dense indices for the chunks the trace uses (bits of a resident set).
  std::vector<int> dense(p.bytes.size(), -1);
  std::vector<uint64_t> size;
  for (uint32_t c : p.chunk_at)
    if (dense[c] < 0) {
      if (size.size() == 64) return false;
      dense[c] = static_cast<int>(size.size());
      size.push_back(p.bytes[c]);
    }
  const int k = static_cast<int>(size.size());
  auto bytes_of = [&](uint64_t mask) {
    uint64_t b = 0;
    for (; mask != 0; mask &= mask - 1) b += size[__builtin_ctzll(mask)];
    return b;
  };
  std::vector<size_t> last(k, 0);
  for (size_t t = 0; t < n; ++t) last[dense[p.chunk_at[t]]] = t;
  // live_after[t]: chunks needed after moment t.
  std::vector<uint64_t> live_after(n + 1, 0);
  for (size_t t = n; t-- > 0;) {
    live_after[t] = live_after[t + 1];
    if (t + 1 < n) live_after[t] |= uint64_t{1} << dense[p.chunk_at[t + 1]];
  }

  // Branch and bound: a state whose cost so far plus the chunks it must
  // still fetch at least once exceeds a known schedule cannot be optimal.
  const uint64_t upper = furthest_next_use(p, true);
  size_t work = 0;
  uint64_t init = 0;
  for (uint32_t c : useful_initial(p, first)) init |= uint64_t{1} << dense[c];
  std::vector<std::pair<uint64_t, uint64_t>> states{{init, 0}}, next;  // (resident set, bytes fetched)
  std::vector<int> others, order(k);
  for (int i = 0; i < k; ++i) order[i] = i;
  std::vector<size_t> upcoming(k, kNever);  // next use of each chunk after the moment being processed
  for (size_t t = n; t-- > 0;) upcoming[dense[p.chunk_at[t]]] = t;
  const std::vector<size_t> next_at = next_uses(p);
  constexpr size_t kDominators = 32;
  std::vector<std::pair<uint64_t, uint64_t>> dominators;
  for (size_t t = 0; t < n; ++t) {
    const int c = dense[p.chunk_at[t]];
    const uint64_t cbit = uint64_t{1} << c;
    const uint64_t keep = last[c] == t ? ~cbit : ~uint64_t{0};  // drops c after its last use
    next.clear();
    upcoming[c] = next_at[t];
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return size[a] != size[b] ? size[a] < size[b] : upcoming[a] < upcoming[b]; });
    for (const auto& [set, cost] : states) {
      if (++work > state_limit) return false;
      const uint64_t paid = cost + ((set & cbit) || t < p.free_moments ? 0 : size[c]);
      // (Within the free prefix, chunks still to come cost nothing: no bound.)
      if (t + 1 >= p.free_moments && paid + bytes_of(live_after[t] & ~set & ~cbit) > upper) continue;
      const uint64_t all = set | cbit;
      if (bytes_of(all) <= p.budget_at[t]) {
        next.emplace_back(all & keep, paid);
        continue;
      }
      others.clear();
      for (int i : order)
        if ((set >> i & 1) && i != c) others.push_back(i);
      MaximalSubsets subsets(others, size, &work, state_limit);
      const bool done =
          subsets.run(p.budget_at[t] - size[c], [&](uint64_t kept) { next.emplace_back((kept | cbit) & keep, paid); });
      if (!done) return false;
    }
    // One entry per resident set, at its lowest cost.
    std::sort(next.begin(), next.end());
    states.clear();
    for (const auto& s : next)
      if (states.empty() || states.back().first != s.first) states.push_back(s);
    // Dominance: a state (S, cost) is no better than (S', cost') when
    // cost' + bytes(S \ S') <= cost, as S' can fetch what it lacks of S and
    // then follow S's schedule (fetching ahead costs nothing extra, see (L)).
    // Each state is checked against the cheapest kDominators states kept.
    std::stable_sort(states.begin(), states.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    dominators.clear();
    size_t kept = 0;
    for (const auto& s : states) {
      bool dominated = false;
      for (const auto& d : dominators)
        if (d.second + bytes_of(s.first & ~d.first) <= s.second) {
          dominated = true;
          break;
        }
      if (dominated) continue;
      if (dominators.size() < kDominators) dominators.push_back(s);
      states[kept++] = s;
    }
    states.resize(kept);
  }
  uint64_t best = std::numeric_limits<uint64_t>::max();
  for (const auto& s : states) best = std::min(best, s.second);
  // An optimal schedule in the maximal form of (E) costs at most `upper` and
  // survives the bound, so states is never empty.
  *out = best;
  return true;
}

PlacementProblem steady_state_problem(const std::vector<uint32_t>& chunk_at, const std::vector<uint64_t>& budget_at,
                                      const std::vector<uint64_t>& bytes, size_t repetitions) {
  PlacementProblem p;
  p.bytes = bytes;
  if (chunk_at.empty()) return p;
  uint64_t largest = 0;
  std::vector<bool> seen(bytes.size(), false);
  for (uint32_t c : chunk_at) {
    if (c >= bytes.size()) break;  // validate_problem() reports it
    largest = std::max(largest, bytes[c]);
    if (seen[c]) continue;
    seen[c] = true;
    p.chunk_at.push_back(c);
  }
  const uint64_t prefix_budget =
      budget_at.empty() ? 0 : budget_at[0] + std::min(largest, std::numeric_limits<uint64_t>::max() - budget_at[0]);
  p.free_moments = p.chunk_at.size();
  p.budget_at.assign(p.free_moments, prefix_budget);
  for (size_t r = 0; r < repetitions; ++r) {
    p.chunk_at.insert(p.chunk_at.end(), chunk_at.begin(), chunk_at.end());
    p.budget_at.insert(p.budget_at.end(), budget_at.begin(), budget_at.end());
  }
  return p;
}

PlacementOptimum placement_optimum(const PlacementProblem& p, size_t exact_state_limit) {
  validate_problem(p);
  PlacementOptimum r;
  if (first_infeasible_moment(p) != kNever) {
    r.feasible = false;
    r.method = "infeasible";
    return r;
  }
  if (uniform_sizes(p)) {
    r.bytes_fetched = belady_uniform(p);
    r.exact = true;
    r.method = "belady-uniform";
    return r;
  }
  uint64_t exact = 0;
  if (exhaustive_optimum(p, exact_state_limit, &exact)) {
    r.bytes_fetched = exact;
    r.exact = true;
    r.method = "exhaustive";
    return r;
  }
  r.bytes_fetched = fractional_lower_bound(p);
  r.exact = r.bytes_fetched == furthest_next_use(p, true);
  r.method = r.exact ? "fractional-tight" : "fractional-lower-bound";
  return r;
}

}  // namespace pstar::bench
