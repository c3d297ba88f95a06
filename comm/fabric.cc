#include "comm/fabric.h"

#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/check.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "comm/agreement.h"
#include "transport/link_rules.h"
#include "transport/loopback.h"
#include "transport/netif.h"
#include "transport/socket_transport.h"
#include "transport/options.h"
#include "transport/ucx_transport.h"

namespace lbcc::comm {
namespace {

using transport::Endpoint;
using transport::Tag;

// The tag of the hello a connecting rank sends first: its rank number.
constexpr Tag kHelloTag = ~Tag{0};
// The tag of the goodbye every rank sends before it closes its connections.
constexpr Tag kByeTag = ~Tag{0} - 1;
// How long a closing rank waits for its peers' goodbyes at most.
constexpr absl::Duration kByeTimeout = absl::Seconds(30);
// Each round of the outcome agreement may last this long past an operation's deadline (at most
// the communicator's timeout): long enough for a lost rank to show as lost.
constexpr absl::Duration kAgreementGrace = absl::Seconds(10);
// The hello of a control connection: the rank with this bit set.
constexpr uint32_t kControlHello = 0x80000000u;
// The hello of a reversed connection (dialed by the peer that cannot be dialed, for the
// acceptor's own sends): the rank with this bit set too.
constexpr uint32_t kReverseHello = 0x40000000u;

// LBCC_REACHABLE=auto: a rank whose transport address names another host than the one its
// bootstrap connection came from (as the root saw it) is behind NAT: nobody can dial the
// address it advertises, so it dials every link itself (socket backend). UCX cannot reverse
// (CheckReachability), and a host that routes to the root from another of its addresses than
// the one it listens on (multi-homed) looks the same, so over UCX the rank stays reachable and
// the mismatch is a warning. A rank seen at its own address that the root's dial-back could not
// connect to (`dialed_back` "0"; kDialBackRequest, socket backend only) is behind a firewall
// that refuses inbound connections: unreachable too. An address without an IP host (the
// loopback backend's) is reachable.
bool ReachableByAddress(const std::string& backend, int rank, int me, const std::string& address,
                        const std::string& observed, const std::string& dialed_back) {
  // Numeric and canonical ("fd77:0::1" reads "fd77::1", as the root's inet_ntop writes it).
  const absl::StatusOr<transport::SocketAddress> listening =
      transport::NumericSocketAddress(transport::SplitHostPort(address).host, 0);
  const std::string host = listening.ok() ? listening->host : "";
  // An IPv4 rank seen by a dual-stack root: "::ffff:10.0.0.2".
  const std::string seen = transport::UnmappedIPv4(observed);
  if (!listening.ok() || host == seen) {
    if (dialed_back == "0") {
      LBCC_LOG_IF(INFO, rank == me || me == 0)
          << "comm: rank " << rank << " listens on " << address << " but the root could not "
          << "connect to it within " << absl::FormatDuration(kDialBackTimeout) << " (a firewall "
          << "refusing inbound connections?): it dials every link (LBCC_REACHABLE=auto; set yes "
          << "if peers can dial it)";
      return false;
    }
    LBCC_LOG_IF(INFO, rank == me) << "comm: rank " << rank << " is reachable (LBCC_REACHABLE=auto: "
                                  << "the root saw it come from " << observed << ", the address "
                                  << "it listens on"
                                  << (dialed_back == "1" ? ", and connected to it" : "") << ")";
    return true;
  }
  if (backend == "socket") {
    LBCC_LOG_IF(INFO, rank == me || me == 0)
        << "comm: rank " << rank << " listens on " << host << " but reached the root from "
        << observed << ": behind NAT, it dials every link (LBCC_REACHABLE=auto; set yes if "
        << "peers can dial " << host << ")";
    return false;
  }
  LBCC_LOG_IF(WARN, rank == me || me == 0)
      << "comm: rank " << rank << " listens on " << host << " but reached the root from "
      << observed << ": if it is behind NAT, peers cannot dial it over " << backend
      << " (use LBCC_TRANSPORT=socket); taken as reachable (LBCC_REACHABLE=auto)";
  return true;
}

// Which pairs cannot be connected: both ends unreachable (a relay would be needed), or any
// unreachable rank over a backend that cannot reverse connections (UCX's tcp lanes dial from
// both ends). FailedPrecondition naming them, the same on every rank; OK otherwise.
absl::Status CheckReachability(const std::string& backend, const std::vector<bool>& reachable) {
  std::vector<int> unreachable;
  for (size_t r = 0; r < reachable.size(); ++r) {
    if (!reachable[r]) unreachable.push_back(static_cast<int>(r));
  }
  if (unreachable.empty()) return absl::OkStatus();
  if (backend == "ucx") {
    return absl::FailedPreconditionError(absl::StrCat(
        "comm: rank", unreachable.size() == 1 ? " " : "s ", absl::StrJoin(unreachable, ", "),
        " cannot be dialed (LBCC_REACHABLE=no), and UCX's tcp lanes connect from both ends of "
        "every link: use LBCC_TRANSPORT=socket, whose links the reachable end dials alone"));
  }
  std::vector<std::string> pairs;
  for (size_t i = 0; i < unreachable.size(); ++i) {
    for (size_t j = i + 1; j < unreachable.size(); ++j) {
      pairs.push_back(absl::StrCat(unreachable[i], "-", unreachable[j]));
    }
  }
  if (pairs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "comm: ranks ", absl::StrJoin(pairs, ", "), " cannot reach each other: neither end of ",
      pairs.size() == 1 ? "that pair" : "those pairs",
      " can be dialed (LBCC_REACHABLE=no, or auto found both behind NAT), and LBCC does not "
      "relay yet"));
}

// `options`: the resolved settings. With a job secret, every link's handshake binds the job
// (the id's session) and the rank. The settings' secret wins over one the id carries
// (LBCC_SECRET_IN_ID).
absl::StatusOr<std::unique_ptr<transport::Transport>> MakeTransport(
    const std::string& backend, transport::TransportOptions options, const UniqueId& id, int rank,
    const std::string& device, bool ipv6) {
  if (!options.security.secret.has_value()) options.security.secret = UniqueIdSecret(id);
  options.security.job_id = std::string(id.internal + 8, 8);
  options.security.identity = static_cast<uint64_t>(rank);
  if (backend == "loopback") return transport::NewLoopbackTransport(options);
  if (backend == "socket") return transport::NewSocketTransport(options);
  LBCC_RETURN_IF_ERROR(transport::PinUcxDevice(device, ipv6, &options));
  if (backend == "ucx") return transport::NewUcxTransport(options);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport backend '", backend, "' (ucx, socket or loopback)"));
}

std::string Hostname() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// Waits until `count` callbacks ran or `deadline` passed.
struct Latch {
  Mutex mu;
  CondVar cv;
  int pending ABSL_GUARDED_BY(mu) = 0;
  absl::Status first_error ABSL_GUARDED_BY(mu);
};

}  // namespace

