// GPU check of the CUDA Adam kernel and of the CUDA tier's copies, a plain
// C++ program (the GPU machine has no Criterion).  Exits 77 with "skipped: no
// CUDA device" where no GPU is usable.
//
//  1. The kernel against the scalar CPU path, bit for bit: fp16, bf16, fp32,
//     with and without the fp32 gradient list, ragged lengths, 20 steps.
//  2. Bandwidth: the kernel on 256M elements (28 bytes each for bf16 with
//     fp32 masters) against a device-to-device cudaMemcpy measured in the
//     same run (bytes read + written), and against H200's nominal 4.8 TB/s.
//  3. Pinned host<->device: the CUDA tier's own copies (copy_async of
//     chunk-sized pieces on its H2D/D2H streams) against one large
//     cudaMemcpy of the same pinned buffer.
// Usage: adam_cuda_check [OUT_DIR]   (writes OUT_DIR/adam_cuda.json)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "memory/cuda_device.h"
#include "optim/adam_cuda.h"
#include "optim/adam_kernel.h"
#include "util/dtype.h"

using namespace pstar;
using namespace pstar::optim;

namespace {

int passes = 0, failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) {
    ++passes;
  } else {
    ++failures;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

#define CU(call)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                        \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// On a mismatch: the step, the array, the first index and both bit patterns,
// so that one GPU run says where the paths part.
void report_first_difference(uint64_t step, const std::vector<float>& gm, const std::vector<float>& cm,
                             const std::vector<float>& gmm, const std::vector<float>& cmm,
                             const std::vector<float>& gv, const std::vector<float>& cv,
                             const std::vector<char>& gslot, const std::vector<char>& cslot, size_t eb) {
  const struct {
    const char* name;
    const std::vector<float>& gpu;
    const std::vector<float>& cpu;
  } lists[] = {{"master", gm, cm}, {"exp_avg", gmm, cmm}, {"exp_avg_sq", gv, cv}};
  for (const auto& l : lists) {
    for (size_t i = 0; i < l.gpu.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &l.gpu[i], 4);
      std::memcpy(&b, &l.cpu[i], 4);
      if (a != b) {
        std::fprintf(stderr, "  step %llu: %s[%zu] gpu 0x%08x (%.9g) cpu 0x%08x (%.9g)\n",
                     static_cast<unsigned long long>(step), l.name, i, a, l.gpu[i], b, l.cpu[i]);
        break;
      }
    }
  }
  for (size_t i = 0; i < gslot.size() / eb; ++i) {
    if (std::memcmp(&gslot[i * eb], &cslot[i * eb], eb) != 0) {
      uint32_t a = 0, b = 0;
      std::memcpy(&a, &gslot[i * eb], eb);
      std::memcpy(&b, &cslot[i * eb], eb);
      std::fprintf(stderr, "  step %llu: slot[%zu] gpu 0x%x cpu 0x%x\n", static_cast<unsigned long long>(step), i, a,
                   b);
      break;
    }
  }
}

