// Throughput of the NCCL net plugin against the LBCC transport's own point-to-point throughput on
// the same link, in one run: 4 MiB messages, 8 in flight (NCCL's steps per channel), one sender
// process and one receiver process (this binary re-executed with --role=...).
//
//   BM_Loopback4MiB       127.0.0.1 over UCX's tcp transport, links pinned fast;
//                         counter plugin_to_transport is the ">= 0.9" figure.
//   BM_Testbed100Mbit4MiB tools/testbed, receiver behind a 100 Mbit/s tbf down-link, links probed
//                         (slow) and striped over 2 connections; plugin_to_shaped and
//                         transport_to_shaped divide by 100 Mbit/s. Needs root; skipped with the
//                         reason otherwise.
//
// Each process is pinned to its own core (--pin=0: not), the same for both kinds. Each benchmark
// alternates transport and plugin runs (--rounds, default 5) and reports medians;
// rates are measured at the receiver from the completion of the window's last warm-up message to
// the completion of the last one. load1 is the 1-minute load average when the benchmark started.
//
//   bazel run //plugin:plugin_benchmark        (as root for the testbed case)
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "benchmark/benchmark.h"
#include "plugin/nccl_net.h"
#include "plugin/testing/plugin_api.h"
#include "plugin/testing/socket_io.h"
#include "plugin/testing/spawn.h"
#include "transport/options.h"
#include "transport/transport.h"
#include "transport/ucx_transport.h"

