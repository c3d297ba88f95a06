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

// The Engine whose worker lock this thread holds (worker context), if any.
thread_local const Engine* t_worker_owner = nullptr;

}  // namespace

void SetWorkerOwner(const Engine* engine) { t_worker_owner = engine; }

absl::Status FromUcs(ucs_status_t status, absl::string_view what) {
  if (status == UCS_OK) return absl::OkStatus();
  if (status == UCS_ERR_CANCELED) return absl::CancelledError(absl::StrCat(what, ": cancelled"));
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// ---------------------------------------------------------------------------------------------
// Engine: creation, progress, shutdown.

Engine::Engine(const TransportOptions& options)
    : options_(options),
      executor_(std::make_shared<Executor>("lbcc-ucx-cb")),
      watch_clock_(options.peer_timeout) {}

absl::StatusOr<std::shared_ptr<Engine>> Engine::Create(const TransportOptions& options) {
  // The callback thread (the constructor's executor) starts before Init's first UCX call. Keep
  // that order: with UCX loaded and a worker created first in a process that had no other thread
  // yet, ucp_worker_create crashed in the allocator of UCX's namespace (a chunk of the program's
  // heap on its free lists) in many runs under Bazel's test runner, and never with the thread
  // started first (seen with the shared UCX worker of commit d2335c9; the cause is not known).
  std::shared_ptr<Engine> engine(new Engine(options));
  LBCC_RETURN_IF_ERROR(engine->Init());
  engine->progress_thread_ = std::thread([raw = engine.get()] { raw->ProgressLoop(); });
  pthread_setname_np(engine->progress_thread_.native_handle(), "lbcc-ucx-prog");
  return engine;
}

absl::Status Engine::Init() {
  for (const NetInterface& netif : ListNetInterfaces()) local_addresses_.push_back(netif.address);
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return FromUcs(status, "ucp_config_read");
  auto modify = [&](const char* name, const std::string& value) -> absl::Status {
    ucs_status_t s = ucp_config_modify(config, name, value.c_str());
    if (s != UCS_OK) {
      return absl::InvalidArgumentError(absl::StrCat("UCX rejected ", name, "=", value, ": ",
                                                     ucs_status_string(s)));
    }
    return absl::OkStatus();
  };
  absl::Status configured = [&]() -> absl::Status {
    if (!options_.ucx_tls.empty()) LBCC_RETURN_IF_ERROR(modify("TLS", options_.ucx_tls));
    if (!options_.ucx_net_devices.empty()) {
      LBCC_RETURN_IF_ERROR(modify("NET_DEVICES", options_.ucx_net_devices));
    }
    // The address family UCX's tcp transport takes from the device (IPv4 first by default).
    // UCT settings are named without their component's prefix here ("AF_PRIO", not
    // "TCP_AF_PRIO", which UCX accepts and then ignores with an "invalid configuration" warning).
    if (!options_.ucx_tcp_af_prio.empty()) {
      LBCC_RETURN_IF_ERROR(modify("AF_PRIO", options_.ucx_tcp_af_prio));
    }
    // Non-blocking connects of UCX's tcp lanes: UCX 1.13's default (a blocking connect() on the
    // progress thread, also when a server's accept connects back to the client) stalls every
    // link of the worker for the kernel's SYN retries (over two minutes) toward a peer whose
    // firewall drops packets, past any set-up timeout.
    LBCC_RETURN_IF_ERROR(modify("CONN_NB", "y"));
    // One rendezvous rail: a fast and a slow device never carry parts of one message.
    LBCC_RETURN_IF_ERROR(modify("MAX_RNDV_RAILS", "1"));
    // A silent peer is noticed within about the peer timeout.
    const double interval_s = absl::ToDoubleSeconds(options_.peer_timeout) / 3;
    LBCC_RETURN_IF_ERROR(modify("KEEPALIVE_INTERVAL", absl::StrCat(interval_s, "s")));
    return absl::OkStatus();
  }();
  if (!configured.ok()) {
    ucp_config_release(config);
    return configured;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "lbcc";
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) return FromUcs(status, "ucp_init");

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // Every call under worker_mu_.
  worker_params.events = UCP_WAKEUP_RMA | UCP_WAKEUP_AMO | UCP_WAKEUP_TAG_SEND |
                         UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_TX | UCP_WAKEUP_RX;
  status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status != UCS_OK) return FromUcs(status, "ucp_worker_create");

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  status = ucp_worker_query(worker_, &attr);
  if (status != UCS_OK) return FromUcs(status, "ucp_worker_query");
  if (attr.max_am_header < sizeof(ControlHeader)) {
    return absl::UnavailableError(absl::StrCat("UCX allows active-message headers of ",
                                               attr.max_am_header, " bytes; LBCC needs ",
                                               sizeof(ControlHeader)));
  }

  for (auto [id, cb] :
       {std::pair<unsigned, ucp_am_recv_callback_t>{kUcxAmData, &Engine::OnAmData},
        {kUcxAmControl, &Engine::OnAmControl}}) {
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                         UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = id;
    handler.flags = UCP_AM_FLAG_WHOLE_MSG;
    handler.cb = cb;
    handler.arg = this;
    status = ucp_worker_set_am_recv_handler(worker_, &handler);
    if (status != UCS_OK) return FromUcs(status, "ucp_worker_set_am_recv_handler");
  }

  status = ucp_worker_get_efd(worker_, &worker_efd_);
  if (status != UCS_OK) return FromUcs(status, "ucp_worker_get_efd");
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (event_fd_ < 0 || epoll_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("eventfd/epoll: ", std::strerror(errno)));
  }
  for (int fd : {worker_efd_, event_fd_}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
      return absl::UnavailableError(absl::StrCat("epoll_ctl: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

Engine::~Engine() {
  Shutdown();
  if (event_fd_ >= 0) close(event_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void Engine::Wake() {
  const uint64_t one = 1;
  ssize_t ignored = write(event_fd_, &one, sizeof(one));
  (void)ignored;  // A full counter still wakes the reader.
}

void Engine::Submit(Command command) {
  {
    MutexLock lock(&cmd_mu_);
    if (!stopped_) {
      commands_.push_back(std::move(command));
      command = nullptr;
    }
  }
  if (command) {
    executor_->Post([command = std::move(command)]() mutable { command(false); });
    return;
  }
  if (t_worker_owner != this) Wake();
}

void Engine::Kick() {
  if (t_worker_owner == this) return;  // The holder drains what we queued.
  if (!worker_mu_.TryLock()) return;   // Someone is progressing; the queue reaches them.
  t_worker_owner = this;
  if (worker_ != nullptr) RunLocked();
  t_worker_owner = nullptr;
  worker_mu_.Unlock();
}

int Engine::DrainCommandsLocked() {
  int total = 0;
  while (true) {
    std::vector<Command> batch;
    {
      MutexLock lock(&cmd_mu_);
      batch.swap(commands_);
    }
    if (batch.empty()) return total;
    total += static_cast<int>(batch.size());
    for (Command& command : batch) command(true);
  }
}

int Engine::ProgressLocked() {
  int total = 0;
  for (int i = 0; i < 64; ++i) {
    const unsigned n = ucp_worker_progress(worker_);
    if (n == 0) break;
    total += static_cast<int>(n);
  }
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

int Engine::RunLocked() {
  int total = 0;
  for (int round = 0; round < 16; ++round) {
    const int n = DrainCommandsLocked() + ProgressLocked();
    total += n;
    if (n == 0) break;
  }
  return total;
}

void Engine::ProgressLoop() {
  absl::Time last_activity = absl::Now();
  while (!stop_progress_.load()) {
    bool sleep = false;
    {
      MutexLock lock(&worker_mu_);
      t_worker_owner = this;
      const int work = RunLocked();
      const absl::Time now = absl::Now();
      if (watch_clock_.Due(now)) WatchPeersLocked();
      if (work > 0) {
        last_activity = now;
      } else if (now - last_activity > options_.progress_spin) {
        bool queued;
        {
          MutexLock cmd_lock(&cmd_mu_);
          queued = !commands_.empty();
        }
        // Arm returns BUSY when events are already pending: progress again instead of sleeping.
        if (!queued && ucp_worker_arm(worker_) == UCS_OK) sleep = true;
      }
      t_worker_owner = nullptr;
    }
    if (sleep) {
      epoll_event events[2];
      const int n = epoll_wait(epoll_fd_, events, 2, /*timeout_ms=*/100);
      for (int i = 0; i < n; ++i) {
        if (events[i].data.fd == event_fd_) {
          uint64_t value;
          ssize_t ignored = read(event_fd_, &value, sizeof(value));
          (void)ignored;
        }
      }
      last_activity = absl::Now();  // Poll a little after every wake-up.
    }
  }
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
  if (worker_ != nullptr) {
    OnWorker([this] {
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
    // Let the progress thread finish cancelled requests and endpoint closes.
    {
      MutexLock lock(&worker_mu_);
      auto quiet = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker_mu_) {
        return outstanding_ == 0 && closing_.empty();
      };
      if (!worker_mu_.AwaitWithTimeout(quiet, kShutdownGrace)) {
        LBCC_LOG(WARN) << "UCX transport shut down with " << outstanding_
                       << " requests and " << closing_.size() << " endpoint closes unfinished";
      }
    }
  }
  stop_progress_.store(true);
  if (event_fd_ >= 0) Wake();
  if (progress_thread_.joinable()) progress_thread_.join();
  if (worker_ != nullptr) {
    MutexLock lock(&worker_mu_);
    t_worker_owner = this;
    RunLocked();  // Commands queued meanwhile see closed lanes and complete with Cancelled.
    {
      MutexLock cmd_lock(&cmd_mu_);
      stopped_ = true;
    }
    DrainCommandsLocked();
    for (void* request : closing_) ucp_request_free(request);
    closing_.clear();
    // Endpoints opened by a Connect() that raced with the shutdown die with the worker: their
    // lanes must not touch them afterwards.
    for (auto& [ep, lane] : eps_) {
      lane->ep = nullptr;
      lane->closed = true;
    }
    eps_.clear();
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
    t_worker_owner = nullptr;
  } else {
    MutexLock cmd_lock(&cmd_mu_);
    stopped_ = true;
  }
  if (context_ != nullptr) {
    ucp_cleanup(context_);
    context_ = nullptr;
  }
  MutexLock lock(&ctl_mu_);
  conns_.clear();
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
