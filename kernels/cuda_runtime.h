// The CUDA runtime as kernels/ sees it: how many devices there are, and a self-test that runs
// a kernel and checks its result. Built by nvcc under --config=cuda (cuda_runtime.cu); without
// CUDA (cuda_runtime_stub.cc) every call returns Unimplemented, so callers fall back to the
// CPU codecs.
//
// Errors: Unimplemented (built without CUDA), Unavailable (no driver or no device), Internal
// (a kernel produced a wrong result).
// Thread-safety: thread-safe.
#ifndef LBCC_KERNELS_CUDA_RUNTIME_H_
#define LBCC_KERNELS_CUDA_RUNTIME_H_

#include "absl/status/statusor.h"

namespace lbcc::kernels {

// True when this build carries CUDA code.
bool BuiltWithCuda();

// Number of visible CUDA devices.
absl::StatusOr<int> CudaDeviceCount();

// Runs y = a * x + y over `n` elements on `device` and compares with the host result.
absl::Status CudaSelfTest(int device, int n);

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_CUDA_RUNTIME_H_
