// The fork-join thread pool; the design is described in thread_pool.h.
#include "util/thread_pool.h"

#include <algorithm>

namespace pstar {

namespace {
// Set while this thread runs a block of some pool: a nested parallel_for
// then runs inline.
thread_local bool t_in_pool_block = false;

struct BlockFlag {
  bool saved;
  BlockFlag() : saved(t_in_pool_block) { t_in_pool_block = true; }
  ~BlockFlag() { t_in_pool_block = saved; }
};
}  // namespace

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  size_ = threads;
  errors_.resize(size_);
  workers_.reserve(size_ - 1);
  try {
    for (unsigned i = 0; i + 1 < size_; ++i) workers_.emplace_back(&ThreadPool::worker_main, this, i);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

std::vector<size_t> ThreadPool::partition(size_t n, size_t grain, unsigned parts) {
  std::vector<size_t> bounds{0};
  if (n == 0) return bounds;
  if (grain == 0) grain = 1;
  if (parts == 0) parts = 1;
  const size_t units = n / grain + (n % grain != 0 ? 1 : 0);
  const size_t p = std::min<size_t>(parts, units);
  const size_t base = units / p;
  const size_t extra = units % p;
  size_t unit = 0;
  for (size_t b = 0; b < p; ++b) {
    unit += base + (b < extra ? 1 : 0);
    bounds.push_back(std::min(n, unit * grain));
  }
  return bounds;
}

void ThreadPool::run_block(unsigned block) {
  BlockFlag flag;
  try {
    (*fn_)(bounds_[block], bounds_[block + 1]);
  } catch (...) {
    errors_[block] = std::current_exception();
  }
}

void ThreadPool::worker_main(unsigned index) {
  const unsigned block = index + 1;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (block >= blocks_) continue;  // no block for this worker this time
    lock.unlock();
    run_block(block);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  if (t_in_pool_block || size_ == 1) {  // nested call, or nothing to share
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  std::vector<size_t> bounds = partition(n, grain, size_);
  const unsigned blocks = static_cast<unsigned>(bounds.size() - 1);
  if (blocks == 1) {
    BlockFlag flag;
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    bounds_ = std::move(bounds);
    blocks_ = blocks;
    pending_ = blocks - 1;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    ++generation_;
  }
  work_cv_.notify_all();
  run_block(0);
  std::exception_ptr first;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
    for (unsigned b = 0; b < blocks; ++b) {
      if (errors_[b]) {
        first = errors_[b];
        break;
      }
    }
    std::fill(errors_.begin(), errors_.end(), nullptr);
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace pstar
