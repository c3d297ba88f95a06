// The bin-mean steps of binmean_kernels.h with the launchers' grid (the emulated backend runs
// them block after block) against codecs::BinMeanQuantize, bit for bit: up to the largest grid
// (256 partials, so the tree combines and the per-bin lookup blocks see full and ragged
// inputs), every bin count, fast paths and fallbacks.
#include "kernels/binmean_kernels.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "codecs/value_coding.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace lbcc::kernels {
namespace {

// Runs EncodeBinMean on the emulated backend and compares shift, scale, codes, lookup and the
// reconstructions with the CPU codec. Returns the fallbacks taken.
uint32_t ExpectSameAsCpu(const std::vector<float>& v, int bits) {
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<float> cpu_centered(v.size());
  std::vector<uint8_t> cpu_codes(v.size());
  const codecs::BinMeanResult cpu = codecs::BinMeanQuantize(
      v, bits, 6.0f, absl::MakeSpan(cpu_centered), absl::MakeSpan(cpu_codes));

  std::vector<float> values = v, centered(v.size());
  std::vector<uint8_t> codes(v.size()), section(static_cast<size_t>((n * bits + 7) / 8));
  std::vector<SumStats> partials(kMaxPartials);
  std::vector<BinStats> bin_partials(kMaxPartials * 256);
  EncodeSummary summary{};
  summary.bad_chunk = INT32_MAX;
  BinMeanArgs a;
  a.n = n;
  a.bits = bits;
  a.range_sigmas = 6.0f;
  a.values = values.data();
  a.centered = centered.data();
  a.codes = codes.data();
  a.section = section.data();
  a.summary = &summary;
  a.partials = partials.data();
  a.bin_partials = bin_partials.data();
  EXPECT_TRUE(EmulatedBackend().EncodeBinMean(a, nullptr).ok());

  EXPECT_EQ(hd::Bits(summary.shift), hd::Bits(cpu.shift));
  EXPECT_EQ(hd::Bits(summary.scale), hd::Bits(cpu.scale));
  EXPECT_EQ(codes, cpu_codes);
  for (int b = 0; b < (1 << bits); ++b) {
    EXPECT_EQ(hd::Bits(summary.lookup[b]), hd::Bits(cpu.lookup[b])) << "bin " << b;
  }
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    wrong += hd::Bits(values[i]) != hd::Bits(hd::Add(cpu.lookup[cpu_codes[i]], cpu.shift));
  }
  EXPECT_EQ(wrong, 0) << "reconstructions differ";
  return summary.fallbacks;
}

TEST(BinMeanKernelsTest, EveryGridSizeMatchesTheCpu) {
  std::mt19937 rng(5);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  // 1 partial, 2 ragged ones, 128 (4096 x 4096 at top_k 64), 200, and the largest grid (256,
  // with more than 2048 values per block).
  for (int64_t n : {1, 5, 2049, 4097, 262144, 409600, 600001}) {
    // What top-k selects: the tails beyond about two sigmas (sums provably exact).
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      do {
        x = 1e-3f * gauss(rng);
      } while (std::fabs(x) < 2e-3f);
    }
    for (int bits : {2, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " bits " << bits << " parts "
                                        << BinMeanParts(n));
      const uint32_t fallbacks = ExpectSameAsCpu(v, bits);
      ASSERT_FALSE(HasFatalFailure());
      EXPECT_EQ(fallbacks & (kFallbackShift | kFallbackBins), 0u);
    }
  }
}

// Values over a hundred binades: the sums are not provably exact, the kernels refold them in
// the CPU's order.
TEST(BinMeanKernelsTest, WideRangesTakeTheFallbacksAndMatchTheCpu) {
  std::mt19937 rng(6);
  std::uniform_int_distribution<int> exponent(-60, 60);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int64_t n : {6000, 300000}) {
    // Pairs +x, -x keep the shift near 0, so the centred values keep their wide range too.
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i += 2) {
      v[i] = std::ldexp(mantissa(rng), exponent(rng));
      v[i + 1] = -v[i];
    }
    std::shuffle(v.begin(), v.end(), rng);
    for (int bits : {2, 8}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " bits " << bits);
      const uint32_t fallbacks = ExpectSameAsCpu(v, bits);
      ASSERT_FALSE(HasFatalFailure());
      EXPECT_NE(fallbacks & kFallbackShift, 0u);
      EXPECT_NE(fallbacks & kFallbackBins, 0u);
    }
  }
}

}  // namespace
}  // namespace lbcc::kernels
