// ElasticGroup and ElasticMaster with members as threads over the loopback transport: forming a
// group, bit-identical steps, clean leaves (also while a step is in flight, two at once), joins
// during a step, refused joins, and the master's own failure. Killed, stopped (SIGSTOP) and
// restarted members as processes over UCX: elastic_churn_test.cc.
#include "comm/elastic/elastic.h"

#include <xxhash.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/scoped_env.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "codecs/topk_ef.h"
#include "comm/elastic/background.h"
#include "comm/elastic/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kElements = 8192;

std::unique_ptr<ElasticMaster> StartMaster(int min_members, const std::string& job = "job-1") {
  ElasticMasterOptions o;
  o.job_id = job;
  o.peer_timeout = absl::Seconds(5);
  o.min_members = min_members;
  absl::StatusOr<std::unique_ptr<ElasticMaster>> m = ElasticMaster::Start(o);
  EXPECT_THAT(m.status(), IsOk());
  return m.ok() ? std::move(*m) : nullptr;
}

ElasticOptions MemberOptions(const ElasticMaster& master, const std::string& name) {
  ElasticOptions o;
  o.master_address = master.address();
  o.job_id = "job-1";
  o.name = name;
  o.comm_config.backend = "loopback";
  o.peer_timeout = absl::Seconds(5);
  o.op_timeout = absl::Seconds(30);
  o.join_timeout = absl::Seconds(30);
  return o;
}

// The pseudo-gradient member `seed` sends in `step`: the same on every try of the step.
std::vector<float> Delta(int seed, uint64_t step) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 7919 + step));
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> v(kElements);
  for (float& x : v) x = normal(rng);
  return v;
}

std::unique_ptr<codecs::TopKEfCodec> Codec() {
  return *codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
}

uint64_t Hash(const std::vector<float>& v) { return XXH3_64bits(v.data(), v.size() * 4); }

// One member: its shared state (a parameter vector), its error feedback, what it committed.
struct Member {
  int seed = 0;
  std::vector<float> params = std::vector<float>(kElements, 0.f);
  codecs::TopKEfState state;
  std::unique_ptr<ElasticGroup> group;
  std::map<uint64_t, uint64_t> out_hash;  // committed step -> hash of its aggregate
  std::vector<uint64_t> committed;        // steps this member committed, in order
  // The last exchange's aggregate: left as it is until the next call (the group may forward
  // it from there to a member whose exchange failed).
  std::vector<float> out = std::vector<float>(kElements);
  int aborted = 0;
  absl::Duration op_timeout = absl::Seconds(30);
  absl::Duration setup_timeout = absl::ZeroDuration();  // zero: the group's default

  absl::Status Join(const ElasticMaster& master, const std::string& name,
                    int64_t state_step = -1) {
    ElasticOptions o = MemberOptions(master, name);
    o.state_step = state_step;
    o.op_timeout = op_timeout;
    if (setup_timeout > absl::ZeroDuration()) o.comm_config.timeout = setup_timeout;
    LBCC_ASSIGN_OR_RETURN(TensorView p, TensorView::Host(params.data(), {kElements}));
    LBCC_ASSIGN_OR_RETURN(group, ElasticGroup::Join(o, {p}));
    return absl::OkStatus();
  }

  // One outer step, retried over new epochs: Boundary, exchange, outer update (params += out).
  absl::Status Step(const codecs::Codec& codec) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      absl::Status s = group->Boundary();
      if (IsRetryable(s)) {
        ++aborted;
        continue;
      }
      LBCC_RETURN_IF_ERROR(s);
      const uint64_t step = group->step();
      std::vector<float> delta = Delta(seed, step);
      LBCC_ASSIGN_OR_RETURN(TensorView d, TensorView::Host(delta.data(), {kElements}));
      LBCC_ASSIGN_OR_RETURN(TensorView o, TensorView::Host(out.data(), {kElements}));
      s = group->SparseAllReduce({{d, o, &state}}, &codec);
      if (IsRetryable(s)) {
        ++aborted;
        continue;
      }
      LBCC_RETURN_IF_ERROR(s);
      for (int64_t i = 0; i < kElements; ++i) params[i] += out[i];
      out_hash[step] = Hash(out);
      committed.push_back(step);
      return absl::OkStatus();
    }
    return absl::InternalError("too many retries");
  }
};

// A fresh state fed the member's committed steps' deltas, committing each: what its error
// feedback must be if nothing was lost and nothing applied twice.
std::vector<float> ReplayError(const Member& m, const codecs::Codec& codec) {
  codecs::TopKEfState replay;
  std::vector<uint8_t> buf(*codec.MaxEncodedBytes({kElements}));
  for (uint64_t step : m.committed) {
    std::vector<float> delta = Delta(m.seed, step);
    EXPECT_THAT(codec.Encode(*TensorView::Host(delta.data(), {kElements}), &replay,
                             absl::MakeSpan(buf))
                    .status(),
                IsOk());
    EXPECT_THAT(replay.Commit(), IsOk());
  }
  return std::vector<float>(replay.error().begin(), replay.error().end());
}

