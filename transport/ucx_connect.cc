// The UCX backend's set-up: Listen, Connect (the client's set-up steps), Accept, and the server's
// side of the set-up: connection requests, HELLO admission, READY (transport/ucx_engine.h).
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "transport/ucx_engine.h"

namespace lbcc::transport::ucx_internal {
namespace {

// Listen and connect addresses: "host:port" or "[v6]:port", the host a name or a literal.
absl::StatusOr<SocketAddress> ParseAddress(absl::string_view address) {
  return ParseSocketAddress(address, "UCX address");
}

// UCX's tcp transport connects from the family it takes first on the listen device; a set-up
// over the other family fails, with an IPv6 one UCX 1.13 corrupts its heap (options.h,
// CheckUcxAddressFamily). Applies only when UCX may use tcp.
absl::Status CheckTcpFamily(const TransportOptions& options, const SocketAddress& listen) {
  const std::string& tls = options.ucx_tls;
  if (!tls.empty() && tls[0] != '^' && tls.find("tcp") == std::string::npos &&
      tls.find("all") == std::string::npos) {
    return absl::OkStatus();
  }
  return CheckUcxAddressFamily(options.ucx_tcp_af_prio, listen.host, ListNetInterfaces());
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// The server's side (worker context).

void Engine::HandleSetup(const std::shared_ptr<UcxLane>& lane, const ControlHeader& h) {
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
  params.err_handler.arg = engine->shared_.get();
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
  const std::string& host = parsed.ok() ? parsed->host : address;
  if (IsLoopbackAddress(host)) return false;
  // An IPv4 peer seen through a dual-stack socket: compare its IPv4 form.
  return std::find(local_addresses_.begin(), local_addresses_.end(), UnmappedIPv4(host)) ==
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
    params.err_handler.arg = shared_.get();
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

}  // namespace lbcc::transport::ucx_internal
