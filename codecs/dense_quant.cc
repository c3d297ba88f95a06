#include "codecs/dense_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "codecs/codec_registry.h"
#include "codecs/cpu_kernels.h"
#include "codecs/payload.h"
#include "codecs/rounding.h"

namespace lbcc::codecs {
namespace {

constexpr size_t kParamBytes = 8;
constexpr int64_t kFloatTile = 4096;  // elements per step of the 16-bit formats' aggregation

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt dense_quant payload: ", what));
}

bool IsInt(DenseFormat f) { return f == DenseFormat::kInt8 || f == DenseFormat::kInt4; }

float MaxScale(DenseFormat f) { return f == DenseFormat::kInt8 ? kMaxScale8 : kMaxScale4; }

int64_t NumBlocks(int64_t n, int64_t block) { return block > 0 ? (n + block - 1) / block : 0; }

size_t CodeBytes(DenseFormat f, int64_t n) {
  switch (f) {
    case DenseFormat::kInt8:
      return static_cast<size_t>(n);
    case DenseFormat::kInt4:
      return static_cast<size_t>((n + 1) / 2);
    case DenseFormat::kF16:
    case DenseFormat::kBf16:
      return static_cast<size_t>(2 * n);
  }
  return 0;
}

size_t BodyBytes(DenseFormat f, int64_t n, int64_t block) {
  return (IsInt(f) ? 4 * static_cast<size_t>(NumBlocks(n, block)) : 0) + CodeBytes(f, n);
}

float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
void StoreF32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }
uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

absl::Status NotFinite(int64_t i) {
  return absl::InvalidArgumentError(
      absl::StrCat("dense_quant: input element ", i, " is NaN or infinite"));
}

// Scalar blockwise absmax for int8 (stochastic) and int4 (both roundings).
absl::Status EncodeIntScalar(const DenseQuantOptions& o, const float* x, int64_t n, uint8_t* scales,
                             uint8_t* codes) {
  const float qmax = o.format == DenseFormat::kInt8 ? 127.0f : 7.0f;
  if (o.format == DenseFormat::kInt4) std::memset(codes, 0, CodeBytes(o.format, n));
  for (int64_t b = 0, blocks = NumBlocks(n, o.block); b < blocks; ++b) {
    const int64_t begin = b * o.block, end = std::min(n, begin + o.block);
    float absmax = 0;
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(x[i])) return NotFinite(i);
      absmax = std::max(absmax, std::fabs(x[i]));
    }
    const float scale = std::min(absmax / qmax, MaxScale(o.format));
    StoreF32(scales + 4 * b, scale);
    for (int64_t i = begin; i < end; ++i) {
      float q = 0;
      if (scale != 0.0f) {
        const float t = x[i] / scale;
        q = o.stochastic ? StochasticRoundF(t, o.seed, static_cast<uint64_t>(i))
                         : RoundHalfEvenF(t);
        q = std::min(std::max(q, -qmax), qmax);
      }
      const int qi = static_cast<int>(q);
      if (o.format == DenseFormat::kInt8) {
        codes[i] = static_cast<uint8_t>(static_cast<int8_t>(qi));
      } else {
        codes[i >> 1] |= static_cast<uint8_t>((qi & 0xF) << ((i & 1) * 4));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status EncodeHalf(const DenseQuantOptions& o, const float* x, int64_t n, uint8_t* codes) {
  const bool bf16 = o.format == DenseFormat::kBf16;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (!std::isfinite(v)) return NotFinite(i);
    uint16_t c;
    if (bf16) {
      c = o.stochastic ? StochasticBf16(v, o.seed, static_cast<uint64_t>(i)) : F32ToBf16(v);
      if ((c & 0x7F80) == 0x7F80) {
        return absl::InvalidArgumentError(
            absl::StrCat("dense_quant: element ", i, " = ", v, " is beyond bf16's range"));
      }
    } else {
      if (std::fabs(v) > 65504.0f && (o.stochastic || std::fabs(v) >= 65520.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("dense_quant: element ", i, " = ", v, " is beyond fp16's range"));
      }
      c = F32ToF16(v);
      if (o.stochastic) c = StochasticF16(v, c, o.seed, static_cast<uint64_t>(i));
    }
    StoreU16(codes + 2 * i, c);
  }
  return absl::OkStatus();
}

// One payload's elements [begin, begin + n) as fp32 (header validated).
void DecodeRange(const DenseQuantHeader& h, int64_t begin, int64_t n, float* out) {
  switch (h.format) {
    case DenseFormat::kInt8: {
      const CpuKernels& kern = ActiveKernels();
      int64_t i = begin;
      while (i < begin + n) {
        const int64_t b = i / h.block;
        const int64_t end = std::min(begin + n, (b + 1) * h.block);
        kern.dequant8_block(reinterpret_cast<const int8_t*>(h.codes.data()) + i, end - i,
                            LoadF32(h.scales.data() + 4 * b), out + (i - begin));
        i = end;
      }
      return;
    }
    case DenseFormat::kInt4:
      for (int64_t i = begin; i < begin + n; ++i) {
        int q = (h.codes[i >> 1] >> ((i & 1) * 4)) & 0xF;
        q = std::max(q >= 8 ? q - 16 : q, -7);
        out[i - begin] = static_cast<float>(q) * LoadF32(h.scales.data() + 4 * (i / h.block));
      }
      return;
    case DenseFormat::kF16:
      ConvertF16ToF32(absl::MakeConstSpan(reinterpret_cast<const uint16_t*>(h.codes.data()) + begin,
                                          static_cast<size_t>(n)),
                      absl::MakeSpan(out, static_cast<size_t>(n)));
      return;
    case DenseFormat::kBf16:
      ConvertBf16ToF32(
          absl::MakeConstSpan(reinterpret_cast<const uint16_t*>(h.codes.data()) + begin,
                              static_cast<size_t>(n)),
          absl::MakeSpan(out, static_cast<size_t>(n)));
      return;
  }
}

}  // namespace

