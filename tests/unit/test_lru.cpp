#include <criterion/criterion.h>

#include "placement/lru_policy.h"

using pstar::placement::LruPolicy;

Test(lru, chooses_least_recently_used_movable_chunk) {
  LruPolicy lru;
  lru.touch(1);
  lru.touch(2);
  lru.touch(3);
  uint32_t v = 99;
  cr_assert(lru.victim([](uint32_t) { return true; }, &v));
  cr_assert_eq(v, 1u);
  lru.touch(1);
  cr_assert(lru.victim([](uint32_t) { return true; }, &v));
  cr_assert_eq(v, 2u);
  cr_assert(lru.victim([](uint32_t k) { return k != 2; }, &v));
  cr_assert_eq(v, 3u);
  lru.remove(3);
  cr_assert_eq(lru.size(), 2u);
  cr_assert(!lru.victim([](uint32_t) { return false; }, &v));
}

Test(lru, touch_of_the_newest_and_remove_of_absent_chunks) {
  LruPolicy lru;
  lru.remove(5);  // never seen: nothing happens
  lru.touch(4);
  lru.touch(4);
  cr_assert_eq(lru.size(), 1u);
  lru.touch(0);
  lru.remove(4);
  uint32_t v = 99;
  cr_assert(lru.victim([](uint32_t) { return true; }, &v));
  cr_assert_eq(v, 0u);
  lru.remove(0);
  cr_assert_eq(lru.size(), 0u);
  cr_assert(!lru.victim([](uint32_t) { return true; }, &v));
}
