// The subspace activation codec for pipeline-stage boundaries (Protocol Models).
//
// Forward: activations h [tokens x d] with token ids y cross as c = U^T (h - T[y]) (k numbers per
// token) plus y; the receiver rebuilds h = U c + T[y]. Exact when h - T[y] lies in span(U), which
// a subspace-constrained model guarantees. Backward: gradients g_h [tokens x d] cross as
// g_c = U^T g_h and are rebuilt as U g_c, which gives every upstream parameter its exact gradient
// (its Jacobian's columns lie in span(U)). With a mixture basis (M > 1 components) the encoder
// picks, per block of `mixture_block` tokens, the component that captures the most energy of
// h - T[y]; the one-byte selectors travel with the payload, and the backward pass reuses the
// forward's selectors.
//
// Coefficients travel as fp32, bf16, fp16 (round to nearest even) or int8 with one fp32 absmax
// scale per `int8_block` coefficients of a token. Because U is orthonormal, coefficient error
// equals activation error. Products run through cblas_sgemm.
//
// Wire format: the envelope of codecs/payload.h with codec id kSubspaceForward or
// kSubspaceBackward, codec version 1, dtype f32, shape [tokens, d], flags 0, and
//   params (28 bytes): u64 basis hash | u32 basis version | u32 k | u32 V (0 backward) |
//                      u16 M | u16 mixture_block (0 when M = 1) | u16 int8_block (0 unless int8) |
//                      u8 coefficient dtype (DType id: f32, f16, bf16, i8) | u8 id width
//                      (SubspaceIdWidth(V) forward, 0 backward)
//   body: selectors, u8 [ceil(tokens / mixture_block)] (M > 1 only) |
//         ids, little-endian, id width bytes each [tokens] (forward only) |
//         int8 scales, f32 [tokens x ceil(k / int8_block)] (int8 only) |
//         coefficients [tokens x k] in the coefficient dtype.
// Example: d 1024, k 160, bf16, V 50257 (2-byte ids): 322 bytes per token + 76 bytes of envelope.
//
// Errors (one meaning each; on any error the output buffers are untouched):
//   DataLoss           the bytes are not a valid payload of this direction: envelope errors,
//                      wrong codec id or version, inconsistent params or body, ids >= V,
//                      selectors >= M, bad int8 scales, or this codec's basis id with another
//                      d, k, M or V.
//   FailedPrecondition the payload is intact but names another basis (hash or version differ):
//                      decode it with that basis (e.g. the old basis kept until in-flight
//                      backwards drain; InspectSubspacePayload names it).
//   InvalidArgument    caller input: tensor views of the wrong dtype, shape or memory kind,
//                      ids outside [0, V) to encode, selectors of the wrong count or >= M,
//                      an output buffer of the wrong size, bad options.
//
// As a codecs::Codec (codec.h): SubspacePayloadCodec below, one object per direction, is
// registered under both payload ids, so InspectPayload summarises subspace payloads, and
// comm/'s compressed point-to-point sends them like any codec's.
//
// Thread-safety: a SubspaceCodec keeps scratch buffers and is thread-compatible: one thread at a
// time per instance (create one per stream); the basis it holds is shared and immutable.
// InspectSubspacePayload is stateless. A SubspacePayloadCodec is immutable and shareable; its
// SubspaceMessageState belongs to one thread at a time.
#ifndef LBCC_CODECS_SUBSPACE_CODEC_H_
#define LBCC_CODECS_SUBSPACE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/dtype.h"
#include "base/tensor_view.h"
#include "codecs/codec.h"
#include "codecs/subspace_basis.h"

