#include "optim/adam_states_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "optim/adam_cuda.h"
#include "optim/adam_states_int8.h"
#include "util/dtype.h"
#include "util/error.h"

// Bit identity with the scalar reference (optim/adam_states.cpp) rests on:
//  - adam_element(), adam_element_int8() and the dtype conversions are the same PSTAR_HD code,
//    compiled with --fmad=false -prec-div=true -prec-sqrt=true and without
//    flushing subnormals (nvcc's default -ftz=false), as adam_cuda.cu;
//  - the products and the reciprocal of the int8 format are written as
//    __fmul_rn / __fdiv_rn: one IEEE round-to-nearest operation each, never
//    contracted, whatever the flags;
//  - the block's absmax is the maximum of a set of non-negative, non-NaN
//    floats (NaN and -0 become +0 per lane first), which has one value
//    whatever the order of the comparisons;
//  - the code is counted over the host's own threshold floats (copied bit
//    for bit), with the reference's float comparisons (see code_of).

namespace pstar::optim {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads == static_cast<int>(kInt8BlockElems), "one thread per element of an int8 block");
constexpr int kWarps = kThreads / 32;
constexpr int kVector = 4;                     // bf16: elements per thread per iteration
constexpr int kBlocksPerSm = 2048 / kThreads;  // resident threads per SM on sm_80/sm_90

// ---- int8 tables ------------------------------------------------------------

// Threshold counts of the two maps (int8::Map::n_thr), checked against the
// host's maps when the tables are built.
constexpr int kSignedThr = 128;
constexpr int kUnsignedThr = 255;

// The host's maps and thresholds, bit for bit.  thr[k] for k >= n_thr is
// +inf (as in int8::Map).
struct Int8Tables {
  float sval[256];  // signed map (m)
  float uval[256];  // unsigned map (v)
  float sthr[256];
  float uthr[256];
};

__device__ Int8Tables g_tables;

Int8Tables build_host_tables() {
  const int8::Map& s = int8::signed_map();
  const int8::Map& u = int8::unsigned_map();
  if (s.n_thr != kSignedThr || u.n_thr != kUnsignedThr) {
    internal_error("CUDA int8 tables: the maps have " + std::to_string(s.n_thr) + " and " + std::to_string(u.n_thr) +
                   " thresholds, not 128 and 255");
  }
  Int8Tables t;
  const float inf = std::numeric_limits<float>::infinity();
  for (int k = 0; k < 256; ++k) {
    t.sval[k] = s.values[k];
    t.uval[k] = u.values[k];
    t.sthr[k] = k < s.n_thr ? s.thr[k] : inf;
    t.uthr[k] = k < u.n_thr ? u.thr[k] : inf;
  }
  // code_of's search needs ascending thresholds (so does the reference's:
  // both then count the thresholds at or below a).
  for (int k = 1; k < 256; ++k) {
    if (!(t.sthr[k - 1] <= t.sthr[k]) || !(t.uthr[k - 1] <= t.uthr[k])) {
      internal_error("CUDA int8 tables: thresholds not ascending");
    }
  }
  return t;
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(PSTAR_ERR_DEVICE, std::string("CUDA: ") + what + ": " + cudaGetErrorString(err));
}

// Copies the tables to the current device once per process.  The first call
// on a device queues the copy on `stream` and waits for it, so that any
// later launch on any stream of that device sees them.  (A cudaDeviceReset()
// would drop them; nothing in libpstar resets a device.)
void ensure_tables(cudaStream_t stream) {
  static const Int8Tables host = build_host_tables();  // the copy's source lives on
  static std::mutex mu;
  static std::vector<bool> ready;
  thread_local int ready_here = -1;  // the last device this thread saw ready
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device == ready_here) return;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<size_t>(device) >= ready.size()) ready.resize(static_cast<size_t>(device) + 1, false);
  if (!ready[static_cast<size_t>(device)]) {
    check_cuda(cudaMemcpyToSymbolAsync(g_tables, &host, sizeof host, 0, cudaMemcpyHostToDevice, stream),
               "copy of the int8 tables");
    check_cuda(cudaStreamSynchronize(stream), "copy of the int8 tables (synchronize)");
    ready[static_cast<size_t>(device)] = true;
  }
  ready_here = device;
}

