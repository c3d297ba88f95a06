// The UCX backend's engine: creation (UCX's configuration, the active-message handlers, the
// event fds), the progress loop and its command queue, request bookkeeping, the peer watch and
// shutdown (transport/ucx_engine.h).
#include "transport/ucx_engine.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "transport/wire_constants.h"

namespace lbcc::transport::ucx_internal {
namespace {

// Transport destruction waits this long for UCX to finish cancelled requests.
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);

}  // namespace

// ---------------------------------------------------------------------------------------------
// Engine: creation, commands, shutdown.

Engine::Engine(const TransportOptions& options, std::shared_ptr<Executor> executor,
               std::shared_ptr<Worker> shared)
    : options_(options),
      executor_(std::move(executor)),
      shared_(std::move(shared)),
      worker_mu_(shared_->mu()),
      watch_clock_(options.peer_timeout) {}

absl::StatusOr<std::shared_ptr<Engine>> Engine::Create(const TransportOptions& options) {
  std::vector<std::string> local_addresses;
  for (const NetInterface& netif : ListNetInterfaces()) local_addresses.push_back(netif.address);
  // The callback thread starts before UCX's first use, as it always has: with UCX loaded and its
  // worker created first in a process that had no other thread yet, ucp_worker_create crashed in
  // the malloc of UCX's namespace (a chunk of the program's heap in its free lists) in many runs
  // under Bazel's test runner; with the thread started first, none did. The cause is
  // not understood (transport/ucx_api.cc lists the namespace's other thread hazards).
  auto executor = std::make_shared<Executor>("lbcc-ucx-cb");
  LBCC_ASSIGN_OR_RETURN(std::shared_ptr<Worker> shared,
                        Worker::Acquire(options, {&Engine::OnAmData, &Engine::OnAmControl}));
  std::shared_ptr<Engine> engine(new Engine(options, std::move(executor), std::move(shared)));
  engine->local_addresses_ = std::move(local_addresses);
  MutexLock lock(&engine->worker_mu_);
  if (engine->shared_->handle() == nullptr) {
    return absl::FailedPreconditionError("UCX transport created while the process exits");
  }
  engine->worker_ = engine->shared_->handle();
  engine->shared_->Register(engine.get());
  return engine;
}

Engine::~Engine() { Shutdown(); }

void Engine::Submit(Command command) {
  {
    MutexLock lock(&cmd_mu_);
    if (!stopped_) {
      // Every command this engine queues runs before its shutdown unregisters it (Shutdown
      // stops the queue, then drains it), so it runs live.
      shared_->Push([command = std::move(command)]() mutable { command(true); });
      return;
    }
  }
  executor_->Post([command = std::move(command)]() mutable { command(false); });
}

int Engine::ReapClosesLocked() {
  int total = 0;
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(*it) != UCS_INPROGRESS) {
      ucp_request_free(*it);
      it = closing_.erase(it);
      ++total;
    } else {
      ++it;
    }
  }
  return total;
}

void Engine::WatchPeersIfDueLocked(absl::Time now) {
  if (watch_clock_.Due(now)) WatchPeersLocked();
}

