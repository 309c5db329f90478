#include "stream_kernels.h"

#include <initializer_list>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cpuid.h>

// F16C from CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports
// does not know "f16c".
static bool pstar_cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
}

#define PSTAR_BENCH_X86 1
#else
#define PSTAR_BENCH_X86 0
#endif

namespace pstar::bench {

namespace {

// ---- scalar (any CPU) -------------------------------------------------------
// Both 2-byte formats are handled as the upper half of an fp32 (the bf16
// conversion): the arithmetic is trivial on purpose, only the traffic counts.
__attribute__((noinline)) void rmw_scalar(uint16_t* slot, float* p, float* m, float* v, size_t n, float k0, float k1) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(slot[i]) << 16;
    float g;
    __builtin_memcpy(&g, &bits, sizeof g);
    const float np = p[i] + k0 * g;
    p[i] = np;
    m[i] = k1 * m[i] + g;
    v[i] = k1 * v[i] + g * g;
    __builtin_memcpy(&bits, &np, sizeof bits);
    slot[i] = static_cast<uint16_t>(bits >> 16);
  }
}

__attribute__((noinline)) void triad_scalar(float* a, const float* b, const float* c, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

#if PSTAR_BENCH_X86
// ---- AVX2 + FMA + F16C -------------------------------------------------------
// The widths and order of the AVX2 Adam kernel: 16 elements per iteration,
// the 2-byte slot loaded as two 128-bit halves, each fp32 array loaded and
// stored as two 256-bit vectors (one whole cache line, stored back to back),
// the new 2-byte values stored as two 128-bit halves (fp16, F16C) or one
// 256-bit vector (bf16).
#define PSTAR_AVX2 __attribute__((target("avx2,fma,f16c"), noinline))
#define PSTAR_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

template <bool kF16>
PSTAR_AVX2_INLINE __m256 load8_avx2(const uint16_t* s) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  if constexpr (kF16) {
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <bool kF16, bool kPrefetch>
PSTAR_AVX2 void rmw_avx2(uint16_t* slot, float* p, float* m, float* v, size_t n, float k0, float k1) {
  const __m256 vk0 = _mm256_set1_ps(k0);
  const __m256 vk1 = _mm256_set1_ps(k1);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if constexpr (kPrefetch) prefetch_rmw(slot, p, m, v, i, 16, n);
    const __m256 g0 = load8_avx2<kF16>(slot + i);
    const __m256 g1 = load8_avx2<kF16>(slot + i + 8);
    const __m256 p0 = _mm256_fmadd_ps(vk0, g0, _mm256_loadu_ps(p + i));
    const __m256 p1 = _mm256_fmadd_ps(vk0, g1, _mm256_loadu_ps(p + i + 8));
    const __m256 m0 = _mm256_fmadd_ps(vk1, _mm256_loadu_ps(m + i), g0);
    const __m256 m1 = _mm256_fmadd_ps(vk1, _mm256_loadu_ps(m + i + 8), g1);
    const __m256 v0 = _mm256_fmadd_ps(vk1, _mm256_loadu_ps(v + i), _mm256_mul_ps(g0, g0));
    const __m256 v1 = _mm256_fmadd_ps(vk1, _mm256_loadu_ps(v + i + 8), _mm256_mul_ps(g1, g1));
    _mm256_storeu_ps(p + i, p0);
    _mm256_storeu_ps(p + i + 8, p1);
    _mm256_storeu_ps(m + i, m0);
    _mm256_storeu_ps(m + i + 8, m1);
    _mm256_storeu_ps(v + i, v0);
    _mm256_storeu_ps(v + i + 8, v1);
    if constexpr (kF16) {
      __m128i* s = reinterpret_cast<__m128i*>(slot + i);
      _mm_storeu_si128(s, _mm256_cvtps_ph(p0, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      _mm_storeu_si128(s + 1, _mm256_cvtps_ph(p1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      // Truncation to the upper halves (the arithmetic is trivial on purpose).
      const __m256i h0 = _mm256_srli_epi32(_mm256_castps_si256(p0), 16);
      const __m256i h1 = _mm256_srli_epi32(_mm256_castps_si256(p1), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(slot + i),
                          _mm256_permute4x64_epi64(_mm256_packus_epi32(h0, h1), 0xd8));
    }
  }
  if (i < n) rmw_scalar(slot + i, p + i, m + i, v + i, n - i, k0, k1);
}

PSTAR_AVX2 void triad_avx2(float* a, const float* b, const float* c, float s, size_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (size_t j = i; j < i + 32; j += 8) {
      _mm256_storeu_ps(a + j, _mm256_fmadd_ps(vs, _mm256_loadu_ps(c + j), _mm256_loadu_ps(b + j)));
    }
  }
  if (i < n) triad_scalar(a + i, b + i, c + i, s, n - i);
}

// ---- AVX-512 F/BW/VL: 16 elements per vector, 4 vectors per iteration ------
// GCC 12 warns that the _mm512_undefined_*() pass-through operand inside
// several of its own intrinsics "may be used uninitialized": a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define PSTAR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), noinline))
#define PSTAR_AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), always_inline)) inline

template <bool kF16>
PSTAR_AVX512_INLINE void rmw16_avx512(uint16_t* slot, float* p, float* m, float* v, size_t j, __m512 vk0, __m512 vk1) {
  const __m256i gh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(slot + j));
  __m512 g;
  if constexpr (kF16) {
    g = _mm512_cvtph_ps(gh);
  } else {
    g = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(gh), 16));
  }
  const __m512 np = _mm512_fmadd_ps(vk0, g, _mm512_loadu_ps(p + j));
  const __m512 nm = _mm512_fmadd_ps(vk1, _mm512_loadu_ps(m + j), g);
  const __m512 nv = _mm512_fmadd_ps(vk1, _mm512_loadu_ps(v + j), _mm512_mul_ps(g, g));
  _mm512_storeu_ps(p + j, np);
  _mm512_storeu_ps(m + j, nm);
  _mm512_storeu_ps(v + j, nv);
  __m256i out;
  if constexpr (kF16) {
    out = _mm512_cvtps_ph(np, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    out = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(np), 16));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(slot + j), out);
}

