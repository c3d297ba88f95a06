#include "transport/ucx_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/check.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "transport/executor.h"
#include "transport/link.h"
#include "transport/link_setup.h"
#include "transport/netif.h"
#include "transport/options.h"
#include "transport/ucx_api.h"  // Routes the ucp_*() calls below to LBCC's own UCX.

namespace lbcc::transport {
namespace {

// Active message ids.
constexpr unsigned kAmControl = 7;
constexpr unsigned kAmData = 8;

// Transport destruction waits this long for UCX to finish cancelled requests.
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);
absl::Status FromUcs(ucs_status_t status, absl::string_view what) {
  if (status == UCS_OK) return absl::OkStatus();
  if (status == UCS_ERR_CANCELED) return absl::CancelledError(absl::StrCat(what, ": cancelled"));
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// Listen and connect addresses: "host:port" or "[v6]:port", the host a name or a literal.
absl::StatusOr<SocketAddress> ParseAddress(absl::string_view address) {
  return ParseSocketAddress(address, "UCX address");
}

// UCX's tcp transport connects from the family it takes first on the listen device; a set-up
// over the other family fails, with an IPv6 one UCX 1.13 corrupts its heap (options.h,
// CheckUcxAddressFamily). Applies only when UCX may use tcp.
absl::Status CheckTcpFamily(const TransportOptions& options, const SocketAddress& listen) {
  const char* env_tls = std::getenv("UCX_TLS");
  const std::string tls = !options.ucx_tls.empty() ? options.ucx_tls : env_tls ? env_tls : "";
  if (!tls.empty() && tls[0] != '^' && tls.find("tcp") == std::string::npos &&
      tls.find("all") == std::string::npos) {
    return absl::OkStatus();
  }
  const char* env_af_prio = std::getenv("UCX_TCP_AF_PRIO");
  const std::string af_prio = !options.ucx_tcp_af_prio.empty() ? options.ucx_tcp_af_prio
                              : env_af_prio != nullptr         ? env_af_prio
                                                               : "";
  return CheckUcxAddressFamily(af_prio, listen.host, ListNetInterfaces());
}

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

thread_local const Engine* t_worker_owner = nullptr;

// Runs `done` of a request exactly once with the status UCX gives it.
struct RequestCtx {
  Engine* engine = nullptr;
  std::shared_ptr<UcxLane> lane;        // Keeps the lane (and its endpoint bookkeeping) alive.
  ChunkHeader chunk_header{};           // UCX reads the header until the send completes.
  ControlHeader control_header{};
  std::shared_ptr<std::vector<uint8_t>> payload;  // Owned payload (probe data).
  bool eager = false;                   // A send forced to UCX's eager protocol.
  DoneCallback done;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  using Command = absl::AnyInvocable<void(bool live)>;

  static absl::StatusOr<std::shared_ptr<Engine>> Create(const TransportOptions& options);
  ~Engine();

  void Shutdown();
  absl::StatusOr<std::string> Listen(absl::string_view address);
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                    absl::Duration timeout,
                                                    ConnectOptions options);
  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(absl::Duration timeout);

  // Queues `command` to run under the worker lock with live = true, on the progress thread or a
  // calling thread. After shutdown it runs with live = false on the callback thread instead.
  void Submit(Command command);
  // Tries to run queued work and progress on the calling thread.
  void Kick();

  ucp_worker_h worker() const { return worker_; }  // Under the worker lock only.
  const std::shared_ptr<Executor>& executor() const { return executor_; }

  // User threads (set-up): queues `message` on `lane` and progresses.
  void SendControlFromUser(const std::shared_ptr<UcxLane>& lane, ControlMessage message);

  // Worker context (lock held).
  void SendControl(const std::shared_ptr<UcxLane>& lane, ControlHeader header,
                   std::shared_ptr<std::vector<uint8_t>> payload, DoneCallback done);
  void SendChunk(const std::shared_ptr<UcxLane>& lane, const ChunkHeader& header,
                 const uint8_t* data, size_t length, DoneCallback done);
  void CloseLane(const std::shared_ptr<UcxLane>& lane);
  // The peer of `lane` is alive (it sent something, or a transfer from it completed).
  void HeardFrom(const UcxLane& lane);
  // A request's context goes to StartRequest with what UCX returned; a UCX callback of a request
  // that was in flight calls CompleteRequest. Either runs ctx->done once and frees ctx.
  void StartRequest(void* status_ptr, RequestCtx* ctx, absl::string_view what);
  void CompleteRequest(RequestCtx* ctx, ucs_status_t status, absl::string_view what);

 private:
  explicit Engine(const TransportOptions& options);
  absl::Status Init();

  // Worker context.
  static void OnConnRequest(ucp_conn_request_h request, void* arg);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnAmData(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnAmControl(void* arg, const void* header, size_t header_length,
                                  void* data, size_t length, const ucp_am_recv_param_t* param);
  void HandleControl(const std::shared_ptr<UcxLane>& lane, const ControlHeader& header);
  // HELLO: the server's Conn for the connection's link (made at the first HELLO); null while
  // shutting down or for a bad lane index.
  std::shared_ptr<Conn> ServerConnLocked(const std::shared_ptr<UcxLane>& lane,
                                         const ControlHeader& hello)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctl_mu_);
  // A connection the link's set-up admitted joins the link (lanes reach the Link in order).
  void AttachLaneLocked(const std::shared_ptr<Conn>& conn, const std::shared_ptr<UcxLane>& lane,
                        int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctl_mu_);
  std::shared_ptr<UcxLane> LaneFor(const ucp_am_recv_param_t* param);
  int RunLocked();
  // One round of every running link's PeerWatch (transport/link_setup.h): heartbeats, and
  // failing links whose peer has been silent for the peer timeout while work was pending.
  void WatchPeersLocked();
  void MarkRunningLocked(const std::shared_ptr<Conn>& conn);
  int DrainCommandsLocked();
  void FinishRequest(RequestCtx* ctx, ucs_status_t status, absl::string_view what);
  int ProgressLocked();

  void ProgressLoop();
  void Wake();
  // Locks the worker (blocking) and runs `fn` in worker context: for set-up calls from user
  // threads, never from callbacks.
  template <typename Fn>
  auto OnWorker(Fn fn);

  // Whether numeric `address` ("host:port", "[v6]:port" or a bare host) belongs to another
  // machine: neither loopback nor one of this machine's interface addresses (listed at Init).
  bool OnOtherMachine(const std::string& address) const;

  // Client set-up helpers (user thread).
  std::shared_ptr<UcxLane> OpenLane(const std::shared_ptr<Conn>& conn, int index,
                                    const SocketAddress& addr);

  const TransportOptions options_;
  const std::shared_ptr<Executor> executor_;
  std::vector<std::string> local_addresses_;  // Set in Init, then read only.

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_efd_ = -1;
  int event_fd_ = -1;
  int epoll_fd_ = -1;

  Mutex worker_mu_;
  absl::flat_hash_map<ucp_ep_h, std::shared_ptr<UcxLane>> eps_ ABSL_GUARDED_BY(worker_mu_);
  std::vector<void*> closing_ ABSL_GUARDED_BY(worker_mu_);  // ep close requests.
  WatchClock watch_clock_ ABSL_GUARDED_BY(worker_mu_);
  int64_t outstanding_ ABSL_GUARDED_BY(worker_mu_) = 0;     // Requests awaiting callbacks.
  ucp_listener_h listener_ ABSL_GUARDED_BY(worker_mu_) = nullptr;
  ProbeScratch probe_scratch_;  // Thread-safe.

  Mutex cmd_mu_;
  std::vector<Command> commands_ ABSL_GUARDED_BY(cmd_mu_);
  bool stopped_ ABSL_GUARDED_BY(cmd_mu_) = false;

  std::atomic<bool> stop_progress_{false};
  std::thread progress_thread_;

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

// A rendezvous chunk whose bytes are still at the sender.
class UcxDeferred final : public DeferredPayload {
 public:
  UcxDeferred(std::weak_ptr<Engine> engine, std::shared_ptr<Executor> executor,
              std::shared_ptr<UcxLane> lane, void* desc, size_t length)
      : engine_(std::move(engine)),
        executor_(std::move(executor)),
        lane_(std::move(lane)),
        desc_(desc),
        length_(length) {}

  ~UcxDeferred() override {
    if (consumed_) return;
    Run([lane = lane_, desc = desc_](Engine* engine) {
      // Releasing a rendezvous descriptor answers the sender through the endpoint it came on; once
      // that endpoint is destroyed the descriptor is left to the worker, which frees it.
      if (engine != nullptr && lane->ep != nullptr) ucp_am_data_release(engine->worker(), desc);
    });
  }

  void Fetch(uint8_t* dst, DoneCallback done) override {
    consumed_ = true;
    Run([lane = lane_, desc = desc_, dst, length = length_,
         done = std::move(done)](Engine* engine) mutable {
      if (engine == nullptr || lane->closed) {
        done(absl::CancelledError("connection closed before the chunk was fetched"));
        return;
      }
      auto* ctx = new RequestCtx;
      ctx->engine = engine;
      ctx->lane = lane;
      ctx->done = std::move(done);
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
        auto* ctx = static_cast<RequestCtx*>(user_data);
        ucp_request_free(request);
        if (status == UCS_OK) ctx->engine->HeardFrom(*ctx->lane);
        ctx->engine->CompleteRequest(ctx, status, "rendezvous receive");
      };
      param.user_data = ctx;
      engine->StartRequest(ucp_am_recv_data_nbx(engine->worker(), desc, dst, length, &param),
                           ctx, "rendezvous receive");
    });
  }

 private:
  template <typename Fn>
  void Run(Fn fn) {
    if (std::shared_ptr<Engine> engine = engine_.lock()) {
      engine->Submit([engine_ptr = engine.get(), fn = std::move(fn)](bool live) mutable {
        fn(live ? engine_ptr : nullptr);
      });
    } else {
      executor_->Post([fn = std::move(fn)]() mutable { fn(nullptr); });
    }
  }

  std::weak_ptr<Engine> engine_;
  std::shared_ptr<Executor> executor_;
  std::shared_ptr<UcxLane> lane_;
  void* desc_;
  size_t length_;
  bool consumed_ = false;
};

// ---------------------------------------------------------------------------------------------
// Engine: creation, progress, shutdown.

Engine::Engine(const TransportOptions& options)
    : options_(options),
      executor_(std::make_shared<Executor>("lbcc-ucx-cb")),
      watch_clock_(options.peer_timeout) {}

absl::StatusOr<std::shared_ptr<Engine>> Engine::Create(const TransportOptions& options) {
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

  for (auto [id, cb] : {std::pair<unsigned, ucp_am_recv_callback_t>{kAmData, &Engine::OnAmData},
                        {kAmControl, &Engine::OnAmControl}}) {
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

template <typename Fn>
auto Engine::OnWorker(Fn fn) {
  MutexLock lock(&worker_mu_);
  t_worker_owner = this;
  auto result = fn();
  if (worker_ != nullptr) RunLocked();  // Null once shut down (Transport::Shutdown).
  t_worker_owner = nullptr;
  return result;
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

void Engine::SendChunk(const std::shared_ptr<UcxLane>& lane, const ChunkHeader& header,
                       const uint8_t* data, size_t length, DoneCallback done) {
  if (lane->closed) {
    done(absl::CancelledError("connection closed"));
    return;
  }
  auto* ctx = new RequestCtx;
  ctx->engine = this;
  ctx->lane = lane;
  ctx->chunk_header = header;
  ctx->done = std::move(done);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  // Slow-link chunks go eagerly: a rendezvous would wait for the receiver's reply, which crosses
  // the sender's own down-link, behind whatever that link is delivering (on a busy shaped link,
  // tens of milliseconds per chunk). The slow-link window (credits) still bounds what is in
  // flight; the receiver keeps an eager chunk that no receive wants yet (Link parks it).
  // Fast-link chunks to another machine go eagerly too: the link is "fast" by the topology
  // (one island), but its reply still crosses a network whose queue may be full (a ring's
  // next step answers behind the step before it); the cost is the receiver's copy, which a
  // network link hides. Between processes of this machine a rendezvous saves that copy.
  const bool credited = (header.flags & kChunkNeedsCredit) != 0;
  ctx->eager = (credited || lane->other_machine) &&
               static_cast<int64_t>(length) <= options_.slow_eager_bytes;
  if (ctx->eager) param.flags |= UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    auto* ctx = static_cast<RequestCtx*>(user_data);
    ucp_request_free(request);
    // A rendezvous send completes on the peer's acknowledgement: it is alive. (An eager one
    // completes once the bytes left this host.)
    if (status == UCS_OK && !ctx->eager) ctx->engine->HeardFrom(*ctx->lane);
    ctx->engine->CompleteRequest(ctx, status, "send");
  };
  param.user_data = ctx;
  StartRequest(ucp_am_send_nbx(lane->ep, kAmData, &ctx->chunk_header, sizeof(ChunkHeader), data,
                               length, &param),
               ctx, "send");
}

void Engine::SendControl(const std::shared_ptr<UcxLane>& lane, ControlHeader header,
                         std::shared_ptr<std::vector<uint8_t>> payload, DoneCallback done) {
  if (lane->closed) {
    if (done) done(absl::CancelledError("connection closed"));
    return;
  }
  auto* ctx = new RequestCtx;
  ctx->engine = this;
  ctx->lane = lane;
  ctx->control_header = header;
  ctx->control_header.lane = static_cast<uint32_t>(std::max(lane->index, 0));
  ctx->control_header.version = kWireVersion;
  ctx->payload = std::move(payload);
  ctx->done = std::move(done);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    auto* ctx = static_cast<RequestCtx*>(user_data);
    ucp_request_free(request);
    ctx->engine->CompleteRequest(ctx, status, "control message");
  };
  param.user_data = ctx;
  const void* data = ctx->payload ? ctx->payload->data() : nullptr;
  const size_t length = ctx->payload ? ctx->payload->size() : 0;
  StartRequest(ucp_am_send_nbx(lane->ep, kAmControl, &ctx->control_header, sizeof(ControlHeader),
                               data, length, &param),
               ctx, "control message");
}

void Engine::HeardFrom(const UcxLane& lane) {
  if (std::shared_ptr<Conn> conn = lane.conn.lock()) conn->watch.HeardFrom(absl::Now());
}

void Engine::CloseLane(const std::shared_ptr<UcxLane>& lane) {
  lane->closed = true;
  if (lane->ep == nullptr) return;
  lane->closed = true;
  ucp_ep_h ep = lane->ep;
  lane->ep = nullptr;
  eps_.erase(ep);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* request = ucp_ep_close_nbx(ep, &param);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing_.push_back(request);
  // A link whose connections are all closed is forgotten.
  if (std::shared_ptr<Conn> conn = lane->conn.lock()) {
    MutexLock lock(&ctl_mu_);
    bool any_open = false;
    for (auto& [index, other] : conn->lanes) any_open |= other != nullptr && !other->closed;
    if (!any_open && (conn->link == nullptr || conn->link->failed())) {
      conns_.erase({conn->id, conn->client});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Incoming (worker context).

std::shared_ptr<UcxLane> Engine::LaneFor(const ucp_am_recv_param_t* param) {
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return nullptr;
  auto it = eps_.find(param->reply_ep);
  if (it == eps_.end() || it->second->closed) return nullptr;
  return it->second;
}

ucs_status_t Engine::OnAmData(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
  auto* engine = static_cast<Engine*>(arg);
  std::shared_ptr<UcxLane> lane = engine->LaneFor(param);
  std::shared_ptr<Link> link = lane ? lane->link.lock() : nullptr;
  if (link == nullptr || header_length != sizeof(ChunkHeader)) return UCS_OK;  // Dropped.
  engine->HeardFrom(*lane);
  ChunkHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (h.length != length) {
    link->Fail(absl::DataLossError(absl::StrCat("chunk from ", lane->peer(), " announces ",
                                                h.length, " bytes and carries ", length)));
    return UCS_OK;
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    link->OnChunk(lane->index, h, nullptr,
                  std::make_unique<UcxDeferred>(engine->weak_from_this(), engine->executor_, lane,
                                                data, length));
    return UCS_INPROGRESS;  // The descriptor is ours until fetched or released.
  }
  link->OnChunk(lane->index, h, static_cast<const uint8_t*>(data), nullptr);
  return UCS_OK;
}

ucs_status_t Engine::OnAmControl(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
  auto* engine = static_cast<Engine*>(arg);
  std::shared_ptr<UcxLane> lane = engine->LaneFor(param);
  if (lane == nullptr || header_length != sizeof(ControlHeader)) return UCS_OK;
  engine->HeardFrom(*lane);
  ControlHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (static_cast<Ctl>(h.type) == Ctl::kProbeData && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    // Probe bytes must really cross the link: receive them into a scratch buffer first.
    auto* ctx = new RequestCtx;
    ctx->engine = engine;
    ctx->lane = lane;
    ctx->payload = engine->probe_scratch_.Get(length);
    ctx->done = [engine, lane, h](absl::Status status) {
      if (status.ok()) engine->HandleControl(lane, h);
    };
    ucp_request_param_t rparam{};
    rparam.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rparam.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
      auto* ctx = static_cast<RequestCtx*>(user_data);
      ucp_request_free(request);
      ctx->engine->CompleteRequest(ctx, status, "probe receive");
    };
    rparam.user_data = ctx;
    engine->StartRequest(ucp_am_recv_data_nbx(engine->worker_, data, ctx->payload->data(), length,
                                              &rparam),
                         ctx, "probe receive");
    return UCS_INPROGRESS;
  }
  engine->HandleControl(lane, h);
  return UCS_OK;
}

void Engine::HandleControl(const std::shared_ptr<UcxLane>& lane, const ControlHeader& h) {
  switch (static_cast<Ctl>(h.type)) {
    case Ctl::kCredit:
    case Ctl::kHeartbeat:  // HeardFrom() already noted it; the Link checks its tag.
      if (std::shared_ptr<Link> link = lane->link.lock()) link->OnControl(lane->index, h);
      return;
    default:
      break;
  }
  if (!IsSetupMessage(h.type)) {
    LBCC_LOG(WARN) << "unknown control message " << h.type << " from " << lane->peer();
    return;
  }
  // The link's set-up answers; UCX is never called with ctl_mu_ held (UCX calls our error
  // handler with its own locks held, and that handler takes ctl_mu_).
  const bool hello = static_cast<Ctl>(h.type) == Ctl::kHello;
  std::shared_ptr<Conn> conn;
  if (hello) {
    MutexLock lock(&ctl_mu_);
    conn = ServerConnLocked(lane, h);
  } else {
    conn = lane->conn.lock();
  }
  if (conn == nullptr) return;
  LinkSetup::Step step = conn->setup->OnControl(h, probe_scratch_);
  if (step.refuse) {
    // Failed authentication (logged and counted by the set-up): close the connection once the
    // reply, if any, is out. A refused HELLO was never admitted, so its link (if it has another
    // connection) lives on; any other refusal came on the link's own connection.
    if (!hello) {
      conn->link->Fail(absl::PermissionDeniedError(
          absl::StrCat("link from ", lane->peer(), " failed authentication")));
    } else {
      MutexLock lock(&ctl_mu_);
      if (conn->lanes.empty()) conns_.erase({conn->id, conn->client});
    }
    auto close = [this, lane](absl::Status) {
      Submit([this, lane](bool live) {
        if (live) CloseLane(lane);
      });
    };
    if (step.reply.has_value()) {
      SendControl(lane, step.reply->header, std::move(step.reply->payload), std::move(close));
    } else {
      close(absl::OkStatus());
    }
    return;
  }
  if (hello && step.admit) {
    MutexLock lock(&ctl_mu_);
    AttachLaneLocked(conn, lane, static_cast<int>(h.lane));
  }
  if (step.ready.has_value()) {
    MutexLock lock(&ctl_mu_);
    if (!shutting_down_) {
      conn->link->Configure(step.ready->link_class, options_.scheduler,
                            options_.fast_chunk_bytes, step.ready->probe, step.ready->channel);
      if (!conn->link->failed()) accept_queue_.push_back(conn);
      MarkRunningLocked(conn);  // Worker context: this runs inside progress.
    }
  }
  if (step.reply.has_value()) {
    SendControl(lane, step.reply->header, std::move(step.reply->payload), nullptr);
  }
}

std::shared_ptr<Conn> Engine::ServerConnLocked(const std::shared_ptr<UcxLane>& lane,
                                               const ControlHeader& h) {
  if (shutting_down_ || h.lane > 64) return nullptr;
  // The server's end of the link; never the client's end of it in this same transport.
  std::shared_ptr<Conn>& conn = conns_[{h.conn_id, /*client=*/false}];
  if (conn == nullptr) {
    conn = std::make_shared<Conn>();
    conn->id = h.conn_id;
    conn->peer = lane->peer();
    // The rules see the connecting host (IPv6 without brackets); its port is ephemeral, so
    // unknown (0).
    absl::StatusOr<HostAndPort> peer = ParseHostPort(conn->peer, "UCX peer");
    conn->setup = std::make_unique<LinkSetup>(
        LinkSetup::Role::kServer, options_, conn->peer,
        HostPort{peer.ok() ? peer->host : conn->peer, 0});
    conn->link = std::make_shared<Link>(executor_, conn->peer);
    conn->link->SetKick([weak = weak_from_this()] {
      if (std::shared_ptr<Engine> engine = weak.lock()) engine->Kick();
    });
  }
  return conn;
}

void Engine::AttachLaneLocked(const std::shared_ptr<Conn>& conn,
                              const std::shared_ptr<UcxLane>& lane, int index) {
  lane->index = index;
  lane->conn = conn;
  lane->link = conn->link;
  conn->lanes[lane->index] = lane;
  while (conn->lanes.count(conn->lanes_added)) {
    conn->link->AddLane(conn->lanes[conn->lanes_added]);
    ++conn->lanes_added;
  }
}

void Engine::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* engine = static_cast<Engine*>(arg);
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string peer = "unknown";
  if (ucp_conn_request_query(request, &attr) == UCS_OK) {
    absl::StatusOr<SocketAddress> client = SocketAddressOf(attr.client_address);
    if (client.ok()) peer = client->ToString();
  }
  bool shutting_down;
  {
    MutexLock lock(&engine->ctl_mu_);
    shutting_down = engine->shutting_down_;
  }
  if (shutting_down) {
    ucp_listener_reject(engine->listener_, request);
    return;
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Engine::OnEpError;
  params.err_handler.arg = engine;
  ucp_ep_h ep = nullptr;
  const ucs_status_t status = ucp_ep_create(engine->worker_, &params, &ep);
  if (status != UCS_OK) {
    LBCC_LOG(WARN) << "cannot accept connection from " << peer << ": " << ucs_status_string(status);
    return;
  }
  auto lane = std::make_shared<UcxLane>(engine->weak_from_this(), engine->executor_, peer);
  lane->other_machine = engine->OnOtherMachine(peer);
  lane->ep = ep;
  engine->eps_[ep] = lane;
}

void Engine::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* engine = static_cast<Engine*>(arg);
  auto it = engine->eps_.find(ep);
  if (it == engine->eps_.end()) return;
  std::shared_ptr<UcxLane> lane = it->second;
  // Say what happened to the peer, not only UCX's word for it ("Endpoint timeout" alone read as
  // a local timeout to users): the comm layer adds which rank that peer is.
  const char* what = "the connection failed";
  switch (status) {
    case UCS_ERR_ENDPOINT_TIMEOUT:
      what = "the peer stopped answering (its process died or froze, or the network failed)";
      break;
    case UCS_ERR_CONNECTION_RESET:
      what = "the peer closed or reset the connection (its process exited or aborted)";
      break;
    case UCS_ERR_UNREACHABLE:
      what = "the peer became unreachable";
      break;
    default:
      break;
  }
  const absl::Status error = absl::UnavailableError(absl::StrCat(
      "peer ", lane->peer(), " is lost: ", what, " (UCX: ", ucs_status_string(status), ")"));
  if (std::shared_ptr<Conn> conn = lane->conn.lock()) conn->setup->Fail(error);
  // No more UCX calls on the failed endpoint; queued work on it completes with Cancelled. The
  // endpoint itself is closed after this callback returns.
  lane->closed = true;
  // Failing the link first queues the release of its rendezvous descriptors ahead of the close.
  if (std::shared_ptr<Link> link = lane->link.lock()) link->Fail(error);
  engine->Submit([engine, lane](bool live) {
    if (live) engine->CloseLane(lane);
  });
}

// ---------------------------------------------------------------------------------------------
// Set-up (user threads).

absl::StatusOr<std::string> Engine::Listen(absl::string_view address) {
  LBCC_ASSIGN_OR_RETURN(const SocketAddress parsed, ParseAddress(address));
  LBCC_RETURN_IF_ERROR(CheckTcpFamily(options_, parsed));
  {
    MutexLock lock(&ctl_mu_);
    if (shutting_down_) return absl::CancelledError("transport shut down");
    if (listening_) return absl::FailedPreconditionError("already listening");
  }
  absl::StatusOr<int> port = OnWorker([&]() -> absl::StatusOr<int> {
    if (worker_ == nullptr) return absl::CancelledError("transport shut down");
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = parsed.get();
    params.sockaddr.addrlen = parsed.length;
    params.conn_handler.cb = &Engine::OnConnRequest;
    params.conn_handler.arg = this;
    ucs_status_t status = ucp_listener_create(worker_, &params, &listener_);
    if (status != UCS_OK) {
      listener_ = nullptr;
      return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ",
                                                 ucs_status_string(status)));
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    status = ucp_listener_query(listener_, &attr);
    if (status != UCS_OK) return FromUcs(status, "ucp_listener_query");
    LBCC_ASSIGN_OR_RETURN(const SocketAddress bound, SocketAddressOf(attr.sockaddr));
    return bound.port;
  });
  if (!port.ok()) return port.status();
  MutexLock lock(&ctl_mu_);
  listening_ = true;
  return JoinHostPort(parsed.host, *port);
}

bool Engine::OnOtherMachine(const std::string& address) const {
  absl::StatusOr<HostAndPort> parsed = ParseHostPort(address, "UCX peer");
  std::string host = parsed.ok() ? parsed->host : address;
  if (IsLoopbackAddress(host)) return false;
  // An IPv4 peer seen through a dual-stack socket: compare its IPv4 form.
  constexpr absl::string_view kMapped = "::ffff:";
  if (absl::StartsWith(host, kMapped) && host.find('.') != std::string::npos) {
    host = host.substr(kMapped.size());
  }
  return std::find(local_addresses_.begin(), local_addresses_.end(), host) ==
         local_addresses_.end();
}

std::shared_ptr<UcxLane> Engine::OpenLane(const std::shared_ptr<Conn>& conn, int index,
                                          const SocketAddress& addr) {
  auto lane = std::make_shared<UcxLane>(weak_from_this(), executor_, conn->peer);
  lane->other_machine = OnOtherMachine(addr.host);
  {
    MutexLock lock(&ctl_mu_);
    conn->lanes[index] = lane;
  }
  OnWorker([&] {
    lane->index = index;
    lane->conn = conn;
    lane->link = conn->link;
    if (worker_ == nullptr) {  // Shut down by another thread meanwhile.
      lane->closed = true;
      conn->setup->Cancel(absl::CancelledError("transport shut down"));
      return 0;
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = addr.get();
    params.sockaddr.addrlen = addr.length;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Engine::OnEpError;
    params.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    const ucs_status_t status = ucp_ep_create(worker_, &params, &ep);
    if (status != UCS_OK) {
      lane->closed = true;
      conn->setup->Fail(FromUcs(status, absl::StrCat("connect to ", conn->peer)));
      return 0;
    }
    lane->ep = ep;
    eps_[ep] = lane;
    SendControl(lane, conn->setup->Hello(conn->id, static_cast<uint32_t>(index)).header, nullptr,
                nullptr);
    return 0;
  });
  return lane;
}

void Engine::SendControlFromUser(const std::shared_ptr<UcxLane>& lane, ControlMessage message) {
  OnWorker([&] {
    SendControl(lane, message.header, std::move(message.payload), nullptr);
    return 0;
  });
}

// Connection 0 of a link being set up, lent to its LinkSetup (the connecting thread).
class UcxSetupWire final : public SetupWire {
 public:
  UcxSetupWire(Engine* engine, std::shared_ptr<UcxLane> lane)
      : engine_(engine), lane_(std::move(lane)) {}
  void Send(ControlMessage message) override {
    engine_->SendControlFromUser(lane_, std::move(message));
  }

 private:
  Engine* const engine_;
  const std::shared_ptr<UcxLane> lane_;
};

absl::StatusOr<std::unique_ptr<Endpoint>> Engine::Connect(absl::string_view address,
                                                          absl::Duration timeout,
                                                          ConnectOptions options) {
  LBCC_ASSIGN_OR_RETURN(const SocketAddress parsed, ParseAddress(address));
  if (parsed.port == 0) {
    return absl::InvalidArgumentError(absl::StrCat("UCX address '", address, "' has port 0"));
  }
  const absl::Time deadline = absl::Now() + timeout;
  auto conn = std::make_shared<Conn>();
  conn->client = true;
  conn->peer = parsed.ToString();
  conn->setup = std::make_unique<LinkSetup>(LinkSetup::Role::kClient, options_, conn->peer,
                                            HostPort{parsed.host, parsed.port});
  LinkSetup& setup = *conn->setup;
  conn->link = std::make_shared<Link>(executor_, conn->peer);
  conn->link->SetKick([weak = weak_from_this()] {
    if (std::shared_ptr<Engine> engine = weak.lock()) engine->Kick();
  });
  {
    MutexLock lock(&ctl_mu_);
    if (shutting_down_) return absl::CancelledError("transport shut down");
    do {
      conn->id = random_();
    } while (conns_.contains({conn->id, /*client=*/true}));
    conns_[{conn->id, /*client=*/true}] = conn;
    connecting_[&setup] = conn;
  }
  // However Connect ends, Shutdown no longer needs to cancel this set-up.
  auto forget = absl::MakeCleanup([this, &setup] {
    MutexLock lock(&ctl_mu_);
    connecting_.erase(&setup);
  });
  // On any failure below, the Link's Fail closes every connection opened so far.
  auto fail = [&](absl::Status status) {
    conn->link->Fail(status);
    std::vector<std::shared_ptr<UcxLane>> lanes;
    {
      MutexLock lock(&ctl_mu_);
      for (auto& [index, lane] : conn->lanes) lanes.push_back(lane);
      conns_.erase({conn->id, /*client=*/true});
    }
    OnWorker([&] {
      for (auto& lane : lanes) CloseLane(lane);
      return 0;
    });
    return status;
  };

  // Step 1: connection 0 and its WELCOME, retried while the peer refuses (it may not listen
  // yet).
  uint64_t retries = 0;
  std::shared_ptr<UcxLane> lane0;
  absl::Duration backoff = absl::Milliseconds(5);
  while (true) {
    lane0 = OpenLane(conn, 0, parsed);
    absl::Status welcomed = setup.AwaitWelcomes(1, deadline);
    if (welcomed.ok()) break;
    if (welcomed.code() != absl::StatusCode::kUnavailable) return fail(welcomed);
    if (absl::Now() + backoff >= deadline) {
      return fail(absl::UnavailableError(
          absl::StrCat("cannot connect to ", conn->peer, " within ", absl::FormatDuration(timeout),
                       ": ", welcomed.message())));
    }
    ++retries;
    OnWorker([&] {
      CloseLane(lane0);
      return 0;
    });
    setup.ClearFailure();
    absl::SleepFor(backoff);  // Retry back-off while the peer is not listening yet.
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }

  // Step 3 (link_setup.h): the class and the probe, over connection 0.
  UcxSetupWire wire(this, lane0);
  absl::StatusOr<LinkParams> params = setup.Negotiate(wire, options, deadline, /*measure=*/true);
  if (!params.ok()) return fail(params.status());

  // Stripes: more connections for a slow link.
  std::vector<std::shared_ptr<UcxLane>> lanes = {lane0};
  for (int i = 1; i < params->stripes; ++i) lanes.push_back(OpenLane(conn, i, parsed));
  absl::Status welcomed = setup.AwaitWelcomes(params->stripes, deadline);
  if (!welcomed.ok()) return fail(welcomed);
  for (auto& lane : lanes) conn->link->AddLane(lane);
  conn->link->Configure(params->link_class, options_.scheduler, options_.fast_chunk_bytes,
                        params->probe, params->channel);
  conn->link->AddRetries(retries);

  // Step 4: READY.
  const ControlMessage ready = LinkSetup::Ready(conn->id, *params);
  OnWorker([&] {
    SendControl(lane0, ready.header, nullptr, nullptr);
    MarkRunningLocked(conn);
    return 0;
  });
  return std::make_unique<LinkEndpoint>(conn->link, shared_from_this());
}

absl::StatusOr<std::unique_ptr<Endpoint>> Engine::Accept(absl::Duration timeout) {
  MutexLock lock(&ctl_mu_);
  if (!listening_) return absl::FailedPreconditionError("not listening");
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctl_mu_) {
    return !accept_queue_.empty() || shutting_down_;
  };
  if (!ctl_mu_.AwaitWithTimeout(ready, timeout)) {
    return absl::DeadlineExceededError("no connection to accept");
  }
  if (shutting_down_) return absl::CancelledError("transport shut down");
  std::shared_ptr<Conn> conn = std::move(accept_queue_.front());
  accept_queue_.pop_front();
  return std::make_unique<LinkEndpoint>(conn->link, shared_from_this());
}

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}
  ~UcxTransport() override { engine_->Shutdown(); }

  void Shutdown() override { engine_->Shutdown(); }
  absl::string_view backend() const override { return "ucx"; }
  absl::StatusOr<std::string> Listen(absl::string_view address) override {
    return engine_->Listen(address);
  }
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view address,
                                                    absl::Duration timeout,
                                                    ConnectOptions options) override {
    return engine_->Connect(address, timeout, options);
  }
  absl::StatusOr<std::unique_ptr<Endpoint>> Accept(absl::Duration timeout) override {
    return engine_->Accept(timeout);
  }

 private:
  std::shared_ptr<Engine> engine_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> NewUcxTransport(const TransportOptions& options) {
  LBCC_ASSIGN_OR_RETURN(std::shared_ptr<Engine> engine, Engine::Create(options));
  return std::make_unique<UcxTransport>(std::move(engine));
}

}  // namespace lbcc::transport
