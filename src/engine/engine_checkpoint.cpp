// Checkpoints and safetensors export (docs/checkpoints.md).
//
// Layout of a checkpoint directory DIR:
//   DIR/LATEST                 the name of the current checkpoint, one line
//   DIR/ckpt-<step>-<n>/       one checkpoint, never modified once LATEST
//                              names it:
//     masters.f32              fp32 masters of the trainable parameters,
//     exp_avg.f32              Adam's m and
//     exp_avg_sq.f32           v, each parameter's numel floats in the
//                              manifest's order (little-endian),
//     frozen.f32               frozen parameters' values as fp32,
//     manifest                 a text manifest (below), written last.
//   A sharded engine (world > 1) writes <list>.r<R>.f32 per rank R instead:
//   each parameter's elements that lie in rank R's shards, and the manifest
//   says with "piece" lines which elements of which parameter lie where.
//
// Keyed by parameter, not by chunk: a checkpoint loads into an engine with
// another chunk size.  Crash safety: each save writes a new subdirectory,
// fsyncs every file and the subdirectory, then replaces LATEST atomically
// (write LATEST.tmp, fsync, rename, fsync DIR).  A crash or a full disk at
// any point leaves the previous LATEST and its subdirectory intact.  Loading
// verifies the format version, the parameter set and every file's size and
// XXH3-64 checksum before it changes anything, so a bad checkpoint leaves
// the engine as it was.
//
// Test hook: PSTAR_TEST_CHECKPOINT_CRASH_AT=n makes a save stop with
// PSTAR_ERR_IO at its n-th durability point (1: after masters.f32 ... 8:
// after the rename of LATEST), as a crash there would; unset, it is inert.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "util/dtype.h"
#include "util/error.h"
#include "util/log.h"

#if defined(PSTAR_HAVE_XXHASH)
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

#ifndef PSTAR_VERSION_STRING
#include "pstar/version.h"
#endif

