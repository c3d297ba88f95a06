// The codec interface: tensors in, self-describing payloads out, and back.
//
// One Codec object carries both directions of one wire format, as leveldb's FilterPolicy
// carries CreateFilter and KeyMayMatch:
//   encode   Encode / EncodeStreamed with the options the object was built from (TopKEfCodec,
//            DenseQuantCodec, SubspacePayloadCodec); memory across calls (TopK-EF's error
//            feedback) lives in a CodecState the caller owns, one per tensor
//   decode   PrepareDecode + ApplyDecode: validate and stage payloads in the codec's own
//            CodecScratch, then write their aggregate; payloads describe themselves, so any
//            object of the codec decodes what any other encoded
//   inspect  Inspect: validate one payload and summarise it
// Each codec registers one object under its payload id (codecs/codec_registry.h); the free
// functions below (DecodeAccumulate, PrepareDecode, ApplyDecode, InspectPayload) read the id
// from the payloads (payload.h) and dispatch to that object. A codec's device twin (kernels/)
// attaches to the same registry entry.
//
// Thread-safety: Codec objects are immutable and may be shared by threads. A CodecState is
// used by one thread at a time, a DecodeScratch too (one per thread). Encoding is two-phase
// for stateful codecs: Encode() leaves the state's update pending, Commit() applies it once the
// payload was delivered, Abort() drops it, so a failed exchange loses nothing.
//
// Decoding combines one or many payloads, given in rank order, into a dense tensor. Every
// payload is validated completely before the output is touched: on any error nothing is
// written.
//
// Memory: encoders write into a caller buffer of MaxEncodedBytes(); states and DecodeScratch
// grow on first use and are reused, so steady-state calls do not allocate.
//
// Implementations: topk_ef.h (chunked top-k with error feedback, SparseLoCo), dense_quant.h
// (int8 / 4-bit absmax, fp16, bf16), subspace_codec.h (activations on a subspace basis).
#ifndef LBCC_CODECS_CODEC_H_
#define LBCC_CODECS_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/tensor_view.h"
#include "codecs/payload.h"
#include "codecs/wire_values.h"

namespace lbcc::codecs {

// How payloads of several replicas combine, per coordinate. Accumulation order is the order of
// the payloads (rank order), so every rank computes the same bits:
//   agg = (v_0 + v_1) + v_2 ... over the payloads that carry the coordinate, left to right in
//         fp32, then
//   kSparseLoCoMean  agg / n_selected   (SparseLoCo: mean over the replicas that selected it;
//                                         0 where none did)
//   kMean            agg / n_payloads   (plain mean over all replicas)
//   kSum             agg
// For dense payloads every payload carries every coordinate, so the two means agree.
// Aggregation (wire values): wire_values.h.

absl::string_view AggregationName(Aggregation aggregation);  // "sparseloco", "mean", "sum"
absl::StatusOr<Aggregation> ParseAggregation(absl::string_view name);

struct DecodeOptions {
  Aggregation aggregation = Aggregation::kSparseLoCoMean;
  // false: out = aggregate (coordinates no payload carries become 0).
  // true:  out += aggregate (coordinates no payload carries are left as they are), e.g. to
  //        apply an outer step straight into a buffer.
  bool accumulate = false;
  // templar's outer step: before aggregating, each payload's decoded values are multiplied by
  // min(1, median(norms) / (norm + 1e-8)), with norm the L2 norm of that payload's decoded
  // values and median the lower median over the call's payloads. Computed from the payloads
  // alone, so every rank gets the same bits (topk_ef.h: MedianNormClipFactors). Only codecs
  // whose Codec::ClipsToMedianNorm() is true (TopK-EF) accept it; others: Unimplemented.
  bool clip_to_median_norm = false;
};

// Per-tensor memory of a stateful codec. Created by Codec::NewState() (or by a device twin,
// kernels::NewDeviceState); owned by the caller.
class CodecState {
 public:
  virtual ~CodecState() = default;
  virtual CodecId codec() const = 0;
  // True between a successful Encode() and Commit() / Abort().
  virtual bool has_pending() const = 0;
  // Applies the pending update (the payload was delivered). FailedPrecondition if none.
  virtual absl::Status Commit() = 0;
  // Drops the pending update; the state is as before Encode(). FailedPrecondition if none.
  virtual absl::Status Abort() = 0;
  // True for a state whose memory is on a device (a device twin's state, kernels/): the CPU
  // codecs refuse it, and device encoders take only such states. device() is its device.
  virtual bool is_device() const { return false; }
  virtual int device() const { return -1; }
};

// A codec's own decoding memory inside a DecodeScratch (each codec defines its subclass in its
// .cc). Created by Codec::NewDecodeScratch() on the scratch's first decode of that codec.
class CodecScratch {
 public:
  virtual ~CodecScratch() = default;
};

namespace internal {
struct DecodeScratchImpl;
}  // namespace internal

// Reusable decoding memory; one per thread. Grows to the largest call and keeps its buffers,
// one CodecScratch per codec it has decoded.
class DecodeScratch {
 public:
  DecodeScratch();
  ~DecodeScratch();
  DecodeScratch(const DecodeScratch&) = delete;
  DecodeScratch& operator=(const DecodeScratch&) = delete;
  internal::DecodeScratchImpl& impl() { return *impl_; }

