// Net in-process over the loopback transport: the set-up state machines, message matching with
// grouped receives, requests in flight, close and abort paths, bad input and threads. The same
// traffic against the built .so over UCX, per plugin version and across processes, is in
// plugin_harness_test.cc.
#include "plugin/net.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugin/emulated_gpu.h"
#include "plugin/handle.h"
#include "plugin/testing/traffic.h"
#include "transport/loopback.h"

namespace lbcc::plugin {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;
using transport::LinkClass;

constexpr absl::Duration kDeadline = absl::Seconds(60);

std::string UniqueName(absl::string_view what) {
  static std::atomic<int> counter{0};
  return absl::StrCat("plugin-", what, "-", getpid(), "-", counter.fetch_add(1));
}

NetOptions LoopbackOptions(int devices = 1, std::optional<LinkClass> link_class = std::nullopt) {
  NetOptions options;
  for (int i = 0; i < devices; ++i) {
    options.devices.push_back({absl::StrCat("loop", i), UniqueName("dev"), "", link_class});
  }
  options.make_transport = [](const transport::TransportOptions& transport_options)
      -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
    return transport::NewLoopbackTransport(transport_options);
  };
  options.connect_timeout = absl::Seconds(20);
  options.close_grace = absl::Seconds(5);
  return options;
}

std::unique_ptr<Net> MakeNet(NetOptions options) {
  absl::StatusOr<std::unique_ptr<Net>> net = Net::Create(std::move(options));
  EXPECT_THAT(net.status(), IsOk());
  return net.ok() ? std::move(*net) : nullptr;
}

struct Pair {
  ListenComm* listen = nullptr;
  SendComm* send = nullptr;
  RecvComm* recv = nullptr;
};

// NCCL's loop: listen on `to`, carry the handle over (a copy, as the bootstrap does), then call
// connect and accept on this one thread until both return a comm.
absl::StatusOr<Pair> Connect(Net& from, Net& to, int dev = 0) {
  Pair pair;
  std::array<uint8_t, kHandleBytes> listened{};
  LBCC_ASSIGN_OR_RETURN(pair.listen, to.Listen(dev, absl::MakeSpan(listened)));
  std::array<uint8_t, kHandleBytes> handle = listened;
  const absl::Time deadline = absl::Now() + kDeadline;
  while (pair.send == nullptr || pair.recv == nullptr) {
    if (pair.send == nullptr) {
      LBCC_ASSIGN_OR_RETURN(pair.send, from.Connect(dev, absl::MakeSpan(handle)));
    }
    if (pair.recv == nullptr) {
      LBCC_ASSIGN_OR_RETURN(pair.recv, Net::Accept(pair.listen));
    }
    if (absl::Now() > deadline) return absl::DeadlineExceededError("connect/accept loop");
    std::this_thread::yield();
  }
  return pair;
}

void ClosePair(const Pair& pair) {
  EXPECT_THAT(Net::CloseSend(pair.send), IsOk());
  EXPECT_THAT(Net::CloseRecv(pair.recv), IsOk());
  EXPECT_THAT(Net::CloseListen(pair.listen), IsOk());
}

class DirectOps : public testing::NetOps {
 public:
  // Buffers are registered as `memory_type` (kPtrCuda: staged through the Net's Gpu).
  explicit DirectOps(int memory_type = kPtrHost) : memory_type_(memory_type) {}
  absl::Status RegMr(void* comm, void* data, size_t size, void** mhandle) override {
    LBCC_ASSIGN_OR_RETURN(*mhandle, Net::RegMr(comm, data, size, memory_type_));
    return absl::OkStatus();
  }
  absl::Status DeregMr(void* comm, void* mhandle) override { return Net::DeregMr(comm, mhandle); }
  absl::Status Isend(void* comm, void* data, size_t size, int tag, void* mhandle,
                     void** request) override {
    LBCC_ASSIGN_OR_RETURN(Request * r,
                          Net::Isend(static_cast<SendComm*>(comm), data, size, tag, mhandle));
    *request = r;
    return absl::OkStatus();
  }
  absl::Status Irecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request) override {
    LBCC_ASSIGN_OR_RETURN(Request * r, Net::Irecv(static_cast<RecvComm*>(comm), n, data, sizes,
                                                  tags, mhandles));
    *request = r;
    return absl::OkStatus();
  }
  absl::Status Test(void* request, bool* done, int* sizes) override {
    return Net::Test(static_cast<Request*>(request), done, sizes);
  }

 private:
  const int memory_type_;
};

// Polls until the request finishes; the status it ended with.
absl::Status Wait(Request* request, int* sizes = nullptr) {
  const absl::Time deadline = absl::Now() + kDeadline;
  while (true) {
    bool done = false;
    absl::Status status = Net::Test(request, &done, sizes);
    if (!status.ok() || done) return status;
    if (absl::Now() > deadline) return absl::DeadlineExceededError("request never finished");
    std::this_thread::yield();
  }
}

// Captures log lines at INFO for the test's duration.
class LogCapture {
 public:
  LogCapture() {
    previous_ = GetLogLevel();
    SetLogLevel(LogLevel::kInfo);
    SetLogSink([this](LogLevel, absl::string_view, int, absl::string_view message) {
      MutexLock lock(&mu_);
      lines_.emplace_back(message);
    });
  }
  ~LogCapture() {
    SetLogSink(nullptr);
    SetLogLevel(previous_);
  }
  std::vector<std::string> lines() {
    MutexLock lock(&mu_);
    return lines_;
  }
  bool Contains(absl::string_view a, absl::string_view b = "") {
    for (const std::string& line : lines()) {
      if (absl::StrContains(line, a) && absl::StrContains(line, b)) return true;
    }
    return false;
  }

