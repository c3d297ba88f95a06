// Link against fake lanes: the test thread plays the backend, so chunking, matching, the slow-link
// window, priorities, striping, pacing and failure handling are checked step by step.
#include "transport/link.h"

#include <deque>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "transport/test_util.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::transport {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::StatusIs;
using ::testing::ElementsAre;

using ::lbcc::transport::testing::kWait;
constexpr uint8_t kHigh = static_cast<uint8_t>(Priority::kHigh);
constexpr uint8_t kNormal = static_cast<uint8_t>(Priority::kNormal);
constexpr uint8_t kBulk = static_cast<uint8_t>(Priority::kBulk);
using ::lbcc::transport::testing::RecvResult;
using ::lbcc::transport::testing::SendResult;

// Records what a Link hands to a lane; the test completes it.
class FakeLane final : public Lane {
 public:
  struct Sent {
    ChunkHeader header;
    const uint8_t* data;
    size_t length;
    DoneCallback done;
  };
  void SendChunk(const ChunkHeader& header, const uint8_t* data, size_t length,
                 DoneCallback done) override {
    MutexLock lock(&mu_);
    sent_.push_back({header, data, length, std::move(done)});
  }
  void SendCredit(uint64_t bytes, uint8_t) override {
    MutexLock lock(&mu_);
    credits_.push_back(bytes);
  }
  void Close() override {
    MutexLock lock(&mu_);
    closed_ = true;
  }

  size_t sent_count() {
    MutexLock lock(&mu_);
    return sent_.size();
  }
  ChunkHeader header(size_t i) {
    MutexLock lock(&mu_);
    return sent_.at(i).header;
  }
  // Runs the `done` of chunk i (on the test thread, which holds no Link lock).
  void Complete(size_t i, absl::Status status = absl::OkStatus()) {
    DoneCallback done;
    {
      MutexLock lock(&mu_);
      done = std::move(sent_.at(i).done);
    }
    done(std::move(status));
  }
  // Runs every `done` not yet run.
  void CompleteRest(absl::Status status) {
    std::vector<DoneCallback> rest;
    {
      MutexLock lock(&mu_);
      for (Sent& sent : sent_) {
        if (sent.done) rest.push_back(std::move(sent.done));
      }
    }
    for (DoneCallback& done : rest) done(status);
  }
  std::vector<uint64_t> credits() {
    MutexLock lock(&mu_);
    return credits_;
  }
  bool closed() {
    MutexLock lock(&mu_);
    return closed_;
  }
  bool WaitForSent(size_t n, absl::Duration timeout = kWait) {
    MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sent_.size() >= n; };
    return mu_.AwaitWithTimeout(ready, timeout);
  }

 private:
  Mutex mu_;
  std::vector<Sent> sent_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> credits_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class FakeDeferred final : public DeferredPayload {
 public:
  FakeDeferred(std::vector<uint8_t> bytes, bool* discarded, uint8_t** fetched_to,
               DoneCallback* fetch_done)
      : bytes_(std::move(bytes)),
        discarded_(discarded),
        fetched_to_(fetched_to),
        fetch_done_(fetch_done) {}
  ~FakeDeferred() override {
    if (!fetched_) *discarded_ = true;
  }
  void Fetch(uint8_t* dst, DoneCallback done) override {
    fetched_ = true;
    std::copy(bytes_.begin(), bytes_.end(), dst);
    *fetched_to_ = dst;
    *fetch_done_ = std::move(done);  // The test runs it later, as a backend would.
  }

 private:
  std::vector<uint8_t> bytes_;
  bool fetched_ = false;
  bool* discarded_;
  uint8_t** fetched_to_;
  DoneCallback* fetch_done_;
};

