// TopK-EF's decode-accumulate (topk_ef.h, module comment): PrepareDecode validates every payload
// and unpacks its indices, ApplyDecode aggregates chunk by chunk; templar's median-norm clip.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "codecs/chunking.h"
#include "codecs/cpu_kernels.h"
#include "codecs/payload.h"
#include "codecs/topk_ef.h"

namespace lbcc::codecs {

namespace {

constexpr int64_t kMaxPayloads = 65535;  // selection counts are 16-bit
// Outputs at least this large are written with non-temporal stores when not accumulated into
// (skipping the read for ownership pays: BM_TopKEfDecodeAssign4, docs/codecs.md).
constexpr int64_t kStreamOutputBytes = int64_t{1} << 20;

// One validated TopK-EF payload, ready to scatter.
struct TopKParsed {
  int64_t k = 0;
  size_t index_offset = 0;  // into TopKDecodeScratch::indices
  ValueDecoder values;
  float clip = 1.0f;                     // the median-norm clip factor (1: values as decoded)
  const float* scaled_quad = nullptr;    // 2-bit bin-mean, clip != 1: values.quad() * clip
};

// TopK-EF's part of a DecodeScratch.
struct TopKDecodeScratch final : CodecScratch {
  ChunkGeometry geometry;             // the prepared payloads' chunking
  std::vector<uint16_t> indices;      // every payload's decoded local indices
  std::vector<TopKParsed> topk;       // per payload
  std::vector<float> acc;             // per-chunk accumulator (4096)
  std::vector<uint16_t> count;        // per-chunk selection counts (4096)
  std::vector<int64_t> local_offset;  // local position -> offset from the chunk's corner
  std::vector<float> values;          // one chunk's decoded values (4096)
  std::vector<uint16_t> touched;      // one chunk's distinct selected positions (4096)
  std::vector<float> strip;           // staged aggregates of a strip of chunks
  std::vector<float> norms;           // clip_to_median_norm: per payload
  std::vector<float> factors;
  std::vector<float> scaled_quads;    // per payload, 1024 floats (TopKParsed::scaled_quad)
};

// agg / d in fp32. For a power of two d the product with the exact reciprocal is the same
// number (both are the correctly rounded agg * 2^-n) and avoids a division.
inline float DivideBy(float agg, uint32_t d) {
  if ((d & (d - 1)) == 0) return agg * BitsToFloat((127u - __builtin_ctz(d)) << 23);
  return agg / static_cast<float>(d);
}

// Whether the chunks are finished position by position (many selections per chunk: 8 payloads
// at top_k 64 touch ~12 % of a chunk) rather than through the list of touched positions; at
// that density the vectorised pass over the block measured faster than the list.
bool UseDenseFinish(const std::vector<TopKParsed>& topk, const ChunkGeometry& g) {
  int64_t per_chunk = 0;
  for (const TopKParsed& p : topk) per_chunk += p.k;
  return per_chunk * 16 >= g.chunk_len;
}

// An accumulated dense finish stages strips of chunks side by side (a multiple of the chunk
// width up to kStripFloats wide) when the output has at least kStageOutputBytes.
constexpr int64_t kStripFloats = 4096;
constexpr int64_t kStageOutputBytes = int64_t{8} << 20;
// Chunks per staged strip, and the strip's row stride: one cache line more than its width, so
// that its rows fall in different L1 sets.
int64_t ChunksPerStrip(const ChunkGeometry& g) {
  return std::max<int64_t>(1, std::min(g.chunks_x, kStripFloats / g.w));
}
int64_t StripStride(const ChunkGeometry& g) { return ChunksPerStrip(g) * g.w + 16; }
// Whether a dense finish goes through staged strips.
bool UseStagedFinish(const ChunkGeometry& g, bool accumulate) {
  return accumulate && g.h > 1 && g.num_elements * 4 >= kStageOutputBytes;
}

// Hints the h rows of chunk c's block into the cache before the chunk is written.
inline void PrefetchBlock(const ChunkGeometry& g, const float* out, int64_t c) {
  const float* corner = out + ChunkCorner(g, c);
  for (int64_t r = 0; r < g.h; ++r) {
    const float* row = corner + r * g.cols;
    for (int64_t x = 0; x < g.w; x += 16) __builtin_prefetch(row + x, 1);
  }
}

// Adds payload p's values of chunk c to the chunk's accumulator, in list order. kList: also
// appends each position seen for the first time to `touched` (*num_touched entries).
template <bool kList>
inline void AddChunk(const TopKParsed& p, const uint16_t* idx, int64_t c, float* acc,
                     uint16_t* count, float* vals, uint16_t* touched, int64_t* num_touched) {
  const int64_t first = c * p.k;
  int64_t nt = kList ? *num_touched : 0;
  auto add = [&](uint32_t l, float v) {
    const uint32_t n = count[l];
    if (kList) {
      touched[nt] = static_cast<uint16_t>(l);
      nt += n == 0;
    }
    count[l] = static_cast<uint16_t>(n + 1);
    acc[l] += v;
  };
  if (p.values.coding() == ValueCoding::kBinMean2 && p.k % 4 == 0) {
    // 2-bit codes: one byte gives four values; no staging buffer.
    const float* quad = p.scaled_quad != nullptr ? p.scaled_quad : p.values.quad();
    const uint8_t* codes = p.values.code_bytes() + first / 4;
    for (int64_t j = 0; j < p.k; j += 4) {
      const float* q = quad + 4 * codes[j / 4];
      add(idx[j], q[0]);
      add(idx[j + 1], q[1]);
      add(idx[j + 2], q[2]);
      add(idx[j + 3], q[3]);
    }
  } else {
    p.values.Decode(first, p.k, vals);
    if (p.clip != 1.0f) {
      for (int64_t j = 0; j < p.k; ++j) vals[j] = vals[j] * p.clip;
    }
    for (int64_t j = 0; j < p.k; ++j) add(idx[j], vals[j]);
  }
  if (kList) *num_touched = nt;
}

template <Aggregation kRule, bool kAccumulate>
void ScatterChunks(const ChunkGeometry& g, absl::Span<const PayloadInfo> payloads,
                   TopKDecodeScratch& s, float* out) {
  float* acc = s.acc.data();
  uint16_t* count = s.count.data();
  float* vals = s.values.data();
  uint16_t* touched = s.touched.data();
  const int64_t* local_offset = s.local_offset.data();
  const uint32_t replicas = static_cast<uint32_t>(payloads.size());
  // Many selections per chunk: finish the chunk position by position (vectorised, the block's
  // rows in order); few: follow the list of touched positions. Both give the same bits.
  const bool dense = UseDenseFinish(s.topk, g);
  const CpuKernels& kern = ActiveKernels();
  // An output written (not added to) and larger than a core's L2 is not read again before it
  // leaves the cache: non-temporal stores skip reading it in first.
  const bool stream = !kAccumulate && g.num_chunks * g.chunk_len * 4 >= kStreamOutputBytes;
  // Blocks are prefetched two chunks ahead (measured: 1, 2, 4 or 8 ahead and lower cache levels
  // are within noise for cache-resident outputs; 2 is best at 4096^2).
  constexpr int64_t kAhead = 2;
  // Every payload's values of chunk c into the chunk's accumulator, in rank order.
  auto add_payloads = [&](int64_t c) {
    for (const TopKParsed& p : s.topk) {
      AddChunk<false>(p, s.indices.data() + p.index_offset + c * p.k, c, acc, count, vals,
                      nullptr, nullptr);
    }
  };
  if (dense && UseStagedFinish(g, kAccumulate)) {
    // Added into an output larger than the caches: a strip of chunks side by side in one block
    // row is staged, then added to the output row by row, so the output is read and written in
    // runs of the strip's width that the hardware prefetches (a chunk's own rows are short and
    // at power-of-two strides all fall in the same few L1 sets: the per-chunk finish waits on
    // them). Smaller outputs come from L2/L3 fast enough that the extra pass costs more.
    const int64_t per_strip = ChunksPerStrip(g);
    const int64_t strip_stride = StripStride(g);
    float* strip = s.strip.data();
    for (int64_t y = 0; y < g.chunks_y; ++y) {
      for (int64_t x0 = 0; x0 < g.chunks_x; x0 += per_strip) {
        const int64_t n = std::min(per_strip, g.chunks_x - x0);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t c = y * g.chunks_x + x0 + j;
          add_payloads(c);
          kern.stage_block(acc, count, g.h, g.w, strip + j * g.w, strip_stride,
                           static_cast<int>(kRule), static_cast<float>(replicas));
        }
        kern.add_rows(strip, strip_stride, g.h, n * g.w,
                      out + ChunkCorner(g, y * g.chunks_x + x0), g.cols);
      }
    }
    return;
  }
  for (int64_t c = 0; c < std::min(kAhead, g.num_chunks); ++c) PrefetchBlock(g, out, c);
  for (int64_t c = 0; c < g.num_chunks; ++c) {
    if (c + kAhead < g.num_chunks) PrefetchBlock(g, out, c + kAhead);
    float* corner = out + ChunkCorner(g, c);
    if (dense) {
      add_payloads(c);
      kern.finalize_block(acc, count, g.h, g.w, corner, g.cols, static_cast<int>(kRule),
                          static_cast<float>(replicas), kAccumulate, stream);
      continue;
    }
    int64_t num_touched = 0;
    for (const TopKParsed& p : s.topk) {
      AddChunk<true>(p, s.indices.data() + p.index_offset + c * p.k, c, acc, count, vals, touched,
                     &num_touched);
    }
    for (int64_t i = 0; i < num_touched; ++i) {
      const uint16_t l = touched[i];
      const uint32_t n = count[l];
      float agg = acc[l];
      if (kRule == Aggregation::kSparseLoCoMean && n != 1) agg = DivideBy(agg, n);
      if (kRule == Aggregation::kMean) agg = DivideBy(agg, replicas);
      float& slot = corner[local_offset[l]];
      slot = kAccumulate ? slot + agg : agg;
      acc[l] = -0.0f;
      count[l] = 0;
    }
  }
  if (dense && stream) kern.store_fence();
}

template <Aggregation kRule>
void Scatter(bool accumulate, const ChunkGeometry& g, absl::Span<const PayloadInfo> payloads,
             TopKDecodeScratch& s, float* out) {
  if (accumulate) {
    ScatterChunks<kRule, true>(g, payloads, s, out);
  } else {
    ScatterChunks<kRule, false>(g, payloads, s, out);
  }
}

}  // namespace

