#include "codecs/topk_ef.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "codecs/cpu_kernels.h"
#include "codecs/codec_registry.h"
#include "codecs/payload.h"

namespace lbcc::codecs {
namespace {

// Elements one EF-update group streams (1 MiB of e' per group: a strip of 64 rows of a
// 4096-wide matrix). Long contiguous rows keep the hardware prefetchers streaming; the group's
// chunks are then selected while e' is still in L2/L3. Shorter groups measured slower.
constexpr int64_t kGroupElements = 262144;
// The next chunk's compaction threshold is this fraction of the last chunk's exact threshold:
// a few more candidates than k on smooth data, sometimes fewer (then it lowers and retries);
// 0.95 measured faster than 0.8 or 0.9 on 4096 x 4096.
constexpr float kHintFactor = 0.95f;
constexpr size_t kFixedParamBytes = 16;  // version 1; version 2 adds the chunking byte
// |v| bits of kMaxEncodableMagnitude: e' entries above are refused (topk_ef.h).
constexpr uint32_t kMaxEncodableAbsBits = 0x71800000u;  // 2^100
constexpr int64_t kMaxPayloads = 65535;  // selection counts are 16-bit
// Outputs at least this large are written with non-temporal stores when not accumulated into
// (skipping the read for ownership pays: BM_TopKEfDecodeAssign4, docs/codecs.md).
constexpr int64_t kStreamOutputBytes = int64_t{1} << 20;

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt topk_ef payload: ", what));
}

uint32_t AbsBitsOf(float x) { return FloatBits(x) & kAbsMask; }

int64_t ChunkCorner(const ChunkGeometry& g, int64_t c) {
  const int64_t y = c / g.chunks_x, x = c - y * g.chunks_x;
  return y * g.h * g.cols + x * g.w;
}

void BuildLocalOffsets(const ChunkGeometry& g, std::vector<int64_t>* out) {
  out->resize(static_cast<size_t>(g.chunk_len));
  int64_t* o = out->data();
  for (int64_t r = 0; r < g.h; ++r) {
    for (int64_t x = 0; x < g.w; ++x) *o++ = r * g.cols + x;
  }
}

// Lowers a threshold (|v| bits) after a chunk had fewer than k candidates: by 10 %, then 19 %,
// 34 %, ... (the factor squares on each retry), so a badly stale guess costs a few passes.
uint32_t LowerThreshold(uint32_t thr, float* factor) {
  const uint32_t lowered = AbsBitsOf(BitsToFloat(thr) * *factor);
  *factor *= *factor;
  return lowered < thr ? lowered : 0;
}

// Selects the k entries of largest |v| of the chunk at `block` (ties: lower local position),
// writing local positions (ascending) and values. `cand_*` and `sel_*` are scratch of
// chunk_len + 8 entries; out_idx / out_val hold k entries.
void SelectChunk(const CpuKernels& kern, const float* block, const ChunkGeometry& g, int64_t k,
                 const int64_t* local_offset, uint32_t* cand_idx, uint32_t* cand_bits,
                 uint32_t* sel_idx, uint32_t* sel_bits, uint16_t* out_idx, float* out_val,
                 uint32_t* hint) {
  const int64_t n = g.chunk_len;
  if (k >= n) {
    for (int64_t l = 0; l < n; ++l) {
      out_idx[l] = static_cast<uint16_t>(l);
      out_val[l] = block[local_offset[l]];
    }
    return;
  }
  uint32_t thr = *hint, max_abs = 0;
  float factor = 0.9f;
  int64_t m;
  for (;;) {
    m = kern.compact(block, g.cols, g.h, g.w, thr, cand_idx, cand_bits, &max_abs);
    if (m >= k) break;
    thr = LowerThreshold(thr, &factor);
  }
  // T = the k-th largest |v|: the largest t with count(|v| >= t) >= k, t in [thr, max_abs].
  int64_t count_lo = m, count_hi = 0;
  const uint32_t t = kern.kth_largest(cand_bits, m, k, thr, max_abs + 1, &count_lo, &count_hi);
  if (count_lo == k) {
    // No tie at the threshold to break: everything >= T, in order.
    const int64_t taken = kern.filter_ge(cand_idx, cand_bits, m, t, sel_idx, sel_bits);
    LBCC_DCHECK(taken == k);
    (void)taken;
  } else {
    // count_hi entries are > T; the first k - count_hi entries equal to T complete the set.
    int64_t need_eq = k - count_hi, j = 0;
    for (int64_t i = 0; i < m; ++i) {
      const uint32_t a = cand_bits[i] & kAbsMask;
      const bool eq = a == t;
      const bool take = (a > t) | (eq & (need_eq > 0));
      need_eq -= static_cast<int64_t>(eq & take);
      sel_idx[j] = cand_idx[i];
      sel_bits[j] = cand_bits[i];
      j += take;
    }
    LBCC_DCHECK(j == k);
  }
  for (int64_t j = 0; j < k; ++j) {
    out_idx[j] = static_cast<uint16_t>(sel_idx[j]);
    out_val[j] = BitsToFloat(sel_bits[j]);
  }
  *hint = AbsBitsOf(BitsToFloat(t) * kHintFactor);
}

template <typename T>
void Grow(std::vector<T>* v, size_t n) {
  if (v->size() < n) v->resize(n);
}

// The streamed encode's index section, coded while the selection proceeds. The coding is fixed
// after the first group of chunks: packed12 when asked for, adaptive with the b and p that
// ChooseAdaptive picks for those chunks, and for auto the shorter of the two on them. Should
// auto's adaptive section come out longer than packed12 over the whole tensor (the output
// buffer holds packed12's), Finish() recodes it as packed12 and tells the observer to discard.
class IndexStream {
 public:
  IndexStream(IndexCoding requested, const IndexLayout& layout, absl::Span<uint8_t> scratch,
              EncodeObserver* observer)
      : requested_(requested), layout_(layout), scratch_(scratch), observer_(observer) {}

