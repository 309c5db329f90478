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
// any point leaves the previous LATEST and its subdirectory intact.  The
// manifest ends with its own XXH3-64 (format version 2).  Loading checks
// everything before it changes anything: the manifest's checksum and every
// line of it, the parameter set, the values' ranges, that the pieces tile
// each parameter and each file exactly, every file's size and XXH3-64 (and
// in a group, every rank agrees first); so a bad checkpoint leaves the
// engine as it was (see "Load" below for the one case that cannot).
//
// Test hook: PSTAR_TEST_CHECKPOINT_CRASH_AT=n makes a save stop with
// PSTAR_ERR_IO at its n-th durability point (1: after masters.f32 ... 8:
// after the rename of LATEST), as a crash there would; unset, it is inert.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <new>
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

// Version 2: the manifest ends with its own checksum.  Version 1 (without
// it) is refused: nothing could tell a changed manifest from a good one.
constexpr int kFormatVersion = 2;
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

// ---------------------------------------------------------------------------
// The manifest, read strictly.  Its last line is "checksum <XXH3-64 of every
// byte before that line>", checked before any other line is believed; then
// every line must be one this library writes, each value in its range.

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

#if defined(PSTAR_HAVE_XXHASH)
// Strict numbers: decimal digits only (no sign, no blanks), no overflow.
bool parse_u64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    const auto d = static_cast<uint64_t>(ch - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool parse_u32(const std::string& s, uint32_t* out) {
  uint64_t v = 0;
  if (!parse_u64(s, &v) || v > UINT32_MAX) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

// A finite float as the save writes it (C99 hex, "%a"), the whole token.
bool parse_f32(const std::string& s, float* out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  const float v = std::strtof(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool parse_flag(const std::string& s, bool* out) {
  if (s != "0" && s != "1") return false;
  *out = s == "1";
  return true;
}

bool is_hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char ch : s) {
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  }
  return true;
}

int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

// escape()'s inverse; false for a malformed escape or a NUL.
bool unescape(const std::string& s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      *out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return false;
    const int hi = hex_digit(s[i + 1]), lo = hex_digit(s[i + 2]);
    if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) return false;
    *out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t next = s.find(sep, at);
    out.push_back(s.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) return out;
    at = next + 1;
  }
}

