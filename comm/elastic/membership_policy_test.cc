// MembershipPolicy with no socket and no thread: events fed in, the decisions it hands to its
// output asserted. Covers forming a group, joins and admission at a step boundary, a member
// lost mid-step, two leaving at once, a join during a step, a step forwarded to the members
// whose exchange failed, silence and unreachable members, and pipeline replicas leaving and
// joining as units across two shard jobs.
#include "comm/elastic/membership_policy.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/elastic/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm::elastic {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr absl::Duration kPeerTimeout = absl::Seconds(10);

// Records every decision; members in `unreachable` fail their sends.
class Recorder : public PolicyOutput {
 public:
  bool Send(uint64_t member, const Message& message, absl::Duration) override {
    sent[member].push_back(message);
    return unreachable.count(member) == 0;
  }
  void Close(uint64_t member) override { closed.push_back(member); }
  absl::StatusOr<UniqueId> NewUniqueId() override {
    if (!root_error.ok()) return root_error;
    UniqueId id{};
    id.internal[0] = static_cast<char>(++roots);
    superseded_at_root.push_back(superseded);
    return id;
  }
  void SupersedeRoots() override { ++superseded; }

  // The messages of `type` sent to `member`, oldest first.
  std::vector<Message> Of(uint64_t member, MsgType type) const {
    std::vector<Message> out;
    auto it = sent.find(member);
    if (it == sent.end()) return out;
    for (const Message& m : it->second) {
      if (m.type == type) out.push_back(m);
    }
    return out;
  }
  // The newest message of `type` sent to `member` (a default Message when none).
  Message Last(uint64_t member, MsgType type) const {
    std::vector<Message> all = Of(member, type);
    return all.empty() ? Message{} : all.back();
  }

  std::map<uint64_t, std::vector<Message>> sent;
  std::vector<uint64_t> closed;
  std::set<uint64_t> unreachable;
  absl::Status root_error;
  int roots = 0;
  int superseded = 0;  // SupersedeRoots() calls
  std::vector<int> superseded_at_root;  // per NewUniqueId(): SupersedeRoots() calls before it
};

PolicyOptions Options(int min_members) {
  return PolicyOptions{"job", "127.0.0.1:1", kPeerTimeout, min_members};
}

// One shard job: a policy, its recorder and the helpers that play its members.
struct Job {
  Job(UnitTable* units, int min_members) : policy(Options(min_members), units, &out) {}

  uint64_t Join(const std::string& name, const std::string& replica = "", int stage = 0,
                int stages = 0, const std::string& job_id = "job") {
    const uint64_t id = policy.Connected(name + "-peer", now);
    Message m;
    m.type = MsgType::kJoin;
    m.job_id = job_id;
    m.name = name;
    m.replica = replica;
    m.stage = static_cast<uint32_t>(stage);
    m.replica_stages = static_cast<uint32_t>(stages);
    policy.Received(id, m, now);
    return id;
  }
  void Report(uint64_t id, uint64_t epoch, uint64_t step, bool ok,
              absl::StatusCode code = absl::StatusCode::kOk, Phase phase = Phase::kStep) {
    Message m;
    m.type = MsgType::kReport;
    m.epoch = epoch;
    m.step = step;
    m.phase = phase;
    m.ok = ok;
    m.code = static_cast<uint32_t>(code);
    m.text = ok ? "" : "exchange failed";
    policy.Received(id, m, now);
  }
  void Leave(uint64_t id) {
    Message m;
    m.type = MsgType::kLeave;
    policy.Received(id, m, now);
  }
  // `id`'s set-up of `epoch` failed on the peer of rank `blame - 1` (0: none named).
  void SetupFailed(uint64_t id, uint64_t epoch, uint32_t blame) {
    Message m;
    m.type = MsgType::kSetupFailed;
    m.epoch = epoch;
    m.blame = blame;
    m.text = "connect failed";
    policy.Received(id, m, now);
  }
  // Every member of the current epoch reports step `step` as committed.
  void CommitStep(uint64_t step) {
    const std::vector<uint64_t> ids = policy.member_ids();
    for (uint64_t id : ids) Report(id, policy.epoch(), step, true);
  }

  Recorder out;
  MembershipPolicy policy;
  absl::Time now = absl::UnixEpoch();
};

class MembershipPolicyTest : public ::testing::Test {
 protected:
  UnitTable units_;
};