  // The selection of chunks [0, end_chunk) is in `local_all`: codes the new chunks and reports
  // the bytes that became final.
  void Advance(const std::vector<uint16_t>& local_all, int64_t end_chunk) {
    const absl::Span<const uint16_t> local(local_all.data(),
                                           static_cast<size_t>(layout_.count()));
    if (!coding_.has_value()) Choose(local, end_chunk);
    size_t final_bytes;
    if (*coding_ == IndexCoding::kAdaptive) {
      adaptive_->EncodeChunks(local, end_chunk);
      final_bytes = adaptive_->final_bytes();
    } else {
      // Pairs of indices code into 3 bytes each; an odd tail waits for the last chunk.
      int64_t upto = end_chunk * layout_.k;
      if (end_chunk < layout_.num_chunks) upto &= ~int64_t{1};
      if (upto > packed_done_) {
        EncodePacked12(local.subspan(static_cast<size_t>(packed_done_),
                                     static_cast<size_t>(upto - packed_done_)),
                       scratch_.subspan(static_cast<size_t>(packed_done_ / 2 * 3),
                                        Packed12Bytes(upto - packed_done_)));
        packed_done_ = upto;
      }
      final_bytes = Packed12Bytes(packed_done_);
    }
    if (final_bytes > appended_) {
      observer_->Append(scratch_.subspan(appended_, final_bytes - appended_));
      appended_ = final_bytes;
    }
  }

  // After the last chunk: the coding, its params and the section's bytes (in the scratch).
  IndexCoding Finish(const std::vector<uint16_t>& local_all, AdaptiveParams* params,
                     size_t* bytes) {
    if (*coding_ == IndexCoding::kAdaptive) {
      *params = params_;
      *bytes = adaptive_->Finish();
      if (requested_ != IndexCoding::kAuto || *bytes <= Packed12Bytes(layout_.count())) {
        return IndexCoding::kAdaptive;
      }
      observer_->Discard();
      coding_ = IndexCoding::kPacked12;
      packed_done_ = 0;
      appended_ = 0;  // the whole section again, as packed12, not reported
    }
    *bytes = Packed12Bytes(layout_.count());
    if (packed_done_ < layout_.count()) {
      const int64_t start = packed_done_;
      EncodePacked12(absl::MakeConstSpan(local_all.data() + start,
                                         static_cast<size_t>(layout_.count() - start)),
                     scratch_.subspan(static_cast<size_t>(start / 2 * 3),
                                      Packed12Bytes(layout_.count() - start)));
    }
    return IndexCoding::kPacked12;
  }