// The whole of a small file (the manifest).
std::string read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("checkpoint_load: missing file '" + path + "' (" + errno_text() + ")");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (int64_t{1} << 30)) {
    ::close(fd);
    io_error("checkpoint_load: '" + path + "' is not a manifest (not a regular file, or over 1 GiB)");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::pread(fd, &text[got], text.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string e = n == 0 ? std::string("unexpected end") : errno_text();
      ::close(fd);
      io_error("checkpoint_load: reading '" + path + "': " + e);
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return text;
}

// "key value" scalar lines, and "param", "file" and "piece" lines with a
// name (or index) and key=value fields.
Manifest parse_manifest(const std::string& path) {
  const std::string text = read_small_file(path);
  if (text.empty()) io_error("checkpoint_load: '" + path + "' is empty");
  size_t lineno = 1;
  auto bad = [&](const std::string& why) {
    io_error("checkpoint_load: '" + path + "' line " + std::to_string(lineno) + ": " + why);
  };
  // The format and its version first, so that another version is named as
  // such and not as a checksum mismatch.
  const size_t eol1 = text.find('\n');
  const std::vector<std::string> head = split(text.substr(0, eol1), ' ');
  if (head[0] != kFormatName) bad("not a libpstar checkpoint manifest");
  uint64_t version = 0;
  if (head.size() != 2 || !parse_u64(head[1], &version)) bad("no format version");
  if (version != static_cast<uint64_t>(kFormatVersion)) {
    io_error("checkpoint_load: '" + path + "': format version " + head[1] + ", this library reads version " +
             std::to_string(kFormatVersion) +
             (version < static_cast<uint64_t>(kFormatVersion)
                  ? " only: version 1 manifests (libpstar before the manifest checksum) carry no checksum, so "
                    "nothing could tell a changed one from a good one; save the training state again with this "
                    "library"
                  : " (the checkpoint was written by a newer libpstar)"));
  }
  // The checksum line, last: over every byte before it.
  if (eol1 == std::string::npos || text.back() != '\n') {
    io_error("checkpoint_load: '" + path +
             "' does not end with its checksum line (truncated, or not a whole manifest)");
  }
  const size_t before = text.rfind('\n', text.size() - 2);
  const size_t start = before + 1;  // the checksum line's first byte (before >= eol1)
  const std::string last = text.substr(start, text.size() - 1 - start);
  if (last.size() != 9 + 16 || last.compare(0, 9, "checksum ") != 0 || !is_hex16(last.substr(9))) {
    io_error("checkpoint_load: '" + path +
             "' does not end with its checksum line (truncated, or not a whole manifest)");
  }
  const std::string got = hex64(XXH3_64bits(text.data(), start));
  if (got != last.substr(9)) {
    io_error("checkpoint_load: '" + path + "' is corrupted: its XXH3 is " + got + ", its checksum line says " +
             last.substr(9));
  }
  // Then every line between, strictly.
  static const char* const kScalars[] = {"library",
                                         "compute_dtype",
                                         "chunk_elems",
                                         "world_size",
                                         "sharded",
                                         "step",
                                         "loss_scale",
                                         "loss_scale_clean_steps",
                                         "loss_scale_hysteresis_left",
                                         "lr",
                                         "beta1",
                                         "beta2",
                                         "eps",
                                         "weight_decay",
                                         "adamw",
                                         "clip_norm"};
  Manifest m;
  std::map<std::string, bool> param_names;
  size_t at = eol1 + 1;
  while (at < start) {
    ++lineno;
    const size_t eol = text.find('\n', at);  // < start: the checksum line follows
    const std::string line = text.substr(at, eol - at);
    at = eol + 1;
    const std::vector<std::string> tok = split(line, ' ');
    const std::string& key = tok[0];
    for (const std::string& t : tok) {
      if (t.empty()) bad("an empty field (two blanks, or a blank at an end)");
    }
    if (key == "param" || key == "file" || key == "piece") {
      if (tok.size() < 2) bad("malformed " + key + " entry");
      std::map<std::string, std::string> f;
      for (size_t i = 2; i < tok.size(); ++i) {
        const size_t eq = tok[i].find('=');
        if (eq == std::string::npos) bad("'" + tok[i] + "' is not key=value");
        if (!f.emplace(tok[i].substr(0, eq), tok[i].substr(eq + 1)).second) bad("'" + tok[i] + "': a key given twice");
      }
      auto field = [&](const char* k) -> const std::string& {
        auto it = f.find(k);
        if (it == f.end()) bad(key + " entry without " + k + "=");
        return it->second;
      };
      auto fields_are = [&](size_t n) {
        if (f.size() != n) bad(key + " entry with a field this library does not write");
      };
      if (key == "piece") {
        ManifestPiece pc;
        fields_are(4);
        if (!parse_u32(tok[1], &pc.param) || !parse_u32(field("rank"), &pc.rank) ||
            !parse_u64(field("start"), &pc.start) || !parse_u64(field("count"), &pc.count) ||
            !parse_u64(field("offset"), &pc.offset)) {
          bad("malformed piece entry");
        }
        m.pieces.push_back(pc);
      } else if (key == "param") {
        ManifestParam p;
        fields_are(6);
        if (!unescape(tok[1], &p.name) || p.name.empty()) bad("malformed parameter name '" + tok[1] + "'");
        if (!parse_u64(field("numel"), &p.numel) || !parse_flag(field("frozen"), &p.frozen) ||
            !parse_u64(field("offset"), &p.offset) || !parse_f32(field("lr_scale"), &p.lr_scale) ||
            !parse_flag(field("weight_decay"), &p.weight_decay)) {
          bad("malformed param entry");
        }
        if (p.lr_scale < 0.0f) bad("a negative lr_scale");
        const std::string& shape = field("shape");
        uint64_t product = 1;
        if (!shape.empty()) {
          for (const std::string& d : split(shape, ',')) {
            uint64_t v = 0;
            if (!parse_u64(d, &v) || v > static_cast<uint64_t>(INT64_MAX)) bad("malformed shape '" + shape + "'");
            product = v == 0 || product <= UINT64_MAX / v ? product * v : UINT64_MAX;
            p.shape.push_back(static_cast<int64_t>(v));
          }
        }
        if (product != p.numel) bad("numel " + std::to_string(p.numel) + " is not the product of shape " + shape);
        if (!param_names.emplace(p.name, true).second) bad("parameter '" + p.name + "' appears twice");
        m.params.push_back(std::move(p));
      } else {
        ManifestFile mf;
        fields_are(2);
        if (!parse_u64(field("bytes"), &mf.bytes) || !is_hex16(field("xxh3"))) bad("malformed file entry");
        mf.xxh3 = field("xxh3");
        if (!m.files.emplace(tok[1], mf).second) bad("file '" + tok[1] + "' appears twice");
      }
      continue;
    }
    bool known = false;
    for (const char* k : kScalars) known = known || key == k;
    if (!known) bad("'" + key + "' is not an entry of a version " + std::to_string(kFormatVersion) + " manifest");
    // The library's version may hold blanks; every other value is one token.
    if (key != "library" && tok.size() != 2) bad("'" + key + "' takes one value");
    if (tok.size() < 2) bad("'" + key + "' has no value");
    if (!m.values.emplace(key, line.substr(key.size() + 1)).second) bad("'" + key + "' appears twice");
  }
  return m;
}

std::string read_latest(const std::string& dir) {
  const std::string path = join_path(dir, "LATEST");
  std::ifstream in(path);
  if (!in) io_error("checkpoint_load: no checkpoint in '" + dir + "' (missing file '" + path + "')");
  std::string name;
  std::getline(in, name);
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    io_error("checkpoint_load: '" + path + "' does not name a checkpoint");
  }
  return name;
}

