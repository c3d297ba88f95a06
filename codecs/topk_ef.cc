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
// |v| bits of kMaxEncodableMagnitude: e' entries above are refused (topk_ef.h).
constexpr uint32_t kMaxEncodableAbsBits = 0x71800000u;  // 2^100

uint32_t AbsBitsOf(float x) { return FloatBits(x) & kAbsMask; }

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

absl::Status TopKEfState::Commit() { return CommitPendingError(pending_, error_, next_); }

absl::Status TopKEfState::Abort() { return AbortPendingError(pending_); }

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
      TopKEfFixedParamBytes(options_.ChunkingFor(shape)) + ValueParamBytes(options_.values);
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

// The encode's steps (topk_ef.h, module comment), in the order EncodeImpl runs them.
struct internal::TopKEfEncoder {
  // Takes the chunking the options give the delta (a state starts with the shape-aware one) and
  // grows the selection's scratch; returns k per chunk.
  static int64_t Prepare(const TopKEfOptions& o, TopKEfState& st, const ChunkGeometry& wanted) {
    if (wanted.w != st.geometry_.w) st.SetGeometry(wanted);
    const ChunkGeometry& g = st.geometry_;
    const int64_t k = o.KFor(g);
    const size_t total = static_cast<size_t>(g.num_chunks * k);
    const size_t candidates = static_cast<size_t>(g.chunk_len) + 8;
    Grow(&st.sel_local_, total);
    Grow(&st.sel_value_, total);
    Grow(&st.centered_, total);
    Grow(&st.codes_, total);
    Grow(&st.cand_idx_, candidates);
    Grow(&st.cand_bits_, candidates);
    Grow(&st.sel_idx_, candidates);
    Grow(&st.sel_bits_, candidates);
    return k;
  }