std::unique_ptr<CodecScratch> TopKEfCodec::NewDecodeScratch() const {
  return std::make_unique<TopKDecodeScratch>();
}

absl::Status TopKEfCodec::PrepareDecode(const DecodeCall& call, CodecScratch* scratch) const {
  TopKDecodeScratch& s = static_cast<TopKDecodeScratch&>(*scratch);
  const absl::Span<const PayloadInfo> payloads = call.infos;
  if (static_cast<int64_t>(payloads.size()) > kMaxPayloads) {
    return absl::InvalidArgumentError(
        absl::StrCat("topk_ef: at most ", kMaxPayloads, " payloads per call"));
  }
  // Phase 1: validate everything (indices decoded into scratch) before touching `out`.
  s.topk.resize(payloads.size());
  size_t total = 0;
  ChunkGeometry g;
  for (size_t r = 0; r < payloads.size(); ++r) {
    LBCC_ASSIGN_OR_RETURN(TopKEfHeader h, ParseTopKEfHeader(payloads[r]),
                          _.Prepend(absl::StrCat("payload ", r)));
    g = h.geometry;
    s.topk[r].k = h.layout.k;
    s.topk[r].index_offset = total;
    total += static_cast<size_t>(h.layout.count());
  }
  if (s.indices.size() < total) s.indices.resize(total);
  for (size_t r = 0; r < payloads.size(); ++r) {
    const TopKEfHeader h = *ParseTopKEfHeader(payloads[r]);  // validated above
    const absl::Span<uint16_t> indices(s.indices.data() + s.topk[r].index_offset,
                                       static_cast<size_t>(h.layout.count()));
    absl::Status status = h.indices == IndexCoding::kAdaptive
                              ? DecodeAdaptive(h.index_section, h.layout, h.adaptive, indices)
                              : DecodePacked12(h.index_section, h.layout, indices);
    if (status.ok()) {
      status = s.topk[r].values.Init(h.values, h.value_params, h.value_section, h.layout.count());
    }
    if (!status.ok()) return Annotate(status, absl::StrCat("payload ", r));
    s.topk[r].clip = 1.0f;
    s.topk[r].scaled_quad = nullptr;
  }
  if (call.options.clip_to_median_norm) {
    // templar's clip (topk_ef.h): every payload's norm, their lower median, then the factors;
    // 2-bit bin-mean payloads get a scaled copy of their four-values-per-code table.
    const size_t n = payloads.size();
    s.norms.resize(n);
    s.factors.resize(n);
    if (s.values.size() < static_cast<size_t>(kTopKReferenceChunk)) {
      s.values.resize(kTopKReferenceChunk);
    }
    for (size_t r = 0; r < n; ++r) {
      s.norms[r] = DecodedNorm(s.topk[r].values, s.topk[r].k * g.num_chunks, s.values.data());
    }
    MedianNormClipFactors(s.norms, absl::MakeSpan(s.factors));
    if (s.scaled_quads.size() < n * 1024) s.scaled_quads.resize(n * 1024);
    for (size_t r = 0; r < n; ++r) {
      TopKParsed& p = s.topk[r];
      p.clip = s.factors[r];
      if (p.clip == 1.0f || p.values.coding() != ValueCoding::kBinMean2) continue;
      float* scaled = s.scaled_quads.data() + r * 1024;
      const float* quad = p.values.quad();
      for (int i = 0; i < 1024; ++i) scaled[i] = quad[i] * p.clip;
      p.scaled_quad = scaled;
    }
  }
  s.geometry = g;
  return absl::OkStatus();
}

