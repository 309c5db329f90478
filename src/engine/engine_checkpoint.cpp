// The engine's side of checkpoints and the safetensors export
// (docs/checkpoints.md): collecting each parameter's values from its chunks
// (or this rank's shards) for a save, the ranks' agreement in a sharded save
// and load, and the all-or-nothing load sequence that writes them back.  The
// format itself (the manifest, durable and checked files, the crash points,
// safetensors) is src/checkpoint/'s; this file fills it and applies it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "engine/engine.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/log.h"

#ifndef PSTAR_VERSION_STRING
#include "pstar/version.h"
#endif

namespace pstar::engine {

namespace {

using checkpoint::CheckedWriter;
using checkpoint::DataFile;
using checkpoint::join_path;
using checkpoint::kListFiles;
using checkpoint::list_file;
using checkpoint::ManifestParam;
using checkpoint::ManifestPiece;

const char* dtype_text(pstar_dtype d) { return d == PSTAR_DTYPE_F32 ? "f32" : d == PSTAR_DTYPE_F16 ? "f16" : "bf16"; }

}  // namespace

// ---------------------------------------------------------------------------
// What save, load and export need: a path, a built engine with values,
// between iterations; `one_process`: not sharded (save and load).

void Engine::require_file_call(const char* what, const char* path, bool one_process) const {
  require(path != nullptr && path[0] != '\0', PSTAR_ERR_INVALID_ARGUMENT,
          [&] { return std::string(what) + ": the path is NULL or empty"; });
  require_built(what);
  require(!iteration_active_, PSTAR_ERR_INVALID_STATE,
          [&] { return std::string(what) + ": legal only between iterations"; });
  require(payloads_, PSTAR_ERR_UNSUPPORTED, [&] { return std::string(what) + ": a dry run holds no values"; });
  require(!one_process || !sharded(), PSTAR_ERR_UNSUPPORTED,
          [&] { return std::string(what) + ": not available with world_size > 1"; });
}

// ---------------------------------------------------------------------------
// State of one parameter, wherever it lives

void Engine::read_state(uint32_t id, int list, float* out) {
  const auto& place = layout_->param(id);
  const Param& p = params_[id];
  if (p.numel == 0) return;  // `out` may be NULL (an empty vector's data())
  ChunkState& c = chunks_[place.chunk];
  nvme_.access(place.chunk, false);
  float* base = list == 0 ? c.master : list == 1 ? c.exp_avg : c.exp_avg_sq;
  if (c.opt_device != nullptr) {
    sync_optimizer(place.chunk);
    copy_sync(out, base + place.offset_elems, p.numel * sizeof(float), memory::CopyKind::kDeviceToHost);
  } else {
    std::memcpy(out, base + place.offset_elems, p.numel * sizeof(float));
  }
}

void Engine::write_state(uint32_t id, int list, const float* in) {
  const auto& place = layout_->param(id);
  const Param& p = params_[id];
  if (p.numel == 0) return;  // `in` may be NULL
  ChunkState& c = chunks_[place.chunk];
  nvme_.access(place.chunk, true);
  float* base = list == 0 ? c.master : list == 1 ? c.exp_avg : c.exp_avg_sq;
  if (c.opt_device != nullptr) {
    sync_optimizer(place.chunk);
    copy_sync(base + place.offset_elems, in, p.numel * sizeof(float), memory::CopyKind::kHostToDevice);
  } else {
    std::memcpy(base + place.offset_elems, in, p.numel * sizeof(float));
  }
}

// ---------------------------------------------------------------------------
// Save

// Saving.  One process: the four list files, parameter by parameter, then
// the manifest, then LATEST.  Sharded (world > 1; the directory must be one
// that every rank reaches, e.g. a shared file system): rank 0 creates the
// subdirectory and the ranks learn its name (an all-gather); every rank
// writes its four files, holding for each parameter the elements that lie
// in its shards, in parameter order; an all-gather brings every rank's
// sizes and checksums (or its failure) to all; rank 0 writes the manifest,
// with a "piece" line per (parameter, rank) saying where each part lies,
// and moves LATEST last; a final all-gather tells every rank whether that
// worked, so all return the same status.  Every step's failure on one rank
// fails the save on all, with the previous checkpoint intact.
std::string Engine::checkpoint_save(const char* dir_c) {
  require_file_call("checkpoint_save", dir_c, false);
  require_load_complete("checkpoint_save");
#if !defined(PSTAR_HAVE_XXHASH)
  throw Error(PSTAR_ERR_UNSUPPORTED,
              "checkpoint_save: this libpstar was built without xxhash (libxxhash-dev): no checksums, no checkpoints");
#else
  const std::string dir = dir_c;
  // Rank 0 creates a new subdirectory for every save.
  std::string name, failure;
  if (group_.rank() == 0) {
    try {
      name = checkpoint::create_checkpoint_dir(dir, optimizer_.step());
    } catch (const Error& e) {
      if (!sharded()) throw;
      failure = e.what();
    }
  }
  if (sharded()) {
    // Rank 0's name (empty: it failed) to every rank.
    constexpr size_t kNameBytes = 64;
    char mine[kNameBytes] = {0};
    std::snprintf(mine, sizeof mine, "%s", name.c_str());
    std::vector<char> all(kNameBytes * static_cast<size_t>(group_.world()));
    checkpoint_all_gather(mine, all.data(), kNameBytes);
    name.assign(all.data(), strnlen(all.data(), kNameBytes));
    if (name.empty()) {
      throw Error(PSTAR_ERR_IO, failure.empty() ? "checkpoint_save: rank 0 could not create the checkpoint's directory "
                                                  "under '" +
                                                      dir + "'"
                                                : failure);
    }
  }
  const std::string sub = join_path(dir, name);
  checkpoint::CrashPoints crash;

  // The four list files: this rank's elements of every parameter (all of
  // them in one process).  Pieces and offsets are a function of the layout,
  // so rank 0 can describe every rank's files.
  auto piece_of = [&](uint32_t id, int r, uint64_t* a, uint64_t* b) {
    if (!sharded()) {
      *a = layout_->param(id).offset_elems;
      *b = *a + params_[id].numel;
      return true;
    }
    const ShardSpan s = shard_span(id, r);
    *a = s.a;
    *b = s.b;
    return s.a < s.b;
  };
  std::vector<uint64_t> offsets(params_.size(), 0);
  struct Record {
    int32_t ok;
    uint32_t pad;
    uint64_t bytes[4];
    uint64_t xxh3[4];
  };
  Record mine{};
  mine.ok = 1;
  std::vector<float> staging;
  try {
    for (int list = 0; list < 4; ++list) {
      const std::string fname = list_file(list, sharded(), group_.rank());
      CheckedWriter w(join_path(sub, fname));
      uint64_t at = 0;
      for (uint32_t id = 0; id < params_.size(); ++id) {
        const Param& p = params_[id];
        if (p.frozen() != (list == 3)) continue;
        uint64_t a = 0, b = 0;
        if (!piece_of(id, group_.rank(), &a, &b)) continue;
        if (!sharded()) {
          offsets[id] = at;
          staging.resize(p.numel);
          if (list == 3) {
            read(id, staging.data(), p.numel, PSTAR_DTYPE_F32);
          } else {
            read_state(id, list, staging.data());
          }
        } else {
          // This rank's shard of the chunk: the fp32 list, or the compute
          // payload of a frozen parameter.
          const auto& place = layout_->param(id);
          if (list != 3) nvme_.access(place.chunk, false);
          const ChunkState& c = chunks_[place.chunk];
          const uint64_t lo = shard_lo(place.chunk);
          const float* src = list == 0 ? c.master : list == 1 ? c.exp_avg : c.exp_avg_sq;
          staging.resize(b - a);
          for (uint64_t i = a; i < b; ++i) {
            staging[i - a] = list == 3 ? load_as(c.shard, options_.compute_dtype, i - lo) : src[i - lo];
          }
        }
        w.write(staging.data(), staging.size() * sizeof(float));
        at += staging.size();
      }
      mine.xxh3[list] = w.finish();
      mine.bytes[list] = w.bytes();
      crash.pass(kListFiles[list]);
    }
  } catch (const Error& e) {
    if (!sharded()) throw;
    mine.ok = 0;
    failure = e.what();
  }
  std::vector<Record> records(static_cast<size_t>(group_.world()));
  if (sharded()) {
    checkpoint_all_gather(&mine, records.data(), sizeof mine);
    for (int r = 0; r < group_.world(); ++r) {
      if (records[static_cast<size_t>(r)].ok) continue;
      throw Error(PSTAR_ERR_IO, r == group_.rank() ? failure
                                                   : "checkpoint_save: rank " + std::to_string(r) +
                                                         " could not write its shard (its own error says why)");
    }
  } else {
    records[0] = mine;
  }

  // Rank 0: the manifest, written last, then LATEST, replaced atomically.
  if (group_.rank() == 0) {
    try {
      checkpoint::Manifest m;
      checkpoint::Settings& st = m.settings;
      st.library = PSTAR_VERSION_STRING;
      st.compute_dtype = dtype_text(options_.compute_dtype);
      st.chunk_elems = options_.chunk_elems;
      st.world_size = static_cast<uint32_t>(group_.world());
      st.sharded = sharded();
      st.step = optimizer_.step();
      st.loss_scale = optimizer_.scaler().scale();
      st.loss_scale_clean_steps = optimizer_.scaler().clean_steps();
      st.loss_scale_hysteresis_left = optimizer_.scaler().hysteresis_left();
      st.adam = optimizer_.hyper();
      st.clip_norm = static_cast<float>(optimizer_.clip_norm());
      for (uint32_t id = 0; id < params_.size(); ++id) {
        const Param& p = params_[id];
        m.params.push_back(
            ManifestParam{p.name, p.shape, p.numel, p.frozen(), offsets[id], p.lr_scale, p.weight_decay});
      }
      for (int r = 0; r < group_.world(); ++r) {
        for (int list = 0; list < 4; ++list) {
          const Record& rec = records[static_cast<size_t>(r)];
          m.files[list_file(list, sharded(), r)] = {rec.bytes[list], rec.xxh3[list]};
        }
        if (!sharded()) continue;
        uint64_t at[2] = {0, 0};  // trainable files, frozen file
        for (uint32_t id = 0; id < params_.size(); ++id) {
          uint64_t a = 0, b = 0;
          if (!piece_of(id, r, &a, &b)) continue;
          uint64_t& off = at[params_[id].frozen() ? 1 : 0];
          m.pieces.push_back(
              ManifestPiece{id, static_cast<uint32_t>(r), a - layout_->param(id).offset_elems, b - a, off});
          off += b - a;
        }
      }
      checkpoint::publish_checkpoint(dir, name, checkpoint::manifest_text(m), crash);
    } catch (const Error& e) {
      if (!sharded()) throw;
      failure = e.what();
    }
  }
  if (sharded()) {
    // Whether rank 0 published the checkpoint.
    int32_t done = group_.rank() == 0 && failure.empty() ? 1 : 0;
    std::vector<int32_t> all(static_cast<size_t>(group_.world()));
    checkpoint_all_gather(&done, all.data(), sizeof done);
    if (!all[0]) {
      throw Error(PSTAR_ERR_IO, group_.rank() == 0
                                    ? failure
                                    : "checkpoint_save: rank 0 could not write the manifest or LATEST of '" + sub +
                                          "' (its own error says why); the previous checkpoint stays");
    }
  }
  log::info("checkpoint saved: " + sub);
  return name;
#endif
}

void Engine::write_state_sharded(uint32_t id, int list, const float* in) {
  const auto& place = layout_->param(id);
  nvme_.access(place.chunk, true);
  ChunkState& c = chunks_[place.chunk];
  float* dst = list == 1 ? c.exp_avg : c.exp_avg_sq;
  const auto [lo, a, b] = shard_span(id, group_.rank());
  for (uint64_t i = a; i < b; ++i) dst[i - lo] = in[i - place.offset_elems];
}

// ---------------------------------------------------------------------------
// Load
//
// All or nothing.  First every check, with nothing in the engine changed:
// LATEST, the manifest's checksum and every line of it, the parameter set,
// each value's range, every piece's place (they must tile each parameter and
// each file exactly, so no read can fall outside a file), every data file's
// size and XXH3-64.  A sharded engine's ranks then agree (an all-gather):
// if any rank refused, every rank returns an error with nothing changed.
// Only then the values are read again, through the descriptors the checks
// opened, and written.  A failure past that point (a read error on a file
// that verified a moment before, a file changed in place meanwhile, an
// NVMe write error) cannot be undone without a second copy of the state,
// so it is recorded (load_incomplete_) and iterations, steps, saves and
// exports are refused until a load completes; in a group every rank
// records it (a second all-gather).

void Engine::require_load_complete(const char* what) const {
  require(load_incomplete_.empty(), PSTAR_ERR_IO, [&] {
    return std::string(what) + ": refused after a checkpoint load that failed part way (" + load_incomplete_ +
           "); load a checkpoint (pstar_checkpoint_load) to go on";
  });
}

void Engine::checkpoint_load(const char* dir_c) {
  require_file_call("checkpoint_load", dir_c, false);
#if !defined(PSTAR_HAVE_XXHASH)
  throw Error(PSTAR_ERR_UNSUPPORTED,
              "checkpoint_load: this libpstar was built without xxhash (libxxhash-dev): no checksums, no checkpoints");
#else
  const std::string dir = dir_c;
  checkpoint::LoadFaults faults;

  // 1. Checks.  What the load will write, and from where.
  std::string sub, manifest_path;
  checkpoint::Manifest m;
  checkpoint::Settings st;
  std::vector<const ManifestParam*> match(params_.size());
  std::vector<std::vector<ManifestPiece> > pieces;
  std::map<std::string, std::unique_ptr<DataFile> > data;
  std::vector<float> staging;
  pstar_status refused = PSTAR_OK;
  std::string why;
  try {
    for (const Param& p : params_) {
      require(p.pins == 0, PSTAR_ERR_BUSY,
              [&] { return "checkpoint_load: '" + p.name + "' is pinned; unpin it first"; });
    }
    sub = join_path(dir, checkpoint::read_latest(dir));
    manifest_path = join_path(sub, "manifest");
    m = checkpoint::parse_manifest(manifest_path);

    // The parameter set: every engine parameter in the checkpoint with the
    // same shape and kind, and nothing else.
    std::map<std::string, const ManifestParam*> by_name;
    for (const ManifestParam& mp : m.params) by_name[mp.name] = &mp;
    for (uint32_t id = 0; id < params_.size(); ++id) {
      const Param& p = params_[id];
      auto it = by_name.find(p.name);
      if (it == by_name.end()) {
        throw Error(PSTAR_ERR_INVALID_ARGUMENT, "checkpoint_load: '" + manifest_path + "' has no parameter '" + p.name +
                                                    "' (the checkpoint is of another parameter set)");
      }
      const ManifestParam& mp = *it->second;
      if (mp.shape != p.shape || mp.numel != p.numel || mp.frozen != p.frozen()) {
        throw Error(PSTAR_ERR_INVALID_ARGUMENT, "checkpoint_load: parameter '" + p.name + "' in '" + manifest_path +
                                                    "' has another shape or is " +
                                                    (mp.frozen ? "frozen" : "trainable") + " there");
      }
      match[id] = &mp;
    }
    if (m.params.size() != params_.size()) {
      std::map<std::string, bool> mine;
      for (const Param& p : params_) mine[p.name] = true;
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
    st = checkpoint::check_settings(m, manifest_path);
    pieces = checkpoint::check_layout(m, st, manifest_path);
    // Every data file whole and unchanged; kept open for the reads below.
    for (uint32_t r = 0; r < st.world_size; ++r) {
      for (int list = 0; list < 4; ++list) {
        const std::string fname = list_file(list, st.sharded, static_cast<int>(r));
        const checkpoint::ManifestFile& f = m.files.at(fname);
        data[fname] = std::make_unique<DataFile>(join_path(sub, fname), f.bytes, f.xxh3);
      }
    }
    uint64_t largest = 0;
    for (const Param& p : params_) largest = std::max(largest, p.numel);
    staging.resize(largest);
    faults.after_checks();
  } catch (const Error& e) {
    if (!sharded()) throw;
    refused = e.status();
    why = e.what();
  } catch (const std::bad_alloc&) {
    if (!sharded()) throw;
    refused = PSTAR_ERR_OUT_OF_MEMORY;
    why = "checkpoint_load: out of host memory while checking the checkpoint";
  }
  // Every rank's verdict (a rank that found the problem keeps its own
  // status and message; the others answer with the lowest such rank's).
  auto agree = [&](pstar_status mine, const std::string& own, const std::string& what, const std::string& tail) {
    const int32_t vote = mine;
    std::vector<int32_t> all(static_cast<size_t>(group_.world()));
    checkpoint_all_gather(&vote, all.data(), sizeof vote);
    for (int r = 0; r < group_.world(); ++r) {
      const auto st = static_cast<pstar_status>(all[static_cast<size_t>(r)]);
      if (st == PSTAR_OK) continue;
      if (mine != PSTAR_OK) throw Error(mine, own + tail);
      throw Error(st, "checkpoint_load: rank " + std::to_string(r) + " " + what + " (its own error says why)" + tail);
    }
  };
  if (sharded()) agree(refused, why, "refused the checkpoint in '" + dir + "'", "; no rank loaded anything");

  // 2. Apply: values (masters and compute copies), then m and v, then the
  // scalars.  Every state is rewritten, so slots on the NVMe drive start
  // from zeros (and are trusted again after an I/O error).  A sharded
  // engine keeps what lies in its own shards.
  load_incomplete_ = "loading '" + sub + "' stopped part way";
  pstar_status failed = PSTAR_OK;
  std::string failure;
  try {
    nvme_.begin_rewrite();
    for (uint32_t id = 0; id < params_.size(); ++id) {
      const Param& p = params_[id];
      const ManifestParam& mp = *match[id];
      const size_t j = static_cast<size_t>(&mp - m.params.data());
      auto read_list = [&](int list) {
        for (const ManifestPiece& pc : pieces[j]) {
          const DataFile& f = *data.at(list_file(list, st.sharded, static_cast<int>(pc.rank)));
          faults.before_read(f);
          f.read(pc.offset, staging.data() + pc.start, pc.count);
        }
      };
      read_list(p.frozen() ? 3 : 0);
      if (sharded()) {
        write_sharded(id, staging.data(), PSTAR_DTYPE_F32);
      } else {
        write(id, staging.data(), p.numel, PSTAR_DTYPE_F32);
      }
      if (p.frozen()) continue;
      for (int list = 1; list <= 2; ++list) {
        read_list(list);
        if (sharded()) {
          write_state_sharded(id, list, staging.data());
        } else {
          write_state(id, list, staging.data());
        }
      }
      params_[id].lr_scale = mp.lr_scale;
      params_[id].weight_decay = mp.weight_decay;
    }
    nvme_.end_rewrite();
    optimizer_.set_step(st.step);
    optimizer_.scaler().restore(st.loss_scale, st.loss_scale_clean_steps, st.loss_scale_hysteresis_left);
    optimizer_.hyper() = st.adam;
    optimizer_.set_clip_norm(st.clip_norm);
  } catch (const Error& e) {
    failed = e.status();
    failure = e.what();
  } catch (const std::exception& e) {
    failed = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ? PSTAR_ERR_OUT_OF_MEMORY : PSTAR_ERR_INTERNAL;
    failure = std::string("checkpoint_load: ") + e.what();
  }
  const std::string consequence = std::string(sharded() ? "; the group's engines hold part of the checkpoint"
                                                        : "; the engine holds part of the checkpoint") +
                                  ": iterations, steps, saves and exports are refused until a load completes";
  if (failed != PSTAR_OK) {
    load_incomplete_ = failure;
    if (!sharded()) throw Error(failed, failure + consequence);
  }
  if (sharded()) {
    try {
      agree(failed, failure, "could not finish loading the checkpoint in '" + dir + "'", consequence);
    } catch (const Error& e) {
      if (load_incomplete_.empty() || failed == PSTAR_OK) load_incomplete_ = e.what();
      throw;
    }
  }
  load_incomplete_.clear();
  log::info("checkpoint loaded: " + sub);
#endif
}

// ---------------------------------------------------------------------------
// safetensors

// The fp32 values of every parameter (masters; frozen ones from their
// compute copies), in registration order (checkpoint/safetensors.h).
void Engine::export_safetensors(const char* path_c) {
  require_file_call("export_safetensors", path_c, false);
  require_load_complete("export_safetensors");
  std::vector<checkpoint::SafetensorsEntry> tensors;
  for (const Param& p : params_) tensors.push_back({p.name, p.shape, p.numel});
  checkpoint::write_safetensors(path_c, tensors, "libpstar " PSTAR_VERSION_STRING,
                                [&](size_t id, std::vector<float>& out) {
                                  read(static_cast<uint32_t>(id), out.data(), out.size(), PSTAR_DTYPE_F32);
                                });
}

}  // namespace pstar::engine
