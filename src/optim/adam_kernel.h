// The fused mixed-precision Adam/AdamW update over a contiguous range of a
// chunk, with one implementation per instruction set, chosen at run time.
//
// One pass per element: read the gradient (compute dtype, from the
// parameter's slot, or fp32 from the separate gradient list), update the fp32
// master, m and v in place, and write the new weight rounded to the compute
// dtype into the slot (fused emit: no second sweep).  Every implementation
// performs exactly the operations of adam_element() (optim/adam.h) in the
// same order, with one rounding each (vector FMA == fmaf), and converts with
// the policy of util/dtype.h, so all of them produce the same bits; the tests
// demand exactly that.
#pragma once

#include <cstddef>

#include "optim/adam.h"
#include "pstar/pstar.h"

namespace pstar::optim {

enum class AdamIsa {
  kScalar = 0,  // portable C++: the reference of the other paths
  kAvx2 = 1,    // AVX2 + FMA + F16C
  kAvx512 = 2,  // AVX-512 F/BW/VL (+ AVX512-BF16 for the bf16 emit)
};

struct AdamRange {
  float* master = nullptr;      // n fp32 master weights: the results
  float* exp_avg = nullptr;     // n first moments: the results
  float* exp_avg_sq = nullptr;  // n second moments: the results
  // Out of place: the lists read, when set (all three or none).  Null: the
  // update reads master, exp_avg and exp_avg_sq and writes them in place.
  // A speculative update (step/speculation.h) reads the chunk's lists and
  // writes fresh buffers, so that the inputs survive a discarded result.
  // The host kernels only; the CUDA kernel updates in place.
  const float* master_in = nullptr;
  const float* exp_avg_in = nullptr;
  const float* exp_avg_sq_in = nullptr;
  // The compute-dtype slot: holds the gradient on entry unless grad_f32 is
  // set, and the new weight on exit.
  void* slot = nullptr;
  pstar_dtype dtype = PSTAR_DTYPE_BF16;
  // Separate fp32 gradient list (micro-batch accumulation), or NULL.
  const float* grad_f32 = nullptr;
  size_t n = 0;
};

// Updates one range on the calling thread with the given instruction set.
// `isa` must be supported by this CPU (see adam_isa_supported).
void adam_update(AdamIsa isa, const AdamStepConstants& c, const AdamRange& r);

bool adam_isa_supported(AdamIsa isa);
const char* adam_isa_name(AdamIsa isa);
// Extensions beyond an instruction set's baseline, each with AVX-512 (false
// without it), detected once: AVX512-BF16 (VCVTNEPS2BF16 for the bf16 emits)
// and AVX512-VBMI (the int8 format's byte-plane dequantization).
bool cpu_has_avx512bf16();
bool cpu_has_avx512vbmi();

// The best supported instruction set, unless the environment variable
// PSTAR_ADAM_ISA (scalar, avx2, avx512) asks for another supported one.
AdamIsa adam_default_isa();

}  // namespace pstar::optim
