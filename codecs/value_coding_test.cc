#include "codecs/value_coding.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/cpu.h"
#include "base/dtype.h"
#include "base/status_matchers.h"
#include "codecs/cpu_kernels.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;

// SparseLoCo's quantizer written out from value_coding.h's formula, independently of the
// implementation (plain loops, std::nearbyint in the default rounding mode).
struct Reference {
  float shift, scale;
  std::vector<float> lookup;
  std::vector<uint8_t> codes;
};

Reference ReferenceBinMean(const std::vector<float>& v, int bits, float range) {
  const int bins = 1 << bits;
  const int64_t n = static_cast<int64_t>(v.size());
  Reference r;
  double lanes[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) lanes[i % 4] += v[i];
  r.shift = static_cast<float>(((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) / n);
  std::vector<float> c(v.size());
  double sq[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) {
    c[i] = v[i] - r.shift;
    sq[i % 4] += static_cast<double>(c[i]) * c[i];
  }
  const float norm = static_cast<float>(std::sqrt((sq[0] + sq[1]) + (sq[2] + sq[3])));
  const float sigma = n > 1 ? norm / static_cast<float>(std::sqrt(static_cast<double>(n - 1))) : 0;
  float scale = range * sigma;
  scale = scale / static_cast<float>(bins);
  if (scale == 0 || std::isnan(scale) || std::isinf(scale)) scale = 1;
  r.scale = scale;
  std::vector<double> sums(bins, 0);
  std::vector<int64_t> counts(bins, 0);
  for (int64_t i = 0; i < n; ++i) {
    float t = c[i] / scale;
    t = t + static_cast<float>(bins / 2);
    float q = std::nearbyint(t);
    q = std::min(std::max(q, 0.0f), static_cast<float>(bins - 1));
    r.codes.push_back(static_cast<uint8_t>(q));
    sums[r.codes.back()] += c[i];
    ++counts[r.codes.back()];
  }
  for (int b = 0; b < bins; ++b) {
    r.lookup.push_back(counts[b] ? static_cast<float>(sums[b] / counts[b]) : 0.0f);
  }
  return r;
}

std::vector<float> Normals(int64_t n, uint32_t seed, float mean = 0, float sd = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

class SimdLevels : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (GetParam() == SimdLevel::kAvx2 && !CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2 on this CPU";
    SetSimdLevelForTesting(GetParam());
  }
  void TearDown() override { SetSimdLevelForTesting(SimdLevel::kScalar); }
};

TEST_P(SimdLevels, BinMeanEqualsTheFormula) {
  for (int bits : {2, 4, 8}) {
    for (int64_t n :
         {int64_t{2}, int64_t{3}, int64_t{7}, int64_t{64}, int64_t{1001}, int64_t{65536}}) {
      const std::vector<float> v = Normals(n, static_cast<uint32_t>(n * bits), 0.3f, 2.0f);
      std::vector<float> centered(v.size());
      std::vector<uint8_t> codes(v.size());
      const BinMeanResult got =
          BinMeanQuantize(v, bits, 6.0f, absl::MakeSpan(centered), absl::MakeSpan(codes));
      const Reference want = ReferenceBinMean(v, bits, 6.0f);
      ASSERT_EQ(FloatBits(got.shift), FloatBits(want.shift)) << bits << " " << n;
      ASSERT_EQ(FloatBits(got.scale), FloatBits(want.scale));
      ASSERT_EQ(codes, want.codes);
      for (int b = 0; b < (1 << bits); ++b) {
        ASSERT_EQ(FloatBits(got.lookup[b]), FloatBits(want.lookup[b])) << b;
      }
    }
  }
}

TEST_P(SimdLevels, CodesRoundHalfToEvenThenClamp) {
  // c / scale + 2 lands exactly on .5 for these (scale 1): -2.5+2=-0.5 -> -0 -> 0,
  // -1.5+2=0.5 -> 0, -0.5+2=1.5 -> 2, 0.5+2=2.5 -> 2, 1.5+2=3.5 -> 4 -> 3, and a few non-ties.
  const std::vector<float> c = {-2.5f, -1.5f, -0.5f, 0.5f,  1.5f,   -1.49f, 0.51f, -7.0f, 9.0f,
                                0.0f,  1.0f,  -1.0f, 0.49f, -0.51f, 2.5f,   -3.5f, 0.25f};
  std::vector<uint8_t> codes(c.size());
  ActiveKernels().binmean_codes(c.data(), static_cast<int64_t>(c.size()), 1.0f, 2.0f, 3.0f,
                                codes.data());
  EXPECT_THAT(codes, ::testing::ElementsAre(0, 0, 2, 2, 3, 1, 3, 0, 3, 2, 3, 1, 2, 1, 3, 0, 2));
}

TEST_P(SimdLevels, EmptyBinsAreZeroAndDegenerateScaleIsOne) {
  std::vector<float> centered(8);
  std::vector<uint8_t> codes(8);
  // All equal: sigma 0, scale falls back to 1, every value in bin 2 with lookup 0.
  const std::vector<float> same(8, 3.25f);
  BinMeanResult r = BinMeanQuantize(same, 2, 6.0f, absl::MakeSpan(centered), absl::MakeSpan(codes));
  EXPECT_EQ(r.shift, 3.25f);
  EXPECT_EQ(r.scale, 1.0f);
  EXPECT_THAT(codes, ::testing::Each(2));
  EXPECT_THAT(std::vector<float>(r.lookup.begin(), r.lookup.begin() + 4),
              ::testing::ElementsAre(0.0f, 0.0f, 0.0f, 0.0f));
  // Two clusters: sigma = sqrt(800 / 7), scale = 6 sigma / 4 = 16.04, so c / scale + 2 is
  // 1.38 or 2.62: bins 1 and 3 hold the values, bins 0 and 2 are empty and their lookup is 0.
  const std::vector<float> split = {-10, -10, -10, -10, 10, 10, 10, 10};
  r = BinMeanQuantize(split, 2, 6.0f, absl::MakeSpan(centered), absl::MakeSpan(codes));
  EXPECT_THAT(codes, ::testing::ElementsAre(1, 1, 1, 1, 3, 3, 3, 3));
  EXPECT_THAT(std::vector<float>(r.lookup.begin(), r.lookup.begin() + 4),
              ::testing::ElementsAre(0.0f, -10.0f, 0.0f, 10.0f));
  // One value: sigma 0 (n - 1 = 0), scale 1.
  r = BinMeanQuantize(std::vector<float>{5.0f}, 2, 6.0f, absl::MakeSpan(centered),
                      absl::MakeSpan(codes));
  EXPECT_EQ(r.scale, 1.0f);
  EXPECT_EQ(r.lookup[2] + r.shift, 5.0f);
}

INSTANTIATE_TEST_SUITE_P(Levels, SimdLevels,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kAvx2),
                         [](const auto& info) { return std::string(SimdLevelName(info.param)); });

