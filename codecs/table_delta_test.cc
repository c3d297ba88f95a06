// Table deltas: round trips over random tables and changed subsets, the encoding each size
// chooses, the layout written out by hand, and every kind of corruption rejected with DataLoss
// and the table untouched.
#include "codecs/table_delta.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <limits>
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

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

float FromBits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> RandomTable(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> t(n);
  for (float& x : t) x = normal(rng);
  return t;
}

// `before` with a random subset of about `fraction` of its elements changed (all when
// fraction >= 1, none when 0).
std::vector<float> Changed(const std::vector<float>& before, double fraction, uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution pick(std::min(fraction, 1.0));
  std::vector<float> after = before;
  for (float& x : after) {
    if (fraction >= 1.0 || (fraction > 0 && pick(rng))) x = x * 0.5f + 0.25f;
  }
  return after;
}

size_t CountChanged(const std::vector<float>& a, const std::vector<float>& b) {
  size_t m = 0;
  for (size_t i = 0; i < a.size(); ++i) m += Bits(a[i]) != Bits(b[i]);
  return m;
}

// Recomputes the trailing checksum after a deliberate edit, so the edit itself is what a
// decoder meets.
void Reseal(std::vector<uint8_t>& bytes) {
  const size_t end = bytes.size() - 8;
  const uint64_t sum = XXH3_64bits(bytes.data(), end);
  std::memcpy(bytes.data() + end, &sum, 8);
}

template <typename T>
void Put(std::vector<uint8_t>& bytes, size_t offset, T v) {
  std::memcpy(bytes.data() + offset, &v, sizeof(T));
}

TEST(TableDeltaTest, RoundTripsRandomTablesAndSubsets) {
  uint32_t seed = 1;
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4099}) {
    for (double fraction : {0.0, 0.05, 0.5, 1.0}) {
      const std::vector<float> before = RandomTable(n, seed++);
      const std::vector<float> after = Changed(before, fraction, seed++);
      LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, EncodeTableDelta(before, after));
      std::vector<float> table = before;
      ASSERT_THAT(ApplyTableDelta(bytes, absl::MakeSpan(table)), IsOk());
      EXPECT_TRUE(SameBits(table, after)) << "n " << n << ", fraction " << fraction;
      LBCC_ASSERT_OK_AND_ASSIGN(TableDeltaInfo info, InspectTableDelta(bytes));
      EXPECT_EQ(info.elements, n);
      EXPECT_EQ(info.changed, CountChanged(before, after));
      EXPECT_EQ(info.total_bytes, bytes.size());
      EXPECT_EQ(bytes.size(), 40 + info.position_bytes + 4 * info.changed);
    }
  }
}

TEST(TableDeltaTest, OneChangedElementAnywhere) {
  const std::vector<float> before = RandomTable(300, 5);
  for (size_t i : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{299}}) {
    std::vector<float> after = before;
    after[i] += 1.0f;
    LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, EncodeTableDelta(before, after));
    LBCC_ASSERT_OK_AND_ASSIGN(TableDeltaInfo info, InspectTableDelta(bytes));
    EXPECT_EQ(info.changed, 1u);
    EXPECT_EQ(info.encoding, TableDeltaEncoding::kGaps);
    EXPECT_EQ(info.position_bytes, i < 128 ? 1u : 2u);
    std::vector<float> table = before;
    ASSERT_THAT(ApplyTableDelta(bytes, absl::MakeSpan(table)), IsOk());
    EXPECT_TRUE(SameBits(table, after));
  }
}

