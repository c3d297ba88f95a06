#include "codecs/payload.h"

#include <xxhash.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "codecs/byte_io.h"

namespace lbcc::codecs {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "LBCC payloads assume little-endian");

using byte_io::Load;
using byte_io::Store;

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt LBCC payload: ", what));
}

struct Envelope {
  uint8_t codec_version;
  CodecId codec;
  DType dtype;
  uint16_t flags;
  Shape shape;
  int64_t num_elements;
  uint32_t params_bytes;
  uint64_t body_bytes;
  size_t header_bytes;  // fixed header + shape
  size_t total_bytes;
};

absl::StatusOr<Envelope> ParseEnvelope(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kPayloadFixedHeaderBytes) {
    return Corrupt(absl::StrCat("truncated: ", bytes.size(), " bytes, a header needs ",
                                kPayloadFixedHeaderBytes));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kPayloadMagic, 4) != 0) return Corrupt("bad magic (not an LBCC payload)");
  if (p[4] != kEnvelopeVersion) {
    return Corrupt(absl::StrCat("unknown envelope version ", p[4], " (this build reads ",
                                kEnvelopeVersion, ")"));
  }
  Envelope e;
  e.codec_version = p[5];
  const uint16_t codec = Load<uint16_t>(p + 6);
  if (!IsKnownCodec(codec)) return Corrupt(absl::StrCat("unknown codec id ", codec));
  e.codec = static_cast<CodecId>(codec);
  if (!IsValidDType(p[8])) return Corrupt(absl::StrCat("invalid dtype ", p[8]));
  e.dtype = static_cast<DType>(p[8]);
  const uint8_t rank = p[9];
  if (rank > kMaxRank) return Corrupt(absl::StrCat("rank ", rank, " exceeds ", kMaxRank));
  e.flags = Load<uint16_t>(p + 10);
  e.params_bytes = Load<uint32_t>(p + 12);
  e.body_bytes = Load<uint64_t>(p + 16);
  e.header_bytes = kPayloadFixedHeaderBytes + 8 * size_t{rank};
  if (bytes.size() < e.header_bytes) return Corrupt("truncated in the shape");
  for (int i = 0; i < rank; ++i) e.shape.push_back(Load<int64_t>(p + kPayloadFixedHeaderBytes + 8 * i));
  absl::StatusOr<int64_t> count = NumElements(e.shape);
  if (!count.ok()) return Corrupt(count.status().message());
  e.num_elements = *count;
  // Lengths are untrusted: add them without overflow.
  const uint64_t limit = UINT64_MAX - e.header_bytes - kPayloadChecksumBytes - e.params_bytes;
  if (e.body_bytes > limit) return Corrupt("body length overflows");
  e.total_bytes = e.header_bytes + e.params_bytes + e.body_bytes + kPayloadChecksumBytes;
  return e;
}

absl::string_view BuiltInCodecName(uint16_t id) {
  switch (static_cast<CodecId>(id)) {
    case CodecId::kTopKEf:
      return "topk_ef";
    case CodecId::kDenseQuant:
      return "dense_quant";
    case CodecId::kSubspaceForward:
      return "subspace_forward";
    case CodecId::kSubspaceBackward:
      return "subspace_backward";
  }
  return absl::string_view();
}

// Names of the claimed ids beyond the built-in ones, indexed by id: written once (compare and
// swap) and then only read, so lookups take no lock. Zero-initialised before any static
// constructor runs, so codecs may claim ids from theirs.
struct ClaimedName {
  absl::string_view name;
};
std::atomic<const ClaimedName*> g_claimed[kMaxCodecId + 1];

}  // namespace

absl::string_view CodecName(CodecId id) {
  const uint16_t raw = static_cast<uint16_t>(id);
  const absl::string_view built_in = BuiltInCodecName(raw);
  if (!built_in.empty()) return built_in;
  if (raw <= kMaxCodecId) {
    if (const ClaimedName* c = g_claimed[raw].load(std::memory_order_acquire)) return c->name;
  }
  return "unknown";
}

bool IsKnownCodec(uint16_t id) {
  if (id >= static_cast<uint16_t>(CodecId::kTopKEf) &&
      id <= static_cast<uint16_t>(CodecId::kSubspaceBackward)) {
    return true;
  }
  return id <= kMaxCodecId && g_claimed[id].load(std::memory_order_acquire) != nullptr;
}

bool ClaimCodecId(uint16_t id, absl::string_view name) {
  if (id == 0 || id > kMaxCodecId || name.empty()) return false;
  const absl::string_view built_in = BuiltInCodecName(id);
  if (!built_in.empty()) return built_in == name;
  const ClaimedName* current = g_claimed[id].load(std::memory_order_acquire);
  if (current == nullptr) {
    // Never freed: names are read without a lock for the life of the process.
    auto* claim = new ClaimedName{name};
    if (g_claimed[id].compare_exchange_strong(current, claim, std::memory_order_acq_rel)) {
      return true;
    }
    delete claim;  // another thread claimed it first; `current` is theirs
  }
  return current->name == name;
}

absl::StatusOr<size_t> PeekPayloadBytes(absl::Span<const uint8_t> prefix) {
  absl::StatusOr<Envelope> e = ParseEnvelope(prefix);
  if (!e.ok()) return e.status();
  return e->total_bytes;
}

absl::StatusOr<size_t> PeekPayloadBodyOffset(absl::Span<const uint8_t> prefix) {
  absl::StatusOr<Envelope> e = ParseEnvelope(prefix);
  if (!e.ok()) return e.status();
  return e->header_bytes + e->params_bytes;
}

