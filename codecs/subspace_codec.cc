#include "codecs/subspace_codec.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "codecs/byte_io.h"
#include "codecs/codec_registry.h"
#include "codecs/payload.h"

namespace lbcc::codecs {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

absl::StatusOr<SubspaceCodec> SubspaceCodec::Create(std::shared_ptr<const SubspaceBasis> basis,
                                                    SubspaceCodecOptions options) {
  if (basis == nullptr) return absl::InvalidArgumentError("null basis");
  if (!IsSubspaceCoefficientDType(options.coefficient_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("coefficient dtype ", DTypeName(options.coefficient_dtype),
                     " is not one of f32, bf16, f16, i8"));
  }
  if (options.int8_block < 1 || options.int8_block > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("int8_block ", options.int8_block, " outside [1, 65535]"));
  }
  if (options.mixture_block < 1 || options.mixture_block > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("mixture_block ", options.mixture_block, " outside [1, 65535]"));
  }
  return SubspaceCodec(std::move(basis), options);
}

int64_t SubspaceCodec::NumSelectors(int64_t tokens) const {
  return basis_->components() > 1 ? CeilDiv(tokens, options_.mixture_block) : 0;
}

size_t SubspaceCodec::PayloadBytes(SubspaceDirection direction, int64_t tokens,
                                   int64_t block) const {
  const bool forward = direction == SubspaceDirection::kForward;
  const int64_t selectors = basis_->components() > 1 ? CeilDiv(tokens, block) : 0;
  const SubspaceBodyLayout layout =
      SubspaceLayout(tokens, basis_->rank(), selectors, forward ? basis_->id_width() : 0,
                     options_.coefficient_dtype, options_.int8_block);
  return codecs::PayloadBytes(2, kSubspaceParamsBytes, layout.total());
}

size_t SubspaceCodec::ForwardPayloadBytes(int64_t tokens) const {
  return PayloadBytes(SubspaceDirection::kForward, tokens, options_.mixture_block);
}

size_t SubspaceCodec::BackwardPayloadBytes(int64_t tokens) const {
  return PayloadBytes(SubspaceDirection::kBackward, tokens, options_.mixture_block);
}

absl::Status SubspaceCodec::CheckActivations(const TensorView& x, absl::string_view what) const {
  if (!x.is_host() || x.dtype() != DType::kF32 || x.rank() != 2 ||
      x.dim(1) != basis_->model_dim()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", x.DebugString(),
                                                   ", expected f32[tokens, ",
                                                   basis_->model_dim(), "]@host"));
  }
  if (x.dim(0) > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", x.dim(0), " tokens, at most ",
                                                   INT32_MAX));
  }
  return absl::OkStatus();
}

absl::Status SubspaceCodec::CheckIds(absl::Span<const int32_t> ids, int64_t tokens) const {
  const int64_t v = basis_->vocab_size();
  if (v == 0) {
    if (!ids.empty()) {
      return absl::InvalidArgumentError("the basis has no vocabulary: pass no token ids");
    }
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(ids.size()) != tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " token ids for ", tokens, " tokens"));
  }
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || ids[t] >= v) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", ids[t], " at position ", t, " outside [0, V = ", v, ")"));
    }
  }
  return absl::OkStatus();
}

