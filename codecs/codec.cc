#include "codecs/codec.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/decode_scratch.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"

namespace lbcc::codecs {

DecodeScratch::DecodeScratch() : impl_(std::make_unique<internal::DecodeScratchImpl>()) {}
DecodeScratch::~DecodeScratch() = default;

absl::string_view AggregationName(Aggregation aggregation) {
  switch (aggregation) {
    case Aggregation::kSparseLoCoMean:
      return "sparseloco";
    case Aggregation::kMean:
      return "mean";
    case Aggregation::kSum:
      return "sum";
  }
  return "unknown";
}

absl::StatusOr<Aggregation> ParseAggregation(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "sparseloco" || lower == "selected_mean") return Aggregation::kSparseLoCoMean;
  if (lower == "mean") return Aggregation::kMean;
  if (lower == "sum") return Aggregation::kSum;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown aggregation '", name, "' (expected sparseloco, mean or sum)"));
}

absl::Status PrepareDecode(absl::Span<const absl::Span<const uint8_t>> payloads,
                           const DecodeOptions& options, const TensorView& out,
                           DecodeScratch* scratch) {
  internal::DecodeScratchImpl& s = scratch->impl();
  s.prepared = false;
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
  const absl::Span<const PayloadInfo> infos(s.infos.data(), payloads.size());
  switch (s.infos[0].codec) {
    case CodecId::kTopKEf:
      LBCC_RETURN_IF_ERROR(internal::TopKEfPrepareDecode(infos, s));
      break;
    case CodecId::kDenseQuant:
      LBCC_RETURN_IF_ERROR(internal::DenseQuantPrepareDecode(infos, s));
      break;
    default:
      return absl::UnimplementedError(
          absl::StrCat("decode: ", CodecName(s.infos[0].codec),
                       " payloads are not decoded by DecodeAccumulate"));
  }
  s.prepared = true;
  s.prepared_codec = s.infos[0].codec;
  s.prepared_options = options;
  s.prepared_out = out;
  s.prepared_payloads = payloads.size();
  return absl::OkStatus();
}

absl::Status ApplyDecode(DecodeScratch* scratch) {
  internal::DecodeScratchImpl& s = scratch->impl();
  if (!s.prepared) return absl::FailedPreconditionError("decode: nothing prepared");
  s.prepared = false;
  if (s.prepared_codec == CodecId::kTopKEf) {
    internal::TopKEfApplyDecode(s);
  } else {
    internal::DenseQuantApplyDecode(s);
  }
  return absl::OkStatus();
}

absl::Status DecodeAccumulate(absl::Span<const absl::Span<const uint8_t>> payloads,
                              const DecodeOptions& options, const TensorView& out,
                              DecodeScratch* scratch) {
  std::unique_ptr<DecodeScratch> local;
  if (scratch == nullptr) {
    local = std::make_unique<DecodeScratch>();
    scratch = local.get();
  }
  LBCC_RETURN_IF_ERROR(PrepareDecode(payloads, options, out, scratch));
  return ApplyDecode(scratch);
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
  switch (info.codec) {
    case CodecId::kTopKEf: {
      LBCC_ASSIGN_OR_RETURN(TopKEfHeader h, ParseTopKEfHeader(info));
      std::vector<uint16_t> indices(static_cast<size_t>(h.layout.count()));
      LBCC_RETURN_IF_ERROR(
          h.indices == IndexCoding::kAdaptive
              ? DecodeAdaptive(h.index_section, h.layout, h.adaptive, absl::MakeSpan(indices))
              : DecodePacked12(h.index_section, h.layout, absl::MakeSpan(indices)));
      ValueDecoder values;
      LBCC_RETURN_IF_ERROR(
          values.Init(h.values, h.value_params, h.value_section, h.layout.count()));
      summary.k_per_chunk = h.layout.k;
      summary.selected = h.layout.count();
      const ChunkGeometry& g = h.geometry;
      summary.details = absl::StrFormat(
          "matrix %dx%d in %d chunks of %dx%d, k %d per chunk (density %.4f%%), values %s "
          "(%d bytes), indices %s (%d bytes%s)",
          g.rows, g.cols, g.num_chunks, g.h, g.w, h.layout.k,
          g.num_elements > 0 ? 100.0 * summary.selected / g.num_elements : 0.0,
          std::string(ValueCodingName(h.values)), h.value_section.size() + h.value_params.size(),
          std::string(IndexCodingName(h.indices)), h.index_section.size(),
          h.indices == IndexCoding::kAdaptive
              ? absl::StrFormat(", sub-blocks of %d, Rice %d", 1 << h.adaptive.sub_block_log2,
                                h.adaptive.rice)
              : std::string());
      break;
    }
    case CodecId::kDenseQuant: {
      LBCC_ASSIGN_OR_RETURN(DenseQuantHeader h, ParseDenseQuantHeader(info));
      summary.selected = info.num_elements;
      summary.details =
          absl::StrFormat("format %s, %s rounding%s", std::string(DenseFormatName(h.format)),
                          h.stochastic ? "stochastic" : "nearest",
                          h.block > 0 ? absl::StrFormat(", blocks of %d", h.block) : std::string());
      break;
    }
    default:
      summary.details = "not a codec of this package (envelope checked only)";
      break;
  }
  return summary;
}

}  // namespace lbcc::codecs
