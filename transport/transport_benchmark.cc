// The transport's performance figures, each a ratio against a limit measured in the same run:
//
//   BM_LoopbackTcp/4MiB      LBCC's UCX transport vs `ucx_perftest -t tag_bw`, 4 MiB messages,
//                            tcp over the loopback device, process pairs, alternating rounds
//                            (medians); target ratio_to_perftest >= 0.9.
//   BM_ShapedLink/100Mbit    bulk bandwidth through the testbed's 100 Mbit/s tbf down-link
//                            (link probed and classified slow) vs the shaped rate; target >= 0.9.
//                            ucx_perftest through the same link for reference.
//   BM_PriorityUnderLoad     round trip of a 64 KiB high-priority message on that link, idle and
//                            with the link saturated by bulk; budget = 1.5 x idle + one chunk's
//                            time; target loaded <= budget.
//
//   bazel run //transport:transport_benchmark      (as root for the testbed cases)
//
// The shaped cases bring up their own testbed (tools/testbed) and skip without root.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "transport/subprocess.h"

namespace lbcc::transport {
namespace {

using json = nlohmann::json;
using testing::RunfilePath;
using testing::Subprocess;

constexpr absl::Duration kTimeout = absl::Seconds(600);
constexpr int64_t kMessageBytes = 4 << 20;

const char* g_argv0 = nullptr;

std::string Perf() { return RunfilePath("transport/transport_perf", g_argv0); }
std::string TestbedScript() { return RunfilePath("tools/testbed/testbed", g_argv0); }

int RandomPort() {
  static std::mt19937 random(static_cast<unsigned>(getpid()));
  return std::uniform_int_distribution<int>(20000, 60000)(random);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// argv run as `host` of testbed `name`, or directly when name is empty.
std::vector<std::string> As(const std::string& name, int host, std::vector<std::string> argv) {
  if (name.empty()) return argv;
  std::vector<std::string> wrapped = {TestbedScript(), "exec", "--name", name,
                                      std::to_string(host), "--"};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

// ucx_perftest -t tag_bw from `client` to `server` (testbed hosts, or loopback when `name` is
// empty); bytes per second from its "Final:" line (its MB are MiB).
absl::StatusOr<double> Perftest(const std::string& name, int server, int client,
                                const std::string& server_address, const std::string& device,
                                int iterations) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::string port = std::to_string(RandomPort());
    absl::StatusOr<std::unique_ptr<Subprocess>> peer = Subprocess::Start(
        As(name, server,
           {"/usr/bin/env", "UCX_TLS=tcp", "UCX_NET_DEVICES=" + device, "ucx_perftest", "-p",
            port}));
    if (!peer.ok()) return peer.status();
    absl::SleepFor(absl::Milliseconds(500));  // ucx_perftest has no readiness signal.
    absl::StatusOr<std::string> out = testing::Run(
        As(name, client,
           {"/usr/bin/env", "UCX_TLS=tcp", "UCX_NET_DEVICES=" + device, "ucx_perftest",
            server_address, "-p", port, "-t", "tag_bw", "-s", std::to_string(kMessageBytes), "-n",
            std::to_string(iterations)}),
        kTimeout);
    (void)(*peer)->Wait(absl::Seconds(10));
    if (!out.ok()) continue;  // Port taken or server not ready yet: another port.
    for (absl::string_view line : absl::StrSplit(*out, '\n')) {
      if (!absl::StartsWith(line, "Final:")) continue;
      std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
      double mib_per_second = 0;
      if (fields.size() >= 7 && absl::SimpleAtod(fields[6], &mib_per_second)) {
        return mib_per_second * (1 << 20);
      }
    }
    return absl::InternalError(absl::StrCat("no Final: line in ucx_perftest output: ", *out));
  }
  return absl::UnavailableError("ucx_perftest did not run (5 attempts)");
}

// transport_perf serve as `server`; returns the process and its address.
absl::StatusOr<std::pair<std::unique_ptr<Subprocess>, std::string>> Serve(
    const std::string& name, int server, const std::string& listen, const std::string& device) {
  LBCC_ASSIGN_OR_RETURN(
      std::unique_ptr<Subprocess> peer,
      Subprocess::Start(As(name, server,
                           {Perf(), "serve", "--listen=" + listen + ":0", "--devices=" + device})));
  LBCC_ASSIGN_OR_RETURN(std::string line,
                        peer->ReadLine([](const std::string& l) {
                          return absl::StartsWith(l, "listening ");
                        }, kTimeout));
  return std::make_pair(std::move(peer), std::string(absl::StripPrefix(line, "listening ")));
}

absl::StatusOr<json> Client(const std::string& name, int client, std::vector<std::string> args,
                            std::vector<std::string> env) {
  std::vector<std::string> argv = {"/usr/bin/env"};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(Perf());
  argv.insert(argv.end(), args.begin(), args.end());
  LBCC_ASSIGN_OR_RETURN(std::string out, testing::Run(As(name, client, argv), kTimeout));
  json result = json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (result.is_discarded()) return absl::InternalError("transport_perf printed no JSON: " + out);
  return result;
}

// One testbed for the shaped cases: host 0 sends, host 1's down-link is shaped.
class Testbed {
 public:
  static Testbed& Get() {
    if (instance_ == nullptr) instance_ = new Testbed;
    return *instance_;
  }
  // Removes the testbed if a case brought it up.
  static void DownIfUp() {
    if (instance_ != nullptr && instance_->up_) {
      (void)testing::Run({TestbedScript(), "down", "--name", instance_->name_}, kTimeout);
      instance_->up_ = false;
    }
  }
  const absl::Status& status() const { return status_; }
  const std::string& name() const { return name_; }

