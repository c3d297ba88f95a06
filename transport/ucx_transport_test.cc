// UCX-specific behaviour over tcp on the loopback device: port 0 listening, classification by
// probe and by configuration on either side, refused and retried connections, and a killed peer
// process failing pending work with Unavailable within the peer timeout.
#include "transport/ucx_transport.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/netif.h"
#include "transport/subprocess.h"
#include "transport/test_util.h"

namespace lbcc::transport {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::StatusIs;
using ::lbcc::transport::testing::kWait;
using ::lbcc::transport::testing::RecvResult;
using ::lbcc::transport::testing::RunfilePath;
using ::lbcc::transport::testing::SendResult;
using ::lbcc::transport::testing::Subprocess;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TransportOptions LoopbackTcp() {
  TransportOptions options;
  options.ucx_tls = "tcp";
  options.ucx_net_devices = "lo";
  options.peer_timeout = absl::Seconds(3);
  options.probe_max_bytes = 4 << 20;  // Enough to time loopback; keeps connects quick.
  return options;
}

struct Pair {
  std::unique_ptr<Transport> server, client;
  std::unique_ptr<Endpoint> a, b;  // a: client side.
};

absl::StatusOr<Pair> Connect(const TransportOptions& server_options,
                             const TransportOptions& client_options, ConnectOptions connect = {}) {
  Pair pair;
  LBCC_ASSIGN_OR_RETURN(pair.server, NewUcxTransport(server_options));
  LBCC_ASSIGN_OR_RETURN(pair.client, NewUcxTransport(client_options));
  LBCC_ASSIGN_OR_RETURN(std::string address, pair.server->Listen("127.0.0.1:0"));
  LBCC_ASSIGN_OR_RETURN(pair.a, pair.client->Connect(address, kWait, connect));
  LBCC_ASSIGN_OR_RETURN(pair.b, pair.server->Accept(kWait));
  return pair;
}

TEST(UcxTransportTest, ListenOnPortZeroReturnsTheRealPort) {
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> transport, NewUcxTransport(LoopbackTcp()));
  LBCC_ASSERT_OK_AND_ASSIGN(std::string address, transport->Listen("127.0.0.1:0"));
  EXPECT_THAT(address, StartsWith("127.0.0.1:"));
  EXPECT_NE(address, "127.0.0.1:0");
  EXPECT_THAT(transport->Listen("127.0.0.1:0"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(transport->backend(), "ucx");
}

TEST(UcxTransportTest, BadAddressesAreInvalidArgument) {
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> transport, NewUcxTransport(LoopbackTcp()));
  EXPECT_THAT(transport->Connect("no-port", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(transport->Connect("127.0.0.1:0", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(transport->Listen("127.0.0.1:99999"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(transport->Accept(absl::Milliseconds(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

bool HaveIpv6Loopback() {
  absl::StatusOr<SocketAddress> any = NumericSocketAddress("::1", 0);
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool ok = any.ok() && fd >= 0 && bind(fd, any->get(), any->length) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

// IPv6 addresses at the UCX API: the listener binds an IPv6 address and reports it in brackets
// with the real port; an unbracketed one is ambiguous and named, not guessed; a name resolves
// (IPv4 first). Data over
// IPv6 needs a device with an IPv6 address (UCX's tcp transport uses none on lo): the
// multi-node test does that between namespaces (tests/multinode_ipv6_test.sh).
TEST(UcxTransportTest, Ipv6AddressesListenAndParse) {
  if (!HaveIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback (::1) here";
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> server, NewUcxTransport(LoopbackTcp()));
  LBCC_ASSERT_OK_AND_ASSIGN(std::string address, server->Listen("[::1]:0"));
  EXPECT_THAT(address, StartsWith("[::1]:"));
  EXPECT_NE(address, "[::1]:0");
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> client, NewUcxTransport(LoopbackTcp()));
  EXPECT_THAT(client->Connect("::1:4000", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'::1:4000'")));
  EXPECT_THAT(client->Connect("[::1]:0", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("port 0")));
  EXPECT_THAT(client->Listen("[::1:0"), StatusIs(absl::StatusCode::kInvalidArgument));
  LBCC_ASSERT_OK_AND_ASSIGN(std::string v4, client->Listen("localhost:0"));
  EXPECT_THAT(v4, StartsWith("127.0.0.1:")) << "a name resolves, IPv4 first";
}

TEST(UcxTransportTest, ProbeClassifiesAgainstTheThreshold) {
  // Loopback is far faster than 1 kbit/s and far slower than 1 Pbit/s, whatever the machine.
  for (const auto& [threshold, expected] :
       {std::pair<double, LinkClass>{1e3, LinkClass::kFast}, {1e15, LinkClass::kSlow}}) {
    TransportOptions options = LoopbackTcp();
    options.slow_threshold_bits_per_second = threshold;
    LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(options, options));
    EXPECT_EQ(pair.a->link_class(), expected) << "threshold " << threshold;
    EXPECT_EQ(pair.b->link_class(), expected) << "the server adopts the client's verdict";
    const LinkCounters client = pair.a->counters();
    const LinkCounters server = pair.b->counters();
    EXPECT_GT(client.probed_send_bytes_per_second, 0);
    EXPECT_GT(client.probed_recv_bytes_per_second, 0);
    EXPECT_GT(client.probed_rtt_seconds, 0);
    EXPECT_EQ(server.probed_send_bytes_per_second, client.probed_recv_bytes_per_second);
    EXPECT_EQ(server.probed_recv_bytes_per_second, client.probed_send_bytes_per_second);
  }
}

TEST(UcxTransportTest, ConfiguredClassOnEitherSideSlowWinsAndIsProbedOnlyToPaceBulk) {
  TransportOptions fast_everywhere = LoopbackTcp();
  fast_everywhere.link_class = LinkClass::kFast;
  TransportOptions server_rules = LoopbackTcp();
  LBCC_ASSERT_OK_AND_ASSIGN(server_rules.link_rules, LinkRules::Parse("127.0.0.1 slow\n"));
  {
    LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(server_rules, fast_everywhere));
    EXPECT_EQ(pair.a->link_class(), LinkClass::kSlow);
    EXPECT_EQ(pair.b->link_class(), LinkClass::kSlow);
    // Bulk yields by the link's rate, so a link configured slow is probed for it.
    EXPECT_GT(pair.a->counters().probed_send_bytes_per_second, 0);
    EXPECT_GT(pair.b->counters().probed_send_bytes_per_second, 0);
  }
  // Without bulk yielding (the connecting side decides), it is not: the class needs no rates.
  fast_everywhere.scheduler.bulk_yield = false;
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(server_rules, fast_everywhere));
  EXPECT_EQ(pair.a->link_class(), LinkClass::kSlow);
  EXPECT_EQ(pair.a->counters().probed_send_bytes_per_second, 0);  // Not probed.
  EXPECT_GT(pair.a->counters().probed_rtt_seconds, 0);             // The round trip always is.
}

TEST(UcxTransportTest, ExplicitConnectOptionWins) {
  TransportOptions slow_everywhere = LoopbackTcp();
  slow_everywhere.link_class = LinkClass::kSlow;
  ConnectOptions fast;
  fast.has_link_class = true;
  fast.link_class = LinkClass::kFast;
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(slow_everywhere, slow_everywhere, fast));
  EXPECT_EQ(pair.a->link_class(), LinkClass::kFast);
  EXPECT_EQ(pair.b->link_class(), LinkClass::kFast);
}

TEST(UcxTransportTest, StripedSlowLinkUsesEveryConnection) {
  TransportOptions options = LoopbackTcp();
  options.link_class = LinkClass::kSlow;
  options.scheduler.stripes = 4;
  options.scheduler.chunk_bytes = 16 << 10;
  options.scheduler.window_bytes = 256 << 10;
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(options, options));
  EXPECT_EQ(pair.a->counters().stripes, 4);
  EXPECT_EQ(pair.b->counters().stripes, 4);
  const std::vector<uint8_t> data = testing::Pattern(3 << 20, 7);
  std::vector<uint8_t> in(data.size());
  RecvResult received;
  SendResult sent;
  pair.b->Recv(1, absl::MakeSpan(in), received.Callback());
  pair.a->Send(1, data, {}, sent.Callback());
  EXPECT_THAT(sent.Wait(), IsOk());
  ASSERT_THAT(received.Wait(), IsOkAndHolds(data.size()));
  EXPECT_EQ(in, data);
  EXPECT_EQ(pair.a->counters().chunks_sent, (3u << 20) / (16u << 10));
}

// Slow-link chunks go by UCX's eager protocol up to slow_eager_bytes (the default), or as UCX
// chooses (0): either way every byte arrives. Eager sends complete before the peer posts its
// receive (the chunks wait at the receiver), which a rendezvous never does: there the parked
// chunks' bytes stay at the sender until a receive wants them, so only receive-first is run.
TEST(UcxTransportTest, SlowLinkChunksArriveEagerOrNot) {
  for (const int64_t eager_bytes : {int64_t{4} << 20, int64_t{0}}) {
    SCOPED_TRACE(absl::StrCat("slow_eager_bytes ", eager_bytes));
    TransportOptions options = LoopbackTcp();
    options.link_class = LinkClass::kSlow;
    options.scheduler.stripes = 2;
    options.scheduler.chunk_bytes = 64 << 10;
    options.slow_eager_bytes = eager_bytes;
    LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(options, options));
    for (const bool recv_first : {true, false}) {
      if (!recv_first && eager_bytes == 0) continue;
      const std::vector<uint8_t> data = testing::Pattern((1 << 20) + 100, recv_first ? 3 : 4);
      std::vector<uint8_t> in(data.size());
      RecvResult received;
      SendResult sent;
      if (recv_first) pair.b->Recv(5, absl::MakeSpan(in), received.Callback());
      pair.a->Send(5, data, {}, sent.Callback());
      EXPECT_THAT(sent.Wait(), IsOk());
      if (!recv_first) pair.b->Recv(5, absl::MakeSpan(in), received.Callback());
      ASSERT_THAT(received.Wait(), IsOkAndHolds(data.size())) << recv_first;
      EXPECT_EQ(in, data) << recv_first;
    }
  }
}

// A process connects to its own listener (NCCL connects every rank to itself): both ends of the
// link live in one transport and share the client's connection id; each must stay its own end.
// Probed (the set-up messages cross inside one worker) and striped slow, small (eager) and large
// (rendezvous) messages, bytes checked both ways.
TEST(UcxTransportTest, SelfConnectCarriesBytesBothWays) {
  for (const bool slow : {false, true}) {
    SCOPED_TRACE(slow ? "slow, 2 stripes" : "probed");
    TransportOptions options = LoopbackTcp();
    if (slow) {
      options.link_class = LinkClass::kSlow;
      options.scheduler.stripes = 2;
      options.scheduler.chunk_bytes = 64 << 10;
    }
    LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> transport, NewUcxTransport(options));
    LBCC_ASSERT_OK_AND_ASSIGN(std::string address, transport->Listen("127.0.0.1:0"));
    LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Endpoint> client, transport->Connect(address, kWait));
    LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Endpoint> server, transport->Accept(kWait));
    EXPECT_EQ(client->link_class(), server->link_class());
    if (slow) {
      EXPECT_EQ(server->counters().stripes, 2);
    }
    EXPECT_THAT(transport->Accept(absl::Milliseconds(10)),
                StatusIs(absl::StatusCode::kDeadlineExceeded))
        << "one connection, accepted once";
    for (const size_t size : {size_t{0}, size_t{100}, size_t{5} << 20}) {
      const std::vector<uint8_t> up = testing::Pattern(size, 2 * size + 1);
      const std::vector<uint8_t> down = testing::Pattern(size, 2 * size + 2);
      std::vector<uint8_t> up_in(size + 1), down_in(size + 1);
      RecvResult up_received, down_received;
      SendResult up_sent, down_sent;
      server->Recv(3, absl::MakeSpan(up_in), up_received.Callback());
      client->Recv(3, absl::MakeSpan(down_in), down_received.Callback());
      client->Send(3, up, {}, up_sent.Callback());
      server->Send(3, down, {}, down_sent.Callback());
      EXPECT_THAT(up_sent.Wait(), IsOk());
      EXPECT_THAT(down_sent.Wait(), IsOk());
      ASSERT_THAT(up_received.Wait(), IsOkAndHolds(size));
      ASSERT_THAT(down_received.Wait(), IsOkAndHolds(size));
      up_in.resize(size);
      down_in.resize(size);
      EXPECT_TRUE(up_in == up) << size << " bytes client -> server";
      EXPECT_TRUE(down_in == down) << size << " bytes server -> client";
    }
    // Closing one end fails the other's pending work (they are distinct ends).
    RecvResult orphan;
    std::vector<uint8_t> sink(8);
    server->Recv(4, absl::MakeSpan(sink), orphan.Callback());
    client->Close();
    EXPECT_THAT(orphan.Wait(), StatusIs(absl::StatusCode::kUnavailable));
  }
}

// Shutdown() without destroying the transport: a Connect() to a peer that never answers and an
// Accept() that nobody connects to, each blocked on another thread with a long timeout, return
// Cancelled promptly; later calls fail the same way.
TEST(UcxTransportTest, ShutdownCancelsBlockedConnectAndAccept) {
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> probe, NewUcxTransport(LoopbackTcp()));
  LBCC_ASSERT_OK_AND_ASSIGN(std::string nobody, probe->Listen("127.0.0.1:0"));
  probe.reset();  // Nothing listens there now: connects are refused and retried.
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> transport, NewUcxTransport(LoopbackTcp()));
  ASSERT_THAT(transport->Listen("127.0.0.1:0"), IsOk());
  absl::StatusOr<std::unique_ptr<Endpoint>> connected, accepted;
  std::thread connector([&] { connected = transport->Connect(nobody, kWait); });
  std::thread acceptor([&] { accepted = transport->Accept(kWait); });
  absl::SleepFor(absl::Milliseconds(300));  // Let both block (the behaviour under test).
  const absl::Time start = absl::Now();
  transport->Shutdown();
  connector.join();
  acceptor.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "not prompt";
  EXPECT_THAT(connected.status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(accepted.status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(transport->Connect(nobody, absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(transport->Accept(absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kCancelled));
  transport->Shutdown();  // Idempotent; the destructor calls it again.
}

TEST(UcxTransportTest, NobodyListeningFailsWithinTheTimeout) {
  // A port that was free a moment ago; nothing listens there.
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> probe, NewUcxTransport(LoopbackTcp()));
  LBCC_ASSERT_OK_AND_ASSIGN(std::string address, probe->Listen("127.0.0.1:0"));
  probe.reset();
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> client, NewUcxTransport(LoopbackTcp()));
  EXPECT_THAT(client->Connect(address, absl::Milliseconds(500)),
              StatusIs(AnyOf(absl::StatusCode::kUnavailable,
                             absl::StatusCode::kDeadlineExceeded)));
}

TEST(UcxTransportTest, ConnectRetriesUntilThePeerListens) {
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> probe, NewUcxTransport(LoopbackTcp()));
  LBCC_ASSERT_OK_AND_ASSIGN(std::string address, probe->Listen("127.0.0.1:0"));
  probe.reset();  // The port is free again; the server below takes it after the client tries.
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> client, NewUcxTransport(LoopbackTcp()));
  absl::StatusOr<std::unique_ptr<Endpoint>> connected;
  std::thread connector([&] { connected = client->Connect(address, kWait); });
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> server, NewUcxTransport(LoopbackTcp()));
  absl::Status listening = server->Listen(address).status();
  absl::StatusOr<std::unique_ptr<Endpoint>> accepted;
  if (listening.ok()) accepted = server->Accept(kWait);
  connector.join();
  ASSERT_THAT(listening, IsOk()) << "the port was taken by someone else";
  ASSERT_THAT(connected, IsOk());
  ASSERT_THAT(accepted, IsOk());
}

TEST(UcxTransportTest, QuietButAlivePeerOutlivesThePeerTimeout) {
  TransportOptions options = LoopbackTcp();
  options.link_class = LinkClass::kFast;
  options.peer_timeout = absl::Seconds(1);
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(options, options));
  std::vector<uint8_t> in(8);
  RecvResult received;
  pair.b->Recv(1, absl::MakeSpan(in), received.Callback());
  // The receive waits several peer timeouts for a message that comes late; heartbeats keep the
  // link alive meanwhile. (The pause is the behaviour under test, not a synchronisation.)
  absl::SleepFor(options.peer_timeout * 5 / 2);
  EXPECT_FALSE(received.done());
  const std::vector<uint8_t> data = {1, 2, 3};
  SendResult sent;
  pair.a->Send(1, data, {}, sent.Callback());
  EXPECT_THAT(received.Wait(), IsOkAndHolds(3u));
  EXPECT_THAT(sent.Wait(), IsOk());
}

