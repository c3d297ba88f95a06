// Internal to transport/: the UCX backend's objects, shared by its files (ucx_transport.h is the
// public face). One Engine per Transport owns its endpoints, listener, links and requests on the
// process's shared UCP worker (transport/ucx_worker.h); its work is split by concern across files,
// all of them methods of this one class:
//
//   ucx_engine.cc     creation, the command queue's entry, request bookkeeping, the peer watch,
//                     shutdown;
//   ucx_lanes.cc      UcxLane (one UCP endpoint: a Link's Lane), sending chunks and control
//                     messages, receiving them (active-message handlers, rendezvous fetches),
//                     closing endpoints and endpoint errors;
//   ucx_connect.cc    Listen, Connect (client set-up steps), Accept, and the server's side of the
//                     set-up (connection requests, HELLO admission, READY);
//   ucx_transport.cc  the Transport over an Engine, and NewUcxTransport().
//
// Contexts and locks. "Worker context": under the shared worker's lock (worker_mu_), which every
// UCP call needs; taken by the worker's progress thread, by a calling thread that queued work
// (Kick) and by set-up calls (OnWorker). Work for the worker from other threads goes through
// Submit(). ctl_mu_ guards the links (conns_, accept queue, set-ups in progress); lock order
// worker_mu_ -> ctl_mu_ -> LinkSetup / Link, and no UCX call is made with ctl_mu_ held (UCX calls
// OnEpError with its own locks held, and that takes ctl_mu_). cmd_mu_ guards stopped_ only.
#ifndef LBCC_TRANSPORT_UCX_ENGINE_H_
#define LBCC_TRANSPORT_UCX_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "transport/executor.h"
#include "transport/lane.h"
#include "transport/link.h"
#include "transport/link_setup.h"
#include "transport/netif.h"
#include "transport/options.h"
#include "transport/transport.h"
#include "transport/ucx_api.h"  // <ucp/api/ucp.h>, and routes ucp_*() calls to LBCC's own UCX.
#include "transport/ucx_worker.h"

namespace lbcc::transport::ucx_internal {

class Engine;
class UcxLane;

// One link being set up or running: its Link, its set-up and its connections.
struct Conn {
  uint64_t id = 0;
  bool client = false;
  std::string peer;  // Address string.
  std::shared_ptr<Link> link;
  std::unique_ptr<LinkSetup> setup;  // Thread-safe; set before the Conn is shared.
  // Guarded by Engine::ctl_mu_.
  std::map<int, std::shared_ptr<UcxLane>> lanes;  // Server: connections by lane index.
  int lanes_added = 0;                            // Server: lanes handed to the Link, in order.
  // Silent-peer watchdog; worker context only (not ctl_mu_).
  PeerWatch watch;
};

// Runs `done` of a request exactly once with the status UCX gives it.
struct RequestCtx {
  Engine* engine = nullptr;  // Alive until UCX completes the request (Engine::Shutdown).
  std::shared_ptr<UcxLane> lane;        // Keeps the lane (and its endpoint bookkeeping) alive.
  ChunkHeader chunk_header{};           // UCX reads the header until the send completes.
  ControlHeader control_header{};
  std::shared_ptr<std::vector<uint8_t>> payload;  // Owned payload (probe data).
  bool eager = false;                   // A send forced to UCX's eager protocol.
  DoneCallback done;
};

class Engine final : public WorkerClient, public std::enable_shared_from_this<Engine> {
 public:
  using Command = absl::AnyInvocable<void(bool live)>;

  // ---- ucx_engine.cc
  static absl::StatusOr<std::shared_ptr<Engine>> Create(const TransportOptions& options);
  ~Engine() override;

  void Shutdown();

  // Queues `command` to run under the worker lock with live = true, on the progress thread or a
  // calling thread. After shutdown it runs with live = false on the callback thread instead.
  void Submit(Command command);
  // Tries to run queued work and progress on the calling thread.
  void Kick() { shared_->Kick(); }

  ucp_worker_h worker() const { return worker_; }  // Under the worker lock only; null once shut down.
  const std::shared_ptr<Executor>& executor() const { return executor_; }

  // A request's context goes to StartRequest with what UCX returned; a UCX callback of a request
  // that was in flight calls CompleteRequest. Either runs ctx->done once and frees ctx.
  void StartRequest(void* status_ptr, RequestCtx* ctx, absl::string_view what);
  void CompleteRequest(RequestCtx* ctx, ucs_status_t status, absl::string_view what);

