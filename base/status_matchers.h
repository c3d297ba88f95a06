// gMock matchers for absl::Status and absl::StatusOr<T> (tests only).
//
//   EXPECT_THAT(DoThing(), IsOk());
//   EXPECT_THAT(Parse("7"), IsOkAndHolds(7));
//   EXPECT_THAT(Decode(bad), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum")));
//
// LBCC_ASSERT_OK_AND_ASSIGN(lhs, rexpr) asserts success and assigns the value.
#ifndef LBCC_BASE_STATUS_MATCHERS_H_
#define LBCC_BASE_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::testing {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// IsOkAndHolds(m): the StatusOr<T> is ok and its value matches m.
template <typename StatusOrType>
class IsOkAndHoldsMatcherImpl : public ::testing::MatcherInterface<StatusOrType> {
 public:
  using ValueType = typename std::remove_reference_t<StatusOrType>::value_type;

  template <typename InnerMatcher>
  explicit IsOkAndHoldsMatcherImpl(InnerMatcher&& inner)
      : inner_(::testing::SafeMatcherCast<const ValueType&>(std::forward<InnerMatcher>(inner))) {}

  void DescribeTo(std::ostream* os) const override {
    *os << "is OK and has a value that ";
    inner_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const override {
    *os << "isn't OK or has a value that ";
    inner_.DescribeNegationTo(os);
  }
  bool MatchAndExplain(StatusOrType actual,
                       ::testing::MatchResultListener* listener) const override {
    if (!actual.ok()) {
      *listener << "which has status " << actual.status();
      return false;
    }
    ::testing::StringMatchResultListener inner_listener;
    const bool matches = inner_.MatchAndExplain(*actual, &inner_listener);
    const std::string explanation = inner_listener.str();
    if (!explanation.empty()) *listener << "which contains a value " << explanation;
    return matches;
  }

 private:
  const ::testing::Matcher<const ValueType&> inner_;
};

template <typename InnerMatcher>
class IsOkAndHoldsMatcher {
 public:
  explicit IsOkAndHoldsMatcher(InnerMatcher inner) : inner_(std::move(inner)) {}
  template <typename StatusOrType>
  operator ::testing::Matcher<StatusOrType>() const {  // NOLINT
    return ::testing::Matcher<StatusOrType>(
        new IsOkAndHoldsMatcherImpl<const StatusOrType&>(inner_));
  }

 private:
  const InnerMatcher inner_;
};

// StatusIs(code, message_matcher): for Status and StatusOr<T>.
class StatusIsMatcherCommonImpl {
 public:
  StatusIsMatcherCommonImpl(::testing::Matcher<absl::StatusCode> code,
                            ::testing::Matcher<const std::string&> message)
      : code_(std::move(code)), message_(std::move(message)) {}

  void DescribeTo(std::ostream* os) const {
    *os << "has a status code that ";
    code_.DescribeTo(os);
    *os << ", and has an error message that ";
    message_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "has a status code that ";
    code_.DescribeNegationTo(os);
    *os << ", or has an error message that ";
    message_.DescribeNegationTo(os);
  }
  bool MatchAndExplain(const absl::Status& status,
                       ::testing::MatchResultListener* listener) const {
    ::testing::StringMatchResultListener inner;
    if (!code_.MatchAndExplain(status.code(), &inner)) {
      *listener << "whose status is " << status;
      return false;
    }
    const std::string message(status.message());
    if (!message_.MatchAndExplain(message, &inner)) {
      *listener << "whose status is " << status;
      return false;
    }
    return true;
  }

 private:
  const ::testing::Matcher<absl::StatusCode> code_;
  const ::testing::Matcher<const std::string&> message_;
};

template <typename T>
class MonoStatusIsMatcherImpl : public ::testing::MatcherInterface<T> {
 public:
  explicit MonoStatusIsMatcherImpl(StatusIsMatcherCommonImpl common)
      : common_(std::move(common)) {}
  void DescribeTo(std::ostream* os) const override { common_.DescribeTo(os); }
  void DescribeNegationTo(std::ostream* os) const override { common_.DescribeNegationTo(os); }
  bool MatchAndExplain(T actual, ::testing::MatchResultListener* listener) const override {
    return common_.MatchAndExplain(GetStatus(actual), listener);
  }

 private:
  StatusIsMatcherCommonImpl common_;
};

class StatusIsMatcher {
 public:
  template <typename CodeMatcher, typename MessageMatcher>
  StatusIsMatcher(CodeMatcher&& code, MessageMatcher&& message)
      : common_(::testing::MatcherCast<absl::StatusCode>(std::forward<CodeMatcher>(code)),
                ::testing::MatcherCast<const std::string&>(
                    std::forward<MessageMatcher>(message))) {}
  template <typename T>
  operator ::testing::Matcher<T>() const {  // NOLINT
    return ::testing::Matcher<T>(new MonoStatusIsMatcherImpl<const T&>(common_));
  }

 private:
  const StatusIsMatcherCommonImpl common_;
};

template <typename T>
class MonoIsOkMatcherImpl : public ::testing::MatcherInterface<T> {
 public:
  void DescribeTo(std::ostream* os) const override { *os << "is OK"; }
  void DescribeNegationTo(std::ostream* os) const override { *os << "is not OK"; }
  bool MatchAndExplain(T actual, ::testing::MatchResultListener* listener) const override {
    const absl::Status& status = GetStatus(actual);
    if (!status.ok()) *listener << "whose status is " << status;
    return status.ok();
  }
};

class IsOkMatcher {
 public:
  template <typename T>
  operator ::testing::Matcher<T>() const {  // NOLINT
    return ::testing::Matcher<T>(new MonoIsOkMatcherImpl<const T&>());
  }
};

}  // namespace internal

inline internal::IsOkMatcher IsOk() { return {}; }

template <typename InnerMatcher>
internal::IsOkAndHoldsMatcher<std::decay_t<InnerMatcher>> IsOkAndHolds(InnerMatcher&& inner) {
  return internal::IsOkAndHoldsMatcher<std::decay_t<InnerMatcher>>(
      std::forward<InnerMatcher>(inner));
}

template <typename CodeMatcher, typename MessageMatcher>
internal::StatusIsMatcher StatusIs(CodeMatcher&& code, MessageMatcher&& message) {
  return internal::StatusIsMatcher(std::forward<CodeMatcher>(code),
                                   std::forward<MessageMatcher>(message));
}

template <typename CodeMatcher>
internal::StatusIsMatcher StatusIs(CodeMatcher&& code) {
  return StatusIs(std::forward<CodeMatcher>(code), ::testing::_);
}

}  // namespace lbcc::testing

#define LBCC_ASSERT_OK(expr) ASSERT_THAT((expr), ::lbcc::testing::IsOk())
#define LBCC_EXPECT_OK(expr) EXPECT_THAT((expr), ::lbcc::testing::IsOk())

#define LBCC_ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  LBCC_ASSERT_OK_AND_ASSIGN_IMPL_(LBCC_MATCHERS_CONCAT_(lbcc_statusor_, __LINE__), lhs, rexpr)
#define LBCC_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  ASSERT_THAT(statusor.status(), ::lbcc::testing::IsOk());    \
  lhs = *std::move(statusor)
#define LBCC_MATCHERS_CONCAT_INNER_(a, b) a##b
#define LBCC_MATCHERS_CONCAT_(a, b) LBCC_MATCHERS_CONCAT_INNER_(a, b)

#endif  // LBCC_BASE_STATUS_MATCHERS_H_
