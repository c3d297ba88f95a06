#include "codecs/index_coding.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "base/cpu.h"
#include "base/status_matchers.h"
#include "codecs/bitstream.h"
#include "codecs/cpu_kernels.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;

// k distinct ascending positions per chunk, uniformly at random.
std::vector<uint16_t> RandomList(const IndexLayout& layout, std::mt19937& rng) {
  std::vector<uint16_t> out;
  std::vector<uint16_t> all(static_cast<size_t>(layout.chunk_len));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<uint16_t> pick(all.begin(), all.begin() + layout.k);
    std::sort(pick.begin(), pick.end());
    out.insert(out.end(), pick.begin(), pick.end());
  }
  return out;
}

// The adaptive length, written out from the format description.
uint64_t ReferenceAdaptiveBits(const std::vector<uint16_t>& list, const IndexLayout& layout, int b,
                               int p) {
  const int64_t size = int64_t{1} << b;
  uint64_t bits = 0;
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    for (int64_t start = 0; start < layout.chunk_len; start += size) {
      const int64_t s = std::min(size, layout.chunk_len - start);
      int64_t n = 0;
      for (int64_t j = 0; j < layout.k; ++j) {
        const int64_t pos = list[c * layout.k + j];
        n += pos >= start && pos < start + s;
      }
      bits += (n >> p) + 1 + p;
      bits += std::min<int64_t>(s, n * b);
    }
  }
  return bits;
}

const std::vector<IndexLayout>& Layouts() {
  static const auto* layouts = new std::vector<IndexLayout>{
      {16, 64, 4096}, {7, 128, 4096}, {5, 1, 4096}, {3, 4096, 4096}, {9, 58, 3721},
      {11, 3, 61},    {4, 61, 61},    {6, 1, 1},    {2, 2000, 4096}, {3, 7, 100},
      {1, 2, 128},    {5, 33, 129},   {0, 0, 4096},
  };
  return *layouts;
}

TEST(Packed12Test, RoundTripAndSize) {
  std::mt19937 rng(1);
  for (const IndexLayout& layout : Layouts()) {
    const std::vector<uint16_t> list = RandomList(layout, rng);
    std::vector<uint8_t> bytes(Packed12Bytes(layout.count()));
    EXPECT_EQ(bytes.size(), static_cast<size_t>((12 * layout.count() + 7) / 8));
    EncodePacked12(list, absl::MakeSpan(bytes));
    std::vector<uint16_t> decoded(list.size());
    ASSERT_THAT(DecodePacked12(bytes, layout, absl::MakeSpan(decoded)), IsOk());
    EXPECT_EQ(decoded, list);
  }
}

// The scalar and AVX2 unpack and run checks agree on random bytes and on valid lists with one
// entry broken (repeated, descending, out of range), at run boundaries too.
TEST(Packed12Test, KernelsAgreeAcrossSimdLevels) {
  if (!CpuHasAvx2Fma()) GTEST_SKIP() << "no AVX2 on this CPU";
  const CpuKernels& scalar = KernelsFor(SimdLevel::kScalar);
  const CpuKernels& avx2 = KernelsFor(SimdLevel::kAvx2);
  std::mt19937 rng(7);
  for (int64_t count : {0, 1, 2, 15, 16, 17, 21, 22, 31, 32, 33, 63, 64, 65, 1000, 4097}) {
    std::vector<uint8_t> bytes(Packed12Bytes(count));
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    std::vector<uint16_t> a(static_cast<size_t>(count)), b(static_cast<size_t>(count));
    scalar.unpack12(bytes.data(), count, a.data());
    avx2.unpack12(bytes.data(), count, b.data());
    EXPECT_EQ(a, b) << count;
  }
  for (const IndexLayout& layout :
       {IndexLayout{40, 64, 4096}, IndexLayout{7, 16, 17}, IndexLayout{9, 33, 3721},
        IndexLayout{3, 5, 100}, IndexLayout{1, 1, 1}, IndexLayout{20, 17, 64}}) {
    const std::vector<uint16_t> list = RandomList(layout, rng);
    const uint32_t limit = static_cast<uint32_t>(layout.chunk_len);
    ASSERT_TRUE(scalar.runs_ascending(list.data(), layout.num_chunks, layout.k, limit));
    ASSERT_TRUE(avx2.runs_ascending(list.data(), layout.num_chunks, layout.k, limit));
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<uint16_t> bad = list;
      const size_t i = rng() % bad.size();
      switch (trial % 3) {
        case 0:
          bad[i] = i > 0 ? bad[i - 1] : bad[i];
          break;
        case 1:
          bad[i] = static_cast<uint16_t>(bad[i] > 0 ? bad[i] - 1 : 0);
          if (i + 1 < bad.size()) bad[i] = std::max(bad[i], bad[i + 1]);
          break;
        case 2:
          bad[i] = static_cast<uint16_t>(limit + rng() % 5000);
          break;
      }
      EXPECT_EQ(scalar.runs_ascending(bad.data(), layout.num_chunks, layout.k, limit),
                avx2.runs_ascending(bad.data(), layout.num_chunks, layout.k, limit))
          << "k " << layout.k << " entry " << i << " trial " << trial;
    }
  }
}

