#include "transport/options.h"

#include <cstdlib>
#include <fstream>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::transport {
namespace {

using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Optional;

// The rules file's parser is tested in link_setup_test.cc.

TEST(ParseLinkClassTest, FastAndSlow) {
  EXPECT_THAT(ParseLinkClass(" Slow "), IsOkAndHolds(LinkClass::kSlow));
  EXPECT_THAT(ParseLinkClass("fast"), IsOkAndHolds(LinkClass::kFast));
  EXPECT_THAT(ParseLinkClass("auto"), StatusIs(absl::StatusCode::kInvalidArgument));
}

class FromEnvTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name :
         {"LBCC_SLOW_CHUNK_BYTES", "LBCC_SLOW_PACE_MBITS", "LBCC_SLOW_STRIPES", "LBCC_SLOW_BULK_YIELD",
          "LBCC_LINK_CLASS", "LBCC_LINK_RULES_FILE", "LBCC_SLOW_LINK_GBITS", "LBCC_PEER_TIMEOUT_MS"}) {
      unsetenv(name);
    }
  }
};

TEST_F(FromEnvTest, DefaultsMatchTheIssue) {
  LBCC_ASSERT_OK_AND_ASSIGN(TransportOptions options, TransportOptions::FromEnv());
  EXPECT_EQ(options.scheduler.chunk_bytes, 256 << 10);
  EXPECT_EQ(options.scheduler.pace_bytes_per_second, 0);
  EXPECT_EQ(options.scheduler.stripes, 1);
  EXPECT_TRUE(options.scheduler.bulk_yield);
  EXPECT_EQ(options.link_class, std::nullopt);
  EXPECT_DOUBLE_EQ(options.slow_threshold_bits_per_second, 10e9);
  EXPECT_EQ(options.peer_timeout, absl::Seconds(10));
}

TEST_F(FromEnvTest, ReadsEveryVariable) {
  const std::string path = ::testing::TempDir() + "/link-rules";
  std::ofstream(path) << "10.1.1.1 slow\n";
  setenv("LBCC_SLOW_CHUNK_BYTES", "64K", 1);
  setenv("LBCC_SLOW_PACE_MBITS", "100", 1);
  setenv("LBCC_SLOW_STRIPES", "4", 1);
  setenv("LBCC_SLOW_BULK_YIELD", "0", 1);
  setenv("LBCC_LINK_CLASS", "slow", 1);
  setenv("LBCC_LINK_RULES_FILE", path.c_str(), 1);
  setenv("LBCC_SLOW_LINK_GBITS", "1", 1);
  setenv("LBCC_PEER_TIMEOUT_MS", "2500", 1);
  LBCC_ASSERT_OK_AND_ASSIGN(TransportOptions options, TransportOptions::FromEnv());
  EXPECT_EQ(options.scheduler.chunk_bytes, 64 << 10);
  EXPECT_DOUBLE_EQ(options.scheduler.pace_bytes_per_second, 12.5e6);
  EXPECT_EQ(options.scheduler.stripes, 4);
  EXPECT_FALSE(options.scheduler.bulk_yield);
  EXPECT_THAT(options.link_class, Optional(LinkClass::kSlow));
  EXPECT_THAT(options.ConfiguredClass("10.1.1.1", 7), Optional(LinkClass::kSlow));
  EXPECT_DOUBLE_EQ(options.slow_threshold_bits_per_second, 1e9);
  EXPECT_EQ(options.peer_timeout, absl::Milliseconds(2500));
}

TEST(BulkYieldTest, LeavesTwiceTheNonBulkRateAndAMarginButKeepsBulkMoving) {
  EXPECT_DOUBLE_EQ(BulkPaceBytesPerSecond(1e6, 0), (1 - kBulkYieldMargin) * 1e6);
  EXPECT_DOUBLE_EQ(BulkPaceBytesPerSecond(1e6, 1e5), (1 - kBulkYieldMargin) * 1e6 - 2e5);
  EXPECT_DOUBLE_EQ(BulkPaceBytesPerSecond(1e6, 1e6), kBulkYieldFloor * 1e6);
}

TEST(BulkYieldTest, ChunksLastAboutTwoMillisecondsWithinTheBounds) {
  SchedulerOptions s;  // 256 KiB chunks.
  EXPECT_EQ(BulkYieldChunkBytes(s, 12.5e6), 25000);  // 100 Mbit/s.
  EXPECT_EQ(BulkYieldChunkBytes(s, 1e5), kBulkYieldMinChunkBytes);
  EXPECT_EQ(BulkYieldChunkBytes(s, 1e12), s.chunk_bytes);
  s.chunk_bytes = 1000;  // Never above the configured chunk.
  EXPECT_EQ(BulkYieldChunkBytes(s, 12.5e6), 1000);
}

TEST_F(FromEnvTest, BadValuesAreInvalidArgument) {
  setenv("LBCC_SLOW_STRIPES", "0", 1);
  EXPECT_THAT(TransportOptions::FromEnv(), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    HasSubstr("LBCC_SLOW_STRIPES")));
  unsetenv("LBCC_SLOW_STRIPES");
  setenv("LBCC_LINK_RULES_FILE", "/nonexistent/link-rules", 1);
  EXPECT_THAT(TransportOptions::FromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "cannot read link rules file /nonexistent/link-rules: No such file or "
                       "directory"));
}

}  // namespace
}  // namespace lbcc::transport
