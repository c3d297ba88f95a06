// Shared body of the decoder fuzzers (topk_ef_fuzz.cc, dense_quant_fuzz.cc).
//
// Input: one mode byte, then a payload. Mode bit 0 set: the fuzzer stamps its codec's id into
// the header and rewrites the checksum, so mutations reach that codec's own parsing instead of
// stopping at the XXH3 check (mode bit 0 clear fuzzes the envelope and checksum path as is).
// Bits 1-2 pick the aggregation, bit 3 accumulate, bit 4 decodes the payload as two replicas,
// bit 5 sets clip_to_median_norm when the payload's codec clips (Codec::ClipsToMedianNorm).
// Properties checked (abort on violation):
//   - every error is DataLoss (the output always has the payload's shape);
//   - on error the output is untouched;
//   - InspectPayload and DecodeAccumulate agree on validity;
//   - a valid payload decodes to finite values.
//
// Thread-safety: fuzz targets run single-threaded.
#ifndef LBCC_CODECS_DECODE_FUZZ_H_
#define LBCC_CODECS_DECODE_FUZZ_H_

#include <xxhash.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codecs/codec.h"
#include "codecs/codec_registry.h"
#include "codecs/payload.h"

namespace lbcc::codecs::fuzz {

inline constexpr int64_t kMaxElements = int64_t{1} << 20;  // bound the output buffer
inline constexpr float kSentinel = 3.5f;

}  // namespace lbcc::codecs::fuzz

namespace lbcc::codecs {

inline int FuzzDecode(CodecId codec, const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> bytes(data + 1, data + size);
  if ((mode & 1) && bytes.size() >= 8) {
    if (bytes.size() >= 8 + 8) {
      const uint16_t id = static_cast<uint16_t>(codec);
      std::memcpy(bytes.data() + 6, &id, 2);
    }
    const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
  }
  const absl::StatusOr<PayloadSummary> summary = InspectPayload(bytes);
  if (!summary.ok() && summary.status().code() != absl::StatusCode::kDataLoss) std::abort();
  const absl::StatusOr<PayloadInfo> info = ParsePayload(bytes);
  if (!info.ok()) {
    if (summary.ok()) std::abort();
    return 0;
  }
  if (info->num_elements > fuzz::kMaxElements) return 0;
  std::vector<float> out(static_cast<size_t>(info->num_elements), fuzz::kSentinel);
  absl::StatusOr<TensorView> view = TensorView::Host(out.data(), info->shape);
  if (!view.ok()) std::abort();
  DecodeOptions options;
  options.aggregation = static_cast<Aggregation>(((mode >> 1) & 3) % 3);
  options.accumulate = (mode >> 3) & 1;
  const Codec* decoder = FindCodec(info->codec);
  options.clip_to_median_norm =
      ((mode >> 5) & 1) && decoder != nullptr && decoder->ClipsToMedianNorm();
  const absl::Span<const uint8_t> span(bytes);
  const absl::Span<const uint8_t> spans[2] = {span, span};
  const size_t count = (mode >> 4) & 1 ? 2 : 1;
  DecodeScratch scratch;
  const absl::Status status =
      DecodeAccumulate(absl::MakeConstSpan(spans, count), options, *view, &scratch);
  // A codec registered in this binary that decodes by aggregation (not, say, one needing a
  // subspace basis): its rejections must be DataLoss and agree with InspectPayload.
  const bool decodable =
      FindCodec(info->codec) != nullptr && status.code() != absl::StatusCode::kUnimplemented;
  if (!status.ok()) {
    if (decodable && status.code() != absl::StatusCode::kDataLoss) std::abort();
    if (decodable && summary.ok()) std::abort();
    for (float v : out) {
      if (v != fuzz::kSentinel) std::abort();
    }
    return 0;
  }
  if (!summary.ok()) std::abort();
  if (!options.accumulate && count == 1) {
    for (float v : out) {
      if (!std::isfinite(v)) std::abort();
    }
  }
  return 0;
}

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_DECODE_FUZZ_H_
