// The job secret, the handshake, sealed chunks, and authenticated links over both backends:
// members connect and their chunks are sealed; impostors (wrong or no secret) and replayed
// handshakes are refused while the job goes on; a byte flipped on a socket between two Links is
// DataLoss naming the peer, and so is one flipped in a credit or heartbeat; the secret never
// reaches the log.
#include "transport/secure.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/executor.h"
#include "transport/link_setup.h"
#include "transport/link.h"
#include "transport/loopback.h"
#include "transport/options.h"
#include "transport/test_util.h"
#include "transport/ucx_transport.h"

namespace lbcc::transport {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::StatusIs;
using ::lbcc::transport::testing::kWait;
using ::lbcc::transport::testing::Pattern;
using ::lbcc::transport::testing::RecvResult;
using ::lbcc::transport::testing::SendResult;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kHex[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

JobSecret Secret(const char* hex = kHex) { return *JobSecret::FromHex(hex); }

HandshakeTranscript Transcript() {
  HandshakeTranscript t;
  t.job_id = "job";
  t.link_id = 7;
  t.client_identity = 1;
  t.server_identity = 2;
  t.client_nonce = NewNonce();
  t.server_nonce = NewNonce();
  return t;
}

// ---------------------------------------------------------------------------------------------
// Secret.

TEST(JobSecretTest, HexAndFileFormsAndErrorsNeverQuoteTheText) {
  EXPECT_EQ(Secret().ToHex(), kHex);
  EXPECT_EQ(Secret(" 00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff\n").ToHex(),
            kHex);
  absl::StatusOr<JobSecret> short_secret = JobSecret::FromHex("abcdef0123");
  EXPECT_THAT(short_secret, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(short_secret.status().message()), Not(HasSubstr("abcdef0123")));
  std::string bad(kHex);
  bad[5] = 'z';
  absl::StatusOr<JobSecret> not_hex = JobSecret::FromHex(bad);
  EXPECT_THAT(not_hex, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(not_hex.status().message()), Not(HasSubstr(bad)));

  const std::string path = ::testing::TempDir() + "/secret.bin";
  const JobSecret random = JobSecret::Random();
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  std::fwrite(random.bytes().data(), 1, random.bytes().size(), file);
  std::fclose(file);
  EXPECT_THAT(JobSecret::FromFile(path).value().ToHex(), random.ToHex());
  EXPECT_THAT(JobSecret::FromFile(path + ".missing"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot read")));
}

TEST(JobSecretTest, EncryptModesAndTheStrongerRequestWins) {
  EXPECT_THAT(ParseEncryptMode("SLOW"), IsOkAndHolds(EncryptMode::kSlow));
  EXPECT_THAT(ParseEncryptMode("some"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(EncryptLink(EncryptMode::kNone, EncryptMode::kNone, true));
  EXPECT_TRUE(EncryptLink(EncryptMode::kNone, EncryptMode::kSlow, true));
  EXPECT_FALSE(EncryptLink(EncryptMode::kNone, EncryptMode::kSlow, false));
  EXPECT_TRUE(EncryptLink(EncryptMode::kAll, EncryptMode::kNone, false));
}

// ---------------------------------------------------------------------------------------------
// Handshake MACs and the channel.

TEST(HandshakeTest, ProofsDependOnEverythingBoundAndOnTheRole) {
  const HandshakeTranscript t = Transcript();
  const Mac server = HandshakeMac(Secret(), t, HandshakeRole::kServer);
  EXPECT_TRUE(MacEqual(server, HandshakeMac(Secret(), t, HandshakeRole::kServer)));
  EXPECT_FALSE(MacEqual(server, HandshakeMac(Secret(), t, HandshakeRole::kClient)));
  EXPECT_FALSE(MacEqual(server, HandshakeMac(JobSecret::Random(), t, HandshakeRole::kServer)));
  auto changed = [&](auto change) {
    HandshakeTranscript other = t;
    change(other);
    return !MacEqual(server, HandshakeMac(Secret(), other, HandshakeRole::kServer));
  };
  EXPECT_TRUE(changed([](HandshakeTranscript& o) { o.job_id = "other job"; }));
  EXPECT_TRUE(changed([](HandshakeTranscript& o) { o.link_id = 8; }));
  EXPECT_TRUE(changed([](HandshakeTranscript& o) { o.client_identity = 3; }));
  EXPECT_TRUE(changed([](HandshakeTranscript& o) { o.server_identity = 3; }));
  EXPECT_TRUE(changed([](HandshakeTranscript& o) { o.client_nonce[0] ^= 1; }));
  EXPECT_TRUE(changed([](HandshakeTranscript& o) { o.server_nonce[15] ^= 1; }));
  EXPECT_TRUE(changed([](HandshakeTranscript& o) { o.server_flags = 5; }));
}

// A thread may still be drawing nonces and computing proofs when the process exits (an elastic
// epoch's set-up outliving the group's exit wait): OpenSSL must still be there for it, not torn
// down by its own exit handler (that crashed in RAND_bytes, CRYPTO_THREAD_write_lock).
TEST(SecureExitTest, AThreadStillInTheHandshakesCryptographyAtExitDoesNotCrashTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // A fresh process: OpenSSL not used yet.
  EXPECT_EXIT(
      {
        std::atomic<int> rounds{0};
        std::thread([&rounds] {
          const JobSecret secret = Secret();
          for (;;) {
            const HandshakeTranscript t = Transcript();
            if (MacEqual(HandshakeMac(secret, t, HandshakeRole::kServer),
                         HandshakeMac(secret, t, HandshakeRole::kClient))) {
              std::_Exit(3);  // The roles' proofs must differ.
            }
            rounds.fetch_add(1, std::memory_order_release);
          }
        }).detach();
        while (rounds.load(std::memory_order_acquire) < 100) std::this_thread::yield();
        std::fprintf(stderr, "exiting with the thread inside OpenSSL\n");
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "exiting with the thread inside OpenSSL");
}

class ChannelTest : public ::testing::TestWithParam<bool> {};

TEST_P(ChannelTest, SealedChunksOpenOnceAndAFlippedBitIsDataLossNamingThePeer) {
  const bool encrypt = GetParam();
  const HandshakeTranscript t = Transcript();
  auto client = *SecureChannel::Create(Secret(), t, HandshakeRole::kClient, encrypt, "client");
  auto server = *SecureChannel::Create(Secret(), t, HandshakeRole::kServer, encrypt, "peer-A");
  const std::vector<uint8_t> data = Pattern(100000, 1);
  const uint8_t aad[4] = {1, 2, 3, 4};
  std::vector<uint8_t> sealed(data.size() + SecureChannel::kOverhead);
  ASSERT_THAT(client->Seal(aad, data.data(), data.size(), sealed.data()), IsOk());
  // Confidentiality only when asked for.
  EXPECT_EQ(std::memcmp(sealed.data() + 8, data.data(), 1000) == 0, !encrypt);

  std::vector<uint8_t> out(data.size());
  std::vector<uint8_t> flipped = sealed;
  flipped[8 + 5000] ^= 0x10;
  EXPECT_THAT(server->Open(aad, encrypt, flipped.data(), flipped.size(), out.data()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("peer-A")));
  const uint8_t other_aad[4] = {1, 2, 3, 5};
  EXPECT_THAT(server->Open(other_aad, encrypt, sealed.data(), sealed.size(), out.data()),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(server->Open(aad, !encrypt, sealed.data(), sealed.size(), out.data()),
              StatusIs(absl::StatusCode::kDataLoss));
  // The direction matters: the client's own keys do not open what it sent.
  EXPECT_THAT(client->Open(aad, encrypt, sealed.data(), sealed.size(), out.data()),
              StatusIs(absl::StatusCode::kDataLoss));
  ASSERT_THAT(server->Open(aad, encrypt, sealed.data(), sealed.size(), out.data()), IsOk());
  EXPECT_EQ(out, data);
  // A replayed chunk (same counter) is refused.
  EXPECT_THAT(server->Open(aad, encrypt, sealed.data(), sealed.size(), out.data()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("replayed")));
  // Counters out of order are fine, each once.
  std::vector<std::vector<uint8_t>> later(3, std::vector<uint8_t>(10 + SecureChannel::kOverhead));
  for (auto& s : later) ASSERT_THAT(client->Seal(aad, data.data(), 10, s.data()), IsOk());
  for (int i : {2, 0, 1}) {
    EXPECT_THAT(server->Open(aad, encrypt, later[i].data(), later[i].size(), out.data()), IsOk());
  }
  EXPECT_THAT(server->Open(aad, encrypt, later[0].data(), later[0].size(), out.data()),
              StatusIs(absl::StatusCode::kDataLoss));
}

INSTANTIATE_TEST_SUITE_P(Modes, ChannelTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "encrypted" : "authenticated"; });

// ---------------------------------------------------------------------------------------------
// Socket handshake (bootstrap root, membership service).

struct SocketPair {
  SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0); }
  ~SocketPair() {
    close(fd[0]);
    close(fd[1]);
  }
  int fd[2];
};

absl::StatusOr<uint64_t> RunServer(int fd, const JobSecret& secret) {
  return AuthenticateSocket(fd, HandshakeRole::kServer, secret, "job", 100, absl::Now() + kWait,
                            "client-peer");
}

TEST(SocketHandshakeTest, MembersLearnEachOthersIdentityAndImpostorsAreRefused) {
  {
    SocketPair p;
    absl::StatusOr<uint64_t> server;
    std::thread t([&] { server = RunServer(p.fd[1], Secret()); });
    EXPECT_THAT(AuthenticateSocket(p.fd[0], HandshakeRole::kClient, Secret(), "job", 7,
                                   absl::Now() + kWait, "server-peer"),
                IsOkAndHolds(100));
    t.join();
    EXPECT_THAT(server, IsOkAndHolds(7));
  }
  const SecurityCounters before = GetSecurityCounters();
  {
    SocketPair p;
    absl::StatusOr<uint64_t> server;
    std::thread t([&] { server = RunServer(p.fd[1], Secret()); });
    // The impostor sees the server's proof fail and gives up; the server sees it leave.
    EXPECT_THAT(AuthenticateSocket(p.fd[0], HandshakeRole::kClient, JobSecret::Random(), "job",
                                   7, absl::Now() + kWait, "server-peer"),
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("server-peer")));
    shutdown(p.fd[0], SHUT_RDWR);
    t.join();
    EXPECT_THAT(server, Not(IsOk()));
  }
  {
    // Another job (same secret, other job id) is refused too.
    SocketPair p;
    absl::StatusOr<uint64_t> server;
    std::thread t([&] { server = RunServer(p.fd[1], Secret()); });
    EXPECT_THAT(AuthenticateSocket(p.fd[0], HandshakeRole::kClient, Secret(), "other job", 7,
                                   absl::Now() + kWait, "server-peer"),
                StatusIs(absl::StatusCode::kPermissionDenied));
    shutdown(p.fd[0], SHUT_RDWR);
    t.join();
  }
  {
    // Bytes that are not a handshake (an old client's bootstrap hello).
    SocketPair p;
    absl::StatusOr<uint64_t> server;
    std::thread t([&] { server = RunServer(p.fd[1], Secret()); });
    const std::string junk(kAuthHelloBytes, 'x');
    ASSERT_EQ(write(p.fd[0], junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
    t.join();
    EXPECT_THAT(server, StatusIs(absl::StatusCode::kDataLoss));
  }
  EXPECT_GE(GetSecurityCounters().handshakes_refused, before.handshakes_refused + 2);
}

TEST(SocketHandshakeTest, AReplayedHandshakeIsRefused) {
  // A recording proxy between a member and the server keeps what the member sent...
  std::string recorded;
  {
    SocketPair member_side, server_side;
    absl::StatusOr<uint64_t> server;
    std::thread t([&] { server = RunServer(server_side.fd[1], Secret()); });
    std::thread proxy([&] {
      // member -> server: hello then proof; server -> member: the answer.
      char hello[kAuthHelloBytes], answer[kAuthAnswerBytes], proof[kAuthProofBytes];
      ASSERT_EQ(read(member_side.fd[1], hello, sizeof(hello)), ssize_t{sizeof(hello)});
      ASSERT_EQ(write(server_side.fd[0], hello, sizeof(hello)), ssize_t{sizeof(hello)});
      ASSERT_EQ(read(server_side.fd[0], answer, sizeof(answer)), ssize_t{sizeof(answer)});
      ASSERT_EQ(write(member_side.fd[1], answer, sizeof(answer)), ssize_t{sizeof(answer)});
      ASSERT_EQ(read(member_side.fd[1], proof, sizeof(proof)), ssize_t{sizeof(proof)});
      ASSERT_EQ(write(server_side.fd[0], proof, sizeof(proof)), ssize_t{sizeof(proof)});
      recorded.assign(hello, sizeof(hello));
      recorded.append(proof, sizeof(proof));
    });
    EXPECT_THAT(AuthenticateSocket(member_side.fd[0], HandshakeRole::kClient, Secret(), "job", 7,
                                   absl::Now() + kWait, "server"),
                IsOk());
    proxy.join();
    t.join();
    ASSERT_THAT(server, IsOk());
  }
  // ...and replays it to a new session: the server's nonce is new, so the old proof fails.
  SocketPair p;
  absl::StatusOr<uint64_t> server;
  std::thread t([&] { server = RunServer(p.fd[1], Secret()); });
  ASSERT_EQ(write(p.fd[0], recorded.data(), recorded.size()),
            static_cast<ssize_t>(recorded.size()));
  t.join();
  EXPECT_THAT(server, StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(AuthFrameTest, ParsesOnlyWellFormedFramesOfTheKindExpected) {
  AuthFrame frame;
  frame.kind = 2;
  frame.identity = 42;
  frame.nonce = NewNonce();
  frame.mac[3] = 9;
  const std::string bytes = EncodeAuthFrame(frame);
  ASSERT_EQ(bytes.size(), kAuthAnswerBytes);
  auto span = absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  absl::StatusOr<AuthFrame> parsed = ParseAuthFrame(span, 2);
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->identity, 42u);
  EXPECT_EQ(parsed->nonce, frame.nonce);
  EXPECT_EQ(parsed->mac, frame.mac);
  EXPECT_THAT(ParseAuthFrame(span, 1), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(ParseAuthFrame(span.subspan(1), 2), StatusIs(absl::StatusCode::kDataLoss));
  std::string bad = bytes;
  bad[0] = 'X';
  EXPECT_THAT(ParseAuthFrame(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bad.data()),
                                                 bad.size()),
                             2),
              StatusIs(absl::StatusCode::kDataLoss));
}

// ---------------------------------------------------------------------------------------------
// The link handshake, message by message (LinkSetup): what a hostile client can send.

TransportOptions WithSecret(std::optional<JobSecret> secret, uint64_t identity) {
  TransportOptions options;
  options.security.secret = secret;
  options.security.identity = identity;
  return options;
}

// A member's HELLO and AUTH against `server`; returns them (for replaying).
std::vector<ControlHeader> MemberHandshake(LinkSetup& server, ProbeScratch& scratch) {
  LinkSetup client(LinkSetup::Role::kClient, WithSecret(Secret(), 1), "server", HostPort{"s", 1});
  std::vector<ControlHeader> sent;
  sent.push_back(client.Hello(42, 0).header);
  LinkSetup::Step welcome = server.OnControl(sent.back(), scratch);
  EXPECT_TRUE(welcome.admit);
  EXPECT_FALSE(welcome.refuse);
  client.OnControl(welcome.reply->header, scratch);
  EXPECT_THAT(client.AwaitWelcomes(1, absl::Now() + kWait), IsOk());
  // Negotiate sends AUTH first; capture it with a wire that records.
  struct Recorder : SetupWire {
    void Send(ControlMessage message) override { messages.push_back(message.header); }
    std::vector<ControlHeader> messages;
  } wire;
  ConnectOptions fast;
  fast.has_link_class = true;
  fast.link_class = LinkClass::kFast;
  EXPECT_THAT(client.Negotiate(wire, fast, absl::Now() + kWait, /*measure=*/false), IsOk());
  EXPECT_FALSE(wire.messages.empty());
  sent.push_back(wire.messages.at(0));
  EXPECT_EQ(sent.back().type, static_cast<uint32_t>(Ctl::kAuth));
  return sent;
}

TEST(LinkHandshakeTest, AForgedProofIsRefusedAndNothingIsAnsweredBeforeAProof) {
  ProbeScratch scratch;
  LinkSetup server(LinkSetup::Role::kServer, WithSecret(Secret(), 2), "client", HostPort{"c", 0});
  // An impostor (another secret) ignores the server's proof and sends its own anyway.
  LinkSetup impostor(LinkSetup::Role::kClient, WithSecret(JobSecret::Random(), 1), "server",
                     HostPort{"s", 1});
  LinkSetup::Step welcome = server.OnControl(impostor.Hello(42, 0).header, scratch);
  ASSERT_TRUE(welcome.reply.has_value());
  // Before a proof, nothing but the handshake is answered: a PING or READY is refused.
  ControlHeader ping{};
  ping.type = static_cast<uint32_t>(Ctl::kPing);
  EXPECT_TRUE(server.OnControl(ping, scratch).refuse);
  ControlHeader forged{};
  forged.type = static_cast<uint32_t>(Ctl::kAuth);
  forged.a = 0x1234;
  forged.b = 0x5678;
  EXPECT_TRUE(server.OnControl(forged, scratch).refuse);
  ControlMessage ready = LinkSetup::Ready(42, LinkParams{});
  LinkSetup::Step step = server.OnControl(ready.header, scratch);
  EXPECT_TRUE(step.refuse);
  EXPECT_FALSE(step.ready.has_value());
}

TEST(LinkHandshakeTest, AReplayedLinkHandshakeIsRefused) {
  ProbeScratch scratch;
  LinkSetup first(LinkSetup::Role::kServer, WithSecret(Secret(), 2), "client", HostPort{"c", 0});
  const std::vector<ControlHeader> recorded = MemberHandshake(first, scratch);
  EXPECT_FALSE(first.OnControl(recorded[1], scratch).refuse);  // The member's own AUTH passes.
  // A second HELLO for the authenticated link is refused.
  EXPECT_TRUE(first.OnControl(recorded[0], scratch).refuse);
  // Replayed to a fresh server, HELLO gets a new nonce and the old AUTH fails.
  LinkSetup second(LinkSetup::Role::kServer, WithSecret(Secret(), 2), "client", HostPort{"c", 0});
  EXPECT_TRUE(second.OnControl(recorded[0], scratch).admit);
  EXPECT_TRUE(second.OnControl(recorded[1], scratch).refuse);
  ControlMessage ready = LinkSetup::Ready(42, LinkParams{});
  EXPECT_FALSE(second.OnControl(ready.header, scratch).ready.has_value());
}

// ---------------------------------------------------------------------------------------------
// Authenticated links over both backends.

enum class Backend { kLoopback, kUcx };

TransportOptions Options(Backend backend, std::optional<JobSecret> secret,
                         EncryptMode encrypt = EncryptMode::kSlow) {
  TransportOptions options;
  if (backend == Backend::kUcx) {
    options.ucx_tls = "tcp";
    options.ucx_net_devices = "lo";
    options.peer_timeout = absl::Seconds(5);
    options.link_class = LinkClass::kFast;  // No probe: quick connects.
  }
  options.security.secret = secret;
  options.security.encrypt = encrypt;
  options.security.identity = secret.has_value() ? 11 : 0;
  return options;
}

std::unique_ptr<Transport> Make(Backend backend, const TransportOptions& options) {
  if (backend == Backend::kLoopback) return NewLoopbackTransport(options);
  absl::StatusOr<std::unique_ptr<Transport>> transport = NewUcxTransport(options);
  EXPECT_THAT(transport, IsOk());
  return transport.ok() ? *std::move(transport) : nullptr;
}

std::string ListenAddress(Backend backend) {
  static std::atomic<int> n{0};
  return backend == Backend::kLoopback ? absl::StrCat("secure-", n++) : "127.0.0.1:0";
}

// Sends `size` bytes a -> b and back, and checks they arrive intact.
void RoundTrip(Endpoint& a, Endpoint& b, size_t size) {
  for (int direction = 0; direction < 2; ++direction) {
    Endpoint& from = direction == 0 ? a : b;
    Endpoint& to = direction == 0 ? b : a;
    const std::vector<uint8_t> data = Pattern(size, direction + 1);
    std::vector<uint8_t> got(size);
    SendResult sent;
    RecvResult received;
    to.Recv(3, absl::MakeSpan(got), received.Callback());
    from.Send(3, data, {}, sent.Callback());
    EXPECT_THAT(sent.Wait(), IsOk());
    EXPECT_THAT(received.Wait(), IsOkAndHolds(size));
    EXPECT_EQ(got, data);
  }
}

// A server transport listening, a client transport, and the link between them once the
// client connected and the server accepted (a: the client's end, b: the server's).
struct TransportPair {
  std::unique_ptr<Transport> server;
  std::unique_ptr<Transport> client;
  std::string address;
  std::unique_ptr<Endpoint> a;
  std::unique_ptr<Endpoint> b;
};

// Makes the server of `backend` and listens on a fresh address.
absl::StatusOr<TransportPair> Listening(Backend backend, const TransportOptions& server_options) {
  TransportPair pair;
  pair.server = Make(backend, server_options);
  if (pair.server == nullptr) return absl::InternalError("no server transport");
  LBCC_ASSIGN_OR_RETURN(pair.address, pair.server->Listen(ListenAddress(backend)));
  return pair;
}

// Makes the client, connects it to the pair's server and accepts the link there.
absl::Status Join(Backend backend, const TransportOptions& client_options, TransportPair& pair) {
  pair.client = Make(backend, client_options);
  if (pair.client == nullptr) return absl::InternalError("no client transport");
  LBCC_ASSIGN_OR_RETURN(pair.a, pair.client->Connect(pair.address, kWait, {}));
  LBCC_ASSIGN_OR_RETURN(pair.b, pair.server->Accept(kWait));
  return absl::OkStatus();
}

// Listening, then Join.
absl::StatusOr<TransportPair> Connected(Backend backend, const TransportOptions& server_options,
                                        const TransportOptions& client_options) {
  LBCC_ASSIGN_OR_RETURN(TransportPair pair, Listening(backend, server_options));
  LBCC_RETURN_IF_ERROR(Join(backend, client_options, pair));
  return pair;
}

class SecureLinkTest : public ::testing::TestWithParam<Backend> {};

TEST_P(SecureLinkTest, MembersConnectAndEveryChunkIsSealedEncryptedAsAsked) {
  for (EncryptMode mode : {EncryptMode::kSlow, EncryptMode::kAll}) {
    SCOPED_TRACE(EncryptModeName(mode));
    LBCC_ASSERT_OK_AND_ASSIGN(TransportPair pair,
                              Connected(GetParam(), Options(GetParam(), Secret(), mode),
                                        Options(GetParam(), Secret())));
    std::unique_ptr<Endpoint>& a = pair.a;
    std::unique_ptr<Endpoint>& b = pair.b;
    RoundTrip(*a, *b, 3 << 20);
    RoundTrip(*a, *b, 0);
    // A fast link: encrypted only when either end asks for all links.
    const bool encrypted = mode == EncryptMode::kAll;
    EXPECT_TRUE(a->counters().authenticated);
    EXPECT_TRUE(b->counters().authenticated);
    EXPECT_EQ(a->counters().encrypted, encrypted);
    EXPECT_EQ(b->counters().encrypted, encrypted);
    EXPECT_EQ(a->counters().integrity_failures, 0u);
  }
}

TEST_P(SecureLinkTest, QueuedMessagesOfAFastLinkArriveIntactInChunksOfOneToFourMiB) {
  // Many messages queued at once: chunks grow from kSealedChunkBytes towards
  // kMaxSealedChunkBytes as sealed bytes queue up (how far depends on timing), never beyond.
  for (EncryptMode mode : {EncryptMode::kNone, EncryptMode::kAll}) {
    SCOPED_TRACE(EncryptModeName(mode));
    LBCC_ASSERT_OK_AND_ASSIGN(TransportPair pair,
                              Connected(GetParam(), Options(GetParam(), Secret(), mode),
                                        Options(GetParam(), Secret(), mode)));
    std::unique_ptr<Endpoint>& a = pair.a;
    std::unique_ptr<Endpoint>& b = pair.b;
    constexpr int kMessages = 8;
    constexpr size_t kSize = (6 << 20) + 5;
    std::vector<std::vector<uint8_t>> data, got;
    std::vector<SendResult> sent(kMessages);
    std::vector<RecvResult> received(kMessages);
    for (int i = 0; i < kMessages; ++i) {
      data.push_back(Pattern(kSize, i + 1));
      got.emplace_back(kSize);
      b->Recv(5, absl::MakeSpan(got[i]), received[i].Callback());
    }
    for (int i = 0; i < kMessages; ++i) a->Send(5, data[i], {}, sent[i].Callback());
    for (int i = 0; i < kMessages; ++i) {
      EXPECT_THAT(sent[i].Wait(), IsOk());
      EXPECT_THAT(received[i].Wait(), IsOkAndHolds(kSize));
      EXPECT_EQ(got[i], data[i]) << "message " << i;
    }
    // Each message: at least ceil(kSize / 4 MiB) = 2 chunks, at most ceil(kSize / 1 MiB) = 7.
    EXPECT_GE(a->counters().chunks_sent, uint64_t{kMessages} * 2);
    EXPECT_LE(a->counters().chunks_sent, uint64_t{kMessages} * 7);
    EXPECT_EQ(b->counters().chunks_received, a->counters().chunks_sent);
    // Once they are sent nothing is queued: a lone message goes in 1 MiB chunks again (its own
    // first 6 MiB never reach the 8 MiB queued that a 2 MiB chunk takes).
    const uint64_t before = a->counters().chunks_sent;
    std::vector<uint8_t> alone(kSize);
    SendResult alone_sent;
    RecvResult alone_received;
    b->Recv(6, absl::MakeSpan(alone), alone_received.Callback());
    a->Send(6, data[0], {}, alone_sent.Callback());
    EXPECT_THAT(alone_sent.Wait(), IsOk());
    EXPECT_THAT(alone_received.Wait(), IsOkAndHolds(kSize));
    EXPECT_EQ(alone, data[0]);
    EXPECT_EQ(a->counters().chunks_sent - before, 7u);
    EXPECT_EQ(b->counters().integrity_failures, 0u);
  }
}

TEST_P(SecureLinkTest, ClosingAFastLinkWithChunksHeldBackCompletesEverySend) {
  // More than kMaxSealAheadBytes queued: chunks wait unsealed; a Close must still complete
  // every send (sent, or Cancelled), exactly once.
  const TransportOptions options = Options(GetParam(), Secret(), EncryptMode::kAll);
  LBCC_ASSERT_OK_AND_ASSIGN(TransportPair pair, Connected(GetParam(), options, options));
  std::unique_ptr<Endpoint>& a = pair.a;
  constexpr int kMessages = 8;
  const std::vector<uint8_t> data = Pattern(6 << 20, 9);
  std::vector<SendResult> sent(kMessages);
  for (int i = 0; i < kMessages; ++i) a->Send(7, data, {}, sent[i].Callback());
  a->Close();
  for (int i = 0; i < kMessages; ++i) {
    const absl::Status status = sent[i].Wait();
    EXPECT_TRUE(status.ok() || status.code() == absl::StatusCode::kCancelled)
        << "message " << i << ": " << status;
    EXPECT_EQ(sent[i].calls(), 1) << "message " << i;
  }
}

TEST_P(SecureLinkTest, SlowStripedLinksAuthenticateEveryConnection) {
  TransportOptions options = Options(GetParam(), Secret());
  options.link_class = LinkClass::kSlow;
  options.scheduler.stripes = 3;
  options.scheduler.chunk_bytes = 64 << 10;
  LBCC_ASSERT_OK_AND_ASSIGN(TransportPair pair, Connected(GetParam(), options, options));
  std::unique_ptr<Endpoint>& a = pair.a;
  std::unique_ptr<Endpoint>& b = pair.b;
  EXPECT_EQ(a->counters().stripes, 3);
  RoundTrip(*a, *b, 1 << 20);
  EXPECT_TRUE(a->counters().encrypted);  // A slow link under the default mode.
  EXPECT_TRUE(b->counters().encrypted);
}

TEST_P(SecureLinkTest, ImpostorsAreRefusedAndTheJobGoesOn) {
  LBCC_ASSERT_OK_AND_ASSIGN(TransportPair pair,
                            Listening(GetParam(), Options(GetParam(), Secret())));
  const std::string& address = pair.address;
  const SecurityCounters before = GetSecurityCounters();

  auto wrong = Make(GetParam(), Options(GetParam(), JobSecret::Random()));
  EXPECT_THAT(wrong->Connect(address, absl::Seconds(20), {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("secret")));
  auto none = Make(GetParam(), Options(GetParam(), std::nullopt));
  EXPECT_THAT(none->Connect(address, absl::Seconds(20), {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("requires a job secret")));
  EXPECT_GE(GetSecurityCounters().handshakes_refused, before.handshakes_refused + 2);

  // The member that comes next is the one Accept returns, and its link works.
  LBCC_ASSERT_OK(Join(GetParam(), Options(GetParam(), Secret()), pair));
  RoundTrip(*pair.a, *pair.b, 100000);
  EXPECT_THAT(pair.server->Accept(absl::Milliseconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));  // No impostor was accepted.
}

TEST_P(SecureLinkTest, AMemberRefusesAListenerWithoutTheSecret) {
  auto server = Make(GetParam(), Options(GetParam(), std::nullopt));
  LBCC_ASSERT_OK_AND_ASSIGN(std::string address, server->Listen(ListenAddress(GetParam())));
  auto member = Make(GetParam(), Options(GetParam(), Secret()));
  EXPECT_THAT(member->Connect(address, absl::Seconds(20), {}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("does not authenticate")));
}

INSTANTIATE_TEST_SUITE_P(Backends, SecureLinkTest,
                         ::testing::Values(Backend::kLoopback, Backend::kUcx),
                         [](const auto& info) {
                           return info.param == Backend::kUcx ? "ucx" : "loopback";
                         });

// ---------------------------------------------------------------------------------------------
// A byte flipped on a real socket between two Links.

// A Lane that writes each chunk (header, then bytes) to a socket; a reader thread on the other
// end hands them to its Link. Completions run on the lane's own thread, never inline.
class SocketLane final : public Lane {
 public:
  explicit SocketLane(int fd) : fd_(fd), executor_(std::make_shared<Executor>("lane")) {}
  void SendChunk(const ChunkHeader& header, const uint8_t* data, size_t length,
                 DoneCallback done) override {
    executor_->Post([this, header, data, length, done = std::move(done)]() mutable {
      bool ok = write(fd_, &header, sizeof(header)) == sizeof(header);
      for (size_t sent = 0; ok && sent < length;) {
        const ssize_t n = write(fd_, data + sent, length - sent);
        ok = n > 0;
        sent += ok ? static_cast<size_t>(n) : 0;
      }
      done(ok ? absl::OkStatus() : absl::UnavailableError("socket lane write failed"));
    });
  }
  void SendCredit(uint64_t, uint8_t) override {}
  void Close() override {}

 private:
  const int fd_;
  std::shared_ptr<Executor> executor_;
};

bool ReadFull(int fd, void* into, size_t size) {
  auto* p = static_cast<uint8_t*>(into);
  while (size > 0) {
    const ssize_t n = read(fd, p, size);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// A sender Link ("peer-B") and a receiver Link ("peer-A") with sealed chunks (`encrypt`, else
// integrity-only) over two socket pairs: the sender writes to_proxy.fd[0], the receiver's lane
// is from_proxy.fd[1]; the test puts a proxy and a reader between them.
struct ProxiedLinks {
  explicit ProxiedLinks(bool encrypt) {
    const HandshakeTranscript t = Transcript();
    auto executor = std::make_shared<Executor>("callbacks");
    sender = std::make_shared<Link>(executor, "peer-B");
    receiver = std::make_shared<Link>(executor, "peer-A");
    sender->AddLane(std::make_shared<SocketLane>(to_proxy.fd[0]));
    receiver->AddLane(std::make_shared<SocketLane>(from_proxy.fd[1]));  // Unused direction.
    sender->Configure(
        LinkClass::kFast, {}, 1 << 20, {},
        *SecureChannel::Create(Secret(), t, HandshakeRole::kClient, encrypt, "peer-B"));
    receiver->Configure(
        LinkClass::kFast, {}, 1 << 20, {},
        *SecureChannel::Create(Secret(), t, HandshakeRole::kServer, encrypt, "peer-A"));
  }
  SocketPair to_proxy, from_proxy;
  std::shared_ptr<Link> sender, receiver;
};

TEST(SecureWireTest, AByteFlippedByAProxyOnTheSocketIsDataLossNeverAWrongResult) {
  // sender Link -> lane socket -> proxy (flips one byte) -> socket -> reader -> receiver Link.
  ProxiedLinks links(/*encrypt=*/true);
  SocketPair& to_proxy = links.to_proxy;
  SocketPair& from_proxy = links.from_proxy;
  const std::shared_ptr<Link>& sender = links.sender;
  const std::shared_ptr<Link>& receiver = links.receiver;
  constexpr size_t kSize = 3 << 20;  // Three chunks; the second gets the flip.
  constexpr size_t kFlipAt = sizeof(ChunkHeader) + (1 << 20) + SecureChannel::kOverhead +
                             sizeof(ChunkHeader) + 8 + 12345;
  std::thread proxy([&] {
    std::vector<uint8_t> buffer(65536);
    size_t at = 0;
    while (true) {
      const ssize_t n = read(to_proxy.fd[1], buffer.data(), buffer.size());
      if (n <= 0) break;
      if (at <= kFlipAt && kFlipAt < at + n) buffer[kFlipAt - at] ^= 0x01;
      at += n;
      if (write(from_proxy.fd[0], buffer.data(), n) != n) break;
    }
    shutdown(from_proxy.fd[0], SHUT_WR);
  });
  std::thread reader([&] {
    ChunkHeader h;
    while (ReadFull(from_proxy.fd[1], &h, sizeof(h))) {
      std::vector<uint8_t> bytes(h.length);
      if (!ReadFull(from_proxy.fd[1], bytes.data(), bytes.size())) break;
      receiver->OnChunk(0, h, bytes.data(), nullptr);
    }
  });

  const std::vector<uint8_t> data = Pattern(kSize, 9);
  std::vector<uint8_t> got(kSize);
  SendResult sent;
  RecvResult received;
  receiver->Recv(1, absl::MakeSpan(got), received.Callback());
  sender->Send(1, data, {}, sent.Callback());
  EXPECT_THAT(sent.Wait(), IsOk());
  EXPECT_THAT(received.Wait(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("peer-A")));
  EXPECT_EQ(receiver->counters().integrity_failures, 1u);
  shutdown(to_proxy.fd[0], SHUT_WR);
  proxy.join();
  reader.join();
  sender->Close();
  receiver->Close();
}

// Sealed chunks are the segments of a message: each its own AEAD record (counter, tag) bound to
// the link's key and, by its header as associated data, to the message, its offset and length.
// A proxy that has the whole message's chunks in hand rearranges them before the receiver sees
// any: what arrives is either the message, intact, or DataLoss naming the peer.
struct WireChunk {
  ChunkHeader header;
  std::vector<uint8_t> bytes;
};
using Rearrange = std::function<void(std::vector<WireChunk>&)>;

// Sends a `chunks`-chunk message through a proxy that applies `rearrange` to its chunks (sorted
// by offset); returns what the receive ended with, and the bytes in `got`.
// `late_recv`: the receive is posted only once every chunk arrived (they wait, staged, unopened).
absl::StatusOr<size_t> ThroughProxy(int chunks, bool encrypt, const Rearrange& rearrange,
                                    std::vector<uint8_t>* got, bool late_recv = false) {
  ProxiedLinks links(encrypt);
  SocketPair& to_proxy = links.to_proxy;
  SocketPair& from_proxy = links.from_proxy;
  const std::shared_ptr<Link>& sender = links.sender;
  const std::shared_ptr<Link>& receiver = links.receiver;
  std::thread proxy([&] {
    std::vector<WireChunk> message;
    for (int i = 0; i < chunks; ++i) {
      WireChunk chunk;
      if (!ReadFull(to_proxy.fd[1], &chunk.header, sizeof(chunk.header))) break;
      chunk.bytes.resize(chunk.header.length);
      if (!ReadFull(to_proxy.fd[1], chunk.bytes.data(), chunk.bytes.size())) break;
      message.push_back(std::move(chunk));
    }
    std::sort(message.begin(), message.end(), [](const WireChunk& a, const WireChunk& b) {
      return a.header.offset < b.header.offset;
    });
    rearrange(message);
    for (const WireChunk& chunk : message) {
      if (write(from_proxy.fd[0], &chunk.header, sizeof(chunk.header)) != sizeof(chunk.header) ||
          write(from_proxy.fd[0], chunk.bytes.data(), chunk.bytes.size()) !=
              static_cast<ssize_t>(chunk.bytes.size())) {
        break;
      }
    }
    shutdown(from_proxy.fd[0], SHUT_WR);
  });
  std::thread reader([&] {
    ChunkHeader h;
    while (ReadFull(from_proxy.fd[1], &h, sizeof(h))) {
      std::vector<uint8_t> bytes(h.length);
      if (!ReadFull(from_proxy.fd[1], bytes.data(), bytes.size())) break;
      receiver->OnChunk(0, h, bytes.data(), nullptr);
    }
  });
  const size_t size = static_cast<size_t>(chunks) << 20;
  const std::vector<uint8_t> data = Pattern(size, 5);
  got->assign(size, 0);
  SendResult sent;
  RecvResult received;
  if (!late_recv) receiver->Recv(1, absl::MakeSpan(*got), received.Callback());
  sender->Send(1, data, {}, sent.Callback());
  EXPECT_THAT(sent.Wait(), IsOk());
  if (late_recv) {
    const absl::Time deadline = absl::Now() + kWait;
    while (receiver->counters().chunks_received < static_cast<uint64_t>(chunks) &&
           !receiver->failed() && absl::Now() < deadline) {
      std::this_thread::yield();
    }
    receiver->Recv(1, absl::MakeSpan(*got), received.Callback());
  }
  absl::StatusOr<size_t> result = received.Wait();
  if (result.ok()) EXPECT_EQ(*got, data);
  if (!result.ok()) EXPECT_GE(receiver->counters().integrity_failures, 1u);
  proxy.join();
  reader.join();
  sender->Close();
  receiver->Close();
  return result;
}

class SegmentTest : public ::testing::TestWithParam<bool> {};

TEST_P(SegmentTest, ReorderedChunksMakeTheMessage) {
  std::vector<uint8_t> got;
  EXPECT_THAT(ThroughProxy(4, GetParam(),
                           [](std::vector<WireChunk>& m) { std::reverse(m.begin(), m.end()); },
                           &got),
              IsOkAndHolds(4u << 20));
}

TEST_P(SegmentTest, ASwappedReplayedTruncatedOrFlippedChunkIsDataLoss) {
  const std::vector<std::pair<std::string, Rearrange>> attacks = {
      // Chunk 1's sealed bytes under chunk 2's header and the other way round.
      {"swapped", [](std::vector<WireChunk>& m) { std::swap(m[1].bytes, m[2].bytes); }},
      // Chunk 1 dropped, chunk 2 relabelled to fill its place.
      {"dropped and filled", [](std::vector<WireChunk>& m) {
         m[2].header.offset = m[1].header.offset;
         m.erase(m.begin() + 1);
       }},
      // Chunk 1 delivered twice (its copy relabelled as chunk 2, then as itself).
      {"replayed in place of another", [](std::vector<WireChunk>& m) {
         m[2].bytes = m[1].bytes;
       }},
      {"replayed", [](std::vector<WireChunk>& m) { m.insert(m.begin() + 2, m[1]); }},
      // The last chunk dropped and the message relabelled shorter.
      {"message truncated", [](std::vector<WireChunk>& m) {
         m.pop_back();
         for (WireChunk& c : m) c.header.total_size = m.size() << 20;
       }},
      // A chunk cut short (its header's length too), or its tag cut off.
      {"chunk truncated", [](std::vector<WireChunk>& m) {
         m[1].bytes.erase(m[1].bytes.begin() + 8, m[1].bytes.begin() + 8 + 4096);
         m[1].header.length -= 4096;
       }},
      {"tag cut off", [](std::vector<WireChunk>& m) {
         m[1].bytes.resize(m[1].bytes.size() - 16);
         m[1].header.length -= 16;
       }},
      // A bit of the counter, the payload, the tag; the header's priority (associated data).
      {"counter flipped", [](std::vector<WireChunk>& m) { m[1].bytes[0] ^= 1; }},
      {"payload flipped", [](std::vector<WireChunk>& m) { m[3].bytes[100000] ^= 0x80; }},
      {"tag flipped", [](std::vector<WireChunk>& m) { m[0].bytes.back() ^= 1; }},
      {"header flipped", [](std::vector<WireChunk>& m) { m[2].header.priority ^= 1; }},
      // Passed off as a plain chunk (the sealed flag cleared).
      {"unsealed", [](std::vector<WireChunk>& m) {
         m[1].header.flags &= static_cast<uint8_t>(~kChunkSealed);
       }},
  };
  for (const auto& [name, attack] : attacks) {
    SCOPED_TRACE(name);
    std::vector<uint8_t> got;
    EXPECT_THAT(ThroughProxy(4, GetParam(), attack, &got),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("peer-A")));
  }
}

TEST_P(SegmentTest, ChunksThatWaitForTheirReceiveAreOpenedWhenItComes) {
  std::vector<uint8_t> got;
  EXPECT_THAT(ThroughProxy(4, GetParam(), [](std::vector<WireChunk>&) {}, &got,
                           /*late_recv=*/true),
              IsOkAndHolds(4u << 20));
  EXPECT_THAT(ThroughProxy(4, GetParam(),
                           [](std::vector<WireChunk>& m) { m[2].bytes[5000] ^= 1; }, &got,
                           /*late_recv=*/true),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("peer-A")));
  // Nothing unverified reached the buffer: the failed chunk's bytes are zero.
  EXPECT_TRUE(std::all_of(got.begin() + (2 << 20), got.begin() + (3 << 20),
                          [](uint8_t b) { return b == 0; }));
}

INSTANTIATE_TEST_SUITE_P(Modes, SegmentTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "encrypted" : "authenticated"; });

// ---------------------------------------------------------------------------------------------
// Every control message of an authenticated link (credits, heartbeats) carries a tag.

class NullLane final : public Lane {
 public:
  void SendChunk(const ChunkHeader&, const uint8_t*, size_t, DoneCallback done) override {
    done(absl::CancelledError("null lane"));
  }
  void SendCredit(uint64_t, uint8_t) override {}
  void Close() override {}
};

// Two ends of one authenticated link, not connected: the test carries their control messages.
struct LinkPair {
  explicit LinkPair(bool secure = true) {
    const HandshakeTranscript t = Transcript();
    for (auto& link : {a, b}) link->AddLane(std::make_shared<NullLane>());
    a->Configure(LinkClass::kFast, {}, 1 << 20, {},
                 secure ? *SecureChannel::Create(Secret(), t, HandshakeRole::kClient, true, "peer-B")
                        : nullptr);
    b->Configure(LinkClass::kFast, {}, 1 << 20, {},
                 secure ? *SecureChannel::Create(Secret(), t, HandshakeRole::kServer, true, "peer-A")
                        : nullptr);
  }
  ~LinkPair() {
    a->Close();
    b->Close();
    for (auto& receive : pending) (void)receive->Wait();  // Closing ended them.
  }
  // `message` reaches `a` on connection 0: the status a receive pending on `a` then ends with
  // (OK: the link is still up, the receive still pending).
  absl::Status Deliver(const ControlHeader& message) {
    std::vector<uint8_t>& buffer = *buffers.emplace_back(std::make_unique<std::vector<uint8_t>>(16));
    RecvResult& receive = *pending.emplace_back(std::make_unique<RecvResult>());
    a->Recv(99, absl::MakeSpan(buffer), receive.Callback());
    a->OnControl(0, message);
    if (!a->failed()) return absl::OkStatus();
    return receive.Wait().status();
  }
  std::vector<std::unique_ptr<std::vector<uint8_t>>> buffers;
  std::vector<std::unique_ptr<RecvResult>> pending;
  std::shared_ptr<Executor> executor = std::make_shared<Executor>("callbacks");
  std::shared_ptr<Link> a = std::make_shared<Link>(executor, "peer-B");
  std::shared_ptr<Link> b = std::make_shared<Link>(executor, "peer-A");
};

ControlHeader Credit(uint64_t bytes) {
  ControlHeader h{};
  h.type = static_cast<uint32_t>(Ctl::kCredit);
  h.a = bytes;
  h.b = 1;
  return h;
}

TEST(SecureControlTest, CreditsAndHeartbeatsAreTaggedAndVerify) {
  LinkPair pair;
  ControlHeader credit = Credit(4096);
  pair.b->SealControl(0, &credit);
  EXPECT_NE(credit.reserved & kControlSealed, 0u);
  EXPECT_EQ(credit.a, 4096u);
  ControlHeader heartbeat = HeartbeatMessage().header;
  pair.b->SealControl(0, &heartbeat);
  EXPECT_NE(credit.conn_id, heartbeat.conn_id);  // Counters are never reused.
  // Out of order is fine (lanes reorder); each verifies once.
  EXPECT_THAT(pair.Deliver(heartbeat), IsOk());
  EXPECT_THAT(pair.Deliver(credit), IsOk());
  EXPECT_FALSE(pair.a->failed());
  EXPECT_EQ(pair.a->counters().integrity_failures, 0u);
}

TEST(SecureControlTest, AFlippedBitInACreditOrHeartbeatIsDataLossNamingThePeer) {
  // Every byte of the 64-byte header is covered: the type, the lane, the fields, the counter
  // and the tag itself.
  for (const bool heartbeat : {false, true}) {
    for (size_t byte = 0; byte < sizeof(ControlHeader); ++byte) {
      LinkPair pair;
      ControlHeader message = heartbeat ? HeartbeatMessage().header : Credit(1 << 20);
      pair.b->SealControl(0, &message);
      reinterpret_cast<uint8_t*>(&message)[byte] ^= 0x04;
      SCOPED_TRACE(absl::StrCat(heartbeat ? "heartbeat" : "credit", ", byte ", byte));
      if (byte < 4) {
        // The type no longer names a credit or a heartbeat: not a running link's message (the
        // backend treats it as a set-up message, which the set-up refuses).
        continue;
      }
      EXPECT_THAT(pair.Deliver(message),
                  StatusIs(absl::StatusCode::kDataLoss, HasSubstr("peer-B")));
      EXPECT_EQ(pair.a->counters().integrity_failures, 1u);
    }
  }
}

TEST(SecureControlTest, UntaggedAndReplayedControlMessagesAreDataLoss) {
  {
    LinkPair pair;
    EXPECT_THAT(pair.Deliver(Credit(100)),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("untagged credit from peer-B")));
  }
  {
    LinkPair pair;
    EXPECT_THAT(pair.Deliver(HeartbeatMessage().header),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("untagged heartbeat")));
  }
  {
    LinkPair pair;
    ControlHeader credit = Credit(100);
    pair.b->SealControl(0, &credit);
    EXPECT_THAT(pair.Deliver(credit), IsOk());
    EXPECT_THAT(pair.Deliver(credit),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("replayed")));
  }
  {
    // A credit tagged by the other direction's key (reflected back to its sender).
    LinkPair pair;
    ControlHeader credit = Credit(100);
    pair.a->SealControl(0, &credit);
    EXPECT_THAT(pair.Deliver(credit), StatusIs(absl::StatusCode::kDataLoss));
  }
  {
    // Tagged for connection 1, delivered on connection 0.
    LinkPair pair;
    ControlHeader credit = Credit(100);
    pair.b->SealControl(1, &credit);
    EXPECT_THAT(pair.Deliver(credit),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("arrived on 0")));
  }
}

TEST(SecureControlTest, PlainLinksLeaveControlMessagesAsTheyAre) {
  LinkPair pair(/*secure=*/false);
  ControlHeader credit = Credit(100);
  const ControlHeader before = credit;
  pair.b->SealControl(0, &credit);
  EXPECT_EQ(std::memcmp(&credit, &before, sizeof(credit)), 0);
  EXPECT_THAT(pair.Deliver(credit), IsOk());
}

// ---------------------------------------------------------------------------------------------
// The secret never reaches the log.

TEST(SecretLogTest, TraceLogsOfSetUpAndRefusalsNeverContainTheSecret) {
  Mutex mu;
  std::string log;
  SetLogLevel(LogLevel::kTrace);
  SetLogSink([&](LogLevel, absl::string_view, int, absl::string_view message) {
    MutexLock lock(&mu);
    absl::StrAppend(&log, message, "\n");
  });
  const JobSecret secret = JobSecret::Random();
  for (Backend backend : {Backend::kLoopback, Backend::kUcx}) {
    LBCC_ASSERT_OK_AND_ASSIGN(TransportPair pair, Listening(backend, Options(backend, secret)));
    auto impostor = Make(backend, Options(backend, JobSecret::Random()));
    EXPECT_THAT(impostor->Connect(pair.address, absl::Seconds(20), {}), Not(IsOk()));
    LBCC_ASSERT_OK(Join(backend, Options(backend, secret), pair));
    RoundTrip(*pair.a, *pair.b, 1000);
  }
  SetLogSink(nullptr);
  SetLogLevel(LogLevel::kWarn);
  MutexLock lock(&mu);
  EXPECT_THAT(log, HasSubstr("refused connection from"));  // The refusals were logged...
  const std::string hex = secret.ToHex();
  EXPECT_THAT(absl::AsciiStrToLower(log), Not(HasSubstr(hex)));  // ...without the secret,
  EXPECT_THAT(log, Not(HasSubstr(hex.substr(0, 16))));           // or a piece of it.
}

}  // namespace
}  // namespace lbcc::transport