TEST_F(MembershipPolicyTest, FormsTheGroupOnceMinMembersJoined) {
  Job job(&units_, 2);
  const uint64_t a = job.Join("a");
  EXPECT_EQ(job.out.Of(a, MsgType::kWelcome).size(), 1u);
  EXPECT_EQ(job.policy.epoch(), 0u);
  EXPECT_EQ(job.policy.waiting(), 1);
  const uint64_t b = job.Join("b");
  EXPECT_EQ(job.policy.epoch(), 1u);
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a, b));
  const Message ea = job.out.Last(a, MsgType::kEpoch), eb = job.out.Last(b, MsgType::kEpoch);
  EXPECT_EQ(ea.epoch, 1u);
  EXPECT_EQ(ea.rank, 0u);
  EXPECT_EQ(eb.rank, 1u);
  EXPECT_EQ(eb.nranks, 2u);
  EXPECT_THAT(eb.names, ElementsAre("a", "b"));
  EXPECT_THAT(eb.needs_state, ElementsAre(1u));  // rank 0's state is the reference
  EXPECT_EQ(eb.parent_epoch, 0u);                 // built anew, on a new bootstrap root
  EXPECT_EQ(eb.unique_id.size(), static_cast<size_t>(kUniqueIdBytes));
  EXPECT_EQ(job.out.roots, 1);
}

// Every new epoch, derived or fresh, stops the roots of the epochs before it, before it makes
// its own: a member's set-up of a superseded epoch is told Cancelled by its root at once.
TEST_F(MembershipPolicyTest, EveryNewEpochStopsTheRootsOfTheEpochsItSupersedes) {
  Job job(&units_, 3);
  const uint64_t a = job.Join("a"), b = job.Join("b"), c = job.Join("c");
  EXPECT_EQ(job.policy.epoch(), 1u);
  EXPECT_EQ(job.out.superseded, 1);
  EXPECT_THAT(job.out.superseded_at_root, ElementsAre(1));
  job.policy.Lost(c, "connection closed");  // between steps: derived, no root of its own
  EXPECT_EQ(job.policy.epoch(), 2u);
  EXPECT_NE(job.out.Last(a, MsgType::kEpoch).parent_epoch, 0u);
  EXPECT_EQ(job.out.superseded, 2);  // epoch 1's root stops although epoch 2 has none
  EXPECT_EQ(job.out.roots, 1);
  job.CommitStep(0);
  const uint64_t d = job.Join("d");
  job.CommitStep(1);  // d is admitted: a fresh epoch
  EXPECT_EQ(job.policy.epoch(), 3u);
  EXPECT_EQ(job.out.Last(d, MsgType::kEpoch).parent_epoch, 0u);
  EXPECT_EQ(job.out.superseded, 3);
  EXPECT_THAT(job.out.superseded_at_root, ElementsAre(1, 3));
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a, b, d));
}

TEST_F(MembershipPolicyTest, RefusesAnotherJobAndClosesTheConnection) {
  Job job(&units_, 1);
  const uint64_t x = job.Join("x", "", 0, 0, "other-job");
  const Message refuse = job.out.Last(x, MsgType::kRefuse);
  EXPECT_EQ(refuse.type, MsgType::kRefuse);
  EXPECT_EQ(refuse.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(job.out.closed, ElementsAre(x));
  EXPECT_FALSE(job.policy.connected(x));
  EXPECT_EQ(job.policy.epoch(), 0u);
}

TEST_F(MembershipPolicyTest, RefusesEveryMemberWhenNoBootstrapRootCanBeMade) {
  Job job(&units_, 2);
  job.out.root_error = absl::UnavailableError("no port");
  const uint64_t a = job.Join("a"), b = job.Join("b");
  EXPECT_EQ(job.out.Last(a, MsgType::kRefuse).code,
            static_cast<uint32_t>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(job.out.Last(b, MsgType::kRefuse).text, "no port");
  EXPECT_EQ(job.policy.members(), 0);
}

TEST_F(MembershipPolicyTest, CommitsAStepAndAdmitsANewcomerAtTheNextBoundary) {
  Job job(&units_, 2);
  const uint64_t a = job.Join("a"), b = job.Join("b");
  job.Report(a, 1, 0, true, absl::StatusCode::kOk, Phase::kSync);
  job.Report(b, 1, 0, true, absl::StatusCode::kOk, Phase::kSync);
  EXPECT_TRUE(job.out.Last(b, MsgType::kDecision).ok);
  job.CommitStep(0);
  const Message d = job.out.Last(a, MsgType::kDecision);
  EXPECT_TRUE(d.ok);
  EXPECT_FALSE(d.broken);  // nobody waits: the epoch goes on
  EXPECT_EQ(job.policy.committed_steps(), 1u);
  EXPECT_EQ(job.policy.commit_epoch(), 1u);

  const uint64_t c = job.Join("c");
  EXPECT_EQ(job.out.Last(c, MsgType::kWelcome).step, 1u);
  EXPECT_EQ(job.policy.waiting(), 1);
  EXPECT_EQ(job.policy.epoch(), 1u);
  job.CommitStep(1);
  const Message admit = job.out.Last(a, MsgType::kDecision);
  EXPECT_TRUE(admit.ok);
  EXPECT_TRUE(admit.broken);  // a new epoch follows: the newcomer's
  EXPECT_EQ(admit.next_epoch, 2u);
  EXPECT_EQ(job.policy.epoch(), 2u);
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a, b, c));
  const Message e = job.out.Last(c, MsgType::kEpoch);
  EXPECT_EQ(e.rank, 2u);
  EXPECT_EQ(e.step, 2u);
  EXPECT_THAT(e.needs_state, ElementsAre(2u));  // a and b synced in the first Boundary
  EXPECT_EQ(e.parent_epoch, 0u);  // arrivals: a fresh communicator
  EXPECT_EQ(job.policy.waiting(), 0);
}

