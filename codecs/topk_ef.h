// TopK-EF: chunked top-k with error feedback, SparseLoCo's pseudo-gradient compressor.
//
// Per tensor and round, with e the error-feedback buffer held by a TopKEfState:
//   1. e' = (beta * e) + (lr * delta)          fp32: two products, then the sum, no FMA
//   2. chunk e' (chunking.h) and select in each chunk the k entries of largest |e'|; ties go to
//      the lower local position (row-major within the chunk), so the selection is a function
//      of the values alone, whatever the SIMD level or the order of work
//   3. code the selected values (value_coding.h: SparseLoCo's 2-bit bin-mean by default) and
//      their positions (index_coding.h: 12-bit or adaptive)
//   4. e_new = e' - v_hat at the selected positions (fp32 subtraction of the decoder's exact
//      reconstruction v_hat), e_new = e' elsewhere; so e_new + v_hat == e' up to that one
//      rounding, and bitwise e_new == fl(fl(fl(beta * e) + fl(lr * delta)) - v_hat)
// SparseLoCo-compatible mode is the default options (top_k 64 per 4096, beta 0.95, lr 1,
// 2-bit bin-mean values with range 6 sigma); the index coding does not change the result.
//
// Two-phase update: Encode() writes e_new into the state's pending buffer and leaves the
// committed buffer as it was; Commit() makes e_new the state (a pointer swap), Abort() drops it.
// Encode() refuses to run while an update is pending (FailedPrecondition).
//
// NaN, infinity and overflow: a delta with a non-finite entry, or an e' of magnitude above
// kMaxEncodableMagnitude (2^100), is InvalidArgument; the state is untouched and nothing is
// pending. The bound keeps every later step finite: the bin-mean's centred values (<= 2 max|e'|)
// and reconstructions (<= 3 max|e'|), and a decode's sum over up to 65535 payloads (< 2^16
// times 3 * 2^100 < FLT_MAX = 2^128), so a decode never turns finite payloads into +-inf.
//
// SparseLoCo compatibility (TopKEfOptions::k_rule, chunk_1d; chunking.h): k_rule kProportional
// (the default) scales k with the chunk's length; kPerChunk is templar's (the production
// trainer's) rule, top_k values in every chunk. chunk_1d kLbcc (the default) and kTemplar
// chunk a 1-D tensor into rows of edge(N) <= 64 elements (the two rules coincide today; both
// names stay so that a caller asking for templar's keeps it if LBCC's default changes);
// kFlat4096 into 4096-element chunks. Ties at the k-th magnitude: the lower local position
// wins (torch.topk leaves it unspecified).
//
// Payload (codec id kTopKEf, dtype f32, the tensor's shape), params, little-endian:
//   u32 k per chunk | u8 value coding | u8 index coding (1 packed12, 2 adaptive) |
//   u8 sub-block log2 (adaptive; else 0) | u8 Rice parameter (adaptive; else 0) |
//   u64 index section bytes | [version 2 only: u8 chunking (chunking.h Chunking)] |
//   value coding params (value_coding.h)
// Version 1 (no chunking byte: Chunking::kShapeAware) is written whenever the tensor's
// geometry is the shape-aware one, so every payload of the default options and of k_rule
// kPerChunk is byte-for-byte what earlier builds wrote; version 2 only when kFlat4096 chunks a
// 1-D tensor differently. Decoders read both. The k rule needs no field: k is in the header.
// Body: index section, then value section. The chunk geometry follows from the shape (and the
// chunking byte).
//
// Performance: one pass streams e, delta and the pending buffer (like a triad); selection runs
// on cache-resident groups of chunks with AVX2 (compaction against a threshold carried from
// chunk to chunk, then an exact threshold search on the few candidates). One thread per call;
// encode different tensors on different threads. Decode-accumulate validates and unpacks every
// payload's indices first (AVX2 12-bit unpack and one-pass run check; adaptive sub-blocks of
// <= 2 offsets without data-dependent branches), then per chunk adds the payloads' values in
// rank order into an L1-resident accumulator (2-bit codes looked up four per byte) and finishes
// the 64 x 64 block 16 positions per AVX2 step (power-of-two counts by exact reciprocal); an
// output added to and >= 8 MiB is finished through a staged strip of a whole block row that is
// then added row by row (sequential output).
//
// Streamed encode (EncodeStreamed): the index section is coded group by group as the selection
// proceeds and its final bytes reported to the observer; the coding is chosen from the first
// group's selection (auto: the shorter there; recoded as packed12, with Discard(), if adaptive
// ends longer than packed12 over the tensor). The values and the header come at the end.
//
// Thread-safety: TopKEfCodec is immutable and shareable; a TopKEfState belongs to one thread at
// a time.
#ifndef LBCC_CODECS_TOPK_EF_H_
#define LBCC_CODECS_TOPK_EF_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/tensor_view.h"
#include "codecs/chunking.h"
#include "codecs/codec.h"
#include "codecs/index_coding.h"
#include "codecs/value_coding.h"

