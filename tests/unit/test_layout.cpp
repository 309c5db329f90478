#include <criterion/criterion.h>

#include <algorithm>
#include <vector>

#include "chunk/layout.h"
#include "chunk/size_search.h"
#include "util/error.h"

using pstar::chunk::ChunkLayout;
using pstar::chunk::kAlignElems;

Test(layout, packs_in_registration_order_with_alignment) {
  // 100 + 300 fit one chunk of 1024 (100 -> aligned 128, 128 + 300 = 428).
  ChunkLayout l({100, 300, 700, 50}, {false, false, false, false}, 1024);
  cr_assert_eq(l.param(0).chunk, 0u);
  cr_assert_eq(l.param(0).offset_elems, 0u);
  cr_assert_eq(l.param(1).chunk, 0u);
  cr_assert_eq(l.param(1).offset_elems, 128u);
  // 428 -> aligned 512, 512 + 700 > 1024: new chunk.
  cr_assert_eq(l.param(2).chunk, 1u);
  cr_assert_eq(l.param(2).offset_elems, 0u);
  cr_assert_eq(l.param(3).chunk, 1u);
  cr_assert_eq(l.param(3).offset_elems, 768u);
  for (uint32_t i = 0; i < 4; ++i) {
    cr_assert_eq(l.param(i).offset_elems % kAlignElems, 0u);
    // 256-byte alignment in the 2-byte dtypes and in fp32.
    cr_assert_eq((l.param(i).offset_elems * 2) % 256, 0u);
    cr_assert_eq((l.param(i).offset_elems * 4) % 256, 0u);
  }
  cr_assert_eq(l.chunks().size(), 2u);
  cr_assert_eq(l.optimizer_chunk_count(), 2u);
}

Test(layout, jumbo_parameter_gets_its_own_chunk) {
  ChunkLayout l({10, 5000, 20}, {false, false, false}, 1024);
  const auto& j = l.chunks()[l.param(1).chunk];
  cr_assert(j.jumbo);
  cr_assert_eq(j.capacity_elems, 5120u);  // rounded up to 128
  cr_assert_eq(l.param(1).offset_elems, 0u);
  // The open chunk keeps filling around the jumbo one.
  cr_assert_eq(l.param(0).chunk, l.param(2).chunk);
  cr_assert_eq(l.jumbo_chunk_count(), 1u);
}

Test(layout, frozen_parameters_are_packed_apart_without_optimizer_twins) {
  ChunkLayout l({100, 100, 100, 100}, {false, true, false, true}, 1024);
  cr_assert_eq(l.param(0).chunk, l.param(2).chunk);
  cr_assert_eq(l.param(1).chunk, l.param(3).chunk);
  cr_assert_neq(l.param(0).chunk, l.param(1).chunk);
  const auto& frozen = l.chunks()[l.param(1).chunk];
  cr_assert(frozen.frozen);
  cr_assert_eq(frozen.optimizer_index, -1);
  cr_assert_eq(l.optimizer_chunk_count(), 1u);
  cr_assert_eq(l.trainable_capacity_elems(), 1024u);
  cr_assert_eq(l.total_capacity_elems(), 2048u);
}

Test(layout, fill_ratio_counts_parameter_elements_over_capacity) {
  ChunkLayout l({512, 512}, {false, false}, 1024);
  cr_assert_eq(l.chunks().size(), 1u);
  cr_assert_float_eq(l.fill_ratio(), 1.0, 1e-12);
  ChunkLayout half({256}, {false}, 512);
  cr_assert_float_eq(half.fill_ratio(), 0.5, 1e-12);
}

Test(layout, exact_fit_and_zero_sized_parameters) {
  ChunkLayout l({1024, 0, 1024}, {false, false, false}, 1024);
  cr_assert_eq(l.chunks().size(), 2u);
  cr_assert_eq(l.param(1).numel, 0u);
  cr_assert(!l.chunks()[0].jumbo);
}

Test(layout, rejects_unaligned_chunk_size) {
  bool threw = false;
  try {
    ChunkLayout l({1}, {false}, 1000);
  } catch (const pstar::Error& e) {
    threw = e.status() == PSTAR_ERR_INVALID_ARGUMENT;
  }
  cr_assert(threw);
}

// ---------------------------------------------------------------------------
// search_chunk_elems (chunk/size_search.h)

