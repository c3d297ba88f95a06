// Invariant checks for LBCC's own bugs. Never use these for caller input, peer data or
// configuration: those get an absl::Status (see base/status_macros.h).
//
//   LBCC_CHECK(offset <= size) << "offset " << offset;   // always on; logs FATAL and aborts
//   LBCC_DCHECK(IsAligned(p));                            // debug builds only (no NDEBUG)
//
// Thread-safety: like base/logging.h.
#ifndef LBCC_BASE_CHECK_H_
#define LBCC_BASE_CHECK_H_

#include "absl/base/optimization.h"
#include "base/logging.h"

#define LBCC_CHECK(condition)                                                           \
  ABSL_PREDICT_TRUE(condition)                                                          \
  ? (void)0                                                                             \
  : ::lbcc::internal::LogVoidify() &                                                    \
        ::lbcc::internal::LogMessage(__FILE__, __LINE__, ::lbcc::LogLevel::kFatal).stream() \
            << "Check failed: " #condition " "

#define LBCC_CHECK_OP_(a, op, b) LBCC_CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define LBCC_CHECK_EQ(a, b) LBCC_CHECK_OP_(a, ==, b)
#define LBCC_CHECK_NE(a, b) LBCC_CHECK_OP_(a, !=, b)
#define LBCC_CHECK_LT(a, b) LBCC_CHECK_OP_(a, <, b)
#define LBCC_CHECK_LE(a, b) LBCC_CHECK_OP_(a, <=, b)
#define LBCC_CHECK_GT(a, b) LBCC_CHECK_OP_(a, >, b)
#define LBCC_CHECK_GE(a, b) LBCC_CHECK_OP_(a, >=, b)

#ifdef NDEBUG
#define LBCC_DCHECK(condition) \
  while (false) LBCC_CHECK(condition)
#else
#define LBCC_DCHECK(condition) LBCC_CHECK(condition)
#endif

#endif  // LBCC_BASE_CHECK_H_
