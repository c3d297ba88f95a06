// Link set-up: everything two ends of a link agree on before data moves, negotiated once here
// for every backend (as tensorpipe's core does above its transports). A backend only moves the
// set-up messages below over its connection 0 (SetupWire) and hands what arrives to the link's
// LinkSetup; it never decides a link class itself.
//
// What lives here:
//   - (LinkRules, the LBCC_LINK_RULES_FILE parser, and SplitHostPort are in link_rules.h;
//     the wire version in wire_constants.h);
//   - the class rule: ConnectOptions, else either side's configuration (rules file, then
//     LBCC_LINK_CLASS) where slow wins, else the connect-time probe (SlowWins, LinkSetup);
//   - the set-up protocol (ControlHeader, Ctl): HELLO -> WELCOME -> [AUTH] -> [probe] -> READY,
//     run by a LinkSetup on each end (client: Connect's thread drives it; server: it answers);
//   - with a job secret (TransportOptions::security, transport/secure.h): mutual
//     authentication in HELLO / WELCOME / AUTH (a fresh nonce from each side, HMAC-SHA-256
//     proofs binding the job, the link id and both identities), a proof on every further
//     connection of the link, and the link's SecureChannel (per-direction AES-256-GCM keys) in
//     LinkParams; a connection that fails is refused (Step::refuse), logged at WARN and counted;
//   - the probe: three pings for the round trip, then transfers each way growing 4x from 64 KiB
//     until one takes probe_min_time or reaches probe_max_bytes (ProbeScratch keeps its buffers);
//   - PeerWatch: heartbeats on a running link and the silent-peer rule.
//
// The steps, in order; each new step goes into LinkSetup once and every backend runs it:
//   1. HELLO / WELCOME on each connection: the server's OnControl admits the connection to the
//      link (Step::admit) or refuses it (Step::refuse: the backend closes it), the one admission
//      point for every connection of every backend; the client's backend opens connection 0
//      (its HELLO from Hello()) and AwaitWelcomes() waits (and checks the server's proof);
//   2. Negotiate(): every client step over connection 0, in order: AUTH (the client's proof;
//      the server answers nothing else before it), then the class, then the probe; the backend
//      opens `stripes` - 1 more connections (step 1);
//   3. Ready(): READY tells the server the class and the probe figures; both ends configure
//      their Link with the same LinkParams, and only then does Accept() return the server's end.
//
// Implementations of SetupWire: the UCX backend (control active messages on connection 0) and
// the loopback backend (the peer's LinkSetup called in memory).
//
// Thread-safety: the free functions are pure. LinkSetup is thread-safe
// (its own mutex, never held while it calls SetupWire). ProbeScratch is thread-safe. PeerWatch
// and WatchClock are not: one backend context owns them (UCX: the worker).
#ifndef LBCC_TRANSPORT_LINK_SETUP_H_
#define LBCC_TRANSPORT_LINK_SETUP_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "transport/link_rules.h"
#include "transport/secure.h"
#include "transport/transport.h"
#include "transport/wire_constants.h"

