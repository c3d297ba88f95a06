#include "transport/link_setup.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "transport/options.h"

namespace lbcc::transport {
namespace {

// First size of the link probe.
constexpr int64_t kProbeFirstBytes = 64 << 10;
// Largest probe transfer of a link configured slow (its rates pace bulk, see
// LinkSetup::probe_configured_slow_): enough for a shaped link, cheap for a test's loopback.
constexpr int64_t kConfiguredSlowProbeBytes = 4 << 20;
// Largest single probe transfer a peer may ask us for.
constexpr uint64_t kProbeLimitBytes = uint64_t{1} << 30;

uint64_t EncodeClass(std::optional<LinkClass> link_class) {
  if (!link_class.has_value()) return 0;
  return *link_class == LinkClass::kSlow ? 2 : 1;
}

std::optional<LinkClass> DecodeClass(uint64_t value) {
  if (value == 2) return LinkClass::kSlow;
  if (value == 1) return LinkClass::kFast;
  return std::nullopt;
}

ControlMessage Message(Ctl type) {
  ControlMessage message;
  message.header.type = static_cast<uint32_t>(type);
  message.header.version = kWireVersion;
  return message;
}

// Every member of a job runs the same wire format: a peer on another LBCC build is refused at
// its HELLO / WELCOME, before any chunk of it is read, with both versions named.
std::string VersionMismatch(uint32_t theirs) {
  return absl::StrCat("it speaks LBCC wire version ", theirs, ", this build ", kWireVersion,
                      " (every member of a job must run the same LBCC release)");
}

// The header's 16-byte slots: any two 8-byte fields (u64 or double bits).
void PutBytes(const uint8_t* bytes, void* lo, void* hi) {
  std::memcpy(lo, bytes, 8);
  std::memcpy(hi, bytes + 8, 8);
}
std::array<uint8_t, 16> GetBytes(const void* lo, const void* hi) {
  std::array<uint8_t, 16> bytes;
  std::memcpy(bytes.data(), lo, 8);
  std::memcpy(bytes.data() + 8, hi, 8);
  return bytes;
}

uint32_t AuthFlags(const SecurityOptions& security) {
  return kAuthFlag | static_cast<uint32_t>(security.encrypt) << 1;
}

EncryptMode FlagsMode(uint32_t flags) {
  const uint32_t mode = (flags >> 1) & 3;
  return mode <= 2 ? static_cast<EncryptMode>(mode) : EncryptMode::kAll;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The class rule.

std::optional<LinkClass> SlowWins(std::optional<LinkClass> mine,
                                  std::optional<LinkClass> theirs) {
  if (mine == LinkClass::kSlow || theirs == LinkClass::kSlow) return LinkClass::kSlow;
  if (mine.has_value() || theirs.has_value()) return LinkClass::kFast;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Messages.

bool IsSetupMessage(uint32_t type) {
  switch (static_cast<Ctl>(type)) {
    case Ctl::kHello:
    case Ctl::kWelcome:
    case Ctl::kReady:
    case Ctl::kPing:
    case Ctl::kPong:
    case Ctl::kProbeData:
    case Ctl::kProbeAck:
    case Ctl::kProbeRequest:
    case Ctl::kAuth:
      return true;
    case Ctl::kCredit:
    case Ctl::kHeartbeat:
      return false;
  }
  return false;
}

ControlMessage HelloMessage(uint64_t conn_id) {
  ControlMessage hello = Message(Ctl::kHello);
  hello.header.conn_id = conn_id;
  return hello;
}

ControlMessage HeartbeatMessage() { return Message(Ctl::kHeartbeat); }

ControlMessage LinkSetup::Ready(uint64_t conn_id, const LinkParams& params) {
  ControlMessage ready = Message(Ctl::kReady);
  ready.header.conn_id = conn_id;
  ready.header.a = params.link_class == LinkClass::kSlow ? 1 : 0;
  ready.header.x = params.probe.send_bytes_per_second;
  ready.header.y = params.probe.recv_bytes_per_second;
  ready.header.z = params.probe.rtt_seconds;
  return ready;
}

// ---------------------------------------------------------------------------------------------
// Probe buffers.

std::shared_ptr<std::vector<uint8_t>> ProbeScratch::Get(size_t bytes) {
  MutexLock lock(&mu_);
  std::shared_ptr<std::vector<uint8_t>>& buffer = buffers_[bytes];
  if (buffer == nullptr) buffer = std::make_shared<std::vector<uint8_t>>(bytes);
  return buffer;
}

void ProbeScratch::Reserve(uint64_t max_bytes) {
  for (uint64_t bytes = std::min<uint64_t>(kProbeFirstBytes, max_bytes); bytes > 0;
       bytes = bytes >= max_bytes ? 0 : std::min<uint64_t>(bytes * 4, max_bytes)) {
    Get(std::min<uint64_t>(bytes, kProbeLimitBytes));
  }
}

// ---------------------------------------------------------------------------------------------
// LinkSetup.

LinkSetup::LinkSetup(Role role, const TransportOptions& options, std::string peer,
                     HostPort peer_address)
    : role_(role),
      peer_(std::move(peer)),
      configured_(options.ConfiguredClass(peer_address.host, peer_address.port)),
      slow_threshold_bits_per_second_(options.slow_threshold_bits_per_second),
      probe_max_bytes_(options.probe_max_bytes),
      probe_min_time_(options.probe_min_time),
      slow_stripes_(std::max(1, options.scheduler.stripes)),
      probe_configured_slow_(options.scheduler.bulk_yield &&
                             options.scheduler.pace_bytes_per_second <= 0),
      security_(options.security) {}

ControlMessage LinkSetup::Hello(uint64_t conn_id, uint32_t lane) {
  ControlMessage hello = HelloMessage(conn_id);
  if (!security_.enabled()) return hello;
  MutexLock lock(&mu_);
  hello.header.reserved = AuthFlags(security_);
  if (lane == 0) {
    transcript_ = HandshakeTranscript{};
    transcript_.job_id = security_.job_id;
    transcript_.link_id = conn_id;
    transcript_.client_identity = security_.identity;
    transcript_.client_nonce = NewNonce();
    transcript_.client_flags = hello.header.reserved;
    authenticated_ = false;
    PutBytes(transcript_.client_nonce.data(), &hello.header.a, &hello.header.b);
    std::memcpy(&hello.header.x, &security_.identity, 8);
  } else {
    const Mac mac = StripeMac(*security_.secret, transcript_, lane);
    PutBytes(mac.data(), &hello.header.a, &hello.header.b);
  }
  return hello;
}

LinkSetup::Step LinkSetup::Refuse(absl::string_view why) {
  RefuseConnection(peer_, why);
  Step step;
  step.refuse = true;
  return step;
}

LinkSetup::Step LinkSetup::ServeHello(const ControlHeader& h) {
  Step step;
  if (!security_.enabled()) {
    // The client authenticates and we cannot: tell it, so it fails with a clear error.
    step.admit = true;
    step.reply = Message(Ctl::kWelcome);
    step.reply->header.conn_id = h.conn_id;
    step.reply->header.a = EncodeClass(configured_);
    return step;
  }
  if ((h.reserved & kAuthFlag) == 0) {
    step = Refuse("it offers no job secret (LBCC_JOB_SECRET) and this job requires one");
    // A WELCOME asking for authentication lets an LBCC client without a secret say why.
    step.reply = Message(Ctl::kWelcome);
    step.reply->header.reserved = kAuthFlag;
    return step;
  }
  if (h.lane == 0) {
    if (authenticated_) {
      return Refuse(absl::StrCat("a second handshake for link ", h.conn_id,
                                 ", already authenticated (a replay?)"));
    }
    hello_seen_ = true;
    transcript_ = HandshakeTranscript{};
    transcript_.job_id = security_.job_id;
    transcript_.link_id = h.conn_id;
    std::memcpy(&transcript_.client_identity, &h.x, 8);
    const std::array<uint8_t, 16> nonce = GetBytes(&h.a, &h.b);
    std::memcpy(transcript_.client_nonce.data(), nonce.data(), kNonceBytes);
    transcript_.client_flags = h.reserved;
    transcript_.server_identity = security_.identity;
    transcript_.server_nonce = NewNonce();
    transcript_.server_flags = AuthFlags(security_);
    const Mac mac = HandshakeMac(*security_.secret, transcript_, HandshakeRole::kServer);
    step.admit = true;
    step.reply = Message(Ctl::kWelcome);
    ControlHeader& w = step.reply->header;
    w.conn_id = security_.identity;
    w.a = EncodeClass(configured_);
    PutBytes(transcript_.server_nonce.data(), &w.b, &w.x);
    PutBytes(mac.data(), &w.y, &w.z);
    w.reserved = transcript_.server_flags;
    return step;
  }
  // A further connection (a stripe) of an authenticated link carries its own proof.
  const std::array<uint8_t, 16> got = GetBytes(&h.a, &h.b);
  Mac mac;
  std::memcpy(mac.data(), got.data(), kMacBytes);
  if (!authenticated_ || !MacEqual(mac, StripeMac(*security_.secret, transcript_, h.lane))) {
    return Refuse(absl::StrCat("connection ", h.lane, " of link ", h.conn_id,
                               " carries no valid proof"));
  }
  step.admit = true;
  step.reply = Message(Ctl::kWelcome);
  step.reply->header.conn_id = h.conn_id;
  step.reply->header.a = EncodeClass(configured_);
  step.reply->header.reserved = transcript_.server_flags;
  return step;
}

LinkSetup::Step LinkSetup::ServeAuth(const ControlHeader& h) {
  if (!security_.enabled()) return Refuse("it sent a proof this end cannot check (no secret)");
  if (!hello_seen_ || authenticated_) {
    return Refuse("a proof without a handshake in progress (a replay?)");
  }
  const std::array<uint8_t, 16> got = GetBytes(&h.a, &h.b);
  Mac mac;
  std::memcpy(mac.data(), got.data(), kMacBytes);
  if (!MacEqual(mac, HandshakeMac(*security_.secret, transcript_, HandshakeRole::kClient))) {
    hello_seen_ = false;  // This handshake is over; a new one needs a new HELLO (and nonce).
    return Refuse("it does not hold this job's secret (its handshake proof is wrong)");
  }
  authenticated_ = true;
  CountHandshake(true);
  return Step{};
}

bool LinkSetup::TakeWelcome(const ControlHeader& h) {
  const bool theirs_auth = (h.reserved & kAuthFlag) != 0;
  if (!security_.enabled()) {
    if (theirs_auth && failure_.ok()) {
      RefuseConnection(peer_, "it requires a job secret and this end has none");
      failure_ = absl::PermissionDeniedError(absl::StrCat(
          peer_, " requires a job secret: set LBCC_JOB_SECRET or LBCC_JOB_SECRET_FILE"));
    }
    return !theirs_auth;
  }
  if (h.lane != 0) return true;  // A stripe's WELCOME: its data is sealed with the link's keys.
  if (!theirs_auth) {
    if (failure_.ok()) {
      RefuseConnection(peer_, "it does not authenticate (no job secret)");
      failure_ = absl::PermissionDeniedError(
          absl::StrCat(peer_, " does not authenticate: it has no job secret"));
    }
    return false;
  }
  transcript_.server_identity = h.conn_id;
  const std::array<uint8_t, 16> nonce = GetBytes(&h.b, &h.x);
  std::memcpy(transcript_.server_nonce.data(), nonce.data(), kNonceBytes);
  transcript_.server_flags = h.reserved;
  const std::array<uint8_t, 16> got = GetBytes(&h.y, &h.z);
  Mac mac;
  std::memcpy(mac.data(), got.data(), kMacBytes);
  if (!MacEqual(mac, HandshakeMac(*security_.secret, transcript_, HandshakeRole::kServer))) {
    if (failure_.ok()) {
      RefuseConnection(peer_, "it does not hold this job's secret (its handshake proof is wrong)");
      failure_ = absl::PermissionDeniedError(
          absl::StrCat(peer_, " does not hold this job's secret (its handshake proof is wrong)"));
    }
    return false;
  }
  authenticated_ = true;
  CountHandshake(true);
  return true;
}

absl::StatusOr<std::shared_ptr<SecureChannel>> LinkSetup::Channel(LinkClass link_class) {
  if (!security_.enabled()) return std::shared_ptr<SecureChannel>();
  const uint32_t theirs =
      role_ == Role::kClient ? transcript_.server_flags : transcript_.client_flags;
  const bool encrypt =
      EncryptLink(security_.encrypt, FlagsMode(theirs), link_class == LinkClass::kSlow);
  return SecureChannel::Create(*security_.secret, transcript_,
                               role_ == Role::kClient ? HandshakeRole::kClient
                                                      : HandshakeRole::kServer,
                               encrypt, peer_);
}

LinkSetup::Step LinkSetup::OnControl(const ControlHeader& h, ProbeScratch& scratch) {
  Step step;
  if (h.version != kWireVersion) {
    if (role_ == Role::kServer && static_cast<Ctl>(h.type) == Ctl::kHello) {
      MutexLock lock(&mu_);
      return Refuse(VersionMismatch(h.version));
    }
    if (role_ == Role::kClient && static_cast<Ctl>(h.type) == Ctl::kWelcome) {
      MutexLock lock(&mu_);
      if (failure_.ok()) {
        RefuseConnection(peer_, VersionMismatch(h.version));
        failure_ = absl::FailedPreconditionError(
            absl::StrCat(peer_, ": ", VersionMismatch(h.version)));
      }
      return step;
    }
  }
  if (role_ == Role::kServer &&
      (security_.enabled() || (static_cast<Ctl>(h.type) == Ctl::kHello && h.reserved != 0))) {
    MutexLock lock(&mu_);
    switch (static_cast<Ctl>(h.type)) {
      case Ctl::kHello:
        return ServeHello(h);
      case Ctl::kAuth:
        return ServeAuth(h);
      default:
        // Nothing but the handshake is answered before the client's proof verified.
        if (!authenticated_) {
          return Refuse(absl::StrCat("set-up message ", h.type, " before authentication"));
        }
        break;
    }
  }
  switch (static_cast<Ctl>(h.type)) {
    // Served by either end.
    case Ctl::kHello:
      // Every connection of the link is admitted here (an authentication step decides).
      step.admit = true;
      step.reply = Message(Ctl::kWelcome);
      step.reply->header.conn_id = h.conn_id;
      step.reply->header.a = EncodeClass(configured_);
      return step;
    case Ctl::kPing:
      // A client about to probe announces its largest transfer: allocate the buffers now, not
      // inside the timed transfers.
      scratch.Reserve(h.b);
      step.reply = Message(Ctl::kPong);
      step.reply->header.a = h.a;
      return step;
    case Ctl::kProbeRequest:
      step.reply = Message(Ctl::kProbeData);
      step.reply->header.a = h.a;
      step.reply->payload = scratch.Get(std::min<uint64_t>(h.b, kProbeLimitBytes));
      return step;
    case Ctl::kProbeData:
      if (role_ == Role::kServer) {
        step.reply = Message(Ctl::kProbeAck);
        step.reply->header.a = h.a;
        return step;
      }
      break;
    default:
      break;
  }
  MutexLock lock(&mu_);
  return RecordLocked(h);
}

LinkSetup::Step LinkSetup::RecordLocked(const ControlHeader& h) {
  Step step;
  switch (static_cast<Ctl>(h.type)) {
    case Ctl::kWelcome:
      if (role_ != Role::kClient) break;
      if (!TakeWelcome(h)) break;  // failure_ says why; AwaitWelcomes returns it.
      ++welcomes_;
      theirs_ = DecodeClass(h.a);
      break;
    case Ctl::kAuth:  // A client never takes a proof: only a server asks for one.
      step = Refuse("it sent a proof to the connecting side");
      break;
    case Ctl::kPong:
      pong_seq_ = std::max(pong_seq_, h.a);
      break;
    case Ctl::kProbeAck:
      probe_ack_seq_ = std::max(probe_ack_seq_, h.a);
      break;
    case Ctl::kProbeData:  // Client: the reply to a ProbeRequest arrived in full.
      probe_data_seq_ = std::max(probe_data_seq_, h.a);
      break;
    case Ctl::kReady: {
      if (role_ != Role::kServer || ready_) break;
      ready_ = true;
      LinkParams params;
      params.link_class = h.a == 1 ? LinkClass::kSlow : LinkClass::kFast;
      params.probe.send_bytes_per_second = h.y;  // The client's receive rate is our send rate.
      params.probe.recv_bytes_per_second = h.x;
      params.probe.rtt_seconds = h.z;
      absl::StatusOr<std::shared_ptr<SecureChannel>> channel = Channel(params.link_class);
      if (!channel.ok()) {
        LBCC_LOG(WARN) << "link from " << peer_ << ": " << channel.status();
        return Refuse("its link keys could not be derived");
      }
      params.channel = *std::move(channel);
      LBCC_LOG_IF(INFO, params.channel != nullptr)
          << "link from " << peer_ << " authenticated, "
          << (params.channel->encrypt() ? "encrypted" : "not encrypted");
      step.ready = params;
      break;
    }
    default:
      LBCC_LOG(WARN) << "unknown control message " << h.type << " from " << peer_;
      break;
  }
  return step;
}

void LinkSetup::Fail(absl::Status status) {
  MutexLock lock(&mu_);
  if (failure_.ok()) failure_ = std::move(status);
}

void LinkSetup::ClearFailure() {
  MutexLock lock(&mu_);
  failure_ = absl::OkStatus();
}

void LinkSetup::Cancel(absl::Status status) {
  MutexLock lock(&mu_);
  if (cancelled_.ok()) cancelled_ = std::move(status);
}

template <typename Pred>
absl::Status LinkSetup::Await(Pred done, absl::Time deadline, absl::string_view what) {
  MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done() || !failure_.ok() || !cancelled_.ok();
  };
  if (!mu_.AwaitWithDeadline(ready, deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(what, " from ", peer_, " timed out"));
  }
  if (!cancelled_.ok()) return cancelled_;
  if (!done()) return failure_;
  return absl::OkStatus();
}

absl::Status LinkSetup::AwaitWelcomes(int connections, absl::Time deadline) {
  return Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return welcomes_ >= connections; },
               deadline, "handshake");
}

absl::StatusOr<ProbeResult> LinkSetup::Probe(SetupWire& wire, absl::Time deadline,
                                             int64_t max_bytes) {
  const bool rates = max_bytes > 0;
  ProbeResult result;
  uint64_t seq = 0;
  double rtt = 1e9;
  for (int i = 0; i < 3; ++i) {
    ControlMessage ping = Message(Ctl::kPing);
    ping.header.a = ++seq;
    ping.header.b = rates && i == 0 ? static_cast<uint64_t>(max_bytes) : 0;
    const absl::Time start = absl::Now();
    wire.Send(std::move(ping));
    LBCC_RETURN_IF_ERROR(Await(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pong_seq_ >= seq; }, deadline, "ping"));
    rtt = std::min(rtt, absl::ToDoubleSeconds(absl::Now() - start));
  }
  result.rtt_seconds = rtt;
  if (!rates) return result;

