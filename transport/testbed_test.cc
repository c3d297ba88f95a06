// Multi-process tests over UCX tcp inside the testbed (tools/testbed): four emulated hosts, the
// down-link of host 2 shaped to 100 Mbit/s, host 3 unplugged by one test. Checks link
// classification by probe, pacing and priority on a real shaped link, and a vanished peer.
// Needs root and network namespaces; skips with the reason otherwise.
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "transport/subprocess.h"

namespace lbcc::transport {
namespace {

using ::lbcc::transport::testing::RunfilePath;
using ::lbcc::transport::testing::Subprocess;
using json = nlohmann::json;

constexpr absl::Duration kTimeout = absl::Seconds(300);

class TestbedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testbed_ = new std::string(RunfilePath("tools/testbed/testbed"));
    perf_ = new std::string(RunfilePath("transport/transport_perf"));
    absl::StatusOr<std::string> check = testing::Run({*testbed_, "check"}, absl::Seconds(30));
    if (!check.ok()) {
      skip_reason_ = new std::string(absl::StrCat("testbed unavailable (needs root and network "
                                                  "namespaces): ",
                                                  check.status().message()));
      return;
    }
    (void)testing::Run({*testbed_, "down", "--stale"}, absl::Seconds(30));
    name_ = new std::string(absl::StrCat("tt", getpid()));
    absl::StatusOr<std::string> up =
        testing::Run({*testbed_, "up", "--name", *name_, "--hosts", "4", "--rate", "100mbit", "--slow", "2",
             "--owner-pid", std::to_string(getpid())},
            absl::Seconds(60));
    if (!up.ok()) setup_error_ = new std::string(up.status().ToString());
  }
  static void TearDownTestSuite() {
    if (name_ != nullptr) (void)testing::Run({*testbed_, "down", "--name", *name_}, absl::Seconds(60));
  }
  void SetUp() override {
    if (skip_reason_ != nullptr) GTEST_SKIP() << *skip_reason_;
    ASSERT_EQ(setup_error_, nullptr) << *setup_error_;
  }

  static std::string Address(int host) { return absl::StrCat("10.77.0.", host + 1); }

  // Starts `transport_perf serve` as `host`; returns its address.
  std::string Serve(int host) {
    absl::StatusOr<std::unique_ptr<Subprocess>> server = Subprocess::Start(
        {*testbed_, "exec", "--name", *name_, std::to_string(host), "--", *perf_, "serve",
         "--listen=" + Address(host) + ":0", "--devices=eth0"});
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "";
    absl::StatusOr<std::string> line = (*server)->ReadLine(
        [](const std::string& l) { return absl::StartsWith(l, "listening "); }, kTimeout);
    EXPECT_TRUE(line.ok()) << line.status();
    servers_.push_back(*std::move(server));
    return line.ok() ? std::string(absl::StripPrefix(*line, "listening ")) : "";
  }