 private:
  std::unique_ptr<internal::DecodeScratchImpl> impl_;
};

// One decode as a codec sees it: `payloads` (rank order) whose envelopes parsed as `infos`,
// all of the codec's id and of out's shape; out is host f32. The views stay valid from
// Codec::PrepareDecode to Codec::ApplyDecode (see PrepareDecode below).
struct DecodeCall {
  absl::Span<const absl::Span<const uint8_t>> payloads;
  absl::Span<const PayloadInfo> infos;
  DecodeOptions options;
  TensorView out;
};

// What a payload holds, for tools and logs.
struct PayloadSummary {
  CodecId codec = CodecId::kTopKEf;
  int codec_version = 0;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t num_elements = 0;
  size_t total_bytes = 0;
  double bits_per_param = 0;  // total_bytes * 8 / num_elements
  int64_t k_per_chunk = 0;    // top-k codecs; 0 otherwise
  int64_t selected = 0;       // values carried (num_elements for dense codecs)
  std::string details;        // codec-specific, one line
};

// Receives, during Codec::EncodeStreamed, the leading bytes of the payload's body as they
// become final, so that a sender can put them on the wire while the codec still encodes the
// rest (SparseAllReduce streams one large tensor's TopK-EF index section this way).
class EncodeObserver {
 public:
  virtual ~EncodeObserver() = default;
  // `bytes` continue those appended before (the first call starts at the body's first byte);
  // valid during the call only.
  virtual void Append(absl::Span<const uint8_t> bytes) = 0;
  // The body will not start with what was appended so far (the codec changed its coding):
  // forget it. Later calls of Append start at the body's first byte again.
  virtual void Discard() = 0;
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual CodecId id() const = 0;
  // The wire name of id() ("topk_ef"); a codec whose id is not built in (payload.h) overrides
  // it, and registration claims the id under this name.
  virtual absl::string_view name() const { return CodecName(id()); }
  // The options, for logs: "topk_ef(top_k=64, beta=0.95, ...)".
  virtual std::string Describe() const = 0;

  // --- Encoding (uses the options the object was built from).

  // Bytes Encode() may write for a tensor of `shape`. InvalidArgument for a bad shape.
  virtual absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t> shape) const = 0;
  // A fresh state for one tensor, or nullptr for stateless codecs.
  virtual std::unique_ptr<CodecState> NewState() const { return nullptr; }
  // Encodes `input` (host fp32) into `out`, which must hold MaxEncodedBytes(input.shape())
  // bytes; returns the payload's size. `state` is the tensor's state (nullptr for stateless
  // codecs); input and out are only used during the call.
  // Errors: InvalidArgument (bad buffer, shape or state, a device state, NaN/Inf in the input:
  // the state is then untouched), FailedPrecondition (the state has a pending update),
  // Unimplemented (device memory or a dtype other than fp32).
  virtual absl::StatusOr<size_t> Encode(const TensorView& input, CodecState* state,
                                        absl::Span<uint8_t> out) const = 0;
  // Encode(), reporting body bytes to `observer` as they become final: when it succeeds, the
  // payload's body starts with the bytes appended since the last Discard(). The payload may
  // differ from Encode()'s (a codec may choose its coding from part of the input) but decodes
  // to the same values and leaves the same state. On failure the appended bytes mean nothing.
  // The default appends nothing.
  virtual absl::StatusOr<size_t> EncodeStreamed(const TensorView& input, CodecState* state,
                                                absl::Span<uint8_t> out,
                                                EncodeObserver* observer) const {
    (void)observer;
    return Encode(input, state, out);
  }