 private:
  LogLevel previous_;
  Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

TEST(NetTest, SelfConnectOnOneThreadAndSmallExchange) {
  std::unique_ptr<Net> net = MakeNet(LoopbackOptions());
  ASSERT_NE(net, nullptr);
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*net, *net));
  std::vector<uint8_t> out(1000), in(2000, 0);
  testing::FillPattern(7, absl::MakeSpan(out));
  LBCC_ASSERT_OK_AND_ASSIGN(void* out_mr, Net::RegMr(pair.send, out.data(), out.size(), kPtrHost));
  LBCC_ASSERT_OK_AND_ASSIGN(void* in_mr, Net::RegMr(pair.recv, in.data(), in.size(), kPtrHost));
  void* data[1] = {in.data()};
  size_t sizes[1] = {in.size()};
  int tags[1] = {3};
  void* mhandles[1] = {in_mr};
  LBCC_ASSERT_OK_AND_ASSIGN(Request * recv, Net::Irecv(pair.recv, 1, data, sizes, tags, mhandles));
  LBCC_ASSERT_OK_AND_ASSIGN(Request * send, Net::Isend(pair.send, out.data(), out.size(), 3, out_mr));
  int sent[1] = {0};
  int received[1] = {0};
  ASSERT_THAT(Wait(send, sent), IsOk());
  ASSERT_THAT(Wait(recv, received), IsOk());
  EXPECT_EQ(sent[0], 1000);
  EXPECT_EQ(received[0], 1000);
  EXPECT_EQ(testing::FindMismatch(7, absl::MakeConstSpan(in.data(), 1000)), -1);
  EXPECT_EQ(in[1000], 0);  // Nothing written past the message.
  EXPECT_THAT(Net::DeregMr(pair.send, out_mr), IsOk());
  EXPECT_THAT(Net::DeregMr(pair.recv, in_mr), IsOk());
  ClosePair(pair);
}

// The connect/accept loop, listen handle and hello routing with several listen comms on one
// device: each connection reaches the listen comm its handle names.
TEST(NetTest, ConnectionsReachTheListenCommTheirHandleNames) {
  std::unique_ptr<Net> a = MakeNet(LoopbackOptions());
  std::unique_ptr<Net> b = MakeNet(LoopbackOptions());
  std::array<uint8_t, kHandleBytes> h1{}, h2{};
  LBCC_ASSERT_OK_AND_ASSIGN(ListenComm * l1, b->Listen(0, absl::MakeSpan(h1)));
  LBCC_ASSERT_OK_AND_ASSIGN(ListenComm * l2, b->Listen(0, absl::MakeSpan(h2)));
  LBCC_ASSERT_OK_AND_ASSIGN(ListenHandle d1, DecodeListenHandle(h1));
  LBCC_ASSERT_OK_AND_ASSIGN(ListenHandle d2, DecodeListenHandle(h2));
  EXPECT_EQ(d1.address, d2.address);  // One listener per device...
  EXPECT_NE(d1.comm_id, d2.comm_id);  // ...many listen comms.
  // Connect to the second first: the first must not see that connection.
  SendComm* s2 = nullptr;
  RecvComm* r2 = nullptr;
  const absl::Time deadline = absl::Now() + kDeadline;
  while (s2 == nullptr || r2 == nullptr) {
    if (s2 == nullptr) {
      LBCC_ASSERT_OK_AND_ASSIGN(s2, a->Connect(0, absl::MakeSpan(h2)));
    }
    if (r2 == nullptr) {
      LBCC_ASSERT_OK_AND_ASSIGN(r2, Net::Accept(l2));
    }
    LBCC_ASSERT_OK_AND_ASSIGN(RecvComm * wrong, Net::Accept(l1));
    ASSERT_EQ(wrong, nullptr);
    ASSERT_LT(absl::Now(), deadline);
    std::this_thread::yield();
  }
  // The handle's connect stage was cleared: the same buffer starts a new connection.
  EXPECT_FALSE(ReadConnectStage(h2).has_value());
  EXPECT_THAT(Net::CloseSend(s2), IsOk());
  EXPECT_THAT(Net::CloseRecv(r2), IsOk());
  EXPECT_THAT(Net::CloseListen(l1), IsOk());
  EXPECT_THAT(Net::CloseListen(l2), IsOk());
}

// Thousands of messages both ways with grouped receives, shuffled send order within groups, 32
// receives in flight, every byte checked; comms made on this thread, driven on four others.
TEST(NetTest, TrafficBothWaysWithGroupedReceivesAndFullWindows) {
  std::unique_ptr<Net> a = MakeNet(LoopbackOptions());
  std::unique_ptr<Net> b = MakeNet(LoopbackOptions());
  LBCC_ASSERT_OK_AND_ASSIGN(Pair ab, Connect(*a, *b));
  LBCC_ASSERT_OK_AND_ASSIGN(Pair ba, Connect(*b, *a));
  testing::PlanOptions plan_options;
  plan_options.groups = 400;
  plan_options.max_random_bytes = 1 << 20;
  plan_options.special_sizes = {0, 4 << 20};
  const testing::Plan plan_ab = testing::MakePlan(plan_options);
  plan_options.seed = 2;
  const testing::Plan plan_ba = testing::MakePlan(plan_options);
  ASSERT_GE(plan_ab.messages, 1000u);

  DirectOps ops;
  const absl::Time deadline = absl::Now() + kDeadline;
  absl::StatusOr<testing::TrafficStats> results[4];
  std::vector<std::thread> threads;
  threads.emplace_back([&] { results[0] = RunSends(ops, ab.send, plan_ab, 256, deadline); });
  threads.emplace_back([&] { results[1] = RunReceives(ops, ab.recv, plan_ab, 32, deadline); });
  threads.emplace_back([&] { results[2] = RunSends(ops, ba.send, plan_ba, 256, deadline); });
  threads.emplace_back([&] { results[3] = RunReceives(ops, ba.recv, plan_ba, 32, deadline); });
  for (std::thread& thread : threads) thread.join();
  for (auto& result : results) ASSERT_THAT(result.status(), IsOk());
  EXPECT_EQ(results[1]->messages, plan_ab.messages);
  EXPECT_EQ(results[1]->bytes, plan_ab.bytes);
  EXPECT_EQ(results[3]->messages, plan_ba.messages);
  EXPECT_EQ(results[1]->max_in_flight, 32);
  EXPECT_EQ(results[3]->max_in_flight, 32);
  EXPECT_EQ(results[1]->null_requests, 0u);
  EXPECT_EQ(results[0]->null_requests, 0u);
  ClosePair(ab);
  ClosePair(ba);
}

