#include "codecs/chunking.h"

#include <cstdint>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::StatusIs;

int64_t BruteEdge(int64_t n) {
  int64_t best = 1;
  for (int64_t d = 1; d <= std::min<int64_t>(n, 64); ++d) {
    if (n % d == 0) best = d;
  }
  return best;
}

TEST(ChunkEdgeTest, LargestDivisorAtMost64) {
  for (int64_t n = 1; n <= 5000; ++n) ASSERT_EQ(ChunkEdge(n), BruteEdge(n)) << n;
  // Primes above 64 have edge 1; 64 and its multiples have 64; small n are their own edge.
  for (int64_t p : {67, 71, 97, 101, 4093, 4099, 65521}) EXPECT_EQ(ChunkEdge(p), 1) << p;
  for (int64_t n : {64, 128, 4096, 50257 * 64}) EXPECT_EQ(ChunkEdge(n), 64) << n;
  for (int64_t n : {1, 7, 13, 61, 63}) EXPECT_EQ(ChunkEdge(n), n) << n;
  EXPECT_EQ(ChunkEdge(50257), 29);  // 50257 = 29 * 1733 (a vocabulary size)
  EXPECT_EQ(ChunkEdge(3 * 67), 3);
  EXPECT_EQ(ChunkEdge(11008), 64);  // 11008 = 2^8 * 43
}

struct ShapeCase {
  std::vector<int64_t> shape;
  int64_t rows, cols, h, w;
};

TEST(ChunkGeometryTest, MatrixViewAndEdges) {
  const std::vector<ShapeCase> cases = {
      {{}, 1, 1, 1, 1},
      {{7}, 1, 7, 1, 7},
      {{4096}, 1, 4096, 1, 64},
      {{67}, 1, 67, 1, 1},
      {{4096, 4096}, 4096, 4096, 64, 64},
      {{100, 130}, 100, 130, 50, 26},
      {{61, 61}, 61, 61, 61, 61},
      {{97, 4096}, 97, 4096, 1, 64},
      {{3, 5, 7}, 15, 7, 15, 7},
      {{2, 64, 4096}, 128, 4096, 64, 64},
      {{1, 1, 1, 1}, 1, 1, 1, 1},
  };
  for (const ShapeCase& c : cases) {
    LBCC_ASSERT_OK_AND_ASSIGN(ChunkGeometry g, MakeChunkGeometry(c.shape));
    EXPECT_EQ(g.rows, c.rows);
    EXPECT_EQ(g.cols, c.cols);
    EXPECT_EQ(g.h, c.h);
    EXPECT_EQ(g.w, c.w);
    EXPECT_EQ(g.h, BruteEdge(c.rows));
    EXPECT_EQ(g.w, BruteEdge(c.cols));
    EXPECT_EQ(g.chunk_len, g.h * g.w);
    EXPECT_LE(g.chunk_len, 4096);
    EXPECT_EQ(g.num_chunks * g.chunk_len, g.num_elements);
  }
  LBCC_ASSERT_OK_AND_ASSIGN(ChunkGeometry empty, MakeChunkGeometry({0, 64}));
  EXPECT_EQ(empty.num_chunks, 0);
  EXPECT_THAT(MakeChunkGeometry({-1, 4}), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Offset() is einops' "(y h) (x w) -> y x h w" followed by flattening: every position of the
// tensor appears exactly once, chunk c holding rows [y*h, y*h+h) x cols [x*w, x*w+w).
TEST(ChunkGeometryTest, OffsetsAreTheReferenceRearrange) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{12, 10}, {130, 66}, {67, 5}, {128}, {3, 4, 6}}) {
    LBCC_ASSERT_OK_AND_ASSIGN(ChunkGeometry g, MakeChunkGeometry(shape));
    std::vector<int> seen(static_cast<size_t>(g.num_elements), 0);
    for (int64_t c = 0; c < g.num_chunks; ++c) {
      const int64_t y = c / g.chunks_x, x = c % g.chunks_x;
      for (int64_t hh = 0; hh < g.h; ++hh) {
        for (int64_t ww = 0; ww < g.w; ++ww) {
          const int64_t expected = (y * g.h + hh) * g.cols + (x * g.w + ww);
          ASSERT_EQ(g.Offset(c, hh * g.w + ww), expected);
          ++seen[expected];
        }
      }
    }
    for (int s : seen) ASSERT_EQ(s, 1);
  }
}

TEST(KPerChunkTest, PythonRoundThenClamp) {
  EXPECT_EQ(KPerChunk(4096, 64), 64);
  EXPECT_EQ(KPerChunk(4096, 128), 128);
  // 3721 * 64 / 4096 = 58.14 -> 58.
  EXPECT_EQ(KPerChunk(3721, 64), 58);
  // Exact halves round to even: 32 * 64 / 4096 = 0.5 -> 0 -> max(1, 0) = 1;
  // 160 * 64 / 4096 = 2.5 -> 2; 224 * 64 / 4096 = 3.5 -> 4.
  EXPECT_EQ(KPerChunk(32, 64), 1);
  EXPECT_EQ(KPerChunk(160, 64), 2);
  EXPECT_EQ(KPerChunk(224, 64), 4);
  EXPECT_EQ(KPerChunk(96, 64), 2);  // 1.5 -> 2
  EXPECT_EQ(KPerChunk(1, 64), 1);
  EXPECT_EQ(KPerChunk(7, 4096), 7);  // clamped to the chunk
  EXPECT_EQ(KPerChunk(4096, 4096), 4096);
  EXPECT_EQ(KPerChunk(4096, 0.001), 1);
  EXPECT_EQ(KPerChunk(0, 64), 0);
  EXPECT_EQ(RoundHalfEven(0.5), 0);
  EXPECT_EQ(RoundHalfEven(1.5), 2);
  EXPECT_EQ(RoundHalfEven(2.5), 2);
  EXPECT_EQ(RoundHalfEven(-0.5), 0);
  EXPECT_EQ(RoundHalfEven(-1.5), -2);
  EXPECT_EQ(RoundHalfEven(2.5000001), 3);
}

}  // namespace
}  // namespace lbcc::codecs
