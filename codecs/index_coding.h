// Index codings of the TopK-EF codec: where in each chunk the selected entries are.
//
// Input to every encoder is the list of selected local positions, chunk after chunk, k per
// chunk, strictly ascending inside a chunk, each < chunk_len (<= 4096). Decoders produce the
// same list from untrusted bytes and reject with DataLoss anything a valid encoder would not
// have produced: an index out of its chunk, a repeated or descending index, a count that does
// not add up to k, a length that disagrees with the stream, non-zero padding.
//
// kPacked12: every index in 12 bits, the whole tensor's list as one stream, two indices in three
//   bytes (a | b << 12, little-endian); an odd count ends with a 2-byte word whose top 4 bits
//   are zero. Bytes = ceil(12 * count / 8).
// kAdaptive: per chunk, per sub-block of B = 2^b positions (b = 6 or 7; the last sub-block of a
//   chunk has s = chunk_len - j*B positions when B does not divide chunk_len):
//     count n: Rice code with parameter p (unary n >> p, then the p low bits of n);
//     positions: an s-bit bitmap when s < n * b, otherwise n ascending b-bit local offsets.
//   One LSB-first bit stream (see bitstream.h) for the tensor, zero-padded to a byte.
//   The encoder tries b = 6 and b = 7, each with p = clamp(round_half_even(log2(k * B /
//   chunk_len)), 0, b), and keeps the shorter (b = 6 on a tie); b and p travel in the params.
// kAuto (encoder only): the shorter of the two, kPacked12 on a tie.
//
// Thread-safety: pure functions.
#ifndef LBCC_CODECS_INDEX_CODING_H_
#define LBCC_CODECS_INDEX_CODING_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/bitstream.h"
#include "codecs/wire_values.h"

namespace lbcc::codecs {

// IndexCoding (wire values): wire_values.h.

absl::string_view IndexCodingName(IndexCoding coding);  // "auto", "packed12", "adaptive"

// The geometry the index list follows.
struct IndexLayout {
  int64_t num_chunks = 0;
  int64_t k = 0;          // selected per chunk, 1 <= k <= chunk_len (0 when num_chunks is 0)
  int64_t chunk_len = 0;  // <= 4096
  int64_t count() const { return num_chunks * k; }
};

struct AdaptiveParams {
  int sub_block_log2 = 6;  // b: 6 or 7
  int rice = 0;            // p: 0..b
};

inline size_t Packed12Bytes(int64_t count) { return static_cast<size_t>((count * 12 + 7) / 8); }

// Rice parameter the encoder uses for sub-blocks of 2^b positions.
int AdaptiveRice(const IndexLayout& layout, int sub_block_log2);
// Exact bit length of the adaptive coding of `local` with `params`.
uint64_t AdaptiveBits(absl::Span<const uint16_t> local, const IndexLayout& layout,
                      const AdaptiveParams& params);

// The encoder's choice of b and p (the shorter) and its length in bits.
struct AdaptiveChoice {
  AdaptiveParams params;
  uint64_t bits = 0;
};
AdaptiveChoice ChooseAdaptive(absl::Span<const uint16_t> local, const IndexLayout& layout);

// Upper bound of the adaptive coding's bytes for any valid list with this layout.
size_t AdaptiveMaxBytes(const IndexLayout& layout);

// Encoders: `local` holds layout.count() valid indices; `out` holds exactly the coding's bytes
// (Packed12Bytes(count) or ceil(AdaptiveBits / 8)). Invalid input is an LBCC bug (checked).
void EncodePacked12(absl::Span<const uint16_t> local, absl::Span<uint8_t> out);
void EncodeAdaptive(absl::Span<const uint16_t> local, const IndexLayout& layout,
                    const AdaptiveParams& params, absl::Span<uint8_t> out);

// EncodeAdaptive a few chunks at a time, for an encoder that streams the section while it still
// selects (TopK-EF's streamed encode): the bytes before final_bytes() no longer change, so they
// can be sent before the section is complete. `out` must hold the whole section (for a list
// not yet known: AdaptiveMaxBytes(layout)).
class AdaptiveIndexEncoder {
 public:
  AdaptiveIndexEncoder(const IndexLayout& layout, const AdaptiveParams& params,
                       absl::Span<uint8_t> out);
  // Encodes chunks [chunks_done(), end_chunk); `local` holds at least end_chunk * k valid
  // indices (the first chunks_done() chunks as given before).
  void EncodeChunks(absl::Span<const uint16_t> local, int64_t end_chunk);
  int64_t chunks_done() const { return next_chunk_; }
  size_t final_bytes() const { return writer_.bytes_final(); }
  // After the last chunk: pads the last byte; returns the section's bytes.
  size_t Finish();

 private:
  IndexLayout layout_;
  AdaptiveParams params_;
  BitWriter writer_;
  int64_t next_chunk_ = 0;
};

// Decoders: `bytes` is the whole index section; `out` receives layout.count() indices (it must
// hold that many). DataLoss on anything invalid (see above); `out` may then hold garbage, so
// callers decode into scratch.
absl::Status DecodePacked12(absl::Span<const uint8_t> bytes, const IndexLayout& layout,
                            absl::Span<uint16_t> out);
absl::Status DecodeAdaptive(absl::Span<const uint8_t> bytes, const IndexLayout& layout,
                            const AdaptiveParams& params, absl::Span<uint16_t> out);

namespace internal {
// DecodeAdaptive without the multi-chunk fast path of Rice parameter 0: one chunk after the
// other, as DecodeAdaptive does for p > 0 and for the chunks its fast path turns down. Same
// results and errors as DecodeAdaptive; for tests and benchmarks.
absl::Status DecodeAdaptiveSequential(absl::Span<const uint8_t> bytes, const IndexLayout& layout,
                                      const AdaptiveParams& params, absl::Span<uint16_t> out);
}  // namespace internal

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_INDEX_CODING_H_
