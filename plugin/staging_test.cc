// StagingPool over the emulated GPU: size classes, reuse, the limit, the must-succeed exception
// and eviction of cached buffers of other sizes.
#include "plugin/staging.h"

#include <memory>

#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "plugin/emulated_gpu.h"

namespace lbcc::plugin {
namespace {

TEST(StagingPoolTest, ReusesBuffersOfTheSameClass) {
  auto gpu = std::make_shared<EmulatedGpu>();
  StagingPool pool(gpu, 8 << 20);
  LBCC_ASSERT_OK_AND_ASSIGN(std::optional<StagingBuffer> a, pool.Acquire(100, false));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->capacity, kMinStagingBytes);
  uint8_t* first = a->data;
  pool.Release(*a);
  LBCC_ASSERT_OK_AND_ASSIGN(std::optional<StagingBuffer> b, pool.Acquire(kMinStagingBytes, false));
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->data, first);
  LBCC_ASSERT_OK_AND_ASSIGN(std::optional<StagingBuffer> c, pool.Acquire(kMinStagingBytes + 1,
                                                                        false));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->capacity, 2 * kMinStagingBytes);
  EXPECT_EQ(pool.counters().allocations, 2u);
  EXPECT_EQ(gpu->counters().pinned_live, 2u);
  pool.Release(*b);
  pool.Release(*c);
  EXPECT_EQ(pool.counters().in_use_bytes, 0u);
}

TEST(StagingPoolTest, RefusesBeyondTheLimitUnlessItMustSucceed) {
  auto gpu = std::make_shared<EmulatedGpu>();
  StagingPool pool(gpu, 1 << 20);
  LBCC_ASSERT_OK_AND_ASSIGN(std::optional<StagingBuffer> a, pool.Acquire(1 << 20, false));
  ASSERT_TRUE(a.has_value());
  LBCC_ASSERT_OK_AND_ASSIGN(std::optional<StagingBuffer> refused, pool.Acquire(1, false));
  EXPECT_FALSE(refused.has_value());
  EXPECT_EQ(pool.counters().refusals, 1u);
  LBCC_ASSERT_OK_AND_ASSIGN(std::optional<StagingBuffer> forced, pool.Acquire(4 << 20, true));
  ASSERT_TRUE(forced.has_value());
  EXPECT_EQ(pool.counters().allocated_bytes, 5u << 20);
  pool.Release(*forced);  // Beyond the limit: freed, not cached.
  EXPECT_EQ(pool.counters().allocated_bytes, 1u << 20);
  EXPECT_EQ(gpu->counters().pinned_live, 1u);
  pool.Release(*a);
  EXPECT_EQ(gpu->counters().pinned_live, 1u);  // Cached.
}

TEST(StagingPoolTest, EvictsCachedBuffersOfOtherClassesToMakeRoom) {
  auto gpu = std::make_shared<EmulatedGpu>();
  StagingPool pool(gpu, 1 << 20);
  LBCC_ASSERT_OK_AND_ASSIGN(std::optional<StagingBuffer> small, pool.Acquire(512 << 10, false));
  ASSERT_TRUE(small.has_value());
  pool.Release(*small);
  LBCC_ASSERT_OK_AND_ASSIGN(std::optional<StagingBuffer> big, pool.Acquire(1 << 20, false));
  ASSERT_TRUE(big.has_value()) << "the cached 512 KiB buffer makes room";
  EXPECT_EQ(pool.counters().allocated_bytes, 1u << 20);
  EXPECT_EQ(gpu->counters().pinned_live, 1u);
  pool.Release(*big);
}

}  // namespace
}  // namespace lbcc::plugin