namespace lbcc::transport {

struct TransportOptions;  // transport/options.h

// The configured class of a link from both ends' configuration: slow if either says slow, fast
// if either says fast, nullopt (measure) if neither says anything.
std::optional<LinkClass> SlowWins(std::optional<LinkClass> mine, std::optional<LinkClass> theirs);

// ---------------------------------------------------------------------------------------------
// Wire: control messages on a link's connections (set-up, heartbeats, and the backends' credits).
// Host byte order, like ChunkHeader. Never renumber a type.
enum class Ctl : uint32_t {
  kHello = 1,         // client -> server on each new connection: conn_id, lane
  kWelcome = 2,       // server -> client: a = server's configured class (0 none, 1 fast, 2 slow)
  kReady = 3,         // client -> server: a = class, x/y = client's send/recv rate, z = rtt
  kPing = 4,          // a = sequence, b = largest probe transfer to come (0: none)
  kPong = 5,          // a = sequence
  kProbeData = 6,     // a = sequence, payload = probe bytes
  kProbeAck = 7,      // server -> client: a = sequence of the ProbeData fully received
  kProbeRequest = 8,  // client -> server: a = sequence, b = bytes to send back as ProbeData
  kCredit = 9,        // a = bytes, b = priority of the chunks (a backend's lane, not set-up)
  kHeartbeat = 10,    // every peer_timeout / 4 on connection 0 of a running link
  kAuth = 11,         // client -> server: a/b = the client's proof (after WELCOME, connection 0)
};

// With a job secret, `reserved` carries kAuthFlag | encryption mode << 1 in HELLO and WELCOME,
// and the fields carry the handshake (transport/secure.h):
//   HELLO, connection 0: a/b = client nonce, x = client identity (bits);
//   HELLO, connection i > 0: a/b = StripeMac(lane i);
//   WELCOME, connection 0: conn_id = server identity, b/x = server nonce, y/z = server proof;
//   AUTH: a/b = client proof.
inline constexpr uint32_t kAuthFlag = 1;

struct ControlHeader {
  uint32_t type;
  uint32_t lane;  // The connection it travels on (the sending backend stamps it).
  uint64_t conn_id;
  uint64_t a;
  uint64_t b;
  double x;
  double y;
  double z;
  uint32_t version;  // kWireVersion (wire_constants.h): set by Message(), stamped by the backend
  uint32_t reserved;
};
static_assert(sizeof(ControlHeader) == 64, "ControlHeader is a wire format");

// A control message and, for probe transfers, its bytes (null: none). The payload's contents do
// not matter; it must stay alive until the backend's send completes (hence shared).
struct ControlMessage {
  ControlHeader header{};
  std::shared_ptr<std::vector<uint8_t>> payload;
};

// Whether `type` belongs to the set-up protocol (LinkSetup::OnControl takes it).
bool IsSetupMessage(uint32_t type);
// An unauthenticated HELLO (LinkSetup::Hello makes the one a backend sends).
ControlMessage HelloMessage(uint64_t conn_id);
ControlMessage HeartbeatMessage();

// ---------------------------------------------------------------------------------------------
// What the connect-time probe measured (zeros when the class was configured and for backends
// that do not measure).
struct ProbeResult {
  double send_bytes_per_second = 0;
  double recv_bytes_per_second = 0;
  double rtt_seconds = 0;
};

// What both ends configure their Link with.
struct LinkParams {
  LinkClass link_class = LinkClass::kFast;
  int stripes = 1;  // Connections the client opens (the server counts the ones that arrive).
  ProbeResult probe;
  // Authenticated links (a job secret): this end's keys; every chunk is sealed. Null: plain.
  std::shared_ptr<SecureChannel> channel;
};

// Probe buffers of each size, kept for reuse by one backend: allocating (and zeroing) inside a
// timed probe transfer would make the link look slower than it is. Contents do not matter.
class ProbeScratch {
 public:
  std::shared_ptr<std::vector<uint8_t>> Get(size_t bytes);
  // Allocates every size a probe up to `max_bytes` will use (a PING announces it).
  void Reserve(uint64_t max_bytes);

 private:
  Mutex mu_;
  std::map<size_t, std::shared_ptr<std::vector<uint8_t>>> buffers_ ABSL_GUARDED_BY(mu_);
};

// Connection 0 of a link, as a backend lends it to the set-up: sends one control message to the
// peer's LinkSetup. Called from the connecting thread with no lock held; must not block on the
// network (queue and return). Replies come back through the link's LinkSetup::OnControl.
class SetupWire {
 public:
  virtual ~SetupWire() = default;
  virtual void Send(ControlMessage message) = 0;
};

// One end of one link during set-up. The backend creates it with the link (client: in Connect;
// server: at the first HELLO), hands it every set-up message that arrives on the link's
// connections, and fails it when a connection is lost or the transport shuts down.
class LinkSetup {
 public:
  enum class Role { kClient, kServer };

  // `peer` names the peer in errors and logs; `peer_host` / `peer_port` are how this end's
  // rules see it (client: the address given to Connect; server: the connecting host, port 0).
  // Copies what it needs from `options`.
  LinkSetup(Role role, const TransportOptions& options, std::string peer, HostPort peer_address);

  Role role() const { return role_; }
  // This end's configured class for the peer (rules file, then LBCC_LINK_CLASS).
  std::optional<LinkClass> configured() const { return configured_; }

  // -- Incoming, any thread (backend context). Never blocks on the network.
  struct Step {
    bool admit = false;                   // HELLO: attach this connection to the link.
    // Close this connection once `reply` (if any) is sent: it failed authentication (already
    // logged and counted). A refused HELLO's connection was not admitted; any other refusal
    // fails the link.
    bool refuse = false;
    std::optional<ControlMessage> reply;  // Send back on the connection the message came on.
    std::optional<LinkParams> ready;      // Server, once: READY arrived; configure the Link.
  };
  // Handles one set-up message (IsSetupMessage). `scratch`: the backend's probe buffers.
  Step OnControl(const ControlHeader& header, ProbeScratch& scratch);

  // A connection of the link failed (keeps the first failure; the waiting step returns it).
  // ClearFailure() forgets it before a retried connection.
  void Fail(absl::Status status);
  void ClearFailure();
  // The set-up can never complete (transport shut down): every step, now and later, returns
  // `status`.
  void Cancel(absl::Status status);

