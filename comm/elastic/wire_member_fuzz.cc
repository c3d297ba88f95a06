// Fuzzes the member's side of the membership protocol (comm/elastic/wire.h): the byte stream a
// member reads from the master, cut into frames (FrameReader, kMaxFrame) as it arrives in
// pieces, each frame decoded (Decode) and the first one read as the answer to the join
// (JoinAnswerStatus, as MasterLink::Connect does). Any bytes give messages or DataLoss, never a
// crash; a refusal becomes a status with a real code (never OK); a decoded message re-encodes
// to bytes that decode to a message encoding the same way (nothing is lost or made up).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "comm/elastic/wire.h"

namespace {

using lbcc::comm::elastic::Decode;
using lbcc::comm::elastic::Encode;
using lbcc::comm::elastic::Message;
using lbcc::comm::elastic::MsgType;

void CheckMessage(const Message& m) {
  const std::string once = Encode(m);
  absl::StatusOr<Message> again = Decode(once);
  if (!again.ok() || Encode(*again) != once) std::abort();
  const absl::Status answer = lbcc::comm::elastic::JoinAnswerStatus(m);
  if (answer.ok() != (m.type == MsgType::kWelcome)) std::abort();
  if (!answer.ok() && answer.code() > absl::StatusCode::kUnauthenticated) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // First byte: the size of the pieces the stream arrives in (1-256 bytes).
  const size_t piece = static_cast<size_t>(data[0]) + 1;
  const absl::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  lbcc::comm::elastic::FrameReader frames(lbcc::comm::elastic::kMaxFrame);
  size_t at = 0;
  while (true) {
    absl::StatusOr<std::optional<std::string>> body = frames.Next();
    if (!body.ok()) {
      if (body.status().code() != absl::StatusCode::kDataLoss) std::abort();
      break;
    }
    if (!body->has_value()) {
      if (at >= stream.size()) break;
      const size_t n = std::min(piece, stream.size() - at);
      frames.Append(stream.substr(at, n));
      at += n;
      continue;
    }
    absl::StatusOr<Message> m = Decode(**body);
    if (!m.ok()) {
      if (m.status().code() != absl::StatusCode::kDataLoss) std::abort();
      continue;  // A member's reader stops at the first corrupt frame; later ones are fuzzed too.
    }
    CheckMessage(*m);
  }
  return 0;
}