namespace pstar::engine {

namespace {

constexpr int kFormatVersion = 1;
constexpr const char* kFormatName = "pstar-checkpoint";
const char* const kListFiles[4] = {"masters.f32", "exp_avg.f32", "exp_avg_sq.f32", "frozen.f32"};

[[noreturn]] void io_error(const std::string& what) { throw Error(PSTAR_ERR_IO, what); }

std::string errno_text() { return std::strerror(errno); }

// Names may hold any byte but NUL: percent-encode what would break a line.
std::string escape(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char ch : s) {
    if (ch <= ' ' || ch == '%' || ch >= 0x7f) {
      std::snprintf(buf, sizeof buf, "%%%02X", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out += static_cast<char>(std::strtol(s.substr(i + 1, 2).c_str(), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string join_path(const std::string& a, const std::string& b) {
  return a.empty() || a.back() == '/' ? a + b : a + "/" + b;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) io_error("checkpoint_save: opening '" + path + "' to sync it: " + errno_text());
  if (::fsync(fd) != 0) {
    const std::string e = errno_text();
    ::close(fd);
    io_error("checkpoint_save: syncing '" + path + "': " + e);
  }
  ::close(fd);
}

// A file written in pieces, with its XXH3-64 computed along the way.
class CheckedWriter {
 public:
  // `what` names the call in error messages.
  CheckedWriter(std::string path, std::string what = "checkpoint_save")
      : path_(std::move(path)), what_(std::move(what)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) io_error(what_ + ": creating '" + path_ + "': " + errno_text());
#if defined(PSTAR_HAVE_XXHASH)
    state_ = XXH3_createState();
    XXH3_64bits_reset(state_);
#endif
  }
  ~CheckedWriter() {
    if (fd_ >= 0) ::close(fd_);
#if defined(PSTAR_HAVE_XXHASH)
    XXH3_freeState(state_);
#endif
  }
  void write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    size_t left = bytes;
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        io_error(what_ + ": writing '" + path_ + "': " + errno_text());
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
#if defined(PSTAR_HAVE_XXHASH)
    XXH3_64bits_update(state_, data, bytes);
#endif
    bytes_ += bytes;
  }
  // fsync and close; returns the checksum.
  uint64_t finish() {
    if (::fsync(fd_) != 0) io_error(what_ + ": syncing '" + path_ + "': " + errno_text());
    if (::close(fd_) != 0) {
      fd_ = -1;
      io_error(what_ + ": closing '" + path_ + "': " + errno_text());
    }
    fd_ = -1;
#if defined(PSTAR_HAVE_XXHASH)
    return XXH3_64bits_digest(state_);
#else
    return 0;
#endif
  }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string path_;
  std::string what_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
#if defined(PSTAR_HAVE_XXHASH)
  XXH3_state_t* state_ = nullptr;
#endif
};

// The durability points of a save, for the crash test hook.
class CrashPoints {
 public:
  CrashPoints() {
    if (const char* v = std::getenv("PSTAR_TEST_CHECKPOINT_CRASH_AT")) at_ = std::atoi(v);
  }
  void pass(const char* where) {
    ++count_;
    if (at_ == count_) {
      io_error(std::string("checkpoint_save: simulated crash at point ") + std::to_string(count_) + " (" + where +
               "; PSTAR_TEST_CHECKPOINT_CRASH_AT)");
    }
  }

 private:
  int at_ = 0;
  int count_ = 0;
};

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

struct ManifestParam {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  bool frozen = false;
  uint64_t offset = 0;  // in elements, in its list files
  float lr_scale = 1.0f;
  bool weight_decay = true;
};

struct ManifestFile {
  uint64_t bytes = 0;
  std::string xxh3;
};

// A sharded checkpoint's piece of a parameter: elements [start, start +
// count) of it, at element `offset` of rank `rank`'s list files.
struct ManifestPiece {
  uint32_t param = 0;  // index in Manifest::params
  uint32_t rank = 0;
  uint64_t start = 0, count = 0, offset = 0;
};

struct Manifest {
  int version = 0;
  std::string library;
  std::map<std::string, std::string> values;  // scalar entries
  std::vector<ManifestParam> params;
  std::map<std::string, ManifestFile> files;
  std::vector<ManifestPiece> pieces;  // sharded checkpoints only
};

// List file `list` (0..3, kListFiles) of rank `rank` of a sharded save.
std::string shard_file(int list, int rank) {
  std::string f = kListFiles[list];
  return f.substr(0, f.size() - 4) + ".r" + std::to_string(rank) + ".f32";
}

// key value... ; "param" and "file" lines carry key=value pairs.
Manifest parse_manifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) io_error("checkpoint_load: missing file '" + path + "'");
  Manifest m;
  std::string line;
  int lineno = 0;
  auto bad = [&](const std::string& why) {
    io_error("checkpoint_load: '" + path + "' line " + std::to_string(lineno) + ": " + why);
  };
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (lineno == 1) {
      if (key != kFormatName) bad("not a libpstar checkpoint manifest");
      if (!(ls >> m.version)) bad("no format version");
      if (m.version != kFormatVersion) {
        io_error("checkpoint_load: '" + path + "': format version " + std::to_string(m.version) +
                 ", this library reads version " + std::to_string(kFormatVersion));
      }
      continue;
    }
    if (key == "param" || key == "file" || key == "piece") {
      // "<key> <name or index> k=v k=v ..."
      std::string name, kv;
      ls >> name;
      std::map<std::string, std::string> f;
      while (ls >> kv) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos) bad("'" + kv + "' is not key=value");
        f[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      try {
        if (key == "piece") {
          ManifestPiece pc;
          pc.param = static_cast<uint32_t>(std::stoul(name));
          pc.rank = static_cast<uint32_t>(std::stoul(f.at("rank")));
          pc.start = std::stoull(f.at("start"));
          pc.count = std::stoull(f.at("count"));
          pc.offset = std::stoull(f.at("offset"));
          m.pieces.push_back(pc);
        } else if (key == "param") {
          ManifestParam p;
          p.name = unescape(name);
          p.numel = std::stoull(f.at("numel"));
          p.frozen = f.at("frozen") == "1";
          p.offset = std::stoull(f.at("offset"));
          p.lr_scale = std::stof(f.at("lr_scale"));
          p.weight_decay = f.at("weight_decay") == "1";
          std::istringstream ss(f.at("shape"));
          std::string d;
          while (std::getline(ss, d, ',')) p.shape.push_back(std::stoll(d));
          m.params.push_back(std::move(p));
        } else {
          m.files[name] = ManifestFile{std::stoull(f.at("bytes")), f.at("xxh3")};
        }
      } catch (const std::exception&) {
        bad("malformed " + key + " entry");
      }
      continue;
    }
    std::string value;
    std::getline(ls >> std::ws, value);
    m.values[key] = value;
  }
  if (m.version == 0) io_error("checkpoint_load: '" + path + "' is empty");
  return m;
}

std::string read_latest(const std::string& dir) {
  const std::string path = join_path(dir, "LATEST");
  std::ifstream in(path);
  if (!in) io_error("checkpoint_load: no checkpoint in '" + dir + "' (missing file '" + path + "')");
  std::string name;
  std::getline(in, name);
  if (name.empty() || name.find('/') != std::string::npos) {
    io_error("checkpoint_load: '" + path + "' does not name a checkpoint");
  }
  return name;
}

// Size and XXH3-64 of a file, against the manifest.
void verify_file(const std::string& path, const ManifestFile& expect) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("checkpoint_load: missing file '" + path + "' (" + errno_text() + ")");
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != expect.bytes) {
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    ::close(fd);
    io_error("checkpoint_load: '" + path + "' is truncated or extended: " + std::to_string(size) +
             " bytes, the manifest says " + std::to_string(expect.bytes));
  }