namespace lbcc::codecs {

inline constexpr uint8_t kTopKEfVersion = 1;         // shape-aware chunking
inline constexpr uint8_t kTopKEfVersionChunking = 2;  // with the chunking byte
inline constexpr float kMaxEncodableMagnitude = 0x1p100f;  // largest |beta * e + lr * delta|

// How TopK-EF chunks a 1-D tensor (see the module comment).
enum class Chunk1D : uint8_t { kLbcc = 0, kTemplar = 1, kFlat4096 = 2 };
// "lbcc", "templar", "flat4096".
absl::string_view Chunk1DName(Chunk1D rule);
// The names above; InvalidArgument otherwise.
absl::StatusOr<Chunk1D> ParseChunk1D(absl::string_view name);

struct TopKEfOptions {
  // kProportional: selected per 4096 elements (= density * 4096), in (0, 4096].
  // kPerChunk: selected in every chunk (templar's topk_compression), a whole number in
  // [1, 4096].
  double top_k = 64;
  float beta = 0.95f;  // error decay
  float lr = 1.0f;     // outer learning rate, applied before compression
  ValueCoding values = ValueCoding::kBinMean2;
  IndexCoding indices = IndexCoding::kAuto;
  float range_sigmas = 6.0f;  // bin-mean range
  int64_t value_block = 64;   // absmax codings: selected values per scale, [1, 2^20]
  KRule k_rule = KRule::kProportional;
  Chunk1D chunk_1d = Chunk1D::kLbcc;

  static TopKEfOptions FromDensity(double density) {
    TopKEfOptions o;
    o.top_k = density * kTopKReferenceChunk;
    return o;
  }
  // The options templar (the production SparseLoCo trainer) runs: top_k per chunk (64),
  // beta 0.95, lr 1, 2-bit bin-mean values, range 6 sigma, its 1-D chunking.
  static TopKEfOptions Templar(double top_k = 64) {
    TopKEfOptions o;
    o.top_k = top_k;
    o.k_rule = KRule::kPerChunk;
    o.chunk_1d = Chunk1D::kTemplar;
    return o;
  }
  // The chunking these options give a tensor of `shape` (kFlat1D only where it changes the
  // geometry), its geometry and k per chunk (0 for an empty tensor). InvalidArgument for a bad
  // shape.
  Chunking ChunkingFor(absl::Span<const int64_t> shape) const;
  absl::StatusOr<ChunkGeometry> Geometry(absl::Span<const int64_t> shape) const;
  int64_t KFor(const ChunkGeometry& g) const;
  // InvalidArgument naming the bad field.
  absl::Status Validate() const;
  std::string ToString() const;
};

namespace internal {
struct TopKEfEncoder;  // topk_ef.cc: the encode's steps
}  // namespace internal

class TopKEfState final : public CodecState {
 public:
  TopKEfState() = default;
  TopKEfState(const TopKEfState&) = delete;
  TopKEfState& operator=(const TopKEfState&) = delete;

  // Fixes the tensor's shape and zeroes e (drops a pending update). InvalidArgument for a bad
  // shape. A state that was never reset takes the shape of its first Encode().
  absl::Status Reset(absl::Span<const int64_t> shape);
  // Reset(shape), then e = error (e.g. from a checkpoint). InvalidArgument on a size mismatch
  // or a non-finite entry.
  absl::Status Load(absl::Span<const int64_t> shape, absl::Span<const float> error);

  bool initialized() const { return initialized_; }
  const Shape& shape() const { return shape_; }
  // The committed buffer e; valid until the next Reset/Load/Commit.
  absl::Span<const float> error() const { return error_; }
  // The pending e_new; empty unless has_pending().
  absl::Span<const float> pending_error() const {
    return pending_ ? absl::Span<const float>(next_) : absl::Span<const float>();
  }