TEST(TableDeltaTest, ChoosesTheSmallerPositionEncoding) {
  const size_t n = 10000;
  const std::vector<float> before = RandomTable(n, 11);
  struct Case {
    double fraction;
    TableDeltaEncoding want;
  };
  // 5 %: gaps average 20 (one LEB128 byte each, 500 bytes) against a 1250-byte bitmap; from
  // about 1 in 8 changed on the bitmap wins; nothing changed: no positions at all.
  for (const Case& c : {Case{0.0, TableDeltaEncoding::kGaps}, Case{0.05, TableDeltaEncoding::kGaps},
                        Case{0.3, TableDeltaEncoding::kBitmap},
                        Case{1.0, TableDeltaEncoding::kBitmap}}) {
    const std::vector<float> after = Changed(before, c.fraction, 12);
    LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, EncodeTableDelta(before, after));
    LBCC_ASSERT_OK_AND_ASSIGN(TableDeltaInfo info, InspectTableDelta(bytes));
    EXPECT_EQ(info.encoding, c.want) << c.fraction;
    if (c.want == TableDeltaEncoding::kBitmap) {
      EXPECT_EQ(info.position_bytes, n / 8);
    } else {
      EXPECT_LT(info.position_bytes, n / 8);
    }
  }
}

TEST(TableDeltaTest, FivePercentChangedIsFarSmallerThanTheDenseTable) {
  const size_t n = 200000;
  const std::vector<float> before = RandomTable(n, 21);
  const std::vector<float> after = Changed(before, 0.05, 22);
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, EncodeTableDelta(before, after));
  // About 5 bytes per changed element (4 for the value, 1 for its gap): ~0.25 of 4n.
  EXPECT_LT(bytes.size(), 4 * n * 3 / 10);
  EXPECT_LT(bytes.size(), CountChanged(before, after) * 5 + 200);
}

TEST(TableDeltaTest, ComparesAndCopiesBits) {
  const float nan_a = FromBits(0x7fc00001u), nan_b = FromBits(0x7fc00002u);
  const std::vector<float> before = {0.0f, 1.0f, nan_a, nan_a, 3.0f};
  const std::vector<float> after = {-0.0f, 1.0f, nan_a, nan_b, std::numeric_limits<float>::infinity()};
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, EncodeTableDelta(before, after));
  LBCC_ASSERT_OK_AND_ASSIGN(TableDeltaInfo info, InspectTableDelta(bytes));
  EXPECT_EQ(info.changed, 3u);  // -0.0, the other NaN payload, +inf
  std::vector<float> table = before;
  ASSERT_THAT(ApplyTableDelta(bytes, absl::MakeSpan(table)), IsOk());
  EXPECT_TRUE(SameBits(table, after));
}

// The layout of table_delta.h, written out by hand.
TEST(TableDeltaTest, LayoutIsTheDocumentedOne) {
  std::vector<float> before(20, 0.0f), after(20, 0.0f);
  after[3] = 1.5f;
  after[0] = -2.0f;
  // Gaps: positions 0 and 3 -> LEB128 0, 2 (2 bytes) against a 3-byte bitmap.
  std::vector<uint8_t> want = {'L', 'B', 'C', 'C', 'T', 'B', 'L', 'D', 1, 0, 0, 0, 1, 0, 0, 0};
  for (uint64_t v : {uint64_t{20}, uint64_t{2}}) {
    for (int i = 0; i < 8; ++i) want.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  want.push_back(0);
  want.push_back(2);
  for (float v : {-2.0f, 1.5f}) {
    const uint32_t b = Bits(v);
    for (int i = 0; i < 4; ++i) want.push_back(static_cast<uint8_t>(b >> (8 * i)));
  }
  const uint64_t sum = XXH3_64bits(want.data(), want.size());
  for (int i = 0; i < 8; ++i) want.push_back(static_cast<uint8_t>(sum >> (8 * i)));
  EXPECT_EQ(*EncodeTableDelta(before, after), want);

  // Bitmap: 5 of 12 changed (positions 0, 2, 3, 9, 11) -> bits 0b00001101, 0b00001010.
  std::vector<float> b12(12, 1.0f), a12 = b12;
  for (int i : {0, 2, 3, 9, 11}) a12[i] = 2.0f;
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, EncodeTableDelta(b12, a12));
  ASSERT_EQ(bytes.size(), 32u + 2 + 5 * 4 + 8);
  EXPECT_EQ(bytes[12], 0);  // kBitmap
  EXPECT_EQ(bytes[32], 0x0d);
  EXPECT_EQ(bytes[33], 0x0a);
}

