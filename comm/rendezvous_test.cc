#include "comm/rendezvous.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/scoped_env.h"
#include "base/status_matchers.h"
#include "comm/fabric.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::ScopedEnv;
using ::lbcc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every launcher variable DetectLaunch looks at, unset for one test.
struct CleanLaunchEnv {
  ScopedEnv v[16] = {{"OMPI_COMM_WORLD_RANK", nullptr}, {"OMPI_COMM_WORLD_SIZE", nullptr},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", nullptr}, {"PMI_RANK", nullptr},
                     {"PMI_SIZE", nullptr}, {"SLURM_PROCID", nullptr}, {"SLURM_NTASKS", nullptr},
                     {"SLURM_LOCALID", nullptr}, {"SLURM_STEP_NODELIST", nullptr},
                     {"SLURM_JOB_NODELIST", nullptr}, {"RANK", nullptr}, {"WORLD_SIZE", nullptr},
                     {"MASTER_ADDR", nullptr}, {"MASTER_PORT", nullptr},
                     {"LBCC_BOOTSTRAP_ADDR", nullptr}, {"LBCC_MPI_LIBRARY", nullptr}};
};

TEST(SlurmNodeListTest, ExpandsAsSlurmDoes) {
  EXPECT_THAT(ExpandSlurmNodeList("node[01-03,07]"),
              IsOkAndHolds(ElementsAre("node01", "node02", "node03", "node07")));
  EXPECT_THAT(ExpandSlurmNodeList("a1,b[8-10],c"),
              IsOkAndHolds(ElementsAre("a1", "b8", "b9", "b10", "c")));
  EXPECT_THAT(ExpandSlurmNodeList("rack[1-2]-n[0-1]"),
              IsOkAndHolds(ElementsAre("rack1-n0", "rack1-n1", "rack2-n0", "rack2-n1")));
  EXPECT_THAT(ExpandSlurmNodeList("gpu005"), IsOkAndHolds(ElementsAre("gpu005")));
}

TEST(SlurmNodeListTest, BadListsNameTheList) {
  for (const char* bad : {"node[01-03", "node01-03]", "node[3-1]", "node[a-b]", "", "node[]"}) {
    EXPECT_THAT(ExpandSlurmNodeList(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("Slurm node list '", bad, "'"))))
        << bad;
  }
}

TEST(DetectLaunchTest, TorchrunWithAHostName) {
  CleanLaunchEnv clean;
  ScopedEnv rank("RANK", "1"), size("WORLD_SIZE", "2"), addr("MASTER_ADDR", "localhost"),
      port("MASTER_PORT", "29500");
  LBCC_ASSERT_OK_AND_ASSIGN(LaunchEnvironment l, DetectLaunch());
  EXPECT_EQ(l.launcher, Launcher::kTorchrun);
  EXPECT_EQ(l.rank, 1);
  EXPECT_EQ(l.nranks, 2);
  EXPECT_EQ(l.root_address, "localhost:29501");
}

TEST(DetectLaunchTest, SlurmRootOnTheFirstHostOfTheStep) {
  CleanLaunchEnv clean;
  ScopedEnv procid("SLURM_PROCID", "2"), ntasks("SLURM_NTASKS", "4"),
      localid("SLURM_LOCALID", "0"), list("SLURM_STEP_NODELIST", "localhost,node[2-4]"),
      port("LBCC_BOOTSTRAP_PORT", "31000");
  LBCC_ASSERT_OK_AND_ASSIGN(LaunchEnvironment l, DetectLaunch());
  EXPECT_EQ(l.launcher, Launcher::kSlurm);
  EXPECT_EQ(l.rank, 2);
  EXPECT_EQ(l.nranks, 4);
  EXPECT_EQ(l.root_address, "localhost:31000");
  EXPECT_NE(l.session, 0u);
}

TEST(DetectLaunchTest, BadInputFailsAtOnceNamingTheValue) {
  CleanLaunchEnv clean;
  {
    ScopedEnv procid("SLURM_PROCID", "0"), ntasks("SLURM_NTASKS", "2"),
        list("SLURM_STEP_NODELIST", "node[01-");
    EXPECT_THAT(DetectLaunch(), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("SLURM_STEP_NODELIST: Slurm node list 'node[01-'")));
  }
  {
    ScopedEnv rank("RANK", "0"), size("WORLD_SIZE", "2"),
        addr("MASTER_ADDR", "no-such-host.invalid"), port("MASTER_PORT", "29500");
    EXPECT_THAT(DetectLaunch(), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("'no-such-host.invalid'")));
  }
  {
    ScopedEnv rank("RANK", "two"), size("WORLD_SIZE", "2");
    EXPECT_THAT(DetectLaunch(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("RANK='two'")));
  }
  {
    ScopedEnv rank("OMPI_COMM_WORLD_RANK", "3"), size("OMPI_COMM_WORLD_SIZE", "2");
    EXPECT_THAT(DetectLaunch(), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("OMPI_COMM_WORLD_RANK=3")));
  }
}

