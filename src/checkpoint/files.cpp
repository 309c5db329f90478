// Durable writes and checked reads of checkpoint files (files.h): fsync of
// files and directories, the publication of a checkpoint through LATEST,
// the crash and load-fault test hooks, XXH3-64 checksums.  Kept apart from
// the engine so that what makes a save crash-safe reads in one place.
#include "checkpoint/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <vector>

#include "util/error.h"

#if defined(PSTAR_HAVE_XXHASH)
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

namespace pstar::checkpoint {

void io_error(const std::string& what) { throw Error(PSTAR_ERR_IO, what); }

std::string errno_text() { return std::strerror(errno); }

std::string join_path(const std::string& a, const std::string& b) {
  return a.empty() || a.back() == '/' ? a + b : a + "/" + b;
}

bool have_checksums() {
#if defined(PSTAR_HAVE_XXHASH)
  return true;
#else
  return false;
#endif
}

uint64_t xxh3_64(const void* data, size_t bytes) {
#if defined(PSTAR_HAVE_XXHASH)
  return XXH3_64bits(data, bytes);
#else
  (void)data;
  (void)bytes;
  throw Error(PSTAR_ERR_UNSUPPORTED, "this libpstar was built without xxhash (libxxhash-dev): no checksums");
#endif
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
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

// ---------------------------------------------------------------------------
// Streaming XXH3-64 (a no-op without xxhash).

struct CheckedWriter::Hash {
#if defined(PSTAR_HAVE_XXHASH)
  XXH3_state_t* state = nullptr;
  Hash() : state(XXH3_createState()) {
    if (state == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state);
  }
  ~Hash() { XXH3_freeState(state); }
  void update(const void* data, size_t bytes) { XXH3_64bits_update(state, data, bytes); }
  uint64_t digest() const { return XXH3_64bits_digest(state); }
#else
  void update(const void*, size_t) {}
  uint64_t digest() const { return 0; }
#endif
  Hash(const Hash&) = delete;
  Hash& operator=(const Hash&) = delete;
};

CheckedWriter::CheckedWriter(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)), hash_(std::make_unique<Hash>()) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) io_error(what_ + ": creating '" + path_ + "': " + errno_text());
}

CheckedWriter::~CheckedWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void CheckedWriter::write(const void* data, size_t bytes) {
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
  hash_->update(data, bytes);
  bytes_ += bytes;
}

uint64_t CheckedWriter::finish() {
  if (::fsync(fd_) != 0) io_error(what_ + ": syncing '" + path_ + "': " + errno_text());
  if (::close(fd_) != 0) {
    fd_ = -1;
    io_error(what_ + ": closing '" + path_ + "': " + errno_text());
  }
  fd_ = -1;
  return hash_->digest();
}

// ---------------------------------------------------------------------------
// Saving: the test hook, the directory, the publication.

CrashPoints::CrashPoints() {
  if (const char* v = std::getenv("PSTAR_TEST_CHECKPOINT_CRASH_AT")) at_ = std::atoi(v);
}

void CrashPoints::pass(const char* where) {
  ++count_;
  if (at_ == count_) {
    io_error(std::string("checkpoint_save: simulated crash at point ") + std::to_string(count_) + " (" + where +
             "; PSTAR_TEST_CHECKPOINT_CRASH_AT)");
  }
}

std::string create_checkpoint_dir(const std::string& dir, uint64_t step) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    io_error("checkpoint_save: creating '" + dir + "': " + errno_text());
  }
  for (int n = 0;; ++n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "ckpt-%010" PRIu64 "-%d", step, n);
    if (::mkdir(join_path(dir, buf).c_str(), 0755) == 0) return buf;
    if (errno != EEXIST) io_error("checkpoint_save: creating '" + join_path(dir, buf) + "': " + errno_text());
  }
}

void publish_checkpoint(const std::string& dir, const std::string& name, const std::string& manifest,
                        CrashPoints& crash) {
  const std::string sub = join_path(dir, name);
  {
    CheckedWriter w(join_path(sub, "manifest"));
    w.write(manifest.data(), manifest.size());
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
}

// ---------------------------------------------------------------------------
// Loading: small files whole, data files verified before they are read.

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

DataFile::DataFile(std::string path, uint64_t expect_bytes, uint64_t expect_xxh3) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) io_error("checkpoint_load: missing file '" + path_ + "' (" + errno_text() + ")");
  try {
    verify(expect_bytes, expect_xxh3);
  } catch (...) {
    ::close(fd_);  // the destructor of a half-made object does not run
    fd_ = -1;
    throw;
  }
}

DataFile::~DataFile() {
  if (fd_ >= 0) ::close(fd_);
}

void DataFile::read(uint64_t offset_elems, float* out, uint64_t count) const {
  char* p = reinterpret_cast<char*>(out);
  size_t left = count * sizeof(float);
  off_t pos = static_cast<off_t>(offset_elems * sizeof(float));
  while (left > 0) {
    const ssize_t n = ::pread(fd_, p, left, pos);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      io_error("checkpoint_load: reading '" + path_ + "': " + (n == 0 ? std::string("unexpected end") : errno_text()));
    }
    p += n;
    pos += n;
    left -= static_cast<size_t>(n);
  }
}

// Size and XXH3-64 of the whole file against the manifest's.
void DataFile::verify(uint64_t expect_bytes, uint64_t expect_xxh3) {
  struct stat st;
  if (::fstat(fd_, &st) != 0) io_error("checkpoint_load: '" + path_ + "': " + errno_text());
  bytes_ = static_cast<uint64_t>(st.st_size);
  if (!S_ISREG(st.st_mode) || bytes_ != expect_bytes) {
    io_error("checkpoint_load: '" + path_ + "' is truncated or extended: " + std::to_string(bytes_) +
             " bytes, the manifest says " + std::to_string(expect_bytes));
  }
#if defined(PSTAR_HAVE_XXHASH)
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
  const uint64_t got = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!failure.empty()) io_error("checkpoint_load: reading '" + path_ + "': " + failure);
  if (pos != bytes_) io_error("checkpoint_load: '" + path_ + "' changed size while it was read");
  if (got != expect_xxh3) {
    io_error("checkpoint_load: '" + path_ + "' is corrupted: its XXH3 is " + hex64(got) + ", the manifest says " +
             hex64(expect_xxh3));
  }
#else
  (void)expect_xxh3;
  throw Error(PSTAR_ERR_UNSUPPORTED, "checkpoint_load: this libpstar was built without xxhash (libxxhash-dev)");
#endif
}

LoadFaults::LoadFaults() {
  const char* v = std::getenv("PSTAR_TEST_CHECKPOINT_LOAD_FAULT");
  if (v == nullptr) return;
  const std::string s(v);
  if (s == "check") check_ = true;
  if (s.rfind("read:", 0) == 0) read_at_ = std::strtoull(s.c_str() + 5, nullptr, 10);
}

void LoadFaults::after_checks() const {
  if (check_) io_error("checkpoint_load: simulated refusal after every check (PSTAR_TEST_CHECKPOINT_LOAD_FAULT)");
}

void LoadFaults::before_read(const DataFile& f) {
  if (read_at_ != 0 && ++reads_ == read_at_) {
    io_error("checkpoint_load: reading '" + f.path() + "': simulated I/O error at read " + std::to_string(reads_) +
             " (PSTAR_TEST_CHECKPOINT_LOAD_FAULT)");
  }
}

}  // namespace pstar::checkpoint
