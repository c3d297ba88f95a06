// The codecs on CUDA tensors: encode device memory into the same payloads the CPU codecs write,
// and decode payloads into device memory.
//
//   TopK-EF (codecs/topk_ef.h)          EncodeOnDevice with a DeviceTopKEfState: the error
//                                       feedback lives on the GPU; the payload is byte-identical
//                                       to the CPU codec's for the same delta and state
//   dense quantizer (codecs/dense_quant.h)  EncodeOnDevice (stateless): byte-identical
//   decode-accumulate (codecs/codec.h)  DecodeAccumulateOnDevice: same aggregation rules and
//                                       order, bit-identical output
//   subspace codec                      kernels/device_subspace.h
//
// Each codec's device half is its twin (kernels/device_internal.h DeviceCodec), attached to the
// codec's registry entry (codecs/codec_registry.h); these entry points find it by codec id.
//
// Data movement: the dense tensor never leaves the GPU. An encode copies only the payload's
// sections (plus a few hundred bytes of parameters) into pinned host memory and assembles the
// envelope on the host; a decode validates the payloads on the host (like the CPU decoder: on
// any error the output is untouched), uploads the payloads' sections and decoded indices, and
// aggregates on the GPU.
//
// Streams: every call runs on `stream` (a cudaStream_t; nullptr for the legacy default stream),
// after the work the caller queued there, and returns once its work on the stream is done (the
// payload is in `out`, or the output tensor is written). The current device is set to the
// tensor's device.
//
// Builds: under --config=cuda these run on the GPU. Without CUDA every entry point returns
// Unimplemented (callers fall back to host tensors and the CPU codecs). The same code runs on
// the host through an emulated device (kernels/backend.h) in tests.
//
// Errors: as the CPU codecs (InvalidArgument, FailedPrecondition, DataLoss; for NaN/Inf input
// the state is unchanged), plus Unimplemented (built without CUDA, host memory, a codec without
// a device implementation), Unavailable (no driver or device), ResourceExhausted (device memory).
//
// Thread-safety: a DeviceTopKEfState, like the CPU state, belongs to one thread at a time; a
// DeviceScratch too. Functions are otherwise thread-safe.
#ifndef LBCC_KERNELS_DEVICE_CODEC_H_
#define LBCC_KERNELS_DEVICE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/tensor_view.h"
#include "codecs/chunking.h"
#include "codecs/codec.h"

namespace lbcc::kernels {

class Backend;

// True when this build carries CUDA code and a device is visible.
bool DeviceCodecsAvailable();

// Pinned host memory and device memory that encodes and decodes reuse (they grow to the largest
// call). Optional everywhere: without one a call allocates its own.
class DeviceScratch {
 public:
  DeviceScratch();  // the CUDA backend (Unimplemented at first use without CUDA)
  explicit DeviceScratch(Backend& backend);
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  Backend* backend() const { return backend_; }
  // Buffers of at least `bytes`; contents are not kept across growth.
  absl::StatusOr<uint8_t*> Device(size_t bytes);
  absl::StatusOr<uint8_t*> Host(size_t bytes);

 private:
  Backend* backend_;
  uint8_t* device_ = nullptr;
  size_t device_bytes_ = 0;
  uint8_t* host_ = nullptr;
  size_t host_bytes_ = 0;
};

// Device memory owned by the caller's code (tests, tools, callers without an allocator of their
// own), with synchronous copies. Unimplemented without CUDA.
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, int device);
  // On any backend (tests use the emulated one).
  static absl::StatusOr<DeviceBuffer> Allocate(Backend& backend, size_t bytes, int device);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  // A CUDA view of the buffer (f32 of `shape`); InvalidArgument when it does not fit.
  absl::StatusOr<TensorView> View(Shape shape) const;
  absl::Status CopyFromHost(absl::Span<const uint8_t> bytes);
  absl::Status CopyToHost(absl::Span<uint8_t> bytes) const;

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
  int device_ = 0;
};

// The error-feedback state of one tensor, in device memory (codecs::TopKEfState's twin: same
// Reset/Load/Commit/Abort semantics). Encode with EncodeOnDevice only: it answers is_device(), so
// the CPU codecs refuse it.
class DeviceTopKEfState final : public codecs::CodecState {
 public:
  // Counts of the sequential fallbacks of the bin-mean statistics (kernels/binmean_stats.h).
  struct Stats {
    int64_t encodes = 0;
    int64_t shift_fallbacks = 0;
    int64_t norm_fallbacks = 0;
    int64_t bin_fallbacks = 0;
    // With set_timing(true): seconds the last encode's device work took (events around the
    // kernels, from the EF update to the error-feedback correction; copies not included).
    double last_device_seconds = 0;
  };