namespace lbcc::plugin {
namespace {

constexpr size_t kMessageBytes = 4 << 20;
constexpr int kWindow = 8;

std::string g_self;
std::string g_plugin;
std::string g_testbed;
int g_rounds = 5;
bool g_pin = true;  // --pin=0: let the scheduler place the processes.

using Args = std::map<std::string, std::string>;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "plugin_benchmark role failed: %s\n", what.c_str());
  std::exit(1);
}
#define ROLE_OK(expr)                                                   \
  do {                                                                  \
    absl::Status role_status_ = (expr);                                 \
    if (!role_status_.ok()) Fail(absl::StrCat(#expr, ": ", role_status_.ToString())); \
  } while (0)

void WriteAll(int fd, const void* data, size_t size) {
  if (!testing::WriteFully(fd, data, size)) Fail("socket write");
}
void ReadAll(int fd, void* data, size_t size) {
  if (!testing::ReadFully(fd, data, size)) Fail("socket read (peer gone)");
}

// Receiver-side timing: from the completion of message `warm - 1` to that of the last one.
struct Clock {
  int warm = kWindow;
  int completed = 0;
  absl::Time start;
  absl::Time end;
  void Complete() {
    ++completed;
    if (completed == warm) start = absl::Now();
    end = absl::Now();
  }
  void Report(int messages) const {
    const double seconds = absl::ToDoubleSeconds(end - start);
    std::printf("RESULT %.0f %.9f\n", static_cast<double>(messages - warm) * kMessageBytes,
                seconds);
    std::fflush(stdout);
  }
};

// ---- The transport's own point-to-point ------------------------------------------------------

int TransportRole(const Args& args, bool sender) {
  const int fd = std::stoi(args.at("fd"));
  const int messages = std::stoi(args.at("messages"));
  absl::StatusOr<transport::TransportOptions> options = transport::TransportOptions::FromEnv();
  ROLE_OK(options.status());
  absl::StatusOr<std::unique_ptr<transport::Transport>> made =
      transport::NewUcxTransport(*options);
  ROLE_OK(made.status());
  std::unique_ptr<transport::Transport> transport = std::move(*made);
  std::unique_ptr<transport::Endpoint> endpoint;
  if (sender) {
    uint32_t length = 0;
    ReadAll(fd, &length, 4);
    std::string address(length, '\0');
    ReadAll(fd, address.data(), length);
    absl::StatusOr<std::unique_ptr<transport::Endpoint>> connected =
        transport->Connect(address, absl::Seconds(60));
    ROLE_OK(connected.status());
    endpoint = std::move(*connected);
  } else {
    absl::StatusOr<std::string> address = transport->Listen(args.at("ip") + ":0");
    ROLE_OK(address.status());
    const uint32_t length = static_cast<uint32_t>(address->size());
    WriteAll(fd, &length, 4);
    WriteAll(fd, address->data(), length);
    absl::StatusOr<std::unique_ptr<transport::Endpoint>> accepted =
        transport->Accept(absl::Seconds(60));
    ROLE_OK(accepted.status());
    endpoint = std::move(*accepted);
  }

  std::vector<std::vector<uint8_t>> buffers(kWindow, std::vector<uint8_t>(kMessageBytes, 7));
  Mutex mu;
  CondVar cv;
  int posted = 0;
  Clock clock;
  absl::Status failure;
  // Completions repost from the callback thread (allowed: they start operations, never block).
  std::function<void(int)> post = [&](int slot) {
    ++posted;
    if (sender) {
      endpoint->Send(0, absl::MakeConstSpan(buffers[slot]), {}, [&, slot](absl::Status status) {
        MutexLock lock(&mu);
        if (!status.ok() && failure.ok()) failure = status;
        clock.Complete();
        if (posted < messages && failure.ok()) post(slot);
        cv.SignalAll();
      });
    } else {
      endpoint->Recv(0, absl::MakeSpan(buffers[slot]),
                     [&, slot](absl::StatusOr<size_t> length) {
                       MutexLock lock(&mu);
                       if (!length.ok() && failure.ok()) failure = length.status();
                       clock.Complete();
                       if (posted < messages && failure.ok()) post(slot);
                       cv.SignalAll();
                     });
    }
  };
  {
    MutexLock lock(&mu);
    for (int slot = 0; slot < kWindow && slot < messages; ++slot) post(slot);
    while (clock.completed < messages && failure.ok()) cv.Wait(&mu);
  }
  ROLE_OK(failure);
  char byte = 'd';
  if (sender) {
    ReadAll(fd, &byte, 1);  // The receiver has everything: closing cannot cut a transfer short.
  } else {
    clock.Report(messages);
    WriteAll(fd, &byte, 1);
  }
  endpoint->Close();
  return 0;
}

// ---- The plugin, driven like NCCL's proxy ------------------------------------------------------

int PluginRole(const Args& args, bool sender) {
  const int fd = std::stoi(args.at("fd"));
  const int messages = std::stoi(args.at("messages"));
  absl::StatusOr<std::unique_ptr<testing::PluginApi>> loaded =
      testing::PluginApi::Load(args.at("plugin"), 11);
  ROLE_OK(loaded.status());
  testing::PluginApi& api = **loaded;
  void* ctx = nullptr;
  ROLE_OK(api.Init(1, &ctx));
  void* listen = nullptr;
  void* comm = nullptr;
  std::array<uint8_t, LBCC_NCCL_NET_HANDLE_MAXSIZE> handle{};
  if (sender) {
    ReadAll(fd, handle.data(), handle.size());
    while (comm == nullptr) {
      ROLE_OK(api.Connect(ctx, 0, handle.data(), &comm));
      std::this_thread::yield();
    }
  } else {
    ROLE_OK(api.Listen(ctx, 0, handle.data(), &listen));
    WriteAll(fd, handle.data(), handle.size());
    while (comm == nullptr) {
      ROLE_OK(api.Accept(listen, &comm));
      std::this_thread::yield();
    }
  }
  std::vector<std::vector<uint8_t>> buffers(kWindow, std::vector<uint8_t>(kMessageBytes, 7));
  std::vector<void*> mhandles(kWindow);
  for (int slot = 0; slot < kWindow; ++slot) {
    ROLE_OK(api.RegMr(comm, buffers[slot].data(), kMessageBytes, &mhandles[slot]));
  }
  std::vector<void*> requests(kWindow, nullptr);
  int posted = 0;
  Clock clock;
  auto post = [&](int slot) {
    void* request = nullptr;
    while (request == nullptr) {
      if (sender) {
        ROLE_OK(api.Isend(comm, buffers[slot].data(), kMessageBytes, 0, mhandles[slot], &request));
      } else {
        void* data[1] = {buffers[slot].data()};
        size_t sizes[1] = {kMessageBytes};
        int tags[1] = {0};
        void* mh[1] = {mhandles[slot]};
        ROLE_OK(api.Irecv(comm, 1, data, sizes, tags, mh, &request));
      }
    }
    requests[slot] = request;
    ++posted;
  };
  for (int slot = 0; slot < kWindow && slot < messages; ++slot) post(slot);
  while (clock.completed < messages) {
    bool moved = false;
    for (int slot = 0; slot < kWindow; ++slot) {
      if (requests[slot] == nullptr) continue;
      bool done = false;
      int sizes[1];
      ROLE_OK(api.Test(requests[slot], &done, sizes));
      if (!done) continue;
      moved = true;
      requests[slot] = nullptr;
      clock.Complete();
      if (posted < messages) post(slot);
    }
    if (!moved) sched_yield();  // What NCCL's proxy thread does when idle.
  }
  char byte = 'd';
  if (sender) {
    ReadAll(fd, &byte, 1);
  } else {
    clock.Report(messages);
    WriteAll(fd, &byte, 1);
  }
  for (void* mhandle : mhandles) ROLE_OK(api.DeregMr(comm, mhandle));
  ROLE_OK(sender ? api.CloseSend(comm) : api.CloseRecv(comm));
  if (listen != nullptr) ROLE_OK(api.CloseListen(listen));
  ROLE_OK(api.Finalize(ctx));
  return 0;
}

int RunRole(const Args& args) {
  alarm(600);
  // Each process on its own core when the machine has two or more (both kinds alike), so that
  // the two processes do not contend for a core and NCCL-style sched_yield() polling yields to
  // the process's own transport threads.
  if (args.count("cpu")) {
    const int cpu = std::stoi(args.at("cpu")) % std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  const std::string role = args.at("role");
  if (role == "transport_send") return TransportRole(args, true);
  if (role == "transport_recv") return TransportRole(args, false);
  if (role == "plugin_send") return PluginRole(args, true);
  if (role == "plugin_recv") return PluginRole(args, false);
  Fail("unknown role " + role);
}

// ---- The driver ---------------------------------------------------------------------------------

pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            int close_fd, int stdout_fd) {
  int error = 0;
  return testing::Spawn(argv, env, close_fd, stdout_fd, &error);
}

// Waits for `pid`; adds its CPU seconds (user + system) to *cpu_seconds when given.
bool WaitOk(pid_t pid, double* cpu_seconds = nullptr) {
  int status = 0;
  if (pid <= 0) return false;
  rusage usage{};
  while (wait4(pid, &status, 0, &usage) < 0) {
    if (errno != EINTR) return false;
  }
  if (cpu_seconds != nullptr) {
    *cpu_seconds += usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 +
                    usage.ru_stime.tv_sec + usage.ru_stime.tv_usec * 1e-6;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

struct Link {
  std::vector<std::string> env;
  std::string sender_ip;
  std::string receiver_ip;
  std::string testbed_name;  // Empty: run directly.
  int messages = 0;
};

// One measured transfer; bytes per second at the receiver, or an error.
absl::StatusOr<double> RunOnce(const std::string& kind, const Link& link) {
  int pair[2];
  int out[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0 || pipe(out) != 0) {
    return absl::InternalError("socketpair/pipe");
  }
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {  // 0 sends, 1 receives.
    const bool receiver = rank == 1;
    std::vector<std::string> argv = {
        g_self, "--role=" + kind + (receiver ? "_recv" : "_send"),
        absl::StrCat("--fd=", pair[rank]), absl::StrCat("--messages=", link.messages),
        "--plugin=" + g_plugin, "--ip=" + (receiver ? link.receiver_ip : link.sender_ip),
        g_pin ? absl::StrCat("--cpu=", rank) : std::string("--cpu_unpinned=1")};
    if (!link.testbed_name.empty()) {
      std::vector<std::string> wrapped = {g_testbed, "exec", "--name", link.testbed_name,
                                          absl::StrCat(rank), "--"};
      wrapped.insert(wrapped.end(), argv.begin(), argv.end());
      argv = wrapped;
    }
    std::vector<std::string> env = link.env;
    env.push_back("LBCC_PLUGIN_DEVICES=" + (receiver ? link.receiver_ip : link.sender_ip));
    pids[rank] = Spawn(argv, env, pair[1 - rank], receiver ? out[1] : -1);
  }
  close(pair[0]);
  close(pair[1]);
  close(out[1]);
  std::string text;
  char chunk[256];
  ssize_t n;
  while ((n = read(out[0], chunk, sizeof(chunk))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) text.append(chunk, static_cast<size_t>(n));
  }
  close(out[0]);
  double cpu = 0;
  const bool sent = WaitOk(pids[0], &cpu);
  const bool received = WaitOk(pids[1], &cpu);
  double bytes = 0, seconds = 0;
  if (!sent || !received || std::sscanf(text.c_str(), "RESULT %lf %lf", &bytes, &seconds) != 2 ||
      seconds <= 0) {
    return absl::InternalError(absl::StrCat(kind, " run failed (sender ", sent ? "ok" : "failed",
                                            ", receiver ", received ? "ok" : "failed", ")"));
  }
  std::fprintf(stderr, "  %-9s %.3f Gbit/s, %.2f CPU s for both processes\n", kind.c_str(),
               bytes / seconds * 8e-9, cpu);
  return bytes / seconds;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Alternates transport and plugin runs; sets the counters; false (and skips) on failure.
bool Compare(benchmark::State& state, const Link& link, double shaped_bits_per_second) {
  double load[1] = {0};
  getloadavg(load, 1);
  std::vector<double> transport_rates, plugin_rates;
  const absl::Time start = absl::Now();
  for (int round = 0; round < g_rounds; ++round) {
    for (const char* kind : {"transport", "plugin"}) {
      absl::StatusOr<double> rate = RunOnce(kind, link);
      if (!rate.ok()) {
        state.SkipWithError(std::string(rate.status().message()).c_str());
        return false;
      }
      (std::string(kind) == "transport" ? transport_rates : plugin_rates).push_back(*rate);
    }
  }
  const double transport = Median(transport_rates);
  const double plugin = Median(plugin_rates);
  state.SetIterationTime(absl::ToDoubleSeconds(absl::Now() - start));
  state.SetBytesProcessed(static_cast<int64_t>(plugin));  // Per one-second "iteration".
  state.counters["load1"] = load[0];
  state.counters["transport_Gbit/s"] = transport * 8e-9;
  state.counters["plugin_Gbit/s"] = plugin * 8e-9;
  state.counters["plugin_to_transport"] = plugin / transport;
  if (shaped_bits_per_second > 0) {
    state.counters["plugin_to_shaped"] = plugin * 8 / shaped_bits_per_second;
    state.counters["transport_to_shaped"] = transport * 8 / shaped_bits_per_second;
  }
  return true;
}

void BM_Loopback4MiB(benchmark::State& state) {
  Link link;
  link.env = {"UCX_TLS=tcp", "LBCC_LINK_CLASS=fast"};
  link.sender_ip = link.receiver_ip = "127.0.0.1";
  link.messages = 1000;
  for (auto _ : state) {
    if (!Compare(state, link, 0)) return;
  }
}
BENCHMARK(BM_Loopback4MiB)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

std::string RunTestbed(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {g_testbed};
  argv.insert(argv.end(), args.begin(), args.end());
  return WaitOk(Spawn(argv, {}, -1, -1)) ? "ok" : "failed";
}

void BM_Testbed100Mbit4MiB(benchmark::State& state) {
  if (g_testbed.empty()) {
    state.SkipWithError("no testbed script (--testbed=path/to/tools/testbed/testbed)");
    return;
  }
  if (RunTestbed({"check"}) != "ok") {
    state.SkipWithError("testbed check failed (needs root and iproute2)");
    return;
  }
  RunTestbed({"down", "--stale"});
  Link link;
  link.testbed_name = absl::StrCat("plgb", getpid());
  if (RunTestbed({"up", "--name", link.testbed_name, "--hosts", "2", "--rate", "100mbit",
                  "--slow", "1", "--owner-pid", absl::StrCat(getpid())}) != "ok") {
    state.SkipWithError("testbed up failed");
    return;
  }
  link.env = {"UCX_TLS=tcp", "LBCC_SLOW_STRIPES=2"};
  link.sender_ip = "10.77.0.1";
  link.receiver_ip = "10.77.0.2";
  link.messages = 40;
  for (auto _ : state) {
    if (!Compare(state, link, 100e6)) break;
  }
  RunTestbed({"down", "--name", link.testbed_name});
}
BENCHMARK(BM_Testbed100Mbit4MiB)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace lbcc::plugin

int main(int argc, char** argv) {
  using namespace lbcc::plugin;  // NOLINT
  Args args;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos &&
        arg.rfind("--benchmark_", 0) != 0) {
      args[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (args.count("role")) return RunRole(args);
  char self[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return 2;
  g_self.assign(self, static_cast<size_t>(length));
  // The plugin sits next to this binary in bazel-bin (or give --plugin=).
  std::string plugin = args.count("plugin") ? args["plugin"]
                                            : g_self.substr(0, g_self.rfind('/')) +
                                                  "/libnccl-net-lbcc.so";
  char resolved[PATH_MAX];
  if (realpath(plugin.c_str(), resolved) == nullptr) {
    std::fprintf(stderr, "no plugin at %s (--plugin=)\n", plugin.c_str());
    return 2;
  }
  g_plugin = resolved;
  // --testbed=, else the script in this binary's runfiles (bazel run).
  const std::string testbed =
      args.count("testbed") ? args["testbed"]
                            : g_self + ".runfiles/lbcc/tools/testbed/testbed";
  if (realpath(testbed.c_str(), resolved) != nullptr) g_testbed = resolved;
  if (args.count("rounds")) g_rounds = std::max(1, std::stoi(args["rounds"]));
  if (args.count("pin")) g_pin = args["pin"] != "0";
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
