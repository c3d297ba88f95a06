// SparseLoCo's shape-aware chunking: how a tensor is cut into the chunks top-k selects from.
//
// Every tensor is first viewed as a matrix [rows, cols]:
//   rank 2 [R, C]         -> [R, C]                        (the reference's rule)
//   rank 1 [N]            -> [1, N]                        (edge(1) = 1, so chunks are rows of
//                                                           edge(N) elements: the reference's
//                                                           "(c s) -> c s")
//   rank 0 []             -> [1, 1]                        (one chunk of one element)
//   rank > 2 [d0, .., dn] -> [d0 * .. * d(n-1), dn]        (leading dims fold into rows, so a
//                                                           stack of matrices chunks like each
//                                                           matrix when 64 divides its rows)
// The reference handles ranks 1 and 2 only; ranks 0 and > 2 are LBCC's documented extension.
// Chunk edges: h = ChunkEdge(rows), w = ChunkEdge(cols), where ChunkEdge(n) is the largest
// divisor of n that is <= 64. The matrix is cut "(y h) (x w) -> y x h w": chunk (y, x) is the
// h*w block at rows [y*h, y*h+h), cols [x*w, x*w+w), numbered c = y * (cols / w) + x, and a
// position inside it is local = r * w + col (row-major within the block), so local < 4096.
// Chunking::kFlat1D (TopKEfOptions::chunk_1d = flat4096) replaces the rule for rank 1 only:
// [N] -> [1, N] with w = ChunkEdge(N, 4096), so chunks of 4096 consecutive elements when 4096
// divides N (the SparseLoCo 72B report's 1-D rule). Chunks stay uniform: for other N they are
// the largest divisor of N that is <= 4096 (N itself when N <= 4096), never a ragged tail.
// k per chunk (KRule):
//   kProportional  clamp(max(1, round_half_even(chunk_len * top_k / 4096)), 1, chunk_len):
//                  top_k is "per 4096 elements" (LBCC's default)
//   kPerChunk      templar's _clamp_topk: k = min(top_k, chunk_len), then max(k, 2), then
//                  rounded down to even, in every chunk whatever its length; finally capped at
//                  chunk_len (only a chunk of 1 element, where templar's torch.topk would fail,
//                  gets k = 1). top_k is a whole number of values per chunk.
// Both agree for full 64 x 64 chunks and an even top_k.
//
// Thread-safety: value types and pure functions.
#ifndef LBCC_CODECS_CHUNKING_H_
#define LBCC_CODECS_CHUNKING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lbcc::codecs {

inline constexpr int64_t kChunkEdgeTarget = 64;
inline constexpr int64_t kTopKReferenceChunk = 4096;  // top_k is "per 64 * 64 elements"

// Python's round(): to nearest, ties to even, whatever the FPU rounding mode.
double RoundHalfEven(double x);

// The largest divisor of n that is <= target (n itself when n <= target). n >= 1, target >= 1.
int64_t ChunkEdge(int64_t n, int64_t target = kChunkEdgeTarget);

// How a rank-1 tensor is chunked. Wire values (TopK-EF v2 params); never renumber.
enum class Chunking : uint8_t {
  kShapeAware = 0,  // the rules above (1-D: rows of edge(N) <= 64 elements)
  kFlat1D = 1,      // 1-D: chunks of ChunkEdge(N, 4096) elements; other ranks as kShapeAware
};
inline constexpr int64_t kFlatChunkTarget = 4096;

// How many values top-k takes per chunk (see the module comment).
enum class KRule : uint8_t { kProportional = 0, kPerChunk = 1 };
// "proportional", "per_chunk".
absl::string_view KRuleName(KRule rule);
// The names above; InvalidArgument otherwise.
absl::StatusOr<KRule> ParseKRule(absl::string_view name);

struct ChunkGeometry {
  int64_t rows = 0;  // matrix view
  int64_t cols = 0;
  int64_t h = 0;           // chunk edge along rows
  int64_t w = 0;           // chunk edge along cols
  int64_t chunk_len = 0;   // h * w, <= 4096
  int64_t chunks_y = 0;    // rows / h
  int64_t chunks_x = 0;    // cols / w
  int64_t num_chunks = 0;  // chunks_y * chunks_x; 0 for an empty tensor
  int64_t num_elements = 0;

  // Flat (row-major) offset in the tensor of `local` inside chunk `c`.
  int64_t Offset(int64_t c, int64_t local) const {
    const int64_t y = c / chunks_x, x = c - y * chunks_x;
    const int64_t r = local / w, col = local - r * w;
    return (y * h + r) * cols + x * w + col;
  }
};

// InvalidArgument for an invalid shape (negative dims, rank > kMaxRank, overflow).
absl::StatusOr<ChunkGeometry> MakeChunkGeometry(absl::Span<const int64_t> shape,
                                                Chunking chunking = Chunking::kShapeAware);

// Flat offset of chunk c's top-left corner in the tensor.
inline int64_t ChunkCorner(const ChunkGeometry& g, int64_t c) {
  const int64_t y = c / g.chunks_x, x = c - y * g.chunks_x;
  return y * g.h * g.cols + x * g.w;
}

// out[local] = the offset of local position `local` from its chunk's corner (chunk_len entries).
void BuildLocalOffsets(const ChunkGeometry& g, std::vector<int64_t>* out);

// k per chunk. kProportional: `top_k` selected per 4096 elements (fractional values allowed:
// density * 4096), half-to-even rounding of chunk_len * top_k / 4096, then clamped to
// [1, chunk_len]. kPerChunk: templar's rule (module comment) on a whole top_k. Returns 0 for
// chunk_len 0. top_k must be finite and > 0 (checked by the options).
int64_t KPerChunk(int64_t chunk_len, double top_k, KRule rule = KRule::kProportional);

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_CHUNKING_H_
