#include "kernels/cuda_status.h"

#include <cuda_runtime.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace lbcc::kernels {

absl::Status FromCuda(int code, absl::string_view what) {
  const cudaError_t error = static_cast<cudaError_t>(code);
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", cudaGetErrorName(error), ": ",
                                           cudaGetErrorString(error));
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::UnavailableError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace lbcc::kernels
