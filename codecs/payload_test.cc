#include "codecs/payload.h"

#include <cstdint>
#include <random>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<uint8_t> MakePayload(absl::Span<const int64_t> shape, size_t params, size_t body) {
  std::vector<uint8_t> out(PayloadBytes(shape.size(), params, body));
  PayloadWriter writer;
  EXPECT_THAT(writer.Begin(absl::MakeSpan(out), CodecId::kDenseQuant, 3, DType::kBF16, shape,
                           params, body, 0x5),
              IsOk());
  for (size_t i = 0; i < params; ++i) writer.params()[i] = static_cast<uint8_t>(0xA0 + i);
  for (size_t i = 0; i < body; ++i) writer.body()[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ(writer.Finish(), out.size());
  return out;
}

TEST(PayloadTest, RoundTrip) {
  const std::vector<int64_t> shape = {3, 5};
  std::vector<uint8_t> bytes = MakePayload(shape, 6, 40);
  EXPECT_EQ(bytes.size(), 24u + 16 + 6 + 40 + 8);
  LBCC_ASSERT_OK_AND_ASSIGN(PayloadInfo info, ParsePayload(bytes));
  EXPECT_EQ(info.codec, CodecId::kDenseQuant);
  EXPECT_EQ(info.codec_version, 3);
  EXPECT_EQ(info.dtype, DType::kBF16);
  EXPECT_EQ(info.flags, 0x5);
  EXPECT_THAT(info.shape, ::testing::ElementsAre(3, 5));
  EXPECT_EQ(info.num_elements, 15);
  ASSERT_EQ(info.params.size(), 6u);
  EXPECT_EQ(info.params[5], 0xA5);
  ASSERT_EQ(info.body.size(), 40u);
  EXPECT_EQ(info.body[3], 21);
  EXPECT_THAT(PeekPayloadBytes(absl::MakeSpan(bytes).subspan(0, 40)),
              ::lbcc::testing::IsOkAndHolds(bytes.size()));
  EXPECT_THAT(PeekPayloadBodyOffset(absl::MakeSpan(bytes).subspan(0, 40)),
              ::lbcc::testing::IsOkAndHolds(
                  static_cast<size_t>(info.body.data() - bytes.data())));
  EXPECT_THAT(PeekPayloadBodyOffset(absl::MakeSpan(bytes).subspan(0, 20)),
              StatusIs(absl::StatusCode::kDataLoss));
}

TEST(PayloadTest, EveryFlippedBitIsRejected) {
  const std::vector<uint8_t> good = MakePayload({7}, 4, 9);
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bad = good;
      bad[byte] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_THAT(ParsePayload(bad), StatusIs(absl::StatusCode::kDataLoss))
          << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(PayloadTest, RejectionsSayWhy) {
  const std::vector<uint8_t> good = MakePayload({2, 2}, 0, 8);
  auto with = [&](size_t offset, uint8_t value) {
    std::vector<uint8_t> b = good;
    b[offset] = value;
    return b;
  };
  EXPECT_THAT(ParsePayload(with(0, 'X')), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("magic")));
  EXPECT_THAT(ParsePayload(with(4, 9)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("envelope version")));
  EXPECT_THAT(ParsePayload(with(6, 77)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("codec id")));
  EXPECT_THAT(ParsePayload(with(8, 0)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("dtype")));
  EXPECT_THAT(ParsePayload(with(9, 9)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("rank")));
  EXPECT_THAT(ParsePayload(with(31, 0x80)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("negative")));
  EXPECT_THAT(ParsePayload(absl::MakeSpan(good).subspan(0, good.size() - 1)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_THAT(ParsePayload(longer), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("trailing")));
  EXPECT_THAT(ParsePayload(with(good.size() - 9, good[good.size() - 9] ^ 1)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum")));
  EXPECT_THAT(ParsePayload({}), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  std::vector<uint8_t> huge = good;
  for (int i = 16; i < 24; ++i) huge[i] = 0xff;
  EXPECT_THAT(ParsePayload(huge), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("overflow")));
}

TEST(PayloadTest, WriterChecksItsArguments) {
  std::vector<uint8_t> small(10);
  PayloadWriter writer;
  EXPECT_THAT(writer.Begin(absl::MakeSpan(small), CodecId::kTopKEf, 1, DType::kF32, {4}, 0, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs")));
  std::vector<uint8_t> big(1000);
  EXPECT_THAT(writer.Begin(absl::MakeSpan(big), CodecId::kTopKEf, 1, DType::kF32, {-4}, 0, 16),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ByteReaderTest, BoundsAndValues) {
  std::vector<uint8_t> bytes(15);
  ByteWriter w(absl::MakeSpan(bytes));
  w.U8(1);
  w.U16(0x0203);
  w.U32(0x04050607);
  w.U64(0x08090a0b0c0d0e0full);
  EXPECT_EQ(w.offset(), 15u);
  ByteReader r(bytes);
  EXPECT_THAT(r.U8("a"), ::lbcc::testing::IsOkAndHolds(1));
  EXPECT_THAT(r.U16("b"), ::lbcc::testing::IsOkAndHolds(0x0203));
  EXPECT_THAT(r.ExpectEnd("c"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(r.U32("c"), ::lbcc::testing::IsOkAndHolds(0x04050607u));
  EXPECT_THAT(r.U64("d"), ::lbcc::testing::IsOkAndHolds(0x08090a0b0c0d0e0full));
  EXPECT_THAT(r.U8("tail"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tail")));
  EXPECT_THAT(r.ExpectEnd("all"), IsOk());
}

}  // namespace
}  // namespace lbcc::codecs
