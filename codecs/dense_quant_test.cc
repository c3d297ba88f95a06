#include "codecs/dense_quant.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/cpu.h"
#include "base/dtype.h"
#include "base/status_matchers.h"
#include "codecs/counter_rng.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;
using Bytes = std::vector<uint8_t>;

std::vector<float> Normals(int64_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

Bytes Encode(const DenseQuantOptions& options, std::vector<float>& x) {
  auto codec = DenseQuantCodec::Create(options);
  EXPECT_THAT(codec, IsOk());
  const Shape shape = {static_cast<int64_t>(x.size())};
  Bytes out(*(*codec)->MaxEncodedBytes(shape));
  absl::StatusOr<size_t> size =
      (*codec)->Encode(*TensorView::Host(x.data(), shape), nullptr, absl::MakeSpan(out));
  EXPECT_THAT(size, IsOk());
  EXPECT_EQ(size.ok() ? *size : 0, out.size());  // the maximum is exact for dense payloads
  return out;
}

std::vector<float> Decode(const std::vector<Bytes>& payloads, DecodeOptions options,
                          std::vector<float> out) {
  std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.end());
  EXPECT_THAT(DecodeAccumulate(spans, options,
                               *TensorView::Host(out.data(), {static_cast<int64_t>(out.size())})),
              IsOk());
  return out;
}

void Reseal(Bytes& bytes) {
  const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
  std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
}

// x_hat per the formula in dense_quant.h.
std::vector<float> ReferenceInt(const std::vector<float>& x, int64_t block, float qmax,
                                bool stochastic, uint64_t seed) {
  std::vector<float> out(x.size());
  for (size_t begin = 0; begin < x.size(); begin += block) {
    const size_t end = std::min(x.size(), begin + block);
    float absmax = 0;
    for (size_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(x[i]));
    const float scale = absmax / qmax;
    for (size_t i = begin; i < end; ++i) {
      float q = 0;
      if (scale != 0) {
        const float t = x[i] / scale;
        q = stochastic ? std::floor(t + CounterUniform(seed, i)) : std::nearbyint(t);
        q = std::min(std::max(q, -qmax), qmax);
      }
      out[i] = static_cast<float>(static_cast<int>(q)) * scale;  // codes are integers: no -0
    }
  }
  return out;
}

class DenseSimdTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (GetParam() == SimdLevel::kAvx2 && !CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2 on this CPU";
    SetSimdLevelForTesting(GetParam());
  }
  void TearDown() override { SetSimdLevelForTesting(SimdLevel::kScalar); }
};

TEST_P(DenseSimdTest, IntFormatsEqualTheFormula) {
  for (DenseFormat format : {DenseFormat::kInt8, DenseFormat::kInt4}) {
    const float qmax = format == DenseFormat::kInt8 ? 127.0f : 7.0f;
    for (int64_t block : {16, 64, 256, 4096}) {
      for (int64_t n : {0, 1, 15, 33, 1000, 10007}) {
        for (bool stochastic : {false, true}) {
          std::vector<float> x = Normals(n, static_cast<uint32_t>(n + block), 3.0f);
          if (n > 40) {
            std::fill(x.begin() + 16, x.begin() + 32, 0.0f);  // an all-zero block when block 16
            x[35] = 2.5f * 3.0f;  // ties at .5 do occur with real scales; force a few values
          }
          DenseQuantOptions options{format, block, stochastic, 42};
          const Bytes payload = Encode(options, x);
          const std::vector<float> got = Decode({payload}, {}, std::vector<float>(n, 9.0f));
          const std::vector<float> want = ReferenceInt(x, block, qmax, stochastic, 42);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(FloatBits(got[i]), FloatBits(want[i]))
                << DenseFormatName(format) << " block " << block << " n " << n << " at " << i;
          }
        }
      }
    }
  }
}