void SubspaceCodec::ProjectForward(const float* h, int64_t tokens, const int32_t* ids,
                                   int64_t block) {
  const SubspaceBasis& b = *basis_;
  const int64_t d = b.model_dim(), k = b.rank(), m = b.components(), ld = b.ld();
  coef_.resize(static_cast<size_t>(tokens * k));
  float* all = coef_.data();
  if (m > 1) {
    all_coef_.resize(static_cast<size_t>(tokens * ld));
    all = all_coef_.data();
  }
  if (tokens > 0) {
    // U^T (h - T[y]) = U^T h - (T U)[y]: one product over h, then k values per token.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(tokens),
                static_cast<int>(ld), static_cast<int>(d), 1.0f, h, static_cast<int>(d),
                b.u().data(), static_cast<int>(ld), 0.0f, all, static_cast<int>(ld));
  }
  if (b.has_table() && ids != nullptr) {
    const float* p = b.projected_table().data();
    for (int64_t t = 0; t < tokens; ++t) {
      const float* row = p + static_cast<int64_t>(ids[t]) * ld;
      float* out = all + t * ld;
      for (int64_t j = 0; j < ld; ++j) out[j] -= row[j];
    }
  }
  if (m == 1) {
    selectors_.clear();
    return;
  }
  const int64_t blocks = CeilDiv(tokens, block);
  selectors_.assign(static_cast<size_t>(blocks), 0);
  std::vector<double> energy(static_cast<size_t>(m));
  for (int64_t blk = 0; blk < blocks; ++blk) {
    std::fill(energy.begin(), energy.end(), 0.0);
    const int64_t t1 = std::min(tokens, (blk + 1) * block);
    for (int64_t t = blk * block; t < t1; ++t) {
      const float* row = all + t * ld;
      for (int64_t c = 0; c < m; ++c) {
        float s = 0;
        for (int64_t j = 0; j < k; ++j) s += row[c * k + j] * row[c * k + j];
        energy[c] += s;
      }
    }
    // The first component with the most energy (ties to the lowest index).
    int64_t best = 0;
    for (int64_t c = 1; c < m; ++c) {
      if (energy[c] > energy[best]) best = c;
    }
    selectors_[blk] = static_cast<uint8_t>(best);
    for (int64_t t = blk * block; t < t1; ++t) {
      std::memcpy(coef_.data() + t * k, all + t * ld + best * k, sizeof(float) * k);
    }
  }
}

void SubspaceCodec::ProjectWithSelectors(const float* x, int64_t tokens, const uint8_t* selectors,
                                         int64_t block) {
  const SubspaceBasis& b = *basis_;
  const int64_t d = b.model_dim(), k = b.rank(), ld = b.ld();
  coef_.resize(static_cast<size_t>(tokens * k));
  ForEachSelectorRun(tokens, selectors, block, [&](int64_t r0, int64_t r1, int c) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(r1 - r0),
                static_cast<int>(k), static_cast<int>(d), 1.0f, x + r0 * d, static_cast<int>(d),
                b.component(c), static_cast<int>(ld), 0.0f, coef_.data() + r0 * k,
                static_cast<int>(k));
    return absl::OkStatus();
  }).IgnoreError();  // the products cannot fail
}

void SubspaceCodec::Reconstruct(const float* coef, int64_t tokens, const uint8_t* selectors,
                                int64_t block, const int32_t* ids, float* out) {
  const SubspaceBasis& b = *basis_;
  const int64_t d = b.model_dim(), k = b.rank(), ld = b.ld();
  const bool add_table = ids != nullptr && b.has_table();
  const float* table = b.table().data();
  auto gather_table = [&](int64_t t0, int64_t t1, float* dst) {
    for (int64_t t = t0; t < t1; ++t, dst += d) {
      std::memcpy(dst, table + static_cast<int64_t>(ids[t]) * d, sizeof(float) * d);
    }
  };
  // Rows per product when the output is staged: about 1 MiB of output, so that T[y] gathered
  // into it (beta = 1) is still in cache when the product reads it.
  const int64_t chunk = std::max<int64_t>(16, (int64_t{1} << 18) / d);
  if (selectors == nullptr) {
    const int64_t step = add_table ? chunk : tokens;
    for (int64_t t0 = 0; t0 < tokens; t0 += step) {
      const int64_t t1 = std::min(tokens, t0 + step);
      if (add_table) gather_table(t0, t1, out + t0 * d);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(t1 - t0),
                  static_cast<int>(d), static_cast<int>(k), 1.0f, coef + t0 * k,
                  static_cast<int>(k), b.component(0), static_cast<int>(ld),
                  add_table ? 1.0f : 0.0f, out + t0 * d, static_cast<int>(d));
    }
    return;
  }
  // Mixture: per component, the blocks that chose it are staged together (coefficients and
  // T[y] rows), multiplied in one product and copied out, instead of one small product per
  // block.
  const int64_t blocks = CeilDiv(tokens, block);
  const int64_t capacity = std::max(block, chunk - chunk % block);
  stage_coef_.resize(static_cast<size_t>(capacity * k));
  stage_out_.resize(static_cast<size_t>(capacity * d));
  std::vector<int64_t> staged;
  for (int64_t c = 0; c < b.components(); ++c) {
    for (int64_t blk = 0; blk < blocks;) {
      staged.clear();
      int64_t rows = 0;
      for (; blk < blocks && rows + block <= capacity; ++blk) {
        if (selectors[blk] != c) continue;
        const int64_t t0 = blk * block, t1 = std::min(tokens, t0 + block);
        std::memcpy(stage_coef_.data() + rows * k, coef + t0 * k, sizeof(float) * (t1 - t0) * k);
        if (add_table) gather_table(t0, t1, stage_out_.data() + rows * d);
        staged.push_back(blk);
        rows += t1 - t0;
      }
      if (rows == 0) continue;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                  static_cast<int>(d), static_cast<int>(k), 1.0f, stage_coef_.data(),
                  static_cast<int>(k), b.component(c), static_cast<int>(ld),
                  add_table ? 1.0f : 0.0f, stage_out_.data(), static_cast<int>(d));
      const float* src = stage_out_.data();
      for (int64_t s : staged) {
        const int64_t t0 = s * block, t1 = std::min(tokens, t0 + block);
        std::memcpy(out + t0 * d, src, sizeof(float) * (t1 - t0) * d);
        src += (t1 - t0) * d;
      }
    }
  }
}