absl::Status BackendAvailable(const std::string& backend) {
  if (backend == "ucx") return transport::UcxAvailable();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Fabric>> Fabric::Create(const UniqueId& id, int nranks, int rank,
                                                       FabricOptions options) {
  const std::shared_ptr<Cancellation> cancel = std::move(options.cancel);
  if (cancel != nullptr) LBCC_RETURN_IF_ERROR(cancel->status());
  options.cancel = cancel;
  absl::StatusOr<std::shared_ptr<Fabric>> fabric = Build(id, nranks, rank, std::move(options));
  if (cancel != nullptr && cancel->cancelled()) {
    // Whatever failed once the set-up was cancelled (its transport shut down under it) failed
    // because of that; a fabric finished just then has a shut-down transport: dropped.
    return cancel->status();
  }
  if (fabric.ok()) (*fabric)->options_.cancel.reset();
  return fabric;
}

absl::StatusOr<std::shared_ptr<Fabric>> Fabric::Build(const UniqueId& id, int nranks, int rank,
                                                      FabricOptions options) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of ", nranks, " is not a valid rank"));
  }
  std::shared_ptr<Fabric> fabric(new Fabric());
  fabric->rank_ = rank;
  fabric->nranks_ = nranks;
  if (!options.transport.has_value()) {
    LBCC_ASSIGN_OR_RETURN(options.transport, transport::TransportOptions::FromEnv());
  }
  fabric->options_ = options;
  std::string listen, device;
  bool ipv6 = false;
  if (options.backend == "loopback") {
    std::random_device random;
    listen = absl::StrCat("lbcc-", random(), random(), "-r", rank);
  } else {  // LBCC_LISTEN_ADDR, else the interface toward the root (transport/netif.h).
    LBCC_ASSIGN_OR_RETURN(const transport::NetChoice net, ChooseListenAddress(id, options.listen_host));
    listen = transport::JoinHostPort(net.address, 0);
    if (!net.loopback) device = net.interface;
    ipv6 = net.ipv6;
  }
  LBCC_ASSIGN_OR_RETURN(fabric->transport_,
                        MakeTransport(options.backend, *options.transport, id, rank, device, ipv6));
  // A cancelled set-up: Connect(), Accept() and the hellos' receives return Cancelled at once.
  const Cancellation::Hook stop(options.cancel.get(),
                                [t = fabric->transport_.get()] { t->Shutdown(); });
  LBCC_ASSIGN_OR_RETURN(std::string address, fabric->transport_->Listen(listen),
                        _.Prepend("comm: listen"));
  const std::string hostname = Hostname();
  if (options.reachable.empty()) options.reachable = "auto";  // resolved by the caller
  if (options.reachable != "auto" && options.reachable != "yes" && options.reachable != "no") {
    return absl::InvalidArgumentError(absl::StrCat("comm: reachable '", options.reachable,
                                                   "' is invalid: expected auto, yes or no"));
  }
  if (options.reachable != "auto") {
    LBCC_LOG(INFO) << "comm: rank " << rank << " is "
                   << (options.reachable == "yes" ? "reachable"
                                                  : "not reachable (it dials every link)")
                   << " (LBCC_REACHABLE=" << options.reachable << ")";
  }
  // Each rank's blob: host name, transport address, whether peers can dial it: 1, 0, or "auto"
  // and the address the root saw it come from (kObservedAddressRequest; see ReachableByAddress).
  // The socket backend also asks the root to dial it back (kDialBackRequest): a firewall that
  // refuses inbound connections leaves the address as it is. Over UCX, which cannot reverse
  // a link anyway, no stranger's connection is made to its listener.
  const std::string dialable =
      options.reachable == "yes"  ? "1"
      : options.reachable == "no" ? "0"
                                  : absl::StrCat("auto", kObservedAddressRequest,
                                                 options.backend == "socket"
                                                     ? absl::StrCat(kDialBackRequest, address)
                                                     : "");
  LBCC_ASSIGN_OR_RETURN(
      std::vector<std::string> blobs,
      BootstrapExchange(id, nranks, rank, absl::StrCat(hostname, "\n", address, "\n", dialable),
                        options.timeout,
                        BootstrapSecurity{true, options.transport->security.secret},
                        options.cancel.get()));
  std::vector<std::string> addresses;
  std::vector<bool> reachable;
  for (const std::string& blob : blobs) {
    // host, address, then "0" / "1", or "auto", the observed address and [the dial-back's 0 / 1].
    std::vector<std::string> parts = absl::StrSplit(blob, absl::MaxSplits('\n', 4));
    const bool fixed = parts.size() == 3 && (parts[2] == "0" || parts[2] == "1");
    const bool observed =
        (parts.size() == 4 || (parts.size() == 5 && (parts[4] == "0" || parts[4] == "1"))) &&
        parts[2] == "auto";
    if (!fixed && !observed) return absl::InternalError("comm: malformed bootstrap blob");
    const int r = static_cast<int>(addresses.size());
    fabric->hostnames_.push_back(parts[0]);
    addresses.push_back(parts[1]);
    reachable.push_back(fixed ? parts[2] == "1"
                              : ReachableByAddress(options.backend, r, rank, parts[1], parts[3],
                                                   parts.size() == 5 ? parts[4] : ""));
  }
  LBCC_RETURN_IF_ERROR(CheckReachability(options.backend, reachable));
  LBCC_RETURN_IF_ERROR(CheckAdvertisedAddresses(fabric->hostnames_, addresses));
  fabric->addresses_ = addresses;
  if (options.topology.has_value()) {
    if (options.topology->nranks() != nranks) {
      return absl::InvalidArgumentError(absl::StrCat("comm: the topology has ",
                                                     options.topology->nranks(),
                                                     " ranks, the communicator ", nranks));
    }
    fabric->topology_ = *options.topology;
  } else {
    LBCC_ASSIGN_OR_RETURN(fabric->topology_, Topology::FromEnvironment(fabric->hostnames_));
  }
  LBCC_RETURN_IF_ERROR(fabric->Connect(addresses, reachable));
  std::vector<Endpoint*> control_out(nranks, nullptr), control_in(nranks, nullptr);
  for (int peer = 0; peer < nranks; ++peer) {
    control_out[peer] = fabric->control_out_[peer].get();
    control_in[peer] = fabric->control_in_[peer].get();
  }
  fabric->agreement_ = std::make_unique<internal::VoteAgreement>(
      rank, std::move(control_out), std::move(control_in),
      std::min(options.timeout, kAgreementGrace));
  fabric->agreement_->Start();
  LBCC_LOG(INFO) << "comm: rank " << rank << "/" << nranks << " connected over "
                 << fabric->transport_->backend() << ", topology " << fabric->topology_.ToJson();
  return fabric;
}

