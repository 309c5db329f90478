// bf16 masters (optim/adam_masters.h) on the device: the CPU's tile path in
// three steps on one stream.  The masters are widened into fp32 scratch
// (stream-ordered cudaMallocAsync, freed on the stream after use), the state
// format's kernel updates the scratch (adam_update_states_cuda, the same
// bits as the scalar path), and one kernel rounds each new master back to
// bf16 stochastically with sr_bits() of its element and writes the weight
// from the rounded master.  Every element's result is therefore the CPU's,
// bit for bit (checked by tests/gpu/adam_states_cuda_check.cpp on a device).
#include <cuda_runtime.h>

#include <string>

#include "optim/adam_masters.h"
#include "optim/adam_states_cuda.h"
#include "util/dtype.h"
#include "util/error.h"

namespace pstar::optim {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;  // grid-stride beyond this

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(PSTAR_ERR_DEVICE, std::string("CUDA: ") + what + ": " + cudaGetErrorString(err));
}

int grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

__global__ void widen_kernel(const uint16_t* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < n; i += size_t{gridDim.x} * kThreads) {
    out[i] = bf16_to_f32(in[i]);
  }
}

__global__ void round_kernel(const float* p, uint16_t* master, SrStream stream, uint64_t offset, void* slot,
                             pstar_dtype dtype, size_t n) {
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < n; i += size_t{gridDim.x} * kThreads) {
    const uint16_t b = f32_to_bf16_stochastic(p[i], sr_bits(stream, offset + i));
    master[i] = b;
    if (dtype == PSTAR_DTYPE_BF16) {
      static_cast<uint16_t*>(slot)[i] = b;
    } else {
      store_as(slot, dtype, i, bf16_to_f32(b));
    }
  }
}

}  // namespace

void adam_update_bf16_masters_cuda(void* stream, StateFormat f, const AdamStepConstants& c, const AdamStateRange& r) {
  if (r.n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool oop = r.bf16.master_in != nullptr;
  void* scratch = nullptr;
  check(cudaMallocAsync(&scratch, r.n * sizeof(float) * (oop ? 2 : 1), s), "cudaMallocAsync (bf16 masters' scratch)");
  float* out = static_cast<float*>(scratch);
  float* in = oop ? out + r.n : out;
  try {
    widen_kernel<<<grid_for(r.n), kThreads, 0, s>>>(oop ? r.bf16.master_in : r.bf16.master, in, r.n);
    check(cudaGetLastError(), "bf16 masters' widen kernel launch");
    AdamStateRange q = r;
    q.bf16 = Bf16Masters{};
    q.master = out;
    q.master_in = oop ? in : nullptr;
    adam_update_states_cuda(stream, f, c, q);
    round_kernel<<<grid_for(r.n), kThreads, 0, s>>>(out, r.bf16.master, r.bf16.stream, r.bf16.offset, r.slot, r.dtype,
                                                    r.n);
    check(cudaGetLastError(), "bf16 masters' rounding kernel launch");
  } catch (...) {
    cudaFreeAsync(scratch, s);
    throw;
  }
  check(cudaFreeAsync(scratch, s), "cudaFreeAsync (bf16 masters' scratch)");
}

}  // namespace pstar::optim
