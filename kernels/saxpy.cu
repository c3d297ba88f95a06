#include "kernels/saxpy.h"

namespace lbcc::kernels::internal {
namespace {

__global__ void Saxpy(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

}  // namespace

void LaunchSaxpy(int n, float a, const float* x, float* y) {
  Saxpy<<<(n + 255) / 256, 256>>>(n, a, x, y);
}

}  // namespace lbcc::kernels::internal
