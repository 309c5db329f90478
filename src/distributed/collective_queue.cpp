#include "distributed/collective_queue.h"

#include <utility>

namespace pstar::distributed {

struct CollectiveQueue::Operation {
  std::function<void()> op;
  bool finished = false;       // guarded by the queue's mu_
  std::exception_ptr failure;  // set before finished
};

CollectiveQueue::CollectiveQueue() : thread_([this] { run(); }) {}

CollectiveQueue::~CollectiveQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CollectiveQueue::Ticket CollectiveQueue::submit(std::function<void()> op) {
  auto t = std::make_shared<Operation>();
  t->op = std::move(op);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(t);
    ++submitted_;
  }
  cv_.notify_one();
  return t;
}

bool CollectiveQueue::done(const Ticket& t) {
  if (t == nullptr) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return t->finished;
}

void CollectiveQueue::wait(const Ticket& t) {
  if (t == nullptr) return;
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return t->finished; });
  if (t->failure != nullptr) std::rethrow_exception(t->failure);
}

void CollectiveQueue::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = submitted_;
  done_cv_.wait(lock, [&] { return finished_ >= target; });
  if (broken_ != nullptr) std::rethrow_exception(broken_);
}

void CollectiveQueue::run() {
  for (;;) {
    Ticket t;
    std::exception_ptr broken;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      t = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_;
    }
    std::exception_ptr failure = broken;
    if (failure == nullptr) {
      try {
        t->op();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    t->op = nullptr;  // release what the closure holds on this thread
    {
      std::lock_guard<std::mutex> lock(mu_);
      t->failure = failure;
      t->finished = true;
      ++finished_;
      if (failure != nullptr && broken_ == nullptr) broken_ = failure;
    }
    done_cv_.notify_all();
  }
}

}  // namespace pstar::distributed
