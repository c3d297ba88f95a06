// plugin_gpu_test without --config=cuda: nothing to run (the plugin takes host memory only).
#include "gtest/gtest.h"

TEST(PluginGpuTest, NeedsACudaBuild) {
  GTEST_SKIP() << "built without CUDA: bazel test --config=cuda //plugin:plugin_gpu_test "
                  "(or plugin/gpu_check.sh) on a machine with a GPU";
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
