#include "distributed/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>  // types and enums only: the functions come from nccl_api() (nccl_loader.h)

#include <cstring>
#include <exception>
#include <string>
#include <thread>

#include "distributed/comm/nccl_loader.h"
#include "util/error.h"
#include "util/log.h"

namespace pstar::distributed {
namespace {

using Clock = std::chrono::steady_clock;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclConfig& config, const NcclIdExchange& exchange) : config_(config) {
    require(config.size >= 1 && config.rank >= 0 && config.rank < config.size, PSTAR_ERR_INVALID_ARGUMENT, [&] {
      return "nccl: rank " + std::to_string(config.rank) + " is not in a group of " + std::to_string(config.size);
    });
    require(config.size == 1 || static_cast<bool>(exchange), PSTAR_ERR_INVALID_ARGUMENT,
            "nccl: several ranks need a function to exchange the NCCL id");
    // NCCL itself, loaded now if this is the process's first CUDA group;
    // PSTAR_ERR_UNSUPPORTED when there is none to load.
    nccl_ = &nccl_api();
    try {
      init(exchange);
    } catch (...) {
      release();
      throw;
    }
    log::debug("nccl: rank " + std::to_string(config.rank) + " of " + std::to_string(config.size) + " initialized");
  }

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      set_device();
      nccl_->CommDestroy(comm_);  // finalizes a healthy communicator first
      comm_ = nullptr;
    }
    release();
  }

  int rank() const override { return config_.rank; }
  int size() const override { return config_.size; }
  const char* backend() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  bool failed() const override { return failed_; }

  void all_gather(const void* shard, void* out, size_t shard_bytes) override {
    const char* op = "all_gather";
    check_usable(op);
    if (shard_bytes == 0) return;
    set_device();
    enqueue(op, nccl_->AllGather(shard, out, shard_bytes, ncclUint8, comm_, stream_));
    wait(op);
  }

  void reduce_scatter_sum(float* data, float* out, size_t block_elems) override {
    const char* op = "reduce_scatter";
    check_usable(op);
    if (block_elems == 0) return;
    set_device();
    enqueue(op, nccl_->ReduceScatter(data, out, block_elems, ncclFloat, ncclSum, comm_, stream_));
    wait(op);
  }

  void all_reduce_sum(double* values, size_t n) override {
    all_reduce_host("all_reduce_sum", values, n, ncclDouble, ncclSum);
  }

  void all_reduce_max(int64_t* values, size_t n) override {
    all_reduce_host("all_reduce_max", values, n, ncclInt64, ncclMax);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    const char* op = "broadcast";
    check_usable(op);
    require(root >= 0 && root < config_.size, PSTAR_ERR_INVALID_ARGUMENT, "nccl: broadcast root out of range");
    if (bytes == 0) return;
    set_device();
    enqueue(op, nccl_->Broadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
    wait(op);
  }

  void barrier() override {
    int64_t one = 1;
    all_reduce_host("barrier", &one, 1, ncclInt64, ncclMax);
  }

 private:
  void init(const NcclIdExchange& exchange) {
    const char* op = "init";
    if (config_.device >= 0) cuda_check(op, cudaSetDevice(config_.device));
    cuda_check(op, cudaGetDevice(&device_));
    cuda_check(op, cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (config_.rank == 0) nccl_check(op, nccl_->GetUniqueId(&id));
    if (config_.size > 1) {
      std::vector<char> bytes;
      if (config_.rank == 0)
        bytes.assign(reinterpret_cast<const char*>(&id), reinterpret_cast<const char*>(&id) + sizeof(id));
      try {
        exchange(bytes);
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        fail(op, std::string("exchanging the NCCL id: ") + e.what());
      }
      require(bytes.size() == sizeof(id), PSTAR_ERR_COMM, [&] {
        return "nccl: init on rank " + std::to_string(config_.rank) + ": the exchanged id has " +
               std::to_string(bytes.size()) + " bytes, not " + std::to_string(sizeof(id));
      });
      std::memcpy(&id, bytes.data(), sizeof(id));
    }

#if PSTAR_NCCL_NONBLOCKING
    ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
    nccl_config.blocking = 0;
    ncclResult_t r = nccl_->CommInitRankConfig(&comm_, config_.size, id, config_.rank, &nccl_config);
#else
    ncclResult_t r = nccl_->CommInitRank(&comm_, config_.size, id, config_.rank);
#endif
    if (r != ncclSuccess && r != ncclInProgress) {
      // comm_ may be set (non-blocking): abort it in fail().
      fail(op, std::string(nccl_->GetErrorString(r)) + last_error());
    }
    enqueue(op, r);  // waits out ncclInProgress against the timeout
  }

  void release() noexcept {
    if (stream_ != nullptr) {
      cudaStreamDestroy(stream_);
      stream_ = nullptr;
    }
    if (device_buf_ != nullptr) {
      cudaFree(device_buf_);
      device_buf_ = nullptr;
    }
    if (host_buf_ != nullptr) {
      cudaFreeHost(host_buf_);
      host_buf_ = nullptr;
    }
    staging_bytes_ = 0;
  }

  void set_device() {
    if (device_ >= 0) cudaSetDevice(device_);
  }

  // Host values through pinned and device staging buffers; the copies are
  // on the communicator's stream, so the watchdog covers them too.
  template <class T>
  void all_reduce_host(const char* op, T* values, size_t n, ncclDataType_t type, ncclRedOp_t red) {
    check_usable(op);
    if (n == 0) return;
    set_device();
    const size_t bytes = n * sizeof(T);
    ensure_staging(op, bytes);
    std::memcpy(host_buf_, values, bytes);
    cuda_check(op, cudaMemcpyAsync(device_buf_, host_buf_, bytes, cudaMemcpyHostToDevice, stream_));
    enqueue(op, nccl_->AllReduce(device_buf_, device_buf_, n, type, red, comm_, stream_));
    cuda_check(op, cudaMemcpyAsync(host_buf_, device_buf_, bytes, cudaMemcpyDeviceToHost, stream_));
    wait(op);
    std::memcpy(values, host_buf_, bytes);
  }

  void ensure_staging(const char* op, size_t bytes) {
    if (bytes <= staging_bytes_) return;
    size_t cap = staging_bytes_ == 0 ? 256 : staging_bytes_;
    while (cap < bytes) cap *= 2;
    if (device_buf_ != nullptr) cudaFree(device_buf_);
    if (host_buf_ != nullptr) cudaFreeHost(host_buf_);
    device_buf_ = nullptr;
    host_buf_ = nullptr;
    staging_bytes_ = 0;
    cuda_check(op, cudaMalloc(&device_buf_, cap));
    cuda_check(op, cudaMallocHost(&host_buf_, cap));
    staging_bytes_ = cap;
  }

  void check_usable(const char* op) const {
    require(!failed_, PSTAR_ERR_COMM, [&] {
      return std::string("nccl: ") + op + " on rank " + std::to_string(config_.rank) +
             ": an earlier collective failed (" + failure_ + "); the group must be rebuilt";
    });
  }

  std::string last_error() const {
    if (comm_ == nullptr) return "";
    const char* s = nccl_->GetLastError(comm_);
    return (s != nullptr && *s != '\0') ? std::string(" (") + s + ")" : std::string();
  }

  void cuda_check(const char* op, cudaError_t e) {
    if (e != cudaSuccess) fail(op, std::string("CUDA: ") + cudaGetErrorString(e));
  }

  void nccl_check(const char* op, ncclResult_t r) {
    if (r != ncclSuccess) fail(op, std::string(nccl_->GetErrorString(r)) + last_error());
  }

  // The result of an NCCL call: in non-blocking mode ncclInProgress means
  // the call is still being issued; wait for the communicator to leave that
  // state, against the timeout.
  void enqueue(const char* op, ncclResult_t r) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) fail(op, std::string(nccl_->GetErrorString(r)) + last_error());
    const auto deadline = Clock::now() + config_.timeout;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t q = nccl_->CommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) fail(op, std::string(nccl_->GetErrorString(q)) + last_error());
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(op, std::string(nccl_->GetErrorString(state)) + last_error());
      if (Clock::now() > deadline) fail(op, "timed out after " + std::to_string(config_.timeout.count()) + " ms");
      std::this_thread::yield();
    }
  }

  // The watchdog: the stream done, or an asynchronous NCCL error, a CUDA
  // error or the timeout, whichever comes first.
  void wait(const char* op) {
    const auto start = Clock::now();
    const auto deadline = start + config_.timeout;
    for (unsigned spins = 0;; ++spins) {
      const cudaError_t s = cudaStreamQuery(stream_);
      if (s == cudaSuccess) return;
      if (s != cudaErrorNotReady) fail(op, std::string("CUDA: ") + cudaGetErrorString(s));
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = nccl_->CommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) fail(op, std::string(nccl_->GetErrorString(q)) + last_error());
      if (state != ncclSuccess && state != ncclInProgress)
        fail(op, std::string(nccl_->GetErrorString(state)) + last_error());
      if (Clock::now() > deadline) fail(op, "timed out after " + std::to_string(config_.timeout.count()) + " ms");
      // Spin briefly (small collectives finish in microseconds), then sleep.
      if (spins < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  [[noreturn]] void fail(const char* op, const std::string& why) {
    const std::string message = std::string("nccl: ") + op + " failed on rank " + std::to_string(config_.rank) +
                                " of " + std::to_string(config_.size) + ": " + why;
    if (comm_ != nullptr) {
      nccl_->CommAbort(comm_);
      comm_ = nullptr;
    }
    failed_ = true;
    failure_ = std::string(op) + ": " + why;
    log::debug(message);
    throw Error(PSTAR_ERR_COMM, message);
  }

  NcclConfig config_;
  const NcclApi* nccl_ = nullptr;  // set before anything else is created
  int device_ = -1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* device_buf_ = nullptr;  // staging of all_reduce_* and barrier
  void* host_buf_ = nullptr;    // pinned
  size_t staging_bytes_ = 0;
  bool failed_ = false;
  std::string failure_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const NcclConfig& config, NcclIdExchange exchange) {
  return std::make_unique<NcclCommunicator>(config, exchange);
}

}  // namespace pstar::distributed
