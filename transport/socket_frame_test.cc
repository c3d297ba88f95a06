// The socket backend's frame reader (socket_frame.h): frames cut anywhere, empty bodies, the
// limits, unknown kinds; the heads the writer sends.
#include "transport/socket_frame.h"

#include <cstring>
#include <string>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::transport {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

struct Frame {
  uint8_t kind;
  ControlHeader control{};
  ChunkHeader chunk{};
  std::string body;
};

// Feeds `stream` in pieces of at most `piece` bytes; the frames read, or the first error.
absl::Status Read(const std::string& stream, size_t piece, uint64_t limit,
                  std::vector<Frame>* frames) {
  SocketFrameReader reader;
  size_t at = 0;
  while (at < stream.size()) {
    absl::Span<uint8_t> space = reader.Space();
    if (space.empty()) return absl::InternalError("no room offered");
    const size_t n = std::min({space.size(), piece, stream.size() - at});
    std::memcpy(space.data(), stream.data() + at, n);
    at += n;
    absl::Status s = reader.Received(n, limit);
    if (!s.ok()) return s;
    if (reader.ready()) {
      Frame f{reader.kind()};
      if (f.kind == kFrameControl) f.control = reader.control();
      if (f.kind == kFrameChunk) f.chunk = reader.chunk();
      f.body.assign(reader.body().begin(), reader.body().end());
      frames->push_back(std::move(f));
      reader.Next();
    }
  }
  return absl::OkStatus();
}

std::string Stream() {
  ControlHeader hello{};
  hello.type = 7;
  hello.conn_id = 0x1234;
  ChunkHeader chunk{};
  chunk.tag = 9;
  chunk.length = 5;
  ChunkHeader empty{};
  empty.tag = 10;
  return SocketFrameHead(hello, 0) + SocketFrameHead(chunk) + "hello" +
         SocketFrameHead(empty) + SocketFrameHead(hello, 3) + "abc";
}

TEST(SocketFrameTest, FramesCutAnywhereReadTheSame) {
  for (size_t piece : {size_t{1}, size_t{2}, size_t{7}, size_t{64}, size_t{1} << 20}) {
    SCOPED_TRACE(piece);
    std::vector<Frame> frames;
    ASSERT_THAT(Read(Stream(), piece, 4096, &frames), IsOk());
    ASSERT_EQ(frames.size(), 4u);
    EXPECT_EQ(frames[0].kind, kFrameControl);
    EXPECT_EQ(frames[0].control.conn_id, 0x1234u);
    EXPECT_EQ(frames[0].body, "");
    EXPECT_EQ(frames[1].kind, kFrameChunk);
    EXPECT_EQ(frames[1].chunk.tag, 9u);
    EXPECT_EQ(frames[1].body, "hello");
    EXPECT_EQ(frames[2].chunk.tag, 10u);  // an empty chunk is a whole frame at once
    EXPECT_EQ(frames[2].body, "");
    EXPECT_EQ(frames[3].body, "abc");
  }
}

TEST(SocketFrameTest, UnknownKindsAndOversizedBodiesAreDataLossAndTheReaderStaysFailed) {
  std::vector<Frame> frames;
  EXPECT_THAT(Read("GET / HTTP/1.0", 1, 4096, &frames),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("unknown frame kind 71")));
  ChunkHeader big{};
  big.length = 4097;
  EXPECT_THAT(Read(SocketFrameHead(big), 3, 4096, &frames),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("a frame of 4097 bytes")));
  ControlHeader h{};
  EXPECT_THAT(Read(SocketFrameHead(h, 5000), 100, 4096, &frames),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("a frame of 5000 bytes")));
  EXPECT_THAT(frames, ::testing::IsEmpty());

  SocketFrameReader reader;
  const uint8_t junk = 0;
  reader.Space()[0] = junk;
  EXPECT_THAT(reader.Received(1, 4096), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(reader.Space().empty());
  EXPECT_THAT(reader.Received(0, 4096), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(SocketFrameTest, MoreBytesThanOfferedIsAnInternalError) {
  SocketFrameReader reader;
  EXPECT_EQ(reader.Space().size(), 1u);
  EXPECT_THAT(reader.Received(2, 4096), StatusIs(absl::StatusCode::kInternal));
}

}  // namespace
}  // namespace lbcc::transport
