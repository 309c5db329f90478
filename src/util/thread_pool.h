// A small fork-join thread pool: the library's own threads for work split
// across a range (the Adam update over a chunk, gradient-norm partials), so
// that no OpenMP runtime is linked in (OpenMP fights the host program's own
// OpenMP runtime for cores and does not survive fork()).
//
// Design:
//  - size() threads take part in each call: size() - 1 workers started by
//    the constructor plus the thread calling parallel_for, which runs the
//    first block itself instead of waiting idle.
//  - parallel_for(n, grain, fn) splits [0, n) into at most size() contiguous
//    blocks.  The range is counted in units of `grain` elements (the last
//    unit may be short); with U = ceil(n / grain) units and
//    P = min(size(), U) blocks, block b gets U / P units, plus one more for
//    b < U % P, in order.  So every block but the last starts and ends on a
//    multiple of `grain` (aligned vectors, cache lines, the fixed blocks of a
//    reduction), and the partition is a pure function of (n, grain, size()):
//    which elements a block holds never depends on timing, so results that
//    depend on the partition are reproducible.  Block 0 runs on the caller,
//    block b > 0 on worker b - 1.
//  - Between calls the workers sleep on a condition variable (no spinning:
//    the pool costs nothing while the program does something else).  A call
//    publishes the job under the mutex and bumps a generation counter; each
//    worker with a block runs it and counts down; the caller returns when
//    the count reaches zero, after its own block.
//  - An exception thrown by fn is caught in the thread that ran the block;
//    parallel_for waits for every block to finish and then rethrows in the
//    caller the exception of the lowest-numbered block that threw (again
//    independent of timing).  The other blocks still run to completion.
//  - Calls from several threads at once are serialized.  A call from inside
//    fn (on any pool thread) runs its whole range inline on that thread, as
//    one block, instead of deadlocking.
//  - The destructor wakes the workers and joins them.  A pool must not be
//    used in the child of a fork() (the child has none of the workers); make
//    a new one there.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pstar {

class ThreadPool {
 public:
  // `threads`: how many threads take part in each call, the caller
  // included; 0 means std::thread::hardware_concurrency() (1 if unknown).
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return size_; }

  // Calls fn(begin, end) once per block of the partition described above
  // and returns when all blocks are done.  n == 0 calls nothing; grain 0 is
  // taken as 1.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t begin, size_t end)>& fn);

  // The block boundaries parallel_for uses for (n, grain) with `parts`
  // threads: blocks() + 1 ascending offsets from 0 to n (just {0} for n == 0).
  static std::vector<size_t> partition(size_t n, size_t grain, unsigned parts);

 private:
  void worker_main(unsigned index);
  void run_block(unsigned block);

  unsigned size_ = 1;
  std::vector<std::thread> workers_;

  std::mutex call_mu_;  // one parallel_for at a time

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  // The job of the current generation (valid while pending_ > 0).
  const std::function<void(size_t, size_t)>* fn_ = nullptr;
  std::vector<size_t> bounds_;
  unsigned blocks_ = 0;
  unsigned pending_ = 0;
  std::vector<std::exception_ptr> errors_;  // per block
};

}  // namespace pstar