  // A state on `device` (the CUDA backend).
  static absl::StatusOr<std::unique_ptr<DeviceTopKEfState>> Create(int device);
  // On any backend (tests use the emulated one).
  static absl::StatusOr<std::unique_ptr<DeviceTopKEfState>> Create(Backend& backend, int device);
  ~DeviceTopKEfState() override;

  int device() const override { return device_; }
  bool is_device() const override { return true; }
  Backend& backend() const { return *backend_; }
  bool initialized() const { return initialized_; }
  const Shape& shape() const { return shape_; }
  const Stats& stats() const { return stats_; }
  // Times every encode's device work with events (Stats::last_device_seconds); off by default.
  void set_timing(bool on) { timing_ = on; }

  // Fixes the shape and zeroes e (drops a pending update). InvalidArgument for a bad shape.
  absl::Status Reset(absl::Span<const int64_t> shape);
  // Reset(shape), then e = `error` (host memory, e.g. a checkpoint). InvalidArgument on a size
  // mismatch or a non-finite entry.
  absl::Status Load(absl::Span<const int64_t> shape, absl::Span<const float> error);
  // Copies the committed e (or the pending e_new) into host memory of num_elements floats.
  absl::Status CopyErrorToHost(absl::Span<float> out) const;
  absl::Status CopyPendingErrorToHost(absl::Span<float> out) const;
  // The committed e in device memory; valid until the next Reset/Load/Commit.
  const float* error_device() const { return error_; }

  codecs::CodecId codec() const override { return codecs::CodecId::kTopKEf; }
  bool has_pending() const override { return pending_; }
  absl::Status Commit() override;
  absl::Status Abort() override;

 private:
  friend struct TopKEncoder;
  DeviceTopKEfState(Backend& backend, int device);
  void Release();
  absl::Status Allocate(const codecs::ChunkGeometry& g, int64_t count);

  Backend* backend_;
  int device_;
  bool initialized_ = false;
  bool pending_ = false;
  Shape shape_;
  codecs::ChunkGeometry geometry_;
  Stats stats_;
  bool timing_ = false;
  void* events_[2] = {nullptr, nullptr};
  // Device memory: one allocation carved into the buffers below.
  uint8_t* arena_ = nullptr;
  float* error_ = nullptr;  // committed e
  float* next_ = nullptr;   // pending e_new
  // Per-encode buffers (sized for the shape and the codec options of the first encode).
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
  uint8_t* host_ = nullptr;  // pinned staging
  size_t host_bytes_ = 0;
};

// A state for `codec` on `device`: a DeviceTopKEfState for TopK-EF, nullptr for stateless
// codecs. Unimplemented without CUDA or for codecs without a device implementation.
absl::StatusOr<std::unique_ptr<codecs::CodecState>> NewDeviceState(const codecs::Codec& codec,
                                                                   int device);

// Encodes `input` (f32, CUDA memory) into `out` (host memory of codec.MaxEncodedBytes() bytes);
// returns the payload's size. `state`: a DeviceTopKEfState on the tensor's device for TopK-EF,
// nullptr for the dense quantizer. The payload equals codec.Encode()'s for a host copy of the
// input and state. `input` and `out` are only used during the call.
absl::StatusOr<size_t> EncodeOnDevice(const codecs::Codec& codec, const TensorView& input,
                                      codecs::CodecState* state, absl::Span<uint8_t> out,
                                      void* stream, DeviceScratch* scratch = nullptr);

// Decodes `payloads` (host memory, rank order) into `out` (f32, CUDA memory) like
// codecs::DecodeAccumulate: TopK-EF and dense-quantizer payloads, bit-identical results.
absl::Status DecodeAccumulateOnDevice(absl::Span<const absl::Span<const uint8_t>> payloads,
                                      const codecs::DecodeOptions& options, const TensorView& out,
                                      void* stream, DeviceScratch* scratch = nullptr);

namespace internal {
// The entry points above without the memory-kind checks, on `backend` (the emulated backend
// takes host pointers). `data` points to the tensor's elements on the backend.
absl::StatusOr<size_t> EncodeWith(Backend& backend, const codecs::Codec& codec, const float* data,
                                  absl::Span<const int64_t> shape, codecs::CodecState* state,
                                  absl::Span<uint8_t> out, void* stream, DeviceScratch* scratch);
absl::Status DecodeAccumulateWith(Backend& backend,
                                  absl::Span<const absl::Span<const uint8_t>> payloads,
                                  const codecs::DecodeOptions& options, float* out,
                                  absl::Span<const int64_t> shape, void* stream,
                                  DeviceScratch* scratch);
}  // namespace internal

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_DEVICE_CODEC_H_
