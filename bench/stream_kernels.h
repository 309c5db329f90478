// The reference loops of `pstar-bench adam`: the memory ceiling of the fused
// mixed-precision Adam update and the STREAM triad.
//
// The ceiling is the update's exact memory pattern with trivial arithmetic:
// per element it reads the 2-byte value in the compute-dtype slot and the
// fp32 master, m and v, and writes master, m, v and a 2-byte value back into
// the slot, in place (28 bytes; every line written was just read, so no
// write-allocate read), with the same load and store widths as the vector
// kernels (the 2-byte slot converted with F16C for fp16 and with integer
// shifts for bf16).  Its vector variants are compiled with per-function
// target attributes and chosen at run time, like the kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pstar/pstar.h"

namespace pstar::bench {

enum class StreamIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

bool stream_isa_supported(StreamIsa isa);
const char* stream_isa_name(StreamIsa isa);
StreamIsa best_stream_isa();

// In-place read-modify-write over [0, n): g = slot[i] (fp16 or bf16),
// master[i] += k0 * g, m[i] = k1 * m[i] + g, v[i] = k1 * v[i] + g * g,
// slot[i] = (2-byte) master[i].  With k0 = 0 and 0 <= k1 < 1 all values stay
// bounded and v stays non-negative, so the Adam state it shares with the
// update stays valid.  `isa` must be supported.
void rmw_stream(StreamIsa isa, pstar_dtype dtype, uint16_t* slot, float* master, float* m, float* v, size_t n, float k0,
                float k1);

// STREAM triad over [0, n): a[i] = b[i] + s * c[i] (24 bytes per element as
// STREAM counts it; the store into `a` also costs a write-allocate read).
void triad(StreamIsa isa, float* a, const float* b, const float* c, float s, size_t n);

}  // namespace pstar::bench
