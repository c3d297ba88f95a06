#include "base/logging.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/mutex.h"
#include "base/env.h"

namespace lbcc {
namespace {

constexpr int kUnset = -100;
std::atomic<int> g_level{kUnset};

struct Destination {
  lbcc::Mutex mu;
  LogSink sink ABSL_GUARDED_BY(mu);
  FILE* file ABSL_GUARDED_BY(mu) = nullptr;
  bool file_opened ABSL_GUARDED_BY(mu) = false;
};

Destination& GetDestination() {
  static Destination* destination = new Destination();  // Never destroyed: used at exit.
  return *destination;
}

absl::StatusOr<LogLevel> LevelFromEnv() {
  absl::StatusOr<std::string> value = env::GetString("LBCC_DEBUG");
  if (!value.ok()) return value.status();
  return ParseLogLevel(*value);
}

int InitLevelFromEnv() {
  LogLevel level = LogLevel::kWarn;
  absl::StatusOr<LogLevel> parsed = LevelFromEnv();
  if (parsed.ok()) {
    level = *parsed;
  } else {
    // Bad value: say so once, on stderr, and keep the default.
    std::fprintf(stderr, "[lbcc] WARN %s\n", std::string(parsed.status().message()).c_str());
  }
  int expected = kUnset;
  g_level.compare_exchange_strong(expected, static_cast<int>(level));
  return g_level.load(std::memory_order_relaxed);
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

FILE* OpenLogFile() {
  absl::StatusOr<std::string> path = env::GetString("LBCC_DEBUG_FILE");
  if (!path.ok() || path->empty()) return stderr;
  char host[256] = "unknown";
  gethostname(host, sizeof(host) - 1);
  std::string expanded = absl::StrReplaceAll(
      *path, {{"%h", host}, {"%p", absl::StrCat(getpid())}, {"%%", "%"}});
  FILE* file = std::fopen(expanded.c_str(), "a");
  if (file == nullptr) {
    std::fprintf(stderr, "[lbcc] WARN cannot open LBCC_DEBUG_FILE %s: %s; logging to stderr\n",
                 expanded.c_str(), std::strerror(errno));
    return stderr;
  }
  return file;
}

}  // namespace

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text) {
  const std::string upper = absl::AsciiStrToUpper(text);
  if (upper == "NONE") return LogLevel::kNone;
  if (upper == "VERSION") return LogLevel::kVersion;
  if (upper == "WARN") return LogLevel::kWarn;
  if (upper == "INFO") return LogLevel::kInfo;
  if (upper == "TRACE") return LogLevel::kTrace;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level '", text, "' (expected NONE, VERSION, WARN, INFO or TRACE)"));
}

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kNone:
      return "NONE";
    case LogLevel::kVersion:
      return "VERSION";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kTrace:
      return "TRACE";
    case LogLevel::kFatal:
      return "FATAL";
  }
  return "UNKNOWN";
}

LogLevel GetLogLevel() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level == kUnset) level = InitLevelFromEnv();
  return static_cast<LogLevel>(level);
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

absl::Status ReloadLogLevelFromEnv() {
  absl::StatusOr<LogLevel> parsed = LevelFromEnv();
  if (!parsed.ok()) return parsed.status();
  SetLogLevel(*parsed);
  return absl::OkStatus();
}

void SetLogSink(LogSink sink) {
  Destination& destination = GetDestination();
  MutexLock lock(&destination.mu);
  destination.sink = std::move(sink);
}

namespace internal {

LogMessage::LogMessage(const char* file, int line, LogLevel level)
    : file_(Basename(file)), line_(line), level_(level) {}

LogMessage::~LogMessage() {
  const std::string message = stream_.str();
  Destination& destination = GetDestination();
  {
    MutexLock lock(&destination.mu);
    if (destination.sink) {
      destination.sink(level_, file_, line_, message);
    } else {
      if (!destination.file_opened) {
        destination.file = OpenLogFile();
        destination.file_opened = true;
      }
      static const std::string prefix = [] {
        char host[256] = "unknown";
        gethostname(host, sizeof(host) - 1);
        return absl::StrCat(host, ":", getpid());
      }();
      const long tid = syscall(SYS_gettid);
      const std::string text = absl::StrCat(prefix, ":", tid, " [lbcc] ", LogLevelName(level_),
                                            " ", file_, ":", line_, " ", message, "\n");
      std::fwrite(text.data(), 1, text.size(), destination.file);
      std::fflush(destination.file);
    }
  }
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace internal
}  // namespace lbcc
