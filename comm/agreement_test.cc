// The vote agreement's control messages (round trip, every malformed form rejected with
// DataLoss) and the agreement over real control connections: ranks as threads over the
// loopback transport, each deciding one operation with a chosen local outcome.
#include "comm/agreement.h"

#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status_matchers.h"
#include "comm/collectives.h"
#include "comm/communicator.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using internal::ControlKind;
using internal::ControlMessage;
using internal::DecodeControl;
using internal::EncodeControl;
using ::lbcc::comm::testing::RankOptions;
using ::lbcc::comm::testing::RunRanks;
using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::Each;
using ::testing::HasSubstr;

TEST(ControlMessageTest, RoundTripsEveryKind) {
  for (ControlKind kind : {ControlKind::kVoteCommit, ControlKind::kVoteAbort, ControlKind::kQuery,
                           ControlKind::kReplyCommitted, ControlKind::kReplyAborted,
                           ControlKind::kReplyUndecided}) {
    const std::string bytes =
        EncodeControl(kind, 0x0001000200030000ull, absl::DataLossError("bad payload"));
    ControlMessage message;
    ASSERT_THAT(DecodeControl(bytes, &message), IsOk());
    EXPECT_EQ(message.kind, kind);
    EXPECT_EQ(message.op, 0x0001000200030000ull);
    if (kind == ControlKind::kVoteAbort || kind == ControlKind::kReplyAborted) {
      EXPECT_THAT(message.reason, StatusIs(absl::StatusCode::kDataLoss, "bad payload"));
    } else {
      EXPECT_THAT(message.reason, IsOk());
    }
  }
}

TEST(ControlMessageTest, LongReasonsAreCut) {
  const std::string bytes = EncodeControl(ControlKind::kVoteAbort, 7,
                                          absl::UnavailableError(std::string(5000, 'x')));
  ControlMessage message;
  ASSERT_THAT(DecodeControl(bytes, &message), IsOk());
  EXPECT_EQ(message.reason.message().size(), internal::kMaxReasonBytes);
}

TEST(ControlMessageTest, MalformedMessagesAreDataLoss) {
  const std::string good = EncodeControl(ControlKind::kQuery, 7, absl::OkStatus());
  std::vector<std::string> bad = {"", good.substr(0, 15), good + "x"};
  for (size_t i : {0, 4, 5, 6}) {
    std::string flipped = good;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
    bad.push_back(flipped);
  }
  std::string unknown = good;
  unknown[5] = 9;
  bad.push_back(unknown);
  std::string short_abort = EncodeControl(ControlKind::kVoteAbort, 7, absl::OkStatus());
  bad.push_back(short_abort.substr(0, 18));
  for (const std::string& bytes : bad) {
    ControlMessage message;
    EXPECT_THAT(DecodeControl(bytes, &message), StatusIs(absl::StatusCode::kDataLoss))
        << bytes.size() << " bytes";
  }
}

// Decide() directly, on every rank's Fabric agreement; `local` per rank.
std::vector<absl::Status> DecideEverywhere(const std::vector<absl::Status>& local) {
  std::vector<absl::Status> decided(local.size());
  RankOptions options;
  options.timeout = absl::Seconds(20);
  auto statuses = RunRanks(static_cast<int>(local.size()), options,
                           [&](int rank, Communicator& comm) -> absl::Status {
                             Group group;
                             group.fabric = comm.fabric();
                             for (int r = 0; r < comm.nranks(); ++r) group.ranks.push_back(r);
                             group.me = rank;
                             decided[rank] = comm.fabric()->agreement()->Decide(
                                 group, MakeTag(9, 1, 0), local[rank],
                                 absl::Now() + absl::Seconds(20));
                             return absl::OkStatus();
                           });
  EXPECT_THAT(statuses, Each(IsOk()));
  return decided;
}

