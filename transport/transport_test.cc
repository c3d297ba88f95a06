// The Endpoint contract, for every backend and link class: data integrity at every size, per-tag
// order with hundreds of messages in flight, callbacks exactly once and never inline, Close() ->
// Cancelled, peer close -> Unavailable, counters. UCX runs over tcp on the loopback device between
// two Transports of this process.
#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/loopback.h"
#include "transport/socket_transport.h"
#include "transport/test_util.h"
#include "transport/transport.h"
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

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
// Sanitizer shadow memory and slow copies: a smaller "huge" message keeps the suite's wall time
// and memory modest; the chunking path is the same from 64 MiB up.
constexpr size_t kHugeBytes = size_t{256} << 20;
#else
constexpr size_t kHugeBytes = size_t{1} << 30;
#endif

struct Param {
  std::string backend;  // "loopback", "ucx" or "socket"
  LinkClass link_class;
};

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return info.param.backend + "_" + std::string(LinkClassName(info.param.link_class));
}

TransportOptions Options(const Param& param) {
  TransportOptions options;
  options.scheduler.chunk_bytes = 64 << 10;  // Many chunks per message on slow links.
  options.scheduler.stripes = 2;
  options.fast_chunk_bytes = 16 << 20;  // Several chunks for the huge message.
  options.ucx_tls = "tcp";
  options.ucx_net_devices = "lo";
  options.peer_timeout = absl::Seconds(5);
  return options;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const Param& param) {
  if (param.backend == "ucx") return NewUcxTransport(Options(param));
  if (param.backend == "socket") return NewSocketTransport(Options(param));
  return NewLoopbackTransport(Options(param));
}

std::string ListenAddress(const Param& param) {
  static std::atomic<int> counter{0};
  if (param.backend == "ucx" || param.backend == "socket") return "127.0.0.1:0";
  return "transport-test-" + std::to_string(counter++);
}

class TransportTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    LBCC_ASSERT_OK_AND_ASSIGN(server_, MakeTransport(GetParam()));
    LBCC_ASSERT_OK_AND_ASSIGN(client_, MakeTransport(GetParam()));
    LBCC_ASSERT_OK_AND_ASSIGN(std::string address, server_->Listen(ListenAddress(GetParam())));
    ConnectOptions options;
    options.has_link_class = true;
    options.link_class = GetParam().link_class;
    LBCC_ASSERT_OK_AND_ASSIGN(a_, client_->Connect(address, kWait, options));
    LBCC_ASSERT_OK_AND_ASSIGN(b_, server_->Accept(kWait));
  }
  void TearDown() override { Shutdown(); }

  // Destroys endpoints and transports: every callback has run when this returns.
  void Shutdown() {
    a_.reset();
    b_.reset();
    client_.reset();
    server_.reset();
  }

  // Results live in the fixture: a callback may run after the test body's scope ended.
  SendResult& NewSend() { return sends_.emplace_back(); }
  RecvResult& NewRecv() { return recvs_.emplace_back(); }

  std::deque<SendResult> sends_;
  std::deque<RecvResult> recvs_;
  std::deque<std::vector<uint8_t>> buffers_;
  std::unique_ptr<Transport> server_, client_;
  std::unique_ptr<Endpoint> a_, b_;  // a_: client side, b_: server side.
};

TEST_P(TransportTest, LinkClassAndStripesAreAsConfigured) {
  EXPECT_EQ(a_->link_class(), GetParam().link_class);
  EXPECT_EQ(b_->link_class(), GetParam().link_class);
  const int stripes = GetParam().link_class == LinkClass::kSlow ? 2 : 1;
  EXPECT_EQ(a_->counters().stripes, stripes);
  EXPECT_EQ(b_->counters().stripes, stripes);
  EXPECT_FALSE(a_->peer_address().empty());
}

TEST_P(TransportTest, DeliversEverySizeBothWays) {
  const std::vector<size_t> sizes = {0, 1, 4097, (64 << 10) + 3, (5 << 20) + 1};
  for (Endpoint* from : {a_.get(), b_.get()}) {
    Endpoint* to = from == a_.get() ? b_.get() : a_.get();
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::vector<uint8_t>& data = buffers_.emplace_back(Pattern(sizes[i], i));
      std::vector<uint8_t>& in = buffers_.emplace_back(sizes[i] + 16);
      RecvResult& received = NewRecv();
      SendResult& sent = NewSend();
      to->Recv(/*tag=*/100 + i, absl::MakeSpan(in), received.Callback());
      from->Send(/*tag=*/100 + i, data, {}, sent.Callback());
      EXPECT_THAT(sent.Wait(), IsOk());
      ASSERT_THAT(received.Wait(), IsOkAndHolds(sizes[i]));
      EXPECT_TRUE(std::equal(data.begin(), data.end(), in.begin())) << "size " << sizes[i];
    }
  }
}

