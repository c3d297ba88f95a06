// Decoding and inspecting payloads by their codec id: the registered codec of each payload's id
// (codec_registry.h), or the caller's, behind the free functions of codec.h (PrepareDecode,
// ApplyDecode, DecodeAccumulate, InspectPayload) and the codec-independent half of a
// DecodeScratch. Apart from codec.cc so that the Codec interface does not depend on the
// registry that stores Codecs.
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/codec.h"
#include "codecs/codec_registry.h"

namespace lbcc::codecs {
namespace internal {

// The codec-independent half of a DecodeScratch: what PrepareDecode staged for ApplyDecode, and
// each decoded codec's own CodecScratch.
struct DecodeScratchImpl {
  const Codec* prepared = nullptr;  // set between a successful Prepare and Apply
  CodecScratch* prepared_part = nullptr;
  DecodeCall prepared_call;
  std::vector<absl::Span<const uint8_t>> payloads;  // the call's spans (the caller's may go)
  std::vector<PayloadInfo> infos;                   // per payload: the parsed envelope
  // One entry per codec id decoded so far (a handful): found by a short linear search.
  std::vector<std::pair<CodecId, std::unique_ptr<CodecScratch>>> parts;

  CodecScratch* PartFor(const Codec& codec) {
    for (auto& [id, part] : parts) {
      if (id == codec.id()) return part.get();
    }
    parts.emplace_back(codec.id(), codec.NewDecodeScratch());
    return parts.back().second.get();
  }
};

}  // namespace internal

DecodeScratch::DecodeScratch() : impl_(std::make_unique<internal::DecodeScratchImpl>()) {}
DecodeScratch::~DecodeScratch() = default;

namespace {

// Checks the envelopes and stages the call in `s`; `decoder` is the caller's codec, or nullptr
// for the registered codec of the payloads' id.
absl::Status Prepare(const Codec* decoder, absl::Span<const absl::Span<const uint8_t>> payloads,
                     const DecodeOptions& options, const TensorView& out,
                     internal::DecodeScratchImpl& s) {
  s.prepared = nullptr;
  if (payloads.empty()) return absl::InvalidArgumentError("decode: no payloads");
  if (!out.is_host()) return absl::UnimplementedError("decode: the CPU codecs write host memory");
  if (out.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode: output must be f32, got ", DTypeName(out.dtype())));
  }
  s.infos.resize(payloads.size());
  for (size_t r = 0; r < payloads.size(); ++r) {
    LBCC_ASSIGN_OR_RETURN(s.infos[r], ParsePayload(payloads[r]),
                          _.Prepend(absl::StrCat("payload ", r)));
    const PayloadInfo& info = s.infos[r];
    if (info.codec != s.infos[0].codec) {
      return absl::InvalidArgumentError(absl::StrCat("decode: payload ", r, " is ",
                                                     CodecName(info.codec), ", payload 0 is ",
                                                     CodecName(s.infos[0].codec)));
    }
    if (info.shape != out.shape()) {
      return absl::InvalidArgumentError(absl::StrCat("decode: payload ", r, " has shape ",
                                                     ShapeToString(info.shape), ", the output ",
                                                     ShapeToString(out.shape())));
    }
  }
  const CodecId id = s.infos[0].codec;
  const Codec* codec = decoder != nullptr ? decoder : FindCodec(id);
  if (codec == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "decode: no decoder of ", CodecName(id), " payloads is linked into this binary"));
  }
  if (codec->id() != id) {
    return absl::InvalidArgumentError(absl::StrCat("decode: ", CodecName(id),
                                                   " payloads given to the decoder of ",
                                                   codec->name()));
  }
  if (options.clip_to_median_norm && !codec->ClipsToMedianNorm()) {
    return absl::UnimplementedError(absl::StrCat(
        "decode: clip_to_median_norm is not implemented for ", codec->name(), " payloads"));
  }
  s.payloads.assign(payloads.begin(), payloads.end());
  const DecodeCall call{s.payloads, absl::MakeConstSpan(s.infos.data(), payloads.size()),
                        options, out};
  CodecScratch* part = s.PartFor(*codec);
  LBCC_RETURN_IF_ERROR(codec->PrepareDecode(call, part));
  s.prepared = codec;
  s.prepared_part = part;
  s.prepared_call = call;
  return absl::OkStatus();
}

absl::Status DecodeWith(const Codec* decoder,
                        absl::Span<const absl::Span<const uint8_t>> payloads,
                        const DecodeOptions& options, const TensorView& out,
                        DecodeScratch* scratch) {
  std::unique_ptr<DecodeScratch> local;
  if (scratch == nullptr) {
    local = std::make_unique<DecodeScratch>();
    scratch = local.get();
  }
  LBCC_RETURN_IF_ERROR(Prepare(decoder, payloads, options, out, scratch->impl()));
  return ApplyDecode(scratch);
}

}  // namespace

absl::Status PrepareDecode(absl::Span<const absl::Span<const uint8_t>> payloads,
                           const DecodeOptions& options, const TensorView& out,
                           DecodeScratch* scratch) {
  return Prepare(nullptr, payloads, options, out, scratch->impl());
}

absl::Status ApplyDecode(DecodeScratch* scratch) {
  internal::DecodeScratchImpl& s = scratch->impl();
  if (s.prepared == nullptr) return absl::FailedPreconditionError("decode: nothing prepared");
  const Codec* codec = s.prepared;
  s.prepared = nullptr;
  codec->ApplyDecode(s.prepared_call, s.prepared_part);
  return absl::OkStatus();
}

absl::Status DecodeAccumulate(absl::Span<const absl::Span<const uint8_t>> payloads,
                              const DecodeOptions& options, const TensorView& out,
                              DecodeScratch* scratch) {
  return DecodeWith(nullptr, payloads, options, out, scratch);
}

absl::Status DecodeAccumulate(const Codec& decoder,
                              absl::Span<const absl::Span<const uint8_t>> payloads,
                              const DecodeOptions& options, const TensorView& out,
                              DecodeScratch* scratch) {
  return DecodeWith(&decoder, payloads, options, out, scratch);
}

absl::StatusOr<PayloadSummary> InspectPayload(absl::Span<const uint8_t> bytes) {
  LBCC_ASSIGN_OR_RETURN(PayloadInfo info, ParsePayload(bytes));
  PayloadSummary summary;
  summary.codec = info.codec;
  summary.codec_version = info.codec_version;
  summary.dtype = info.dtype;
  summary.shape = info.shape;
  summary.num_elements = info.num_elements;
  summary.total_bytes = info.total_bytes;
  summary.bits_per_param =
      info.num_elements > 0 ? 8.0 * static_cast<double>(info.total_bytes) / info.num_elements : 0;
  const Codec* codec = FindCodec(info.codec);
  if (codec == nullptr) {
    summary.details = "no codec of this id linked into this binary (envelope checked only)";
    return summary;
  }
  LBCC_RETURN_IF_ERROR(codec->Inspect(info, &summary));
  return summary;
}

}  // namespace lbcc::codecs