void TopKEfCodec::ApplyDecode(const DecodeCall& call, CodecScratch* scratch) const {
  TopKDecodeScratch& s = static_cast<TopKDecodeScratch&>(*scratch);
  const ChunkGeometry& g = s.geometry;
  const DecodeOptions& options = call.options;
  const TensorView& out = call.out;
  const absl::Span<const PayloadInfo> payloads = call.infos;
  // Phase 2: aggregate chunk by chunk (each chunk's accumulator stays in L1). The dense finish
  // writes every position of every chunk (chunks tile the tensor), zeros included; the sparse
  // one only the selected positions, so the output is cleared first.
  float* o = out.data_as<float>();
  const bool dense = UseDenseFinish(s.topk, g);
  if (!options.accumulate && out.num_elements() > 0 && (!dense || g.num_chunks == 0)) {
    std::memset(o, 0, static_cast<size_t>(out.num_elements()) * sizeof(float));
  }
  if (g.num_chunks == 0) return;
  if (s.acc.size() < static_cast<size_t>(g.chunk_len)) {
    s.acc.assign(kTopKReferenceChunk, -0.0f);  // -0 + v == v for every v, -0 included
    s.count.assign(kTopKReferenceChunk, 0);
    s.values.resize(kTopKReferenceChunk);
    s.touched.resize(kTopKReferenceChunk);
  }
  if (dense && UseStagedFinish(g, options.accumulate) &&
      s.strip.size() < static_cast<size_t>(g.h * StripStride(g))) {
    s.strip.resize(static_cast<size_t>(g.h * StripStride(g)));
  }
  if (!dense) BuildLocalOffsets(g, &s.local_offset);  // the dense finish walks the block's rows
  switch (options.aggregation) {
    case Aggregation::kSparseLoCoMean:
      Scatter<Aggregation::kSparseLoCoMean>(options.accumulate, g, payloads, s, o);
      break;
    case Aggregation::kMean:
      Scatter<Aggregation::kMean>(options.accumulate, g, payloads, s, o);
      break;
    case Aggregation::kSum:
      Scatter<Aggregation::kSum>(options.accumulate, g, payloads, s, o);
      break;
  }
}