  // Runs `transport_perf <args>` as `host` with `env`; its JSON result.
  json Client(int host, std::vector<std::string> args, std::vector<std::string> env = {}) {
    std::vector<std::string> argv = {*testbed_, "exec", "--name", *name_, std::to_string(host),
                                     "--", "env"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.push_back(*perf_);
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--devices=eth0");
    absl::StatusOr<std::string> out = testing::Run(argv, kTimeout);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return json::object();
    return json::parse(*out, nullptr, /*allow_exceptions=*/false);
  }

  static std::string* testbed_;
  static std::string* perf_;
  static std::string* name_;
  static std::string* skip_reason_;
  static std::string* setup_error_;
  std::vector<std::unique_ptr<Subprocess>> servers_;  // Killed when the test ends.
};

std::string* TestbedTest::testbed_ = nullptr;
std::string* TestbedTest::perf_ = nullptr;
std::string* TestbedTest::name_ = nullptr;
std::string* TestbedTest::skip_reason_ = nullptr;
std::string* TestbedTest::setup_error_ = nullptr;

TEST_F(TestbedTest, ProbeClassifiesTheShapedLinkSlowAndTheUnshapedOneFast) {
  const std::string fast_server = Serve(1);
  const std::string slow_server = Serve(2);
  // 0.3 Gbit/s sits far from 100 Mbit/s and from an unshaped veth, even in sanitizer builds.
  const std::vector<std::string> env = {"LBCC_SLOW_LINK_GBITS=0.3"};
  json fast = Client(0, {"classify", "--connect=" + fast_server}, env);
  json slow = Client(0, {"classify", "--connect=" + slow_server}, env);
  EXPECT_EQ(fast["counters"]["link_class"], "fast") << fast.dump();
  EXPECT_EQ(slow["counters"]["link_class"], "slow") << slow.dump();
  // Only host 2's down-link is shaped: the probe sees the asymmetry.
  EXPECT_LT(slow["counters"]["probed_send_bytes_per_second"].get<double>(),
            slow["counters"]["probed_recv_bytes_per_second"].get<double>())
      << slow.dump();
}

TEST_F(TestbedTest, PacingHoldsTheConfiguredRateOverStripes) {
  const std::string server = Serve(1);  // Unshaped: only the pacing limits the rate.
  json result = Client(0, {"bw", "--connect=" + server, "--bytes=1M", "--count=16"},
                       {"LBCC_LINK_CLASS=slow", "LBCC_SLOW_PACE_MBITS=80", "LBCC_SLOW_STRIPES=3"});
  const double pace = 80e6 / 8;
  const double chunk = 256 << 10;
  const double bytes = 16 << 20;
  // Upper bound only: the bucket starts with one chunk of tokens; a slow machine only lowers it.
  EXPECT_LE(result["bytes_per_second"].get<double>(), pace * bytes / (bytes - chunk) * 1.02)
      << result.dump();
  EXPECT_GT(result["counters"]["pacing_waits"].get<uint64_t>(), 0u) << result.dump();
  EXPECT_EQ(result["counters"]["stripes"], 3) << result.dump();
  EXPECT_EQ(result["counters"]["link_class"], "slow") << result.dump();
}

TEST_F(TestbedTest, HighPriorityOvertakesQueuedBulkOnTheShapedLink) {
  const std::string server = Serve(2);
  constexpr int kRounds = 5;
  json result = Client(0,
                       {"prio", "--connect=" + server, "--rounds=" + std::to_string(kRounds),
                        "--bulk_bytes=1M", "--window=6"},
                       {"LBCC_SLOW_LINK_GBITS=0.3"});
  ASSERT_EQ(result["counters"]["link_class"], "slow") << result.dump();
  // Each ping completed while less bulk completed than was queued ahead of it when it was sent:
  // it overtook queued bulk data (an ordering property, not a timing one).
  EXPECT_EQ(result["pings_that_overtook_queued_bulk"], kRounds) << result.dump();
  for (const json& sample : result["samples"]) {
    EXPECT_GT(sample["queued_bytes_at_send"].get<uint64_t>(), 0u) << sample.dump();
  }
}

TEST_F(TestbedTest, VanishedPeerFailsPendingWorkWithinThePeerTimeout) {
  const std::string server = Serve(3);
  absl::StatusOr<std::unique_ptr<Subprocess>> client = Subprocess::Start(
      {*testbed_, "exec", "--name", *name_, "0", "--", "env", "LBCC_PEER_TIMEOUT_MS=5000", *perf_,
       "bw", "--connect=" + server, "--devices=eth0", "--link_class=fast", "--bytes=1M",
       "--count=1000000", "--announce"});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)
                  ->ReadLine([](const std::string& l) { return l.find("bulk_started") != l.npos; },
                             kTimeout)
                  .ok());
  // No reset reaches the client: only the silent-peer watchdog can end its pending sends.
  ASSERT_TRUE(testing::Run({*testbed_, "cut", "--name", *name_, "3"}, kTimeout).ok());
  absl::StatusOr<std::string> error = (*client)->ReadLine(
      [](const std::string& l) { return l.find("\"error\"") != l.npos; }, kTimeout);
  ASSERT_TRUE(error.ok()) << error.status() << "; output: " << (*client)->output();
  EXPECT_EQ(json::parse(*error)["code"], "UNAVAILABLE") << *error;
  EXPECT_EQ((*client)->Wait(kTimeout).value_or(-1), 1);
}

}  // namespace
}  // namespace lbcc::transport
