#include "codecs/chunking.h"

#include <cmath>

#include "base/tensor_view.h"

namespace lbcc::codecs {

double RoundHalfEven(double x) {
  const double r = std::floor(x);
  const double d = x - r;  // exact
  if (d > 0.5) return r + 1;
  if (d == 0.5 && std::fmod(r, 2.0) != 0) return r + 1;
  return r;
}

int64_t ChunkEdge(int64_t n) {
  if (n <= kChunkEdgeTarget) return n;
  for (int64_t d = kChunkEdgeTarget; d > 1; --d) {
    if (n % d == 0) return d;
  }
  return 1;
}

absl::StatusOr<ChunkGeometry> MakeChunkGeometry(absl::Span<const int64_t> shape) {
  absl::StatusOr<int64_t> count = NumElements(shape);
  if (!count.ok()) return count.status();
  ChunkGeometry g;
  g.num_elements = *count;
  if (shape.empty()) {
    g.rows = 1;
    g.cols = 1;
  } else {
    g.cols = shape.back();
    g.rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i)
      g.rows *= shape[i];  // no overflow: product checked
  }
  if (g.num_elements == 0) {
    // Keep the edges meaningful for reporting, but there is nothing to chunk.
    g.h = g.rows > 0 ? ChunkEdge(g.rows) : 0;
    g.w = g.cols > 0 ? ChunkEdge(g.cols) : 0;
    g.chunk_len = g.h * g.w;
    return g;
  }
  g.h = ChunkEdge(g.rows);
  g.w = ChunkEdge(g.cols);
  g.chunk_len = g.h * g.w;
  g.chunks_y = g.rows / g.h;
  g.chunks_x = g.cols / g.w;
  g.num_chunks = g.chunks_y * g.chunks_x;
  return g;
}

int64_t KPerChunk(int64_t chunk_len, double top_k) {
  if (chunk_len <= 0) return 0;
  // chunk_len * top_k / 4096 is exact in double for every chunk_len <= 4096 and any top_k with
  // at most 40 significant bits, so rounding it half to even is Python's round() on the same
  // value.
  double k = RoundHalfEven(static_cast<double>(chunk_len) * top_k / kTopKReferenceChunk);
  if (!(k >= 1)) k = 1;  // also catches NaN
  if (k > static_cast<double>(chunk_len)) k = static_cast<double>(chunk_len);
  return static_cast<int64_t>(k);
}

}  // namespace lbcc::codecs
