// PSTAR_HD marks functions shared by the CPU paths and CUDA kernels, so that
// both run the same arithmetic (DESIGN.md section 5).
#pragma once

#if defined(__CUDACC__)
#define PSTAR_HD __host__ __device__ __forceinline__
#else
#define PSTAR_HD inline
#endif
