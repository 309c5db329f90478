// NCCL at run time: the functions the NCCL communicator calls, resolved with
// dlopen/dlsym the first time a CUDA group forms, instead of libpstar.so
// linking libnccl.so.2.
//
// Why.  A process may already hold an NCCL, or load one later: PyTorch's
// wheels bring their own libnccl.so.2 (nvidia-nccl), newer than the
// toolkit's and under the same soname.  When libpstar.so named libnccl.so.2
// in its DT_NEEDED, whichever library was loaded first served everybody, and
// `import pstar` before `import torch` left PyTorch with the toolkit's NCCL
// (`libtorch_cuda.so: undefined symbol: ncclCommResume`).  Now libpstar.so
// loads no NCCL until it needs one, and then prefers the one the process
// already has.
//
// Where NCCL comes from, in this order (the first that loads wins):
//   1. PSTAR_NCCL_LIBRARY=<path> in the environment: that file and nothing
//      else (a failure to load it is an error, not a reason to look on).
//   2. A libnccl.so.2 already loaded into the process (dlopen RTLD_NOLOAD),
//      e.g. PyTorch's.
//   3. libnccl.so.2 through the dynamic loader's search (LD_LIBRARY_PATH,
//      the ld.so cache), loaded RTLD_LOCAL so that its symbols serve only us.
//   4. The NCCL CMake found when libpstar was configured (its directory's
//      libnccl.so.2, then the file itself), as a last resort.
// The library is never unloaded.  Its version (ncclGetVersion) must be at
// least kNcclMinVersion, the oldest with every function the communicator
// calls.
//
// Errors: no NCCL anywhere, a missing function or a too-old version throw
// Error(PSTAR_ERR_UNSUPPORTED) with a message naming what was tried and why
// it failed (dlerror()).  Loading happens once per process (thread-safe);
// the outcome, success or error, is kept and reported to every later call.
#pragma once

#include <nccl.h>

#include <string>

namespace pstar::distributed {

// The oldest NCCL the communicator runs on: 2.14 brought
// ncclCommInitRankConfig (non-blocking communicators) and ncclInProgress;
// 2.13 ncclGetLastError.
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define PSTAR_NCCL_NONBLOCKING 1
inline constexpr int kNcclMinVersion = NCCL_VERSION(2, 14, 0);
#else
#define PSTAR_NCCL_NONBLOCKING 0
inline constexpr int kNcclMinVersion = NCCL_VERSION(2, 13, 0);
#endif

struct NcclApi {
  ncclResult_t (*GetVersion)(int* version) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId* id) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) = nullptr;
#if PSTAR_NCCL_NONBLOCKING
  ncclResult_t (*CommInitRankConfig)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t* config) = nullptr;
#endif
  ncclResult_t (*CommDestroy)(ncclComm_t comm) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t comm) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t* async_error) = nullptr;
  const char* (*GetErrorString)(ncclResult_t result) = nullptr;
  const char* (*GetLastError)(ncclComm_t comm) = nullptr;
  ncclResult_t (*AllGather)(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                            ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*ReduceScatter)(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*AllReduce)(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                            ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*Broadcast)(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                            ncclComm_t comm, cudaStream_t stream) = nullptr;

  int version = 0;     // ncclGetVersion's code, e.g. 22809 for 2.28.9
  std::string path;    // the file the functions come from (dladdr)
  std::string source;  // how it was found: "PSTAR_NCCL_LIBRARY", "already loaded", ...
};

// The process's NCCL, loaded on the first call (thread-safe, once); throws
// Error(PSTAR_ERR_UNSUPPORTED) when none can be loaded, on this call and
// every later one.  Reads PSTAR_NCCL_LIBRARY on that first call.
const NcclApi& nccl_api();

// Does the loading nccl_api() does once, now, without keeping the result:
// `override_path` plays PSTAR_NCCL_LIBRARY's part (nullptr or "": none).
// For tests; the library itself calls nccl_api().
NcclApi load_nccl(const char* override_path);

// "2.28.9" for 22809 (and 2.8.4 for the old encoding, 2804).
std::string nccl_version_string(int code);

}  // namespace pstar::distributed
