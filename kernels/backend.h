// Internal: what the device codecs need from a device, as one interface with two
// implementations.
//
//   CudaBackend()      kernels/cuda_backend.cc + the .cu files: CUDA memory, streams and kernel
//                      launches (built under --config=cuda; nullptr otherwise)
//   EmulatedBackend()  kernels/emulated_backend.cc: "device" memory is host memory and every
//                      kernel runs its thread blocks one simulated thread at a time, through the
//                      same block-level code (kernels/block.h). Tests run the whole device
//                      pipeline with it on machines without a GPU.
//
// The orchestration (kernels/topk_device.cc, dense_device.cc, subspace_device.cc) is written
// once against this interface: launches are asynchronous on `stream` (a cudaStream_t, nullptr
// for the legacy default stream), copies to pinned host memory too, and Synchronize() waits for
// the stream.
//
// Errors: Unavailable (no driver or device), ResourceExhausted (allocation failed), Internal (a
// CUDA call failed otherwise).
// Thread-safety: thread-safe; a stream is used by one thread at a time.
#ifndef LBCC_KERNELS_BACKEND_H_
#define LBCC_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/launch.h"

namespace lbcc::kernels {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual absl::string_view name() const = 0;
  // True for real device memory (TensorViews must then be kCuda).
  virtual bool is_device() const = 0;

  virtual absl::Status SetDevice(int device) = 0;
  virtual absl::StatusOr<void*> Malloc(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual absl::StatusOr<void*> MallocHost(size_t bytes) = 0;  // pinned
  virtual void FreeHost(void* p) = 0;
  virtual absl::Status Memset(void* p, int value, size_t bytes, Stream stream) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual absl::Status Synchronize(Stream stream) = 0;
  // Timing events (cudaEvent_t; host clock readings on the emulated backend). ElapsedSeconds
  // needs both events recorded and reached (after a Synchronize).
  virtual absl::StatusOr<void*> CreateEvent() = 0;
  virtual void DestroyEvent(void* event) = 0;
  virtual absl::Status RecordEvent(void* event, Stream stream) = 0;
  virtual absl::StatusOr<double> ElapsedSeconds(void* start, void* stop) = 0;

  // TopK-EF encode (kernels/topk_select.h, topk_encode.h, binmean_stats.h).
  virtual absl::Status Select(const SelectArgs& args, Stream stream) = 0;
  virtual size_t ScanTempBytes(int64_t n) = 0;
  virtual absl::Status ExclusiveScan(const uint32_t* in, uint64_t* out, int64_t n, void* temp,
                                     size_t temp_bytes, Stream stream) = 0;
  virtual absl::Status PlanIndex(const PlanArgs& args, Stream stream) = 0;
  virtual absl::Status WriteIndices(const IndexWriteArgs& args, Stream stream) = 0;
  virtual absl::Status EncodeBinMean(const BinMeanArgs& args, Stream stream) = 0;
  virtual absl::Status EncodeFloatValues(int coding, float* values, int64_t n, uint8_t* section,
                                         Stream stream) = 0;
  virtual absl::Status EncodeAbsmax(const AbsmaxArgs& args, Stream stream) = 0;
  virtual absl::Status SubtractReconstruction(const SubtractArgs& args, Stream stream) = 0;

  // Decode-accumulate (kernels/aggregate.h).
  virtual absl::Status AggregateTopK(const AggregateArgs& args, Stream stream) = 0;
  virtual absl::Status AggregateDense(const DenseAggregateArgs& args, Stream stream) = 0;

  // Dense quantizer encode (kernels/dense_encode.h).
  virtual absl::Status DenseEncode(const DenseEncodeArgs& args, Stream stream) = 0;

  // Subspace codec (kernels/subspace_kernels.h). Gemm is cuBLAS's column-major sgemm
  // (C = alpha op(A) op(B) + beta C) on a handle from CreateBlas.
  virtual absl::StatusOr<void*> CreateBlas() = 0;
  virtual void DestroyBlas(void* blas) = 0;
  virtual absl::Status Gemm(void* blas, Stream stream, bool transpose_a, bool transpose_b, int m,
                            int n, int k, float alpha, const float* a, int lda, const float* b,
                            int ldb, float beta, float* c, int ldc) = 0;
  virtual absl::Status SubspaceForwardPrep(const SubspaceForwardArgs& args, Stream stream) = 0;
  virtual absl::Status SubspaceQuantize(const SubspaceQuantizeArgs& args, Stream stream) = 0;
  virtual absl::Status SubspaceDequantize(const SubspaceDequantizeArgs& args, Stream stream) = 0;
  virtual absl::Status SubspaceGatherTable(const SubspaceGatherArgs& args, Stream stream) = 0;
};

// nullptr when LBCC was built without CUDA (then every device entry point is Unimplemented).
Backend* CudaBackend();
// Always available; see the header comment.
Backend& EmulatedBackend();

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_BACKEND_H_
