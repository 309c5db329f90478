// BackwardGradients: the gradient of a parameter during its backward, from
// the first BACKWARD acquire to the last use's release.
//
// The sum over a parameter's backward uses is kept in fp32, on the device
// (Param::grad_acc, 4 B per element) when the device has room for it, and
// on the host (Param::grad_host) when it has not.  "Room" is decided once
// per parameter and iteration, at its first BACKWARD acquire, without
// moving anything (placement::Runtime::fits_after_evicting):
//  - a parameter with one backward use to come holds the buffer only for
//    that use, so the buffer alone must fit beside the chunks in use;
//  - a parameter with more uses to come (a tied embedding, a module called
//    twice) holds it across the acquires in between, so it must also leave
//    room for one more chunk and the buffer of a parameter filling it.
// Without the host path, a tied 50257 x 768 embedding needs 154 MB of
// gradient buffer held through the whole backward on top of its own chunk,
// and a jumbo parameter its whole gradient on the device at once: that set
// the device floor (the smallest capacity that trains).  With it, the floor
// is about the largest chunk in use at one moment.
//
// Same bits either way: a contribution is added in fp32 in the order the
// calls come, by the same element-wise conversion and addition
// (memory/host_kernels.h), onto a sum that started at +0; the finalize
// rounds to the compute dtype and sums the squares in the order device.h
// fixes for every device.  What the host path costs is time: the caller's
// device gradient crosses to the host (in pieces of kHostGradPieceElems)
// and the host adds it; the finalized gradient goes back in the compute
// dtype.
//
// Not on the host path (a device buffer is required): world > 1 (the
// reduce-scatter reads the device buffer) and, with gradient accumulation,
// a chunk whose fp32 lists are on the device (hybrid: the fold adds on the
// device).
//
// One process without accumulation, on a device that packs (the emulated
// one), the last backward use's first contribution in the compute dtype is
// finalized at its write instead of summed (Param::grad_packed): the
// fp32 pass is skipped, the bits are the same.  Given with its release
// (pstar_grad_write_release, defer_to_slot), such a gradient is finalized
// straight into the slot: no buffer in between, no copy.
//
// What happens to the sum at the last use is the caller's sequence: one
// process without accumulation finalizes it into the slot here
// (finalize_into_slot); accumulation folds it (OptimizerStep::fold_gradient);
// world > 1 leaves it for the chunk's reduce-scatter.
#pragma once

#include <cstdint>
#include <vector>

#include "chunk/chunk.h"
#include "chunk/layout.h"
#include "chunk/param_table.h"
#include "distributed/process_group.h"
#include "memory/device.h"
#include "memory/host_pool.h"
#include "placement/runtime.h"
#include "pstar/pstar.h"

namespace pstar::step {

// The engine's modules the gradients live in; each outlives the object.
struct GradientParts {
  memory::Device* device = nullptr;
  memory::HostPool* host = nullptr;
  placement::Runtime* placement = nullptr;
  chunk::ParamTable* params = nullptr;
  std::vector<chunk::ChunkState>* chunks = nullptr;
  const distributed::ProcessGroup* group = nullptr;
};

class BackwardGradients {
 public:
  BackwardGradients(const GradientParts& parts, pstar_dtype compute_dtype, bool grad_accumulation, bool payloads);

  // At build, once the layout exists.
  void attach(const chunk::ChunkLayout* layout) { layout_ = layout; }