  // Steps 1-2: e' = beta * e + lr * delta into the pending buffer and the selection, group of
  // chunks by group (the streamed index section coded after each group). InvalidArgument, with
  // the state unchanged, for a non-finite or too large e'.
  static absl::Status UpdateAndSelect(const TopKEfOptions& o, TopKEfState& st, const float* d,
                                      int64_t k, IndexStream* stream) {
    const CpuKernels& kern = ActiveKernels();
    const ChunkGeometry& g = st.geometry_;
    const float* e = st.error_.data();
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
          max_bits = std::max(max_bits, kern.ef_update(e + off, d + off, next + off, len, o.beta,
                                                       o.lr));
        }
        if (max_bits > kMaxEncodableAbsBits) {
          return absl::InvalidArgumentError(absl::StrCat(
              "topk_ef: delta has a NaN or infinite entry, or |beta * e + lr * delta| exceeds "
              "2^100, in rows ",
              y * g.h, "..", y * g.h + g.h - 1, "; the state is unchanged"));
        }
        for (int64_t x = x0; x < x1; ++x) {
          const int64_t c = y * g.chunks_x + x;
          SelectChunk(kern, next + ChunkCorner(g, c), g, k, st.local_offset_.data(),
                      st.cand_idx_.data(), st.cand_bits_.data(), st.sel_idx_.data(),
                      st.sel_bits_.data(), st.sel_local_.data() + c * k,
                      st.sel_value_.data() + c * k, &st.hint_);
        }
        if (stream != nullptr) stream->Advance(st.sel_local_, y * g.chunks_x + x1);
      }
    }
    return absl::OkStatus();
  }

  // Step 3a: the index coding (the streamed one's, or the requested one, auto picking the
  // shorter) and the index section's length.
  static void ChooseIndexCoding(const TopKEfOptions& o, const TopKEfState& st,
                                const IndexLayout& layout, IndexStream* stream,
                                TopKEfFixedParams* p) {
    const absl::Span<const uint16_t> local(st.sel_local_.data(),
                                           static_cast<size_t>(layout.count()));
    p->indices = o.indices;
    p->index_bytes = Packed12Bytes(layout.count());
    if (stream != nullptr) {
      size_t bytes = 0;
      p->indices = stream->Finish(st.sel_local_, &p->adaptive, &bytes);
      p->index_bytes = bytes;
    } else if (p->indices != IndexCoding::kPacked12) {
      const AdaptiveChoice adaptive = ChooseAdaptive(local, layout);
      const uint64_t adaptive_bytes = (adaptive.bits + 7) / 8;
      if (p->indices == IndexCoding::kAuto) {
        p->indices = adaptive_bytes < p->index_bytes ? IndexCoding::kAdaptive
                                                     : IndexCoding::kPacked12;
      }
      if (p->indices == IndexCoding::kAdaptive) p->index_bytes = adaptive_bytes;
      p->adaptive = adaptive.params;
    }
  }

  // Step 3b: the payload: header, index section, values (sel_value_ then holds v_hat).
  static absl::StatusOr<size_t> Write(const TopKEfOptions& o, TopKEfState& st,
                                      absl::Span<const int64_t> shape, const IndexLayout& layout,
                                      const TopKEfFixedParams& p, bool streamed,
                                      absl::Span<uint8_t> out) {
    const size_t total = static_cast<size_t>(layout.count());
    const size_t value_param_bytes = ValueParamBytes(o.values);
    const size_t value_bytes = ValueSectionBytes(o.values, layout.count(), o.value_block);
    const size_t fixed_param_bytes = TopKEfFixedParamBytes(p.chunking);
    PayloadWriter writer;
    LBCC_RETURN_IF_ERROR(
        BeginTopKEfPayload(p, shape, value_param_bytes, value_bytes, out, &writer));
    const absl::Span<uint8_t> index_section = writer.body().subspan(0, p.index_bytes);
    const absl::Span<const uint16_t> local(st.sel_local_.data(), total);
    if (streamed) {
      if (p.index_bytes > 0) {
        std::memcpy(index_section.data(), st.index_scratch_.data(), p.index_bytes);
      }
    } else if (p.indices == IndexCoding::kAdaptive) {
      EncodeAdaptive(local, layout, p.adaptive, index_section);
    } else {
      EncodePacked12(local, index_section);
    }
    EncodeValues(o.values, ValueEncodeOptions{o.range_sigmas, o.value_block},
                 absl::MakeSpan(st.sel_value_.data(), total),
                 writer.params().subspan(fixed_param_bytes, value_param_bytes),
                 writer.body().subspan(p.index_bytes, value_bytes),
                 absl::MakeSpan(st.centered_.data(), total),
                 absl::MakeSpan(st.codes_.data(), total));
    return writer.Finish();
  }

  // Step 4: e_new = e' - v_hat at the selected positions.
  static void SubtractReconstruction(TopKEfState& st, int64_t k) {
    const ChunkGeometry& g = st.geometry_;
    float* next = st.next_.data();
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
  }
};

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
  LBCC_RETURN_IF_ERROR(PrepareTopKEfState(*this, st, delta.shape(), out.size()));
  using Steps = internal::TopKEfEncoder;
  TopKEfFixedParams p;
  p.values = options_.values;
  p.chunking = options_.ChunkingFor(delta.shape());
  LBCC_ASSIGN_OR_RETURN(const ChunkGeometry wanted, MakeChunkGeometry(delta.shape(), p.chunking));
  p.k = Steps::Prepare(options_, st, wanted);
  const ChunkGeometry& g = st.geometry_;
  const IndexLayout layout{g.num_chunks, p.k, g.chunk_len};
  // Streamed: the index section is coded group by group into index_scratch_ (the coding chosen
  // from the first group's selection) and its final bytes reported as they appear.
  std::optional<IndexStream> stream;
  if (observer != nullptr && g.num_chunks > 0) {
    Grow(&st.index_scratch_, std::max(Packed12Bytes(layout.count()), AdaptiveMaxBytes(layout)));
    stream.emplace(options_.indices, layout, absl::MakeSpan(st.index_scratch_), observer);
  }
  IndexStream* streamed = stream ? &*stream : nullptr;
  LBCC_RETURN_IF_ERROR(
      Steps::UpdateAndSelect(options_, st, delta.data_as<const float>(), p.k, streamed));
  Steps::ChooseIndexCoding(options_, st, layout, streamed, &p);
  LBCC_ASSIGN_OR_RETURN(const size_t size, Steps::Write(options_, st, delta.shape(), layout, p,
                                                         streamed != nullptr, out));
  Steps::SubtractReconstruction(st, p.k);
  st.pending_ = true;
  return size;
}

LBCC_REGISTER_CODEC(*TopKEfCodec::Create(TopKEfOptions()));

}  // namespace lbcc::codecs

