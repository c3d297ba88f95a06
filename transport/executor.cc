#include "transport/executor.h"

#include <pthread.h>

#include <deque>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"

namespace lbcc::transport {

struct Executor::State {
  Mutex mu;
  std::deque<absl::AnyInvocable<void()>> tasks ABSL_GUARDED_BY(mu);
  std::multimap<absl::Time, absl::AnyInvocable<void()>> timers ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  uint64_t timer_generation ABSL_GUARDED_BY(mu) = 0;  // Bumped by PostAt: re-check the deadline.
  std::thread::id thread_id;  // Written before the thread starts running tasks.

  void Run() {
    while (true) {
      absl::AnyInvocable<void()> task;
      {
        MutexLock lock(&mu);
        while (true) {
          if (!tasks.empty()) break;
          if (stopping) return;
          const absl::Time now = absl::Now();
          if (!timers.empty() && timers.begin()->first <= now) break;
          const absl::Time wake = timers.empty() ? absl::InfiniteFuture() : timers.begin()->first;
          const uint64_t generation = timer_generation;
          auto ready = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
            return !tasks.empty() || stopping || timer_generation != generation;
          };
          mu.AwaitWithDeadline(ready, wake);
        }
        if (!tasks.empty()) {
          task = std::move(tasks.front());
          tasks.pop_front();
        } else {
          task = std::move(timers.begin()->second);
          timers.erase(timers.begin());
        }
      }
      task();
    }
  }
};

Executor::Executor(std::string name) : state_(std::make_shared<State>()) {
  std::shared_ptr<State> state = state_;
  thread_ = std::thread([state] { state->Run(); });
  state_->thread_id = thread_.get_id();
  pthread_setname_np(thread_.native_handle(), name.substr(0, 15).c_str());
}

Executor::~Executor() {
  {
    MutexLock lock(&state_->mu);
    state_->stopping = true;
    state_->timers.clear();
  }
  if (std::this_thread::get_id() == thread_.get_id()) {
    thread_.detach();  // The thread holds the state and drains the queue on its own.
  } else {
    thread_.join();
  }
}

void Executor::Post(absl::AnyInvocable<void()> task) {
  MutexLock lock(&state_->mu);
  state_->tasks.push_back(std::move(task));
}

void Executor::PostAt(absl::Time when, absl::AnyInvocable<void()> task) {
  MutexLock lock(&state_->mu);
  if (state_->stopping) return;
  state_->timers.emplace(when, std::move(task));
  ++state_->timer_generation;
}

bool Executor::InExecutorThread() const {
  return std::this_thread::get_id() == state_->thread_id;
}

}  // namespace lbcc::transport