TEST(NetTest, RequestSlotsRunOutAsNullRequestsAndComeBackAfterTest) {
  std::unique_ptr<Net> net = MakeNet(LoopbackOptions());
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*net, *net));
  std::vector<uint8_t> byte(1);
  std::vector<Request*> sends;
  for (int i = 0; i < kMaxRequests * kMaxRecvs; ++i) {
    LBCC_ASSERT_OK_AND_ASSIGN(Request * r, Net::Isend(pair.send, byte.data(), 1, 0, nullptr));
    ASSERT_NE(r, nullptr) << i;
    sends.push_back(r);
  }
  LBCC_ASSERT_OK_AND_ASSIGN(Request * extra, Net::Isend(pair.send, byte.data(), 1, 0, nullptr));
  EXPECT_EQ(extra, nullptr);

  std::vector<std::vector<uint8_t>> buffers(kMaxRequests * kMaxRecvs, std::vector<uint8_t>(1));
  std::vector<Request*> receives;
  for (int i = 0; i < kMaxRequests; ++i) {
    void* data[kMaxRecvs];
    size_t sizes[kMaxRecvs];
    int tags[kMaxRecvs] = {};
    for (int p = 0; p < kMaxRecvs; ++p) {
      data[p] = buffers[i * kMaxRecvs + p].data();
      sizes[p] = 1;
    }
    LBCC_ASSERT_OK_AND_ASSIGN(Request * r,
                              Net::Irecv(pair.recv, kMaxRecvs, data, sizes, tags, nullptr));
    ASSERT_NE(r, nullptr) << i;
    receives.push_back(r);
  }
  void* data[1] = {buffers[0].data()};
  size_t sizes[1] = {1};
  int tags[1] = {0};
  LBCC_ASSERT_OK_AND_ASSIGN(Request * more, Net::Irecv(pair.recv, 1, data, sizes, tags, nullptr));
  EXPECT_EQ(more, nullptr);

  for (Request* r : sends) ASSERT_THAT(Wait(r), IsOk());
  for (Request* r : receives) {
    int got[kMaxRecvs];
    ASSERT_THAT(Wait(r, got), IsOk());
    for (int p = 0; p < kMaxRecvs; ++p) EXPECT_EQ(got[p], 1);
  }
  // Retired requests free their slots; a retired request cannot be tested again.
  bool done = false;
  EXPECT_THAT(Net::Test(sends[0], &done, nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  LBCC_ASSERT_OK_AND_ASSIGN(Request * again, Net::Isend(pair.send, byte.data(), 1, 0, nullptr));
  EXPECT_NE(again, nullptr);
  ClosePair(pair);
}

TEST(NetTest, MessageLargerThanReceiveBufferFailsThatRequest) {
  std::unique_ptr<Net> net = MakeNet(LoopbackOptions());
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*net, *net));
  std::vector<uint8_t> out(100), in(10);
  void* data[1] = {in.data()};
  size_t sizes[1] = {in.size()};
  int tags[1] = {1};
  LBCC_ASSERT_OK_AND_ASSIGN(Request * recv, Net::Irecv(pair.recv, 1, data, sizes, tags, nullptr));
  LBCC_ASSERT_OK_AND_ASSIGN(Request * send, Net::Isend(pair.send, out.data(), 100, 1, nullptr));
  EXPECT_THAT(Wait(recv), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not fit")));
  (void)Wait(send);
  ClosePair(pair);
}

// NCCL's abort path: memory deregistered and comms closed while requests are in flight. Close
// must return only once the transport no longer touches the buffers (ASan would see it).
TEST(NetTest, DeregisterAndCloseWithRequestsInFlight) {
  std::unique_ptr<Net> a = MakeNet(LoopbackOptions());
  std::unique_ptr<Net> b = MakeNet(LoopbackOptions());
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*a, *b));
  auto big = std::make_unique<std::vector<uint8_t>>(8 << 20, 1);
  auto sink = std::make_unique<std::vector<uint8_t>>(1 << 20);
  LBCC_ASSERT_OK_AND_ASSIGN(void* big_mr, Net::RegMr(pair.send, big->data(), big->size(), kPtrHost));
  LBCC_ASSERT_OK_AND_ASSIGN(void* sink_mr,
                            Net::RegMr(pair.recv, sink->data(), sink->size(), kPtrHost));
  // Sends nobody receives under these tags, receives nobody sends.
  for (int i = 0; i < 8; ++i) {
    LBCC_ASSERT_OK_AND_ASSIGN(Request * r,
                              Net::Isend(pair.send, big->data(), big->size(), 100 + i, big_mr));
    ASSERT_NE(r, nullptr);
  }
  for (int i = 0; i < 8; ++i) {
    void* data[1] = {sink->data()};
    size_t sizes[1] = {sink->size()};
    int tags[1] = {200 + i};
    void* mhandles[1] = {sink_mr};
    LBCC_ASSERT_OK_AND_ASSIGN(Request * r, Net::Irecv(pair.recv, 1, data, sizes, tags, mhandles));
    ASSERT_NE(r, nullptr);
  }
  EXPECT_THAT(Net::DeregMr(pair.send, big_mr), IsOk());
  EXPECT_THAT(Net::DeregMr(pair.recv, sink_mr), IsOk());
  ClosePair(pair);
  big.reset();  // NCCL frees its buffers after close.
  sink.reset();
}

