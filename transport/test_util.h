// Helpers for transport tests: waitable callback results and payload patterns.
#ifndef LBCC_TRANSPORT_TEST_UTIL_H_
#define LBCC_TRANSPORT_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace lbcc::transport::testing {

// Generous: sanitizer builds on a shared 2-core machine are slow. Waits end as soon as the
// callback runs; the bound only turns a hang into a failure.
inline constexpr absl::Duration kWait = absl::Seconds(120);

// The result of one completion callback: the test waits for it, and can check on which thread
// and how often the callback ran.
template <typename T>
class Result {
 public:
  Result() = default;
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;

  absl::AnyInvocable<void(T)> Callback() {
    return [this](T value) {
      MutexLock lock(&mu_);
      if (!value_.has_value()) value_.emplace(std::move(value));
      thread_ = std::this_thread::get_id();
      ++calls_;
    };
  }
  // The value, or DeadlineExceeded (and a test failure) after `timeout`.
  T Wait(absl::Duration timeout = kWait) {
    MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return value_.has_value(); };
    if (!mu_.AwaitWithTimeout(ready, timeout)) {
      ADD_FAILURE() << "callback did not run within " << timeout;
      return T(absl::DeadlineExceededError("test wait"));
    }
    return *value_;
  }
  bool done() {
    MutexLock lock(&mu_);
    return value_.has_value();
  }
  int calls() {
    MutexLock lock(&mu_);
    return calls_;
  }
  std::thread::id thread() {
    MutexLock lock(&mu_);
    return thread_;
  }

 private:
  Mutex mu_;
  std::optional<T> value_ ABSL_GUARDED_BY(mu_);
  std::thread::id thread_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};
using SendResult = Result<absl::Status>;
using RecvResult = Result<absl::StatusOr<size_t>>;

// Bytes that differ between messages and positions: message `id`, byte i.
inline std::vector<uint8_t> Pattern(size_t n, uint64_t id) {
  std::vector<uint8_t> v(n);
  uint64_t x = id * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<uint8_t>(x >> (8 * (i % 8)));
  return v;
}

}  // namespace lbcc::transport::testing

#endif  // LBCC_TRANSPORT_TEST_UTIL_H_