namespace lbcc::codecs {

inline constexpr uint8_t kSubspaceCodecVersion = 1;
inline constexpr size_t kSubspaceParamsBytes = 28;

enum class SubspaceDirection : uint8_t { kForward, kBackward };

struct SubspaceCodecOptions {
  // f32, bf16, f16 or i8.
  DType coefficient_dtype = DType::kBF16;
  // Coefficients of one token per int8 scale, in [1, 65535].
  int64_t int8_block = 32;
  // Tokens per selector of a mixture basis, in [1, 65535]; ignored when M = 1.
  int64_t mixture_block = 64;
};

// The components a mixture-basis payload used: one per block of `mixture_block` tokens. The
// forward decoder hands them out; the backward encoder must use the same ones. Empty (block 0)
// for a single basis.
struct SubspaceSelectors {
  int64_t mixture_block = 0;
  std::vector<uint8_t> values;
};

// What a payload's header says, validated (DataLoss otherwise) but not checked against a basis.
struct SubspacePayloadHeader {
  SubspaceDirection direction = SubspaceDirection::kForward;
  SubspaceBasisId basis;
  int64_t tokens = 0;
  int64_t model_dim = 0;       // d
  int64_t rank = 0;            // k
  int64_t components = 1;      // M
  int64_t vocab_size = 0;      // V (0 for backward payloads)
  int id_width = 0;            // bytes per id (0 for backward payloads)
  int64_t mixture_block = 0;   // tokens per selector (0 when M = 1)
  int64_t num_selectors = 0;   // ceil(tokens / mixture_block) (0 when M = 1)
  DType coefficient_dtype = DType::kF32;
  int64_t int8_block = 0;      // 0 unless int8
  size_t total_bytes = 0;
};

// Parses the envelope and params of a forward or backward payload; `payload` need only live for
// the call. DataLoss for anything malformed (the body's contents are checked by the decoders).
absl::StatusOr<SubspacePayloadHeader> InspectSubspacePayload(absl::Span<const uint8_t> payload);

// Energy of a batch against the basis: total = sum ||h - T[y]||^2, captured = sum ||c||^2 (c the
// fp32 coefficients of the chosen component), residual = sum ||h - T[y] - U c||^2 measured
// directly (the out-of-subspace energy; equals total - captured up to rounding).
struct SubspaceEnergy {
  double total = 0;
  double captured = 0;
  double residual = 0;
  double residual_fraction() const { return total > 0 ? residual / total : 0.0; }
};

class SubspaceCodec {
 public:
  // InvalidArgument for a null basis or bad options.
  static absl::StatusOr<SubspaceCodec> Create(std::shared_ptr<const SubspaceBasis> basis,
                                              SubspaceCodecOptions options = {});

  const SubspaceBasis& basis() const { return *basis_; }
  const std::shared_ptr<const SubspaceBasis>& shared_basis() const { return basis_; }
  const SubspaceCodecOptions& options() const { return options_; }

  // Exact payload sizes for `tokens` tokens with this codec's options.
  size_t ForwardPayloadBytes(int64_t tokens) const;
  size_t BackwardPayloadBytes(int64_t tokens) const;
  // Selectors a payload of `tokens` tokens carries with this codec's options (0 for a single
  // basis).
  int64_t NumSelectors(int64_t tokens) const;

  // Encodes activations `h` (host f32 [tokens, d]) with token ids `ids` (tokens values in [0, V);
  // empty when V = 0) into `out`, which must hold ForwardPayloadBytes(tokens) bytes; returns the
  // bytes written. `selectors_out` (optional) receives the chosen components. Buffers need only
  // live for the call. InvalidArgument for bad views, ids or sizes.
  absl::StatusOr<size_t> EncodeForward(const TensorView& h, absl::Span<const int32_t> ids,
                                       absl::Span<uint8_t> out,
                                       SubspaceSelectors* selectors_out = nullptr);
  absl::StatusOr<std::vector<uint8_t>> EncodeForward(const TensorView& h,
                                                     absl::Span<const int32_t> ids,
                                                     SubspaceSelectors* selectors_out = nullptr);

  // Decodes a forward payload into `h_out` (host f32 [tokens, d], see InspectSubspacePayload);
  // optionally returns the ids (`ids_out` empty or tokens values) and the selectors. Any
  // coefficient dtype and mixture block is accepted. Errors as in the header comment; outputs
  // untouched on error.
  absl::Status DecodeForward(absl::Span<const uint8_t> payload, const TensorView& h_out,
                             absl::Span<int32_t> ids_out = {},
                             SubspaceSelectors* selectors_out = nullptr);

  // Encodes activation gradients `g_h` (host f32 [tokens, d]) into `out` (BackwardPayloadBytes
  // bytes). A mixture basis needs the selectors of the matching forward payload (any mixture
  // block, ceil(tokens / block) values < M); a single basis takes none (empty selectors).
  // InvalidArgument for bad views, selectors or sizes.
  absl::StatusOr<size_t> EncodeBackward(const TensorView& g_h, const SubspaceSelectors& selectors,
                                        absl::Span<uint8_t> out);
  absl::StatusOr<std::vector<uint8_t>> EncodeBackward(const TensorView& g_h,
                                                      const SubspaceSelectors& selectors = {});

