#include "comm/bootstrap.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "base/status_matchers.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<absl::StatusOr<std::vector<std::string>>> RunRanks(const UniqueId& id, int nranks,
                                                                std::vector<int> ranks,
                                                                absl::Duration timeout) {
  std::vector<absl::StatusOr<std::vector<std::string>>> results(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = BootstrapExchange(id, nranks, ranks[i], absl::StrCat("blob-", ranks[i]), timeout);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

TEST(BootstrapTest, EightThreadRanksExchangeBlobs) {
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(30)));
  EXPECT_THAT(UniqueIdAddress(id), HasSubstr("127.0.0.1:"));
  auto results = RunRanks(id, 8, {7, 3, 0, 1, 2, 6, 5, 4}, absl::Seconds(30));
  std::vector<std::string> expected;
  for (int r = 0; r < 8; ++r) expected.push_back(absl::StrCat("blob-", r));
  for (auto& r : results) EXPECT_THAT(r, ::lbcc::testing::IsOkAndHolds(ElementsAreArray(expected)));
}

TEST(BootstrapTest, ARankThatAsksLearnsTheAddressTheRootSawItComeFrom) {
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(30)));
  std::vector<absl::StatusOr<std::vector<std::string>>> results(2);
  std::thread asks([&] {
    results[0] = BootstrapExchange(id, 2, 0, absl::StrCat("a\nauto", kObservedAddressRequest),
                                   absl::Seconds(30));
  });
  // Only a blob that ends with the request is touched.
  std::thread plain([&] {
    results[1] = BootstrapExchange(id, 2, 1, absl::StrCat("b", kObservedAddressRequest, "x"),
                                   absl::Seconds(30));
  });
  asks.join();
  plain.join();
  const std::vector<std::string> expected = {"a\nauto\n127.0.0.1",
                                             absl::StrCat("b", kObservedAddressRequest, "x")};
  for (auto& r : results) EXPECT_THAT(r, ::lbcc::testing::IsOkAndHolds(ElementsAreArray(expected)));
}

// A listening TCP socket on the loopback device, and its port.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "listener: " << std::strerror(errno);
    }
    port = ntohs(a.sin_port);
  }
  ~Listener() { close(fd); }
};

TEST(BootstrapTest, TheRootDialsBackWhoAsksAtTheAddressItCameFromOnly) {
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(30)));
  Listener open;
  int closed_port = 0;
  {
    Listener gone;  // Bound, then closed: a connection to it is refused.
    closed_port = gone.port;
  }
  const std::vector<std::string> blobs = {
      absl::StrCat("a\nauto", kObservedAddressRequest, kDialBackRequest, "127.0.0.1:", open.port),
      absl::StrCat("b\nauto", kObservedAddressRequest, kDialBackRequest, "127.0.0.1:", closed_port),
      // Another host than the one the connection came from: answered 0, never dialed.
      absl::StrCat("c", kDialBackRequest, "192.0.2.1:", open.port),
      absl::StrCat("d", kDialBackRequest, "127.0.0.1:0"),
      absl::StrCat("e", kDialBackRequest, "not an address"),
      // Not the last line: not a request.
      absl::StrCat("f", kDialBackRequest, "127.0.0.1:", open.port, "\nx"),
  };
  const int n = static_cast<int>(blobs.size());
  std::vector<absl::StatusOr<std::vector<std::string>>> results(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] { results[r] = BootstrapExchange(id, n, r, blobs[r], absl::Seconds(30)); });
  }
  for (std::thread& t : ranks) t.join();
  const std::vector<std::string> expected = {"a\nauto\n127.0.0.1\n1", "b\nauto\n127.0.0.1\n0",
                                             "c\n0", "d\n0", "e\n0", blobs[5]};
  for (auto& r : results) EXPECT_THAT(r, ::lbcc::testing::IsOkAndHolds(ElementsAreArray(expected)));
  // The root's connection to the open listener arrived, and carried nothing.
  const int conn = accept4(open.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  ASSERT_GE(conn, 0) << std::strerror(errno);
  char byte;
  EXPECT_EQ(recv(conn, &byte, 1, 0), 0);  // Closed by the root, nothing sent.
  close(conn);
}

TEST(BootstrapTest, MissingRankTimesOutOnEveryJoinedRank) {
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(1)));
  auto results = RunRanks(id, 4, {0, 1, 3}, absl::Seconds(1));
  for (auto& r : results) {
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("rank(s) 2 of 4")));
  }
}

