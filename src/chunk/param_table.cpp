#include "chunk/param_table.h"

#include <limits>

#include "util/error.h"

namespace pstar::chunk {

uint32_t ParamTable::add(const char* name, uint32_t ndim, const int64_t* shape, uint32_t flags) {
  require(name != nullptr && name[0] != '\0', PSTAR_ERR_INVALID_ARGUMENT, "param_register: name is NULL or empty");
  require(ndim <= kMaxNdim, PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return "param_register: ndim " + std::to_string(ndim) + " exceeds " + std::to_string(kMaxNdim); });
  require(ndim == 0 || shape != nullptr, PSTAR_ERR_INVALID_ARGUMENT, "param_register: shape is NULL");
  const uint32_t known = PSTAR_PARAM_FROZEN | PSTAR_PARAM_NO_WEIGHT_DECAY;
  require((flags & ~known) == 0, PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return "param_register: unknown flag bits " + std::to_string(flags & ~known); });
  require(by_name_.find(name) == by_name_.end(), PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return std::string("param_register: a parameter named '") + name + "' exists"; });
  require(params_.size() < std::numeric_limits<uint32_t>::max(), PSTAR_ERR_INVALID_ARGUMENT,
          "param_register: too many parameters");
  uint64_t numel = 1;
  for (uint32_t d = 0; d < ndim; ++d) {
    require(shape[d] >= 0, PSTAR_ERR_INVALID_ARGUMENT,
            [&] { return "param_register: extent " + std::to_string(d) + " of '" + name + "' is negative"; });
    const uint64_t e = static_cast<uint64_t>(shape[d]);
    require(e == 0 || numel <= kMaxNumel / e, PSTAR_ERR_INVALID_ARGUMENT,
            [&] { return std::string("param_register: '") + name + "' has more than 2^48 elements"; });
    numel *= e;
  }
  Param p;
  p.name = name;
  p.shape.assign(shape, shape + ndim);
  p.numel = numel;
  p.flags = flags;
  p.weight_decay = (flags & PSTAR_PARAM_NO_WEIGHT_DECAY) == 0;
  const auto id = static_cast<uint32_t>(params_.size());
  params_.push_back(std::move(p));
  by_name_.emplace(params_.back().name, id);
  return id;
}

uint32_t ParamTable::find(const char* name) const {
  require(name != nullptr, PSTAR_ERR_INVALID_ARGUMENT, "param_find: name is NULL");
  auto it = by_name_.find(name);
  require(it != by_name_.end(), PSTAR_ERR_NOT_FOUND, [&] { return std::string("no parameter named '") + name + "'"; });
  return it->second;
}

Param& ParamTable::checked(uint32_t id) {
  require(id < params_.size(), PSTAR_ERR_NOT_FOUND, [&] {
    return "no parameter with id " + std::to_string(id) + " (" + std::to_string(params_.size()) + " registered)";
  });
  return params_[id];
}

const Param& ParamTable::checked(uint32_t id) const { return const_cast<ParamTable*>(this)->checked(id); }

TensorState ParamTable::next_state(uint32_t id, TensorEvent ev) const {
  const Param& p = params_[id];
  TensorState next;
  if (!transition(p.state, ev, &next)) {
    throw Error(PSTAR_ERR_INVALID_STATE, std::string(event_name(ev)) + " of parameter " + std::to_string(id) + " ('" +
                                             p.name + "') is illegal in state " + state_name(p.state));
  }
  return next;
}

void ParamTable::require_none_acquired(const char* what) const {
  for (uint32_t id = 0; id < params_.size(); ++id) {
    require(params_[id].state != TensorState::kCompute, PSTAR_ERR_INVALID_STATE, [&] {
      return std::string(what) + ": parameter " + std::to_string(id) + " ('" + params_[id].name +
             "') is still acquired";
    });
  }
}

void ParamTable::require_backward_complete(const char* what) const {
  for (uint32_t id = 0; id < params_.size(); ++id) {
    const Param& p = params_[id];
    require(p.backward_uses == 0 || p.backward_uses == p.forward_uses, PSTAR_ERR_INVALID_STATE, [&] {
      return std::string(what) + ": parameter " + std::to_string(id) + " ('" + p.name + "') had " +
             std::to_string(p.backward_uses) + " backward uses for " + std::to_string(p.forward_uses) + " forward uses";
    });
  }
}

}  // namespace pstar::chunk