namespace {
// The failed peer travels in the message, not as a status payload: a payload is an absl::Cord,
// whose sampling state (a thread-local) liblbcc.so would then export (tools/ldd_test.sh).
constexpr absl::string_view kFailedPeerMark = " [failed peer ";
}  // namespace

absl::Status WithFailedPeer(absl::Status status, int peer) {
  if (status.ok() || peer < 0 || FailedPeer(status).has_value()) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), kFailedPeerMark, peer, "]"));
}

std::optional<int> FailedPeer(const absl::Status& status) {
  const absl::string_view message = status.message();
  const size_t at = message.rfind(kFailedPeerMark);
  if (at == absl::string_view::npos || !absl::EndsWith(message, "]")) return std::nullopt;
  const size_t from = at + kFailedPeerMark.size();
  int peer = -1;
  if (!absl::SimpleAtoi(message.substr(from, message.size() - 1 - from), &peer) || peer < 0) {
    return std::nullopt;
  }
  return peer;
}

absl::Status Fabric::Connect(const std::vector<std::string>& addresses,
                             const std::vector<bool>& reachable) {
  out_.resize(nranks_);
  in_.resize(nranks_);
  control_out_.resize(nranks_);
  control_in_.resize(nranks_);
  const absl::Time deadline = absl::Now() + options_.timeout;
  std::vector<std::unique_ptr<Endpoint>> accepted;
  std::vector<std::pair<Endpoint*, uint32_t>> dialed;
  LBCC_RETURN_IF_ERROR(OpenEndpoints(addresses, reachable, deadline, &accepted, &dialed));
  std::vector<uint32_t> peer_of;
  LBCC_RETURN_IF_ERROR(ExchangeHellos(accepted, dialed, deadline, &peer_of));
  for (size_t i = 0; i < accepted.size(); ++i) {
    const bool control = (peer_of[i] & kControlHello) != 0;
    const bool reversed = (peer_of[i] & kReverseHello) != 0;
    const uint32_t peer = peer_of[i] & ~(kControlHello | kReverseHello);
    // A reversed connection carries this rank's sends to the peer that dialed it.
    std::vector<std::unique_ptr<Endpoint>>& slot =
        reversed ? (control ? control_out_ : out_) : (control ? control_in_ : in_);
    if (peer >= static_cast<uint32_t>(nranks_) || peer == static_cast<uint32_t>(rank_) ||
        slot[peer] || (reversed && reachable[peer])) {
      return absl::InternalError(absl::StrCat("comm: unexpected hello from rank ", peer));
    }
    slot[peer] = std::move(accepted[i]);
  }
  connected_ = true;
  return absl::OkStatus();
}