// Every thread of the block copies its share of the tables to shared memory.
__device__ __forceinline__ void load_tables(Int8Tables& t) {
  for (int k = threadIdx.x; k < 256; k += blockDim.x) {
    t.sval[k] = g_tables.sval[k];
    t.uval[k] = g_tables.uval[k];
    t.sthr[k] = g_tables.sthr[k];
    t.uthr[k] = g_tables.uthr[k];
  }
  __syncthreads();
}

// int8::code_ref(kSigned, y) on the device.
//  - The magnitude is int8::magnitude(): |y| (sign bit cleared) for the
//    signed map, y for the unsigned one, then a > 0 ? a : 0 (NaN, -0 and,
//    unsigned, every negative become +0).  a is never NaN.
//  - The count: int8::count_below() returns the partition point of the
//    predicate a >= thr[k] over k in [0, n_thr), which is monotone because
//    thr ascends (checked in build_host_tables), i.e. the number of
//    thresholds at or below a.  Here T = thr padded with +inf to 256
//    entries is ascending too, so the predicate is monotone over [0, 255)
//    and the branchless search (steps 128, 64, ..., 1; it reads T[0..254])
//    returns its partition point p over [0, 255): the count over [0, n_thr)
//    plus the padding entries at or below a, which are 255 - n_thr when a is
//    +inf and none otherwise.  min(p, n_thr) is therefore the reference's
//    count for every a, +inf included.  The comparison is the reference's
//    (a >= thr, IEEE), on the same threshold floats.
//  - The code from the count: int8::code_from_count().
template <bool kSigned>
__host__ __device__ __forceinline__ uint8_t code_of(const float* __restrict__ thr, float y) {
  const uint32_t bits = f32_bits(y);
  const float a0 = kSigned ? f32_from_bits(bits & 0x7fffffffu) : y;
  const float a = a0 > 0.0f ? a0 : 0.0f;
  int k = 0;
#pragma unroll
  for (int step = 128; step >= 1; step >>= 1) k += a >= thr[k + step - 1] ? step : 0;
  constexpr int kThr = kSigned ? kSignedThr : kUnsignedThr;
  k = k < kThr ? k : kThr;
  if (!kSigned) return static_cast<uint8_t>(k);
  if ((bits & 0x80000000u) != 0) return static_cast<uint8_t>(127 - (k < 127 ? k : 127));
  return static_cast<uint8_t>(127 + k);
}

// A lane's share of the absmax: |x| where that is > 0 (NaN, -0 and lanes
// past the range give +0), as absmax_step() in the reference never lets NaN
// win and starts from +0.
__device__ __forceinline__ float absmax_lane(float x, bool valid) {
  const float a = fabsf(x);
  return valid && a > 0.0f ? a : 0.0f;
}

__device__ __forceinline__ float max_of(float a, float b) { return b > a ? b : a; }

__device__ __forceinline__ float warp_max(float a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = max_of(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

// The block's maximum of two lane values (every thread gets both).
// `scratch` holds 2 * kWarps floats; the caller synchronizes before reusing
// it.
__device__ __forceinline__ void block_max2(float& a, float& b, float* scratch) {
  a = warp_max(a);
  b = warp_max(b);
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    scratch[warp] = a;
    scratch[kWarps + warp] = b;
  }
  __syncthreads();
  a = scratch[0];
  b = scratch[kWarps];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) {
    a = max_of(a, scratch[w]);
    b = max_of(b, scratch[kWarps + w]);
  }
}

// The block's reciprocal scale: int8::inv_scale() with an IEEE division.
__device__ __forceinline__ float inv_scale(float absmax) { return absmax > 0.0f ? __fdiv_rn(1.0f, absmax) : 0.0f; }

// ---- int8 update ------------------------------------------------------------