void Engine::Shutdown() {
  std::vector<std::shared_ptr<Link>> links;
  {
    MutexLock lock(&ctl_mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    const absl::Status cancelled = absl::CancelledError("transport shut down");
    for (auto& [id, conn] : conns_) {
      links.push_back(conn->link);
      conn->setup->Cancel(cancelled);
    }
    for (auto& [setup, conn] : connecting_) setup->Cancel(cancelled);
    accept_queue_.clear();
  }
  for (auto& link : links) link->Fail(absl::CancelledError("transport shut down"));
  OnWorker([this] {
    if (worker_ == nullptr) return 0;  // Never registered.
    if (listener_ != nullptr) {
      ucp_listener_destroy(listener_);
      listener_ = nullptr;
    }
    // Connections that never became links (half-open handshakes) close here too.
    std::vector<std::shared_ptr<UcxLane>> lanes;
    for (auto& [ep, lane] : eps_) lanes.push_back(lane);
    for (auto& lane : lanes) CloseLane(lane);
    return 0;
  });
  // Let the worker's progress thread finish cancelled requests and endpoint closes.
  {
    MutexLock lock(&worker_mu_);
    auto quiet = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker_mu_) {
      return outstanding_ == 0 && closing_.empty();
    };
    if (!worker_mu_.AwaitWithTimeout(quiet, kShutdownGrace)) {
      LBCC_LOG(WARN) << "UCX transport shut down with " << outstanding_
                     << " requests and " << closing_.size() << " endpoint closes unfinished";
      if (outstanding_ > 0) {
        // The shared worker outlives this transport and may still complete those requests,
        // whose callbacks reach this engine: it is kept for the process's life (rare; no
        // transport sends after its shutdown, so nothing else grows).
        static Mutex kept_mu;
        static auto* kept = new std::vector<std::shared_ptr<Engine>>;
        MutexLock kept_lock(&kept_mu);
        if (std::shared_ptr<Engine> self = weak_from_this().lock()) kept->push_back(self);
      }
    }
  }
  bool unregistered = false;
  {
    MutexLock lock(&worker_mu_);
    shared_->SetHeldHere(true);
    {
      MutexLock cmd_lock(&cmd_mu_);
      stopped_ = true;
    }
    // Commands queued meanwhile see closed lanes and complete with Cancelled.
    shared_->RunLocked();
    if (worker_ != nullptr) {
      // A close still in flight goes on in the worker; its request handle is released here.
      for (void* request : closing_) ucp_request_free(request);
      closing_.clear();
      // Endpoints opened by a Connect() that raced with the shutdown close now: the worker
      // stays, so they must not wait for it to go.
      for (auto& [ep, lane] : eps_) {
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;
        void* request = ucp_ep_close_nbx(ep, &param);
        if (request != nullptr && !UCS_PTR_IS_ERR(request)) ucp_request_free(request);
        lane->ep = nullptr;
        lane->closed = true;
      }
      eps_.clear();
      shared_->Unregister(this);
      worker_ = nullptr;
      unregistered = true;
    }
    shared_->SetHeldHere(false);
  }
  {
    MutexLock ctl_lock(&ctl_mu_);
    conns_.clear();
  }
  if (unregistered) Worker::ReleaseIfExiting();
}

void Engine::MarkRunningLocked(const std::shared_ptr<Conn>& conn) {
  conn->watch.Start(absl::Now());
}

void Engine::WatchPeersLocked() {
  const absl::Time now = absl::Now();
  const bool we_stalled = watch_clock_.StartRound(now);
  std::vector<std::shared_ptr<Conn>> conns;
  {
    MutexLock lock(&ctl_mu_);
    for (auto& [id, conn] : conns_) {
      if (conn->watch.running()) conns.push_back(conn);
    }
  }
  for (const std::shared_ptr<Conn>& conn : conns) {
    std::shared_ptr<UcxLane> lane0;
    {
      MutexLock lock(&ctl_mu_);
      auto it = conn->lanes.find(0);
      if (it != conn->lanes.end()) lane0 = it->second;
    }
    if (lane0 == nullptr || lane0->closed || conn->link->failed()) continue;
    const PeerWatch::Verdict verdict =
        conn->watch.Check(now, options_.peer_timeout, we_stalled,
                          [&conn] { return conn->link->HasPendingWork(); }, conn->peer);
    if (verdict.send_heartbeat) {
      ControlHeader heartbeat = HeartbeatMessage().header;
      conn->link->SealControl(0, &heartbeat);
      SendControl(lane0, heartbeat, nullptr, nullptr);
    }
    if (!verdict.failure.ok()) conn->link->Fail(verdict.failure);
  }
}

// ---------------------------------------------------------------------------------------------
// Requests.

void Engine::StartRequest(void* status_ptr, RequestCtx* ctx, absl::string_view what) {
  if (status_ptr == nullptr) {
    FinishRequest(ctx, UCS_OK, what);  // Completed at once: UCX does not call the callback.
  } else if (UCS_PTR_IS_ERR(status_ptr)) {
    FinishRequest(ctx, UCS_PTR_STATUS(status_ptr), what);
  } else {
    ++outstanding_;
  }
}

void Engine::CompleteRequest(RequestCtx* ctx, ucs_status_t status, absl::string_view what) {
  --outstanding_;
  FinishRequest(ctx, status, what);
}

void Engine::FinishRequest(RequestCtx* ctx, ucs_status_t status, absl::string_view what) {
  std::unique_ptr<RequestCtx> owned(ctx);
  if (!ctx->done) return;
  if (status == UCS_OK) {
    ctx->done(absl::OkStatus());
  } else {
    ctx->done(FromUcs(status, absl::StrCat(what, " to ", ctx->lane->peer())));
  }
}

}  // namespace lbcc::transport::ucx_internal
