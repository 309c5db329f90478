// The checkpoint format on its own (src/checkpoint/, docs/checkpoints.md):
// the manifest's text, pinned byte for byte; its round trip through the
// strict reader; the reader's refusals (syntax, ranges, tiling), each with
// its reason; the safetensors header; the checked files and the crash
// points.  No engine: the module takes plain values.
#include <criterion/criterion.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "util/error.h"

namespace ck = pstar::checkpoint;

namespace {

// A one-process manifest: a scalar, a name that needs escaping, a frozen
// parameter, an empty one.
ck::Manifest one_process() {
  ck::Manifest m;
  ck::Settings& s = m.settings;
  s.library = "0.1.0 test build";
  s.compute_dtype = "bf16";
  s.chunk_elems = 1024;
  s.step = 7;
  s.loss_scale = 65536.0f;
  s.loss_scale_clean_steps = 3;
  s.loss_scale_hysteresis_left = 2;
  s.adam.lr = 1e-3f;
  s.adam.beta1 = 0.9f;
  s.adam.beta2 = 0.999f;
  s.adam.eps = 1e-8f;
  s.adam.weight_decay = 0.01f;
  s.adam.adamw = true;
  s.clip_norm = 1.0f;
  m.params.push_back({"layer 0.w%", {3, 4}, 12, false, 0, 0.5f, true});
  m.params.push_back({"emb\x01\x7f\xc3\xbc", {5}, 5, true, 0, 1.0f, true});
  m.params.push_back({"bias", {}, 1, false, 12, 1.0f, false});
  m.params.push_back({"empty", {0}, 0, false, 13, 1.0f, true});
  m.files["masters.f32"] = {13 * 4, 0x0123456789abcdefull};
  m.files["exp_avg.f32"] = {13 * 4, 1};
  m.files["exp_avg_sq.f32"] = {13 * 4, 2};
  m.files["frozen.f32"] = {5 * 4, 0xffffffffffffffffull};
  return m;
}

// Two ranks: "w" (10 elements) split 6 + 4, frozen "f" (3) on rank 1 only.
ck::Manifest two_ranks() {
  ck::Manifest m = one_process();
  m.settings.sharded = true;
  m.settings.world_size = 2;
  m.params.clear();
  m.params.push_back({"w", {2, 5}, 10, false, 0, 1.0f, true});
  m.params.push_back({"f", {3}, 3, true, 0, 1.0f, true});
  m.pieces.push_back({0, 0, 0, 6, 0});
  m.pieces.push_back({0, 1, 6, 4, 0});
  m.pieces.push_back({1, 1, 0, 3, 0});
  m.files.clear();
  for (int r = 0; r < 2; ++r) {
    for (int list = 0; list < 4; ++list) {
      const uint64_t floats = list == 3 ? (r == 1 ? 3 : 0) : (r == 0 ? 6 : 4);
      m.files[ck::shard_file(list, r)] = {floats * 4, static_cast<uint64_t>(10 * r + list)};
    }
  }
  return m;
}

// The checksum line recomputed for the (edited) bytes before it, as a
// deliberate editor would.
std::string reseal(std::string text) {
  const size_t at = text.rfind('\n', text.size() - 2) + 1;
  text.replace(at + 9, 16, ck::hex64(ck::xxh3_64(text.data(), at)));
  return text;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  cr_assert_neq(at, std::string::npos, "'%s' is not in the manifest", from.c_str());
  return text.replace(at, from.size(), to);
}

// The error of fn(), or "" if it returned.
std::string error_of(const std::function<void()>& fn, pstar_status* status = nullptr) {
  try {
    fn();
  } catch (const pstar::Error& e) {
    if (status != nullptr) *status = e.status();
    return e.what();
  }
  return "";
}

// Every step of a load's reading of `text`: the syntax, the settings, the
// layout.
void read_all(const std::string& text) {
  const ck::Manifest m = ck::parse_manifest_text(text, "M");
  (void)ck::check_layout(m, ck::check_settings(m, "M"), "M");
}

// An edit of a manifest (`from` replaced by `to`, resealed) and the reason
// it must be refused with.
struct Edit {
  const char *from, *to, *reason;
};

void expect_refused(const std::string& text, const char* reason) {
  pstar_status st = PSTAR_OK;
  const std::string e = error_of([&] { read_all(text); }, &st);
  cr_assert(!e.empty(), "accepted; expected a refusal with '%s'", reason);
  cr_assert_eq(st, PSTAR_ERR_IO, "%s", e.c_str());
  cr_assert(e.find(reason) != std::string::npos, "refused with '%s'; expected '%s'", e.c_str(), reason);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expect_same(const ck::Manifest& want, const ck::Manifest& got, const ck::Settings& s) {
  const ck::Settings& w = want.settings;
  cr_assert_eq(s.library, w.library);
  cr_assert_eq(s.compute_dtype, w.compute_dtype);
  cr_assert_eq(s.chunk_elems, w.chunk_elems);
  cr_assert_eq(s.world_size, w.world_size);
  cr_assert_eq(s.sharded, w.sharded);
  cr_assert_eq(s.step, w.step);
  cr_assert_eq(s.loss_scale_clean_steps, w.loss_scale_clean_steps);
  cr_assert_eq(s.loss_scale_hysteresis_left, w.loss_scale_hysteresis_left);
  cr_assert_eq(s.adam.adamw, w.adam.adamw);
  const float got_f[] = {s.loss_scale, s.adam.lr, s.adam.beta1, s.adam.beta2, s.adam.eps, s.adam.weight_decay,
                         s.clip_norm};
  const float want_f[] = {w.loss_scale, w.adam.lr, w.adam.beta1, w.adam.beta2, w.adam.eps, w.adam.weight_decay,
                          w.clip_norm};
  for (size_t i = 0; i < 7; ++i) cr_assert(same_bits(got_f[i], want_f[i]), "float setting %zu", i);
  cr_assert_eq(got.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    const ck::ManifestParam &a = want.params[i], &b = got.params[i];
    cr_assert_eq(a.name, b.name, "parameter %zu", i);
    cr_assert(a.shape == b.shape && a.numel == b.numel && a.frozen == b.frozen && a.offset == b.offset &&
                  same_bits(a.lr_scale, b.lr_scale) && a.weight_decay == b.weight_decay,
              "parameter %zu", i);
  }
  cr_assert_eq(got.pieces.size(), want.pieces.size());
  for (size_t i = 0; i < want.pieces.size(); ++i) {
    const ck::ManifestPiece &a = want.pieces[i], &b = got.pieces[i];
    cr_assert(a.param == b.param && a.rank == b.rank && a.start == b.start && a.count == b.count &&
                  a.offset == b.offset,
              "piece %zu", i);
  }
  cr_assert_eq(got.files.size(), want.files.size());
  for (const auto& [name, f] : want.files) {
    cr_assert_eq(got.files.count(name), 1u, "%s", name.c_str());
    cr_assert(got.files.at(name).bytes == f.bytes && got.files.at(name).xxh3 == f.xxh3, "%s", name.c_str());
  }
}

// A fresh directory under the build tree, removed (two levels) at the end.
struct TempDir {
  std::string path;
  TempDir() {
    path = std::string(PSTAR_TEST_TMP_DIR) + "/ckfmt-XXXXXX";
    cr_assert_not_null(mkdtemp(path.data()), "mkdtemp: %s", std::strerror(errno));
  }
  ~TempDir() { remove_tree(path); }
  static void remove_tree(const std::string& p) {
    if (DIR* d = opendir(p.c_str())) {
      while (const dirent* e = readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) remove_tree(p + "/" + e->d_name);
      }
      closedir(d);
      ::rmdir(p.c_str());
    } else {
      ::unlink(p.c_str());
    }
  }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

}  // namespace

// The format, pinned: any change to what a save writes fails here first.
Test(checkpoint_format, the_manifest_text_is_format_version_2) {
  const std::string body =
      "pstar-checkpoint 2\n"
      "library 0.1.0 test build\n"
      "compute_dtype bf16\n"
      "chunk_elems 1024\n"
      "world_size 1\n"
      "step 7\n"
      "loss_scale 0x1p+16\n"
      "loss_scale_clean_steps 3\n"
      "loss_scale_hysteresis_left 2\n"
      "lr 0x1.0624dep-10\n"
      "beta1 0x1.ccccccp-1\n"
      "beta2 0x1.ff7ceep-1\n"
      "eps 0x1.5798eep-27\n"
      "weight_decay 0x1.47ae14p-7\n"
      "adamw 1\n"
      "clip_norm 0x1p+0\n"
      "param layer%200.w%25 numel=12 shape=3,4 frozen=0 offset=0 lr_scale=0x1p-1 weight_decay=1\n"
      "param emb%01%7F%C3%BC numel=5 shape=5 frozen=1 offset=0 lr_scale=0x1p+0 weight_decay=1\n"
      "param bias numel=1 shape= frozen=0 offset=12 lr_scale=0x1p+0 weight_decay=0\n"
      "param empty numel=0 shape=0 frozen=0 offset=13 lr_scale=0x1p+0 weight_decay=1\n"
      "file exp_avg.f32 bytes=52 xxh3=0000000000000001\n"
      "file exp_avg_sq.f32 bytes=52 xxh3=0000000000000002\n"
      "file frozen.f32 bytes=20 xxh3=ffffffffffffffff\n"
      "file masters.f32 bytes=52 xxh3=0123456789abcdef\n";
  const std::string text = ck::manifest_text(one_process());
  cr_assert_eq(text, body + "checksum " + ck::hex64(ck::xxh3_64(body.data(), body.size())) + "\n", "%s",
               text.c_str());
  const std::string sharded = ck::manifest_text(two_ranks());
  cr_assert(sharded.find("world_size 2\nsharded 1\nstep 7\n") != std::string::npos, "%s", sharded.c_str());
  cr_assert(sharded.find("piece 0 rank=0 start=0 count=6 offset=0\npiece 0 rank=1 start=6 count=4 offset=0\n"
                         "piece 1 rank=1 start=0 count=3 offset=0\nfile exp_avg.r0.f32 bytes=24 ") != std::string::npos,
            "%s", sharded.c_str());
}

Test(checkpoint_format, a_manifest_reads_back_as_written) {
  for (const ck::Manifest& want : {one_process(), two_ranks()}) {
    const std::string text = ck::manifest_text(want);
    ck::Manifest got = ck::parse_manifest_text(text, "M");
    const ck::Settings s = ck::check_settings(got, "M");
    expect_same(want, got, s);
    const auto pieces = ck::check_layout(got, s, "M");
    cr_assert_eq(pieces.size(), want.params.size());
    if (!want.settings.sharded) {
      for (size_t j = 0; j < pieces.size(); ++j) {
        cr_assert(pieces[j].size() == 1 && pieces[j][0].start == 0 && pieces[j][0].count == want.params[j].numel &&
                  pieces[j][0].offset == want.params[j].offset);
      }
    } else {
      cr_assert(pieces[0].size() == 2 && pieces[1].size() == 1 && pieces[1][0].rank == 1);
    }
    // Written again from what was read: the same bytes.
    got.settings = s;
    cr_assert_eq(ck::manifest_text(got), text);
  }
}

Test(checkpoint_format, a_file_manifest_reads_back) {
  TempDir dir;
  const std::string path = dir.path + "/manifest";
  const std::string text = ck::manifest_text(one_process());
  spit(path, text);
  const ck::Manifest got = ck::parse_manifest(path);
  expect_same(one_process(), got, ck::check_settings(got, path));
  const std::string e = error_of([&] { ck::parse_manifest(dir.path + "/none"); });
  cr_assert(e.find("missing file") != std::string::npos, "%s", e.c_str());
}

Test(checkpoint_format, the_reader_refuses_what_the_writer_does_not_write) {
  const std::string good = ck::manifest_text(one_process());
  read_all(good);
  const size_t checksum_at = good.rfind('\n', good.size() - 2) + 1;
  // Without a reseal: the checksum finds any edit.
  expect_refused(replaced(good, "step 7", "step 8"), "is corrupted: its XXH3 is");
  expect_refused(good.substr(0, good.size() - 1), "does not end with its checksum line");
  expect_refused(good.substr(0, checksum_at), "does not end with its checksum line");
  expect_refused(good + "x\n", "does not end with its checksum line");
  expect_refused("", "is empty");
  // The version before the checksum.
  expect_refused(replaced(good, "pstar-checkpoint 2", "pstar-checkpoint 1"), "version 1 manifests");
  expect_refused(replaced(good, "pstar-checkpoint 2", "pstar-checkpoint 3"), "written by a newer libpstar");
  expect_refused(replaced(good, "pstar-checkpoint 2", "pstar-checkpoint"), "no format version");
  expect_refused(replaced(good, "pstar-checkpoint 2", "other-format 2"), "not a libpstar checkpoint manifest");
  // Resealed edits: every line is still read strictly.
  const Edit edits[] = {
      {"step 7", "step +7", "step +7 is malformed"},
      {"step 7", "step 99999999999999999999", "is malformed"},
      {"step 7", "step 7 8", "'step' takes one value"},
      {"step 7\n", "step 7\nstep 8\n", "'step' appears twice"},
      {"step 7\n", "stop 7\n", "'stop' is not an entry of a version 2 manifest"},
      {"step 7\n", "step  7\n", "an empty field"},
      {"adamw 1", "adamw 2", "adamw 2 is malformed"},
      {"lr 0x1.0624dep-10", "lr nan", "lr nan is malformed or out of range"},
      {"lr 0x1.0624dep-10", "lr -0x1p+0", "out of range"},
      {"beta1 0x1.ccccccp-1", "beta1 0x1p+0", "beta1 0x1p+0 is malformed or out of range"},
      {"eps 0x1.5798eep-27", "eps 0x0p+0", "eps 0x0p+0 is malformed or out of range"},
      {"loss_scale 0x1p+16", "loss_scale inf", "out of range"},
      {"loss_scale_clean_steps 3", "loss_scale_clean_steps 4294967296", "is malformed"},
      {"compute_dtype bf16", "compute_dtype f64", "is not f32, f16 or bf16"},
      {"chunk_elems 1024", "chunk_elems 0", "chunk_elems 0"},
      {"world_size 1", "world_size 2", "world_size 2 without 'sharded 1'"},
      {"world_size 1\n", "world_size 1\nsharded 0\n", "only 'sharded 1' is written"},
      {"clip_norm 0x1p+0\n", "", "has no 'clip_norm'"},
      {"layer%200.w%25", "layer%200.w%2", "malformed parameter name"},
      {"layer%200.w%25", "layer%00", "malformed parameter name"},
      {"param bias", "param layer%200.w%25", "appears twice"},
      {"numel=12 shape=3,4", "numel=12 shape=3,5", "is not the product of shape"},
      {"numel=12 shape=3,4", "numel=12 shape=3,-4", "malformed shape"},
      {"shape=3,4 frozen=0", "shape=3,4 frozen=0 extra=1", "a field this library does not write"},
      {"shape=3,4 frozen=0", "shape=3,4 frozen=0 frozen=1", "a key given twice"},
      {" lr_scale=0x1p-1", " lr_scale=-0x1p-1", "a negative lr_scale"},
      {" lr_scale=0x1p-1", " lr_scale= 0x1p-1", "'0x1p-1' is not key=value"},
      {"xxh3=0123456789abcdef", "xxh3=0123456789ABCDEF", "malformed file entry"},
      {"file exp_avg.f32", "file masters.f32", "appears twice"},
      // The layout: offsets and sizes against the files.
      {"offset=12 lr_scale", "offset=11 lr_scale", "overlap, leave a gap or run past its end"},
      {"offset=12 lr_scale", "offset=13 lr_scale", "overlap, leave a gap or run past its end"},
      {"offset=0 lr_scale=0x1p-1", "offset=1 lr_scale=0x1p-1", "overlap, leave a gap or run past its end"},
      {"exp_avg.f32 bytes=52", "exp_avg.f32 bytes=56", "is said to hold 56 bytes, its pieces 13 floats"},
      {"frozen.f32 bytes=20", "frozen.f32 bytes=21", "is said to hold 21 bytes"},
      {"file frozen.f32 bytes=20 xxh3=ffffffffffffffff\n", "", "lists 3 files"},
      {"file frozen.f32", "file frozen2.f32", "lists no file 'frozen.f32'"},
      {"file masters.f32 bytes=52 xxh3=0123456789abcdef\n",
       "file masters.f32 bytes=52 xxh3=0123456789abcdef\npiece 0 rank=0 start=0 count=12 offset=0\n",
       "piece entries without 'sharded 1'"},
  };
  for (const auto& ed : edits) expect_refused(reseal(replaced(good, ed.from, ed.to)), ed.reason);

  const std::string sharded = ck::manifest_text(two_ranks());
  read_all(sharded);
  const Edit sharded_edits[] = {
      {"rank=1 start=6 count=4", "rank=1 start=7 count=4", "lies outside it"},
      {"rank=1 start=6 count=4", "rank=1 start=5 count=4", "do not cover it exactly once"},
      {"rank=1 start=6 count=4", "rank=1 start=6 count=3", "do not cover it exactly once"},
      {"piece 0 rank=1", "piece 0 rank=2", "outside the world"},
      {"piece 1 rank=1", "piece 2 rank=1", "outside the world"},
      {"start=0 count=3", "start=0 count=0", "lies outside it"},
      {"world_size 2", "world_size 0", "world_size 0 is out of range"},
      {"numel=3 shape=3 frozen=1 offset=0", "numel=3 shape=3 frozen=1 offset=1", "has an offset in a sharded"},
      {"start=0 count=3 offset=0", "start=0 count=3 offset=x", "malformed piece entry"},
      {"file masters.r1.f32 bytes=16 xxh3=000000000000000a\n", "", "lists 7 files"},
  };
  for (const auto& ed : sharded_edits) expect_refused(reseal(replaced(sharded, ed.from, ed.to)), ed.reason);
}

Test(checkpoint_format, tiles_covers_exactly_once) {
  cr_assert(ck::tiles({}, 0));
  cr_assert(ck::tiles({{4, 2}, {0, 4}, {9, 0}}, 6));
  cr_assert(!ck::tiles({{0, 4}, {3, 3}}, 6));  // overlap
  cr_assert(!ck::tiles({{0, 3}, {4, 2}}, 6));  // gap
  cr_assert(!ck::tiles({{0, 7}}, 6));          // past the end
  cr_assert(!ck::tiles({{1, UINT64_MAX}}, 0));
}

Test(checkpoint_format, the_safetensors_header) {
  const std::vector<ck::SafetensorsEntry> t = {{"a \"b\"\\c/\x01\x7f\xc3\xbc", {2, 3}, 6}, {"s", {}, 1}, {"e", {0}, 0}};
  const std::string h = ck::safetensors_header(t, "libpstar 9");
  const std::string json =
      "{\"__metadata__\":{\"producer\":\"libpstar 9\"},"
      "\"a \\\"b\\\"\\\\c/\\u0001\x7f\xc3\xbc\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
      "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[24,28]},"
      "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[28,28]}}";
  cr_assert_eq(h.size() % 8, 0u);
  cr_assert_eq(h.substr(0, json.size()), json, "%s", h.c_str());
  cr_assert_eq(h.find_first_not_of(' ', json.size()), std::string::npos);
  cr_assert_lt(h.size() - json.size(), 8u);
  // JSON's own escapes for the control characters that have one.
  cr_assert(ck::safetensors_header({{"t\tn\n", {1}, 1}}, "p").find("\"t\\tn\\n\":") != std::string::npos);
  pstar_status st = PSTAR_OK;
  std::string e = error_of([&] { (void)ck::safetensors_header({{"bad\xff", {1}, 1}}, "p"); }, &st);
  cr_assert(st == PSTAR_ERR_INVALID_ARGUMENT && e.find("not UTF-8") != std::string::npos, "%s", e.c_str());
  st = PSTAR_OK;
  e = error_of([&] { (void)ck::safetensors_header({{"__metadata__", {1}, 1}}, "p"); }, &st);
  cr_assert(st == PSTAR_ERR_INVALID_ARGUMENT && e.find("metadata") != std::string::npos, "%s", e.c_str());
}

Test(checkpoint_format, the_safetensors_file) {
  TempDir dir;
  const std::string path = dir.path + "/m.safetensors";
  const std::vector<ck::SafetensorsEntry> t = {{"w", {2}, 2}, {"e", {0}, 0}, {"b", {1}, 1}};
  ck::write_safetensors(path, t, "p", [](size_t i, std::vector<float>& out) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(10 * i + k) + 0.5f;
  });
  const std::string bytes = slurp(path);
  const std::string h = ck::safetensors_header(t, "p");
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[static_cast<size_t>(i)] = static_cast<char>(h.size() >> (8 * i));
  const float data[] = {0.5f, 1.5f, 20.5f};
  cr_assert_eq(bytes, len + h + std::string(reinterpret_cast<const char*>(data), sizeof data));
  cr_assert_eq(::access((path + ".tmp").c_str(), F_OK), -1);
  // A failure while writing removes the temporary file and leaves the old one.
  const std::string e = error_of([&] {
    ck::write_safetensors(path, t, "p", [](size_t i, std::vector<float>&) {
      if (i == 1) throw pstar::Error(PSTAR_ERR_IO, "boom");
    });
  });
  cr_assert_eq(e, "boom");
  cr_assert_eq(::access((path + ".tmp").c_str(), F_OK), -1);
  cr_assert_eq(slurp(path), bytes);
}

