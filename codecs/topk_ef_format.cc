// TopK-EF's wire format (topk_ef.h, module comment): the fixed params every encoder writes
// (this CPU codec, kernels/topk_device.cc) and the header every decoder parses.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "base/tensor_view.h"
#include "codecs/payload.h"
#include "codecs/topk_ef.h"

namespace lbcc::codecs {
namespace {

constexpr size_t kFixedParamBytes = 16;  // version 1; version 2 adds the chunking byte

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt topk_ef payload: ", what));
}

}  // namespace

namespace internal {

absl::Status StillPending() {
  return absl::FailedPreconditionError(
      "topk_ef: the previous update is still pending; Commit() or Abort() it first");
}

absl::Status ShapeDiffers(absl::Span<const int64_t> shape, absl::Span<const int64_t> state_shape) {
  return absl::InvalidArgumentError(absl::StrCat("topk_ef: delta shape ", ShapeToString(shape),
                                                 " differs from the state's ",
                                                 ShapeToString(state_shape)));
}

absl::Status NothingPending(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat("topk_ef state: nothing to ", what));
}

}  // namespace internal

size_t TopKEfFixedParamBytes(Chunking chunking) {
  return chunking == Chunking::kShapeAware ? kFixedParamBytes : kFixedParamBytes + 1;
}

absl::Status BeginTopKEfPayload(const TopKEfFixedParams& p, absl::Span<const int64_t> shape,
                                size_t value_param_bytes, size_t value_bytes,
                                absl::Span<uint8_t> out, PayloadWriter* writer) {
  const bool shape_aware = p.chunking == Chunking::kShapeAware;
  LBCC_RETURN_IF_ERROR(writer->Begin(out, CodecId::kTopKEf,
                                     shape_aware ? kTopKEfVersion : kTopKEfVersionChunking,
                                     DType::kF32, shape,
                                     TopKEfFixedParamBytes(p.chunking) + value_param_bytes,
                                     p.index_bytes + value_bytes));
  const bool adaptive = p.indices == IndexCoding::kAdaptive;
  ByteWriter params(writer->params());
  params.U32(static_cast<uint32_t>(p.k));
  params.U8(static_cast<uint8_t>(p.values));
  params.U8(static_cast<uint8_t>(p.indices));
  params.U8(adaptive ? static_cast<uint8_t>(p.adaptive.sub_block_log2) : 0);
  params.U8(adaptive ? static_cast<uint8_t>(p.adaptive.rice) : 0);
  params.U64(p.index_bytes);
  if (!shape_aware) params.U8(static_cast<uint8_t>(p.chunking));
  return absl::OkStatus();
}

absl::StatusOr<TopKEfHeader> ParseTopKEfHeader(const PayloadInfo& info) {
  if (info.codec != CodecId::kTopKEf) return Corrupt("not a topk_ef payload");
  if (info.codec_version != kTopKEfVersion && info.codec_version != kTopKEfVersionChunking) {
    return Corrupt(absl::StrCat("unknown topk_ef version ", info.codec_version,
                                " (this build reads ", kTopKEfVersion, " and ",
                                kTopKEfVersionChunking, ")"));
  }
  if (info.dtype != DType::kF32) {
    return Corrupt(absl::StrCat("dtype ", DTypeName(info.dtype), " (topk_ef carries f32)"));
  }
  if (info.flags != 0) return Corrupt(absl::StrCat("unknown flags ", info.flags));
  TopKEfHeader h;
  h.version = info.codec_version;
  ByteReader params(info.params);
  LBCC_ASSIGN_OR_RETURN(const uint32_t k, params.U32("k"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t value_coding, params.U8("value coding"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t index_coding, params.U8("index coding"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t sub_block_log2, params.U8("sub-block size"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t rice, params.U8("Rice parameter"));
  LBCC_ASSIGN_OR_RETURN(const uint64_t index_bytes, params.U64("index section length"));
  if (h.version == kTopKEfVersionChunking) {
    LBCC_ASSIGN_OR_RETURN(const uint8_t chunking, params.U8("chunking"));
    if (chunking > static_cast<uint8_t>(Chunking::kFlat1D)) {
      return Corrupt(absl::StrCat("unknown chunking ", chunking));
    }
    h.chunking = static_cast<Chunking>(chunking);
  }
  absl::StatusOr<ChunkGeometry> g = MakeChunkGeometry(info.shape, h.chunking);
  if (!g.ok()) return Corrupt(g.status().message());
  h.geometry = *g;
  if (h.geometry.num_chunks == 0 ? k != 0 : (k < 1 || k > h.geometry.chunk_len)) {
    return Corrupt(absl::StrCat("k ", k, " for chunks of ", h.geometry.chunk_len));
  }
  if (!IsValidValueCoding(value_coding)) {
    return Corrupt(absl::StrCat("unknown value coding ", value_coding));
  }
  h.values = static_cast<ValueCoding>(value_coding);
  if (index_coding == static_cast<uint8_t>(IndexCoding::kPacked12)) {
    if (sub_block_log2 != 0 || rice != 0) return Corrupt("packed12 with adaptive parameters");
  } else if (index_coding == static_cast<uint8_t>(IndexCoding::kAdaptive)) {
    if ((sub_block_log2 != 6 && sub_block_log2 != 7) || rice > sub_block_log2) {
      return Corrupt(absl::StrCat("adaptive sub-block log2 ", sub_block_log2, ", Rice ", rice));
    }
  } else {
    return Corrupt(absl::StrCat("unknown index coding ", index_coding));
  }
  h.indices = static_cast<IndexCoding>(index_coding);
  h.adaptive = {sub_block_log2, rice};
  LBCC_ASSIGN_OR_RETURN(h.value_params, params.Bytes(params.remaining(), "value params"));
  if (index_bytes > info.body.size()) {
    return Corrupt(
        absl::StrCat("index section of ", index_bytes, " bytes in a body of ", info.body.size()));
  }
  h.layout = {h.geometry.num_chunks, static_cast<int64_t>(k), h.geometry.chunk_len};
  h.index_section = info.body.subspan(0, static_cast<size_t>(index_bytes));
  h.value_section = info.body.subspan(static_cast<size_t>(index_bytes));
  // Every value costs at least 2 bits: this bounds the count (and what decoders allocate for it)
  // by the payload's size before any length arithmetic.
  const int64_t count = h.layout.count();
  if (static_cast<uint64_t>(count) > 4 * static_cast<uint64_t>(info.body.size())) {
    return Corrupt(
        absl::StrCat(count, " values cannot fit in a body of ", info.body.size(), " bytes"));
  }
  if (h.value_params.size() != ValueParamBytes(h.values)) {
    return Corrupt(absl::StrCat(ValueCodingName(h.values), " parameters have ",
                                h.value_params.size(), " bytes, expected ",
                                ValueParamBytes(h.values)));
  }
  int64_t block = 0;
  if (IsAbsmax(h.values)) {
    uint32_t b;
    std::memcpy(&b, h.value_params.data(), 4);
    if (b < 1) return Corrupt("absmax block of 0 values");
    block = b;
  }
  if (h.value_section.size() != ValueSectionBytes(h.values, count, block)) {
    return Corrupt(absl::StrCat(ValueCodingName(h.values), " section has ", h.value_section.size(),
                                " bytes, ", count, " values need ",
                                ValueSectionBytes(h.values, count, block)));
  }
  return h;
}

}  // namespace lbcc::codecs
