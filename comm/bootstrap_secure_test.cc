// The bootstrap root with a job secret (issue 24): impostors that connect to the root (a wrong
// secret, or no handshake at all) are refused and closed, and the job's ranks still meet.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_matchers.h"
#include "comm/bootstrap.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/secure.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::ElementsAre;

constexpr char kSecret[] = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

int ConnectTo(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(colon + 1), &port));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

TEST(BootstrapSecureTest, ImpostorsAtTheRootAreRefusedAndTheRanksStillMeet) {
  setenv("LBCC_JOB_SECRET", kSecret, 1);
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(60)));
  const std::string root = UniqueIdAddress(id);
  const transport::SecurityCounters before = transport::GetSecurityCounters();

  // An impostor holding another secret: the root's proof fails for it, and its own proof would
  // fail at the root.
  int fd = ConnectTo(root);
  EXPECT_THAT(transport::AuthenticateSocket(fd, transport::HandshakeRole::kClient,
                                            transport::JobSecret::Random(), "anything", 0,
                                            absl::Now() + absl::Seconds(30), root),
              StatusIs(absl::StatusCode::kPermissionDenied));
  close(fd);
  // An impostor that skips the handshake and sends a rank's hello: closed without an answer.
  fd = ConnectTo(root);
  const std::string junk(64, '\x01');
  ASSERT_EQ(write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  char byte;
  EXPECT_LE(read(fd, &byte, 1), 0);  // Closed (0) or reset (-1); never an answer.
  close(fd);

  std::vector<absl::StatusOr<std::vector<std::string>>> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      results[r] = BootstrapExchange(id, 2, r, absl::StrCat("blob-", r), absl::Seconds(60));
    });
  }
  for (auto& t : ranks) t.join();
  for (auto& result : results) {
    ASSERT_THAT(result, IsOk());
    EXPECT_THAT(*result, ElementsAre("blob-0", "blob-1"));
  }
  // The root refused the junk; the first impostor was refused by itself (the root's proof).
  EXPECT_GE(transport::GetSecurityCounters().handshakes_refused, before.handshakes_refused + 2);
  unsetenv("LBCC_JOB_SECRET");
}

}  // namespace
}  // namespace lbcc::comm