TEST(VoteAgreementTest, EveryoneReadyCommitsEverywhere) {
  EXPECT_THAT(DecideEverywhere(std::vector<absl::Status>(4)), Each(IsOk()));
}

TEST(VoteAgreementTest, OneRankThatCannotCommitAbortsEveryoneWithItsReason) {
  std::vector<absl::Status> local(4);
  local[2] = absl::UnavailableError("receive from rank 3: link lost");
  const std::vector<absl::Status> decided = DecideEverywhere(local);
  EXPECT_EQ(decided[2], local[2]);
  for (int r : {0, 1, 3}) {
    EXPECT_THAT(decided[r], StatusIs(absl::StatusCode::kUnavailable,
                                     HasSubstr("rank 2 could not complete the step")))
        << "rank " << r;
    EXPECT_THAT(decided[r], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("link lost")));
  }
}

TEST(VoteAgreementTest, AVoteAfterTheDeadlineIsAnAbort) {
  RankOptions options;
  std::vector<absl::Status> decided(3);
  auto statuses = RunRanks(3, options, [&](int rank, Communicator& comm) -> absl::Status {
    Group group;
    group.fabric = comm.fabric();
    group.ranks = {0, 1, 2};
    group.me = rank;
    const absl::Time deadline =
        rank == 1 ? absl::Now() - absl::Seconds(1) : absl::Now() + absl::Seconds(20);
    decided[rank] = comm.fabric()->agreement()->Decide(group, MakeTag(9, 2, 0),
                                                       absl::OkStatus(), deadline);
    return absl::OkStatus();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
  EXPECT_THAT(decided, Each(StatusIs(absl::StatusCode::kDeadlineExceeded)));
  EXPECT_THAT(decided[0], StatusIs(absl::StatusCode::kDeadlineExceeded,
                                   HasSubstr("rank 1 reached its vote after the deadline")));
}

// Rank 3 is alive but slow: it reaches its vote only after the others gave up waiting and asked
// it. Its answer (it has not voted) binds it: everyone aborts, rank 3 included.
TEST(VoteAgreementTest, ARankAskedBeforeItVotedAbortsWithEveryone) {
  RankOptions options;
  options.timeout = absl::Seconds(1);  // also the agreement's grace period
  Mutex mu;
  int decided_count = 0;
  std::vector<absl::Status> decided(4);
  auto statuses = RunRanks(4, options, [&](int rank, Communicator& comm) -> absl::Status {
    Group group;
    group.fabric = comm.fabric();
    group.ranks = {0, 1, 2, 3};
    group.me = rank;
    if (rank == 3) {
      MutexLock lock(&mu);
      mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return decided_count == 3; });
    }
    // Rank 3's own deadline is still ahead: it is slow, not late by its own clock.
    decided[rank] = comm.fabric()->agreement()->Decide(
        group, MakeTag(9, 3, 0), absl::OkStatus(),
        absl::Now() + (rank == 3 ? absl::Seconds(20) : absl::Milliseconds(100)));
    MutexLock lock(&mu);
    ++decided_count;
    return absl::OkStatus();
  });
  EXPECT_THAT(statuses, Each(IsOk()));
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(decided[r], StatusIs(absl::StatusCode::kUnavailable,
                                     HasSubstr("rank 3 had not voted when rank")))
        << "rank " << r;
  }
  EXPECT_THAT(decided[3], StatusIs(absl::StatusCode::kUnavailable,
                                   HasSubstr("rank 3 had not voted when rank")));
}

TEST(VoteAgreementTest, ASingleRankDecidesAlone) {
  std::vector<absl::Status> decided = DecideEverywhere({absl::OkStatus()});
  EXPECT_THAT(decided, Each(IsOk()));
  decided = DecideEverywhere({absl::DataLossError("x")});
  EXPECT_THAT(decided, Each(StatusIs(absl::StatusCode::kDataLoss)));
}

}  // namespace
}  // namespace lbcc::comm
