// The CUDA backend (backend.h): CUDA runtime memory and streams, cuBLAS, and the launchers of
// kernels/*.cu. Built only under --config=cuda.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/cuda_status.h"

namespace lbcc::kernels {
namespace {

absl::Status FromCublas(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": cuBLAS status ", static_cast<int>(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  if (status == CUBLAS_STATUS_NOT_INITIALIZED) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

cudaStream_t S(Stream stream) { return static_cast<cudaStream_t>(stream); }

class Cuda final : public Backend {
 public:
  absl::string_view name() const override { return "cuda"; }
  bool is_device() const override { return true; }

  absl::Status SetDevice(int device) override {
    return FromCuda(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
  }
  absl::StatusOr<void*> Malloc(size_t bytes) override {
    void* p = nullptr;
    absl::Status s = FromCuda(cudaMalloc(&p, bytes > 0 ? bytes : 1), absl::StrCat("cudaMalloc ", bytes));
    if (!s.ok()) return s;
    return p;
  }
  void Free(void* p) override { cudaFree(p); }
  absl::StatusOr<void*> MallocHost(size_t bytes) override {
    void* p = nullptr;
    absl::Status s =
        FromCuda(cudaMallocHost(&p, bytes > 0 ? bytes : 1), absl::StrCat("cudaMallocHost ", bytes));
    if (!s.ok()) return s;
    return p;
  }
  void FreeHost(void* p) override { cudaFreeHost(p); }
  absl::Status Memset(void* p, int value, size_t bytes, Stream stream) override {
    if (bytes == 0) return absl::OkStatus();
    return FromCuda(cudaMemsetAsync(p, value, bytes, S(stream)), "cudaMemsetAsync");
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes, Stream stream) override {
    if (bytes == 0) return absl::OkStatus();
    return FromCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, S(stream)),
                    "cudaMemcpyAsync to host");
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes, Stream stream) override {
    if (bytes == 0) return absl::OkStatus();
    return FromCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, S(stream)),
                    "cudaMemcpyAsync to device");
  }
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes, Stream stream) override {
    if (bytes == 0) return absl::OkStatus();
    return FromCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S(stream)),
                    "cudaMemcpyAsync on device");
  }
  absl::Status Synchronize(Stream stream) override {
    return FromCuda(cudaStreamSynchronize(S(stream)), "cudaStreamSynchronize");
  }
  absl::StatusOr<void*> CreateEvent() override {
    cudaEvent_t event = nullptr;
    absl::Status s = FromCuda(cudaEventCreate(&event), "cudaEventCreate");
    if (!s.ok()) return s;
    return static_cast<void*>(event);
  }
  void DestroyEvent(void* event) override {
    if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  absl::Status RecordEvent(void* event, Stream stream) override {
    return FromCuda(cudaEventRecord(static_cast<cudaEvent_t>(event), S(stream)), "cudaEventRecord");
  }
  absl::StatusOr<double> ElapsedSeconds(void* start, void* stop) override {
    float ms = 0;
    absl::Status s = FromCuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start),
                                                   static_cast<cudaEvent_t>(stop)),
                              "cudaEventElapsedTime");
    if (!s.ok()) return s;
    return static_cast<double>(ms) / 1e3;
  }

  absl::Status Select(const SelectArgs& a, Stream s) override {
    return FromCuda(launch::Select(a, s), "topk select kernel");
  }
  size_t ScanTempBytes(int64_t n) override { return launch::ScanTempBytes(n); }
  absl::Status ExclusiveScan(const uint32_t* in, uint64_t* out, int64_t n, void* temp,
                             size_t temp_bytes, Stream s) override {
    return FromCuda(launch::ExclusiveScan(in, out, n, temp, temp_bytes, s), "exclusive scan");
  }
  absl::Status PlanIndex(const PlanArgs& a, Stream s) override {
    return FromCuda(launch::PlanIndex(a, s), "index plan kernel");
  }
  absl::Status WriteIndices(const IndexWriteArgs& a, Stream s) override {
    return FromCuda(launch::WriteIndices(a, s), "index coding kernels");
  }
  absl::Status EncodeBinMean(const BinMeanArgs& a, Stream s) override {
    return FromCuda(launch::EncodeBinMean(a, s), "bin-mean kernels");
  }
  absl::Status EncodeFloatValues(int coding, float* values, int64_t n, uint8_t* section,
                                 Stream s) override {
    return FromCuda(launch::EncodeFloatValues(coding, values, n, section, s), "value kernel");
  }
  absl::Status EncodeAbsmax(const AbsmaxArgs& a, Stream s) override {
    return FromCuda(launch::EncodeAbsmax(a, s), "absmax kernels");
  }
  absl::Status SubtractReconstruction(const SubtractArgs& a, Stream s) override {
    return FromCuda(launch::SubtractReconstruction(a, s), "error-feedback kernel");
  }
  absl::Status AggregateTopK(const AggregateArgs& a, Stream s) override {
    return FromCuda(launch::AggregateTopK(a, s), "topk aggregate kernel");
  }
  absl::Status AggregateDense(const DenseAggregateArgs& a, Stream s) override {
    return FromCuda(launch::AggregateDense(a, s), "dense aggregate kernel");
  }
  absl::Status DenseEncode(const DenseEncodeArgs& a, Stream s) override {
    return FromCuda(launch::DenseEncode(a, s), "dense encode kernel");
  }

  absl::StatusOr<void*> CreateBlas() override {
    cublasHandle_t handle = nullptr;
    absl::Status s = FromCublas(cublasCreate(&handle), "cublasCreate");
    if (!s.ok()) return s;
    // Plain fp32 products (no TF32): the CPU codec computes in fp32.
    s = FromCublas(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
    if (!s.ok()) {
      cublasDestroy(handle);
      return s;
    }
    return static_cast<void*>(handle);
  }
  void DestroyBlas(void* blas) override {
    if (blas != nullptr) cublasDestroy(static_cast<cublasHandle_t>(blas));
  }
  absl::Status Gemm(void* blas, Stream stream, bool ta, bool tb, int m, int n, int k, float alpha,
                    const float* a, int lda, const float* b, int ldb, float beta, float* c,
                    int ldc) override {
    cublasHandle_t handle = static_cast<cublasHandle_t>(blas);
    absl::Status s = FromCublas(cublasSetStream(handle, S(stream)), "cublasSetStream");
    if (!s.ok()) return s;
    return FromCublas(cublasSgemm(handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, lda, b, ldb,
                                  &beta, c, ldc),
                      "cublasSgemm");
  }
  absl::Status SubspaceForwardPrep(const SubspaceForwardArgs& a, Stream s) override {
    return FromCuda(launch::SubspaceForwardPrep(a, s), "subspace forward kernels");
  }
  absl::Status SubspaceQuantize(const SubspaceQuantizeArgs& a, Stream s) override {
    return FromCuda(launch::SubspaceQuantize(a, s), "subspace quantize kernel");
  }
  absl::Status SubspaceDequantize(const SubspaceDequantizeArgs& a, Stream s) override {
    return FromCuda(launch::SubspaceDequantize(a, s), "subspace dequantize kernel");
  }
  absl::Status SubspaceGatherTable(const SubspaceGatherArgs& a, Stream s) override {
    return FromCuda(launch::SubspaceGatherTable(a, s), "subspace gather kernel");
  }
};

}  // namespace

Backend* CudaBackend() {
  static Cuda* backend = new Cuda();
  return backend;
}

}  // namespace lbcc::kernels