absl::StatusOr<size_t> SubspaceCodec::Write(SubspaceDirection direction, int64_t tokens,
                                            int64_t block, const int32_t* ids,
                                            absl::Span<uint8_t> out) {
  const SubspaceBasis& b = *basis_;
  const int64_t k = b.rank();
  const DType dtype = options_.coefficient_dtype;
  const int64_t int8_block = dtype == DType::kI8 ? options_.int8_block : 0;
  PayloadWriter writer;
  LBCC_ASSIGN_OR_RETURN(uint8_t * p,
                        BeginSubspacePayload(b, direction, tokens, block, dtype, int8_block,
                                             selectors_.data(), ids, out, &writer));
  const int64_t n = tokens * k;
  switch (dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(p, coef_.data(), sizeof(float) * n);
      break;
    case DType::kBF16:
    case DType::kF16:
      half_.resize(static_cast<size_t>(n));
      if (dtype == DType::kBF16) {
        ConvertF32ToBf16(absl::MakeConstSpan(coef_.data(), n), absl::MakeSpan(half_));
      } else {
        ConvertF32ToF16(absl::MakeConstSpan(coef_.data(), n), absl::MakeSpan(half_));
      }
      if (n > 0) std::memcpy(p, half_.data(), sizeof(uint16_t) * n);
      break;
    case DType::kI8: {
      uint8_t* scales = p;
      auto* q = reinterpret_cast<int8_t*>(
          p + SubspaceLayout(tokens, k, 0, 0, dtype, int8_block).scales);
      for (int64_t t = 0; t < tokens; ++t) {
        const float* row = coef_.data() + t * k;
        for (int64_t j0 = 0; j0 < k; j0 += int8_block) {
          const int64_t j1 = std::min(k, j0 + int8_block);
          float absmax = 0;  // NaN coefficients are ignored here and sent as 0
          for (int64_t j = j0; j < j1; ++j) absmax = std::max(absmax, std::fabs(row[j]));
          const float scale = absmax / 127.0f;
          const float inv = absmax > 0 ? 127.0f / absmax : 0.0f;
          std::memcpy(scales, &scale, sizeof(scale));
          scales += sizeof(scale);
          for (int64_t j = j0; j < j1; ++j) {
            float r = std::nearbyint(row[j] * inv);
            if (std::isnan(r)) r = 0;
            q[t * k + j] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
          }
        }
      }
      break;
    }
    default:
      LBCC_CHECK(false) << "coefficient dtype checked in Create";
  }
  return writer.Finish();
}

absl::StatusOr<size_t> SubspaceCodec::EncodeForward(const TensorView& h,
                                                    absl::Span<const int32_t> ids,
                                                    absl::Span<uint8_t> out,
                                                    SubspaceSelectors* selectors_out) {
  LBCC_RETURN_IF_ERROR(CheckActivations(h, "activations"));
  const int64_t tokens = h.dim(0);
  LBCC_RETURN_IF_ERROR(CheckIds(ids, tokens));
  const size_t bytes = ForwardPayloadBytes(tokens);
  if (out.size() < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload buffer holds ", out.size(), " bytes, needs ", bytes));
  }
  const int32_t* id_ptr = ids.empty() ? nullptr : ids.data();
  ProjectForward(h.data_as<float>(), tokens, id_ptr, options_.mixture_block);
  LBCC_ASSIGN_OR_RETURN(size_t written, Write(SubspaceDirection::kForward, tokens,
                                              options_.mixture_block, id_ptr, out));
  if (selectors_out != nullptr) {
    selectors_out->mixture_block = basis_->components() > 1 ? options_.mixture_block : 0;
    selectors_out->values = selectors_;
  }
  return written;
}

