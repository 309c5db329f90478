// Check of NCCL's loading at run time (src/distributed/comm/nccl_loader.h), a plain
// C++ program (the GPU machine has no Criterion).  Needs no GPU: dlopen and
// ncclGetVersion work without one.  Modes:
//   nccl_loader_check              no NCCL mapped at start (the program links
//                                  the core, which no longer links NCCL); a
//                                  missing file and a library without NCCL's
//                                  functions give PSTAR_ERR_UNSUPPORTED
//                                  naming them; nccl_api() loads NCCL once
//                                  (from several threads), reports a version
//                                  >= the minimum and the file, which is the
//                                  one the process maps; a second load finds
//                                  it already loaded; a communicator gets past
//                                  loading (a CUDA error without a GPU).
//   nccl_loader_check --env-bad P  PSTAR_NCCL_LIBRARY is P, a missing file:
//                                  nccl_api() and make_nccl_communicator throw
//                                  PSTAR_ERR_UNSUPPORTED naming P, every time.
//   nccl_loader_check --env-good P PSTAR_NCCL_LIBRARY is P, an NCCL: it is the
//                                  one loaded.
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distributed/comm/nccl_communicator.h"
#include "distributed/comm/nccl_loader.h"
#include "util/error.h"

using namespace pstar;
using namespace pstar::distributed;

namespace {

int passes = 0, failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) {
    ++passes;
  } else {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string real(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) != nullptr ? std::string(buf) : path;
}

// The libnccl files this process maps (resolved).
std::set<std::string> mapped_nccl() {
  std::set<std::string> files;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (contains(path.substr(path.rfind('/') + 1), "libnccl")) files.insert(real(path));
  }
  return files;
}

// Runs `fn`, expecting Error(PSTAR_ERR_UNSUPPORTED) whose message holds
// every string of `parts`; returns the message.
template <class Fn>
std::string expect_unsupported(const std::string& what, Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    expect(false, what + ": no error");
    return "";
  } catch (const Error& e) {
    const std::string m = e.what();
    std::printf("%s: %s\n", what.c_str(), m.c_str());
    expect(e.status() == PSTAR_ERR_UNSUPPORTED, what + ": PSTAR_ERR_UNSUPPORTED, not " + std::to_string(e.status()));
    for (const std::string& p : parts) expect(contains(m, p), what + ": the message names \"" + p + "\"");
    return m;
  }
}

void check_loaded(const NcclApi& api, const char* what) {
  std::printf("%s: %s, NCCL %s (%d), %s\n", what, api.path.c_str(), nccl_version_string(api.version).c_str(),
              api.version, api.source.c_str());
  expect(api.version >= kNcclMinVersion, std::string(what) + ": version " + std::to_string(api.version) +
                                             " >= the minimum " + std::to_string(kNcclMinVersion));
  expect(!api.path.empty() && contains(api.path.substr(api.path.rfind('/') + 1), "libnccl"),
         std::string(what) + ": the path names a libnccl file");
  expect(api.GetVersion && api.GetUniqueId && api.CommInitRank && api.CommDestroy && api.CommAbort &&
             api.CommGetAsyncError && api.GetErrorString && api.GetLastError && api.AllGather && api.ReduceScatter &&
             api.AllReduce && api.Broadcast,
         std::string(what) + ": every function resolved");
#if PSTAR_NCCL_NONBLOCKING
  expect(api.CommInitRankConfig != nullptr, std::string(what) + ": ncclCommInitRankConfig resolved");
#endif
  int v = 0;
  expect(api.GetVersion(&v) == ncclSuccess && v == api.version, std::string(what) + ": ncclGetVersion through the table");
  expect(std::strcmp(api.GetErrorString(ncclInvalidArgument), "") != 0, std::string(what) + ": ncclGetErrorString");
}