Test(checkpoint_format, checked_files_and_the_publication_of_a_checkpoint) {
  TempDir dir;
  const std::string root = dir.path + "/ck";
  unsetenv("PSTAR_TEST_CHECKPOINT_CRASH_AT");
  cr_assert_eq(ck::create_checkpoint_dir(root, 42), "ckpt-0000000042-0");
  cr_assert_eq(ck::create_checkpoint_dir(root, 42), "ckpt-0000000042-1");
  const std::string sub = ck::join_path(root, "ckpt-0000000042-0");
  cr_assert_eq(ck::join_path("a/", "b"), "a/b");
  // A list file: its checksum is the XXH3-64 of what was written.
  const float v[] = {1.0f, 2.0f, 3.0f};
  ck::CheckedWriter w(ck::join_path(sub, "masters.f32"));
  w.write(v, sizeof v);
  const uint64_t sum = w.finish();
  cr_assert_eq(w.bytes(), sizeof v);
  cr_assert_eq(sum, ck::xxh3_64(v, sizeof v));
  ck::CrashPoints crash;
  crash.pass("1");
  crash.pass("2");
  crash.pass("3");
  crash.pass("4");
  ck::publish_checkpoint(root, "ckpt-0000000042-0", "text\n", crash);
  cr_assert_eq(ck::read_latest(root), "ckpt-0000000042-0");
  cr_assert_eq(ck::read_small_file(ck::join_path(sub, "manifest")), "text\n");
  cr_assert_eq(::access(ck::join_path(root, "LATEST.tmp").c_str(), F_OK), -1);
  // Read back, verified; a wrong size or checksum is refused.
  const ck::DataFile f(ck::join_path(sub, "masters.f32"), sizeof v, sum);
  float back[2] = {0, 0};
  f.read(1, back, 2);
  cr_assert(back[0] == 2.0f && back[1] == 3.0f);
  std::string e = error_of([&] { ck::DataFile(ck::join_path(sub, "masters.f32"), sizeof v + 4, sum); });
  cr_assert(e.find("is truncated or extended: 12 bytes, the manifest says 16") != std::string::npos, "%s", e.c_str());
  e = error_of([&] { ck::DataFile(ck::join_path(sub, "masters.f32"), sizeof v, sum ^ 1); });
  cr_assert(e.find("is corrupted: its XXH3 is " + ck::hex64(sum) + ", the manifest says " + ck::hex64(sum ^ 1)) !=
                std::string::npos,
            "%s", e.c_str());
  // The crash hook: the n-th durability point stops the save; LATEST moves
  // only at the rename (point 8).
  for (int point = 5; point <= 8; ++point) {
    setenv("PSTAR_TEST_CHECKPOINT_CRASH_AT", std::to_string(point).c_str(), 1);
    ck::CrashPoints c;
    for (int i = 1; i <= 4; ++i) c.pass("a list file");
    const std::string name = ck::create_checkpoint_dir(root, 43);
    e = error_of([&] { ck::publish_checkpoint(root, name, "m\n", c); });
    unsetenv("PSTAR_TEST_CHECKPOINT_CRASH_AT");
    cr_assert(e.find("simulated crash at point " + std::to_string(point)) != std::string::npos, "%s", e.c_str());
    cr_assert_eq(ck::read_latest(root), point < 8 ? "ckpt-0000000042-0" : name, "point %d", point);
  }
  // LATEST that names no checkpoint.
  spit(ck::join_path(root, "LATEST"), "../x\n");
  e = error_of([&] { (void)ck::read_latest(root); });
  cr_assert(e.find("does not name a checkpoint") != std::string::npos, "%s", e.c_str());
  e = error_of([&] { (void)ck::read_latest(dir.path); });
  cr_assert(e.find("no checkpoint in") != std::string::npos, "%s", e.c_str());
}
