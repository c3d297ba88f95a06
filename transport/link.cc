#include "transport/link.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/logging.h"

namespace lbcc::transport {
namespace {

// Bytes a link keeps unread before Configure() (see OnChunk).
constexpr uint64_t kMaxEarlyBytes = uint64_t{1} << 30;

// Scratch for sealed bytes, not zero-filled (it is written in full before it is read).
struct Scratch {
  std::unique_ptr<uint8_t[]> bytes;
  size_t capacity = 0;
};

// Scratch buffers kept for reuse: a fresh megabyte per chunk (allocated, faulted in, given back
// to the system) costs about as much as sealing it. Capacities are size classes (a power of two
// plus room for a sealed chunk's overhead), so that the last chunks of messages of every length
// share them; at most kMaxCachedBytes are kept.
class ScratchPool {
 public:
  static ScratchPool& Get() {
    static ScratchPool* const pool = new ScratchPool;  // Never destroyed: used by pool threads.
    return *pool;
  }

  std::shared_ptr<Scratch> Take(size_t size) {
    const size_t capacity = Capacity(size);
    auto scratch = std::make_unique<Scratch>();
    scratch->capacity = capacity;
    if (capacity <= kMaxClassBytes) {
      MutexLock lock(&mu_);
      auto it = free_.find(capacity);
      if (it != free_.end() && !it->second.empty()) {
        scratch->bytes = std::move(it->second.back());
        it->second.pop_back();
        cached_bytes_ -= capacity;
      }
    }
    if (scratch->bytes == nullptr) scratch->bytes.reset(new uint8_t[capacity]);
    return std::shared_ptr<Scratch>(scratch.release(), [](Scratch* s) { Get().Give(s); });
  }

 private:
  static constexpr size_t kSlack = 64;  // >= SecureChannel::kOverhead.
  static constexpr size_t kMaxClassBytes = (size_t{8} << 20) + kSlack;
  static constexpr size_t kMaxCachedBytes = size_t{64} << 20;

  static size_t Capacity(size_t size) {
    size_t base = 4096;
    while (base + kSlack < size) base <<= 1;
    return base + kSlack;
  }

  void Give(Scratch* scratch) {
    std::unique_ptr<Scratch> owned(scratch);
    if (scratch->capacity > kMaxClassBytes) return;
    MutexLock lock(&mu_);
    if (cached_bytes_ + scratch->capacity > kMaxCachedBytes) return;
    cached_bytes_ += scratch->capacity;
    free_[scratch->capacity].push_back(std::move(scratch->bytes));
  }

  Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<std::unique_ptr<uint8_t[]>>> free_ ABSL_GUARDED_BY(mu_);
  size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// The crypto pool: a few threads per process that seal and open chunks of every Link, so that
// neither a Link's mutex nor a backend's progress thread waits for the cipher. One queue for all
// threads (a task never waits behind a busy thread while another is idle), and opens before
// seals: an open completes a receive (and returns its window) now, a seal only adds to what is
// already queued for the wire. The threads only run the cipher and hand chunks to lanes; they
// never progress a backend (the lane wakes the backend's own thread), which would hold a
// thread the cipher needs on a machine with few cores. A forked child (which has none of the
// parent's threads) makes its own pool on first use.
class CryptoPool {
 public:
  enum class Kind { kOpen, kSeal };

  static CryptoPool& Get() {
    CryptoPool* pool = g_pool.load(std::memory_order_acquire);
    if (pool != nullptr) return *pool;
    static Mutex* const mu = new Mutex;
    MutexLock lock(mu);
    pool = g_pool.load(std::memory_order_acquire);
    if (pool == nullptr) {
      static const bool registered = [] {
        return pthread_atfork(nullptr, nullptr,
                              [] { g_pool.store(nullptr, std::memory_order_release); }) == 0;
      }();
      (void)registered;
      pool = new CryptoPool(
          std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4));
      g_pool.store(pool, std::memory_order_release);
    }
    return *pool;
  }

