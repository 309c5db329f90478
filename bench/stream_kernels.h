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

#include "optim/adam_prefetch.h"
#include "pstar/pstar.h"

namespace pstar::bench {

enum class StreamIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

bool stream_isa_supported(StreamIsa isa);
const char* stream_isa_name(StreamIsa isa);
StreamIsa best_stream_isa();

// The streams run with and without the kernels' software prefetch
// (optim/adam_prefetch.h); pstar-bench takes the faster as the ceiling, so
// that a ceiling is never the slower way of streaming the same bytes.
enum class StreamPrefetch { kOff = 0, kOn = 1 };

// One step's prefetch in a stream: the kernels' own (optim::prefetch_step),
// `elems` elements at i + optim::kPrefetchAheadElems of the master, both
// moment lists and the 2-byte slot, when that lies before `end`.
template <typename Moment>
PSTAR_PREFETCH_INLINE void prefetch_rmw(const uint16_t* slot, const float* master, const Moment* m, const Moment* v,
                                        size_t i, size_t elems, size_t end) {
  optim::prefetch_step<PSTAR_DTYPE_BF16, false>(master, m, v, sizeof(Moment), nullptr, slot, i, elems, end);
}

// In-place read-modify-write over [0, n): g = slot[i] (fp16 or bf16),
// master[i] += k0 * g, m[i] = k1 * m[i] + g, v[i] = k1 * v[i] + g * g,
// slot[i] = (2-byte) master[i].  With k0 = 0 and 0 <= k1 < 1 all values stay
// bounded and v stays non-negative, so the Adam state it shares with the
// update stays valid.  `isa` must be supported.
void rmw_stream(StreamIsa isa, pstar_dtype dtype, uint16_t* slot, float* master, float* m, float* v, size_t n, float k0,
                float k1, StreamPrefetch pf = StreamPrefetch::kOff);

// STREAM triad over [0, n): a[i] = b[i] + s * c[i] (24 bytes per element as
// STREAM counts it; the store into `a` also costs a write-allocate read).
void triad(StreamIsa isa, float* a, const float* b, const float* c, float s, size_t n);

}  // namespace pstar::bench
