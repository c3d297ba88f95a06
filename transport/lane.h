// What a backend provides to a Link: lanes (one connection each) that carry data chunks and
// credits, and deferred payloads for chunks whose bytes have not moved yet (UCX rendezvous).
//
// The Link calls these methods with its own mutex held, so an implementation must only queue work:
// it never calls back into the Link from inside a call, and runs every `done` exactly once, later,
// on a backend thread that holds no Link mutex. After Close() every outstanding `done` still runs
// (with an error when the work did not happen).
//
// Thread-safety: every method may be called from any thread.
#ifndef LBCC_TRANSPORT_LANE_H_
#define LBCC_TRANSPORT_LANE_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "transport/wire_constants.h"

namespace lbcc::transport {

// Header of one data chunk on the wire (host byte order: LBCC runs on little-endian machines).
// A message of n bytes travels as max(1, ceil(n / chunk)) chunks, in any order and over any lane.
struct ChunkHeader {
  uint64_t msg_seq;     // Sender's message number on this link (0, 1, 2, ...).
  uint64_t tag;
  uint64_t tag_seq;     // Sender's message number within `tag`: the receiver matches in this order.
  uint64_t total_size;  // Message length.
  uint64_t offset;      // Of this chunk within the message.
  uint32_t length;      // Of this chunk.
  uint8_t priority;
  uint8_t flags;        // kChunkNeedsCredit.
  uint16_t version;     // kWireVersion (transport/wire_constants.h).
};
static_assert(sizeof(ChunkHeader) == 48, "ChunkHeader is a wire format");

// The receiver returns a credit of `length` bytes on the same lane once the chunk's bytes have
// crossed the link (an eager chunk on arrival, a rendezvous chunk when its fetch completes, a
// parked or dropped one at once): the sender's slow-link window.
inline constexpr uint8_t kChunkNeedsCredit = 1;

using DoneCallback = absl::AnyInvocable<void(absl::Status)>;

class Lane {
 public:
  virtual ~Lane() = default;
  // Sends one chunk; [data, data + length) stays valid until `done`. `done` gets OK, Cancelled
  // (lane closed first) or Unavailable (connection lost).
  virtual void SendChunk(const ChunkHeader& header, const uint8_t* data, size_t length,
                         DoneCallback done) = 0;
  // Returns `bytes` of window, taken by chunks of `priority`, to the peer's sender (see
  // kChunkNeedsCredit).
  virtual void SendCredit(uint64_t bytes, uint8_t priority) = 0;
  // Disconnects; idempotent.
  virtual void Close() = 0;
};

// The bytes of a received chunk that are still at the sender. Destroying it without Fetch()
// discards them.
class DeferredPayload {
 public:
  virtual ~DeferredPayload() = default;
  // Moves the chunk's bytes to `dst` (header.length bytes, valid until `done`). Call at most once;
  // the object may be destroyed right after.
  virtual void Fetch(uint8_t* dst, DoneCallback done) = 0;
};

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_LANE_H_