TEST(TableDeltaTest, SizeMismatchesAreInvalidArgument) {
  std::vector<float> a(5), b(6);
  EXPECT_THAT(EncodeTableDelta(a, b).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  b.resize(5);
  b[1] = 1.0f;
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> bytes, EncodeTableDelta(a, b));
  std::vector<float> table(6, 7.0f);
  EXPECT_THAT(ApplyTableDelta(bytes, absl::MakeSpan(table)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("table of 6")));
  EXPECT_EQ(table, std::vector<float>(6, 7.0f));
}

// Every flipped bit, every truncation and any appended byte: DataLoss, table untouched.
TEST(TableDeltaTest, DamagedMessagesAreDataLossAndLeaveTheTableUntouched) {
  for (double fraction : {0.05, 0.6}) {  // one message of each encoding
    const std::vector<float> before = RandomTable(100, 31);
    const std::vector<float> after = Changed(before, fraction, 32);
    LBCC_ASSERT_OK_AND_ASSIGN(const std::vector<uint8_t> good, EncodeTableDelta(before, after));
    std::vector<float> table = before;
    auto expect_rejected = [&](const std::vector<uint8_t>& bytes, const char* what, size_t at) {
      EXPECT_THAT(ApplyTableDelta(bytes, absl::MakeSpan(table)),
                  StatusIs(absl::StatusCode::kDataLoss))
          << what << " at " << at;
      EXPECT_THAT(InspectTableDelta(bytes).status(), StatusIs(absl::StatusCode::kDataLoss));
      ASSERT_TRUE(SameBits(table, before)) << what << " at " << at;
    };
    for (size_t i = 0; i < good.size(); ++i) {
      for (int bit : {0, 7}) {
        std::vector<uint8_t> bytes = good;
        bytes[i] ^= static_cast<uint8_t>(1u << bit);
        expect_rejected(bytes, "flipped bit", i);
      }
    }
    for (size_t size = 0; size < good.size(); ++size) {
      expect_rejected(std::vector<uint8_t>(good.begin(), good.begin() + size), "truncated", size);
    }
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    expect_rejected(longer, "appended byte", good.size());
    longer.pop_back();
    longer.insert(longer.end() - 8, 0);  // a byte inside, checksum recomputed
    Reseal(longer);
    expect_rejected(longer, "trailing byte", good.size() - 8);
  }
}

