#include "distributed/comm/nccl_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "util/error.h"
#include "util/log.h"

namespace pstar::distributed {
namespace {

constexpr const char* kSoname = "libnccl.so.2";

std::string last_dlerror() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("unknown error");
}

std::string join(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts) {
    if (!s.empty()) s += "; ";
    s += p;
  }
  return s;
}

// The places to try after the process and the loader's search: the NCCL CMake
// found at configure time (PSTAR_NCCL_CONFIGURED_LIBRARY), its directory's
// libnccl.so.2 first (the unversioned name may be a development symlink
// that is absent where only the runtime is installed).
std::vector<std::string> configured_candidates() {
  std::vector<std::string> out;
#ifdef PSTAR_NCCL_CONFIGURED_LIBRARY
  const std::string configured = PSTAR_NCCL_CONFIGURED_LIBRARY;
  const size_t slash = configured.rfind('/');
  if (slash != std::string::npos) out.push_back(configured.substr(0, slash + 1) + kSoname);
  if (out.empty() || out.front() != configured) out.push_back(configured);
#endif
  return out;
}

template <class Fn>
void resolve(void* handle, const char* name, Fn& fn, const std::string& where) {
  dlerror();
  void* sym = dlsym(handle, name);
  require(sym != nullptr, PSTAR_ERR_UNSUPPORTED, [&] {
    return std::string("nccl: ") + where + " lacks " + name + " (" + last_dlerror() + "); libpstar needs NCCL " +
           nccl_version_string(kNcclMinVersion) + " or newer (set PSTAR_NCCL_LIBRARY to another libnccl.so.2)";
  });
  fn = reinterpret_cast<Fn>(sym);
}

NcclApi resolve_all(void* handle, const std::string& where, const char* source) {
  NcclApi api;
  resolve(handle, "ncclGetVersion", api.GetVersion, where);
  resolve(handle, "ncclGetUniqueId", api.GetUniqueId, where);
  resolve(handle, "ncclCommInitRank", api.CommInitRank, where);
#if PSTAR_NCCL_NONBLOCKING
  resolve(handle, "ncclCommInitRankConfig", api.CommInitRankConfig, where);
#endif
  resolve(handle, "ncclCommDestroy", api.CommDestroy, where);
  resolve(handle, "ncclCommAbort", api.CommAbort, where);
  resolve(handle, "ncclCommGetAsyncError", api.CommGetAsyncError, where);
  resolve(handle, "ncclGetErrorString", api.GetErrorString, where);
  resolve(handle, "ncclGetLastError", api.GetLastError, where);
  resolve(handle, "ncclAllGather", api.AllGather, where);
  resolve(handle, "ncclReduceScatter", api.ReduceScatter, where);
  resolve(handle, "ncclAllReduce", api.AllReduce, where);
  resolve(handle, "ncclBroadcast", api.Broadcast, where);

  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(api.GetVersion), &info) != 0 && info.dli_fname != nullptr) {
    api.path = info.dli_fname;
  } else {
    api.path = where;
  }
  api.source = source;

  const ncclResult_t r = api.GetVersion(&api.version);
  require(r == ncclSuccess, PSTAR_ERR_UNSUPPORTED, [&] {
    return "nccl: ncclGetVersion of " + api.path + " failed (" + std::string(api.GetErrorString(r)) + ")";
  });
  require(api.version >= kNcclMinVersion, PSTAR_ERR_UNSUPPORTED, [&] {
    return "nccl: " + api.path + " (" + source + ") is NCCL " + nccl_version_string(api.version) + "; libpstar needs " +
           nccl_version_string(kNcclMinVersion) +
           " or newer (ncclCommInitRankConfig, ncclGetLastError); set PSTAR_NCCL_LIBRARY to a newer libnccl.so.2";
  });
  return api;
}

struct Loaded {
  std::once_flag once;
  NcclApi api;
  bool ok = false;
  std::string error;
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

}  // namespace

std::string nccl_version_string(int code) {
  int major, minor, patch;
  if (code >= 10000) {  // NCCL_VERSION since 2.9: X*10000 + Y*100 + Z
    major = code / 10000;
    minor = (code % 10000) / 100;
  } else {  // before: X*1000 + Y*100 + Z
    major = code / 1000;
    minor = (code % 1000) / 100;
  }
  patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

NcclApi load_nccl(const char* override_path) {
  // 1. The user's choice, and nothing else.
  if (override_path != nullptr && *override_path != '\0') {
    dlerror();
    void* h = dlopen(override_path, RTLD_NOW | RTLD_LOCAL);
    require(h != nullptr, PSTAR_ERR_UNSUPPORTED, [&] {
      return std::string("nccl: PSTAR_NCCL_LIBRARY=") + override_path + " could not be loaded: " + last_dlerror();
    });
    return resolve_all(h, override_path, "PSTAR_NCCL_LIBRARY");
  }

  std::vector<std::string> tried;
  // 2. The NCCL the process already has (PyTorch's, ...).
  dlerror();
  if (void* h = dlopen(kSoname, RTLD_NOW | RTLD_NOLOAD)) return resolve_all(h, kSoname, "already loaded");
  tried.push_back(std::string(kSoname) + " already in the process: no");

  // 3. The dynamic loader's search, kept local to libpstar.
  dlerror();
  if (void* h = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL)) return resolve_all(h, kSoname, "the loader's search");
  tried.push_back(last_dlerror());

  // 4. The NCCL found when libpstar was configured.
  for (const std::string& path : configured_candidates()) {
    dlerror();
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return resolve_all(h, path, "found at build time");
    tried.push_back(last_dlerror());
  }

  throw Error(PSTAR_ERR_UNSUPPORTED,
              "nccl: no NCCL could be loaded for the CUDA group (" + join(tried) + "); install NCCL " +
                  nccl_version_string(kNcclMinVersion) +
                  " or newer (the CUDA toolkit's, or PyTorch's nvidia-nccl wheel) where the dynamic loader finds "
                  "libnccl.so.2, or set PSTAR_NCCL_LIBRARY to its path");
}

const NcclApi& nccl_api() {
  Loaded& l = loaded();
  std::call_once(l.once, [&l] {
    try {
      l.api = load_nccl(std::getenv("PSTAR_NCCL_LIBRARY"));
      l.ok = true;
      log::info("nccl: using " + l.api.path + " (NCCL " + nccl_version_string(l.api.version) + ", " + l.api.source +
                ")");
    } catch (const Error& e) {
      l.error = e.what();
      log::debug(l.error);
    }
  });
  if (!l.ok) throw Error(PSTAR_ERR_UNSUPPORTED, l.error);
  return l.api;
}

}  // namespace pstar::distributed