void ExpectErrorFeedbackExact(const Member& m, const codecs::Codec& codec) {
  const std::vector<float> want = ReplayError(m, codec);
  ASSERT_FALSE(m.state.has_pending());
  if (m.committed.empty()) return;
  const std::vector<float> got(m.state.error().begin(), m.state.error().end());
  EXPECT_EQ(got, want) << "member " << m.seed;
}

// Runs `steps` outer steps on every member in `members` (threads).
std::vector<absl::Status> RunSteps(std::vector<Member*> members, int steps,
                                   const codecs::Codec& codec) {
  std::vector<absl::Status> results(members.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < members.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int s = 0; s < steps && results[i].ok(); ++s) results[i] = members[i]->Step(codec);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::vector<absl::Status> JoinAll(const ElasticMaster& master, std::vector<Member*> members) {
  std::vector<absl::Status> results(members.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < members.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = members[i]->Join(master, absl::StrCat("m", members[i]->seed));
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(ElasticTest, GroupFormsSyncsStateAndStepsBitIdentically) {
  auto master = StartMaster(3);
  ASSERT_NE(master, nullptr);
  auto codec = Codec();
  Member m[3];
  for (int i = 0; i < 3; ++i) {
    m[i].seed = i;
    m[i].params.assign(kElements, static_cast<float>(i));  // only rank 0's survives the sync
  }
  for (const absl::Status& s : JoinAll(*master, {&m[0], &m[1], &m[2]})) ASSERT_THAT(s, IsOk());
  for (const absl::Status& s : RunSteps({&m[0], &m[1], &m[2]}, 4, *codec)) EXPECT_THAT(s, IsOk());
  // Members commit at once; the master's decision follows (awaited before the next phase).
  EXPECT_TRUE(master->AwaitCommittedSteps(4, absl::Seconds(30)));
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(m[i].out_hash, m[0].out_hash);
    EXPECT_EQ(m[i].params, m[0].params);
  }
  // The state holder is whoever joined first; the two others received it.
  uint64_t received = 0;
  for (int i = 0; i < 3; ++i) received += m[i].group->stats().state_bytes_received;
  EXPECT_GE(received, 2 * kElements * sizeof(float));
  for (int i = 0; i < 3; ++i) ExpectErrorFeedbackExact(m[i], *codec);
}

// A survivor already in its next step when the leave is announced retries it once; no timeout.
TEST(ElasticTest, CleanLeaveBetweenStepsCostsAtMostOneRetry) {
  auto master = StartMaster(3);
  auto codec = Codec();
  Member m[3];
  for (int i = 0; i < 3; ++i) m[i].seed = i;
  for (const absl::Status& s : JoinAll(*master, {&m[0], &m[1], &m[2]})) ASSERT_THAT(s, IsOk());
  for (const absl::Status& s : RunSteps({&m[0], &m[1], &m[2]}, 2, *codec)) ASSERT_THAT(s, IsOk());
  const uint64_t epoch = master->epoch();
  ASSERT_THAT(m[2].group->Leave(), IsOk());
  for (const absl::Status& s : RunSteps({&m[0], &m[1]}, 2, *codec)) EXPECT_THAT(s, IsOk());
  EXPECT_GT(master->epoch(), epoch);
  EXPECT_EQ(master->members(), 2);
  EXPECT_EQ(m[0].out_hash, m[1].out_hash);
  EXPECT_LE(m[0].aborted, 1);
  EXPECT_LE(m[1].aborted, 1);
  for (int i = 0; i < 3; ++i) ExpectErrorFeedbackExact(m[i], *codec);
}

// A member that leaves right after its own step, while the others may still be inside that
// step's exchange (the first member to finish the step leaves): its departure is announced
// once the step is decided (every other member finished it), so each survivor derives the next
// epoch's communicator from the current one's connections at once (Communicator::Subgroup: no
// bootstrap, no new connections, no timer) and its next step runs over it without a retry. A
// departure announced while a survivor's phase ran would make it abort that communicator and
// build the next epoch anew (a set-up failure, one more epoch). Three times: 5 -> 2 members.
TEST(ElasticTest, ACleanLeaveRightAfterAStepCostsTheSurvivorsNoRetryAndNoNewConnections) {
  constexpr int kMembers = 5;
  auto master = StartMaster(kMembers);
  ASSERT_NE(master, nullptr);
  auto codec = Codec();
  Member m[kMembers];
  std::vector<Member*> alive;
  for (int i = 0; i < kMembers; ++i) {
    m[i].seed = i;
    alive.push_back(&m[i]);
  }
  for (const absl::Status& s : JoinAll(*master, alive)) ASSERT_THAT(s, IsOk());
  for (const absl::Status& s : RunSteps(alive, 1, *codec)) ASSERT_THAT(s, IsOk());
  while (alive.size() > 2) {
    const uint64_t epoch = master->epoch();
    std::vector<ElasticStats> before;
    for (Member* a : alive) before.push_back(a->group->stats());
    std::atomic<int> leaver{-1};
    std::vector<absl::Status> results(alive.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < alive.size(); ++i) {
      threads.emplace_back([&, i] {
        results[i] = alive[i]->Step(*codec);
        if (!results[i].ok()) return;
        int none = -1;
        if (leaver.compare_exchange_strong(none, static_cast<int>(i))) {
          results[i] = alive[i]->group->Leave();
          return;
        }
        // As during a trainer's inner steps: the announcement arrives, then the next step.
        if (!alive[i]->group->AwaitEpoch(epoch + 1, absl::Seconds(30))) {
          results[i] = absl::DeadlineExceededError("the leave was not announced");
          return;
        }
        results[i] = alive[i]->Step(*codec);
      });
    }
    for (auto& t : threads) t.join();
    for (const absl::Status& s : results) ASSERT_THAT(s, IsOk());
    ASSERT_GE(leaver.load(), 0);
    // One epoch for the departure; none for a set-up that failed.
    EXPECT_EQ(master->epoch(), epoch + 1);
    EXPECT_EQ(master->members(), static_cast<int>(alive.size()) - 1);
    for (size_t i = 0; i < alive.size(); ++i) {
      if (static_cast<int>(i) == leaver) continue;
      const ElasticStats after = alive[i]->group->stats();
      const int seed = alive[i]->seed;
      EXPECT_EQ(after.aborted_calls, before[i].aborted_calls) << "member " << seed;
      EXPECT_EQ(after.fresh_epochs, before[i].fresh_epochs) << "member " << seed;
      EXPECT_EQ(after.derived_epochs, before[i].derived_epochs + 1) << "member " << seed;
      EXPECT_EQ(after.committed_epoch, epoch + 1) << "member " << seed;
      EXPECT_EQ(alive[i]->aborted, 0) << "member " << seed;
    }
    alive.erase(alive.begin() + leaver);
  }
  EXPECT_EQ(alive[0]->out_hash, alive[1]->out_hash);
  EXPECT_EQ(alive[0]->params, alive[1]->params);
  for (int i = 0; i < kMembers; ++i) ExpectErrorFeedbackExact(m[i], *codec);
}

TEST(ElasticTest, LeavingWhileOthersAreInAStepAbortsAndRetriesOverTheSurvivors) {
  auto master = StartMaster(4);
  auto codec = Codec();
  Member m[4];
  for (int i = 0; i < 4; ++i) m[i].seed = i;
  for (const absl::Status& s : JoinAll(*master, {&m[0], &m[1], &m[2], &m[3]})) {
    ASSERT_THAT(s, IsOk());
  }
  for (const absl::Status& s : RunSteps({&m[0], &m[1], &m[2], &m[3]}, 1, *codec)) {
    ASSERT_THAT(s, IsOk());
  }
  // Members 0 and 1 enter step 1; 2 and 3 never do: they leave at once while it is in flight.
  std::thread survivors([&] {
    for (const absl::Status& s : RunSteps({&m[0], &m[1]}, 2, *codec)) EXPECT_THAT(s, IsOk());
  });
  // The survivors' step is in flight once their communicator runs an operation; waiting for
  // the master to see their reports is not possible (they cannot finish), so leave right away:
  // either order (leave before or during the step) must end with both survivors' steps done.
  std::thread a([&] { EXPECT_THAT(m[2].group->Leave(), IsOk()); });
  std::thread b([&] { EXPECT_THAT(m[3].group->Leave(), IsOk()); });
  a.join();
  b.join();
  survivors.join();
  EXPECT_EQ(master->members(), 2);
  EXPECT_EQ(m[0].out_hash, m[1].out_hash);
  EXPECT_EQ(m[0].committed, (std::vector<uint64_t>{0, 1, 2}));
  for (int i = 0; i < 4; ++i) ExpectErrorFeedbackExact(m[i], *codec);
}

// A member that stays in the group but never comes to the exchange (a trainer held inside its
// other shard group's call) keeps the master from deciding the step the others failed: they
// leave the group after the set-up and operation timeouts with DeadlineExceeded, states rolled
// back, instead of waiting for ever.
TEST(ElasticTest, AMemberThatNeverComesToTheExchangeHoldsTheOthersOnlyForTheTimeouts) {
  auto master = StartMaster(2);
  auto codec = Codec();
  Member m[2];
  for (int i = 0; i < 2; ++i) {
    m[i].seed = i;
    m[i].op_timeout = absl::Seconds(1);
    m[i].setup_timeout = absl::Seconds(2);
  }
  for (const absl::Status& s : JoinAll(*master, {&m[0], &m[1]})) ASSERT_THAT(s, IsOk());
  for (const absl::Status& s : RunSteps({&m[0], &m[1]}, 1, *codec)) ASSERT_THAT(s, IsOk());
  // Member 1 makes no call; member 0's exchange of step 1 fails at its operation timeout and
  // waits for a decision that needs member 1's report.
  const absl::Status s = m[0].Step(*codec);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDeadlineExceeded,
                          AllOf(HasSubstr("no decision on step 1"),
                                HasSubstr("this member left the group"))));
  EXPECT_EQ(m[0].committed, (std::vector<uint64_t>{0}));
  ExpectErrorFeedbackExact(m[0], *codec);  // step 1's update rolled back
  // Out for good: its next call says so at once.
  EXPECT_THAT(m[0].group->Boundary(), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(ElasticTest, ANewcomerWaitsForTheStepInFlightThenGetsTheState) {
  auto master = StartMaster(2);
  auto codec = Codec();
  Member m[3];
  for (int i = 0; i < 3; ++i) m[i].seed = i;
  for (const absl::Status& s : JoinAll(*master, {&m[0], &m[1]})) ASSERT_THAT(s, IsOk());
  for (const absl::Status& s : RunSteps({&m[0], &m[1]}, 2, *codec)) ASSERT_THAT(s, IsOk());
  // Step 1 decided: the next boundary for a newcomer is after step 2.
  ASSERT_TRUE(master->AwaitCommittedSteps(2, absl::Seconds(30)));
  // Member 0 enters step 2 and waits for member 1; the newcomer joins meanwhile.
  std::atomic<bool> joined{false};
  absl::Status first;
  std::thread zero([&] { first = m[0].Step(*codec); });
  std::thread newcomer([&] {
    EXPECT_THAT(m[2].Join(*master, "m2"), IsOk());
    joined = true;
  });
  // The newcomer is admitted only once step 2 committed, which needs member 1.
  ASSERT_TRUE(master->AwaitWaiting(1, absl::Seconds(30)));
  EXPECT_FALSE(joined);
  EXPECT_THAT(m[1].Step(*codec), IsOk());
  zero.join();
  newcomer.join();
  EXPECT_THAT(first, IsOk());
  ASSERT_TRUE(joined);
  EXPECT_EQ(m[0].aborted + m[1].aborted, 0);
  EXPECT_EQ(m[2].group->step(), 3u);
  for (const absl::Status& s : RunSteps({&m[0], &m[1], &m[2]}, 2, *codec)) EXPECT_THAT(s, IsOk());
  EXPECT_EQ(m[2].params, m[0].params);
  EXPECT_EQ(m[1].params, m[0].params);
  EXPECT_EQ(m[2].out_hash.at(3), m[0].out_hash.at(3));
  EXPECT_GE(m[2].group->stats().state_bytes_received, kElements * sizeof(float));
  for (int i = 0; i < 3; ++i) ExpectErrorFeedbackExact(m[i], *codec);
}

// The forward phase: a step that failed on one live member only while the others committed
// it. The live communicator's own agreement makes that rare, so the third member here speaks
// the members' protocol itself (elastic_wire.h) over a real communicator of each epoch: it
// takes part in the exchange and then reports a failure. The master must forward the step: in
// the next epoch the lowest rank that committed sends its result to that member, which gets
// exactly the bits it computed itself; the others commit the step once, and go on.
TEST(ElasticTest, AStepThatFailedOnOneLiveMemberOnlyIsForwardedToIt) {
  using elastic::Message;
  using elastic::MsgType;
  using elastic::Phase;
  auto master = StartMaster(3);
  ASSERT_NE(master, nullptr);
  auto codec = Codec();
  Member m[2];
  for (int i = 0; i < 2; ++i) m[i].seed = i;
  // The two real members join first (ranks 0 and 1); the shared state is empty, so the first
  // boundary moves nothing but still runs its phase (the fake takes part in it).
  std::thread real([&] {
    std::vector<std::thread> t;
    for (int i = 0; i < 2; ++i) {
      t.emplace_back([&, i] {
        ElasticOptions o = MemberOptions(*master, absl::StrCat("m", i));
        absl::StatusOr<std::unique_ptr<ElasticGroup>> g = ElasticGroup::Join(o, {});
        ASSERT_THAT(g.status(), IsOk());
        m[i].group = std::move(*g);
      });
      // m0 waits before m1 joins (ranks in join order); the fake joins once both wait.
      if (i == 0) ASSERT_TRUE(master->AwaitWaiting(1, absl::Seconds(30)));
    }
    for (auto& x : t) x.join();
  });
  ASSERT_TRUE(master->AwaitWaiting(2, absl::Seconds(30)));
  absl::StatusOr<std::unique_ptr<elastic::Socket>> sock =
      elastic::Socket::Connect(master->address(), absl::Now() + absl::Seconds(10));
  ASSERT_THAT(sock.status(), IsOk());
  auto send = [&](Message msg) {
    ASSERT_THAT((*sock)->Send(msg, absl::Now() + absl::Seconds(5)), IsOk());
  };
  // The next message of `type` (heartbeats and others skipped).
  auto next = [&](MsgType type) -> Message {
    while (true) {
      absl::StatusOr<Message> msg = (*sock)->Receive(absl::Now() + absl::Seconds(30));
      EXPECT_THAT(msg.status(), IsOk());
      if (!msg.ok() || msg->type == type) return msg.ok() ? *msg : Message{};
    }
  };
  Message join;
  join.type = MsgType::kJoin;
  join.job_id = "job-1";
  join.name = "fake";
  send(join);
  // Heartbeats, as a member sends them, until the fake leaves.
  std::atomic<bool> beating{true};
  std::thread heartbeat([&] {
    Message hb;
    hb.type = MsgType::kHeartbeat;
    while (beating) {
      (void)(*sock)->Send(hb, absl::Now() + absl::Seconds(1));
      absl::SleepFor(absl::Milliseconds(250));  // the heartbeat period, not a synchronisation
    }
  });
  struct StopBeating {
    std::atomic<bool>* beating;
    std::thread* t;
    ~StopBeating() {
      *beating = false;
      t->join();
    }
  } stop_beating{&beating, &heartbeat};
  next(MsgType::kWelcome);
  const Message e1 = next(MsgType::kEpoch);
  real.join();
  ASSERT_EQ(e1.rank, 2u);
  ASSERT_EQ(e1.nranks, 3u);
  UniqueId id;
  ASSERT_EQ(e1.unique_id.size(), sizeof(id.internal));
  std::memcpy(id.internal, e1.unique_id.data(), sizeof(id.internal));
  CommConfig config;
  config.backend = "loopback";
  std::unique_ptr<Communicator> comm1;
  std::thread build([&] {
    absl::StatusOr<std::unique_ptr<Communicator>> c = Communicator::Init(id, 3, 2, config);
    ASSERT_THAT(c.status(), IsOk());
    comm1 = std::move(*c);
  });

  // Members 0 and 1 step once (boundary: the state phase, then the exchange of step 0).
  std::vector<absl::Status> first(2);
  std::thread steps([&] {
    std::vector<std::thread> t;
    for (int i = 0; i < 2; ++i) t.emplace_back([&, i] { first[i] = m[i].Step(*codec); });
    for (auto& x : t) x.join();
  });
  build.join();
  ASSERT_NE(comm1, nullptr);
  // The fake's boundary: its state record (empty, like everyone's), and a report.
  struct Record {
    uint8_t synced = 0;
    uint64_t hash = 0;
    uint64_t bytes = 0;
  } record;
  record.hash = XXH3_64bits(nullptr, 0);
  std::string mine(reinterpret_cast<const char*>(&record), sizeof(record)), *mine_ptr = &mine;
  std::vector<std::string> all;
  ASSERT_THAT(comm1->AllGatherV(mine_ptr, &all)->Wait(), IsOk());
  Message report;
  report.type = MsgType::kReport;
  report.epoch = e1.epoch;
  report.phase = Phase::kSync;
  report.ok = true;
  send(report);
  ASSERT_TRUE(next(MsgType::kDecision).ok) << "the state phase did not commit";
  // The fake's exchange of step 0: it takes part for real, then reports a failure.
  std::vector<float> delta = Delta(2, 0), out(kElements);
  codecs::TopKEfState state;
  ASSERT_THAT(comm1
                  ->SparseAllReduce({{*TensorView::Host(delta.data(), {kElements}),
                                      *TensorView::Host(out.data(), {kElements}), &state}},
                                    codec.get())
                  ->Wait(),
              IsOk());
  report.phase = Phase::kStep;
  report.step = 0;
  report.ok = false;
  report.code = static_cast<uint32_t>(absl::StatusCode::kUnavailable);
  report.text = "the fake member's exchange failed";
  send(report);
  steps.join();
  for (const absl::Status& s : first) ASSERT_THAT(s, IsOk());  // committed at once

  const Message decision = next(MsgType::kDecision);
  EXPECT_FALSE(decision.ok);
  EXPECT_TRUE(decision.forward) << decision.text;
  const Message e2 = next(MsgType::kEpoch);
  ASSERT_TRUE(e2.forward);
  EXPECT_EQ(e2.forward_step, 0u);
  EXPECT_EQ(e2.forward_source, 0u);  // the lowest rank that committed
  EXPECT_EQ(e2.forward_to, std::vector<uint32_t>{2});
  ASSERT_EQ(e2.parent_epoch, e1.epoch);  // departures only: derived, no new connections
  absl::StatusOr<std::unique_ptr<Communicator>> comm2 = comm1->Subgroup(
      std::vector<int>(e2.parent_ranks.begin(), e2.parent_ranks.end()),
      static_cast<uint32_t>(2 + e2.epoch % 65534));
  ASSERT_THAT(comm2.status(), IsOk());

  // Members 0 and 1 start their next step: its boundary runs the forward phase first.
  std::vector<absl::Status> second(2);
  std::thread more([&] {
    std::vector<std::thread> t;
    for (int i = 0; i < 2; ++i) t.emplace_back([&, i] { second[i] = m[i].Step(*codec); });
    for (auto& x : t) x.join();
  });
  struct Header {
    uint32_t magic = 0, compressed = 0;
    uint64_t raw_bytes = 0, wire_bytes = 0, hash = 0;
  } header;
  constexpr uint32_t kForwardTag = 0x5e1b;
  ASSERT_THAT((*comm2)->Recv(&header, sizeof(header), 0, kForwardTag)->Wait(), IsOk());
  EXPECT_EQ(header.magic, 0x5453424cu);
  ASSERT_EQ(header.raw_bytes, kElements * sizeof(float));
  std::vector<float> forwarded(kElements);
  ASSERT_THAT((*comm2)->Recv(forwarded.data(), header.raw_bytes, 0, kForwardTag)->Wait(),
              IsOk());
  EXPECT_EQ(header.hash, XXH3_64bits(forwarded.data(), header.raw_bytes));
  EXPECT_EQ(forwarded, out) << "the forwarded result is not the step's";
  EXPECT_EQ(Hash(out), m[0].out_hash.at(0));
  report.epoch = e2.epoch;
  report.phase = Phase::kForward;
  report.ok = true;
  report.code = 0;
  report.text.clear();
  send(report);
  EXPECT_TRUE(next(MsgType::kDecision).ok) << "the forward phase did not commit";
  // The fake leaves; the others' step 1 goes on without it.
  Message leave;
  leave.type = MsgType::kLeave;
  send(leave);
  more.join();
  for (const absl::Status& s : second) EXPECT_THAT(s, IsOk());
  EXPECT_TRUE(master->AwaitCommittedSteps(2, absl::Seconds(30)));
  EXPECT_EQ(m[0].out_hash, m[1].out_hash);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(m[i].committed, (std::vector<uint64_t>{0, 1}));
    ExpectErrorFeedbackExact(m[i], *codec);
  }
  // Closing lingers for the peers' goodbyes: the members close theirs first.
  for (int i = 0; i < 2; ++i) EXPECT_THAT(m[i].group->Leave(), IsOk());
  comm2->reset();
  comm1.reset();
}

// A member lost while the others set up an epoch it belonged to (it never joined that epoch's
// bootstrap): the master stops that epoch's root and each member cancels its set-up of it as the
// next epoch is announced. With a set-up timeout of 300 s, every set-up thread is gone well
// before (without the cancellation, each would wait in the bootstrap for the lost member until
// the timeout).
TEST(ElasticTest, ASupersededEpochsSetUpIsCancelledAtOnce) {
  using elastic::Message;
  using elastic::MsgType;
  constexpr absl::Duration kSetup = absl::Seconds(300);
  ElasticMasterOptions mo;
  mo.job_id = "job-1";
  mo.peer_timeout = absl::Seconds(5);
  mo.min_members = 3;
  mo.setup_timeout = kSetup;
  absl::StatusOr<std::unique_ptr<ElasticMaster>> master = ElasticMaster::Start(mo);
  ASSERT_THAT(master.status(), IsOk());
  auto codec = Codec();
  Member m[2];
  for (int i = 0; i < 2; ++i) m[i].seed = i;
  std::thread real([&] {
    std::vector<std::thread> t;
    for (int i = 0; i < 2; ++i) {
      t.emplace_back([&, i] {
        ElasticOptions o = MemberOptions(**master, absl::StrCat("m", i));
        o.comm_config.timeout = kSetup;
        absl::StatusOr<std::unique_ptr<ElasticGroup>> g = ElasticGroup::Join(
            o, {*TensorView::Host(m[i].params.data(), {kElements})});
        ASSERT_THAT(g.status(), IsOk());
        m[i].group = std::move(*g);
      });
    }
    for (auto& x : t) x.join();
  });
  ASSERT_TRUE((*master)->AwaitWaiting(2, absl::Seconds(30)));
  // The third member speaks the protocol itself: it joins, is given epoch 1, and goes away
  // without joining the epoch's bootstrap, where the other two wait for it.
  absl::StatusOr<std::unique_ptr<elastic::Socket>> sock =
      elastic::Socket::Connect((*master)->address(), absl::Now() + absl::Seconds(10));
  ASSERT_THAT(sock.status(), IsOk());
  Message join;
  join.type = MsgType::kJoin;
  join.job_id = "job-1";
  join.name = "gone";
  ASSERT_THAT((*sock)->Send(join, absl::Now() + absl::Seconds(5)), IsOk());
  Message epoch;
  while (epoch.type != MsgType::kEpoch) {
    absl::StatusOr<Message> msg = (*sock)->Receive(absl::Now() + absl::Seconds(30));
    ASSERT_THAT(msg.status(), IsOk());
    epoch = *msg;
  }
  ASSERT_EQ(epoch.nranks, 3u);
  real.join();
  ASSERT_TRUE(m[0].group != nullptr && m[1].group != nullptr);
  (*sock)->Shutdown();
  sock->reset();
  // The two go on in a newer epoch without it ...
  for (const absl::Status& s : RunSteps({&m[0], &m[1]}, 1, *codec)) EXPECT_THAT(s, IsOk());
  EXPECT_GT(m[0].group->epoch(), epoch.epoch);
  EXPECT_EQ(m[0].out_hash, m[1].out_hash);
  // ... and no set-up of epoch 1 still waits for it.
  EXPECT_TRUE(elastic::Background::AwaitIdle(absl::Seconds(30)));
  for (Member& x : m) EXPECT_THAT(x.group->Leave(), IsOk());
}

TEST(ElasticTest, WrongJobIdAndStaleStateAreRefused) {
  auto master = StartMaster(1);
  auto codec = Codec();
  Member m;
  ASSERT_THAT(m.Join(*master, "m0"), IsOk());
  ASSERT_THAT(m.Step(*codec), IsOk());
  ASSERT_THAT(m.Step(*codec), IsOk());
  ASSERT_TRUE(master->AwaitCommittedSteps(2, absl::Seconds(30)));

  std::vector<float> params(kElements);
  ElasticOptions o = MemberOptions(*master, "intruder");
  o.job_id = "job-2";
  absl::StatusOr<std::unique_ptr<ElasticGroup>> wrong =
      ElasticGroup::Join(o, {*TensorView::Host(params.data(), {kElements})});
  EXPECT_THAT(wrong.status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job-2")));

  o = MemberOptions(*master, "stale");
  o.state_step = 1;  // the job is at step 2
  absl::StatusOr<std::unique_ptr<ElasticGroup>> stale =
      ElasticGroup::Join(o, {*TensorView::Host(params.data(), {kElements})});
  EXPECT_THAT(stale.status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("stale shared state")));
  EXPECT_EQ(master->members(), 1);
  EXPECT_THAT(m.Step(*codec), IsOk());
}

TEST(ElasticTest, ANewcomerWithTheWrongStateSizeFailsTheSyncWithoutHurtingTheOthers) {
  auto master = StartMaster(1);
  auto codec = Codec();
  Member m;
  ASSERT_THAT(m.Join(*master, "m0"), IsOk());
  ASSERT_THAT(m.Step(*codec), IsOk());
  ASSERT_TRUE(master->AwaitCommittedSteps(1, absl::Seconds(30)));  // the next boundary: step 1's end
  std::vector<float> small(16);
  ElasticOptions o = MemberOptions(*master, "small");
  std::unique_ptr<ElasticGroup> odd;
  std::thread join([&] {
    absl::StatusOr<std::unique_ptr<ElasticGroup>> g =
        ElasticGroup::Join(o, {*TensorView::Host(small.data(), {16})});
    ASSERT_THAT(g.status(), IsOk());
    odd = std::move(*g);
  });
  ASSERT_TRUE(master->AwaitWaiting(1, absl::Seconds(30)));
  ASSERT_THAT(m.Step(*codec), IsOk());  // admits the newcomer at its commit
  join.join();
  ASSERT_NE(odd, nullptr);
  absl::Status odd_sync;
  std::thread t([&] { odd_sync = odd->Boundary(); });
  const absl::Status member_sync = m.group->Boundary();
  t.join();
  EXPECT_THAT(odd_sync, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bytes")));
  EXPECT_FALSE(member_sync.ok());
  EXPECT_THAT(odd->Leave(), IsOk());
  EXPECT_THAT(m.Step(*codec), IsOk());
  ExpectErrorFeedbackExact(m, *codec);
}

TEST(ElasticTest, TheMastersFailureFailsEveryMemberWithAStatusNamingIt) {
  auto master = StartMaster(2);
  auto codec = Codec();
  Member m[2];
  for (int i = 0; i < 2; ++i) m[i].seed = i;
  for (const absl::Status& s : JoinAll(*master, {&m[0], &m[1]})) ASSERT_THAT(s, IsOk());
  for (const absl::Status& s : RunSteps({&m[0], &m[1]}, 1, *codec)) ASSERT_THAT(s, IsOk());
  ASSERT_TRUE(master->AwaitCommittedSteps(1, absl::Seconds(30)));
  const std::string address = master->address();
  master->Stop();
  // A step whose exchange succeeded everywhere commits without the master; the call after it
  // waits for the master's decision and fails.
  for (const absl::Status& s : RunSteps({&m[0], &m[1]}, 2, *codec)) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
  }
  for (int i = 0; i < 2; ++i) ExpectErrorFeedbackExact(m[i], *codec);
}

TEST(ElasticTest, MembersFindTheMasterThroughLbccMasterAddr) {
  auto master = StartMaster(1);
  lbcc::testing::ScopedEnv addr("LBCC_MASTER_ADDR", master->address().c_str());
  auto codec = Codec();
  Member m;
  ElasticOptions o = MemberOptions(*master, "m0");
  o.master_address.clear();
  absl::StatusOr<std::unique_ptr<ElasticGroup>> g =
      ElasticGroup::Join(o, {*TensorView::Host(m.params.data(), {kElements})});
  ASSERT_THAT(g.status(), IsOk());
  m.group = std::move(*g);
  EXPECT_THAT(m.Step(*codec), IsOk());
  EXPECT_TRUE(master->AwaitCommittedSteps(1, absl::Seconds(30)));
}

// The membership service's addresses as every LBCC address: IPv6 in brackets, host names.
TEST(ElasticTest, TheMasterListensOnIpv6AndMembersFindItByName) {
  auto codec = Codec();
  ElasticMasterOptions mo;
  mo.job_id = "job-1";
  mo.peer_timeout = absl::Seconds(5);
  mo.listen_address = "[::1]:0";
  absl::StatusOr<std::unique_ptr<ElasticMaster>> v6 = ElasticMaster::Start(mo);
  if (v6.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "no IPv6 loopback here: " << v6.status();
  }
  ASSERT_THAT(v6.status(), IsOk());
  EXPECT_THAT((*v6)->address(), ::testing::StartsWith("[::1]:"));
  Member a;
  ASSERT_THAT(a.Join(**v6, "a"), IsOk());
  EXPECT_THAT(a.Step(*codec), IsOk());
  EXPECT_TRUE((*v6)->AwaitCommittedSteps(1, absl::Seconds(30)));

  mo.listen_address = "localhost:0";  // Resolved: its first address, 127.0.0.1.
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ElasticMaster> named, ElasticMaster::Start(mo));
  const std::string address = named->address();
  ASSERT_THAT(address, ::testing::StartsWith("127.0.0.1:"));
  Member b;
  ElasticOptions o = MemberOptions(*named, "b");
  o.master_address = "localhost" + address.substr(address.rfind(':'));
  LBCC_ASSERT_OK_AND_ASSIGN(b.group,
                            ElasticGroup::Join(o, {*TensorView::Host(b.params.data(), {kElements})}));
  EXPECT_THAT(b.Step(*codec), IsOk());
  EXPECT_TRUE(named->AwaitCommittedSteps(1, absl::Seconds(30)));
}

