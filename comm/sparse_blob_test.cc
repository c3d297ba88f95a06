#include "comm/sparse_blob.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm::internal {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

std::string BlobOf(const std::vector<std::string>& payloads) {
  std::string blob(1, '\1');
  const uint32_t count = static_cast<uint32_t>(payloads.size());
  blob.append(reinterpret_cast<const char*>(&count), 4);
  for (const std::string& p : payloads) {
    const uint64_t size = p.size();
    blob.append(reinterpret_cast<const char*>(&size), 8);
    blob += p;
  }
  return blob;
}

TEST(SparseBlobTest, SplitReturnsThePayloadsAndRejectsMalformedBlobs) {
  const std::string blob = BlobOf({"abc", "", std::string(1000, 'x')});
  absl::StatusOr<std::vector<absl::Span<const uint8_t>>> spans = SplitBlob(blob, 3, 2);
  ASSERT_THAT(spans, IsOk());
  ASSERT_EQ(spans->size(), 3u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*spans)[0].data()), 3), "abc");
  EXPECT_TRUE((*spans)[1].empty());
  EXPECT_EQ((*spans)[2].size(), 1000u);

  EXPECT_THAT(SplitBlob(blob, 2, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2 sent 3 tensors")));
  EXPECT_THAT(SplitBlob(ErrorBlob(absl::InvalidArgumentError("NaN in tensor 4")), 3, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1 could not encode its input: INVALID_ARGUMENT: NaN")));
  EXPECT_THAT(SplitBlob("", 3, 0), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("empty")));
  // A long message is cut; the blob stays well-formed.
  EXPECT_THAT(SplitBlob(ErrorBlob(absl::InternalError(std::string(100000, 'm'))), 1, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 1 could not encode")));
  EXPECT_LE(ErrorBlob(absl::InternalError(std::string(100000, 'm'))).size(),
            kMaxErrorMessageBytes + 9);
  for (size_t cut = 1; cut < blob.size(); cut += 97) {
    EXPECT_THAT(SplitBlob(blob.substr(0, cut), 3, 0),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")))
        << cut;
  }
  EXPECT_THAT(SplitBlob(blob + "z", 3, 0),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("trailing bytes")));
}

// A message that starts with byte 0 but is not an error blob (float bytes of a corrupt or
// foreign payload) is DataLoss, and its bytes are not reported as some rank's error text.
TEST(SparseBlobTest, BytesStartingWithZeroAreNotTakenForAnErrorMessage) {
  std::string floats(4000, '\0');
  for (size_t i = 0; i < floats.size(); i += 4) floats[i + 3] = '\x3f';  // 0.5f-ish words
  const absl::Status status = SplitBlob(floats, 2, 3).status();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDataLoss,
                               HasSubstr("payloads from rank 3: neither payloads nor an error")));
  EXPECT_LT(status.message().size(), 200u);
  // The right magic with a length that disagrees with the message's.
  std::string blob = ErrorBlob(absl::InvalidArgumentError("NaN"));
  EXPECT_THAT(SplitBlob(blob + "x", 1, 2),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("its header says")));
  EXPECT_THAT(SplitBlob(blob.substr(0, 6), 1, 2),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated error message")));
  EXPECT_THAT(SplitBlob(std::string(1, '\0'), 1, 2),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated error message")));
}

// Any split of a blob into prefix, streamed bytes (cut into pieces anyhow) and rest comes back
// byte for byte; a final message that disagrees with its pieces is DataLoss, never a crash.
TEST(SparseBlobTest, StreamedBlobsReassembleAndBadFinalsAreRejected) {
  std::mt19937 rng(5);
  const std::string blob = BlobOf({std::string(5000, 'a'), "tail"});
  for (int trial = 0; trial < 200; ++trial) {
    const size_t prefix = rng() % (blob.size() + 1);
    const size_t used = rng() % (blob.size() - prefix + 1);
    std::vector<std::string> pieces;
    size_t at = prefix;
    while (at < prefix + used || pieces.size() < 4) {
      const size_t n = std::min<size_t>(prefix + used - at, rng() % 2000);
      pieces.push_back(blob.substr(at, n));
      at += n;
    }
    absl::StatusOr<std::string> back = AssembleStreamed(pieces, StreamFinal(blob, prefix, used), 3);
    ASSERT_THAT(back, IsOk()) << trial;
    ASSERT_EQ(*back, blob) << trial;
  }
  const std::vector<std::string> pieces = {blob.substr(10, 100)};
  const std::string good = StreamFinal(blob, 10, 100);
  ASSERT_THAT(AssembleStreamed(pieces, good, 1), IsOk());
  // More streamed bytes used than the pieces hold.
  EXPECT_THAT(AssembleStreamed({blob.substr(10, 99)}, good, 1),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank 1")));
  // A prefix longer than the message, a truncated header, an empty message.
  std::string bad = good;
  const uint64_t huge = bad.size();
  std::memcpy(bad.data(), &huge, 8);
  EXPECT_THAT(AssembleStreamed(pieces, bad, 1), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(AssembleStreamed(pieces, good.substr(0, 15), 1),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(AssembleStreamed(pieces, "", 1), StatusIs(absl::StatusCode::kDataLoss));
  // Random bytes as the final message: rejected or assembled, never past the buffers.
  for (int trial = 0; trial < 1000; ++trial) {
    std::string junk(rng() % 64, '\0');
    for (char& c : junk) c = static_cast<char>(rng() % 4 == 0 ? rng() : 0);
    absl::StatusOr<std::string> out = AssembleStreamed(pieces, junk, 0);
    if (out.ok()) {
      uint64_t header[2];
      std::memcpy(header, junk.data(), 16);
      EXPECT_EQ(out->size(), junk.size() - 16 + header[1]);
    }
  }
}

}  // namespace
}  // namespace lbcc::comm::internal
