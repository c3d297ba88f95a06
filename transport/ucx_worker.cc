// The process's shared UCP context and worker (transport/ucx_worker.h).
#include "transport/ucx_worker.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "transport/link_setup.h"
#include "transport/wire_constants.h"

namespace lbcc::transport::ucx_internal {
namespace {

// The Worker whose lock this thread holds (worker context), if any. Kept in this file: a
// thread_local of external linkage lands in liblbcc.so's dynamic symbol table whatever its
// version script says (//tools:ldd_test).
thread_local const Worker* t_held = nullptr;

// The workers by their UCX settings; never freed (UCX may call back until the process is gone).
struct Registry {
  Mutex mu;
  std::map<std::string, std::shared_ptr<Worker>> workers ABSL_GUARDED_BY(mu);
};
Registry& TheRegistry() {
  static Registry* const registry = new Registry;
  return *registry;
}

// Set by the exit handler: from then on a worker is released as soon as no engine uses it.
std::atomic<bool> g_exiting{false};

// What makes two transports' UCX configurations differ.
std::string SettingsKey(const TransportOptions& options) {
  return absl::StrCat("tls=", options.ucx_tls, ";devices=", options.ucx_net_devices,
                      ";af=", options.ucx_tcp_af_prio,
                      ";peer_timeout=", absl::FormatDuration(options.peer_timeout),
                      ";spin=", absl::FormatDuration(options.progress_spin));
}

}  // namespace

absl::Status FromUcs(ucs_status_t status, absl::string_view what) {
  if (status == UCS_OK) return absl::OkStatus();
  if (status == UCS_ERR_CANCELED) return absl::CancelledError(absl::StrCat(what, ": cancelled"));
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

absl::StatusOr<std::shared_ptr<Worker>> Worker::Acquire(const TransportOptions& options,
                                                        AmHandlers handlers) {
  // Registered once the program runs (not while a library loads), so exit() runs it before the
  // dynamic linker finalizes UCX's libraries.
  static const bool hooked = [] {
    std::atexit(+[] {
      g_exiting.store(true);
      ReleaseIdle();
    });
    return true;
  }();
  (void)hooked;
  Registry& registry = TheRegistry();
  if (g_exiting.load()) {
    return absl::FailedPreconditionError("UCX transport created while the process exits");
  }
  const std::string key = SettingsKey(options);
  MutexLock lock(&registry.mu);
  auto it = registry.workers.find(key);
  if (it != registry.workers.end()) return it->second;
  std::shared_ptr<Worker> worker(new Worker(options.progress_spin));
  absl::Status status = worker->Init(options, handlers);
  if (!status.ok()) {
    worker->Release();
    return status;
  }
  worker->thread_ = std::thread([raw = worker.get()] { raw->ProgressLoop(); });
  pthread_setname_np(worker->thread_.native_handle(), "lbcc-ucx-prog");
  LBCC_LOG(INFO) << "UCX worker for " << key << " created (shared by this process's transports)";
  registry.workers.emplace(key, worker);
  return worker;
}

absl::Status Worker::Init(const TransportOptions& options, AmHandlers handlers) {
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
    if (!options.ucx_tls.empty()) LBCC_RETURN_IF_ERROR(modify("TLS", options.ucx_tls));
    if (!options.ucx_net_devices.empty()) {
      LBCC_RETURN_IF_ERROR(modify("NET_DEVICES", options.ucx_net_devices));
    }
    // The address family UCX's tcp transport takes from the device (IPv4 first by default).
    // UCT settings are named without their component's prefix here ("AF_PRIO", not
    // "TCP_AF_PRIO", which UCX accepts and then ignores with an "invalid configuration" warning).
    if (!options.ucx_tcp_af_prio.empty()) {
      LBCC_RETURN_IF_ERROR(modify("AF_PRIO", options.ucx_tcp_af_prio));
    }
    // Non-blocking connects of UCX's tcp lanes: UCX 1.13's default (a blocking connect() on the
    // progress thread, also when a server's accept connects back to the client) stalls every
    // link of the worker for the kernel's SYN retries (over two minutes) toward a peer whose
    // firewall drops packets, past any set-up timeout.
    LBCC_RETURN_IF_ERROR(modify("CONN_NB", "y"));
    // One rendezvous rail: a fast and a slow device never carry parts of one message.
    LBCC_RETURN_IF_ERROR(modify("MAX_RNDV_RAILS", "1"));
    // A silent peer is noticed within about the peer timeout.
    const double interval_s = absl::ToDoubleSeconds(options.peer_timeout) / 3;
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
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // Every call under mu_.
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
       {std::pair<unsigned, ucp_am_recv_callback_t>{kUcxAmData, handlers.data},
        {kUcxAmControl, handlers.control}}) {
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

bool Worker::HeldHere() const { return t_held == this; }
void Worker::SetHeldHere(bool held) { t_held = held ? this : nullptr; }

void Worker::Register(WorkerClient* client) { engines_.push_back(client); }

void Worker::Unregister(WorkerClient* client) {
  engines_.erase(std::remove(engines_.begin(), engines_.end(), client), engines_.end());
}

std::shared_ptr<UcxLane> Worker::LaneFor(ucp_ep_h ep, WorkerClient** client) {
  for (WorkerClient* candidate : engines_) {
    if (std::shared_ptr<UcxLane> lane = candidate->LaneForEp(ep)) {
      *client = candidate;
      return lane;
    }
  }
  return nullptr;
}

void Worker::Wake() {
  const uint64_t one = 1;
  ssize_t ignored = write(event_fd_, &one, sizeof(one));
  (void)ignored;  // A full counter still wakes the reader.
}

void Worker::Push(Command command) {
  {
    MutexLock lock(&cmd_mu_);
    commands_.push_back(std::move(command));
  }
  if (!HeldHere()) Wake();
}

void Worker::Kick() {
  if (HeldHere()) return;        // The holder drains what we queued.
  if (!mu_.TryLock()) return;    // Someone is progressing; the queue reaches them.
  SetHeldHere(true);
  RunLocked();
  SetHeldHere(false);
  mu_.Unlock();
}

int Worker::DrainLocked() {
  int total = 0;
  while (true) {
    std::vector<Command> batch;
    {
      MutexLock lock(&cmd_mu_);
      batch.swap(commands_);
    }
    if (batch.empty()) return total;
    total += static_cast<int>(batch.size());
    for (Command& command : batch) command();
  }
}

int Worker::ProgressLocked() {
  int total = 0;
  for (int i = 0; i < 64; ++i) {
    const unsigned n = ucp_worker_progress(worker_);
    if (n == 0) break;
    total += static_cast<int>(n);
  }
  for (WorkerClient* engine : engines_) total += engine->ReapClosesLocked();
  return total;
}

int Worker::RunLocked() {
  if (worker_ == nullptr) return 0;
  int total = 0;
  for (int round = 0; round < 16; ++round) {
    const int n = DrainLocked() + ProgressLocked();
    total += n;
    if (n == 0) break;
  }
  return total;
}

void Worker::ProgressLoop() {
  absl::Time last_activity = absl::Now();
  while (!stop_.load()) {
    bool sleep = false;
    {
      MutexLock lock(&mu_);
      SetHeldHere(true);
      const int work = RunLocked();
      const absl::Time now = absl::Now();
      // A copy: a peer watch may fail links, whose callbacks never unregister an engine, but the
      // list stays the one this round started with.
      const std::vector<WorkerClient*> engines = engines_;
      for (WorkerClient* engine : engines) engine->WatchPeersIfDueLocked(now);
      if (work > 0) {
        last_activity = now;
      } else if (now - last_activity > progress_spin_) {
        bool queued;
        {
          MutexLock cmd_lock(&cmd_mu_);
          queued = !commands_.empty();
        }
        // Arm returns BUSY when events are already pending: progress again instead of sleeping.
        if (!queued && ucp_worker_arm(worker_) == UCS_OK) sleep = true;
      }
      SetHeldHere(false);
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

void Worker::Release() {
  stop_.store(true);
  if (event_fd_ >= 0) Wake();
  if (thread_.joinable()) thread_.join();
  {
    MutexLock lock(&mu_);
    SetHeldHere(true);
    DrainLocked();
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    worker_ = nullptr;
    SetHeldHere(false);
  }
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
  if (event_fd_ >= 0) close(event_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  event_fd_ = epoll_fd_ = -1;
}

void Worker::ReleaseIfExiting() {
  if (g_exiting.load()) ReleaseIdle();
}

void Worker::ReleaseIdle() {
  Registry& registry = TheRegistry();
  MutexLock lock(&registry.mu);
  for (auto it = registry.workers.begin(); it != registry.workers.end();) {
    Worker& worker = *it->second;
    bool idle;
    {
      MutexLock worker_lock(&worker.mu_);
      idle = worker.engines_.empty();
    }
    // A worker a transport still uses stays: that transport was not destroyed before exit.
    if (idle) {
      worker.Release();
      it = registry.workers.erase(it);  // Engines shut down before keep their reference.
    } else {
      ++it;
    }
  }
}

}  // namespace lbcc::transport::ucx_internal