TEST(ElasticTest, AnUnresolvableMasterIsInvalidArgumentNamingIt) {
  ElasticOptions o;
  o.master_address = "no-such-host.invalid:4000";
  o.job_id = "j";
  o.join_timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  EXPECT_THAT(ElasticGroup::Join(o, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("no-such-host.invalid"), HasSubstr("does not resolve"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(25)) << "not retried until the join timeout";
  ElasticMasterOptions mo;
  mo.job_id = "j";
  mo.listen_address = "fd77::1:0";
  EXPECT_THAT(ElasticMaster::Start(mo).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[addr]:port")));
}

TEST(ElasticTest, BadOptionsAreInvalidArgument) {
  ElasticMasterOptions mo;
  EXPECT_THAT(ElasticMaster::Start(mo).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  ElasticOptions o;
  o.master_address = "not-an-address";
  o.job_id = "j";
  EXPECT_THAT(ElasticGroup::Join(o, {}).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  o.master_address = "127.0.0.1:1";
  o.job_id = "";
  EXPECT_THAT(ElasticGroup::Join(o, {}).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

// The readers wait with an infinite deadline: their poll() slices must be whole slices, not
// zero (a zero timeout returns at once, and every reader thread spun on a CPU).
TEST(ElasticTest, SocketWaitsPollInBoundedSlicesThatNeverEndAWaitEarly) {
  using elastic::kPollSliceMs;
  using elastic::PollSliceMs;
  EXPECT_EQ(PollSliceMs(absl::InfiniteDuration()), kPollSliceMs);
  EXPECT_EQ(PollSliceMs(absl::InfiniteFuture() - absl::Now()), kPollSliceMs);
  EXPECT_EQ(PollSliceMs(absl::Hours(1000000)), kPollSliceMs);
  EXPECT_EQ(PollSliceMs(absl::Milliseconds(kPollSliceMs)), kPollSliceMs);
  EXPECT_EQ(PollSliceMs(absl::Microseconds(5500)), 6);  // a slice covers what is left
  EXPECT_EQ(PollSliceMs(absl::Microseconds(10)), 1);
  EXPECT_EQ(PollSliceMs(absl::ZeroDuration()), 0);
  EXPECT_EQ(PollSliceMs(-absl::Seconds(1)), 0);
  EXPECT_EQ(PollSliceMs(-absl::InfiniteDuration()), 0);
}

}  // namespace
}  // namespace lbcc::comm
