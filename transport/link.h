// Link: the backend-independent half of an Endpoint. It turns messages into chunks over one or
// more Lanes (transport/lane.h), matches incoming messages to posted receives by (tag, order),
// schedules slow links (priority queues, credit window, token-bucket pacing, striping), keeps the
// per-link counters and fails pending work exactly once on Close() or a lost peer.
//
// Both backends build their Endpoints on a Link: the loopback backend with in-memory lanes, UCX
// with one ucp endpoint per lane. Fast links send every chunk at once on lane 0; slow links queue
// messages by priority and hand chunks to the least-loaded lane while the bytes in flight (not yet
// credited back by the receiver) stay under the window and the token bucket allows.
//
// Authenticated links (a SecureChannel from the link set-up, transport/secure.h): every chunk is
// sealed (AES-256-GCM: encrypted, or authenticated only) before it reaches a lane, and opened
// before any of its bytes reach a receive buffer; a chunk that does not verify fails the link
// with DataLoss naming the peer. On the wire such a chunk carries kChunkSealed (and
// kChunkEncrypted when encrypted) and `length` counts the counter and tag as well; the header
// as sent is the AEAD's associated data. Chunks that arrive before Configure() wait, unread,
// until it says whether the link is sealed. The cipher never runs under the Link's mutex: the
// scheduler only reserves a chunk, and a fast link's chunk is sealed on the crypto pool (a few
// threads per process, one queue, opens before seals; they never progress the backend) or, for a
// small chunk, on the sending thread; a slow link's chunk is sealed on the thread that releases
// it (the sender, a credit's backend thread, the pacing timer: its seal is far shorter than its
// time on the wire, a hop to the pool costs a wake-up); a fast link's message is sealed in
// chunks of at most kSealedChunkBytes (larger, up to kMaxSealedChunkBytes, while much is already
// queued), so the pool seals one while another is on the wire. Rendezvous chunks are opened on
// the pool too, never on the backend's progress thread. An eager chunk is opened by the
// backend's thread after the mutex is released: the first of a message into scratch before its
// header is used, a later one of a matched message straight into the receive buffer
// (EagerOpen); a chunk that fails to open leaves zeros there.
// A backend's own control messages of a running link (credits, heartbeats) are tagged too
// (SealControl / OnControl): GMAC under the same per-direction counters.
//
// Files: link.cc (set-up, send side, credits, failure), link_recv.cc (receive side),
// link_crypto.h (the crypto pool and scratch buffers).
//
// Thread-safety: all public methods are thread-safe. Lock order: a backend's own lock (the UCX
// worker) may be held when calling On*(); the Link's mutex is never held while calling user code
// other than a RecvAllocator, and user callbacks run on the Executor.
#ifndef LBCC_TRANSPORT_LINK_H_
#define LBCC_TRANSPORT_LINK_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "base/mutex.h"
#include "absl/time/time.h"
#include "transport/executor.h"
#include "transport/lane.h"
#include "transport/link_setup.h"
#include "transport/options.h"
#include "transport/token_bucket.h"
#include "transport/transport.h"

namespace lbcc::transport {

// ChunkHeader::flags beside kChunkNeedsCredit (lane.h).
inline constexpr uint8_t kChunkSealed = 2;
inline constexpr uint8_t kChunkEncrypted = 4;
// ControlHeader::reserved of a credit or heartbeat on an authenticated link: conn_id carries
// the counter, x and y (their bits) the 16-byte tag.
inline constexpr uint32_t kControlSealed = 1u << 8;
// Chunks of a fast authenticated link: kSealedChunkBytes while the link has little queued
// (small chunks pipeline sealing, the wire and opening within one message), growing up to
// kMaxSealedChunkBytes while more is queued (each chunk costs both ends a rendezvous and a few
// thread wake-ups; a full pipeline needs no small chunks): the largest power of two in that
// range that is at most a quarter of the sealed bytes already handed and not yet sent, so those
// keep the wire busy while it is sealed (powers of two: the scratch buffers' size classes).
inline constexpr int64_t kSealedChunkBytes = 1 << 20;
inline constexpr int64_t kMaxSealedChunkBytes = 4 << 20;
// Sealed bytes of a fast link on the crypto pool or on the wire at once: further chunks wait,
// unsealed, until some are sent, so that the ciphertext is still in cache when the wire reads it
// and scratch buffers stay few (sealing far ahead of the wire buys nothing).
inline constexpr int64_t kMaxSealAheadBytes = 8 << 20;

class Link : public std::enable_shared_from_this<Link> {
 public:
  // An eager sealed chunk on its way to a receive buffer (link_recv.cc), under the Link's mutex
  // while OnChunk accepts it.
  struct EagerOpen {
    bool inside = true;    // OnChunk is accepting it.
    bool fetched = false;  // Placed: OnChunk opens it into `dst`, then runs `done`.
    uint8_t* dst = nullptr;
    DoneCallback done;
  };