// Structural errors behind a valid checksum (what a buggy or hostile encoder could send).
TEST(TableDeltaTest, ResealedStructuralErrorsAreDataLoss) {
  std::vector<float> before(40, 0.0f), gaps_after = before, bitmap_after = before;
  gaps_after[5] = 1.0f;
  gaps_after[30] = 2.0f;
  for (int i = 0; i < 40; i += 2) bitmap_after[i] = 3.0f;
  LBCC_ASSERT_OK_AND_ASSIGN(const std::vector<uint8_t> gaps, EncodeTableDelta(before, gaps_after));
  LBCC_ASSERT_OK_AND_ASSIGN(const std::vector<uint8_t> bitmap,
                            EncodeTableDelta(before, bitmap_after));
  ASSERT_EQ(gaps[12], 1);
  ASSERT_EQ(bitmap[12], 0);
  struct Edit {
    const char* what;
    const std::vector<uint8_t>* base;
    void (*edit)(std::vector<uint8_t>&);
    const char* message;
  };
  const Edit edits[] = {
      {"magic", &gaps, [](std::vector<uint8_t>& b) { b[0] = 'X'; }, "magic"},
      {"version", &gaps, [](std::vector<uint8_t>& b) { Put<uint32_t>(b, 8, 2); }, "version 2"},
      {"encoding", &gaps, [](std::vector<uint8_t>& b) { b[12] = 2; }, "encoding 2"},
      {"reserved", &gaps, [](std::vector<uint8_t>& b) { b[14] = 1; }, "reserved"},
      {"m > n", &gaps, [](std::vector<uint8_t>& b) { Put<uint64_t>(b, 24, 41); }, "41 changed"},
      {"huge m", &gaps, [](std::vector<uint8_t>& b) { Put<uint64_t>(b, 16, ~0ull); Put<uint64_t>(b, 24, ~0ull >> 1); },
       "truncated"},
      // Positions 5, 30 -> gaps 5, 24; a second gap of 40 puts it beyond n.
      {"position beyond n", &gaps, [](std::vector<uint8_t>& b) { b[33] = 40; }, "beyond 40"},
      // n shrunk below the second position.
      {"n too small", &gaps, [](std::vector<uint8_t>& b) { Put<uint64_t>(b, 16, 30); }, "beyond 30"},
      // Gap 5 written as 0x85 0x00: an overlong LEB128 (and one byte too many).
      {"overlong", &gaps,
       [](std::vector<uint8_t>& b) {
         b[32] = 0x85;
         b.insert(b.begin() + 33, 0x00);
       },
       "minimal"},
      // m = 1: the second gap byte is left over before the values.
      {"trailing positions", &gaps,
       [](std::vector<uint8_t>& b) {
         Put<uint64_t>(b, 24, 1);
         b.erase(b.end() - 12, b.end() - 8);  // one value fewer
       },
       "trailing"},
      // The bitmap claims n = 36: 5 bytes needed, 5 present, but bits 36..39 are set beyond.
      {"bitmap padding", &bitmap,
       [](std::vector<uint8_t>& b) {
         Put<uint64_t>(b, 16, 35);
         Put<uint64_t>(b, 24, 18);
         b.erase(b.end() - 16, b.end() - 8);
       },
       "beyond element 35"},
      {"bitmap popcount", &bitmap, [](std::vector<uint8_t>& b) { b[32] |= 0x02; }, "holds 21"},
      {"bitmap short", &bitmap,
       [](std::vector<uint8_t>& b) { Put<uint64_t>(b, 16, 48); }, "truncated"},
      {"bitmap long", &bitmap,
       [](std::vector<uint8_t>& b) { Put<uint64_t>(b, 16, 24); }, "trailing"},
  };
  for (const Edit& e : edits) {
    std::vector<uint8_t> bytes = *e.base;
    e.edit(bytes);
    Reseal(bytes);
    std::vector<float> table = before;
    EXPECT_THAT(ApplyTableDelta(bytes, absl::MakeSpan(table)),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(e.message)))
        << e.what;
    EXPECT_THAT(InspectTableDelta(bytes).status(), StatusIs(absl::StatusCode::kDataLoss))
        << e.what;
    EXPECT_TRUE(SameBits(table, before)) << e.what;
  }
}

TEST(TableDeltaTest, ForeignBytesAreDataLoss) {
  std::vector<float> table(4, 1.0f);
  std::vector<uint8_t> other(64, 0);
  std::memcpy(other.data(), "LBCC", 4);  // a codec payload's magic, not a table delta's
  const std::vector<std::vector<uint8_t>> foreign = {{}, {1, 2, 3}, other};
  for (const std::vector<uint8_t>& bytes : foreign) {
    EXPECT_THAT(ApplyTableDelta(bytes, absl::MakeSpan(table)),
                StatusIs(absl::StatusCode::kDataLoss));
  }
  EXPECT_EQ(table, std::vector<float>(4, 1.0f));
}

}  // namespace
}  // namespace lbcc::codecs