  void Post(Kind kind, absl::AnyInvocable<void()> task) {
    MutexLock lock(&mu_);
    (kind == Kind::kOpen ? opens_ : seals_).push_back(std::move(task));
    if (idle_ > 0) cv_.Signal();
  }

 private:
  explicit CryptoPool(int threads) {
    for (int i = 0; i < threads; ++i) {
      std::thread thread([this] { Run(); });
      pthread_setname_np(thread.native_handle(), "lbcc-crypto");
      thread.detach();  // Never joined: tasks may run at exit, the pool is never destroyed.
    }
  }

  void Run() {
    while (true) {
      absl::AnyInvocable<void()> task;
      {
        MutexLock lock(&mu_);
        while (opens_.empty() && seals_.empty()) {
          ++idle_;
          cv_.Wait(&mu_);
          --idle_;
        }
        std::deque<absl::AnyInvocable<void()>>& queue = opens_.empty() ? seals_ : opens_;
        task = std::move(queue.front());
        queue.pop_front();
      }
      task();
    }
  }

  static std::atomic<CryptoPool*> g_pool;  // Never destroyed: tasks may run at exit.

  Mutex mu_;
  CondVar cv_;
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<absl::AnyInvocable<void()>> opens_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::AnyInvocable<void()>> seals_ ABSL_GUARDED_BY(mu_);
};
std::atomic<CryptoPool*> CryptoPool::g_pool{nullptr};

// A chunk the sender seals on its own thread rather than handing it to the pool (the pool's
// thread hop costs more than the cipher for chunks up to this size).
constexpr uint32_t kInlineSealBytes = 64 << 10;

absl::Span<const uint8_t> HeaderBytes(const ChunkHeader& header) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(&header), sizeof(header));
}

// The header of a sealed chunk as the sender's Link made it (plain length and flags).
ChunkHeader PlainHeader(const ChunkHeader& wire) {
  ChunkHeader h = wire;
  h.length = static_cast<uint32_t>(wire.length - SecureChannel::kOverhead);
  h.flags = static_cast<uint8_t>(wire.flags & ~(kChunkSealed | kChunkEncrypted));
  return h;
}

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

// A sealed chunk's bytes still at the sender: fetched into a scratch buffer, opened into the
// receive buffer on the crypto pool (the fetch completes on the backend's progress thread).
class SealedPayload final : public DeferredPayload {
 public:
  SealedPayload(std::unique_ptr<DeferredPayload> inner, std::shared_ptr<SecureChannel> channel,
                const ChunkHeader& wire)
      : inner_(std::move(inner)), channel_(std::move(channel)), wire_(wire) {}
  void Fetch(uint8_t* dst, DoneCallback done) override {
    std::shared_ptr<Scratch> sealed = ScratchPool::Get().Take(wire_.length);
    uint8_t* into = sealed->bytes.get();
    inner_->Fetch(into, [sealed, dst, channel = channel_, wire = wire_,
                         done = std::move(done)](absl::Status status) mutable {
      if (!status.ok()) {
        done(std::move(status));
        return;
      }
      CryptoPool::Get().Post(CryptoPool::Kind::kOpen, [sealed = std::move(sealed), dst,
                                                       channel = std::move(channel), wire,
                                                       done = std::move(done)]() mutable {
        done(channel->Open(HeaderBytes(wire), (wire.flags & kChunkEncrypted) != 0,
                           sealed->bytes.get(), wire.length, dst));
      });
    });
  }

 private:
  std::unique_ptr<DeferredPayload> inner_;
  std::shared_ptr<SecureChannel> channel_;
  ChunkHeader wire_;
};

