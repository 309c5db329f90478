#include "chunk/size_search.h"

#include <algorithm>

#include "chunk/layout.h"

namespace pstar::chunk {

uint64_t search_cost(const ChunkLayout& layout) {
  const uint64_t trainable = layout.trainable_capacity_elems();
  return layout.total_capacity_elems() - trainable + kTrainableWeight * trainable;
}

SearchRange search_range(const std::vector<uint64_t>& numels, const std::vector<bool>& frozen, uint64_t align_elems,
                         uint64_t ceiling_elems) {
  uint64_t largest = 0, kind_total[2] = {0, 0};
  for (size_t i = 0; i < numels.size(); ++i) {
    const uint64_t n = align_up(numels[i], align_elems);
    largest = std::max(largest, n);
    kind_total[frozen[i] ? 1 : 0] += n;
  }
  SearchRange r;
  r.hi = std::max(align_up(std::max<uint64_t>(ceiling_elems, 1), align_elems), largest);
  const uint64_t whole = std::max(kind_total[0], kind_total[1]);  // one chunk per kind
  r.lo = std::max({align_elems, largest, std::min(align_up(r.hi / 4, align_elems), whole)});
  r.lo = std::min(r.lo, r.hi);
  return r;
}

uint64_t search_chunk_elems(const std::vector<uint64_t>& numels, const std::vector<bool>& frozen, uint64_t align_elems,
                            uint64_t ceiling_elems) {
  const SearchRange range = search_range(numels, frozen, align_elems, ceiling_elems);
  const uint64_t lo = range.lo, hi = range.hi;
  if (lo >= hi) return hi;

  // Runs of consecutive parameters of one kind, as the packing meets them:
  // for each first parameter, the ends whose run length is in [lo, hi]
  // (prefix sums, two pointers).  A model of many small parameters has
  // many such runs; past kMaxRunLengths, only every stride-th first
  // parameter is taken (the result may then miss the least).
  std::vector<uint64_t> sizes{lo, hi};
  for (size_t kind = 0; kind < 2; ++kind) {
    std::vector<uint64_t> prefix{0};  // aligned sizes of this kind, summed in order
    for (size_t i = 0; i < numels.size(); ++i)
      if (frozen[i] == (kind == 1) && numels[i] > 0) prefix.push_back(prefix.back() + align_up(numels[i], align_elems));
    const size_t n = prefix.size() - 1;
    std::vector<size_t> first_end(n), past_end(n);  // ends j+1 in [first_end, past_end)
    uint64_t runs = 0;
    for (size_t i = 0, a = 1, b = 1; i < n; ++i) {
      a = std::max(a, i + 1);
      b = std::max(b, a);
      while (a <= n && prefix[a] - prefix[i] < lo) ++a;
      b = std::max(b, a);
      while (b <= n && prefix[b] - prefix[i] <= hi) ++b;
      first_end[i] = a;
      past_end[i] = b;
      runs += b - a;
    }
    const uint64_t stride = runs / kMaxRunLengths + 1;
    for (size_t i = 0; i < n; i += stride)
      for (size_t j = first_end[i]; j < past_end[i]; ++j) sizes.push_back(prefix[j] - prefix[i]);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  if (sizes.size() > kMaxCandidates) {
    std::vector<uint64_t> spaced;
    for (size_t k = 0; k < kMaxCandidates; ++k) spaced.push_back(sizes[k * (sizes.size() - 1) / (kMaxCandidates - 1)]);
    sizes = std::move(spaced);
  }

  std::vector<uint64_t> cost(sizes.size());
  uint64_t least = UINT64_MAX;
  for (size_t k = 0; k < sizes.size(); ++k) {
    cost[k] = search_cost(ChunkLayout(numels, frozen, sizes[k], align_elems));
    least = std::min(least, cost[k]);
  }
  const double tie = static_cast<double>(least) * (1.0 + kTieFraction);
  for (size_t k = 0; k < sizes.size(); ++k)  // increasing size: the smallest tie
    if (static_cast<double>(cost[k]) <= tie) return sizes[k];
  return hi;  // not reached: the least is a tie of itself
}

}  // namespace pstar::chunk