TEST(NetTest, PeerShutDownFailsPendingRequests) {
  std::unique_ptr<Net> a = MakeNet(LoopbackOptions());
  std::unique_ptr<Net> b = MakeNet(LoopbackOptions());
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*a, *b));  // a sends, b receives.
  std::vector<uint8_t> buffer(64);
  void* data[1] = {buffer.data()};
  size_t sizes[1] = {buffer.size()};
  int tags[1] = {0};
  LBCC_ASSERT_OK_AND_ASSIGN(Request * recv, Net::Irecv(pair.recv, 1, data, sizes, tags, nullptr));
  a->Shutdown();  // The sending side goes away.
  absl::Status status = Wait(recv);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  // A comm of a shut-down Net fails new work and still closes.
  LBCC_ASSERT_OK_AND_ASSIGN(Request * send, Net::Isend(pair.send, buffer.data(), 1, 0, nullptr));
  EXPECT_THAT(Wait(send), StatusIs(absl::StatusCode::kCancelled));
  ClosePair(pair);
}

TEST(NetTest, ConnectToNobodyFailsInsteadOfHanging) {
  NetOptions options = LoopbackOptions();
  options.connect_timeout = absl::Milliseconds(200);
  std::unique_ptr<Net> net = MakeNet(std::move(options));
  std::array<uint8_t, kHandleBytes> handle{};
  ASSERT_THAT(EncodeListenHandle({UniqueName("nobody"), 5}, absl::MakeSpan(handle)), IsOk());
  const absl::Time deadline = absl::Now() + kDeadline;
  absl::StatusOr<SendComm*> comm;
  do {
    comm = net->Connect(0, absl::MakeSpan(handle));
    ASSERT_LT(absl::Now(), deadline);
    std::this_thread::yield();
  } while (comm.ok() && *comm == nullptr);
  EXPECT_THAT(comm.status(), StatusIs(absl::StatusCode::kUnavailable));
}

// Finalize while a connection attempt waits for a peer that never listens: the attempt is
// cancelled through the transport at once, not at the end of its connect slice (5 s).
TEST(NetTest, ShutdownCancelsARunningConnectAttemptPromptly) {
  NetOptions options = LoopbackOptions();
  options.connect_timeout = absl::Seconds(300);
  std::unique_ptr<Net> net = MakeNet(std::move(options));
  std::array<uint8_t, kHandleBytes> handle{};
  ASSERT_THAT(EncodeListenHandle({UniqueName("never"), 5}, absl::MakeSpan(handle)), IsOk());
  LBCC_ASSERT_OK_AND_ASSIGN(SendComm * comm, net->Connect(0, absl::MakeSpan(handle)));
  ASSERT_EQ(comm, nullptr);
  absl::SleepFor(absl::Milliseconds(200));  // The attempt is now blocked in Connect().
  const absl::Time start = absl::Now();
  net->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_THAT(net->Connect(0, absl::MakeSpan(handle)).status(),
              StatusIs(absl::StatusCode::kCancelled));
}

TEST(NetTest, RejectsBadInputWithoutCrashing) {
  std::unique_ptr<Net> net = MakeNet(LoopbackOptions());
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*net, *net));
  std::array<uint8_t, kHandleBytes> handle{};
  const auto kInvalid = absl::StatusCode::kInvalidArgument;

  EXPECT_THAT(net->Listen(1, absl::MakeSpan(handle)).status(), StatusIs(kInvalid));
  EXPECT_THAT(net->Listen(-1, absl::MakeSpan(handle)).status(), StatusIs(kInvalid));
  EXPECT_THAT(net->Properties(7).status(), StatusIs(kInvalid));
  // Not a handle; a handle whose stage names an attempt nobody started.
  handle.fill(0x5a);
  EXPECT_THAT(net->Connect(0, absl::MakeSpan(handle)).status(), StatusIs(kInvalid));
  ASSERT_THAT(EncodeListenHandle({"x", 1}, absl::MakeSpan(handle)), IsOk());
  EXPECT_THAT(net->Connect(5, absl::MakeSpan(handle)).status(), StatusIs(kInvalid));

  std::vector<uint8_t> buffer(16);
  EXPECT_THAT(Net::RegMr(nullptr, buffer.data(), 16, kPtrHost).status(), StatusIs(kInvalid));
  EXPECT_THAT(Net::RegMr(pair.listen, buffer.data(), 16, kPtrHost).status(), StatusIs(kInvalid));
  // No Gpu in these options: CUDA memory is refused (whichever the build).
  EXPECT_THAT(Net::RegMr(pair.send, buffer.data(), 16, kPtrCuda).status(),
              StatusIs(kInvalid, HasSubstr("NCCL_PTR_CUDA is not supported")));
  EXPECT_THAT(Net::RegMr(pair.send, nullptr, 16, kPtrHost).status(), StatusIs(kInvalid));
  LBCC_ASSERT_OK_AND_ASSIGN(void* send_mr, Net::RegMr(pair.send, buffer.data(), 8, kPtrHost));
  EXPECT_THAT(Net::DeregMr(pair.recv, send_mr), StatusIs(kInvalid));  // Another comm's.
  EXPECT_THAT(Net::DeregMr(pair.send, buffer.data()), StatusIs(kInvalid));
  EXPECT_THAT(Net::Isend(pair.send, buffer.data(), 16, 0, send_mr).status(),
              StatusIs(kInvalid, HasSubstr("outside")));
  EXPECT_THAT(Net::Isend(pair.send, nullptr, 16, 0, nullptr).status(), StatusIs(kInvalid));
  EXPECT_THAT(Net::Isend(pair.send, buffer.data(), kMaxMessageBytes + 1, 0, nullptr).status(),
              StatusIs(kInvalid));
  EXPECT_THAT(Net::Isend(reinterpret_cast<SendComm*>(pair.recv), buffer.data(), 1, 0, nullptr)
                  .status(),
              StatusIs(kInvalid));
  EXPECT_THAT(Net::Isend(nullptr, buffer.data(), 1, 0, nullptr).status(), StatusIs(kInvalid));

  void* data[kMaxRecvs + 1] = {};
  size_t sizes[kMaxRecvs + 1] = {};
  int tags[kMaxRecvs + 1] = {};
  EXPECT_THAT(Net::Irecv(pair.recv, 0, data, sizes, tags, nullptr).status(), StatusIs(kInvalid));
  EXPECT_THAT(Net::Irecv(pair.recv, kMaxRecvs + 1, data, sizes, tags, nullptr).status(),
              StatusIs(kInvalid));
  sizes[0] = 4;
  EXPECT_THAT(Net::Irecv(pair.recv, 1, data, sizes, tags, nullptr).status(),
              StatusIs(kInvalid, HasSubstr("null buffer")));
  EXPECT_THAT(Net::Irecv(pair.recv, 1, nullptr, sizes, tags, nullptr).status(),
              StatusIs(kInvalid));
  data[0] = buffer.data();
  void* foreign[1] = {send_mr};
  EXPECT_THAT(Net::Irecv(pair.recv, 1, data, sizes, tags, foreign).status(), StatusIs(kInvalid));
  EXPECT_THAT(Net::Irecv(reinterpret_cast<RecvComm*>(pair.send), 1, data, sizes, tags, nullptr)
                  .status(),
              StatusIs(kInvalid));

  bool done = false;
  EXPECT_THAT(Net::Test(nullptr, &done, nullptr), StatusIs(kInvalid));
  EXPECT_THAT(Net::Test(reinterpret_cast<Request*>(buffer.data()), &done, nullptr),
              StatusIs(kInvalid));

  EXPECT_THAT(Net::DeregMr(pair.send, send_mr), IsOk());
  ClosePair(pair);
  // Closed comms are refused, not freed twice.
  EXPECT_THAT(Net::CloseSend(pair.send), StatusIs(kInvalid));
  EXPECT_THAT(Net::CloseRecv(pair.recv), StatusIs(kInvalid));
  EXPECT_THAT(Net::CloseListen(pair.listen), StatusIs(kInvalid));
  EXPECT_THAT(Net::CloseSend(nullptr), StatusIs(kInvalid));
  EXPECT_THAT(Net::Accept(pair.listen).status(), StatusIs(kInvalid));
}

