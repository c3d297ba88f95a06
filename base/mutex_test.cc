#include "base/mutex.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lbcc {
namespace {

TEST(MutexTest, CountersUnderContention) {
  Mutex mu;
  int64_t count = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        MutexLock lock(&mu);
        ++count;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(count, 40000);
}

TEST(CondVarTest, HandOffBetweenThreads) {
  Mutex mu;
  CondVar cv;
  int turn = 0;
  std::vector<int> order;
  std::thread other([&] {
    for (int i = 0; i < 100; ++i) {
      MutexLock lock(&mu);
      while (turn != 1) cv.Wait(&mu);
      order.push_back(1);
      turn = 0;
      cv.SignalAll();
    }
  });
  for (int i = 0; i < 100; ++i) {
    MutexLock lock(&mu);
    while (turn != 0) cv.Wait(&mu);
    order.push_back(0);
    turn = 1;
    cv.SignalAll();
  }
  other.join();
  ASSERT_EQ(order.size(), 200u);
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], static_cast<int>(i % 2));
}

TEST(CondVarTest, DeadlineInThePastTimesOutAndKeepsTheLock) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  EXPECT_TRUE(cv.WaitWithDeadline(&mu, absl::Now() - absl::Seconds(1)));
  EXPECT_TRUE(cv.WaitWithTimeout(&mu, absl::Milliseconds(1)));
  EXPECT_FALSE(mu.TryLock());  // Still held by this thread after the waits.
}

TEST(MutexTest, AwaitReturnsWhenTheConditionHolds) {
  Mutex mu;
  int stage = 0;
  std::thread producer([&] {
    for (int i = 1; i <= 3; ++i) {
      MutexLock lock(&mu);
      stage = i;
    }
  });
  {
    MutexLock lock(&mu);
    mu.Await([&] { return stage == 3; });
    EXPECT_EQ(stage, 3);
  }
  producer.join();
  MutexLock lock(&mu);
  EXPECT_FALSE(mu.AwaitWithTimeout([&] { return stage == 4; }, absl::Milliseconds(5)));
}

}  // namespace
}  // namespace lbcc