template <bool kF16, bool kPrefetch>
PSTAR_AVX512 void rmw_avx512(uint16_t* slot, float* p, float* m, float* v, size_t n, float k0, float k1) {
  const __m512 vk0 = _mm512_set1_ps(k0);
  const __m512 vk1 = _mm512_set1_ps(k1);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    if constexpr (kPrefetch) prefetch_rmw(slot, p, m, v, i, 64, n);
    rmw16_avx512<kF16>(slot, p, m, v, i, vk0, vk1);
    rmw16_avx512<kF16>(slot, p, m, v, i + 16, vk0, vk1);
    rmw16_avx512<kF16>(slot, p, m, v, i + 32, vk0, vk1);
    rmw16_avx512<kF16>(slot, p, m, v, i + 48, vk0, vk1);
  }
  for (; i + 16 <= n; i += 16) rmw16_avx512<kF16>(slot, p, m, v, i, vk0, vk1);
  if (i < n) rmw_scalar(slot + i, p + i, m + i, v + i, n - i, k0, k1);
}

PSTAR_AVX512 void triad_avx512(float* a, const float* b, const float* c, float s, size_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (size_t j = i; j < i + 64; j += 16) {
      _mm512_storeu_ps(a + j, _mm512_fmadd_ps(vs, _mm512_loadu_ps(c + j), _mm512_loadu_ps(b + j)));
    }
  }
  if (i < n) triad_scalar(a + i, b + i, c + i, s, n - i);
}
#pragma GCC diagnostic pop
#endif  // PSTAR_BENCH_X86

}  // namespace

bool stream_isa_supported(StreamIsa isa) {
  switch (isa) {
    case StreamIsa::kScalar: return true;
#if PSTAR_BENCH_X86
    case StreamIsa::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && pstar_cpu_has_f16c();
    case StreamIsa::kAvx512:
      __builtin_cpu_init();
      return stream_isa_supported(StreamIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    default: return false;
#endif
  }
  return false;
}

const char* stream_isa_name(StreamIsa isa) {
  switch (isa) {
    case StreamIsa::kScalar: return "scalar";
    case StreamIsa::kAvx2: return "avx2";
    case StreamIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

StreamIsa best_stream_isa() {
  for (StreamIsa isa : {StreamIsa::kAvx512, StreamIsa::kAvx2}) {
    if (stream_isa_supported(isa)) return isa;
  }
  return StreamIsa::kScalar;
}

void rmw_stream(StreamIsa isa, pstar_dtype dtype, uint16_t* slot, float* master, float* m, float* v, size_t n, float k0,
                float k1, StreamPrefetch pf) {
  const bool f16 = dtype == PSTAR_DTYPE_F16;
  const bool on = pf == StreamPrefetch::kOn;
  switch (isa) {
#if PSTAR_BENCH_X86
    case StreamIsa::kAvx512:
      if (f16)
        return on ? rmw_avx512<true, true>(slot, master, m, v, n, k0, k1)
                  : rmw_avx512<true, false>(slot, master, m, v, n, k0, k1);
      return on ? rmw_avx512<false, true>(slot, master, m, v, n, k0, k1)
                : rmw_avx512<false, false>(slot, master, m, v, n, k0, k1);
    case StreamIsa::kAvx2:
      if (f16)
        return on ? rmw_avx2<true, true>(slot, master, m, v, n, k0, k1)
                  : rmw_avx2<true, false>(slot, master, m, v, n, k0, k1);
      return on ? rmw_avx2<false, true>(slot, master, m, v, n, k0, k1)
                : rmw_avx2<false, false>(slot, master, m, v, n, k0, k1);
#endif
    default: return rmw_scalar(slot, master, m, v, n, k0, k1);
  }
}

void triad(StreamIsa isa, float* a, const float* b, const float* c, float s, size_t n) {
  switch (isa) {
#if PSTAR_BENCH_X86
    case StreamIsa::kAvx512: return triad_avx512(a, b, c, s, n);
    case StreamIsa::kAvx2: return triad_avx2(a, b, c, s, n);
#endif
    default: return triad_scalar(a, b, c, s, n);
  }
}

}  // namespace pstar::bench
