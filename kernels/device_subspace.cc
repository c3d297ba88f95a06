#include "kernels/device_subspace.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "codecs/payload.h"
#include "kernels/backend.h"
#include "kernels/device_internal.h"

namespace lbcc::kernels {
namespace {

static_assert(kCoefF32 == static_cast<int>(DType::kF32));
static_assert(kCoefF16 == static_cast<int>(DType::kF16));
static_assert(kCoefBf16 == static_cast<int>(DType::kBF16));
static_assert(kCoefI8 == static_cast<int>(DType::kI8));

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Sub-buffers of one allocation.
class Carve {
 public:
  size_t Add(size_t bytes) {
    const size_t at = size_;
    size_ += AlignUp(bytes);
    return at;
  }
  size_t size() const { return std::max<size_t>(size_, 256); }

 private:
  size_t size_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceSubspaceCodec>> DeviceSubspaceCodec::Create(
    std::shared_ptr<const codecs::SubspaceBasis> basis, codecs::SubspaceCodecOptions options,
    int device) {
  Backend* backend = CudaBackend();
  if (backend == nullptr) return NoCuda("DeviceSubspaceCodec");
  return Create(*backend, std::move(basis), options, device);
}

absl::StatusOr<std::unique_ptr<DeviceSubspaceCodec>> DeviceSubspaceCodec::Create(
    Backend& backend, std::shared_ptr<const codecs::SubspaceBasis> basis,
    codecs::SubspaceCodecOptions options, int device) {
  LBCC_ASSIGN_OR_RETURN(codecs::SubspaceCodec host, codecs::SubspaceCodec::Create(basis, options));
  std::unique_ptr<DeviceSubspaceCodec> codec(
      new DeviceSubspaceCodec(backend, std::move(basis), options, std::move(host), device));
  LBCC_RETURN_IF_ERROR(codec->Upload());
  return codec;
}

DeviceSubspaceCodec::DeviceSubspaceCodec(Backend& backend,
                                         std::shared_ptr<const codecs::SubspaceBasis> basis,
                                         codecs::SubspaceCodecOptions options,
                                         codecs::SubspaceCodec host, int device)
    : backend_(&backend),
      basis_(std::move(basis)),
      options_(options),
      host_(std::move(host)),
      device_(device),
      buffers_(backend) {}

DeviceSubspaceCodec::~DeviceSubspaceCodec() {
  if (blas_ != nullptr) backend_->DestroyBlas(blas_);
  for (float* p : {u_, projected_table_, table_}) {
    if (p != nullptr) backend_->Free(p);
  }
}

absl::Status DeviceSubspaceCodec::Upload() {
  LBCC_RETURN_IF_ERROR(backend_->SetDevice(device_));
  LBCC_ASSIGN_OR_RETURN(blas_, backend_->CreateBlas());
  auto upload = [this](absl::Span<const float> host, float** device) -> absl::Status {
    if (host.empty()) return absl::OkStatus();
    LBCC_ASSIGN_OR_RETURN(void* p, backend_->Malloc(host.size() * sizeof(float)));
    *device = static_cast<float*>(p);
    return backend_->CopyToDevice(p, host.data(), host.size() * sizeof(float), nullptr);
  };
  LBCC_RETURN_IF_ERROR(upload(basis_->u(), &u_));
  LBCC_RETURN_IF_ERROR(upload(basis_->projected_table(), &projected_table_));
  LBCC_RETURN_IF_ERROR(upload(basis_->table(), &table_));
  return backend_->Synchronize(nullptr);
}

absl::Status DeviceSubspaceCodec::CheckView(const TensorView& x, absl::string_view what) const {
  const MemoryKind memory = backend_->is_device() ? MemoryKind::kCuda : MemoryKind::kHost;
  if (x.memory() != memory || x.dtype() != DType::kF32 || x.rank() != 2 ||
      x.dim(1) != basis_->model_dim() || (memory == MemoryKind::kCuda && x.device() != device_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", x.DebugString(), ", expected f32[tokens, ", basis_->model_dim(), "]@",
        memory == MemoryKind::kCuda ? absl::StrCat("cuda:", device_) : std::string("host")));
  }
  if (x.dim(0) > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", x.dim(0), " tokens, at most ", INT32_MAX));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> DeviceSubspaceCodec::EncodeForward(const TensorView& h,
                                                          absl::Span<const int32_t> ids,
                                                          absl::Span<uint8_t> out,
                                                          codecs::SubspaceSelectors* selectors_out,
                                                          void* stream) {
  LBCC_RETURN_IF_ERROR(CheckView(h, "activations"));
  const int64_t tokens = h.dim(0);
  const int64_t v = basis_->vocab_size();
  if (v == 0) {
    if (!ids.empty()) {
      return absl::InvalidArgumentError("the basis has no vocabulary: pass no token ids");
    }
  } else {
    if (static_cast<int64_t>(ids.size()) != tokens) {
      return absl::InvalidArgumentError(absl::StrCat(ids.size(), " token ids for ", tokens,
                                                     " tokens"));
    }
    for (size_t t = 0; t < ids.size(); ++t) {
      if (ids[t] < 0 || ids[t] >= v) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", ids[t], " at position ", t,
                                                       " outside [0, V = ", v, ")"));
      }
    }
  }
  return Encode(true, h.data_as<const float>(), tokens, ids, nullptr, options_.mixture_block, out,
                selectors_out, stream);
}

