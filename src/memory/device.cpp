#include "memory/device.h"

#include <limits>

#include "util/error.h"

namespace pstar::memory {

double Device::clock_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count();
}

void Device::advance_clock(double) {
  throw Error(PSTAR_ERR_UNSUPPORTED, "clock_advance: the engine runs on the wall clock (set options.virtual_clock)");
}

EventPtr Device::model_host_work(double, const std::vector<EventPtr>&) {
  throw Error(PSTAR_ERR_UNSUPPORTED, "modelled host work: the engine runs on the wall clock");
}

double Device::completion_time(const EventPtr&) const { return std::numeric_limits<double>::quiet_NaN(); }

void Device::check_caller_buffer(const void*, size_t, pstar_mem_space, const char*) const {}

}  // namespace pstar::memory
