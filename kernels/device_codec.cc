// Public entry points of the device codecs, DeviceScratch, the dense-quantizer encode and the
// decode-accumulate orchestration (validation on the host, aggregation on the device).
#include "kernels/device_codec.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/dense_quant.h"
#include "codecs/index_coding.h"
#include "codecs/payload.h"
#include "codecs/topk_ef.h"
#include "codecs/value_coding.h"
#include "kernels/backend.h"
#include "kernels/cuda_runtime.h"
#include "kernels/device_internal.h"

namespace lbcc::kernels {

static_assert(kDenseInt8 == static_cast<int>(codecs::DenseFormat::kInt8));
static_assert(kDenseInt4 == static_cast<int>(codecs::DenseFormat::kInt4));
static_assert(kDenseF16 == static_cast<int>(codecs::DenseFormat::kF16));
static_assert(kDenseBf16 == static_cast<int>(codecs::DenseFormat::kBf16));
static_assert(kAggSparseLoCoMean == static_cast<int>(codecs::Aggregation::kSparseLoCoMean));
static_assert(kAggMean == static_cast<int>(codecs::Aggregation::kMean));
static_assert(kAggSum == static_cast<int>(codecs::Aggregation::kSum));

namespace {

constexpr int64_t kMaxPayloads = 65535;  // codecs/topk_ef.cc: selection counts are 16-bit

bool IsInt(codecs::DenseFormat f) {
  return f == codecs::DenseFormat::kInt8 || f == codecs::DenseFormat::kInt4;
}

size_t DenseCodeBytes(codecs::DenseFormat f, int64_t n) {
  switch (f) {
    case codecs::DenseFormat::kInt8:
      return static_cast<size_t>(n);
    case codecs::DenseFormat::kInt4:
      return static_cast<size_t>((n + 1) / 2);
    default:
      return static_cast<size_t>(2 * n);
  }
}

// A host image of device memory: sections appended at 256-byte boundaries; Pointer() names the
// device address a section will have once the image is copied to `device_base`.
class Image {
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

absl::Status DecodeTopK(Backend& be, absl::Span<const codecs::PayloadInfo> infos,
                        const codecs::DecodeOptions& options, float* out, Stream stream,
                        DeviceScratch& scratch) {
  if (static_cast<int64_t>(infos.size()) > kMaxPayloads) {
    return absl::InvalidArgumentError(
        absl::StrCat("topk_ef: at most ", kMaxPayloads, " payloads per call"));
  }
  // Phase 1 (host): validate everything, as the CPU decoder does, before touching `out`.
  std::vector<codecs::TopKEfHeader> headers(infos.size());
  std::vector<size_t> index_first(infos.size());
  size_t total = 0;
  for (size_t r = 0; r < infos.size(); ++r) {
    LBCC_ASSIGN_OR_RETURN(headers[r], codecs::ParseTopKEfHeader(infos[r]),
                          _.Prepend(absl::StrCat("payload ", r)));
    index_first[r] = total;
    total += static_cast<size_t>(headers[r].layout.count());
  }
  const codecs::ChunkGeometry& g = headers[0].geometry;
  Image image;
  const size_t descs_at = image.Add(infos.size() * sizeof(TopKPayloadDesc));
  const size_t indices_at = image.Add(total * sizeof(uint16_t));
  std::vector<size_t> table_at(infos.size(), 0), values_at(infos.size(), 0);
  for (size_t r = 0; r < infos.size(); ++r) {
    if (codecs::IsBinMean(headers[r].values)) table_at[r] = image.Add(256 * sizeof(float));
    values_at[r] = image.Add(headers[r].value_section.size());
  }
  LBCC_ASSIGN_OR_RETURN(uint8_t * host, scratch.Host(image.size()));
  LBCC_ASSIGN_OR_RETURN(uint8_t * device, scratch.Device(image.size()));
  auto* indices = reinterpret_cast<uint16_t*>(host + indices_at);
  auto* descs = reinterpret_cast<TopKPayloadDesc*>(host + descs_at);
  for (size_t r = 0; r < infos.size(); ++r) {
    const codecs::TopKEfHeader& h = headers[r];
    const absl::Span<uint16_t> list(indices + index_first[r], static_cast<size_t>(h.layout.count()));
    absl::Status status =
        h.indices == codecs::IndexCoding::kAdaptive
            ? codecs::DecodeAdaptive(h.index_section, h.layout, h.adaptive, list)
            : codecs::DecodePacked12(h.index_section, h.layout, list);
    codecs::ValueDecoder values;
    if (status.ok()) status = values.Init(h.values, h.value_params, h.value_section, h.layout.count());
    if (!status.ok()) return Annotate(status, absl::StrCat("payload ", r));
    TopKPayloadDesc d;
    d.k = h.layout.k;
    d.index_offset = static_cast<int64_t>(index_first[r]);
    d.coding = static_cast<int32_t>(h.values);
    d.block = values.block();
    d.values = device + values_at[r];
    if (!h.value_section.empty()) {
      std::memcpy(host + values_at[r], h.value_section.data(), h.value_section.size());
    }
    if (codecs::IsBinMean(h.values)) {
      // codecs::ValueDecoder's table: lookup[b] + shift in fp32.
      auto* table = reinterpret_cast<float*>(host + table_at[r]);
      const int bins = 1 << BinMeanBits(d.coding);
      const float shift = hd::LoadF32(h.value_params.data());
      for (int b = 0; b < 256; ++b) {
        table[b] = b < bins ? hd::Add(hd::LoadF32(h.value_params.data() + 4 + 4 * b), shift) : 0.0f;
      }
      d.table = reinterpret_cast<const float*>(device + table_at[r]);
    }
    descs[r] = d;
  }
  if (g.num_chunks == 0) return absl::OkStatus();  // no elements
  // Phase 2 (device): upload, aggregate chunk by chunk.
  LBCC_RETURN_IF_ERROR(be.CopyToDevice(device, host, image.size(), stream));
  AggregateArgs a;
  a.g.rows = g.rows;
  a.g.cols = g.cols;
  a.g.h = g.h;
  a.g.w = g.w;
  a.g.chunk_len = g.chunk_len;
  a.g.chunks_x = g.chunks_x;
  a.g.num_chunks = g.num_chunks;
  a.payloads = reinterpret_cast<const TopKPayloadDesc*>(device + descs_at);
  a.num_payloads = static_cast<int32_t>(infos.size());
  a.indices = reinterpret_cast<const uint16_t*>(device + indices_at);
  a.rule = static_cast<int32_t>(options.aggregation);
  a.accumulate = options.accumulate;
  a.out = out;
  LBCC_RETURN_IF_ERROR(be.AggregateTopK(a, stream));
  return be.Synchronize(stream);
}

absl::Status DecodeDense(Backend& be, absl::Span<const codecs::PayloadInfo> infos,
                         const codecs::DecodeOptions& options, float* out, int64_t n,
                         Stream stream, DeviceScratch& scratch) {
  std::vector<codecs::DenseQuantHeader> headers(infos.size());
  for (size_t r = 0; r < infos.size(); ++r) {
    LBCC_ASSIGN_OR_RETURN(headers[r], codecs::ParseDenseQuantHeader(infos[r]),
                          _.Prepend(absl::StrCat("payload ", r)));
  }
  if (n == 0) return absl::OkStatus();
  Image image;
  const size_t descs_at = image.Add(infos.size() * sizeof(DensePayloadDesc));
  std::vector<size_t> scales_at(infos.size()), codes_at(infos.size());
  for (size_t r = 0; r < infos.size(); ++r) {
    scales_at[r] = image.Add(headers[r].scales.size());
    codes_at[r] = image.Add(headers[r].codes.size());
  }
  LBCC_ASSIGN_OR_RETURN(uint8_t * host, scratch.Host(image.size()));
  LBCC_ASSIGN_OR_RETURN(uint8_t * device, scratch.Device(image.size()));
  auto* descs = reinterpret_cast<DensePayloadDesc*>(host + descs_at);
  for (size_t r = 0; r < infos.size(); ++r) {
    const codecs::DenseQuantHeader& h = headers[r];
    if (!h.scales.empty()) std::memcpy(host + scales_at[r], h.scales.data(), h.scales.size());
    if (!h.codes.empty()) std::memcpy(host + codes_at[r], h.codes.data(), h.codes.size());
    DensePayloadDesc d;
    d.format = static_cast<int32_t>(h.format);
    d.block = h.block;
    d.scales = reinterpret_cast<const float*>(device + scales_at[r]);
    d.codes = device + codes_at[r];
    descs[r] = d;
  }
  LBCC_RETURN_IF_ERROR(be.CopyToDevice(device, host, image.size(), stream));
  DenseAggregateArgs a;
  a.payloads = reinterpret_cast<const DensePayloadDesc*>(device + descs_at);
  a.num_payloads = static_cast<int32_t>(infos.size());
  a.num_elements = n;
  a.divide = options.aggregation != codecs::Aggregation::kSum;
  a.accumulate = options.accumulate;
  a.out = out;
  LBCC_RETURN_IF_ERROR(be.AggregateDense(a, stream));
  return be.Synchronize(stream);
}

}  // namespace

absl::StatusOr<size_t> EncodeDenseWith(Backend& be, const codecs::DenseQuantCodec& codec,
                                       const float* x, absl::Span<const int64_t> shape,
                                       absl::Span<uint8_t> out, Stream stream,
                                       DeviceScratch& scratch) {
  const codecs::DenseQuantOptions& o = codec.options();
  LBCC_ASSIGN_OR_RETURN(const int64_t n, NumElements(shape));
  const int64_t block = IsInt(o.format) ? o.block : 0;
  const int64_t blocks = block > 0 ? (n + block - 1) / block : 0;
  const size_t scale_bytes = 4 * static_cast<size_t>(blocks);
  const size_t code_bytes = DenseCodeBytes(o.format, n);
  codecs::PayloadWriter writer;
  LBCC_RETURN_IF_ERROR(writer.Begin(out, codecs::CodecId::kDenseQuant, codecs::kDenseQuantVersion,
                                    DType::kF32, shape, 8, scale_bytes + code_bytes));
  codecs::ByteWriter params(writer.params());
  params.U8(static_cast<uint8_t>(o.format));
  params.U8(o.stochastic ? 1 : 0);
  params.U16(0);
  params.U32(static_cast<uint32_t>(block));
  if (n == 0) return writer.Finish();
  Image image;
  const size_t bad_at = image.Add(sizeof(uint64_t));
  const size_t scales_at = image.Add(scale_bytes);
  const size_t codes_at = image.Add(code_bytes);
  LBCC_ASSIGN_OR_RETURN(uint8_t * host, scratch.Host(image.size()));
  LBCC_ASSIGN_OR_RETURN(uint8_t * device, scratch.Device(image.size()));
  LBCC_RETURN_IF_ERROR(be.Memset(device + bad_at, 0xFF, sizeof(uint64_t), stream));
  DenseEncodeArgs a;
  a.format = static_cast<int32_t>(o.format);
  a.block = block;
  a.stochastic = o.stochastic;
  a.seed = o.seed;
  a.x = x;
  a.n = n;
  a.scales = reinterpret_cast<float*>(device + scales_at);
  a.codes = device + codes_at;
  a.first_bad = reinterpret_cast<uint64_t*>(device + bad_at);
  LBCC_RETURN_IF_ERROR(be.DenseEncode(a, stream));
  LBCC_RETURN_IF_ERROR(be.CopyToHost(host, device, image.size(), stream));
  LBCC_RETURN_IF_ERROR(be.Synchronize(stream));
  uint64_t bad;
  std::memcpy(&bad, host + bad_at, sizeof(bad));
  if (bad != ~uint64_t{0}) {
    float v = 0;
    LBCC_RETURN_IF_ERROR(be.CopyToHost(&v, x + bad, sizeof(float), stream));
    LBCC_RETURN_IF_ERROR(be.Synchronize(stream));
    if (hd::AbsBits(v) > hd::kMaxFiniteAbsBits) {
      return absl::InvalidArgumentError(
          absl::StrCat("dense_quant: input element ", bad, " is NaN or infinite"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "dense_quant: element ", bad, " = ", v, " is beyond ",
        o.format == codecs::DenseFormat::kBf16 ? "bf16" : "fp16", "'s range"));
  }
  uint8_t* body = writer.body().data();
  if (scale_bytes > 0) std::memcpy(body, host + scales_at, scale_bytes);
  std::memcpy(body + scale_bytes, host + codes_at, code_bytes);
  return writer.Finish();
}

DeviceScratch::DeviceScratch() : backend_(CudaBackend()) {}
DeviceScratch::DeviceScratch(Backend& backend) : backend_(&backend) {}
DeviceScratch::~DeviceScratch() {
  if (backend_ == nullptr) return;
  if (device_ != nullptr) backend_->Free(device_);
  if (host_ != nullptr) backend_->FreeHost(host_);
}

absl::StatusOr<uint8_t*> DeviceScratch::Device(size_t bytes) {
  if (backend_ == nullptr) return NoCuda("DeviceScratch");
  if (device_bytes_ < bytes) {
    if (device_ != nullptr) backend_->Free(device_);
    device_ = nullptr;
    device_bytes_ = 0;
    LBCC_ASSIGN_OR_RETURN(void* p, backend_->Malloc(bytes));
    device_ = static_cast<uint8_t*>(p);
    device_bytes_ = bytes;
  }
  return device_;
}

absl::StatusOr<uint8_t*> DeviceScratch::Host(size_t bytes) {
  if (backend_ == nullptr) return NoCuda("DeviceScratch");
  if (host_bytes_ < bytes) {
    if (host_ != nullptr) backend_->FreeHost(host_);
    host_ = nullptr;
    host_bytes_ = 0;
    LBCC_ASSIGN_OR_RETURN(void* p, backend_->MallocHost(bytes));
    host_ = static_cast<uint8_t*>(p);
    host_bytes_ = bytes;
  }
  return host_;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes, int device) {
  Backend* backend = CudaBackend();
  if (backend == nullptr) return NoCuda("DeviceBuffer");
  return Allocate(*backend, bytes, device);
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(Backend& backend, size_t bytes, int device) {
  LBCC_RETURN_IF_ERROR(backend.SetDevice(device));
  LBCC_ASSIGN_OR_RETURN(void* p, backend.Malloc(bytes));
  DeviceBuffer b;
  b.backend_ = &backend;
  b.data_ = p;
  b.size_ = bytes;
  b.device_ = device;
  return b;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) backend_->Free(data_);
    backend_ = other.backend_;
    data_ = other.data_;
    size_ = other.size_;
    device_ = other.device_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) backend_->Free(data_);
}

absl::StatusOr<TensorView> DeviceBuffer::View(Shape shape) const {
  LBCC_ASSIGN_OR_RETURN(const int64_t n, NumElements(shape));
  if (static_cast<size_t>(n) * sizeof(float) > size_) {
    return absl::InvalidArgumentError(absl::StrCat("a buffer of ", size_, " bytes cannot hold f32",
                                                   ShapeToString(shape)));
  }
  return TensorView::Create(data_, DType::kF32, std::move(shape),
                            backend_ != nullptr && backend_->is_device() ? MemoryKind::kCuda
                                                                         : MemoryKind::kHost,
                            device_);
}

absl::Status DeviceBuffer::CopyFromHost(absl::Span<const uint8_t> bytes) {
  if (bytes.size() > size_) return absl::InvalidArgumentError("DeviceBuffer: copy too large");
  if (bytes.empty()) return absl::OkStatus();
  LBCC_RETURN_IF_ERROR(backend_->SetDevice(device_));
  LBCC_RETURN_IF_ERROR(backend_->CopyToDevice(data_, bytes.data(), bytes.size(), nullptr));
  return backend_->Synchronize(nullptr);
}

absl::Status DeviceBuffer::CopyToHost(absl::Span<uint8_t> bytes) const {
  if (bytes.size() > size_) return absl::InvalidArgumentError("DeviceBuffer: copy too large");
  if (bytes.empty()) return absl::OkStatus();
  LBCC_RETURN_IF_ERROR(backend_->SetDevice(device_));
  LBCC_RETURN_IF_ERROR(backend_->CopyToHost(bytes.data(), data_, bytes.size(), nullptr));
  return backend_->Synchronize(nullptr);
}

bool DeviceCodecsAvailable() {
  if (CudaBackend() == nullptr) return false;
  absl::StatusOr<int> count = CudaDeviceCount();
  return count.ok() && *count > 0;
}

absl::StatusOr<std::unique_ptr<codecs::CodecState>> NewDeviceState(const codecs::Codec& codec,
                                                                   int device) {
  switch (codec.id()) {
    case codecs::CodecId::kTopKEf: {
      LBCC_ASSIGN_OR_RETURN(std::unique_ptr<DeviceTopKEfState> state,
                            DeviceTopKEfState::Create(device));
      return std::unique_ptr<codecs::CodecState>(std::move(state));
    }
    case codecs::CodecId::kDenseQuant:
      if (CudaBackend() == nullptr) return NoCuda("NewDeviceState");
      return std::unique_ptr<codecs::CodecState>();
    default:
      return absl::UnimplementedError(
          absl::StrCat("no device implementation of ", codecs::CodecName(codec.id())));
  }
}

namespace internal {

absl::StatusOr<size_t> EncodeWith(Backend& backend, const codecs::Codec& codec, const float* data,
                                  absl::Span<const int64_t> shape, codecs::CodecState* state,
                                  absl::Span<uint8_t> out, void* stream, DeviceScratch* scratch) {
  switch (codec.id()) {
    case codecs::CodecId::kTopKEf: {
      const auto* topk = dynamic_cast<const codecs::TopKEfCodec*>(&codec);
      auto* st = dynamic_cast<DeviceTopKEfState*>(state);
      if (topk == nullptr) return absl::InvalidArgumentError("topk_ef: not a TopKEfCodec");
      if (st == nullptr || &st->backend() != &backend) {
        return absl::InvalidArgumentError(
            "topk_ef: encoding device memory needs the tensor's DeviceTopKEfState "
            "(kernels::NewDeviceState)");
      }
      return EncodeTopKWith(*topk, data, shape, *st, out, stream);
    }
    case codecs::CodecId::kDenseQuant: {
      const auto* dense = dynamic_cast<const codecs::DenseQuantCodec*>(&codec);
      if (dense == nullptr) return absl::InvalidArgumentError("dense_quant: not a DenseQuantCodec");
      if (scratch != nullptr && scratch->backend() == &backend) {
        return EncodeDenseWith(backend, *dense, data, shape, out, stream, *scratch);
      }
      DeviceScratch local(backend);
      return EncodeDenseWith(backend, *dense, data, shape, out, stream, local);
    }
    default:
      return absl::UnimplementedError(
          absl::StrCat("no device encoder for ", codecs::CodecName(codec.id())));
  }
}

absl::Status DecodeAccumulateWith(Backend& backend,
                                  absl::Span<const absl::Span<const uint8_t>> payloads,
                                  const codecs::DecodeOptions& options, float* out,
                                  absl::Span<const int64_t> shape, void* stream,
                                  DeviceScratch* scratch) {
  if (payloads.empty()) return absl::InvalidArgumentError("decode: no payloads");
  LBCC_ASSIGN_OR_RETURN(const int64_t n, NumElements(shape));
  std::vector<codecs::PayloadInfo> infos(payloads.size());
  for (size_t r = 0; r < payloads.size(); ++r) {
    LBCC_ASSIGN_OR_RETURN(infos[r], codecs::ParsePayload(payloads[r]),
                          _.Prepend(absl::StrCat("payload ", r)));
    if (infos[r].codec != infos[0].codec) {
      return absl::InvalidArgumentError(absl::StrCat("decode: payload ", r, " is ",
                                                     codecs::CodecName(infos[r].codec),
                                                     ", payload 0 is ",
                                                     codecs::CodecName(infos[0].codec)));
    }
    if (!std::equal(infos[r].shape.begin(), infos[r].shape.end(), shape.begin(), shape.end())) {
      return absl::InvalidArgumentError(absl::StrCat("decode: payload ", r, " has shape ",
                                                     ShapeToString(infos[r].shape),
                                                     ", the output ", ShapeToString(shape)));
    }
  }
  DeviceScratch local(backend);
  DeviceScratch& s = scratch != nullptr && scratch->backend() == &backend ? *scratch : local;
  switch (infos[0].codec) {
    case codecs::CodecId::kTopKEf:
      return DecodeTopK(backend, infos, options, out, stream, s);
    case codecs::CodecId::kDenseQuant:
      return DecodeDense(backend, infos, options, out, n, stream, s);
    default:
      return absl::UnimplementedError(absl::StrCat("decode: ", codecs::CodecName(infos[0].codec),
                                                   " payloads are not decoded by DecodeAccumulate"));
  }
}

}  // namespace internal

absl::StatusOr<size_t> EncodeOnDevice(const codecs::Codec& codec, const TensorView& input,
                                      codecs::CodecState* state, absl::Span<uint8_t> out,
                                      void* stream, DeviceScratch* scratch) {
  Backend* backend = CudaBackend();
  if (backend == nullptr) return NoCuda("EncodeOnDevice");
  if (input.memory() != MemoryKind::kCuda) {
    return absl::UnimplementedError(
        absl::StrCat("EncodeOnDevice encodes CUDA memory, got ", input.DebugString(),
                     " (use the codec's Encode)"));
  }
  if (input.dtype() != DType::kF32) {
    return absl::UnimplementedError(
        absl::StrCat("EncodeOnDevice: encodes f32 tensors, got ", DTypeName(input.dtype())));
  }
  if (auto* st = dynamic_cast<DeviceTopKEfState*>(state);
      st != nullptr && st->device() != input.device()) {
    return absl::InvalidArgumentError(absl::StrCat("EncodeOnDevice: the state is on device ",
                                                   st->device(), ", the input on device ",
                                                   input.device()));
  }
  LBCC_RETURN_IF_ERROR(backend->SetDevice(input.device()));
  return internal::EncodeWith(*backend, codec, input.data_as<const float>(), input.shape(), state,
                              out, stream, scratch);
}

absl::Status DecodeAccumulateOnDevice(absl::Span<const absl::Span<const uint8_t>> payloads,
                                      const codecs::DecodeOptions& options, const TensorView& out,
                                      void* stream, DeviceScratch* scratch) {
  Backend* backend = CudaBackend();
  if (backend == nullptr) return NoCuda("DecodeAccumulateOnDevice");
  if (out.memory() != MemoryKind::kCuda) {
    return absl::UnimplementedError(absl::StrCat(
        "DecodeAccumulateOnDevice writes CUDA memory, got ", out.DebugString(),
        " (use codecs::DecodeAccumulate)"));
  }
  if (out.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode: output must be f32, got ", DTypeName(out.dtype())));
  }
  LBCC_RETURN_IF_ERROR(backend->SetDevice(out.device()));
  return internal::DecodeAccumulateWith(*backend, payloads, options, out.data_as<float>(),
                                        out.shape(), stream, scratch);
}

}  // namespace lbcc::kernels
