#include "plugin/handle.h"

#include <array>
#include <cstring>
#include <string>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::plugin {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

TEST(HandleTest, RoundTripsAddressAndCommId) {
  std::array<uint8_t, kHandleBytes> bytes;
  bytes.fill(0xab);
  ASSERT_THAT(EncodeListenHandle({"10.77.0.2:41234", 0x0123456789abcdefull}, absl::MakeSpan(bytes)),
              IsOk());
  LBCC_ASSERT_OK_AND_ASSIGN(ListenHandle handle, DecodeListenHandle(bytes));
  EXPECT_EQ(handle.address, "10.77.0.2:41234");
  EXPECT_EQ(handle.comm_id, 0x0123456789abcdefull);
  EXPECT_FALSE(ReadConnectStage(bytes).has_value());  // Encoding clears the stage.
}

TEST(HandleTest, LongestAddressFitsAndLongerIsRejected) {
  std::array<uint8_t, kHandleBytes> bytes{};
  const std::string longest(kMaxAddressBytes, 'x');
  ASSERT_THAT(EncodeListenHandle({longest, 1}, absl::MakeSpan(bytes)), IsOk());
  LBCC_ASSERT_OK_AND_ASSIGN(ListenHandle handle, DecodeListenHandle(bytes));
  EXPECT_EQ(handle.address, longest);
  EXPECT_THAT(EncodeListenHandle({longest + "x", 1}, absl::MakeSpan(bytes)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(EncodeListenHandle({"", 1}, absl::MakeSpan(bytes)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::array<uint8_t, 64> small{};
  EXPECT_THAT(EncodeListenHandle({"a:1", 1}, absl::MakeSpan(small)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(HandleTest, RejectsForeignAndCorruptBytes) {
  std::array<uint8_t, kHandleBytes> good{};
  ASSERT_THAT(EncodeListenHandle({"127.0.0.1:5000", 7}, absl::MakeSpan(good)), IsOk());

  std::array<uint8_t, kHandleBytes> zeros{};
  EXPECT_THAT(DecodeListenHandle(zeros), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("magic")));
  EXPECT_THAT(DecodeListenHandle(absl::MakeConstSpan(good.data(), 100)),
              StatusIs(absl::StatusCode::kDataLoss));
  for (size_t i = 0; i < 104; ++i) {
    std::array<uint8_t, kHandleBytes> bad = good;
    bad[i] ^= 0x40;
    EXPECT_THAT(DecodeListenHandle(bad), StatusIs(absl::StatusCode::kDataLoss)) << "byte " << i;
  }
}

// handle_fuzz's finding (plugin/testdata/handle_corpus/padding_byte_after_address): a byte in
// the address field's padding under a checksum that covers it. Such a handle does not re-encode
// to itself, so it is not one of ours.
TEST(HandleTest, RejectsBytesAfterTheAddressEvenUnderAValidChecksum) {
  std::array<uint8_t, kHandleBytes> bytes{};
  ASSERT_THAT(EncodeListenHandle({"127.1.0.1:41234", 0x1122344455667788ull}, absl::MakeSpan(bytes)),
              IsOk());
  bytes[74] = 0x08;
  const uint8_t checksum[4] = {0xd3, 0x69, 0x2a, 0x80};  // FNV-1a 32 of bytes [0, 96) as changed
  std::memcpy(bytes.data() + 96, checksum, sizeof(checksum));
  EXPECT_THAT(DecodeListenHandle(bytes),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("after its 15-byte address")));
}

TEST(HandleTest, ConnectStageIsLocalAndDoesNotDisturbTheHandle) {
  std::array<uint8_t, kHandleBytes> bytes{};
  ASSERT_THAT(EncodeListenHandle({"127.0.0.1:5000", 9}, absl::MakeSpan(bytes)), IsOk());
  WriteConnectStage(absl::MakeSpan(bytes), {0xfeed, 42});
  std::optional<ConnectStage> stage = ReadConnectStage(bytes);
  ASSERT_TRUE(stage.has_value());
  EXPECT_EQ(stage->net_instance, 0xfeedu);
  EXPECT_EQ(stage->attempt_id, 42u);
  LBCC_ASSERT_OK_AND_ASSIGN(ListenHandle handle, DecodeListenHandle(bytes));
  EXPECT_EQ(handle.comm_id, 9u);
  ClearConnectStage(absl::MakeSpan(bytes));
  EXPECT_FALSE(ReadConnectStage(bytes).has_value());
  LBCC_EXPECT_OK(DecodeListenHandle(bytes).status());
}

}  // namespace
}  // namespace lbcc::plugin