  Link(std::shared_ptr<Executor> executor, std::string peer_address);
  ~Link();

  // Set-up by the backend, with what the link's LinkSetup negotiated (transport/link_setup.h).
  // Lanes may be added until the first Send; chunks may arrive on a lane as soon as it is added.
  // Configure() must come before the first Send.
  void AddLane(std::shared_ptr<Lane> lane);
  // `channel`: the link's keys when the set-up authenticated it (LinkParams::channel); null:
  // chunks travel as they are.
  void Configure(LinkClass link_class, const SchedulerOptions& scheduler, int64_t fast_chunk_bytes,
                 const ProbeResult& probe, std::shared_ptr<SecureChannel> channel = nullptr);
  // Called after the Link's mutex is released in calling paths, so that the backend can make
  // progress on the caller's thread (UCX: try the worker lock and progress).
  void SetKick(std::function<void()> kick);
  // Connection attempts the backend repeated while setting the link up (a counter).
  void AddRetries(uint64_t retries);

  // The Endpoint API (see transport.h for the contracts).
  void Send(Tag tag, absl::Span<const uint8_t> data, SendOptions options, SendCallback done);
  void Recv(Tag tag, absl::Span<uint8_t> buffer, RecvCallback done);
  void Recv(Tag tag, RecvAllocator allocate, RecvCallback done);
  void ReleaseTags(Tag first, Tag last);  // See Endpoint::ReleaseTags.
  void Close();
  LinkClass link_class() const;
  LinkCounters counters() const;
  const std::string& peer_address() const { return peer_address_; }

  // From the backend. `data` (valid during the call) holds the chunk's bytes, or `deferred` does.
  void OnChunk(int lane, const ChunkHeader& header, const uint8_t* data,
               std::unique_ptr<DeferredPayload> deferred);
  void OnCredit(int lane, uint64_t bytes, uint8_t priority);
  // Control messages of the running link over a wire (UCX). SealControl: the backend is about
  // to send `header` (a credit or heartbeat) on connection `lane`; on an authenticated link it
  // stamps `lane`, the version and the tag (a plain link leaves it as it is). OnControl: one
  // arrived on connection `lane`: on an authenticated link it must verify (else the link fails
  // with DataLoss naming the peer); a credit then returns window as OnCredit.
  void SealControl(int lane, ControlHeader* header);
  void OnControl(int lane, const ControlHeader& header);
  // Fails all pending and future work with `status` (Unavailable for a lost peer).
  void Fail(absl::Status status);
  bool failed() const;
  // True while a send or receive is pending (the backend's silent-peer watchdog cares only then).
  bool HasPendingWork() const;

 private:
  struct OutMsg {
    uint64_t seq = 0;
    Tag tag = 0;
    uint64_t tag_seq = 0;
    const uint8_t* data = nullptr;
    uint64_t size = 0;
    Priority priority = Priority::kNormal;
    bool control = false;            // SendOptions::control.
    uint64_t next_offset = 0;        // First byte not yet handed to a lane.
    uint64_t chunks_outstanding = 0;  // Handed to a lane, `done` not yet run.
    bool all_handed = false;          // No more chunks will be handed (sent or failed).
    absl::Status status;
    SendCallback done;
  };
  struct PostedRecv {
    absl::Span<uint8_t> buffer;
    RecvAllocator allocate;  // Null: use `buffer`.
    RecvCallback done;
  };
  struct StagedChunk {
    uint64_t offset = 0;
    uint32_t length = 0;
    std::vector<uint8_t> bytes;                 // Arrived with the header...
    std::unique_ptr<DeferredPayload> deferred;  // ...or still at the sender.
  };
  struct InMsg {
    uint64_t seq = 0;
    Tag tag = 0;
    uint64_t tag_seq = 0;
    uint64_t total = 0;
    uint64_t bytes_seen = 0;    // Chunk lengths that arrived.
    uint64_t bytes_placed = 0;  // Bytes that landed in `buffer`.
    int fetches_outstanding = 0;
    bool matched = false;
    bool discard = false;      // Matched, failed; later chunks are dropped.
    bool done_posted = false;
    uint8_t* buffer = nullptr;
    absl::Status status;
    RecvCallback done;
    std::vector<StagedChunk> staged;
  };
  struct TagState {
    uint64_t next_match = 0;  // tag_seq the next posted receive takes.
    std::deque<PostedRecv> posted;
    std::map<uint64_t, InMsg*> unmatched;  // By tag_seq.
  };

