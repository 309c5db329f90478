// The files of a checkpoint, written durably and read back checked
// (docs/checkpoints.md, "Crash safety" and "Loading").  This module owns
// what makes a save crash-safe and a load trustworthy, apart from the
// engine whose values go through it: writes that fsync the file and its
// directory, the LATEST.tmp + rename that publishes a checkpoint, the test
// hook PSTAR_TEST_CHECKPOINT_CRASH_AT with its numbered durability points,
// XXH3-64 checksums, and on the way back the data files verified whole
// before they are read (with the test hook PSTAR_TEST_CHECKPOINT_LOAD_FAULT)
// and the small files (LATEST, the manifest).  Dependencies point one way:
// the engine uses this, this knows nothing of the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace pstar::checkpoint {

// Throws Error(PSTAR_ERR_IO, what).
[[noreturn]] void io_error(const std::string& what);
// strerror(errno).
std::string errno_text();

// a/b (no doubled slash when a ends with one).
std::string join_path(const std::string& a, const std::string& b);

// Whether this build has XXH3 (libxxhash-dev): without it nothing is
// checksummed and saves and loads are refused by their callers.
bool have_checksums();
// XXH3-64 of `bytes` bytes; PSTAR_ERR_UNSUPPORTED without xxhash.
uint64_t xxh3_64(const void* data, size_t bytes);
// A checksum as the manifest writes it: 16 lowercase hex digits.
std::string hex64(uint64_t v);

// fsync of a file or a directory (errors name checkpoint_save).
void fsync_path(const std::string& path, bool directory);

// A file written in pieces, with its XXH3-64 computed along the way (0
// without xxhash): created (truncated), written, then fsynced and closed.
class CheckedWriter {
 public:
  // `what` names the call in error messages.
  explicit CheckedWriter(std::string path, std::string what = "checkpoint_save");
  ~CheckedWriter();
  CheckedWriter(const CheckedWriter&) = delete;
  CheckedWriter& operator=(const CheckedWriter&) = delete;

  void write(const void* data, size_t bytes);
  // fsync and close; returns the checksum.
  uint64_t finish();
  uint64_t bytes() const { return bytes_; }

 private:
  struct Hash;
  std::string path_;
  std::string what_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  std::unique_ptr<Hash> hash_;
};

// The durability points of a save, for the crash test hook: with
// PSTAR_TEST_CHECKPOINT_CRASH_AT=n the n-th pass() throws PSTAR_ERR_IO as
// a crash there would (1-4: after each list file, 5: the manifest, 6: the
// checkpoint directory's fsync, 7: LATEST.tmp, 8: the rename of LATEST);
// unset, it is inert.
class CrashPoints {
 public:
  CrashPoints();
  void pass(const char* where);

 private:
  int at_ = 0;
  int count_ = 0;
};

// A new subdirectory "ckpt-<step, 10 digits>-<n>" of `dir` (created if
// missing), the first free n; returns its name.
std::string create_checkpoint_dir(const std::string& dir, uint64_t step);

// Publishes checkpoint `name` of `dir`: writes `manifest` into it (fsynced),
// fsyncs the subdirectory, writes LATEST.tmp (fsynced), renames it over
// LATEST and fsyncs `dir`; durability points 5 to 8 of `crash`.  Until the
// rename LATEST names the previous checkpoint, whole.
void publish_checkpoint(const std::string& dir, const std::string& name, const std::string& manifest,
                        CrashPoints& crash);

// The whole of a small file (the manifest): a regular file of at most 1 GiB.
std::string read_small_file(const std::string& path);
// The checkpoint dir/LATEST names (no '/', not "." or "..").
std::string read_latest(const std::string& dir);

// A data file of the checkpoint being loaded, open from its verification
// (size and XXH3-64 against the manifest) until the load has read it again:
// a file replaced meanwhile is never the one read.
class DataFile {
 public:
  DataFile(std::string path, uint64_t expect_bytes, uint64_t expect_xxh3);
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;
  ~DataFile();

  // `count` floats from element `offset_elems` (checked against the size
  // before the load began writing; an error here is a read error or a file
  // changed in place since).
  void read(uint64_t offset_elems, float* out, uint64_t count) const;
  const std::string& path() const { return path_; }

 private:
  void verify(uint64_t expect_bytes, uint64_t expect_xxh3);

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
  LoadFaults();
  void after_checks() const;
  void before_read(const DataFile& f);

 private:
  bool check_ = false;
  uint64_t read_at_ = 0;
  uint64_t reads_ = 0;
};

}  // namespace pstar::checkpoint