absl::Status Fabric::OpenEndpoints(const std::vector<std::string>& addresses,
                                   const std::vector<bool>& reachable, absl::Time deadline,
                                   std::vector<std::unique_ptr<Endpoint>>* accepted,
                                   std::vector<std::pair<Endpoint*, uint32_t>>* dialed) {
  // Per peer: both reachable, each dials its data and control connection to the other; one
  // unreachable, it dials those and the other's two as well (reversed); so this rank accepts
  // 2 connections from a reachable peer when it is reachable itself, 4 from an unreachable one,
  // and none when it is unreachable.
  const bool me_reachable = reachable[rank_];
  int to_accept = 0;
  for (int peer = 0; peer < nranks_; ++peer) {
    if (peer == rank_ || !me_reachable) continue;
    to_accept += reachable[peer] ? 2 : 4;
  }
  absl::Status accept_status;
  std::thread acceptor([&] {
    for (int i = 0; i < to_accept; ++i) {
      absl::StatusOr<std::unique_ptr<Endpoint>> endpoint =
          transport_->Accept(deadline - absl::Now());
      if (!endpoint.ok()) {
        accept_status = Annotate(endpoint.status(), "comm: accept");
        return;
      }
      accepted->push_back(*std::move(endpoint));
    }
  });
  absl::Status connect_status;
  const uint32_t me = static_cast<uint32_t>(rank_);
  for (int peer = 0; peer < nranks_ && connect_status.ok(); ++peer) {
    if (peer == rank_ || !reachable[peer]) continue;  // an unreachable peer dials this rank
    transport::ConnectOptions connect_options;
    connect_options.has_link_class = true;
    connect_options.link_class = topology_.link(rank_, peer) == LinkClass::kFast
                                     ? transport::LinkClass::kFast
                                     : transport::LinkClass::kSlow;
    struct Use {
      std::vector<std::unique_ptr<Endpoint>>* slot;
      uint32_t hello;
    };
    std::vector<Use> uses = {{&out_, me}, {&control_out_, me | kControlHello}};
    if (!me_reachable) {
      uses.push_back({&in_, me | kReverseHello});
      uses.push_back({&control_in_, me | kControlHello | kReverseHello});
    }
    for (const Use& use : uses) {
      absl::StatusOr<std::unique_ptr<Endpoint>> endpoint =
          transport_->Connect(addresses[peer], deadline - absl::Now(), connect_options);
      if (!endpoint.ok()) {
        connect_status = WithFailedPeer(
            Annotate(endpoint.status(), absl::StrCat("comm: connect to rank ", peer)), peer);
        break;
      }
      (*use.slot)[peer] = *std::move(endpoint);
      dialed->emplace_back((*use.slot)[peer].get(), use.hello);
    }
  }
  acceptor.join();
  LBCC_RETURN_IF_ERROR(connect_status);
  return accept_status;
}