TEST(RendezvousTest, MpiLaunchWithoutLibmpiNamesTheLibrary) {
  CleanLaunchEnv clean;
  ScopedEnv rank("OMPI_COMM_WORLD_RANK", "1"), size("OMPI_COMM_WORLD_SIZE", "2"),
      lib("LBCC_MPI_LIBRARY", "libmpi-not-installed.so.99");
  LBCC_ASSERT_OK_AND_ASSIGN(LaunchEnvironment l, DetectLaunch());
  EXPECT_EQ(l.launcher, Launcher::kMpi);
  EXPECT_THAT(RendezvousId(l, "127.0.0.1", absl::Seconds(5)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("LBCC_MPI_LIBRARY=libmpi-not-installed.so.99")));
}

TEST(RendezvousTest, BootstrapAddrWinsOverMpi) {
  CleanLaunchEnv clean;
  ScopedEnv rank("OMPI_COMM_WORLD_RANK", "0"), size("OMPI_COMM_WORLD_SIZE", "1"),
      addr("LBCC_BOOTSTRAP_ADDR", "localhost:0");
  LBCC_ASSERT_OK_AND_ASSIGN(LaunchEnvironment l, DetectLaunch());
  EXPECT_EQ(l.launcher, Launcher::kBootstrapAddr);
  EXPECT_EQ(l.root_address, "localhost:0");
}

TEST(RendezvousTest, FixedRootRanksMeetThroughAHostName) {
  // Ranks as threads (one environment per process, so each gets its launch explicitly): rank 0
  // starts the root on "localhost:<port>", everyone joins through the name.
  const int port = testing::FreeLoopbackPort();
  std::vector<absl::StatusOr<std::vector<std::string>>> results(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      LaunchEnvironment mine;
      mine.launcher = Launcher::kTorchrun;
      mine.nranks = 3;
      mine.rank = r;
      mine.root_address = "localhost:" + std::to_string(port);
      absl::StatusOr<UniqueId> id = RendezvousId(mine, "", absl::Seconds(20));
      if (!id.ok()) {
        results[r] = id.status();
        return;
      }
      results[r] = BootstrapExchange(*id, 3, r, std::to_string(r), absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (auto& r : results) EXPECT_THAT(r, IsOkAndHolds(ElementsAre("0", "1", "2")));
}

// FabricOptions{} (C++) listens where the C API's and Python's defaults do: chosen by
// transport/netif.h (LBCC_SOCKET_IFNAME, the interface toward the root), not a fixed 127.0.0.1
// that would ignore the filter and advertise loopback to remote peers.
TEST(FabricDefaultsTest, DefaultOptionsChooseTheInterfaceLikeTheCApi) {
  EXPECT_EQ(FabricOptions{}.listen_host, "") << "empty: chosen";
  absl::StatusOr<UniqueId> id = CreateUniqueId("127.0.0.1", absl::Seconds(20));
  ASSERT_THAT(id.status(), IsOk());
  {
    // The filter applies to the default options as to the C API's (CommConfig unset): a filter
    // matching no interface is the same clear error from both, before any waiting.
    ScopedEnv filter("LBCC_SOCKET_IFNAME", "=no-such-if0");
    EXPECT_THAT(Fabric::Create(*id, 2, 1, FabricOptions{}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("LBCC_SOCKET_IFNAME='=no-such-if0' matches no interface")));
    CommConfig c_api_default;
    c_api_default.timeout = absl::Seconds(20);
    EXPECT_THAT(Communicator::Init(*id, 2, 1, c_api_default).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("LBCC_SOCKET_IFNAME='=no-such-if0' matches no interface")));
  }
  // Unfiltered, a root on loopback: both ranks connect over UCX with the default options and
  // advertise loopback (every rank is on this host).
  std::vector<absl::StatusOr<std::string>> peers(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      FabricOptions options;
      options.timeout = absl::Seconds(30);
      absl::StatusOr<std::shared_ptr<Fabric>> fabric = Fabric::Create(*id, 2, r, options);
      if (!fabric.ok()) {
        peers[r] = fabric.status();
        return;
      }
      peers[r] = (*fabric)->out(1 - r)->peer_address();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_THAT(peers[r].status(), IsOk()) << "rank " << r;
    EXPECT_THAT(*peers[r], ::testing::StartsWith("127.0.0.1:")) << "rank " << r;
  }
}

}  // namespace
}  // namespace lbcc::comm
