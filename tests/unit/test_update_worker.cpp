// The overlapped step's update thread (src/step/update_worker.h) on its
// own, with jobs that record what they do: jobs run in the order handed
// over and complete as a prefix; take_done reports them in that order;
// wait_for returns once its chunk's job is done, while later jobs may still
// run; a job that throws ends the step there (the later jobs do not run,
// waits return, the failure is kept until cleared); the destructor waits for
// the step in flight.
#include <criterion/criterion.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "step/update_worker.h"
#include "util/error.h"

using pstar::step::UpdateWorker;

namespace {

// A gate a job can wait at until the test opens it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

// Records the chunks of the jobs run, in order; blocks at `gated`'s gate;
// throws at `failing`.
struct Recorder {
  std::mutex mu;
  std::vector<uint32_t> ran;
  uint32_t gated = UINT32_MAX;
  uint32_t failing = UINT32_MAX;
  Gate gate;
  UpdateWorker::RunJob run() {
    return [this](const UpdateWorker::Job& job) {
      if (job.chunk == gated) gate.wait();
      if (job.chunk == failing) throw pstar::Error(PSTAR_ERR_IO, "job failed");
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(job.chunk);
    };
  }
  std::vector<uint32_t> snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return ran;
  }
};

std::vector<UpdateWorker::Job> jobs_of(const std::vector<uint32_t>& chunks) {
  std::vector<UpdateWorker::Job> jobs;
  for (uint32_t k : chunks) {
    UpdateWorker::Job j;
    j.chunk = k;
    jobs.push_back(j);
  }
  return jobs;
}

std::vector<uint32_t> take(UpdateWorker& w) {
  std::vector<uint32_t> done;
  w.take_done([&](uint32_t k) { done.push_back(k); });
  return done;
}

}  // namespace

Test(update_worker, jobs_complete_in_order_and_waits_are_per_chunk) {
  Recorder r;
  r.gated = 1;
  UpdateWorker w(r.run(), 5);
  cr_assert_not(w.in_flight());
  w.start(jobs_of({3, 1, 2}));
  cr_assert(w.in_flight());
  w.wait_for(3);  // returns while the job of chunk 1 waits at the gate
  cr_assert(take(w) == std::vector<uint32_t>({3}));
  cr_assert(take(w).empty(), "nothing new completed");
  cr_assert(w.in_flight());
  cr_assert_eq(w.wait_for(4), 0.0, "a chunk without a job does not wait");
  cr_assert_eq(w.wait_for(3), 0.0, "a chunk already taken does not wait");
  r.gate.release();
  w.wait_for(2);
  cr_assert(take(w) == std::vector<uint32_t>({1, 2}));
  cr_assert_not(w.in_flight(), "every job taken: the step is over");
  cr_assert(r.snapshot() == std::vector<uint32_t>({3, 1, 2}));
  cr_assert_not(w.failed());
  cr_assert_geq(w.busy_seconds(), 0.0);

  // The next step reuses the thread; the positions of the last are gone.
  w.start(jobs_of({0, 4}));
  w.wait_all();
  cr_assert(take(w) == std::vector<uint32_t>({0, 4}));
  cr_assert(r.snapshot() == std::vector<uint32_t>({3, 1, 2, 0, 4}));
  w.start({});  // nothing to update: nothing in flight
  cr_assert_not(w.in_flight());
}

Test(update_worker, a_failing_job_ends_the_step_and_is_kept) {
  Recorder r;
  r.failing = 2;
  UpdateWorker w(r.run(), 8);
  w.start(jobs_of({0, 2, 3}));
  w.wait_for(3);  // returns: the step ended at chunk 2
  cr_assert(take(w) == std::vector<uint32_t>({0, 2, 3}), "every job is taken, run or not");
  cr_assert_not(w.in_flight());
  cr_assert(w.failed());
  cr_assert(r.snapshot() == std::vector<uint32_t>({0}), "the job after the failed one did not run");
  try {
    std::rethrow_exception(w.error());
  } catch (const pstar::Error& e) {
    cr_assert_eq(e.status(), PSTAR_ERR_IO);
  }
  w.clear_failure();
  cr_assert_not(w.failed());
  r.failing = UINT32_MAX;
  w.start(jobs_of({3}));
  w.wait_all();
  cr_assert(take(w) == std::vector<uint32_t>({3}));
  cr_assert_not(w.failed());
}

Test(update_worker, the_destructor_waits_for_the_step_in_flight) {
  Recorder r;
  r.gated = 1;
  std::thread opener;
  {
    UpdateWorker w(r.run(), 2);
    w.start(jobs_of({0, 1}));
    opener = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      r.gate.release();
    });
  }
  opener.join();
  cr_assert(r.snapshot() == std::vector<uint32_t>({0, 1}), "both jobs ran before the worker went");
}

