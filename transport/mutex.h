// Mutex: a std::mutex with Abseil's thread-safety annotations and an Await that re-checks its
// predicate whenever the mutex is released, like absl::Mutex::Await.
//
// Why not absl::Mutex: LBCC links Debian's prebuilt Abseil, which is not built with
// ThreadSanitizer, so TSan cannot see its synchronisation and reports every access it orders as
// a race. std::mutex and std::condition_variable go through pthreads, which TSan intercepts.
//
// Thread-safety: it is a mutex.
#ifndef LBCC_TRANSPORT_MUTEX_H_
#define LBCC_TRANSPORT_MUTEX_H_

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace lbcc::transport {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    // Notify before unlocking: a waiter that returns may destroy the mutex right after.
    if (waiters_ > 0) cv_.notify_all();
    mu_.unlock();
  }

  // With the mutex held: waits until `ready()` (evaluated with the mutex held) or `deadline`.
  // Returns ready(). Every Unlock() by another thread makes waiters re-check.
  template <typename Pred>
  bool AwaitWithDeadline(Pred ready, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    ++waiters_;
    while (!ready()) {
      if (deadline == absl::InfiniteFuture()) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, absl::ToChronoTime(deadline)) ==
                 std::cv_status::timeout) {
        break;
      }
    }
    --waiters_;
    const bool result = ready();
    lock.release();  // Still held by the caller.
    return result;
  }
  template <typename Pred>
  bool AwaitWithTimeout(Pred ready, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    return AwaitWithDeadline(std::move(ready), absl::Now() + timeout);
  }
  template <typename Pred>
  void Await(Pred ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    AwaitWithDeadline(std::move(ready), absl::InfiniteFuture());
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiters_ = 0;  // Guarded by mu_.
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_MUTEX_H_
