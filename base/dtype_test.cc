#include "base/dtype.h"

#include <immintrin.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "base/cpu.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc {
namespace {

using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::StatusIs;

TEST(DTypeTest, SizesNamesAndParsing) {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI8,
                       DType::kU8,  DType::kI32, DType::kI64};
  const size_t sizes[] = {4, 2, 2, 1, 1, 4, 8};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(DTypeSize(all[i]), sizes[i]);
    EXPECT_THAT(ParseDType(DTypeName(all[i])), IsOkAndHolds(all[i]));
    EXPECT_TRUE(IsValidDType(static_cast<uint8_t>(all[i])));
  }
  EXPECT_THAT(ParseDType("bfloat16"), IsOkAndHolds(DType::kBF16));
  EXPECT_THAT(ParseDType("HALF"), IsOkAndHolds(DType::kF16));
  EXPECT_THAT(ParseDType("f8"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(IsValidDType(0));
  EXPECT_FALSE(IsValidDType(8));
  EXPECT_EQ(DTypeSize(static_cast<DType>(99)), 0u);
}

// The bf16 nearest to `x` by exhaustive reasoning on neighbours: the two bf16 values that
// bracket x (truncation and truncation + 1 ulp), pick the closer in double, ties to even.
uint16_t ReferenceBf16(float x) {
  const uint32_t bits = FloatBits(x);
  const uint16_t low = static_cast<uint16_t>(bits >> 16);
  const uint16_t high = static_cast<uint16_t>(low + 1);
  const double dl = std::fabs(static_cast<double>(Bf16ToF32(low)) - x);
  const double dh = std::fabs(static_cast<double>(Bf16ToF32(high)) - x);
  // Exponent overflow of `high` lands on infinity, which is the right rounding past max.
  if (std::isinf(Bf16ToF32(high)) && !std::isinf(x)) {
    // Halfway point to 2^128 decides, per IEEE.
    const double halfway = (std::fabs(static_cast<double>(Bf16ToF32(low))) + std::ldexp(1.0, 128)) / 2;
    const double ax = std::fabs(static_cast<double>(x));
    if (ax < halfway) return low;
    if (ax > halfway) return high;
    return (low & 1) ? high : low;
  }
  if (dl < dh) return low;
  if (dh < dl) return high;
  return (low & 1) ? high : low;
}

TEST(DTypeTest, Bf16RoundsToNearestEvenAgainstReference) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t b = bits(rng);
    if ((b & 0x7f800000u) == 0x7f800000u) continue;  // NaN/inf below.
    const float x = BitsToFloat(b);
    ASSERT_EQ(F32ToBf16(x), ReferenceBf16(x)) << std::hex << b;
  }
  // Exact ties: halfway between 1.0 and the next bf16 rounds to even (1.0); the next tie up.
  EXPECT_EQ(F32ToBf16(BitsToFloat(0x3f808000u)), 0x3f80);
  EXPECT_EQ(F32ToBf16(BitsToFloat(0x3f818000u)), 0x3f82);
  EXPECT_EQ(F32ToBf16(BitsToFloat(0x3f808001u)), 0x3f81);
}

TEST(DTypeTest, Bf16SpecialValues) {
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload lives only in the low bits must stay NaN.
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(BitsToFloat(0x7f800001u)))));
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);  // Rounds up to inf.
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
}

TEST(DTypeTest, Bf16RoundTripIsExactForAllBf16Values) {
  for (uint32_t v = 0; v < 65536; ++v) {
    const float f = Bf16ToF32(static_cast<uint16_t>(v));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToBf16(f), v);
  }
}

TEST(DTypeTest, F16RoundTripIsExactForAllF16Values) {
  for (uint32_t v = 0; v < 65536; ++v) {
    const float f = F16ToF32(static_cast<uint16_t>(v));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
      continue;
    }
    ASSERT_EQ(F32ToF16(f), v) << v;
  }
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // Smallest subnormal.
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
}

TEST(DTypeTest, F16RoundingMatchesFormula) {
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);                   // Below the halfway point to inf.
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);                   // Halfway: ties to even = inf.
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);      // Half the smallest: even = 0.
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);      // Above half: rounds up.
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);      // 1.5 ulp: tie to even (2).
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // Tie: stays at even 1.0.
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // Tie: goes up to even.
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
}

__attribute__((target("f16c"))) uint16_t HardwareF16(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}

TEST(DTypeTest, F16MatchesHardwareF16c) {
  if (!CpuHasF16c()) GTEST_SKIP() << "CPU has no F16C to compare against";
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    const float x = BitsToFloat(bits(rng));
    if (std::isnan(x)) continue;
    ASSERT_EQ(F32ToF16(x), HardwareF16(x)) << std::hex << FloatBits(x);
  }
  // Every f32 in the f16 subnormal and small-normal range (exponents 101..114).
  for (uint32_t b = 0x32800000u; b < 0x39000000u; b += 97) {
    ASSERT_EQ(F32ToF16(BitsToFloat(b)), HardwareF16(BitsToFloat(b))) << std::hex << b;
  }
}

TEST(DTypeTest, BulkConversionsAgreeWithScalar) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  std::vector<float> in(1003);
  for (float& v : in) v = normal(rng);
  std::vector<uint16_t> h(in.size()), b(in.size());
  std::vector<float> back(in.size());
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2}) {
    if (level == SimdLevel::kAvx2 && !CpuHasAvx2Fma()) continue;
    SetSimdLevelForTesting(level);
    ConvertF32ToF16(in, absl::MakeSpan(h));
    ConvertF32ToBf16(in, absl::MakeSpan(b));
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(h[i], F32ToF16(in[i]));
      ASSERT_EQ(b[i], F32ToBf16(in[i]));
    }
    ConvertF16ToF32(h, absl::MakeSpan(back));
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(FloatBits(back[i]), FloatBits(F16ToF32(h[i])));
    ConvertBf16ToF32(b, absl::MakeSpan(back));
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(FloatBits(back[i]), FloatBits(Bf16ToF32(b[i])));
  }
}

}  // namespace
}  // namespace lbcc
