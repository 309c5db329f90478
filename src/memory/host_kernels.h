// Host implementations of the device-side gradient operations, used by the
// emulated and the modelled device, by the sharded step on the host, and by
// tests as the reference for the CUDA kernels.
//
// The squared norm's order of operations is part of the contract, so that
// every path gives the same bits (the CUDA finalize kernel included):
//  - the n values are cut into blocks of kNormBlockElems (memory/device.h),
//    and the blocks' partials are added in block order into one fp64 sum;
//  - within a block, value j goes to lane j % kNormLanes; a lane adds the
//    squares (fp64, each square rounded, then added) of its values in index
//    order, starting from 0.0;
//  - the lanes are then added as a tree: for w = kNormLanes/2, ..., 1, lane
//    t += lane t + w for every t < w; the block's partial is lane 0.
// That is the CUDA kernel's thread-per-lane loop and shared-memory tree, and
// on the host it vectorizes: the AVX2 path (host_kernels_avx2.cpp) does the
// same additions in the same order, lanes side by side.
//
// A value is not finite exactly when its block's partial is not: every
// finite value's square is finite in fp64 (|x| < 2^128 for fp32, so
// x^2 < 2^256) and so is a sum of fewer than 2^40 of them, while a square of
// inf or NaN is inf or NaN and stays so through additions of non-negative
// terms.  The flag is computed from the partials.
#pragma once

#include <cstddef>

#include "pstar/pstar.h"

namespace pstar::memory {

// Which code the host gradient operations run.  kAvx2 needs AVX2, FMA and
// F16C (optim::adam_isa_supported(kAvx2)); both give the same bits.
enum class HostKernelIsa { kScalar, kAvx2 };

bool host_kernel_isa_supported(HostKernelIsa isa);
// kAvx2 where the CPU has it, unless PSTAR_ADAM_ISA=scalar asks for the
// scalar paths everywhere.
HostKernelIsa host_kernel_default_isa();

// acc[i] += src[i] (src converted from src_dtype to fp32, exactly).  With
// onto_zero, acc's content is ignored and never read: acc[i] = +0 + src[i],
// the bits of zeroing acc and then adding (-0 becomes +0).
void host_grad_accumulate(float* acc, const void* src, pstar_dtype src_dtype, size_t n, bool onto_zero = false);
// Squared sum (fp64, in the order above) and inf/NaN flag of n fp32
// gradient values.
void host_grad_norm(const float* g, size_t n, double* sumsq, int* nonfinite);
// Writes acc rounded to `dtype` into slot[0..n), then the squared sum and
// the flag of the rounded values, as host_grad_norm.
void host_grad_finalize(const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq, int* nonfinite);

// The finalize of a sum that has exactly one contribution, from that
// contribution itself: packed[0..n) = src rounded to `dtype` through the
// fp32 sum +0 + src[i] (the bits host_grad_accumulate onto zero and then
// host_grad_finalize give: -0 becomes +0), with the squared sum and the
// flag of the rounded values, without an fp32 buffer.  src is in `dtype`.
// packed may not overlap src.
void host_grad_pack(void* packed, const void* src, pstar_dtype dtype, size_t n, double* sumsq, int* nonfinite);
// A packed sum back to fp32, in place: acc[i] = +0 + packed[i], where the
// n packed values of `dtype` occupy the first bytes of acc (its fp32 sum
// when a second contribution comes).
void host_grad_unpack(float* acc, pstar_dtype dtype, size_t n);

// The same, on a chosen path (tests compare the paths).
void host_grad_accumulate(HostKernelIsa isa, float* acc, const void* src, pstar_dtype src_dtype, size_t n,
                          bool onto_zero = false);
void host_grad_norm(HostKernelIsa isa, const float* g, size_t n, double* sumsq, int* nonfinite);
void host_grad_finalize(HostKernelIsa isa, const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq,
                        int* nonfinite);
void host_grad_pack(HostKernelIsa isa, void* packed, const void* src, pstar_dtype dtype, size_t n, double* sumsq,
                    int* nonfinite);

namespace detail {
// The AVX2 path (host_kernels_avx2.cpp): call only where kAvx2 is supported.
void grad_accumulate_avx2(float* acc, const void* src, pstar_dtype src_dtype, size_t n, bool onto_zero);
// slot == nullptr: the norm of acc itself (host_grad_norm).
void grad_finalize_avx2(const float* acc, void* slot, pstar_dtype dtype, size_t n, double* sumsq);
// host_grad_pack's sum: src in `dtype`, read as the fp32 +0 + src[i].
void grad_pack_avx2(void* packed, const void* src, pstar_dtype dtype, size_t n, double* sumsq);
}  // namespace detail

}  // namespace pstar::memory
