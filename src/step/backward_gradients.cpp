// The gradient of a parameter during its backward (backward_gradients.h).
#include "step/backward_gradients.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "memory/host_kernels.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/log.h"

namespace pstar::step {

namespace {
using Use = memory::DeviceTier::Use;
// Elements of a caller's device gradient staged on the host at a time
// (16 MiB of fp32): bounds the host staging of the host path.
constexpr uint64_t kHostGradPieceElems = uint64_t{1} << 22;
}  // namespace

BackwardGradients::BackwardGradients(const GradientParts& parts, pstar_dtype compute_dtype, bool grad_accumulation,
                                     bool payloads)
    : device_(parts.device),
      host_(parts.host),
      placement_(parts.placement),
      params_(*parts.params),
      chunks_(*parts.chunks),
      group_(*parts.group),
      compute_dtype_(compute_dtype),
      grad_accumulation_(grad_accumulation),
      payloads_(payloads) {}

size_t BackwardGradients::elem_bytes() const { return dtype_size(compute_dtype_); }

bool BackwardGradients::host_allowed(uint32_t chunk) const {
  if (group_.sharded()) return false;
  return !(grad_accumulation_ && chunks_[chunk].opt_device != nullptr);
}

void BackwardGradients::open(uint32_t id) {
  chunk::Param& p = params_[id];
  const auto& place = layout_->param(id);
  const uint64_t bytes = p.numel * sizeof(float);
  const bool more_uses_to_come = p.forward_uses - p.backward_uses > 1;
  const uint64_t headroom = more_uses_to_come ? layout_->chunk_elems() * (elem_bytes() + sizeof(float)) : 0;
  if (host_allowed(place.chunk) &&
      !placement_->fits_after_evicting(bytes + headroom, static_cast<int64_t>(place.chunk))) {
    p.grad_host = static_cast<float*>(host_->acquire(bytes));
    if (payloads_) std::memset(p.grad_host, 0, bytes);
    if (!host_logged_) {
      host_logged_ = true;
      log::info("the gradient of '" + p.name + "' (" + std::to_string(bytes) +
                " bytes of fp32) accumulates on the host: the device has no room for it beside the chunks in use" +
                " (further parameters are not logged)");
    }
    return;
  }
  alloc_device(id);
  // Zeroed by its first reader (zero_pending), not here: on a
  // host-accessible device the acquire waits for its stream, and the
  // first reader may be the last release, which needs no buffer at all.
  p.grad_zero_pending = true;
}

void BackwardGradients::zero_pending(chunk::Param& p, memory::Stream* s) {
  if (!p.grad_zero_pending) return;
  p.grad_zero_pending = false;
  device_->memset_async(s, p.grad_acc, 0, p.numel * sizeof(float));
}

// p.grad_acc = a device buffer of parameter `id`'s fp32 size, room made
// with its chunk kept in place; PSTAR_ERR_OUT_OF_MEMORY when none can be.
void BackwardGradients::alloc_device(uint32_t id) {
  chunk::Param& p = params_[id];
  const auto& place = layout_->param(id);
  chunk::ChunkState& c = chunks_[place.chunk];
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
void BackwardGradients::accumulate_on_host(chunk::Param& p, const void* grad, pstar_dtype dtype, pstar_mem_space space,
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

void BackwardGradients::write(uint32_t id, const void* grad, uint64_t count, pstar_dtype dtype, pstar_mem_space space,
                              memory::Stream* s) {
  chunk::Param& p = params_[id];
  if (p.grad_acc == nullptr) {
    accumulate_on_host(p, grad, dtype, space, s);
    return;
  }
  // The first contribution onto a buffer that was never zeroed replaces
  // its content: the zeroing and the addition in one pass.
  const bool onto_zero = p.grad_zero_pending;
  p.grad_zero_pending = false;
  if (onto_zero && packs(p, dtype)) {
    // The last use's first contribution, in the compute dtype: finalized
    // now, from the caller's gradient while it is in cache, into the
    // buffer's first bytes (the release copies it into the slot).
    device_->grad_pack(s, p.grad_acc, grad, dtype, space, count, &p.grad_sumsq, &p.grad_nonfinite);
    p.grad_packed = true;
  } else {
    unpack(p, s);
    device_->grad_accumulate(s, p.grad_acc, grad, dtype, space, count, onto_zero);
  }
  // A host source may be reused as soon as this returns; on the emulated
  // device the caller's compute is host code, so it sees the result now.
  if (space == PSTAR_MEM_HOST || device_->host_accessible()) device_->synchronize(s);
}

// Packing (Param::grad_packed): the sum of one contribution is its
// finalize, so the fp32 pass over the buffer (4 B per element written by
// the addition, read again by the finalize) is skipped where that sum is
// all there will be: the parameter's last backward use (a tied weight's
// earlier uses add into fp32 as before), its gradient in the compute dtype,
// one process without accumulation (the reduce-scatter and the fold read
// fp32 sums), on a device that packs.  A second contribution to the same
// use unpacks first; the bits are those of the fp32 path either way
// (host_grad_pack).
bool BackwardGradients::packs(const chunk::Param& p, pstar_dtype dtype) const {
  return dtype == compute_dtype_ && payloads_ && device_->packs_gradients() && !group_.sharded() &&
         !grad_accumulation_ && p.backward_uses == p.forward_uses;
}

void BackwardGradients::unpack(chunk::Param& p, memory::Stream* s) {
  if (!p.grad_packed) return;
  p.grad_packed = false;
  device_->grad_unpack(s, p.grad_acc, compute_dtype_, p.numel);
}

void BackwardGradients::check_write(const char* what, const chunk::Param& p, const void* grad, uint64_t count,
                                    pstar_dtype dtype, pstar_mem_space space) const {
  const std::string w(what);
  require(dtype_valid(dtype), PSTAR_ERR_INVALID_ARGUMENT, [&] { return w + ": unknown dtype"; });
  require(space == PSTAR_MEM_HOST || space == PSTAR_MEM_DEVICE, PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return w + ": unknown memory space"; });
  require(count == p.numel, PSTAR_ERR_INVALID_ARGUMENT, [&] {
    return w + ": count " + std::to_string(count) + " differs from the element count " + std::to_string(p.numel) +
           " of '" + p.name + "'";
  });
  require(grad != nullptr || count == 0 || !payloads_, PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return w + ": grad is NULL"; });
  if (payloads_) device_->check_caller_buffer(grad, count * dtype_size(dtype), space, what);
}

bool BackwardGradients::defer_to_slot(uint32_t id, const void* grad, pstar_dtype dtype, pstar_mem_space space) {
  chunk::Param& p = params_[id];
  deferred_ = Deferred{};
  if (p.grad_acc == nullptr || !p.grad_zero_pending || !packs(p, dtype)) return false;
  deferred_ = Deferred{id, grad, dtype, space};
  return true;
}

float* BackwardGradients::slot_acquire(uint32_t id, memory::Stream* s) {
  chunk::Param& p = params_[id];
  if (p.grad_acc == nullptr) {
    alloc_device(id);
    device_->copy_async(s, p.grad_acc, p.grad_host, p.numel * sizeof(float), memory::CopyKind::kHostToDevice);
  }
  unpack(p, s);
  zero_pending(p, s);
  if (device_->host_accessible()) device_->synchronize(s);
  return p.grad_acc;
}

void BackwardGradients::end_use(chunk::Param& p, bool last_use, memory::Stream* s) {
  if (p.grad_acc == nullptr || p.grad_host == nullptr) return;  // nothing borrowed
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

memory::EventPtr BackwardGradients::finalize_into_slot(uint32_t id, memory::Stream* s) {
  chunk::Param& p = params_[id];
  const auto& place = layout_->param(id);
  void* slot = static_cast<char*>(chunks_[place.chunk].device) + place.offset_elems * elem_bytes();
  const uint64_t slot_bytes = p.numel * elem_bytes();
  memory::EventPtr done;
  if (p.grad_host != nullptr) {
    // After the caller's work reading the slot on `s`: the host sum,
    // finalized in host staging, goes up in the compute dtype.
    void* staging = host_->acquire(slot_bytes);
    p.grad_sumsq = 0.0;
    p.grad_nonfinite = 0;
    if (payloads_)
      memory::host_grad_finalize(p.grad_host, staging, compute_dtype_, p.numel, &p.grad_sumsq, &p.grad_nonfinite);
    host_->release(p.grad_host, p.numel * sizeof(float));
    p.grad_host = nullptr;
    device_->copy_async(s, slot, staging, slot_bytes, memory::CopyKind::kHostToDevice);
    done = device_->record(s);
    placement_->defer_free_host(done, staging, slot_bytes);
  } else {
    if (p.grad_zero_pending && deferred_.grad != nullptr && deferred_.id == id) {
      // pstar_grad_write_release of the only contribution: finalized from
      // the caller's gradient straight into the slot (the caller reads the
      // weight no more), its norm too.  The buffer was never written.
      const Deferred d = deferred_;
      deferred_ = Deferred{};
      p.grad_zero_pending = false;
      device_->grad_pack(s, slot, d.grad, d.dtype, d.space, p.numel, &p.grad_sumsq, &p.grad_nonfinite);
      // The caller may reuse its gradient once the call returns.
      device_->synchronize(s);
    } else if (p.grad_zero_pending) {
      // No contribution came: the finalize of a +0 sum is +0 in every
      // dtype (all bits clear), a squared sum of +0 and no non-finite
      // value, written without a pass over the buffer.
      p.grad_zero_pending = false;
      device_->memset_async(s, slot, 0, slot_bytes);
      p.grad_sumsq = 0.0;
      p.grad_nonfinite = 0;
    } else if (p.grad_packed) {
      // Finalized at its write (its norm too): a copy into the slot.
      p.grad_packed = false;
      device_->copy_async(s, slot, p.grad_acc, slot_bytes, memory::CopyKind::kDeviceToDevice);
    } else {
      device_->grad_finalize(s, p.grad_acc, slot, compute_dtype_, p.numel, &p.grad_sumsq, &p.grad_nonfinite);
    }
    done = device_->record(s);
    placement_->defer_free_device(done, p.grad_acc, p.numel * sizeof(float), Use::kGradients);
    p.grad_acc = nullptr;
  }
  // The gradient replaces the weight in the slot; overflow and norm are
  // known from here on, before the step begins.
  p.slot_is_grad = true;
  p.has_grad = true;
  return done;
}

void BackwardGradients::discard(const memory::EventPtr& done) {
  for (uint32_t id = 0; id < params_.size(); ++id) {
    chunk::Param& p = params_[id];
    if (p.grad_acc != nullptr) {
      placement_->defer_free_device(done, p.grad_acc, p.numel * sizeof(float), Use::kGradients);
      p.grad_acc = nullptr;
      p.grad_zero_pending = false;
      p.grad_packed = false;
    }
    if (p.grad_host != nullptr) {
      placement_->defer_free_host(done, p.grad_host, p.numel * sizeof(float));
      p.grad_host = nullptr;
    }
  }
}

void BackwardGradients::release_all() {
  for (uint32_t id = 0; id < params_.size(); ++id) {
    chunk::Param& p = params_[id];
    if (p.grad_acc != nullptr) device_->deallocate(p.grad_acc, p.numel * sizeof(float));
    p.grad_acc = nullptr;
    p.grad_packed = false;
    if (p.grad_host != nullptr) host_->release(p.grad_host, p.numel * sizeof(float));
    p.grad_host = nullptr;
  }
}

}  // namespace pstar::step
