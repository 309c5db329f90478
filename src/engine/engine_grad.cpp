// The gradient of a parameter during backward: where its fp32 sum over the
// backward uses lives, how the caller's contributions reach it, and how it
// becomes the content of the parameter's slot at the last use.
//
// The sum lives on the device (Param::grad_acc, a 4 B/element buffer) when
// the device has room for it, and on the host (Param::grad_host) when it
// has not.  "Room" is decided once per parameter and iteration, at its
// first BACKWARD acquire, without moving anything (fits_after_evicting):
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
// (host_kernels.h), onto a sum that started at +0; the finalize rounds to
// the compute dtype and sums the squares in the order device.h fixes for
// every device.  What the host path costs is time: the caller's device
// gradient crosses to the host (in pieces of kHostGradPieceElems) and the
// host adds it; the finalized gradient goes back in the compute dtype.
//
// Not on the host path (a device buffer is required, as before): world > 1
// (the reduce-scatter reads the device buffer) and, with gradient
// accumulation, a chunk whose fp32 lists are on the device (hybrid: the
// fold adds on the device).
#include <algorithm>
#include <cstring>
#include <string>

#include "engine/engine.h"
#include "memory/host_kernels.h"
#include "step/optimizer_step.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/log.h"

namespace pstar::engine {

namespace {
// Elements of a caller's device gradient staged on the host at a time
// (16 MiB of fp32): bounds the host staging of the host path.
constexpr uint64_t kHostGradPieceElems = uint64_t{1} << 22;
}  // namespace

bool Engine::host_accumulation_allowed(uint32_t chunk) const {
  if (sharded()) return false;
  return !(options_.grad_accumulation && chunks_[chunk].opt_device != nullptr);
}

// At a BACKWARD acquire of parameter `id`, which has no accumulator yet.
void Engine::open_accumulator(uint32_t id) {
  Param& p = params_[id];
  const auto& place = layout_->param(id);
  const uint64_t bytes = p.numel * sizeof(float);
  const bool more_uses_to_come = p.forward_uses - p.backward_uses > 1;
  const uint64_t headroom = more_uses_to_come ? layout_->chunk_elems() * (elem_bytes() + sizeof(float)) : 0;
  if (host_accumulation_allowed(place.chunk) &&
      !placement_->fits_after_evicting(bytes + headroom, static_cast<int64_t>(place.chunk))) {
    p.grad_host = static_cast<float*>(host_->acquire(bytes));
    if (payloads_) std::memset(p.grad_host, 0, bytes);
    if (!host_gradient_logged_) {
      host_gradient_logged_ = true;
      log::info("the gradient of '" + p.name + "' (" + std::to_string(bytes) +
                " bytes of fp32) accumulates on the host: the device has no room for it beside the chunks in use" +
                " (further parameters are not logged)");
    }
    return;
  }
  alloc_device_accumulator(id);
  // Zeroed by its first reader (zero_pending_accumulator), not here: on a
  // host-accessible device the acquire waits for its stream, and the
  // first reader may be the last release, which needs no buffer at all.
  p.grad_zero_pending = true;
}

// The buffer of a deferred zeroing (open_accumulator) is zeroed on `s`
// before anything reads it.  Every path that reads or hands out grad_acc
// calls this first.
void Engine::zero_pending_accumulator(Param& p, memory::Stream* s) {
  if (!p.grad_zero_pending) return;
  p.grad_zero_pending = false;
  device_->memset_async(s, p.grad_acc, 0, p.numel * sizeof(float));
}

// p.grad_acc = a device buffer of parameter `id`'s fp32 size, room made
// with its chunk kept in place; PSTAR_ERR_OUT_OF_MEMORY when none can be.
void Engine::alloc_device_accumulator(uint32_t id) {
  Param& p = params_[id];
  const auto& place = layout_->param(id);
  ChunkState& c = chunks_[place.chunk];
  const uint64_t bytes = p.numel * sizeof(float);
  ++c.compute_refs;  // keep the chunk in place while room is made
  try {
    p.grad_acc =
        static_cast<float*>(placement_->device_alloc(bytes, place.chunk, "gradient buffer of '" + p.name + "'"));
  } catch (...) {
    --c.compute_refs;
    throw;
  }
  --c.compute_refs;
  placement_->tier().add(Use::kGradients, bytes);
  placement_->note_device_peak();
}

// grad_host += grad.  The caller's queued work on `s` has produced `grad`
// once `s` gets here.  A device gradient is staged through a host buffer on
// every device (the emulated one too, so that the path CUDA takes is the
// one tested, and the modelled clock charges its copy).
void Engine::accumulate_on_host(Param& p, const void* grad, pstar_dtype dtype, pstar_mem_space space,
                                memory::Stream* s) {
  const size_t esize = dtype_size(dtype);
  if (p.numel == 0) return;
  if (space == PSTAR_MEM_HOST) {
    device_->synchronize(s);
    if (payloads_) memory::host_grad_accumulate(p.grad_host, grad, dtype, p.numel);
    return;
  }
  const uint64_t piece = std::min<uint64_t>(p.numel, kHostGradPieceElems);
  void* staging = host_->acquire(piece * esize);
  try {
    for (uint64_t at = 0; at < p.numel; at += piece) {
      const uint64_t n = std::min(piece, p.numel - at);
      device_->copy_async(s, staging, static_cast<const char*>(grad) + at * esize, n * esize,
                          memory::CopyKind::kDeviceToHost);
      device_->synchronize(s);
      if (payloads_) memory::host_grad_accumulate(p.grad_host + at, staging, dtype, n);
    }
  } catch (...) {
    host_->release(staging, piece * esize);
    throw;
  }
  host_->release(staging, piece * esize);
}

void Engine::grad_write(uint32_t id, const void* grad, uint64_t count, pstar_dtype dtype, pstar_mem_space space,
                        void* stream) {
  Param& p = backward_param("grad_write", id);
  group_.require_ok("grad_write");
  require(dtype_valid(dtype), PSTAR_ERR_INVALID_ARGUMENT, "grad_write: unknown dtype");
  require(space == PSTAR_MEM_HOST || space == PSTAR_MEM_DEVICE, PSTAR_ERR_INVALID_ARGUMENT,
          "grad_write: unknown memory space");
  require(count == p.numel, PSTAR_ERR_INVALID_ARGUMENT, [&] {
    return "grad_write: count " + std::to_string(count) + " differs from the element count " + std::to_string(p.numel) +
           " of '" + p.name + "'";
  });
  require(grad != nullptr || count == 0 || !payloads_, PSTAR_ERR_INVALID_ARGUMENT, "grad_write: grad is NULL");
  if (payloads_) device_->check_caller_buffer(grad, count * dtype_size(dtype), space, "grad_write");
  memory::Stream* s = device_->caller_stream(stream);
  if (p.grad_acc == nullptr) {
    accumulate_on_host(p, grad, dtype, space, s);
    return;
  }
  // The first contribution onto a buffer that was never zeroed replaces
  // its content: the zeroing and the addition in one pass.
  const bool onto_zero = p.grad_zero_pending;
  p.grad_zero_pending = false;
  device_->grad_accumulate(s, p.grad_acc, grad, dtype, space, count, onto_zero);
  // A host source may be reused as soon as this returns; on the emulated
  // device the caller's compute is host code, so it sees the result now.
  if (space == PSTAR_MEM_HOST || device_->host_accessible()) device_->synchronize(s);
}

float* Engine::grad_slot_acquire(uint32_t id, void* stream) {
  Param& p = backward_param("grad_slot_acquire", id);
  require(payloads_, PSTAR_ERR_UNSUPPORTED, "grad_slot_acquire: a dry run has no gradient buffers to write");
  memory::Stream* s = device_->caller_stream(stream);
  if (p.grad_acc == nullptr) {
    // A host-accumulated parameter: this use borrows a device buffer that
    // starts from the host sum (given back at its release).
    alloc_device_accumulator(id);
    device_->copy_async(s, p.grad_acc, p.grad_host, p.numel * sizeof(float), memory::CopyKind::kHostToDevice);
  }
  zero_pending_accumulator(p, s);
  if (device_->host_accessible()) device_->synchronize(s);
  return p.grad_acc;
}

// At the release of a backward use of a host-accumulated parameter that
// borrowed a device buffer (grad_slot_acquire): the device buffer holds the
// sum.  At the last use it stays for the device finalize and the host sum
// goes; otherwise the sum goes back to the host and the buffer is freed.
void Engine::return_borrowed_accumulator(Param& p, bool last_use, memory::Stream* s) {
  const uint64_t bytes = p.numel * sizeof(float);
  if (!last_use) {
    device_->copy_async(s, p.grad_host, p.grad_acc, bytes, memory::CopyKind::kDeviceToHost);
    device_->synchronize(s);
    placement_->defer_free_device(device_->record(s), p.grad_acc, bytes, Use::kGradients);
    p.grad_acc = nullptr;
    return;
  }
  // Queued work on `s` may still read the host sum (the borrowing copy).
  placement_->defer_free_host(device_->record(s), p.grad_host, bytes);
  p.grad_host = nullptr;
}

// The last backward use's release of a host-accumulated parameter (world
// 1, no accumulation over micro-batches): the sum, rounded to the compute
// dtype, goes into the slot on `s`, after the caller's work reading it.
// Returns the event after which the slot holds the gradient.
memory::EventPtr Engine::finalize_on_host(Param& p, void* slot, memory::Stream* s) {
  const uint64_t slot_bytes = p.numel * elem_bytes();
  void* staging = host_->acquire(slot_bytes);
  p.grad_sumsq = 0.0;
  p.grad_nonfinite = 0;
  if (payloads_)
    memory::host_grad_finalize(p.grad_host, staging, options_.compute_dtype, p.numel, &p.grad_sumsq, &p.grad_nonfinite);
  host_->release(p.grad_host, p.numel * sizeof(float));
  p.grad_host = nullptr;
  device_->copy_async(s, slot, staging, slot_bytes, memory::CopyKind::kHostToDevice);
  memory::EventPtr done = device_->record(s);
  placement_->defer_free_host(done, staging, slot_bytes);
  return done;
}

void Engine::free_host_accumulator(Param& p) {
  if (p.grad_host == nullptr) return;
  host_->release(p.grad_host, p.numel * sizeof(float));
  p.grad_host = nullptr;
}

}  // namespace pstar::engine
