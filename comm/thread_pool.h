// ThreadPool: a fixed set of threads that run submitted jobs in order of submission. A
// Communicator owns one (created with it, sized once, joined when it is destroyed), so no
// operation starts a thread of its own: SparseAllReduce's exchange phase runs on it.
//
// A job may block (on transport completions, on a deadline), but never on another job of the
// same pool: with N threads, N blocking jobs stall the pool.
//
// ThreadsStarted() counts every thread any ThreadPool started in this process, so that tests
// can assert that an operation starts none.
//
// Thread-safety: Submit() may be called from any thread. The destructor runs every job already
// submitted, then joins; it must not run on one of the pool's threads.
#ifndef LBCC_COMM_THREAD_POOL_H_
#define LBCC_COMM_THREAD_POOL_H_

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "base/mutex.h"

namespace lbcc::comm {

class ThreadPool {
 public:
  // Starts `threads` (>= 1) threads named `name` (first 15 characters, for debuggers).
  ThreadPool(int threads, std::string name);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs `job` on one of the threads, after the jobs submitted before it have started.
  void Submit(absl::AnyInvocable<void()> job);

  int size() const { return static_cast<int>(threads_.size()); }

  // Threads started by every ThreadPool of the process so far.
  static uint64_t ThreadsStarted();

 private:
  void Loop();

  Mutex mu_;
  CondVar cv_;
  std::deque<absl::AnyInvocable<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace lbcc::comm

#endif  // LBCC_COMM_THREAD_POOL_H_