TEST_P(TransportTest, HugeMessageArrivesIntact) {
  // 1 GiB over UCX fast links (several fast chunks); the loopback and slow paths chunk the same
  // way from far smaller sizes, so they keep the suite quick.
  const bool ucx_fast = GetParam().backend == "ucx" && GetParam().link_class == LinkClass::kFast;
  const size_t bytes = ucx_fast ? kHugeBytes : size_t{64} << 20;
  std::vector<uint8_t> data = Pattern(bytes, 42);
  std::vector<uint8_t> in(bytes);
  RecvResult& received = NewRecv();
  SendResult& sent = NewSend();
  b_->Recv(1, absl::MakeSpan(in), received.Callback());
  a_->Send(1, data, {Priority::kBulk}, sent.Callback());
  EXPECT_THAT(sent.Wait(), IsOk());
  ASSERT_THAT(received.Wait(), IsOkAndHolds(bytes));
  EXPECT_EQ(std::memcmp(data.data(), in.data(), bytes), 0);
}

TEST_P(TransportTest, KeepsPerTagOrderWithHundredsInFlight) {
  constexpr int kTags = 3;
  constexpr int kPerTag = 120;
  const Priority priorities[kTags] = {Priority::kHigh, Priority::kNormal, Priority::kBulk};
  auto size_of = [](int tag, int i) -> size_t { return (i * 7919 + tag * 131) % (150 << 10); };
  std::vector<RecvResult*> received(kTags * kPerTag);
  std::vector<std::vector<uint8_t>*> in(kTags * kPerTag);
  // Half of the receives are posted before the sends (expected messages), half after
  // (unexpected ones, staged or left at the sender until matched).
  auto post_recvs = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      for (int tag = 0; tag < kTags; ++tag) {
        const int k = tag * kPerTag + i;
        in[k] = &buffers_.emplace_back(150 << 10);
        received[k] = &NewRecv();
        b_->Recv(tag, absl::MakeSpan(*in[k]), received[k]->Callback());
      }
    }
  };
  post_recvs(0, kPerTag / 2);
  std::vector<SendResult*> sent;
  for (int i = 0; i < kPerTag; ++i) {
    for (int tag = 0; tag < kTags; ++tag) {
      const std::vector<uint8_t>& data =
          buffers_.emplace_back(Pattern(size_of(tag, i), tag * 1000 + i));
      sent.push_back(&NewSend());
      a_->Send(tag, data, {priorities[tag]}, sent.back()->Callback());
    }
  }
  post_recvs(kPerTag / 2, kPerTag);
  for (SendResult* s : sent) EXPECT_THAT(s->Wait(), IsOk());
  for (int tag = 0; tag < kTags; ++tag) {
    for (int i = 0; i < kPerTag; ++i) {
      const int k = tag * kPerTag + i;
      const size_t size = size_of(tag, i);
      ASSERT_THAT(received[k]->Wait(), IsOkAndHolds(size)) << "tag " << tag << " #" << i;
      const std::vector<uint8_t> expected = Pattern(size, tag * 1000 + i);
      ASSERT_TRUE(std::equal(expected.begin(), expected.end(), in[k]->begin()))
          << "tag " << tag << " message " << i << " out of order or corrupt";
    }
  }
}

TEST_P(TransportTest, CallbacksRunExactlyOnceAndNeverInline) {
  const std::thread::id me = std::this_thread::get_id();
  std::vector<SendResult*> sends;
  std::vector<RecvResult*> recvs;
  for (int i = 0; i < 50; ++i) {
    const std::vector<uint8_t>& data = buffers_.emplace_back(Pattern(i * 1000, i));
    std::vector<uint8_t>& in = buffers_.emplace_back(i * 1000);
    recvs.push_back(&NewRecv());
    b_->Recv(7, absl::MakeSpan(in), recvs.back()->Callback());
    sends.push_back(&NewSend());
    a_->Send(7, data, {}, sends.back()->Callback());
  }
  // Operations that cannot succeed: unmatched receives and, after Close, immediate failures.
  for (int i = 0; i < 5; ++i) {
    recvs.push_back(&NewRecv());
    std::vector<uint8_t>& in = buffers_.emplace_back(8);
    b_->Recv(8, absl::MakeSpan(in), recvs.back()->Callback());
  }
  for (SendResult* s : sends) EXPECT_THAT(s->Wait(), IsOk());
  b_->Close();
  for (int i = 0; i < 5; ++i) {
    sends.push_back(&NewSend());
    b_->Send(9, {}, {}, sends.back()->Callback());
    recvs.push_back(&NewRecv());
    std::vector<uint8_t>& in = buffers_.emplace_back(8);
    b_->Recv(9, absl::MakeSpan(in), recvs.back()->Callback());
  }
  // Every callback runs once everything is destroyed, though not always before Shutdown()
  // returns: the last reference to a transport's callback executor may drop on that executor's
  // own thread, which then runs what is queued by itself (transport/executor.h).
  Shutdown();
  for (SendResult* s : sends) {
    (void)s->Wait();
    EXPECT_EQ(s->calls(), 1);
    EXPECT_NE(s->thread(), me);
  }
  for (RecvResult* r : recvs) {
    (void)r->Wait();
    EXPECT_EQ(r->calls(), 1);
    EXPECT_NE(r->thread(), me);
  }
}

