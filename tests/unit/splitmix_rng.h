// splitmix64: the unit tests' small, fixed generator (their data must not
// depend on the standard library's distributions, which differ between
// implementations).
#pragma once

#include <cmath>
#include <cstdint>

namespace pstar_test {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // In [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Standard normal (Box-Muller).
  double normal() {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) / 9007199254740993.0;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * uniform());
  }
};

}  // namespace pstar_test
