#include "memory/modelled_device.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "memory/host_kernels.h"
#include "util/error.h"

namespace pstar::memory {

class ModelledDevice::ModelledStream final : public Stream {
 public:
  double busy_until = 0.0;  // completion time of the last item queued
};

namespace {

class ModelledEvent final : public Event {
 public:
  explicit ModelledEvent(double t) : at(t) {}
  const double at;  // completion time on the virtual clock
};

double event_time(const EventPtr& e) { return e ? static_cast<const ModelledEvent*>(e.get())->at : 0.0; }

size_t round_up(size_t bytes) {
  const size_t r = (bytes + kModelledAlignBytes - 1) / kModelledAlignBytes * kModelledAlignBytes;
  return r == 0 ? kModelledAlignBytes : r;
}

void* payload_allocate(size_t bytes) {
  void* p = std::aligned_alloc(kModelledAlignBytes, round_up(bytes));
  if (p == nullptr)
    throw Error(PSTAR_ERR_OUT_OF_MEMORY, "emulated device: allocation of " + std::to_string(bytes) + " bytes failed");
  return p;
}

}  // namespace

ModelledDevice::ModelledDevice(bool payloads, double h2d_bytes_per_s, double d2h_bytes_per_s)
    : payloads_(payloads),
      adam_isa_(optim::adam_default_isa()),
      h2d_bytes_per_s_(h2d_bytes_per_s),
      d2h_bytes_per_s_(d2h_bytes_per_s),
      compute_(std::make_unique<ModelledStream>()),
      h2d_(std::make_unique<ModelledStream>()),
      d2h_(std::make_unique<ModelledStream>()) {
  if (!(h2d_bytes_per_s > 0.0) || !(d2h_bytes_per_s > 0.0)) internal_error("modelled bandwidths must be > 0");
}

ModelledDevice::~ModelledDevice() = default;

std::string ModelledDevice::name() const {
  return payloads_ ? "emulated device (virtual clock)" : "emulated device (virtual clock, dry run)";
}

void* ModelledDevice::dry_allocate(size_t bytes) {
  const size_t size = round_up(bytes);
  auto it = dry_free_.find(size);
  if (it != dry_free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }
  if (size > kDryRunAddressSpaceBytes - dry_used_) {
    throw Error(PSTAR_ERR_OUT_OF_MEMORY, "dry run: address range exhausted");
  }
  void* p = reinterpret_cast<void*>(kDryRunBaseAddress + dry_used_);
  dry_used_ += size;
  return p;
}

void ModelledDevice::dry_deallocate(void* ptr, size_t bytes) {
  if (ptr != nullptr) dry_free_[round_up(bytes)].push_back(ptr);
}

void* ModelledDevice::allocate(size_t bytes) { return payloads_ ? payload_allocate(bytes) : dry_allocate(bytes); }

void ModelledDevice::deallocate(void* ptr, size_t bytes) {
  if (payloads_) {
    std::free(ptr);
  } else {
    dry_deallocate(ptr, bytes);
  }
}

void* ModelledDevice::allocate_host(size_t bytes) { return allocate(bytes); }
void ModelledDevice::deallocate_host(void* ptr, size_t bytes) { deallocate(ptr, bytes); }

Stream* ModelledDevice::compute_stream() { return compute_.get(); }
Stream* ModelledDevice::h2d_stream() { return h2d_.get(); }
Stream* ModelledDevice::d2h_stream() { return d2h_.get(); }

Stream* ModelledDevice::caller_stream(void* handle) {
  if (handle == nullptr || handle == compute_.get()) return compute_.get();
  throw Error(PSTAR_ERR_INVALID_ARGUMENT,
              "stream handle is not this engine's compute stream (use NULL or pstar_engine_compute_stream)");
}

void* ModelledDevice::compute_stream_handle() { return compute_.get(); }

ModelledDevice::ModelledStream* ModelledDevice::stream_of(Stream* stream) {
  auto* s = dynamic_cast<ModelledStream*>(stream);
  if (s == nullptr) internal_error("stream of another device");
  return s;
}

double ModelledDevice::start_on(ModelledStream* s) const { return std::max(now_, s->busy_until); }

void ModelledDevice::copy_async(Stream* stream, void* dst, const void* src, size_t bytes, CopyKind kind) {
  ModelledStream* s = stream_of(stream);
  double seconds = 0.0;  // device-to-device copies: not modelled (none are issued)
  if (kind == CopyKind::kHostToDevice) seconds = static_cast<double>(bytes) / h2d_bytes_per_s_;
  if (kind == CopyKind::kDeviceToHost) seconds = static_cast<double>(bytes) / d2h_bytes_per_s_;
  s->busy_until = start_on(s) + seconds;
  if (payloads_ && bytes != 0) std::memcpy(dst, src, bytes);  // zero bytes may come with NULL pointers
}

void ModelledDevice::memset_async(Stream* stream, void* dst, int value, size_t bytes) {
  ModelledStream* s = stream_of(stream);
  s->busy_until = start_on(s);
  if (payloads_ && bytes != 0) std::memset(dst, value, bytes);
}

EventPtr ModelledDevice::record(Stream* stream) { return std::make_shared<ModelledEvent>(start_on(stream_of(stream))); }

void ModelledDevice::stream_wait(Stream* stream, const EventPtr& event) {
  ModelledStream* s = stream_of(stream);
  s->busy_until = std::max(s->busy_until, event_time(event));
}

void ModelledDevice::synchronize(const EventPtr& event) { now_ = std::max(now_, event_time(event)); }

void ModelledDevice::synchronize(Stream* stream) { now_ = std::max(now_, stream_of(stream)->busy_until); }

bool ModelledDevice::query(const EventPtr& event) { return event_time(event) <= now_; }

void ModelledDevice::advance_clock(double seconds) {
  require(std::isfinite(seconds) && seconds >= 0.0, PSTAR_ERR_INVALID_ARGUMENT,
          "clock_advance: seconds must be finite and >= 0");
  require(std::isfinite(now_ + seconds), PSTAR_ERR_INVALID_ARGUMENT,
          "clock_advance: seconds would take the clock past the largest double");
  now_ += seconds;
}

double ModelledDevice::completion_time(const EventPtr& event) const { return event_time(event); }

EventPtr ModelledDevice::model_host_work(double seconds, const std::vector<EventPtr>& after) {
  require(std::isfinite(seconds) && seconds >= 0.0, PSTAR_ERR_INVALID_ARGUMENT,
          "modelled host work: seconds must be finite and >= 0");
  double start = std::max(now_, host_lane_until_);
  for (const EventPtr& e : after) start = std::max(start, event_time(e));
  host_lane_until_ = start + seconds;
  return std::make_shared<ModelledEvent>(host_lane_until_);
}

void ModelledDevice::grad_accumulate(Stream* stream, float* acc, const void* src, pstar_dtype src_dtype,
                                     pstar_mem_space, size_t n, bool onto_zero) {
  ModelledStream* s = stream_of(stream);
  s->busy_until = start_on(s);
  if (payloads_) host_grad_accumulate(acc, src, src_dtype, n, onto_zero);
}

void ModelledDevice::grad_finalize(Stream* stream, const float* acc, void* slot, pstar_dtype dtype, size_t n,
                                   double* sumsq, int* nonfinite) {
  ModelledStream* s = stream_of(stream);
  s->busy_until = start_on(s);
  if (payloads_) {
    host_grad_finalize(acc, slot, dtype, n, sumsq, nonfinite);
  } else {
    *sumsq = 0.0;
    *nonfinite = 0;
  }
}

void ModelledDevice::adam_update_async(Stream* stream, const optim::AdamStepConstants& c, const optim::AdamRange& r) {
  ModelledStream* s = stream_of(stream);
  s->busy_until = start_on(s);
  if (payloads_) optim::adam_update(adam_isa_, c, r);
}

void ModelledDevice::adam_update_states_async(Stream* stream, optim::StateFormat f, const optim::AdamStepConstants& c,
                                              const optim::AdamStateRange& r) {
  ModelledStream* s = stream_of(stream);
  s->busy_until = start_on(s);
  if (payloads_) optim::adam_update_states(adam_isa_, f, c, r);
}

}  // namespace pstar::memory