absl::StatusOr<PayloadInfo> ParsePayload(absl::Span<const uint8_t> bytes) {
  absl::StatusOr<Envelope> e = ParseEnvelope(bytes);
  if (!e.ok()) return e.status();
  if (bytes.size() != e->total_bytes) {
    return Corrupt(absl::StrCat(bytes.size() < e->total_bytes ? "truncated" : "trailing bytes",
                                ": header declares ", e->total_bytes, " bytes, got ",
                                bytes.size()));
  }
  const size_t checked = e->total_bytes - kPayloadChecksumBytes;
  const uint64_t expected = Load<uint64_t>(bytes.data() + checked);
  const uint64_t actual = XXH3_64bits(bytes.data(), checked);
  if (expected != actual) return Corrupt("checksum mismatch");
  PayloadInfo info;
  info.codec = e->codec;
  info.codec_version = e->codec_version;
  info.dtype = e->dtype;
  info.flags = e->flags;
  info.shape = std::move(e->shape);
  info.num_elements = e->num_elements;
  info.params = bytes.subspan(e->header_bytes, e->params_bytes);
  info.body = bytes.subspan(e->header_bytes + e->params_bytes, e->body_bytes);
  info.total_bytes = e->total_bytes;
  return info;
}

absl::Status PayloadWriter::Begin(absl::Span<uint8_t> out, CodecId codec, uint8_t codec_version,
                                  DType dtype, absl::Span<const int64_t> shape,
                                  size_t params_bytes, size_t body_bytes, uint16_t flags) {
  absl::StatusOr<int64_t> count = NumElements(shape);
  if (!count.ok()) return count.status();
  if (!IsValidDType(static_cast<uint8_t>(dtype))) {
    return absl::InvalidArgumentError("invalid dtype for a payload");
  }
  if (params_bytes > UINT32_MAX) return absl::InvalidArgumentError("codec params too large");
  const size_t total = PayloadBytes(shape.size(), params_bytes, body_bytes);
  if (out.size() < total) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload buffer holds ", out.size(), " bytes, needs ", total));
  }
  uint8_t* p = out.data();
  std::memcpy(p, kPayloadMagic, 4);
  p[4] = kEnvelopeVersion;
  p[5] = codec_version;
  Store<uint16_t>(p + 6, static_cast<uint16_t>(codec));
  p[8] = static_cast<uint8_t>(dtype);
  p[9] = static_cast<uint8_t>(shape.size());
  Store<uint16_t>(p + 10, flags);
  Store<uint32_t>(p + 12, static_cast<uint32_t>(params_bytes));
  Store<uint64_t>(p + 16, body_bytes);
  for (size_t i = 0; i < shape.size(); ++i) {
    Store<int64_t>(p + kPayloadFixedHeaderBytes + 8 * i, shape[i]);
  }
  const size_t header = kPayloadFixedHeaderBytes + 8 * shape.size();
  out_ = out.subspan(0, total);
  params_ = out.subspan(header, params_bytes);
  body_ = out.subspan(header + params_bytes, body_bytes);
  total_ = total;
  return absl::OkStatus();
}

size_t PayloadWriter::Finish() {
  LBCC_CHECK_GT(total_, 0u) << "Finish() without Begin()";
  const size_t checked = total_ - kPayloadChecksumBytes;
  Store<uint64_t>(out_.data() + checked, XXH3_64bits(out_.data(), checked));
  const size_t total = total_;
  total_ = 0;
  return total;
}

absl::StatusOr<uint8_t> ByteReader::U8(absl::string_view what) {
  auto b = Bytes(1, what);
  if (!b.ok()) return b.status();
  return (*b)[0];
}

absl::StatusOr<uint16_t> ByteReader::U16(absl::string_view what) {
  auto b = Bytes(2, what);
  if (!b.ok()) return b.status();
  return Load<uint16_t>(b->data());
}

absl::StatusOr<uint32_t> ByteReader::U32(absl::string_view what) {
  auto b = Bytes(4, what);
  if (!b.ok()) return b.status();
  return Load<uint32_t>(b->data());
}

absl::StatusOr<uint64_t> ByteReader::U64(absl::string_view what) {
  auto b = Bytes(8, what);
  if (!b.ok()) return b.status();
  return Load<uint64_t>(b->data());
}

absl::StatusOr<float> ByteReader::F32(absl::string_view what) {
  auto b = Bytes(4, what);
  if (!b.ok()) return b.status();
  return Load<float>(b->data());
}

absl::StatusOr<absl::Span<const uint8_t>> ByteReader::Bytes(size_t n, absl::string_view what) {
  if (n > remaining()) {
    return Corrupt(absl::StrCat("truncated reading ", what, ": need ", n, " bytes, ",
                                remaining(), " left"));
  }
  absl::Span<const uint8_t> out = bytes_.subspan(offset_, n);
  offset_ += n;
  return out;
}

absl::Status ByteReader::ExpectEnd(absl::string_view what) const {
  if (remaining() != 0) return Corrupt(absl::StrCat(remaining(), " unexpected bytes after ", what));
  return absl::OkStatus();
}

void ByteWriter::Put(const void* data, size_t n) {
  LBCC_CHECK_LE(offset_ + n, bytes_.size()) << "ByteWriter overflow";
  std::memcpy(bytes_.data() + offset_, data, n);
  offset_ += n;
}

void ByteWriter::U8(uint8_t v) { Put(&v, 1); }
void ByteWriter::U16(uint16_t v) { Put(&v, 2); }
void ByteWriter::U32(uint32_t v) { Put(&v, 4); }
void ByteWriter::U64(uint64_t v) { Put(&v, 8); }
void ByteWriter::F32(float v) { Put(&v, 4); }
void ByteWriter::Bytes(absl::Span<const uint8_t> v) { Put(v.data(), v.size()); }

}  // namespace lbcc::codecs
