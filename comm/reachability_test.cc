// Connection reversal (comm/fabric.h, LBCC_REACHABLE): a rank that cannot be dialed dials every
// connection of its links and its peers use the ones it dialed for them; pairs that cannot be
// connected fail at set-up on every rank, naming them.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"
#include "comm/config.h"
#include "comm/fabric.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::Each;
using ::testing::HasSubstr;

// Runs `body` on `reachable.size()` ranks over `backend`, rank r with LBCC_REACHABLE
// reachable[r]; each rank's status.
std::vector<absl::Status> RunWithReachability(
    const std::string& backend, const std::vector<std::string>& reachable,
    const std::function<absl::Status(int, Communicator&)>& body) {
  const int n = static_cast<int>(reachable.size());
  CommConfig base;
  base.backend = backend;
  base.listen_host = "127.0.0.1";
  base.timeout = absl::Seconds(30);
  std::vector<absl::Status> results(n);
  absl::StatusOr<UniqueId> id = CreateUniqueId(base);
  if (!id.ok()) return std::vector<absl::Status>(n, id.status());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      CommConfig config = base;
      config.reachable = reachable[rank];
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          Communicator::Init(*id, n, rank, config);
      results[rank] = comm.ok() ? body(rank, **comm) : comm.status();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// A dense and a sparse all-reduce, checked.
absl::Status Collectives(int rank, Communicator& comm) {
  const int n = comm.nranks();
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(rank + i);
  auto v = *TensorView::Host(x.data(), {1000});
  LBCC_RETURN_IF_ERROR(comm.AllReduce(v, v, ReduceOp::kSum)->Wait());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(i));
    if (x[i] != want) return absl::InternalError(absl::StrCat("rank ", rank, ": sum ", i));
  }
  auto codec = *codecs::TopKEfCodec::Create(codecs::TopKEfOptions());
  std::vector<float> delta(4096, 1.0f + rank), out(4096);
  codecs::TopKEfState state;
  LBCC_RETURN_IF_ERROR(comm.SparseAllReduce({{*TensorView::Host(delta.data(), {4096}),
                                              *TensorView::Host(out.data(), {4096}), &state}},
                                            codec.get())
                           ->Wait());
  return comm.Barrier()->Wait();
}

class ReversalTest : public ::testing::TestWithParam<std::string> {};

TEST(FailedPeerTest, TheMessageCarriesTheRankAndKeepsTheFirst) {
  const absl::Status failed =
      WithFailedPeer(absl::UnavailableError("connect to rank 3: refused"), 3);
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("refused")));
  EXPECT_EQ(FailedPeer(failed), 3);
  EXPECT_EQ(FailedPeer(WithFailedPeer(failed, 1)), 3);  // The first blame stays.
  EXPECT_EQ(FailedPeer(absl::UnavailableError("connect: refused")), std::nullopt);
  EXPECT_EQ(FailedPeer(absl::UnavailableError("x [failed peer -2]")), std::nullopt);
  EXPECT_EQ(FailedPeer(absl::UnavailableError("x [failed peer 7] later text")), std::nullopt);
  EXPECT_THAT(WithFailedPeer(absl::OkStatus(), 2), IsOk());
  EXPECT_EQ(FailedPeer(WithFailedPeer(absl::CancelledError("stop"), -1)), std::nullopt);
}

TEST_P(ReversalTest, UnreachableRanksDialAndEveryCollectiveRuns) {
  // Rank 1 cannot be dialed: it dials all its links, the others dial each other.
  auto results = RunWithReachability(GetParam(), {"yes", "no", "auto", "yes"}, Collectives);
  EXPECT_THAT(results, Each(IsOk()));
}

TEST_P(ReversalTest, TwoUnreachableRanksFailEveryRankNamingThePair) {
  auto results = RunWithReachability(GetParam(), {"yes", "no", "no"},
                                     [](int, Communicator&) { return absl::OkStatus(); });
  EXPECT_THAT(results, Each(StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("ranks 1-2 cannot reach each other"))));
}

INSTANTIATE_TEST_SUITE_P(Backends, ReversalTest, ::testing::Values("socket", "loopback"));

TEST(ReachabilityTest, UcxRefusesAnUnreachableRankNamingTheSocketBackend) {
  auto results = RunWithReachability("ucx", {"yes", "no"},
                                     [](int, Communicator&) { return absl::OkStatus(); });
  EXPECT_THAT(results, Each(StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("LBCC_TRANSPORT=socket"))));
}

TEST(ReachabilityTest, ABadSettingIsNamed) {
  CommConfig config;
  config.reachable = "maybe";
  EXPECT_THAT(ResolveConfig(config).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CommConfig.reachable")));
}

}  // namespace
}  // namespace lbcc::comm