TEST_F(MembershipPolicyTest, AJoinDuringAStepIsAdmittedAtItsDecision) {
  Job job(&units_, 2);
  const uint64_t a = job.Join("a"), b = job.Join("b");
  job.Report(a, 1, 0, true);  // the step is in flight: b has not reported
  const uint64_t c = job.Join("c");
  EXPECT_THAT(job.out.Of(c, MsgType::kEpoch), IsEmpty());
  EXPECT_EQ(job.policy.epoch(), 1u);
  job.Report(b, 1, 0, true);
  EXPECT_EQ(job.policy.epoch(), 2u);
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a, b, c));
  EXPECT_EQ(job.out.Last(c, MsgType::kEpoch).step, 1u);
}

TEST_F(MembershipPolicyTest, AMemberLostMidStepLeavesTheStepCommittedOnTheOthers) {
  Job job(&units_, 3);
  const uint64_t a = job.Join("a"), b = job.Join("b"), c = job.Join("c");
  job.Report(a, 1, 0, true);
  job.Report(b, 1, 0, true);
  job.policy.Lost(c, "connection reset");
  EXPECT_THAT(job.out.closed, ElementsAre(c));
  EXPECT_EQ(job.policy.epoch(), 2u);
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a, b));
  // Departures only: derived from epoch 1's communicator, with no new bootstrap root.
  const Message e = job.out.Last(b, MsgType::kEpoch);
  EXPECT_EQ(e.parent_epoch, 1u);
  EXPECT_THAT(e.parent_ranks, ElementsAre(0u, 1u));
  EXPECT_EQ(job.out.roots, 1);
  // Only the member that is gone failed the step: every live member has it.
  const Message d = job.out.Last(a, MsgType::kDecision);
  EXPECT_EQ(d.epoch, 1u);
  EXPECT_TRUE(d.ok);
  EXPECT_FALSE(d.forward);
  EXPECT_EQ(d.text, "rank 2 left before it reported");
  EXPECT_EQ(job.policy.committed_steps(), 1u);
}

TEST_F(MembershipPolicyTest, AMemberLostBeforeAnyReportAbortsTheStep) {
  Job job(&units_, 3);
  const uint64_t a = job.Join("a"), b = job.Join("b"), c = job.Join("c");
  job.policy.Lost(c, "connection reset");
  job.Report(a, 1, 0, false, absl::StatusCode::kAborted);
  job.Report(b, 1, 0, false, absl::StatusCode::kAborted);
  const Message d = job.out.Last(a, MsgType::kDecision);
  EXPECT_FALSE(d.ok);
  EXPECT_FALSE(d.forward);  // nobody committed it: rolled back everywhere
  EXPECT_EQ(job.policy.committed_steps(), 0u);
  EXPECT_EQ(job.policy.epoch(), 2u);
}

