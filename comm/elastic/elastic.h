// Elastic membership: members join and leave a running SparseLoCo job without stopping it.
//
// ElasticMaster is the membership service (the `lbcc-master` binary runs one; a test or rank 0
// may run one in-process). It holds the job id, the member list and a membership epoch, and
// decides, for every phase a group runs, whether it commits: only when every member of the
// epoch reported success. ElasticGroup is one member: it keeps a TCP connection to the master
// (heartbeats both ways every LBCC_PEER_TIMEOUT_MS / 4), builds a plain Communicator per epoch
// (Communicator::Init with the UniqueId the master hands out) in the background, and runs
// SparseLoCo's exchange over it with error-feedback updates held back until the master decided.
//
//   LBCC_ASSIGN_OR_RETURN(auto group, ElasticGroup::Join(options, shared_state_views));
//   while (training) {
//     absl::Status s;
//     do s = group->Boundary(); while (IsRetryable(s));           // newcomers get the state
//     ... inner steps, pseudo-gradient into delta ...
//     do s = group->SparseAllReduce(tensors, codec); while (IsRetryable(s));  // same inputs
//     ... outer optimizer step on the shared state ...
//   }
//   group->Leave();
//
// Semantics (docs/elastic.md has the why):
//   - Every phase (a Boundary that moves shared state, a SparseAllReduce) commits on every
//     member of its epoch or on none: the master decides from every member's report, so no
//     member applies an error-feedback update that another rolled back. The exception is a
//     member dropped before the decision (killed, evicted, its pipeline replica gone) after its
//     SparseAllReduce returned OK: the others may roll that step back and run it again without
//     it; it learns from its next call's error, and when admitted again its first Boundary()
//     replaces its shared state.
//   - A member that dies, is cut off or stops (SIGSTOP) is dropped by the master (its TCP
//     connection closes, or it is silent for the peer timeout); the master hands out a new
//     epoch, the survivors' running call fails with Aborted "membership changed: ... (epoch
//     e -> e')" (IsRetryable), their states are as before the call, and the retry runs over
//     the new epoch. Leave() drops a member at once, without a timeout.
//   - A newcomer waits at the master until the next committed step, then its first Boundary()
//     receives the shared state from the member with the best link (fast before slow, then the
//     lowest rank), checked by XXH3 against every member's hash, zstd-compressed over slow
//     links where that is smaller. Its error feedback is the caller's (start it at zero).
//   - The master failing: every member's call fails with Unavailable naming the master's
//     address (its connection closed or it went silent for the peer timeout); never a hang.
//
// Errors: Aborted (membership changed or another member's phase failed: retry), Unavailable
// (the master is lost), FailedPrecondition (evicted, its pipeline replica left (IsReplicaLeft),
// refused as stale, or Leave()d; misuse; from Join, a transport this process cannot create at
// all, such as UCX that could not be loaded),
// InvalidArgument (bad options or input; a wrong job id), DataLoss (shared state whose hash
// differs, corrupt master messages), DeadlineExceeded (not admitted before join_timeout).
//
// Thread-safety: ElasticMaster is thread-safe. An ElasticGroup's calls come from one thread;
// its own threads (master reader, heartbeat) are started by Join and joined by Leave() and the
// destructor; each epoch's Communicator::Init runs on a thread of its own that ends by itself
// (within the set-up timeout) and holds what it needs.
#ifndef LBCC_COMM_ELASTIC_ELASTIC_H_
#define LBCC_COMM_ELASTIC_ELASTIC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/tensor_view.h"
#include "codecs/codec.h"
#include "comm/communicator.h"
#include "comm/config.h"