struct Int8Args {
  float* master;
  const float* master_in;  // == master in place
  uint8_t* m_codes;
  float* m_absmax;
  uint8_t* v_codes;
  float* v_absmax;
  const uint8_t* m_codes_in;  // == m_codes in place; likewise below
  const float* m_absmax_in;
  const uint8_t* v_codes_in;
  const float* v_absmax_in;
  void* slot;
  const float* grad_f32;
  size_t n;
  size_t blocks;  // int8_blocks(n)
};

// One absmax block per iteration, one element per thread.  In place, every
// thread reads its code and the block's absmax before the block_max2
// barrier, and the new absmax is written after it; each code is read and
// written by its own thread.
template <pstar_dtype D, bool kGradF32>
__global__ void __launch_bounds__(kThreads) int8_kernel(AdamStepConstants c, Int8Args a) {
  __shared__ Int8Tables t;
  __shared__ float scratch[2 * kWarps];
  load_tables(t);
  for (size_t b = blockIdx.x; b < a.blocks; b += gridDim.x) {
    const size_t e = b * kInt8BlockElems + threadIdx.x;
    const bool valid = e < a.n;
    const float am_in = a.m_absmax_in[b], av_in = a.v_absmax_in[b];
    float m = 0.0f, v = 0.0f;
    if (valid) {
      const float g = kGradF32 ? a.grad_f32[e] : load_as(a.slot, D, e);
      float p = a.master_in[e];
      m = __fmul_rn(t.sval[a.m_codes_in[e]], am_in);
      v = __fmul_rn(t.uval[a.v_codes_in[e]], av_in);
      const float w = adam_element_int8(c, g, p, m, v);
      a.master[e] = p;
      store_as(a.slot, D, e, w);
    }
    float am = absmax_lane(m, valid), av = absmax_lane(v, valid);
    block_max2(am, av, scratch);
    if (threadIdx.x == 0) {
      a.m_absmax[b] = am;
      a.v_absmax[b] = av;
    }
    if (valid) {
      a.m_codes[e] = code_of<true>(t.sthr, __fmul_rn(m, inv_scale(am)));
      a.v_codes[e] = code_of<false>(t.uthr, __fmul_rn(v, inv_scale(av)));
    }
    __syncthreads();  // scratch is reused by the next block
  }
}

// ---- int8 encode and codes (conversions, tests) -----------------------------

template <bool kSigned>
__global__ void __launch_bounds__(kThreads)
    int8_encode_kernel(const float* __restrict__ x, size_t n, size_t blocks, uint8_t* __restrict__ codes,
                       float* __restrict__ absmax) {
  __shared__ Int8Tables t;
  __shared__ float scratch[2 * kWarps];
  load_tables(t);
  for (size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const size_t e = b * kInt8BlockElems + threadIdx.x;
    const bool valid = e < n;
    const float xv = valid ? x[e] : 0.0f;
    float am = absmax_lane(xv, valid), unused = 0.0f;
    block_max2(am, unused, scratch);
    if (threadIdx.x == 0) absmax[b] = am;
    if (valid) codes[e] = code_of<kSigned>(kSigned ? t.sthr : t.uthr, __fmul_rn(xv, inv_scale(am)));
    __syncthreads();
  }
}

template <bool kSigned>
__global__ void __launch_bounds__(kThreads)
    int8_codes_kernel(const float* __restrict__ y, size_t n, uint8_t* __restrict__ codes) {
  __shared__ Int8Tables t;
  load_tables(t);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    codes[i] = code_of<kSigned>(kSigned ? t.sthr : t.uthr, y[i]);
  }
}

// ---- bf16 update ------------------------------------------------------------

struct Bf16Args {
  float* master;
  const float* master_in;  // == master in place; likewise below
  uint16_t* m;
  uint16_t* v;
  const uint16_t* m_in;
  const uint16_t* v_in;
  void* slot;
  const float* grad_f32;
  size_t n;
};

template <pstar_dtype D, bool kGradF32>
__device__ __forceinline__ void bf16_one(const AdamStepConstants& c, const Bf16Args& a, size_t i) {
  const float g = kGradF32 ? a.grad_f32[i] : load_as(a.slot, D, i);
  float p = a.master_in[i], m = bf16_to_f32(a.m_in[i]), v = bf16_to_f32(a.v_in[i]);
  const float w = adam_element(c, g, p, m, v);
  a.master[i] = p;
  a.m[i] = f32_to_bf16(m);
  a.v[i] = f32_to_bf16(v);
  store_as(a.slot, D, i, w);
}