  // --- Decoding and inspection (independent of the options: payloads describe themselves).
  // Called through the free functions below, which check the envelopes, the output's kind and
  // dtype, and that every payload has this codec's id and out's shape.

  // The codec's CodecScratch; nullptr when it needs none.
  virtual std::unique_ptr<CodecScratch> NewDecodeScratch() const { return nullptr; }
  // Validates the codec's params and bodies of `call` as fully as ApplyDecode needs (DataLoss
  // for a corrupt payload, InvalidArgument for caller input) and stages what ApplyDecode reads
  // in `scratch` (this codec's, from NewDecodeScratch()). Writes nothing to call.out. The
  // default: Unimplemented (the codec's payloads are not decoded by aggregation).
  virtual absl::Status PrepareDecode(const DecodeCall& call, CodecScratch* scratch) const;
  // Writes the aggregate of the call PrepareDecode accepted; cannot fail.
  virtual void ApplyDecode(const DecodeCall& call, CodecScratch* scratch) const;
  // Validates `info` (a parsed envelope of this codec's id) as fully as a decoder would
  // (DataLoss otherwise) and fills the codec-specific fields of `summary` (k_per_chunk,
  // selected, details; the envelope's are set). The default checks nothing more.
  virtual absl::Status Inspect(const PayloadInfo& info, PayloadSummary* summary) const;
  // Whether PrepareDecode honours DecodeOptions::clip_to_median_norm; the free functions
  // refuse the option (Unimplemented) for a codec that does not.
  virtual bool ClipsToMedianNorm() const { return false; }
};

// Decodes `payloads` (rank order; all of the same codec and of out's shape) and writes or adds
// their aggregate into `out` (host fp32), with the codec registered for the payloads' id. The
// payload bytes are only read during the call. `scratch` may be nullptr (then the call
// allocates). Errors: DataLoss for a corrupt or foreign payload, an unknown codec id included
// (nothing is written to out), InvalidArgument for a shape, codec or dtype that does not match
// out, or no payloads, Unimplemented for device memory or a codec that does not decode by
// aggregation (or is not linked into this binary), or clip_to_median_norm for a codec that does
// not clip (Codec::ClipsToMedianNorm).
absl::Status DecodeAccumulate(absl::Span<const absl::Span<const uint8_t>> payloads,
                              const DecodeOptions& options, const TensorView& out,
                              DecodeScratch* scratch = nullptr);
// The same with `decoder` instead of the registered codec: for a codec whose decoding needs
// more than the payload (SubspacePayloadCodec: its basis). InvalidArgument when the payloads
// are not of decoder.id().
absl::Status DecodeAccumulate(const Codec& decoder,
                              absl::Span<const absl::Span<const uint8_t>> payloads,
                              const DecodeOptions& options, const TensorView& out,
                              DecodeScratch* scratch = nullptr);

// DecodeAccumulate in two steps, for a caller that must check several tensors' payloads before
// writing any output (SparseAllReduce): PrepareDecode validates `payloads` against `out`
// exactly as DecodeAccumulate does — same errors, nothing written — and stages them in
// `scratch`; ApplyDecode then writes the aggregate into that `out` and only fails when nothing
// was prepared (FailedPrecondition). DecodeAccumulate is the two in a row, so the work is not
// repeated. The payload bytes and `out` must stay valid, and the bytes unchanged, until
// ApplyDecode; a scratch holds one prepared call at a time (a new Prepare replaces it).
absl::Status PrepareDecode(absl::Span<const absl::Span<const uint8_t>> payloads,
                           const DecodeOptions& options, const TensorView& out,
                           DecodeScratch* scratch);
absl::Status ApplyDecode(DecodeScratch* scratch);

// Validates `bytes` as fully as a decoder would (DataLoss otherwise, an unknown codec id
// included) and summarises it. A payload of a built-in id whose codec is not linked into this
// binary is checked as far as its envelope.
absl::StatusOr<PayloadSummary> InspectPayload(absl::Span<const uint8_t> bytes);

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_CODEC_H_
