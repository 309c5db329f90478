#include "state_streams.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PSTAR_STATES_X86 1
#else
#define PSTAR_STATES_X86 0
#endif

namespace pstar::bench {

namespace {

inline float upper(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

inline uint16_t upper_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return static_cast<uint16_t>(b >> 16);
}

// ---- scalar ---------------------------------------------------------------------

__attribute__((noinline)) void bf16_scalar(uint16_t* slot, float* p, uint16_t* m, uint16_t* v, size_t n, float k0,
                                           float k1) {
  for (size_t i = 0; i < n; ++i) {
    const float g = upper(slot[i]);
    const float np = p[i] + k0 * g;
    p[i] = np;
    m[i] = upper_of(k1 * upper(m[i]) + g);
    v[i] = upper_of(k1 * upper(v[i]) + g * g);
    slot[i] = upper_of(np);
  }
}

__attribute__((noinline)) void int8_scalar(uint16_t* slot, float* p, uint8_t* m, uint8_t* v, size_t n, float k0) {
  for (size_t i = 0; i < n; ++i) {
    const float np = p[i] + k0 * upper(slot[i]);
    p[i] = np;
    slot[i] = upper_of(np);
    m[i] = static_cast<uint8_t>(m[i] + 1);
    v[i] = static_cast<uint8_t>(v[i] + 1);
  }
}

#if PSTAR_STATES_X86
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define PSTAR_S_AVX2 __attribute__((target("avx2,fma,f16c"), noinline))
#define PSTAR_S_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline
#define PSTAR_S_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), noinline))
#define PSTAR_S_AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline)) inline

// ---- AVX2: 16 elements per iteration ----------------------------------------

PSTAR_S_AVX2_INLINE __m256 widen8(const uint16_t* s) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))), 16));
}

PSTAR_S_AVX2_INLINE void store_upper16(uint16_t* d, __m256 a, __m256 b) {
  const __m256i h0 = _mm256_srli_epi32(_mm256_castps_si256(a), 16);
  const __m256i h1 = _mm256_srli_epi32(_mm256_castps_si256(b), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm256_permute4x64_epi64(_mm256_packus_epi32(h0, h1), 0xd8));
}

template <bool kPrefetch>
PSTAR_S_AVX2 void bf16_avx2(uint16_t* slot, float* p, uint16_t* m, uint16_t* v, size_t n, float k0, float k1) {
  const __m256 vk0 = _mm256_set1_ps(k0), vk1 = _mm256_set1_ps(k1);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if constexpr (kPrefetch) prefetch_rmw(slot, p, m, v, i, 16, n);
    const __m256 g0 = widen8(slot + i), g1 = widen8(slot + i + 8);
    const __m256 p0 = _mm256_fmadd_ps(vk0, g0, _mm256_loadu_ps(p + i));
    const __m256 p1 = _mm256_fmadd_ps(vk0, g1, _mm256_loadu_ps(p + i + 8));
    const __m256 m0 = _mm256_fmadd_ps(vk1, widen8(m + i), g0), m1 = _mm256_fmadd_ps(vk1, widen8(m + i + 8), g1);
    const __m256 v0 = _mm256_fmadd_ps(vk1, widen8(v + i), _mm256_mul_ps(g0, g0));
    const __m256 v1 = _mm256_fmadd_ps(vk1, widen8(v + i + 8), _mm256_mul_ps(g1, g1));
    _mm256_storeu_ps(p + i, p0);
    _mm256_storeu_ps(p + i + 8, p1);
    store_upper16(m + i, m0, m1);
    store_upper16(v + i, v0, v1);
    store_upper16(slot + i, p0, p1);
  }
  if (i < n) bf16_scalar(slot + i, p + i, m + i, v + i, n - i, k0, k1);
}

// `end`: the elements from this block to the end of the range (the limit
// of the prefetch).
template <bool kPrefetch>
PSTAR_S_AVX2 void int8_avx2(uint16_t* slot, float* p, uint8_t* m, uint8_t* v, size_t n, float k0, size_t end) {
  const __m256 vk0 = _mm256_set1_ps(k0);
  const __m256i one = _mm256_set1_epi8(1);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if constexpr (kPrefetch) prefetch_rmw(slot, p, m, v, i, 32, end);
    for (size_t j = i; j < i + 32; j += 16) {
      const __m256 p0 = _mm256_fmadd_ps(vk0, widen8(slot + j), _mm256_loadu_ps(p + j));
      const __m256 p1 = _mm256_fmadd_ps(vk0, widen8(slot + j + 8), _mm256_loadu_ps(p + j + 8));
      _mm256_storeu_ps(p + j, p0);
      _mm256_storeu_ps(p + j + 8, p1);
      store_upper16(slot + j, p0, p1);
    }
    __m256i* mv = reinterpret_cast<__m256i*>(m + i);
    __m256i* vv = reinterpret_cast<__m256i*>(v + i);
    _mm256_storeu_si256(mv, _mm256_add_epi8(_mm256_loadu_si256(mv), one));
    _mm256_storeu_si256(vv, _mm256_add_epi8(_mm256_loadu_si256(vv), one));
  }
  if (i < n) int8_scalar(slot + i, p + i, m + i, v + i, n - i, k0);
}