  // Decodes a backward payload into `g_out` (host f32 [tokens, d]); `selectors_out` as in
  // DecodeForward. Errors as in the header comment; outputs untouched on error.
  absl::Status DecodeBackward(absl::Span<const uint8_t> payload, const TensorView& g_out,
                              SubspaceSelectors* selectors_out = nullptr);

  // Energy of activations `h` with ids `ids` against the basis (components chosen as the
  // forward encoder would). InvalidArgument as EncodeForward.
  absl::StatusOr<SubspaceEnergy> MeasureEnergy(const TensorView& h, absl::Span<const int32_t> ids);

 private:
  SubspaceCodec(std::shared_ptr<const SubspaceBasis> basis, SubspaceCodecOptions options)
      : basis_(std::move(basis)), options_(options) {}

  absl::Status CheckActivations(const TensorView& x, absl::string_view what) const;
  absl::Status CheckIds(absl::Span<const int32_t> ids, int64_t tokens) const;
  // coef_ = U^T (h - T[y]) [tokens x k] of the chosen components; selectors_ = the choices made
  // per block of `block` tokens (M > 1).
  void ProjectForward(const float* h, int64_t tokens, const int32_t* ids, int64_t block);
  // coef_ = U_sel^T x per block (selectors null for a single basis).
  void ProjectWithSelectors(const float* x, int64_t tokens, const uint8_t* selectors,
                            int64_t block);
  // out = coef U_sel^T (+ T[ids] when ids is non-null and the basis has a table).
  void Reconstruct(const float* coef, int64_t tokens, const uint8_t* selectors, int64_t block,
                   const int32_t* ids, float* out);
  size_t PayloadBytes(SubspaceDirection direction, int64_t tokens, int64_t block) const;
  // Writes the payload from coef_ and selectors_.
  absl::StatusOr<size_t> Write(SubspaceDirection direction, int64_t tokens, int64_t block,
                               const int32_t* ids, absl::Span<uint8_t> out);
  absl::Status Decode(SubspaceDirection direction, absl::Span<const uint8_t> payload,
                      const TensorView& out, absl::Span<int32_t> ids_out,
                      SubspaceSelectors* selectors_out);

  std::shared_ptr<const SubspaceBasis> basis_;
  SubspaceCodecOptions options_;
  // Scratch, grown on demand.
  std::vector<float> all_coef_;   // [tokens x M*k] (mixture encode)
  std::vector<float> coef_;       // [tokens x k]
  std::vector<uint16_t> half_;    // bf16 / f16 staging
  std::vector<float> stage_coef_; // mixture decode: coefficients of one component's blocks
  std::vector<float> stage_out_;  // ... and their output rows
  std::vector<uint8_t> selectors_;
  std::vector<int32_t> ids_;
};

// The per-message inputs and outputs of SubspacePayloadCodec::Encode, and its encoder's buffers:
// one per stream of messages. Nothing is ever pending (the codec has no memory across
// messages): Commit() and Abort() answer FailedPrecondition.
class SubspacePayloadCodec;

class SubspaceMessageState final : public CodecState {
 public:
  // Forward: the token ids of the next Encode (copied; empty when the basis has no vocabulary).
  void set_ids(absl::Span<const int32_t> ids) { ids_.assign(ids.begin(), ids.end()); }
  // Backward: the selectors of the matching forward payload (empty for a single basis).
  void set_selectors(SubspaceSelectors selectors) { selectors_ = std::move(selectors); }
  // After a forward Encode: the components it chose; else what set_selectors() gave.
  const SubspaceSelectors& selectors() const { return selectors_; }

  CodecId codec() const override { return id_; }
  bool has_pending() const override { return false; }
  absl::Status Commit() override;
  absl::Status Abort() override;

 private:
  friend class SubspacePayloadCodec;
  SubspaceMessageState(const SubspacePayloadCodec* owner, CodecId id, SubspaceCodec codec)
      : owner_(owner), id_(id), codec_(std::move(codec)) {}

