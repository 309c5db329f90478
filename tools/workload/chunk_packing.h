// The engine's chunk layout of a workload, as chunk/layout.cpp packs it
// (the tools link the public C API only, which does not expose it):
// parameters in registration order, next fit into chunks of chunk_elems,
// each at an `align`-element offset (128; 256, the int8 state format's
// block, in an int8 engine), a jumbo chunk of its own for a parameter
// larger than a chunk; with world > 1 the chunk capacity and every chunk
// padded to a multiple of world x align elements, as Engine::build does.
// Every workload parameter is trainable.  Used by the planner's models of
// what the dry run does not show (the overlapped step, the collectives).
#pragma once

#include <cstdint>
#include <vector>

#include "gpt_workload.h"

namespace pstar::workload {

struct ChunkPacking {
  std::vector<uint32_t> chunk_of;   // per parameter
  std::vector<uint64_t> elems;      // per chunk: its capacity (this padding included)
  std::vector<uint32_t> params_in;  // per chunk: its parameters
};

ChunkPacking pack_chunks(const Workload& w, uint64_t chunk_elems, uint32_t world, uint64_t align = 128);

}  // namespace pstar::workload