// One element per thread per iteration (arrays not aligned for the vector
// kernel).
template <pstar_dtype D, bool kGradF32>
__global__ void bf16_kernel(AdamStepConstants c, Bf16Args a) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < a.n; i += stride) {
    bf16_one<D, kGradF32>(c, a, i);
  }
}

// The compute-dtype slot's four elements as one access.
template <pstar_dtype D>
struct SlotVector {
  using type = uint2;
};
template <>
struct SlotVector<PSTAR_DTYPE_F32> {
  using type = uint4;
};

// Four elements per thread per iteration with 16-byte (fp32) and 8-byte
// (16-bit) accesses: elements [0, 4 * n4); the tail [4 * n4, n) (fewer than
// 4) one by one.  Every array is aligned for its vector at element 0 (the
// launcher checks).
template <pstar_dtype D, bool kGradF32>
__global__ void bf16_kernel_vec(AdamStepConstants c, Bf16Args a, size_t n4) {
  using SlotT = typename SlotVector<D>::type;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const float4* p_in4 = reinterpret_cast<const float4*>(a.master_in);
  float4* p4 = reinterpret_cast<float4*>(a.master);
  const uint2* m_in4 = reinterpret_cast<const uint2*>(a.m_in);
  const uint2* v_in4 = reinterpret_cast<const uint2*>(a.v_in);
  uint2* m4 = reinterpret_cast<uint2*>(a.m);
  uint2* v4 = reinterpret_cast<uint2*>(a.v);
  SlotT* slot4 = static_cast<SlotT*>(a.slot);
  const float4* g4 = reinterpret_cast<const float4*>(a.grad_f32);
  for (size_t i = tid; i < n4; i += stride) {
    const float4 pv = __ldcs(p_in4 + i);
    const uint2 mraw = __ldcs(m_in4 + i), vraw = __ldcs(v_in4 + i);
    SlotT raw{};
    float g[kVector];
    if (kGradF32) {
      const float4 gg = __ldcs(g4 + i);
      g[0] = gg.x, g[1] = gg.y, g[2] = gg.z, g[3] = gg.w;
    } else {
      raw = __ldcs(slot4 + i);
      for (int k = 0; k < kVector; ++k) g[k] = load_as(&raw, D, k);
    }
    uint16_t mh[kVector], vh[kVector];
    std::memcpy(mh, &mraw, sizeof mh);
    std::memcpy(vh, &vraw, sizeof vh);
    float p[kVector] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      float m = bf16_to_f32(mh[k]), v = bf16_to_f32(vh[k]);
      const float w = adam_element(c, g[k], p[k], m, v);
      mh[k] = f32_to_bf16(m);
      vh[k] = f32_to_bf16(v);
      store_as(&raw, D, k, w);
    }
    uint2 mo, vo;
    std::memcpy(&mo, mh, sizeof mo);
    std::memcpy(&vo, vh, sizeof vo);
    __stcs(p4 + i, make_float4(p[0], p[1], p[2], p[3]));
    __stcs(m4 + i, mo);
    __stcs(v4 + i, vo);
    __stcs(slot4 + i, raw);
  }
  const size_t i = kVector * n4 + tid;
  if (i < a.n) bf16_one<D, kGradF32>(c, a, i);
}

// ---- launchers ----------------------------------------------------------------

int multiprocessors() {
  thread_local int cached_device = -1, cached_sms = 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  if (device != cached_device) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) sms = 132;
    cached_device = device;
    cached_sms = sms;
  }
  return cached_sms;
}

int grid_for(size_t units) {
  const size_t max_blocks = static_cast<size_t>(multiprocessors()) * kBlocksPerSm;
  return static_cast<int>(std::max<size_t>(1, std::min(units, max_blocks)));
}

