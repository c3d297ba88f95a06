#include "kernels/cuda_runtime.h"

namespace lbcc::kernels {

bool BuiltWithCuda() { return false; }

absl::StatusOr<int> CudaDeviceCount() {
  return absl::UnimplementedError("LBCC was built without CUDA (use --config=cuda)");
}

absl::Status CudaSelfTest(int, int) {
  return absl::UnimplementedError("LBCC was built without CUDA (use --config=cuda)");
}

}  // namespace lbcc::kernels
