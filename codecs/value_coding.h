// Value codings of the TopK-EF codec: how the selected values of one tensor travel.
//
// The encoder gets the selected values in payload order (chunk after chunk, ascending position
// inside a chunk), writes the coding's parameters and section, and replaces each value by its
// reconstruction: exactly what the decoder will produce, so the caller subtracts it from the
// error-feedback buffer.
//
//   kF32                raw fp32 (reconstruction exact)
//   kBf16, kF16         round to nearest even; a value beyond the format's range saturates to
//                       its largest finite value (the error feedback keeps the rest)
//   kBinMean2/4/8       SparseLoCo's quantizer with 4, 16 or 256 bins over ALL values of the
//                       tensor (BinMeanQuantize below); params: shift, lookup[bins] (fp32);
//                       codes bit-packed low bits first (4, 2 or 1 per byte)
//   kAbsmax8, kAbsmax4  blockwise absmax over runs of `block` consecutive values: scale =
//                       absmax / qmax (qmax 127 or 7; capped at FLT_MAX / 128 or / 8), q =
//                       clamp(round_half_even(v / scale),
//                       -qmax, qmax), reconstruction q * scale (0 when absmax is 0); params:
//                       block (u32); section: fp32 scales, then codes (int8, or 4-bit two's
//                       complement, low nibble first)
//
// Bin-mean quantizer, in this exact fp32 operation order (n = number of values, bins = 2^bits,
// range = range_sigmas, default 6):
//   shift = fp32(sum(v) / n)               sum in double, 4 lanes (lane i % 4) added as
//                                          (l0 + l1) + (l2 + l3); shift = 0 when n = 0
//   c_i   = v_i - shift                    fp32
//   norm  = fp32(sqrt(sum(c_i^2)))         squares and sum in double, same 4-lane order
//   sigma = norm / fp32(sqrt(n - 1))       fp32; 0 when n <= 1
//   scale = (range * sigma) / bins         fp32; 1 when that is 0, NaN or infinite
//   q_i   = clamp(round_half_even(c_i / scale + bins / 2), 0, bins - 1)   fp32 ops
//   lookup[b] = fp32(sum of c_i with q_i == b (double, in order) / their count); 0 if none
//   reconstruction v_hat_i = lookup[q_i] + shift (fp32)
// PyTorch's reference reduces in fp32 in its own order, so its shift and scale can differ from
// these in the last bit; given shift and scale, every other step is the reference's.
//
// Decoders validate before use: parameters finite, section length exact, padding zero, raw
// values finite; DataLoss otherwise. Corrupt codes cannot overflow: absmax codes outside
// [-qmax, qmax] are clamped.
//
// Thread-safety: pure functions; a ValueDecoder is immutable after Init.
#ifndef LBCC_CODECS_VALUE_CODING_H_
#define LBCC_CODECS_VALUE_CODING_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/wire_values.h"

namespace lbcc::codecs {

// ValueCoding (wire values): wire_values.h.

// "fp32", "bf16", "fp16", "binmean2", "binmean4", "binmean8", "absmax8", "absmax4".
absl::string_view ValueCodingName(ValueCoding coding);
// The names above, plus "2bit" for binmean2. InvalidArgument otherwise.
absl::StatusOr<ValueCoding> ParseValueCoding(absl::string_view name);
bool IsValidValueCoding(uint8_t value);
bool IsBinMean(ValueCoding coding);
bool IsAbsmax(ValueCoding coding);
// Bits per value of the codes (32, 16, 2, 4, 8), scales and tables not counted.
int ValueCodeBits(ValueCoding coding);

// Bytes of the coding's parameter block and section for `count` values (`block`: absmax run).
size_t ValueParamBytes(ValueCoding coding);
size_t ValueSectionBytes(ValueCoding coding, int64_t count, int64_t block);

struct ValueEncodeOptions {
  float range_sigmas = 6.0f;  // bin-mean range
  int64_t block = 64;         // absmax run length, >= 1
};

// `values` in: the selected values (finite); out: their reconstructions. `params` and `section`
// must have exactly ValueParamBytes / ValueSectionBytes bytes. `centered` and `codes` are
// scratch of at least values.size() entries (used by the bin-mean codings).
void EncodeValues(ValueCoding coding, const ValueEncodeOptions& options, absl::Span<float> values,
                  absl::Span<uint8_t> params, absl::Span<uint8_t> section,
                  absl::Span<float> centered, absl::Span<uint8_t> codes);

// SparseLoCo's bin-mean quantizer on its own (what EncodeValues uses): codes[i] = q_i and
// centered[i] = c_i (both at least values.size() entries).
struct BinMeanResult {
  float shift = 0;
  float scale = 1;
  int bins = 0;
  std::array<float, 256> lookup{};
};
BinMeanResult BinMeanQuantize(absl::Span<const float> values, int bits, float range_sigmas,
                              absl::Span<float> centered, absl::Span<uint8_t> codes);

class ValueDecoder {
 public:
  // Validates the parameters and section of `count` values; the spans must outlive the decoder.
  // DataLoss when anything is inconsistent or non-finite.
  absl::Status Init(ValueCoding coding, absl::Span<const uint8_t> params,
                    absl::Span<const uint8_t> section, int64_t count);
  // out[0..n) = values [first, first + n); requires first + n <= count.
  void Decode(int64_t first, int64_t n, float* out) const;
  ValueCoding coding() const { return coding_; }
  int64_t block() const { return block_; }
  // 2-bit bin-mean only (for fused decode loops): value t is quad()[4 * code_bytes()[t / 4] +
  // t % 4], what Decode() writes.
  const float* quad() const { return quad_[0].data(); }
  const uint8_t* code_bytes() const { return codes_; }

 private:
  ValueCoding coding_ = ValueCoding::kF32;
  int64_t count_ = 0;
  int64_t block_ = 0;
  const uint8_t* codes_ = nullptr;
  const uint8_t* scales_ = nullptr;  // absmax: fp32 per block (unaligned)
  std::array<float, 256> table_{};   // bin-mean: lookup[b] + shift
  // 2-bit bin-mean: the four values of every code byte.
  std::array<std::array<float, 4>, 256> quad_{};
};

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_VALUE_CODING_H_