TEST(NetTest, PropertiesComeFromConfigurationPacingMeasurementOrDefault) {
  NetOptions options = LoopbackOptions(2);
  options.devices[1].link_class = LinkClass::kSlow;
  options.transport.scheduler.pace_bytes_per_second = 100e6 / 8;  // 100 Mbit/s.
  std::unique_ptr<Net> net = MakeNet(options);
  EXPECT_EQ(net->num_devices(), 2);
  LBCC_ASSERT_OK_AND_ASSIGN(DeviceProperties fast, net->Properties(0));
  EXPECT_EQ(fast.name, "loop0");
  EXPECT_EQ(fast.speed_mbits, 10000);
  EXPECT_EQ(fast.speed_source, "default");
  EXPECT_EQ(fast.latency_us, 0);
  EXPECT_EQ(fast.max_recvs, kMaxRecvs);
  EXPECT_EQ(fast.max_message_bytes, kMaxMessageBytes);
  LBCC_ASSERT_OK_AND_ASSIGN(DeviceProperties slow, net->Properties(1));
  EXPECT_EQ(slow.speed_mbits, 100);
  EXPECT_EQ(slow.speed_source, "paced");

  options = LoopbackOptions();
  options.speed_mbits = 250;
  options.latency_us = 1500;
  net = MakeNet(options);
  LBCC_ASSERT_OK_AND_ASSIGN(DeviceProperties configured, net->Properties(0));
  EXPECT_EQ(configured.speed_mbits, 250);
  EXPECT_EQ(configured.speed_source, "configured");
  EXPECT_FLOAT_EQ(configured.latency_us, 1500);
}

// A device configured slow: its links use the transport's slow-link scheduler, striped over the
// configured connections and paced; the plugin says so in its log.
TEST(NetTest, SlowDeviceStripesAndPacesItsLinks) {
  LogCapture log;
  NetOptions options = LoopbackOptions(1, LinkClass::kSlow);
  options.transport.scheduler.stripes = 3;
  options.transport.scheduler.chunk_bytes = 64 << 10;
  options.transport.scheduler.pace_bytes_per_second = 50e6;  // Below what loopback moves.
  std::unique_ptr<Net> a = MakeNet(options);
  std::unique_ptr<Net> b = MakeNet(options);
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*a, *b));
  EXPECT_TRUE(log.Contains("send comm to", "slow link, 3 stripes"));
  testing::PlanOptions plan_options;
  plan_options.groups = 40;
  plan_options.special_sizes = {8 << 20};
  const testing::Plan plan = testing::MakePlan(plan_options);
  DirectOps ops;
  const absl::Time deadline = absl::Now() + kDeadline;
  absl::StatusOr<testing::TrafficStats> sent, received;
  std::thread sender([&] { sent = RunSends(ops, pair.send, plan, 64, deadline); });
  received = RunReceives(ops, pair.recv, plan, 32, deadline);
  sender.join();
  ASSERT_THAT(sent.status(), IsOk());
  ASSERT_THAT(received.status(), IsOk());
  ClosePair(pair);
  // More chunks than messages (chunked), three stripes, and the token bucket held chunks back.
  bool striped_and_paced = false;
  for (const std::string& line : log.lines()) {
    if (!absl::StrContains(line, "closed send comm")) continue;
    EXPECT_THAT(line, HasSubstr("slow link"));
    EXPECT_THAT(line, HasSubstr("over 3 stripes"));
    striped_and_paced = !absl::StrContains(line, " 0 pacing waits");
  }
  EXPECT_TRUE(striped_and_paced);
}


// ---------------------------------------------------------------------------------------------
// Device memory (NCCL_PTR_CUDA) staged through pinned buffers, on the emulated GPU: the copies
// are real memcpys on another thread, checked to go between declared device memory and live
// pinned buffers; Pause() holds them so that unfinished copies can be observed.

