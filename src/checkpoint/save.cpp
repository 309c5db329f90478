// The save sequence and the safetensors export (engine_state.h): what goes
// into each list file and the manifest, in what order, and how the ranks of
// a sharded save agree.  The files' durability and the manifest's text are
// files.h's and manifest.h's; the values come through EngineState, so this
// file knows nothing of chunks, shards or where a list lives.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/engine_state.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "util/error.h"
#include "util/log.h"

#ifndef PSTAR_VERSION_STRING
#include "pstar/version.h"
#endif

namespace pstar::checkpoint {

#if !defined(PSTAR_HAVE_XXHASH)

std::string save(EngineState&, const std::string&) {
  throw Error(PSTAR_ERR_UNSUPPORTED,
              "checkpoint_save: this libpstar was built without xxhash (libxxhash-dev): no checksums, no checkpoints");
}

#else

namespace {

const char* dtype_text(pstar_dtype d) { return d == PSTAR_DTYPE_F32 ? "f32" : d == PSTAR_DTYPE_F16 ? "f16" : "bf16"; }

}  // namespace

// One process: the four list files, parameter by parameter, then the
// manifest, then LATEST.  Sharded (world > 1; the directory must be one
// that every rank reaches, e.g. a shared file system): rank 0 creates the
// subdirectory and the ranks learn its name (an all-gather); every rank
// writes its four files, holding for each parameter the elements that lie
// in its shards, in parameter order; an all-gather brings every rank's
// sizes and checksums (or its failure) to all; rank 0 writes the manifest,
// with a "piece" line per (parameter, rank) saying where each part lies,
// and moves LATEST last; a final all-gather tells every rank whether that
// worked, so all return the same status.  Every step's failure on one rank
// fails the save on all, with the previous checkpoint intact.
std::string save(EngineState& s, const std::string& dir) {
  const bool sharded = s.sharded();
  const int rank = s.rank(), world = s.world();
  // Rank 0 creates a new subdirectory for every save.
  std::string name, failure;
  if (rank == 0) {
    try {
      name = create_checkpoint_dir(dir, s.optimizer().step());
    } catch (const Error& e) {
      if (!sharded) throw;
      failure = e.what();
    }
  }
  if (sharded) {
    // Rank 0's name (empty: it failed) to every rank.
    constexpr size_t kNameBytes = 64;
    char mine[kNameBytes] = {0};
    std::snprintf(mine, sizeof mine, "%s", name.c_str());
    std::vector<char> all(kNameBytes * static_cast<size_t>(world));
    s.all_gather(mine, all.data(), kNameBytes);
    name.assign(all.data(), strnlen(all.data(), kNameBytes));
    if (name.empty()) {
      throw Error(PSTAR_ERR_IO, failure.empty() ? "checkpoint_save: rank 0 could not create the checkpoint's directory "
                                                  "under '" +
                                                      dir + "'"
                                                : failure);
    }
  }
  const std::string sub = join_path(dir, name);
  CrashPoints crash;

  // The four list files: this rank's elements of every parameter (all of
  // them, an empty one too, in one process).  Parts and offsets are a
  // function of the layout, so rank 0 can describe every rank's files.
  auto part_of = [&](uint32_t id, int r, Part* out) {
    *out = s.part(id, r);
    return !sharded || out->count > 0;
  };
  const uint32_t n = s.param_count();
  std::vector<uint64_t> offsets(n, 0);
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
      CheckedWriter w(join_path(sub, list_file(list, sharded, rank)));
      uint64_t at = 0;
      for (uint32_t id = 0; id < n; ++id) {
        if (s.param(id).frozen != (list == 3)) continue;
        Part part;
        if (!part_of(id, rank, &part)) continue;
        if (!sharded) offsets[id] = at;
        staging.resize(part.count);
        s.read_list(id, list, staging.data());
        w.write(staging.data(), staging.size() * sizeof(float));
        at += staging.size();
      }
      mine.xxh3[list] = w.finish();
      mine.bytes[list] = w.bytes();
      crash.pass(kListFiles[list]);
    }
  } catch (const Error& e) {
    if (!sharded) throw;
    mine.ok = 0;
    failure = e.what();
  }
  std::vector<Record> records(static_cast<size_t>(world));
  if (sharded) {
    s.all_gather(&mine, records.data(), sizeof mine);
    for (int r = 0; r < world; ++r) {
      if (records[static_cast<size_t>(r)].ok) continue;
      throw Error(PSTAR_ERR_IO, r == rank ? failure
                                          : "checkpoint_save: rank " + std::to_string(r) +
                                                " could not write its shard (its own error says why)");
    }
  } else {
    records[0] = mine;
  }

  // Rank 0: the manifest, written last, then LATEST, replaced atomically.
  if (rank == 0) {
    try {
      Manifest m;
      Settings& st = m.settings;
      const optim::Optimizer& opt = s.optimizer();
      st.library = PSTAR_VERSION_STRING;
      st.compute_dtype = dtype_text(s.compute_dtype());
      st.chunk_elems = s.chunk_elems();
      st.state_format = s.state_format();
      st.master_format = s.master_format();
      st.world_size = static_cast<uint32_t>(world);
      st.sharded = sharded;
      st.step = opt.step();
      st.loss_scale = opt.scaler().scale();
      st.loss_scale_clean_steps = opt.scaler().clean_steps();
      st.loss_scale_hysteresis_left = opt.scaler().hysteresis_left();
      st.adam = opt.hyper();
      st.clip_norm = static_cast<float>(opt.clip_norm());
      for (uint32_t id = 0; id < n; ++id) {
        const ParamView p = s.param(id);
        m.params.push_back(ManifestParam{p.name, p.shape, p.numel, p.frozen, offsets[id], p.lr_scale, p.weight_decay});
      }
      for (int r = 0; r < world; ++r) {
        for (int list = 0; list < 4; ++list) {
          const Record& rec = records[static_cast<size_t>(r)];
          m.files[list_file(list, sharded, r)] = {rec.bytes[list], rec.xxh3[list]};
        }
        if (!sharded) continue;
        uint64_t at[2] = {0, 0};  // trainable files, frozen file
        for (uint32_t id = 0; id < n; ++id) {
          Part part;
          if (!part_of(id, r, &part)) continue;
          uint64_t& off = at[s.param(id).frozen ? 1 : 0];
          m.pieces.push_back(ManifestPiece{id, static_cast<uint32_t>(r), part.start, part.count, off});
          off += part.count;
        }
      }
      publish_checkpoint(dir, name, manifest_text(m), crash);
    } catch (const Error& e) {
      if (!sharded) throw;
      failure = e.what();
    }
  }
  if (sharded) {
    // Whether rank 0 published the checkpoint.
    int32_t done = rank == 0 && failure.empty() ? 1 : 0;
    std::vector<int32_t> all(static_cast<size_t>(world));
    s.all_gather(&done, all.data(), sizeof done);
    if (!all[0]) {
      throw Error(PSTAR_ERR_IO, rank == 0 ? failure
                                          : "checkpoint_save: rank 0 could not write the manifest or LATEST of '" +
                                                sub + "' (its own error says why); the previous checkpoint stays");
    }
  }
  log::info("checkpoint saved: " + sub);
  return name;
}

#endif

// The fp32 values of every parameter, in registration order.
void export_safetensors(EngineState& s, const std::string& path) {
  std::vector<SafetensorsEntry> tensors;
  for (uint32_t id = 0; id < s.param_count(); ++id) {
    const ParamView p = s.param(id);
    tensors.push_back({p.name, p.shape, p.numel});
  }
  write_safetensors(path, tensors, "libpstar " PSTAR_VERSION_STRING,
                    [&](size_t id, std::vector<float>& out) { s.read_values(static_cast<uint32_t>(id), out.data()); });
}

}  // namespace pstar::checkpoint