  // One direction: transfers grow until one takes probe_min_time or reaches max_bytes, and
  // there are at least two; the rate is the best of those that took probe_min_time (a
  // transfer a busy host stalls reads low, never high), or of the last.
  auto measure = [&](bool up) -> absl::StatusOr<double> {
    int64_t bytes = std::min<int64_t>(kProbeFirstBytes, max_bytes);
    double best = 0;
    for (int transfers = 1;; ++transfers) {
      ControlMessage message = Message(up ? Ctl::kProbeData : Ctl::kProbeRequest);
      message.header.a = ++seq;
      const uint64_t want = seq;
      if (up) {
        message.payload = std::make_shared<std::vector<uint8_t>>(bytes);
      } else {
        message.header.b = static_cast<uint64_t>(bytes);
      }
      const absl::Time start = absl::Now();
      wire.Send(std::move(message));
      if (up) {
        LBCC_RETURN_IF_ERROR(Await(
            [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return probe_ack_seq_ >= want; },
            deadline, "probe"));
      } else {
        LBCC_RETURN_IF_ERROR(Await(
            [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return probe_data_seq_ >= want; },
            deadline, "probe"));
      }
      const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
      // The round trip is not transfer time; keep at least half the sample.
      const double rate = bytes / std::max(elapsed - rtt, elapsed / 2);
      const bool long_enough = elapsed >= absl::ToDoubleSeconds(probe_min_time_);
      if (long_enough) best = std::max(best, rate);
      if ((long_enough || bytes >= max_bytes) && transfers >= 2) return std::max(best, rate);
      // Grow until a transfer takes probe_min_time; after that, repeat the size once more.
      if (!long_enough) bytes = std::min<int64_t>(bytes * 4, max_bytes);
    }
  };
  LBCC_ASSIGN_OR_RETURN(result.send_bytes_per_second, measure(/*up=*/true));
  LBCC_ASSIGN_OR_RETURN(result.recv_bytes_per_second, measure(/*up=*/false));
  return result;
}