TEST(RoundHalfEvenTest, MatchesNearbyInt) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-300.0f, 300.0f);
  for (int i = 0; i < 100000; ++i) {
    float x = dist(rng);
    if (i % 3 == 0) x = std::floor(x) + 0.5f;  // ties
    ASSERT_EQ(RoundHalfEvenF(x), std::nearbyint(x)) << x;
  }
  for (float x : {-0.5f, 0.5f, 1.5f, 2.5f, -2.5f, 8388607.5f, 1e20f, -1e-30f, 0.49999997f}) {
    EXPECT_EQ(RoundHalfEvenF(x), std::nearbyint(x)) << x;
  }
}

const std::vector<ValueCoding>& AllCodings() {
  static const auto* all = new std::vector<ValueCoding>{
      ValueCoding::kF32,      ValueCoding::kBf16,     ValueCoding::kF16,     ValueCoding::kBinMean2,
      ValueCoding::kBinMean4, ValueCoding::kBinMean8, ValueCoding::kAbsmax8, ValueCoding::kAbsmax4};
  return *all;
}

TEST(ValueCodingTest, DecoderReproducesTheEncodersReconstruction) {
  for (ValueCoding coding : AllCodings()) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{64}, int64_t{1000}}) {
      const std::vector<float> original = Normals(n, 17, 0.1f, 3.0f);
      std::vector<float> values = original;
      const ValueEncodeOptions options{6.0f, 48};
      std::vector<uint8_t> params(ValueParamBytes(coding));
      std::vector<uint8_t> section(ValueSectionBytes(coding, n, options.block));
      std::vector<float> centered(n);
      std::vector<uint8_t> codes(n);
      EncodeValues(coding, options, absl::MakeSpan(values), absl::MakeSpan(params),
                   absl::MakeSpan(section), absl::MakeSpan(centered), absl::MakeSpan(codes));
      ValueDecoder decoder;
      ASSERT_THAT(decoder.Init(coding, params, section, n), IsOk()) << ValueCodingName(coding);
      std::vector<float> decoded(n);
      if (n > 0) decoder.Decode(0, n, decoded.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(FloatBits(decoded[i]), FloatBits(values[i])) << ValueCodingName(coding) << i;
      }
      // Decoding a sub-range gives the same values.
      if (n >= 5) {
        std::vector<float> part(3);
        decoder.Decode(2, 3, part.data());
        EXPECT_EQ(part[0], values[2]);
        EXPECT_EQ(part[2], values[4]);
      }
      // Sanity of the reconstruction error per coding.
      for (int64_t i = 0; i < n; ++i) {
        const float err = std::fabs(values[i] - original[i]);
        switch (coding) {
          case ValueCoding::kF32:
            ASSERT_EQ(err, 0.0f);
            break;
          case ValueCoding::kBf16:
            ASSERT_LE(err, std::fabs(original[i]) * (1.0f / 256));
            break;
          case ValueCoding::kF16:
            ASSERT_LE(err, std::fabs(original[i]) * (1.0f / 2048) + 1e-7f);
            break;
          default:
            break;
        }
      }
    }
  }
}

