// The Adam state formats (optim/adam_states.h) as CUDA kernels (builds with
// CUDA only): the same bits as the scalar reference adam_update_states(
// AdamIsa::kScalar, ...) in every format, in place and out of place (checked
// by tests/gpu/adam_states_cuda_check.cpp on a device).
//
//  - fp32: adam_update_cuda() (optim/adam_cuda.h).  Out of place, the three
//    input lists are first copied onto the outputs on the same stream.
//  - bf16: one element per lane (four per thread where every array allows
//    16-byte and 8-byte accesses): the moments widened exactly,
//    adam_element(), rounded back with util/dtype.h's f32_to_bf16.
//  - int8: 256 threads per absmax block of kInt8BlockElems elements (each
//    CUDA block walks blocks in a grid-stride loop): dequantization, then
//    adam_element(), then the block's new absmax of |m| and |v| (NaN never
//    wins, 0 for a block of zeros), then the codes of x * (1 / absmax) by the
//    host's own thresholds (int8::Map::thr, copied to the device once per
//    device), searched exactly as int8::count_below() counts them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optim/adam_states.h"

namespace pstar::optim {

// Queues the update of range `r` in format `f` (every pointer in device
// memory) on the CUDA stream `stream` (a cudaStream_t; NULL for the legacy
// default stream).  Throws Error(PSTAR_ERR_DEVICE) if a launch or the
// one-time copy of the int8 tables fails.  The int8 tables are copied to the
// current device on its first int8 call (that call waits for `stream`).
void adam_update_states_cuda(void* stream, StateFormat f, const AdamStepConstants& c, const AdamStateRange& r);
// The same with bf16 masters (r.bf16.master set; adam_update_states_cuda
// calls it): optim/adam_masters_cuda.cu.
void adam_update_bf16_masters_cuda(void* stream, StateFormat f, const AdamStepConstants& c, const AdamStateRange& r);

// ---- the int8 quantizer on the device (conversions, tests) ------------------

// codes[i] = the device's code of the normalized value y[i]: the same as
// int8_code(is_signed, y[i]) for every float.  Device pointers.
void int8_codes_cuda(void* stream, bool is_signed, const float* y, size_t n, uint8_t* codes);
// The blockwise encode of int8_encode() (the first value on a block
// boundary): the same bits, with the update's absmax and quantization.
void int8_encode_cuda(void* stream, bool is_signed, const float* x, size_t n, uint8_t* codes, float* absmax);

}  // namespace pstar::optim
