#include "memory/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "memory/host_kernels.h"
#include "optim/adam_cuda.h"
#include "optim/adam_states_cuda.h"
#include "util/dtype.h"
#include "util/error.h"

namespace pstar::memory {
namespace {

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const pstar_status st = err == cudaErrorMemoryAllocation ? PSTAR_ERR_OUT_OF_MEMORY : PSTAR_ERR_DEVICE;
  throw Error(st, std::string("CUDA: ") + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

class CudaStream final : public Stream {
 public:
  explicit CudaStream(cudaStream_t s, bool owned) : stream(s), owned_(owned) {}
  ~CudaStream() override {
    if (owned_) cudaStreamDestroy(stream);
  }
  cudaStream_t stream;

 private:
  bool owned_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent() { check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"); }
  ~CudaEvent() override { cudaEventDestroy(event); }
  cudaEvent_t event{};
};

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;
// The finalize kernel's threads are the norm's lanes (host_kernels.h).
static_assert(static_cast<size_t>(kThreads) == kNormLanes, "one finalize thread per norm lane");

// onto_zero: acc is not read (acc = +0 + src, the bits of zeroing first).
__global__ void accumulate_kernel(float* acc, const void* src, pstar_dtype dtype, size_t n, bool onto_zero) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    acc[i] = (onto_zero ? 0.0f : acc[i]) + load_as(src, dtype, i);
  }
}

// One block per kNormBlockElems-element block: writes the rounded gradient
// and that block's fp64 squared sum, thread t summing lane t and the shared
// memory tree adding the lanes (the order host_kernels.h fixes, so the bits
// equal the host's); the host adds the partials in block order, so the norm
// does not depend on the grid shape.
__global__ void finalize_kernel(const float* acc, void* slot, pstar_dtype dtype, size_t n, double* partials,
                                int* nonfinite) {
  __shared__ double sums[kThreads];
  const size_t b = blockIdx.x;
  const size_t begin = b * kNormBlockElems;
  const size_t end = begin + kNormBlockElems < n ? begin + kNormBlockElems : n;
  double s = 0.0;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    store_as(slot, dtype, i, acc[i]);
    const double g = load_as(slot, dtype, i);
    if (!isfinite(g)) atomicExch(nonfinite, 1);
    s += g * g;
  }
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sums[threadIdx.x] += sums[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[b] = sums[0];
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    check(cudaSetDevice(ordinal), "cudaSetDevice");
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    h2d_ = std::make_unique<CudaStream>(s, true);
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    d2h_ = std::make_unique<CudaStream>(s, true);
    // NULL from the caller means the legacy default stream, as in CUDA itself.
    default_ = std::make_unique<CudaStream>(static_cast<cudaStream_t>(0), false);
  }