absl::StatusOr<std::vector<uint8_t>> SubspaceCodec::EncodeForward(
    const TensorView& h, absl::Span<const int32_t> ids, SubspaceSelectors* selectors_out) {
  LBCC_RETURN_IF_ERROR(CheckActivations(h, "activations"));
  std::vector<uint8_t> out(ForwardPayloadBytes(h.dim(0)));
  LBCC_ASSIGN_OR_RETURN(size_t written, EncodeForward(h, ids, absl::MakeSpan(out), selectors_out));
  out.resize(written);
  return out;
}

absl::StatusOr<size_t> SubspaceCodec::EncodeBackward(const TensorView& g_h,
                                                     const SubspaceSelectors& selectors,
                                                     absl::Span<uint8_t> out) {
  LBCC_RETURN_IF_ERROR(CheckActivations(g_h, "gradients"));
  const int64_t tokens = g_h.dim(0);
  const int64_t m = basis_->components();
  LBCC_ASSIGN_OR_RETURN(const int64_t block,
                        BackwardSelectorBlock(selectors, m, tokens, options_.mixture_block));
  const size_t bytes = PayloadBytes(SubspaceDirection::kBackward, tokens, block);
  if (out.size() < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload buffer holds ", out.size(), " bytes, needs ", bytes));
  }
  ProjectWithSelectors(g_h.data_as<float>(), tokens, m > 1 ? selectors.values.data() : nullptr,
                       block);
  selectors_ = selectors.values;
  return Write(SubspaceDirection::kBackward, tokens, block, nullptr, out);
}

absl::StatusOr<std::vector<uint8_t>> SubspaceCodec::EncodeBackward(
    const TensorView& g_h, const SubspaceSelectors& selectors) {
  LBCC_RETURN_IF_ERROR(CheckActivations(g_h, "gradients"));
  const int64_t block =
      basis_->components() > 1 ? std::max<int64_t>(1, selectors.mixture_block) : 1;
  std::vector<uint8_t> out(PayloadBytes(SubspaceDirection::kBackward, g_h.dim(0), block));
  LBCC_ASSIGN_OR_RETURN(size_t written, EncodeBackward(g_h, selectors, absl::MakeSpan(out)));
  out.resize(written);
  return out;
}

