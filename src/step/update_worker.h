// UpdateWorker: the CPU updates of an overlapped step, run on a thread of
// the engine's own while the caller goes on with the next iteration.
//
// Design:
//  - The engine's thread decides everything at pstar_step: skip or clip
//    from the complete norm, which chunks are updated, in which order (the
//    next iteration's first use when it follows the trace), each chunk's
//    segments with their constants, and the host buffers (the chunk is on
//    the host; its D2H copy completed before start()).  start() hands that
//    list over; the worker runs the chunks' updates in list order, one
//    after the other (each split over the optimizer's threads as in a
//    synchronous step, so the bits are the same).
//  - Completion is a prefix: the worker publishes how many jobs are done
//    (an atomic count, release); the engine's thread reads it without a
//    lock (take_done(), on every acquire) and waits on the condition
//    variable only for a chunk it needs now (wait_for) or for all
//    (wait_all).
//  - While a chunk's job is not done, the engine's thread must neither move
//    nor read nor write its payload or fp32 lists: the chunk carries
//    awaiting_update (placement neither fetches nor prefetches it), and
//    every call that reads or writes values, lists or optimizer state waits
//    for the whole step first.
//  - An exception in a job (or in the RunSequence around them) ends the
//    step in flight: the jobs after it are not run, waits return, and the
//    failure is kept (failed(), error()) until the engine clears it.  The updated chunks keep their new values;
//    the others keep the old ones.
//  - A job may be followed (follow()): the engine's thread hands over, for a
//    job not yet taken, a closure the update thread runs right after that
//    job's update and before it publishes the job's completion (the
//    placement runtime queues the updated chunk's copy to the device there,
//    so that the copy does not wait for the caller's next engine call).
//    Whether the closure runs is decided by one compare-and-swap on the
//    job's state: follow() wins while the job has not finished its update,
//    and then the closure runs exactly once; otherwise follow() returns
//    false and nothing runs.  A closure that throws fails the step as a
//    job that throws does.  A job that never ran (a failure before it)
//    never runs its closure.
//  - One step in flight at a time: start() requires the previous one taken
//    in full.  The destructor waits for the step in flight and joins.
//  - Speculation (OptimizerStep's speculative update, during the backward):
//    speculate() queues a job that writes only buffers of its own (out of
//    place); the worker runs such jobs after the step in flight's jobs,
//    each time starting the queued one of least Job::priority (the next
//    iteration's first use of its chunk: the backward hands chunks over in
//    the reverse of the order the forward needs them, so hand-over order
//    would leave the first ones the forward needs for last; ties in
//    hand-over order).  end_speculation() stops it: no queued speculative
//    job starts any more, the running one completes, and which ones
//    completed (by hand-over index) is returned.  A speculative job that
//    throws only ends the speculation (the step recomputes that chunk in
//    place and reports its own errors); it is not a failure of a step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "optim/chunk_update.h"

namespace pstar::step {

class UpdateWorker {
 public:
  // One chunk's CPU update.
  struct Job {
    uint32_t chunk = 0;
    uint64_t elems = 0;  // elements [0, elems) of the lists
    std::vector<optim::Segment> segments;
    optim::ChunkLists lists;
    // Gradient accumulation: the segments' part of the fp32 gradient list
    // is zeroed after the update (the step consumes it).
    bool clear_gradients = false;
    // Speculative: the chunk's compute payload (slot_bytes) is copied into
    // lists.slot before the update, which reads the gradients there and
    // writes the new weights in place of them; the fp32 lists are read
    // from lists.*_in.  The chunk's own buffers are only read.
    const void* copy_slot_from = nullptr;
    uint64_t slot_bytes = 0;
    // Speculative: queued jobs start in increasing priority.
    uint64_t priority = 0;
  };

  // Runs one job on the update thread (the optimizer step's update of a
  // chunk); an exception ends the step in flight.
  using RunJob = std::function<void(const Job&)>;
  // Runs the jobs of one step: calls run_one(i) for i = 0, 1, ... n-1, in
  // that order, each once; run_one runs job i and publishes its completion,
  // and throws what the job threw.  What it does around them (the NVMe
  // tier streams the drive's lists through its staging ring) is its own;
  // the step is complete, and its last job published, only when it
  // returns, so that nothing it started outlives the step.  Empty: a loop.
  using RunSequence = std::function<void(const std::vector<Job>& jobs, const std::function<void(size_t)>& run_one)>;