// A data file of the checkpoint being loaded, open from its verification
// (size and XXH3-64 against the manifest) until the load has read it again:
// a file replaced meanwhile is never the one read.
class DataFile {
 public:
  DataFile(std::string path, const ManifestFile& expect) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) io_error("checkpoint_load: missing file '" + path_ + "' (" + errno_text() + ")");
    try {
      verify(expect);
    } catch (...) {
      ::close(fd_);  // the destructor of a half-made object does not run
      fd_ = -1;
      throw;
    }
  }
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;
  ~DataFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  // `count` floats from element `offset_elems` (checked against the size
  // before the load began writing; an error here is a read error or a file
  // changed in place since).
  void read(uint64_t offset_elems, float* out, uint64_t count) const {
    char* p = reinterpret_cast<char*>(out);
    size_t left = count * sizeof(float);
    off_t pos = static_cast<off_t>(offset_elems * sizeof(float));
    while (left > 0) {
      const ssize_t n = ::pread(fd_, p, left, pos);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        io_error("checkpoint_load: reading '" + path_ +
                 "': " + (n == 0 ? std::string("unexpected end") : errno_text()));
      }
      p += n;
      pos += n;
      left -= static_cast<size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

 private:
  // Size and XXH3-64 of the whole file against the manifest's.
  void verify(const ManifestFile& expect) {
    struct stat st;
    if (::fstat(fd_, &st) != 0) io_error("checkpoint_load: '" + path_ + "': " + errno_text());
    bytes_ = static_cast<uint64_t>(st.st_size);
    if (!S_ISREG(st.st_mode) || bytes_ != expect.bytes) {
      io_error("checkpoint_load: '" + path_ + "' is truncated or extended: " + std::to_string(bytes_) +
               " bytes, the manifest says " + std::to_string(expect.bytes));
    }
    std::vector<char> buf(1 << 20);
    XXH3_state_t* state = XXH3_createState();
    if (state == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state);
    uint64_t pos = 0;
    std::string failure;
    for (;;) {
      const ssize_t n = ::pread(fd_, buf.data(), buf.size(), static_cast<off_t>(pos));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) failure = errno_text();
      if (n <= 0) break;
      XXH3_64bits_update(state, buf.data(), static_cast<size_t>(n));
      pos += static_cast<uint64_t>(n);
    }
    const std::string got = hex64(XXH3_64bits_digest(state));
    XXH3_freeState(state);
    if (!failure.empty()) io_error("checkpoint_load: reading '" + path_ + "': " + failure);
    if (pos != bytes_) io_error("checkpoint_load: '" + path_ + "' changed size while it was read");
    if (got != expect.xxh3) {
      io_error("checkpoint_load: '" + path_ + "' is corrupted: its XXH3 is " + got + ", the manifest says " +
               expect.xxh3);
    }
  }

  std::string path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
};

