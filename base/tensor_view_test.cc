#include "base/tensor_view.h"

#include <cstdint>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc {
namespace {

using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

TEST(TensorViewTest, CreateHostView) {
  std::vector<float> data(12);
  LBCC_ASSERT_OK_AND_ASSIGN(TensorView view, TensorView::Host(data.data(), {3, 4}));
  EXPECT_EQ(view.num_elements(), 12);
  EXPECT_EQ(view.num_bytes(), 48u);
  EXPECT_EQ(view.rank(), 2);
  EXPECT_EQ(view.dim(1), 4);
  EXPECT_TRUE(view.is_host());
  EXPECT_EQ(view.data_as<float>(), data.data());
  EXPECT_EQ(view.DebugString(), "f32[3, 4]@host");
}

TEST(TensorViewTest, ScalarAndEmpty) {
  float x = 1;
  LBCC_ASSERT_OK_AND_ASSIGN(TensorView scalar, TensorView::Host(&x, {}));
  EXPECT_EQ(scalar.num_elements(), 1);
  LBCC_ASSERT_OK_AND_ASSIGN(TensorView empty, TensorView::Create(nullptr, DType::kBF16, {0, 5}));
  EXPECT_EQ(empty.num_bytes(), 0u);
}

TEST(TensorViewTest, CudaView) {
  alignas(8) static int64_t fake[4];
  LBCC_ASSERT_OK_AND_ASSIGN(
      TensorView view, TensorView::Create(fake, DType::kI64, {4}, MemoryKind::kCuda, 2));
  EXPECT_EQ(view.DebugString(), "i64[4]@cuda:2");
  EXPECT_THAT(TensorView::Create(fake, DType::kI64, {4}, MemoryKind::kCuda, -1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device")));
}

TEST(TensorViewTest, RejectsBadArguments) {
  std::vector<float> data(4);
  EXPECT_THAT(TensorView::Host(data.data(), {2, -2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(TensorView::Host(nullptr, {2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
  EXPECT_THAT(TensorView::Host(data.data(), {1, 1, 1, 1, 1, 1, 1, 1, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
  EXPECT_THAT(TensorView::Host(data.data(), {int64_t{1} << 40, int64_t{1} << 40}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too many")));
  EXPECT_THAT(TensorView::Create(reinterpret_cast<char*>(data.data()) + 1, DType::kF32, {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("aligned")));
  EXPECT_THAT(TensorView::Create(data.data(), static_cast<DType>(0), {1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
}

TEST(TensorViewTest, NumElements) {
  EXPECT_THAT(NumElements({}), IsOkAndHolds(1));
  EXPECT_THAT(NumElements({7, 0, 3}), IsOkAndHolds(0));
  EXPECT_THAT(NumElements({4096, 4096}), IsOkAndHolds(4096 * 4096));
  EXPECT_EQ(ShapeToString({2, 3}), "[2, 3]");
}

}  // namespace
}  // namespace lbcc
