// ProcessGroup (process_group.h): forming or adopting the group, and the
// failure and hashing discipline of its collectives.
#include "distributed/process_group.h"

#include <exception>
#include <utility>
#include <vector>

#include "distributed/group.h"
#include "util/error.h"
#include "util/log.h"

namespace pstar::distributed {

void ProcessGroup::set_launch(const LaunchInfo& launch) {
  launch_ = launch;
  rank_ = launch.rank;
  world_ = launch.world_size;
}

void ProcessGroup::connect(int cuda_device, std::chrono::milliseconds timeout) {
  if (world_ < 2 || comm_ != nullptr) return;
  GroupOptions go;
  go.launch = launch_;
  go.timeout = timeout;
  try {
    comm_ = cuda_device >= 0 ? form_cuda_group(go, cuda_device) : form_cpu_group(go);
  } catch (const Error& e) {
    throw Error(e.status(),
                "engine_create: forming the data-parallel group failed (" + describe(launch_) + "): " + e.what());
  }
  ++collectives_;  // the group's barrier
}

void ProcessGroup::adopt(std::unique_ptr<Communicator> comm) {
  rank_ = comm->rank();
  world_ = comm->size();
  comm_ = std::move(comm);
}

void ProcessGroup::throw_refused(const char* what) const {
  throw Error(PSTAR_ERR_COMM, std::string(what) + ": refused: a collective of this engine failed earlier (" + failure_ +
                                  "); the group is broken: destroy the engine and start the ranks again");
}

bool ProcessGroup::failed_call(const std::function<void()>& f, std::string* failure) {
  try {
    f();
    return false;
  } catch (const Error& e) {
    if (e.status() != PSTAR_ERR_COMM) throw;
    *failure = e.what();
  } catch (const std::exception& e) {
    *failure = e.what();
  }
  return true;
}

void ProcessGroup::fail(const char* what, const std::string& failure) {
  fail_all(std::string(what) + " on rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": " + failure);
}

void ProcessGroup::fail_all(const std::string& message) {
  failed_ = true;
  failure_ = message;
  log::error(failure_);
  throw Error(PSTAR_ERR_COMM, failure_);
}

void ProcessGroup::note(CollectiveKind kind, uint64_t chunk) {
  hash_ = (hash_ ^ (static_cast<uint64_t>(kind) * 0x9E3779B97F4A7C15ull + chunk)) * 0x100000001B3ull;
  ++collectives_;
}

void ProcessGroup::all_gather_host(const char* what, CollectiveKind kind, uint64_t chunk, const void* mine, void* all,
                                   size_t bytes) {
  run(what, kind, chunk, [&] {
    if (!comm_->device_buffers()) {
      comm_->all_gather(mine, all, bytes);
      return;
    }
    const size_t total = bytes * static_cast<size_t>(world_);
    void* scratch = scratch_.alloc(total);
    try {
      void* own = static_cast<char*>(scratch) + static_cast<size_t>(rank_) * bytes;
      scratch_.copy(own, mine, bytes, true);
      comm_->all_gather(own, scratch, bytes);
      scratch_.copy(all, scratch, total, false);
    } catch (...) {
      scratch_.free(scratch, total);
      throw;
    }
    scratch_.free(scratch, total);  // the copies waited: nothing uses it
  });
}

ProcessGroup::StepVote ProcessGroup::agree_on_step(const StepVote& mine) {
  // Fixed-size fields, the same layout on every rank.
  struct Exchange {
    double sumsq;
    uint64_t overflow;
    uint64_t hash;
    uint64_t schedule_ready;
  };
  const Exchange own{mine.sumsq, mine.overflow ? 1u : 0u, take_hash(), mine.schedule_ready ? 1u : 0u};
  std::vector<Exchange> all(static_cast<size_t>(world_));
  all_gather_host("step: norm and overflow exchange", CollectiveKind::kStep, 0, &own, all.data(), sizeof own);
  StepVote agreed;
  agreed.schedule_ready = true;
  for (int q = 0; q < world_; ++q) {
    const Exchange& e = all[static_cast<size_t>(q)];
    if (e.hash != all[0].hash) {
      fail_all("step: the ranks issued different collectives since the last step (rank 0 and rank " +
               std::to_string(q) +
               " differ): their acquires, releases, reads or builds were not the same calls in the same order");
    }
    agreed.sumsq += e.sumsq;  // rank order: the same bits on every rank
    agreed.overflow = agreed.overflow || e.overflow != 0;
    agreed.schedule_ready = agreed.schedule_ready && e.schedule_ready != 0;
  }
  return agreed;
}

void ProcessGroup::start_queue() { queue_ = std::make_unique<CollectiveQueue>(); }

CollectiveQueue::Ticket ProcessGroup::submit(const char* what, CollectiveKind kind, uint64_t chunk,
                                             std::function<void()> op) {
  require_ok(what);
  note(kind, chunk);
  return queue_->submit(std::move(op));
}

bool ProcessGroup::wait_failed(const CollectiveQueue::Ticket& t, std::string* failure) {
  return failed_call([&] { queue_->wait(t); }, failure);
}

void ProcessGroup::drain(const char* what) {
  if (queue_ == nullptr) return;
  std::string failure;
  if (failed_call([&] { queue_->drain(); }, &failure)) fail(what, failure);
}

}  // namespace pstar::distributed
