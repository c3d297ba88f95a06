// Request: the handle of a non-blocking communicator operation (NCCL-style init/post/test/wait).
//
// An operation posted on a Communicator returns a Request at once; the work runs on the
// communicator's worker thread. Test() polls, Wait() blocks until the operation finished and
// returns its status. Output buffers and codec states passed to the operation must stay valid
// and untouched until the request is done.
//
// Thread-safety: all methods are thread-safe; any number of threads may Wait on one Request.
#ifndef LBCC_COMM_REQUEST_H_
#define LBCC_COMM_REQUEST_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/mutex.h"

namespace lbcc::comm {

class Request {
 public:
  Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // True once the operation finished (successfully or not).
  bool Test() const;
  // Blocks until the operation finished; returns its status.
  absl::Status Wait() const;
  // As Wait, but gives up after `timeout` with DeadlineExceeded (the operation goes on).
  absl::Status WaitFor(absl::Duration timeout) const;
  // The final status; FailedPrecondition while the operation runs.
  absl::Status status() const;

  // For the communicator: records the outcome and wakes waiters. Call exactly once.
  void Complete(absl::Status status);

 private:
  mutable Mutex mu_;
  mutable CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

using RequestPtr = std::shared_ptr<Request>;

// A request that is already complete with `status` (argument errors found before posting).
RequestPtr CompletedRequest(absl::Status status);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_REQUEST_H_
