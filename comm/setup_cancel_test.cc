// Cancelling a set-up from another thread (bootstrap.h's Cancellation): a bootstrap root, a
// rank's bootstrap exchange and a whole Communicator::Init stop at once with the
// cancellation's status, and leave no thread behind. Every wait here is far shorter than the
// set-up timeout (300 s): a set-up that was not cancelled would fail the test by its deadline.
#include <dirent.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "base/status_matchers.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr absl::Duration kSetupTimeout = absl::Seconds(300);
// Generous bounds for "at once": a fraction of the set-up timeout.
constexpr absl::Duration kPrompt = absl::Seconds(30);

int ThreadCount() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
    closedir(dir);
  }
  return n;
}

// The thread count before a case, once a thread has been started and joined: a sanitizer's
// runtime starts a helper thread of its own with the process's first thread.
int BaselineThreads() {
  std::thread([] {}).join();
  return ThreadCount();
}

// Polls the thread count (a thread that returned leaves no other trace) until it is at most
// `n`, up to kPrompt. The count each time.
int AwaitThreadsAtMost(int n) {
  const absl::Time deadline = absl::Now() + kPrompt;
  int now = ThreadCount();
  while (now > n && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));  // polling an observable, not a synchronisation
    now = ThreadCount();
  }
  return now;
}

// A result one thread sets and another awaits.
struct Result {
  Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  void Set(absl::Status s) {
    MutexLock lock(&mu);
    status = std::move(s);
    done = true;
  }
  bool Await(absl::Duration timeout) {
    MutexLock lock(&mu);
    return mu.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done; },
                               timeout);
  }
  absl::Status Get() {
    MutexLock lock(&mu);
    return status;
  }
};

TEST(SetupCancelTest, ACancelledRootTellsTheRanksThatJoinedAndItsThreadEnds) {
  const int threads_before = BaselineThreads();
  auto root = std::make_shared<Cancellation>();
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id,
                            CreateUniqueId("127.0.0.1", kSetupTimeout, BootstrapSecurity{}, root));
  // Two processes claim rank 0 of 2 and rank 1 never comes: the root turns the second away
  // at once, so when one of them returns, the other has joined and waits for the table.
  Result first, second;
  Result* results[2] = {&first, &second};
  Mutex order_mu;
  int returned = 0;
  std::vector<std::thread> ranks;
  for (int i = 0; i < 2; ++i) {
    ranks.emplace_back([&, i] {
      absl::Status s = BootstrapExchange(id, 2, 0, absl::StrCat("blob", i), kSetupTimeout).status();
      int slot = 0;
      {
        MutexLock lock(&order_mu);
        slot = returned++;
      }
      results[slot]->Set(std::move(s));
    });
  }
  ASSERT_TRUE(first.Await(kPrompt));
  EXPECT_THAT(first.Get(), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("two processes claim rank 0")));
  const absl::Time cancelled_at = absl::Now();
  root->Cancel(absl::CancelledError("epoch 7 was superseded"));
  ASSERT_TRUE(second.Await(kPrompt));
  EXPECT_LT(absl::Now() - cancelled_at, kPrompt);
  EXPECT_THAT(second.Get(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("superseded")));
  for (auto& t : ranks) t.join();
  // The root's thread let go of the cancellation and ended.
  EXPECT_LE(AwaitThreadsAtMost(threads_before), threads_before);
  EXPECT_EQ(root->hooks(), 0);
}

TEST(SetupCancelTest, ACancelledExchangeReturnsTheCancellationsStatusWhereverItWaits) {
  // Rank 1 never comes: rank 0 waits for the table until it is cancelled.
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", absl::Seconds(20)));
  Cancellation cancel;
  Result result;
  std::thread rank([&] {
    result.Set(BootstrapExchange(id, 2, 0, "blob", kSetupTimeout, BootstrapSecurity{}, &cancel)
                   .status());
  });
  // Its socket's hook: it connects or waits for the table (polled: a state, not an event).
  for (const absl::Time until = absl::Now() + kPrompt; cancel.hooks() == 0 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(cancel.hooks(), 1);
  EXPECT_FALSE(result.Await(absl::ZeroDuration()));
  cancel.Cancel(absl::CancelledError("the test gave up"));
  ASSERT_TRUE(result.Await(kPrompt));
  rank.join();
  EXPECT_THAT(result.Get(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("gave up")));
  EXPECT_EQ(cancel.hooks(), 0);

  // Cancelled before it starts: it never connects. A root nobody serves (no process listens on
  // port 1) would otherwise be retried until the timeout.
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId nowhere, UniqueIdFromAddress("127.0.0.1:1", 5));
  EXPECT_THAT(BootstrapExchange(nowhere, 2, 0, "blob", kSetupTimeout, BootstrapSecurity{}, &cancel),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("gave up")));
}

