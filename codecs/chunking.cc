#include "codecs/chunking.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

#include "base/tensor_view.h"

namespace lbcc::codecs {

double RoundHalfEven(double x) {
  const double r = std::floor(x);
  const double d = x - r;  // exact
  if (d > 0.5) return r + 1;
  if (d == 0.5 && std::fmod(r, 2.0) != 0) return r + 1;
  return r;
}

int64_t ChunkEdge(int64_t n, int64_t target) {
  if (n <= target) return n;
  for (int64_t d = target; d > 1; --d) {
    if (n % d == 0) return d;
  }
  return 1;
}

absl::string_view KRuleName(KRule rule) {
  return rule == KRule::kPerChunk ? "per_chunk" : "proportional";
}

absl::StatusOr<KRule> ParseKRule(absl::string_view name) {
  if (name == "proportional") return KRule::kProportional;
  if (name == "per_chunk") return KRule::kPerChunk;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown k_rule '", name, "' (expected per_chunk or proportional)"));
}

absl::StatusOr<ChunkGeometry> MakeChunkGeometry(absl::Span<const int64_t> shape,
                                                Chunking chunking) {
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
  g.w = chunking == Chunking::kFlat1D && shape.size() == 1 ? ChunkEdge(g.cols, kFlatChunkTarget)
                                                           : ChunkEdge(g.cols);
  g.chunk_len = g.h * g.w;
  g.chunks_y = g.rows / g.h;
  g.chunks_x = g.cols / g.w;
  g.num_chunks = g.chunks_y * g.chunks_x;
  return g;
}

void BuildLocalOffsets(const ChunkGeometry& g, std::vector<int64_t>* out) {
  out->resize(static_cast<size_t>(g.chunk_len));
  int64_t* o = out->data();
  for (int64_t r = 0; r < g.h; ++r) {
    for (int64_t x = 0; x < g.w; ++x) *o++ = r * g.cols + x;
  }
}

int64_t KPerChunk(int64_t chunk_len, double top_k, KRule rule) {
  if (chunk_len <= 0) return 0;
  if (rule == KRule::kPerChunk) {
    // templar's _clamp_topk: min(top_k, len), at least 2, rounded down to even; then capped at
    // len (a 1-element chunk, which templar cannot select from).
    int64_t k = top_k >= static_cast<double>(chunk_len) ? chunk_len : static_cast<int64_t>(top_k);
    k = std::max<int64_t>(k, 2);
    k -= k % 2;
    return std::min(k, chunk_len);
  }
  // chunk_len * top_k / 4096 is exact in double for every chunk_len <= 4096 and any top_k with
  // at most 40 significant bits, so rounding it half to even is Python's round() on the same
  // value.
  double k = RoundHalfEven(static_cast<double>(chunk_len) * top_k / kTopKReferenceChunk);
  if (!(k >= 1)) k = 1;  // also catches NaN
  if (k > static_cast<double>(chunk_len)) k = static_cast<double>(chunk_len);
  return static_cast<int64_t>(k);
}

}  // namespace lbcc::codecs
