// Executor: one thread that runs posted tasks in order, plus timers. Completion callbacks of a
// Transport run here, which is how they never run inside the call that started the operation.
//
// Tasks posted with Post() always run, also at shutdown: the destructor runs everything queued
// (including tasks those tasks post) before the thread exits. Timers (PostAt) are for internal
// wake-ups such as pacing and are dropped at shutdown.
//
// Thread-safety: every method is thread-safe. The executor may be destroyed from its own thread
// (the last reference dropped inside a task): the thread then finishes the queue and exits alone.
#ifndef LBCC_TRANSPORT_EXECUTOR_H_
#define LBCC_TRANSPORT_EXECUTOR_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace lbcc::transport {

class Executor {
 public:
  explicit Executor(std::string name);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs `task` on the executor thread after every task posted before it.
  void Post(absl::AnyInvocable<void()> task);
  // Runs `task` on the executor thread at or after `when`, unless the executor shuts down first.
  void PostAt(absl::Time when, absl::AnyInvocable<void()> task);
  // True when called from the executor thread.
  bool InExecutorThread() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_EXECUTOR_H_