 private:
  void Choose(absl::Span<const uint16_t> local, int64_t end_chunk) {
    coding_ = requested_;
    if (requested_ == IndexCoding::kPacked12) return;
    const IndexLayout prefix{end_chunk, layout_.k, layout_.chunk_len};
    const AdaptiveChoice choice =
        ChooseAdaptive(local.subspan(0, static_cast<size_t>(prefix.count())), prefix);
    if (requested_ == IndexCoding::kAuto &&
        choice.bits >= static_cast<uint64_t>(prefix.count()) * 12) {
      coding_ = IndexCoding::kPacked12;
      return;
    }
    coding_ = IndexCoding::kAdaptive;
    params_ = choice.params;
    adaptive_.emplace(layout_, params_, scratch_);
  }

  const IndexCoding requested_;
  const IndexLayout layout_;
  const absl::Span<uint8_t> scratch_;
  EncodeObserver* const observer_;
  std::optional<IndexCoding> coding_;
  AdaptiveParams params_;
  std::optional<AdaptiveIndexEncoder> adaptive_;
  int64_t packed_done_ = 0;  // indices coded as packed12
  size_t appended_ = 0;      // scratch bytes reported
};

size_t FixedParamBytes(Chunking chunking) {
  return chunking == Chunking::kShapeAware ? kFixedParamBytes : kFixedParamBytes + 1;
}

}  // namespace

absl::string_view Chunk1DName(Chunk1D rule) {
  switch (rule) {
    case Chunk1D::kLbcc:
      return "lbcc";
    case Chunk1D::kTemplar:
      return "templar";
    case Chunk1D::kFlat4096:
      return "flat4096";
  }
  return "unknown";
}

absl::StatusOr<Chunk1D> ParseChunk1D(absl::string_view name) {
  for (Chunk1D r : {Chunk1D::kLbcc, Chunk1D::kTemplar, Chunk1D::kFlat4096}) {
    if (name == Chunk1DName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown chunk_1d '", name, "' (expected lbcc, templar or flat4096)"));
}

Chunking TopKEfOptions::ChunkingFor(absl::Span<const int64_t> shape) const {
  if (chunk_1d != Chunk1D::kFlat4096 || shape.size() != 1 || shape[0] <= 0) {
    return Chunking::kShapeAware;
  }
  return ChunkEdge(shape[0], kFlatChunkTarget) != ChunkEdge(shape[0]) ? Chunking::kFlat1D
                                                                      : Chunking::kShapeAware;
}

absl::StatusOr<ChunkGeometry> TopKEfOptions::Geometry(absl::Span<const int64_t> shape) const {
  return MakeChunkGeometry(shape, ChunkingFor(shape));
}

int64_t TopKEfOptions::KFor(const ChunkGeometry& g) const {
  return g.num_chunks > 0 ? KPerChunk(g.chunk_len, top_k, k_rule) : 0;
}

absl::Status TopKEfOptions::Validate() const {
  if (k_rule != KRule::kProportional && k_rule != KRule::kPerChunk) {
    return absl::InvalidArgumentError(
        absl::StrCat("topk_ef: unknown k_rule ", static_cast<int>(k_rule)));
  }
  if (chunk_1d != Chunk1D::kLbcc && chunk_1d != Chunk1D::kTemplar &&
      chunk_1d != Chunk1D::kFlat4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("topk_ef: unknown chunk_1d ", static_cast<int>(chunk_1d)));
  }
  if (k_rule == KRule::kPerChunk) {
    if (!(top_k >= 1 && top_k <= kTopKReferenceChunk && top_k == std::floor(top_k))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topk_ef: top_k ", top_k, " must be a whole number in [1, 4096] with k_rule per_chunk "
          "(values per chunk)"));
    }
  } else if (!(top_k > 0 && top_k <= kTopKReferenceChunk)) {
    return absl::InvalidArgumentError(
        absl::StrCat("topk_ef: top_k ", top_k, " must be in (0, 4096] (per 4096 elements)"));
  }
  if (!std::isfinite(beta)) return absl::InvalidArgumentError("topk_ef: beta must be finite");
  if (!std::isfinite(lr)) return absl::InvalidArgumentError("topk_ef: lr must be finite");
  if (!IsValidValueCoding(static_cast<uint8_t>(values))) {
    return absl::InvalidArgumentError("topk_ef: unknown value coding");
  }
  if (indices != IndexCoding::kAuto && indices != IndexCoding::kPacked12 &&
      indices != IndexCoding::kAdaptive) {
    return absl::InvalidArgumentError("topk_ef: unknown index coding");
  }
  if (!(range_sigmas > 0) || !std::isfinite(range_sigmas)) {
    return absl::InvalidArgumentError("topk_ef: range_sigmas must be finite and > 0");
  }
  if (value_block < 1 || value_block > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError("topk_ef: value_block must be in [1, 2^20]");
  }
  return absl::OkStatus();
}

