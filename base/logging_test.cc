#include "base/logging.h"

#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/check.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc {
namespace {

using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::StatusIs;

struct Captured {
  lbcc::Mutex mu;
  std::vector<std::string> lines ABSL_GUARDED_BY(mu);
};

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([this](LogLevel level, absl::string_view, int, absl::string_view message) {
      MutexLock lock(&captured_.mu);
      captured_.lines.push_back(std::string(LogLevelName(level)) + " " + std::string(message));
    });
  }
  void TearDown() override {
    SetLogSink(nullptr);
    SetLogLevel(LogLevel::kWarn);
  }
  std::vector<std::string> Lines() {
    MutexLock lock(&captured_.mu);
    return captured_.lines;
  }
  Captured captured_;
};

TEST_F(LoggingTest, LevelFiltersMessagesAndSkipsFormatting) {
  SetLogLevel(LogLevel::kWarn);
  int formatted = 0;
  auto count = [&formatted] { return ++formatted; };
  LBCC_LOG(WARN) << "warned " << count();
  LBCC_LOG(INFO) << "hidden " << count();
  LBCC_LOG(TRACE) << "hidden " << count();
  SetLogLevel(LogLevel::kTrace);
  LBCC_LOG(TRACE) << "traced " << count();
  EXPECT_EQ(formatted, 2);
  EXPECT_THAT(Lines(), ::testing::ElementsAre("WARN warned 1", "TRACE traced 2"));
}

TEST_F(LoggingTest, NoneSilencesEverything) {
  SetLogLevel(LogLevel::kNone);
  LBCC_LOG(WARN) << "x";
  LBCC_LOG(VERSION) << "y";
  EXPECT_TRUE(Lines().empty());
}

TEST_F(LoggingTest, LogIfEvaluatesCondition) {
  SetLogLevel(LogLevel::kInfo);
  LBCC_LOG_IF(INFO, 1 + 1 == 3) << "no";
  LBCC_LOG_IF(INFO, 1 + 1 == 2) << "yes";
  EXPECT_THAT(Lines(), ::testing::ElementsAre("INFO yes"));
}

TEST_F(LoggingTest, ConcurrentLinesAreWhole) {
  SetLogLevel(LogLevel::kInfo);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) LBCC_LOG(INFO) << "thread " << t << " line " << i;
    });
  }
  for (auto& th : threads) th.join();
  const auto lines = Lines();
  EXPECT_EQ(lines.size(), 800u);
  for (const auto& line : lines) EXPECT_THAT(line, ::testing::MatchesRegex("INFO thread [0-3] line [0-9]+"));
}

TEST_F(LoggingTest, ReloadFromEnvironment) {
  setenv("LBCC_DEBUG", "TRACE", 1);
  EXPECT_THAT(ReloadLogLevelFromEnv(), ::lbcc::testing::IsOk());
  EXPECT_EQ(GetLogLevel(), LogLevel::kTrace);
  setenv("LBCC_DEBUG", "chatty", 1);
  EXPECT_THAT(ReloadLogLevelFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("chatty")));
  EXPECT_EQ(GetLogLevel(), LogLevel::kTrace);
  unsetenv("LBCC_DEBUG");
}

TEST(LogLevelTest, Parse) {
  EXPECT_THAT(ParseLogLevel("trace"), IsOkAndHolds(LogLevel::kTrace));
  EXPECT_THAT(ParseLogLevel("Version"), IsOkAndHolds(LogLevel::kVersion));
  EXPECT_THAT(ParseLogLevel("DEBUG"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CheckDeathTest, CheckFailureAbortsWithMessage) {
  SetLogSink(nullptr);
  const int limit = 3;
  EXPECT_DEATH(LBCC_CHECK_LT(limit, 2) << "context", "Check failed: .*limit.*context");
}

}  // namespace
}  // namespace lbcc
