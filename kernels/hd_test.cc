// The kernels' shared arithmetic (hd.h, binmean_stats.h) against the CPU codecs' definitions.
#include "kernels/hd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "codecs/counter_rng.h"
#include "codecs/cpu_kernels.h"
#include "codecs/value_coding.h"
#include "gtest/gtest.h"
#include "kernels/binmean_stats.h"

namespace lbcc::kernels {
namespace {

uint32_t Bits(float x) { return hd::Bits(x); }

std::vector<uint32_t> InterestingBits() {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u,
                                0x3f800000u, 0xbf800000u, 0x477fe000u, 0x477ff000u, 0x477fefffu,
                                0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0x33000000u, 0x33000001u, 0x387fffffu, 0x38800000u,
                                0x7f7f8000u, 0x7f7f7fffu};
  std::mt19937 rng(7);
  for (int i = 0; i < 1 << 20; ++i) bits.push_back(rng());
  return bits;
}

TEST(HdTest, HalfConversionsMatchBase) {
  for (uint32_t b : InterestingBits()) {
    const float x = BitsToFloat(b);
    ASSERT_EQ(hd::F32ToBf16(x), F32ToBf16(x)) << std::hex << b;
    ASSERT_EQ(hd::F32ToF16(x), F32ToF16(x)) << std::hex << b;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t c = static_cast<uint16_t>(h);
    ASSERT_EQ(Bits(hd::F16ToF32(c)), Bits(F16ToF32(c))) << h;
    ASSERT_EQ(Bits(hd::Bf16ToF32(c)), Bits(Bf16ToF32(c))) << h;
  }
}

TEST(HdTest, RoundingAndRandomMatchCodecs) {
  for (uint32_t b : InterestingBits()) {
    const float x = BitsToFloat(b);
    if (std::isnan(x)) continue;
    ASSERT_EQ(Bits(hd::RoundHalfEvenF(x)), Bits(codecs::RoundHalfEvenF(x))) << std::hex << b;
  }
  for (float x : {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 8388607.5f, 16777216.0f}) {
    EXPECT_EQ(Bits(hd::RoundHalfEvenF(x)), Bits(codecs::RoundHalfEvenF(x))) << x;
  }
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
    for (uint64_t n = 0; n < 100000; n += 7) {
      const uint64_t i = n * 0x9E3779B97F4A7C15ull;
      ASSERT_EQ(hd::CounterRandom32(seed, i), codecs::CounterRandom32(seed, i));
      ASSERT_EQ(Bits(hd::CounterUniform(seed, i)), Bits(codecs::CounterUniform(seed, i)));
    }
  }
}

// The bin-mean statistics through the kernels' functions, one reduction order (sequential) or
// another (pairwise), fast path first: what EncodeBinMean computes.
struct Quantized {
  float shift = 0, scale = 0;
  std::vector<float> lookup;
  std::vector<uint8_t> codes;
  uint32_t fallbacks = 0;
};

SumStats PairwiseStats(const std::vector<float>& x, size_t lo, size_t hi) {
  if (hi - lo == 1) {
    SumStats s;
    AddTerm(s, x[lo]);
    return s;
  }
  const size_t mid = lo + (hi - lo) / 2;
  return Combine(PairwiseStats(x, lo, mid), PairwiseStats(x, mid, hi));
}

Quantized KernelQuantize(const std::vector<float>& v, int bits, bool pairwise) {
  const int64_t n = static_cast<int64_t>(v.size());
  const int bins = 1 << bits;
  Quantized q;
  const SumStats s = PairwiseStats(v, 0, v.size());
  if (SumsAreExact(s)) {
    q.shift = ShiftFromSum(s.sum, n);
  } else {
    q.fallbacks |= kFallbackShift;
    q.shift = ShiftFromSum(CombineLanes(LaneFold(v.data(), n, 0, false), LaneFold(v.data(), n, 1, false),
                                        LaneFold(v.data(), n, 2, false), LaneFold(v.data(), n, 3, false)),
                           n);
  }
  std::vector<float> c(v.size());
  for (size_t i = 0; i < v.size(); ++i) c[i] = hd::Sub(v[i], q.shift);
  SumStats cs;
  if (pairwise) {
    cs = PairwiseStats(c, 0, c.size());
  } else {
    for (float x : c) AddTerm(cs, x);
  }
  const int64_t depth = pairwise ? 64 : n;
  float norm;
  if (!NormFromSquares(cs.sq_sum, n, depth, &norm)) {
    q.fallbacks |= kFallbackNorm;
    norm = NormFromLanes(LaneFold(c.data(), n, 0, true), LaneFold(c.data(), n, 1, true),
                         LaneFold(c.data(), n, 2, true), LaneFold(c.data(), n, 3, true));
  }
  q.scale = BinMeanScale(norm, n, 6.0f, bins);
  q.codes.resize(v.size());
  std::vector<BinStats> bin(bins);
  for (size_t i = 0; i < v.size(); ++i) {
    q.codes[i] = BinMeanCode(c[i], q.scale, bins);
    AddToBin(bin[q.codes[i]], c[i]);
  }
  q.lookup.resize(bins);
  for (int b = 0; b < bins; ++b) {
    double sum = bin[b].sum;
    if (!BinSumIsExact(bin[b])) {
      q.fallbacks |= kFallbackBins;
      sum = BinFold(c.data(), q.codes.data(), n, b);
    }
    q.lookup[b] = BinLookup(sum, bin[b].count);
  }
  return q;
}

