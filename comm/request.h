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

class Request;
using RequestPtr = std::shared_ptr<Request>;

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

  // True when the operation was refused before it was posted (CompletedRequest with an error:
  // bad arguments). A posted operation that fails later, however soon, is not: callers that
  // report argument errors from the posting call itself (the C API) see the same outcome
  // whatever the timing.
  bool RejectedAtPost() const;

 private:
  friend RequestPtr CompletedRequest(absl::Status status);
  bool rejected_at_post_ = false;  // written before the request is shared
  mutable Mutex mu_;
  mutable CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// A request that is already complete with `status` (argument errors found before posting).
RequestPtr CompletedRequest(absl::Status status);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_REQUEST_H_
