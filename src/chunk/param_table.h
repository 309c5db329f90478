// ParamTable: the parameters registered with one engine, by id (the order of
// registration) and by name, each with its shape, flags, parameter group,
// tensor state (chunk/tensor_state.h) and this iteration's gradient
// bookkeeping.  Registration validates what the caller passes; every state
// change goes through the transition table, so an illegal event is refused
// before anything changes.
//
// The table knows no chunks' payloads and no tiers: where a parameter's
// elements are is the layout's (chunk/layout.h), what is done with them the
// engine's and the step's.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "chunk/tensor_state.h"
#include "memory/device.h"
#include "pstar/pstar.h"

namespace pstar::chunk {

// Most dimensions a parameter may have.
constexpr uint32_t kMaxNdim = 16;
// Largest element count of one parameter (2^48).
constexpr uint64_t kMaxNumel = uint64_t{1} << 48;

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  uint32_t flags = 0;
  float lr_scale = 1.0f;     // parameter group: learning-rate multiplier
  bool weight_decay = true;  // parameter group: takes weight decay
  TensorState state = TensorState::kFree;
  pstar_stage acquired_stage = PSTAR_STAGE_FORWARD;  // meaningful in kCompute
  uint32_t forward_uses = 0;                         // this iteration
  uint32_t backward_uses = 0;                        // this iteration; <= forward_uses
  bool slot_is_grad = false;                         // the compute slot holds the gradient
  bool has_grad = false;                             // a gradient arrived this iteration
  // world > 1: the gradient in grad_acc is final for this (micro-)batch
  // and waits for its chunk's reduce-scatter; grad_ready completes when
  // the queued work writing grad_acc is done.
  bool grad_pending = false;
  memory::EventPtr grad_ready;
  // The fp32 accumulator of this iteration's backward uses: on the device
  // (grad_acc), or, when the device has no room for it, on the host
  // (grad_host; step/backward_gradients.h).  At most one holds the running
  // sum: grad_acc when it is set (a pstar_grad_slot_acquire() use of a
  // host-accumulated parameter borrows a device buffer for that use),
  // grad_host otherwise.
  float* grad_acc = nullptr;
  float* grad_host = nullptr;
  // grad_acc holds the sum of no contribution yet and has not been zeroed:
  // zeroing waits for the first reader (step/backward_gradients.h), so a
  // parameter whose last use comes with no gradient costs no pass over a
  // 4 B/element buffer.
  bool grad_zero_pending = false;
  // grad_acc holds the finalized gradient of the parameter's one
  // contribution, in the compute dtype (its first bytes), and grad_sumsq
  // and grad_nonfinite its norm, instead of an fp32 sum: the last backward
  // use's first contribution, on a device that packs (Device::
  // packs_gradients()).  A second contribution unpacks it first.
  bool grad_packed = false;
  // Written by the device when the gradient is finalized.
  double grad_sumsq = 0.0;
  int grad_nonfinite = 0;
  uint32_t pins = 0;               // outstanding pstar_param_pin exports of the master
  std::vector<bool> pin_writable;  // per outstanding pin, oldest first
  bool frozen() const { return (flags & PSTAR_PARAM_FROZEN) != 0; }
};

class ParamTable {
 public:
  // Validates a registration (pstar_param_register's errors) and appends
  // the parameter in state kFree; returns its id.
  uint32_t add(const char* name, uint32_t ndim, const int64_t* shape, uint32_t flags);
  // The id of `name`; PSTAR_ERR_NOT_FOUND when none has it.
  uint32_t find(const char* name) const;
  // Parameter `id`; PSTAR_ERR_NOT_FOUND when there is none.
  Param& checked(uint32_t id);
  const Param& checked(uint32_t id) const;

  Param& operator[](uint32_t id) { return params_[id]; }
  const Param& operator[](uint32_t id) const { return params_[id]; }
  uint32_t size() const { return static_cast<uint32_t>(params_.size()); }
  std::vector<Param>::iterator begin() { return params_.begin(); }
  std::vector<Param>::iterator end() { return params_.end(); }
  std::vector<Param>::const_iterator begin() const { return params_.begin(); }
  std::vector<Param>::const_iterator end() const { return params_.end(); }

  // The state event `ev` takes parameter `id` to; PSTAR_ERR_INVALID_STATE,
  // naming the parameter, when the table has no such transition.
  TensorState next_state(uint32_t id, TensorEvent ev) const;
  void apply(uint32_t id, TensorEvent ev) { params_[id].state = next_state(id, ev); }
  // PSTAR_ERR_INVALID_STATE when a parameter is still acquired (kCompute):
  // "<what>: parameter N ('name') is still acquired".
  void require_none_acquired(const char* what) const;
  // Refuses (PSTAR_ERR_INVALID_STATE, `what` names the call) while some
  // parameter's backward is part way: backward uses begun but fewer than
  // its forward uses.  A parameter no backward use reached passes (it gets
  // no update).
  void require_backward_complete(const char* what) const;

 private:
  std::vector<Param> params_;
  std::unordered_map<std::string, uint32_t> by_name_;
};

}  // namespace pstar::chunk
