#include "kernels/cuda_runtime.h"

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::kernels {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;

TEST(CudaRuntimeTest, WithoutCudaEverythingIsUnimplemented) {
  if (BuiltWithCuda()) GTEST_SKIP() << "built with CUDA";
  EXPECT_THAT(CudaDeviceCount(), StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_THAT(CudaSelfTest(0, 1024), StatusIs(absl::StatusCode::kUnimplemented));
}

TEST(CudaRuntimeTest, SelfTestOnEveryDevice) {
  if (!BuiltWithCuda()) GTEST_SKIP() << "built without CUDA (--config=cuda)";
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok() || *count == 0) GTEST_SKIP() << "no CUDA device: " << count.status();
  for (int device = 0; device < *count; ++device) {
    EXPECT_THAT(CudaSelfTest(device, 1 << 20), IsOk()) << "device " << device;
  }
  EXPECT_THAT(CudaSelfTest(0, 0), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lbcc::kernels
