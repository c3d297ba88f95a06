#include "comm/request.h"

#include "base/check.h"

namespace lbcc::comm {

bool Request::Test() const {
  MutexLock lock(&mu_);
  return done_;
}

absl::Status Request::Wait() const {
  MutexLock lock(&mu_);
  while (!done_) cv_.Wait(&mu_);
  return status_;
}

absl::Status Request::WaitFor(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  while (!done_) {
    if (cv_.WaitWithDeadline(&mu_, deadline) && !done_) {
      return absl::DeadlineExceededError("request still running");
    }
  }
  return status_;
}

absl::Status Request::status() const {
  MutexLock lock(&mu_);
  if (!done_) return absl::FailedPreconditionError("request still running");
  return status_;
}

void Request::Complete(absl::Status status) {
  MutexLock lock(&mu_);
  LBCC_CHECK(!done_) << "request completed twice";
  done_ = true;
  status_ = std::move(status);
  cv_.SignalAll();
}

bool Request::RejectedAtPost() const { return rejected_at_post_; }

RequestPtr CompletedRequest(absl::Status status) {
  auto request = std::make_shared<Request>();
  request->rejected_at_post_ = !status.ok();
  request->Complete(std::move(status));
  return request;
}

}  // namespace lbcc::comm