#if defined(PSTAR_HAVE_XXHASH)
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string e = errno_text();
      XXH3_freeState(state);
      ::close(fd);
      io_error("checkpoint_load: reading '" + path + "': " + e);
    }
    if (n == 0) break;
    XXH3_64bits_update(state, buf.data(), static_cast<size_t>(n));
  }
  const std::string got = hex64(XXH3_64bits_digest(state));
  XXH3_freeState(state);
  ::close(fd);
  if (got != expect.xxh3) {
    io_error("checkpoint_load: '" + path + "' is corrupted: its XXH3 is " + got + ", the manifest says " +
             expect.xxh3);
  }
#else
  ::close(fd);
#endif
}

void read_at(const std::string& path, uint64_t offset_elems, float* out, uint64_t count) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("checkpoint_load: missing file '" + path + "'");
  char* p = reinterpret_cast<char*>(out);
  size_t left = count * sizeof(float);
  off_t pos = static_cast<off_t>(offset_elems * sizeof(float));
  while (left > 0) {
    const ssize_t n = ::pread(fd, p, left, pos);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      ::close(fd);
      io_error("checkpoint_load: reading '" + path + "': " + (n == 0 ? std::string("unexpected end") : errno_text()));
    }
    p += n;
    pos += n;
    left -= static_cast<size_t>(n);
  }
  ::close(fd);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  char buf[8];
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

const char* dtype_text(pstar_dtype d) {
  return d == PSTAR_DTYPE_F32 ? "f32" : d == PSTAR_DTYPE_F16 ? "f16" : "bf16";
}

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
  nvme_access(place.chunk, false);
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
  nvme_access(place.chunk, true);
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