// A later eager chunk of a matched message, accepted by OnChunk (Link::EagerOpen): fetched while
// OnChunk is accepting it (a matched message places a chunk at once), it only records where the
// bytes go; OnChunk opens them there after releasing the mutex.
class EagerSealedPayload final : public DeferredPayload {
 public:
  explicit EagerSealedPayload(std::shared_ptr<Link::EagerOpen> state) : state_(std::move(state)) {}
  void Fetch(uint8_t* dst, DoneCallback done) override {
    if (!state_->inside) {  // Not reached: a matched message places its chunks when they come.
      done(absl::InternalError("eager sealed chunk fetched after it arrived"));
      return;
    }
    state_->fetched = true;
    state_->dst = dst;
    state_->done = std::move(done);
  }

 private:
  std::shared_ptr<Link::EagerOpen> state_;
};

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
  const uint64_t chunk = static_cast<uint64_t>(scheduler_.chunk_bytes);
  while (!failed_) {
    int priority = 0;
    while (priority < kNumPriorities && queues_[priority].empty()) ++priority;
    if (priority == kNumPriorities) return;
    // The highest priority may exceed the window by one chunk: it never waits for a credit's
    // round trip, only for the bytes already in flight.
    const uint64_t window = static_cast<uint64_t>(window_bytes_) + (priority == 0 ? chunk : 0);
    if (inflight_bytes_ >= window) return;
    OutMsg* msg = queues_[priority].front();
    const uint32_t length =
        static_cast<uint32_t>(std::min<uint64_t>(chunk, msg->size - msg->next_offset));
    if (bucket_.has_value() && length > 0) {
      absl::Time ready_at;
      if (!bucket_->TryTake(length, absl::Now(), &ready_at)) {
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
    for (int higher = 0; higher < priority; ++higher) {
      if (inflight_by_priority_[higher] > 0) return;
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
// Receive side.

void Link::Recv(Tag tag, absl::Span<uint8_t> buffer, RecvCallback done) {
  {
    MutexLock lock(&mu_);
    RecvLocked(tag, PostedRecv{buffer, nullptr, std::move(done)});
  }
  Kick();
}

void Link::Recv(Tag tag, RecvAllocator allocate, RecvCallback done) {
  {
    MutexLock lock(&mu_);
    if (!allocate) {
      PostRecvDone(std::move(done), absl::InvalidArgumentError("null RecvAllocator"));
      return;
    }
    RecvLocked(tag, PostedRecv{{}, std::move(allocate), std::move(done)});
  }
  Kick();
}

void Link::RecvLocked(Tag tag, PostedRecv recv) {
  if (failed_) {
    PostRecvDone(std::move(recv.done), failure_);
    return;
  }
  tags_[tag].posted.push_back(std::move(recv));
  TryMatchLocked(tag);
}

void Link::OnChunk(int lane, const ChunkHeader& wire, const uint8_t* data,
                   std::unique_ptr<DeferredPayload> deferred) {
  // A sealed chunk with its bytes (eager). The first chunk of a message is opened before its
  // header does anything (it creates the message, matches a receive, sizes an allocation): into
  // scratch, without the mutex. A later chunk of a message already matched to a buffer (its
  // header then only says where in that buffer) is accepted as a payload still to be opened,
  // and opened straight into the buffer once the mutex is released (one pass, no scratch copy).
  std::shared_ptr<SecureChannel> channel;
  std::shared_ptr<EagerOpen> eager;
  {
    MutexLock lock(&mu_);
    if (failed_) return;  // `deferred` is discarded.
    if (!configured_ || channel_ == nullptr || deferred != nullptr || data == nullptr ||
        (wire.flags & kChunkSealed) == 0 || wire.length < SecureChannel::kOverhead) {
      OnChunkPlainOrDeferredLocked(lane, wire, data, std::move(deferred));
      return;
    }
    channel = channel_;
    auto it = in_.find(wire.msg_seq);
    if (it != in_.end() && it->second->matched && !it->second->discard) {
      eager = std::make_shared<EagerOpen>();
      AcceptChunkLocked(lane, PlainHeader(wire), nullptr,
                        std::make_unique<EagerSealedPayload>(eager));
      eager->inside = false;
      if (!eager->fetched) return;  // Refused, or the message was dropped meanwhile.
    }
  }
  if (eager != nullptr) {
    absl::Status status = channel->Open(HeaderBytes(wire), (wire.flags & kChunkEncrypted) != 0,
                                        data, wire.length, eager->dst);
    DoneCallback done = std::move(eager->done);
    done(std::move(status));
    return;
  }
  const ChunkHeader h = PlainHeader(wire);
  std::shared_ptr<Scratch> opened = ScratchPool::Get().Take(h.length);
  absl::Status status = channel->Open(HeaderBytes(wire), (wire.flags & kChunkEncrypted) != 0,
                                      data, wire.length, opened->bytes.get());
  MutexLock lock(&mu_);
  if (failed_) return;
  if (!status.ok()) {
    ++counters_.integrity_failures;
    FailLocked(std::move(status));
    return;
  }
  AcceptChunkLocked(lane, h, opened->bytes.get(), nullptr);
}

void Link::OnChunkPlainOrDeferredLocked(int lane, const ChunkHeader& wire, const uint8_t* data,
                                        std::unique_ptr<DeferredPayload> deferred) {
  if (!configured_) {
    // Whether it is sealed is known at Configure(): keep it unread until then. A legitimate peer
    // sends at most a few stripes' chunks before its READY is processed; a connection that sends
    // more before the set-up finished (it may not even have authenticated) is cut off.
    early_bytes_ += wire.length;
    if (early_bytes_ > kMaxEarlyBytes) {
      FailLocked(absl::UnavailableError(absl::StrCat(
          peer_address_, " sent more than ", kMaxEarlyBytes, " bytes before the link was set up")));
      return;
    }
    EarlyChunk early;
    early.lane = lane;
    early.header = wire;
    if (deferred != nullptr) {
      early.deferred = std::move(deferred);
    } else if (data != nullptr) {
      early.bytes.assign(data, data + wire.length);
    }
    early_.push_back(std::move(early));
    return;
  }
  OnChunkLocked(lane, wire, data, std::move(deferred));
}

void Link::OnChunkLocked(int lane, const ChunkHeader& wire, const uint8_t* data,
                         std::unique_ptr<DeferredPayload> deferred) {
  if (channel_ == nullptr) {
    AcceptChunkLocked(lane, wire, data, std::move(deferred));
    return;
  }
  if ((wire.flags & kChunkSealed) == 0 || wire.length < SecureChannel::kOverhead) {
    CountIntegrityFailure();
    ++counters_.integrity_failures;
    FailLocked(absl::DataLossError(
        absl::StrCat("unsealed chunk from ", peer_address_, " on an authenticated link")));
    return;
  }
  const ChunkHeader h = PlainHeader(wire);
  if (deferred != nullptr) {
    AcceptChunkLocked(lane, h, nullptr,
                      std::make_unique<SealedPayload>(std::move(deferred), channel_, wire));
    return;
  }
  // Chunks that waited for Configure(): opened here.
  std::shared_ptr<Scratch> opened = ScratchPool::Get().Take(h.length);
  absl::Status status = channel_->Open(HeaderBytes(wire), (wire.flags & kChunkEncrypted) != 0,
                                       data, wire.length, opened->bytes.get());
  if (!status.ok()) {
    ++counters_.integrity_failures;
    FailLocked(std::move(status));
    return;
  }
  AcceptChunkLocked(lane, h, opened->bytes.get(), nullptr);
}

void Link::AcceptChunkLocked(int lane, const ChunkHeader& h, const uint8_t* data,
                             std::unique_ptr<DeferredPayload> deferred) {
  if (h.version != kWireVersion || h.offset > h.total_size ||
      h.length > h.total_size - h.offset || (h.length == 0 && h.total_size != 0) ||
      lane < 0 || lane >= static_cast<int>(lanes_.size())) {
    FailLocked(absl::DataLossError(absl::StrCat(
        "malformed chunk from ", peer_address_, ": version ", h.version, " offset ", h.offset,
        " length ", h.length, " of ", h.total_size)));
    return;
  }
  // The sender's window counts bytes on the wire. They have left it when an eager chunk arrives
  // or a rendezvous chunk's fetch completes; a rendezvous chunk that is parked or dropped leaves
  // its bytes at the sender, so it is credited at once (which also keeps a sender from stalling
  // behind messages the receiver has not asked for yet).
  const bool needs_credit = (h.flags & kChunkNeedsCredit) && h.length > 0;
  ++counters_.chunks_received;

  InMsg* msg;
  auto it = in_.find(h.msg_seq);
  if (it == in_.end()) {
    auto owned = std::make_unique<InMsg>();
    msg = owned.get();
    msg->seq = h.msg_seq;
    msg->tag = h.tag;
    msg->tag_seq = h.tag_seq;
    msg->total = h.total_size;
    in_.emplace(h.msg_seq, std::move(owned));
    RecvBusyLocked(+1);
    TagState& state = tags_[h.tag];
    if (h.tag_seq < state.next_match || !state.unmatched.emplace(h.tag_seq, msg).second) {
      FailLocked(absl::DataLossError(absl::StrCat("duplicate message ", h.tag_seq, " for tag ",
                                                  h.tag, " from ", peer_address_)));
      return;
    }
    // Match before placing, so that the first chunk goes straight to the buffer. A 0-byte
    // message completes (and is forgotten) right here.
    TryMatchLocked(h.tag);
    auto again = in_.find(h.msg_seq);
    if (again == in_.end()) return;
    msg = again->second.get();
  } else {
    msg = it->second.get();
    if (msg->tag != h.tag || msg->tag_seq != h.tag_seq || msg->total != h.total_size ||
        h.length > msg->total - msg->bytes_seen) {
      FailLocked(absl::DataLossError(
          absl::StrCat("inconsistent chunk of message ", h.msg_seq, " from ", peer_address_)));
      return;
    }
  }
  msg->bytes_seen += h.length;
  const bool fetch_later = deferred != nullptr && msg->matched && !msg->discard;
  if (needs_credit && !fetch_later) lanes_[lane]->SendCredit(h.length, h.priority);
  if (msg->discard) {
    // Dropped: `deferred` goes out of scope.
  } else if (msg->matched) {
    PlaceLocked(msg, h.offset, h.length, data, std::move(deferred), needs_credit ? lane : -1,
                h.priority);
  } else {
    StagedChunk staged;
    staged.offset = h.offset;
    staged.length = h.length;
    if (deferred != nullptr) {
      staged.deferred = std::move(deferred);
    } else if (h.length > 0) {
      staged.bytes.assign(data, data + h.length);
    }
    msg->staged.push_back(std::move(staged));
  }
  MaybeFinishRecvLocked(msg);  // May destroy msg.
}

void Link::TryMatchLocked(Tag tag) {
  TagState& state = tags_[tag];
  while (!state.posted.empty()) {
    auto it = state.unmatched.find(state.next_match);
    if (it == state.unmatched.end()) return;
    InMsg* msg = it->second;
    state.unmatched.erase(it);
    ++state.next_match;
    PostedRecv recv = std::move(state.posted.front());
    state.posted.pop_front();
    MatchLocked(msg, std::move(recv));
  }
}

void Link::MatchLocked(InMsg* msg, PostedRecv recv) {
  msg->matched = true;
  msg->done = std::move(recv.done);
  absl::Status status;
  if (recv.allocate) {
    absl::StatusOr<absl::Span<uint8_t>> buffer = recv.allocate(msg->total);
    if (!buffer.ok()) {
      status = buffer.status();
    } else if (buffer->size() < msg->total) {
      status = absl::InvalidArgumentError(absl::StrCat("RecvAllocator returned ", buffer->size(),
                                                       " bytes for a ", msg->total,
                                                       "-byte message"));
    } else {
      msg->buffer = buffer->data();
    }
  } else if (recv.buffer.size() < msg->total) {
    status = absl::InvalidArgumentError(absl::StrCat("message of ", msg->total, " bytes (tag ",
                                                     msg->tag, ") does not fit the ",
                                                     recv.buffer.size(), "-byte buffer"));
  } else {
    msg->buffer = recv.buffer.data();
  }
  std::vector<StagedChunk> staged = std::move(msg->staged);
  msg->staged.clear();
  if (!status.ok()) {
    msg->discard = true;  // `staged` is dropped with this scope.
    msg->status = status;
  } else {
    for (StagedChunk& chunk : staged) {
      PlaceLocked(msg, chunk.offset, chunk.length,
                  chunk.bytes.empty() ? nullptr : chunk.bytes.data(), std::move(chunk.deferred),
                  /*credit_lane=*/-1, /*priority=*/0);
    }
  }
  MaybeFinishRecvLocked(msg);  // May destroy msg.
}

void Link::PlaceLocked(InMsg* msg, uint64_t offset, uint32_t length, const uint8_t* bytes,
                       std::unique_ptr<DeferredPayload> deferred, int credit_lane,
                       uint8_t priority) {
  if (deferred != nullptr) {
    ++msg->fetches_outstanding;
    deferred->Fetch(msg->buffer + offset, [self = shared_from_this(), seq = msg->seq, length,
                                           credit_lane, priority](absl::Status status) {
      self->OnFetchDone(seq, length, credit_lane, priority, std::move(status));
    });
    return;
  }
  if (length > 0) std::memcpy(msg->buffer + offset, bytes, length);
  msg->bytes_placed += length;
  counters_.bytes_received += length;
}

void Link::OnFetchDone(uint64_t seq, uint32_t length, int credit_lane, uint8_t priority,
                       absl::Status status) {
  MutexLock lock(&mu_);
  if (credit_lane >= 0 && status.ok() && !failed_) {
    lanes_[credit_lane]->SendCredit(length, priority);
  }
  auto it = in_.find(seq);
  LBCC_CHECK(it != in_.end()) << "fetch completion for unknown message " << seq;
  InMsg* msg = it->second.get();
  --msg->fetches_outstanding;
  if (status.ok()) {
    msg->bytes_placed += length;
    counters_.bytes_received += length;
    MaybeFinishRecvLocked(msg);
  } else {
    if (status.code() == absl::StatusCode::kDataLoss) ++counters_.integrity_failures;
    if (msg->status.ok()) msg->status = status;
    MaybeFinishRecvLocked(msg);  // May destroy msg.
    if (!failed_) {
      // A sealed chunk that did not verify stays DataLoss; anything else lost the link.
      FailLocked(status.code() == absl::StatusCode::kCancelled ||
                         status.code() == absl::StatusCode::kDataLoss
                     ? status
                     : absl::UnavailableError(absl::StrCat("link to ", peer_address_,
                                                           " lost: ", status.message())));
    }
  }
}

void Link::MaybeFinishRecvLocked(InMsg* msg) {
  if (msg->matched && !msg->done_posted && msg->fetches_outstanding == 0 &&
      (!msg->status.ok() || msg->bytes_placed == msg->total)) {
    msg->done_posted = true;
    if (msg->status.ok()) {
      ++counters_.messages_received;
      PostRecvDone(std::move(msg->done), static_cast<size_t>(msg->total));
    } else {
      PostRecvDone(std::move(msg->done), msg->status);
    }
  }
  // Forget the message once its callback is posted and no chunk of it can still arrive.
  const bool all_seen = msg->bytes_seen == msg->total || failed_;
  if (msg->done_posted && msg->fetches_outstanding == 0 && all_seen) {
    in_.erase(msg->seq);  // Destroys msg.
    RecvBusyLocked(-1);
  }
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
