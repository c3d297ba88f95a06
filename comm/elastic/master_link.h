// MasterLink: an elastic member's connection to the membership master (the membership client).
//
// Connect() opens the TCP connection and joins (kJoin, answered by kWelcome or kRefuse).
// Start() then runs two threads: a reader that hands every message of the master to its
// Listener, and a heartbeat sender that also watches the master's silence (a member stalled
// itself, by SIGSTOP or swapping, gives the reader a period to take what the master sent
// meanwhile before it judges). Send() may be called from any thread.
//
// Errors: Unavailable (the master cannot be reached or went away), DeadlineExceeded (no answer
// to the join within the set-up timeout), DataLoss (a corrupt or unexpected answer), and the
// master's refusal as it sent it.
//
// Thread-safety: thread-safe. The Listener is called without the link's mutex held; a
// Listener may call Send(), StopHeartbeats() and Shutdown() from its callbacks.
#ifndef LBCC_COMM_ELASTIC_MASTER_LINK_H_
#define LBCC_COMM_ELASTIC_MASTER_LINK_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "comm/elastic/wire.h"

namespace lbcc::comm::elastic {

class MasterLink {
 public:
  class Listener {
   public:
    virtual ~Listener() = default;
    // A message from the master, on the reader thread. False stops the reader.
    virtual bool OnMessage(const Message& message) = 0;
    // The connection ended (`why`: the reader's error), on the reader thread; the reader stops.
    virtual void OnClosed(const absl::Status& why) = 0;
    // The master was silent for the peer timeout, on the heartbeat thread (which stops).
    virtual void OnSilent(absl::Duration silent) = 0;
  };

  // Connects to `address` (retrying until `connect_deadline`), sends `join` and waits up to
  // `answer_timeout` for the answer. *welcome: the master's kWelcome.
  static absl::StatusOr<std::unique_ptr<MasterLink>> Connect(const std::string& address,
                                                             const Message& join,
                                                             absl::Time connect_deadline,
                                                             absl::Duration answer_timeout,
                                                             Message* welcome);
  ~MasterLink();  // Shutdown() and Join()

  // Starts the reader and the heartbeat threads; `listener` must outlive Join().
  void Start(Listener* listener, absl::Duration peer_timeout);
  // Unavailable when the master is gone or not reading before `timeout`.
  absl::Status Send(const Message& message, absl::Duration timeout);
  // Ends the heartbeat thread (the member left or failed); the reader goes on.
  void StopHeartbeats();
  // Wakes the reader (its Receive fails) and makes later sends fail. Idempotent.
  void Shutdown();
  // Joins both threads (after Shutdown, or once the reader ended).
  void Join();
  bool started() const { return reader_.joinable(); }

 private:
  explicit MasterLink(std::unique_ptr<Socket> sock) : sock_(std::move(sock)) {}
  void ReadLoop();
  void HeartbeatLoop();

  const std::unique_ptr<Socket> sock_;
  Listener* listener_ = nullptr;
  absl::Duration peer_timeout_;
  std::thread reader_, heartbeat_;

  Mutex mu_;
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_);
  bool heartbeats_stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace lbcc::comm::elastic

#endif  // LBCC_COMM_ELASTIC_MASTER_LINK_H_
