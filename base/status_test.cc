#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

absl::Status FailIf(bool fail, int* calls) {
  ++*calls;
  return fail ? absl::DataLossError("bad bytes") : absl::OkStatus();
}

absl::Status Propagate(bool fail, int* calls) {
  LBCC_RETURN_IF_ERROR(FailIf(fail, calls));
  return absl::InternalError("reached the end");
}

absl::StatusOr<int> Half(int value) {
  if (value % 2 != 0) return absl::InvalidArgumentError("odd");
  return value / 2;
}

absl::StatusOr<int> Quarter(int value) {
  LBCC_ASSIGN_OR_RETURN(int half, Half(value));
  LBCC_ASSIGN_OR_RETURN(int quarter, Half(half), _.Prepend("second halving"));
  return quarter;
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheErrorAndEvaluatesOnce) {
  int calls = 0;
  EXPECT_THAT(Propagate(true, &calls), StatusIs(absl::StatusCode::kDataLoss, "bad bytes"));
  EXPECT_EQ(calls, 1);
  EXPECT_THAT(Propagate(false, &calls), StatusIs(absl::StatusCode::kInternal));
  EXPECT_EQ(calls, 2);
}

TEST(StatusMacrosTest, ReturnIfErrorAcceptsStatusOr) {
  auto f = [](int v) -> absl::Status {
    LBCC_RETURN_IF_ERROR(Half(v));
    return absl::OkStatus();
  };
  EXPECT_THAT(f(4), IsOk());
  EXPECT_THAT(f(3), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(StatusMacrosTest, AssignOrReturnAssignsOrAnnotates) {
  EXPECT_THAT(Quarter(8), IsOkAndHolds(2));
  EXPECT_THAT(Quarter(3), StatusIs(absl::StatusCode::kInvalidArgument, "odd"));
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, "second halving: odd"));
}

TEST(StatusMacrosTest, AnnotateKeepsCodeAndOk) {
  EXPECT_THAT(Annotate(absl::OkStatus(), "ctx"), IsOk());
  absl::Status s = Annotate(absl::UnavailableError("peer gone"), "rank 3");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, "rank 3: peer gone"));
}

TEST(StatusMatchersTest, MatchersReject) {
  EXPECT_THAT(absl::InternalError("x"), Not(IsOk()));
  EXPECT_THAT(absl::StatusOr<int>(3), Not(IsOkAndHolds(4)));
  EXPECT_THAT(absl::StatusOr<int>(absl::CancelledError("c")), Not(IsOkAndHolds(4)));
  EXPECT_THAT(absl::CancelledError("closed"),
              Not(StatusIs(absl::StatusCode::kCancelled, HasSubstr("open"))));
  EXPECT_THAT(absl::CancelledError("closed"), Not(StatusIs(absl::StatusCode::kAborted)));
  EXPECT_THAT(absl::StatusOr<int>(absl::CancelledError("closed")),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("close")));
}

TEST(StatusMatchersTest, AssertOkAndAssign) {
  LBCC_ASSERT_OK_AND_ASSIGN(int v, Half(10));
  EXPECT_EQ(v, 5);
}

}  // namespace
}  // namespace lbcc