TEST(BootstrapTest, DisagreementsAreRejected) {
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(20)));
  // Two processes claim rank 0. Neither can finish before ranks 1 and 2 join, so the first to
  // return is the one the root turned away.
  Mutex mu;
  CondVar cv;
  std::vector<absl::Status> finished;
  std::vector<std::thread> claimants;
  for (int i = 0; i < 2; ++i) {
    claimants.emplace_back([&] {
      absl::Status status = BootstrapExchange(id, 3, 0, "blob-0", absl::Seconds(20)).status();
      MutexLock lock(&mu);
      finished.push_back(status);
      cv.SignalAll();
    });
  }
  {
    MutexLock lock(&mu);
    while (finished.empty()) cv.Wait(&mu);
    EXPECT_THAT(finished[0],
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("claim rank 0")));
  }
  // The root learnt nranks 3 from the first claimant: a rank that believes in 4 is turned away.
  EXPECT_THAT(BootstrapExchange(id, 4, 1, "x", absl::Seconds(20)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nranks 4")));
  auto results = RunRanks(id, 3, {1, 2}, absl::Seconds(20));
  for (auto& t : claimants) t.join();
  for (auto& r : results) EXPECT_THAT(r, IsOk());
  EXPECT_THAT(finished[1], IsOk());
}

TEST(BootstrapTest, BadArguments) {
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, UniqueIdFromAddress("127.0.0.1:1", 5));
  EXPECT_THAT(BootstrapExchange(id, 2, 2, "", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(BootstrapExchange(id, 0, 0, "", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  UniqueId garbage{};
  EXPECT_THAT(BootstrapExchange(garbage, 1, 0, "", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unique id")));
  EXPECT_THAT(UniqueIdFromAddress("localhost", 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CreateUniqueId("not-an-ip", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // Nobody listens on port 1: the rank gives up at its deadline.
  EXPECT_THAT(BootstrapExchange(id, 1, 0, "", absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("could not reach")));
}

TEST(BootstrapTest, ProcessesWithAFixedRootAddress) {
  const std::string address = absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort());
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, UniqueIdFromAddress(address, 42));
  // Children first (before this process starts the root thread): they retry until it is up.
  std::vector<pid_t> children;
  for (int rank = 1; rank < 3; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto blobs = BootstrapExchange(id, 3, rank, absl::StrCat("p", rank), absl::Seconds(20));
      _exit(blobs.ok() && blobs->size() == 3 && (*blobs)[0] == "p0" && (*blobs)[2] == "p2" ? 0 : 1);
    }
    children.push_back(pid);
  }
  LBCC_ASSERT_OK(StartRoot(address, 3, 42, absl::Seconds(20)));
  auto blobs = BootstrapExchange(id, 3, 0, "p0", absl::Seconds(20));
  EXPECT_THAT(blobs, ::lbcc::testing::IsOkAndHolds(ElementsAreArray({"p0", "p1", "p2"})));
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << pid;
  }
}

TEST(BootstrapTest, RootsOnAHostNameAndOnIpv6) {
  for (const std::string host : {"localhost", "[::1]"}) {
    const std::string address = absl::StrCat(host, ":", testing::FreeLoopbackPort());
    LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, UniqueIdFromAddress(address, 7));
    LBCC_ASSERT_OK(StartRoot(address, 2, 7, absl::Seconds(20)));
    auto results = RunRanks(id, 2, {1, 0}, absl::Seconds(20));
    for (auto& r : results) {
      EXPECT_THAT(r, ::lbcc::testing::IsOkAndHolds(ElementsAreArray({"blob-0", "blob-1"})))
          << address;
    }
  }
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId v6, CreateUniqueId("::1", absl::Seconds(20)));
  EXPECT_THAT(UniqueIdAddress(v6), HasSubstr("[::1]:"));
  auto results = RunRanks(v6, 2, {0, 1}, absl::Seconds(20));
  for (auto& r : results) EXPECT_THAT(r, IsOk());
}

TEST(BootstrapTest, UnresolvableHostsFailAtOnceNamingTheHost) {
  EXPECT_THAT(UniqueIdFromAddress("no-such-host.invalid:29500", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'no-such-host.invalid'")));
  EXPECT_THAT(StartRoot("no-such-host.invalid:29500", 2, 0, absl::Seconds(300)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'no-such-host.invalid'")));
  EXPECT_THAT(CreateUniqueId("no-such-host.invalid", absl::Seconds(300)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'no-such-host.invalid'")));
  EXPECT_THAT(UniqueIdFromAddress("fd00::1:29500", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[addr]:port")));
}

TEST(BootstrapTest, ChooseListenAddressFollowsTheRoot) {
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, UniqueIdFromAddress("127.0.0.1:1", 1));
  EXPECT_THAT(ChooseListenAddress(id, ""),
              ::lbcc::testing::IsOkAndHolds(::testing::Field(&transport::NetChoice::address,
                                                             "127.0.0.1")));
  EXPECT_THAT(ChooseListenAddress(id, "::1"),
              ::lbcc::testing::IsOkAndHolds(::testing::Field(&transport::NetChoice::ipv6, true)));
}

TEST(BootstrapTest, LoopbackAdvertisedToRemotePeersIsNamed) {
  EXPECT_THAT(CheckAdvertisedAddresses({"a", "a"}, {"127.0.0.1:5", "127.0.0.1:6"}), IsOk());
  EXPECT_THAT(CheckAdvertisedAddresses({"a", "b"}, {"10.0.0.1:5", "10.0.0.2:6"}), IsOk());
  EXPECT_THAT(
      CheckAdvertisedAddresses({"node0", "node1", "node1"},
                               {"10.77.0.1:5", "10.77.0.2:6", "127.0.0.1:7"}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AllOf(HasSubstr("rank 2 (host node1) advertises the loopback address "
                                          "127.0.0.1:7 but rank 0 is on host node0"),
                                HasSubstr("LBCC_SOCKET_IFNAME"))));
}

// bootstrap_fuzz's finding: an error reply carrying the code OK read as success (a StatusOr
// built from an OK status: a process abort in debug builds), and unknown codes passed through.
TEST(BootstrapTest, ARootReplyWithoutARealErrorCodeIsMalformed) {
  const std::string ok_code = std::string("\0\0\0\0\0bad", 8);
  EXPECT_THAT(internal::DecodeReply(ok_code, 2),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("malformed error reply")));
  std::string unknown(1, '\0');
  unknown += std::string("\x63\0\0\0", 4);  // code 99
  EXPECT_THAT(internal::DecodeReply(unknown, 2),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("malformed error reply")));
  EXPECT_THAT(internal::DecodeReply(
                  internal::EncodeErrorReply(absl::PermissionDeniedError("no secret")), 2),
              StatusIs(absl::StatusCode::kPermissionDenied, "no secret"));
  EXPECT_THAT(internal::DecodeReply(internal::EncodeTable({"a", "bc"}), 2),
              ::lbcc::testing::IsOkAndHolds(ElementsAreArray({"a", "bc"})));
  EXPECT_THAT(internal::DecodeReply(internal::EncodeTable({"a"}), 2),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("malformed table")));
  // bootstrap_fuzz's second finding: a first byte other than 0 and 1 was read as a table.
  std::string not_ok = internal::EncodeTable({"a", "bc"});
  not_ok[0] = '\xab';
  EXPECT_THAT(internal::DecodeReply(not_ok, 2),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("malformed reply")));
}

TEST(BootstrapTest, HelloAndUniqueIdDecodersRoundTrip) {
  const internal::BootstrapHello hello{42, 4, 3, "blob"};
  LBCC_ASSERT_OK_AND_ASSIGN(internal::BootstrapHello back,
                            internal::DecodeHello(internal::EncodeHello(hello)));
  EXPECT_EQ(back.session, 42u);
  EXPECT_EQ(back.nranks, 4u);
  EXPECT_EQ(back.rank, 3u);
  EXPECT_EQ(back.blob, "blob");
  EXPECT_THAT(internal::DecodeHello("short"), StatusIs(absl::StatusCode::kDataLoss));
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, UniqueIdFromAddress("10.0.0.1:29500", 7));
  LBCC_ASSERT_OK_AND_ASSIGN(internal::DecodedUniqueId decoded, internal::DecodeUniqueId(id));
  EXPECT_EQ(decoded.session, 7u);
  EXPECT_EQ(decoded.address, "10.0.0.1:29500");
  EXPECT_FALSE(decoded.secret.has_value());
  id.internal[0] = 'X';
  EXPECT_THAT(internal::DecodeUniqueId(id),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not an LBCC unique id")));
}

}  // namespace
}  // namespace lbcc::comm
