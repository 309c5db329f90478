// The AVX2 + F16C path of the host gradient operations (host_kernels.h).
//
// Same bits as the scalar path: the conversions are those of util/dtype.h
// (util/convert_avx2.h), and the norm does the scalar path's additions in
// its order, sixteen lanes of the kNormLanes side by side: for each group
// of sixteen lanes, four vectors of fp64 partials walk down the block's
// rows (lane t of row r is value r * kNormLanes + t), then the tree adds
// the lanes four at a time while four or more remain.  Every product and
// sum is its own rounding (the project builds with -ffp-contract=off, so
// no multiply and add are fused).  Functions carry target attributes
// instead of the file being built with -mavx2 (see optim/adam_avx2.cpp).
#include "memory/host_kernels.h"

#include "memory/device.h"
#include "util/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "util/convert_avx2.h"

namespace pstar::memory::detail {
namespace {

constexpr size_t kGroupLanes = 16;  // lanes per group: four vectors of four doubles
static_assert(kNormLanes % kGroupLanes == 0, "lane groups tile the lanes");

// Eight gradient values of dtype D from src + i, exactly, as fp32.
template <pstar_dtype D>
PSTAR_AVX2 __m256 load8_as_f32(const void* src, size_t i) {
  if (D == PSTAR_DTYPE_F32) return _mm256_loadu_ps(static_cast<const float*>(src) + i);
  if (D == PSTAR_DTYPE_F16) return simd::load_f16x8(static_cast<const uint16_t*>(src) + i);
  return simd::load_bf16x8(static_cast<const uint16_t*>(src) + i);
}

// Where a block's fp32 sums come from.  AccSource: an fp32 accumulator
// (the finalize, the norm).  PackSource<D>: the one contribution of a
// packed gradient, in dtype D, as the sum +0 + src[i] that accumulating it
// onto zero would have stored (host_grad_pack).
struct AccSource {
  const float* acc;
  PSTAR_AVX2 void load16(size_t i, __m256& x0, __m256& x1) const {
    x0 = _mm256_loadu_ps(acc + i);
    x1 = _mm256_loadu_ps(acc + i + 8);
  }
  float at(size_t i) const { return acc[i]; }
  AccSource offset(size_t b) const { return {acc + b}; }
};

template <pstar_dtype D>
struct PackSource {
  const void* src;
  PSTAR_AVX2 __m256 load8(size_t i) const { return _mm256_add_ps(_mm256_setzero_ps(), load8_as_f32<D>(src, i)); }
  PSTAR_AVX2 void load16(size_t i, __m256& x0, __m256& x1) const {
    x0 = load8(i);
    x1 = load8(i + 8);
  }
  float at(size_t i) const { return 0.0f + load_as(src, D, i); }
  PackSource offset(size_t b) const { return {static_cast<const char*>(src) + b * dtype_size(D)}; }
};

// A vector stored at p: with Nt, around the cache (non-temporal; p is
// aligned to the vector), otherwise a plain unaligned store.
template <bool Nt>
PSTAR_AVX2 void store(float* p, __m256 v) {
  Nt ? _mm256_stream_ps(p, v) : _mm256_storeu_ps(p, v);
}
template <bool Nt>
PSTAR_AVX2 void store(__m128i* p, __m128i v) {
  Nt ? _mm_stream_si128(p, v) : _mm_storeu_si128(p, v);
}
template <bool Nt>
PSTAR_AVX2 void store(__m256i* p, __m256i v) {
  Nt ? _mm256_stream_si256(p, v) : _mm256_storeu_si256(p, v);
}

// Sixteen values from `from` rounded through dtype D, stored into `slot`
// (unless it is null), returned as fp32 in g0 (first eight) and g1.
// Nt: the slot is 32-byte aligned and large; its stores bypass the cache
// (non-temporal), so that writing it does not first read it from memory.
template <pstar_dtype D, bool Nt, typename Source>
PSTAR_AVX2 void round16(const Source& from, void* slot, size_t i, __m256& g0, __m256& g1) {
  __m256 x0, x1;
  from.load16(i, x0, x1);
  if (D == PSTAR_DTYPE_F32) {
    if (slot != nullptr) {
      float* s = static_cast<float*>(slot) + i;
      store<Nt>(s, x0);
      store<Nt>(s + 8, x1);
    }
    g0 = x0;
    g1 = x1;
  } else if (D == PSTAR_DTYPE_F16) {
    const __m128i h0 = simd::f16_pack8(x0), h1 = simd::f16_pack8(x1);
    __m128i* s = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(slot) + i);
    store<Nt>(s, h0);
    store<Nt>(s + 1, h1);
    g0 = _mm256_cvtph_ps(h0);
    g1 = _mm256_cvtph_ps(h1);
  } else {
    __m256i ha, hb;
    simd::bf16_round_hi16(x0, x1, ha, hb);
    // The rounded value as fp32 is its high half with the low bits cleared.
    const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    g0 = _mm256_castsi256_ps(_mm256_and_si256(ha, hi_mask));
    g1 = _mm256_castsi256_ps(_mm256_and_si256(hb, hi_mask));
    store<Nt>(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(slot) + i), simd::bf16_pack_hi16(ha, hb));
  }
}

