// One outcome per step: the decision every surviving rank of a group takes at the end of a
// collective that commits state (SparseAllReduce: error feedback and outputs), so that either all
// of them commit or all of them abort, even when a rank dies, freezes or loses a link mid-step.
//
// OutcomeAgreement is the interface the schedule calls once it knows its own outcome (`local`:
// OK = this rank holds every payload, validated, and could commit). Implementations:
//   - VoteAgreement (here): a vote per rank on the Fabric's control connections, which survive
//     the Fabric's abort, then on a missing vote a bounded query of the reachable ranks. The
//     protocol, why it is safe when ranks crash and what a partition can still do:
//     docs/agreement.md.
//   - a membership-service decision (comm/elastic/elastic.h) can implement the same interface.
//
// Thread-safety: Decide() may be called from any thread, for different operations concurrently;
// one call per (operation, rank).
#ifndef LBCC_COMM_AGREEMENT_H_
#define LBCC_COMM_AGREEMENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "transport/transport.h"

namespace lbcc::comm {

struct Group;

class OutcomeAgreement {
 public:
  virtual ~OutcomeAgreement() = default;
  // Decides operation `op_seq` (the operation's tag base: communicator id and sequence; the same
  // on every rank of `group`) given this rank's own outcome `local`. Returns OK when every
  // surviving rank commits; otherwise the error this rank reports, and every surviving rank
  // aborts: `local` itself when it is an error, else Unavailable (a rank could not complete the
  // step or could not be reached) or DeadlineExceeded (a rank did not answer in time), naming
  // the rank. Blocks at most until max(deadline, now + the agreement's grace) plus one grace.
  virtual absl::Status Decide(const Group& group, uint64_t op_seq, absl::Status local,
                              absl::Time deadline) = 0;
};

namespace internal {

// VoteAgreement's control messages, on the control endpoints (Fabric::control_out/in): a header
// of u32 magic 'LBAG', u8 version, u8 kind, u16 zero, u64 operation; abort kinds add u32 status
// code and the reason's text (at most kMaxReasonBytes). Anything else is DataLoss.
enum class ControlKind : uint8_t {
  kVoteCommit = 1,      // this rank holds every payload and will commit if everyone does
  kVoteAbort = 2,       // this rank cannot commit (carries why)
  kQuery = 3,           // this rank misses a vote: what did you decide?
  kReplyCommitted = 4,  // answers to a query
  kReplyAborted = 5,
  kReplyUndecided = 6,  // voted to commit, not decided yet; will not commit on its own now
};
inline constexpr size_t kMaxReasonBytes = 256;
std::string EncodeControl(ControlKind kind, uint64_t op, const absl::Status& reason);
struct ControlMessage {
  ControlKind kind;
  uint64_t op = 0;
  absl::Status reason;  // abort kinds
};
absl::Status DecodeControl(absl::string_view bytes, ControlMessage* out);

// The vote protocol (docs/agreement.md) over one rank's control endpoints, indexed by global
// rank (null at this rank's own index). Answers queries from Start() until Stop().
class VoteAgreement final : public OutcomeAgreement {
 public:
  // The endpoints must outlive Stop(); `grace` bounds each round after the operation's deadline.
  VoteAgreement(int rank, std::vector<transport::Endpoint*> out,
                std::vector<transport::Endpoint*> in, absl::Duration grace);
  ~VoteAgreement() override;  // Stop()s.

  // Posts the standing receive for every peer's queries.
  void Start();
  absl::Status Decide(const Group& group, uint64_t op_seq, absl::Status local,
                      absl::Time deadline) override;
  // Before closing: tells every peer this rank is done and waits (until `deadline`, and no
  // longer than a peer could still be deciding an operation this rank voted on: its deadline
  // plus two grace periods; not at all without such an operation) for each peer to say the
  // same or to be lost, answering queries meanwhile, so that a rank that committed still
  // answers the peers that are deciding. Returns the first failure.
  absl::Status Linger(absl::Time deadline);
  // No more answers; pending control operations fail (the caller then closes the endpoints).
  void Stop();

  // Operations remembered (decided, or refused before this rank voted), for tests.
  size_t RememberedForTesting() const;

  struct State;  // agreement.cc; shared with the transport callbacks
  struct Round;

 private:
  std::shared_ptr<State> state_;
};

// Test-only fault injection: the hook runs at each point a rank can die at (SparseAllReduce and
// VoteAgreement call MaybeFault); it gets the rank's group and may close its Fabric
// (Fabric::CrashForTesting). At kVote it returns how many peers (in group order) get this
// rank's vote; any negative value means all of them. Unset: no cost beyond one atomic load.
enum class FaultPoint {
  kBeforeSend,     // encoded nothing yet
  kMidExchange,    // the first exchange group posted, the rest not
  kAfterLastSend,  // every message sent and received, before the vote
  kVote,           // before voting (return value: peers that get the vote)
  kAfterVote,      // the vote sent (and handed over) to those peers
};
using FaultHook = std::function<int(const Group& group, FaultPoint point)>;
void SetFaultHookForTesting(FaultHook hook);
int MaybeFault(const Group& group, FaultPoint point);

}  // namespace internal
}  // namespace lbcc::comm

#endif  // LBCC_COMM_AGREEMENT_H_
