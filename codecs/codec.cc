#include "codecs/codec.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace lbcc::codecs {

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

absl::Status Codec::PrepareDecode(const DecodeCall& /*call*/, CodecScratch* /*scratch*/) const {
  return absl::UnimplementedError(
      absl::StrCat("decode: ", name(), " payloads are not decoded by DecodeAccumulate"));
}

void Codec::ApplyDecode(const DecodeCall& /*call*/, CodecScratch* /*scratch*/) const {}

absl::Status Codec::Inspect(const PayloadInfo& /*info*/, PayloadSummary* summary) const {
  summary->details = "envelope checked only";
  return absl::OkStatus();
}

}  // namespace lbcc::codecs
