#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_runtime.h"
#include "kernels/saxpy.h"

namespace lbcc::kernels {
namespace {

absl::Status CudaError(cudaError_t error, const char* what) {
  const std::string message = absl::StrCat(what, ": ", cudaGetErrorString(error));
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

}  // namespace

bool BuiltWithCuda() { return true; }

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) return CudaError(error, "cudaGetDeviceCount");
  return count;
}

absl::Status CudaSelfTest(int device, int n) {
  if (n <= 0) return absl::InvalidArgumentError("n must be positive");
  cudaError_t error = cudaSetDevice(device);
  if (error != cudaSuccess) return CudaError(error, "cudaSetDevice");
  std::vector<float> x(n), y(n), expected(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 97);
    y[i] = 1.0f;
    expected[i] = 2.0f * x[i] + 1.0f;
  }
  float* dx = nullptr;
  float* dy = nullptr;
  const size_t bytes = sizeof(float) * n;
  if ((error = cudaMalloc(&dx, bytes)) != cudaSuccess) return CudaError(error, "cudaMalloc");
  if ((error = cudaMalloc(&dy, bytes)) != cudaSuccess) {
    cudaFree(dx);
    return CudaError(error, "cudaMalloc");
  }
  cudaMemcpy(dx, x.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), bytes, cudaMemcpyHostToDevice);
  internal::LaunchSaxpy(n, 2.0f, dx, dy);
  error = cudaMemcpy(y.data(), dy, bytes, cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  if (error != cudaSuccess) return CudaError(error, "saxpy");
  for (int i = 0; i < n; ++i) {
    if (y[i] != expected[i]) {
      return absl::InternalError(absl::StrCat("saxpy mismatch at ", i, ": ", y[i], " != ",
                                              expected[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace lbcc::kernels
