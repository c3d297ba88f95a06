// The subspace payloads' wire format (subspace_codec.h): parsing and checking a payload's header
// and body, and writing its envelope, parameters, selectors and token ids. The CPU codec
// (subspace_codec.cc) and kernels/device_subspace.cc both read and write payloads through these.
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/byte_io.h"
#include "codecs/payload.h"
#include "codecs/subspace_codec.h"

namespace lbcc::codecs {
namespace {

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt subspace payload: ", what));
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool IsSubspaceCoefficientDType(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kI8;
}

absl::StatusOr<SubspacePayloadHeader> ParseSubspaceHeader(const PayloadInfo& info) {
  SubspacePayloadHeader h;
  if (info.codec == CodecId::kSubspaceForward) {
    h.direction = SubspaceDirection::kForward;
  } else if (info.codec == CodecId::kSubspaceBackward) {
    h.direction = SubspaceDirection::kBackward;
  } else {
    return Corrupt(absl::StrCat("codec is ", CodecName(info.codec), ", not subspace"));
  }
  if (info.codec_version != kSubspaceCodecVersion) {
    return Corrupt(absl::StrCat("unknown codec version ", info.codec_version, " (this build reads ",
                                kSubspaceCodecVersion, ")"));
  }
  if (info.dtype != DType::kF32) {
    return Corrupt(absl::StrCat("activation dtype ", DTypeName(info.dtype), ", expected f32"));
  }
  if (info.flags != 0) return Corrupt(absl::StrCat("unknown flags ", info.flags));
  if (info.shape.size() != 2) {
    return Corrupt(absl::StrCat("rank ", info.shape.size(), ", expected [tokens, d]"));
  }
  h.tokens = info.shape[0];
  h.model_dim = info.shape[1];
  if (h.model_dim < 1 || h.model_dim > kSubspaceMaxModelDim) {
    return Corrupt(absl::StrCat("model dim ", h.model_dim, " out of range"));
  }
  if (h.tokens > INT32_MAX) return Corrupt(absl::StrCat("too many tokens: ", h.tokens));
  if (info.params.size() != kSubspaceParamsBytes) {
    return Corrupt(absl::StrCat("params block of ", info.params.size(), " bytes, expected ",
                                kSubspaceParamsBytes));
  }
  ByteReader r(info.params);
  LBCC_ASSIGN_OR_RETURN(h.basis.hash, r.U64("basis hash"));
  LBCC_ASSIGN_OR_RETURN(h.basis.version, r.U32("basis version"));
  LBCC_ASSIGN_OR_RETURN(const uint32_t k, r.U32("k"));
  LBCC_ASSIGN_OR_RETURN(const uint32_t v, r.U32("vocabulary"));
  LBCC_ASSIGN_OR_RETURN(const uint16_t m, r.U16("components"));
  LBCC_ASSIGN_OR_RETURN(const uint16_t mixture_block, r.U16("mixture block"));
  LBCC_ASSIGN_OR_RETURN(const uint16_t int8_block, r.U16("int8 block"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t dtype, r.U8("coefficient dtype"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t id_width, r.U8("id width"));
  LBCC_RETURN_IF_ERROR(r.ExpectEnd("params"));
  h.rank = k;
  h.components = m;
  h.vocab_size = v;
  h.id_width = id_width;
  h.mixture_block = mixture_block;
  h.int8_block = int8_block;
  if (h.rank < 1 || h.rank > h.model_dim) {
    return Corrupt(absl::StrCat("k = ", h.rank, " outside [1, d = ", h.model_dim, "]"));
  }
  if (m < 1 || m > kSubspaceMaxComponents) return Corrupt(absl::StrCat("M = ", m));
  if (v > static_cast<uint32_t>(kSubspaceMaxVocab)) return Corrupt(absl::StrCat("V = ", v));
  if (h.direction == SubspaceDirection::kForward) {
    if (id_width != SubspaceIdWidth(v)) {
      return Corrupt(absl::StrCat("id width ", int{id_width}, " for V = ", v, ", expected ",
                                  SubspaceIdWidth(v)));
    }
  } else if (v != 0 || id_width != 0) {
    return Corrupt("a backward payload carries a vocabulary or ids");
  }
  if ((m == 1) != (mixture_block == 0)) {
    return Corrupt(absl::StrCat("mixture block ", mixture_block, " with M = ", m));
  }
  h.num_selectors = m > 1 ? CeilDiv(h.tokens, mixture_block) : 0;
  if (!IsValidDType(dtype) || !IsSubspaceCoefficientDType(static_cast<DType>(dtype))) {
    return Corrupt(absl::StrCat("coefficient dtype ", int{dtype}));
  }
  h.coefficient_dtype = static_cast<DType>(dtype);
  if ((h.coefficient_dtype == DType::kI8) != (int8_block != 0)) {
    return Corrupt(absl::StrCat("int8 block ", int8_block, " with coefficient dtype ",
                                DTypeName(h.coefficient_dtype)));
  }
  // Every token holds at least k >= 1 coefficient bytes: bounding tokens * k by the body length
  // keeps the layout arithmetic exact.
  const uint64_t body = info.body.size();
  if (static_cast<uint64_t>(h.tokens) > body / static_cast<uint64_t>(h.rank)) {
    return Corrupt(absl::StrCat("body of ", body, " bytes is too short for ", h.tokens,
                                " tokens of ", h.rank, " coefficients"));
  }
  const SubspaceBodyLayout layout = SubspaceLayout(h.tokens, h.rank, h.num_selectors,
                                                   h.id_width, h.coefficient_dtype, h.int8_block);
  if (layout.total() != body) {
    return Corrupt(absl::StrCat("body of ", body, " bytes, the header implies ", layout.total()));
  }
  h.total_bytes = info.total_bytes;
  return h;
}

// CheckSubspaceBody locates the body from the payload's end, so the span from the body to the
// end of the checksum serves.
absl::Span<const uint8_t> SubspaceBodyToEnd(const PayloadInfo& info) {
  return absl::MakeConstSpan(info.body.data(), info.body.size() + kPayloadChecksumBytes);
}

absl::StatusOr<SubspacePayloadHeader> InspectSubspacePayload(absl::Span<const uint8_t> payload) {
  LBCC_ASSIGN_OR_RETURN(PayloadInfo info, ParsePayload(payload));
  return ParseSubspaceHeader(info);
}

absl::StatusOr<int64_t> BackwardSelectorBlock(const SubspaceSelectors& selectors,
                                              int64_t components, int64_t tokens,
                                              int64_t default_block) {
  if (components == 1) {
    if (!selectors.values.empty()) {
      return absl::InvalidArgumentError("a single basis takes no selectors");
    }
    return default_block;
  }
  const int64_t block = selectors.mixture_block;
  if (block < 1 || block > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("selector mixture_block ", block, " outside [1, 65535]"));
  }
  if (static_cast<int64_t>(selectors.values.size()) != CeilDiv(tokens, block)) {
    return absl::InvalidArgumentError(absl::StrCat(selectors.values.size(), " selectors for ",
                                                   tokens, " tokens in blocks of ", block));
  }
  for (uint8_t s : selectors.values) {
    if (s >= components) {
      return absl::InvalidArgumentError(
          absl::StrCat("selector ", int{s}, " outside [0, M = ", components, ")"));
    }
  }
  return block;
}

absl::Status CheckSubspaceHeaderForDecode(const SubspacePayloadHeader& h,
                                          SubspaceDirection direction, const SubspaceBasis& b) {
  const bool forward = direction == SubspaceDirection::kForward;
  if (h.direction != direction) {
    return Corrupt(forward ? "a backward payload given to the forward decoder"
                           : "a forward payload given to the backward decoder");
  }
  const int64_t expected_vocab = forward ? b.vocab_size() : 0;
  if (h.basis != b.id()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "payload was encoded with basis ", h.basis.ToString(), " (d ", h.model_dim, ", k ",
        h.rank, ", M ", h.components, ", V ", h.vocab_size, "); this codec holds ",
        b.id().ToString(), " (d ", b.model_dim(), ", k ", b.rank(), ", M ", b.components(),
        ", V ", expected_vocab, ")"));
  }
  if (h.model_dim != b.model_dim() || h.rank != b.rank() || h.components != b.components() ||
      h.vocab_size != expected_vocab) {
    return Corrupt(absl::StrCat("names basis ", h.basis.ToString(), " but its shape (d ",
                                h.model_dim, ", k ", h.rank, ", M ", h.components, ", V ",
                                h.vocab_size, ") disagrees with it"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SubspaceBody> CheckSubspaceBody(absl::Span<const uint8_t> payload,
                                               const SubspacePayloadHeader& h) {
  SubspaceBody body;
  body.layout = SubspaceLayout(h.tokens, h.rank, h.num_selectors, h.id_width,
                               h.coefficient_dtype, h.int8_block);
  const SubspaceBodyLayout& layout = body.layout;
  body.selectors =
      payload.data() + (payload.size() - kPayloadChecksumBytes - layout.total());
  body.ids = body.selectors + layout.selectors;
  body.scales = body.ids + layout.ids;
  body.coefficients = body.scales + layout.scales;
  for (int64_t s = 0; s < h.num_selectors; ++s) {
    if (body.selectors[s] >= h.components) {
      return Corrupt(absl::StrCat("selector ", int{body.selectors[s]}, " of block ", s,
                                  " outside [0, M = ", h.components, ")"));
    }
  }
  for (int64_t t = 0; t < h.tokens && h.id_width > 0; ++t) {
    const uint32_t id = LoadSubspaceId(body.ids + t * h.id_width, h.id_width);
    if (id >= static_cast<uint64_t>(h.vocab_size)) {
      return Corrupt(absl::StrCat("token id ", id, " at position ", t, " outside [0, V = ",
                                  h.vocab_size, ")"));
    }
  }
  const int64_t scale_count = layout.scales / 4;
  for (int64_t s = 0; s < scale_count; ++s) {
    const float scale = byte_io::Load<float>(body.scales + 4 * s);
    if (!(scale >= 0)) return Corrupt(absl::StrCat("int8 scale ", scale, " is negative or NaN"));
  }
  return body;
}

absl::StatusOr<uint8_t*> BeginSubspacePayload(const SubspaceBasis& b,
                                              SubspaceDirection direction, int64_t tokens,
                                              int64_t block, DType dtype, int64_t int8_block,
                                              const uint8_t* selectors, const int32_t* ids,
                                              absl::Span<uint8_t> out, PayloadWriter* writer) {
  const bool forward = direction == SubspaceDirection::kForward;
  const int64_t k = b.rank(), m = b.components();
  const int id_width = forward ? b.id_width() : 0;
  const int64_t num_selectors = m > 1 ? CeilDiv(tokens, block) : 0;
  const SubspaceBodyLayout layout =
      SubspaceLayout(tokens, k, num_selectors, id_width, dtype, int8_block);
  const Shape shape = {tokens, b.model_dim()};
  LBCC_RETURN_IF_ERROR(writer->Begin(
      out, forward ? CodecId::kSubspaceForward : CodecId::kSubspaceBackward, kSubspaceCodecVersion,
      DType::kF32, shape, kSubspaceParamsBytes, layout.total()));
  ByteWriter params(writer->params());
  params.U64(b.id().hash);
  params.U32(b.id().version);
  params.U32(static_cast<uint32_t>(k));
  params.U32(forward ? static_cast<uint32_t>(b.vocab_size()) : 0u);
  params.U16(static_cast<uint16_t>(m));
  params.U16(m > 1 ? static_cast<uint16_t>(block) : 0);
  params.U16(static_cast<uint16_t>(int8_block));
  params.U8(static_cast<uint8_t>(dtype));
  params.U8(static_cast<uint8_t>(id_width));
  uint8_t* p = writer->body().data();
  if (num_selectors > 0) std::memcpy(p, selectors, layout.selectors);
  p += layout.selectors;
  for (int64_t t = 0; t < tokens && id_width > 0; ++t) {
    const uint32_t id = static_cast<uint32_t>(ids[t]);
    for (int byte = 0; byte < id_width; ++byte) *p++ = static_cast<uint8_t>(id >> (8 * byte));
  }
  return p;
}

}  // namespace lbcc::codecs