namespace lbcc::comm {

// True for the status a call returns when it should be retried over the new epoch.
bool IsRetryable(const absl::Status& status);

// True for the status a pipeline stage's calls fail with when another stage of its pipeline
// replica left (FailedPrecondition "pipeline replica R left the data-parallel group: ...").
// The stage is out of its group; it Joins again, and is admitted once every stage is back.
bool IsReplicaLeft(const absl::Status& status);

// Pipeline replicas as units (docs/elastic.md). The data-parallel group of each pipeline stage
// (a model shard) is its own job on its own master; masters started with the same
// ElasticUnits (in one process) know which members are the stages of one pipeline replica
// (ElasticOptions::replica): a stage that leaves, dies or is evicted takes its whole replica
// out of every shard's group (the other stages' calls fail with IsReplicaLeft), and a replica's
// stages are admitted only once all of them are back, each at the same outer step of its job.
// A master without one has its own (units then span that master's job only).
class ElasticUnits;
std::shared_ptr<ElasticUnits> NewElasticUnits();

struct ElasticMasterOptions {
  std::string listen_address = "127.0.0.1:0";  // host:port; port 0: the kernel picks
  std::string job_id;                           // members must present it; not empty
  absl::Duration peer_timeout = absl::ZeroDuration();  // zero: LBCC_PEER_TIMEOUT_MS
  // Address the per-epoch bootstrap roots listen on (IPv4, IPv6 without brackets, or a name);
  // empty: listen_address's host.
  std::string bootstrap_host;
  // How long an epoch's members have to build its communicator; zero: peer_timeout + 5 s.
  absl::Duration setup_timeout = absl::ZeroDuration();
  int min_members = 1;  // the first epoch forms once this many joined
  // Limits against clients that are not members (README, Security): a connection that has not
  // sent its join within handshake_timeout is closed; at most max_handshakes connections wait
  // for their join at once (the oldest is closed for a new one); a peer address holds at most
  // max_connections_per_address connections, joining or joined (more are closed at accept).
  absl::Duration handshake_timeout = absl::Seconds(10);
  int max_handshakes = 1024;
  int max_connections_per_address = 64;
  // Shared by the masters of one model's shard jobs: pipeline replicas leave and join as units
  // across them (NewElasticUnits). Null: this master's own.
  std::shared_ptr<ElasticUnits> units;
};

class ElasticMaster {
 public:
  static absl::StatusOr<std::unique_ptr<ElasticMaster>> Start(ElasticMasterOptions options);
  ~ElasticMaster();  // Stop()

  // "host:port" members connect to (LBCC_MASTER_ADDR).
  std::string address() const;
  uint64_t epoch() const;
  uint64_t committed_steps() const;
  int members() const;  // in the current epoch
  // Waits until `n` newcomers wait for the next step boundary; false at the timeout.
  bool AwaitWaiting(int n, absl::Duration timeout) const;
  // Waits until the epoch is at least `n`; false at the timeout.
  bool AwaitEpoch(uint64_t n, absl::Duration timeout) const;
  // Waits until the job committed `n` outer steps; false at the timeout.
  bool AwaitCommittedSteps(uint64_t n, absl::Duration timeout) const;
  // Waits until a step exchanged in epoch `epoch` or a later one is committed (a step of an
  // older epoch decided meanwhile does not count); false at the timeout.
  bool AwaitCommitInEpoch(uint64_t epoch, absl::Duration timeout) const;
  // Closes every connection and joins the threads: members fail with Unavailable naming it.
  void Stop();

  class Impl;