TEST_F(MembershipPolicyTest, AStepThatFailedOnSomeMembersOnlyIsForwardedToThem) {
  Job job(&units_, 3);
  const uint64_t a = job.Join("a"), b = job.Join("b"), c = job.Join("c");
  job.Report(a, 1, 0, true);
  job.Report(b, 1, 0, false, absl::StatusCode::kUnavailable);
  job.Report(c, 1, 0, true);
  const Message d = job.out.Last(b, MsgType::kDecision);
  EXPECT_FALSE(d.ok);
  EXPECT_TRUE(d.forward);
  EXPECT_TRUE(d.broken);
  EXPECT_EQ(job.policy.epoch(), 2u);
  const Message e = job.out.Last(b, MsgType::kEpoch);
  EXPECT_TRUE(e.forward);
  EXPECT_EQ(e.forward_step, 0u);
  EXPECT_EQ(e.forward_source, 0u);  // the lowest rank that committed it
  EXPECT_THAT(e.forward_to, ElementsAre(1u));
  EXPECT_EQ(job.policy.committed_steps(), 0u);
  for (uint64_t id : {a, b, c}) job.Report(id, 2, 0, true, absl::StatusCode::kOk, Phase::kForward);
  const Message forwarded = job.out.Last(b, MsgType::kDecision);
  EXPECT_EQ(forwarded.phase, Phase::kForward);
  EXPECT_TRUE(forwarded.ok);
  EXPECT_EQ(job.policy.committed_steps(), 1u);
  EXPECT_EQ(job.policy.commit_epoch(), 2u);
}

TEST_F(MembershipPolicyTest, TwoMembersLeavingAtOnceEachStartAnEpochOfTheOthers) {
  Job job(&units_, 4);
  const uint64_t a = job.Join("a"), b = job.Join("b"), c = job.Join("c"), d = job.Join("d");
  job.Report(a, 1, 0, true);
  job.Report(b, 1, 0, true);
  job.Leave(c);
  EXPECT_EQ(job.policy.epoch(), 2u);
  EXPECT_THAT(job.out.Last(a, MsgType::kEpoch).parent_ranks, ElementsAre(0u, 1u, 3u));
  EXPECT_EQ(job.policy.committed_steps(), 0u);  // d, still a member of epoch 1, did not report
  job.policy.Lost(d, "connection reset");
  EXPECT_EQ(job.policy.epoch(), 3u);
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a, b));
  const Message e = job.out.Last(b, MsgType::kEpoch);
  EXPECT_EQ(e.parent_epoch, 2u);
  EXPECT_THAT(e.parent_ranks, ElementsAre(0u, 1u));
  EXPECT_EQ(e.rank, 1u);
  EXPECT_THAT(job.out.closed, UnorderedElementsAre(c, d));
  EXPECT_TRUE(job.out.Last(a, MsgType::kDecision).ok);  // the survivors committed step 0
  EXPECT_EQ(job.policy.committed_steps(), 1u);
}

// wire_master_fuzz's finding: a member that sent a message only the master sends (here a
// refusal) was refused by closing its connection only; it stayed in the member list, and the
// next epoch (another member lost) threw on its missing connection: the master aborted. It is
// now refused and dropped like a lost member, and the job goes on without it.
TEST_F(MembershipPolicyTest, AMemberSendingAMastersMessageIsRefusedAndDropped) {
  Job job(&units_, 3);
  const uint64_t a = job.Join("a"), b = job.Join("b"), c = job.Join("c");
  ASSERT_EQ(job.policy.epoch(), 1u);
  Message bogus;
  bogus.type = MsgType::kRefuse;
  job.policy.Received(b, bogus, job.now);
  EXPECT_EQ(job.out.Last(b, MsgType::kRefuse).code,
            static_cast<uint32_t>(absl::StatusCode::kDataLoss));
  EXPECT_FALSE(job.policy.connected(b));
  EXPECT_EQ(job.policy.epoch(), 2u);
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a, c));
  job.policy.Lost(c, "connection reset");  // threw std::out_of_range before the fix
  EXPECT_EQ(job.policy.epoch(), 3u);
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a));
  EXPECT_THAT(job.out.closed, UnorderedElementsAre(b, c));
}

