// The checkpoint manifest (docs/checkpoints.md, "What a checkpoint holds"
// and "Loading"): what it says, its text, and its strict reading.  The
// format lives here, apart from the engine that fills it and applies it:
// everything is plain values (names, shapes, flags, offsets, file sizes and
// checksums), never an Engine, so the format can be read, written and
// tested on its own, and a change to it shows in one place.
//
// The text: "pstar-checkpoint 2", then "key value" lines (the settings),
// one "param" line per parameter, "piece" lines (sharded checkpoints),
// one "file" line per data file, and last "checksum <XXH3-64 of every byte
// before that line>".  Reading is in three steps, in the order a load
// reports problems: parse_manifest (the checksum, then every line's
// syntax), check_settings (each value in the range its setter accepts),
// check_layout (the pieces tile each parameter and each file exactly).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "optim/adam.h"

namespace pstar::checkpoint {

// Version 2: the manifest ends with its own checksum.  Version 1 (without
// it) is refused: nothing could tell a changed manifest from a good one.
constexpr int kFormatVersion = 2;
constexpr const char* kFormatName = "pstar-checkpoint";

// The list files of a one-process checkpoint: 0 masters, 1 Adam's m, 2
// Adam's v (trainable parameters), 3 frozen parameters' values.
extern const char* const kListFiles[4];
// List file `list` of rank `rank` of a sharded save ("masters.r<R>.f32").
std::string shard_file(int list, int rank);
// kListFiles[list], or shard_file(list, rank) when `sharded`.
std::string list_file(int list, bool sharded, int rank);

// The scalar entries.
struct Settings {
  std::string library;        // the writer's version (may hold blanks)
  std::string compute_dtype;  // "f32", "f16" or "bf16"
  uint64_t chunk_elems = 0;
  // Adam's moments' format in the engine that saved: "fp32", "bf16" or
  // "int8".  Written only when not fp32, so an fp32 engine's manifest is
  // the one it always was; absent reads as fp32.  The list files hold fp32
  // values in every format (the moments dequantized: a load requantizes
  // them to the same codes).
  std::string state_format = "fp32";
  // The masters' format, "fp32" or "bf16", written only when not fp32 (as
  // state_format); the master list files hold their fp32 values.
  std::string master_format = "fp32";
  uint32_t world_size = 1;
  bool sharded = false;  // written as "sharded 1" (rank files and pieces)
  uint64_t step = 0;     // Adam's
  float loss_scale = 1.0f;
  uint32_t loss_scale_clean_steps = 0;
  uint32_t loss_scale_hysteresis_left = 0;
  optim::AdamHyper adam;  // lr, betas, eps, weight decay, AdamW
  float clip_norm = 0.0f;
};

struct ManifestParam {
  std::string name;  // any bytes but NUL (percent-encoded in the text)
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  bool frozen = false;
  uint64_t offset = 0;  // in elements, in its list files (0 when sharded)
  float lr_scale = 1.0f;
  bool weight_decay = true;
};

struct ManifestFile {
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

// A sharded checkpoint's piece of a parameter: elements [start, start +
// count) of it, at element `offset` of rank `rank`'s list files.
struct ManifestPiece {
  uint32_t param = 0;  // index in Manifest::params
  uint32_t rank = 0;
  uint64_t start = 0, count = 0, offset = 0;
};

struct Manifest {
  Settings settings;  // what the writer writes (parse_manifest leaves it default)
  std::vector<ManifestParam> params;
  std::vector<ManifestPiece> pieces;          // sharded checkpoints only, in the text's order
  std::map<std::string, ManifestFile> files;  // by file name (written in name order)
  // As read: the scalar entries' values, unchecked (check_settings reads them).
  std::map<std::string, std::string> values;
};

// The manifest's text, its checksum line last (without xxhash: none).
std::string manifest_text(const Manifest& m);

// Reads the manifest at `path` strictly: the format and version first, the
// checksum line against every byte before it, then every line (only the
// entries this version writes, each once; decimal numbers without sign or
// overflow, whole C99 hex floats, finite; names escaped correctly and
// unique; shapes whose product is numel).  PSTAR_ERR_IO naming the file
// and the line.  Needs xxhash.
Manifest parse_manifest(const std::string& path);
// The same for `text` (`path` names it in errors).
Manifest parse_manifest_text(const std::string& text, const std::string& path);

// The scalar entries of a parsed manifest, each in the range its setter
// accepts (lr, weight decay, clip norm >= 0; betas in [0, 1); eps and the
// loss scale > 0; world_size 1 unless "sharded 1").  PSTAR_ERR_IO.
Settings check_settings(const Manifest& m, const std::string& path);

// Where each parameter's values lie: for each parameter (by index), its
// pieces; one per parameter at its offset in a one-process checkpoint.
// Checks that they tile each parameter and each rank's list files exactly
// and that the files' sizes are what the pieces add up to, so no read can
// fall outside a file.  `s` from check_settings.  PSTAR_ERR_IO.
std::vector<std::vector<ManifestPiece>> check_layout(const Manifest& m, const Settings& s, const std::string& path);

// Ranges [start, start + count) cover [0, total) exactly once (empty ranges
// aside: they read nothing).
bool tiles(std::vector<std::pair<uint64_t, uint64_t>> ranges, uint64_t total);

}  // namespace pstar::checkpoint
