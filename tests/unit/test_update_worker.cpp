// The overlapped step's update thread (src/step/update_worker.h) on its
// own, with jobs that record what they do: jobs run in the order handed
// over and complete as a prefix; take_done reports them in that order;
// wait_for returns once its chunk's job is done, while later jobs may still
// run; a job that throws ends the step there (the later jobs do not run,
// waits return, the failure is kept until cleared); the destructor waits for
// the step in flight.
#include <criterion/criterion.h>

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
  UpdateWorker w(r.run(), 4);
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

// Speculative jobs run in hand-over order after the step in flight;
// end_speculation lets the running one finish, starts no other, and returns
// the completed prefix; a throwing speculative job only stops the
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
  const size_t done = w.end_speculation();  // waits for job 5
  opener.join();
  cr_assert_eq(done, 2u, "4 and 5 completed, 6 never started");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cr_assert(r.snapshot() == std::vector<uint32_t>({0, 1, 4, 5}), "job 6 did not run");
  cr_assert_eq(w.end_speculation(), 0u, "nothing handed since");

  r.failing = 2;
  for (uint32_t k : {3u, 2u, 7u}) w.speculate(jobs_of({k})[0]);
  while (r.snapshot().size() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cr_assert_eq(w.end_speculation(), 1u, "3 completed; 2 threw, so 7 never started");
  cr_assert(r.snapshot() == std::vector<uint32_t>({0, 1, 4, 5, 3}));
  cr_assert_not(w.failed(), "a speculative job's exception is not a step's failure");
  r.failing = UINT32_MAX;
  w.start(jobs_of({2}));
  w.wait_all();
  cr_assert(take(w) == std::vector<uint32_t>({2}));
}
