// The Link's receive side (transport/link.h): posted receives, arriving chunks (plain, sealed,
// deferred, early), matching in the sender's order, placement and completion.
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/logging.h"
#include "transport/link.h"
#include "transport/link_crypto.h"

namespace lbcc::transport {
namespace {

using link_internal::CryptoPool;
using link_internal::HeaderBytes;
using link_internal::Scratch;
using link_internal::ScratchPool;

// Bytes a link keeps unread before Configure() (see OnChunk).
constexpr uint64_t kMaxEarlyBytes = uint64_t{1} << 30;

// The header of a sealed chunk as the sender's Link made it (plain length and flags).
ChunkHeader PlainHeader(const ChunkHeader& wire) {
  ChunkHeader h = wire;
  h.length = static_cast<uint32_t>(wire.length - SecureChannel::kOverhead);
  h.flags = static_cast<uint8_t>(wire.flags & ~(kChunkSealed | kChunkEncrypted));
  return h;
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

}  // namespace lbcc::transport
