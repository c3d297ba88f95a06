#include "codecs/index_coding.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Positions for the equivalence tests: uniform (sparse), or crowded into a few sub-blocks so
// that counts exceed 8 and bitmaps appear (dense).
std::vector<uint16_t> MixedList(const IndexLayout& layout, std::mt19937& rng, bool dense) {
  if (!dense) return RandomList(layout, rng);
  std::vector<uint16_t> out;
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    // Weights favour a random window of the chunk; sample k distinct positions from it.
    const int64_t window =
        std::max<int64_t>(layout.k, std::min<int64_t>(layout.chunk_len, 1 + rng() % 200));
    const int64_t start = rng() % (layout.chunk_len - window + 1);
    std::vector<uint16_t> all(static_cast<size_t>(window));
    std::iota(all.begin(), all.end(), static_cast<uint16_t>(start));
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<uint16_t> pick(all.begin(), all.begin() + layout.k);
    std::sort(pick.begin(), pick.end());
    out.insert(out.end(), pick.begin(), pick.end());
  }
  return out;
}

// DecodeAdaptive at every SIMD level gives the sequential decoder's Status (code and message)
// and, when it is OK, its indices. (The sequential decoder, one chunk after another, is what
// DecodeAdaptive was before its Rice-0 fast path; the tests above check it against the encoder
// and every corruption message.)
void ExpectLikeReference(absl::Span<const uint8_t> bytes, const IndexLayout& layout,
                         const AdaptiveParams& params, const std::string& what) {
  const size_t n = static_cast<size_t>(layout.count());
  std::vector<uint16_t> want(n), got(n);
  const absl::Status want_status =
      internal::DecodeAdaptiveSequential(bytes, layout, params, absl::MakeSpan(want));
  const SimdLevel saved = ActiveSimdLevel();
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2}) {
    SetSimdLevelForTesting(level);
    std::fill(got.begin(), got.end(), 0xFFFF);
    const absl::Status status = DecodeAdaptive(bytes, layout, params, absl::MakeSpan(got));
    ASSERT_EQ(status, want_status) << what << " level " << SimdLevelName(level);
    if (status.ok()) ASSERT_EQ(got, want) << what << " level " << SimdLevelName(level);
  }
  SetSimdLevelForTesting(saved);
}

const std::vector<IndexLayout>& EquivalenceLayouts() {
  static const auto* layouts = new std::vector<IndexLayout>{
      {64, 64, 4096}, {23, 64, 4096}, {9, 90, 4096}, {13, 32, 4096}, {17, 58, 3721},
      {12, 3, 61},    {9, 61, 61},    {8, 1, 1},     {11, 7, 100},  {7, 17, 200},
      {6, 40, 1000},  {5, 128, 4096}, {4, 1, 4096},  {3, 2, 130},   {0, 0, 4096},
  };
  return *layouts;
}

// `list` coded adaptively with `params`, exactly the coding's bytes.
std::vector<uint8_t> EncodedAdaptive(const std::vector<uint16_t>& list, const IndexLayout& layout,
                                     const AdaptiveParams& params) {
  std::vector<uint8_t> bytes((AdaptiveBits(list, layout, params) + 7) / 8);
  EncodeAdaptive(list, layout, params, absl::MakeSpan(bytes));
  return bytes;
}

std::string CaseName(const IndexLayout& layout, bool dense, const AdaptiveParams& params) {
  return absl::StrCat(layout.num_chunks, "x", layout.k, "/", layout.chunk_len, " dense ", dense,
                      " b ", params.sub_block_log2, " p ", params.rice);
}

// Valid streams: every layout, b, p, sparse and dense positions.
TEST(AdaptiveEquivalenceTest, ValidStreamsDecodeLikeTheReference) {
  std::mt19937 rng(21);
  for (const IndexLayout& layout : EquivalenceLayouts()) {
    for (bool dense : {false, true}) {
      if (layout.num_chunks == 0 && dense) continue;
      const std::vector<uint16_t> list = MixedList(layout, rng, dense);
      for (int b : {6, 7}) {
        for (int p = 0; p <= b; ++p) {
          const AdaptiveParams params{b, p};
          const std::vector<uint8_t> bytes = EncodedAdaptive(list, layout, params);
          const std::string what = CaseName(layout, dense, params);
          ASSERT_NO_FATAL_FAILURE(ExpectLikeReference(bytes, layout, params, what));
          std::vector<uint16_t> decoded(list.size());
          ASSERT_THAT(DecodeAdaptive(bytes, layout, params, absl::MakeSpan(decoded)), IsOk());
          ASSERT_EQ(decoded, list) << what;
        }
      }
    }
  }
}

