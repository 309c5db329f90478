// The load sequence (engine_state.h): all or nothing.  This file owns the
// order of a load: every check before the first write, the ranks'
// agreement, then the writes, and what a failure part way leaves recorded.
// The manifest's reading and the data files' verification are manifest.h's
// and files.h's; the values go back through EngineState, so this file knows
// nothing of chunks, shards or where a list lives.
//
// First every check, with nothing in the engine changed: LATEST, the
// manifest's checksum and every line of it, the parameter set, each value's
// range, every piece's place (they must tile each parameter and each file
// exactly, so no read can fall outside a file), every data file's size and
// XXH3-64.  A sharded engine's ranks then agree (an all-gather): if any
// rank refused, every rank returns an error with nothing changed.  Only
// then the values are read again, through the descriptors the checks
// opened, and written.  A failure past that point (a read error on a file
// that verified a moment before, a file changed in place meanwhile, an NVMe
// write error) cannot be undone without a second copy of the state, so it
// is recorded (`incomplete`) and the engine refuses iterations, steps,
// saves and exports until a load completes; in a group every rank records
// it (a second all-gather).
#include <algorithm>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "checkpoint/engine_state.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "util/error.h"
#include "util/log.h"

namespace pstar::checkpoint {

#if !defined(PSTAR_HAVE_XXHASH)

void load(EngineState&, const std::string&, std::string&) {
  throw Error(PSTAR_ERR_UNSUPPORTED,
              "checkpoint_load: this libpstar was built without xxhash (libxxhash-dev): no checksums, no checkpoints");
}

#else

void load(EngineState& s, const std::string& dir, std::string& incomplete) {
  const bool sharded = s.sharded();
  const int world = s.world();
  const uint32_t n = s.param_count();
  LoadFaults faults;

  // 1. Checks.  What the load will write, and from where.
  std::string sub, manifest_path;
  Manifest m;
  Settings st;
  std::vector<const ManifestParam*> match(n);
  std::vector<std::vector<ManifestPiece> > pieces;
  std::map<std::string, std::unique_ptr<DataFile> > data;
  std::vector<float> staging;
  pstar_status refused = PSTAR_OK;
  std::string why;
  try {
    for (uint32_t id = 0; id < n; ++id) {
      const ParamView p = s.param(id);
      require(!p.pinned, PSTAR_ERR_BUSY, [&] { return "checkpoint_load: '" + p.name + "' is pinned; unpin it first"; });
    }
    sub = join_path(dir, read_latest(dir));
    manifest_path = join_path(sub, "manifest");
    m = parse_manifest(manifest_path);

    // The parameter set: every engine parameter in the checkpoint with the
    // same shape and kind, and nothing else.
    std::map<std::string, const ManifestParam*> by_name;
    for (const ManifestParam& mp : m.params) by_name[mp.name] = &mp;
    for (uint32_t id = 0; id < n; ++id) {
      const ParamView p = s.param(id);
      auto it = by_name.find(p.name);
      if (it == by_name.end()) {
        throw Error(PSTAR_ERR_INVALID_ARGUMENT, "checkpoint_load: '" + manifest_path + "' has no parameter '" + p.name +
                                                    "' (the checkpoint is of another parameter set)");
      }
      const ManifestParam& mp = *it->second;
      if (mp.shape != p.shape || mp.numel != p.numel || mp.frozen != p.frozen) {
        throw Error(PSTAR_ERR_INVALID_ARGUMENT, "checkpoint_load: parameter '" + p.name + "' in '" + manifest_path +
                                                    "' has another shape or is " +
                                                    (mp.frozen ? "frozen" : "trainable") + " there");
      }
      match[id] = &mp;
    }
    if (m.params.size() != n) {
      std::map<std::string, bool> mine;
      for (uint32_t id = 0; id < n; ++id) mine[s.param(id).name] = true;
      for (const ManifestParam& mp : m.params) {
        if (mine.count(mp.name) == 0) {
          throw Error(PSTAR_ERR_INVALID_ARGUMENT, "checkpoint_load: '" + manifest_path + "' has parameter '" + mp.name +
                                                      "', which this engine does not register");
        }
      }
    }

    // The scalars, each in the range its setter accepts; then where each
    // parameter's values lie (the pieces must tile each parameter, and each
    // rank's files, exactly: no read can fall outside a file).
    st = check_settings(m, manifest_path);
    // The moments' format is fixed for an engine's life: a checkpoint of
    // another format is refused, not converted (a conversion would change
    // the optimizer's numbers silently).
    if (st.state_format != s.state_format()) {
      throw Error(PSTAR_ERR_INVALID_ARGUMENT, "checkpoint_load: '" + manifest_path +
                                                  "' holds Adam states saved in the " + st.state_format +
                                                  " format; this engine's state_format is " + s.state_format() +
                                                  " (create the engine with the checkpoint's)");
    }
    if (st.master_format != s.master_format()) {
      throw Error(PSTAR_ERR_INVALID_ARGUMENT, "checkpoint_load: '" + manifest_path + "' holds " + st.master_format +
                                                  " masters; this engine's master_format is " + s.master_format() +
                                                  " (create the engine with the checkpoint's)");
    }
    pieces = check_layout(m, st, manifest_path);
    // Every data file whole and unchanged; kept open for the reads below.
    for (uint32_t r = 0; r < st.world_size; ++r) {
      for (int list = 0; list < 4; ++list) {
        const std::string fname = list_file(list, st.sharded, static_cast<int>(r));
        const ManifestFile& f = m.files.at(fname);
        data[fname] = std::make_unique<DataFile>(join_path(sub, fname), f.bytes, f.xxh3);
      }
    }
    uint64_t largest = 0;
    for (uint32_t id = 0; id < n; ++id) largest = std::max(largest, s.param(id).numel);
    staging.resize(largest);
    faults.after_checks();
  } catch (const Error& e) {
    if (!sharded) throw;
    refused = e.status();
    why = e.what();
  } catch (const std::bad_alloc&) {
    if (!sharded) throw;
    refused = PSTAR_ERR_OUT_OF_MEMORY;
    why = "checkpoint_load: out of host memory while checking the checkpoint";
  }
  // Every rank's verdict (a rank that found the problem keeps its own
  // status and message; the others answer with the lowest such rank's).
  auto agree = [&](pstar_status mine, const std::string& own, const std::string& what, const std::string& tail) {
    const int32_t vote = mine;
    std::vector<int32_t> all(static_cast<size_t>(world));
    s.all_gather(&vote, all.data(), sizeof vote);
    for (int r = 0; r < world; ++r) {
      const auto st = static_cast<pstar_status>(all[static_cast<size_t>(r)]);
      if (st == PSTAR_OK) continue;
      if (mine != PSTAR_OK) throw Error(mine, own + tail);
      throw Error(st, "checkpoint_load: rank " + std::to_string(r) + " " + what + " (its own error says why)" + tail);
    }
  };
  if (sharded) agree(refused, why, "refused the checkpoint in '" + dir + "'", "; no rank loaded anything");

  // 2. Apply: values (masters and compute copies), then m and v, then the
  // scalars.  Every state is rewritten.  A sharded engine keeps what lies
  // in its own shards.
  incomplete = "loading '" + sub + "' stopped part way";
  pstar_status failed = PSTAR_OK;
  std::string failure;
  try {
    s.begin_rewrite();
    for (uint32_t id = 0; id < n; ++id) {
      const bool frozen = s.param(id).frozen;
      const ManifestParam& mp = *match[id];
      const size_t j = static_cast<size_t>(&mp - m.params.data());
      auto read_list = [&](int list) {
        for (const ManifestPiece& pc : pieces[j]) {
          const DataFile& f = *data.at(list_file(list, st.sharded, static_cast<int>(pc.rank)));
          faults.before_read(f);
          f.read(pc.offset, staging.data() + pc.start, pc.count);
        }
      };
      read_list(frozen ? 3 : 0);
      s.write_list(id, frozen ? 3 : 0, staging.data());
      if (frozen) continue;
      for (int list = 1; list <= 2; ++list) {
        read_list(list);
        s.write_list(id, list, staging.data());
      }
      s.set_param_group(id, mp.lr_scale, mp.weight_decay);
    }
    s.end_rewrite();
    optim::Optimizer& opt = s.optimizer();
    opt.set_step(st.step);
    opt.scaler().restore(st.loss_scale, st.loss_scale_clean_steps, st.loss_scale_hysteresis_left);
    opt.hyper() = st.adam;
    opt.set_clip_norm(st.clip_norm);
  } catch (const Error& e) {
    failed = e.status();
    failure = e.what();
  } catch (const std::exception& e) {
    failed = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ? PSTAR_ERR_OUT_OF_MEMORY : PSTAR_ERR_INTERNAL;
    failure = std::string("checkpoint_load: ") + e.what();
  }
  const std::string consequence = std::string(sharded ? "; the group's engines hold part of the checkpoint"
                                                      : "; the engine holds part of the checkpoint") +
                                  ": iterations, steps, saves and exports are refused until a load completes";
  if (failed != PSTAR_OK) {
    incomplete = failure;
    if (!sharded) throw Error(failed, failure + consequence);
  }
  if (sharded) {
    try {
      agree(failed, failure, "could not finish loading the checkpoint in '" + dir + "'", consequence);
    } catch (const Error& e) {
      if (incomplete.empty() || failed == PSTAR_OK) incomplete = e.what();
      throw;
    }
  }
  incomplete.clear();
  log::info("checkpoint loaded: " + sub);
}

#endif

}  // namespace pstar::checkpoint
