#include "comm/elastic/background.h"

#include <cstdlib>
#include <thread>
#include <utility>

#include "base/logging.h"
#include "base/mutex.h"
#include "comm/fabric.h"

namespace lbcc::comm::elastic {
namespace {

// The count of running background threads, and exit()'s wait for it to reach zero.
class Running {
 public:
  static Running& Get() {
    static Running* running = new Running();  // Never destroyed: used at exit.
    return *running;
  }

  void Add() {
    MutexLock lock(&mu_);
    ++running_;
    if (!at_exit_) {
      at_exit_ = true;
      std::atexit([] { Get().AwaitAll(); });
    }
  }

  void Done() {
    MutexLock lock(&mu_);
    --running_;
  }

  bool AwaitIdle(absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; }, timeout);
  }

 private:
  void AwaitAll() {
    MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; },
                              Background::kExitWait)) {
      LBCC_LOG(WARN) << "ElasticGroup: exiting with " << running_
                     << " set-up or close thread(s) still running after "
                     << absl::FormatDuration(Background::kExitWait);
    }
  }

  Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool at_exit_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

void Background::Start(std::function<void()> fn) {
  Running::Get().Add();
  std::thread([fn = std::move(fn)]() mutable {
    {
      std::function<void()> run = std::move(fn);
      run();
    }
    Running::Get().Done();
  }).detach();
}

bool Background::AwaitIdle(absl::Duration timeout) { return Running::Get().AwaitIdle(timeout); }

std::shared_ptr<Communicator> Adopt(std::unique_ptr<Communicator> comm) {
  return std::shared_ptr<Communicator>(comm.release(), [](Communicator* c) {
    Background::Start([c] { delete c; });
  });
}

void AbortSoon(std::shared_ptr<Communicator> comm, bool control) {
  Background::Start([comm = std::move(comm), control] {
    const absl::Status why =
        absl::CancelledError("communicator aborted: its elastic epoch was superseded");
    if (control) {
      comm->fabric()->AbortWithControl(why);
    } else {
      comm->fabric()->Abort(why);
    }
  });
}

}  // namespace lbcc::comm::elastic
