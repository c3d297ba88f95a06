#include "comm/thread_pool.h"

#include <memory>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

TEST(ThreadPoolTest, OneThreadRunsJobsInOrderOffTheCaller) {
  Mutex mu;
  std::vector<int> order;
  std::vector<std::thread::id> where;
  {
    ThreadPool pool(1, "test");
    for (int i = 0; i < 100; ++i) {
      pool.Submit([&, i] {
        MutexLock lock(&mu);
        order.push_back(i);
        where.push_back(std::this_thread::get_id());
      });
    }
  }  // The destructor runs what is queued, then joins.
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  for (const std::thread::id& id : where) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, where[0]);
  }
}

// Two threads: a job may block on something a later job does.
TEST(ThreadPoolTest, JobsRunConcurrentlyOnSeveralThreads) {
  Mutex mu;
  bool second_ran = false;
  bool first_saw_second = false;
  {
    ThreadPool pool(2, "test");
    pool.Submit([&] {
      MutexLock lock(&mu);
      mu.Await([&] { return second_ran; });
      first_saw_second = true;
    });
    pool.Submit([&] {
      MutexLock lock(&mu);
      second_ran = true;
    });
  }
  EXPECT_TRUE(first_saw_second);
}

TEST(ThreadPoolTest, CountsTheThreadsItStartsAndNoneAfterwards) {
  const uint64_t before = ThreadPool::ThreadsStarted();
  auto pool = std::make_unique<ThreadPool>(3, "test");
  EXPECT_EQ(pool->size(), 3);
  EXPECT_EQ(ThreadPool::ThreadsStarted(), before + 3);
  Mutex mu;
  int ran = 0;
  for (int i = 0; i < 50; ++i) {
    pool->Submit([&] {
      MutexLock lock(&mu);
      ++ran;
    });
  }
  pool.reset();
  EXPECT_EQ(ran, 50);
  EXPECT_EQ(ThreadPool::ThreadsStarted(), before + 3);
}

}  // namespace
}  // namespace lbcc::comm