namespace {

using pstar::chunk::search_chunk_elems;

uint64_t cost_at(const std::vector<uint64_t>& numels, const std::vector<bool>& frozen, uint64_t chunk,
                     uint64_t align) {
  return pstar::chunk::search_cost(ChunkLayout(numels, frozen, chunk, align));
}

// Every multiple of `align` in [lo, hi] laid out: the search must find the
// least cost among them (its candidates provably include a size of least
// capacity of each kind, hence of least cost), and answer a size within the tie fraction of it, in range.
void check_against_every_size(const std::vector<uint64_t>& numels, const std::vector<bool>& frozen, uint64_t align,
                              uint64_t ceiling) {
  const auto range = pstar::chunk::search_range(numels, frozen, align, ceiling);
  const uint64_t lo = range.lo, hi = range.hi;
  uint64_t least = UINT64_MAX;
  for (uint64_t c = lo; c <= hi; c += align) least = std::min(least, cost_at(numels, frozen, c, align));
  const uint64_t got = search_chunk_elems(numels, frozen, align, ceiling);
  cr_assert_eq(got % align, 0u, "size %lu not a multiple of %lu", (unsigned long)got, (unsigned long)align);
  cr_assert(got >= lo && got <= hi, "size %lu outside [%lu, %lu]", (unsigned long)got, (unsigned long)lo,
            (unsigned long)hi);
  const uint64_t cap = cost_at(numels, frozen, got, align);
  cr_assert(static_cast<double>(cap) <= static_cast<double>(least) * (1.0 + pstar::chunk::kTieFraction),
            "capacity %lu at %lu, least over every size %lu", (unsigned long)cap, (unsigned long)got,
            (unsigned long)least);
  // The smallest tie: no smaller size in range is a tie too.
  for (uint64_t c = lo; c < got; c += align)
    cr_assert(static_cast<double>(cost_at(numels, frozen, c, align)) >
                  static_cast<double>(least) * (1.0 + pstar::chunk::kTieFraction),
              "a smaller tie at %lu than %lu", (unsigned long)c, (unsigned long)got);
}

}  // namespace

Test(chunk_size_search, gpt2_shape_fills_its_chunks) {
  // The parameters of bench/torch_overhead.py's GPT-2 (vocabulary 8192,
  // 128 positions, 4 layers of width 256), in registration order.
  const uint64_t h = 256;
  std::vector<uint64_t> numels{8192 * h, 128 * h};
  for (int l = 0; l < 4; ++l) {
    for (uint64_t n : {h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * 4 * h, 4 * h, 4 * h * h, h}) numels.push_back(n);
  }
  numels.push_back(h);
  numels.push_back(h);
  const std::vector<bool> frozen(numels.size(), false);
  const double fixed = ChunkLayout(numels, frozen, 1u << 22).fill_ratio();
  const uint64_t got = search_chunk_elems(numels, frozen, kAlignElems, 1u << 22);
  const double fill = ChunkLayout(numels, frozen, got).fill_ratio();
  // The fixed 2^22 fills 63%; the searched size more than 99%.
  cr_assert(fixed < 0.64, "fill %f at 2^22", fixed);
  cr_assert(fill > 0.99, "fill %f at %lu", fill, (unsigned long)got);
  check_against_every_size(numels, frozen, kAlignElems, 1u << 22);
}

Test(chunk_size_search, least_capacity_over_every_size) {
  // Pseudo-random models, some with frozen parameters (packed apart), in
  // the layout's alignment and the int8 block's.
  uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x >> 33;
  };
  for (int model = 0; model < 24; ++model) {
    const size_t n = 1 + next() % 40;
    std::vector<uint64_t> numels;
    std::vector<bool> frozen;
    for (size_t i = 0; i < n; ++i) {
      numels.push_back(next() % 4 == 0 ? next() % 200 : next() % 9000);
      frozen.push_back(model % 3 == 0 && next() % 2 == 0);
    }
    check_against_every_size(numels, frozen, kAlignElems, 16384);
    check_against_every_size(numels, frozen, 256, 16384);  // PSTAR_STATE_INT8_BLOCK
  }
}

Test(chunk_size_search, bounds) {
  // No parameter: the smallest size.
  cr_assert_eq(search_chunk_elems({}, {}, kAlignElems, 1u << 22), kAlignElems);
  // Many small parameters: not below a quarter of the ceiling.
  const std::vector<uint64_t> small(100000, 100);
  cr_assert_geq(search_chunk_elems(small, std::vector<bool>(small.size(), false), kAlignElems, 1u << 20),
                (1u << 20) / 4);
  // A model smaller than that: one chunk per kind, of the larger kind.
  const std::vector<uint64_t> tiny{90000, 300, 6000};
  const uint64_t one = search_chunk_elems(tiny, {false, false, true}, kAlignElems, 1u << 22);
  cr_assert_eq(one, 90112u + 384u);
  cr_assert_eq(ChunkLayout(tiny, {false, false, true}, one).chunks().size(), 2u);
  // A parameter above the ceiling: the chunks grow to it, so that it is
  // not a jumbo chunk of its own.
  const std::vector<uint64_t> big{100, 5000000, 100};
  const uint64_t got = search_chunk_elems(big, std::vector<bool>(3, false), kAlignElems, 1u << 22);
  cr_assert_geq(got, 5000000u);
  cr_assert_eq(ChunkLayout(big, std::vector<bool>(3, false), got).jumbo_chunk_count(), 0u);
}