NetOptions StagedOptions(std::shared_ptr<EmulatedGpu> gpu, size_t staging_bytes = 64 << 20) {
  NetOptions options = LoopbackOptions();
  options.gpu = std::move(gpu);
  options.staging_bytes = staging_bytes;
  return options;
}

// Polls `request` a while and says whether it stayed not done (the copy it waits for is held).
bool StaysPending(Request* request) {
  for (int i = 0; i < 50; ++i) {
    bool done = false;
    if (!Net::Test(request, &done, nullptr).ok() || done) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(NetStagingTest, PropertiesAdvertiseCudaOnlyWithAGpu) {
  std::unique_ptr<Net> host = MakeNet(LoopbackOptions());
  LBCC_ASSERT_OK_AND_ASSIGN(DeviceProperties host_props, host->Properties(0));
  EXPECT_EQ(host_props.ptr_support, kPtrHost);
  std::unique_ptr<Net> staged = MakeNet(StagedOptions(std::make_shared<EmulatedGpu>()));
  LBCC_ASSERT_OK_AND_ASSIGN(DeviceProperties staged_props, staged->Properties(0));
  EXPECT_EQ(staged_props.ptr_support, kPtrHost | kPtrCuda);
}

TEST(NetStagingTest, RegisterChecksThatTheMemoryIsOnADevice) {
  auto gpu = std::make_shared<EmulatedGpu>();
  std::unique_ptr<Net> net = MakeNet(StagedOptions(gpu));
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*net, *net));
  std::vector<uint8_t> device(4096), host(4096);
  gpu->AddDeviceMemory(device.data(), device.size(), 0);
  LBCC_ASSERT_OK_AND_ASSIGN(void* mr, Net::RegMr(pair.send, device.data(), 4096, kPtrCuda));
  EXPECT_THAT(Net::RegMr(pair.send, host.data(), 4096, kPtrCuda).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device memory")));
  EXPECT_THAT(Net::RegMr(pair.send, device.data(), 8192, kPtrCuda).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Net::RegMr(pair.send, device.data(), 16, 0x4).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Net::DeregMr(pair.send, mr), IsOk());
  ClosePair(pair);
}

// The life of one staged message, step by step: the send is not handed to the transport before
// its device-to-host copy finished; the receive is not reported done before its host-to-device
// copy finished, and until then the device buffer is untouched.
TEST(NetStagingTest, TestReportsDoneOnlyAfterEachCopyFinished) {
  auto gpu = std::make_shared<EmulatedGpu>();
  std::unique_ptr<Net> net = MakeNet(StagedOptions(gpu));
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*net, *net));
  constexpr size_t kBytes = 3 << 20;
  std::vector<uint8_t> out(kBytes), in(kBytes + 64, 0xee);
  testing::FillPattern(11, absl::MakeSpan(out));
  gpu->AddDeviceMemory(out.data(), out.size(), 0);
  gpu->AddDeviceMemory(in.data(), in.size(), 0);
  LBCC_ASSERT_OK_AND_ASSIGN(void* out_mr, Net::RegMr(pair.send, out.data(), out.size(), kPtrCuda));
  LBCC_ASSERT_OK_AND_ASSIGN(void* in_mr, Net::RegMr(pair.recv, in.data(), in.size(), kPtrCuda));

  gpu->Pause();
  void* data[1] = {in.data()};
  size_t sizes[1] = {in.size()};
  int tags[1] = {9};
  void* mhandles[1] = {in_mr};
  LBCC_ASSERT_OK_AND_ASSIGN(Request * recv, Net::Irecv(pair.recv, 1, data, sizes, tags, mhandles));
  LBCC_ASSERT_OK_AND_ASSIGN(Request * send, Net::Isend(pair.send, out.data(), kBytes, 9, out_mr));
  ASSERT_NE(send, nullptr);
  EXPECT_EQ(gpu->counters().queued, 1u);  // The device-to-host copy.
  EXPECT_TRUE(StaysPending(send)) << "done before its copy ran";
  EXPECT_TRUE(StaysPending(recv)) << "nothing can have arrived";
  EXPECT_EQ(net->Properties(0)->ptr_support, kPtrHost | kPtrCuda);

  gpu->Resume();
  int sent[1] = {0};
  ASSERT_THAT(Wait(send, sent), IsOk());
  EXPECT_EQ(sent[0], static_cast<int>(kBytes));
  gpu->Pause();
  // The message lands in staging; test() then queues the copy to the device and waits for it.
  const absl::Time deadline = absl::Now() + kDeadline;
  while (gpu->counters().queued == 0) {
    bool done = false;
    ASSERT_THAT(Net::Test(recv, &done, nullptr), IsOk());
    ASSERT_FALSE(done) << "done before the copy to the device ran";
    ASSERT_LT(absl::Now(), deadline);
    std::this_thread::yield();
  }
  EXPECT_TRUE(StaysPending(recv));
  EXPECT_EQ(in[0], 0xee);  // Not in device memory yet.
  EXPECT_EQ(in[kBytes - 1], 0xee);

  gpu->Resume();
  int received[1] = {0};
  ASSERT_THAT(Wait(recv, received), IsOk());
  EXPECT_EQ(received[0], static_cast<int>(kBytes));
  EXPECT_EQ(testing::FindMismatch(11, absl::MakeConstSpan(in.data(), kBytes)), -1);
  EXPECT_EQ(in[kBytes], 0xee);  // Nothing past the message.
  const EmulatedGpu::Counters counters = gpu->counters();
  EXPECT_EQ(counters.copies_to_host, 1u);
  EXPECT_EQ(counters.copies_to_device, 1u);
  EXPECT_EQ(counters.bytes, 2 * kBytes);
  EXPECT_EQ(counters.events_live, 0u);
  EXPECT_THAT(Net::DeregMr(pair.send, out_mr), IsOk());
  EXPECT_THAT(Net::DeregMr(pair.recv, in_mr), IsOk());
  ClosePair(pair);
}

