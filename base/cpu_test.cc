#include "base/cpu.h"

#include <cstdlib>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc {
namespace {

using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::StatusIs;

TEST(CpuTest, ScalarIsAlwaysAvailable) {
  setenv("LBCC_SIMD", "scalar", 1);
  EXPECT_THAT(ResolveSimdLevel(), IsOkAndHolds(SimdLevel::kScalar));
  unsetenv("LBCC_SIMD");
}

TEST(CpuTest, AutoPicksWhatTheCpuHas) {
  unsetenv("LBCC_SIMD");
  EXPECT_THAT(ResolveSimdLevel(),
              IsOkAndHolds(CpuHasAvx2Fma() ? SimdLevel::kAvx2 : SimdLevel::kScalar));
}

TEST(CpuTest, ExplicitAvx2DependsOnCpu) {
  setenv("LBCC_SIMD", "AVX2", 1);
  if (CpuHasAvx2Fma()) {
    EXPECT_THAT(ResolveSimdLevel(), IsOkAndHolds(SimdLevel::kAvx2));
  } else {
    EXPECT_THAT(ResolveSimdLevel(), StatusIs(absl::StatusCode::kInvalidArgument));
  }
  unsetenv("LBCC_SIMD");
}

TEST(CpuTest, BadValueIsAnError) {
  setenv("LBCC_SIMD", "avx512", 1);
  EXPECT_THAT(ResolveSimdLevel(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("avx512")));
  unsetenv("LBCC_SIMD");
}

TEST(CpuTest, TestingOverride) {
  SetSimdLevelForTesting(SimdLevel::kScalar);
  EXPECT_EQ(ActiveSimdLevel(), SimdLevel::kScalar);
  EXPECT_EQ(SimdLevelName(SimdLevel::kAvx2), "avx2");
}

}  // namespace
}  // namespace lbcc