absl::StatusOr<size_t> DeviceSubspaceCodec::EncodeBackward(
    const TensorView& g_h, const codecs::SubspaceSelectors& selectors, absl::Span<uint8_t> out,
    void* stream) {
  LBCC_RETURN_IF_ERROR(CheckView(g_h, "gradients"));
  const int64_t tokens = g_h.dim(0);
  const int64_t m = basis_->components();
  LBCC_ASSIGN_OR_RETURN(const int64_t block, codecs::BackwardSelectorBlock(
                                                 selectors, m, tokens, options_.mixture_block));
  return Encode(false, g_h.data_as<const float>(), tokens, {},
                m > 1 ? selectors.values.data() : nullptr, block, out, nullptr, stream);
}

absl::Status DeviceSubspaceCodec::ProjectBackward(const float* x, int64_t tokens,
                                                  const uint8_t* selectors, int64_t block,
                                                  float* coef, void* stream) {
  const codecs::SubspaceBasis& b = *basis_;
  const int64_t d = b.model_dim(), k = b.rank(), ld = b.ld();
  return codecs::ForEachSelectorRun(tokens, selectors, block, [&](int64_t t0, int64_t t1, int c) {
    return backend_->Gemm(blas_, stream, false, false, static_cast<int>(k),
                          static_cast<int>(t1 - t0), static_cast<int>(d), 1.0f, u_ + c * k,
                          static_cast<int>(ld), x + t0 * d, static_cast<int>(d), 0.0f,
                          coef + t0 * k, static_cast<int>(k));
  });
}

