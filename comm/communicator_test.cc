#include "comm/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::comm::testing::RankOptions;
using ::lbcc::comm::testing::AbortAndWait;
using ::lbcc::comm::testing::AwaitFirstSend;
using ::lbcc::comm::testing::RunRanks;
using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::Each;
using ::testing::HasSubstr;

Topology Hetero4() {
  // Ranks 0 and 1 share a fast island; 2 and 3 are alone behind slow links.
  return *Topology::FromJson(R"({"nranks": 4, "islands": [[0, 1]]})");
}

std::string PayloadOf(int rank, size_t size) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) s[i] = static_cast<char>((rank * 131 + i * 7) & 0xff);
  return s;
}

class AllGatherVTest : public ::testing::TestWithParam<Algorithm> {};

TEST_P(AllGatherVTest, EveryRankGetsEveryPayload) {
  RankOptions options;
  options.topology = Hetero4();
  auto results = RunRanks(4, options, [](int rank, Communicator& comm) -> absl::Status {
    for (size_t size : {size_t{0}, size_t{1}, size_t{1000}, size_t{3} << 20}) {
      const std::string mine = PayloadOf(rank, size + rank);  // Different sizes per rank.
      std::vector<std::string> all;
      OpOptions op;
      op.algorithm = GetParam();
      LBCC_RETURN_IF_ERROR(comm.AllGatherV(&mine, &all, op)->Wait());
      for (int r = 0; r < 4; ++r) {
        if (all[r] != PayloadOf(r, size + r)) {
          return absl::InternalError(absl::StrCat("rank ", rank, " got a wrong payload from ", r));
        }
      }
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllGatherVTest,
                         ::testing::Values(Algorithm::kAuto, Algorithm::kDirect, Algorithm::kRing,
                                           Algorithm::kHierarchical),
                         [](const auto& info) { return std::string(AlgorithmName(info.param)); });

// Hierarchical: every payload crosses into every other island once, and only leaders talk
// across islands. With islands {0,1}, {2}, {3} the slow links carry 8 payloads (leader 0 gets
// 2's and 3's; 2 and 3 get the other three each, 0's and 1's from leader 0), direct 10 (1 also
// gets 2's and 3's over its own slow links); member 1 sends nothing over slow links and gets
// the full set from its leader over the fast one.
TEST(AllGatherVTest, HierarchicalSendsEachPayloadIntoEachIslandOnceThroughLeaders) {
  constexpr size_t kSize = 1 << 20;
  RankOptions options;
  options.topology = Hetero4();
  Mutex mu;
  std::map<Algorithm, std::vector<Fabric::ClassBytes>> bytes;
  auto results = RunRanks(4, options, [&](int rank, Communicator& comm) -> absl::Status {
    const std::string mine = PayloadOf(rank, kSize);
    for (Algorithm algorithm : {Algorithm::kHierarchical, Algorithm::kDirect}) {
      LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
      const Fabric::ClassBytes before = comm.fabric()->BytesByClass();
      std::vector<std::string> all;
      OpOptions op;
      op.algorithm = algorithm;
      LBCC_RETURN_IF_ERROR(comm.AllGatherV(&mine, &all, op)->Wait());
      for (int r = 0; r < 4; ++r) {
        if (all[r] != PayloadOf(r, kSize)) return absl::InternalError("wrong payload");
      }
      const Fabric::ClassBytes after = comm.fabric()->BytesByClass();
      MutexLock lock(&mu);
      bytes[algorithm].resize(4);
      bytes[algorithm][rank].slow_received = after.slow_received - before.slow_received;
      bytes[algorithm][rank].fast_received = after.fast_received - before.fast_received;
      bytes[algorithm][rank].slow_sent = after.slow_sent - before.slow_sent;
    }
    return absl::OkStatus();
  });
  ASSERT_THAT(results, Each(IsOk()));
  // Per rank, in payloads (the transport adds a little framing).
  auto payloads = [](uint64_t b) { return static_cast<double>(b) / kSize; };
  const std::vector<double> hier_slow = {2, 0, 3, 3};
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(payloads(bytes[Algorithm::kHierarchical][r].slow_received), hier_slow[r], 0.01)
        << "rank " << r;
  }
  EXPECT_NEAR(payloads(bytes[Algorithm::kHierarchical][1].fast_received), 4, 0.01);
  EXPECT_NEAR(payloads(bytes[Algorithm::kHierarchical][0].slow_sent), 4, 0.01);
  EXPECT_NEAR(payloads(bytes[Algorithm::kHierarchical][1].slow_sent), 0, 0.01);
  double direct_total = 0;
  for (int r = 0; r < 4; ++r) direct_total += payloads(bytes[Algorithm::kDirect][r].slow_received);
  EXPECT_NEAR(direct_total, 10, 0.04);
}

std::vector<float> InputOf(int rank, size_t n) {
  std::mt19937 rng(rank + 1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(CommunicatorTest, AllReduceSumAndMeanAreIdenticalOnEveryRank) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 10007;  // Not divisible by the rank count.
  Mutex mu;
  std::vector<std::vector<float>> sums(kRanks), means(kRanks);
  auto results = RunRanks(kRanks, {}, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<float> data = InputOf(rank, kCount);
    std::vector<float> out(kCount);
    LBCC_ASSIGN_OR_RETURN(TensorView in, TensorView::Host(data.data(), {kCount}));
    LBCC_ASSIGN_OR_RETURN(TensorView outv, TensorView::Host(out.data(), {kCount}));
    LBCC_RETURN_IF_ERROR(comm.AllReduce(in, outv, ReduceOp::kSum)->Wait());
    LBCC_RETURN_IF_ERROR(comm.AllReduce(in, in, ReduceOp::kAvg)->Wait());  // In place.
    MutexLock lock(&mu);
    sums[rank] = out;
    means[rank] = data;
    return absl::OkStatus();
  });
  ASSERT_THAT(results, Each(IsOk()));
  for (size_t i = 0; i < kCount; ++i) {
    double expected = 0;
    for (int r = 0; r < kRanks; ++r) expected += InputOf(r, kCount)[i];
    EXPECT_NEAR(sums[0][i], expected, 1e-5);
    EXPECT_NEAR(means[0][i], expected / kRanks, 1e-5);
  }
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_EQ(std::memcmp(sums[r].data(), sums[0].data(), kCount * 4), 0) << "rank " << r;
    EXPECT_EQ(std::memcmp(means[r].data(), means[0].data(), kCount * 4), 0) << "rank " << r;
  }
}

TEST(CommunicatorTest, AllReduceBf16) {
  constexpr size_t kCount = 999;
  auto results = RunRanks(4, {}, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<uint16_t> data(kCount);
    for (size_t i = 0; i < kCount; ++i) data[i] = F32ToBf16(static_cast<float>(rank + 1) * 0.5f);
    LBCC_ASSIGN_OR_RETURN(TensorView v, TensorView::Create(data.data(), DType::kBF16, {kCount}));
    LBCC_RETURN_IF_ERROR(comm.AllReduce(v, v, ReduceOp::kSum)->Wait());
    for (uint16_t x : data) {
      if (Bf16ToF32(x) != 5.0f) return absl::InternalError(absl::StrCat("got ", Bf16ToF32(x)));
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(CommunicatorTest, AllGatherBroadcastBarrier) {
  auto results = RunRanks(4, {}, [&](int rank, Communicator& comm) -> absl::Status {
    int32_t mine[3] = {rank, rank * 10, rank * 100};
    int32_t all[12] = {};
    LBCC_ASSIGN_OR_RETURN(TensorView in, TensorView::Create(mine, DType::kI32, {3}));
    LBCC_ASSIGN_OR_RETURN(TensorView out, TensorView::Create(all, DType::kI32, {4, 3}));
    LBCC_RETURN_IF_ERROR(comm.AllGather(in, out)->Wait());
    for (int r = 0; r < 4; ++r) {
      if (all[3 * r] != r || all[3 * r + 2] != r * 100) return absl::InternalError("allgather");
    }
    int64_t value[2] = {rank == 2 ? 77 : 0, rank == 2 ? -5 : 0};
    LBCC_ASSIGN_OR_RETURN(TensorView b, TensorView::Create(value, DType::kI64, {2}));
    LBCC_RETURN_IF_ERROR(comm.Broadcast(b, 2)->Wait());
    if (value[0] != 77 || value[1] != -5) return absl::InternalError("broadcast");
    return comm.Barrier()->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(CommunicatorTest, SplitFormsIndependentGroups) {
  auto results = RunRanks(5, {}, [&](int rank, Communicator& comm) -> absl::Status {
    // Colors: even ranks, odd ranks; rank 4 opts out. Keys reverse the order.
    const int color = rank == 4 ? -1 : rank % 2;
    LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, comm.Split(color, -rank));
    if (rank == 4) {
      if (sub != nullptr) return absl::InternalError("not null");
      return comm.Barrier()->Wait();
    }
    if (sub->nranks() != 2) return absl::InternalError("size");
    if (sub->rank() != (rank < 2 ? 1 : 0)) return absl::InternalError("order by key");
    float x = static_cast<float>(rank);
    LBCC_ASSIGN_OR_RETURN(TensorView v, TensorView::Host(&x, {1}));
    LBCC_RETURN_IF_ERROR(sub->AllReduce(v, v, ReduceOp::kSum)->Wait());
    const float expected = rank % 2 == 0 ? 2.0f : 4.0f;  // 0+2, 1+3
    if (x != expected) return absl::InternalError(absl::StrCat("sum ", x));
    // The parent still works alongside.
    return comm.Barrier()->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(CommunicatorTest, BadArgumentsFailAtOnce) {
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    float a[4], b[3];
    int32_t c[4];
    auto va = *TensorView::Host(a, {4});
    auto vb = *TensorView::Host(b, {3});
    auto vc = *TensorView::Create(c, DType::kI32, {4});
    if (comm.AllReduce(va, vb, ReduceOp::kSum)->status().code() !=
        absl::StatusCode::kInvalidArgument) {
      return absl::InternalError("shape mismatch accepted");
    }
    if (comm.AllReduce(vc, vc, ReduceOp::kSum)->status().code() !=
        absl::StatusCode::kInvalidArgument) {
      return absl::InternalError("int all-reduce accepted");
    }
    if (comm.Broadcast(va, 5)->status().code() != absl::StatusCode::kInvalidArgument) {
      return absl::InternalError("bad root accepted");
    }
    if (comm.AllGather(va, va)->status().code() != absl::StatusCode::kInvalidArgument) {
      return absl::InternalError("small allgather output accepted");
    }
    return comm.Barrier()->Wait();  // Nothing was posted by the bad calls: still in step.
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(CommunicatorTest, AMissingRankFailsEveryoneWithinTheTimeout) {
  RankOptions options;
  options.timeout = absl::Seconds(2);
  auto results = RunRanks(3, options, [&](int rank, Communicator& comm) -> absl::Status {
    float x[1000] = {};
    auto v = *TensorView::Host(x, {1000});
    if (rank == 2) return absl::OkStatus();  // Never posts: its communicator is destroyed.
    absl::Status status = comm.AllReduce(v, v, ReduceOp::kSum)->Wait();
    // The next operation reports the earlier failure instead of trying again.
    absl::Status next = comm.Barrier()->Wait();
    if (next.code() != absl::StatusCode::kFailedPrecondition) {
      return absl::InternalError(absl::StrCat("after a failure: ", next.ToString()));
    }
    return status;
  });
  EXPECT_THAT(results[2], IsOk());
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(results[r], StatusIs(AnyOf(absl::StatusCode::kUnavailable,
                                           absl::StatusCode::kDeadlineExceeded,
                                           absl::StatusCode::kCancelled)))
        << "rank " << r;
  }
}

TEST(CommunicatorTest, InitWithARankThatNeverJoinsFailsCleanly) {
  // Only rank 0 of 2 joins: Init fails with DeadlineExceeded (and the half-made fabric is
  // destroyed without touching endpoints that were never connected).
  absl::StatusOr<UniqueId> id = CreateUniqueId("127.0.0.1", absl::Seconds(5));
  ASSERT_THAT(id.status(), IsOk());
  FabricOptions options;
  options.backend = "loopback";
  options.timeout = absl::Milliseconds(500);
  EXPECT_THAT(Communicator::Init(*id, 2, 0, options).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(CommunicatorTest, PerOperationTimeout) {
  // The communicator waits a minute by default; one operation asks for 300 ms.
  Mutex mu;
  CondVar cv;
  bool rank0_done = false;
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    if (rank == 1) {
      // Posts nothing until rank 0 gave up, then leaves.
      MutexLock lock(&mu);
      while (!rank0_done) cv.Wait(&mu);
      return absl::OkStatus();
    }
    OpOptions op;
    op.timeout = absl::Milliseconds(300);
    const absl::Time start = absl::Now();
    absl::Status status = comm.Barrier(op)->Wait();
    const absl::Duration took = absl::Now() - start;
    MutexLock lock(&mu);
    rank0_done = true;
    cv.SignalAll();
    if (took > absl::Seconds(30)) return absl::InternalError("the per-operation timeout was ignored");
    return status;
  });
  EXPECT_THAT(results[0], StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(results[1], IsOk());
}

TEST(CommunicatorTest, RepeatedInitAndDestroy) {
  // Under --config=asan, LeakSanitizer checks that nothing of the 10 communicators stays behind.
  for (int round = 0; round < 10; ++round) {
    auto results = RunRanks(3, {}, [&](int rank, Communicator& comm) -> absl::Status {
      float x = 1.0f;
      auto v = *TensorView::Host(&x, {1});
      LBCC_RETURN_IF_ERROR(comm.AllReduce(v, v, ReduceOp::kSum)->Wait());
      return x == 3.0f ? absl::OkStatus() : absl::InternalError("sum");
    });
    ASSERT_THAT(results, Each(IsOk())) << "round " << round;
  }
}

TEST(CommunicatorTest, AbortFailsPendingWorkEverywhere) {
  auto results = RunRanks(3, {}, [&](int rank, Communicator& comm) -> absl::Status {
    std::vector<float> x(1 << 16);
    auto v = *TensorView::Host(x.data(), {1 << 16});
    if (rank == 0) {
      comm.Abort();
      return comm.AllReduce(v, v, ReduceOp::kSum)->Wait();
    }
    return comm.AllReduce(v, v, ReduceOp::kSum)->Wait();
  });
  EXPECT_THAT(results[0], StatusIs(absl::StatusCode::kFailedPrecondition));
  for (int r = 1; r < 3; ++r) {
    EXPECT_THAT(results[r], StatusIs(AnyOf(absl::StatusCode::kUnavailable,
                                           absl::StatusCode::kCancelled)))
        << "rank " << r;
  }
}

// Abort() while an operation waits for peers that never post it (ranks 1 and 2): only the abort
// can end it, since the communicator's timeout and LBCC_PEER_TIMEOUT_MS are a minute. Rank 0
// posts it (and a second one queued behind it), waits until the first is under way (its header
// went out to rank 1; point-to-point: posted at once), and aborts from another thread. Ranks as
// threads over each transport.
struct PendingCase {
  const char* name;
  const char* backend;
  // Posts the operation on rank 0; `buffer` holds 1 << 16 floats.
  std::function<RequestPtr(Communicator& comm, std::vector<float>& buffer)> post;
  bool collective = true;  // ordered on the worker (its header goes out first)
};

void PrintTo(const PendingCase& c, std::ostream* os) { *os << c.name << " over " << c.backend; }

class AbortPendingTest : public ::testing::TestWithParam<PendingCase> {};

TEST_P(AbortPendingTest, FailsThePendingOperationWithTheAbortsStatusAtOnce) {
  const PendingCase& c = GetParam();
  setenv("LBCC_PEER_TIMEOUT_MS", "60000", 1);
  RankOptions options;
  options.backend = c.backend;
  options.timeout = absl::Seconds(60);
  Mutex mu;
  CondVar cv;
  bool rank0_done = false;
  int through_barrier = 0;
  absl::Status pending_status, queued_status;
  absl::Duration latency = absl::InfiniteDuration();
  auto results = RunRanks(3, options, [&](int rank, Communicator& comm) -> absl::Status {
    // Every rank is up (its Init returned) before rank 0 closes its connections. Rank 0 also
    // waits until every rank's Barrier returned: a barrier returns on one rank while another's
    // last message is still completing, and rank 0 aborting at once would fail that one (as a
    // rank killed right after a barrier does).
    LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
    {
      MutexLock lock(&mu);
      ++through_barrier;
      cv.SignalAll();
      while (rank == 0 && through_barrier < 3) cv.Wait(&mu);
    }
    if (rank != 0) {
      // Never post it; leave (aborted, as a killed process would) once rank 0 is done.
      MutexLock lock(&mu);
      while (!rank0_done) cv.Wait(&mu);
      comm.Abort();
      return absl::OkStatus();
    }
    std::vector<float> buffer(1 << 16, 1.0f), second(1 << 16, 1.0f);
    const uint64_t sent_before = comm.fabric()->Counters(1).messages_sent;
    RequestPtr request = c.post(comm, buffer);
    RequestPtr queued = c.collective ? comm.Barrier() : nullptr;
    if (c.collective) AwaitFirstSend(comm, 1, sent_before, request);
    std::tie(pending_status, latency) = AbortAndWait(comm, request);
    if (queued != nullptr) queued_status = queued->Wait();
    MutexLock lock(&mu);
    rank0_done = true;
    cv.SignalAll();
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
  EXPECT_THAT(pending_status, StatusIs(absl::StatusCode::kCancelled, HasSubstr("aborted")));
  EXPECT_THAT(pending_status.message(), HasSubstr("Communicator::Abort"));
  if (c.collective) {
    EXPECT_THAT(queued_status, StatusIs(absl::StatusCode::kCancelled, HasSubstr("before it ran")));
  }
  // Not a timing check: far above what it takes, and below anything that waits for a peer (the
  // outcome agreement's grace of 10 s, the timeouts of a minute).
  EXPECT_LT(latency, absl::Seconds(10));
  std::printf("Abort() to the pending %s's return over %s: %.3f ms\n", c.name, c.backend,
              absl::ToDoubleMilliseconds(latency));
}

std::vector<PendingCase> PendingCases() {
  std::vector<PendingCase> cases;
  for (const char* backend : {"loopback", "ucx"}) {
    cases.push_back({"Barrier", backend, [](Communicator& comm, std::vector<float>&) {
                       return comm.Barrier();
                     }});
    cases.push_back({"AllReduceDirect", backend, [](Communicator& comm, std::vector<float>& b) {
                       auto v = *TensorView::Host(b.data(), {256});
                       OpOptions op;
                       op.algorithm = Algorithm::kDirect;
                       return comm.AllReduce(v, v, ReduceOp::kSum, op);
                     }});
    cases.push_back({"FloatAllReduceRing", backend, [](Communicator& comm, std::vector<float>& b) {
                       auto v = *TensorView::Host(b.data(), {static_cast<int64_t>(b.size())});
                       OpOptions op;
                       op.algorithm = Algorithm::kRing;
                       return comm.AllReduce(v, v, ReduceOp::kSum, op);
                     }});
    cases.push_back({"DenseAllReduce", backend, [](Communicator& comm, std::vector<float>& b) {
                       return comm.AllReduce(b.data(), b.data(), b.size(), DType::kF32,
                                             ReduceOp::kSum);
                     }});
    cases.push_back({"DenseRecv", backend,
                     [](Communicator& comm, std::vector<float>& b) {
                       return comm.Recv(b.data(), b.size() * 4, 1, 7);
                     },
                     /*collective=*/false});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Operations, AbortPendingTest, ::testing::ValuesIn(PendingCases()),
                         [](const auto& info) {
                           return absl::StrCat(info.param.name, "_", info.param.backend);
                         });

}  // namespace
}  // namespace lbcc::comm