// The manifest: format, scalars, parameters (`offsets`: each one's element
// offset in its list files; 0 in a sharded save, whose pieces say where),
// then `pieces` (sharded: "piece" lines) and the files with their sizes and
// XXH3-64.
std::string Engine::checkpoint_manifest_text(const std::map<std::string, std::pair<uint64_t, uint64_t>>& files,
                                             const std::vector<uint64_t>& offsets, const std::string& pieces) const {
  std::ostringstream m;
  m << kFormatName << ' ' << kFormatVersion << '\n';
  m << "library " << PSTAR_VERSION_STRING << '\n';
  m << "compute_dtype " << dtype_text(opt_.compute_dtype) << '\n';
  m << "chunk_elems " << opt_.chunk_elems << '\n';
  m << "world_size " << world_ << '\n';
  if (sharded()) m << "sharded 1\n";
  m << "step " << adam_step_ << '\n';
  char buf[64];
  auto f32 = [&](float v) {
    std::snprintf(buf, sizeof buf, "%a", static_cast<double>(v));  // exact
    return std::string(buf);
  };
  m << "loss_scale " << f32(scaler_.scale()) << '\n';
  m << "loss_scale_clean_steps " << scaler_.clean_steps() << '\n';
  m << "loss_scale_hysteresis_left " << scaler_.hysteresis_left() << '\n';
  m << "lr " << f32(hyper_.lr) << '\n';
  m << "beta1 " << f32(hyper_.beta1) << '\n';
  m << "beta2 " << f32(hyper_.beta2) << '\n';
  m << "eps " << f32(hyper_.eps) << '\n';
  m << "weight_decay " << f32(hyper_.weight_decay) << '\n';
  m << "adamw " << (hyper_.adamw ? 1 : 0) << '\n';
  m << "clip_norm " << f32(static_cast<float>(clip_norm_)) << '\n';
  for (uint32_t id = 0; id < params_.size(); ++id) {
    const Param& p = params_[id];
    std::string shape;
    for (size_t i = 0; i < p.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(p.shape[i]);
    m << "param " << escape(p.name) << " numel=" << p.numel << " shape=" << shape
      << " frozen=" << (p.frozen() ? 1 : 0) << " offset=" << offsets[id] << " lr_scale=" << f32(p.lr_scale)
      << " weight_decay=" << (p.weight_decay ? 1 : 0) << '\n';
  }
  m << pieces;
  for (const auto& [fname, f] : files) m << "file " << fname << " bytes=" << f.first << " xxh3=" << hex64(f.second) << '\n';
  return m.str();
}

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
#if !defined(PSTAR_HAVE_XXHASH)
  throw Error(PSTAR_ERR_UNSUPPORTED,
              "checkpoint_save: this libpstar was built without xxhash (libxxhash-dev): no checksums, no checkpoints");
#else
  const std::string dir = dir_c;
  // Rank 0 creates a new subdirectory for every save.
  std::string name, failure;
  if (rank_ == 0) {
    try {
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        io_error("checkpoint_save: creating '" + dir + "': " + errno_text());
      }
      for (int n = 0;; ++n) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "ckpt-%010" PRIu64 "-%d", adam_step_, n);
        if (::mkdir(join_path(dir, buf).c_str(), 0755) == 0) {
          name = buf;
          break;
        }
        if (errno != EEXIST) io_error("checkpoint_save: creating '" + join_path(dir, buf) + "': " + errno_text());
      }
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
    std::vector<char> all(kNameBytes * static_cast<size_t>(world_));
    checkpoint_all_gather(mine, all.data(), kNameBytes);
    name.assign(all.data(), strnlen(all.data(), kNameBytes));
    if (name.empty()) {
      throw Error(PSTAR_ERR_IO, failure.empty() ? "checkpoint_save: rank 0 could not create the checkpoint's directory "
                                                  "under '" + dir + "'"
                                                : failure);
    }
  }
  const std::string sub = join_path(dir, name);
  CrashPoints crash;

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
      const std::string fname = sharded() ? shard_file(list, rank_) : kListFiles[list];
      CheckedWriter w(join_path(sub, fname));
      uint64_t at = 0;
      for (uint32_t id = 0; id < params_.size(); ++id) {
        const Param& p = params_[id];
        if (p.frozen() != (list == 3)) continue;
        uint64_t a = 0, b = 0;
        if (!piece_of(id, rank_, &a, &b)) continue;
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
          if (list != 3) nvme_access(place.chunk, false);
          const ChunkState& c = chunks_[place.chunk];
          const uint64_t lo = shard_lo(place.chunk);
          const float* src = list == 0 ? c.master : list == 1 ? c.exp_avg : c.exp_avg_sq;
          staging.resize(b - a);
          for (uint64_t i = a; i < b; ++i) {
            staging[i - a] = list == 3 ? load_as(c.shard, opt_.compute_dtype, i - lo) : src[i - lo];
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
  std::vector<Record> records(static_cast<size_t>(world_));
  if (sharded()) {
    checkpoint_all_gather(&mine, records.data(), sizeof mine);
    for (int r = 0; r < world_; ++r) {
      if (records[static_cast<size_t>(r)].ok) continue;
      throw Error(PSTAR_ERR_IO, r == rank_ ? failure
                                           : "checkpoint_save: rank " + std::to_string(r) +
                                                 " could not write its shard (its own error says why)");
    }
  } else {
    records[0] = mine;
  }

  // Rank 0: the manifest, written last, then LATEST, replaced atomically.
  if (rank_ == 0) {
    try {
      std::map<std::string, std::pair<uint64_t, uint64_t>> files;
      std::string pieces;
      for (int r = 0; r < world_; ++r) {
        for (int list = 0; list < 4; ++list) {
          const Record& rec = records[static_cast<size_t>(r)];
          files[sharded() ? shard_file(list, r) : kListFiles[list]] = {rec.bytes[list], rec.xxh3[list]};
        }
        if (!sharded()) continue;
        uint64_t at[2] = {0, 0};  // trainable files, frozen file
        for (uint32_t id = 0; id < params_.size(); ++id) {
          uint64_t a = 0, b = 0;
          if (!piece_of(id, r, &a, &b)) continue;
          uint64_t& off = at[params_[id].frozen() ? 1 : 0];
          pieces += "piece " + std::to_string(id) + " rank=" + std::to_string(r) +
                    " start=" + std::to_string(a - layout_->param(id).offset_elems) +
                    " count=" + std::to_string(b - a) + " offset=" + std::to_string(off) + "\n";
          off += b - a;
        }
      }
      const std::string text = checkpoint_manifest_text(files, offsets, pieces);
      {
        CheckedWriter w(join_path(sub, "manifest"));
        w.write(text.data(), text.size());
        w.finish();
        crash.pass("manifest");
      }
      fsync_path(sub, true);
      crash.pass("the checkpoint directory");
      const std::string tmp = join_path(dir, "LATEST.tmp");
      CheckedWriter w(tmp);
      const std::string line = name + "\n";
      w.write(line.data(), line.size());
      w.finish();
      crash.pass("LATEST.tmp");
      if (::rename(tmp.c_str(), join_path(dir, "LATEST").c_str()) != 0) {
        io_error("checkpoint_save: renaming '" + tmp + "' to LATEST: " + errno_text());
      }
      crash.pass("the rename of LATEST");
      fsync_path(dir, true);
    } catch (const Error& e) {
      if (!sharded()) throw;
      failure = e.what();
    }
  }
  if (sharded()) {
    // Whether rank 0 published the checkpoint.
    int32_t done = rank_ == 0 && failure.empty() ? 1 : 0;
    std::vector<int32_t> all(static_cast<size_t>(world_));
    checkpoint_all_gather(&done, all.data(), sizeof done);
    if (!all[0]) {
      throw Error(PSTAR_ERR_IO, rank_ == 0 ? failure
                                           : "checkpoint_save: rank 0 could not write the manifest or LATEST of '" +
                                                 sub + "' (its own error says why); the previous checkpoint stays");
    }
  }
  log::info("checkpoint saved: " + sub);
  return name;
#endif
}

void Engine::write_state_sharded(uint32_t id, int list, const float* in) {
  const auto& place = layout_->param(id);
  nvme_access(place.chunk, true);
  ChunkState& c = chunks_[place.chunk];
  float* dst = list == 1 ? c.exp_avg : c.exp_avg_sq;
  const auto [lo, a, b] = shard_span(id, rank_);
  for (uint64_t i = a; i < b; ++i) dst[i - lo] = in[i - place.offset_elems];
}

// ---------------------------------------------------------------------------
// Load

void Engine::checkpoint_load(const char* dir_c) {
  require_file_call("checkpoint_load", dir_c, false);
  for (const Param& p : params_) {
    require(p.pins == 0, PSTAR_ERR_BUSY, [&] { return "checkpoint_load: '" + p.name + "' is pinned; unpin it first"; });
  }
#if !defined(PSTAR_HAVE_XXHASH)
  throw Error(PSTAR_ERR_UNSUPPORTED,
              "checkpoint_load: this libpstar was built without xxhash (libxxhash-dev): no checksums, no checkpoints");
#else
  const std::string dir = dir_c;
  const std::string sub = join_path(dir, read_latest(dir));
  const std::string manifest_path = join_path(sub, "manifest");
  const Manifest m = parse_manifest(manifest_path);

  // The parameter set: every engine parameter in the checkpoint with the
  // same shape and kind, and nothing else.
  std::map<std::string, const ManifestParam*> by_name;
  for (const ManifestParam& mp : m.params) by_name[mp.name] = &mp;
  std::vector<const ManifestParam*> match(params_.size());
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
    for (const ManifestParam& mp : m.params) {
      bool found = false;
      for (const Param& p : params_) found = found || p.name == mp.name;
      if (!found) {
        throw Error(PSTAR_ERR_INVALID_ARGUMENT, "checkpoint_load: '" + manifest_path + "' has parameter '" + mp.name +
                                                    "', which this engine does not register");
      }
    }
  }
  // Where each parameter's values lie: one piece per parameter in the list
  // files of a one-process save; a piece per (parameter, rank) in the rank
  // files of a sharded one (any world size and chunk size loads either).
  const auto value_of = [&](const char* key) {
    auto it = m.values.find(key);
    return it == m.values.end() ? std::string() : it->second;
  };
  const bool from_shards = value_of("sharded") == "1";
  const int saved_world = from_shards ? std::atoi(value_of("world_size").c_str()) : 1;
  if (from_shards && saved_world < 1) io_error("checkpoint_load: '" + manifest_path + "': bad world_size");
  std::vector<std::vector<ManifestPiece>> pieces(m.params.size());
  if (from_shards) {
    for (const ManifestPiece& pc : m.pieces) {
      if (pc.param >= m.params.size() || pc.rank >= static_cast<uint32_t>(saved_world) ||
          pc.start + pc.count > m.params[pc.param].numel) {
        io_error("checkpoint_load: '" + manifest_path + "': a piece of parameter " + std::to_string(pc.param) +
                 " lies outside it");
      }
      pieces[pc.param].push_back(pc);
    }
    for (size_t j = 0; j < m.params.size(); ++j) {
      uint64_t covered = 0;
      for (const ManifestPiece& pc : pieces[j]) covered += pc.count;
      if (covered != m.params[j].numel) {
        io_error("checkpoint_load: '" + manifest_path + "': the pieces of '" + m.params[j].name + "' cover " +
                 std::to_string(covered) + " of its " + std::to_string(m.params[j].numel) + " elements");
      }
    }
  } else {
    for (size_t j = 0; j < m.params.size(); ++j) {
      pieces[j].push_back(ManifestPiece{static_cast<uint32_t>(j), 0, 0, m.params[j].numel, m.params[j].offset});
    }
  }
  auto list_file = [&](int list, uint32_t rank) { return from_shards ? shard_file(list, static_cast<int>(rank)) : std::string(kListFiles[list]); };
  // Every file whole and unchanged before anything is applied.
  for (int r = 0; r < saved_world; ++r) {
    for (int list = 0; list < 4; ++list) {
      const std::string fname = list_file(list, static_cast<uint32_t>(r));
      auto it = m.files.find(fname);
      if (it == m.files.end()) io_error("checkpoint_load: '" + manifest_path + "' lists no file '" + fname + "'");
      verify_file(join_path(sub, fname), it->second);
    }
  }
  auto scalar = [&](const char* key) -> std::string {
    auto it = m.values.find(key);
    if (it == m.values.end()) io_error("checkpoint_load: '" + manifest_path + "' has no '" + key + "'");
    return it->second;
  };
  const float scale = std::strtof(scalar("loss_scale").c_str(), nullptr);
  const uint64_t step = std::stoull(scalar("step"));
  const uint32_t clean = static_cast<uint32_t>(std::stoul(scalar("loss_scale_clean_steps")));
  const uint32_t hyst = static_cast<uint32_t>(std::stoul(scalar("loss_scale_hysteresis_left")));
  optim::AdamHyper h = hyper_;
  h.lr = std::strtof(scalar("lr").c_str(), nullptr);
  h.beta1 = std::strtof(scalar("beta1").c_str(), nullptr);
  h.beta2 = std::strtof(scalar("beta2").c_str(), nullptr);
  h.eps = std::strtof(scalar("eps").c_str(), nullptr);
  h.weight_decay = std::strtof(scalar("weight_decay").c_str(), nullptr);
  h.adamw = scalar("adamw") == "1";
  const double clip = std::strtod(scalar("clip_norm").c_str(), nullptr);

  // Apply: values (masters and compute copies), then m and v.  Every state
  // is rewritten, so slots on the NVMe drive start from zeros (and are
  // trusted again after an I/O error).
  nvme_begin_rewrite();
  // A sharded engine keeps what lies in its own shards: no collective.
  std::vector<float> staging;
  for (uint32_t id = 0; id < params_.size(); ++id) {
    const Param& p = params_[id];
    const ManifestParam& mp = *match[id];
    const size_t j = static_cast<size_t>(&mp - m.params.data());
    staging.resize(p.numel);
    auto read_list = [&](int list) {
      for (const ManifestPiece& pc : pieces[j]) {
        read_at(join_path(sub, list_file(list, pc.rank)), pc.offset, staging.data() + pc.start, pc.count);
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
  nvme_end_rewrite();
  adam_step_ = step;
  scaler_.restore(scale, clean, hyst);
  hyper_ = h;
  clip_norm_ = static_cast<float>(clip);
  log::info("checkpoint loaded: " + sub);
#endif
}

// ---------------------------------------------------------------------------
// safetensors

// The fp32 values of every parameter (masters; frozen ones from their
// compute copies) as a safetensors file: an 8-byte little-endian header
// length, a JSON header (name -> dtype, shape, data offsets; padded with
// spaces to 8 bytes), then the data.
void Engine::export_safetensors(const char* path_c) {
  require_file_call("export_safetensors", path_c, false);
  std::string header = "{\"__metadata__\":{\"producer\":\"libpstar " PSTAR_VERSION_STRING "\"}";
  uint64_t offset = 0;
  for (const Param& p : params_) {
    header += "," + json_string(p.name) + ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t i = 0; i < p.shape.size(); ++i) header += (i ? "," : "") + std::to_string(p.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + p.numel * 4) + "]}";
    offset += p.numel * 4;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  const std::string path = path_c;
  const std::string tmp = path + ".tmp";
  try {
    CheckedWriter w(tmp, "export_safetensors");
    unsigned char len[8];
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    w.write(len, 8);
    w.write(header.data(), header.size());
    std::vector<float> staging;
    for (uint32_t id = 0; id < params_.size(); ++id) {
      staging.resize(params_[id].numel);
      read(id, staging.data(), params_[id].numel, PSTAR_DTYPE_F32);
      w.write(staging.data(), staging.size() * sizeof(float));
    }
    w.finish();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) io_error("export_safetensors: renaming to '" + path + "': " + errno_text());
}

}  // namespace pstar::engine
