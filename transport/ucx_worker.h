// Internal to transport/: the UCP context and worker that every UCX transport of a process shares
// (one per set of UCX settings), with its progress thread and command queue.
//
// Why one: UCX 1.13 (Debian 12's) hands an fd event that its async thread queued for a busy worker
// to whatever handler holds that fd number when the queue is drained; after a transport closed the
// fd and another worker of the process registered the number again, that handler belongs to
// another async context and UCX aborts the process (async.c: Assertion `handler->async == async`;
// fixed upstream by openucx/ucx pull request 9942, after 1.13). With one worker per process every
// handler belongs to the one async context. It also spares each new transport (an elastic epoch's)
// a UCP context and worker of its own, which kept growing a member's memory under churn.
//
// Engines (transport/ucx_engine.h, WorkerClients here) register with the worker and keep their own endpoints,
// listener, links and requests; the worker dispatches what UCX delivers (active messages,
// endpoint errors) to the engine whose endpoint it came on. The worker is made at first use and
// lives as long as the process. At exit (a handler registered when the first worker is made, so it
// runs before the dynamic linker finalizes UCX) a worker no engine uses stops its thread and
// releases UCX's objects; one still in use is released when its last engine shuts down (an
// elastic group's exit wait destroys transports after that handler).
//
// Locks: mu() is the worker lock every UCP call needs ("worker context"), taken by the progress
// thread, by a calling thread that queued work (Kick) and by set-up calls (Engine::OnWorker).
// cmd_mu_ guards the command queue only. Lock order: an engine's own locks are never held while
// taking mu(), except Engine::cmd_mu_ -> Worker::cmd_mu_ (Engine::Submit).
#ifndef LBCC_TRANSPORT_UCX_WORKER_H_
#define LBCC_TRANSPORT_UCX_WORKER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "transport/options.h"
#include "transport/ucx_api.h"

namespace lbcc::transport::ucx_internal {

class UcxLane;

// A UCX status as LBCC's: OK, Cancelled, else Unavailable "<what>: <UCX's words>".
absl::Status FromUcs(ucs_status_t status, absl::string_view what);

// What the worker needs of each transport that uses it (transport/ucx_engine.h's Engine); every
// call in worker context.
class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  // Frees the endpoint closes that finished; how many.
  virtual int ReapClosesLocked() = 0;
  // One round of the peer watch when it is due.
  virtual void WatchPeersIfDueLocked(absl::Time now) = 0;
  // The open lane of endpoint `ep`, if it is this client's.
  virtual std::shared_ptr<UcxLane> LaneForEp(ucp_ep_h ep) = 0;
};

// UCX's active-message callbacks for LBCC's two message ids; their arg is the Worker.
struct AmHandlers {
  ucp_am_recv_callback_t data = nullptr;
  ucp_am_recv_callback_t control = nullptr;
};

class Worker {
 public:
  using Command = absl::AnyInvocable<void()>;

  // The process's worker for `options`' UCX settings (tls, devices, address family, keepalive,
  // progress spin), made at first use.
  static absl::StatusOr<std::shared_ptr<Worker>> Acquire(const TransportOptions& options,
                                                         AmHandlers handlers);

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Null once the process is exiting (ReleaseIdle); read in worker context.
  ucp_worker_h handle() const { return worker_; }
  Mutex& mu() { return mu_; }

  // Whether this thread holds the worker lock (worker context).
  bool HeldHere() const;
  // Marks this thread as holding the worker lock, or as no longer holding it.
  void SetHeldHere(bool held);

  // Worker context.
  void Register(WorkerClient* client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unregister(WorkerClient* client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs queued commands and progresses UCX until nothing is left (bounded rounds).
  int RunLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const std::vector<WorkerClient*>& engines() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return engines_;
  }
  // The open lane of `ep` and its client, among the registered clients; null if none has it.
  std::shared_ptr<UcxLane> LaneFor(ucp_ep_h ep, WorkerClient** client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Any thread: queues `command` for worker context and wakes the progress thread unless this
  // thread holds the lock (it drains the queue before releasing it).
  void Push(Command command);
  // Runs queued work and progress on the calling thread if the lock is free.
  void Kick();

  // After an engine unregistered, outside worker context: once the process is exiting, the
  // workers no engine uses any more are released.
  static void ReleaseIfExiting();

 private:
  // The workers no engine uses stop their threads and release UCX's objects (process exit).
  static void ReleaseIdle();

  explicit Worker(absl::Duration progress_spin) : progress_spin_(progress_spin) {}
  absl::Status Init(const TransportOptions& options, AmHandlers handlers);
  void ProgressLoop();
  void Wake();
  int DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int ProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the progress thread and releases UCX's objects (no engine registered).
  void Release();

  const absl::Duration progress_spin_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_efd_ = -1;
  int event_fd_ = -1;
  int epoll_fd_ = -1;

  Mutex mu_;
  std::vector<WorkerClient*> engines_ ABSL_GUARDED_BY(mu_);

  Mutex cmd_mu_;
  std::vector<Command> commands_ ABSL_GUARDED_BY(cmd_mu_);

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace lbcc::transport::ucx_internal

#endif  // LBCC_TRANSPORT_UCX_WORKER_H_
