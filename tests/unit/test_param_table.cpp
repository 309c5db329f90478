// The parameter table (src/chunk/param_table.h) on its own: registration
// validates names, shapes and flags and counts elements; lookups by name
// and by id refuse what is not there; every state change goes through the
// transition table and names the parameter when it is refused.
#include <criterion/criterion.h>

#include <cstdint>
#include <string>

#include "chunk/param_table.h"
#include "util/error.h"

using pstar::Error;
using pstar::chunk::ParamTable;
using pstar::chunk::TensorEvent;
using pstar::chunk::TensorState;

// The status of what `f` throws (PSTAR_OK when it throws nothing).
template <typename F>
static pstar_status status_of(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message != nullptr) *message = e.what();
    return e.status();
  }
  return PSTAR_OK;
}

Test(param_table, registration_counts_elements_and_keeps_the_order) {
  ParamTable t;
  const int64_t w[2] = {3, 4};
  const int64_t b[1] = {4};
  cr_assert_eq(t.add("w", 2, w, 0), 0u);
  cr_assert_eq(t.add("b", 1, b, PSTAR_PARAM_NO_WEIGHT_DECAY), 1u);
  cr_assert_eq(t.add("scalar", 0, nullptr, PSTAR_PARAM_FROZEN), 2u);
  cr_assert_eq(t.size(), 3u);
  cr_assert_eq(t[0].numel, 12u);
  cr_assert_eq(t[0].shape.size(), 2u);
  cr_assert(t[0].weight_decay);
  cr_assert_not(t[1].weight_decay);  // the flag sets the parameter group's default
  cr_assert_eq(t[2].numel, 1u);      // no dimensions: one element
  cr_assert(t[2].frozen());
  cr_assert_eq(t[2].state, TensorState::kFree);
  cr_assert_eq(t.find("b"), 1u);
}

Test(param_table, registration_refuses_bad_input_and_changes_nothing) {
  ParamTable t;
  const int64_t ok[1] = {2};
  const int64_t negative[2] = {2, -1};
  const int64_t huge[2] = {int64_t{1} << 30, int64_t{1} << 30};
  t.add("a", 1, ok, 0);
  std::string why;
  cr_assert_eq(status_of([&] { t.add("a", 1, ok, 0); }, &why), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert(why.find("'a' exists") != std::string::npos, "%s", why.c_str());
  cr_assert_eq(status_of([&] { t.add("", 1, ok, 0); }), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert_eq(status_of([&] { t.add(nullptr, 1, ok, 0); }), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert_eq(status_of([&] { t.add("n", 2, negative, 0); }, &why), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert(why.find("extent 1") != std::string::npos, "%s", why.c_str());
  cr_assert_eq(status_of([&] { t.add("h", 2, huge, 0); }), PSTAR_ERR_INVALID_ARGUMENT);  // 2^60 > 2^48
  cr_assert_eq(status_of([&] { t.add("s", 1, nullptr, 0); }), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert_eq(status_of([&] { t.add("d", pstar::chunk::kMaxNdim + 1, ok, 0); }), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert_eq(status_of([&] { t.add("f", 1, ok, 1u << 7); }), PSTAR_ERR_INVALID_ARGUMENT);
  cr_assert_eq(t.size(), 1u);
  cr_assert_eq(status_of([&] { t.find("n"); }), PSTAR_ERR_NOT_FOUND);
}

Test(param_table, lookups_refuse_what_is_not_registered) {
  ParamTable t;
  const int64_t s[1] = {5};
  t.add("x", 1, s, 0);
  cr_assert_eq(&t.checked(0), &t[0]);
  std::string why;
  cr_assert_eq(status_of([&] { t.checked(1); }, &why), PSTAR_ERR_NOT_FOUND);
  cr_assert(why.find("1 registered") != std::string::npos, "%s", why.c_str());
  cr_assert_eq(status_of([&] { t.find("y"); }), PSTAR_ERR_NOT_FOUND);
  cr_assert_eq(status_of([&] { t.find(nullptr); }), PSTAR_ERR_INVALID_ARGUMENT);
}

Test(param_table, transitions_follow_the_table_and_name_the_parameter) {
  ParamTable t;
  const int64_t s[1] = {5};
  t.add("x", 1, s, 0);
  std::string why;
  // Not built yet: no acquire.
  cr_assert_eq(status_of([&] { t.apply(0, TensorEvent::kAcquireForward); }, &why), PSTAR_ERR_INVALID_STATE);
  cr_assert(why.find("'x'") != std::string::npos, "%s", why.c_str());
  cr_assert_eq(t[0].state, TensorState::kFree);  // a refused event changes nothing
  t.apply(0, TensorEvent::kBuild);
  cr_assert_eq(t[0].state, TensorState::kHold);
  cr_assert_eq(t.next_state(0, TensorEvent::kAcquireForward), TensorState::kCompute);
  cr_assert_eq(t[0].state, TensorState::kHold);  // next_state only looks
  t.apply(0, TensorEvent::kAcquireForward);
  cr_assert_eq(status_of([&] { t.require_none_acquired("step"); }, &why), PSTAR_ERR_INVALID_STATE);
  cr_assert(why.find("step: parameter 0 ('x') is still acquired") != std::string::npos, "%s", why.c_str());
  t.apply(0, TensorEvent::kReleaseForward);
  cr_assert_eq(status_of([&] { t.require_none_acquired("step"); }), PSTAR_OK);
}
