// MembershipPolicy: the membership master's decisions as a state machine with no I/O.
//
// Events come in (a connection opened, a member's message, a connection lost, a tick of the
// clock) and decisions go out through PolicyOutput (send a message to a member, close its
// connection, create a bootstrap root for a new epoch): join (welcome or refuse), admit
// newcomers at a step boundary, decide every phase (commit, forward or abort), start a new
// epoch (formation, arrivals, departures, a broken communicator) and drop members (left,
// lost, silent, unreachable from a peer, or their pipeline replica left).
//
// The unreachable-peer rule: a member whose epoch set-up fails names the peer it could not
// connect to (kSetupFailed's blame). The master collects the epoch's failures for a moment
// (kBlameGrace, or until every member reported). When the set-ups of two different epochs
// failed between the same two members with no step committed since, it drops one member of
// such a pair: the one named by the most distinct members, and on a tie the newer (joined
// later); else it starts the next epoch as before. A member cut off from some members but not
// from the master would otherwise make every epoch fail the same way, and the master retry it
// for ever. The master's socket server
// (master_server.cc) feeds it from its threads; membership_policy_test.cc feeds it directly.
//
// Pipeline replicas as units: the policies of one model's shard jobs share a UnitTable; a
// stage's departure from one job evicts its sibling stages from the others through it (their
// outputs receive those decisions within the same event).
//
// Thread-safety: none. A policy, and every policy sharing its UnitTable, is driven by one
// thread at a time (the master serializes on ElasticUnits::mu).
#ifndef LBCC_COMM_ELASTIC_MEMBERSHIP_POLICY_H_
#define LBCC_COMM_ELASTIC_MEMBERSHIP_POLICY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/bootstrap.h"
#include "comm/elastic/wire.h"

namespace lbcc::comm::elastic {

// Where a policy's decisions go. The master's server carries them out on the members' sockets;
// a test records them.
class PolicyOutput {
 public:
  virtual ~PolicyOutput() = default;
  // Sends `message` to connection `member` within `timeout`; false when it could not be sent
  // (the policy then drops the member as unreachable once the event is handled).
  virtual bool Send(uint64_t member, const Message& message, absl::Duration timeout) = 0;
  // Closes connection `member`: it is gone for the policy, which never names it again.
  virtual void Close(uint64_t member) = 0;
  // The id of a new epoch's bootstrap root (CreateUniqueId); an error refuses its members.
  virtual absl::StatusOr<UniqueId> NewUniqueId() = 0;
  // A new epoch begins: every earlier epoch is superseded, and the bootstrap roots made for
  // them stop now (their members still waiting in them are told Cancelled) instead of at their
  // set-up timeout. Called before the new epoch's NewUniqueId(), if it has one.
  virtual void SupersedeRoots() = 0;
};

struct PolicyOptions {
  std::string job_id;        // members must present it
  std::string address;       // the master's, for refusals
  absl::Duration peer_timeout = absl::Seconds(30);  // a member silent this long is evicted
  int min_members = 1;       // the first epoch forms once this many joined
};

class MembershipPolicy;

// The pipeline replicas of one model (elastic.h, ElasticUnits), shared by the policies of its
// shard jobs: which stages of each replica are present, and whether they were released to be
// admitted together.
struct UnitTable {
  struct Stage {
    MembershipPolicy* policy = nullptr;  // the job (shard) this stage joined
    uint64_t member = 0;
    std::string name;
  };
  struct Unit {
    int stages = 0;
    std::map<int, Stage> present;  // joined stages (waiting or members), by stage
    bool released = false;         // every stage was back: each waits for outer step `target`
    uint64_t target = 0;
  };
  std::map<std::string, Unit> units;
};

class MembershipPolicy {
 public:
  // `units` and `output` must outlive the policy; `units` may be shared with other policies.
  MembershipPolicy(PolicyOptions options, UnitTable* units, PolicyOutput* output);
  MembershipPolicy(const MembershipPolicy&) = delete;
  MembershipPolicy& operator=(const MembershipPolicy&) = delete;

  // Events. Connected returns the new connection's member id (1, 2, ...).
  uint64_t Connected(std::string peer, absl::Time now);
  void Received(uint64_t member, const Message& message, absl::Time now);
  // The connection closed or sent corrupt bytes.
  void Lost(uint64_t member, absl::string_view why);
  // Evicts members silent for the peer timeout; heartbeats the others that joined.
  void Tick(absl::Time now);
  // The master stops: this job's stages leave the unit table (its connections are closed by
  // the caller).
  void Stop();

  // State, for the master's accessors and tests.
  bool connected(uint64_t member) const;  // open and not dropped
  uint64_t epoch() const { return epoch_; }
  uint64_t committed_steps() const { return step_; }
  uint64_t commit_epoch() const { return commit_epoch_; }  // newest epoch a step committed in
  int members() const { return static_cast<int>(members_.size()); }
  const std::vector<uint64_t>& member_ids() const { return members_; }  // in rank order
  int waiting() const { return static_cast<int>(joiners_.size()); }
  // When the set-up failures being collected are due to be settled (a Tick at or after it
  // settles them; the server ticks then); InfiniteFuture when none are.
  absl::Time settle_due() const;

