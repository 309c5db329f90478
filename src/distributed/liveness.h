// Liveness of a group's ranks through the rendezvous store, so that a failed
// collective can say which peer is gone or stuck.
//
// Why: a collective that fails names a peer only when its transport does
// (Gloo prints the address of the pair that broke, and only for some
// failures; a timeout names nobody; NCCL never does).  Every rank therefore
// publishes a heartbeat in the store, and a rank whose collective failed
// looks at them: a rank whose heartbeat stopped is gone (or its process is
// hung); a rank whose heartbeat goes on but which has not reached the
// failed collective is alive and stuck elsewhere; a store that does not
// answer means rank 0, which serves it, is gone.
//
// How: a thread per rank sets key "<prefix>/live/<rank>" to "<beat> <seq>"
// every kHeartbeatInterval, where beat counts up and seq is the number of
// collectives this rank has entered (note_collective).  diagnose() reads
// every rank's key twice, kDiagnoseWindow apart, with a client of its own,
// and describes what it saw.  The heartbeat costs one small store request
// per interval per rank; a collective costs one atomic store.
//
// MonitoredCommunicator forwards every call to the backend's communicator,
// counts collectives, and adds diagnose() to the message of a
// PSTAR_ERR_COMM failure.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "distributed/comm/communicator.h"
#include "distributed/store/store.h"

namespace pstar::distributed {

// How often a rank's heartbeat is published.
constexpr std::chrono::milliseconds kHeartbeatInterval{200};
// How long diagnose() watches the heartbeats: five intervals, so that a live
// rank on a loaded machine is not taken for a dead one.
constexpr std::chrono::milliseconds kDiagnoseWindow{1000};

class Liveness {
 public:
  // Starts the heartbeat of `rank` of `world` under `prefix`; `client`
  // says where the store is (its timeouts are replaced by short ones).
  Liveness(const StoreClientOptions& client, std::string prefix, int rank, int world);
  ~Liveness();  // stops the heartbeat
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // This rank entered collective number `seq` (1, 2, ...).
  void note_collective(uint64_t seq) { seq_.store(seq, std::memory_order_relaxed); }

  // What the heartbeats say about the other ranks (one sentence; takes
  // about kDiagnoseWindow).  Never throws.
  std::string diagnose();

 private:
  void beat_loop();
  StoreClientOptions options_;  // short timeouts
  std::string prefix_;
  int rank_;
  int world_;
  std::atomic<uint64_t> seq_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

class MonitoredCommunicator : public Communicator {
 public:
  MonitoredCommunicator(std::unique_ptr<Communicator> inner, std::unique_ptr<Liveness> liveness)
      : inner_(std::move(inner)), liveness_(std::move(liveness)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return inner_->backend(); }
  bool failed() const override { return inner_->failed(); }
  bool device_buffers() const override { return inner_->device_buffers(); }
  void all_gather(const void* shard, void* out, size_t shard_bytes) override;
  void reduce_scatter_sum(float* data, float* out, size_t block_elems) override;
  void all_reduce_sum(double* values, size_t n) override;
  void all_reduce_max(int64_t* values, size_t n) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;

 private:
  template <class F>
  void monitored(F&& f);
  std::unique_ptr<Communicator> inner_;
  std::unique_ptr<Liveness> liveness_;
  uint64_t seq_ = 0;
  bool diagnosed_ = false;  // the first failure carries the diagnosis
};

}  // namespace pstar::distributed