TEST(ValueCodingTest, AbsmaxEqualsTheFormula) {
  const std::vector<float> original = Normals(100, 23);
  for (ValueCoding coding : {ValueCoding::kAbsmax8, ValueCoding::kAbsmax4}) {
    const float qmax = coding == ValueCoding::kAbsmax8 ? 127.0f : 7.0f;
    std::vector<float> values = original;
    const ValueEncodeOptions options{6.0f, 32};
    std::vector<uint8_t> params(ValueParamBytes(coding));
    std::vector<uint8_t> section(ValueSectionBytes(coding, 100, 32));
    EXPECT_EQ(section.size(), 4 * 4 + (coding == ValueCoding::kAbsmax8 ? 100u : 50u));
    std::vector<float> centered(100);
    std::vector<uint8_t> codes(100);
    EncodeValues(coding, options, absl::MakeSpan(values), absl::MakeSpan(params),
                 absl::MakeSpan(section), absl::MakeSpan(centered), absl::MakeSpan(codes));
    for (int64_t b = 0; b < 4; ++b) {
      float absmax = 0;
      for (int64_t i = 32 * b; i < std::min<int64_t>(100, 32 * b + 32); ++i) {
        absmax = std::max(absmax, std::fabs(original[i]));
      }
      const float scale = absmax / qmax;
      for (int64_t i = 32 * b; i < std::min<int64_t>(100, 32 * b + 32); ++i) {
        const float q = std::min(std::max(std::nearbyint(original[i] / scale), -qmax), qmax);
        ASSERT_EQ(values[i], q * scale) << i;
      }
    }
  }
}

TEST(ValueCodingTest, HalfFormatsSaturateInsteadOfOverflowing) {
  for (ValueCoding coding : {ValueCoding::kBf16, ValueCoding::kF16}) {
    std::vector<float> values = {3.0e38f, -3.4028235e38f, 1e5f, -70000.0f, 1.0f};
    std::vector<uint8_t> params;
    std::vector<uint8_t> section(ValueSectionBytes(coding, 5, 64));
    std::vector<float> centered(5);
    std::vector<uint8_t> codes(5);
    EncodeValues(coding, {}, absl::MakeSpan(values), absl::MakeSpan(params),
                 absl::MakeSpan(section), absl::MakeSpan(centered), absl::MakeSpan(codes));
    for (float v : values) EXPECT_TRUE(std::isfinite(v)) << v;
    if (coding == ValueCoding::kF16) {
      EXPECT_EQ(values[2], 65504.0f);
      EXPECT_EQ(values[3], -65504.0f);
    }
    ValueDecoder decoder;
    EXPECT_THAT(decoder.Init(coding, params, section, 5), IsOk());
  }
}