TEST_F(MembershipPolicyTest, ASilentMemberIsEvictedAndTheOthersHeartbeated) {
  Job job(&units_, 2);
  const uint64_t a = job.Join("a"), b = job.Join("b");
  Message hb;
  hb.type = MsgType::kHeartbeat;
  job.policy.Received(a, hb, job.now + kPeerTimeout);
  job.policy.Tick(job.now + kPeerTimeout + absl::Milliseconds(1));
  EXPECT_EQ(job.out.Of(b, MsgType::kEvicted).size(), 1u);
  EXPECT_FALSE(job.out.Last(b, MsgType::kEvicted).replica_left);
  EXPECT_FALSE(job.policy.connected(b));
  EXPECT_EQ(job.out.Of(a, MsgType::kHeartbeat).size(), 1u);
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a));
  EXPECT_EQ(job.policy.epoch(), 2u);
}

TEST_F(MembershipPolicyTest, AMemberThatCannotBeReachedIsDropped) {
  Job job(&units_, 2);
  const uint64_t a = job.Join("a"), b = job.Join("b");
  job.out.unreachable.insert(b);
  job.policy.Tick(job.now + absl::Seconds(1));  // heartbeats: b's send fails
  EXPECT_FALSE(job.policy.connected(b));
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a));
}

TEST_F(MembershipPolicyTest, ASetupFailureMakesTheNextEpochFresh) {
  Job job(&units_, 3);
  const uint64_t a = job.Join("a"), b = job.Join("b"), c = job.Join("c");
  job.Leave(c);  // epoch 2, derived
  Message failed;
  failed.type = MsgType::kSetupFailed;
  failed.epoch = 2;
  job.policy.Received(b, failed, job.now);
  EXPECT_EQ(job.policy.epoch(), 3u);
  EXPECT_EQ(job.out.Last(a, MsgType::kEpoch).parent_epoch, 0u);
  EXPECT_EQ(job.out.roots, 2);
}

// c cannot reach a (and a not c), both reach b and the master: every epoch's set-up fails
// between them. Each names the other once per epoch (a tie): after the second epoch, the newer
// of the two is dropped, told why, and the others go on. A failure that names a peer waits for
// the epoch's other failures until a tick kBlameGrace later.
TEST_F(MembershipPolicyTest, APairWhoseSetUpsFailTwiceLosesItsNewerMemberOnATie) {
  Job job(&units_, 3);
  const uint64_t a = job.Join("a"), b = job.Join("b"), c = job.Join("c");
  ASSERT_EQ(job.policy.epoch(), 1u);
  EXPECT_EQ(job.policy.settle_due(), absl::InfiniteFuture());
  job.SetupFailed(c, 1, 1);  // c could not connect to rank 0 (a)
  EXPECT_EQ(job.policy.settle_due(), job.now + absl::Milliseconds(250));  // the server ticks then
  job.SetupFailed(a, 1, 3);  // a could not connect to c
  job.policy.Tick(job.now + absl::Milliseconds(100));  // within the grace: b may still report
  EXPECT_EQ(job.policy.epoch(), 1u);
  job.policy.Tick(job.policy.settle_due());  // epoch 2, the same members
  EXPECT_EQ(job.policy.epoch(), 2u);
  EXPECT_EQ(job.policy.settle_due(), absl::InfiniteFuture());
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a, b, c));
  EXPECT_EQ(job.out.Last(b, MsgType::kEpoch).parent_epoch, 0u);
  job.SetupFailed(a, 2, 3);  // epoch 2 fails between the same two
  job.policy.Tick(job.now + absl::Seconds(1));
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a, b));
  EXPECT_FALSE(job.policy.connected(c));
  EXPECT_THAT(job.out.closed, ElementsAre(c));
  const Message evicted = job.out.Last(c, MsgType::kEvicted);
  EXPECT_THAT(evicted.text,
              AllOf(HasSubstr("unreachable from rank 0 (a)"), HasSubstr("epochs 1 and 2"),
                    HasSubstr("the newer member goes")));
  EXPECT_EQ(job.policy.epoch(), 3u);
  EXPECT_EQ(job.out.Last(b, MsgType::kEpoch).nranks, 2u);
  EXPECT_EQ(job.out.Last(b, MsgType::kEpoch).parent_epoch, 0u);  // epoch 2 was never built
}