absl::Status SubspaceCodec::Decode(SubspaceDirection direction, absl::Span<const uint8_t> payload,
                                   const TensorView& out, absl::Span<int32_t> ids_out,
                                   SubspaceSelectors* selectors_out) {
  LBCC_ASSIGN_OR_RETURN(const SubspacePayloadHeader h, InspectSubspacePayload(payload));
  LBCC_RETURN_IF_ERROR(CheckSubspaceHeaderForDecode(h, direction, *basis_));
  if (!out.is_host() || out.dtype() != DType::kF32 || out.rank() != 2 || out.dim(0) != h.tokens ||
      out.dim(1) != h.model_dim) {
    return absl::InvalidArgumentError(absl::StrCat("output is ", out.DebugString(),
                                                   ", the payload holds f32[", h.tokens, ", ",
                                                   h.model_dim, "]@host"));
  }
  const int64_t id_count = h.id_width > 0 ? h.tokens : 0;
  if (!ids_out.empty() && static_cast<int64_t>(ids_out.size()) != id_count) {
    return absl::InvalidArgumentError(absl::StrCat("ids output holds ", ids_out.size(),
                                                   " values, the payload carries ", id_count,
                                                   " ids"));
  }
  // Validate everything before writing anything.
  LBCC_ASSIGN_OR_RETURN(const SubspaceBody body, CheckSubspaceBody(payload, h));
  const uint8_t* selectors = body.selectors;
  const uint8_t* ids = body.ids;
  const uint8_t* scales = body.scales;
  const uint8_t* coefficients = body.coefficients;

  const int64_t k = h.rank, n = h.tokens * k;
  coef_.resize(static_cast<size_t>(n));
  switch (h.coefficient_dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(coef_.data(), coefficients, sizeof(float) * n);
      break;
    case DType::kBF16:
    case DType::kF16:
      half_.resize(static_cast<size_t>(n));
      if (n > 0) std::memcpy(half_.data(), coefficients, sizeof(uint16_t) * n);
      if (h.coefficient_dtype == DType::kBF16) {
        ConvertBf16ToF32(half_, absl::MakeSpan(coef_));
      } else {
        ConvertF16ToF32(half_, absl::MakeSpan(coef_));
      }
      break;
    case DType::kI8: {
      const auto* q = reinterpret_cast<const int8_t*>(coefficients);
      const int64_t per_token = CeilDiv(k, h.int8_block);
      for (int64_t t = 0; t < h.tokens; ++t) {
        for (int64_t blk = 0; blk < per_token; ++blk) {
          const float scale = byte_io::Load<float>(scales + 4 * (t * per_token + blk));
          const int64_t j1 = std::min(k, (blk + 1) * h.int8_block);
          for (int64_t j = blk * h.int8_block; j < j1; ++j) coef_[t * k + j] = q[t * k + j] * scale;
        }
      }
      break;
    }
    default:
      LBCC_CHECK(false) << "coefficient dtype validated by InspectSubspacePayload";
  }
  const int32_t* id_ptr = nullptr;
  if (h.id_width > 0) {
    ids_.resize(static_cast<size_t>(h.tokens));
    for (int64_t t = 0; t < h.tokens; ++t) {
      ids_[t] = static_cast<int32_t>(LoadSubspaceId(ids + t * h.id_width, h.id_width));
    }
    id_ptr = ids_.data();
  }
  Reconstruct(coef_.data(), h.tokens, h.num_selectors > 0 ? selectors : nullptr, h.mixture_block,
              id_ptr, out.data_as<float>());
  if (!ids_out.empty()) std::copy(ids_.begin(), ids_.end(), ids_out.begin());
  if (selectors_out != nullptr) {
    selectors_out->mixture_block = h.mixture_block;
    selectors_out->values.assign(selectors, selectors + h.num_selectors);
  }
  return absl::OkStatus();
}

absl::Status SubspaceCodec::DecodeForward(absl::Span<const uint8_t> payload,
                                          const TensorView& h_out, absl::Span<int32_t> ids_out,
                                          SubspaceSelectors* selectors_out) {
  return Decode(SubspaceDirection::kForward, payload, h_out, ids_out, selectors_out);
}

absl::Status SubspaceCodec::DecodeBackward(absl::Span<const uint8_t> payload,
                                           const TensorView& g_out,
                                           SubspaceSelectors* selectors_out) {
  return Decode(SubspaceDirection::kBackward, payload, g_out, {}, selectors_out);
}

absl::StatusOr<SubspaceEnergy> SubspaceCodec::MeasureEnergy(const TensorView& h,
                                                            absl::Span<const int32_t> ids) {
  LBCC_RETURN_IF_ERROR(CheckActivations(h, "activations"));
  const int64_t tokens = h.dim(0);
  LBCC_RETURN_IF_ERROR(CheckIds(ids, tokens));
  const SubspaceBasis& b = *basis_;
  const int64_t d = b.model_dim(), k = b.rank();
  const int32_t* id_ptr = ids.empty() ? nullptr : ids.data();
  const float* x = h.data_as<float>();
  ProjectForward(x, tokens, id_ptr, options_.mixture_block);
  std::vector<float> rebuilt(static_cast<size_t>(tokens * d));
  Reconstruct(coef_.data(), tokens, b.components() > 1 ? selectors_.data() : nullptr,
              options_.mixture_block, id_ptr, rebuilt.data());
  SubspaceEnergy e;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = x + t * d;
    const float* rec = rebuilt.data() + t * d;
    const float* base = (b.has_table() && id_ptr != nullptr)
                            ? b.table().data() + static_cast<int64_t>(id_ptr[t]) * d
                            : nullptr;
    for (int64_t i = 0; i < d; ++i) {
      const double centred = static_cast<double>(row[i]) - (base ? base[i] : 0.0f);
      const double r = static_cast<double>(row[i]) - rec[i];
      e.total += centred * centred;
      e.residual += r * r;
    }
    for (int64_t j = 0; j < k; ++j) {
      e.captured += static_cast<double>(coef_[t * k + j]) * coef_[t * k + j];
    }
  }
  return e;
}

// --- SubspacePayloadCodec: the subspace codec as a codecs::Codec.