// Corrupt streams: bit flips, bursts, truncations, appended bytes, all-ones and random bytes,
// and the wrong layout; the Status (and the chunk it names) must be the reference's.
TEST(AdaptiveEquivalenceTest, CorruptStreamsFailLikeTheReference) {
  std::mt19937 rng(22);
  for (const IndexLayout& layout : EquivalenceLayouts()) {
    if (layout.num_chunks == 0) continue;
    for (bool dense : {false, true}) {
      const std::vector<uint16_t> list = MixedList(layout, rng, dense);
      for (int b : {6, 7}) {
        for (int p : {0, 1, AdaptiveRice(layout, b), b}) {
          const AdaptiveParams params{b, p};
          const std::vector<uint8_t> bytes = EncodedAdaptive(list, layout, params);
          const std::string what = CaseName(layout, dense, params);
          const size_t bits = bytes.size() * 8;
          const int trials = p == 0 ? 120 : 25;
          for (int t = 0; t < trials; ++t) {
            std::vector<uint8_t> bad = bytes;
            const int flips = 1 + t % 3;
            for (int f = 0; f < flips; ++f) {
              const size_t bit = rng() % bits;
              bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
            }
            ASSERT_NO_FATAL_FAILURE(
                ExpectLikeReference(bad, layout, params, absl::StrCat(what, " flips ", t)));
          }
          for (int t = 0; t < 20; ++t) {  // a burst of ones or zeros (long unary runs)
            std::vector<uint8_t> bad = bytes;
            const size_t at = rng() % bad.size();
            const size_t len = 1 + rng() % 24;
            for (size_t i = at; i < std::min(bad.size(), at + len); ++i) {
              bad[i] = t % 2 ? 0xFF : 0x00;
            }
            ASSERT_NO_FATAL_FAILURE(
                ExpectLikeReference(bad, layout, params, absl::StrCat(what, " burst ", t)));
          }
          for (size_t cut : {size_t{0}, size_t{1}, bytes.size() / 2, bytes.size() - 1,
                             static_cast<size_t>(rng() % bytes.size())}) {
            ASSERT_NO_FATAL_FAILURE(ExpectLikeReference(
                absl::MakeConstSpan(bytes).subspan(0, std::min(cut, bytes.size())), layout,
                params, absl::StrCat(what, " cut ", cut)));
          }
          for (uint8_t extra : {uint8_t{0}, uint8_t{1}, uint8_t{0x80}}) {
            std::vector<uint8_t> longer = bytes;
            longer.push_back(extra);
            ASSERT_NO_FATAL_FAILURE(ExpectLikeReference(
                longer, layout, params, absl::StrCat(what, " extra ", int{extra})));
          }
          std::vector<uint8_t> padded = bytes;  // the top bit: padding, or the last bit
          padded.back() |= 0x80;
          ASSERT_NO_FATAL_FAILURE(
              ExpectLikeReference(padded, layout, params, absl::StrCat(what, " pad")));
          std::vector<uint8_t> noise(bytes.size());
          for (uint8_t& x : noise) x = static_cast<uint8_t>(rng());
          ASSERT_NO_FATAL_FAILURE(
              ExpectLikeReference(noise, layout, params, absl::StrCat(what, " noise")));
          std::vector<uint8_t> ones(bytes.size(), 0xFF);
          ASSERT_NO_FATAL_FAILURE(
              ExpectLikeReference(ones, layout, params, absl::StrCat(what, " ones")));
          IndexLayout other = layout;
          other.k = layout.k > 1 ? layout.k - 1 : layout.k + 1;
          if (other.k <= other.chunk_len) {
            ASSERT_NO_FATAL_FAILURE(
                ExpectLikeReference(bytes, other, params, absl::StrCat(what, " other k")));
          }
        }
      }
    }
  }
}

// A chunk that needs the sequential decoder (a count of 9, or a bitmap) among chunks the lanes
// take, at every position in a group of lanes: the decoders hand over at the right bit.
TEST(AdaptiveEquivalenceTest, FastPathHandsOverAtChunkBoundaries) {
  std::mt19937 rng(23);
  const IndexLayout layout{40, 64, 4096};
  for (int dense_chunk : {0, 1, 3, 4, 5, 17, 36, 39}) {
    std::vector<uint16_t> list = RandomList(layout, rng);
    // Chunk dense_chunk: 9 or 20 of its indices in sub-block 1 (count > 8; a bitmap at 20).
    const int crowd = dense_chunk % 2 ? 9 : 20;
    std::vector<uint16_t> chunk(64);
    for (int i = 0; i < crowd; ++i) chunk[i] = static_cast<uint16_t>(64 + 2 * i);
    for (int i = crowd; i < 64; ++i) chunk[i] = static_cast<uint16_t>(128 + 50 * (i - crowd));
    std::copy(chunk.begin(), chunk.end(), list.begin() + dense_chunk * 64);
    for (int b : {6, 7}) {
      const AdaptiveParams params{b, 0};
      std::vector<uint8_t> bytes((AdaptiveBits(list, layout, params) + 7) / 8);
      EncodeAdaptive(list, layout, params, absl::MakeSpan(bytes));
      const std::string what = absl::StrCat("dense chunk ", dense_chunk, " b ", b);
      ASSERT_NO_FATAL_FAILURE(ExpectLikeReference(bytes, layout, params, what));
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
