// Without CUDA there is no device backend: every device entry point reports Unimplemented.
#include "kernels/backend.h"

namespace lbcc::kernels {

Backend* CudaBackend() { return nullptr; }

}  // namespace lbcc::kernels
