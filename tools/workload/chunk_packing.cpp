// The engine's chunk layout of a workload (chunk_packing.h).
#include "chunk_packing.h"

namespace pstar::workload {

namespace {
uint64_t align_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }
}  // namespace

ChunkPacking pack_chunks(const Workload& w, uint64_t chunk_elems, uint32_t world, uint64_t align) {
  const uint64_t unit = align * (world == 0 ? 1 : world);
  const uint64_t cap = align_up(chunk_elems, unit);
  ChunkPacking out;
  out.chunk_of.resize(w.params.size());
  int64_t open = -1;
  uint64_t used = 0;
  for (size_t i = 0; i < w.params.size(); ++i) {
    const uint64_t n = w.params[i].numel;
    if (n > cap) {
      out.elems.push_back(align_up(align_up(n, align), unit));
      out.params_in.push_back(0);
      out.chunk_of[i] = uint32_t(out.elems.size() - 1);
    } else {
      if (open >= 0 && align_up(used, align) + n > cap) open = -1;
      if (open < 0) {
        out.elems.push_back(cap);
        out.params_in.push_back(0);
        open = int64_t(out.elems.size() - 1);
        used = 0;
      }
      used = align_up(used, align) + n;
      out.chunk_of[i] = uint32_t(open);
    }
    ++out.params_in[out.chunk_of[i]];
  }
  return out;
}

}  // namespace pstar::workload
