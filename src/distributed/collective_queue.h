// CollectiveQueue: runs an engine's asynchronous collectives, in the order
// they were submitted, on one thread of its own (docs/distributed.md,
// "Gathering ahead").
//
// Why a thread: both communicators block the calling thread until a
// collective is complete (Gloo's TCP loops; NCCL's stream wait, which is
// also where its watchdog runs).  A gather issued ahead of its use must
// proceed while the engine's thread returns to the caller's compute, so it
// runs here.
//
// Invariants the engine keeps:
//  - the communicator is used by one thread at a time: the engine drains the
//    queue (drain()) before it runs any collective on its own thread, so
//    the order of collectives on every rank is the order of submission
//    followed by the inline one;
//  - the buffers an operation reads or writes stay allocated and untouched
//    by the engine until its ticket is waited for.
//
// After an operation throws, every later one fails at once with the same
// message without touching the communicator (the group is broken; see
// communicator.h), and wait() rethrows it for each.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace pstar::distributed {

class CollectiveQueue {
 public:
  struct Operation;
  using Ticket = std::shared_ptr<Operation>;

  CollectiveQueue();
  // Finishes every queued operation (collectives end by their timeout at
  // worst), then joins the thread.
  ~CollectiveQueue();
  CollectiveQueue(const CollectiveQueue&) = delete;
  CollectiveQueue& operator=(const CollectiveQueue&) = delete;

  // Queues `op`; it runs after every operation submitted before it.
  Ticket submit(std::function<void()> op);
  // True once the operation finished (successfully or not); never blocks
  // on the operation.
  bool done(const Ticket& t);
  // Blocks until the operation finished; rethrows what it threw.
  void wait(const Ticket& t);
  // Blocks until every submitted operation finished; rethrows the first
  // failure of any of them (so a broken group is seen by the next inline
  // collective).
  void drain();

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;             // work queued, or stopping
  std::condition_variable done_cv_;        // an operation finished
  std::deque<Ticket> queue_;               // guarded by mu_
  std::exception_ptr broken_;              // the first failure; guarded by mu_
  uint64_t submitted_ = 0, finished_ = 0;  // guarded by mu_
  bool stop_ = false;                      // guarded by mu_
  std::thread thread_;
};

}  // namespace pstar::distributed