  // `chunks`: the engine's chunk count (positions are kept per chunk).
  UpdateWorker(RunJob run_job, uint32_t chunks, RunSequence run_sequence = {});
  ~UpdateWorker();
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  // Hands over one step's jobs, in the order they run.  Engine thread;
  // nothing in flight.
  void start(std::vector<Job> jobs);
  // A step handed over whose completion the engine has not taken in full.
  bool in_flight() const { return in_flight_; }
  // Calls on_done(chunk) for every job completed since the last call, in
  // job order.  Lock-free unless a job completed.
  template <typename F>
  void take_done(F&& on_done) {
    if (!in_flight_) return;
    const size_t n = completed_.load(std::memory_order_acquire);
    if (n == taken_) return;
    for (; taken_ < n; ++taken_) on_done(jobs_[taken_].chunk);
    if (taken_ == jobs_.size()) finish();
  }
  // Chunk k's job in flight, not yet taken: `after` runs on the update
  // thread right after its update, before its completion is published.
  // Returns false, and `after` is dropped, when there is no such job or its
  // update has already finished (see the top of this file).  Engine thread.
  bool follow(uint32_t k, std::function<void()> after);
  // Whether follow(k, ...) would succeed now (it may still fail later).
  bool can_follow(uint32_t k) const;
  // Waits until chunk k's job (if it has one in flight) completed; returns
  // the seconds waited.
  double wait_for(uint32_t k);
  // Waits until every job completed; returns the seconds waited.
  double wait_all();

  // A job threw: the step in flight ended there.
  bool failed() const { return error_ != nullptr; }
  std::exception_ptr error() const { return error_; }
  void clear_failure() { error_ = nullptr; }

  // Speculation (see the top of this file).  Engine thread.  speculate()
  // queues one job; end_speculation() returns, for each job queued since
  // the last end_speculation() (in hand-over order), whether it completed,
  // and forgets them.
  void speculate(Job job);
  std::vector<bool> end_speculation();

  // Seconds the worker spent in jobs (all steps).
  double busy_seconds() const { return busy_seconds_.load(std::memory_order_relaxed); }

 private:
  void run();
  // The index of chunk k's job when follow(k, ...) may still win now (in
  // flight, not taken, its update not finished), else -1.  Engine thread.
  int64_t followable(uint32_t k) const;
  struct SpecEntry;
  void run_speculative(SpecEntry& entry);
  void finish();
  double wait_until(size_t count);

  const RunJob run_job_;
  const RunSequence run_sequence_;
  // Engine thread: the jobs of the step in flight, the prefix taken, and
  // each chunk's position in jobs_ (-1: none).
  std::vector<Job> jobs_;
  size_t taken_ = 0;
  std::vector<int64_t> position_;
  bool in_flight_ = false;
  // Per job of the step in flight: kJobPending until the update finished
  // or the job was followed (kJobFollowed, after_[i] set before it), then
  // kJobRan.  The one compare-and-swap from kJobPending decides whether
  // after_[i] runs (see follow()).  after_[i] is written by the engine's
  // thread before its swap and read by the worker after it fails.
  enum : uint8_t { kJobPending = 0, kJobFollowed = 1, kJobRan = 2 };
  std::unique_ptr<std::atomic<uint8_t>[]> job_state_;
  std::vector<std::function<void()>> after_;
  std::exception_ptr error_;  // set by finish() from failure_

  // Shared with the worker, under mu_ except completed_.
  std::mutex mu_;
  std::condition_variable work_cv_;  // a step to run, or stop
  std::condition_variable done_cv_;  // a job completed
  bool has_work_ = false;
  bool stop_ = false;
  std::atomic<size_t> completed_{0};
  std::exception_ptr failure_;  // written by the worker before it publishes the end
  // Speculative jobs, in hand-over order (a deque: the worker holds a
  // reference to the one it runs while the engine appends), each one's
  // state, how many are queued (not started), and whether one runs now.
  // Under mu_.
  enum class SpecStatus : uint8_t { kQueued, kRunning, kDone, kFailed };
  struct SpecEntry {
    Job job;
    SpecStatus status = SpecStatus::kQueued;
  };
  std::deque<SpecEntry> spec_jobs_;
  size_t spec_queued_ = 0;
  bool spec_running_ = false;
  bool spec_closed_ = false;  // no further speculative job starts
  std::atomic<double> busy_seconds_{0.0};
  std::thread thread_;
};

}  // namespace pstar::step