std::string TopKEfOptions::ToString() const {
  return absl::StrFormat(
      "topk_ef(top_k=%g, beta=%g, lr=%g, values=%s, indices=%s, range_sigmas=%g, "
      "value_block=%d, k_rule=%s, chunk_1d=%s)",
      top_k, beta, lr, std::string(ValueCodingName(values)), std::string(IndexCodingName(indices)),
      range_sigmas, value_block, std::string(KRuleName(k_rule)),
      std::string(Chunk1DName(chunk_1d)));
}

absl::Status TopKEfState::Reset(absl::Span<const int64_t> shape) {
  LBCC_ASSIGN_OR_RETURN(ChunkGeometry g, MakeChunkGeometry(shape));
  shape_.assign(shape.begin(), shape.end());
  error_.assign(static_cast<size_t>(g.num_elements), 0.0f);
  next_.assign(static_cast<size_t>(g.num_elements), 0.0f);
  SetGeometry(g);
  pending_ = false;
  initialized_ = true;
  return absl::OkStatus();
}

void TopKEfState::SetGeometry(const ChunkGeometry& g) {
  geometry_ = g;
  if (g.num_chunks > 0) BuildLocalOffsets(g, &local_offset_);
  hint_ = 0;
}

absl::Status TopKEfState::Load(absl::Span<const int64_t> shape, absl::Span<const float> error) {
  LBCC_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  if (static_cast<int64_t>(error.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("topk_ef state: ", error.size(), " values for shape ", ShapeToString(shape)));
  }
  for (size_t i = 0; i < error.size(); ++i) {
    if (!std::isfinite(error[i])) {
      return absl::InvalidArgumentError(absl::StrCat("topk_ef state: entry ", i, " is not finite"));
    }
  }
  LBCC_RETURN_IF_ERROR(Reset(shape));
  std::copy(error.begin(), error.end(), error_.begin());
  return absl::OkStatus();
}

absl::Status TopKEfState::Commit() {
  if (!pending_) return absl::FailedPreconditionError("topk_ef state: nothing to commit");
  std::swap(error_, next_);
  pending_ = false;
  return absl::OkStatus();
}

