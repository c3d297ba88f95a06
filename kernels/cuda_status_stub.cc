// Without CUDA there are no CUDA errors to map.
#include "absl/strings/str_cat.h"
#include "kernels/cuda_status.h"

namespace lbcc::kernels {

absl::Status FromCuda(int code, absl::string_view what) {
  if (code == 0) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(what, ": built without CUDA"));
}

}  // namespace lbcc::kernels
