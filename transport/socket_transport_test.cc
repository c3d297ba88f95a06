// The socket backend against strangers on its port: garbage, oversized frames and silent
// connections are closed without disturbing the transport, which goes on accepting real links.
// (The Endpoint contract itself: transport_test's socket cases.)
#include "transport/socket_transport.h"
#include "transport/socket_frame.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "transport/lane.h"
#include "transport/link_setup.h"
#include "transport/netif.h"
#include "transport/test_util.h"

namespace lbcc::transport {
namespace {

using ::lbcc::testing::IsOk;
using testing::kWait;


// A raw TCP connection to `address`, or -1.
int Dial(const std::string& address) {
  absl::StatusOr<SocketAddress> to = ParseSocketAddress(address, "address");
  if (!to.ok()) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (ConnectBefore(fd, to->get(), to->length, absl::Now() + absl::Seconds(20)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True once the server closed `fd` (recv sees the end, or a reset).
bool ClosedByPeer(int fd) {
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte;
  const ssize_t n = recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

TransportOptions Options() {
  TransportOptions options;
  options.peer_timeout = absl::Seconds(5);
  return options;
}

// Sends one message each way over a fresh link: the transport still works.
void ExpectALinkWorks(Transport& server, Transport& client, const std::string& address) {
  ConnectOptions connect;
  connect.has_link_class = true;
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Endpoint> a, client.Connect(address, kWait, connect));
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Endpoint> b, server.Accept(kWait));
  uint8_t out = 42, in = 0;
  testing::Result<absl::Status> sent;
  testing::Result<absl::StatusOr<size_t>> got;
  a->Send(1, absl::MakeConstSpan(&out, 1), {}, sent.Callback());
  b->Recv(1, absl::MakeSpan(&in, 1), got.Callback());
  EXPECT_THAT(sent.Wait(), IsOk());
  EXPECT_THAT(got.Wait(), IsOk());
  EXPECT_EQ(in, 42);
}

TEST(SocketTransportTest, StrangersAreClosedAndRealLinksGoOn) {
  std::unique_ptr<Transport> server = NewSocketTransport(Options());
  std::unique_ptr<Transport> client = NewSocketTransport(Options());
  LBCC_ASSERT_OK_AND_ASSIGN(std::string address, server->Listen("127.0.0.1:0"));

  // An unknown frame kind.
  int fd = Dial(address);
  ASSERT_GE(fd, 0);
  const char garbage[] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_GT(send(fd, garbage, sizeof(garbage), MSG_NOSIGNAL), 0);
  EXPECT_TRUE(ClosedByPeer(fd));
  close(fd);

  // A control frame announcing a large payload before any HELLO.
  fd = Dial(address);
  ASSERT_GE(fd, 0);
  std::string frame(1 + sizeof(ControlHeader) + 4, '\0');
  frame[0] = static_cast<char>(kFrameControl);
  const uint32_t huge = 1u << 30;
  std::memcpy(&frame[1 + sizeof(ControlHeader)], &huge, 4);
  ASSERT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(frame.size()));
  EXPECT_TRUE(ClosedByPeer(fd));
  close(fd);

  // A data chunk before the link was set up.
  fd = Dial(address);
  ASSERT_GE(fd, 0);
  std::string chunk(1 + sizeof(ChunkHeader), '\0');
  chunk[0] = static_cast<char>(kFrameChunk);
  ASSERT_EQ(send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(chunk.size()));
  EXPECT_TRUE(ClosedByPeer(fd));
  close(fd);

  ExpectALinkWorks(*server, *client, address);
}

TEST(SocketTransportTest, ASilentConnectionIsClosedAfterTheHelloDeadline) {
  std::unique_ptr<Transport> server = NewSocketTransport(Options());
  LBCC_ASSERT_OK_AND_ASSIGN(std::string address, server->Listen("127.0.0.1:0"));
  const int fd = Dial(address);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(ClosedByPeer(fd));  // within the receive timeout (20 s > the 10 s deadline)
  close(fd);
}

TEST(SocketTransportTest, ConnectToNobodyIsUnavailableAndABadAddressInvalid) {
  std::unique_ptr<Transport> client = NewSocketTransport(Options());
  EXPECT_EQ(client->Connect("127.0.0.1:1", kWait, {}).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->Connect("not an address", kWait, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lbcc::transport