// A host-memory send posted behind a staged one under the same tag waits for it: the transport
// must see NCCL's posting order.
TEST(NetStagingTest, SendsLeaveInPostingOrderBehindACopy) {
  auto gpu = std::make_shared<EmulatedGpu>();
  std::unique_ptr<Net> net = MakeNet(StagedOptions(gpu));
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*net, *net));
  std::vector<uint8_t> device(1000), host(1000), first(1000), second(1000);
  testing::FillPattern(1, absl::MakeSpan(device));
  testing::FillPattern(2, absl::MakeSpan(host));
  gpu->AddDeviceMemory(device.data(), device.size(), 0);
  LBCC_ASSERT_OK_AND_ASSIGN(void* device_mr,
                            Net::RegMr(pair.send, device.data(), device.size(), kPtrCuda));
  gpu->Pause();
  LBCC_ASSERT_OK_AND_ASSIGN(Request * a, Net::Isend(pair.send, device.data(), 1000, 4, device_mr));
  LBCC_ASSERT_OK_AND_ASSIGN(Request * b, Net::Isend(pair.send, host.data(), 1000, 4, nullptr));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(StaysPending(b)) << "a host send overtook a staged one";
  void* data[1] = {first.data()};
  size_t sizes[1] = {first.size()};
  int tags[1] = {4};
  LBCC_ASSERT_OK_AND_ASSIGN(Request * r1, Net::Irecv(pair.recv, 1, data, sizes, tags, nullptr));
  data[0] = second.data();
  LBCC_ASSERT_OK_AND_ASSIGN(Request * r2, Net::Irecv(pair.recv, 1, data, sizes, tags, nullptr));
  gpu->Resume();
  ASSERT_THAT(Wait(b), IsOk());  // Testing the later one moves the queue too.
  ASSERT_THAT(Wait(a), IsOk());
  ASSERT_THAT(Wait(r1), IsOk());
  ASSERT_THAT(Wait(r2), IsOk());
  EXPECT_EQ(testing::FindMismatch(1, first), -1);
  EXPECT_EQ(testing::FindMismatch(2, second), -1);
  ClosePair(pair);
}

// The pool bounds pinned memory: a comm that already holds staging gets no request (NCCL calls
// again) rather than more memory, and gets one once a request retired.
TEST(NetStagingTest, FullPoolAnswersNoRequestUntilStagingComesBack) {
  auto gpu = std::make_shared<EmulatedGpu>();
  gpu->TreatAllMemoryAsDevice(0);
  std::unique_ptr<Net> net = MakeNet(StagedOptions(gpu, /*staging_bytes=*/1 << 20));
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*net, *net));
  std::vector<uint8_t> in1(1 << 20), in2(1 << 20), out(1 << 20);
  testing::FillPattern(3, absl::MakeSpan(out));
  LBCC_ASSERT_OK_AND_ASSIGN(void* in1_mr, Net::RegMr(pair.recv, in1.data(), in1.size(), kPtrCuda));
  LBCC_ASSERT_OK_AND_ASSIGN(void* in2_mr, Net::RegMr(pair.recv, in2.data(), in2.size(), kPtrCuda));
  void* data[1] = {in1.data()};
  size_t sizes[1] = {in1.size()};
  int tags[1] = {0};
  void* mhandles[1] = {in1_mr};
  LBCC_ASSERT_OK_AND_ASSIGN(Request * r1, Net::Irecv(pair.recv, 1, data, sizes, tags, mhandles));
  ASSERT_NE(r1, nullptr);
  data[0] = in2.data();
  mhandles[0] = in2_mr;
  LBCC_ASSERT_OK_AND_ASSIGN(Request * refused,
                            Net::Irecv(pair.recv, 1, data, sizes, tags, mhandles));
  EXPECT_EQ(refused, nullptr);
  // The send comm holds no staging yet: it gets a buffer even though the pool is full.
  LBCC_ASSERT_OK_AND_ASSIGN(void* out_mr, Net::RegMr(pair.send, out.data(), out.size(), kPtrCuda));
  LBCC_ASSERT_OK_AND_ASSIGN(Request * s1, Net::Isend(pair.send, out.data(), out.size(), 0, out_mr));
  ASSERT_NE(s1, nullptr);
  ASSERT_THAT(Wait(s1), IsOk());
  ASSERT_THAT(Wait(r1), IsOk());
  EXPECT_EQ(testing::FindMismatch(3, in1), -1);
  LBCC_ASSERT_OK_AND_ASSIGN(Request * r2, Net::Irecv(pair.recv, 1, data, sizes, tags, mhandles));
  EXPECT_NE(r2, nullptr);
  ClosePair(pair);
  EXPECT_EQ(gpu->counters().events_live, 0u);
}

TEST(NetStagingTest, FailedCopyFailsItsRequestAndTheCommCarriesOn) {
  auto gpu = std::make_shared<EmulatedGpu>();
  gpu->TreatAllMemoryAsDevice(0);
  std::unique_ptr<Net> net = MakeNet(StagedOptions(gpu));
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*net, *net));
  std::vector<uint8_t> out(5000), in(5000);
  testing::FillPattern(5, absl::MakeSpan(out));
  LBCC_ASSERT_OK_AND_ASSIGN(void* out_mr, Net::RegMr(pair.send, out.data(), out.size(), kPtrCuda));
  LBCC_ASSERT_OK_AND_ASSIGN(void* in_mr, Net::RegMr(pair.recv, in.data(), in.size(), kPtrCuda));
  // A failed copy to the host: the send fails and sends nothing.
  gpu->FailNextCopy(absl::InternalError("emulated ECC error"));
  LBCC_ASSERT_OK_AND_ASSIGN(Request * bad, Net::Isend(pair.send, out.data(), 5000, 1, out_mr));
  EXPECT_THAT(Wait(bad), StatusIs(absl::StatusCode::kInternal, HasSubstr("ECC")));
  // The next send and a receive whose copy to the device fails.
  void* data[1] = {in.data()};
  size_t sizes[1] = {in.size()};
  int tags[1] = {1};
  void* mhandles[1] = {in_mr};
  LBCC_ASSERT_OK_AND_ASSIGN(Request * recv, Net::Irecv(pair.recv, 1, data, sizes, tags, mhandles));
  LBCC_ASSERT_OK_AND_ASSIGN(Request * good, Net::Isend(pair.send, out.data(), 5000, 1, out_mr));
  ASSERT_THAT(Wait(good), IsOk());
  gpu->FailNextCopy(absl::InternalError("emulated copy failure"));
  EXPECT_THAT(Wait(recv), StatusIs(absl::StatusCode::kInternal));
  // And the comms still work.
  LBCC_ASSERT_OK_AND_ASSIGN(recv, Net::Irecv(pair.recv, 1, data, sizes, tags, mhandles));
  LBCC_ASSERT_OK_AND_ASSIGN(good, Net::Isend(pair.send, out.data(), 5000, 1, out_mr));
  ASSERT_THAT(Wait(good), IsOk());
  ASSERT_THAT(Wait(recv), IsOk());
  EXPECT_EQ(testing::FindMismatch(5, in), -1);
  ClosePair(pair);
  EXPECT_EQ(gpu->counters().events_live, 0u);
}