// `offset` elements into every array (an unaligned head for the vector
// path); `slot_skew` elements more into the slot only (arrays not co-aligned:
// the one-element path).
void bit_identity(pstar_dtype dtype, bool grad_list, size_t n, size_t offset = 0, size_t slot_skew = 0) {
  std::mt19937 rng(static_cast<unsigned>(n * 7 + dtype));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t eb = dtype_size(dtype);
  std::vector<float> master(n), m(n, 0.0f), v(n, 0.0f), g32(n);
  std::vector<char> slot(n * eb);
  for (size_t i = 0; i < n; ++i) master[i] = normal(rng) * 0.1f;
  float *dmaster, *dm, *dv, *dg32;
  void* dslot;
  float *amaster, *am, *av, *ag32;
  char* aslot;
  CU(cudaMalloc(&amaster, (n + offset) * 4));
  CU(cudaMalloc(&am, (n + offset) * 4));
  CU(cudaMalloc(&av, (n + offset) * 4));
  CU(cudaMalloc(&ag32, (n + offset) * 4));
  CU(cudaMalloc(&aslot, (n + offset + slot_skew) * eb));
  dmaster = amaster + offset;
  dm = am + offset;
  dv = av + offset;
  dg32 = ag32 + offset;
  dslot = aslot + (offset + slot_skew) * eb;
  CU(cudaMemcpy(dmaster, master.data(), n * 4, cudaMemcpyHostToDevice));
  CU(cudaMemset(dm, 0, n * 4));
  CU(cudaMemset(dv, 0, n * 4));
  AdamHyper h;
  h.lr = 1e-3f;
  h.weight_decay = 0.01f;
  bool same = true;
  for (uint64_t step = 1; step <= 20 && same; ++step) {
    for (size_t i = 0; i < n; ++i) {
      const float g = normal(rng) * 1e-2f;
      g32[i] = g;
      store_as(slot.data(), dtype, i, g);
    }
    if (step == 7 && n > 3) g32[3] = 1e-40f;  // a denormal gradient
    CU(cudaMemcpy(dslot, slot.data(), n * eb, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dg32, g32.data(), n * 4, cudaMemcpyHostToDevice));
    h.adamw = (step % 2) == 0;  // both flavours
    const AdamStepConstants c = adam_constants(h, step, 1.0 / 1024.0, true);
    AdamRange r;
    r.master = master.data();
    r.exp_avg = m.data();
    r.exp_avg_sq = v.data();
    r.slot = slot.data();
    r.dtype = dtype;
    r.grad_f32 = grad_list ? g32.data() : nullptr;
    r.n = n;
    adam_update(AdamIsa::kScalar, c, r);
    AdamRange d = r;
    d.master = dmaster;
    d.exp_avg = dm;
    d.exp_avg_sq = dv;
    d.slot = dslot;
    d.grad_f32 = grad_list ? dg32 : nullptr;
    adam_update_cuda(nullptr, c, d);
    CU(cudaDeviceSynchronize());
    std::vector<float> gm(n), gmm(n), gv(n);
    std::vector<char> gslot(n * eb);
    CU(cudaMemcpy(gm.data(), dmaster, n * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gmm.data(), dm, n * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gv.data(), dv, n * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gslot.data(), dslot, n * eb, cudaMemcpyDeviceToHost));
    same = std::memcmp(gm.data(), master.data(), n * 4) == 0 && std::memcmp(gmm.data(), m.data(), n * 4) == 0 &&
           std::memcmp(gv.data(), v.data(), n * 4) == 0 && std::memcmp(gslot.data(), slot.data(), n * eb) == 0;
    if (!same) report_first_difference(step, gm, master, gmm, m, gv, v, gslot, slot, eb);
  }
  expect(same, std::string("CUDA kernel bit-identical to the CPU path: ") + dtype_name(dtype) +
                   (grad_list ? " with fp32 gradient list" : "") + ", n=" + std::to_string(n) +
                   ", offset " + std::to_string(offset) + ", slot skew " + std::to_string(slot_skew));
  cudaFree(amaster);
  cudaFree(am);
  cudaFree(av);
  cudaFree(ag32);
  cudaFree(aslot);
}