  // A chunk of an authenticated link, reserved by the scheduler, to be sealed and handed to its
  // lane without the mutex (FlushOutbox).
  struct Handoff {
    ChunkHeader header{};  // As sent: sealed flags, wire length.
    int lane = 0;
    uint64_t seq = 0;
    uint32_t length = 0;  // Plaintext bytes at `data`.
    const uint8_t* data = nullptr;
    bool credit = false;
    Priority priority = Priority::kNormal;
    bool fast = false;  // Counted in sealed_unsent_bytes_.
  };
  struct EarlyChunk {  // Arrived before Configure().
    int lane = 0;
    ChunkHeader header{};
    std::vector<uint8_t> bytes;
    std::unique_ptr<DeferredPayload> deferred;
  };
  // Before Configure(): kept (early_); after: OnChunkLocked.
  void OnChunkPlainOrDeferredLocked(int lane, const ChunkHeader& header, const uint8_t* data,
                                    std::unique_ptr<DeferredPayload> deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A chunk as it arrived: checked and, when sealed, opened (deferred ones when fetched).
  void OnChunkLocked(int lane, const ChunkHeader& header, const uint8_t* data,
                     std::unique_ptr<DeferredPayload> deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A chunk whose header and bytes are plain (opened, or from a plain link).
  void AcceptChunkLocked(int lane, const ChunkHeader& h, const uint8_t* data,
                         std::unique_ptr<DeferredPayload> deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Seals and hands the chunks the scheduler reserved (outbox_); called without the mutex by
  // every path that may have reserved some. `from_sender`: on the thread of a Send, which seals
  // small chunks itself; everything else goes to the crypto pool.
  void FlushOutbox(bool from_sender) ABSL_LOCKS_EXCLUDED(mu_);
  // The outbox's chunks and the held ones that may be sealed now (kMaxSealAheadBytes; all of
  // them once the link failed, so that they complete); the rest of a fast link's wait in held_.
  std::vector<Handoff> TakeSealableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `kick`: progress the backend afterwards (the sending thread; never a crypto pool thread).
  void SealAndHand(const Handoff& handoff, const std::shared_ptr<SecureChannel>& channel,
                   bool kick) ABSL_LOCKS_EXCLUDED(mu_);
  void SendLocked(Tag tag, absl::Span<const uint8_t> data, SendOptions options, SendCallback done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecvLocked(Tag tag, PostedRecv recv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandChunkLocked(OutMsg* msg, int lane, uint64_t offset, uint32_t length, bool credit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `fast_sealed`: the chunk counted in sealed_unsent_bytes_.
  void OnChunkSent(uint64_t seq, int lane, uint32_t length, bool credit, Priority priority,
                   absl::Status status, bool fast_sealed = false);
  void ReturnWindowLocked(int lane, uint64_t bytes, int priority)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a bulk chunk yields now; if so, bulk_bucket_ holds its pace and chunk size.
  bool BulkYieldLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The non-bulk send rate at `now` (nonbulk_rate_ decayed since nonbulk_at_).
  double NonBulkRateLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr double kNonBulkRateSeconds = 1.0;
  void OnPacingTimer();
  void MaybeFinishSendLocked(OutMsg* msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void TryMatchLocked(Tag tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MatchLocked(InMsg* msg, PostedRecv recv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a chunk's bytes into the matched buffer; a fetched chunk returns its credit on
  // `credit_lane` (-1: none) when the fetch completes.
  void PlaceLocked(InMsg* msg, uint64_t offset, uint32_t length, const uint8_t* bytes,
                   std::unique_ptr<DeferredPayload> deferred, int credit_lane, uint8_t priority)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFetchDone(uint64_t seq, uint32_t length, int credit_lane, uint8_t priority,
                   absl::Status status);
  void MaybeFinishRecvLocked(InMsg* msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PostSendDone(SendCallback done, absl::Status status);
  void PostRecvDone(RecvCallback done, absl::StatusOr<size_t> result);
  void Kick();

  // Busy-time accounting for the achieved rates.
  void SendBusyLocked(int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecvBusyLocked(int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<Executor> executor_;
  const std::string peer_address_;

  mutable Mutex mu_;
  std::function<void()> kick_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> lane_inflight_ ABSL_GUARDED_BY(mu_);
  bool configured_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<SecureChannel> channel_ ABSL_GUARDED_BY(mu_);
  std::vector<Handoff> outbox_ ABSL_GUARDED_BY(mu_);
  std::vector<EarlyChunk> early_ ABSL_GUARDED_BY(mu_);
  uint64_t early_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  LinkClass link_class_ ABSL_GUARDED_BY(mu_) = LinkClass::kFast;
  SchedulerOptions scheduler_ ABSL_GUARDED_BY(mu_);
  int64_t fast_chunk_bytes_ ABSL_GUARDED_BY(mu_) = 64 << 20;
  int64_t window_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  ProbeResult probe_ ABSL_GUARDED_BY(mu_);
  std::optional<TokenBucket> bucket_ ABSL_GUARDED_BY(mu_);
  // Bulk yielding (SchedulerOptions::bulk_yield): the bulk-only bucket, the non-bulk send rate
  // (an exponential average over about a second) and when a non-bulk chunk last left.
  std::optional<TokenBucket> bulk_bucket_ ABSL_GUARDED_BY(mu_);
  int64_t bulk_chunk_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  double nonbulk_rate_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time nonbulk_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool pacing_timer_armed_ ABSL_GUARDED_BY(mu_) = false;

  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);

  // Send side.
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<Tag, uint64_t> next_tag_seq_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<OutMsg>> out_ ABSL_GUARDED_BY(mu_);
  std::deque<OutMsg*> queues_[kNumPriorities] ABSL_GUARDED_BY(mu_);
  uint64_t inflight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Fast authenticated links: sealed bytes handed to the outbox whose send has not completed
  // (they size the next chunks, see kMaxSealedChunkBytes).
  uint64_t sealed_unsent_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Fast authenticated links: chunks reserved but held back (kMaxSealAheadBytes), in order, and
  // the bytes handed to the pool or the wire and not yet sent.
  std::deque<Handoff> held_ ABSL_GUARDED_BY(mu_);
  uint64_t sealing_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // In flight per priority: a chunk is not handed while a higher-priority one is in flight, so
  // that bulk chunks handed during a rendezvous hand-shake cannot get ahead of its bytes.
  uint64_t inflight_by_priority_[kNumPriorities] ABSL_GUARDED_BY(mu_) = {};

  // Receive side.
  absl::flat_hash_map<uint64_t, std::unique_ptr<InMsg>> in_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Tag, TagState> tags_ ABSL_GUARDED_BY(mu_);

  // Counters.
  LinkCounters counters_ ABSL_GUARDED_BY(mu_);
  int send_active_ ABSL_GUARDED_BY(mu_) = 0;
  int recv_active_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time send_busy_since_ ABSL_GUARDED_BY(mu_);
  absl::Time recv_busy_since_ ABSL_GUARDED_BY(mu_);
  absl::Duration send_busy_ ABSL_GUARDED_BY(mu_);
  absl::Duration recv_busy_ ABSL_GUARDED_BY(mu_);
};

// The Endpoint handed to callers: a Link plus whatever backend state must outlive it.
class LinkEndpoint final : public Endpoint {
 public:
  LinkEndpoint(std::shared_ptr<Link> link, std::shared_ptr<void> backend)
      : link_(std::move(link)), backend_(std::move(backend)) {}
  ~LinkEndpoint() override { link_->Close(); }

  void Send(Tag tag, absl::Span<const uint8_t> data, SendOptions options,
            SendCallback done) override {
    link_->Send(tag, data, options, std::move(done));
  }
  void Recv(Tag tag, absl::Span<uint8_t> buffer, RecvCallback done) override {
    link_->Recv(tag, buffer, std::move(done));
  }
  void Recv(Tag tag, RecvAllocator allocate, RecvCallback done) override {
    link_->Recv(tag, std::move(allocate), std::move(done));
  }
  void ReleaseTags(Tag first, Tag last) override { link_->ReleaseTags(first, last); }
  void Close() override { link_->Close(); }
  LinkClass link_class() const override { return link_->link_class(); }
  LinkCounters counters() const override { return link_->counters(); }
  std::string peer_address() const override { return link_->peer_address(); }

 private:
  std::shared_ptr<Link> link_;
  std::shared_ptr<void> backend_;
};

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_LINK_H_
