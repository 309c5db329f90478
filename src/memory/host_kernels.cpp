#include "memory/host_kernels.h"

#include <cmath>

#include "memory/device.h"
#include "optim/adam_kernel.h"
#include "util/dtype.h"

namespace pstar::memory {
namespace {

static_assert(kNormBlockElems % kNormLanes == 0, "a full block is whole rows of lanes");
static_assert((kNormLanes & (kNormLanes - 1)) == 0, "the lane tree halves down to one lane");

// One block of the norm (host_kernels.h): the lanes, then the tree.  With
// `slot`, each value is first rounded through `dtype` and stored there.
// value(begin + j) is the block's j-th fp32 sum.
template <typename Value>
double block_sumsq_scalar(const Value& value, size_t begin, void* slot, pstar_dtype dtype, size_t n) {
  double lanes[kNormLanes] = {};
  for (size_t j = 0; j < n; ++j) {
    const float x = value(begin + j);
    double g = x;
    if (slot != nullptr) {
      store_as(slot, dtype, j, x);
      g = load_as(slot, dtype, j);
    }
    lanes[j % kNormLanes] += g * g;
  }
  for (size_t w = kNormLanes / 2; w > 0; w /= 2) {
    for (size_t t = 0; t < w; ++t) lanes[t] += lanes[t + w];
  }
  return lanes[0];
}

// The blocks' partials added in block order: the finalize of the fp32 sums
// value(0..n), rounded into slot (unless it is null).
template <typename Value>
double sumsq_scalar(const Value& value, void* slot, pstar_dtype dtype, size_t n) {
  const size_t esize = dtype_size(dtype);
  double total = 0.0;
  for (size_t b = 0; b < n; b += kNormBlockElems) {
    const size_t len = n - b < kNormBlockElems ? n - b : kNormBlockElems;
    void* block_slot = slot == nullptr ? nullptr : static_cast<char*>(slot) + b * esize;
    total += block_sumsq_scalar(value, b, block_slot, dtype, len);
  }
  return total;
}

void finalize_scalar(const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq) {
  *sumsq = sumsq_scalar([acc](size_t i) { return acc[i]; }, slot, dtype, n);
}

// The sum of one contribution: +0 + src[i] in fp32, as accumulate_scalar
// onto zero computes it.
void pack_scalar(void* packed, const void* src, pstar_dtype dtype, size_t n, double* sumsq) {
  *sumsq = sumsq_scalar([src, dtype](size_t i) { return 0.0f + load_as(src, dtype, i); }, packed, dtype, n);
}

void accumulate_scalar(float* acc, const void* src, pstar_dtype src_dtype, size_t n, bool onto_zero) {
  for (size_t i = 0; i < n; ++i) acc[i] = (onto_zero ? 0.0f : acc[i]) + load_as(src, src_dtype, i);
}

}  // namespace

bool host_kernel_isa_supported(HostKernelIsa isa) {
  return isa == HostKernelIsa::kScalar || optim::adam_isa_supported(optim::AdamIsa::kAvx2);
}

// The Adam path's choice (PSTAR_ADAM_ISA, else the best the CPU has): every
// path above scalar has AVX2, FMA and F16C.
HostKernelIsa host_kernel_default_isa() {
  static const HostKernelIsa isa =
      optim::adam_default_isa() == optim::AdamIsa::kScalar ? HostKernelIsa::kScalar : HostKernelIsa::kAvx2;
  return isa;
}

void host_grad_accumulate(HostKernelIsa isa, float* acc, const void* src, pstar_dtype src_dtype, size_t n,
                          bool onto_zero) {
  if (isa == HostKernelIsa::kAvx2) {
    detail::grad_accumulate_avx2(acc, src, src_dtype, n, onto_zero);
  } else {
    accumulate_scalar(acc, src, src_dtype, n, onto_zero);
  }
}

// slot == nullptr: the norm of acc itself (host_grad_norm).
void host_grad_finalize(HostKernelIsa isa, const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq,
                        int* nonfinite) {
  if (isa == HostKernelIsa::kAvx2) {
    detail::grad_finalize_avx2(acc, slot, dtype, n, sumsq);
  } else {
    finalize_scalar(acc, slot, dtype, n, sumsq);
  }
  *nonfinite = std::isfinite(*sumsq) ? 0 : 1;
}

void host_grad_pack(HostKernelIsa isa, void* packed, const void* src, pstar_dtype dtype, size_t n, double* sumsq,
                    int* nonfinite) {
  if (isa == HostKernelIsa::kAvx2) {
    detail::grad_pack_avx2(packed, src, dtype, n, sumsq);
  } else {
    pack_scalar(packed, src, dtype, n, sumsq);
  }
  *nonfinite = std::isfinite(*sumsq) ? 0 : 1;
}

// Highest index first: value i moves from byte i * esize to byte i * 4,
// never below where it was, so every packed value is read before a wider
// store reaches it.  A second contribution to one use's gradient is rare
// (the engine packs only a parameter's last backward use): no vector path.
void host_grad_unpack(float* acc, pstar_dtype dtype, size_t n) {
  for (size_t i = n; i-- > 0;) acc[i] = 0.0f + load_as(acc, dtype, i);
}

void host_grad_norm(HostKernelIsa isa, const float* g, size_t n, double* sumsq, int* nonfinite) {
  host_grad_finalize(isa, g, nullptr, PSTAR_DTYPE_F32, n, sumsq, nonfinite);
}

void host_grad_accumulate(float* acc, const void* src, pstar_dtype src_dtype, size_t n, bool onto_zero) {
  host_grad_accumulate(host_kernel_default_isa(), acc, src, src_dtype, n, onto_zero);
}

void host_grad_norm(const float* g, size_t n, double* sumsq, int* nonfinite) {
  host_grad_norm(host_kernel_default_isa(), g, n, sumsq, nonfinite);
}

void host_grad_finalize(const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq, int* nonfinite) {
  host_grad_finalize(host_kernel_default_isa(), acc, slot, dtype, n, sumsq, nonfinite);
}

void host_grad_pack(void* packed, const void* src, pstar_dtype dtype, size_t n, double* sumsq, int* nonfinite) {
  host_grad_pack(host_kernel_default_isa(), packed, src, dtype, n, sumsq, nonfinite);
}

}  // namespace pstar::memory
