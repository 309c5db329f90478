// DropRule: when a sharded engine drops a gathered chunk, and when its
// gradients are reduce-scattered (DESIGN.md section 2, after PatrickStar).
//
// Applied after every release:
//  - FORWARD, EVAL and RECOMPUTE: a chunk is dropped once none of its
//    parameters is acquired and every one of them has been released in that
//    stage this iteration (FORWARD and EVAL share one mark).  A later use,
//    e.g. a tied weight's second one, gathers it again.
//  - BACKWARD: once none of its parameters is acquired and every one has as
//    many backward uses as forward uses (all its gradients final); its
//    pending gradients are reduce-scattered first.
//
// It keeps counts only: per chunk, the parameters not yet released in each
// stage, the parameters whose backward is open, the gradients waiting for
// the reduce-scatter; per parameter, the stages whose release it has seen.
// It knows no payloads; the engine acts on its answers.
//
// With one process it is never built: every call does nothing and no chunk
// is dropped.
#pragma once

#include <cstdint>
#include <vector>

#include "pstar/pstar.h"

namespace pstar::distributed {

class DropRule {
 public:
  // At build, sharded engines only: each chunk's parameters, and the
  // parameter count.
  void build(const std::vector<uint32_t>& params_per_chunk, size_t param_count);
  bool enabled() const { return !chunks_.empty(); }

  // A new iteration: nothing released, nothing open, no marks.
  void iteration_begin();
  // The iteration was abandoned or ended: no backward is open.
  void close_backward();

  // An acquire changed whether parameter `id` of chunk k has an open
  // backward (backward uses below forward uses).
  void note_backward_open(uint32_t k, bool was_open, bool now_open) {
    if (!enabled() || was_open == now_open) return;
    if (was_open) {
      --chunks_[k].backward_open;
    } else {
      ++chunks_[k].backward_open;
    }
  }
  // A final gradient of chunk k waits for the chunk's reduce-scatter.
  void note_gradient_pending(uint32_t k) { ++chunks_[k].gradients_pending; }
  uint32_t gradients_pending(uint32_t k) const { return enabled() ? chunks_[k].gradients_pending : 0; }
  // The chunk's gradients were laid out for their reduce-scatter.
  void gradients_taken(uint32_t k) { chunks_[k].gradients_pending = 0; }

  enum class Action { kKeep, kDrop, kReduceThenDrop };
  // Parameter `id` of chunk k, acquired in `stage`, was released; the chunk
  // has `compute_refs` acquired parameters left.
  // Inline: it runs on every release.
  Action after_release(uint32_t id, uint32_t k, pstar_stage stage, uint32_t compute_refs) {
    return enabled() ? apply(id, k, stage, compute_refs) : Action::kKeep;
  }

 private:
  Action apply(uint32_t id, uint32_t k, pstar_stage stage, uint32_t compute_refs);

  struct ChunkCounts {
    uint32_t params = 0;
    // Parameters not yet released in FORWARD or EVAL [0] and RECOMPUTE [1]
    // this iteration.
    uint32_t unreleased[2] = {0, 0};
    uint32_t backward_open = 0;
    uint32_t gradients_pending = 0;
  };
  std::vector<ChunkCounts> chunks_;   // empty: one process
  std::vector<uint8_t> released_in_;  // per parameter: bit 0 FORWARD/EVAL, bit 1 RECOMPUTE
};

}  // namespace pstar::distributed