absl::string_view DenseFormatName(DenseFormat format) {
  switch (format) {
    case DenseFormat::kInt8:
      return "int8";
    case DenseFormat::kInt4:
      return "int4";
    case DenseFormat::kF16:
      return "fp16";
    case DenseFormat::kBf16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<DenseFormat> ParseDenseFormat(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "int8" || lower == "i8") return DenseFormat::kInt8;
  if (lower == "int4" || lower == "i4") return DenseFormat::kInt4;
  if (lower == "fp16" || lower == "f16" || lower == "float16") return DenseFormat::kF16;
  if (lower == "bf16" || lower == "bfloat16") return DenseFormat::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dense format '", name, "' (expected int8, int4, fp16, bf16)"));
}

absl::Status DenseQuantOptions::Validate() const {
  if (format != DenseFormat::kInt8 && format != DenseFormat::kInt4 && format != DenseFormat::kF16 &&
      format != DenseFormat::kBf16) {
    return absl::InvalidArgumentError("dense_quant: unknown format");
  }
  if (IsInt(format) && (block < 16 || block > 65536 || block % 16 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense_quant: block ", block, " must be a multiple of 16 in [16, 65536]"));
  }
  return absl::OkStatus();
}

std::string DenseQuantOptions::ToString() const {
  return absl::StrFormat("dense_quant(format=%s, block=%d, rounding=%s, seed=%d)",
                         std::string(DenseFormatName(format)), IsInt(format) ? block : 0,
                         stochastic ? "stochastic" : "nearest", seed);
}

absl::StatusOr<std::unique_ptr<DenseQuantCodec>> DenseQuantCodec::Create(
    const DenseQuantOptions& options) {
  LBCC_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<DenseQuantCodec>(new DenseQuantCodec(options));
}

absl::StatusOr<size_t> DenseQuantCodec::MaxEncodedBytes(absl::Span<const int64_t> shape) const {
  LBCC_ASSIGN_OR_RETURN(const int64_t n, NumElements(shape));
  return PayloadBytes(shape.size(), kParamBytes, BodyBytes(options_.format, n, options_.block));
}

absl::StatusOr<size_t> DenseQuantCodec::Encode(const TensorView& input, CodecState* /*state*/,
                                               absl::Span<uint8_t> out) const {
  if (!input.is_host()) {
    return absl::UnimplementedError("dense_quant: the CPU codec encodes host memory only");
  }
  if (input.dtype() != DType::kF32) {
    return absl::UnimplementedError(
        absl::StrCat("dense_quant: encodes f32 tensors, got ", DTypeName(input.dtype())));
  }
  const DenseQuantOptions& o = options_;
  const int64_t n = input.num_elements();
  const int64_t block = IsInt(o.format) ? o.block : 0;
  const size_t body = BodyBytes(o.format, n, block);
  PayloadWriter writer;
  LBCC_RETURN_IF_ERROR(writer.Begin(out, CodecId::kDenseQuant, kDenseQuantVersion, DType::kF32,
                                    input.shape(), kParamBytes, body));
  ByteWriter params(writer.params());
  params.U8(static_cast<uint8_t>(o.format));
  params.U8(o.stochastic ? 1 : 0);
  params.U16(0);
  params.U32(static_cast<uint32_t>(block));
  const float* x = input.data_as<const float>();
  uint8_t* scales = writer.body().data();
  uint8_t* codes = writer.body().data() + (IsInt(o.format) ? 4 * NumBlocks(n, block) : 0);
  if (o.format == DenseFormat::kInt8 && !o.stochastic) {
    const CpuKernels& kern = ActiveKernels();
    for (int64_t b = 0, blocks = NumBlocks(n, block); b < blocks; ++b) {
      const int64_t begin = b * block, len = std::min(block, n - begin);
      uint32_t max_bits = 0;
      const float scale =
          kern.absmax8_block(x + begin, len, reinterpret_cast<int8_t*>(codes) + begin, &max_bits);
      if (max_bits > kMaxFiniteAbsBits) {
        for (int64_t i = begin; i < begin + len; ++i) {
          if (!std::isfinite(x[i])) return NotFinite(i);
        }
      }
      StoreF32(scales + 4 * b, scale);
    }
  } else if (IsInt(o.format)) {
    LBCC_RETURN_IF_ERROR(EncodeIntScalar(o, x, n, scales, codes));
  } else {
    LBCC_RETURN_IF_ERROR(EncodeHalf(o, x, n, codes));
  }
  return writer.Finish();
}

absl::StatusOr<DenseQuantHeader> ParseDenseQuantHeader(const PayloadInfo& info) {
  if (info.codec != CodecId::kDenseQuant) return Corrupt("not a dense_quant payload");
  if (info.codec_version != kDenseQuantVersion) {
    return Corrupt(absl::StrCat("unknown dense_quant version ", info.codec_version,
                                " (this build reads ", kDenseQuantVersion, ")"));
  }
  if (info.dtype != DType::kF32) {
    return Corrupt(absl::StrCat("dtype ", DTypeName(info.dtype), " (dense_quant carries f32)"));
  }
  if (info.flags != 0) return Corrupt(absl::StrCat("unknown flags ", info.flags));
  ByteReader params(info.params);
  LBCC_ASSIGN_OR_RETURN(const uint8_t format, params.U8("format"));
  LBCC_ASSIGN_OR_RETURN(const uint8_t rounding, params.U8("rounding"));
  LBCC_ASSIGN_OR_RETURN(const uint16_t reserved, params.U16("reserved"));
  LBCC_ASSIGN_OR_RETURN(const uint32_t block, params.U32("block"));
  LBCC_RETURN_IF_ERROR(params.ExpectEnd("dense_quant params"));
  DenseQuantHeader h;
  if (format < 1 || format > 4) return Corrupt(absl::StrCat("unknown format ", format));
  h.format = static_cast<DenseFormat>(format);
  if (rounding > 1 || reserved != 0) return Corrupt("unknown rounding or reserved bits");
  h.stochastic = rounding == 1;
  if (IsInt(h.format) ? (block < 16 || block > 65536 || block % 16 != 0) : block != 0) {
    return Corrupt(absl::StrCat("block ", block, " for format ", DenseFormatName(h.format)));
  }
  h.block = block;
  h.num_elements = info.num_elements;
  // Every element costs at least 4 bits: bound the count before any length arithmetic.
  if (static_cast<uint64_t>(h.num_elements) > 2 * static_cast<uint64_t>(info.body.size())) {
    return Corrupt(absl::StrCat(h.num_elements, " elements cannot fit in a body of ",
                                info.body.size(), " bytes"));
  }
  const size_t expected = BodyBytes(h.format, h.num_elements, h.block);
  if (info.body.size() != expected) {
    return Corrupt(absl::StrCat("body has ", info.body.size(), " bytes, ", h.num_elements,
                                " elements need ", expected));
  }
  const size_t scale_bytes = IsInt(h.format) ? 4 * NumBlocks(h.num_elements, h.block) : 0;
  h.scales = info.body.subspan(0, scale_bytes);
  h.codes = info.body.subspan(scale_bytes);
  for (size_t b = 0; b < scale_bytes; b += 4) {
    const float s = LoadF32(h.scales.data() + b);
    if (!(s >= 0.0f && s <= MaxScale(h.format))) {
      return Corrupt(absl::StrCat("scale ", b / 4, " is negative, too large or not finite"));
    }
  }
  if (h.format == DenseFormat::kInt4 && h.num_elements % 2 == 1 &&
      (h.codes[h.codes.size() - 1] & 0xF0) != 0) {
    return Corrupt("non-zero padding after the last code");
  }
  if (!IsInt(h.format)) {
    const uint16_t exp_mask = h.format == DenseFormat::kBf16 ? 0x7F80 : 0x7C00;
    for (int64_t i = 0; i < h.num_elements; ++i) {
      if ((LoadU16(h.codes.data() + 2 * i) & exp_mask) == exp_mask) {
        return Corrupt(absl::StrCat("element ", i, " is not finite"));
      }
    }
  }
  return h;
}

namespace {

// The dense quantizer's part of a DecodeScratch.
struct DenseDecodeScratch final : CodecScratch {
  std::vector<DenseQuantHeader> headers;  // per payload
  std::vector<float> dense;               // accumulator and one payload's tile
};

}  // namespace

std::unique_ptr<CodecScratch> DenseQuantCodec::NewDecodeScratch() const {
  return std::make_unique<DenseDecodeScratch>();
}

absl::Status DenseQuantCodec::PrepareDecode(const DecodeCall& call, CodecScratch* scratch) const {
  DenseDecodeScratch& s = static_cast<DenseDecodeScratch&>(*scratch);
  const absl::Span<const PayloadInfo> payloads = call.infos;
  // Phase 1: validate every payload before touching `out`.
  s.headers.resize(payloads.size());
  for (size_t r = 0; r < payloads.size(); ++r) {
    LBCC_ASSIGN_OR_RETURN(s.headers[r], ParseDenseQuantHeader(payloads[r]),
                          _.Prepend(absl::StrCat("payload ", r)));
  }
  return absl::OkStatus();
}

void DenseQuantCodec::ApplyDecode(const DecodeCall& call, CodecScratch* scratch) const {
  DenseDecodeScratch& s = static_cast<DenseDecodeScratch&>(*scratch);
  const DecodeOptions& options = call.options;
  const TensorView& out = call.out;
  const absl::Span<const PayloadInfo> payloads = call.infos;
  const DenseQuantHeader& first = s.headers[0];
  float* o = out.data_as<float>();
  const int64_t n = out.num_elements();
  const CpuKernels& kern = ActiveKernels();
  // One payload: aggregate == its values (the means divide by 1).
  if (payloads.size() == 1 && first.format == DenseFormat::kInt8) {
    for (int64_t b = 0, blocks = NumBlocks(n, first.block); b < blocks; ++b) {
      const int64_t begin = b * first.block, len = std::min(first.block, n - begin);
      const int8_t* codes = reinterpret_cast<const int8_t*>(first.codes.data()) + begin;
      const float scale = LoadF32(first.scales.data() + 4 * b);
      if (options.accumulate) {
        kern.dequant8_block_add(codes, len, scale, o + begin);
      } else {
        kern.dequant8_block(codes, len, scale, o + begin);
      }
    }
    return;
  }
  // General case, tile by tile: agg = v_0 + v_1 + ... in payload order, then the rule.
  const int64_t tile = IsInt(first.format) ? first.block : kFloatTile;
  if (s.dense.size() < static_cast<size_t>(2 * tile)) s.dense.resize(static_cast<size_t>(2 * tile));
  float* acc = s.dense.data();
  float* tmp = s.dense.data() + tile;
  const float replicas = static_cast<float>(payloads.size());
  const bool divide = options.aggregation != Aggregation::kSum;
  for (int64_t begin = 0; begin < n; begin += tile) {
    const int64_t len = std::min(tile, n - begin);
    std::fill(acc, acc + len, -0.0f);  // -0 + v == v for every v, -0 included
    for (size_t r = 0; r < payloads.size(); ++r) {
      DecodeRange(s.headers[r], begin, len, tmp);
      for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] + tmp[i];
    }
    for (int64_t i = 0; i < len; ++i) {
      const float agg = divide ? acc[i] / replicas : acc[i];
      o[begin + i] = options.accumulate ? o[begin + i] + agg : agg;
    }
  }
}

absl::Status DenseQuantCodec::Inspect(const PayloadInfo& info, PayloadSummary* summary) const {
  LBCC_ASSIGN_OR_RETURN(DenseQuantHeader h, ParseDenseQuantHeader(info));
  summary->selected = info.num_elements;
  summary->details =
      absl::StrFormat("format %s, %s rounding%s", std::string(DenseFormatName(h.format)),
                      h.stochastic ? "stochastic" : "nearest",
                      h.block > 0 ? absl::StrFormat(", blocks of %d", h.block) : std::string());
  return absl::OkStatus();
}

LBCC_REGISTER_CODEC(*DenseQuantCodec::Create(DenseQuantOptions()));

}  // namespace lbcc::codecs
