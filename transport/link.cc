#include "transport/link.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/logging.h"
#include "transport/link_crypto.h"

namespace lbcc::transport {
namespace {

using link_internal::CryptoPool;
using link_internal::HeaderBytes;
using link_internal::Scratch;
using link_internal::ScratchPool;

// A chunk the sender seals on its own thread rather than handing it to the pool (the pool's
// thread hop costs more than the cipher for chunks up to this size).
constexpr uint32_t kInlineSealBytes = 64 << 10;

// What a control message's tag covers: the header with the tag's own fields (conn_id: the
// counter, which the IV binds; x, y: the tag) zeroed.
std::array<uint8_t, sizeof(ControlHeader)> ControlAad(const ControlHeader& header) {
  ControlHeader h = header;
  h.conn_id = 0;
  h.x = 0;
  h.y = 0;
  std::array<uint8_t, sizeof(ControlHeader)> bytes;
  std::memcpy(bytes.data(), &h, sizeof(h));
  return bytes;
}

}  // namespace

Link::Link(std::shared_ptr<Executor> executor, std::string peer_address)
    : executor_(std::move(executor)), peer_address_(std::move(peer_address)) {}

Link::~Link() {
  // Every operation keeps the Link alive until its callback is posted, so nothing is pending.
  MutexLock lock(&mu_);
  LBCC_DCHECK(out_.empty()) << out_.size() << " sends outstanding";
}

void Link::AddLane(std::shared_ptr<Lane> lane) {
  MutexLock lock(&mu_);
  lanes_.push_back(std::move(lane));
  lane_inflight_.push_back(0);
  counters_.stripes = static_cast<int>(lanes_.size());
}

void Link::Configure(LinkClass link_class, const SchedulerOptions& scheduler,
                     int64_t fast_chunk_bytes, const ProbeResult& probe,
                     std::shared_ptr<SecureChannel> channel) {
  MutexLock lock(&mu_);
  configured_ = true;
  channel_ = std::move(channel);
  counters_.authenticated = channel_ != nullptr;
  counters_.encrypted = channel_ != nullptr && channel_->encrypt();
  link_class_ = link_class;
  scheduler_ = scheduler;
  fast_chunk_bytes_ = std::max<int64_t>(fast_chunk_bytes, 1);
  probe_ = probe;
  scheduler_.stripes = std::max<int>(1, static_cast<int>(lanes_.size()));
  window_bytes_ = WindowBytes(scheduler_, std::min(probe.send_bytes_per_second,
                                                   probe.recv_bytes_per_second),
                              probe.rtt_seconds);
  if (scheduler_.pace_bytes_per_second > 0) {
    bucket_.emplace(scheduler_.pace_bytes_per_second, static_cast<double>(scheduler_.chunk_bytes),
                    absl::Now());
  } else {
    bucket_.reset();
  }
  counters_.link_class = link_class;
  counters_.probed_send_bytes_per_second = probe.send_bytes_per_second;
  counters_.probed_recv_bytes_per_second = probe.recv_bytes_per_second;
  counters_.probed_rtt_seconds = probe.rtt_seconds;
  std::vector<EarlyChunk> early = std::move(early_);
  early_.clear();
  for (EarlyChunk& chunk : early) {
    if (failed_) break;
    OnChunkLocked(chunk.lane, chunk.header, chunk.bytes.data(), std::move(chunk.deferred));
  }
}

void Link::AddRetries(uint64_t retries) {
  MutexLock lock(&mu_);
  counters_.retries += retries;
}

void Link::SetKick(std::function<void()> kick) {
  MutexLock lock(&mu_);
  kick_ = std::move(kick);
}

void Link::Kick() {
  std::function<void()> kick;
  {
    MutexLock lock(&mu_);
    kick = kick_;
  }
  if (kick) kick();
}

LinkClass Link::link_class() const {
  MutexLock lock(&mu_);
  return link_class_;
}

bool Link::failed() const {
  MutexLock lock(&mu_);
  return failed_;
}

bool Link::HasPendingWork() const {
  MutexLock lock(&mu_);
  if (failed_) return false;
  if (!out_.empty() || !in_.empty()) return true;
  for (const auto& [tag, state] : tags_) {
    if (!state.posted.empty()) return true;
  }
  return false;
}

void Link::ReleaseTags(Tag first, Tag last) {
  MutexLock lock(&mu_);
  auto in_range = [&](Tag tag) { return tag >= first && tag < last; };
  for (auto it = next_tag_seq_.begin(); it != next_tag_seq_.end();) {
    if (in_range(it->first)) {
      next_tag_seq_.erase(it++);  // flat_hash_map's erase(iterator) returns void.
    } else {
      ++it;
    }
  }
  for (auto it = tags_.begin(); it != tags_.end();) {
    if (in_range(it->first) && it->second.posted.empty() && it->second.unmatched.empty()) {
      tags_.erase(it++);
    } else {
      ++it;
    }
  }
}

LinkCounters Link::counters() const {
  MutexLock lock(&mu_);
  LinkCounters c = counters_;
  c.live_tags = tags_.size() + next_tag_seq_.size();
  const absl::Time now = absl::Now();
  absl::Duration send_busy = send_busy_;
  absl::Duration recv_busy = recv_busy_;
  if (send_active_ > 0) send_busy += now - send_busy_since_;
  if (recv_active_ > 0) recv_busy += now - recv_busy_since_;
  if (send_busy > absl::ZeroDuration()) {
    c.send_bytes_per_second = c.bytes_sent / absl::ToDoubleSeconds(send_busy);
  }
  if (recv_busy > absl::ZeroDuration()) {
    c.recv_bytes_per_second = c.bytes_received / absl::ToDoubleSeconds(recv_busy);
  }
  c.queued_messages = 0;
  c.queued_bytes = 0;
  for (const auto& queue : queues_) {
    c.queued_messages += queue.size();
    for (const OutMsg* msg : queue) c.queued_bytes += msg->size - msg->next_offset;
  }
  c.inflight_bytes = inflight_bytes_;
  return c;
}

void Link::SendBusyLocked(int delta) {
  if (delta > 0 && send_active_++ == 0) send_busy_since_ = absl::Now();
  if (delta < 0 && --send_active_ == 0) send_busy_ += absl::Now() - send_busy_since_;
}

void Link::RecvBusyLocked(int delta) {
  if (delta > 0 && recv_active_++ == 0) recv_busy_since_ = absl::Now();
  if (delta < 0 && --recv_active_ == 0) recv_busy_ += absl::Now() - recv_busy_since_;
}

void Link::PostSendDone(SendCallback done, absl::Status status) {
  executor_->Post([done = std::move(done), status = std::move(status)]() mutable {
    done(std::move(status));
  });
}

void Link::PostRecvDone(RecvCallback done, absl::StatusOr<size_t> result) {
  executor_->Post([done = std::move(done), result = std::move(result)]() mutable {
    done(std::move(result));
  });
}

// ---------------------------------------------------------------------------------------------
// Send side.

void Link::Send(Tag tag, absl::Span<const uint8_t> data, SendOptions options, SendCallback done) {
  bool flush;
  {
    MutexLock lock(&mu_);
    SendLocked(tag, data, options, std::move(done));
    flush = !outbox_.empty();
  }
  if (flush) FlushOutbox(/*from_sender=*/true);
  Kick();
}

void Link::SendLocked(Tag tag, absl::Span<const uint8_t> data, SendOptions options,
                      SendCallback done) {
  if (failed_) {
    PostSendDone(std::move(done), failure_);
    return;
  }
  const int priority = static_cast<int>(options.priority);
  if (priority < 0 || priority >= kNumPriorities) {
    PostSendDone(std::move(done), absl::InvalidArgumentError(
                                      absl::StrCat("unknown priority ", priority)));
    return;
  }
  if (!configured_ || lanes_.empty()) {
    PostSendDone(std::move(done),
                 absl::FailedPreconditionError("endpoint is not connected yet"));
    return;
  }
  auto owned = std::make_unique<OutMsg>();
  OutMsg* msg = owned.get();
  msg->seq = next_seq_++;
  msg->tag = tag;
  msg->tag_seq = next_tag_seq_[tag]++;
  msg->data = data.data();
  msg->size = data.size();
  msg->priority = options.priority;
  msg->control = options.control;
  msg->done = std::move(done);
  out_.emplace(msg->seq, std::move(owned));
  SendBusyLocked(+1);

  if (link_class_ == LinkClass::kFast) {
    // Fast links bypass the scheduler: every chunk goes to lane 0 now (sealed ones in pieces
    // that the crypto pool seals while earlier ones are on the wire; see kMaxSealedChunkBytes).
    do {
      uint64_t chunk = static_cast<uint64_t>(fast_chunk_bytes_);
      if (channel_ != nullptr) {
        // A power of two (the scratch pool's size classes), 1 to 4 MiB.
        uint64_t sealed = kSealedChunkBytes;
        while (sealed < static_cast<uint64_t>(kMaxSealedChunkBytes) &&
               2 * sealed <= sealed_unsent_bytes_ / 4) {
          sealed *= 2;
        }
        chunk = std::min(chunk, sealed);
      }
      const uint32_t length =
          static_cast<uint32_t>(std::min<uint64_t>(chunk, msg->size - msg->next_offset));
      const uint64_t offset = msg->next_offset;
      msg->next_offset += length;
      HandChunkLocked(msg, 0, offset, length, /*credit=*/false);
    } while (msg->next_offset < msg->size);
    msg->all_handed = true;
    return;
  }
  queues_[priority].push_back(msg);
  counters_.max_queued_messages = std::max<uint64_t>(
      counters_.max_queued_messages,
      queues_[0].size() + queues_[1].size() + queues_[2].size());
  PumpLocked();
}

void Link::HandChunkLocked(OutMsg* msg, int lane, uint64_t offset, uint32_t length, bool credit) {
  ChunkHeader header{};
  header.msg_seq = msg->seq;
  header.tag = msg->tag;
  header.tag_seq = msg->tag_seq;
  header.total_size = msg->size;
  header.offset = offset;
  header.length = length;
  header.priority = static_cast<uint8_t>(msg->priority);
  header.flags = credit ? kChunkNeedsCredit : 0;
  header.version = kWireVersion;
  ++msg->chunks_outstanding;
  if (credit) {
    inflight_bytes_ += length;
    lane_inflight_[lane] += length;
    inflight_by_priority_[static_cast<int>(msg->priority)] += length;
  }
  if (channel_ != nullptr) {
    // Reserved here, sealed and handed without the mutex (FlushOutbox).
    header.flags |= kChunkSealed | (channel_->encrypt() ? kChunkEncrypted : 0);
    header.length = static_cast<uint32_t>(length + SecureChannel::kOverhead);
    Handoff handoff;
    handoff.header = header;
    handoff.lane = lane;
    handoff.seq = msg->seq;
    handoff.length = length;
    handoff.data = msg->data + offset;
    handoff.credit = credit;
    handoff.priority = msg->priority;
    handoff.fast = link_class_ == LinkClass::kFast;
    if (handoff.fast) sealed_unsent_bytes_ += length;
    outbox_.push_back(handoff);
    return;
  }
  lanes_[lane]->SendChunk(header, msg->data + offset, length,
                          [self = shared_from_this(), seq = msg->seq, lane, length, credit,
                           priority = msg->priority](absl::Status status) {
                            self->OnChunkSent(seq, lane, length, credit, priority,
                                              std::move(status));
                          });
}

std::vector<Link::Handoff> Link::TakeSealableLocked() {
  std::vector<Handoff> work;
  for (Handoff& handoff : outbox_) {
    if (handoff.fast) {
      held_.push_back(handoff);
    } else {
      work.push_back(handoff);
    }
  }
  outbox_.clear();
  while (!held_.empty() &&
         (failed_ || sealing_bytes_ == 0 ||
          sealing_bytes_ + held_.front().length <= static_cast<uint64_t>(kMaxSealAheadBytes))) {
    sealing_bytes_ += held_.front().length;
    work.push_back(held_.front());
    held_.pop_front();
  }
  return work;
}

void Link::FlushOutbox(bool from_sender) {
  std::vector<Handoff> work;
  std::shared_ptr<SecureChannel> channel;
  {
    MutexLock lock(&mu_);
    work = TakeSealableLocked();
    channel = channel_;
  }
  for (const Handoff& handoff : work) {
    // A slow link's chunk is sealed on the thread that releases it (the sender, a credit's
    // backend thread, the pacing timer): its seal takes far less than its time on the wire,
    // while a hop to the pool costs a wake-up, which on a busy host (ranks' compute, other
    // ranks' pools) can take milliseconds, and a slow-link collective waits on every chunk.
    if (!handoff.fast || (from_sender && handoff.length <= kInlineSealBytes)) {
      SealAndHand(handoff, channel, /*kick=*/from_sender);
    } else {
      CryptoPool::Get().Post(CryptoPool::Kind::kSeal, [self = shared_from_this(), handoff, channel] {
        self->SealAndHand(handoff, channel, /*kick=*/false);
      });
    }
  }
}

void Link::SealAndHand(const Handoff& h, const std::shared_ptr<SecureChannel>& channel,
                       bool kick) {
  std::shared_ptr<Lane> lane;
  absl::Status failure;
  {
    MutexLock lock(&mu_);
    lane = lanes_[h.lane];
    if (failed_) failure = failure_;
  }
  if (!failure.ok()) {  // Not sealed for nothing: the reserved chunk completes as not sent.
    OnChunkSent(h.seq, h.lane, h.length, h.credit, h.priority, std::move(failure), h.fast);
    return;
  }
  std::shared_ptr<Scratch> sealed = ScratchPool::Get().Take(h.header.length);
  const absl::Status status =
      channel->Seal(HeaderBytes(h.header), h.data, h.length, sealed->bytes.get());
  LBCC_CHECK(status.ok()) << status;  // OpenSSL failing on valid keys is not input's fault.
  const uint8_t* bytes = sealed->bytes.get();
  lane->SendChunk(h.header, bytes, h.header.length,
                  [self = shared_from_this(), seq = h.seq, index = h.lane, length = h.length,
                   credit = h.credit, priority = h.priority, fast = h.fast,
                   sealed = std::move(sealed)](absl::Status status) {
                    self->OnChunkSent(seq, index, length, credit, priority, std::move(status),
                                      fast);
                  });
  // Like a Send on a plain link, the sending thread progresses the backend if no other thread
  // does (rather than waiting for the progress thread to wake up); a pool thread does not (see
  // CryptoPool): the lane has already woken the backend.
  if (kick) Kick();
}

void Link::OnChunkSent(uint64_t seq, int lane, uint32_t length, bool credit, Priority priority,
                       absl::Status status, bool fast_sealed) {
  bool release = false;
  {
    MutexLock lock(&mu_);
    if (fast_sealed) {
      sealed_unsent_bytes_ -= std::min<uint64_t>(sealed_unsent_bytes_, length);
      sealing_bytes_ -= std::min<uint64_t>(sealing_bytes_, length);
      release = !held_.empty();
    }
    auto it = out_.find(seq);
    LBCC_CHECK(it != out_.end()) << "completion for unknown message " << seq;
    OutMsg* msg = it->second.get();
    --msg->chunks_outstanding;
    if (status.ok()) {
      counters_.bytes_sent += length;
      ++counters_.chunks_sent;
      MaybeFinishSendLocked(msg);
    } else {
      if (msg->status.ok()) msg->status = status;
      // A chunk that was never delivered returns no credit.
      if (credit) ReturnWindowLocked(lane, length, static_cast<int>(priority));
      MaybeFinishSendLocked(msg);  // May destroy msg.
      if (!failed_) {
        FailLocked(status.code() == absl::StatusCode::kCancelled
                       ? status
                       : absl::UnavailableError(
                             absl::StrCat("link to ", peer_address_, " lost: ", status.message())));
      }
    }
  }
  // Chunks held back for the seal-ahead bound go to the pool now (never sealed on this thread,
  // which may be a backend's).
  if (release) FlushOutbox(/*from_sender=*/false);
  Kick();
}

void Link::MaybeFinishSendLocked(OutMsg* msg) {
  if (!msg->all_handed || msg->chunks_outstanding > 0) return;
  absl::Status status = msg->status;
  if (status.ok()) ++counters_.messages_sent;
  PostSendDone(std::move(msg->done), std::move(status));
  out_.erase(msg->seq);  // Destroys msg.
  SendBusyLocked(-1);
}

void Link::PumpLocked() {
  if (link_class_ != LinkClass::kSlow) return;
  while (!failed_) {
    int priority = 0;
    while (priority < kNumPriorities && queues_[priority].empty()) ++priority;
    if (priority == kNumPriorities) return;
    const absl::Time now = absl::Now();
    const bool bulk = priority == static_cast<int>(Priority::kBulk);
    const bool yielding = bulk && BulkYieldLocked(now);
    const uint64_t chunk =
        static_cast<uint64_t>(yielding ? bulk_chunk_bytes_ : scheduler_.chunk_bytes);
    // The highest priority may exceed the window by one chunk: it never waits for a credit's
    // round trip, only for the bytes already in flight.
    const uint64_t window = static_cast<uint64_t>(window_bytes_) + (priority == 0 ? chunk : 0);
    if (inflight_bytes_ >= window) return;
    for (int higher = 0; higher < priority; ++higher) {
      if (inflight_by_priority_[higher] > 0) return;
    }
    OutMsg* msg = queues_[priority].front();
    const uint32_t length =
        static_cast<uint32_t>(std::min<uint64_t>(chunk, msg->size - msg->next_offset));
    // High priority is never held; bulk that yields has its own bucket (see BulkYieldLocked).
    TokenBucket* bucket = yielding ? &*bulk_bucket_
                          : (priority != static_cast<int>(Priority::kHigh) && bucket_.has_value())
                              ? &*bucket_
                              : nullptr;
    if (bucket != nullptr && length > 0) {
      absl::Time ready_at;
      if (!bucket->TryTake(length, now, &ready_at)) {
        ++counters_.pacing_waits;
        if (!pacing_timer_armed_) {
          pacing_timer_armed_ = true;
          executor_->PostAt(ready_at, [weak = weak_from_this()] {
            if (std::shared_ptr<Link> self = weak.lock()) self->OnPacingTimer();
          });
        }
        return;
      }
    }
    if (!bulk && !msg->control && length > 0) {
      nonbulk_rate_ = NonBulkRateLocked(now) + length / kNonBulkRateSeconds;
      nonbulk_at_ = now;
    }
    // Striping: the lane with the fewest bytes in flight.
    int lane = 0;
    for (int i = 1; i < static_cast<int>(lanes_.size()); ++i) {
      if (lane_inflight_[i] < lane_inflight_[lane]) lane = i;
    }
    const uint64_t offset = msg->next_offset;
    msg->next_offset += length;
    if (msg->next_offset == msg->size) {
      queues_[priority].pop_front();
      msg->all_handed = true;
    }
    HandChunkLocked(msg, lane, offset, length, /*credit=*/length > 0);
  }
}

double Link::NonBulkRateLocked(absl::Time now) const {
  if (nonbulk_at_ == absl::InfinitePast()) return 0;
  return nonbulk_rate_ * std::exp(-absl::ToDoubleSeconds(now - nonbulk_at_) / kNonBulkRateSeconds);
}

bool Link::BulkYieldLocked(absl::Time now) {
  // The rate bulk yields from: the configured pace where there is one, else the probe's.
  const double rate = scheduler_.pace_bytes_per_second > 0 ? scheduler_.pace_bytes_per_second
                                                           : probe_.send_bytes_per_second;
  if (!scheduler_.bulk_yield || rate <= 0 || now - nonbulk_at_ >= kBulkYieldHold) return false;
  const double pace = BulkPaceBytesPerSecond(rate, NonBulkRateLocked(now));
  bulk_chunk_bytes_ = BulkYieldChunkBytes(scheduler_, pace);
  // Room for kBulkYieldBurstChunks: a pacing timer that fires late (a busy host) catches up.
  const double capacity = static_cast<double>(kBulkYieldBurstChunks * bulk_chunk_bytes_);
  if (bulk_bucket_.has_value()) {
    bulk_bucket_->Reconfigure(pace, capacity, now);
  } else {
    bulk_bucket_.emplace(pace, capacity, now);
  }
  counters_.bulk_pace_bytes_per_second = pace;
  return true;
}

void Link::OnPacingTimer() {
  bool flush;
  {
    MutexLock lock(&mu_);
    pacing_timer_armed_ = false;
    PumpLocked();
    flush = !outbox_.empty();
  }
  if (flush) FlushOutbox(/*from_sender=*/false);
  Kick();
}

void Link::ReturnWindowLocked(int lane, uint64_t bytes, int priority) {
  inflight_bytes_ -= std::min(inflight_bytes_, bytes);
  lane_inflight_[lane] -= std::min(lane_inflight_[lane], bytes);
  inflight_by_priority_[priority] -= std::min(inflight_by_priority_[priority], bytes);
}

void Link::OnCredit(int lane, uint64_t bytes, uint8_t priority) {
  bool flush;
  {
    MutexLock lock(&mu_);
    if (lane < 0 || lane >= static_cast<int>(lanes_.size()) || priority >= kNumPriorities) return;
    ReturnWindowLocked(lane, bytes, priority);
    PumpLocked();
    flush = !outbox_.empty();
  }
  // From the backend's thread (a credit arrived): a slow link's chunks are sealed here.
  if (flush) FlushOutbox(/*from_sender=*/false);
}

void Link::SealControl(int lane, ControlHeader* header) {
  std::shared_ptr<SecureChannel> channel;
  {
    MutexLock lock(&mu_);
    channel = channel_;
  }
  if (channel == nullptr) return;
  header->lane = static_cast<uint32_t>(std::max(lane, 0));
  header->version = kWireVersion;
  header->reserved |= kControlSealed;
  uint64_t counter = 0;
  Mac tag;
  const absl::Status status = channel->TagMessage(ControlAad(*header), &counter, &tag);
  LBCC_CHECK(status.ok()) << status;  // OpenSSL failing on valid keys is not input's fault.
  header->conn_id = counter;
  std::memcpy(&header->x, tag.data(), 8);
  std::memcpy(&header->y, tag.data() + 8, 8);
}

void Link::OnControl(int lane, const ControlHeader& h) {
  std::shared_ptr<SecureChannel> channel;
  {
    MutexLock lock(&mu_);
    // Nothing of a running link arrives before Configure() (the peer credits only chunks this
    // end sent, and heartbeats start after READY): one that does is dropped.
    if (failed_ || !configured_) return;
    channel = channel_;
  }
  const bool credit = static_cast<Ctl>(h.type) == Ctl::kCredit;
  if (!credit && static_cast<Ctl>(h.type) != Ctl::kHeartbeat) return;
  if (channel != nullptr) {
    const absl::string_view what = credit ? "credit" : "heartbeat";
    absl::Status status;
    if ((h.reserved & kControlSealed) == 0) {
      CountIntegrityFailure();
      status = absl::DataLossError(absl::StrCat("untagged ", what, " from ", peer_address_,
                                                " on an authenticated link"));
    } else if (h.lane != static_cast<uint32_t>(lane)) {
      CountIntegrityFailure();
      status = absl::DataLossError(absl::StrCat(what, " from ", peer_address_, " tagged for ",
                                                "connection ", h.lane, " arrived on ", lane));
    } else {
      Mac tag;
      std::memcpy(tag.data(), &h.x, 8);
      std::memcpy(tag.data() + 8, &h.y, 8);
      status = channel->VerifyMessage(ControlAad(h), h.conn_id, tag, what);
    }
    if (!status.ok()) {
      {
        MutexLock lock(&mu_);
        ++counters_.integrity_failures;
        FailLocked(std::move(status));
      }
      Kick();
      return;
    }
  }
  if (credit) OnCredit(lane, h.a, static_cast<uint8_t>(h.b));
}

// ---------------------------------------------------------------------------------------------
// Failure.

void Link::Close() {
  {
    MutexLock lock(&mu_);
    if (!failed_) FailLocked(absl::CancelledError("endpoint closed"));
  }
  Kick();
}

void Link::Fail(absl::Status status) {
  {
    MutexLock lock(&mu_);
    if (!failed_) FailLocked(std::move(status));
  }
  Kick();
}

void Link::FailLocked(absl::Status status) {
  LBCC_DCHECK(!status.ok());
  if (failed_) return;
  failed_ = true;
  failure_ = status;
  early_.clear();  // Unread; their deferred bytes are released.
  LBCC_LOG_IF(INFO, status.code() != absl::StatusCode::kCancelled)
      << "link to " << peer_address_ << " failed: " << status;

  // Sends: unscheduled chunks are dropped; messages finish once their handed chunks return.
  for (auto& queue : queues_) queue.clear();
  std::vector<OutMsg*> sends;
  for (auto& [seq, msg] : out_) sends.push_back(msg.get());
  for (OutMsg* msg : sends) {
    msg->all_handed = true;
    if (msg->status.ok()) msg->status = status;
    MaybeFinishSendLocked(msg);
  }

  // Receives: posted ones fail now, matched ones once their fetches return; staged chunks go.
  for (auto& [tag, state] : tags_) {
    for (PostedRecv& recv : state.posted) PostRecvDone(std::move(recv.done), status);
    state.posted.clear();
    state.unmatched.clear();
  }
  std::vector<InMsg*> receives;
  for (auto& [seq, msg] : in_) receives.push_back(msg.get());
  for (InMsg* msg : receives) {
    msg->staged.clear();
    if (!msg->matched) {
      in_.erase(msg->seq);
      RecvBusyLocked(-1);
      continue;
    }
    if (msg->status.ok()) msg->status = status;
    MaybeFinishRecvLocked(msg);
  }

  for (auto& lane : lanes_) lane->Close();
}

}  // namespace lbcc::transport