absl::Status Fabric::ExchangeHellos(std::vector<std::unique_ptr<Endpoint>>& accepted,
                                    const std::vector<std::pair<Endpoint*, uint32_t>>& dialed,
                                    absl::Time deadline, std::vector<uint32_t>* peer_of) {
  peer_of->assign(accepted.size(), 0);
  auto latch = std::make_shared<Latch>();
  {
    MutexLock lock(&latch->mu);
    latch->pending = static_cast<int>(dialed.size() + accepted.size());
  }
  auto done = [latch](const absl::Status& status) {
    MutexLock lock(&latch->mu);
    if (!status.ok() && latch->first_error.ok()) latch->first_error = status;
    --latch->pending;
    latch->cv.SignalAll();
  };
  // The hellos' bytes must outlive their sends: kept with the latch.
  auto hellos = std::make_shared<std::vector<uint32_t>>();
  for (const auto& [endpoint, hello] : dialed) hellos->push_back(hello);
  for (size_t i = 0; i < dialed.size(); ++i) {
    dialed[i].first->Send(
        kHelloTag,
        absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(&(*hellos)[i]), 4), {},
        [done, hellos](absl::Status s) { done(s); });
  }
  for (size_t i = 0; i < accepted.size(); ++i) {
    accepted[i]->Recv(kHelloTag,
                      absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(&(*peer_of)[i]), 4),
                      [done](absl::StatusOr<size_t> n) {
                        done(n.ok() && *n != 4 ? absl::DataLossError("comm: bad hello")
                                               : n.status());
                      });
  }
  absl::Status status;
  {
    MutexLock lock(&latch->mu);
    while (latch->pending > 0) {
      if (latch->cv.WaitWithDeadline(&latch->mu, deadline) && latch->pending > 0) {
        status = absl::DeadlineExceededError("comm: peers did not say hello in time");
        break;
      }
    }
    if (status.ok()) status = latch->first_error;
  }
  if (status.ok()) return status;
  for (auto* endpoints : {&out_, &control_out_, &in_, &control_in_}) {
    for (auto& e : *endpoints) {
      if (e) e->Close();
    }
  }
  for (auto& e : accepted) e->Close();
  MutexLock lock(&latch->mu);
  while (latch->pending > 0) latch->cv.Wait(&latch->mu);  // Close() completes everything.
  return status;
}