absl::StatusOr<LinkParams> LinkSetup::Negotiate(SetupWire& wire, const ConnectOptions& options,
                                                absl::Time deadline, bool measure) {
  if (security_.enabled()) {
    // The client's proof goes first; the server answers nothing else before it.
    ControlMessage auth = Message(Ctl::kAuth);
    {
      MutexLock lock(&mu_);
      auth.header.conn_id = transcript_.link_id;
      if (!authenticated_) {
        return absl::InternalError(absl::StrCat("link to ", peer_, " negotiated before WELCOME"));
      }
      const Mac mac = HandshakeMac(*security_.secret, transcript_, HandshakeRole::kClient);
      PutBytes(mac.data(), &auth.header.a, &auth.header.b);
    }
    wire.Send(std::move(auth));
  }
  // The link class: explicit, configured on either side (slow wins), or measured.
  std::optional<LinkClass> link_class;
  if (options.has_link_class) {
    link_class = options.link_class;
  } else {
    std::optional<LinkClass> theirs;
    {
      MutexLock lock(&mu_);
      theirs = theirs_;
    }
    link_class = SlowWins(configured_, theirs);
  }
  LinkParams params;
  if (measure) {
    // Rates: to classify the link, or for a link configured slow, to pace its bulk by.
    const int64_t rate_bytes =
        !link_class.has_value() ? probe_max_bytes_
        : *link_class == LinkClass::kSlow && probe_configured_slow_
            ? std::min<int64_t>(probe_max_bytes_, kConfiguredSlowProbeBytes)
            : 0;
    LBCC_ASSIGN_OR_RETURN(params.probe, Probe(wire, deadline, rate_bytes));
  }
  if (!link_class.has_value() && measure) {
    const double slowest =
        std::min(params.probe.send_bytes_per_second, params.probe.recv_bytes_per_second);
    link_class = slowest * 8 < slow_threshold_bits_per_second_ ? LinkClass::kSlow
                                                               : LinkClass::kFast;
    LBCC_LOG(INFO) << "link to " << peer_ << " probed at "
                   << params.probe.send_bytes_per_second * 8e-9 << " Gbit/s up, "
                   << params.probe.recv_bytes_per_second * 8e-9 << " Gbit/s down, rtt "
                   << params.probe.rtt_seconds * 1e6 << " us: " << LinkClassName(*link_class);
  } else if (params.probe.send_bytes_per_second > 0) {
    LBCC_LOG(INFO) << "link to " << peer_ << " configured slow, probed at "
                   << params.probe.send_bytes_per_second * 8e-6 << " Mbit/s up, "
                   << params.probe.recv_bytes_per_second * 8e-6
                   << " Mbit/s down (bulk yields below them)";
  }
  params.link_class = link_class.value_or(LinkClass::kFast);
  params.stripes = params.link_class == LinkClass::kSlow ? slow_stripes_ : 1;
  MutexLock lock(&mu_);
  LBCC_ASSIGN_OR_RETURN(params.channel, Channel(params.link_class));
  LBCC_LOG_IF(INFO, params.channel != nullptr)
      << "link to " << peer_ << " authenticated, "
      << (params.channel->encrypt() ? "encrypted" : "not encrypted");
  return params;
}