// Speculative jobs of equal priority run in hand-over order after the step
// in flight; end_speculation lets the running one finish, starts no other,
// and says which completed; a throwing speculative job only stops the
// speculation (no failure is kept).
Test(update_worker, speculation_runs_after_the_step_and_ends_on_request) {
  Recorder r;
  r.gated = 5;
  UpdateWorker w(r.run(), 8);
  w.start(jobs_of({0, 1}));
  for (uint32_t k : {4u, 5u, 6u}) w.speculate(jobs_of({k})[0]);
  w.wait_all();
  cr_assert(take(w) == std::vector<uint32_t>({0, 1}));
  // Job 4 done, job 5 at its gate (running), job 6 queued.
  while (r.snapshot().size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    r.gate.release();
  });
  const std::vector<bool> done = w.end_speculation();  // waits for job 5
  opener.join();
  cr_assert(done == std::vector<bool>({true, true, false}), "4 and 5 completed, 6 never started");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cr_assert(r.snapshot() == std::vector<uint32_t>({0, 1, 4, 5}), "job 6 did not run");
  cr_assert(w.end_speculation().empty(), "nothing handed since");

  r.failing = 2;
  for (uint32_t k : {3u, 2u, 7u}) w.speculate(jobs_of({k})[0]);
  while (r.snapshot().size() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cr_assert(w.end_speculation() == std::vector<bool>({true, false, false}),
            "3 completed; 2 threw, so 7 never started");
  cr_assert(r.snapshot() == std::vector<uint32_t>({0, 1, 4, 5, 3}));
  cr_assert_not(w.failed(), "a speculative job's exception is not a step's failure");
  r.failing = UINT32_MAX;
  w.start(jobs_of({2}));
  w.wait_all();
  cr_assert(take(w) == std::vector<uint32_t>({2}));
}

// Among queued speculative jobs the worker starts the one of least
// priority (the chunk the next forward needs first), not the first handed
// over; end_speculation reports completion by hand-over index.
Test(update_worker, speculation_starts_the_least_priority_first) {
  Recorder r;
  r.gated = 9;
  UpdateWorker w(r.run(), 16);
  UpdateWorker::Job blocker = jobs_of({9})[0];
  w.speculate(blocker);  // priority 0: first in any case; holds the worker while the others queue
  const uint32_t chunks[4] = {6, 4, 7, 5};
  const uint64_t priority[4] = {30, 10, 40, 20};
  for (int i = 0; i < 4; ++i) {
    UpdateWorker::Job j = jobs_of({chunks[i]})[0];
    j.priority = priority[i];
    w.speculate(j);
  }
  r.gate.release();
  while (r.snapshot().size() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  cr_assert(r.snapshot() == std::vector<uint32_t>({9, 4, 5, 6, 7}), "least priority first");
  cr_assert(w.end_speculation() == std::vector<bool>({true, true, true, true, true}));
}

// follow(k, f): f runs on the update thread right after chunk k's job and
// before its completion is published (take_done sees what f wrote); once
// the job's update is over, or the job is taken, follow is refused and f
// never runs; a job that never ran (a failure before it) never runs f.
Test(update_worker, a_followed_job_runs_its_closure_before_it_is_published) {
  Recorder r;
  r.gated = 1;
  UpdateWorker w(r.run(), 8);
  w.start(jobs_of({0, 1, 2}));
  std::atomic<int> ran_after{0};
  std::thread::id after_thread;
  cr_assert(w.can_follow(1));
  cr_assert(w.follow(1, [&] {
    after_thread = std::this_thread::get_id();
    ran_after.fetch_add(1);
  }));
  cr_assert_not(w.can_follow(1), "followed once");
  cr_assert_not(w.follow(1, [] {}), "followed once");
  cr_assert_not(w.follow(3, [] {}), "chunk 3 has no job");
  w.wait_for(0);
  // Job 0 is over (published, not taken): following it is refused.
  cr_assert_not(w.follow(0, [&] { ran_after.fetch_add(100); }));
  r.gate.release();
  w.wait_for(1);
  std::vector<uint32_t> seen;
  int after_at_take = -1;
  w.take_done([&](uint32_t k) {
    seen.push_back(k);
    if (k == 1) after_at_take = ran_after.load();
  });
  cr_assert_eq(after_at_take, 1, "the closure ran before chunk 1 was published");
  cr_assert(after_thread != std::this_thread::get_id(), "on the update thread");
  w.wait_all();
  take(w);
  cr_assert_eq(ran_after.load(), 1);

  // A failure at job 0: the closure of job 1 never runs.
  r.failing = 5;
  w.start(jobs_of({5, 6}));
  bool followed = w.follow(6, [&] { ran_after.fetch_add(1000); });
  w.wait_all();
  take(w);
  cr_assert(w.failed());
  cr_assert_eq(ran_after.load(), 1, "job 6 never ran, so neither did its closure (followed: %d)", followed);
  w.clear_failure();
}
