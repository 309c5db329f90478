#include "util/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace pstar::log {
namespace {

pstar_log_level level_from_env() {
  const char* v = std::getenv("PSTAR_LOG_LEVEL");
  if (v == nullptr) return PSTAR_LOG_WARN;
  if (std::strcmp(v, "debug") == 0) return PSTAR_LOG_DEBUG;
  if (std::strcmp(v, "info") == 0) return PSTAR_LOG_INFO;
  if (std::strcmp(v, "warn") == 0) return PSTAR_LOG_WARN;
  if (std::strcmp(v, "error") == 0) return PSTAR_LOG_ERROR;
  if (std::strcmp(v, "off") == 0) return PSTAR_LOG_OFF;
  return PSTAR_LOG_WARN;
}

struct Sink {
  std::mutex mu;
  pstar_log_fn fn = nullptr;
  void* user = nullptr;
  std::atomic<int> min_level{level_from_env()};
};

Sink& sink() {
  static Sink s;
  return s;
}

const char* level_name(pstar_log_level level) {
  switch (level) {
    case PSTAR_LOG_DEBUG: return "debug";
    case PSTAR_LOG_INFO: return "info";
    case PSTAR_LOG_WARN: return "warn";
    case PSTAR_LOG_ERROR: return "error";
    default: return "log";
  }
}

}  // namespace

void set_callback(pstar_log_fn fn, void* user, pstar_log_level min_level) {
  Sink& s = sink();
  std::lock_guard<std::mutex> lock(s.mu);
  s.fn = fn;
  s.user = user;
  s.min_level.store(min_level);
}

bool enabled(pstar_log_level level) {
  return level != PSTAR_LOG_OFF && static_cast<int>(level) >= sink().min_level.load();
}

// Set while this thread runs the callback: a record emitted meanwhile (a
// library call the callback makes fails and logs it) is dropped, so that a
// callback that calls the library cannot recurse (pstar.h, pstar_log_fn).
thread_local bool t_in_callback = false;

void write(pstar_log_level level, const std::string& message) {
  if (t_in_callback) return;
  Sink& s = sink();
  pstar_log_fn fn;
  void* user;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    fn = s.fn;
    user = s.user;
  }
  if (fn != nullptr) {
    struct InCallback {
      InCallback() { t_in_callback = true; }
      ~InCallback() { t_in_callback = false; }
    } in_callback;
    fn(level, message.c_str(), user);
  } else {
    std::fprintf(stderr, "libpstar %s: %s\n", level_name(level), message.c_str());
  }
}

}  // namespace pstar::log
