// Fuzzes the socket backend's frame reader (transport/socket_frame.h) as its reactor drives it:
// the input's first byte seeds how the rest, the bytes a connection delivers, is cut into
// receives (1 byte to 64 KiB each); frames up to 4 KiB while the connection is a stranger, then,
// once a HELLO frame was admitted by a LinkSetup server (as the reactor does), frames up to
// 1 MiB (the reactor's limit is 1 GiB, kMaxSocketFrameBytes: kept small so that executions stay
// fast). Never a crash. The reader offers room until a frame is whole or it failed; it fails
// exactly on an unknown kind or a body over the limit, and then stays failed; each whole frame
// re-encodes (SocketFrameHead + body) to exactly the bytes it was read from.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "transport/link_setup.h"
#include "transport/options.h"
#include "transport/socket_frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lbcc::transport;
  if (size == 0) return 0;
  uint64_t rng = data[0] * 0x9E3779B97F4A7C15ull + 1;
  const uint8_t* stream = data + 1;
  const size_t n = size - 1;
  TransportOptions options;  // no secret: a HELLO of this wire version is admitted
  ProbeScratch scratch;
  LinkSetup server(LinkSetup::Role::kServer, options, "fuzz-client", HostPort{"fuzz", 0});
  SocketFrameReader reader;
  bool stranger = true;
  size_t at = 0, frame_start = 0;
  while (at < n) {
    const absl::Span<uint8_t> space = reader.Space();
    if (space.empty()) std::abort();  // neither ready (handled below) nor failed (returned)
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    const size_t cut = 1 + (rng >> 33) % (rng >> 62 == 0 ? 65536 : 64);
    const size_t take = std::min({space.size(), n - at, cut});
    std::memcpy(space.data(), stream + at, take);
    at += take;
    const uint64_t limit = stranger ? 4096 : (1 << 20);
    const absl::Status status = reader.Received(take, limit);
    if (!status.ok()) {
      if (status.code() != absl::StatusCode::kDataLoss) std::abort();
      // Only an unknown kind or an oversized body fails the reader, and it stays failed.
      const uint8_t kind = stream[frame_start];
      if (kind == kFrameControl || kind == kFrameChunk) {
        const size_t head = SocketFrameHeadBytes(kind);
        if (at - frame_start != head) std::abort();
        uint64_t length = 0;
        if (kind == kFrameControl) {
          uint32_t l;
          std::memcpy(&l, stream + frame_start + head - 4, 4);
          length = l;
        } else {
          ChunkHeader h;
          std::memcpy(&h, stream + frame_start + 1, sizeof(h));
          length = h.length;
        }
        if (length <= limit) std::abort();
      } else if (at - frame_start != 1) {
        std::abort();
      }
      if (!reader.Space().empty() || reader.Received(0, limit).ok()) std::abort();
      return 0;
    }
    if (!reader.ready()) continue;
    std::string again = reader.kind() == kFrameControl
                            ? SocketFrameHead(reader.control(),
                                              static_cast<uint32_t>(reader.body().size()))
                            : SocketFrameHead(reader.chunk());
    again.append(reinterpret_cast<const char*>(reader.body().data()), reader.body().size());
    if (again.size() != at - frame_start ||
        std::memcmp(again.data(), stream + frame_start, again.size()) != 0) {
      std::abort();
    }
    if (reader.kind() == kFrameControl) {
      ControlHeader h = reader.control();
      // A PING or PROBE_REQUEST may ask for probe buffers of up to 1 GiB (by design); small here.
      if (h.type == static_cast<uint32_t>(Ctl::kPing) ||
          h.type == static_cast<uint32_t>(Ctl::kProbeRequest)) {
        h.b = std::min<uint64_t>(h.b, 1 << 16);
      }
      if (IsSetupMessage(h.type)) {
        const LinkSetup::Step step = server.OnControl(h, scratch);
        if (h.type == static_cast<uint32_t>(Ctl::kHello) && step.admit) stranger = false;
      }
    }
    reader.Next();
    frame_start = at;
  }
  return 0;
}