absl::Status TopKEfState::Abort() {
  if (!pending_) return absl::FailedPreconditionError("topk_ef state: nothing to abort");
  pending_ = false;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TopKEfCodec>> TopKEfCodec::Create(const TopKEfOptions& options) {
  LBCC_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<TopKEfCodec>(new TopKEfCodec(options));
}

std::string TopKEfCodec::Describe() const { return options_.ToString(); }

std::unique_ptr<CodecState> TopKEfCodec::NewState() const {
  return std::make_unique<TopKEfState>();
}

absl::StatusOr<size_t> TopKEfCodec::MaxEncodedBytes(absl::Span<const int64_t> shape) const {
  LBCC_ASSIGN_OR_RETURN(ChunkGeometry g, options_.Geometry(shape));
  const int64_t k = options_.KFor(g);
  const IndexLayout layout{g.num_chunks, k, g.chunk_len};
  size_t index_bytes = Packed12Bytes(layout.count());
  if (options_.indices == IndexCoding::kAdaptive) index_bytes = AdaptiveMaxBytes(layout);
  const size_t params =
      FixedParamBytes(options_.ChunkingFor(shape)) + ValueParamBytes(options_.values);
  const size_t body =
      index_bytes + ValueSectionBytes(options_.values, layout.count(), options_.value_block);
  return PayloadBytes(shape.size(), params, body);
}

absl::StatusOr<size_t> TopKEfCodec::Encode(const TensorView& delta, CodecState* state_base,
                                           absl::Span<uint8_t> out) const {
  return EncodeImpl(delta, state_base, out, nullptr);
}

absl::StatusOr<size_t> TopKEfCodec::EncodeStreamed(const TensorView& delta,
                                                   CodecState* state_base,
                                                   absl::Span<uint8_t> out,
                                                   EncodeObserver* observer) const {
  return EncodeImpl(delta, state_base, out, observer);
}

absl::StatusOr<size_t> TopKEfCodec::EncodeImpl(const TensorView& delta, CodecState* state_base,
                                               absl::Span<uint8_t> out,
                                               EncodeObserver* observer) const {
  if (state_base == nullptr || state_base->codec() != CodecId::kTopKEf) {
    return absl::InvalidArgumentError("topk_ef: Encode needs the tensor's TopKEfState");
  }
  if (state_base->is_device()) {
    return absl::InvalidArgumentError(
        "topk_ef: a device state (kernels::NewDeviceState) given to the CPU codec: encode a CUDA "
        "tensor with kernels::EncodeOnDevice, or use the codec's NewState()");
  }
  TopKEfState& st = static_cast<TopKEfState&>(*state_base);
  if (!delta.is_host()) {
    return absl::UnimplementedError("topk_ef: the CPU codec encodes host memory only");
  }
  if (delta.dtype() != DType::kF32) {
    return absl::UnimplementedError(
        absl::StrCat("topk_ef: encodes f32 tensors, got ", DTypeName(delta.dtype())));
  }
  if (st.pending_) {
    return absl::FailedPreconditionError(
        "topk_ef: the previous update is still pending; Commit() or Abort() it first");
  }
  if (!st.initialized_) {
    LBCC_RETURN_IF_ERROR(st.Reset(delta.shape()));
  } else if (st.shape_ != delta.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat("topk_ef: delta shape ", ShapeToString(delta.shape()),
                     " differs from the state's ", ShapeToString(st.shape_)));
  }
  LBCC_ASSIGN_OR_RETURN(const size_t max_bytes, MaxEncodedBytes(delta.shape()));
  if (out.size() < max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("topk_ef: output buffer holds ", out.size(),
                                                   " bytes, MaxEncodedBytes is ", max_bytes));
  }
  // The options decide the chunking (a state starts with the shape-aware one).
  const Chunking chunking = options_.ChunkingFor(delta.shape());
  LBCC_ASSIGN_OR_RETURN(const ChunkGeometry wanted, MakeChunkGeometry(delta.shape(), chunking));
  if (wanted.w != st.geometry_.w) st.SetGeometry(wanted);
  const ChunkGeometry& g = st.geometry_;
  const int64_t k = options_.KFor(g);
  const IndexLayout layout{g.num_chunks, k, g.chunk_len};
  const int64_t total = layout.count();
  Grow(&st.sel_local_, static_cast<size_t>(total));
  Grow(&st.sel_value_, static_cast<size_t>(total));
  Grow(&st.centered_, static_cast<size_t>(total));
  Grow(&st.codes_, static_cast<size_t>(total));
  Grow(&st.cand_idx_, static_cast<size_t>(g.chunk_len) + 8);
  Grow(&st.cand_bits_, static_cast<size_t>(g.chunk_len) + 8);
  Grow(&st.sel_idx_, static_cast<size_t>(g.chunk_len) + 8);
  Grow(&st.sel_bits_, static_cast<size_t>(g.chunk_len) + 8);

  // Streamed: the index section is coded group by group into index_scratch_ (the coding chosen
  // from the first group's selection) and its final bytes reported as they appear.
  std::optional<IndexStream> stream;
  if (observer != nullptr && g.num_chunks > 0) {
    Grow(&st.index_scratch_, std::max(Packed12Bytes(total), AdaptiveMaxBytes(layout)));
    stream.emplace(options_.indices, layout, absl::MakeSpan(st.index_scratch_), observer);
  }

  // 1-2. e' = beta * e + lr * delta into the pending buffer, and the selection, group by group.
  const CpuKernels& kern = ActiveKernels();
  const float* e = st.error_.data();
  const float* d = delta.data_as<const float>();
  float* next = st.next_.data();
  const int64_t group =
      g.num_chunks > 0 ? std::clamp<int64_t>(kGroupElements / g.chunk_len, 1, g.chunks_x) : 1;
  for (int64_t y = 0; y < g.chunks_y; ++y) {
    for (int64_t x0 = 0; x0 < g.chunks_x; x0 += group) {
      const int64_t x1 = std::min(g.chunks_x, x0 + group);
      const int64_t len = (x1 - x0) * g.w;
      uint32_t max_bits = 0;
      for (int64_t r = 0; r < g.h; ++r) {
        const int64_t off = (y * g.h + r) * g.cols + x0 * g.w;
        max_bits = std::max(max_bits, kern.ef_update(e + off, d + off, next + off, len,
                                                     options_.beta, options_.lr));
      }
      if (max_bits > kMaxEncodableAbsBits) {
        return absl::InvalidArgumentError(absl::StrCat(
            "topk_ef: delta has a NaN or infinite entry, or |beta * e + lr * delta| exceeds 2^100, "
            "in rows ",
            y * g.h, "..", y * g.h + g.h - 1, "; the state is unchanged"));
      }
      for (int64_t x = x0; x < x1; ++x) {
        const int64_t c = y * g.chunks_x + x;
        SelectChunk(kern, next + ChunkCorner(g, c), g, k, st.local_offset_.data(),
                    st.cand_idx_.data(), st.cand_bits_.data(), st.sel_idx_.data(),
                    st.sel_bits_.data(), st.sel_local_.data() + c * k, st.sel_value_.data() + c * k,
                    &st.hint_);
      }
      if (stream) stream->Advance(st.sel_local_, y * g.chunks_x + x1);
    }
  }

  // 3. Index coding choice, then the payload.
  const absl::Span<const uint16_t> local(st.sel_local_.data(), static_cast<size_t>(total));
  IndexCoding coding = options_.indices;
  AdaptiveChoice adaptive;
  size_t index_bytes = Packed12Bytes(total);
  if (stream) {
    coding = stream->Finish(st.sel_local_, &adaptive.params, &index_bytes);
  } else if (coding != IndexCoding::kPacked12) {
    adaptive = ChooseAdaptive(local, layout);
    const size_t adaptive_bytes = static_cast<size_t>((adaptive.bits + 7) / 8);
    if (coding == IndexCoding::kAuto) {
      coding = adaptive_bytes < index_bytes ? IndexCoding::kAdaptive : IndexCoding::kPacked12;
    }
    if (coding == IndexCoding::kAdaptive) index_bytes = adaptive_bytes;
  }
  const size_t value_param_bytes = ValueParamBytes(options_.values);
  const size_t value_bytes = ValueSectionBytes(options_.values, total, options_.value_block);
  const size_t fixed_param_bytes = FixedParamBytes(chunking);
  PayloadWriter writer;
  LBCC_RETURN_IF_ERROR(writer.Begin(
      out, CodecId::kTopKEf,
      chunking == Chunking::kShapeAware ? kTopKEfVersion : kTopKEfVersionChunking, DType::kF32,
      delta.shape(), fixed_param_bytes + value_param_bytes, index_bytes + value_bytes));
  ByteWriter params(writer.params());
  params.U32(static_cast<uint32_t>(k));
  params.U8(static_cast<uint8_t>(options_.values));
  params.U8(static_cast<uint8_t>(coding));
  params.U8(coding == IndexCoding::kAdaptive ? static_cast<uint8_t>(adaptive.params.sub_block_log2)
                                             : 0);
  params.U8(coding == IndexCoding::kAdaptive ? static_cast<uint8_t>(adaptive.params.rice) : 0);
  params.U64(index_bytes);
  if (chunking != Chunking::kShapeAware) params.U8(static_cast<uint8_t>(chunking));
  const absl::Span<uint8_t> index_section = writer.body().subspan(0, index_bytes);
  if (stream) {
    if (index_bytes > 0) std::memcpy(index_section.data(), st.index_scratch_.data(), index_bytes);
  } else if (coding == IndexCoding::kAdaptive) {
    EncodeAdaptive(local, layout, adaptive.params, index_section);
  } else {
    EncodePacked12(local, index_section);
  }
  const absl::Span<float> values(st.sel_value_.data(), static_cast<size_t>(total));
  EncodeValues(options_.values, ValueEncodeOptions{options_.range_sigmas, options_.value_block},
               values, writer.params().subspan(fixed_param_bytes, value_param_bytes),
               writer.body().subspan(index_bytes, value_bytes),
               absl::MakeSpan(st.centered_.data(), static_cast<size_t>(total)),
               absl::MakeSpan(st.codes_.data(), static_cast<size_t>(total)));
  const size_t size = writer.Finish();

  // 4. e_new = e' - v_hat at the selected positions (values now hold v_hat).
  const int64_t* local_offset = st.local_offset_.data();
  constexpr int64_t kAhead = 4;  // chunks; each chunk's positions span h rows
  for (int64_t c = 0; c < g.num_chunks; ++c) {
    float* corner = next + ChunkCorner(g, c);
    const uint16_t* idx = st.sel_local_.data() + c * k;
    const float* v_hat = st.sel_value_.data() + c * k;
    if (c + kAhead < g.num_chunks) {  // the chunk's rows are far apart: fetch them early
      float* ahead = next + ChunkCorner(g, c + kAhead);
      const uint16_t* ahead_idx = idx + kAhead * k;
      for (int64_t j = 0; j < k; ++j) __builtin_prefetch(ahead + local_offset[ahead_idx[j]], 1);
    }
    for (int64_t j = 0; j < k; ++j) {
      float& slot = corner[local_offset[idx[j]]];
      slot = slot - v_hat[j];
    }
  }
  st.pending_ = true;
  return size;
}

