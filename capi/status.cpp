// Versions, status names and strings, the per-thread last error, logging.
#include <cstdlib>
#include <string>

#include "errors.h"
#include "util/log.h"

namespace {
thread_local std::string t_last_error;
}

namespace pstar::capi {

pstar_status fail(pstar_status status, const std::string& message) {
  try {
    t_last_error = message;
  } catch (...) {
    // Keep the status even if the message cannot be stored.
  }
  if (pstar::log::enabled(PSTAR_LOG_DEBUG)) {
    pstar::log::write(PSTAR_LOG_DEBUG, std::string(pstar_status_name(status)) + ": " + message);
  }
  return status;
}

}  // namespace pstar::capi

extern "C" {

uint32_t pstar_version(void) { return PSTAR_VERSION_HEX; }

const char* pstar_version_string(void) { return PSTAR_VERSION_STRING; }

const char* pstar_status_name(pstar_status status) {
  switch (status) {
    case PSTAR_OK: return "PSTAR_OK";
    case PSTAR_ERR_INVALID_ARGUMENT: return "PSTAR_ERR_INVALID_ARGUMENT";
    case PSTAR_ERR_INVALID_HANDLE: return "PSTAR_ERR_INVALID_HANDLE";
    case PSTAR_ERR_INVALID_STATE: return "PSTAR_ERR_INVALID_STATE";
    case PSTAR_ERR_NOT_FOUND: return "PSTAR_ERR_NOT_FOUND";
    case PSTAR_ERR_OUT_OF_MEMORY: return "PSTAR_ERR_OUT_OF_MEMORY";
    case PSTAR_ERR_BUSY: return "PSTAR_ERR_BUSY";
    case PSTAR_ERR_UNSUPPORTED: return "PSTAR_ERR_UNSUPPORTED";
    case PSTAR_ERR_DEVICE: return "PSTAR_ERR_DEVICE";
    case PSTAR_ERR_IO: return "PSTAR_ERR_IO";
    case PSTAR_ERR_COMM: return "PSTAR_ERR_COMM";
    case PSTAR_ERR_VERSION: return "PSTAR_ERR_VERSION";
    case PSTAR_ERR_INTERNAL: return "PSTAR_ERR_INTERNAL";
    case PSTAR_STATUS_FORCE_32BIT_: break;
  }
  return "PSTAR_ERR_UNKNOWN";
}

const char* pstar_status_string(pstar_status status) {
  switch (status) {
    case PSTAR_OK: return "success";
    case PSTAR_ERR_INVALID_ARGUMENT: return "invalid argument";
    case PSTAR_ERR_INVALID_HANDLE: return "invalid, destroyed or NULL engine handle";
    case PSTAR_ERR_INVALID_STATE: return "call not legal in the current state";
    case PSTAR_ERR_NOT_FOUND: return "no such parameter or key";
    case PSTAR_ERR_OUT_OF_MEMORY: return "what must be resident does not fit in a tier's capacity";
    case PSTAR_ERR_BUSY:
      return "busy: a chunk is pinned by an outstanding export, or another call on the engine is in progress";
    case PSTAR_ERR_UNSUPPORTED: return "not supported by this build or machine";
    case PSTAR_ERR_DEVICE: return "accelerator runtime error";
    case PSTAR_ERR_IO: return "file or disk error";
    case PSTAR_ERR_COMM: return "communication error";
    case PSTAR_ERR_VERSION: return "struct size or version not supported by this library";
    case PSTAR_ERR_INTERNAL: return "internal error (a bug in libpstar)";
    case PSTAR_STATUS_FORCE_32BIT_: break;
  }
  return "unknown status";
}

const char* pstar_last_error_message(void) { return t_last_error.c_str(); }

pstar_status pstar_log_set_callback(pstar_log_fn fn, void* user, pstar_log_level min_level) {
  return pstar::capi::guarded([&] {
    pstar::require(min_level >= PSTAR_LOG_DEBUG && min_level <= PSTAR_LOG_OFF, PSTAR_ERR_INVALID_ARGUMENT,
                   "log_set_callback: unknown level");
    pstar::log::set_callback(fn, user, min_level);
  });
}

void pstar_free(void* ptr) { std::free(ptr); }

}  // extern "C"
