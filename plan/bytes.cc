#include "plan/bytes.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/chunking.h"
#include "codecs/dense_quant.h"
#include "codecs/index_coding.h"
#include "codecs/payload.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"

namespace lbcc::plan {
namespace {

// log C(n, r) by lgamma: the hypergeometric pmf below for chunk lengths up to 4096.
double LogChoose(int64_t n, int64_t r) {
  return std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(r) + 1) -
         std::lgamma(static_cast<double>(n - r) + 1);
}

// E[bits of one sub-block of s positions] when k of the chunk's L positions are selected
// uniformly: the count n is hypergeometric(L, k, s); bits(n) as index_coding.cc's SubBlockBits.
double ExpectedSubBlockBits(int64_t chunk_len, int64_t k, int64_t s, int b, int p) {
  const int64_t lo = std::max<int64_t>(0, k - (chunk_len - s));
  const int64_t hi = std::min(k, s);
  const double log_total = LogChoose(chunk_len, k);
  double expected = 0;
  for (int64_t n = lo; n <= hi; ++n) {
    const double pmf =
        std::exp(LogChoose(s, n) + LogChoose(chunk_len - s, k - n) - log_total);
    const double rice = static_cast<double>((n >> p) + 1 + p);
    const double positions = static_cast<double>(std::min<int64_t>(s, n * b));
    expected += pmf * (rice + positions);
  }
  return expected;
}

double ExpectedBitsPerChunk(int64_t chunk_len, int64_t k, int b) {
  const codecs::IndexLayout layout{1, k, chunk_len};
  const int p = codecs::AdaptiveRice(layout, b);
  const int64_t block = int64_t{1} << b;
  double bits = 0;
  for (int64_t start = 0; start < chunk_len; start += block) {
    bits += ExpectedSubBlockBits(chunk_len, k, std::min(block, chunk_len - start), b, p);
  }
  return bits;
}

}  // namespace

double ExpectedAdaptiveBits(int64_t num_chunks, int64_t chunk_len, int64_t k) {
  if (num_chunks <= 0 || k <= 0) return 0;
  const double per6 = ExpectedBitsPerChunk(chunk_len, k, 6);
  const double per7 = ExpectedBitsPerChunk(chunk_len, k, 7);
  return static_cast<double>(num_chunks) * std::min(per6, per7);
}

absl::StatusOr<double> TopKEfPayloadBytes(absl::Span<const int64_t> shape,
                                          const codecs::TopKEfOptions& options) {
  codecs::TopKEfOptions packed = options;
  packed.indices = codecs::IndexCoding::kPacked12;
  LBCC_ASSIGN_OR_RETURN(std::unique_ptr<codecs::TopKEfCodec> codec,
                        codecs::TopKEfCodec::Create(packed));
  LBCC_ASSIGN_OR_RETURN(const size_t exact_packed, codec->MaxEncodedBytes(shape));
  if (options.indices == codecs::IndexCoding::kPacked12) return static_cast<double>(exact_packed);
  LBCC_ASSIGN_OR_RETURN(const codecs::ChunkGeometry g, options.Geometry(shape));
  const int64_t k = options.KFor(g);
  const double packed12_index = static_cast<double>(codecs::Packed12Bytes(g.num_chunks * k));
  // The adaptive section is zero-padded to a byte once per tensor.
  const double adaptive_index =
      std::ceil(ExpectedAdaptiveBits(g.num_chunks, g.chunk_len, k) / 8.0);
  const double index = options.indices == codecs::IndexCoding::kAdaptive
                           ? adaptive_index
                           : std::min(adaptive_index, packed12_index);
  return static_cast<double>(exact_packed) - packed12_index + index;
}

std::vector<std::pair<size_t, size_t>> PlanGroups(absl::Span<const int64_t> tensor_elements,
                                                  int64_t min_elements) {
  constexpr int64_t kMaxPipelineGroups = 8;  // comm/compressed.cc
  int64_t total = 0;
  for (int64_t n : tensor_elements) total += n;
  const int64_t target = std::max(total / kMaxPipelineGroups, min_elements);
  std::vector<std::pair<size_t, size_t>> groups;
  size_t begin = 0;
  int64_t filled = 0;
  for (size_t i = 0; i < tensor_elements.size(); ++i) {
    filled += tensor_elements[i];
    if (filled >= target || i + 1 == tensor_elements.size()) {
      groups.emplace_back(begin, i + 1);
      begin = i + 1;
      filled = 0;
    }
  }
  if (groups.empty()) groups.emplace_back(0, 0);
  return groups;
}

absl::StatusOr<double> SparseBlobBytes(const std::vector<std::vector<int64_t>>& shapes,
                                       size_t begin, size_t end,
                                       const codecs::TopKEfOptions& options, bool streamed) {
  double bytes = 1 + 4;  // u8 ok, u32 tensor count
  for (size_t i = begin; i < end && i < shapes.size(); ++i) {
    LBCC_ASSIGN_OR_RETURN(const double payload, TopKEfPayloadBytes(shapes[i], options));
    bytes += 8 + payload;
  }
  if (streamed) bytes += 16;  // comm::internal::kStreamFinalHeader
  return bytes;
}

