#include "optim/adam_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "util/dtype.h"
#include "util/error.h"

namespace pstar::optim {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill an H100/H200 (132 SMs x 8 resident blocks).
constexpr int kMaxBlocks = 132 * 8;

template <pstar_dtype D, bool kGradF32>
__global__ void adam_kernel(AdamStepConstants c, float* __restrict__ master, float* __restrict__ m,
                            float* __restrict__ v, void* __restrict__ slot, const float* __restrict__ grad_f32,
                            size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const float g = kGradF32 ? grad_f32[i] : load_as(slot, D, i);
    float p = master[i], mi = m[i], vi = v[i];
    const float w = adam_element(c, g, p, mi, vi);
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
    store_as(slot, D, i, w);
  }
}

template <pstar_dtype D>
void launch(cudaStream_t s, int blocks, const AdamStepConstants& c, const AdamRange& r) {
  if (r.grad_f32 != nullptr) {
    adam_kernel<D, true><<<blocks, kThreads, 0, s>>>(c, r.master, r.exp_avg, r.exp_avg_sq, r.slot, r.grad_f32, r.n);
  } else {
    adam_kernel<D, false><<<blocks, kThreads, 0, s>>>(c, r.master, r.exp_avg, r.exp_avg_sq, r.slot, nullptr, r.n);
  }
}

}  // namespace

void adam_update_cuda(void* stream, const AdamStepConstants& c, const AdamRange& r) {
  if (r.n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const int blocks = static_cast<int>(std::min<size_t>((r.n + kThreads - 1) / kThreads, kMaxBlocks));
  switch (r.dtype) {
    case PSTAR_DTYPE_F16: launch<PSTAR_DTYPE_F16>(s, blocks, c, r); break;
    case PSTAR_DTYPE_BF16: launch<PSTAR_DTYPE_BF16>(s, blocks, c, r); break;
    case PSTAR_DTYPE_F32: launch<PSTAR_DTYPE_F32>(s, blocks, c, r); break;
    default: throw Error(PSTAR_ERR_INVALID_ARGUMENT, "adam_update_cuda: unknown dtype");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(PSTAR_ERR_DEVICE, std::string("CUDA: Adam kernel launch: ") + cudaGetErrorString(err));
  }
}

}  // namespace pstar::optim
