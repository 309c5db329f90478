// The library's small logger: records go to a user callback (process-wide),
// stderr by default, filtered by a level taken from PSTAR_LOG_LEVEL.  It may
// be called from any thread; the callback is invoked without holding a lock
// other than the one that protects the callback pointer itself.
#pragma once

#include <string>

#include "pstar/pstar.h"

namespace pstar::log {

void set_callback(pstar_log_fn fn, void* user, pstar_log_level min_level);
bool enabled(pstar_log_level level);
void write(pstar_log_level level, const std::string& message);

inline void debug(const std::string& m) {
  if (enabled(PSTAR_LOG_DEBUG)) write(PSTAR_LOG_DEBUG, m);
}
inline void info(const std::string& m) {
  if (enabled(PSTAR_LOG_INFO)) write(PSTAR_LOG_INFO, m);
}
inline void warn(const std::string& m) {
  if (enabled(PSTAR_LOG_WARN)) write(PSTAR_LOG_WARN, m);
}
inline void error(const std::string& m) {
  if (enabled(PSTAR_LOG_ERROR)) write(PSTAR_LOG_ERROR, m);
}

}  // namespace pstar::log