// ---- AVX-512: 32 elements per step (64 code bytes per two steps) --------------

PSTAR_S_AVX512_INLINE __m512 widen16(const uint16_t* s) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s))), 16));
}

PSTAR_S_AVX512_INLINE void store_upper(uint16_t* d, __m512 a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(a), 16)));
}

template <bool kPrefetch>
PSTAR_S_AVX512 void bf16_avx512(uint16_t* slot, float* p, uint16_t* m, uint16_t* v, size_t n, float k0, float k1) {
  const __m512 vk0 = _mm512_set1_ps(k0), vk1 = _mm512_set1_ps(k1);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if constexpr (kPrefetch) prefetch_rmw(slot, p, m, v, i, 32, n);
    for (size_t j = i; j < i + 32; j += 16) {
      const __m512 g = widen16(slot + j);
      const __m512 np = _mm512_fmadd_ps(vk0, g, _mm512_loadu_ps(p + j));
      _mm512_storeu_ps(p + j, np);
      store_upper(m + j, _mm512_fmadd_ps(vk1, widen16(m + j), g));
      store_upper(v + j, _mm512_fmadd_ps(vk1, widen16(v + j), _mm512_mul_ps(g, g)));
      store_upper(slot + j, np);
    }
  }
  if (i < n) bf16_scalar(slot + i, p + i, m + i, v + i, n - i, k0, k1);
}

// `end`: the elements from this block to the end of the range (the limit
// of the prefetch).
template <bool kPrefetch>
PSTAR_S_AVX512 void int8_avx512(uint16_t* slot, float* p, uint8_t* m, uint8_t* v, size_t n, float k0, size_t end) {
  const __m512 vk0 = _mm512_set1_ps(k0);
  const __m512i one = _mm512_set1_epi8(1);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    if constexpr (kPrefetch) prefetch_rmw(slot, p, m, v, i, 64, end);
    for (size_t j = i; j < i + 64; j += 16) {
      const __m512 np = _mm512_fmadd_ps(vk0, widen16(slot + j), _mm512_loadu_ps(p + j));
      _mm512_storeu_ps(p + j, np);
      store_upper(slot + j, np);
    }
    _mm512_storeu_si512(m + i, _mm512_add_epi8(_mm512_loadu_si512(m + i), one));
    _mm512_storeu_si512(v + i, _mm512_add_epi8(_mm512_loadu_si512(v + i), one));
  }
  if (i < n) int8_scalar(slot + i, p + i, m + i, v + i, n - i, k0);
}
#pragma GCC diagnostic pop
#endif  // PSTAR_STATES_X86

}  // namespace

void rmw_stream_bf16(StreamIsa isa, uint16_t* slot, float* master, uint16_t* m, uint16_t* v, size_t n, float k0,
                     float k1, StreamPrefetch pf) {
  const bool on = pf == StreamPrefetch::kOn;
  switch (isa) {
#if PSTAR_STATES_X86
    case StreamIsa::kAvx512:
      return on ? bf16_avx512<true>(slot, master, m, v, n, k0, k1) : bf16_avx512<false>(slot, master, m, v, n, k0, k1);
    case StreamIsa::kAvx2:
      return on ? bf16_avx2<true>(slot, master, m, v, n, k0, k1) : bf16_avx2<false>(slot, master, m, v, n, k0, k1);
#endif
    default: return bf16_scalar(slot, master, m, v, n, k0, k1);
  }
}

void rmw_stream_int8(StreamIsa isa, uint16_t* slot, float* master, uint8_t* m, uint8_t* v, float* m_absmax,
                     float* v_absmax, size_t n, float k0, float k1, StreamPrefetch pf) {
  // Block by block, as the kernel walks them: the block's elements, then
  // its two absmax floats.
  constexpr size_t kBlock = 256;
  const bool on = pf == StreamPrefetch::kOn;
  for (size_t b = 0; b * kBlock < n; ++b) {
    const size_t off = b * kBlock, nb = n - off < kBlock ? n - off : kBlock;
    uint16_t* const s = slot + off;
    float* const p = master + off;
    switch (isa) {
#if PSTAR_STATES_X86
      case StreamIsa::kAvx512:
        on ? int8_avx512<true>(s, p, m + off, v + off, nb, k0, n - off)
           : int8_avx512<false>(s, p, m + off, v + off, nb, k0, n - off);
        break;
      case StreamIsa::kAvx2:
        on ? int8_avx2<true>(s, p, m + off, v + off, nb, k0, n - off)
           : int8_avx2<false>(s, p, m + off, v + off, nb, k0, n - off);
        break;
#endif
      default: int8_scalar(s, p, m + off, v + off, nb, k0); break;
    }
    m_absmax[b] *= k1;
    v_absmax[b] *= k1;
  }
}

}  // namespace pstar::bench