bool aligned(const void* p, size_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(PSTAR_ERR_DEVICE, std::string("CUDA: ") + what + " kernel launch: " + cudaGetErrorString(err));
  }
}

template <pstar_dtype D, bool kGradF32>
void launch_bf16(cudaStream_t s, const AdamStepConstants& c, const Bf16Args& a) {
  const size_t eb = dtype_size(D);
  const bool vec = aligned(a.master, 16) && aligned(a.master_in, 16) && aligned(a.m, 8) && aligned(a.v, 8) &&
                   aligned(a.m_in, 8) && aligned(a.v_in, 8) && aligned(a.slot, eb * kVector) &&
                   (!kGradF32 || aligned(a.grad_f32, 16));
  if (vec) {
    const size_t n4 = a.n / kVector;
    // The tail's (< 4) elements go to threads 0..2: at least 4 threads.
    const size_t threads = std::max<size_t>(n4, kVector);
    bf16_kernel_vec<D, kGradF32><<<grid_for((threads + kThreads - 1) / kThreads), kThreads, 0, s>>>(c, a, n4);
  } else {
    bf16_kernel<D, kGradF32><<<grid_for((a.n + kThreads - 1) / kThreads), kThreads, 0, s>>>(c, a);
  }
}

template <pstar_dtype D>
void launch_bf16(cudaStream_t s, const AdamStepConstants& c, const Bf16Args& a) {
  if (a.grad_f32 != nullptr) {
    launch_bf16<D, true>(s, c, a);
  } else {
    launch_bf16<D, false>(s, c, a);
  }
}

template <pstar_dtype D>
void launch_int8(cudaStream_t s, const AdamStepConstants& c, const Int8Args& a) {
  const int grid = grid_for(a.blocks);
  if (a.grad_f32 != nullptr) {
    int8_kernel<D, true><<<grid, kThreads, 0, s>>>(c, a);
  } else {
    int8_kernel<D, false><<<grid, kThreads, 0, s>>>(c, a);
  }
}

