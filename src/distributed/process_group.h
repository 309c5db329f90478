// ProcessGroup: one engine's membership in a data-parallel group, and the
// discipline every collective of that engine follows (docs/distributed.md).
//
// It owns the communicator, the rank and size, the collective queue that
// runs collectives off the engine's thread (gathering ahead), and two pieces
// of state that make a broken group safe to report:
//  - failure: once a collective fails, the group is broken for good (a peer
//    may be gone, or half-way through a collective this rank abandoned), so
//    every later collective is refused with the first failure's message;
//  - the collective hash: every collective issued since the last step
//    (kind, chunk), folded in issue order.  The step exchanges it, so that
//    ranks whose calls differed fail with a clear message rather than hang
//    in mismatched collectives or exchange the wrong chunks.
//
// With one process it holds no communicator: sharded() is false, rank 0 of
// 1, and nothing here is called.
//
// It must not know chunks, parameters or memory tiers: the callers pass the
// operation to run and the (kind, chunk) to hash.  Placing buffers for a
// collective (device staging, gather slots) is the caller's.
//
// Threading: the engine's thread calls everything here.  The queue's thread
// runs only the operations submitted to it; the engine drains the queue
// before any collective of its own (run()), so that the communicator is
// used by one thread at a time (collective_queue.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "distributed/collective_queue.h"
#include "distributed/comm/communicator.h"
#include "distributed/launch_env.h"

namespace pstar::distributed {

// Kinds of collectives, folded into the collective hash.
enum class CollectiveKind : uint32_t {
  kLayout = 1,  // the build's layout check
  kGather = 2,  // a chunk's all-gather
  kReduce = 3,  // a chunk's gradient reduce-scatter
  kRead = 4,    // a parameter read's all-gather
  kStep = 5,    // the step's norm and overflow exchange
  kCheckpoint = 6
};

class ProcessGroup {
 public:
  ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  // Finishes the queue's operations first (they use the communicator).
  ~ProcessGroup() { stop_queue(); }

  // The launch this process belongs to (resolve_launch's answer): its rank
  // and size; connect() forms the group when the size is above one.
  void set_launch(const LaunchInfo& launch);
  // Forms the group (distributed/group.h) when the launch has more than one rank
  // and no communicator was adopted: NCCL on CUDA device `cuda_device`, or
  // Gloo when `cuda_device` < 0.  Counts the group's barrier.
  void connect(int cuda_device, std::chrono::milliseconds timeout);
  // A group formed by the caller (tests, embedders), whatever its size.
  void adopt(std::unique_ptr<Communicator> comm);

  bool sharded() const { return comm_ != nullptr; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  const LaunchInfo& launch() const { return launch_; }
  // The communicator; only when sharded().
  Communicator& comm() { return *comm_; }
  bool device_buffers() const { return comm_->device_buffers(); }

  // Refuses (PSTAR_ERR_COMM) once a collective failed.
  void require_ok(const char* what) const {
    if (failed_) throw_refused(what);
  }
  // Runs `f`, a collective, on this thread: refused after a failure; the
  // queue is drained first; a PSTAR_ERR_COMM (or any non-pstar exception)
  // from `f` marks the group failed for good and throws PSTAR_ERR_COMM.
  // Other pstar errors pass through.
  template <class F>
  void run(const char* what, CollectiveKind kind, uint64_t chunk, F&& f) {
    require_ok(what);
    drain(what);
    note(kind, chunk);
    std::string failure;
    if (failed_call(std::function<void()>(std::forward<F>(f)), &failure)) fail(what, failure);
  }

  // Scratch in device memory for collectives of host memory over a
  // communicator that takes device memory (NCCL): allocated where room is
  // made and counted while it lives, and copies that wait.
  struct DeviceScratch {
    std::function<void*(uint64_t bytes)> alloc;
    std::function<void(void* p, uint64_t bytes)> free;
    std::function<void(void* dst, const void* src, size_t bytes, bool to_device)> copy;
  };
  void set_device_scratch(DeviceScratch scratch) { scratch_ = std::move(scratch); }
  // A collective (as run()): all-gathers `bytes` of host memory from every
  // rank into `all` (world * bytes, rank order); through the device scratch
  // when the communicator takes device memory.
  void all_gather_host(const char* what, CollectiveKind kind, uint64_t chunk, const void* mine, void* all,
                       size_t bytes);

  // The step's agreement (one collective): every rank's squared gradient
  // norm, overflow flag and gather-schedule readiness, exchanged with the
  // hash of the collectives each issued since the last step.  The sum is
  // taken in rank order (the same bits on every rank), overflow if any rank
  // overflowed, the schedule ready only if ready on every rank.  Ranks
  // whose hashes differ made different calls: the group fails for good on
  // every rank (PSTAR_ERR_COMM).
  struct StepVote {
    double sumsq = 0.0;
    bool overflow = false;
    bool schedule_ready = false;
  };
  StepVote agree_on_step(const StepVote& mine);

  // The collective queue (gathering ahead): started at build, stopped
  // before the buffers its operations use are freed.
  void start_queue();
  void stop_queue() { queue_.reset(); }
  bool has_queue() const { return queue_ != nullptr; }
  // Queues `op`, a collective, counted and hashed now (issue order);
  // refused after a failure.  Only with a queue.
  CollectiveQueue::Ticket submit(const char* what, CollectiveKind kind, uint64_t chunk, std::function<void()> op);
  // True once the queued operation finished; never blocks.
  bool done(const CollectiveQueue::Ticket& t) { return queue_->done(t); }
  // Waits for a queued operation: true, with *failure set, when it failed.
  // The caller decides when to fail() (after freeing what the operation
  // used, or not at all for a chunk being dropped: the queue fails every
  // later operation itself, so the next collective reports it).
  bool wait_failed(const CollectiveQueue::Ticket& t, std::string* failure);
  // Waits for every queued operation (they were issued first, so they are
  // first in every rank's order); a failure fails the group.
  void drain(const char* what);

  // Marks the group failed for good with `failure` (said of `what` on this
  // rank) and throws PSTAR_ERR_COMM.
  [[noreturn]] void fail(const char* what, const std::string& failure);
  // Marks the group failed with `message` as is and throws PSTAR_ERR_COMM
  // (a failure every rank finds itself, e.g. differing collective hashes).
  [[noreturn]] void fail_all(const std::string& message);

  // The hash of the collectives issued since the last call, and a new one
  // begun.
  uint64_t take_hash() {
    const uint64_t h = hash_;
    hash_ = 0;
    return h;
  }
  // Collectives issued since the engine was created (pstar_stats).
  uint64_t collectives() const { return collectives_; }

 private:
  void note(CollectiveKind kind, uint64_t chunk);
  // Runs f; true and *failure set when it failed as a collective does
  // (PSTAR_ERR_COMM or a non-pstar exception); other pstar errors rethrown.
  static bool failed_call(const std::function<void()>& f, std::string* failure);
  [[noreturn]] void throw_refused(const char* what) const;

  LaunchInfo launch_;
  int rank_ = 0;
  int world_ = 1;
  std::unique_ptr<Communicator> comm_;  // null with one process
  bool failed_ = false;
  std::string failure_;  // the first failure, said of its collective and rank
  uint64_t hash_ = 0;    // collectives since the last take_hash()
  uint64_t collectives_ = 0;
  DeviceScratch scratch_;
  // Declared after comm_, so that it is destroyed (its thread joined) first.
  std::unique_ptr<CollectiveQueue> queue_;
};

}  // namespace pstar::distributed
