// Threads an elastic member starts and never joins: an epoch's communicator set-up, and the
// abort or destruction of a superseded epoch's communicator.
//
// exit() waits for them, up to Background::kExitWait, before the libraries' finalizers run
// (atexit handlers run first), so that none of them is inside UCX, OpenSSL or BLAS while those
// tear down: members that return from main right after Leave() or Destroy() otherwise abort
// there (SIGSEGV/SIGABRT in UCX's async thread or in ucp_worker_create).
//
// Thread-safety: every function may be called from any thread.
#ifndef LBCC_COMM_ELASTIC_BACKGROUND_H_
#define LBCC_COMM_ELASTIC_BACKGROUND_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "comm/communicator.h"

namespace lbcc::comm::elastic {

class Background {
 public:
  static constexpr absl::Duration kExitWait = absl::Seconds(10);

  // Runs `fn` on a detached thread that exit() waits for. What `fn` holds is released before
  // the thread counts as done (releasing a communicator may start another such thread).
  static void Start(std::function<void()> fn);
  // Waits up to `timeout` until no such thread runs; false at the timeout (tests: a superseded
  // epoch's set-up must not linger).
  static bool AwaitIdle(absl::Duration timeout);
};

// An epoch's communicator, destroyed on a background thread by whoever drops it last: closing
// its connections lingers for the peers' goodbyes on the control connections until the last
// operation's agreement window ends (up to the set-up timeout), and peers that keep theirs (a
// derived epoch) or are gone never say it.
std::shared_ptr<Communicator> Adopt(std::unique_ptr<Communicator> comm);

// Aborts `comm` on a background thread: closing endpoints to a dead peer can take the
// transport's timeout, and the member's reader of the master must keep reading meanwhile. With
// `control`, its control connections close too (Fabric::AbortWithControl): the master decides
// the epoch's outcomes, and a peer inside an operation this member never runs would otherwise
// wait in the communicator's outcome agreement for its vote (up to 10 s) before its retry.
void AbortSoon(std::shared_ptr<Communicator> comm, bool control);

}  // namespace lbcc::comm::elastic

#endif  // LBCC_COMM_ELASTIC_BACKGROUND_H_