  CodecId codec() const override { return CodecId::kTopKEf; }
  bool has_pending() const override { return pending_; }
  absl::Status Commit() override;
  absl::Status Abort() override;

 private:
  friend class TopKEfCodec;
  friend struct internal::TopKEfEncoder;

  bool initialized_ = false;
  bool pending_ = false;
  Shape shape_;
  // The chunking the encoder uses (the codec's options decide it; Reset picks the shape-aware
  // one). e is stored in the tensor's layout, so a change of chunking keeps it.
  void SetGeometry(const ChunkGeometry& g);

  ChunkGeometry geometry_;
  std::vector<float> error_;  // committed e
  std::vector<float> next_;   // pending e_new (same size; swapped on Commit)
  // Encoder scratch, grown on first use and reused.
  std::vector<int64_t> local_offset_;  // local position -> offset from the chunk's corner
  std::vector<uint16_t> sel_local_;
  std::vector<float> sel_value_;
  std::vector<float> centered_;
  std::vector<uint8_t> codes_;
  std::vector<uint32_t> cand_idx_;
  std::vector<uint32_t> cand_bits_;
  std::vector<uint32_t> sel_idx_;
  std::vector<uint32_t> sel_bits_;
  std::vector<uint8_t> index_scratch_;  // the streamed encode's index section
  uint32_t hint_ = 0;  // threshold guess carried between chunks (speed only)
};

class TopKEfCodec final : public Codec {
 public:
  // InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<TopKEfCodec>> Create(const TopKEfOptions& options);

  const TopKEfOptions& options() const { return options_; }
  CodecId id() const override { return CodecId::kTopKEf; }
  std::string Describe() const override;
  absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t> shape) const override;
  std::unique_ptr<CodecState> NewState() const override;
  // `state` must be a TopKEfState (InvalidArgument otherwise). See codec.h for the rest.
  absl::StatusOr<size_t> Encode(const TensorView& delta, CodecState* state,
                                absl::Span<uint8_t> out) const override;
  // Streams the index section (the bulk of the payload) group of chunks by group of chunks
  // while the selection runs; the values follow at the end (the quantizer needs every selected
  // value). The coding is chosen from the first group's selection (module comment), so the
  // payload may differ from Encode()'s in its index coding only.
  absl::StatusOr<size_t> EncodeStreamed(const TensorView& delta, CodecState* state,
                                        absl::Span<uint8_t> out,
                                        EncodeObserver* observer) const override;

  // Decode-accumulate (module comment): Prepare validates every payload and unpacks its indices
  // into the scratch; Apply aggregates chunk by chunk.
  std::unique_ptr<CodecScratch> NewDecodeScratch() const override;
  absl::Status PrepareDecode(const DecodeCall& call, CodecScratch* scratch) const override;
  void ApplyDecode(const DecodeCall& call, CodecScratch* scratch) const override;
  absl::Status Inspect(const PayloadInfo& info, PayloadSummary* summary) const override;
  // Honours DecodeOptions::clip_to_median_norm (topk_ef.h: MedianNormClipFactors).
  bool ClipsToMedianNorm() const override;

 private:
  explicit TopKEfCodec(const TopKEfOptions& options) : options_(options) {}
  absl::StatusOr<size_t> EncodeImpl(const TensorView& delta, CodecState* state,
                                    absl::Span<uint8_t> out, EncodeObserver* observer) const;
  TopKEfOptions options_;
};

// The parsed params of a TopK-EF payload (for decoders, tools and tests).
struct TopKEfHeader {
  int version = kTopKEfVersion;
  Chunking chunking = Chunking::kShapeAware;
  ChunkGeometry geometry;
  IndexLayout layout;
  ValueCoding values = ValueCoding::kBinMean2;
  IndexCoding indices = IndexCoding::kPacked12;
  AdaptiveParams adaptive;
  absl::Span<const uint8_t> value_params;
  absl::Span<const uint8_t> index_section;
  absl::Span<const uint8_t> value_section;
};
// Validates a parsed envelope as TopK-EF (version 1 or 2) params and body lengths. DataLoss
// otherwise.
absl::StatusOr<TopKEfHeader> ParseTopKEfHeader(const PayloadInfo& info);