TEST_P(DenseSimdTest, HalfFormatsRoundToNearestEven) {
  std::vector<float> x = Normals(1001, 3, 100.0f);
  x[0] = 65519.0f;  // rounds down to 65504 in fp16
  for (DenseFormat format : {DenseFormat::kF16, DenseFormat::kBf16}) {
    const Bytes payload = Encode({format, 0, false, 0}, x);
    const std::vector<float> got = Decode({payload}, {}, std::vector<float>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const float want =
          format == DenseFormat::kF16 ? F16ToF32(F32ToF16(x[i])) : Bf16ToF32(F32ToBf16(x[i]));
      ASSERT_EQ(FloatBits(got[i]), FloatBits(want)) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, DenseSimdTest,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kAvx2),
                         [](const auto& info) { return std::string(SimdLevelName(info.param)); });

TEST(DenseQuantTest, Avx2AndScalarPayloadsAreIdentical) {
  if (!CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::vector<float> x = Normals(100003, 8, 0.01f);
  for (int64_t block : {16, 48, 256, 4096}) {
    SetSimdLevelForTesting(SimdLevel::kScalar);
    const Bytes a = Encode({DenseFormat::kInt8, block, false, 0}, x);
    SetSimdLevelForTesting(SimdLevel::kAvx2);
    const Bytes b = Encode({DenseFormat::kInt8, block, false, 0}, x);
    SetSimdLevelForTesting(SimdLevel::kScalar);
    EXPECT_EQ(a, b) << block;
  }
}

TEST(DenseQuantTest, StochasticRoundingIsReproducibleAndUnbiased) {
  const std::vector<float> x0 = Normals(256, 4);
  for (DenseFormat format :
       {DenseFormat::kInt8, DenseFormat::kInt4, DenseFormat::kF16, DenseFormat::kBf16}) {
    std::vector<float> x = x0;
    if (format == DenseFormat::kF16) {
      for (float& v : x) v *= 1e-3f;  // a range where fp16 rounding error is visible
    }
    const DenseQuantOptions options{format, 64, true, 7};
    EXPECT_EQ(Encode(options, x), Encode(options, x));
    EXPECT_NE(Encode(options, x), Encode({format, 64, true, 8}, x));
    // Averaged over seeds, the decoded value approaches x (nearest rounding would not).
    const int kSeeds = 400;
    std::vector<double> mean(x.size(), 0.0);
    for (int seed = 0; seed < kSeeds; ++seed) {
      const Bytes p = Encode({format, 64, true, static_cast<uint64_t>(seed)}, x);
      const std::vector<float> got = Decode({p}, {}, std::vector<float>(x.size()));
      for (size_t i = 0; i < x.size(); ++i) mean[i] += got[i] / kSeeds;
    }
    const std::vector<float> nearest =
        Decode({Encode({format, 64, false, 0}, x)}, {}, std::vector<float>(x.size()));
    double sr_error = 0, nearest_error = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      sr_error += std::fabs(mean[i] - x[i]);
      nearest_error += std::fabs(nearest[i] - x[i]);
    }
    EXPECT_LT(sr_error, 0.25 * nearest_error) << DenseFormatName(format);
  }
}

TEST(DenseQuantTest, AggregationEqualsBruteForce) {
  const int64_t n = 5000;
  std::vector<std::vector<float>> inputs = {Normals(n, 1), Normals(n, 2), Normals(n, 3)};
  std::vector<Bytes> payloads = {Encode({DenseFormat::kInt8, 256, false, 0}, inputs[0]),
                                 Encode({DenseFormat::kInt4, 64, false, 0}, inputs[1]),
                                 Encode({DenseFormat::kBf16, 0, false, 0}, inputs[2])};
  std::vector<std::vector<float>> decoded;
  for (const Bytes& p : payloads) decoded.push_back(Decode({p}, {}, std::vector<float>(n)));
  const std::vector<float> before = Normals(n, 9);
  for (Aggregation rule : {Aggregation::kSparseLoCoMean, Aggregation::kMean, Aggregation::kSum}) {
    for (bool accumulate : {false, true}) {
      const std::vector<float> got = Decode(payloads, {rule, accumulate}, before);
      for (int64_t i = 0; i < n; ++i) {
        float agg = (decoded[0][i] + decoded[1][i]) + decoded[2][i];
        if (rule != Aggregation::kSum) agg = agg / 3.0f;
        const float want = accumulate ? before[i] + agg : agg;
        ASSERT_EQ(FloatBits(got[i]), FloatBits(want)) << i;
      }
    }
  }
  // One payload accumulated: out += x_hat.
  const std::vector<float> once = Decode({payloads[0]}, {Aggregation::kMean, true}, before);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(once[i], before[i] + decoded[0][i]);
}

TEST(DenseQuantTest, NonFiniteAndOutOfRangeInputsAreInvalidArgument) {
  for (DenseFormat format :
       {DenseFormat::kInt8, DenseFormat::kInt4, DenseFormat::kF16, DenseFormat::kBf16}) {
    for (bool stochastic : {false, true}) {
      for (float bad :
           {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        std::vector<float> x = Normals(300, 1);
        x[257] = bad;
        auto codec = *DenseQuantCodec::Create({format, 64, stochastic, 1});
        Bytes out(*codec->MaxEncodedBytes({300}));
        EXPECT_THAT(codec->Encode(*TensorView::Host(x.data(), {300}), nullptr, absl::MakeSpan(out)),
                    StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("element 257")));
      }
    }
  }
  std::vector<float> big = {1.0f, 70000.0f};
  auto f16 = *DenseQuantCodec::Create({DenseFormat::kF16, 0, false, 0});
  Bytes out(*f16->MaxEncodedBytes({2}));
  EXPECT_THAT(f16->Encode(*TensorView::Host(big.data(), {2}), nullptr, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fp16")));
  EXPECT_THAT(DenseQuantCodec::Create({DenseFormat::kInt8, 100, false, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(DenseQuantCodec::Create({DenseFormat::kInt8, 8, false, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

class DenseRejectTest : public ::testing::Test {
 protected:
  void ExpectRejected(const std::vector<Bytes>& payloads, const std::string& message) {
    std::vector<absl::Span<const uint8_t>> spans(payloads.begin(), payloads.end());
    std::vector<float> out(100, 7.0f);
    EXPECT_THAT(DecodeAccumulate(spans, {}, *TensorView::Host(out.data(), {100})),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(message)));
    EXPECT_THAT(out, ::testing::Each(7.0f));
  }
  Bytes Make(DenseFormat format, int64_t n = 100) {
    std::vector<float> x = Normals(n, 5);
    return Encode({format, 32, false, 0}, x);
  }
  static constexpr size_t kParams = 24 + 8;  // rank-1 header
};

TEST_F(DenseRejectTest, CorruptPayloads) {
  Bytes p = Make(DenseFormat::kInt8);
  p[5] = 7;
  Reseal(p);
  ExpectRejected({p}, "unknown dense_quant version");
  p = Make(DenseFormat::kInt8);
  p[kParams] = 9;
  Reseal(p);
  ExpectRejected({p}, "unknown format");
  p = Make(DenseFormat::kInt8);
  p[kParams + 4] = 33;  // block 33
  Reseal(p);
  ExpectRejected({p}, "block");
  p = Make(DenseFormat::kInt8);
  const float negative = -1.0f;
  std::memcpy(p.data() + kParams + 8, &negative, 4);
  Reseal(p);
  ExpectRejected({p}, "scale 0");
  p = Make(DenseFormat::kInt8);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(p.data() + kParams + 12, &nan, 4);
  Reseal(p);
  ExpectRejected({p}, "scale 1");
  p = Make(DenseFormat::kF16);
  p[kParams + 8 + 2 * 10 + 1] = 0x7C;  // element 10 := inf
  p[kParams + 8 + 2 * 10] = 0x00;
  Reseal(p);
  ExpectRejected({p}, "element 10");
  p = Make(DenseFormat::kInt8);
  p[p.size() - 9] ^= 1;
  ExpectRejected({Make(DenseFormat::kInt8), p}, "payload 1");
  p = Make(DenseFormat::kInt8);
  ExpectRejected({Bytes(p.begin(), p.end() - 3)}, "truncated");
}

TEST_F(DenseRejectTest, Int4PaddingMustBeZero) {
  std::vector<float> x = Normals(99, 5);
  Bytes p = Encode({DenseFormat::kInt4, 32, false, 0}, x);
  p[p.size() - 9] |= 0x80;
  Reseal(p);
  std::vector<float> out(99, 7.0f);
  const absl::Span<const uint8_t> span(p);
  EXPECT_THAT(
      DecodeAccumulate(absl::MakeConstSpan(&span, 1), {}, *TensorView::Host(out.data(), {99})),
      StatusIs(absl::StatusCode::kDataLoss, HasSubstr("padding")));
  EXPECT_THAT(out, ::testing::Each(7.0f));
}

TEST(DenseQuantTest, InspectDescribesThePayload) {
  std::vector<float> x = Normals(4096, 1);
  const Bytes p = Encode({DenseFormat::kInt8, 256, false, 0}, x);
  LBCC_ASSERT_OK_AND_ASSIGN(PayloadSummary s, InspectPayload(p));
  EXPECT_EQ(s.codec, CodecId::kDenseQuant);
  EXPECT_EQ(s.selected, 4096);
  // int8 codes, a 32-bit scale per 256 elements, 48 bytes of envelope and params.
  EXPECT_DOUBLE_EQ(s.bits_per_param, 8 + 32.0 / 256 + 8.0 * 48 / 4096);
  EXPECT_THAT(s.details, HasSubstr("int8"));
}

}  // namespace
}  // namespace lbcc::codecs
