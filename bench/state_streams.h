// The memory ceilings of `pstar-bench adam`'s per-format lines (issue 45):
// in-place read-modify-write streams over exactly the bytes the update of
// each Adam state format moves (optim/adam_states.h), with trivial
// arithmetic, in the vector width of the kernels.  fp32 is rmw_stream()
// (stream_kernels.h); these add the bf16 and int8 formats.  The compute
// dtype is bf16 (the gradient read from the 2-byte slot, the weight written
// back into it).
//
//  - bf16: g (2) and the master (4) read, m and v (2 each) read and written,
//    master (4) and weight (2) written: 20 bytes.
//  - int8: g (2), master (4), the two code bytes read; master (4), the two
//    code bytes and the weight (2) written; each block of 256 elements reads
//    and writes its two absmax floats: 16.0625 bytes.  Ranges start on a
//    block boundary.
#pragma once

#include <cstddef>
#include <cstdint>

#include "stream_kernels.h"

namespace pstar::bench {

// master += k0 * g; m = k1 * m + g, v = k1 * v + g * g (through fp32, the
// results truncated to bf16); slot = master's upper half.
void rmw_stream_bf16(StreamIsa isa, uint16_t* slot, float* master, uint16_t* m, uint16_t* v, size_t n, float k0,
                     float k1, StreamPrefetch pf = StreamPrefetch::kOff);

// master += k0 * g; slot = master's upper half; m and v codes += 1 (bytes);
// m_absmax and v_absmax (one per started block of 256) *= k1.
void rmw_stream_int8(StreamIsa isa, uint16_t* slot, float* master, uint8_t* m, uint8_t* v, float* m_absmax,
                     float* v_absmax, size_t n, float k0, float k1, StreamPrefetch pf = StreamPrefetch::kOff);

}  // namespace pstar::bench
