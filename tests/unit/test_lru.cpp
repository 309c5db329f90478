#include <criterion/criterion.h>

#include "placement/lru_policy.h"

using pstar::placement::LruPolicy;

Test(lru, chooses_least_recently_used_movable_chunk) {
  LruPolicy lru;
  lru.touch(1, 10);
  lru.touch(2, 11);
  lru.touch(3, 12);
  uint32_t v = 99;
  cr_assert(lru.victim([](uint32_t) { return true; }, &v));
  cr_assert_eq(v, 1u);
  lru.touch(1, 13);
  cr_assert(lru.victim([](uint32_t) { return true; }, &v));
  cr_assert_eq(v, 2u);
  cr_assert(lru.victim([](uint32_t k) { return k != 2; }, &v));
  cr_assert_eq(v, 3u);
  lru.remove(3);
  cr_assert_eq(lru.size(), 2u);
  cr_assert(!lru.victim([](uint32_t) { return false; }, &v));
}
