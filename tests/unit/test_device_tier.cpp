#include <criterion/criterion.h>

#include <cstdint>
#include <string>

#include "memory/device_tier.h"
#include "util/error.h"

using pstar::memory::DeviceTier;
using Use = DeviceTier::Use;

namespace {
// Runs f and returns the status it threw (PSTAR_OK when it did not).
template <class F>
pstar_status status_of(F&& f) {
  try {
    f();
  } catch (const pstar::Error& e) {
    return e.status();
  }
  return PSTAR_OK;
}
}  // namespace

Test(device_tier, uses_add_up_to_used) {
  DeviceTier t(1000);
  t.add(Use::kChunks, 300);
  t.add(Use::kGradients, 200);
  t.set_nonmodel(100);
  cr_assert_eq(t.used(), 600u);
  cr_assert_eq(t.free_bytes(), 400u);
  cr_assert(t.fits(400));
  cr_assert(!t.fits(401));
  t.set_nonmodel(50);  // a level, not a delta
  cr_assert_eq(t.used(), 550u);
  cr_assert_eq(t.bytes(Use::kNonModel), 50u);
}

Test(device_tier, deferred_bytes_stay_used_until_removed) {
  DeviceTier t(1000);
  t.add(Use::kChunks, 500);
  t.move(Use::kChunks, Use::kDeferred, 500);
  cr_assert_eq(t.bytes(Use::kChunks), 0u);
  cr_assert_eq(t.bytes(Use::kDeferred), 500u);
  cr_assert_eq(t.used(), 500u);
  t.remove(Use::kDeferred, 500);
  cr_assert_eq(t.used(), 0u);
}

Test(device_tier, over_capacity_and_unlimited) {
  DeviceTier t(100);
  t.set_nonmodel(150);  // the caller's memory is real even above capacity
  cr_assert(t.over_capacity());
  cr_assert_eq(t.free_bytes(), 0u);
  cr_assert(!t.fits(0));
  DeviceTier u(0);
  u.add(Use::kOptimizer, UINT64_C(1) << 40);
  cr_assert(!u.limited());
  cr_assert(!u.over_capacity());
  cr_assert(u.fits(UINT64_C(1) << 50));
  cr_assert_eq(u.free_bytes(), UINT64_MAX);
}

Test(device_tier, removing_more_than_a_use_holds_is_an_internal_error) {
  DeviceTier t(0);
  t.add(Use::kGradients, 10);
  cr_assert_eq(status_of([&] { t.remove(Use::kGradients, 11); }), PSTAR_ERR_INTERNAL);
  cr_assert_eq(status_of([&] { t.move(Use::kChunks, Use::kDeferred, 1); }), PSTAR_ERR_INTERNAL);
  cr_assert_eq(t.used(), 10u);  // a refused change changes nothing
  cr_assert_eq(t.bytes(Use::kGradients), 10u);
}

Test(device_tier, describe_names_the_uses) {
  DeviceTier t(0);
  t.add(Use::kChunks, 7);
  const std::string d = t.describe();
  cr_assert(d.find("chunks 7 bytes") != std::string::npos, "%s", d.c_str());
  cr_assert(d.find("non-model 0 bytes") != std::string::npos, "%s", d.c_str());
  cr_assert(d.find("buffers being freed") == std::string::npos, "%s", d.c_str());  // transient, absent
}
