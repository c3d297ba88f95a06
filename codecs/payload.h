// The self-describing envelope every LBCC codec payload travels in.
//
// Wire layout, little-endian, no padding:
//
//   offset  size        field
//   0       4           magic "LBCC"
//   4       1           envelope version (kEnvelopeVersion)
//   5       1           codec format version (each codec numbers its own encodings)
//   6       2           codec id (CodecId; never renumbered)
//   8       1           dtype of the tensor the payload encodes (DType wire id)
//   9       1           rank (<= kMaxRank)
//   10      2           flags (codec-defined; 0 unless the codec says otherwise)
//   12      4           params_bytes: length of the codec parameter block
//   16      8           body_bytes: length of the body
//   24      8 * rank    shape
//   ...     params_bytes  codec parameters (codec-defined)
//   ...     body_bytes    body (codec-defined)
//   end-8   8           XXH3-64 of every byte before it
//
// A payload is written in two steps: PayloadWriter::Begin() lays out the header and hands out
// the params and body regions, the codec fills them, Finish() writes the checksum. ParsePayload()
// validates everything the envelope can validate (magic, versions, id, dtype, rank, shape,
// lengths, checksum) and returns views into the bytes; the codec validates its own params and
// body. Every rejection is DataLoss with a message that says what was wrong.
//
// Thread-safety: stateless functions; a PayloadWriter belongs to one thread.
#ifndef LBCC_CODECS_PAYLOAD_H_
#define LBCC_CODECS_PAYLOAD_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/dtype.h"
#include "base/tensor_view.h"

namespace lbcc::codecs {

// Codec ids on the wire. Never renumber. Ids 1-4 are LBCC's first codecs and are always known
// to the envelope (a relay parses them whether or not it links their decoders). A codec added
// later names its id in its own header (`inline constexpr CodecId kMyCodec{5};`) and claims it
// when it registers (codecs/codec_registry.h); the registry refuses an id claimed twice.
enum class CodecId : uint16_t {
  kTopKEf = 1,            // chunked top-k with error feedback (SparseLoCo)
  kDenseQuant = 2,        // dense quantizer: int8 / 4-bit blockwise absmax, fp16, bf16
  kSubspaceForward = 3,   // activations projected on a subspace basis, plus token ids
  kSubspaceBackward = 4,  // activation gradients projected on a subspace basis
};

// Ids a codec may claim: [1, kMaxCodecId].
inline constexpr uint16_t kMaxCodecId = 1023;

// The codec's name ("topk_ef"), or "unknown" for an id neither built in nor claimed.
absl::string_view CodecName(CodecId id);
// Whether ParsePayload accepts `id`: ids 1-4, and the ids claimed in this process.
bool IsKnownCodec(uint16_t id);
// Claims `id` for the codec `name` (which must outlive the process: a literal or the codec's
// own storage); from then on ParsePayload accepts it and CodecName names it. Called by
// codecs::RegisterCodec, not by codecs themselves. Returns false, claiming nothing, when `id`
// is 0 or above kMaxCodecId, or is built in or claimed under another name; claiming an id
// again under its own name returns true (two copies of one codec library in a process).
// Thread-safe.
bool ClaimCodecId(uint16_t id, absl::string_view name);

inline constexpr char kPayloadMagic[4] = {'L', 'B', 'C', 'C'};
inline constexpr uint8_t kEnvelopeVersion = 1;
inline constexpr size_t kPayloadFixedHeaderBytes = 24;
inline constexpr size_t kPayloadChecksumBytes = 8;

// Total bytes of a payload with the given rank, parameter block and body.
inline constexpr size_t PayloadBytes(size_t rank, size_t params_bytes, size_t body_bytes) {
  return kPayloadFixedHeaderBytes + 8 * rank + params_bytes + body_bytes + kPayloadChecksumBytes;
}

// Bytes of envelope around params and body for a tensor of `rank`.
inline constexpr size_t PayloadOverheadBytes(size_t rank) { return PayloadBytes(rank, 0, 0); }

struct PayloadInfo {
  CodecId codec;
  uint8_t codec_version;
  DType dtype;
  uint16_t flags;
  Shape shape;
  int64_t num_elements;
  absl::Span<const uint8_t> params;
  absl::Span<const uint8_t> body;
  size_t total_bytes;
};

// Validates the envelope of `bytes` (exactly one payload; trailing bytes are an error) and
// returns views into it, valid while `bytes` is. DataLoss for anything malformed: wrong magic,
// unknown envelope version or codec id, invalid dtype, rank > kMaxRank, negative or overflowing
// shape, lengths that disagree with the buffer, checksum mismatch.
absl::StatusOr<PayloadInfo> ParsePayload(absl::Span<const uint8_t> bytes);

// Reads the total length a payload declares from its fixed header and shape, without checking
// the checksum: lets a receiver size a buffer or split a stream of payloads. DataLoss when the
// prefix is malformed or too short to hold the header and shape.
absl::StatusOr<size_t> PeekPayloadBytes(absl::Span<const uint8_t> prefix);
// Where the body starts (the bytes before it: header, shape, params), read the same way: for
// a sender that just wrote the payload and need not check its checksum again.
absl::StatusOr<size_t> PeekPayloadBodyOffset(absl::Span<const uint8_t> prefix);

class PayloadWriter {
 public:
  // Lays out the header for a payload in `out` (which must hold PayloadBytes(rank, params_bytes,
  // body_bytes) bytes; InvalidArgument otherwise, or for a bad shape/dtype). After Begin,
  // params() and body() are the regions to fill.
  absl::Status Begin(absl::Span<uint8_t> out, CodecId codec, uint8_t codec_version, DType dtype,
                     absl::Span<const int64_t> shape, size_t params_bytes, size_t body_bytes,
                     uint16_t flags = 0);
  absl::Span<uint8_t> params() const { return params_; }
  absl::Span<uint8_t> body() const { return body_; }
  // Writes the checksum; returns the payload's total size.
  size_t Finish();