  const SubspacePayloadCodec* owner_;  // the codec whose NewState() made it
  CodecId id_;
  SubspaceCodec codec_;  // its own copy: the encoder's buffers
  std::vector<int32_t> ids_;
  SubspaceSelectors selectors_;
};

// The subspace codec of one direction as a codecs::Codec (id kSubspaceForward or
// kSubspaceBackward), over a SubspaceCodec:
//   Encode(x, state, out)  x: h (forward) or g_h (backward), host f32 [tokens, d]; `state`: a
//                          SubspaceMessageState from NewState() holding the message's ids or
//                          selectors. The payload is SubspaceCodec's EncodeForward/Backward's.
//   DecodeAccumulate(codec, payloads, options, out)  decodes with this codec's basis (errors as
//                          in the header comment); several payloads aggregate as dense ones do:
//                          agg = v_0 + v_1 + ... in rank order, then / n unless kSum.
//   Inspect                the header and the body's selectors, ids and scales (DataLoss).
// The objects the registry holds come from Inspector(): no basis, so they inspect, and answer
// Unimplemented to DecodeAccumulate without a codec (subspace payloads need their basis) and
// FailedPrecondition to MaxEncodedBytes and Encode.
class SubspacePayloadCodec final : public Codec {
 public:
  // InvalidArgument as SubspaceCodec::Create.
  static absl::StatusOr<std::unique_ptr<SubspacePayloadCodec>> Create(
      std::shared_ptr<const SubspaceBasis> basis, SubspaceDirection direction,
      SubspaceCodecOptions options = {});
  // The basis-less object registered for `direction`'s id.
  static std::unique_ptr<SubspacePayloadCodec> Inspector(SubspaceDirection direction);

  SubspaceDirection direction() const { return direction_; }
  // The codec it encodes with; nullptr for an Inspector().
  const SubspaceCodec* subspace_codec() const { return codec_ ? &*codec_ : nullptr; }

  CodecId id() const override;
  std::string Describe() const override;
  // [tokens, d] (InvalidArgument otherwise): ForwardPayloadBytes / BackwardPayloadBytes.
  absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t> shape) const override;
  // A SubspaceMessageState; nullptr for an Inspector().
  std::unique_ptr<CodecState> NewState() const override;
  // InvalidArgument for a state not from this object's NewState(), and as
  // EncodeForward/Backward.
  absl::StatusOr<size_t> Encode(const TensorView& input, CodecState* state,
                                absl::Span<uint8_t> out) const override;
  std::unique_ptr<CodecScratch> NewDecodeScratch() const override;
  absl::Status PrepareDecode(const DecodeCall& call, CodecScratch* scratch) const override;
  void ApplyDecode(const DecodeCall& call, CodecScratch* scratch) const override;
  absl::Status Inspect(const PayloadInfo& info, PayloadSummary* summary) const override;

 private:
  SubspacePayloadCodec(SubspaceDirection direction, std::optional<SubspaceCodec> codec)
      : direction_(direction), codec_(std::move(codec)) {}
  absl::Status NeedBasis(absl::string_view what) const;

  SubspaceDirection direction_;
  std::optional<SubspaceCodec> codec_;  // sizes, options, basis; never encodes itself
};

// Byte sizes of a subspace payload's body sections (the wire format above): selectors, ids, int8
// scales, coefficients. The one definition the CPU codec and kernels/ both use. Callers bound
// tokens and k so that the products stay far below 2^64.
struct SubspaceBodyLayout {
  uint64_t selectors = 0;
  uint64_t ids = 0;
  uint64_t scales = 0;
  uint64_t coefficients = 0;
  uint64_t total() const { return selectors + ids + scales + coefficients; }
};
inline SubspaceBodyLayout SubspaceLayout(int64_t tokens, int64_t k, int64_t num_selectors,
                                         int id_width, DType dtype, int64_t int8_block) {
  SubspaceBodyLayout l;
  l.selectors = static_cast<uint64_t>(num_selectors);
  l.ids = static_cast<uint64_t>(tokens) * static_cast<uint64_t>(id_width);
  if (dtype == DType::kI8) {
    l.scales = static_cast<uint64_t>(tokens) *
               static_cast<uint64_t>((k + int8_block - 1) / int8_block) * 4;
  }
  l.coefficients = static_cast<uint64_t>(tokens) * static_cast<uint64_t>(k) * DTypeSize(dtype);
  return l;
}