PSTAR_AVX2 __m256d square_add(__m256d sum, __m128 g) {
  const __m256d d = _mm256_cvtps_pd(g);
  return _mm256_add_pd(sum, _mm256_mul_pd(d, d));
}

// Sixteen values from i on (rounded through D into the slot) squared into
// sixteen lanes' partials.
template <pstar_dtype D, bool Nt, typename Source>
PSTAR_AVX2 void add_group(const Source& from, void* slot, size_t i, double* lanes) {
  __m256 g0, g1;
  round16<D, Nt>(from, slot, i, g0, g1);
  _mm256_store_pd(lanes, square_add(_mm256_load_pd(lanes), _mm256_castps256_ps128(g0)));
  _mm256_store_pd(lanes + 4, square_add(_mm256_load_pd(lanes + 4), _mm256_extractf128_ps(g0, 1)));
  _mm256_store_pd(lanes + 8, square_add(_mm256_load_pd(lanes + 8), _mm256_castps256_ps128(g1)));
  _mm256_store_pd(lanes + 12, square_add(_mm256_load_pd(lanes + 12), _mm256_extractf128_ps(g1, 1)));
}

// One block of n <= kNormBlockElems values (host_kernels.h's order).  The
// block is read row by row (kNormLanes values each), in memory order, so
// that the gradient and the slot stream through the cache; each lane's
// partial lives in `lanes` (in L1) and takes its rows in order, so the sums
// are those of the lane order whichever way the loops run.  Reading by
// lane group (a column of rows at a time, 1 KiB apart) made the finalize
// memory-latency bound: as much CPU time as the Adam update in
// pstar-bench overlap's backward.
template <pstar_dtype D, bool Nt, typename Source>
__attribute__((target("avx2,fma,f16c"))) double block_sumsq(const Source& from, void* slot, size_t n) {
  alignas(32) double lanes[kNormLanes];
  for (size_t t = 0; t < kNormLanes; t += 4) _mm256_store_pd(lanes + t, _mm256_setzero_pd());
  const size_t rows = n / kNormLanes, rem = n % kNormLanes;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t t0 = 0; t0 < kNormLanes; t0 += kGroupLanes)
      add_group<D, Nt>(from, slot, r * kNormLanes + t0, lanes + t0);
  }
  // The last, partial row: whole groups, then lane by lane.
  size_t t = 0;
  for (; t + kGroupLanes <= rem; t += kGroupLanes) add_group<D, Nt>(from, slot, rows * kNormLanes + t, lanes + t);
  for (; t < rem; ++t) {
    const size_t i = rows * kNormLanes + t;
    const float x = from.at(i);
    double g = x;
    if (D != PSTAR_DTYPE_F32 || slot != nullptr) {
      store_as(slot, D, i, x);
      g = load_as(slot, D, i);
    }
    lanes[t] += g * g;
  }
  size_t w = kNormLanes / 2;
  for (; w >= 4; w /= 2) {
    for (size_t u = 0; u < w; u += 4) {
      _mm256_store_pd(lanes + u, _mm256_add_pd(_mm256_load_pd(lanes + u), _mm256_load_pd(lanes + u + w)));
    }
  }
  for (; w > 0; w /= 2) {
    for (size_t u = 0; u < w; ++u) lanes[u] += lanes[u + w];
  }
  return lanes[0];
}

