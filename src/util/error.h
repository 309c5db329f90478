// Errors inside the core: an exception carrying a pstar_status code and a
// message.  Only the C API shims catch it (capi/), turning it into a status
// and the per-thread last error; nothing else crosses the ABI boundary.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>

#include "pstar/pstar.h"

namespace pstar {

class Error : public std::runtime_error {
 public:
  Error(pstar_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  pstar_status status() const noexcept { return status_; }

 private:
  pstar_status status_;
};

// Throws Error(status, message) unless `condition` holds.  The message is a
// literal, or a callable that builds it: hot paths must not build strings
// for checks that pass.
inline void require(bool condition, pstar_status status, const char* message) {
  if (!condition) throw Error(status, message);
}

template <class MessageFn, class = std::enable_if_t<std::is_invocable_r_v<std::string, MessageFn>>>
inline void require(bool condition, pstar_status status, MessageFn&& message) {
  if (!condition) throw Error(status, message());
}

[[noreturn]] inline void internal_error(const std::string& message) {
  throw Error(PSTAR_ERR_INTERNAL, "internal error: " + message);
}

}  // namespace pstar