TEST_P(TransportTest, CloseCancelsPendingWorkAndThePeerSeesUnavailable) {
  std::vector<uint8_t>& mine = buffers_.emplace_back(16);
  std::vector<uint8_t>& theirs = buffers_.emplace_back(16);
  RecvResult& local = NewRecv();
  RecvResult& remote = NewRecv();
  a_->Recv(1, absl::MakeSpan(mine), local.Callback());
  b_->Recv(1, absl::MakeSpan(theirs), remote.Callback());
  // A send stuck behind an unmatched rendezvous on the peer is pending too.
  const std::vector<uint8_t>& big = buffers_.emplace_back(Pattern(8 << 20, 3));
  SendResult& pending = NewSend();
  a_->Send(2, big, {}, pending.Callback());
  a_->Close();
  EXPECT_THAT(local.Wait(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(pending.Wait(), ::testing::AnyOf(IsOk(), StatusIs(absl::StatusCode::kCancelled)));
  EXPECT_THAT(remote.Wait(), StatusIs(absl::StatusCode::kUnavailable));
  SendResult& after = NewSend();
  a_->Send(1, {}, {}, after.Callback());
  EXPECT_THAT(after.Wait(), StatusIs(absl::StatusCode::kCancelled));
  SendResult& peer_after = NewSend();
  b_->Send(1, {}, {}, peer_after.Callback());
  EXPECT_THAT(peer_after.Wait(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_P(TransportTest, CloseDuringATransferCancelsBothEnds) {
  const size_t bytes = size_t{128} << 20;
  const std::vector<uint8_t>& data = buffers_.emplace_back(Pattern(bytes, 5));
  std::vector<uint8_t>& in = buffers_.emplace_back(bytes);
  RecvResult& received = NewRecv();
  SendResult& sent = NewSend();
  b_->Recv(1, absl::MakeSpan(in), received.Callback());
  a_->Send(1, data, {Priority::kBulk}, sent.Callback());
  // Close the receiver once the message is partly across (fetches may be in flight).
  const absl::Time deadline = absl::Now() + kWait;
  while (b_->counters().chunks_received == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Microseconds(200));  // Polling a counter, bounded by the deadline.
  }
  b_->Close();
  EXPECT_THAT(received.Wait(), ::testing::AnyOf(StatusIs(absl::StatusCode::kCancelled),
                                                IsOkAndHolds(bytes)));
  EXPECT_THAT(sent.Wait(), ::testing::AnyOf(IsOk(), StatusIs(absl::StatusCode::kUnavailable),
                                            StatusIs(absl::StatusCode::kCancelled)));
  Shutdown();
  EXPECT_EQ(received.calls(), 1);
  EXPECT_EQ(sent.calls(), 1);
}

TEST_P(TransportTest, TooSmallBufferFailsThatReceiveOnly) {
  const std::vector<uint8_t>& big = buffers_.emplace_back(Pattern(300 << 10, 1));
  const std::vector<uint8_t>& small = buffers_.emplace_back(Pattern(10, 2));
  std::vector<uint8_t>& in = buffers_.emplace_back(100);
  RecvResult& first = NewRecv();
  RecvResult& second = NewRecv();
  SendResult& s1 = NewSend();
  SendResult& s2 = NewSend();
  a_->Send(5, big, {}, s1.Callback());
  a_->Send(5, small, {}, s2.Callback());
  b_->Recv(5, absl::MakeSpan(in), first.Callback());
  EXPECT_THAT(first.Wait(), StatusIs(absl::StatusCode::kInvalidArgument));
  b_->Recv(5, absl::MakeSpan(in), second.Callback());
  EXPECT_THAT(second.Wait(), IsOkAndHolds(10u));
  EXPECT_TRUE(std::equal(small.begin(), small.end(), in.begin()));
  EXPECT_THAT(s1.Wait(), IsOk());
  EXPECT_THAT(s2.Wait(), IsOk());
}

TEST_P(TransportTest, AllocatorLearnsTheSizeFirst) {
  const std::vector<uint8_t>& data = buffers_.emplace_back(Pattern((3 << 20) + 5, 9));
  std::vector<uint8_t>& storage = buffers_.emplace_back();
  std::atomic<size_t> asked{0};
  RecvResult& received = NewRecv();
  b_->Recv(
      3,
      [&storage, &asked](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
        asked = size;
        storage.resize(size);
        return absl::MakeSpan(storage);
      },
      received.Callback());
  SendResult& sent = NewSend();
  a_->Send(3, data, {}, sent.Callback());
  ASSERT_THAT(received.Wait(), IsOkAndHolds(data.size()));
  EXPECT_EQ(asked.load(), data.size());
  EXPECT_EQ(storage, data);
  EXPECT_THAT(sent.Wait(), IsOk());
}

TEST_P(TransportTest, CountersAddUp) {
  uint64_t total = 0;
  constexpr int kMessages = 20;
  for (int i = 0; i < kMessages; ++i) {
    const std::vector<uint8_t>& data = buffers_.emplace_back(Pattern(i * 10000, i));
    std::vector<uint8_t>& in = buffers_.emplace_back(i * 10000);
    total += data.size();
    RecvResult& received = NewRecv();
    b_->Recv(1, absl::MakeSpan(in), received.Callback());
    SendResult& sent = NewSend();
    a_->Send(1, data, {}, sent.Callback());
    ASSERT_THAT(sent.Wait(), IsOk());
    ASSERT_THAT(received.Wait(), IsOk());
  }
  const LinkCounters sender = a_->counters();
  const LinkCounters receiver = b_->counters();
  EXPECT_EQ(sender.bytes_sent, total);
  EXPECT_EQ(sender.messages_sent, kMessages);
  EXPECT_EQ(receiver.bytes_received, total);
  EXPECT_EQ(receiver.messages_received, kMessages);
  EXPECT_EQ(sender.chunks_sent, receiver.chunks_received);
  EXPECT_GE(sender.chunks_sent, static_cast<uint64_t>(kMessages));
  EXPECT_GT(sender.send_bytes_per_second, 0);
  EXPECT_GT(receiver.recv_bytes_per_second, 0);
  EXPECT_EQ(sender.queued_messages, 0u);
  EXPECT_EQ(receiver.bytes_sent, 0u);
  EXPECT_EQ(sender.link_class, GetParam().link_class);
}

TEST_P(TransportTest, DestroyingTheTransportCancelsItsEndpoints) {
  std::vector<uint8_t>& in = buffers_.emplace_back(16);
  RecvResult& pending = NewRecv();
  b_->Recv(1, absl::MakeSpan(in), pending.Callback());
  server_.reset();
  EXPECT_THAT(pending.Wait(), StatusIs(absl::StatusCode::kCancelled));
  // The endpoint outlives its transport and stays safe to call.
  SendResult& after = NewSend();
  b_->Send(1, {}, {}, after.Callback());
  EXPECT_THAT(after.Wait(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_NE(after.thread(), std::this_thread::get_id());
}

TEST_P(TransportTest, ShutdownClosesEndpointsAndFailsLaterCalls) {
  std::vector<uint8_t>& in = buffers_.emplace_back(8);
  RecvResult& pending = NewRecv();
  b_->Recv(5, absl::MakeSpan(in), pending.Callback());
  server_->Shutdown();
  EXPECT_THAT(pending.Wait(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(server_->Accept(absl::Milliseconds(10)).status(),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(server_->Listen(ListenAddress(GetParam())).status(),
              StatusIs(absl::StatusCode::kCancelled));
  SendResult& sent = NewSend();
  b_->Send(5, {}, {}, sent.Callback());
  EXPECT_THAT(sent.Wait(), StatusIs(absl::StatusCode::kCancelled));
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportTest,
                         ::testing::Values(Param{"loopback", LinkClass::kFast},
                                           Param{"loopback", LinkClass::kSlow},
                                           Param{"ucx", LinkClass::kFast},
                                           Param{"ucx", LinkClass::kSlow},
                                           Param{"socket", LinkClass::kFast},
                                           Param{"socket", LinkClass::kSlow}),
                         ParamName);

}  // namespace
}  // namespace lbcc::transport
