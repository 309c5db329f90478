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

UpdateWorker::UpdateWorker(RunJob run_job, uint32_t chunks) : run_job_(std::move(run_job)), position_(chunks, -1) {
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
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return has_work_ || stop_; });
      if (stop_) return;
      has_work_ = false;
    }
    // jobs_ is not touched by the engine's thread until the last job is
    // published (finish() runs after completed_ reaches the end).
    const size_t n = jobs_.size();
    for (size_t i = 0; i < n; ++i) {
      const Job& job = jobs_[i];
      const auto t0 = std::chrono::steady_clock::now();
      std::exception_ptr failure;
      try {
        run_job_(job);
      } catch (...) {
        failure = std::current_exception();
      }
      busy_seconds_.store(busy_seconds_.load(std::memory_order_relaxed) + seconds_since(t0), std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failure) failure_ = failure;
        completed_.store(failure ? n : i + 1, std::memory_order_release);
      }
      done_cv_.notify_all();
      if (failure) break;
    }
  }
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
  taken_ = 0;
  in_flight_ = false;
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_) error_ = failure_;
  failure_ = nullptr;
}

}  // namespace pstar::step
