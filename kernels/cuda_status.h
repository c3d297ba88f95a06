// One mapping from CUDA runtime errors to Status, for every LBCC file that calls the CUDA
// runtime (kernels/, plugin/). Built only under --config=cuda; without CUDA it reports
// Unimplemented (nobody calls it then).
#ifndef LBCC_KERNELS_CUDA_STATUS_H_
#define LBCC_KERNELS_CUDA_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lbcc::kernels {

// OK for cudaSuccess; else "<what>: <error name>: <error string>" as Unavailable (no device,
// driver too old, invalid device), ResourceExhausted (out of memory) or Internal. `code` is a
// cudaError_t.
absl::Status FromCuda(int code, absl::string_view what);

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_CUDA_STATUS_H_