 private:
  struct Conn {
    uint64_t id = 0;
    std::string name;
    absl::Time last_heard;
    bool joined = false;
    bool synced = false;  // holds the shared state
    // The newest (epoch, step) it reported or entered: it takes part in no older exchange.
    std::pair<uint64_t, uint64_t> last{0, 0};
    // A pipeline stage (ElasticOptions::replica): its replica, stage and the replica's stages.
    std::string replica;
    int stage = 0;
    int replica_stages = 0;
  };
  struct Report {
    Phase phase;
    uint64_t step;
    bool ok;
    bool broken;
    uint32_t code;
    std::string text;
  };
  // Step exchanges waiting for their decision, by (epoch, step).
  struct Open {
    std::vector<uint64_t> members;  // the epoch's, in rank order
    std::map<uint64_t, Report> reports;
  };
  // A step that failed on some members only: `receivers` get its result from one of `sources`.
  struct Forward {
    uint64_t epoch = 0, step = 0;
    std::vector<uint64_t> sources, receivers;
  };
  // The outcome of a complete step exchange (membership_policy_steps.cc).
  struct StepOutcome {
    bool all_ok = true, broken = false;
    std::vector<uint64_t> sources, receivers;
    std::string why;
  };

  // membership_policy.cc: connections, joins, departures, epochs, admission.
  void Handle(Conn& conn, const Message& m);
  void Send(uint64_t member, const Message& m);
  void FlushFailedSends();
  std::string Describe(const Conn& conn) const;
  void Refuse(Conn& conn, const absl::Status& why);
  absl::Status CheckJoin(const Message& m) const;
  void OnJoin(Conn& conn, const Message& m);
  void OnSetupFailed(Conn& conn, const Message& m);
  // The unreachable-peer rule: records a set-up failure that names a peer ...
  void RecordBlame(const Conn& conn, const Message& m);
  // ... and, once the epoch's failures are in (every member reported, or a tick kBlameGrace
  // after the first: settle_due), drops the member at fault or starts the next epoch.
  void SettleSetupFailure();
  void QueueJoiner(uint64_t id, uint64_t target);
  bool IsMember(uint64_t id) const;
  bool Live(uint64_t id) const;
  void Drop(uint64_t id, absl::string_view what, bool clean);
  void NewEpoch(std::vector<uint64_t> ids, const std::string& reason);
  void DeriveEpoch(uint64_t previous, Message* e) const;
  void ForwardInEpoch(Message* e);
  bool Admissible(uint64_t step) const;
  void Admit();

  // membership_policy_steps.cc: reports and decisions.
  void OnReport(Conn& conn, const Message& m);
  void DecidePhase();
  void OnStepReport(Conn& conn, const Message& m);
  void OnEnter(Conn& conn, uint64_t epoch);
  void TryDecideSteps();
  StepOutcome Tally(const Open& open);
  void DecideStep(uint64_t epoch, uint64_t step, const std::vector<uint64_t>& told,
                  const StepOutcome& outcome);

  // membership_policy_units.cc: pipeline replicas as units.
  void JoinUnit(Conn& conn, const Message& m);
  void ReleaseUnit(const std::string& replica);
  void DropStage(uint64_t id, absl::string_view what);
  void LoseStage(const Conn& conn, absl::string_view what);
  void RegisterAgain(const Conn& conn);
  void EvictStage(const UnitTable::Stage& stage, const std::string& replica,
                  const std::string& text);

  PolicyOptions options_;
  UnitTable* const units_;
  PolicyOutput* const output_;

  uint64_t next_id_ = 0;
  std::map<uint64_t, std::shared_ptr<Conn>> conns_;  // open connections
  std::vector<uint64_t> members_;  // the current epoch, in rank order
  std::vector<uint64_t> joiners_;  // waiting for a step boundary
  // Per joiner: the job's step at whose commit it is admitted (0: the next commit).
  std::map<uint64_t, uint64_t> join_target_;
  uint64_t epoch_ = 0;
  uint64_t step_ = 0;          // committed outer steps
  uint64_t commit_epoch_ = 0;  // the newest epoch a step committed in
  std::map<uint64_t, Report> reports_;  // the current sync/forward phase's
  std::map<std::pair<uint64_t, uint64_t>, Open> open_;
  std::map<uint64_t, std::vector<uint64_t>> epoch_members_;
  std::optional<Forward> forward_;
  bool fresh_next_ = false;  // the next epoch is not derived
  // Set-up failures that named a peer (kSetupFailed's blame) since the last committed step:
  // per pair of members (lower id first) the epochs whose set-up failed between them, and per
  // member the members that named it (the unreachable-peer rule, BlameSetup).
  std::map<std::pair<uint64_t, uint64_t>, std::set<uint64_t>> pair_failures_;
  std::map<uint64_t, std::set<uint64_t>> named_by_;
  // The current epoch's set-up failed on a connection: its other members' failures (their
  // connections time out at the same deadline) are collected before the next epoch.
  struct SetupFailure {
    uint64_t epoch = 0;
    absl::Time since;
    std::set<uint64_t> reported;
    std::string reason;
  };
  std::optional<SetupFailure> setup_failure_;
  std::vector<uint64_t> failed_sends_;
};

}  // namespace lbcc::comm::elastic

#endif  // LBCC_COMM_ELASTIC_MEMBERSHIP_POLICY_H_