 private:
  Testbed() : name_(absl::StrCat("bm", getpid())) {
    absl::StatusOr<std::string> check = testing::Run({TestbedScript(), "check"}, kTimeout);
    if (!check.ok()) {
      status_ = absl::UnavailableError(absl::StrCat("testbed unavailable: ", check.status().message()));
      return;
    }
    (void)testing::Run({TestbedScript(), "down", "--stale"}, kTimeout);
    absl::StatusOr<std::string> up =
        testing::Run({TestbedScript(), "up", "--name", name_, "--hosts", "2", "--rate", "100mbit",
                      "--slow", "1", "--owner-pid", std::to_string(getpid())},
                     kTimeout);
    status_ = up.status();
    up_ = up.ok();
  }
  static Testbed* instance_;
  std::string name_;
  absl::Status status_;
  bool up_ = false;
};
Testbed* Testbed::instance_ = nullptr;

void BM_LoopbackTcp(benchmark::State& state) {
  constexpr int kRounds = 3;
  std::vector<double> perftest, lbcc;
  for (auto _ : state) {
    for (int round = 0; round < kRounds; ++round) {
      absl::StatusOr<double> reference = Perftest("", 0, 0, "127.0.0.1", "lo", 500);
      if (!reference.ok()) return state.SkipWithError(reference.status().ToString().c_str());
      perftest.push_back(*reference);
      auto server = Serve("", 0, "127.0.0.1", "lo");
      if (!server.ok()) return state.SkipWithError(server.status().ToString().c_str());
      absl::StatusOr<json> result =
          Client("", 0,
                 {"bw", "--connect=" + server->second, "--devices=lo", "--link_class=fast",
                  "--bytes=4M", "--count=500", "--window=16"},
                 {});
      if (!result.ok()) return state.SkipWithError(result.status().ToString().c_str());
      lbcc.push_back((*result)["bytes_per_second"].get<double>());
    }
    // Manual time of one second: bytes_per_second then reads as LBCC's median rate.
    state.SetIterationTime(1.0);
  }
  state.SetBytesProcessed(static_cast<int64_t>(Median(lbcc)));
  state.counters["lbcc_MBps"] = Median(lbcc) / 1e6;
  state.counters["ucx_perftest_MBps"] = Median(perftest) / 1e6;
  state.counters["ratio_to_perftest"] = Median(lbcc) / Median(perftest);
  state.counters["ratio_min_round"] =
      *std::min_element(lbcc.begin(), lbcc.end()) / *std::max_element(perftest.begin(), perftest.end());
}

void BM_ShapedLink(benchmark::State& state) {
  Testbed& testbed = Testbed::Get();
  if (!testbed.status().ok()) return state.SkipWithError(testbed.status().ToString().c_str());
  constexpr double kShaped = 100e6 / 8;
  double lbcc = 0, perftest = 0;
  json counters;
  for (auto _ : state) {
    absl::StatusOr<double> reference = Perftest(testbed.name(), 1, 0, "10.77.0.2", "eth0", 30);
    if (!reference.ok()) return state.SkipWithError(reference.status().ToString().c_str());
    perftest = *reference;
    auto server = Serve(testbed.name(), 1, "10.77.0.2", "eth0");
    if (!server.ok()) return state.SkipWithError(server.status().ToString().c_str());
    // The link class comes from the probe (threshold at its default).
    absl::StatusOr<json> result = Client(
        testbed.name(), 0,
        {"bw", "--connect=" + server->second, "--devices=eth0", "--bytes=4M", "--count=30"}, {});
    if (!result.ok()) return state.SkipWithError(result.status().ToString().c_str());
    lbcc = (*result)["bytes_per_second"].get<double>();
    counters = (*result)["counters"];
    state.SetIterationTime(1.0);  // bytes_per_second reads as LBCC's rate.
  }
  state.SetBytesProcessed(static_cast<int64_t>(lbcc));
  state.SetLabel(absl::StrCat("link ", counters["link_class"].get<std::string>(), ", probed ",
                              static_cast<int>(counters["probed_send_bytes_per_second"].get<double>() *
                                               8e-6),
                              " Mbit/s"));
  state.counters["shaped_MBps"] = kShaped / 1e6;
  state.counters["lbcc_MBps"] = lbcc / 1e6;
  state.counters["ratio_to_shaped"] = lbcc / kShaped;
  state.counters["ucx_perftest_MBps"] = perftest / 1e6;
  state.counters["perftest_ratio_to_shaped"] = perftest / kShaped;
}

void BM_PriorityUnderLoad(benchmark::State& state) {
  Testbed& testbed = Testbed::Get();
  if (!testbed.status().ok()) return state.SkipWithError(testbed.status().ToString().c_str());
  json result;
  for (auto _ : state) {
    auto server = Serve(testbed.name(), 1, "10.77.0.2", "eth0");
    if (!server.ok()) return state.SkipWithError(server.status().ToString().c_str());
    absl::StatusOr<json> r = Client(testbed.name(), 0,
                                    {"prio", "--connect=" + server->second, "--devices=eth0",
                                     "--ping_bytes=64K", "--rounds=30", "--bulk_bytes=4M",
                                     "--window=8"},
                                    {});
    if (!r.ok()) return state.SkipWithError(r.status().ToString().c_str());
    result = *r;
    state.SetIterationTime(result["loaded"]["p50_seconds"].get<double>());
  }
  auto ms = [](const json& j) { return j.get<double>() * 1e3; };
  state.SetLabel(absl::StrCat("link ", result["counters"]["link_class"].get<std::string>()));
  state.counters["idle_p50_ms"] = ms(result["idle"]["p50_seconds"]);
  state.counters["loaded_p50_ms"] = ms(result["loaded"]["p50_seconds"]);
  state.counters["loaded_p90_ms"] = ms(result["loaded"]["p90_seconds"]);
  state.counters["loaded_max_ms"] = ms(result["loaded"]["max_seconds"]);
  state.counters["chunk_ms"] = ms(result["chunk_seconds"]);
  state.counters["budget_ms"] = ms(result["budget_seconds"]);
  state.counters["p50_over_budget"] = result["loaded_p50_over_budget"].get<double>();
  state.counters["max_over_budget"] = result["loaded_max_over_budget"].get<double>();
  state.counters["bulk_MBps"] = result["bulk_bytes_per_second"].get<double>() / 1e6;
}

}  // namespace
}  // namespace lbcc::transport

int main(int argc, char** argv) {
  using namespace lbcc::transport;  // NOLINT: main only.
  g_argv0 = argv[0];
  benchmark::RegisterBenchmark("BM_LoopbackTcp/4MiB", BM_LoopbackTcp)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("BM_ShapedLink/100Mbit", BM_ShapedLink)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kSecond);
  benchmark::RegisterBenchmark("BM_PriorityUnderLoad/64KiB", BM_PriorityUnderLoad)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  Testbed::DownIfUp();
  benchmark::Shutdown();
  return 0;
}