// NCCL's abort path with copies in flight: close waits for them (the GPU must not write into
// staging or NCCL's buffers afterwards) and gives every event and buffer back.
TEST(NetStagingTest, CloseWaitsForCopiesInFlight) {
  auto gpu = std::make_shared<EmulatedGpu>();
  gpu->TreatAllMemoryAsDevice(0);
  std::unique_ptr<Net> net = MakeNet(StagedOptions(gpu));
  LBCC_ASSERT_OK_AND_ASSIGN(Pair pair, Connect(*net, *net));
  std::vector<uint8_t> out(1 << 20);
  LBCC_ASSERT_OK_AND_ASSIGN(void* out_mr, Net::RegMr(pair.send, out.data(), out.size(), kPtrCuda));
  gpu->Pause();
  for (int i = 0; i < 4; ++i) {
    LBCC_ASSERT_OK_AND_ASSIGN(Request * r, Net::Isend(pair.send, out.data(), out.size(), i, out_mr));
    ASSERT_NE(r, nullptr);
  }
  EXPECT_EQ(gpu->counters().queued, 4u);
  std::thread resume([&] {
    absl::SleepFor(absl::Milliseconds(100));
    gpu->Resume();
  });
  EXPECT_THAT(Net::CloseSend(pair.send), IsOk());
  resume.join();
  EXPECT_EQ(gpu->counters().queued, 0u);
  EXPECT_EQ(gpu->counters().events_live, 0u);
  EXPECT_THAT(Net::CloseRecv(pair.recv), IsOk());
  EXPECT_THAT(Net::CloseListen(pair.listen), IsOk());
}

// Thousands of messages (0 B to 4 MiB, grouped receives of 1-8, 32 receives in flight) through
// the staging path, each side in device or host memory, every byte checked, with a pool small
// enough to run full.
class NetStagingTrafficTest : public ::testing::TestWithParam<std::pair<bool, bool>> {};

TEST_P(NetStagingTrafficTest, EveryByteArrives) {
  const auto [send_device, recv_device] = GetParam();
  auto gpu_a = std::make_shared<EmulatedGpu>();
  auto gpu_b = std::make_shared<EmulatedGpu>();
  gpu_a->TreatAllMemoryAsDevice(0);
  gpu_b->TreatAllMemoryAsDevice(1);
  std::unique_ptr<Net> a = MakeNet(StagedOptions(gpu_a, 16 << 20));
  std::unique_ptr<Net> b = MakeNet(StagedOptions(gpu_b, 16 << 20));
  LBCC_ASSERT_OK_AND_ASSIGN(Pair ab, Connect(*a, *b));
  testing::PlanOptions plan_options;
  plan_options.groups = 300;
  plan_options.max_random_bytes = 1 << 20;
  plan_options.special_sizes = {0, 4 << 20};
  const testing::Plan plan = testing::MakePlan(plan_options);
  DirectOps send_ops(send_device ? kPtrCuda : kPtrHost);
  DirectOps recv_ops(recv_device ? kPtrCuda : kPtrHost);
  const absl::Time deadline = absl::Now() + kDeadline;
  absl::StatusOr<testing::TrafficStats> sent, received;
  std::thread sender([&] { sent = RunSends(send_ops, ab.send, plan, 256, deadline); });
  received = RunReceives(recv_ops, ab.recv, plan, 32, deadline);
  sender.join();
  ASSERT_THAT(sent.status(), IsOk());
  ASSERT_THAT(received.status(), IsOk());
  EXPECT_EQ(received->messages, plan.messages);
  EXPECT_EQ(received->bytes, plan.bytes);
  ClosePair(ab);
  const EmulatedGpu::Counters ca = gpu_a->counters();
  const EmulatedGpu::Counters cb = gpu_b->counters();
  EXPECT_EQ(ca.copies_to_host > 0, send_device);
  EXPECT_EQ(cb.copies_to_device > 0, recv_device);
  EXPECT_EQ(ca.copies_to_device + cb.copies_to_host, 0u);
  if (send_device) {
    EXPECT_EQ(ca.bytes, plan.bytes);
  }
  if (recv_device) {
    EXPECT_EQ(cb.bytes, plan.bytes);
  }
  EXPECT_EQ(ca.events_live + cb.events_live, 0u);
  // Pinned memory stayed within the pool (plus the one-request exception).
  EXPECT_LE(ca.pinned_bytes, (16u << 20) + (4u << 20));
  EXPECT_LE(cb.pinned_bytes, (16u << 20) + (8u << 20));
}

INSTANTIATE_TEST_SUITE_P(DeviceOrHost, NetStagingTrafficTest,
                         ::testing::Values(std::pair<bool, bool>{true, true},
                                           std::pair<bool, bool>{true, false},
                                           std::pair<bool, bool>{false, true}));

}  // namespace
}  // namespace lbcc::plugin