// templar's median-norm clip (DecodeOptions::clip_to_median_norm), shared by the CPU decoder
// and its device twin so that every rank and device computes the same bits from the payloads
// alone:
//   norm_r   = fp32(sqrt(sum of v_hat^2)) over payload r's decoded values, squares and sum in
//              double, in payload order
//   median   = the lower median of the norms (torch.median: element (R - 1) / 2 of the sorted
//              norms)
//   factor_r = min(1, median / (norm_r + 1e-8f))   fp32 operations
// Each decoded value of payload r is then multiplied by factor_r (fp32) before the
// aggregation. A factor of exactly 1 leaves the values' bits as they are.
// `scratch` holds 4096 floats; `values` decodes `count` values.
float DecodedNorm(const ValueDecoder& values, int64_t count, float* scratch);
// factors[r] from norms[r] (same sizes, >= 1 entry).
void MedianNormClipFactors(absl::Span<const float> norms, absl::Span<float> factors);

// The fixed params of a payload (module comment), as every TopK-EF encoder (this CPU codec and
// its device twin in kernels/) writes them.
struct TopKEfFixedParams {
  int64_t k = 0;
  ValueCoding values = ValueCoding::kBinMean2;
  IndexCoding indices = IndexCoding::kPacked12;  // kPacked12 or kAdaptive
  AdaptiveParams adaptive;                        // written for kAdaptive (else zeros)
  uint64_t index_bytes = 0;
  Chunking chunking = Chunking::kShapeAware;  // anything else: version 2, the chunking byte
};
// Bytes of the fixed params: 16, or 17 with the chunking byte.
size_t TopKEfFixedParamBytes(Chunking chunking);
// Begins a payload of `shape` in `out` through `writer`: the envelope (version 1 or 2 from the
// chunking) and the fixed params. The value coding's `value_param_bytes` params follow at
// writer->params().subspan(TopKEfFixedParamBytes(p.chunking)); the body holds p.index_bytes of
// index section, then `value_bytes` of values. InvalidArgument as PayloadWriter::Begin.
absl::Status BeginTopKEfPayload(const TopKEfFixedParams& p, absl::Span<const int64_t> shape,
                                size_t value_param_bytes, size_t value_bytes,
                                absl::Span<uint8_t> out, PayloadWriter* writer);

namespace internal {
absl::Status StillPending();
absl::Status ShapeDiffers(absl::Span<const int64_t> shape, absl::Span<const int64_t> state_shape);
absl::Status NothingPending(absl::string_view what);
}  // namespace internal

// The checks every TopK-EF encoder (this CPU codec, kernels/) makes of a tensor's state before
// it touches it, in this order: FailedPrecondition while an update is pending; a state never
// reset takes `shape` (State::Reset), one of another shape is InvalidArgument; an `out` smaller
// than codec.MaxEncodedBytes(shape) is InvalidArgument. State: TopKEfState or its device twin.
template <typename State>
absl::Status PrepareTopKEfState(const TopKEfCodec& codec, State& state,
                                absl::Span<const int64_t> shape, size_t out_size) {
  if (state.has_pending()) return internal::StillPending();
  if (!state.initialized()) {
    if (absl::Status s = state.Reset(shape); !s.ok()) return s;
  } else if (!std::equal(state.shape().begin(), state.shape().end(), shape.begin(),
                         shape.end())) {
    return internal::ShapeDiffers(shape, state.shape());
  }
  absl::StatusOr<size_t> max_bytes = codec.MaxEncodedBytes(shape);
  if (!max_bytes.ok()) return max_bytes.status();
  if (out_size < *max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("topk_ef: output buffer holds ", out_size,
                                                   " bytes, MaxEncodedBytes is ", *max_bytes));
  }
  return absl::OkStatus();
}

// Commit / Abort of the double-buffered error feedback (e and the pending e_new), for
// TopKEfState and its device twin: Commit makes e_new the state by swapping the two buffers,
// Abort drops it; FailedPrecondition when nothing is pending.
template <typename Buffer>
absl::Status CommitPendingError(bool& pending, Buffer& error, Buffer& next) {
  if (!pending) return internal::NothingPending("commit");
  using std::swap;
  swap(error, next);
  pending = false;
  return absl::OkStatus();
}
inline absl::Status AbortPendingError(bool& pending) {
  if (!pending) return internal::NothingPending("abort");
  pending = false;
  return absl::OkStatus();
}

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_TOPK_EF_H_