// True for the coefficient dtypes a payload may carry: f32, bf16, f16, i8.
bool IsSubspaceCoefficientDType(DType t);

// The subspace header of a parsed envelope (InspectSubspacePayload is ParsePayload and this);
// DataLoss as InspectSubspacePayload.
absl::StatusOr<SubspacePayloadHeader> ParseSubspaceHeader(const PayloadInfo& info);
// The bytes CheckSubspaceBody reads, from a parsed envelope: the body to the checksum's end.
absl::Span<const uint8_t> SubspaceBodyToEnd(const PayloadInfo& info);

// Begins a payload of `tokens` tokens for `basis` in `out` (PayloadBytes of it or more;
// InvalidArgument otherwise): the envelope and its parameters through `writer`, then the
// body's selectors (ceil(tokens / block) of them when the basis is a mixture) and, forward, the
// token ids. Returns where the int8 scales (or, for other dtypes, the coefficients) go; the
// caller fills SubspaceLayout's scales + coefficients bytes there and calls writer->Finish().
// The one writer of these fields for the CPU codec and kernels/.
absl::StatusOr<uint8_t*> BeginSubspacePayload(const SubspaceBasis& basis,
                                              SubspaceDirection direction, int64_t tokens,
                                              int64_t block, DType dtype, int64_t int8_block,
                                              const uint8_t* selectors, const int32_t* ids,
                                              absl::Span<uint8_t> out, PayloadWriter* writer);

// Calls fn(first_token, end_token, component) -> absl::Status for each maximal run of mixture
// blocks of `block` tokens that share a selector, in order (one run over all tokens when
// `selectors` is null); returns the first error fn returns. The encoders and decoders (CPU,
// kernels/) walk the runs with it.
template <typename Fn>
absl::Status ForEachSelectorRun(int64_t tokens, const uint8_t* selectors, int64_t block,
                                Fn&& fn) {
  if (selectors == nullptr) return tokens > 0 ? fn(int64_t{0}, tokens, 0) : absl::OkStatus();
  const int64_t blocks = (tokens + block - 1) / block;
  for (int64_t b = 0; b < blocks;) {
    int64_t e = b + 1;
    while (e < blocks && selectors[e] == selectors[b]) ++e;
    const int64_t end = e * block < tokens ? e * block : tokens;
    if (absl::Status s = fn(b * block, end, static_cast<int>(selectors[b])); !s.ok()) return s;
    b = e;
  }
  return absl::OkStatus();
}

// A token id of `width` bytes, little-endian, as the body stores it.
inline uint32_t LoadSubspaceId(const uint8_t* p, int width) {
  uint32_t v = 0;
  for (int b = 0; b < width; ++b) v |= static_cast<uint32_t>(p[b]) << (8 * b);
  return v;
}

// The mixture block a backward payload uses for `selectors` from the forward payload: the
// selectors' own block for a mixture of `components` bases, `default_block` for a single basis.
// InvalidArgument for selectors given to a single basis, a block outside [1, 65535], a count
// other than ceil(tokens / block) or a selector >= M. Both encoders (CPU, kernels/) use it.
absl::StatusOr<int64_t> BackwardSelectorBlock(const SubspaceSelectors& selectors,
                                              int64_t components, int64_t tokens,
                                              int64_t default_block);

// The header checks every subspace decoder (this CPU codec, kernels/) makes first: the payload
// goes in `direction` (DataLoss), names `basis` (FailedPrecondition naming both bases, so a
// receiver can retry with its previous one) and agrees with its shape (DataLoss).
absl::Status CheckSubspaceHeaderForDecode(const SubspacePayloadHeader& h,
                                          SubspaceDirection direction, const SubspaceBasis& basis);

// The body of a payload that passed InspectSubspacePayload, sliced into its sections and
// checked before a decoder writes anything: selectors < M, token ids < V, int8 scales >= 0
// (DataLoss otherwise). The pointers point into `payload`.
struct SubspaceBody {
  SubspaceBodyLayout layout;
  const uint8_t* selectors = nullptr;
  const uint8_t* ids = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* coefficients = nullptr;
};
absl::StatusOr<SubspaceBody> CheckSubspaceBody(absl::Span<const uint8_t> payload,
                                               const SubspacePayloadHeader& h);

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_SUBSPACE_CODEC_H_