  // ---- WorkerClient: the shared worker's calls, in worker context.
  int ReapClosesLocked() override;
  // Every running link's PeerWatch (transport/link_setup.h): heartbeats, and failing links whose
  // peer has been silent for the peer timeout while work was pending.
  void WatchPeersIfDueLocked(absl::Time now) override;
  std::shared_ptr<UcxLane> LaneForEp(ucp_ep_h ep) override;
  // UCX's active-message and endpoint-error callbacks (arg: the Worker).
  static ucs_status_t OnAmData(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnAmControl(void* arg, const void* header, size_t header_length,
                                  void* data, size_t length, const ucp_am_recv_param_t* param);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);

  // ---- ucx_connect.cc (user threads)
  absl::StatusOr<std::string> Listen(absl::string_view address);
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                    absl::Duration timeout,
                                                    ConnectOptions options);
  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(absl::Duration timeout);

  // User threads (set-up): queues `message` on `lane` and progresses.
  void SendControlFromUser(const std::shared_ptr<UcxLane>& lane, ControlMessage message);

  // ---- ucx_lanes.cc: worker context (lock held).
  void SendControl(const std::shared_ptr<UcxLane>& lane, ControlHeader header,
                   std::shared_ptr<std::vector<uint8_t>> payload, DoneCallback done);
  void SendChunk(const std::shared_ptr<UcxLane>& lane, const ChunkHeader& header,
                 const uint8_t* data, size_t length, DoneCallback done);
  void CloseLane(const std::shared_ptr<UcxLane>& lane);
  // The peer of `lane` is alive (it sent something, or a transfer from it completed).
  void HeardFrom(const UcxLane& lane);

 private:
  // ---- ucx_engine.cc
  Engine(const TransportOptions& options, std::shared_ptr<Executor> executor,
         std::shared_ptr<Worker> shared);
  void WatchPeersLocked();
  void MarkRunningLocked(const std::shared_ptr<Conn>& conn);
  void FinishRequest(RequestCtx* ctx, ucs_status_t status, absl::string_view what);
  // Locks the worker (blocking) and runs `fn` in worker context: for set-up calls from user
  // threads, never from callbacks.
  template <typename Fn>
  auto OnWorker(Fn fn);

  // ---- ucx_lanes.cc: worker context.
  // Credits and heartbeats to the Link; set-up messages to HandleSetup.
  void HandleControl(const std::shared_ptr<UcxLane>& lane, const ControlHeader& header);

  // ---- ucx_connect.cc
  // Worker context.
  static void OnConnRequest(ucp_conn_request_h request, void* arg);
  // A set-up message: the link's LinkSetup answers (admits or refuses a connection, replies,
  // configures the server's Link at READY).
  void HandleSetup(const std::shared_ptr<UcxLane>& lane, const ControlHeader& header);
  // HELLO: the server's Conn for the connection's link (made at the first HELLO); null while
  // shutting down or for a bad lane index.
  std::shared_ptr<Conn> ServerConnLocked(const std::shared_ptr<UcxLane>& lane,
                                         const ControlHeader& hello)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctl_mu_);
  // A connection the link's set-up admitted joins the link (lanes reach the Link in order).
  void AttachLaneLocked(const std::shared_ptr<Conn>& conn, const std::shared_ptr<UcxLane>& lane,
                        int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctl_mu_);

  // Whether numeric `address` ("host:port", "[v6]:port" or a bare host) belongs to another
  // machine: neither loopback nor one of this machine's interface addresses (listed at Init).
  bool OnOtherMachine(const std::string& address) const;

  // Client set-up helpers (user thread).
  std::shared_ptr<UcxLane> OpenLane(const std::shared_ptr<Conn>& conn, int index,
                                    const SocketAddress& addr);

  const TransportOptions options_;
  const std::shared_ptr<Executor> executor_;
  std::vector<std::string> local_addresses_;  // Set in Create, then read only.

  const std::shared_ptr<Worker> shared_;
  Mutex& worker_mu_;  // shared_->mu().
  ucp_worker_h worker_ = nullptr;  // shared_'s, from registration until shutdown.

  absl::flat_hash_map<ucp_ep_h, std::shared_ptr<UcxLane>> eps_ ABSL_GUARDED_BY(worker_mu_);
  std::vector<void*> closing_ ABSL_GUARDED_BY(worker_mu_);  // ep close requests.
  WatchClock watch_clock_ ABSL_GUARDED_BY(worker_mu_);
  int64_t outstanding_ ABSL_GUARDED_BY(worker_mu_) = 0;     // Requests awaiting callbacks.
  ucp_listener_h listener_ ABSL_GUARDED_BY(worker_mu_) = nullptr;
  ProbeScratch probe_scratch_;  // Thread-safe.

  Mutex cmd_mu_;
  bool stopped_ ABSL_GUARDED_BY(cmd_mu_) = false;  // Commands go to the callback thread.

  Mutex ctl_mu_;
  // Links by (connection id, client side). The side is part of the key: a transport that
  // connects to its own listener holds both ends of one link, which share the client's id.
  absl::flat_hash_map<std::pair<uint64_t, bool>, std::shared_ptr<Conn>> conns_
      ABSL_GUARDED_BY(ctl_mu_);
  std::deque<std::shared_ptr<Conn>> accept_queue_ ABSL_GUARDED_BY(ctl_mu_);
  // Client set-ups in progress (Connect), cancelled by Shutdown even after their Conn left
  // conns_ (a refused connection that is being retried).
  absl::flat_hash_map<LinkSetup*, std::shared_ptr<Conn>> connecting_ ABSL_GUARDED_BY(ctl_mu_);
  bool listening_ ABSL_GUARDED_BY(ctl_mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(ctl_mu_) = false;
  std::mt19937_64 random_ ABSL_GUARDED_BY(ctl_mu_){std::random_device{}()};
};