// Test hook PSTAR_TEST_CHECKPOINT_LOAD_FAULT (tests/capi/test_checkpoint.c,
// tests/dist_engine): "check" refuses the load once every check has passed,
// before anything is written; "read:N" fails the N-th read of data once the
// load has begun writing (as an I/O error there would).  Inert unless set.
class LoadFaults {
 public:
  LoadFaults() {
    const char* v = std::getenv("PSTAR_TEST_CHECKPOINT_LOAD_FAULT");
    if (v == nullptr) return;
    const std::string s(v);
    if (s == "check") check_ = true;
    if (s.rfind("read:", 0) == 0) read_at_ = std::strtoull(s.c_str() + 5, nullptr, 10);
  }
  void after_checks() const {
    if (check_) io_error("checkpoint_load: simulated refusal after every check (PSTAR_TEST_CHECKPOINT_LOAD_FAULT)");
  }
  void before_read(const DataFile& f) {
    if (read_at_ != 0 && ++reads_ == read_at_) {
      io_error("checkpoint_load: reading '" + f.path() + "': simulated I/O error at read " + std::to_string(reads_) +
               " (PSTAR_TEST_CHECKPOINT_LOAD_FAULT)");
    }
  }

 private:
  bool check_ = false;
  uint64_t read_at_ = 0;
  uint64_t reads_ = 0;
};

// Ranges [start, start + count) cover [0, total) exactly once (empty ranges
// aside: they read nothing).
bool tile(std::vector<std::pair<uint64_t, uint64_t>> ranges, uint64_t total) {
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [s, c] : ranges) {
    if (c == 0) continue;
    if (s != at || c > UINT64_MAX - s) return false;
    at = s + c;
  }
  return at == total;
}
#endif  // PSTAR_HAVE_XXHASH

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
  m << "compute_dtype " << dtype_text(options_.compute_dtype) << '\n';
  m << "chunk_elems " << options_.chunk_elems << '\n';
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
    m << "param " << escape(p.name) << " numel=" << p.numel << " shape=" << shape << " frozen=" << (p.frozen() ? 1 : 0)
      << " offset=" << offsets[id] << " lr_scale=" << f32(p.lr_scale) << " weight_decay=" << (p.weight_decay ? 1 : 0)
      << '\n';
  }
  m << pieces;
  for (const auto& [fname, f] : files)
    m << "file " << fname << " bytes=" << f.first << " xxh3=" << hex64(f.second) << '\n';
  std::string text = m.str();
#if defined(PSTAR_HAVE_XXHASH)
  // Last: the checksum of every byte before it (checked before a load
  // believes any other line).
  text += "checksum " + hex64(XXH3_64bits(text.data(), text.size())) + "\n";
