#include "comm/thread_pool.h"

#include <pthread.h>

#include <atomic>
#include <utility>

#include "base/check.h"

namespace lbcc::comm {
namespace {

std::atomic<uint64_t> threads_started{0};

}  // namespace

ThreadPool::ThreadPool(int threads, std::string name) {
  LBCC_CHECK(threads >= 1) << "ThreadPool needs a thread, got " << threads;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { Loop(); });
    threads_started.fetch_add(1, std::memory_order_relaxed);
    pthread_setname_np(threads_.back().native_handle(), name.substr(0, 15).c_str());
  }
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  for (std::thread& thread : threads_) thread.join();
}

void ThreadPool::Submit(absl::AnyInvocable<void()> job) {
  MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
  cv_.Signal();
}

uint64_t ThreadPool::ThreadsStarted() { return threads_started.load(std::memory_order_relaxed); }

void ThreadPool::Loop() {
  while (true) {
    absl::AnyInvocable<void()> job;
    {
      MutexLock lock(&mu_);
      while (jobs_.empty() && !stopping_) cv_.Wait(&mu_);
      if (jobs_.empty()) return;  // stopping, and everything submitted has run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace lbcc::comm
