// The CUDA self-test's kernel (saxpy.cu), callable from host code that nvcc does not compile.
// Internal to kernels/:cuda_runtime.
#ifndef LBCC_KERNELS_SAXPY_H_
#define LBCC_KERNELS_SAXPY_H_

namespace lbcc::kernels::internal {

// y[i] = a * x[i] + y[i] for i < n, on the current device's default stream (x, y: device
// memory). Returns at once; the caller synchronises (a cudaMemcpy back does).
void LaunchSaxpy(int n, float a, const float* x, float* y);

}  // namespace lbcc::kernels::internal

#endif  // LBCC_KERNELS_SAXPY_H_