namespace {

CodecId IdOf(SubspaceDirection direction) {
  return direction == SubspaceDirection::kForward ? CodecId::kSubspaceForward
                                                  : CodecId::kSubspaceBackward;
}

// The subspace codec's part of a DecodeScratch.
struct SubspaceDecodeScratch final : CodecScratch {
  std::optional<SubspaceCodec> codec;  // decodes (it keeps buffers); rebuilt for a new basis
  std::vector<float> tile;             // one payload's reconstruction
  std::vector<float> acc;              // the aggregate of several payloads
};

}  // namespace

absl::Status SubspaceMessageState::Commit() {
  return absl::FailedPreconditionError("subspace state: nothing to commit (stateless codec)");
}

absl::Status SubspaceMessageState::Abort() {
  return absl::FailedPreconditionError("subspace state: nothing to abort (stateless codec)");
}

absl::StatusOr<std::unique_ptr<SubspacePayloadCodec>> SubspacePayloadCodec::Create(
    std::shared_ptr<const SubspaceBasis> basis, SubspaceDirection direction,
    SubspaceCodecOptions options) {
  LBCC_ASSIGN_OR_RETURN(SubspaceCodec codec, SubspaceCodec::Create(std::move(basis), options));
  return std::unique_ptr<SubspacePayloadCodec>(
      new SubspacePayloadCodec(direction, std::move(codec)));
}

std::unique_ptr<SubspacePayloadCodec> SubspacePayloadCodec::Inspector(
    SubspaceDirection direction) {
  return std::unique_ptr<SubspacePayloadCodec>(new SubspacePayloadCodec(direction, std::nullopt));
}

CodecId SubspacePayloadCodec::id() const { return IdOf(direction_); }

std::string SubspacePayloadCodec::Describe() const {
  if (!codec_) return absl::StrCat(name(), "(no basis: inspects only)");
  const SubspaceBasis& b = codec_->basis();
  const SubspaceCodecOptions& o = codec_->options();
  return absl::StrFormat("%s(basis %s, d=%d, k=%d, M=%d, V=%d, coefficients=%s, int8_block=%d, "
                         "mixture_block=%d)",
                         std::string(name()), b.id().ToString(), b.model_dim(), b.rank(),
                         b.components(), b.vocab_size(),
                         std::string(DTypeName(o.coefficient_dtype)), o.int8_block,
                         o.mixture_block);
}

absl::Status SubspacePayloadCodec::NeedBasis(absl::string_view what) const {
  if (codec_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(name(), ": ", what, " needs a basis (SubspacePayloadCodec::Create)"));
}

absl::StatusOr<size_t> SubspacePayloadCodec::MaxEncodedBytes(
    absl::Span<const int64_t> shape) const {
  LBCC_RETURN_IF_ERROR(NeedBasis("MaxEncodedBytes"));
  if (shape.size() != 2 || shape[0] < 0 || shape[1] != codec_->basis().model_dim()) {
    return absl::InvalidArgumentError(absl::StrCat(name(), ": expected [tokens, ",
                                                   codec_->basis().model_dim(), "], got ",
                                                   ShapeToString(shape)));
  }
  return direction_ == SubspaceDirection::kForward ? codec_->ForwardPayloadBytes(shape[0])
                                                   : codec_->BackwardPayloadBytes(shape[0]);
}

std::unique_ptr<CodecState> SubspacePayloadCodec::NewState() const {
  if (!codec_) return nullptr;
  return std::unique_ptr<CodecState>(new SubspaceMessageState(this, id(), *codec_));
}

absl::StatusOr<size_t> SubspacePayloadCodec::Encode(const TensorView& input, CodecState* state,
                                                    absl::Span<uint8_t> out) const {
  LBCC_RETURN_IF_ERROR(NeedBasis("Encode"));
  if (state == nullptr || state->codec() != id() || state->is_device()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": Encode needs a SubspaceMessageState from this codec's NewState()"));
  }
  auto& st = static_cast<SubspaceMessageState&>(*state);
  if (st.owner_ != this) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(), ": the state comes from another SubspacePayloadCodec (basis ",
        st.codec_.basis().id().ToString(), "; this codec's is ", codec_->basis().id().ToString(),
        "): use this codec's NewState()"));
  }
  if (direction_ == SubspaceDirection::kForward) {
    return st.codec_.EncodeForward(input, st.ids_, out, &st.selectors_);
  }
  return st.codec_.EncodeBackward(input, st.selectors_, out);
}

