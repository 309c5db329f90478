// Checks exact_div_sqrt_bc2's arithmetic (optim/adam_lanes_avx512.h) against
// the divider: for every float x in [2^-75, sqrt(FLT_MAX)] (every sqrt(v)
// the int8 kernel can meet, 0 aside) and 152 divisors c = sqrt(1 - beta2^t)
// (a grid of beta2 and t, 40 random c in [2.4e-4, 1], four mantissa
// extremes), q = x * RN(1/c) corrected once by FMA equals VDIVPS's x / c
// bit for bit.  About a minute on one AVX-512 core; not part of CI.
//
//   g++ -O2 -ffp-contract=off tools/check_exact_division.cpp -o /tmp/check_exact_division
//   /tmp/check_exact_division    # exit status 0: no difference
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

__attribute__((target("avx512f,avx512dq,fma"))) uint64_t differences(float c) {
  const __m512 y = _mm512_set1_ps(1.0f / c), cc = _mm512_set1_ps(c);
  const uint32_t lo = bits_of(0x1p-75f), hi = bits_of(std::sqrt(3.4028235e38f));
  const __m512i step = _mm512_set1_epi32(16);
  __m512i bits = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(lo)),
                                  _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  uint64_t bad = 0;
  for (uint64_t b = lo; b <= hi; b += 16) {
    const __m512 x = _mm512_castsi512_ps(bits);
    const __m512 q = _mm512_mul_ps(x, y);
    const __m512 r = _mm512_fnmadd_ps(q, cc, x);
    const __m512 qc = _mm512_fmadd_ps(r, y, q);
    const __mmask16 ne = _mm512_cmpneq_epi32_mask(_mm512_castps_si512(qc), _mm512_castps_si512(_mm512_div_ps(x, cc)));
    if (ne != 0) {
      bad += static_cast<uint64_t>(__builtin_popcount(ne));
      if (bad <= 3)
        std::printf("difference: c=%a, from x=%a\n", static_cast<double>(c), static_cast<double>(_mm512_cvtss_f32(x)));
    }
    bits = _mm512_add_epi32(bits, step);
  }
  return bad;
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq")) {
    std::printf("skipped: no AVX-512 on this CPU\n");
    return 77;
  }
  std::vector<float> cs;
  for (double b2 :
       {0.0, 0.5, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999, static_cast<double>(0.99999994f)}) {
    for (double t : {1.0, 2.0, 3.0, 7.0, 10.0, 100.0, 1000.0, 12345.0, 1e6}) {
      cs.push_back(static_cast<float>(std::sqrt(1.0 - std::pow(b2, t))));
    }
  }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(2.4e-4f, 1.0f);
  for (int i = 0; i < 40; ++i) cs.push_back(u(rng));
  cs.push_back(std::nextafter(1.0f, 0.0f));
  cs.push_back(0.5f);
  cs.push_back(std::nextafter(0.5f, 1.0f));
  cs.push_back(0.75f);
  uint64_t total = 0;
  for (float c : cs) total += differences(c);
  std::printf("%zu divisors, %llu differences\n", cs.size(), static_cast<unsigned long long>(total));
  return total == 0 ? 0 : 1;
}
