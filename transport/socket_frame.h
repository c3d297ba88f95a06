// The socket backend's frames (socket_transport.h's wire) without a socket: the writer's frame
// heads and the reader, a state machine over the bytes a connection delivers. The reactor
// (socket_transport.cc) receives straight into the space the reader offers (a chunk's bytes land
// in its body, not copied) and hands each whole frame on; socket_frame_fuzz drives the same
// reader with untrusted bytes.
//
// A frame: kind (u8), then for kFrameControl a ControlHeader (64 bytes) and u32 payload length,
// for kFrameChunk a ChunkHeader (48 bytes) whose `length` counts the chunk's bytes; then that
// many bytes. Host byte order, like the headers themselves.
//
// Thread-safety: none; one reader per connection, used by one thread.
#ifndef LBCC_TRANSPORT_SOCKET_FRAME_H_
#define LBCC_TRANSPORT_SOCKET_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "transport/lane.h"
#include "transport/link_setup.h"

namespace lbcc::transport {

inline constexpr uint8_t kFrameControl = 1;
inline constexpr uint8_t kFrameChunk = 2;
inline constexpr uint64_t kMaxSocketFrameBytes = uint64_t{1} << 30;

// The bytes of a frame's kind and header (0 for an unknown kind).
size_t SocketFrameHeadBytes(uint8_t kind);

// A frame's head as the writer sends it, before the body.
std::string SocketFrameHead(const ControlHeader& header, uint32_t payload_bytes);
std::string SocketFrameHead(const ChunkHeader& header);

class SocketFrameReader {
 public:
  // Where the next received bytes go: the rest of the frame's head, or of its body. Never
  // empty unless ready() (handle the frame, then Next()) or failed.
  absl::Span<uint8_t> Space();
  // `n` bytes (at most Space().size()) were written at Space(). DataLoss for an unknown kind or
  // a body of more than `limit` bytes: the connection must be closed (the reader stays failed).
  absl::Status Received(size_t n, uint64_t limit);

  // A whole frame arrived.
  bool ready() const { return ready_; }
  uint8_t kind() const { return head_[0]; }
  ControlHeader control() const;  // kind() == kFrameControl
  ChunkHeader chunk() const;      // kind() == kFrameChunk
  // Its body (a control frame's payload, a chunk's bytes); the caller may move it away.
  std::vector<uint8_t>& body() { return body_; }
  // Past the frame handled: the next one's bytes are awaited.
  void Next();

 private:
  static constexpr size_t kMaxHead = 1 + sizeof(ControlHeader) + 4;
  static_assert(kMaxHead >= 1 + sizeof(ChunkHeader), "a chunk's head fits");

  uint8_t head_[kMaxHead] = {};
  size_t head_size_ = 0;
  std::vector<uint8_t> body_;
  size_t body_read_ = 0;
  bool in_body_ = false;
  bool ready_ = false;
  bool failed_ = false;
};

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_SOCKET_FRAME_H_