template <typename Fn>
auto Engine::OnWorker(Fn fn) {
  MutexLock lock(&worker_mu_);
  shared_->SetHeldHere(true);
  auto result = fn();
  shared_->RunLocked();
  shared_->SetHeldHere(false);
  return result;
}

// One UCP endpoint. Its fields are touched in worker context only, except the immutable ones.
class UcxLane final : public Lane, public std::enable_shared_from_this<UcxLane> {
 public:
  UcxLane(std::weak_ptr<Engine> engine, std::shared_ptr<Executor> executor, std::string peer)
      : engine_(std::move(engine)), executor_(std::move(executor)), peer_(std::move(peer)) {}

  void SendChunk(const ChunkHeader& header, const uint8_t* data, size_t length,
                 DoneCallback done) override {
    Submit([self = shared_from_this(), header, data, length,
            done = std::move(done)](Engine* engine) mutable {
      if (engine == nullptr) {
        done(absl::CancelledError("transport shut down"));
        return;
      }
      engine->SendChunk(self, header, data, length, std::move(done));
    });
  }

  void SendCredit(uint64_t bytes, uint8_t priority) override {
    Submit([self = shared_from_this(), bytes, priority](Engine* engine) {
      if (engine == nullptr) return;
      ControlHeader header{};
      header.type = static_cast<uint32_t>(Ctl::kCredit);
      header.a = bytes;
      header.b = priority;
      if (std::shared_ptr<Link> link = self->link.lock()) link->SealControl(self->index, &header);
      engine->SendControl(self, header, nullptr, nullptr);
    });
  }

  void Close() override {
    Submit([self = shared_from_this()](Engine* engine) {
      if (engine != nullptr) engine->CloseLane(self);
    });
  }

  // Set once before the lane is shared: the peer's address is not one of this machine's (see
  // Engine::SendChunk).
  bool other_machine = false;

  // Worker context.
  ucp_ep_h ep = nullptr;
  bool closed = false;  // Closed by us or failed: no new operations on `ep`.
  int index = -1;
  std::weak_ptr<Conn> conn;
  std::weak_ptr<Link> link;
  const std::string& peer() const { return peer_; }

 private:
  // Runs `fn(engine)` in worker context, or `fn(nullptr)` on the callback thread once the
  // transport is gone.
  template <typename Fn>
  void Submit(Fn fn) {
    if (std::shared_ptr<Engine> engine = engine_.lock()) {
      engine->Submit([engine_ptr = engine.get(), fn = std::move(fn)](bool live) mutable {
        fn(live ? engine_ptr : nullptr);
      });
    } else {
      executor_->Post([fn = std::move(fn)]() mutable { fn(nullptr); });
    }
  }

  const std::weak_ptr<Engine> engine_;
  const std::shared_ptr<Executor> executor_;
  const std::string peer_;
};

}  // namespace lbcc::transport::ucx_internal

#endif  // LBCC_TRANSPORT_UCX_ENGINE_H_
