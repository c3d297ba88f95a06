// Fabric: one rank's connections to every other rank of a job, set up from a unique id.
//
// Create() makes a Transport (UCX, or in-process loopback for tests), listens, exchanges
// addresses and host names through the bootstrap (comm/bootstrap.h), settles the topology, and
// connects every pair of ranks both ways: this rank sends on the endpoint it connected to a
// peer (whose link class it sets from the topology, so slow links get the slow-link scheduler)
// and receives on the endpoint the peer connected to it. Communicators made by Split() share
// their parent's Fabric and use their own tag space.
//
// Each pair of ranks also has a control connection each way (control_out/control_in), which an
// abort does not close: the outcome agreement (comm/agreement.h) runs on it after a failure, and
// a closing rank answers its peers' questions on it until they said goodbye.
//
// Batch posts sends and receives and waits for all of them with a deadline; any failure or the
// deadline aborts the Fabric (every endpoint closed, so peers fail fast too, NCCL-style) and the
// Batch returns the first error once no callback can touch its buffers any more.
//
// Errors: Unavailable (a peer or link was lost; the communicator must be recreated),
// DeadlineExceeded (a peer did not answer in time), InvalidArgument (bad options), Cancelled
// (aborted, or the set-up cancelled: FabricOptions::cancel).
// Thread-safety: Fabric methods are thread-safe. A Batch belongs to one thread.
#ifndef LBCC_COMM_FABRIC_H_
#define LBCC_COMM_FABRIC_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "comm/bootstrap.h"
#include "comm/topology.h"
#include "transport/options.h"
#include "transport/transport.h"

namespace lbcc::comm {

class OutcomeAgreement;
namespace internal {
class VoteAgreement;
}  // namespace internal

struct FabricOptions {
  std::string backend = "ucx";          // "ucx", "socket" or "loopback" (LBCC_TRANSPORT).
  // Address or interface to listen on (LBCC_LISTEN_ADDR). Empty (the default, as in the C API
  // and Python): chosen as transport/netif.h's SelectListenAddress does (LBCC_SOCKET_IFNAME, the
  // interface toward the bootstrap root; loopback when the root is on loopback).
  std::string listen_host;
  absl::Duration timeout = absl::Seconds(300);  // Set-up and per-operation (LBCC_TIMEOUT_S).
  std::optional<Topology> topology;     // Unset: LBCC_TOPO_FILE, else same host = island.
  // The transport's settings, the job secret among them (comm/config.h resolves them with the
  // rest). Unset: TransportOptions::FromEnv when the fabric is created.
  std::optional<transport::TransportOptions> transport;
  // Whether peers can dial this rank (LBCC_REACHABLE): "yes", "no" (behind NAT or a firewall
  // that refuses inbound connections: this rank dials every connection of its links, its peers
  // use the ones it dialed for them, docs/nat.md), "auto" (for now: yes), or empty (the
  // default: LBCC_REACHABLE).
  std::string reachable;
  // Stops the set-up from another thread (optional): once cancelled, Create() returns the
  // cancellation's status promptly, wherever it waits (the bootstrap, connections, hellos: the
  // transport is shut down). Create() lets go of it before returning.
  std::shared_ptr<Cancellation> cancel;
};

// A Fabric's first abort and whether its caller asked for it (Communicator::Abort) rather than
// a failure. Shared with transport callbacks, which may run after the Fabric is gone.
// Thread-safe.
class AbortRecord {
 public:
  // Records the first abort; false when one was recorded already (nothing changes then).
  bool Set(absl::Status why, bool by_caller);
  // OK until the first abort; its reason afterwards.
  absl::Status status() const;
  // The first abort's reason when the caller asked for it; OK otherwise.
  absl::Status caller_abort() const;
  // What an operation that failed (`failure`) reports: after the caller's abort, Cancelled
  // saying so, with `failure` (often just "endpoint closed") as the detail; otherwise `failure`.
  absl::Status Explain(absl::Status failure) const;
  // The aborting thread closed every data endpoint (Fabric::Abort).
  void MarkClosed();
  // Waits until MarkClosed(), or `timeout`: an operation the caller's abort failed returns only
  // after that, so that the caller's next step (a new communicator, elastic) does not start
  // while this one's endpoints are still being closed. A short wait: closing only queues work.
  void AwaitClosed(absl::Duration timeout) const;