  // -- Client steps, in order, on the connecting thread. Each blocks until its replies arrived,
  // a failure, Cancel() or `deadline` (DeadlineExceeded "<what> from <peer> timed out").
  // 0. The HELLO for connection `lane` of the link `conn_id` (connection 0: a fresh nonce; a
  // further connection: its proof, so only after Negotiate()).
  ControlMessage Hello(uint64_t conn_id, uint32_t lane);
  // 1. WELCOMEs for `connections` connections (the backend sent their HELLOs). With a secret:
  // PermissionDenied when the server's proof is wrong or it does not authenticate.
  absl::Status AwaitWelcomes(int connections, absl::Time deadline);
  // 2. Every step over connection 0 after WELCOME: the link class and the probe. `measure`: the
  // backend's lanes can be timed (UCX); a backend that cannot measure (memory) makes
  // unconfigured links fast and sends no pings.
  absl::StatusOr<LinkParams> Negotiate(SetupWire& wire, const ConnectOptions& options,
                                       absl::Time deadline, bool measure);
  // 3. The READY message carrying `params` to the server.
  static ControlMessage Ready(uint64_t conn_id, const LinkParams& params);

 private:
  // Waits for `done()` (under mu_), a failure or the deadline.
  template <typename Pred>
  absl::Status Await(Pred done, absl::Time deadline, absl::string_view what);
  // Measures the round trip and, when max_bytes > 0, both directions' rates with transfers of
  // up to max_bytes.
  absl::StatusOr<ProbeResult> Probe(SetupWire& wire, absl::Time deadline, int64_t max_bytes);
  // The authenticated parts of OnControl (a secret is set, or the peer sent one).
  Step ServeHello(const ControlHeader& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Step ServeAuth(const ControlHeader& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rest of OnControl: what a message tells this end (WELCOMEs, pongs, probe acks and data;
  // a server's READY, which yields the LinkParams), and a proof sent to a client refused.
  Step RecordLocked(const ControlHeader& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Client: checks a WELCOME; false (failure_ set) when the server fails authentication.
  bool TakeWelcome(const ControlHeader& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Step Refuse(absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<SecureChannel>> Channel(LinkClass link_class)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Role role_;
  const std::string peer_;
  const std::optional<LinkClass> configured_;
  const double slow_threshold_bits_per_second_;
  const int64_t probe_max_bytes_;
  const absl::Duration probe_min_time_;
  const int slow_stripes_;
  // A link configured slow is still probed for its rates (with transfers of at most
  // kConfiguredSlowProbeBytes) when bulk yielding needs them (no LBCC_SLOW_PACE_MBITS).
  const bool probe_configured_slow_;
  const SecurityOptions security_;

  Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  int welcomes_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<LinkClass> theirs_ ABSL_GUARDED_BY(mu_);  // From WELCOME.
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;  // Client: last ping / probe sequence sent.
  uint64_t pong_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t probe_ack_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t probe_data_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Authentication (security_.enabled()).
  HandshakeTranscript transcript_ ABSL_GUARDED_BY(mu_);
  bool hello_seen_ ABSL_GUARDED_BY(mu_) = false;     // Server: a HELLO on connection 0 arrived.
  bool authenticated_ ABSL_GUARDED_BY(mu_) = false;  // The peer's proof verified.
};

// ---------------------------------------------------------------------------------------------
// Liveness of one running link: a heartbeat every peer_timeout / 4 on connection 0, and a link
// whose peer has been silent for peer_timeout while work is pending fails with Unavailable (a
// vanished host sends no reset; TCP alone would retry for many minutes). The backend reports
// every sign of life (HeardFrom) and calls Check() from its WatchClock rounds.
class PeerWatch {
 public:
  void Start(absl::Time now);  // The link is set up: heartbeats flow, the rule applies.
  bool running() const { return running_; }
  void HeardFrom(absl::Time now) { last_heard_ = now; }

  struct Verdict {
    bool send_heartbeat = false;
    absl::Status failure;  // Unavailable naming `peer` and the silence; OK otherwise.
  };
  // `we_stalled`: this round found the backend itself starved (WatchClock), so the silence was
  // ours: the peer's clock restarts instead of blaming it.
  // `pending_work` is asked only when the peer has been silent too long.
  Verdict Check(absl::Time now, absl::Duration peer_timeout, bool we_stalled,
                absl::FunctionRef<bool()> pending_work, absl::string_view peer);

 private:
  bool running_ = false;
  absl::Time last_heard_;
  absl::Time last_heartbeat_;
};

// When a backend runs its PeerWatch rounds (every min(peer_timeout / 4, 100 ms)) and whether it
// was itself starved since the last round.
class WatchClock {
 public:
  explicit WatchClock(absl::Duration peer_timeout) : peer_timeout_(peer_timeout) {}
  bool Due(absl::Time now) const { return now >= next_; }
  // Starts a round; true when the previous round is longer ago than a heartbeat interval.
  bool StartRound(absl::Time now);

 private:
  const absl::Duration peer_timeout_;
  absl::Time next_ = absl::InfinitePast();
  absl::Time last_ = absl::InfinitePast();
};

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_LINK_SETUP_H_