template <class F>
double median_ms(int reps, F&& f) {
  std::vector<double> t;
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  f();  // warm-up
  for (int i = 0; i < reps; ++i) {
    CU(cudaEventRecord(a));
    f();
    CU(cudaEventRecord(b));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string out_dir = argc > 1 ? argv[1] : ".";
  if (memory::cuda_runtime_device_count() == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  CU(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s\n", prop.name);

  for (pstar_dtype d : {PSTAR_DTYPE_BF16, PSTAR_DTYPE_F16, PSTAR_DTYPE_F32}) {
    for (size_t n : {size_t{1}, size_t{255}, size_t{4097}, size_t{1000003}}) {
      bit_identity(d, false, n);
    }
    bit_identity(d, true, 4097);
    // Unaligned heads and tails (vector path) and arrays not co-aligned
    // (one-element path).
    for (size_t off : {size_t{1}, size_t{2}, size_t{3}}) {
      bit_identity(d, false, 4099, off);
      bit_identity(d, true, 4099, off);
      bit_identity(d, false, 2, off);
    }
    bit_identity(d, false, 4099, 0, 1);
    bit_identity(d, true, 4099, 2, 1);
  }

  // Bandwidth of the kernel (bf16 params, fp32 master/m/v: 28 B/element).
  const size_t n = size_t{256} << 20;
  float *master, *m, *v;
  void* slot;
  CU(cudaMalloc(&master, n * 4));
  CU(cudaMalloc(&m, n * 4));
  CU(cudaMalloc(&v, n * 4));
  CU(cudaMalloc(&slot, n * 2));
  CU(cudaMemset(master, 0, n * 4));
  CU(cudaMemset(m, 0, n * 4));
  CU(cudaMemset(v, 0, n * 4));
  CU(cudaMemset(slot, 0, n * 2));
  AdamHyper h;
  const AdamStepConstants c = adam_constants(h, 1, 1.0, true);
  AdamRange r;
  r.master = master;
  r.exp_avg = m;
  r.exp_avg_sq = v;
  r.slot = slot;
  r.dtype = PSTAR_DTYPE_BF16;
  r.n = n;
  const double adam_ms = median_ms(9, [&] { adam_update_cuda(nullptr, c, r); });
  const double adam_gbs = 28.0 * n / (adam_ms * 1e6);
  // Device-to-device copy of 1 GiB: reads and writes 2 GiB in all.
  const size_t copy_bytes = size_t{1} << 30;
  const double d2d_ms = median_ms(9, [&] { CU(cudaMemcpyAsync(m, master, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double d2d_gbs = 2.0 * copy_bytes / (d2d_ms * 1e6);
  const double nominal_gbs = 4800.0;  // H200 HBM3e, NVIDIA's figure
  std::printf("adam kernel: %.3f ms for %zu elements, %.0f GB/s; d2d memcpy %.0f GB/s; fraction %.3f of memcpy, %.3f of nominal\n",
              adam_ms, n, adam_gbs, d2d_gbs, adam_gbs / d2d_gbs, adam_gbs / nominal_gbs);
  cudaFree(master);
  cudaFree(m);
  cudaFree(v);
  cudaFree(slot);

  // Pinned copies through the CUDA tier vs one cudaMemcpy.
  auto dev = memory::make_cuda_device(0);
  const size_t total = size_t{1} << 30, chunk = size_t{64} << 20;
  void* host = dev->allocate_host(total);
  void* devbuf = dev->allocate(total);
  std::memset(host, 1, total);
  const double peak_h2d_ms = median_ms(5, [&] { CU(cudaMemcpy(devbuf, host, total, cudaMemcpyHostToDevice)); });
  const double peak_d2h_ms = median_ms(5, [&] { CU(cudaMemcpy(host, devbuf, total, cudaMemcpyDeviceToHost)); });
  auto tier = [&](memory::CopyKind kind) {
    memory::Stream* s = kind == memory::CopyKind::kHostToDevice ? dev->h2d_stream() : dev->d2h_stream();
    for (size_t off = 0; off < total; off += chunk) {
      char* h8 = static_cast<char*>(host) + off;
      char* d8 = static_cast<char*>(devbuf) + off;
      if (kind == memory::CopyKind::kHostToDevice) {
        dev->copy_async(s, d8, h8, chunk, kind);
      } else {
        dev->copy_async(s, h8, d8, chunk, kind);
      }
    }
    dev->synchronize(s);
  };
  const double tier_h2d_ms = median_ms(5, [&] { tier(memory::CopyKind::kHostToDevice); });
  const double tier_d2h_ms = median_ms(5, [&] { tier(memory::CopyKind::kDeviceToHost); });
  const double gb = total / 1e9;
  std::printf("pinned H2D: tier %.1f GB/s, cudaMemcpy %.1f GB/s, fraction %.3f\n", gb / (tier_h2d_ms / 1e3),
              gb / (peak_h2d_ms / 1e3), peak_h2d_ms / tier_h2d_ms);
  std::printf("pinned D2H: tier %.1f GB/s, cudaMemcpy %.1f GB/s, fraction %.3f\n", gb / (tier_d2h_ms / 1e3),
              gb / (peak_d2h_ms / 1e3), peak_d2h_ms / tier_d2h_ms);
  dev->deallocate(devbuf, total);
  dev->deallocate_host(host, total);

  const std::string path = out_dir + "/adam_cuda.json";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fprintf(f,
                 "{\"bench\":\"adam_cuda\",\"device\":\"%s\",\"elements\":%zu,\"median_ms\":%.4f,\"adam_gbs\":%.1f,"
                 "\"d2d_gbs\":%.1f,\"fraction_of_memcpy\":%.4f,\"fraction_of_nominal\":%.4f,"
                 "\"h2d_tier_gbs\":%.2f,\"h2d_memcpy_gbs\":%.2f,\"d2h_tier_gbs\":%.2f,\"d2h_memcpy_gbs\":%.2f}\n",
                 prop.name, n, adam_ms, adam_gbs, d2d_gbs, adam_gbs / d2d_gbs, adam_gbs / nominal_gbs,
                 gb / (tier_h2d_ms / 1e3), gb / (peak_h2d_ms / 1e3), gb / (tier_d2h_ms / 1e3),
                 gb / (peak_d2h_ms / 1e3));
    std::fclose(f);
  }
  std::printf("%d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}