absl::StatusOr<size_t> DeviceSubspaceCodec::Encode(bool forward, const float* x, int64_t tokens,
                                                   absl::Span<const int32_t> ids,
                                                   const uint8_t* selectors, int64_t block,
                                                   absl::Span<uint8_t> out,
                                                   codecs::SubspaceSelectors* selectors_out,
                                                   void* stream) {
  const codecs::SubspaceBasis& b = *basis_;
  const int64_t d = b.model_dim(), k = b.rank(), m = b.components(), ld = b.ld();
  const int id_width = forward ? b.id_width() : 0;
  const DType dtype = options_.coefficient_dtype;
  const int64_t int8_block = dtype == DType::kI8 ? options_.int8_block : 0;
  const int64_t num_selectors = m > 1 ? CeilDiv(tokens, block) : 0;
  const codecs::SubspaceBodyLayout layout =
      codecs::SubspaceLayout(tokens, k, num_selectors, id_width, dtype, int8_block);
  const size_t bytes = codecs::PayloadBytes(2, codecs::kSubspaceParamsBytes, layout.total());
  if (out.size() < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload buffer holds ", out.size(), " bytes, needs ", bytes));
  }
  LBCC_RETURN_IF_ERROR(backend_->SetDevice(device_));
  const bool subtract_table = forward && b.has_table() && !ids.empty();
  // Device: all (forward: every component), coef (the chosen component), ids, selectors,
  // scales, quantized coefficients. Host staging: ids out, selectors, scales, coefficients back.
  Carve dev;
  const size_t all_at = dev.Add(sizeof(float) * static_cast<size_t>(tokens * (forward ? ld : k)));
  const size_t coef_at = dev.Add(sizeof(float) * static_cast<size_t>(tokens * k));
  const size_t ids_at = dev.Add(subtract_table ? sizeof(int32_t) * static_cast<size_t>(tokens) : 0);
  const size_t sel_at = dev.Add(layout.selectors);
  const size_t scales_at = dev.Add(layout.scales);
  const size_t q_at = dev.Add(layout.coefficients);
  LBCC_ASSIGN_OR_RETURN(uint8_t * device, buffers_.Device(dev.size()));
  LBCC_ASSIGN_OR_RETURN(uint8_t * host, buffers_.Host(dev.size()));
  float* all = reinterpret_cast<float*>(device + all_at);
  float* coef = forward && m == 1 ? all : reinterpret_cast<float*>(device + coef_at);
  if (tokens > 0) {
    if (forward) {
      // all^T [ld x tokens] = U^T [ld x d] h^T [d x tokens] (column-major views of row-major).
      LBCC_RETURN_IF_ERROR(backend_->Gemm(blas_, stream, false, false, static_cast<int>(ld),
                                          static_cast<int>(tokens), static_cast<int>(d), 1.0f, u_,
                                          static_cast<int>(ld), x, static_cast<int>(d), 0.0f, all,
                                          static_cast<int>(ld)));
      SubspaceForwardArgs fa;
      fa.tokens = tokens;
      fa.k = k;
      fa.components = m;
      fa.mixture_block = block;
      fa.all = all;
      fa.coef = coef;
      fa.selectors = device + sel_at;
      if (subtract_table) {
        std::memcpy(host + ids_at, ids.data(), sizeof(int32_t) * static_cast<size_t>(tokens));
        LBCC_RETURN_IF_ERROR(backend_->CopyToDevice(device + ids_at, host + ids_at,
                                                    sizeof(int32_t) * tokens, stream));
        fa.ids = reinterpret_cast<const int32_t*>(device + ids_at);
        fa.projected_table = projected_table_;
      }
      LBCC_RETURN_IF_ERROR(backend_->SubspaceForwardPrep(fa, stream));
    } else {
      LBCC_RETURN_IF_ERROR(ProjectBackward(x, tokens, selectors, block, coef, stream));
    }
    SubspaceQuantizeArgs qa;
    qa.tokens = tokens;
    qa.k = k;
    qa.dtype = static_cast<int>(dtype);
    qa.int8_block = int8_block;
    qa.coef = coef;
    qa.scales = device + scales_at;
    qa.out = device + q_at;
    LBCC_RETURN_IF_ERROR(backend_->SubspaceQuantize(qa, stream));
    if (forward && m > 1) {
      LBCC_RETURN_IF_ERROR(
          backend_->CopyToHost(host + sel_at, device + sel_at, layout.selectors, stream));
    }
    LBCC_RETURN_IF_ERROR(
        backend_->CopyToHost(host + scales_at, device + scales_at, layout.scales, stream));
    LBCC_RETURN_IF_ERROR(backend_->CopyToHost(host + q_at, device + q_at, layout.coefficients,
                                              stream));
    LBCC_RETURN_IF_ERROR(backend_->Synchronize(stream));
  }
  // The envelope, parameters, selectors and ids as the CPU codec writes them.
  const uint8_t* chosen = forward ? host + sel_at : selectors;
  codecs::PayloadWriter writer;
  LBCC_ASSIGN_OR_RETURN(uint8_t * p, codecs::BeginSubspacePayload(
                                          b, forward ? codecs::SubspaceDirection::kForward
                                                     : codecs::SubspaceDirection::kBackward,
                                          tokens, block, dtype, int8_block, chosen, ids.data(),
                                          out, &writer));
  if (layout.scales > 0) std::memcpy(p, host + scales_at, layout.scales);
  p += layout.scales;
  if (layout.coefficients > 0) std::memcpy(p, host + q_at, layout.coefficients);
  if (selectors_out != nullptr) {
    selectors_out->mixture_block = m > 1 ? block : 0;
    selectors_out->values.assign(chosen, chosen + num_selectors);
  }
  return writer.Finish();
}

absl::Status DeviceSubspaceCodec::DecodeForward(absl::Span<const uint8_t> payload,
                                                const TensorView& h_out,
                                                absl::Span<int32_t> ids_out,
                                                codecs::SubspaceSelectors* selectors_out,
                                                void* stream) {
  return Decode(true, payload, h_out, ids_out, selectors_out, stream);
}

absl::Status DeviceSubspaceCodec::DecodeBackward(absl::Span<const uint8_t> payload,
                                                 const TensorView& g_out,
                                                 codecs::SubspaceSelectors* selectors_out,
                                                 void* stream) {
  return Decode(false, payload, g_out, {}, selectors_out, stream);
}

