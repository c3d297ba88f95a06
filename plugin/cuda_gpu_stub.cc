// Gpu without CUDA (the default build): the plugin takes host memory only.
#include "plugin/gpu.h"

namespace lbcc::plugin {

bool BuiltWithCuda() { return false; }

absl::StatusOr<std::unique_ptr<Gpu>> NewCudaGpu() {
  return absl::UnimplementedError(
      "the plugin was built without CUDA (bazel build --config=cuda //plugin:libnccl-net-lbcc.so)");
}

}  // namespace lbcc::plugin