template <pstar_dtype D, bool Nt, typename Source>
double sumsq_blocks(const Source& from, void* slot, size_t n) {
  double total = 0.0;
  for (size_t b = 0; b < n; b += kNormBlockElems) {
    const size_t len = n - b < kNormBlockElems ? n - b : kNormBlockElems;
    void* block_slot = slot == nullptr ? nullptr : static_cast<char*>(slot) + b * dtype_size(D);
    total += block_sumsq<D, Nt>(from.offset(b), block_slot, len);
  }
  return total;
}

// Slots of at least this many bytes are written with non-temporal stores
// (when 32-byte aligned, as a chunk's parameters are): a gradient of this
// size is not read again before it leaves the cache, and a cached store
// would first read each line from memory, a third more traffic on the
// memory PyTorch's threads compute from.  Below it, the slot stays cached.
constexpr size_t kNtSlotBytes = size_t{32} << 10;

template <pstar_dtype D, typename Source>
double sumsq(const Source& from, void* slot, size_t n) {
  if (slot != nullptr && n * dtype_size(D) >= kNtSlotBytes && reinterpret_cast<uintptr_t>(slot) % 32 == 0) {
    const double total = sumsq_blocks<D, true>(from, slot, n);
    _mm_sfence();  // the stores are visible before whatever reads the slot next is signalled
    return total;
  }
  return sumsq_blocks<D, false>(from, slot, n);
}

// acc += src, or with OntoZero acc = +0 + src without reading acc (the same
// bits as zeroing first).
template <pstar_dtype D, bool OntoZero>
__attribute__((target("avx2,fma,f16c"))) void accumulate(float* acc, const void* src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = load8_as_f32<D>(src, i);
    const __m256 sum = OntoZero ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + i);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(sum, g));
  }
  for (; i < n; ++i) acc[i] = (OntoZero ? 0.0f : acc[i]) + load_as(src, D, i);
}

template <bool OntoZero>
void accumulate_as(float* acc, const void* src, pstar_dtype src_dtype, size_t n) {
  switch (src_dtype) {
    case PSTAR_DTYPE_F32: accumulate<PSTAR_DTYPE_F32, OntoZero>(acc, src, n); return;
    case PSTAR_DTYPE_F16: accumulate<PSTAR_DTYPE_F16, OntoZero>(acc, src, n); return;
    default: accumulate<PSTAR_DTYPE_BF16, OntoZero>(acc, src, n); return;  // as load_as() treats every other value
  }
}

}  // namespace

void grad_accumulate_avx2(float* acc, const void* src, pstar_dtype src_dtype, size_t n, bool onto_zero) {
  if (onto_zero) {
    accumulate_as<true>(acc, src, src_dtype, n);
  } else {
    accumulate_as<false>(acc, src, src_dtype, n);
  }
}

void grad_finalize_avx2(const float* acc, void* slot, pstar_dtype dtype, size_t n, double* out) {
  const AccSource from{acc};
  switch (dtype) {
    case PSTAR_DTYPE_F32: *out = sumsq<PSTAR_DTYPE_F32>(from, slot, n); return;
    case PSTAR_DTYPE_F16: *out = sumsq<PSTAR_DTYPE_F16>(from, slot, n); return;
    default: *out = sumsq<PSTAR_DTYPE_BF16>(from, slot, n); return;
  }
}

void grad_pack_avx2(void* packed, const void* src, pstar_dtype dtype, size_t n, double* out) {
  switch (dtype) {
    case PSTAR_DTYPE_F32: *out = sumsq<PSTAR_DTYPE_F32>(PackSource<PSTAR_DTYPE_F32>{src}, packed, n); return;
    case PSTAR_DTYPE_F16: *out = sumsq<PSTAR_DTYPE_F16>(PackSource<PSTAR_DTYPE_F16>{src}, packed, n); return;
    default: *out = sumsq<PSTAR_DTYPE_BF16>(PackSource<PSTAR_DTYPE_BF16>{src}, packed, n); return;
  }
}

}  // namespace pstar::memory::detail

#else  // not x86: never selected (host_kernel_isa_supported says no)

namespace pstar::memory::detail {
void grad_accumulate_avx2(float*, const void*, pstar_dtype, size_t, bool) {}
void grad_finalize_avx2(const float*, void*, pstar_dtype, size_t, double* out) { *out = 0.0; }
void grad_pack_avx2(void*, const void*, pstar_dtype, size_t, double* out) { *out = 0.0; }
}  // namespace pstar::memory::detail

#endif
