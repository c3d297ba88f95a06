// Mutex, MutexLock and CondVar for LBCC code: the shape of absl::Mutex's API over std::mutex.
//
// Why not absl::Mutex: Debian's Abseil is a prebuilt shared library compiled without
// ThreadSanitizer, so TSan cannot see its synchronisation and reports races that are not there
// (and would miss real ones). std::mutex goes through pthread, which TSan understands. The
// Abseil thread-safety annotations still apply (ABSL_GUARDED_BY(mu_) on members).
//
//   lbcc::Mutex mu_;
//   int value_ ABSL_GUARDED_BY(mu_);
//   { lbcc::MutexLock lock(&mu_); value_ = 1; cv_.SignalAll(); }
//   { lbcc::MutexLock lock(&mu_); while (value_ == 0) cv_.Wait(&mu_); }
//   { lbcc::MutexLock lock(&mu_); mu_.Await([&] { return value_ != 0; }); }   // absl-style
//
// Thread-safety: these are the synchronisation primitives.
#ifndef LBCC_BASE_MUTEX_H_
#define LBCC_BASE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace lbcc {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    // Await()ers re-check their condition after every unlock. Notify before unlocking: a waiter
    // that returns may destroy the mutex right after.
    if (waiters_ > 0) await_cv_.notify_all();
    mu_.unlock();
  }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // Documents (does not check) that the caller holds the lock.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // With the mutex held: waits until `ready()` (evaluated with the mutex held) or `deadline`, like
  // absl::Mutex::AwaitWithDeadline. Returns ready(). Every Unlock() elsewhere makes waiters
  // re-check, so no CondVar is needed for conditions on state this mutex guards.
  template <typename Pred>
  bool AwaitWithDeadline(Pred ready, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    ++waiters_;
    while (!ready()) {
      if (deadline == absl::InfiniteFuture()) {
        await_cv_.wait(lock);
      } else if (await_cv_.wait_until(lock, absl::ToChronoTime(deadline)) ==
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
  friend class CondVar;
  std::mutex mu_;
  std::condition_variable await_cv_;
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

class CondVar {
 public:
  // Atomically releases `mu` (held by the caller), waits for a signal, re-acquires `mu`.
  // Spurious wake-ups happen: wait in a loop on the condition.
  void Wait(Mutex* mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait, but returns true if `deadline` passed before a signal.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const absl::Duration left = deadline - absl::Now();
    bool timed_out = true;
    if (left > absl::ZeroDuration()) {
      timed_out = cv_.wait_for(lock, absl::ToChronoNanoseconds(left)) == std::cv_status::timeout;
    }
    lock.release();
    return timed_out;
  }
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
    return WaitWithDeadline(mu, absl::Now() + timeout);
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace lbcc

#endif  // LBCC_BASE_MUTEX_H_