absl::Status TopKEfCodec::Inspect(const PayloadInfo& info, PayloadSummary* summary) const {
  LBCC_ASSIGN_OR_RETURN(TopKEfHeader h, ParseTopKEfHeader(info));
  std::vector<uint16_t> indices(static_cast<size_t>(h.layout.count()));
  LBCC_RETURN_IF_ERROR(
      h.indices == IndexCoding::kAdaptive
          ? DecodeAdaptive(h.index_section, h.layout, h.adaptive, absl::MakeSpan(indices))
          : DecodePacked12(h.index_section, h.layout, absl::MakeSpan(indices)));
  ValueDecoder values;
  LBCC_RETURN_IF_ERROR(values.Init(h.values, h.value_params, h.value_section, h.layout.count()));
  summary->k_per_chunk = h.layout.k;
  summary->selected = h.layout.count();
  const ChunkGeometry& g = h.geometry;
  summary->details = absl::StrFormat(
      "matrix %dx%d in %d chunks of %dx%d, k %d per chunk (density %.4f%%), values %s "
      "(%d bytes), indices %s (%d bytes%s)",
      g.rows, g.cols, g.num_chunks, g.h, g.w, h.layout.k,
      g.num_elements > 0 ? 100.0 * summary->selected / g.num_elements : 0.0,
      std::string(ValueCodingName(h.values)), h.value_section.size() + h.value_params.size(),
      std::string(IndexCodingName(h.indices)), h.index_section.size(),
      h.indices == IndexCoding::kAdaptive
          ? absl::StrFormat(", sub-blocks of %d, Rice %d", 1 << h.adaptive.sub_block_log2,
                            h.adaptive.rice)
          : std::string());
  return absl::OkStatus();
}

float DecodedNorm(const ValueDecoder& values, int64_t count, float* scratch) {
  double sum = 0;
  for (int64_t first = 0; first < count; first += kTopKReferenceChunk) {
    const int64_t n = std::min<int64_t>(kTopKReferenceChunk, count - first);
    values.Decode(first, n, scratch);
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(scratch[i]) * scratch[i];
  }
  return static_cast<float>(std::sqrt(sum));
}

void MedianNormClipFactors(absl::Span<const float> norms, absl::Span<float> factors) {
  LBCC_DCHECK(norms.size() == factors.size() && !norms.empty());
  std::copy(norms.begin(), norms.end(), factors.begin());
  std::sort(factors.begin(), factors.end());
  const float median = factors[(factors.size() - 1) / 2];  // torch.median: the lower one
  for (size_t r = 0; r < norms.size(); ++r) {
    const float q = median / (norms[r] + 1e-8f);
    factors[r] = q < 1.0f ? q : 1.0f;
  }
}

bool TopKEfCodec::ClipsToMedianNorm() const { return true; }


}  // namespace lbcc::codecs
