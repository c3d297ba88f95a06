// AllGatherTask over ranks as threads (loopback): post / test / wait for every algorithm, many
// tasks in flight at once, and the failure paths (an aborted fabric, the deadline).
#include "comm/collectives.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "comm/communicator.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::comm::testing::RankOptions;
using ::lbcc::comm::testing::RunRanks;
using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr int kRanks = 4;
constexpr size_t kMaxBytes = size_t{1} << 30;

std::string PayloadOf(int rank, int task, size_t size) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) s[i] = static_cast<char>((rank * 131 + task * 17 + i) & 0xff);
  return s;
}

RankOptions Hetero4() {
  RankOptions options;
  // Ranks 0 and 1 share a fast island; 2 and 3 are alone behind slow links.
  options.topology = *Topology::FromJson(R"({"nranks": 4, "islands": [[0, 1]]})");
  return options;
}

absl::Status CheckResult(AllGatherTask& task, int task_index, size_t size) {
  for (int r = 0; r < kRanks; ++r) {
    if (task.result()[r] != PayloadOf(r, task_index, size + r)) {
      return absl::InternalError(absl::StrCat("task ", task_index, ": wrong payload from ", r));
    }
  }
  return absl::OkStatus();
}

class AllGatherTaskTest : public ::testing::TestWithParam<Algorithm> {};

// Rank 0 posts first and sees its task pending (no peer has posted); once it has looked, the
// others post, and every rank waits for an equal result.
TEST_P(AllGatherTaskTest, PostTestWait) {
  Mutex mu;
  bool rank0_tested = false;
  auto results = RunRanks(kRanks, Hetero4(), [&](int rank, Communicator& comm) -> absl::Status {
    if (rank != 0) {
      MutexLock lock(&mu);
      mu.Await([&] { return rank0_tested; });
    }
    // Rank 0's task must start before the peers post: no operation-header exchange first.
    return comm.PostUnchecked("test", [&, rank](const Group& group, transport::Tag tag,
                                                absl::Time deadline) -> absl::Status {
          const size_t size = 100000 + rank;
          std::unique_ptr<AllGatherTask> task =
              AllGatherTask::Post(group, tag, PayloadOf(rank, 0, size), GetParam(),
                                  transport::Priority::kNormal, deadline, kMaxBytes);
          if (rank == 0) {
            const bool done = task->Test();
            MutexLock lock(&mu);
            rank0_tested = true;
            if (done) return absl::InternalError("done before any peer posted");
          }
          LBCC_RETURN_IF_ERROR(task->WaitGathered());
          LBCC_RETURN_IF_ERROR(task->Wait());
          if (!task->Test()) return absl::InternalError("Test() false after Wait()");
          return CheckResult(*task, 0, 100000);
        })->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

// Eight all-gathers in flight on disjoint tags, waited for in reverse order.
TEST_P(AllGatherTaskTest, ManyInFlightAtOnce) {
  constexpr int kTasks = 8;
  auto results = RunRanks(kRanks, Hetero4(), [&](int rank, Communicator& comm) -> absl::Status {
    return comm.Post("test", [&, rank](const Group& group, transport::Tag tag,
                                       absl::Time deadline) -> absl::Status {
          std::vector<std::unique_ptr<AllGatherTask>> tasks;
          for (int t = 0; t < kTasks; ++t) {
            tasks.push_back(AllGatherTask::Post(group, tag + 8 * t,
                                                PayloadOf(rank, t, 1000 * t + rank), GetParam(),
                                                transport::Priority::kBulk, deadline, kMaxBytes));
          }
          for (int t = kTasks - 1; t >= 0; --t) {
            LBCC_RETURN_IF_ERROR(tasks[t]->Wait());
            LBCC_RETURN_IF_ERROR(CheckResult(*tasks[t], t, 1000 * t));
          }
          return absl::OkStatus();
        })->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllGatherTaskTest,
                         ::testing::Values(Algorithm::kDirect, Algorithm::kRing,
                                           Algorithm::kHierarchical),
                         [](const auto& info) { return std::string(AlgorithmName(info.param)); });

// Only rank 0 posts; aborting its fabric fails the pending task with Cancelled (its peers see
// the links go away) instead of leaving it to the deadline.
TEST(AllGatherTaskFailureTest, AbortFailsAPendingTaskWithCancelled) {
  Mutex mu;
  bool done = false;
  absl::Status status;
  auto results = RunRanks(3, {}, [&](int rank, Communicator& comm) -> absl::Status {
    // Every rank is set up before the abort. The peers' own outcome is not the subject: the
    // abort may reach them while their barrier still runs.
    (void)comm.Barrier()->Wait();
    if (rank != 0) {
      MutexLock lock(&mu);
      mu.Await([&] { return done; });
      return absl::OkStatus();
    }
    // Only this rank posts: without the operation-header exchange (it would wait for peers).
    (void)comm.PostUnchecked("test", [&](const Group& group, transport::Tag tag,
                                         absl::Time deadline) -> absl::Status {
          std::unique_ptr<AllGatherTask> task =
              AllGatherTask::Post(group, tag, "mine", Algorithm::kDirect,
                                  transport::Priority::kNormal, deadline, kMaxBytes);
          group.fabric->Abort(absl::CancelledError("test aborts"));
          absl::Status waited = task->Wait();
          MutexLock lock(&mu);
          status = waited;
          done = true;
          return absl::OkStatus();
        })->Wait();
    return absl::OkStatus();
  });
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kCancelled));
}

// A task whose peers never post fails at its deadline with DeadlineExceeded and aborts the
// fabric, so the communicator reports the failure afterwards.
TEST(AllGatherTaskFailureTest, DeadlineFailsAndAbortsTheFabric) {
  Mutex mu;
  bool done = false;
  absl::Status status, fabric;
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    // Every rank is set up before the abort. The peers' own outcome is not the subject: the
    // abort may reach them while their barrier still runs.
    (void)comm.Barrier()->Wait();
    if (rank != 0) {
      MutexLock lock(&mu);
      mu.Await([&] { return done; });
      return absl::OkStatus();
    }
    // Only this rank posts: without the operation-header exchange (it would wait for peers).
    (void)comm.PostUnchecked("test", [&](const Group& group, transport::Tag tag,
                                         absl::Time) -> absl::Status {
          std::unique_ptr<AllGatherTask> task = AllGatherTask::Post(
              group, tag, "mine", Algorithm::kRing, transport::Priority::kNormal,
              absl::Now() + absl::Milliseconds(50), kMaxBytes);
          absl::Status gathered = task->WaitGathered();
          MutexLock lock(&mu);
          status = gathered;
          fabric = group.fabric->aborted();
          done = true;
          return absl::OkStatus();
        })->Wait();
    return absl::OkStatus();
  });
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                               HasSubstr("no answer from rank 1 before the")));
  EXPECT_THAT(fabric, StatusIs(absl::StatusCode::kDeadlineExceeded));
}

