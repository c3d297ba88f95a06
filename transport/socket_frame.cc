#include "transport/socket_frame.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace lbcc::transport {

size_t SocketFrameHeadBytes(uint8_t kind) {
  switch (kind) {
    case kFrameControl:
      return 1 + sizeof(ControlHeader) + 4;
    case kFrameChunk:
      return 1 + sizeof(ChunkHeader);
    default:
      return 0;
  }
}

std::string SocketFrameHead(const ControlHeader& header, uint32_t payload_bytes) {
  std::string head(SocketFrameHeadBytes(kFrameControl), '\0');
  head[0] = static_cast<char>(kFrameControl);
  std::memcpy(&head[1], &header, sizeof(header));
  std::memcpy(&head[1 + sizeof(header)], &payload_bytes, 4);
  return head;
}

std::string SocketFrameHead(const ChunkHeader& header) {
  std::string head(SocketFrameHeadBytes(kFrameChunk), '\0');
  head[0] = static_cast<char>(kFrameChunk);
  std::memcpy(&head[1], &header, sizeof(header));
  return head;
}

absl::Span<uint8_t> SocketFrameReader::Space() {
  if (ready_ || failed_) return {};
  if (in_body_) return absl::MakeSpan(body_.data() + body_read_, body_.size() - body_read_);
  const size_t need = head_size_ == 0 ? 1 : SocketFrameHeadBytes(head_[0]);
  return absl::MakeSpan(head_ + head_size_, need - head_size_);
}

absl::Status SocketFrameReader::Received(size_t n, uint64_t limit) {
  if (failed_) return absl::DataLossError("socket frame: the connection failed earlier");
  if (ready_ || n > Space().size()) {
    return absl::InternalError("socket frame: more bytes than the reader offered room for");
  }
  if (in_body_) {
    body_read_ += n;
  } else {
    head_size_ += n;
    if (head_size_ == 0) return absl::OkStatus();
    const uint8_t kind = head_[0];
    const size_t head_bytes = SocketFrameHeadBytes(kind);
    if (head_bytes == 0) {
      failed_ = true;
      return absl::DataLossError(absl::StrCat("unknown frame kind ", kind));
    }
    if (head_size_ < head_bytes) return absl::OkStatus();
    uint64_t length = 0;
    if (kind == kFrameControl) {
      uint32_t l = 0;
      std::memcpy(&l, &head_[1 + sizeof(ControlHeader)], 4);
      length = l;
    } else {
      length = chunk().length;
    }
    if (length > limit) {
      failed_ = true;
      return absl::DataLossError(absl::StrCat("a frame of ", length, " bytes"));
    }
    body_.resize(length);
    body_read_ = 0;
    in_body_ = true;
  }
  if (in_body_ && body_read_ == body_.size()) {
    in_body_ = false;
    ready_ = true;
  }
  return absl::OkStatus();
}

ControlHeader SocketFrameReader::control() const {
  ControlHeader h{};
  std::memcpy(&h, &head_[1], sizeof(h));
  return h;
}

ChunkHeader SocketFrameReader::chunk() const {
  ChunkHeader h{};
  std::memcpy(&h, &head_[1], sizeof(h));
  return h;
}

void SocketFrameReader::Next() {
  ready_ = false;
  head_size_ = 0;
  body_read_ = 0;  // body_ keeps its bytes: the next frame resizes it (no new allocation)
}

}  // namespace lbcc::transport
