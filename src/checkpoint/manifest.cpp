// The checkpoint manifest's text and its strict reading (manifest.h).  The
// whole format version 2 is here: what each line holds and how it is
// written, and everything a load checks about a manifest before it trusts
// it (its checksum, every line, every value's range, the tiling of
// parameters and files).  docs/checkpoints.md describes it for users.
#include "checkpoint/manifest.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "checkpoint/files.h"

namespace pstar::checkpoint {

const char* const kListFiles[4] = {"masters.f32", "exp_avg.f32", "exp_avg_sq.f32", "frozen.f32"};

std::string shard_file(int list, int rank) {
  std::string f = kListFiles[list];
  return f.substr(0, f.size() - 4) + ".r" + std::to_string(rank) + ".f32";
}

std::string list_file(int list, bool sharded, int rank) {
  return sharded ? shard_file(list, rank) : std::string(kListFiles[list]);
}

namespace {

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

// A float exactly, as C99 hex ("%a").
std::string hex_float(float v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", static_cast<double>(v));
  return buf;
}

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

// is_hex16's digits as a number.
uint64_t hex16_value(const std::string& s) {
  uint64_t v = 0;
  for (char ch : s) v = v * 16 + static_cast<uint64_t>(hex_digit(ch));
  return v;
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

std::string join_shape(const std::vector<int64_t>& shape) {
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Writing: format, settings, parameters, pieces, files, checksum.

std::string manifest_text(const Manifest& m) {
  const Settings& s = m.settings;
  std::ostringstream o;
  o << kFormatName << ' ' << kFormatVersion << '\n';
  o << "library " << s.library << '\n';
  o << "compute_dtype " << s.compute_dtype << '\n';
  o << "chunk_elems " << s.chunk_elems << '\n';
  if (s.state_format != "fp32") o << "state_format " << s.state_format << '\n';
  if (s.master_format != "fp32") o << "master_format " << s.master_format << '\n';
  o << "world_size " << s.world_size << '\n';
  if (s.sharded) o << "sharded 1\n";
  o << "step " << s.step << '\n';
  o << "loss_scale " << hex_float(s.loss_scale) << '\n';
  o << "loss_scale_clean_steps " << s.loss_scale_clean_steps << '\n';
  o << "loss_scale_hysteresis_left " << s.loss_scale_hysteresis_left << '\n';
  o << "lr " << hex_float(s.adam.lr) << '\n';
  o << "beta1 " << hex_float(s.adam.beta1) << '\n';
  o << "beta2 " << hex_float(s.adam.beta2) << '\n';
  o << "eps " << hex_float(s.adam.eps) << '\n';
  o << "weight_decay " << hex_float(s.adam.weight_decay) << '\n';
  o << "adamw " << (s.adam.adamw ? 1 : 0) << '\n';
  o << "clip_norm " << hex_float(s.clip_norm) << '\n';
  for (const ManifestParam& p : m.params) {
    o << "param " << escape(p.name) << " numel=" << p.numel << " shape=" << join_shape(p.shape)
      << " frozen=" << (p.frozen ? 1 : 0) << " offset=" << p.offset << " lr_scale=" << hex_float(p.lr_scale)
      << " weight_decay=" << (p.weight_decay ? 1 : 0) << '\n';
  }
  for (const ManifestPiece& pc : m.pieces) {
    o << "piece " << pc.param << " rank=" << pc.rank << " start=" << pc.start << " count=" << pc.count
      << " offset=" << pc.offset << '\n';
  }
  for (const auto& [fname, f] : m.files)
    o << "file " << fname << " bytes=" << f.bytes << " xxh3=" << hex64(f.xxh3) << '\n';
  std::string text = o.str();
  // Last: the checksum of every byte before it (checked before a load
  // believes any other line).
  if (have_checksums()) text += "checksum " + hex64(xxh3_64(text.data(), text.size())) + "\n";
  return text;
}

// ---------------------------------------------------------------------------
// Reading.  The last line is "checksum <XXH3-64 of every byte before that
// line>", checked before any other line is believed; then every line must be
// one this library writes.

Manifest parse_manifest(const std::string& path) { return parse_manifest_text(read_small_file(path), path); }

// "key value" scalar lines, and "param", "file" and "piece" lines with a
// name (or index) and key=value fields.
Manifest parse_manifest_text(const std::string& text, const std::string& path) {
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
  const std::string got = hex64(xxh3_64(text.data(), start));
  if (got != last.substr(9)) {
    io_error("checkpoint_load: '" + path + "' is corrupted: its XXH3 is " + got + ", its checksum line says " +
             last.substr(9));
  }
  // Then every line between, strictly.
  static const char* const kScalars[] = {"library",
                                         "compute_dtype",
                                         "chunk_elems",
                                         "state_format",
                                         "master_format",
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
        mf.xxh3 = hex16_value(field("xxh3"));
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

// ---------------------------------------------------------------------------
// The settings, each in the range its setter accepts.

Settings check_settings(const Manifest& m, const std::string& path) {
  auto bad = [&](const std::string& what) { io_error("checkpoint_load: '" + path + "': " + what); };
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
  Settings s;
  s.library = scalar("library");
  s.compute_dtype = scalar("compute_dtype");
  const std::string& dt = s.compute_dtype;
  if (dt != "f32" && dt != "f16" && dt != "bf16") bad("compute_dtype " + dt + " is not f32, f16 or bf16");
  s.chunk_elems = u64_of("chunk_elems");
  if (s.chunk_elems == 0) bad("chunk_elems 0");
  if (m.values.count("state_format") != 0) {
    s.state_format = scalar("state_format");
    if (s.state_format != "bf16" && s.state_format != "int8") {
      bad("state_format " + s.state_format + " is not bf16 or int8 (fp32 is written as no line)");
    }
  }
  if (m.values.count("master_format") != 0) {
    s.master_format = scalar("master_format");
    if (s.master_format != "bf16")
      bad("master_format " + s.master_format + " is not bf16 (fp32 is written as no line)");
  }
  s.sharded = m.values.count("sharded") != 0;
  if (s.sharded && !flag_of("sharded")) bad("sharded " + scalar("sharded") + " (only 'sharded 1' is written)");
  const uint64_t world64 = u64_of("world_size");
  if (world64 < 1 || world64 > (uint64_t{1} << 20) || (!s.sharded && world64 != 1)) {
    bad("world_size " + scalar("world_size") + (s.sharded ? " is out of range" : " without 'sharded 1'"));
  }
  s.world_size = static_cast<uint32_t>(world64);
  s.step = u64_of("step");
  s.loss_scale = f32_in("loss_scale", 0.0, 3e38, true, false);
  s.loss_scale_clean_steps = u32_of("loss_scale_clean_steps");
  s.loss_scale_hysteresis_left = u32_of("loss_scale_hysteresis_left");
  s.adam.lr = f32_in("lr", 0.0, 1e30, false, false);
  s.adam.beta1 = f32_in("beta1", 0.0, 1.0, false, true);
  s.adam.beta2 = f32_in("beta2", 0.0, 1.0, false, true);
  s.adam.eps = f32_in("eps", 0.0, 1e30, true, false);
  s.adam.weight_decay = f32_in("weight_decay", 0.0, 1e30, false, false);
  s.adam.adamw = flag_of("adamw");
  s.clip_norm = f32_in("clip_norm", 0.0, 1e30, false, false);
  return s;
}

// ---------------------------------------------------------------------------
// The layout: one piece per parameter in the list files of a one-process
// save; a piece per (parameter, rank) in the rank files of a sharded one
// (any world size and chunk size loads either).  The pieces must tile each
// parameter, and each rank's files, exactly.

bool tiles(std::vector<std::pair<uint64_t, uint64_t>> ranges, uint64_t total) {
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [s, c] : ranges) {
    if (c == 0) continue;
    if (s != at || c > UINT64_MAX - s) return false;
    at = s + c;
  }
  return at == total;
}

std::vector<std::vector<ManifestPiece>> check_layout(const Manifest& m, const Settings& s, const std::string& path) {
  auto bad = [&](const std::string& what) { io_error("checkpoint_load: '" + path + "': " + what); };
  const bool from_shards = s.sharded;
  const uint32_t saved_world = s.world_size;
  std::vector<std::vector<ManifestPiece>> pieces(m.params.size());
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
      if (!tiles(r, m.params[j].numel)) bad("the pieces of '" + m.params[j].name + "' do not cover it exactly once");
    }
  } else {
    if (!m.pieces.empty()) bad("piece entries without 'sharded 1'");
    for (size_t j = 0; j < m.params.size(); ++j) {
      pieces[j].push_back(ManifestPiece{static_cast<uint32_t>(j), 0, 0, m.params[j].numel, m.params[j].offset});
    }
  }
  // Each rank's two layouts (the three trainable lists share one, frozen
  // values have theirs): the pieces in them tile the file exactly.
  auto fname_of = [&](int list, uint32_t rank) { return list_file(list, from_shards, static_cast<int>(rank)); };
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
      if (!tiles(layout[r][kind], elems)) {
        bad("the offsets in '" + fname_of(kind == 0 ? 0 : 3, r) + "' overlap, leave a gap or run past its end");
      }
    }
  }
  return pieces;
}

}  // namespace pstar::checkpoint