Fabric::~Fabric() {
  // Orderly close: a rank may still be receiving the last message of an operation that already
  // completed here, so say goodbye to everyone and close only once everyone said goodbye (or
  // failed). Skipped when the fabric was aborted: peers are failing anyway; and when Create()
  // failed before every endpoint existed.
  if (connected_ && aborted().ok() && nranks_ > 1) {
    const absl::Time deadline = absl::Now() + std::min(options_.timeout, kByeTimeout);
    Batch batch(this, deadline);
    const uint8_t bye = 0;
    for (int peer = 0; peer < nranks_; ++peer) {
      if (peer == rank_) continue;
      batch.Send(peer, kByeTag, absl::Span<const uint8_t>(&bye, 1));
    }
    std::vector<std::string> byes(nranks_);
    for (int peer = 0; peer < nranks_; ++peer) {
      if (peer != rank_) batch.RecvAny(peer, kByeTag, &byes[peer], 1);
    }
    const absl::Status status = batch.Wait();
    LBCC_LOG_IF(INFO, !status.ok()) << "comm: rank " << rank_ << " closing: " << status;
  }
  // Peers may still be deciding an operation this rank already decided (after a failure
  // especially): answer their queries until each said goodbye on the control connections too,
  // or is lost.
  if (agreement_ != nullptr && nranks_ > 1) {
    const absl::Status status =
        agreement_->Linger(absl::Now() + std::min(options_.timeout, kByeTimeout));
    LBCC_LOG_IF(INFO, !status.ok()) << "comm: rank " << rank_ << " closing control: " << status;
  }
  Abort(absl::CancelledError("communicator destroyed"));
  CloseControl();
}

void Fabric::CloseControl() {
  if (agreement_ != nullptr) agreement_->Stop();
  for (auto* endpoints : {&control_out_, &control_in_}) {
    for (auto& e : *endpoints) {
      if (e) e->Close();
    }
  }
}

void Fabric::AbortWithControl(absl::Status why) {
  Abort(std::move(why));
  CloseControl();
}

