#include "optim/chunk_update.h"

#include <algorithm>

#include "util/dtype.h"
#include "util/error.h"

namespace pstar::optim {

AdamRange ChunkLists::range(uint64_t lo, uint64_t hi) const {
  AdamRange r;
  r.master = master + lo;
  r.exp_avg = static_cast<float*>(exp_avg) + lo;
  r.exp_avg_sq = static_cast<float*>(exp_avg_sq) + lo;
  r.slot = static_cast<char*>(slot) + lo * dtype_size(dtype);
  r.dtype = dtype;
  r.grad_f32 = grad_f32 != nullptr ? grad_f32 + lo : nullptr;
  r.n = hi - lo;
  if (master_in != nullptr) {
    r.master_in = master_in + lo;
    r.exp_avg_in = static_cast<const float*>(exp_avg_in) + lo;
    r.exp_avg_sq_in = static_cast<const float*>(exp_avg_sq_in) + lo;
  }
  return r;
}

AdamStateRange ChunkLists::state_range(uint64_t lo, uint64_t hi, const Segment* sg) const {
  AdamStateRange r;
  if (master_format == MasterFormat::kBf16) {
    if (sg == nullptr) internal_error("bf16 masters' update without its segment");
    r.bf16.master = reinterpret_cast<uint16_t*>(master) + lo;
    if (master_in != nullptr) r.bf16.master_in = reinterpret_cast<const uint16_t*>(master_in) + lo;
    r.bf16.stream = sr_stream(master_seed, sg->step, sg->param);
    r.bf16.offset = chunk_offset + lo - sg->param_start;
  }
  r.master = master + lo;
  r.exp_avg = moment_list_at(format, exp_avg, elems, lo);
  r.exp_avg_sq = moment_list_at(format, exp_avg_sq, elems, lo);
  r.slot = static_cast<char*>(slot) + lo * dtype_size(dtype);
  r.dtype = dtype;
  r.grad_f32 = grad_f32 != nullptr ? grad_f32 + lo : nullptr;
  r.n = hi - lo;
  if (master_in != nullptr) {
    r.master_in = master_in + lo;
    r.exp_avg_in = moment_list_at(format, exp_avg_in, elems, lo);
    r.exp_avg_sq_in = moment_list_at(format, exp_avg_sq_in, elems, lo);
  }
  return r;
}

void SegmentList::add(uint64_t begin, uint64_t end, float lr_scale, bool weight_decay, uint32_t param,
                      uint64_t param_start) {
  AdamHyper h = hyper_;
  h.lr = hyper_.lr * lr_scale;
  segments_.push_back({begin, end, adam_constants(h, step_, grad_mul_, weight_decay), step_, param, param_start});
}

void update_chunk(ThreadPool& pool, AdamIsa isa, uint64_t elems, const std::vector<Segment>& segments,
                  const ChunkLists& lists) {
  if (segments.empty()) return;
  pool.parallel_for(elems, kAdamGrainElems, [&](size_t b, size_t e) {
    for (const Segment& sg : segments) {
      const uint64_t lo = std::max<uint64_t>(b, sg.begin), hi = std::min<uint64_t>(e, sg.end);
      if (lo >= hi) continue;
      if (lists.fp32_only()) {
        adam_update(isa, sg.constants, lists.range(lo, hi));
      } else {
        adam_update_states(isa, lists.format, sg.constants, lists.state_range(lo, hi, &sg));
      }
    }
  });
}

}  // namespace pstar::optim