// A rank that passed the operation header but sends no data: the data phase's DeadlineExceeded
// names the rank each waiting rank was still receiving from (Batch: a broadcast from rank 2;
// AllGatherTask: a direct all-gather), after the operation's name and sequence number.
TEST(DataPhaseDeadlineTest, NamesTheRankItWaitedFor) {
  for (const bool gather : {false, true}) {
    Mutex mu;
    int finished = 0;
    auto results = RunRanks(3, {}, [&](int rank, Communicator& comm) -> absl::Status {
      const absl::Status status =
          comm.Post("data", [&, rank](const Group& group, transport::Tag tag,
                                      absl::Time deadline) -> absl::Status {
                if (rank == 2) {  // Header done, no data: waits until the others gave up.
                  MutexLock lock(&mu);
                  mu.Await([&] { return finished == 2; });
                  return absl::OkStatus();
                }
                absl::Status data;
                if (gather) {
                  std::vector<std::string> all;
                  data = AllGatherV(group, tag, "x", &all, Algorithm::kDirect,
                                    transport::Priority::kNormal, deadline, kMaxBytes);
                } else {
                  float x = 0;
                  data = Broadcast(group, tag, &x, sizeof(x), 2, transport::Priority::kNormal,
                                   deadline);
                }
                MutexLock lock(&mu);
                ++finished;
                return data;
              }, absl::Milliseconds(300))->Wait();
      if (rank == 2) return status;
      const std::string want = absl::StrCat("data (op 0) on rank ", rank,
                                            ": no answer from rank 2 before the");
      if (!absl::IsDeadlineExceeded(status) || !absl::StrContains(status.message(), want)) {
        return absl::InternalError(absl::StrCat(gather ? "gather" : "broadcast", ": wanted '",
                                                want, "', got ", status.ToString()));
      }
      return absl::OkStatus();
    });
    EXPECT_THAT(results, Each(IsOk())) << (gather ? "gather" : "broadcast");
  }
}

// One rank: the result is its own payload at once, whatever the algorithm (kAuto included).
TEST(AllGatherTaskTest, OneRankCompletesAtPost) {
  auto results = RunRanks(1, {}, [&](int, Communicator& comm) -> absl::Status {
    return comm.Post("test", [](const Group& group, transport::Tag tag,
                                absl::Time deadline) -> absl::Status {
          for (Algorithm a : {Algorithm::kAuto, Algorithm::kDirect, Algorithm::kHierarchical}) {
            auto task = AllGatherTask::Post(group, tag, "solo", a, transport::Priority::kNormal,
                                            deadline, kMaxBytes);
            if (!task->Test()) return absl::InternalError("one rank: not done at post");
            LBCC_RETURN_IF_ERROR(task->Wait());
            if (task->result() != std::vector<std::string>{"solo"}) {
              return absl::InternalError("one rank: wrong result");
            }
          }
          return absl::OkStatus();
        })->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

}  // namespace
}  // namespace lbcc::comm