 private:
  mutable Mutex mu_;
  absl::Status why_ ABSL_GUARDED_BY(mu_);
  bool by_caller_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class Fabric {
 public:
  static absl::StatusOr<std::shared_ptr<Fabric>> Create(const UniqueId& id, int nranks, int rank,
                                                        FabricOptions options);
  ~Fabric();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const Topology& topology() const { return topology_; }
  const FabricOptions& options() const { return options_; }
  const std::vector<std::string>& hostnames() const { return hostnames_; }
  // Every rank's advertised transport address ("host:port" for UCX), in rank order.
  const std::vector<std::string>& addresses() const { return addresses_; }

  // Endpoints to `peer` (!= rank()): send on out, receive on in.
  transport::Endpoint* out(int peer) const { return out_[peer].get(); }
  transport::Endpoint* in(int peer) const { return in_[peer].get(); }

  // The control connections to `peer`: only the outcome agreement uses them.
  transport::Endpoint* control_out(int peer) const { return control_out_[peer].get(); }
  transport::Endpoint* control_in(int peer) const { return control_in_[peer].get(); }
  // The vote agreement over the control connections (comm/agreement.h); lives with the Fabric.
  OutcomeAgreement* agreement() const;

  // Closes every data endpoint: pending operations here and at the peers fail. Idempotent; the
  // first status is kept and returned by aborted(). The control connections stay up.
  // `by_caller`: the owner gave up on purpose (Communicator::Abort), not a failure; when that
  // abort came first, caller_abort() returns `why`. The Fabric is marked aborted before any
  // endpoint closes, so whatever fails because of the close can tell (AbortRecord::Explain).
  void Abort(absl::Status why, bool by_caller = false);
  // Abort(), and the control connections too: no outcome agreement runs or answers here any
  // more, so a peer waiting in one for this rank's vote (this rank never ran that operation,
  // or gave up on it) stops at once instead of after a grace period. For a communicator whose
  // outcomes another service decides (a superseded elastic epoch, comm/elastic/elastic.h).
  void AbortWithControl(absl::Status why);
  // Tests: as if the process died: every endpoint closed, control ones too, no more answers.
  void CrashForTesting();
  // OK while usable; the abort reason afterwards.
  absl::Status aborted() const;
  // The reason of Abort(why, by_caller = true) when that was the first abort; OK otherwise.
  absl::Status caller_abort() const { return abort_->caller_abort(); }
  // The same record, for callbacks that may outlive the Fabric.
  const std::shared_ptr<const AbortRecord>& abort_record() const { return abort_record_; }

  // Bytes sent and received on fast and slow links since creation (all communicators).
  struct ClassBytes {
    uint64_t fast_sent = 0, fast_received = 0, slow_sent = 0, slow_received = 0;
  };
  ClassBytes BytesByClass() const;
  // Counters of the link to `peer`: the send side from out(peer), the receive side from in(peer).
  transport::LinkCounters Counters(int peer) const;

 private:
  Fabric() = default;
  // Create() without the mapping of a cancelled set-up's error to the cancellation's status.
  static absl::StatusOr<std::shared_ptr<Fabric>> Build(const UniqueId& id, int nranks, int rank,
                                                       FabricOptions options);
  // Connects a data and a control endpoint to every peer, accepts theirs, and files the
  // accepted ones by the hello each sends first. A peer that cannot be dialed (reachable_)
  // dials this rank's endpoints to it as well (connection reversal); `reachable` is every
  // rank's flag.
  absl::Status Connect(const std::vector<std::string>& addresses,
                       const std::vector<bool>& reachable);
  // Connect's parts: the endpoints this rank dials (out_, control_out_, and the reversed ones
  // into in_, control_in_ for peers that cannot dial it) and those it accepts (`accepted`,
  // unfiled) ...
  absl::Status OpenEndpoints(const std::vector<std::string>& addresses,
                             const std::vector<bool>& reachable, absl::Time deadline,
                             std::vector<std::unique_ptr<transport::Endpoint>>* accepted,
                             std::vector<std::pair<transport::Endpoint*, uint32_t>>* dialed);
  // ... then the hellos: each dialed endpoint names this rank and its use, each accepted one its
  // peer and use (`peer_of`). On failure every endpoint is closed.
  absl::Status ExchangeHellos(std::vector<std::unique_ptr<transport::Endpoint>>& accepted,
                              const std::vector<std::pair<transport::Endpoint*, uint32_t>>& dialed,
                              absl::Time deadline, std::vector<uint32_t>* peer_of);
  void CloseControl();

  int rank_ = 0;
  int nranks_ = 0;
  FabricOptions options_;
  Topology topology_ = Topology::Flat(1);
  std::vector<std::string> hostnames_;
  std::vector<std::string> addresses_;
  std::unique_ptr<transport::Transport> transport_;
  std::vector<std::unique_ptr<transport::Endpoint>> out_;
  std::vector<std::unique_ptr<transport::Endpoint>> in_;
  std::vector<std::unique_ptr<transport::Endpoint>> control_out_;
  std::vector<std::unique_ptr<transport::Endpoint>> control_in_;
  std::unique_ptr<internal::VoteAgreement> agreement_;  // Stopped before the endpoints close.
  bool connected_ = false;  // Every endpoint exists (Connect succeeded): goodbyes can be said.
  const std::shared_ptr<AbortRecord> abort_ = std::make_shared<AbortRecord>();
  const std::shared_ptr<const AbortRecord> abort_record_ = abort_;
};

// OK when a transport of `backend` ("ucx", "socket", "loopback") can be created in this process
// at all; FailedPrecondition naming why not (UCX could not be loaded). Settles before any peer
// is involved what every set-up would otherwise fail on.
absl::Status BackendAvailable(const std::string& backend);

// The rank (the Fabric's numbering) a failure concerns, carried in the Status's message (a
// trailing " [failed peer N]") where the fabric knows it: a set-up's connection to that rank
// failed. Elastic members report it to the master, which drops a member its peers cannot reach
// (membership_policy.h). A status that already names one keeps it.
absl::Status WithFailedPeer(absl::Status status, int peer);
// The rank the message names; nullopt when it names none.
std::optional<int> FailedPeer(const absl::Status& status);

// The DeadlineExceeded of a data round that timed out: names the ranks this rank was still
// receiving from ("no answer from rank 2 before the timeout"), else those whose sends had not
// completed. Ranks as the caller names them (a count per rank; zero: not waited for).
absl::Status NoAnswerError(const std::vector<int>& receives_pending_by_rank,
                           const std::vector<int>& sends_pending_by_rank);

// Sends and receives posted together and awaited together.
class Batch {
 public:
  Batch(Fabric* fabric, absl::Time deadline);
  ~Batch();  // Waits for outstanding callbacks (after Wait, there are none).

  // `data` / `buffer` must stay valid until Wait() returns.
  void Send(int peer, transport::Tag tag, absl::Span<const uint8_t> data,
            transport::Priority priority = transport::Priority::kNormal);
  // Receives exactly buffer.size() bytes; a message of another size is an error (DataLoss).
  void Recv(int peer, transport::Tag tag, absl::Span<uint8_t> buffer);
  // Receives a message of any size (up to `max_bytes`) into `out`, resized to fit.
  void RecvAny(int peer, transport::Tag tag, std::string* out, size_t max_bytes);

  // Waits for everything posted. On the first failure or at the deadline it aborts the Fabric.
  absl::Status Wait();

 private:
  struct State;
  void Done(const absl::Status& status, int peer, bool receive);

  Fabric* fabric_;
  absl::Time deadline_;
  std::shared_ptr<State> state_;
};

}  // namespace lbcc::comm

#endif  // LBCC_COMM_FABRIC_H_