absl::Status DeviceSubspaceCodec::Decode(bool forward, absl::Span<const uint8_t> payload,
                                         const TensorView& out, absl::Span<int32_t> ids_out,
                                         codecs::SubspaceSelectors* selectors_out, void* stream) {
  LBCC_ASSIGN_OR_RETURN(const codecs::SubspacePayloadHeader h,
                        codecs::InspectSubspacePayload(payload));
  LBCC_RETURN_IF_ERROR(codecs::CheckSubspaceHeaderForDecode(
      h, forward ? codecs::SubspaceDirection::kForward : codecs::SubspaceDirection::kBackward,
      *basis_));
  const codecs::SubspaceBasis& b = *basis_;
  LBCC_RETURN_IF_ERROR(CheckView(out, "output"));
  if (out.dim(0) != h.tokens) {
    return absl::InvalidArgumentError(absl::StrCat("output is ", out.DebugString(),
                                                   ", the payload holds f32[", h.tokens, ", ",
                                                   h.model_dim, "]"));
  }
  const int64_t id_count = h.id_width > 0 ? h.tokens : 0;
  if (!ids_out.empty() && static_cast<int64_t>(ids_out.size()) != id_count) {
    return absl::InvalidArgumentError(absl::StrCat("ids output holds ", ids_out.size(),
                                                   " values, the payload carries ", id_count,
                                                   " ids"));
  }
  // Validate everything before writing anything.
  LBCC_ASSIGN_OR_RETURN(const codecs::SubspaceBody body, codecs::CheckSubspaceBody(payload, h));
  const codecs::SubspaceBodyLayout& layout = body.layout;
  const uint8_t* selectors = body.selectors;
  const uint8_t* ids = body.ids;
  const uint8_t* scales = body.scales;
  const uint8_t* coefficients = body.coefficients;
  const int64_t tokens = h.tokens, d = b.model_dim(), k = b.rank(), ld = b.ld();
  if (tokens > 0) {
    LBCC_RETURN_IF_ERROR(backend_->SetDevice(device_));
    const bool add_table = forward && h.id_width > 0 && b.has_table();
    Carve image;
    const size_t ids_at = image.Add(add_table ? sizeof(int32_t) * static_cast<size_t>(tokens) : 0);
    const size_t scales_at = image.Add(layout.scales);
    const size_t q_at = image.Add(layout.coefficients);
    const size_t coef_at = image.Add(sizeof(float) * static_cast<size_t>(tokens * k));
    LBCC_ASSIGN_OR_RETURN(uint8_t * device, buffers_.Device(image.size()));
    LBCC_ASSIGN_OR_RETURN(uint8_t * host, buffers_.Host(image.size()));
    if (add_table) {
      auto* id32 = reinterpret_cast<int32_t*>(host + ids_at);
      for (int64_t t = 0; t < tokens; ++t) {
        id32[t] = static_cast<int32_t>(codecs::LoadSubspaceId(ids + t * h.id_width, h.id_width));
      }
    }
    if (layout.scales > 0) std::memcpy(host + scales_at, scales, layout.scales);
    std::memcpy(host + q_at, coefficients, layout.coefficients);
    LBCC_RETURN_IF_ERROR(backend_->CopyToDevice(device, host, coef_at, stream));
    float* coef = reinterpret_cast<float*>(device + coef_at);
    SubspaceDequantizeArgs da;
    da.tokens = tokens;
    da.k = k;
    da.dtype = static_cast<int>(h.coefficient_dtype);
    da.int8_block = h.int8_block;
    da.scales = device + scales_at;
    da.in = device + q_at;
    da.coef = coef;
    LBCC_RETURN_IF_ERROR(backend_->SubspaceDequantize(da, stream));
    float* o = out.data_as<float>();
    if (add_table) {
      SubspaceGatherArgs ga;
      ga.tokens = tokens;
      ga.d = d;
      ga.ids = reinterpret_cast<const int32_t*>(device + ids_at);
      ga.table = table_;
      ga.out = o;
      LBCC_RETURN_IF_ERROR(backend_->SubspaceGatherTable(ga, stream));
    }
    // out^T [d x rows] (+)= U_c [d x k] coef^T [k x rows], per run of one component.
    LBCC_RETURN_IF_ERROR(codecs::ForEachSelectorRun(
        tokens, h.num_selectors > 0 ? selectors : nullptr, h.mixture_block,
        [&](int64_t t0, int64_t t1, int c) {
          return backend_->Gemm(blas_, stream, true, false, static_cast<int>(d),
                                static_cast<int>(t1 - t0), static_cast<int>(k), 1.0f, u_ + c * k,
                                static_cast<int>(ld), coef + t0 * k, static_cast<int>(k),
                                add_table ? 1.0f : 0.0f, o + t0 * d, static_cast<int>(d));
        }));
    LBCC_RETURN_IF_ERROR(backend_->Synchronize(stream));
  }
  if (!ids_out.empty()) {
    for (int64_t t = 0; t < tokens; ++t) {
      ids_out[t] = static_cast<int32_t>(codecs::LoadSubspaceId(ids + t * h.id_width, h.id_width));
    }
  }
  if (selectors_out != nullptr) {
    selectors_out->mixture_block = h.mixture_block;
    selectors_out->values.assign(selectors, selectors + h.num_selectors);
  }
  return absl::OkStatus();
}

}  // namespace lbcc::kernels