void run_default() {
  expect(mapped_nccl().empty(), "no libnccl mapped before the first load");
  expect(nccl_version_string(22809) == "2.28.9" && nccl_version_string(2804) == "2.8.4", "nccl_version_string");

  const std::string missing = "/nonexistent-pstar-test/libnccl.so.2";
  expect_unsupported("a missing file", [&] { load_nccl(missing.c_str()); }, {missing, "PSTAR_NCCL_LIBRARY"});
  expect_unsupported("a library without NCCL", [] { load_nccl("libm.so.6"); }, {"libm.so.6", "ncclGetVersion"});
  expect(mapped_nccl().empty(), "still no libnccl mapped after the failed loads");

  // Loaded once, whichever thread comes first.
  const NcclApi* seen[4] = {};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([i, &seen] { seen[i] = &nccl_api(); });
  for (std::thread& t : threads) t.join();
  const NcclApi& api = nccl_api();
  for (const NcclApi* p : seen) expect(p == &api, "every thread got the same table");
  check_loaded(api, "nccl_api");
  const std::set<std::string> mapped = mapped_nccl();
  expect(mapped.size() == 1 && *mapped.begin() == real(api.path),
         "the process maps exactly the reported file (" + std::to_string(mapped.size()) + " mapped)");

  // Loaded now: a second load finds it in the process.
  const NcclApi again = load_nccl(nullptr);
  expect(again.source == "already loaded", "a second load finds NCCL already loaded (" + again.source + ")");
  expect(real(again.path) == real(api.path), "the same file the second time");

  // A communicator gets past the loading: it succeeds on a GPU, and fails
  // in CUDA (PSTAR_ERR_COMM), not for want of NCCL, without one.
  try {
    NcclConfig config;
    config.timeout = std::chrono::seconds(30);
    auto comm = make_nccl_communicator(config, nullptr);
    expect(std::strcmp(comm->backend(), "nccl") == 0, "a one-rank communicator on the GPU");
    std::printf("make_nccl_communicator: a one-rank communicator (a GPU is here)\n");
  } catch (const Error& e) {
    std::printf("make_nccl_communicator: %s\n", e.what());
    expect(e.status() == PSTAR_ERR_COMM, "without a GPU the communicator fails with PSTAR_ERR_COMM, not " +
                                             std::to_string(e.status()));
  }
}

void run_env_bad(const std::string& path) {
  const char* env = std::getenv("PSTAR_NCCL_LIBRARY");
  expect(env != nullptr && path == env, "PSTAR_NCCL_LIBRARY is set to " + path);
  const std::string first = expect_unsupported("nccl_api with a bad PSTAR_NCCL_LIBRARY", [] { nccl_api(); },
                                               {path, "PSTAR_NCCL_LIBRARY"});
  const std::string second = expect_unsupported("nccl_api again", [] { nccl_api(); }, {path});
  expect(first == second, "the same error the second time");
  expect_unsupported("make_nccl_communicator with a bad PSTAR_NCCL_LIBRARY",
                     [] { make_nccl_communicator(NcclConfig{}, nullptr); }, {path});
  expect(mapped_nccl().empty(), "no libnccl mapped");
}

void run_env_good(const std::string& path) {
  const char* env = std::getenv("PSTAR_NCCL_LIBRARY");
  expect(env != nullptr && path == env, "PSTAR_NCCL_LIBRARY is set to " + path);
  const NcclApi& api = nccl_api();
  check_loaded(api, "nccl_api with PSTAR_NCCL_LIBRARY");
  expect(api.source == "PSTAR_NCCL_LIBRARY", "the source is PSTAR_NCCL_LIBRARY (" + api.source + ")");
  expect(real(api.path) == real(path), "the file loaded is PSTAR_NCCL_LIBRARY's");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 1) {
      run_default();
    } else if (argc == 3 && std::strcmp(argv[1], "--env-bad") == 0) {
      run_env_bad(argv[2]);
    } else if (argc == 3 && std::strcmp(argv[1], "--env-good") == 0) {
      run_env_good(argv[2]);
    } else {
      std::printf("usage: %s [--env-bad PATH | --env-good PATH]\n", argv[0]);
      return 2;
    }
  } catch (const std::exception& e) {
    std::printf("FAIL: unexpected exception: %s\n", e.what());
    ++failures;
  }
  std::printf("nccl_loader_check: %d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}
