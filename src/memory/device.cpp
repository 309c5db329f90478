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

void Device::grad_pack(Stream*, void*, const void*, pstar_dtype, pstar_mem_space, size_t, double*, int*) {
  internal_error("grad_pack on a device that does not pack gradients");
}

void Device::grad_unpack(Stream*, float*, pstar_dtype, size_t) {
  internal_error("grad_unpack on a device that does not pack gradients");
}

}  // namespace pstar::memory