TEST(SetupCancelTest, ARankRetryingAnAbsentRootStopsWhenCancelled) {
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId nowhere, UniqueIdFromAddress("127.0.0.1:1", 5));
  Cancellation cancel;
  Result result;
  std::thread rank([&] {
    result.Set(BootstrapExchange(nowhere, 2, 0, "blob", kSetupTimeout, BootstrapSecurity{},
                                 &cancel)
                   .status());
  });
  cancel.Cancel(absl::CancelledError("superseded"));
  ASSERT_TRUE(result.Await(kPrompt));
  rank.join();
  EXPECT_THAT(result.Get(), StatusIs(absl::StatusCode::kCancelled));
}

// A communicator's set-up past its bootstrap: rank 1 (played by the test) joins the bootstrap
// saying it cannot be dialed, so rank 0 waits to accept rank 1's connections, which never
// come. Cancelled, its Init returns Cancelled (the transport shut down under the accept), and
// no thread of it is left.
TEST(SetupCancelTest, ACancelledInitStopsWaitingForItsConnections) {
  for (const char* backend : {"loopback", "socket"}) {
    SCOPED_TRACE(backend);
    const int threads_before = BaselineThreads();
    LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId("127.0.0.1", kSetupTimeout));
    auto cancel = std::make_shared<Cancellation>();
    Result init;
    std::thread rank0([&] {
      CommConfig config;
      config.backend = backend;
      config.listen_host = "127.0.0.1";
      config.timeout = kSetupTimeout;
      init.Set(Communicator::Init(id, 2, 0, config, cancel).status());
    });
    // Rank 1's blob: host name, an address nobody serves, not reachable ("0").
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    absl::StatusOr<std::vector<std::string>> table = BootstrapExchange(
        id, 2, 1, absl::StrCat(host, "\n127.0.0.1:1\n0"), kSetupTimeout);
    ASSERT_THAT(table.status(), ::lbcc::testing::IsOk());
    // Rank 0 has the table too (the root sends rank 0's last): it connects, or is about to.
    EXPECT_FALSE(init.Await(absl::ZeroDuration()));
    cancel->Cancel(absl::CancelledError("epoch 3 was superseded"));
    ASSERT_TRUE(init.Await(kPrompt));
    rank0.join();
    EXPECT_THAT(init.Get(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("superseded")));
    EXPECT_EQ(cancel->hooks(), 0);
    EXPECT_LE(AwaitThreadsAtMost(threads_before), threads_before);
  }
}

// The hooks a Cancellation runs: at once for a hook made after it was cancelled; never again
// after the hook is gone.
TEST(SetupCancelTest, HooksRunOnceWhileTheyExist) {
  Cancellation cancel;
  int runs = 0;
  {
    Cancellation::Hook hook(&cancel, [&] { ++runs; });
    EXPECT_EQ(cancel.hooks(), 1);
    EXPECT_EQ(runs, 0);
    cancel.Cancel(absl::UnavailableError("not a cancellation"));
    EXPECT_EQ(runs, 1);
    cancel.Cancel(absl::CancelledError("again"));  // the first status stays
    EXPECT_EQ(runs, 1);
  }
  EXPECT_EQ(cancel.hooks(), 0);
  EXPECT_THAT(cancel.status(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("not a cancellation")));
  Cancellation::Hook late(&cancel, [&] { ++runs; });
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(cancel.WaitFor(absl::ZeroDuration()));
  Cancellation::Hook none(nullptr, [&] { ++runs; });  // no cancellation: nothing
  EXPECT_EQ(runs, 2);
  Cancellation fresh;
  EXPECT_FALSE(fresh.WaitFor(absl::Milliseconds(1)));
  EXPECT_THAT(fresh.status(), ::lbcc::testing::IsOk());
}

}  // namespace
}  // namespace lbcc::comm
