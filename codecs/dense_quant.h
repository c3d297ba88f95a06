// Dense quantizer codec: every element travels, for activations and fast links.
//
// Formats (DenseQuantOptions::format):
//   kInt8, kInt4  blockwise absmax over runs of `block` elements (flat row-major order):
//                 scale = absmax / qmax (qmax 127 or 7, fp32 division; capped at FLT_MAX / 128
//                 or / 8 so decoded values stay finite), q = clamp(round(x /
//                 scale), -qmax, qmax), x_hat = q * scale; an all-zero block has scale 0.
//                 Rounding: to nearest, ties to even; or, with `stochastic`, q = floor(x / scale
//                 + u) with u = CounterUniform(seed, element index) (counter_rng.h): unbiased,
//                 and the same (seed, input) always gives the same payload.
//   kF16, kBf16   round to nearest even (or stochastic: the value rounds up to the next
//                 representable number with probability equal to its distance from the lower
//                 one, same generator); values beyond the format's range are InvalidArgument.
// NaN/Inf in the input: InvalidArgument. Stateless: Encode takes no state (pass nullptr).
//
// Payload (codec id kDenseQuant, version 1, dtype f32, the tensor's shape), params:
//   u8 format | u8 rounding (0 nearest, 1 stochastic; informational) | u16 0 | u32 block
//   (int formats; 0 otherwise)
// Body: kInt8: fp32 scale per block, then one int8 per element; kInt4: the scales, then two
// 4-bit two's-complement codes per byte (low nibble first, zero padding); kF16 / kBf16: two
// bytes per element. Decoders clamp codes to [-qmax, qmax] and reject non-finite or negative
// scales and non-finite 16-bit values (DataLoss).
//
// Thread-safety: DenseQuantCodec is immutable and shareable.
#ifndef LBCC_CODECS_DENSE_QUANT_H_
#define LBCC_CODECS_DENSE_QUANT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codecs/codec.h"
#include "codecs/wire_values.h"

namespace lbcc::codecs {

inline constexpr uint8_t kDenseQuantVersion = 1;

// DenseFormat (wire values): wire_values.h.

absl::string_view DenseFormatName(DenseFormat format);  // "int8", "int4", "fp16", "bf16"
absl::StatusOr<DenseFormat> ParseDenseFormat(absl::string_view name);

struct DenseQuantOptions {
  DenseFormat format = DenseFormat::kInt8;
  int64_t block = 256;  // int formats: elements per scale; a multiple of 16 in [16, 65536]
  bool stochastic = false;
  uint64_t seed = 0;
  absl::Status Validate() const;  // InvalidArgument naming the bad field
  std::string ToString() const;
};

class DenseQuantCodec final : public Codec {
 public:
  static absl::StatusOr<std::unique_ptr<DenseQuantCodec>> Create(const DenseQuantOptions& options);

  const DenseQuantOptions& options() const { return options_; }
  CodecId id() const override { return CodecId::kDenseQuant; }
  std::string Describe() const override { return options_.ToString(); }
  absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t> shape) const override;
  // `state` is ignored (the codec is stateless). See codec.h.
  absl::StatusOr<size_t> Encode(const TensorView& input, CodecState* state,
                                absl::Span<uint8_t> out) const override;

  // Decode-accumulate: Prepare validates every payload's params, scales and codes; Apply
  // aggregates tile by tile (one int8 payload: dequantised straight into the output).
  std::unique_ptr<CodecScratch> NewDecodeScratch() const override;
  absl::Status PrepareDecode(const DecodeCall& call, CodecScratch* scratch) const override;
  void ApplyDecode(const DecodeCall& call, CodecScratch* scratch) const override;
  absl::Status Inspect(const PayloadInfo& info, PayloadSummary* summary) const override;

 private:
  explicit DenseQuantCodec(const DenseQuantOptions& options) : options_(options) {}
  DenseQuantOptions options_;
};

// The parsed params of a dense payload. DataLoss when they or the body length are invalid.
struct DenseQuantHeader {
  DenseFormat format = DenseFormat::kInt8;
  bool stochastic = false;
  int64_t block = 0;
  int64_t num_elements = 0;
  absl::Span<const uint8_t> scales;  // int formats
  absl::Span<const uint8_t> codes;
};
absl::StatusOr<DenseQuantHeader> ParseDenseQuantHeader(const PayloadInfo& info);

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_DENSE_QUANT_H_