#endif
  return text;
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
  require_load_complete("checkpoint_save");
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
                                                  "under '" +
                                                      dir + "'"
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
  LoadFaults faults;

  // 1. Checks.  What the load will write, and from where.
  std::string sub, manifest_path;
  Manifest m;
  std::vector<const ManifestParam*> match(params_.size());
  std::vector<std::vector<ManifestPiece>> pieces;
  bool from_shards = false;
  std::map<std::string, std::unique_ptr<DataFile>> data;
  std::vector<float> staging;
  float scale = 1.0f, clip = 0.0f;
  uint64_t step = 0;
  uint32_t clean = 0, hyst = 0;
  optim::AdamHyper h = hyper_;
  pstar_status refused = PSTAR_OK;
  std::string why;
  try {
    for (const Param& p : params_) {
      require(p.pins == 0, PSTAR_ERR_BUSY,
              [&] { return "checkpoint_load: '" + p.name + "' is pinned; unpin it first"; });
    }
    sub = join_path(dir, read_latest(dir));
    manifest_path = join_path(sub, "manifest");
    m = parse_manifest(manifest_path);
    auto bad = [&](const std::string& what) { io_error("checkpoint_load: '" + manifest_path + "': " + what); };

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

    // The scalars, each in the range its setter accepts.
    auto scalar = [&](const char* key) -> const std::string& {
      auto it = m.values.find(key);
      if (it == m.values.end()) bad(std::string("has no '") + key + "'");
      return it->second;
    };
    auto f32_in = [&](const char* key, double lo, double hi, bool open_lo, bool open_hi) {
      float v = 0.0f;
      if (!parse_f32(scalar(key), &v) || v < lo || v > hi || (open_lo && v == lo) || (open_hi && v == hi)) {
        bad(std::string(key) + " " + scalar(key) + " is malformed or out of range");
      }
      return v;
    };
    auto u64_of = [&](const char* key) {
      uint64_t v = 0;
      if (!parse_u64(scalar(key), &v)) bad(std::string(key) + " " + scalar(key) + " is malformed");
      return v;
    };
    auto u32_of = [&](const char* key) {
      uint32_t v = 0;
      if (!parse_u32(scalar(key), &v)) bad(std::string(key) + " " + scalar(key) + " is malformed");
      return v;
    };
    auto flag_of = [&](const char* key) {
      bool v = false;
      if (!parse_flag(scalar(key), &v)) bad(std::string(key) + " " + scalar(key) + " is malformed");
      return v;
    };
    (void)scalar("library");
    const std::string& dt = scalar("compute_dtype");
    if (dt != "f32" && dt != "f16" && dt != "bf16") bad("compute_dtype " + dt + " is not f32, f16 or bf16");
    if (u64_of("chunk_elems") == 0) bad("chunk_elems 0");
    from_shards = m.values.count("sharded") != 0;
    if (from_shards && !flag_of("sharded")) bad("sharded " + scalar("sharded") + " (only 'sharded 1' is written)");
    const uint64_t world64 = u64_of("world_size");
    if (world64 < 1 || world64 > (uint64_t{1} << 20) || (!from_shards && world64 != 1)) {
      bad("world_size " + scalar("world_size") + (from_shards ? " is out of range" : " without 'sharded 1'"));
    }
    const auto saved_world = static_cast<uint32_t>(world64);
    step = u64_of("step");
    scale = f32_in("loss_scale", 0.0, 3e38, true, false);
    clean = u32_of("loss_scale_clean_steps");
    hyst = u32_of("loss_scale_hysteresis_left");
    h.lr = f32_in("lr", 0.0, 1e30, false, false);
    h.beta1 = f32_in("beta1", 0.0, 1.0, false, true);
    h.beta2 = f32_in("beta2", 0.0, 1.0, false, true);
    h.eps = f32_in("eps", 0.0, 1e30, true, false);
    h.weight_decay = f32_in("weight_decay", 0.0, 1e30, false, false);
    h.adamw = flag_of("adamw");
    clip = f32_in("clip_norm", 0.0, 1e30, false, false);

    // Where each parameter's values lie: one piece per parameter in the list
    // files of a one-process save; a piece per (parameter, rank) in the rank
    // files of a sharded one (any world size and chunk size loads either).
    // The pieces must tile each parameter, and each rank's files, exactly.
    pieces.resize(m.params.size());
    if (from_shards) {
      for (const ManifestParam& mp : m.params) {
        if (mp.offset != 0) bad("parameter '" + mp.name + "' has an offset in a sharded checkpoint");
      }
      for (const ManifestPiece& pc : m.pieces) {
        if (pc.param >= m.params.size() || pc.rank >= saved_world || pc.count == 0 ||
            pc.start > m.params[pc.param].numel || pc.count > m.params[pc.param].numel - pc.start) {
          bad("a piece of parameter " + std::to_string(pc.param) + " lies outside it, or outside the world");
        }
        pieces[pc.param].push_back(pc);
      }
      for (size_t j = 0; j < m.params.size(); ++j) {
        std::vector<std::pair<uint64_t, uint64_t>> r;
        for (const ManifestPiece& pc : pieces[j]) r.emplace_back(pc.start, pc.count);
        if (!tile(r, m.params[j].numel)) bad("the pieces of '" + m.params[j].name + "' do not cover it exactly once");
      }
    } else {
      if (!m.pieces.empty()) bad("piece entries without 'sharded 1'");
      for (size_t j = 0; j < m.params.size(); ++j) {
        pieces[j].push_back(ManifestPiece{static_cast<uint32_t>(j), 0, 0, m.params[j].numel, m.params[j].offset});
      }
    }
    // Each rank's two layouts (the three trainable lists share one, frozen
    // values have theirs): the pieces in them tile the file exactly.
    auto fname_of = [&](int list, uint32_t rank) {
      return from_shards ? shard_file(list, static_cast<int>(rank)) : std::string(kListFiles[list]);
    };
    if (m.files.size() != 4 * static_cast<size_t>(saved_world)) {
      bad("lists " + std::to_string(m.files.size()) + " files; a checkpoint of " + std::to_string(saved_world) +
          " rank(s) has " + std::to_string(4 * static_cast<uint64_t>(saved_world)));
    }
    std::vector<std::array<std::vector<std::pair<uint64_t, uint64_t>>, 2>> layout(saved_world);
    for (size_t j = 0; j < m.params.size(); ++j) {
      for (const ManifestPiece& pc : pieces[j])
        layout[pc.rank][m.params[j].frozen ? 1 : 0].emplace_back(pc.offset, pc.count);
    }
    for (uint32_t r = 0; r < saved_world; ++r) {
      for (int kind = 0; kind < 2; ++kind) {
        uint64_t elems = 0;
        for (const auto& pr : layout[r][kind]) elems += pr.second;  // <= the parameters' numel: no overflow
        for (int list = kind == 0 ? 0 : 3; list < (kind == 0 ? 3 : 4); ++list) {
          const std::string fname = fname_of(list, r);
          auto it = m.files.find(fname);
          if (it == m.files.end()) bad("lists no file '" + fname + "'");
          if (it->second.bytes % sizeof(float) != 0 || it->second.bytes / sizeof(float) != elems) {
            bad("file '" + fname + "' is said to hold " + std::to_string(it->second.bytes) + " bytes, its pieces " +
                std::to_string(elems) + " floats");
          }
        }
        if (!tile(layout[r][kind], elems)) {
          bad("the offsets in '" + fname_of(kind == 0 ? 0 : 3, r) + "' overlap, leave a gap or run past its end");
        }
      }
    }
    // Every data file whole and unchanged; kept open for the reads below.
    for (uint32_t r = 0; r < saved_world; ++r) {
      for (int list = 0; list < 4; ++list) {
        const std::string fname = fname_of(list, r);
        data[fname] = std::make_unique<DataFile>(join_path(sub, fname), m.files.at(fname));
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
    std::vector<int32_t> all(static_cast<size_t>(world_));
    checkpoint_all_gather(&vote, all.data(), sizeof vote);
    for (int r = 0; r < world_; ++r) {
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
    nvme_begin_rewrite();
    for (uint32_t id = 0; id < params_.size(); ++id) {
      const Param& p = params_[id];
      const ManifestParam& mp = *match[id];
      const size_t j = static_cast<size_t>(&mp - m.params.data());
      auto read_list = [&](int list) {
        for (const ManifestPiece& pc : pieces[j]) {
          const DataFile& f = *data.at(from_shards ? shard_file(list, static_cast<int>(pc.rank)) : kListFiles[list]);
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
    nvme_end_rewrite();
    adam_step_ = step;
    scaler_.restore(scale, clean, hyst);
    hyper_ = h;
    clip_norm_ = clip;
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
// compute copies) as a safetensors file: an 8-byte little-endian header
// length, a JSON header (name -> dtype, shape, data offsets; padded with
// spaces to 8 bytes), then the data.
void Engine::export_safetensors(const char* path_c) {
  require_file_call("export_safetensors", path_c, false);
  require_load_complete("export_safetensors");
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
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    io_error("export_safetensors: renaming to '" + path + "': " + errno_text());
}

}  // namespace pstar::engine