// ---------------------------------------------------------------------------------------------
// Liveness.

void PeerWatch::Start(absl::Time now) {
  running_ = true;
  last_heard_ = now;
  last_heartbeat_ = now;
}

PeerWatch::Verdict PeerWatch::Check(absl::Time now, absl::Duration peer_timeout, bool we_stalled,
                                    absl::FunctionRef<bool()> pending_work,
                                    absl::string_view peer) {
  Verdict verdict;
  const absl::Duration beat = peer_timeout / 4;
  if (we_stalled) last_heard_ = now;
  if (now - last_heartbeat_ >= beat) {
    last_heartbeat_ = now;
    verdict.send_heartbeat = true;
  }
  const absl::Duration silent = now - last_heard_;
  if (silent > peer_timeout && pending_work()) {
    verdict.failure = absl::UnavailableError(
        absl::StrCat("no word from ", peer, " for ", absl::FormatDuration(silent),
                     " (peer timeout ", absl::FormatDuration(peer_timeout), ")"));
  }
  return verdict;
}

bool WatchClock::StartRound(absl::Time now) {
  const absl::Duration beat = peer_timeout_ / 4;
  next_ = now + std::min(beat, absl::Milliseconds(100));
  const bool we_stalled = last_ != absl::InfinitePast() && now - last_ > beat;
  last_ = now;
  return we_stalled;
}

}  // namespace lbcc::transport