void Fabric::CrashForTesting() {
  Abort(absl::UnavailableError("crashed (test)"));
  CloseControl();
}

OutcomeAgreement* Fabric::agreement() const { return agreement_.get(); }

bool AbortRecord::Set(absl::Status why, bool by_caller) {
  MutexLock lock(&mu_);
  if (!why_.ok()) return false;
  why_ = why.ok() ? absl::CancelledError("aborted") : std::move(why);
  by_caller_ = by_caller;
  return true;
}

absl::Status AbortRecord::status() const {
  MutexLock lock(&mu_);
  return why_;
}

absl::Status AbortRecord::caller_abort() const {
  MutexLock lock(&mu_);
  return by_caller_ ? why_ : absl::OkStatus();
}

absl::Status AbortRecord::Explain(absl::Status failure) const {
  if (failure.ok()) return failure;
  const absl::Status why = caller_abort();
  if (why.ok()) return failure;
  return absl::CancelledError(absl::StrCat(why.message(), " while the operation was pending (",
                                           failure.ToString(), ")"));
}

void AbortRecord::MarkClosed() {
  MutexLock lock(&mu_);
  closed_ = true;
}

void AbortRecord::AwaitClosed(absl::Duration timeout) const {
  MutexLock lock(&mu_);
  mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_; }, timeout);
}

void Fabric::Abort(absl::Status why, bool by_caller) {
  if (!abort_->Set(why, by_caller)) return;
  LBCC_LOG_IF(INFO, !absl::IsCancelled(why)) << "comm: rank " << rank_ << " aborts: " << why;
  for (auto& e : out_) {
    if (e) e->Close();
  }
  for (auto& e : in_) {
    if (e) e->Close();
  }
  abort_->MarkClosed();
}

absl::Status Fabric::aborted() const { return abort_->status(); }

Fabric::ClassBytes Fabric::BytesByClass() const {
  ClassBytes bytes;
  for (int peer = 0; peer < nranks_; ++peer) {
    if (peer == rank_) continue;
    const bool slow = topology_.link(rank_, peer) == LinkClass::kSlow;
    const uint64_t sent = out_[peer] ? out_[peer]->counters().bytes_sent : 0;
    const uint64_t received = in_[peer] ? in_[peer]->counters().bytes_received : 0;
    (slow ? bytes.slow_sent : bytes.fast_sent) += sent;
    (slow ? bytes.slow_received : bytes.fast_received) += received;
  }
  return bytes;
}

transport::LinkCounters Fabric::Counters(int peer) const {
  transport::LinkCounters counters;
  if (peer == rank_ || peer < 0 || peer >= nranks_) return counters;
  if (out_[peer]) counters = out_[peer]->counters();
  if (in_[peer]) {
    const transport::LinkCounters in = in_[peer]->counters();
    counters.bytes_received = in.bytes_received;
    counters.messages_received = in.messages_received;
    counters.chunks_received = in.chunks_received;
    counters.recv_bytes_per_second = in.recv_bytes_per_second;
  }
  return counters;
}

absl::Status NoAnswerError(const std::vector<int>& receives_pending_by_rank,
                           const std::vector<int>& sends_pending_by_rank) {
  auto list = [](const std::vector<int>& pending) {
    std::vector<int> ranks;
    for (size_t r = 0; r < pending.size(); ++r) {
      if (pending[r] > 0) ranks.push_back(static_cast<int>(r));
    }
    std::string out = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) absl::StrAppend(&out, i ? ", " : "", ranks[i]);
    return ranks.empty() ? std::string() : out;
  };
  const std::string receiving = list(receives_pending_by_rank);
  if (!receiving.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no answer from ", receiving, " before the communicator's timeout (still receiving)"));
  }
  const std::string sending = list(sends_pending_by_rank);
  return absl::DeadlineExceededError(absl::StrCat(
      sending.empty() ? "a peer" : sending,
      " did not take what this rank sent before the communicator's timeout"));
}