void update_fp32(cudaStream_t s, const AdamStepConstants& c, const AdamStateRange& r) {
  AdamRange a;
  a.master = r.master;
  a.exp_avg = static_cast<float*>(r.exp_avg.values);
  a.exp_avg_sq = static_cast<float*>(r.exp_avg_sq.values);
  a.slot = r.slot;
  a.dtype = r.dtype;
  a.grad_f32 = r.grad_f32;
  a.n = r.n;
  if (r.master_in != nullptr && r.n != 0) {
    // adam_update_cuda() updates in place: the inputs onto the outputs first
    // (the in-place and out-of-place updates give the same bits).
    const size_t bytes = r.n * sizeof(float);
    const struct {
      void* dst;
      const void* src;
    } copies[] = {{a.master, r.master_in}, {a.exp_avg, r.exp_avg_in.values}, {a.exp_avg_sq, r.exp_avg_sq_in.values}};
    for (const auto& cp : copies) {
      if (cp.src == nullptr) internal_error("adam_update_states_cuda: out of place with an input list missing");
      if (cp.dst != cp.src) {
        check_cuda(cudaMemcpyAsync(cp.dst, cp.src, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
      }
    }
  }
  adam_update_cuda(s, c, a);
}

}  // namespace

void adam_update_states_cuda(void* stream, StateFormat f, const AdamStepConstants& c, const AdamStateRange& r) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (r.bf16.master != nullptr) {
    adam_update_bf16_masters_cuda(stream, f, c, r);
    return;
  }
  if (f == StateFormat::kFp32) {
    update_fp32(s, c, r);
    return;
  }
  if (f != StateFormat::kBf16 && f != StateFormat::kInt8) internal_error("unknown state format");
  if (r.dtype != PSTAR_DTYPE_F16 && r.dtype != PSTAR_DTYPE_BF16 && r.dtype != PSTAR_DTYPE_F32) {
    throw Error(PSTAR_ERR_INVALID_ARGUMENT, "adam_update_states_cuda: unknown dtype");
  }
  if (r.n == 0) return;
  const bool oop = r.master_in != nullptr;
  if (oop && (r.exp_avg_in.values == nullptr || r.exp_avg_sq_in.values == nullptr)) {
    internal_error("adam_update_states_cuda: out of place with an input list missing");
  }
  if (f == StateFormat::kBf16) {
    Bf16Args a;
    a.master = r.master;
    a.master_in = oop ? r.master_in : r.master;
    a.m = static_cast<uint16_t*>(r.exp_avg.values);
    a.v = static_cast<uint16_t*>(r.exp_avg_sq.values);
    a.m_in = static_cast<const uint16_t*>(oop ? r.exp_avg_in.values : r.exp_avg.values);
    a.v_in = static_cast<const uint16_t*>(oop ? r.exp_avg_sq_in.values : r.exp_avg_sq.values);
    a.slot = r.slot;
    a.grad_f32 = r.grad_f32;
    a.n = r.n;
    switch (r.dtype) {
      case PSTAR_DTYPE_F16: launch_bf16<PSTAR_DTYPE_F16>(s, c, a); break;
      case PSTAR_DTYPE_BF16: launch_bf16<PSTAR_DTYPE_BF16>(s, c, a); break;
      default: launch_bf16<PSTAR_DTYPE_F32>(s, c, a); break;
    }
    check_launch("Adam bf16-state");
    return;
  }
  const ConstMomentList m_in = oop ? r.exp_avg_in : ConstMomentList{r.exp_avg.values, r.exp_avg.absmax};
  const ConstMomentList v_in = oop ? r.exp_avg_sq_in : ConstMomentList{r.exp_avg_sq.values, r.exp_avg_sq.absmax};
  if (r.exp_avg.absmax == nullptr || r.exp_avg_sq.absmax == nullptr || m_in.absmax == nullptr ||
      v_in.absmax == nullptr) {
    internal_error("adam_update_states_cuda: int8 list without its absmax array");
  }
  ensure_tables(s);
  Int8Args a;
  a.master = r.master;
  a.master_in = oop ? r.master_in : r.master;
  a.m_codes = static_cast<uint8_t*>(r.exp_avg.values);
  a.m_absmax = r.exp_avg.absmax;
  a.v_codes = static_cast<uint8_t*>(r.exp_avg_sq.values);
  a.v_absmax = r.exp_avg_sq.absmax;
  a.m_codes_in = static_cast<const uint8_t*>(m_in.values);
  a.m_absmax_in = m_in.absmax;
  a.v_codes_in = static_cast<const uint8_t*>(v_in.values);
  a.v_absmax_in = v_in.absmax;
  a.slot = r.slot;
  a.grad_f32 = r.grad_f32;
  a.n = r.n;
  a.blocks = int8_blocks(r.n);
  switch (r.dtype) {
    case PSTAR_DTYPE_F16: launch_int8<PSTAR_DTYPE_F16>(s, c, a); break;
    case PSTAR_DTYPE_BF16: launch_int8<PSTAR_DTYPE_BF16>(s, c, a); break;
    default: launch_int8<PSTAR_DTYPE_F32>(s, c, a); break;
  }
  check_launch("Adam int8-state");
}

void int8_codes_cuda(void* stream, bool is_signed, const float* y, size_t n, uint8_t* codes) {
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  ensure_tables(s);
  const int grid = grid_for((n + kThreads - 1) / kThreads);
  if (is_signed) {
    int8_codes_kernel<true><<<grid, kThreads, 0, s>>>(y, n, codes);
  } else {
    int8_codes_kernel<false><<<grid, kThreads, 0, s>>>(y, n, codes);
  }
  check_launch("int8 codes");
}

void int8_encode_cuda(void* stream, bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax) {
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  ensure_tables(s);
  const size_t blocks = int8_blocks(n);
  const int grid = grid_for(blocks);
  if (is_signed) {
    int8_encode_kernel<true><<<grid, kThreads, 0, s>>>(x, n, blocks, codes, absmax);
  } else {
    int8_encode_kernel<false><<<grid, kThreads, 0, s>>>(x, n, blocks, codes, absmax);
  }
  check_launch("int8 encode");
}

}  // namespace pstar::optim
