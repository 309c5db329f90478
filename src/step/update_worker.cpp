#include "step/update_worker.h"

#include <chrono>
#include <utility>

#include "util/error.h"

namespace pstar::step {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

UpdateWorker::UpdateWorker(RunJob run_job, uint32_t chunks, RunSequence run_sequence)
    : run_job_(std::move(run_job)), run_sequence_(std::move(run_sequence)), position_(chunks, -1) {
  thread_ = std::thread([this] { run(); });
}

UpdateWorker::~UpdateWorker() {
  if (in_flight_) wait_until(jobs_.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void UpdateWorker::start(std::vector<Job> jobs) {
  if (in_flight_) internal_error("UpdateWorker::start with a step in flight");
  if (jobs.empty()) return;
  jobs_ = std::move(jobs);
  taken_ = 0;
  for (size_t i = 0; i < jobs_.size(); ++i) position_[jobs_[i].chunk] = static_cast<int64_t>(i);
  job_state_ = std::make_unique<std::atomic<uint8_t>[]>(jobs_.size());
  for (size_t i = 0; i < jobs_.size(); ++i) job_state_[i].store(kJobPending, std::memory_order_relaxed);
  after_.assign(jobs_.size(), {});
  in_flight_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    completed_.store(0, std::memory_order_relaxed);
    failure_ = nullptr;
    has_work_ = true;
  }
  work_cv_.notify_one();
}

void UpdateWorker::run() {
  for (;;) {
    SpecEntry* speculative = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return has_work_ || stop_ || (!spec_closed_ && spec_queued_ > 0); });
      if (stop_) return;
      if (has_work_) {
        has_work_ = false;
      } else {
        // The queued job of least priority, the earliest handed over among
        // equals (a scan: at most one job per chunk is queued).
        for (SpecEntry& e : spec_jobs_) {
          if (e.status != SpecStatus::kQueued) continue;
          if (speculative == nullptr || e.job.priority < speculative->job.priority) speculative = &e;
        }
        speculative->status = SpecStatus::kRunning;
        --spec_queued_;
        spec_running_ = true;
      }
    }
    if (speculative != nullptr) {
      run_speculative(*speculative);
      continue;
    }
    // jobs_ is not touched by the engine's thread until the last job is
    // published (finish() runs after completed_ reaches the end).  The
    // last job is published after the sequence returns (see RunSequence).
    const size_t n = jobs_.size();
    auto run_one = [&](size_t i) {
      const auto t0 = std::chrono::steady_clock::now();
      struct Busy {
        UpdateWorker* w;
        std::chrono::steady_clock::time_point t0;
        ~Busy() {
          w->busy_seconds_.store(w->busy_seconds_.load(std::memory_order_relaxed) + seconds_since(t0),
                                 std::memory_order_relaxed);
        }
      } busy{this, t0};
      run_job_(jobs_[i]);
      uint8_t pending = kJobPending;
      if (!job_state_[i].compare_exchange_strong(pending, kJobRan, std::memory_order_acq_rel)) {
        after_[i]();  // followed before the update finished
      }
      if (i + 1 == n) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        completed_.store(i + 1, std::memory_order_release);
      }
      done_cv_.notify_all();
    };
    std::exception_ptr failure;
    try {
      if (run_sequence_) {
        run_sequence_(jobs_, run_one);
      } else {
        for (size_t i = 0; i < n; ++i) run_one(i);
      }
    } catch (...) {
      failure = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failure) failure_ = failure;
      completed_.store(n, std::memory_order_release);
    }
    done_cv_.notify_all();
  }
}

void UpdateWorker::run_speculative(SpecEntry& entry) {
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  try {
    run_job_(entry.job);
  } catch (...) {
    ok = false;  // the step recomputes this chunk in place
  }
  busy_seconds_.store(busy_seconds_.load(std::memory_order_relaxed) + seconds_since(t0), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    spec_running_ = false;
    entry.status = ok ? SpecStatus::kDone : SpecStatus::kFailed;
    if (!ok) spec_closed_ = true;  // no further one starts
  }
  done_cv_.notify_all();
}

void UpdateWorker::speculate(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    spec_jobs_.push_back(SpecEntry{std::move(job), SpecStatus::kQueued});
    ++spec_queued_;
  }
  work_cv_.notify_one();
}

std::vector<bool> UpdateWorker::end_speculation() {
  std::unique_lock<std::mutex> lock(mu_);
  spec_closed_ = true;
  done_cv_.wait(lock, [&] { return !spec_running_; });
  std::vector<bool> done(spec_jobs_.size());
  for (size_t i = 0; i < spec_jobs_.size(); ++i) done[i] = spec_jobs_[i].status == SpecStatus::kDone;
  spec_jobs_.clear();
  spec_queued_ = 0;
  spec_closed_ = false;
  return done;
}

int64_t UpdateWorker::followable(uint32_t k) const {
  if (!in_flight_) return -1;
  const int64_t pos = position_[k];
  if (pos < static_cast<int64_t>(taken_)) return -1;  // none, or done and taken
  return job_state_[static_cast<size_t>(pos)].load(std::memory_order_acquire) == kJobPending ? pos : -1;
}

bool UpdateWorker::can_follow(uint32_t k) const { return followable(k) >= 0; }

bool UpdateWorker::follow(uint32_t k, std::function<void()> after) {
  const int64_t pos = followable(k);
  if (pos < 0) return false;
  const size_t i = static_cast<size_t>(pos);
  after_[i] = std::move(after);
  uint8_t pending = kJobPending;
  if (job_state_[i].compare_exchange_strong(pending, kJobFollowed, std::memory_order_acq_rel)) return true;
  after_[i] = nullptr;  // the update finished first: the worker does not read it
  return false;
}

double UpdateWorker::wait_until(size_t count) {
  if (completed_.load(std::memory_order_acquire) >= count) return 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return completed_.load(std::memory_order_acquire) >= count; });
  return seconds_since(t0);
}

double UpdateWorker::wait_for(uint32_t k) {
  if (!in_flight_) return 0.0;
  const int64_t pos = position_[k];
  if (pos < static_cast<int64_t>(taken_)) return 0.0;  // none, or done and taken
  return wait_until(static_cast<size_t>(pos) + 1);
}

double UpdateWorker::wait_all() {
  if (!in_flight_) return 0.0;
  return wait_until(jobs_.size());
}

void UpdateWorker::finish() {
  for (const Job& job : jobs_) position_[job.chunk] = -1;
  jobs_.clear();
  after_.clear();
  job_state_.reset();
  taken_ = 0;
  in_flight_ = false;
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_) error_ = failure_;
  failure_ = nullptr;
}

}  // namespace pstar::step