absl::StatusOr<TopKEfHeader> ParseTopKEfHeader(const PayloadInfo& info) {
  if (info.codec != CodecId::kTopKEf) return Corrupt("not a topk_ef payload");
  if (info.codec_version != kTopKEfVersion && info.codec_version != kTopKEfVersionChunking) {
    return Corrupt(absl::StrCat("unknown topk_ef version ", info.codec_version,
                                " (this build reads ", kTopKEfVersion, " and ",
                                kTopKEfVersionChunking, ")"));
  }
  if (info.dtype != DType::kF32) {
    return Corrupt(absl::StrCat("dtype ", DTypeName(info.dtype), " (topk_ef carries f32)"));
  }
  if (info.flags != 0) return Corrupt(absl::StrCat("unknown flags ", info.flags));
  TopKEfHeader h;
  h.version = info.codec_version;
  ByteReader params(info.params);
  LBCC_ASSIGN_OR_RETURN(const uint32_t k, params.U32("k"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t value_coding, params.U8("value coding"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t index_coding, params.U8("index coding"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t sub_block_log2, params.U8("sub-block size"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t rice, params.U8("Rice parameter"));
  LBCC_ASSIGN_OR_RETURN(const uint64_t index_bytes, params.U64("index section length"));
  if (h.version == kTopKEfVersionChunking) {
    LBCC_ASSIGN_OR_RETURN(const uint8_t chunking, params.U8("chunking"));
    if (chunking > static_cast<uint8_t>(Chunking::kFlat1D)) {
      return Corrupt(absl::StrCat("unknown chunking ", chunking));
    }
    h.chunking = static_cast<Chunking>(chunking);
  }
  absl::StatusOr<ChunkGeometry> g = MakeChunkGeometry(info.shape, h.chunking);
  if (!g.ok()) return Corrupt(g.status().message());
  h.geometry = *g;
  if (h.geometry.num_chunks == 0 ? k != 0 : (k < 1 || k > h.geometry.chunk_len)) {
    return Corrupt(absl::StrCat("k ", k, " for chunks of ", h.geometry.chunk_len));
  }
  if (!IsValidValueCoding(value_coding)) {
    return Corrupt(absl::StrCat("unknown value coding ", value_coding));
  }
  h.values = static_cast<ValueCoding>(value_coding);
  if (index_coding == static_cast<uint8_t>(IndexCoding::kPacked12)) {
    if (sub_block_log2 != 0 || rice != 0) return Corrupt("packed12 with adaptive parameters");
  } else if (index_coding == static_cast<uint8_t>(IndexCoding::kAdaptive)) {
    if ((sub_block_log2 != 6 && sub_block_log2 != 7) || rice > sub_block_log2) {
      return Corrupt(absl::StrCat("adaptive sub-block log2 ", sub_block_log2, ", Rice ", rice));
    }
  } else {
    return Corrupt(absl::StrCat("unknown index coding ", index_coding));
  }
  h.indices = static_cast<IndexCoding>(index_coding);
  h.adaptive = {sub_block_log2, rice};
  LBCC_ASSIGN_OR_RETURN(h.value_params, params.Bytes(params.remaining(), "value params"));
  if (index_bytes > info.body.size()) {
    return Corrupt(
        absl::StrCat("index section of ", index_bytes, " bytes in a body of ", info.body.size()));
  }
  h.layout = {h.geometry.num_chunks, static_cast<int64_t>(k), h.geometry.chunk_len};
  h.index_section = info.body.subspan(0, static_cast<size_t>(index_bytes));
  h.value_section = info.body.subspan(static_cast<size_t>(index_bytes));
  // Every value costs at least 2 bits: this bounds the count (and what decoders allocate for it)
  // by the payload's size before any length arithmetic.
  const int64_t count = h.layout.count();
  if (static_cast<uint64_t>(count) > 4 * static_cast<uint64_t>(info.body.size())) {
    return Corrupt(
        absl::StrCat(count, " values cannot fit in a body of ", info.body.size(), " bytes"));
  }
  if (h.value_params.size() != ValueParamBytes(h.values)) {
    return Corrupt(absl::StrCat(ValueCodingName(h.values), " parameters have ",
                                h.value_params.size(), " bytes, expected ",
                                ValueParamBytes(h.values)));
  }
  int64_t block = 0;
  if (IsAbsmax(h.values)) {
    uint32_t b;
    std::memcpy(&b, h.value_params.data(), 4);
    if (b < 1) return Corrupt("absmax block of 0 values");
    block = b;
  }
  if (h.value_section.size() != ValueSectionBytes(h.values, count, block)) {
    return Corrupt(absl::StrCat(ValueCodingName(h.values), " section has ", h.value_section.size(),
                                " bytes, ", count, " values need ",
                                ValueSectionBytes(h.values, count, block)));
  }
  return h;
}

namespace {

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

LBCC_REGISTER_CODEC(*TopKEfCodec::Create(TopKEfOptions()));

}  // namespace lbcc::codecs
