#include "transport/token_bucket.h"

#include "gtest/gtest.h"

namespace lbcc::transport {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(TokenBucketTest, StartsFullAndRefillsAtTheRate) {
  TokenBucket bucket(/*rate=*/1000, /*capacity=*/500, kStart);
  absl::Time ready;
  EXPECT_TRUE(bucket.TryTake(500, kStart, &ready));
  EXPECT_FALSE(bucket.TryTake(100, kStart, &ready));
  EXPECT_EQ(ready, kStart + absl::Milliseconds(100));
  EXPECT_TRUE(bucket.TryTake(100, ready, &ready));
}

TEST(TokenBucketTest, NeverHoldsMoreThanTheCapacity) {
  TokenBucket bucket(1000, 500, kStart);
  EXPECT_DOUBLE_EQ(bucket.Available(kStart + absl::Seconds(60)), 500);
}

TEST(TokenBucketTest, OversizedRequestWaitsForAFullBucket) {
  TokenBucket bucket(1000, 500, kStart);
  absl::Time ready;
  EXPECT_TRUE(bucket.TryTake(800, kStart, &ready));  // Counts as the full capacity.
  EXPECT_FALSE(bucket.TryTake(800, kStart, &ready));
  EXPECT_EQ(ready, kStart + absl::Milliseconds(500));
}

TEST(TokenBucketTest, ReconfigureKeepsEarnedTokensUpToTheNewCapacity) {
  TokenBucket bucket(1000, 500, kStart);
  absl::Time ready;
  EXPECT_TRUE(bucket.TryTake(500, kStart, &ready));
  // 100 ms at the old rate earned 100 tokens; from then on the new rate applies.
  bucket.Reconfigure(2000, 300, kStart + absl::Milliseconds(100));
  EXPECT_DOUBLE_EQ(bucket.Available(kStart + absl::Milliseconds(100)), 100);
  EXPECT_DOUBLE_EQ(bucket.Available(kStart + absl::Milliseconds(150)), 200);
  EXPECT_DOUBLE_EQ(bucket.Available(kStart + absl::Seconds(5)), 300);
  bucket.Reconfigure(2000, 50, kStart + absl::Seconds(5));
  EXPECT_DOUBLE_EQ(bucket.Available(kStart + absl::Seconds(5)), 50);
}

TEST(TokenBucketTest, LongRunRateMatchesTheConfiguredRate) {
  TokenBucket bucket(1e6, 1e4, kStart);
  absl::Time now = kStart;
  double taken = 0;
  while (now < kStart + absl::Seconds(1)) {
    absl::Time ready;
    if (bucket.TryTake(1e4, now, &ready)) {
      taken += 1e4;
    } else {
      ASSERT_GT(ready, now);
      now = ready;
    }
  }
  // One second at 1 MB/s plus the initial bucket, within one take.
  EXPECT_NEAR(taken, 1e6 + 1e4, 1e4);
}

}  // namespace
}  // namespace lbcc::transport
