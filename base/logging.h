// Logging with levels chosen by LBCC_DEBUG, in the manner of NCCL_DEBUG.
//
//   LBCC_DEBUG=NONE|VERSION|WARN|INFO|TRACE   (default WARN; case-insensitive)
//   LBCC_DEBUG_FILE=/tmp/lbcc.%h.%p.log       (%h host, %p pid; default stderr)
//
//   LBCC_LOG(INFO) << "connected to " << peer;
//   LBCC_LOG_IF(WARN, queue_depth > 1000) << "slow link backlog " << queue_depth;
//
// A disabled level costs one relaxed atomic load; its message is not formatted. Lines look like
// `host:pid:tid [lbcc] INFO file.cc:42 message`. SetLogSink() redirects lines (the NCCL net
// plugin hands them to NCCL's logger). The level is read from the environment once, on first
// use; SetLogLevel() overrides it.
//
// Thread-safety: every function here is thread-safe; a line is written atomically.
#ifndef LBCC_BASE_LOGGING_H_
#define LBCC_BASE_LOGGING_H_

#include <functional>
#include <sstream>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace lbcc {

enum class LogLevel : int {
  kNone = 0,
  kVersion = 1,
  kWarn = 2,
  kInfo = 3,
  kTrace = 4,
  kFatal = -1,  // Always emitted; the process aborts after the line (CHECK failures only).
};

// Parses NONE, VERSION, WARN, INFO or TRACE (any case).
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);
absl::string_view LogLevelName(LogLevel level);

// The current threshold: messages at or below it are emitted.
LogLevel GetLogLevel();
void SetLogLevel(LogLevel level);
// Re-reads LBCC_DEBUG now. InvalidArgument (and the level unchanged) for a bad value.
absl::Status ReloadLogLevelFromEnv();
inline bool LogEnabled(LogLevel level) {
  return level == LogLevel::kFatal || static_cast<int>(level) <= static_cast<int>(GetLogLevel());
}

// Receives each formatted line (without trailing newline) instead of the default destination.
// Pass nullptr to restore the default. The sink must be thread-safe.
using LogSink = std::function<void(LogLevel level, absl::string_view file, int line,
                                   absl::string_view message)>;
void SetLogSink(LogSink sink);

namespace internal {

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogLevel level);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  LogLevel level_;
  std::ostringstream stream_;
};

// Makes `LBCC_LOG(x) << ...` a void expression usable in ?: (the glog trick).
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace lbcc

#define LBCC_LOG_LEVEL_NONE ::lbcc::LogLevel::kNone
#define LBCC_LOG_LEVEL_VERSION ::lbcc::LogLevel::kVersion
#define LBCC_LOG_LEVEL_WARN ::lbcc::LogLevel::kWarn
#define LBCC_LOG_LEVEL_INFO ::lbcc::LogLevel::kInfo
#define LBCC_LOG_LEVEL_TRACE ::lbcc::LogLevel::kTrace
#define LBCC_LOG_LEVEL_FATAL ::lbcc::LogLevel::kFatal

#define LBCC_LOG_IF(level, condition)                                                    \
  !(::lbcc::LogEnabled(LBCC_LOG_LEVEL_##level) && (condition))                           \
      ? (void)0                                                                          \
      : ::lbcc::internal::LogVoidify() &                                                 \
            ::lbcc::internal::LogMessage(__FILE__, __LINE__, LBCC_LOG_LEVEL_##level).stream()

#define LBCC_LOG(level) LBCC_LOG_IF(level, true)

#endif  // LBCC_BASE_LOGGING_H_
