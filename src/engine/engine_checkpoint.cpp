// The engine's side of checkpoints and the safetensors export
// (docs/checkpoints.md): the calls' preconditions.  What a checkpoint sees
// of the chunks is values/checkpoint_lists.h; the order of a save and a
// load, the ranks' agreement and the format are src/checkpoint/'s.
#include <string>

#include "checkpoint/engine_state.h"
#include "engine/engine.h"
#include "step/optimizer_step.h"
#include "util/error.h"
#include "values/checkpoint_lists.h"

namespace pstar::engine {
// What save, load and export need: a path, a built engine with values,
// between iterations (sharded engines too: the sequences are collective).
void Engine::require_file_call(const char* what, const char* path) const {
  require(path != nullptr && path[0] != '\0', PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return std::string(what) + ": the path is NULL or empty"; });
  require_built(what);
  require(!iteration_active_, PSTAR_ERR_INVALID_STATE,
          [&] { return std::string(what) + ": legal only between iterations"; });
  require(payloads_, PSTAR_ERR_UNSUPPORTED, [&] { return std::string(what) + ": a dry run holds no values"; });
}

// After a load that failed part way (checkpoint/load.cpp).
void Engine::require_load_complete(const char* what) const {
  require(load_incomplete_.empty(), PSTAR_ERR_IO, [&] {
    return std::string(what) + ": refused after a checkpoint load that failed part way (" + load_incomplete_ +
           "); load a checkpoint (pstar_checkpoint_load) to go on";
  });
}

values::CheckpointLists Engine::checkpoint_lists() {
  return values::CheckpointLists(value_parts(), params_, *host_, *values_, optimizer_, *layout_, options_.compute_dtype,
                                 options_.chunk_elems, state_format(), master_format());
}

std::string Engine::checkpoint_save(const char* dir) {
  require_file_call("checkpoint_save", dir);
  step_->wait();
  require_load_complete("checkpoint_save");
  values::CheckpointLists state = checkpoint_lists();
  return checkpoint::save(state, dir);
}

void Engine::checkpoint_load(const char* dir) {
  require_file_call("checkpoint_load", dir);
  // The load rewrites every state: a failure of the update thread is
  // cleared by it, so the step in flight is waited for without rethrowing.
  step_->wait_noexcept();
  values::CheckpointLists state = checkpoint_lists();
  checkpoint::load(state, dir, load_incomplete_);
  step_->clear_failure();
}

void Engine::export_safetensors(const char* path) {
  require_file_call("export_safetensors", path);
  step_->wait();
  require_load_complete("export_safetensors");
  values::CheckpointLists state = checkpoint_lists();
  checkpoint::export_safetensors(state, path);
}

}  // namespace pstar::engine