// a is cut off from b and c (not from the master): b and c name a, a names one of them. The
// member named by more members goes, although it is the oldest. Once every member of the
// epoch reported, no tick is needed.
TEST_F(MembershipPolicyTest, TheMemberMostPeersCannotReachIsDropped) {
  Job job(&units_, 3);
  const uint64_t a = job.Join("a"), b = job.Join("b"), c = job.Join("c");
  job.SetupFailed(b, 1, 1);  // b -> a
  job.SetupFailed(c, 1, 1);  // c -> a
  job.SetupFailed(a, 1, 2);  // a -> b: all three reported
  ASSERT_EQ(job.policy.epoch(), 2u);
  job.SetupFailed(a, 2, 3);  // a -> c: a and c failed in epochs 1 and 2
  job.policy.Tick(job.now + absl::Seconds(1));
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(b, c));
  EXPECT_FALSE(job.policy.connected(a));
  EXPECT_THAT(job.out.Last(a, MsgType::kEvicted).text,
              AllOf(HasSubstr("unreachable from rank"), HasSubstr("named by 2 member(s)")));
}

// The rule counts failures since the last committed step, names that are members, and only
// a peer named: a pair that failed once, then worked, then failed once more stays.
TEST_F(MembershipPolicyTest, SetUpFailuresSeparatedByACommitOrNamingNobodyDropNobody) {
  Job job(&units_, 3);
  const uint64_t a = job.Join("a"), b = job.Join("b"), c = job.Join("c");
  const auto settle = [&] { job.policy.Tick(job.now + absl::Seconds(1)); };
  job.SetupFailed(c, 1, 1);
  settle();  // epoch 2
  job.CommitStep(0);  // epoch 2 works after all
  job.SetupFailed(c, 2, 1);
  settle();  // epoch 3
  EXPECT_EQ(job.policy.epoch(), 3u);
  job.SetupFailed(c, 3, 0);  // no peer named: epoch 4 at once
  EXPECT_EQ(job.policy.epoch(), 4u);
  job.SetupFailed(c, 4, 3);  // itself
  settle();
  job.SetupFailed(c, 5, 9);  // no such rank
  settle();
  job.SetupFailed(b, 6, 3);  // b -> c: the pair's first failure since the commit
  settle();
  EXPECT_THAT(job.policy.member_ids(), ElementsAre(a, b, c));
  EXPECT_THAT(job.out.closed, IsEmpty());
  EXPECT_EQ(job.policy.epoch(), 7u);
}

// Two shard jobs, each with a full replica, and a two-stage pipeline replica "p" whose stage 0
// is in job A and stage 1 in job B.
class PipelineUnitTest : public MembershipPolicyTest {
 protected:
  PipelineUnitTest() : a_(&units_, 1), b_(&units_, 1) {
    fa_ = a_.Join("full-a");
    fb_ = b_.Join("full-b");
  }
  Job a_, b_;
  uint64_t fa_ = 0, fb_ = 0;
};

TEST_F(PipelineUnitTest, AUnitIsAdmittedOnlyOnceEveryStageIsBack) {
  const uint64_t p0 = a_.Join("p0", "p", 0, 2);
  a_.CommitStep(0);
  EXPECT_EQ(a_.policy.waiting(), 0);  // stage 1 is missing: not even queued
  EXPECT_THAT(a_.policy.member_ids(), ElementsAre(fa_));
  const uint64_t p1 = b_.Join("p1", "p", 1, 2);
  // Released: both wait for outer step 2 of A (at step 1) and B (at step 0).
  EXPECT_EQ(a_.policy.waiting(), 1);
  EXPECT_EQ(b_.policy.waiting(), 1);
  b_.CommitStep(0);
  EXPECT_EQ(b_.policy.waiting(), 1);  // B at step 1: not yet the unit's step
  a_.CommitStep(1);
  b_.CommitStep(1);
  EXPECT_THAT(a_.policy.member_ids(), ElementsAre(fa_, p0));
  EXPECT_THAT(b_.policy.member_ids(), ElementsAre(fb_, p1));
  EXPECT_EQ(a_.out.Last(p0, MsgType::kEpoch).step, 2u);
  EXPECT_EQ(b_.out.Last(p1, MsgType::kEpoch).step, 2u);
}