TEST(ValueCodingTest, DecoderRejectsCorruptSections) {
  ValueDecoder decoder;
  const float inf = std::numeric_limits<float>::infinity();
  auto f32 = [](std::vector<float> v) {
    std::vector<uint8_t> bytes(4 * v.size());
    std::memcpy(bytes.data(), v.data(), bytes.size());
    return bytes;
  };
  // Length mismatches.
  EXPECT_THAT(decoder.Init(ValueCoding::kF32, {}, f32({1, 2}), 3),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoder.Init(ValueCoding::kBinMean2, f32({0, 1, 2, 3}), std::vector<uint8_t>(1), 4),
              StatusIs(absl::StatusCode::kDataLoss));
  // Non-finite raw values, shift, lookup, scales.
  EXPECT_THAT(decoder.Init(ValueCoding::kF32, {}, f32({1, NAN}), 2),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoder.Init(ValueCoding::kBf16, {}, std::vector<uint8_t>{0x80, 0x7F}, 1),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoder.Init(ValueCoding::kF16, {}, std::vector<uint8_t>{0x00, 0x7C}, 1),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(
      decoder.Init(ValueCoding::kBinMean2, f32({inf, 0, 0, 0, 0}), std::vector<uint8_t>(1), 4),
      StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(
      decoder.Init(ValueCoding::kBinMean2, f32({0, 0, NAN, 0, 0}), std::vector<uint8_t>(1), 4),
      StatusIs(absl::StatusCode::kDataLoss));
  // lookup + shift overflows.
  EXPECT_THAT(decoder.Init(ValueCoding::kBinMean2, f32({3e38f, 3e38f, 0, 0, 0}),
                           std::vector<uint8_t>(1), 4),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(
      decoder.Init(ValueCoding::kBinMean2, f32({0, 1, 2, 3, 4}), std::vector<uint8_t>(1), 4),
      IsOk());
  // Padding after 3 two-bit codes must be zero.
  EXPECT_THAT(
      decoder.Init(ValueCoding::kBinMean2, f32({0, 1, 2, 3, 4}), std::vector<uint8_t>{0xC0}, 3),
      StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("padding")));
  std::vector<uint8_t> block32 = {32, 0, 0, 0};
  std::vector<uint8_t> section = f32({-1.0f});
  section.push_back(0);
  EXPECT_THAT(decoder.Init(ValueCoding::kAbsmax8, block32, section, 1),
              StatusIs(absl::StatusCode::kDataLoss));
  section = f32({inf});
  section.push_back(0);
  EXPECT_THAT(decoder.Init(ValueCoding::kAbsmax8, block32, section, 1),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(decoder.Init(ValueCoding::kAbsmax8, std::vector<uint8_t>{0, 0, 0, 0}, section, 1),
              StatusIs(absl::StatusCode::kDataLoss));
  // Codes outside [-qmax, qmax] (never written by the encoder) clamp instead of growing.
  section = f32({2.0f});
  section.push_back(0x80);  // -128
  ASSERT_THAT(decoder.Init(ValueCoding::kAbsmax8, block32, section, 1), IsOk());
  float v = 0;
  decoder.Decode(0, 1, &v);
  EXPECT_EQ(v, -254.0f);
}

TEST(ValueCodingTest, NamesParse) {
  for (ValueCoding coding : AllCodings()) {
    EXPECT_THAT(ParseValueCoding(ValueCodingName(coding)), ::lbcc::testing::IsOkAndHolds(coding));
  }
  EXPECT_THAT(ParseValueCoding("2bit"), ::lbcc::testing::IsOkAndHolds(ValueCoding::kBinMean2));
  EXPECT_THAT(ParseValueCoding("3bit"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lbcc::codecs
