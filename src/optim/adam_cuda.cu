#include "optim/adam_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "util/dtype.h"
#include "util/error.h"

namespace pstar::optim {
namespace {

// Why the kernel looks the way it does: Adam is a pure stream (28 bytes per
// bf16/f16 element: 16-bit gradient read, fp32 master, m and v read and
// written, 16-bit weight written) with a few dozen flops per element, so its
// speed is the fraction of HBM bandwidth it reaches.  One 4-byte access per
// array per element left it at about 0.74 of a device-to-device memcpy on an
// H200 (docs/benchmarks.md); 16-byte accesses (four elements per thread per
// iteration) with streaming cache hints (the data is touched once per step)
// raise the bytes in flight per thread.  Every element still goes through
// adam_element(), so the results stay bit-identical to the CPU paths.
constexpr int kThreads = 256;
constexpr int kVector = 4;  // elements per vector access (16 bytes of fp32)
// Resident blocks per multiprocessor at kThreads (2048 threads per SM on
// sm_80/sm_90); the grid is that many per SM, capped by the work.
constexpr int kBlocksPerSm = 2048 / kThreads;

// The compute-dtype slot's four elements as one access: 8 bytes for 16-bit
// dtypes, 16 for fp32.
template <pstar_dtype D>
struct SlotVector {
  using type = uint2;
};
template <>
struct SlotVector<PSTAR_DTYPE_F32> {
  using type = uint4;
};

// Element i on its own (the one-element kernel, and the vector kernel's
// unaligned head and tail).
template <pstar_dtype D, bool kGradF32>
__device__ __forceinline__ void update_one(const AdamStepConstants& c, float* __restrict__ master,
                                           float* __restrict__ m, float* __restrict__ v, void* __restrict__ slot,
                                           const float* __restrict__ grad_f32, size_t i) {
  const float g = kGradF32 ? grad_f32[i] : load_as(slot, D, i);
  float p = master[i], mi = m[i], vi = v[i];
  const float w = adam_element(c, g, p, mi, vi);
  master[i] = p;
  m[i] = mi;
  v[i] = vi;
  store_as(slot, D, i, w);
}

// Elements [0, head) and [head + 4 * n4, n) one by one; [head, head + 4 * n4)
// four at a time.  Every pointer is 16-byte aligned at element `head` (the
// slot 8-byte aligned for 16-bit dtypes): the launcher checks.
template <pstar_dtype D, bool kGradF32>
__global__ void adam_kernel_vec(AdamStepConstants c, float* __restrict__ master, float* __restrict__ m,
                                float* __restrict__ v, void* __restrict__ slot, const float* __restrict__ grad_f32,
                                size_t head, size_t n4, size_t n) {
  using SlotT = typename SlotVector<D>::type;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  float4* master4 = reinterpret_cast<float4*>(master + head);
  float4* m4 = reinterpret_cast<float4*>(m + head);
  float4* v4 = reinterpret_cast<float4*>(v + head);
  constexpr size_t kSlotBytes = D == PSTAR_DTYPE_F32 ? 4 : 2;
  SlotT* slot4 = reinterpret_cast<SlotT*>(static_cast<char*>(slot) + head * kSlotBytes);
  const float4* g4 = kGradF32 ? reinterpret_cast<const float4*>(grad_f32 + head) : nullptr;
  for (size_t i = tid; i < n4; i += stride) {
    float4 p = __ldcs(master4 + i), mi = __ldcs(m4 + i), vi = __ldcs(v4 + i);
    SlotT raw{};
    if (!kGradF32) raw = __ldcs(slot4 + i);  // the gradient; else only written
    float g[kVector];
    if (kGradF32) {
      const float4 gg = __ldcs(g4 + i);
      g[0] = gg.x, g[1] = gg.y, g[2] = gg.z, g[3] = gg.w;
    } else {
      for (int k = 0; k < kVector; ++k) g[k] = load_as(&raw, D, k);
    }
    float w[kVector];
    w[0] = adam_element(c, g[0], p.x, mi.x, vi.x);
    w[1] = adam_element(c, g[1], p.y, mi.y, vi.y);
    w[2] = adam_element(c, g[2], p.z, mi.z, vi.z);
    w[3] = adam_element(c, g[3], p.w, mi.w, vi.w);
    for (int k = 0; k < kVector; ++k) store_as(&raw, D, k, w[k]);
    __stcs(master4 + i, p);
    __stcs(m4 + i, mi);
    __stcs(v4 + i, vi);
    __stcs(slot4 + i, raw);
  }
  // The unaligned head and the tail: fewer than 4 elements each.
  const size_t tail = head + kVector * n4;
  size_t i = tid < head ? tid : tail + (tid - head);
  if (tid < head || (tid >= head && i < n)) update_one<D, kGradF32>(c, master, m, v, slot, grad_f32, i);
}

// One element per thread per iteration: for ranges whose arrays are not
// co-aligned (possible only through the internal API; the engine's chunks
// are).
template <pstar_dtype D, bool kGradF32>
__global__ void adam_kernel(AdamStepConstants c, float* __restrict__ master, float* __restrict__ m,
                            float* __restrict__ v, void* __restrict__ slot, const float* __restrict__ grad_f32,
                            size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    update_one<D, kGradF32>(c, master, m, v, slot, grad_f32, i);
  }
}

bool aligned_at(const void* p, size_t offset_bytes, size_t alignment) {
  return (reinterpret_cast<uintptr_t>(p) + offset_bytes) % alignment == 0;
}

int multiprocessors() {
  // Per calling thread and device: the attribute query is cheap but not free,
  // and the engine launches once per chunk segment.
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

template <pstar_dtype D>
void launch(cudaStream_t s, const AdamStepConstants& c, const AdamRange& r) {
  const size_t eb = dtype_size(D);
  const size_t max_blocks = static_cast<size_t>(multiprocessors()) * kBlocksPerSm;
  // The head: elements until master is 16-byte aligned.  The vector path
  // needs every other array aligned at the same element.
  const size_t head = std::min<size_t>(((16 - reinterpret_cast<uintptr_t>(r.master) % 16) % 16) / 4, r.n);
  const bool vec = reinterpret_cast<uintptr_t>(r.master) % 4 == 0 && aligned_at(r.exp_avg, head * 4, 16) &&
                   aligned_at(r.exp_avg_sq, head * 4, 16) && aligned_at(r.slot, head * eb, eb * kVector) &&
                   (r.grad_f32 == nullptr || aligned_at(r.grad_f32, head * 4, 16));
  if (vec) {
    const size_t n4 = (r.n - head) / kVector;
    // Every thread takes at most one head and one tail element: at least
    // head + tail (< 8) threads.
    const size_t threads = std::max<size_t>(n4, 8);
    const int blocks = static_cast<int>(std::min<size_t>((threads + kThreads - 1) / kThreads, max_blocks));
    if (r.grad_f32 != nullptr) {
      adam_kernel_vec<D, true>
          <<<blocks, kThreads, 0, s>>>(c, r.master, r.exp_avg, r.exp_avg_sq, r.slot, r.grad_f32, head, n4, r.n);
    } else {
      adam_kernel_vec<D, false>
          <<<blocks, kThreads, 0, s>>>(c, r.master, r.exp_avg, r.exp_avg_sq, r.slot, nullptr, head, n4, r.n);
    }
    return;
  }
  const int blocks = static_cast<int>(std::min<size_t>((r.n + kThreads - 1) / kThreads, max_blocks));
  if (r.grad_f32 != nullptr) {
    adam_kernel<D, true><<<blocks, kThreads, 0, s>>>(c, r.master, r.exp_avg, r.exp_avg_sq, r.slot, r.grad_f32, r.n);
  } else {
    adam_kernel<D, false><<<blocks, kThreads, 0, s>>>(c, r.master, r.exp_avg, r.exp_avg_sq, r.slot, nullptr, r.n);
  }
}

}  // namespace

void adam_update_cuda(void* stream, const AdamStepConstants& c, const AdamRange& r) {
  if (r.n == 0) return;
  if (r.master_in != nullptr || r.exp_avg_in != nullptr || r.exp_avg_sq_in != nullptr) {
    internal_error("adam_update_cuda: the device kernel updates in place (AdamRange's *_in lists are host-only)");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  switch (r.dtype) {
    case PSTAR_DTYPE_F16: launch<PSTAR_DTYPE_F16>(s, c, r); break;
    case PSTAR_DTYPE_BF16: launch<PSTAR_DTYPE_BF16>(s, c, r); break;
    case PSTAR_DTYPE_F32: launch<PSTAR_DTYPE_F32>(s, c, r); break;
    default: throw Error(PSTAR_ERR_INVALID_ARGUMENT, "adam_update_cuda: unknown dtype");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(PSTAR_ERR_DEVICE, std::string("CUDA: Adam kernel launch: ") + cudaGetErrorString(err));
  }
}

}  // namespace pstar::optim