TEST_F(PipelineUnitTest, AStageThatLeavesTakesItsWholeUnitOut) {
  const uint64_t p0 = a_.Join("p0", "p", 0, 2);
  const uint64_t p1 = b_.Join("p1", "p", 1, 2);
  a_.CommitStep(0);
  b_.CommitStep(0);
  ASSERT_THAT(a_.policy.member_ids(), ElementsAre(fa_, p0));
  ASSERT_THAT(b_.policy.member_ids(), ElementsAre(fb_, p1));
  const uint64_t epoch_a = a_.policy.epoch();

  b_.policy.Lost(p1, "connection reset");
  EXPECT_THAT(b_.policy.member_ids(), ElementsAre(fb_));
  // Its sibling in the other job is evicted, saying why, and that job goes on without it.
  const Message evicted = a_.out.Last(p0, MsgType::kEvicted);
  EXPECT_TRUE(evicted.replica_left);
  EXPECT_THAT(evicted.text, ::testing::HasSubstr("pipeline replica 'p' left"));
  EXPECT_THAT(a_.out.closed, ElementsAre(p0));
  EXPECT_THAT(a_.policy.member_ids(), ElementsAre(fa_));
  EXPECT_EQ(a_.policy.epoch(), epoch_a + 1);
  EXPECT_TRUE(units_.units.empty());
}

TEST_F(PipelineUnitTest, AWaitingStageGoesBackToWaitingWhenItsSiblingLeaves) {
  const uint64_t p0 = a_.Join("p0", "p", 0, 2);
  const uint64_t p1 = b_.Join("p1", "p", 1, 2);
  EXPECT_EQ(a_.policy.waiting(), 1);
  b_.policy.Lost(p1, "connection reset");
  EXPECT_EQ(a_.policy.waiting(), 0);
  EXPECT_TRUE(a_.policy.connected(p0));  // still joined, waiting for stage 1 again
  a_.CommitStep(0);
  EXPECT_THAT(a_.policy.member_ids(), ElementsAre(fa_));
  const uint64_t again = b_.Join("p1-again", "p", 1, 2);
  EXPECT_EQ(a_.policy.waiting(), 1);
  EXPECT_EQ(b_.policy.waiting(), 1);
  EXPECT_NE(again, p1);
}

// Stage 0 misses its replica's outer step (its job committed that step without admitting: a
// member that failed it was gone) while stage 1 was admitted in the other job: stage 1 is
// evicted and stage 0 waits again for a whole replica. It used to come back into a unit made
// anew with no stage count: released alone, and every later stage 1 refused ("has 0 stages").
TEST_F(PipelineUnitTest, AStageThatMissedItsStepWaitsForAWholeReplicaAgain) {
  const uint64_t fa2 = a_.Join("full-a2");
  a_.CommitStep(0);  // fa2 admitted
  b_.CommitStep(0);
  ASSERT_THAT(a_.policy.member_ids(), ElementsAre(fa_, fa2));
  const uint64_t p0 = a_.Join("p0", "p", 0, 2);
  const uint64_t p1 = b_.Join("p1", "p", 1, 2);  // released: both at outer step 2
  b_.CommitStep(1);
  ASSERT_THAT(b_.policy.member_ids(), ElementsAre(fb_, p1));
  a_.Report(fa_, a_.policy.epoch(), 1, true);
  a_.policy.Lost(fa2, "connection reset");  // step 1 committed without fa2: nobody admitted
  a_.CommitStep(2);                          // A at step 3: p0 missed step 2
  EXPECT_TRUE(b_.out.Last(p1, MsgType::kEvicted).replica_left);
  EXPECT_THAT(a_.policy.member_ids(), ElementsAre(fa_));
  EXPECT_TRUE(a_.policy.connected(p0));
  EXPECT_EQ(a_.policy.waiting(), 0);  // not released without stage 1
  ASSERT_EQ(units_.units.count("p"), 1u);
  EXPECT_EQ(units_.units["p"].stages, 2);
  EXPECT_FALSE(units_.units["p"].released);
  const uint64_t p1_again = b_.Join("p1-again", "p", 1, 2);
  EXPECT_TRUE(b_.policy.connected(p1_again));  // not refused
  EXPECT_EQ(a_.policy.waiting(), 1);
  EXPECT_EQ(b_.policy.waiting(), 1);
}

TEST_F(PipelineUnitTest, ANewIncarnationOfAStageReplacesTheOldOne) {
  const uint64_t p0 = a_.Join("p0", "p", 0, 2);
  const uint64_t p0_again = a_.Join("p0-again", "p", 0, 2);
  EXPECT_FALSE(a_.policy.connected(p0));
  EXPECT_TRUE(a_.policy.connected(p0_again));
  ASSERT_EQ(units_.units.count("p"), 1u);
  EXPECT_EQ(units_.units["p"].present.at(0).member, p0_again);
}

}  // namespace
}  // namespace lbcc::comm::elastic