void ExpectSameAsCpu(const std::vector<float>& v, int bits, bool pairwise, uint32_t* fallbacks) {
  std::vector<float> centered(v.size());
  std::vector<uint8_t> codes(v.size());
  const codecs::BinMeanResult cpu =
      codecs::BinMeanQuantize(v, bits, 6.0f, absl::MakeSpan(centered), absl::MakeSpan(codes));
  const Quantized q = KernelQuantize(v, bits, pairwise);
  ASSERT_EQ(Bits(q.shift), Bits(cpu.shift));
  ASSERT_EQ(Bits(q.scale), Bits(cpu.scale));
  ASSERT_EQ(q.codes, codes);
  for (int b = 0; b < (1 << bits); ++b) ASSERT_EQ(Bits(q.lookup[b]), Bits(cpu.lookup[b])) << b;
  *fallbacks |= q.fallbacks;
}

// What top-k selects: per chunk of 64 values the tail beyond about two sigmas, chunk scales
// spread over a few binades.
TEST(BinMeanStatsTest, TopKLikeValuesTakeTheFastPathAndMatchTheCpu) {
  std::mt19937 rng(1);
  uint32_t fallbacks = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 5000);
    const float sigma = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 30);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(n);
    float chunk_scale = sigma;
    for (int i = 0; i < n; ++i) {
      if (i % 64 == 0) chunk_scale = std::ldexp(sigma, static_cast<int>(rng() % 5));
      const float tail = 2.0f + std::fabs(normal(rng));
      v[i] = (rng() & 1 ? tail : -tail) * chunk_scale;
    }
    for (int bits : {2, 4, 8}) {
      ExpectSameAsCpu(v, bits, trial % 2 == 0, &fallbacks);
      ASSERT_FALSE(HasFatalFailure()) << "trial " << trial << " bits " << bits;
    }
  }
  EXPECT_EQ(fallbacks & (kFallbackShift | kFallbackBins), 0u);
}

TEST(BinMeanStatsTest, WideRangesFallBackAndStillMatchTheCpu) {
  std::mt19937 rng(2);
  uint32_t fallbacks = 0;
  for (int trial = 0; trial < 50; ++trial) {
    // Pairs +x, -x keep the shift near 0, so the centred values keep their wide range too.
    const int n = 2 * (1 + static_cast<int>(rng() % 1500));
    std::vector<float> v(n);
    std::uniform_int_distribution<int> exponent(-60, 60);
    std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
    for (int i = 0; i < n; i += 2) {
      v[i] = std::ldexp(mantissa(rng), exponent(rng));
      v[i + 1] = -v[i];
    }
    std::shuffle(v.begin(), v.end(), rng);
    for (int bits : {2, 8}) {
      ExpectSameAsCpu(v, bits, true, &fallbacks);
      ASSERT_FALSE(HasFatalFailure()) << "trial " << trial;
    }
  }
  EXPECT_NE(fallbacks & kFallbackShift, 0u);
  EXPECT_NE(fallbacks & kFallbackBins, 0u);
}

TEST(BinMeanStatsTest, EdgeCases) {
  uint32_t fallbacks = 0;
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<std::vector<float>> cases = {
      {1.0f},
      {0.0f, -0.0f, 0.0f},
      {3.0f, 3.0f, 3.0f, 3.0f, 3.0f},
      {tiny, -tiny, 2 * tiny},
      {1e38f, -1e38f, 3e38f, 1e-38f},
      {1.0f, 1.0f + 0x1p-23f, 1.0f - 0x1p-24f, 2.0f},
  };
  for (const auto& v : cases) {
    for (int bits : {2, 4, 8}) ExpectSameAsCpu(v, bits, true, &fallbacks);
  }
}

// The norm's interval check never claims a float the CPU's fold does not produce, and rarely
// gives up.
TEST(BinMeanStatsTest, NormIntervalIsSoundAndUsuallyDecides) {
  std::mt19937 rng(3);
  int undecided = 0, trials = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 20000);
    std::normal_distribution<float> normal(0.0f, std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10));
    std::vector<float> c(n);
    for (float& x : c) x = normal(rng);
    const float cpu = NormFromLanes(LaneFold(c.data(), n, 0, true), LaneFold(c.data(), n, 1, true),
                                    LaneFold(c.data(), n, 2, true), LaneFold(c.data(), n, 3, true));
    SumStats s = PairwiseStats(c, 0, c.size());
    float norm;
    ++trials;
    if (NormFromSquares(s.sq_sum, n, 64, &norm)) {
      ASSERT_EQ(Bits(norm), Bits(cpu)) << "trial " << trial;
    } else {
      ++undecided;
    }
  }
  EXPECT_LT(undecided, trials / 50);
  // Sums of squares that sit on a rounding boundary of sqrt -> fp32 must be left undecided:
  // norm^2 halfway between two floats' squares.
  int boundary_undecided = 0;
  for (int i = 0; i < 100; ++i) {
    const float f = 1.0f + static_cast<float>(i) * 0x1p-10f;
    const double mid = (static_cast<double>(f) + static_cast<double>(std::nextafter(f, 2.0f))) / 2;
    float norm;
    if (!NormFromSquares(mid * mid, 1000, 64, &norm)) ++boundary_undecided;
  }
  EXPECT_EQ(boundary_undecided, 100);
}

}  // namespace
}  // namespace lbcc::kernels
