// The NCCL net plugin with a job secret (issue 24): an impostor (another secret, or none) that
// connects to a plugin's listener gets no comm and the listener accepts nothing from it; members
// then connect and their bytes arrive. Over the loopback transport: the handshake is the link
// set-up's, the same for every backend (transport/secure_test.cc runs it over UCX).
#include <unistd.h>

#include <array>
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugin/handle.h"
#include "plugin/net.h"
#include "transport/loopback.h"
#include "transport/secure.h"

namespace lbcc::plugin {
namespace {

using ::lbcc::testing::IsOk;
using transport::JobSecret;

constexpr absl::Duration kDeadline = absl::Seconds(60);

NetOptions Options(std::optional<JobSecret> secret) {
  static std::atomic<int> counter{0};
  NetOptions options;
  options.devices.push_back(
      {"loop0", absl::StrCat("plugin-secure-", getpid(), "-", counter.fetch_add(1)), "", {}});
  options.make_transport = [](const transport::TransportOptions& transport_options)
      -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
    return transport::NewLoopbackTransport(transport_options);
  };
  options.transport.security.secret = secret;
  options.connect_timeout = absl::Seconds(20);
  options.close_grace = absl::Seconds(5);
  return options;
}

std::unique_ptr<Net> MakeNet(std::optional<JobSecret> secret) {
  absl::StatusOr<std::unique_ptr<Net>> net = Net::Create(Options(secret));
  EXPECT_THAT(net.status(), IsOk());
  return net.ok() ? std::move(*net) : nullptr;
}

// Runs `from`'s connect loop against `handle` until it returns a comm or an error.
absl::StatusOr<SendComm*> ConnectLoop(Net& from, std::array<uint8_t, kHandleBytes> handle) {
  const absl::Time deadline = absl::Now() + kDeadline;
  while (absl::Now() < deadline) {
    LBCC_ASSIGN_OR_RETURN(SendComm * send, from.Connect(0, absl::MakeSpan(handle)));
    if (send != nullptr) return send;
    std::this_thread::yield();
  }
  return absl::DeadlineExceededError("connect loop");
}

absl::Status Wait(Request* request, int* size) {
  const absl::Time deadline = absl::Now() + kDeadline;
  while (absl::Now() < deadline) {
    bool done = false;
    LBCC_RETURN_IF_ERROR(Net::Test(request, &done, size));
    if (done) return absl::OkStatus();
    std::this_thread::yield();
  }
  return absl::DeadlineExceededError("request");
}

TEST(NetSecureTest, ImpostorsGetNoCommAndMembersStillConnect) {
  const JobSecret secret = JobSecret::Random();
  std::unique_ptr<Net> listener = MakeNet(secret);
  ASSERT_NE(listener, nullptr);
  std::array<uint8_t, kHandleBytes> handle{};
  LBCC_ASSERT_OK_AND_ASSIGN(ListenComm * listen, listener->Listen(0, absl::MakeSpan(handle)));
  const uint64_t refused_before = transport::GetSecurityCounters().handshakes_refused;

  for (std::optional<JobSecret> impostor_secret :
       {std::optional<JobSecret>(JobSecret::Random()), std::optional<JobSecret>()}) {
    std::unique_ptr<Net> impostor = MakeNet(impostor_secret);
    ASSERT_NE(impostor, nullptr);
    EXPECT_THAT(ConnectLoop(*impostor, handle), ::testing::Not(IsOk()));
    LBCC_ASSERT_OK_AND_ASSIGN(RecvComm * accepted, Net::Accept(listen));
    EXPECT_EQ(accepted, nullptr);  // Nothing of the impostor's reached the listen comm.
  }
  EXPECT_GE(transport::GetSecurityCounters().handshakes_refused, refused_before + 2);

  // A member connects and a message arrives intact.
  std::unique_ptr<Net> member = MakeNet(secret);
  SendComm* send = nullptr;
  RecvComm* recv = nullptr;
  std::array<uint8_t, kHandleBytes> member_handle = handle;
  const absl::Time deadline = absl::Now() + kDeadline;
  while (send == nullptr || recv == nullptr) {
    if (send == nullptr) {
      LBCC_ASSERT_OK_AND_ASSIGN(send, member->Connect(0, absl::MakeSpan(member_handle)));
    }
    if (recv == nullptr) {
      LBCC_ASSERT_OK_AND_ASSIGN(recv, Net::Accept(listen));
    }
    ASSERT_LT(absl::Now(), deadline);
    std::this_thread::yield();
  }
  std::vector<uint8_t> out(5000, 0x5a), in(5000, 0);
  LBCC_ASSERT_OK_AND_ASSIGN(void* out_mr, Net::RegMr(send, out.data(), out.size(), kPtrHost));
  LBCC_ASSERT_OK_AND_ASSIGN(void* in_mr, Net::RegMr(recv, in.data(), in.size(), kPtrHost));
  void* data[1] = {in.data()};
  size_t sizes[1] = {in.size()};
  int tags[1] = {1};
  void* mhandles[1] = {in_mr};
  LBCC_ASSERT_OK_AND_ASSIGN(Request * r, Net::Irecv(recv, 1, data, sizes, tags, mhandles));
  LBCC_ASSERT_OK_AND_ASSIGN(Request * s, Net::Isend(send, out.data(), out.size(), 1, out_mr));
  int sent = 0, received = 0;
  ASSERT_THAT(Wait(s, &sent), IsOk());
  ASSERT_THAT(Wait(r, &received), IsOk());
  EXPECT_EQ(received, 5000);
  EXPECT_EQ(in, out);
  EXPECT_THAT(Net::DeregMr(send, out_mr), IsOk());
  EXPECT_THAT(Net::DeregMr(recv, in_mr), IsOk());
  EXPECT_THAT(Net::CloseSend(send), IsOk());
  EXPECT_THAT(Net::CloseRecv(recv), IsOk());
  EXPECT_THAT(Net::CloseListen(listen), IsOk());
}

}  // namespace
}  // namespace lbcc::plugin