struct Batch::State {
  Mutex mu;
  CondVar cv;
  int pending ABSL_GUARDED_BY(mu) = 0;
  absl::Status first_error ABSL_GUARDED_BY(mu);
  // Per peer: receives and sends not completed yet (for the DeadlineExceeded).
  std::vector<int> receives ABSL_GUARDED_BY(mu), sends ABSL_GUARDED_BY(mu);
  void Count(int peer, bool receive) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<int>& v = receive ? receives : sends;
    if (static_cast<size_t>(peer) >= v.size()) v.resize(peer + 1, 0);
    ++v[peer];
    ++pending;
  }
};

Batch::Batch(Fabric* fabric, absl::Time deadline)
    : fabric_(fabric), deadline_(deadline), state_(std::make_shared<State>()) {}

Batch::~Batch() {
  MutexLock lock(&state_->mu);
  while (state_->pending > 0) state_->cv.Wait(&state_->mu);
}

void Batch::Done(const absl::Status& status, int peer, bool receive) {
  MutexLock lock(&state_->mu);
  if (!status.ok() && state_->first_error.ok()) state_->first_error = status;
  --(receive ? state_->receives : state_->sends)[peer];
  --state_->pending;
  state_->cv.SignalAll();
}

void Batch::Send(int peer, transport::Tag tag, absl::Span<const uint8_t> data,
                 transport::Priority priority) {
  {
    MutexLock lock(&state_->mu);
    state_->Count(peer, /*receive=*/false);
  }
  fabric_->out(peer)->Send(tag, data, {priority}, [this, peer](absl::Status status) {
    Done(Annotate(status, absl::StrCat("send to rank ", peer)), peer, false);
  });
}

void Batch::Recv(int peer, transport::Tag tag, absl::Span<uint8_t> buffer) {
  {
    MutexLock lock(&state_->mu);
    state_->Count(peer, /*receive=*/true);
  }
  const size_t expected = buffer.size();
  fabric_->in(peer)->Recv(tag, buffer, [this, peer, expected](absl::StatusOr<size_t> n) {
    absl::Status status = n.status();
    if (n.ok() && *n != expected) {
      status = absl::DataLossError(
          absl::StrCat("expected ", expected, " bytes, the message has ", *n));
    }
    Done(Annotate(status, absl::StrCat("receive from rank ", peer)), peer, true);
  });
}

void Batch::RecvAny(int peer, transport::Tag tag, std::string* out, size_t max_bytes) {
  {
    MutexLock lock(&state_->mu);
    state_->Count(peer, /*receive=*/true);
  }
  fabric_->in(peer)->Recv(
      tag,
      [out, max_bytes](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
        if (size > max_bytes) {
          return absl::DataLossError(
              absl::StrCat("message of ", size, " bytes exceeds the limit of ", max_bytes));
        }
        out->resize(size);
        return absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(out->data()), size);
      },
      [this, peer](absl::StatusOr<size_t> n) {
        Done(Annotate(n.status(), absl::StrCat("receive from rank ", peer)), peer, true);
      });
}

absl::Status Batch::Wait() {
  absl::Status status;
  {
    MutexLock lock(&state_->mu);
    while (state_->pending > 0 && state_->first_error.ok()) {
      if (state_->cv.WaitWithDeadline(&state_->mu, deadline_) && state_->pending > 0 &&
          state_->first_error.ok()) {
        status = NoAnswerError(state_->receives, state_->sends);
        break;
      }
    }
    if (status.ok()) status = state_->first_error;
  }
  if (!status.ok()) {
    // Fail fast everywhere: closing every endpoint fails our pending work (so no callback
    // touches the caller's buffers after we return) and the peers' work with Unavailable.
    fabric_->Abort(status);
    MutexLock lock(&state_->mu);
    while (state_->pending > 0) state_->cv.Wait(&state_->mu);
  }
  return status;
}

}  // namespace lbcc::comm