 private:
  explicit ElasticMaster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct ElasticOptions {
  std::string master_address;  // host:port; empty: LBCC_MASTER_ADDR
  std::string job_id;          // must be the master's
  std::string name;            // for logs and status messages; empty: host:pid
  // The per-epoch communicator (backend, listen host, ...). Its timeout bounds the epoch's
  // set-up (unset: the master's setup timeout); operations use op_timeout.
  CommConfig comm_config;
  // Bounds each operation, and with the set-up timeout each wait for the master's decision on
  // a step or phase, which needs every member's next call on the group: past it this member
  // fails out of the group with DeadlineExceeded (Join again). Keep it above the time between
  // a member's outer steps (its inner steps).
  absl::Duration op_timeout = absl::Seconds(300);
  absl::Duration join_timeout = absl::Minutes(10);  // waiting to be admitted
  absl::Duration peer_timeout = absl::ZeroDuration();  // zero: LBCC_PEER_TIMEOUT_MS
  // A member coming back with the shared state of this committed step (skips the transfer
  // when its hash matches); -1: none. A step other than the job's is refused as stale.
  int64_t state_step = -1;
  // A pipeline stage: stage `stage` (0-based) of pipeline replica `replica` (a name unique in
  // the model), which has `replica_stages` stages, each in its shard's job on masters that
  // share ElasticUnits. Empty replica: a full replica (a member by itself).
  std::string replica;
  int stage = 0;
  int replica_stages = 0;
};

// What moved in the last Boundary(), and the group's counters.
struct ElasticStats {
  uint64_t state_bytes = 0;            // the shared state's size
  uint64_t state_bytes_sent = 0;       // by this member, in the last Boundary that moved state
  uint64_t state_bytes_received = 0;   // ditto
  uint64_t epochs_seen = 0;
  uint64_t committed_epoch = 0;        // the epoch in which the last committed phase ran
  uint64_t aborted_calls = 0;
  // Epochs whose communicator this member built and used: derived from the previous epoch's
  // connections (Communicator::Subgroup; departures only, none of its phases running) or made
  // anew (bootstrap and connections: the group forms, arrivals, or a departure that had to
  // abort a running phase).
  uint64_t derived_epochs = 0;
  uint64_t fresh_epochs = 0;
  // Phases that started before the master's decision on the previous step had arrived, and
  // how long they waited for it (back-to-back steps; a trainer's inner steps hide it).
  uint64_t decision_waits = 0;
  absl::Duration decision_wait = absl::ZeroDuration();
};

class ElasticGroup {
 public:
  // Connects to the master, joins `options.job_id` and waits until admitted (an outer-step
  // boundary of the running job). `shared_state`: host buffers every member holds identically
  // (parameters, outer-optimizer state), in the same order and sizes on every member; they must
  // outlive the group. A newcomer's are overwritten by its first Boundary().
  static absl::StatusOr<std::unique_ptr<ElasticGroup>> Join(ElasticOptions options,
                                                            std::vector<TensorView> shared_state);
  ~ElasticGroup();  // Leave() if still a member.

  // The start of an outer step (after the previous outer update): adopts the newest epoch and,
  // when it has newcomers, moves the shared state to them. Aborted: retry Boundary().
  absl::Status Boundary();

  // One outer step's exchange (Communicator::SparseAllReduce over the epoch's members). The
  // states' updates are committed only when the master saw every member succeed; on any
  // other outcome they are rolled back and `out` must be ignored. Host tensors only.
  // After a success, leave `out` as it is (read it, do not write or free it) until the next
  // call on the group: should the master find a member whose exchange failed, this member
  // forwards the result from there at the start of that call (no copy on the steady path).
  absl::Status SparseAllReduce(const std::vector<Communicator::SparseTensor>& tensors,
                               const codecs::Codec* codec, codecs::DecodeOptions decode = {});

  // Leaves: first waits for the master's decision on this member's last committed step (the
  // others have then finished its exchange; at most the peer timeout), so the departure finds
  // them between phases and they derive the next epoch without a retry or a timeout; then
  // tells the master. The connections close on a thread of their own. Idempotent.
  absl::Status Leave();

  uint64_t epoch() const;
  // Waits until the epoch announced is at least `n` (a departure or arrival took effect);
  // false at the timeout.
  bool AwaitEpoch(uint64_t n, absl::Duration timeout) const;
  int rank() const;   // in the current epoch
  int size() const;   // members of the current epoch
  uint64_t step() const;  // committed outer steps of the job
  ElasticStats stats() const;
  // The communicator of the current epoch, or nullptr while none is built (for tests).
  std::shared_ptr<Communicator> communicator() const;

  class Impl;

 private:
  explicit ElasticGroup(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with the epoch set-up thread
};

}  // namespace lbcc::comm

#endif  // LBCC_COMM_ELASTIC_ELASTIC_H_