TEST(UcxTransportTest, KilledPeerFailsPendingWorkWithUnavailable) {
  TransportOptions options = LoopbackTcp();
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> server, NewUcxTransport(options));
  LBCC_ASSERT_OK_AND_ASSIGN(std::string address, server->Listen("127.0.0.1:0"));
  LBCC_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Subprocess> peer,
      Subprocess::Start({RunfilePath("transport/transport_perf"), "hold",
                         "--connect=" + address, "--devices=lo", "--link_class=fast"}));
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Endpoint> endpoint, server->Accept(kWait));
  std::vector<uint8_t> hello(16);
  RecvResult greeted;
  endpoint->Recv(/*tag=*/4, absl::MakeSpan(hello), greeted.Callback());
  ASSERT_THAT(greeted.Wait(), IsOkAndHolds(2u));

  // Pending work: a receive nobody will answer and a large send the peer never matches.
  std::vector<uint8_t> in(64);
  RecvResult pending_recv;
  endpoint->Recv(/*tag=*/9, absl::MakeSpan(in), pending_recv.Callback());
  const std::vector<uint8_t> big = testing::Pattern(8 << 20, 1);
  SendResult pending_send;
  endpoint->Send(/*tag=*/9, big, {}, pending_send.Callback());

  peer->Kill(SIGKILL);
  // The bound is the peer timeout plus slack for a loaded machine; a hang fails here.
  const absl::Duration bound = options.peer_timeout * 3 + absl::Seconds(30);
  // The message says the peer is lost (not just UCX's "Endpoint timeout").
  EXPECT_THAT(pending_recv.Wait(bound),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("is lost")));
  EXPECT_THAT(pending_send.Wait(bound), StatusIs(absl::StatusCode::kUnavailable));
  SendResult after;
  endpoint->Send(1, {}, {}, after.Callback());
  EXPECT_THAT(after.Wait(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("lost")));
}

}  // namespace
}  // namespace lbcc::transport