  pstar_device_kind kind() const override { return PSTAR_DEVICE_CUDA; }
  std::string name() const override { return "CUDA device " + std::to_string(ordinal_); }
  bool host_accessible() const override { return false; }
  void use_on_this_thread() override { check(cudaSetDevice(ordinal_), "cudaSetDevice"); }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes == 0 ? 256 : bytes), "cudaMalloc");
    return p;
  }
  void deallocate(void* ptr, size_t) override {
    if (ptr != nullptr) cudaFree(ptr);
  }
  void* allocate_host(size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes == 0 ? 256 : bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void deallocate_host(void* ptr, size_t) override {
    if (ptr != nullptr) cudaFreeHost(ptr);
  }

  Stream* compute_stream() override { return default_.get(); }
  Stream* h2d_stream() override { return h2d_.get(); }
  Stream* d2h_stream() override { return d2h_.get(); }
  Stream* caller_stream(void* handle) override {
    if (handle == nullptr) return default_.get();
    // Wrap the caller's cudaStream_t; wrappers live as long as the device.
    for (auto& w : wrapped_) {
      if (w->stream == static_cast<cudaStream_t>(handle)) return w.get();
    }
    wrapped_.push_back(std::make_unique<CudaStream>(static_cast<cudaStream_t>(handle), false));
    return wrapped_.back().get();
  }
  void* compute_stream_handle() override { return nullptr; }

  void copy_async(Stream* stream, void* dst, const void* src, size_t bytes, CopyKind kind) override {
    const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                               : cudaMemcpyDeviceToDevice;
    check(cudaMemcpyAsync(dst, src, bytes, k, s(stream)), "cudaMemcpyAsync");
  }
  void memset_async(Stream* stream, void* dst, int value, size_t bytes) override {
    check(cudaMemsetAsync(dst, value, bytes, s(stream)), "cudaMemsetAsync");
  }
  EventPtr record(Stream* stream) override {
    auto ev = std::make_shared<CudaEvent>();
    check(cudaEventRecord(ev->event, s(stream)), "cudaEventRecord");
    return ev;
  }
  void stream_wait(Stream* stream, const EventPtr& event) override {
    if (!event) return;
    check(cudaStreamWaitEvent(s(stream), static_cast<CudaEvent*>(event.get())->event, 0), "cudaStreamWaitEvent");
  }
  void synchronize(const EventPtr& event) override {
    if (!event) return;
    check(cudaEventSynchronize(static_cast<CudaEvent*>(event.get())->event), "cudaEventSynchronize");
  }
  void synchronize(Stream* stream) override { check(cudaStreamSynchronize(s(stream)), "cudaStreamSynchronize"); }
  bool query(const EventPtr& event) override {
    if (!event) return true;
    const cudaError_t e = cudaEventQuery(static_cast<CudaEvent*>(event.get())->event);
    if (e == cudaErrorNotReady) return false;
    check(e, "cudaEventQuery");
    return true;
  }

  void grad_accumulate(Stream* stream, float* acc, const void* src, pstar_dtype dtype, pstar_mem_space space, size_t n,
                       bool onto_zero) override {
    if (n == 0) return;
    const void* dsrc = src;
    void* staging = nullptr;
    if (space == PSTAR_MEM_HOST) {
      const size_t bytes = n * dtype_size(dtype);
      staging = allocate(bytes);
      check(cudaMemcpyAsync(staging, src, bytes, cudaMemcpyHostToDevice, s(stream)), "cudaMemcpyAsync");
      dsrc = staging;
    }
    const int blocks = static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
    accumulate_kernel<<<blocks, kThreads, 0, s(stream)>>>(acc, dsrc, dtype, n, onto_zero);
    check(cudaGetLastError(), "accumulate kernel launch");
    if (staging != nullptr) {
      // The caller's host buffer may be reused on return: finish here.
      check(cudaStreamSynchronize(s(stream)), "cudaStreamSynchronize");
      deallocate(staging, 0);
    }
  }

  void grad_finalize(Stream* stream, const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq,
                     int* nonfinite) override {
    const size_t blocks = (n + kNormBlockElems - 1) / kNormBlockElems;
    *sumsq = 0.0;
    *nonfinite = 0;
    if (blocks == 0) return;
    // Partials and flag in device memory, summed on the host in block order.
    double* partials = static_cast<double*>(allocate(blocks * sizeof(double) + sizeof(int)));
    int* flag = reinterpret_cast<int*>(partials + blocks);
    check(cudaMemsetAsync(flag, 0, sizeof(int), s(stream)), "cudaMemsetAsync");
    finalize_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s(stream)>>>(acc, slot, dtype, n, partials, flag);
    check(cudaGetLastError(), "finalize kernel launch");
    std::unique_ptr<double[]> host(new double[blocks]);
    int host_flag = 0;
    check(cudaMemcpyAsync(host.get(), partials, blocks * sizeof(double), cudaMemcpyDeviceToHost, s(stream)),
          "cudaMemcpyAsync");
    check(cudaMemcpyAsync(&host_flag, flag, sizeof(int), cudaMemcpyDeviceToHost, s(stream)), "cudaMemcpyAsync");
    // The foundation keeps this simple: the norm is needed before the step
    // anyway, and the engine reads it right after the last backward use.
    check(cudaStreamSynchronize(s(stream)), "cudaStreamSynchronize");
    double total = 0.0;
    for (size_t b = 0; b < blocks; ++b) total += host[b];
    *sumsq = total;
    *nonfinite = host_flag;
    deallocate(partials, 0);
  }

  void adam_update_async(Stream* stream, const optim::AdamStepConstants& c, const optim::AdamRange& r) override {
    optim::adam_update_cuda(s(stream), c, r);
  }
  void adam_update_states_async(Stream* stream, optim::StateFormat f, const optim::AdamStepConstants& c,
                                const optim::AdamStateRange& r) override {
    optim::adam_update_states_cuda(s(stream), f, c, r);
  }

 private:
  static cudaStream_t s(Stream* stream) { return static_cast<CudaStream*>(stream)->stream; }

  int ordinal_;
  std::unique_ptr<CudaStream> default_;
  std::unique_ptr<CudaStream> h2d_;
  std::unique_ptr<CudaStream> d2h_;
  std::vector<std::unique_ptr<CudaStream>> wrapped_;
};

}  // namespace

int cuda_runtime_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  const int n = cuda_runtime_device_count();
  if (n == 0) throw Error(PSTAR_ERR_DEVICE, "no CUDA device is usable on this machine (driver missing or no GPU)");
  if (ordinal < 0 || ordinal >= n) {
    throw Error(PSTAR_ERR_INVALID_ARGUMENT,
                "device_ordinal " + std::to_string(ordinal) + " out of range (" + std::to_string(n) + " devices)");
  }
  return std::make_unique<CudaDevice>(ordinal);
}

}  // namespace pstar::memory