 private:
  absl::Span<uint8_t> out_;
  absl::Span<uint8_t> params_;
  absl::Span<uint8_t> body_;
  size_t total_ = 0;
};

// Little-endian field access for codec params and bodies. The reader never reads past its
// span: every getter returns DataLoss naming `what` when the bytes run out.
class ByteReader {
 public:
  explicit ByteReader(absl::Span<const uint8_t> bytes) : bytes_(bytes) {}
  absl::StatusOr<uint8_t> U8(absl::string_view what);
  absl::StatusOr<uint16_t> U16(absl::string_view what);
  absl::StatusOr<uint32_t> U32(absl::string_view what);
  absl::StatusOr<uint64_t> U64(absl::string_view what);
  absl::StatusOr<float> F32(absl::string_view what);
  absl::StatusOr<absl::Span<const uint8_t>> Bytes(size_t n, absl::string_view what);
  size_t remaining() const { return bytes_.size() - offset_; }
  size_t offset() const { return offset_; }
  // DataLoss unless every byte was consumed.
  absl::Status ExpectEnd(absl::string_view what) const;

 private:
  absl::Span<const uint8_t> bytes_;
  size_t offset_ = 0;
};

class ByteWriter {
 public:
  explicit ByteWriter(absl::Span<uint8_t> bytes) : bytes_(bytes) {}
  // Writing past the end is an LBCC bug (sizes are computed first): checked.
  void U8(uint8_t v);
  void U16(uint16_t v);
  void U32(uint32_t v);
  void U64(uint64_t v);
  void F32(float v);
  void Bytes(absl::Span<const uint8_t> v);
  size_t offset() const { return offset_; }

 private:
  void Put(const void* data, size_t n);
  absl::Span<uint8_t> bytes_;
  size_t offset_ = 0;
};

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_PAYLOAD_H_