  // At a BACKWARD acquire of trainable parameter `id`, which has no
  // accumulator yet: a device buffer (zeroed by its first reader) or a host
  // sum.  PSTAR_ERR_OUT_OF_MEMORY when neither can be had.
  void open(uint32_t id);
  // pstar_grad_write after the engine's checks: the sum += grad, queued on
  // `s` (device buffer) or done now (host sum).
  void write(uint32_t id, const void* grad, uint64_t count, pstar_dtype dtype, pstar_mem_space space,
             memory::Stream* s);
  // pstar_grad_write_release after the engine's checks, before its
  // release: true when the gradient is to go straight into the slot at
  // that release (the parameter's last backward use, its first and only
  // contribution, and one that packs): it is kept (the caller's pointer,
  // valid through the call) for finalize_into_slot, which packs it there.
  // False: nothing kept, the caller writes it as pstar_grad_write does.
  // (count is the parameter's element count: the engine checked it.)
  bool defer_to_slot(uint32_t id, const void* grad, pstar_dtype dtype, pstar_mem_space space);
  // Forgets a deferred gradient at the end of the call, whether its
  // release took it or failed.
  class DeferredScope {
   public:
    explicit DeferredScope(BackwardGradients& g) : g_(g) {}
    ~DeferredScope() { g_.deferred_ = Deferred{}; }
    DeferredScope(const DeferredScope&) = delete;
    DeferredScope& operator=(const DeferredScope&) = delete;

   private:
    BackwardGradients& g_;
  };
  // pstar_grad_write's checks of its arguments (`what` names the call);
  // PSTAR_ERR_INVALID_ARGUMENT.
  void check_write(const char* what, const chunk::Param& p, const void* grad, uint64_t count, pstar_dtype dtype,
                   pstar_mem_space space) const;
  // pstar_grad_slot_acquire after the engine's checks: the device buffer
  // holding the sum (a host-accumulated parameter borrows one for this use,
  // starting from the host sum).
  float* slot_acquire(uint32_t id, memory::Stream* s);
  // At the release of a backward use: a borrowed device buffer goes back
  // (the sum to the host) unless this is the last use, where it stays for
  // the device finalize and the host sum goes.
  void end_use(chunk::Param& p, bool last_use, memory::Stream* s);
  // The buffer of a deferred zeroing is zeroed on `s` before anything reads
  // it; every path that reads or hands out grad_acc calls this first.
  void zero_pending(chunk::Param& p, memory::Stream* s);
  // The last backward use's release, one process without accumulation: the
  // sum, rounded to the compute dtype, goes into the parameter's slot on
  // `s` (with its squared norm and overflow count), and the accumulator
  // goes.  Returns the event after which the slot holds the gradient.
  memory::EventPtr finalize_into_slot(uint32_t id, memory::Stream* s);
  // An abandoned iteration: every accumulator is freed once `done` (after
  // the caller's work and the queued finalizes) completes.
  void discard(const memory::EventPtr& done);
  // The engine's destructor, its streams synchronized: frees everything.
  void release_all();

 private:
  bool host_allowed(uint32_t chunk) const;
  bool packs(const chunk::Param& p, pstar_dtype dtype) const;
  void unpack(chunk::Param& p, memory::Stream* s);
  void alloc_device(uint32_t id);
  void accumulate_on_host(chunk::Param& p, const void* grad, pstar_dtype dtype, pstar_mem_space space,
                          memory::Stream* s);
  size_t elem_bytes() const;

  memory::Device* const device_;
  memory::HostPool* const host_;
  placement::Runtime* const placement_;
  chunk::ParamTable& params_;
  std::vector<chunk::ChunkState>& chunks_;
  const distributed::ProcessGroup& group_;
  const pstar_dtype compute_dtype_;
  const bool grad_accumulation_;
  const bool payloads_;                         // false in a dry run: buffers are address space only
  const chunk::ChunkLayout* layout_ = nullptr;  // null until attach
  bool host_logged_ = false;                    // the first host-accumulated gradient is logged, once
  // defer_to_slot's gradient, for the release within the same call.
  struct Deferred {
    uint32_t id = 0;
    const void* grad = nullptr;  // null: none; the parameter's element count of dtype
    pstar_dtype dtype = PSTAR_DTYPE_F32;
    pstar_mem_space space = PSTAR_MEM_HOST;
  };
  Deferred deferred_;
};

}  // namespace pstar::step
