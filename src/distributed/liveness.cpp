#include "distributed/liveness.h"

#include <cstdio>
#include <vector>

#include "util/error.h"
#include "util/log.h"

namespace pstar::distributed {

namespace {
// Store calls of the heartbeat and of diagnose(): short, so that a store
// that is gone is noticed quickly.
constexpr std::chrono::milliseconds kStoreCallTimeout{500};

struct Beat {
  bool seen = false;  // the rank published at least once
  uint64_t beat = 0;
  uint64_t seq = 0;
};
}  // namespace

Liveness::Liveness(const StoreClientOptions& client, std::string prefix, int rank, int world)
    : options_(client), prefix_(std::move(prefix)), rank_(rank), world_(world) {
  options_.connect_timeout = kStoreCallTimeout;
  options_.timeout = kStoreCallTimeout;
  thread_ = std::thread([this] { beat_loop(); });
}

Liveness::~Liveness() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Liveness::beat_loop() {
  const std::string key = prefix_ + "/live/" + std::to_string(rank_);
  std::unique_ptr<Store> client;
  uint64_t beat = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    try {
      if (!client) client = connect_store(options_);
      const std::string value = std::to_string(++beat) + " " + std::to_string(seq_.load(std::memory_order_relaxed));
      client->set(key, value.data(), value.size());
    } catch (const std::exception& e) {
      // The store is gone (rank 0 died) or slow: keep trying; diagnose()
      // reports what the others see.
      client.reset();
      log::debug(std::string("heartbeat: ") + e.what());
    }
    lock.lock();
    cv_.wait_for(lock, kHeartbeatInterval, [this] { return stop_; });
  }
}

std::string Liveness::diagnose() {
  try {
    const std::unique_ptr<Store> client = connect_store(options_);
    auto read_all = [&] {
      std::vector<Beat> out(static_cast<size_t>(world_));
      for (int r = 0; r < world_; ++r) {
        const std::string key = prefix_ + "/live/" + std::to_string(r);
        if (!client->check({key})) continue;
        const Store::Bytes v = client->get(key, kStoreCallTimeout);
        const std::string s(v.begin(), v.end());
        unsigned long long b = 0, q = 0;
        if (std::sscanf(s.c_str(), "%llu %llu", &b, &q) == 2) out[static_cast<size_t>(r)] = Beat{true, b, q};
      }
      return out;
    };
    const std::vector<Beat> first = read_all();
    std::this_thread::sleep_for(kDiagnoseWindow);
    const std::vector<Beat> second = read_all();
    const uint64_t mine = seq_.load(std::memory_order_relaxed);
    std::string gone, stuck;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      const Beat& a = first[static_cast<size_t>(r)];
      const Beat& b = second[static_cast<size_t>(r)];
      const double window_s = std::chrono::duration<double>(kDiagnoseWindow).count();
      if (!b.seen || b.beat == a.beat) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%srank %d is gone or hung (no heartbeat for %.1f s)", gone.empty() ? "" : "; ",
                      r, window_s);
        gone += buf;
      } else if (b.seq < mine) {
        char buf[200];
        std::snprintf(buf, sizeof buf,
                      "%srank %d is alive but has not reached this collective (it entered %llu, this rank %llu)",
                      stuck.empty() ? "" : "; ", r, static_cast<unsigned long long>(b.seq),
                      static_cast<unsigned long long>(mine));
        stuck += buf;
      }
    }
    if (!gone.empty() || !stuck.empty()) {
      return "heartbeats: " + gone + (gone.empty() || stuck.empty() ? "" : "; ") + stuck;
    }
    return "heartbeats: every other rank is alive and has reached this collective";
  } catch (const std::exception& e) {
    return std::string("heartbeats: the rendezvous store does not answer, so rank 0, which serves it, is gone (") +
           e.what() + ")";
  }
}

template <class F>
void MonitoredCommunicator::monitored(F&& f) {
  liveness_->note_collective(++seq_);
  try {
    f();
  } catch (const Error& e) {
    if (e.status() != PSTAR_ERR_COMM || diagnosed_) throw;
    diagnosed_ = true;
    throw Error(PSTAR_ERR_COMM, std::string(e.what()) + "; " + liveness_->diagnose());
  }
}

void MonitoredCommunicator::all_gather(const void* shard, void* out, size_t shard_bytes) {
  monitored([&] { inner_->all_gather(shard, out, shard_bytes); });
}
void MonitoredCommunicator::reduce_scatter_sum(float* data, float* out, size_t block_elems) {
  monitored([&] { inner_->reduce_scatter_sum(data, out, block_elems); });
}
void MonitoredCommunicator::all_reduce_sum(double* values, size_t n) {
  monitored([&] { inner_->all_reduce_sum(values, n); });
}
void MonitoredCommunicator::all_reduce_max(int64_t* values, size_t n) {
  monitored([&] { inner_->all_reduce_max(values, n); });
}
void MonitoredCommunicator::broadcast(void* data, size_t bytes, int root) {
  monitored([&] { inner_->broadcast(data, bytes, root); });
}
void MonitoredCommunicator::barrier() {
  monitored([&] { inner_->barrier(); });
}

}  // namespace pstar::distributed