absl::StatusOr<BoundaryBytes> SubspaceBoundaryBytes(const BoundaryCoding& coding,
                                                    int64_t tokens) {
  if (coding.model_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.d is ", coding.model_dim,
                                                   ", must be > 0"));
  }
  if (tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("boundary tokens is ", tokens));
  }
  BoundaryBytes out;
  if (coding.rank == 0) {  // dense bf16 activations and gradients, no envelope
    out.forward = out.backward = static_cast<double>(tokens) * coding.model_dim * 2.0;
    return out;
  }
  if (coding.rank < 0 || coding.rank > coding.model_dim) {
    return absl::InvalidArgumentError(absl::StrCat("subspace k is ", coding.rank,
                                                   ", must be in [0, d = ", coding.model_dim,
                                                   "]"));
  }
  const int id_width = codecs::SubspaceIdWidth(coding.vocab_size);
  const codecs::SubspaceBodyLayout fwd = codecs::SubspaceLayout(
      tokens, coding.rank, 0, id_width, coding.coefficient_dtype, coding.int8_block);
  const codecs::SubspaceBodyLayout bwd = codecs::SubspaceLayout(
      tokens, coding.rank, 0, 0, coding.coefficient_dtype, coding.int8_block);
  out.forward = static_cast<double>(
      codecs::PayloadBytes(2, codecs::kSubspaceParamsBytes, fwd.total()));
  out.backward = static_cast<double>(
      codecs::PayloadBytes(2, codecs::kSubspaceParamsBytes, bwd.total()));
  return out;
}

absl::StatusOr<RingTensorBytes> RingPayloadBytes(const RingCoding& coding, int64_t tokens,
                                                 int64_t dim) {
  if (tokens < 1 || dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring block of ", tokens, " tokens x ", dim, "; both must be >= 1"));
  }
  RingTensorBytes out;
  switch (coding.kind) {
    case RingCoding::Kind::kRawF32:  // comm::ContextRing sends the f32 bytes as they are
      out.forward = out.backward = static_cast<double>(tokens) * dim * 4.0;
      return out;
    case RingCoding::Kind::kDense: {
      codecs::DenseQuantOptions options;
      LBCC_ASSIGN_OR_RETURN(options.format, codecs::ParseDenseFormat(coding.dense_format));
      LBCC_ASSIGN_OR_RETURN(std::unique_ptr<codecs::DenseQuantCodec> codec,
                            codecs::DenseQuantCodec::Create(options));
      const int64_t shape[] = {tokens, dim};
      LBCC_ASSIGN_OR_RETURN(const size_t bytes, codec->MaxEncodedBytes(shape));
      out.forward = out.backward = static_cast<double>(bytes);
      return out;
    }
    case RingCoding::Kind::kSubspace: {
      if (coding.rank < 1 || coding.rank > dim) {
        return absl::InvalidArgumentError(
            absl::StrCat("subspace k is ", coding.rank, ", must be in [1, d = ", dim, "]"));
      }
      if (coding.components < 1 || coding.components > 255) {
        return absl::InvalidArgumentError(
            absl::StrCat("subspace components M is ", coding.components, ", must be in [1, 255]"));
      }
      if (coding.mixture_block < 1 || coding.mixture_block > 65535) {
        return absl::InvalidArgumentError(absl::StrCat(
            "mixture_block is ", coding.mixture_block, ", must be in [1, 65535]"));
      }
      if (!codecs::IsSubspaceCoefficientDType(coding.coefficient_dtype)) {
        return absl::InvalidArgumentError(
            absl::StrCat("coefficient dtype ", DTypeName(coding.coefficient_dtype),
                         " is not one of f32, bf16, f16, i8"));
      }
      if (coding.coefficient_dtype == DType::kI8 &&
          (coding.int8_block < 1 || coding.int8_block > 65535)) {
        return absl::InvalidArgumentError(
            absl::StrCat("int8_block is ", coding.int8_block, ", must be in [1, 65535]"));
      }
      // SubspaceCodec::PayloadBytes with V = 0: no ids either way, the same selectors both ways.
      const int64_t selectors =
          coding.components > 1 ? (tokens + coding.mixture_block - 1) / coding.mixture_block : 0;
      const codecs::SubspaceBodyLayout body = codecs::SubspaceLayout(
          tokens, coding.rank, selectors, 0, coding.coefficient_dtype, coding.int8_block);
      out.forward = out.backward = static_cast<double>(
          codecs::PayloadBytes(2, codecs::kSubspaceParamsBytes, body.total()));
      return out;
    }
  }
  return absl::InternalError("unknown ring coding");
}

}  // namespace lbcc::plan
