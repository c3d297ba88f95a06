// Public entry points of the device codecs, DeviceScratch and DeviceBuffer. The entry points
// check memory kinds, dtypes and envelopes, then dispatch by codec id to the device twin
// registered for it (device_internal.h DeviceCodec; topk_device.cc, dense_device.cc).
#include "kernels/device_codec.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/payload.h"
#include "kernels/backend.h"
#include "kernels/cuda_runtime.h"
#include "kernels/device_internal.h"

namespace lbcc::kernels {

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
  const DeviceCodec* twin = FindDeviceCodec(codec.id());
  if (twin == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("no device implementation of ", codecs::CodecName(codec.id())));
  }
  return twin->NewState(device);
}

namespace internal {

absl::StatusOr<size_t> EncodeWith(Backend& backend, const codecs::Codec& codec, const float* data,
                                  absl::Span<const int64_t> shape, codecs::CodecState* state,
                                  absl::Span<uint8_t> out, void* stream, DeviceScratch* scratch) {
  const DeviceCodec* twin = FindDeviceCodec(codec.id());
  if (twin == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("no device encoder for ", codecs::CodecName(codec.id())));
  }
  DeviceScratch local(backend);
  DeviceScratch& s = scratch != nullptr && scratch->backend() == &backend ? *scratch : local;
  return twin->Encode(backend, codec, data, shape, state, out, stream, s);
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
  const DeviceCodec* twin = FindDeviceCodec(infos[0].codec);
  if (twin == nullptr) {
    return absl::UnimplementedError(absl::StrCat("decode: ", codecs::CodecName(infos[0].codec),
                                                 " payloads are not decoded by DecodeAccumulate"));
  }
  DeviceScratch local(backend);
  DeviceScratch& s = scratch != nullptr && scratch->backend() == &backend ? *scratch : local;
  return twin->DecodeAccumulate(backend, infos, options, out, n, stream, s);
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
  if (state != nullptr && state->is_device() && state->device() != input.device()) {
    return absl::InvalidArgumentError(absl::StrCat("EncodeOnDevice: the state is on device ",
                                                   state->device(), ", the input on device ",
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
