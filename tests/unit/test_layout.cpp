#include <criterion/criterion.h>

#include "chunk/layout.h"
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