TEST(Packed12Test, TwoIndicesInThreeBytes) {
  const std::vector<uint16_t> list = {0x123, 0xABC, 0x7FF};
  std::vector<uint8_t> bytes(5);
  EncodePacked12(list, absl::MakeSpan(bytes));
  EXPECT_THAT(bytes, ::testing::ElementsAre(0x23, 0xC1, 0xAB, 0xFF, 0x07));
}

TEST(Packed12Test, RejectsOutOfRangeRepeatedDescendingAndBadLengths) {
  const IndexLayout layout{2, 3, 100};
  std::vector<uint16_t> out(6);
  auto encode = [](std::vector<uint16_t> list) {
    std::vector<uint8_t> bytes(Packed12Bytes(static_cast<int64_t>(list.size())));
    EncodePacked12(list, absl::MakeSpan(bytes));
    return bytes;
  };
  EXPECT_THAT(DecodePacked12(encode({1, 2, 3, 4, 5, 99}), layout, absl::MakeSpan(out)), IsOk());
  EXPECT_THAT(DecodePacked12(encode({1, 2, 3, 4, 5, 100}), layout, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("outside the chunk")));
  EXPECT_THAT(DecodePacked12(encode({1, 2, 2, 4, 5, 6}), layout, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(DecodePacked12(encode({1, 3, 2, 4, 5, 6}), layout, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss));
  // A new chunk may restart low.
  EXPECT_THAT(DecodePacked12(encode({50, 60, 70, 0, 1, 2}), layout, absl::MakeSpan(out)), IsOk());
  std::vector<uint8_t> bytes = encode({1, 2, 3, 4, 5, 6});
  bytes.push_back(0);
  EXPECT_THAT(DecodePacked12(bytes, layout, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss));
  bytes.resize(8);
  EXPECT_THAT(DecodePacked12(bytes, layout, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss));
  // Odd count: the pad nibble must be zero.
  const IndexLayout odd{1, 3, 100};
  std::vector<uint8_t> padded = encode({1, 2, 3});
  padded.back() |= 0x10;
  EXPECT_THAT(DecodePacked12(padded, odd, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("padding")));
}

TEST(AdaptiveTest, RoundTripEverySubBlockSizeAndRice) {
  std::mt19937 rng(2);
  for (const IndexLayout& layout : Layouts()) {
    const std::vector<uint16_t> list = RandomList(layout, rng);
    for (int b : {6, 7}) {
      for (int p = 0; p <= b; ++p) {
        const AdaptiveParams params{b, p};
        const uint64_t bits = AdaptiveBits(list, layout, params);
        ASSERT_EQ(bits, ReferenceAdaptiveBits(list, layout, b, p));
        std::vector<uint8_t> bytes((bits + 7) / 8);
        EncodeAdaptive(list, layout, params, absl::MakeSpan(bytes));
        std::vector<uint16_t> decoded(list.size());
        ASSERT_THAT(DecodeAdaptive(bytes, layout, params, absl::MakeSpan(decoded)), IsOk())
            << layout.chunk_len << " " << layout.k << " b " << b << " p " << p;
        ASSERT_EQ(decoded, list);
        EXPECT_LE(bytes.size(), AdaptiveMaxBytes(layout));
      }
    }
  }
}

TEST(AdaptiveTest, ChoiceIsTheShorterWithTheFormulaRice) {
  std::mt19937 rng(3);
  for (const IndexLayout& layout : Layouts()) {
    if (layout.num_chunks == 0) continue;
    const std::vector<uint16_t> list = RandomList(layout, rng);
    const AdaptiveChoice choice = ChooseAdaptive(list, layout);
    const int p6 = AdaptiveRice(layout, 6), p7 = AdaptiveRice(layout, 7);
    const uint64_t bits6 = ReferenceAdaptiveBits(list, layout, 6, p6);
    const uint64_t bits7 = ReferenceAdaptiveBits(list, layout, 7, p7);
    EXPECT_EQ(choice.bits, std::min(bits6, bits7));
    EXPECT_EQ(choice.params.sub_block_log2, bits7 < bits6 ? 7 : 6);
    // p = clamp(round(log2(k * B / C)), 0, b).
    const double lambda6 = static_cast<double>(layout.k) * 64 / layout.chunk_len;
    EXPECT_EQ(p6, static_cast<int>(std::clamp(std::nearbyint(std::log2(lambda6)), 0.0, 6.0)));
  }
  // SparseLoCo's production setting: 64 of 4096 gives lambda 1 at B = 64, so p = 0, and on
  // uniformly random positions about 8 bits per index (0.125 bits per parameter).
  const IndexLayout layout{256, 64, 4096};
  const std::vector<uint16_t> list = RandomList(layout, rng);
  const AdaptiveChoice choice = ChooseAdaptive(list, layout);
  EXPECT_EQ(choice.params.sub_block_log2, 6);
  EXPECT_EQ(choice.params.rice, 0);
  const double bits_per_param = static_cast<double>(choice.bits) / (256.0 * 4096);
  EXPECT_LT(bits_per_param, 0.14);
  EXPECT_GT(bits_per_param, 0.11);
}

TEST(AdaptiveTest, RejectsBadParamsTruncationAndTrailingBytes) {
  std::mt19937 rng(4);
  const IndexLayout layout{4, 64, 4096};
  const std::vector<uint16_t> list = RandomList(layout, rng);
  const AdaptiveParams params{6, 0};
  std::vector<uint8_t> bytes((AdaptiveBits(list, layout, params) + 7) / 8);
  EncodeAdaptive(list, layout, params, absl::MakeSpan(bytes));
  std::vector<uint16_t> out(list.size());
  EXPECT_THAT(DecodeAdaptive(bytes, layout, {5, 0}, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(DecodeAdaptive(bytes, layout, {6, 7}, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss));
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_THAT(DecodeAdaptive(absl::MakeConstSpan(bytes).subspan(0, cut), layout, params,
                               absl::MakeSpan(out)),
                StatusIs(absl::StatusCode::kDataLoss))
        << cut;
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_THAT(DecodeAdaptive(longer, layout, params, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kDataLoss));
}

// Any bytes decode to a valid list or fail with DataLoss (the fuzzer checks the same at scale).
TEST(AdaptiveTest, FlippedBitsNeverYieldAnInvalidList) {
  std::mt19937 rng(5);
  const IndexLayout layout{3, 20, 300};
  const std::vector<uint16_t> list = RandomList(layout, rng);
  for (int b : {6, 7}) {
    for (int p : {0, 2}) {
      const AdaptiveParams params{b, p};
      std::vector<uint8_t> bytes((AdaptiveBits(list, layout, params) + 7) / 8);
      EncodeAdaptive(list, layout, params, absl::MakeSpan(bytes));
      for (size_t bit = 0; bit < 8 * bytes.size(); ++bit) {
        std::vector<uint8_t> bad = bytes;
        bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        std::vector<uint16_t> out(list.size());
        const absl::Status status = DecodeAdaptive(bad, layout, params, absl::MakeSpan(out));
        if (!status.ok()) {
          ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss);
          continue;
        }
        for (int64_t c = 0; c < layout.num_chunks; ++c) {
          for (int64_t j = 0; j < layout.k; ++j) {
            ASSERT_LT(out[c * layout.k + j], layout.chunk_len);
            if (j > 0) ASSERT_LT(out[c * layout.k + j - 1], out[c * layout.k + j]);
          }
        }
      }
    }
  }
}

TEST(BitstreamTest, UnaryAndFixedFieldsRoundTrip) {
  std::vector<uint8_t> bytes(64);
  BitWriter writer(absl::MakeSpan(bytes));
  writer.PutUnary(0);
  writer.PutUnary(70);
  writer.Put(0x5, 3);
  writer.PutUnary(23);
  writer.Put(0xFFFFFFFFu, 32);
  const size_t used = writer.Finish();
  EXPECT_EQ(used, (1 + 71 + 3 + 24 + 32 + 7) / 8u);
  BitReader reader(absl::MakeConstSpan(bytes).subspan(0, used));
  uint32_t v = 0;
  ASSERT_TRUE(reader.GetUnary(100, &v));
  EXPECT_EQ(v, 0u);
  ASSERT_TRUE(reader.GetUnary(100, &v));
  EXPECT_EQ(v, 70u);
  ASSERT_TRUE(reader.Get(3, &v));
  EXPECT_EQ(v, 5u);
  {
    BitReader bounded(absl::MakeConstSpan(bytes).subspan(0, used));
    uint32_t q = 0;
    ASSERT_TRUE(bounded.GetUnary(0, &q));
    EXPECT_FALSE(bounded.GetUnary(69, &q));  // the run of 70 exceeds the bound
  }
  ASSERT_TRUE(reader.GetUnary(23, &v));
  EXPECT_EQ(v, 23u);
  ASSERT_TRUE(reader.Get(32, &v));
  EXPECT_EQ(v, 0xFFFFFFFFu);
  EXPECT_TRUE(reader.AtCleanEnd());
  EXPECT_FALSE(reader.Get(8, &v));  // only the padding bits are left
}

}  // namespace
}  // namespace lbcc::codecs
