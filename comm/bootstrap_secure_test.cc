// The bootstrap root with a job secret (issue 24): impostors that connect to the root (a wrong
// secret, or no handshake at all) are refused and closed, and the job's ranks still meet. An id
// made with LBCC_SECRET_IN_ID carries the secret: ranks launched from it authenticate their
// bootstrap connection and their links with no secret of their own, an id with the secret
// changed (or none) is refused, and LBCC_JOB_SECRET wins when it is set.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/fabric.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/secure.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

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

// Sets environment variables for one test and restores them after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

absl::Status Exchange(const UniqueId& id, int nranks) {
  std::vector<absl::StatusOr<std::vector<std::string>>> results(nranks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < nranks; ++r) {
    ranks.emplace_back([&, r] {
      results[r] = BootstrapExchange(id, nranks, r, absl::StrCat("blob-", r), absl::Seconds(20));
    });
  }
  for (auto& t : ranks) t.join();
  for (auto& result : results) {
    if (!result.ok()) return result.status();
  }
  return absl::OkStatus();
}

TEST(SecretInIdTest, AnIdCarriesAFreshSecretThatAuthenticatesTheRanks) {
  ScopedEnv in_id("LBCC_SECRET_IN_ID", "1");
  ScopedEnv no_secret("LBCC_JOB_SECRET", nullptr);
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(60)));
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId other, CreateUniqueId("127.0.0.1", absl::Seconds(1)));
  const std::optional<transport::JobSecret> secret = UniqueIdSecret(id);
  ASSERT_TRUE(secret.has_value());
  ASSERT_TRUE(UniqueIdSecret(other).has_value());
  EXPECT_NE(secret->ToHex(), UniqueIdSecret(other)->ToHex());  // Fresh per id.
  EXPECT_THAT(UniqueIdAddress(id), ::testing::StartsWith("127.0.0.1:"));

  // The root demands the id's secret: a client with another one is refused.
  const std::string root = UniqueIdAddress(id);
  const int fd = ConnectTo(root);
  EXPECT_THAT(transport::AuthenticateSocket(fd, transport::HandshakeRole::kClient,
                                            transport::JobSecret::Random(), "anything", 0,
                                            absl::Now() + absl::Seconds(30), root),
              StatusIs(absl::StatusCode::kPermissionDenied));
  close(fd);
  EXPECT_THAT(Exchange(id, 2), IsOk());
}

TEST(SecretInIdTest, AnIdWithoutTheRightSecretIsRefused) {
  ScopedEnv in_id("LBCC_SECRET_IN_ID", "1");
  ScopedEnv no_secret("LBCC_JOB_SECRET", nullptr);
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(60)));
  // Whoever knows the root's address and the session but not the secret: an id with one byte
  // of the secret changed, and one without a secret.
  UniqueId forged = id;
  forged.internal[kUniqueIdBytes - 1] ^= 1;
  ASSERT_TRUE(UniqueIdSecret(forged).has_value());
  EXPECT_THAT(BootstrapExchange(forged, 1, 0, "impostor", absl::Seconds(20)),
              StatusIs(absl::StatusCode::kPermissionDenied));
  uint64_t session;
  std::memcpy(&session, id.internal + 8, 8);
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId plain, UniqueIdFromAddress(UniqueIdAddress(id), session));
  EXPECT_FALSE(UniqueIdSecret(plain).has_value());
  EXPECT_THAT(BootstrapExchange(plain, 1, 0, "impostor", absl::Seconds(5)), Not(IsOk()));
  // The job is unaffected.
  EXPECT_THAT(Exchange(id, 2), IsOk());
}

// A rank started without the job's secret learns that the job requires one, at once, instead of
// finding its connection reset; a rank with a secret whose root has none is told to check it.
TEST(SecretRefusalTest, ARankWithoutTheSecretIsToldTheJobRequiresOne) {
  ScopedEnv no_secret("LBCC_JOB_SECRET", nullptr);
  const transport::JobSecret secret = transport::JobSecret::Random();
  LBCC_ASSERT_OK_AND_ASSIGN(
      UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(60), BootstrapSecurity{true, secret}));
  const absl::Time start = absl::Now();
  EXPECT_THAT(BootstrapExchange(id, 2, 1, "no-secret", absl::Seconds(30), BootstrapSecurity{true}),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("this job requires a job secret"),
                             HasSubstr("LBCC_JOB_SECRET"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "refused at once, not at the timeout";

  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId open,
                            CreateUniqueId("127.0.0.1", absl::Seconds(60), BootstrapSecurity{true}));
  EXPECT_THAT(
      BootstrapExchange(open, 2, 1, "with-secret", absl::Seconds(5), BootstrapSecurity{true, secret}),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("does the root's process have the same")));
}

TEST(SecretInIdTest, TheEnvironmentsSecretWinsAndIsNeverPutInTheId) {
  ScopedEnv in_id("LBCC_SECRET_IN_ID", "1");
  ScopedEnv env_secret("LBCC_JOB_SECRET", kSecret);
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(60)));
  EXPECT_FALSE(UniqueIdSecret(id).has_value());
  EXPECT_THAT(std::string(id.internal, kUniqueIdBytes), Not(HasSubstr(std::string(
                                                            reinterpret_cast<const char*>(
                                                                transport::JobSecret::FromHex(
                                                                    kSecret)
                                                                    ->bytes()
                                                                    .data()),
                                                            transport::kJobSecretBytes))));
  EXPECT_THAT(Exchange(id, 2), IsOk());
}

TEST(SecretInIdTest, WithoutTheVariableIdsCarryNoSecret) {
  ScopedEnv in_id("LBCC_SECRET_IN_ID", nullptr);
  ScopedEnv no_secret("LBCC_JOB_SECRET", nullptr);
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(60)));
  EXPECT_FALSE(UniqueIdSecret(id).has_value());
  EXPECT_THAT(Exchange(id, 2), IsOk());
}

TEST(SecretInIdTest, CommunicatorsFromAnIdWithASecretAuthenticateEveryLink) {
  ScopedEnv in_id("LBCC_SECRET_IN_ID", "1");
  ScopedEnv no_secret("LBCC_JOB_SECRET", nullptr);
  for (const char* backend : {"loopback", "ucx"}) {
    SCOPED_TRACE(backend);
    testing::RankOptions options;
    options.backend = backend;
    const std::vector<absl::Status> results =
        testing::RunRanks(3, options, [](int rank, Communicator& comm) -> absl::Status {
          for (int peer = 0; peer < comm.nranks(); ++peer) {
            if (peer == rank) continue;
            const transport::LinkCounters counters = comm.fabric()->Counters(peer);
            if (!counters.authenticated) {
              return absl::InternalError(absl::StrCat("link ", rank, "->", peer, " is plain"));
            }
          }
          std::vector<float> data(1000, static_cast<float>(rank + 1));
          LBCC_ASSIGN_OR_RETURN(TensorView v, TensorView::Host(data.data(), {1000}));
          LBCC_RETURN_IF_ERROR(comm.AllReduce(v, v, ReduceOp::kSum)->Wait());
          if (data[0] != 6.0f || data[999] != 6.0f) return absl::InternalError("wrong sum");
          return absl::OkStatus();
        });
    for (const absl::Status& status : results) EXPECT_THAT(status, IsOk());
  }
}

}  // namespace
}  // namespace lbcc::comm