std::unique_ptr<CodecScratch> SubspacePayloadCodec::NewDecodeScratch() const {
  return std::make_unique<SubspaceDecodeScratch>();
}

absl::Status SubspacePayloadCodec::PrepareDecode(const DecodeCall& call,
                                                 CodecScratch* scratch) const {
  if (!codec_) {
    return absl::UnimplementedError(absl::StrCat(
        "decode: ", name(), " payloads decode with their basis: DecodeAccumulate with a "
        "SubspacePayloadCodec, or SubspaceCodec"));
  }
  for (size_t r = 0; r < call.infos.size(); ++r) {
    absl::StatusOr<SubspacePayloadHeader> h = ParseSubspaceHeader(call.infos[r]);
    absl::Status status = h.status();
    if (status.ok()) status = CheckSubspaceHeaderForDecode(*h, direction_, codec_->basis());
    if (status.ok()) status = CheckSubspaceBody(SubspaceBodyToEnd(call.infos[r]), *h).status();
    if (!status.ok()) return Annotate(status, absl::StrCat("payload ", r));
  }
  auto& s = static_cast<SubspaceDecodeScratch&>(*scratch);
  if (!s.codec || &s.codec->basis() != &codec_->basis()) s.codec.emplace(*codec_);
  return absl::OkStatus();
}

void SubspacePayloadCodec::ApplyDecode(const DecodeCall& call, CodecScratch* scratch) const {
  auto& s = static_cast<SubspaceDecodeScratch&>(*scratch);
  const bool forward = direction_ == SubspaceDirection::kForward;
  auto decode = [&](absl::Span<const uint8_t> payload, const TensorView& into) {
    const absl::Status status =
        forward ? s.codec->DecodeForward(payload, into) : s.codec->DecodeBackward(payload, into);
    LBCC_CHECK(status.ok()) << "validated by PrepareDecode: " << status;
  };
  const TensorView& out = call.out;
  if (call.payloads.size() == 1 && !call.options.accumulate) {
    decode(call.payloads[0], out);
    return;
  }
  // As the dense codecs: agg = v_0 + v_1 + ... in payload order, then the rule (every payload
  // carries every coordinate, so the two means agree).
  const size_t n = static_cast<size_t>(out.num_elements());
  if (n == 0) return;
  s.tile.resize(n);
  s.acc.assign(n, -0.0f);  // -0 + v == v for every v, -0 included
  const TensorView tile = *TensorView::Host(s.tile.data(), out.shape());
  for (absl::Span<const uint8_t> payload : call.payloads) {
    decode(payload, tile);
    for (size_t i = 0; i < n; ++i) s.acc[i] = s.acc[i] + s.tile[i];
  }
  const float replicas = static_cast<float>(call.payloads.size());
  const bool divide = call.options.aggregation != Aggregation::kSum;
  float* o = out.data_as<float>();
  for (size_t i = 0; i < n; ++i) {
    const float agg = divide ? s.acc[i] / replicas : s.acc[i];
    o[i] = call.options.accumulate ? o[i] + agg : agg;
  }
}

absl::Status SubspacePayloadCodec::Inspect(const PayloadInfo& info,
                                           PayloadSummary* summary) const {
  LBCC_ASSIGN_OR_RETURN(const SubspacePayloadHeader h, ParseSubspaceHeader(info));
  LBCC_RETURN_IF_ERROR(CheckSubspaceBody(SubspaceBodyToEnd(info), h).status());
  summary->selected = h.tokens * h.rank;
  summary->details = absl::StrFormat(
      "%d tokens, basis %s (d %d, k %d, M %d, V %d), coefficients %s%s%s", h.tokens,
      h.basis.ToString(), h.model_dim, h.rank, h.components, h.vocab_size,
      std::string(DTypeName(h.coefficient_dtype)),
      h.int8_block > 0 ? absl::StrFormat(" (a scale per %d)", h.int8_block) : std::string(),
      h.mixture_block > 0 ? absl::StrFormat(", a selector per %d tokens", h.mixture_block)
                          : std::string());
  return absl::OkStatus();
}

LBCC_REGISTER_CODEC(SubspacePayloadCodec::Inspector(SubspaceDirection::kForward));
LBCC_REGISTER_CODEC(SubspacePayloadCodec::Inspector(SubspaceDirection::kBackward));

}  // namespace lbcc::codecs