// Waits until everything posted to the executor so far has run.
void Drain(Executor& executor) {
  auto done = std::make_shared<SendResult>();
  executor.Post([callback = done->Callback()]() mutable { callback(absl::OkStatus()); });
  ASSERT_THAT(done->Wait(), IsOk());
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

ChunkHeader Header(uint64_t msg_seq, Tag tag, uint64_t tag_seq, uint64_t total, uint64_t offset,
                   uint32_t length, uint8_t flags = 0) {
  ChunkHeader h{};
  h.msg_seq = msg_seq;
  h.tag = tag;
  h.tag_seq = tag_seq;
  h.total_size = total;
  h.offset = offset;
  h.length = length;
  h.flags = flags;
  h.version = kWireVersion;
  return h;
}

class LinkTest : public ::testing::Test {
 protected:
  void Make(LinkClass link_class, int lanes, SchedulerOptions scheduler,
            int64_t fast_chunk = 1000, ProbeResult probe = {}) {
    link_ = std::make_shared<Link>(executor_, "fake-peer");
    for (int i = 0; i < lanes; ++i) {
      lanes_.push_back(std::make_shared<FakeLane>());
      link_->AddLane(lanes_.back());
    }
    link_->Configure(link_class, scheduler, fast_chunk, probe);
  }
  SchedulerOptions Slow(int64_t chunk, int64_t window) {
    SchedulerOptions s;
    s.chunk_bytes = chunk;
    s.window_bytes = window;
    return s;
  }
  void TearDown() override {
    if (link_ != nullptr) link_->Close();
    // Backends run every outstanding done after Close; play that part.
    for (auto& lane : lanes_) lane->CompleteRest(absl::CancelledError("lane closed"));
    Drain(*executor_);
  }

  // Callback results outlive the test body: callbacks may still run in TearDown.
  SendResult& NewSendResult() { return send_results_.emplace_back(); }
  RecvResult& NewRecvResult() { return recv_results_.emplace_back(); }

  std::deque<SendResult> send_results_;
  std::deque<RecvResult> recv_results_;
  std::shared_ptr<Executor> executor_ = std::make_shared<Executor>("link-test");
  std::shared_ptr<Link> link_;
  std::vector<std::shared_ptr<FakeLane>> lanes_;
};

TEST_F(LinkTest, FastLinkHandsEveryChunkAtOnceAndCompletesAfterAll) {
  Make(LinkClass::kFast, 1, {}, /*fast_chunk=*/1000);
  std::vector<uint8_t> data = Bytes(2500, 1);
  SendResult& sent = NewSendResult();
  link_->Send(7, data, {}, sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 3u);
  EXPECT_EQ(lanes_[0]->header(0).length, 1000u);
  EXPECT_EQ(lanes_[0]->header(1).offset, 1000u);
  EXPECT_EQ(lanes_[0]->header(2).length, 500u);
  EXPECT_EQ(lanes_[0]->header(2).flags & kChunkNeedsCredit, 0);
  lanes_[0]->Complete(0);
  lanes_[0]->Complete(2);
  Drain(*executor_);
  EXPECT_FALSE(sent.done());
  lanes_[0]->Complete(1);
  EXPECT_THAT(sent.Wait(), IsOk());
  EXPECT_NE(sent.thread(), std::this_thread::get_id());
  LinkCounters c = link_->counters();
  EXPECT_EQ(c.bytes_sent, 2500u);
  EXPECT_EQ(c.messages_sent, 1u);
  EXPECT_EQ(c.chunks_sent, 3u);
}

TEST_F(LinkTest, ZeroByteMessageIsOneChunk) {
  Make(LinkClass::kSlow, 1, Slow(100, 100));
  SendResult& sent = NewSendResult();
  link_->Send(1, {}, {}, sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 1u);
  EXPECT_EQ(lanes_[0]->header(0).length, 0u);
  EXPECT_EQ(lanes_[0]->header(0).total_size, 0u);
  lanes_[0]->Complete(0);
  EXPECT_THAT(sent.Wait(), IsOk());
}

TEST_F(LinkTest, SlowLinkKeepsTheWindowAndResumesOnCredit) {
  Make(LinkClass::kSlow, 1, Slow(100, 200));
  std::vector<uint8_t> data = Bytes(1000, 2);
  SendResult& sent = NewSendResult();
  link_->Send(1, data, {Priority::kBulk}, sent.Callback());
  EXPECT_EQ(lanes_[0]->sent_count(), 2u);
  EXPECT_EQ(link_->counters().inflight_bytes, 200u);
  EXPECT_EQ(link_->counters().queued_bytes, 800u);
  EXPECT_EQ(lanes_[0]->header(0).flags & kChunkNeedsCredit, kChunkNeedsCredit);
  link_->OnCredit(0, 100, kBulk);
  EXPECT_EQ(lanes_[0]->sent_count(), 3u);
  for (int i = 0; i < 7; ++i) link_->OnCredit(0, 100, kBulk);
  ASSERT_EQ(lanes_[0]->sent_count(), 10u);
  for (size_t i = 0; i < 10; ++i) lanes_[0]->Complete(i);
  EXPECT_THAT(sent.Wait(), IsOk());
}

TEST_F(LinkTest, HighPriorityOvertakesQueuedBulkAtTheNextChunk) {
  Make(LinkClass::kSlow, 1, Slow(100, 100));
  std::vector<uint8_t> bulk = Bytes(1000, 3);
  std::vector<uint8_t> high = Bytes(150, 4);
  std::vector<uint8_t> normal = Bytes(100, 5);
  SendResult& bulk_sent = NewSendResult();
  SendResult& high_sent = NewSendResult();
  SendResult& normal_sent = NewSendResult();
  link_->Send(/*tag=*/1, bulk, {Priority::kBulk}, bulk_sent.Callback());
  link_->Send(/*tag=*/3, normal, {Priority::kNormal}, normal_sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 1u);  // One bulk chunk fills the window.
  EXPECT_EQ(lanes_[0]->header(0).tag, 1u);
  // The highest priority may exceed the window by one chunk, so it leaves at once.
  link_->Send(/*tag=*/2, high, {Priority::kHigh}, high_sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 2u);
  link_->OnCredit(0, 100, kBulk);
  link_->OnCredit(0, 100, kHigh);
  link_->OnCredit(0, 50, kHigh);
  ASSERT_EQ(lanes_[0]->sent_count(), 4u);
  EXPECT_EQ(lanes_[0]->header(3).tag, 3u);  // Normal before bulk.
  link_->OnCredit(0, 100, kNormal);
  ASSERT_EQ(lanes_[0]->sent_count(), 5u);
  EXPECT_EQ(lanes_[0]->header(1).tag, 2u);
  EXPECT_EQ(lanes_[0]->header(2).tag, 2u);
  EXPECT_EQ(lanes_[0]->header(2).length, 50u);
  EXPECT_EQ(lanes_[0]->header(2).priority, static_cast<uint8_t>(Priority::kHigh));
  EXPECT_EQ(lanes_[0]->header(4).tag, 1u);
  EXPECT_EQ(lanes_[0]->header(4).offset, 100u);
  lanes_[0]->Complete(1);
  lanes_[0]->Complete(2);
  EXPECT_THAT(high_sent.Wait(), IsOk());
  EXPECT_FALSE(bulk_sent.done());
  EXPECT_EQ(link_->counters().max_queued_messages, 3u);
}

TEST_F(LinkTest, LowerPriorityWaitsWhileAHigherPriorityChunkIsInFlight) {
  // A rendezvous hand-shake takes round trips; bulk chunks handed meanwhile would get ahead of
  // the high-priority bytes on the connection.
  Make(LinkClass::kSlow, 1, Slow(100, 1000));
  std::vector<uint8_t> high = Bytes(100, 1);
  std::vector<uint8_t> bulk = Bytes(300, 2);
  SendResult& high_sent = NewSendResult();
  SendResult& bulk_sent = NewSendResult();
  link_->Send(1, high, {Priority::kHigh}, high_sent.Callback());
  link_->Send(2, bulk, {Priority::kBulk}, bulk_sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 1u);
  link_->OnCredit(0, 100, kHigh);
  ASSERT_EQ(lanes_[0]->sent_count(), 4u);
  EXPECT_EQ(lanes_[0]->header(3).tag, 2u);
}

TEST_F(LinkTest, StripesSpreadChunksOverLanes) {
  Make(LinkClass::kSlow, 3, Slow(100, 300));
  std::vector<uint8_t> data = Bytes(600, 5);
  SendResult& sent = NewSendResult();
  link_->Send(1, data, {}, sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 1u);
  ASSERT_EQ(lanes_[1]->sent_count(), 1u);
  ASSERT_EQ(lanes_[2]->sent_count(), 1u);
  link_->OnCredit(1, 100, kNormal);
  ASSERT_EQ(lanes_[1]->sent_count(), 2u);  // The lane that drained gets the next chunk.
  EXPECT_EQ(link_->counters().stripes, 3);
}

TEST_F(LinkTest, PacingHoldsChunksToTheRate) {
  SchedulerOptions s = Slow(10000, 1 << 20);
  s.pace_bytes_per_second = 1e6;  // 10 ms per chunk.
  Make(LinkClass::kSlow, 1, s);
  std::vector<uint8_t> data = Bytes(100000, 6);
  SendResult& sent = NewSendResult();
  const absl::Time start = absl::Now();
  link_->Send(1, data, {}, sent.Callback());
  // The bucket holds at most one chunk of tokens and refills at the rate, so no more chunks can
  // have left than that allows by now (a bound: a descheduled test thread only lets more leave).
  const size_t sent_at_once = lanes_[0]->sent_count();
  const double elapsed_s = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_GE(sent_at_once, 1u);
  EXPECT_LE(sent_at_once, 1 + static_cast<size_t>(elapsed_s * s.pace_bytes_per_second / 10000));
  ASSERT_TRUE(lanes_[0]->WaitForSent(10));
  // Nine more chunks at 1 MB/s cannot leave sooner than 90 ms (a lower bound, not a timing
  // expectation: a slow machine only makes it later).
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  EXPECT_GE(link_->counters().pacing_waits, 1u);
  for (size_t i = 0; i < 10; ++i) lanes_[0]->Complete(i);
  EXPECT_THAT(sent.Wait(), IsOk());
}

TEST_F(LinkTest, PacingNeverHoldsHighPriority) {
  SchedulerOptions s = Slow(1000, 1 << 20);
  s.pace_bytes_per_second = 1000;  // One chunk a second: anything paced would still be waiting.
  Make(LinkClass::kSlow, 1, s);
  std::vector<uint8_t> normal = Bytes(1000, 1);
  std::vector<uint8_t> high = Bytes(5000, 2);
  SendResult& normal_sent = NewSendResult();
  SendResult& high_sent = NewSendResult();
  link_->Send(1, normal, {Priority::kNormal}, normal_sent.Callback());  // Takes the bucket's chunk.
  link_->Send(2, high, {Priority::kHigh}, high_sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 6u);  // All five high chunks went at once.
  for (size_t i = 1; i < 6; ++i) EXPECT_EQ(lanes_[0]->header(i).tag, 2u);
  EXPECT_EQ(link_->counters().pacing_waits, 0u);
  for (size_t i = 0; i < 6; ++i) lanes_[0]->Complete(i);
  EXPECT_THAT(normal_sent.Wait(), IsOk());
  EXPECT_THAT(high_sent.Wait(), IsOk());
}

TEST_F(LinkTest, BulkYieldsOnlyWhileNonBulkTrafficRuns) {
  ProbeResult probe;
  probe.send_bytes_per_second = 1e6;
  probe.recv_bytes_per_second = 1e6;
  Make(LinkClass::kSlow, 1, Slow(64 << 10, 1 << 20), 1000, probe);
  // Bulk alone: full chunks, unpaced.
  std::vector<uint8_t> first = Bytes(128 << 10, 1);
  SendResult& first_sent = NewSendResult();
  link_->Send(1, first, {Priority::kBulk}, first_sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 2u);
  EXPECT_EQ(lanes_[0]->header(0).length, 64u << 10);
  EXPECT_EQ(link_->counters().bulk_pace_bytes_per_second, 0);
  // A latency-critical message, then more bulk: bulk now leaves in small paced chunks.
  std::vector<uint8_t> high = Bytes(100, 2);
  std::vector<uint8_t> second = Bytes(40000, 3);
  SendResult& high_sent = NewSendResult();
  SendResult& second_sent = NewSendResult();
  link_->Send(2, high, {Priority::kHigh}, high_sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 3u);
  link_->OnCredit(0, 100, kHigh);  // Bulk never leaves while a higher priority is in flight.
  link_->Send(3, second, {Priority::kBulk}, second_sent.Callback());
  const LinkCounters c = link_->counters();
  EXPECT_GT(c.bulk_pace_bytes_per_second, kBulkYieldFloor * probe.send_bytes_per_second);
  EXPECT_LE(c.bulk_pace_bytes_per_second, (1 - kBulkYieldMargin) * probe.send_bytes_per_second);
  ASSERT_GE(lanes_[0]->sent_count(), 4u);
  const uint32_t chunk = lanes_[0]->header(3).length;
  EXPECT_EQ(chunk, static_cast<uint32_t>(kBulkYieldMinChunkBytes));
  // 40000 bytes in 4 KiB chunks at under 1 MB/s: the bucket must have held some back.
  ASSERT_TRUE(lanes_[0]->WaitForSent(3 + (40000 + chunk - 1) / chunk));
  EXPECT_GE(link_->counters().pacing_waits, 1u);
  for (size_t i = 0; i < lanes_[0]->sent_count(); ++i) lanes_[0]->Complete(i);
  EXPECT_THAT(first_sent.Wait(), IsOk());
  EXPECT_THAT(high_sent.Wait(), IsOk());
  EXPECT_THAT(second_sent.Wait(), IsOk());
}

TEST_F(LinkTest, BulkDoesNotYieldToControlMessages) {
  ProbeResult probe;
  probe.send_bytes_per_second = 1e6;
  Make(LinkClass::kSlow, 1, Slow(64 << 10, 1 << 20), 1000, probe);
  std::vector<uint8_t> vote = Bytes(100, 1);
  std::vector<uint8_t> bulk = Bytes(128 << 10, 2);
  SendResult& vote_sent = NewSendResult();
  SendResult& bulk_sent = NewSendResult();
  link_->Send(1, vote, {Priority::kHigh, /*control=*/true}, vote_sent.Callback());
  link_->OnCredit(0, 100, kHigh);
  link_->Send(2, bulk, {Priority::kBulk}, bulk_sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 3u);
  EXPECT_EQ(lanes_[0]->header(1).length, 64u << 10);
  EXPECT_EQ(link_->counters().bulk_pace_bytes_per_second, 0);
  for (size_t i = 0; i < 3; ++i) lanes_[0]->Complete(i);
  EXPECT_THAT(vote_sent.Wait(), IsOk());
  EXPECT_THAT(bulk_sent.Wait(), IsOk());
}

TEST_F(LinkTest, BulkDoesNotYieldWhenTurnedOff) {
  ProbeResult probe;
  probe.send_bytes_per_second = 1e6;
  SchedulerOptions s = Slow(64 << 10, 1 << 20);
  s.bulk_yield = false;
  Make(LinkClass::kSlow, 1, s, 1000, probe);
  std::vector<uint8_t> high = Bytes(100, 1);
  std::vector<uint8_t> bulk = Bytes(128 << 10, 2);
  SendResult& high_sent = NewSendResult();
  SendResult& bulk_sent = NewSendResult();
  link_->Send(1, high, {Priority::kHigh}, high_sent.Callback());
  link_->OnCredit(0, 100, kHigh);
  link_->Send(2, bulk, {Priority::kBulk}, bulk_sent.Callback());
  ASSERT_EQ(lanes_[0]->sent_count(), 3u);
  EXPECT_EQ(lanes_[0]->header(1).length, 64u << 10);
  EXPECT_EQ(link_->counters().pacing_waits, 0u);
  for (size_t i = 0; i < 3; ++i) lanes_[0]->Complete(i);
  EXPECT_THAT(high_sent.Wait(), IsOk());
  EXPECT_THAT(bulk_sent.Wait(), IsOk());
}

TEST_F(LinkTest, CloseCancelsQueuedPendingAndLaterWork) {
  Make(LinkClass::kSlow, 1, Slow(100, 100));
  std::vector<uint8_t> data = Bytes(1000, 7);
  std::vector<uint8_t> buffer(10);
  SendResult& sent = NewSendResult();
  SendResult& late_send = NewSendResult();
  RecvResult& received = NewRecvResult();
  RecvResult& late_recv = NewRecvResult();
  link_->Send(1, data, {}, sent.Callback());
  link_->Recv(1, absl::MakeSpan(buffer), received.Callback());
  link_->Close();
  EXPECT_TRUE(lanes_[0]->closed());
  EXPECT_THAT(received.Wait(), StatusIs(absl::StatusCode::kCancelled));
  // The chunk handed to the lane is still the backend's: the send waits for it.
  Drain(*executor_);
  EXPECT_FALSE(sent.done());
  lanes_[0]->Complete(0, absl::CancelledError("lane closed"));
  EXPECT_THAT(sent.Wait(), StatusIs(absl::StatusCode::kCancelled));
  link_->Send(1, data, {}, late_send.Callback());
  link_->Recv(1, absl::MakeSpan(buffer), late_recv.Callback());
  EXPECT_THAT(late_send.Wait(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(late_recv.Wait(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_NE(late_send.thread(), std::this_thread::get_id());
  EXPECT_EQ(sent.calls(), 1);
  EXPECT_EQ(received.calls(), 1);
}

TEST_F(LinkTest, PeerLossFailsWithUnavailable) {
  Make(LinkClass::kFast, 1, {});
  std::vector<uint8_t> buffer(10);
  RecvResult& received = NewRecvResult();
  link_->Recv(3, absl::MakeSpan(buffer), received.Callback());
  link_->Fail(absl::UnavailableError("peer gone"));
  EXPECT_THAT(received.Wait(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(LinkTest, LostChunkFailsTheLinkWithUnavailable) {
  Make(LinkClass::kFast, 1, {});
  std::vector<uint8_t> data = Bytes(10, 8);
  SendResult& sent = NewSendResult();
  link_->Send(1, data, {}, sent.Callback());
  lanes_[0]->Complete(0, absl::InternalError("connection reset"));
  EXPECT_THAT(sent.Wait(), StatusIs(absl::StatusCode::kInternal));
  EXPECT_TRUE(link_->failed());
  SendResult& after = NewSendResult();
  link_->Send(1, data, {}, after.Callback());
  EXPECT_THAT(after.Wait(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(LinkTest, MatchesByTagOrderWhateverTheArrivalOrder) {
  Make(LinkClass::kFast, 1, {});
  std::vector<uint8_t> first = Bytes(30, 10), second = Bytes(20, 20);
  // Message 1 of tag 5 arrives (in two chunks) before message 0.
  link_->OnChunk(0, Header(1, 5, 1, 20, 10, 10), second.data() + 10, nullptr);
  link_->OnChunk(0, Header(1, 5, 1, 20, 0, 10), second.data(), nullptr);
  std::vector<uint8_t> a(64), b(64);
  RecvResult& ra = NewRecvResult();
  RecvResult& rb = NewRecvResult();
  link_->Recv(5, absl::MakeSpan(a), ra.Callback());
  link_->Recv(5, absl::MakeSpan(b), rb.Callback());
  Drain(*executor_);
  EXPECT_FALSE(ra.done());
  EXPECT_FALSE(rb.done());
  link_->OnChunk(0, Header(0, 5, 0, 30, 0, 30), first.data(), nullptr);
  EXPECT_THAT(ra.Wait(), IsOkAndHolds(30u));
  EXPECT_THAT(rb.Wait(), IsOkAndHolds(20u));
  EXPECT_TRUE(std::equal(first.begin(), first.end(), a.begin()));
  EXPECT_TRUE(std::equal(second.begin(), second.end(), b.begin()));
  EXPECT_EQ(link_->counters().messages_received, 2u);
  EXPECT_EQ(link_->counters().bytes_received, 50u);
}

TEST_F(LinkTest, ReturnsCreditsWhenChunksArrive) {
  Make(LinkClass::kSlow, 1, Slow(100, 100));
  std::vector<uint8_t> data = Bytes(100, 1);
  link_->OnChunk(0, Header(0, 1, 0, 100, 0, 100, kChunkNeedsCredit), data.data(), nullptr);
  EXPECT_THAT(lanes_[0]->credits(), ElementsAre(100u));
}

TEST_F(LinkTest, FetchedChunkIsCreditedWhenItsBytesHaveArrived) {
  Make(LinkClass::kSlow, 1, Slow(100, 100));
  std::vector<uint8_t> buffer(100);
  RecvResult& received = NewRecvResult();
  link_->Recv(1, absl::MakeSpan(buffer), received.Callback());
  bool discarded = false;
  uint8_t* fetched_to = nullptr;
  DoneCallback fetch_done;
  link_->OnChunk(0, Header(0, 1, 0, 100, 0, 100, kChunkNeedsCredit), nullptr,
                 std::make_unique<FakeDeferred>(Bytes(100, 1), &discarded, &fetched_to,
                                                &fetch_done));
  EXPECT_TRUE(lanes_[0]->credits().empty());  // The bytes are still crossing the link.
  fetch_done(absl::OkStatus());
  EXPECT_THAT(lanes_[0]->credits(), ElementsAre(100u));
  EXPECT_THAT(received.Wait(), IsOkAndHolds(100u));
}

TEST_F(LinkTest, ParkedChunkIsCreditedAtOnce) {
  Make(LinkClass::kSlow, 1, Slow(100, 100));
  bool discarded = false;
  uint8_t* fetched_to = nullptr;
  DoneCallback fetch_done;
  link_->OnChunk(0, Header(0, 1, 0, 100, 0, 100, kChunkNeedsCredit), nullptr,
                 std::make_unique<FakeDeferred>(Bytes(100, 1), &discarded, &fetched_to,
                                                &fetch_done));
  // No receive is posted: the bytes stay at the sender, which must not stall meanwhile.
  EXPECT_THAT(lanes_[0]->credits(), ElementsAre(100u));
  link_->Close();  // Discards the parked chunk while `discarded` is alive.
  EXPECT_TRUE(discarded);
}

TEST_F(LinkTest, DeferredChunkIsFetchedIntoTheBufferAfterMatching) {
  Make(LinkClass::kFast, 1, {});
  bool discarded = false;
  uint8_t* fetched_to = nullptr;
  DoneCallback fetch_done;
  std::vector<uint8_t> payload = Bytes(40, 3);
  link_->OnChunk(0, Header(0, 9, 0, 50, 10, 40), nullptr,
                 std::make_unique<FakeDeferred>(payload, &discarded, &fetched_to, &fetch_done));
  std::vector<uint8_t> head = Bytes(10, 9);
  link_->OnChunk(0, Header(0, 9, 0, 50, 0, 10), head.data(), nullptr);
  std::vector<uint8_t> buffer(50);
  RecvResult& received = NewRecvResult();
  link_->Recv(9, absl::MakeSpan(buffer), received.Callback());
  ASSERT_EQ(fetched_to, buffer.data() + 10);
  Drain(*executor_);
  EXPECT_FALSE(received.done());
  fetch_done(absl::OkStatus());
  EXPECT_THAT(received.Wait(), IsOkAndHolds(50u));
  EXPECT_FALSE(discarded);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), buffer.begin()));
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), buffer.begin() + 10));
}

TEST_F(LinkTest, TooSmallBufferConsumesTheMessageWithInvalidArgument) {
  Make(LinkClass::kFast, 1, {});
  bool discarded = false;
  uint8_t* fetched_to = nullptr;
  DoneCallback fetch_done;
  link_->OnChunk(0, Header(0, 9, 0, 40, 0, 40), nullptr,
                 std::make_unique<FakeDeferred>(Bytes(40, 1), &discarded, &fetched_to,
                                                &fetch_done));
  std::vector<uint8_t> small(8);
  RecvResult& too_small = NewRecvResult();
  link_->Recv(9, absl::MakeSpan(small), too_small.Callback());
  EXPECT_THAT(too_small.Wait(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(discarded);
  // The next message on the tag goes to the next receive.
  std::vector<uint8_t> next = Bytes(5, 2);
  link_->OnChunk(0, Header(1, 9, 1, 5, 0, 5), next.data(), nullptr);
  RecvResult& ok = NewRecvResult();
  link_->Recv(9, absl::MakeSpan(small), ok.Callback());
  EXPECT_THAT(ok.Wait(), IsOkAndHolds(5u));
}

TEST_F(LinkTest, AllocatorLearnsTheSizeBeforeAnyByteIsPlaced) {
  Make(LinkClass::kFast, 1, {});
  std::vector<uint8_t> storage;
  size_t asked = 0;
  RecvResult& received = NewRecvResult();
  link_->Recv(
      4,
      [&](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
        asked = size;
        storage.resize(size);
        return absl::MakeSpan(storage);
      },
      received.Callback());
  std::vector<uint8_t> data = Bytes(77, 5);
  link_->OnChunk(0, Header(0, 4, 0, 77, 0, 77), data.data(), nullptr);
  EXPECT_THAT(received.Wait(), IsOkAndHolds(77u));
  EXPECT_EQ(asked, 77u);
  EXPECT_EQ(storage, data);
}

TEST_F(LinkTest, AllocatorErrorFailsTheReceive) {
  Make(LinkClass::kFast, 1, {});
  RecvResult& received = NewRecvResult();
  link_->Recv(
      4, [](size_t) -> absl::StatusOr<absl::Span<uint8_t>> {
        return absl::ResourceExhaustedError("no memory");
      },
      received.Callback());
  std::vector<uint8_t> data = Bytes(7, 5);
  link_->OnChunk(0, Header(0, 4, 0, 7, 0, 7), data.data(), nullptr);
  EXPECT_THAT(received.Wait(), StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST_F(LinkTest, MalformedChunkFailsTheLinkWithDataLoss) {
  Make(LinkClass::kFast, 1, {});
  std::vector<uint8_t> buffer(100);
  RecvResult& received = NewRecvResult();
  link_->Recv(1, absl::MakeSpan(buffer), received.Callback());
  std::vector<uint8_t> data(10);
  link_->OnChunk(0, Header(0, 1, 0, 5, 0, 10), data.data(), nullptr);  // length > total
  EXPECT_THAT(received.Wait(), StatusIs(absl::StatusCode::kDataLoss));
}

TEST_F(LinkTest, SendBeforeConfigureIsRefused) {
  link_ = std::make_shared<Link>(executor_, "unconfigured");
  SendResult& sent = NewSendResult();
  link_->Send(1, {}, {}, sent.Callback());
  EXPECT_THAT(sent.Wait(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(LinkTest, UnknownPriorityIsInvalidArgument) {
  Make(LinkClass::kSlow, 1, Slow(100, 100));
  SendResult& sent = NewSendResult();
  link_->Send(1, {}, {static_cast<Priority>(9)}, sent.Callback());
  EXPECT_THAT(sent.Wait(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(WindowBytesTest, ConfiguredOrMaxOfChunksAndTwiceTheBandwidthDelayProduct) {
  SchedulerOptions s;
  s.chunk_bytes = 1000;
  s.stripes = 2;
  EXPECT_EQ(WindowBytes(s, 0, 0), kMinWindowChunks * 1000);
  EXPECT_EQ(WindowBytes(s, 1e6, 0.01), 20000);
  s.stripes = kMinWindowChunks + 2;
  EXPECT_EQ(WindowBytes(s, 0, 0), (kMinWindowChunks + 2) * 1000);
  s.window_bytes = 5;
  EXPECT_EQ(WindowBytes(s, 1e6, 0.01), 5);
}

}  // namespace
}  // namespace lbcc::transport
