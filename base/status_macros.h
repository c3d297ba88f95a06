// Status propagation macros and helpers for absl::Status / absl::StatusOr.
//
// Abseil 20220623 (Debian) ships Status and StatusOr but not the macros Google code uses to
// propagate them; these are LBCC's. They evaluate their argument exactly once.
//
//   LBCC_RETURN_IF_ERROR(DoThing());                       // returns the Status if not ok
//   LBCC_ASSIGN_OR_RETURN(auto payload, Encode(view));     // declares and assigns, or returns
//   LBCC_ASSIGN_OR_RETURN(size, ReadSize(), _.Prepend("header: "));  // annotate on failure
//
// Thread-safety: stateless.
#ifndef LBCC_BASE_STATUS_MACROS_H_
#define LBCC_BASE_STATUS_MACROS_H_

#include <string>
#include "absl/strings/string_view.h"
#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace lbcc {

// Returns `status` with `context + ": "` prepended to its message; ok stays ok. The code and
// payloads are kept, so callers still branch on the code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

namespace internal {

// Lets LBCC_ASSIGN_OR_RETURN's third argument write `_.Prepend("...")`.
class StatusAnnotator {
 public:
  explicit StatusAnnotator(absl::Status status) : status_(std::move(status)) {}
  absl::Status Prepend(absl::string_view context) const { return Annotate(status_, context); }
  operator absl::Status() const { return status_; }  // NOLINT: implicit on purpose.

 private:
  absl::Status status_;
};

inline const absl::Status& ToStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace internal
}  // namespace lbcc

#define LBCC_STATUS_CONCAT_INNER_(a, b) a##b
#define LBCC_STATUS_CONCAT_(a, b) LBCC_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status or absl::StatusOr<T>) and returns its Status from the
// enclosing function when it is not ok.
#define LBCC_RETURN_IF_ERROR(expr)                                                       \
  do {                                                                                   \
    const auto& lbcc_status_or_value_ = (expr);                                          \
    const ::absl::Status& lbcc_status_ = ::lbcc::internal::ToStatus(lbcc_status_or_value_); \
    if (ABSL_PREDICT_FALSE(!lbcc_status_.ok())) return lbcc_status_;                     \
  } while (0)

#define LBCC_ASSIGN_OR_RETURN_2_(lhs, rexpr) LBCC_ASSIGN_OR_RETURN_3_(lhs, rexpr, _)
#define LBCC_ASSIGN_OR_RETURN_3_(lhs, rexpr, on_error)                                   \
  LBCC_ASSIGN_OR_RETURN_IMPL_(LBCC_STATUS_CONCAT_(lbcc_statusor_, __LINE__), lhs, rexpr, \
                              on_error)
#define LBCC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr, on_error)          \
  auto statusor = (rexpr);                                                   \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) {                                  \
    ::lbcc::internal::StatusAnnotator _(std::move(statusor).status());       \
    (void)_;                                                                 \
    return ::absl::Status(on_error);                                         \
  }                                                                          \
  lhs = *std::move(statusor)

#define LBCC_GET_MACRO_4_(_1, _2, _3, NAME, ...) NAME

// LBCC_ASSIGN_OR_RETURN(lhs, rexpr[, on_error]): evaluates `rexpr` (an absl::StatusOr<T>);
// on success moves the value into `lhs` (which may declare a variable), otherwise returns
// from the enclosing function with the Status, or with `on_error`, an expression in which `_`
// names the failed Status (use `_.Prepend("context")`).
#define LBCC_ASSIGN_OR_RETURN(...)                                                   \
  LBCC_GET_MACRO_4_(__VA_ARGS__, LBCC_ASSIGN_OR_RETURN_3_, LBCC_ASSIGN_OR_RETURN_2_, \
                    unused)(__VA_ARGS__)

#endif  // LBCC_BASE_STATUS_MACROS_H_
