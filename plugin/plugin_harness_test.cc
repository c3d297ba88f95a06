// The NCCL-like harness: loads the built libnccl-net-lbcc.so the way NCCL does and drives it the
// way NCCL's proxy threads do, without GPUs.
//
//   - dlopen(RTLD_NOW) (no undefined symbols), the four exported tables and nothing else, their
//     names and function pointers;
//   - per version, two processes (this binary re-executed with --role=...) that exchange listen
//     handles over a socket pair (NCCL's bootstrap), loop connect/accept, register host buffers,
//     run thousands of isend/irecv both ways from 0 B to 64 MiB with grouped receives and 32
//     requests in flight, check every byte, and close with requests pending;
//   - self-connect and bad input per version, a peer that dies, a device configured slow (striped,
//     paced), and (plugin_testbed_test, as root) the same traffic over a 100 Mbit/s link of
//     tools/testbed.
//
// The children report on stderr (the test log) and by exit status; each arms alarm() so that a
// hang ends as a failure, never as a stuck test.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <elf.h>
#include <dlfcn.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "plugin/nccl_net.h"
#include "plugin/testing/plugin_api.h"
#include "plugin/testing/socket_io.h"
#include "plugin/testing/spawn.h"
#include "plugin/testing/traffic.h"

namespace lbcc::plugin::testing {
namespace {

std::string g_plugin_path;  // Absolute path of the .so (from --plugin=).
std::string g_self_path;    // This binary.

// ---------------------------------------------------------------------------------------------
// Children.

using Args = std::map<std::string, std::string>;

std::string Arg(const Args& args, const std::string& key, const std::string& fallback = "") {
  auto it = args.find(key);
  return it == args.end() ? fallback : it->second;
}
int IntArg(const Args& args, const std::string& key, int fallback) {
  int value = fallback;
  if (!absl::SimpleAtoi(Arg(args, key), &value)) return fallback;
  return value;
}

std::string g_who = "child";

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "[%s] FAILED: %s\n", g_who.c_str(), message.c_str());
  std::fflush(stderr);
  std::exit(1);
}
void Say(const std::string& message) {
  std::fprintf(stderr, "[%s] %s\n", g_who.c_str(), message.c_str());
}

#define CHILD_CHECK(cond, message)                                                   \
  do {                                                                               \
    if (!(cond)) Die(absl::StrCat(#cond, " (line ", __LINE__, "): ", message));     \
  } while (0)
#define CHILD_OK(expr)                                                               \
  do {                                                                               \
    absl::Status child_status_ = (expr);                                             \
    if (!child_status_.ok()) {                                                       \
      Die(absl::StrCat(#expr, " (line ", __LINE__, "): ", child_status_.ToString())); \
    }                                                                                \
  } while (0)

void WriteAll(int fd, const void* data, size_t size) {
  if (!WriteFully(fd, data, size)) Die("peer socket write failed (peer gone?)");
}
void ReadAll(int fd, void* data, size_t size) {
  if (!ReadFully(fd, data, size)) Die("peer socket closed early (peer failed?)");
}
void Barrier(int fd) {
  char byte = 'b';
  WriteAll(fd, &byte, 1);
  ReadAll(fd, &byte, 1);
}

std::unique_ptr<PluginApi> LoadOrDie(const Args& args) {
  absl::StatusOr<std::unique_ptr<PluginApi>> api =
      PluginApi::Load(Arg(args, "plugin"), IntArg(args, "version", 0));
  CHILD_OK(api.status());
  return std::move(*api);
}

void CheckProperties(PluginApi& api, int dev, const Args& args) {
  Properties props;
  CHILD_OK(api.GetProperties(dev, &props));
  CHILD_CHECK(!props.name.empty(), "device name");
  // Host memory always; CUDA memory too when the .so was built with CUDA and a device is visible.
  CHILD_CHECK((props.ptr_support & ~LBCC_NCCL_PTR_CUDA) == LBCC_NCCL_PTR_HOST, props.ptr_support);
  CHILD_CHECK(props.max_recvs >= 8, props.max_recvs);
  CHILD_CHECK(props.max_comms >= 1024, props.max_comms);
  CHILD_CHECK(props.speed > 0, props.speed);
  CHILD_CHECK(props.latency >= 0, props.latency);
  CHILD_CHECK(props.net_device_type == LBCC_NCCL_NET_DEVICE_HOST, props.net_device_type);
  CHILD_CHECK(props.net_device_version == 0, props.net_device_version);
  CHILD_CHECK(props.reg_is_global == 0, props.reg_is_global);
  if (api.version() >= 9) {
    CHILD_CHECK(props.force_flush == 0, props.force_flush);
    CHILD_CHECK(props.vdevs == 1 && props.vdev0 == dev, props.vdevs);
    CHILD_CHECK(props.max_p2p_bytes >= (64 << 20), props.max_p2p_bytes);
    CHILD_CHECK(props.max_coll_bytes >= (64 << 20), props.max_coll_bytes);
  }
  if (api.version() == 11) CHILD_CHECK(props.max_multi_request_size >= 1, "multi");
  const int expect_speed = IntArg(args, "expect_speed", 0);
  if (expect_speed > 0) CHILD_CHECK(props.speed == expect_speed, props.speed);
  Say(absl::StrCat("dev ", dev, " ", props.name, ": ", props.speed, " Mbit/s, latency ",
                   props.latency, " us"));
}

PlanOptions PlanFromArgs(const Args& args, uint64_t seed) {
  PlanOptions options;
  options.seed = seed;
  options.groups = IntArg(args, "groups", 500);
  options.max_random_bytes = static_cast<size_t>(IntArg(args, "max_random_kib", 1024)) << 10;
  for (absl::string_view size : absl::StrSplit(Arg(args, "specials", "0,1,16777216,67108864"),
                                               ',', absl::SkipEmpty())) {
    uint64_t value = 0;
    if (absl::SimpleAtoi(size, &value)) options.special_sizes.push_back(value);
  }
  return options;
}

struct Comms {
  void* listen = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
};

// NCCL's set-up: listen, hand the handle to the peer, loop connect and accept on one thread.
Comms Establish(PluginApi& api, void* ctx, int fd, bool self) {
  Comms comms;
  std::array<uint8_t, LBCC_NCCL_NET_HANDLE_MAXSIZE> mine{}, theirs{};
  CHILD_OK(api.Listen(ctx, 0, mine.data(), &comms.listen));
  CHILD_CHECK(comms.listen != nullptr, "listen comm");
  if (self) {
    theirs = mine;
  } else {
    WriteAll(fd, mine.data(), mine.size());
    ReadAll(fd, theirs.data(), theirs.size());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  int polls = 0;
  while (comms.send == nullptr || comms.recv == nullptr) {
    if (comms.send == nullptr) CHILD_OK(api.Connect(ctx, 0, theirs.data(), &comms.send));
    if (comms.recv == nullptr) CHILD_OK(api.Accept(comms.listen, &comms.recv));
    CHILD_CHECK(absl::Now() < deadline, "connect/accept did not finish");
    ++polls;
    std::this_thread::yield();
  }
  Say(absl::StrCat("connected after ", polls, " connect/accept polls"));
  return comms;
}

// Runs `send_plan` out and `recv_plan` in on two new threads (the comms were made on this one).
void Traffic(PluginApi& api, const Comms& comms, const Plan& send_plan, const Plan& recv_plan) {
  const absl::Time deadline = absl::Now() + absl::Seconds(600);
  absl::StatusOr<TrafficStats> sent, received;
  const absl::Time start = absl::Now();
  std::thread sender([&] { sent = RunSends(api, comms.send, send_plan, 256, deadline); });
  std::thread receiver([&] { received = RunReceives(api, comms.recv, recv_plan, 32, deadline); });
  sender.join();
  receiver.join();
  CHILD_OK(sent.status());
  CHILD_OK(received.status());
  CHILD_CHECK(sent->messages == send_plan.messages, sent->messages);
  CHILD_CHECK(received->messages == recv_plan.messages, received->messages);
  CHILD_CHECK(received->bytes == recv_plan.bytes, received->bytes);
  CHILD_CHECK(received->max_in_flight == std::min<int>(32, recv_plan.groups.size()),
              received->max_in_flight);
  CHILD_CHECK(sent->null_requests == 0 && received->null_requests == 0, "null requests");
  Say(absl::StrCat("sent ", sent->messages, " messages (", sent->bytes, " bytes, largest ",
                   send_plan.largest, "), received ", received->messages, " (", received->bytes,
                   " bytes, largest ", recv_plan.largest, "), ", received->max_in_flight,
                   " grouped receives in flight, every byte checked, ",
                   absl::FormatDuration(absl::Now() - start)));
}

// NCCL's abort path: requests in flight, their memory deregistered, then the comms closed.
void CloseWithRequestsPending(PluginApi& api, const Comms& comms) {
  std::vector<std::vector<uint8_t>> buffers(8, std::vector<uint8_t>(4 << 20, 0x3c));
  std::vector<void*> send_mrs, recv_mrs;
  for (int i = 0; i < 4; ++i) {
    void* mr = nullptr;
    CHILD_OK(api.RegMr(comms.send, buffers[i].data(), buffers[i].size(), &mr));
    void* request = nullptr;
    CHILD_OK(api.Isend(comms.send, buffers[i].data(), buffers[i].size(), 900 + i, mr, &request));
    CHILD_CHECK(request != nullptr, "isend request");
    send_mrs.push_back(mr);
  }
  for (int i = 4; i < 8; ++i) {
    void* mr = nullptr;
    CHILD_OK(api.RegMr(comms.recv, buffers[i].data(), buffers[i].size(), &mr));
    void* data[1] = {buffers[i].data()};
    size_t sizes[1] = {buffers[i].size()};
    int tags[1] = {950 + i};
    void* mhandles[1] = {mr};
    void* request = nullptr;
    CHILD_OK(api.Irecv(comms.recv, 1, data, sizes, tags, mhandles, &request));
    CHILD_CHECK(request != nullptr, "irecv request");
    recv_mrs.push_back(mr);
  }
  for (void* mr : send_mrs) CHILD_OK(api.DeregMr(comms.send, mr));
  for (void* mr : recv_mrs) CHILD_OK(api.DeregMr(comms.recv, mr));
  CHILD_OK(api.CloseSend(comms.send));
  CHILD_OK(api.CloseRecv(comms.recv));
  CHILD_OK(api.CloseListen(comms.listen));
  buffers.clear();  // NCCL frees its buffers once the comms are closed.
  Say("closed with 4 sends and 4 receives in flight");
}

void CheckLogForwarding(const Args& args) {
  // INFO lines of the plugin reached NCCL's logger under the NET subsystem.
  CHILD_CHECK(Logged("flags=0x10", "NET/LBCC"), "no plugin line through the logger");
  CHILD_CHECK(Logged("NET/LBCC", "send comm to"), "no connect line");
  const std::string link = Arg(args, "expect_link");
  if (!link.empty()) {
    CHILD_CHECK(Logged("send comm to", link), absl::StrCat("no '", link, "' in the connect log"));
    // The close line names the class too ("slow link, 1094 messages, ...").
    CHILD_CHECK(Logged("closed send comm", link.substr(0, link.find(','))), "close log");
  }
  if (Arg(args, "expect_paced") == "1") {
    bool paced = false;
    for (const std::string& line : LoggedLines()) {
      if (absl::StrContains(line, "closed send comm") &&
          !absl::StrContains(line, " 0 pacing waits")) {
        paced = true;
      }
    }
    CHILD_CHECK(paced, "the slow link never paced");
  }
}

int RolePair(const Args& args) {
  const int rank = IntArg(args, "rank", 0);
  const int fd = IntArg(args, "fd", -1);
  g_who = absl::StrCat("pair v", Arg(args, "version"), " rank ", rank);
  std::unique_ptr<PluginApi> api = LoadOrDie(args);
  CHILD_CHECK(api->name() == "LBCC", api->name());
  void* ctx = nullptr;
  void* ctx2 = nullptr;
  CHILD_OK(api->Init(0x1000 + rank, &ctx));
  if (api->version() == 11) {
    CHILD_OK(api->Init(0x2000 + rank, &ctx2));  // A second communicator: reference counted.
    CHILD_CHECK(ctx != nullptr && ctx2 != nullptr && ctx != ctx2, "contexts");
  }
  int ndev = 0;
  CHILD_OK(api->Devices(&ndev));
  CHILD_CHECK(ndev >= 1, ndev);
  CheckProperties(*api, 0, args);
  Properties ignored;
  CHILD_CHECK(!api->GetProperties(ndev, &ignored).ok(), "getProperties past the last device");

  Comms comms = Establish(*api, ctx, fd, /*self=*/false);
  void* flush = &flush;
  CHILD_OK(api->Iflush(comms.recv, &flush));
  CHILD_CHECK(flush == nullptr, "host memory needs no flush request");
  if (Arg(args, "expect_measured_slow") == "1") {
    // After a slow link was probed the device reports the measured rate, not the interface's.
    Properties props;
    CHILD_OK(api->GetProperties(0, &props));
    Say(absl::StrCat("dev 0 after connecting: ", props.speed, " Mbit/s, latency ",
                     props.latency, " us"));
    CHILD_CHECK(props.speed > 0 && props.speed < 1000, props.speed);
  }

  const Plan send_plan = MakePlan(PlanFromArgs(args, 100 + rank));
  const Plan recv_plan = MakePlan(PlanFromArgs(args, 100 + (1 - rank)));
  Traffic(*api, comms, send_plan, recv_plan);
  Barrier(fd);  // Both received everything before anyone closes.
  CloseWithRequestsPending(*api, comms);
  CheckLogForwarding(args);

  if (api->version() == 11) {
    CHILD_OK(api->Finalize(ctx2));
    CHILD_OK(api->Devices(&ndev));  // Still initialized: ctx holds a reference.
    CHILD_OK(api->Finalize(ctx));
    CHILD_CHECK(!api->Devices(&ndev).ok(), "devices after the last finalize");
    void* again = nullptr;
    CHILD_OK(api->Init(0x3000 + rank, &again));  // A fresh start after the last finalize.
    CHILD_OK(api->Devices(&ndev));
    CHILD_OK(api->Finalize(again));
  }
  Say("ok");
  return 0;
}

int RoleSelf(const Args& args) {
  g_who = absl::StrCat("self v", Arg(args, "version"));
  std::unique_ptr<PluginApi> api = LoadOrDie(args);
  void* ctx = nullptr;
  CHILD_OK(api->Init(0x77, &ctx));
  // One thread: listen, then connect to our own handle and accept, interleaved.
  Comms comms = Establish(*api, ctx, -1, /*self=*/true);
  const Plan plan = MakePlan(PlanFromArgs(args, 7));
  const absl::Time deadline = absl::Now() + absl::Seconds(300);
  absl::StatusOr<TrafficStats> sent;
  std::thread sender([&] { sent = RunSends(*api, comms.send, plan, 256, deadline); });
  absl::StatusOr<TrafficStats> received = RunReceives(*api, comms.recv, plan, 32, deadline);
  sender.join();
  CHILD_OK(sent.status());
  CHILD_OK(received.status());
  CHILD_CHECK(received->messages == plan.messages, received->messages);
  Say(absl::StrCat("self-connected, ", received->messages, " messages checked"));

  // Bad input: errors, never crashes.
  std::array<uint8_t, LBCC_NCCL_NET_HANDLE_MAXSIZE> junk{};
  void* out = nullptr;
  CHILD_CHECK(!api->Connect(ctx, 0, junk.data(), &out).ok() && out == nullptr, "junk handle");
  CHILD_CHECK(!api->Listen(ctx, 99, junk.data(), &out).ok(), "bad device");
  Properties props;
  CHILD_CHECK(!api->GetProperties(-1, &props).ok(), "negative device");
  std::vector<uint8_t> buffer(64);
  void* request = &request;
  CHILD_CHECK(!api->Isend(nullptr, buffer.data(), 1, 0, nullptr, &request).ok(), "null comm");
  CHILD_CHECK(request == nullptr, "request cleared on error");
  void* data[9] = {buffer.data()};
  size_t sizes[9] = {1};
  int tags[9] = {};
  CHILD_CHECK(!api->Irecv(comms.recv, 0, data, sizes, tags, nullptr, &request).ok(), "n = 0");
  CHILD_CHECK(!api->Irecv(comms.recv, 9, data, sizes, tags, nullptr, &request).ok(), "n = 9");
  CHILD_CHECK(!api->Irecv(comms.send, 1, data, sizes, tags, nullptr, &request).ok(), "kind");
  bool done = false;
  CHILD_CHECK(!api->Test(nullptr, &done, nullptr).ok(), "null request");
  void* mr = nullptr;
  auto* net = static_cast<const ncclNet_v8_t*>(api->table());  // regMr has one signature.
  CHILD_CHECK(net->regMr(comms.send, buffer.data(), 64, LBCC_NCCL_PTR_CUDA, &mr) ==
                  lbccNcclInternalError,
              "CUDA memory in a host-only build");
  CHILD_CHECK(!api->DeregMr(comms.send, buffer.data()).ok(), "unknown mhandle");
  if (api->version() == 8) {
    CHILD_CHECK(api->RawIsendV8(comms.send, buffer.data(), -1, 0, nullptr, &request) ==
                    lbccNcclInternalError,
                "negative size");
  }
  if (api->version() == 11) {
    uint64_t not_a_context = 0;
    CHILD_CHECK(!api->Listen(&not_a_context, 0, junk.data(), &out).ok(), "foreign ctx");
  }
  CHILD_OK(api->CloseSend(comms.send));
  CHILD_CHECK(!api->CloseSend(comms.send).ok(), "double close");
  CHILD_CHECK(!api->CloseRecv(nullptr).ok(), "null close");
  CHILD_OK(api->CloseRecv(comms.recv));
  CHILD_OK(api->CloseListen(comms.listen));
  if (api->version() == 11) CHILD_OK(api->Finalize(ctx));
  Say("ok");
  return 0;
}

// Rank 1 dies with rank 0's receive pending; rank 0's test() must fail, not hang.
int RoleDeadPeer(const Args& args) {
  const int rank = IntArg(args, "rank", 0);
  const int fd = IntArg(args, "fd", -1);
  g_who = absl::StrCat("deadpeer rank ", rank);
  std::unique_ptr<PluginApi> api = LoadOrDie(args);
  void* ctx = nullptr;
  CHILD_OK(api->Init(0x99, &ctx));
  Comms comms = Establish(*api, ctx, fd, /*self=*/false);
  if (rank == 1) {
    char byte;
    ReadAll(fd, &byte, 1);  // Rank 0 posted its receive.
    Say("exiting without closing anything");
    std::fflush(stderr);
    _exit(0);
  }
  std::vector<uint8_t> buffer(1 << 20);
  void* mr = nullptr;
  CHILD_OK(api->RegMr(comms.recv, buffer.data(), buffer.size(), &mr));
  void* data[1] = {buffer.data()};
  size_t sizes[1] = {buffer.size()};
  int tags[1] = {5};
  void* mhandles[1] = {mr};
  void* request = nullptr;
  CHILD_OK(api->Irecv(comms.recv, 1, data, sizes, tags, mhandles, &request));
  char byte = 'p';
  WriteAll(fd, &byte, 1);
  const absl::Time start = absl::Now();
  absl::Status status;
  bool done = false;
  while (status.ok() && !done) {
    status = api->Test(request, &done, nullptr);
    CHILD_CHECK(absl::Now() - start < absl::Seconds(100), "test() never reported the dead peer");
    std::this_thread::yield();
  }
  CHILD_CHECK(!status.ok(), "a receive from a dead peer completed");
  CHILD_CHECK(absl::StrContains(status.message(), "ncclSystemError"), status.ToString());
  Say(absl::StrCat("test() reported the dead peer after ",
                   absl::FormatDuration(absl::Now() - start), ": ", status.message()));
  // Sending to it fails too (at once or at test()), and everything still closes.
  std::vector<uint8_t> out(4096);
  void* send_request = nullptr;
  absl::Status sent = api->Isend(comms.send, out.data(), out.size(), 1, nullptr, &send_request);
  while (sent.ok() && send_request != nullptr) {
    bool finished = false;
    sent = api->Test(send_request, &finished, nullptr);
    if (finished) break;
    CHILD_CHECK(absl::Now() - start < absl::Seconds(100), "send to a dead peer never ended");
    std::this_thread::yield();
  }
  CHILD_OK(api->DeregMr(comms.recv, mr));
  CHILD_OK(api->CloseSend(comms.send));
  CHILD_OK(api->CloseRecv(comms.recv));
  CHILD_OK(api->CloseListen(comms.listen));
  CHILD_OK(api->Finalize(ctx));
  Say("ok");
  return 0;
}

// A configuration the plugin cannot use: init fails cleanly (NCCL then drops the plugin).
int RoleInitFails(const Args& args) {
  g_who = absl::StrCat("initfails v", Arg(args, "version"));
  std::unique_ptr<PluginApi> api = LoadOrDie(args);
  void* ctx = &ctx;
  absl::Status status = api->Init(1, &ctx);
  CHILD_CHECK(absl::StrContains(status.message(), "ncclInternalError"), status.ToString());
  CHILD_CHECK(ctx == nullptr, "context left set after a failed init");
  int ndev = 0;
  CHILD_CHECK(!api->Devices(&ndev).ok(), "devices after a failed init");
  CHILD_CHECK(Logged("NET/LBCC", Arg(args, "expect_log")), "the reason was not logged");
  Say("ok");
  return 0;
}

int RunRole(const Args& args) {
  // A hang ends as a failure (SIGALRM) instead of a stuck test.
  alarm(static_cast<unsigned>(IntArg(args, "alarm_s", 600)));
  const std::string role = Arg(args, "role");
  if (role == "pair") return RolePair(args);
  if (role == "self") return RoleSelf(args);
  if (role == "deadpeer") return RoleDeadPeer(args);
  if (role == "initfails") return RoleInitFails(args);
  Die(absl::StrCat("unknown role ", role));
}

// ---------------------------------------------------------------------------------------------
// The parent: spawns children and waits for them.

// Runs `argv` with `env` added to this process's environment; `keep_fd` stays open in it (the
// other end of its socket pair, `close_fd`, does not).
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            int close_fd = -1) {
  int error = 0;
  const pid_t pid = testing::Spawn(argv, env, close_fd, /*stdout_fd=*/-1, &error);
  if (pid < 0) ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << std::strerror(error);
  return pid;
}

// The child's exit status as text ("exit 0", "signal 14").
std::string Wait(pid_t pid) {
  if (pid <= 0) return "not started";
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return "waitpid failed";
  }
  if (WIFEXITED(status)) return absl::StrCat("exit ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return "unknown";
}

std::vector<std::string> ChildArgv(const std::string& role, int version,
                                   const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {g_self_path, "--role=" + role,
                                   absl::StrCat("--version=", version),
                                   "--plugin=" + g_plugin_path};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// Two children joined by a socket pair; `wrap(rank, argv)` may prefix a launcher (testbed).
void RunPair(const std::string& role, int version, const std::vector<std::string>& extra,
             const std::vector<std::string>& env,
             std::function<std::vector<std::string>(int, std::vector<std::string>)> wrap = {},
             const std::vector<std::vector<std::string>>& rank_env = {{}, {}}) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> args = extra;
    args.push_back(absl::StrCat("--rank=", rank));
    args.push_back(absl::StrCat("--fd=", fds[rank]));
    std::vector<std::string> argv = ChildArgv(role, version, args);
    if (wrap) argv = wrap(rank, argv);
    std::vector<std::string> child_env = env;
    child_env.insert(child_env.end(), rank_env[rank].begin(), rank_env[rank].end());
    pids[rank] = Spawn(argv, child_env, fds[1 - rank]);
  }
  close(fds[0]);
  close(fds[1]);
  const std::string first = Wait(pids[0]);
  const std::string second = Wait(pids[1]);
  EXPECT_EQ(first, "exit 0") << "rank 0 (see its lines above)";
  EXPECT_EQ(second, "exit 0") << "rank 1 (see its lines above)";
}

const std::vector<std::string> kLoopbackEnv = {"LBCC_DEBUG=INFO", "LBCC_PLUGIN_DEVICES=127.0.0.1",
                                               "UCX_MEM_EVENTS=no"};

// ---------------------------------------------------------------------------------------------
// Loading.

// Names of the defined global symbols in the ELF file's dynamic symbol table.
std::vector<std::string> ExportedSymbols(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> names;
  if (image.size() < sizeof(Elf64_Ehdr)) return names;
  Elf64_Ehdr header;
  std::memcpy(&header, image.data(), sizeof(header));
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64)
    return names;
  if (header.e_shoff + header.e_shnum * sizeof(Elf64_Shdr) > image.size()) return names;
  std::vector<Elf64_Shdr> sections(header.e_shnum);
  std::memcpy(sections.data(), image.data() + header.e_shoff, header.e_shnum * sizeof(Elf64_Shdr));
  for (const Elf64_Shdr& section : sections) {
    if (section.sh_type != SHT_DYNSYM || section.sh_link >= sections.size()) continue;
    const Elf64_Shdr& strings = sections[section.sh_link];
    for (size_t offset = 0; offset + sizeof(Elf64_Sym) <= section.sh_size;
         offset += sizeof(Elf64_Sym)) {
      Elf64_Sym symbol;
      std::memcpy(&symbol, image.data() + section.sh_offset + offset, sizeof(symbol));
      const int binding = ELF64_ST_BIND(symbol.st_info);
      if (symbol.st_shndx == SHN_UNDEF || (binding != STB_GLOBAL && binding != STB_WEAK)) continue;
      if (strings.sh_offset + symbol.st_name >= image.size()) continue;
      names.emplace_back(image.data() + strings.sh_offset + symbol.st_name);
    }
  }
  return names;
}

TEST(PluginLoadTest, DlopenNowFindsFourTablesAndNothingElseIsExported) {
  void* library = dlopen(g_plugin_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(library, nullptr) << dlerror();
  for (int version = 8; version <= 11; ++version) {
    const std::string symbol = absl::StrCat("ncclNetPlugin_v", version);
    const void* table = dlsym(library, symbol.c_str());
    ASSERT_NE(table, nullptr) << symbol;
    // Every version starts with the name, and the v8 functions in the same order.
    const auto* v8 = static_cast<const ncclNet_v8_t*>(table);
    EXPECT_STREQ(v8->name, "LBCC") << symbol;
    const void* required[] = {
        reinterpret_cast<const void*>(v8->init),     reinterpret_cast<const void*>(v8->devices),
        reinterpret_cast<const void*>(v8->getProperties),
        reinterpret_cast<const void*>(v8->listen),   reinterpret_cast<const void*>(v8->connect),
        reinterpret_cast<const void*>(v8->accept),   reinterpret_cast<const void*>(v8->regMr),
        reinterpret_cast<const void*>(v8->deregMr),  reinterpret_cast<const void*>(v8->isend),
        reinterpret_cast<const void*>(v8->irecv),    reinterpret_cast<const void*>(v8->iflush),
        reinterpret_cast<const void*>(v8->test),     reinterpret_cast<const void*>(v8->closeSend),
        reinterpret_cast<const void*>(v8->closeRecv),
        reinterpret_cast<const void*>(v8->closeListen)};
    for (const void* function : required) EXPECT_NE(function, nullptr) << symbol;
    // Optional entries NCCL tests for null: no DMA-BUF, no device offload.
    EXPECT_EQ(v8->regMrDmaBuf, nullptr);
    EXPECT_EQ(v8->getDeviceMr, nullptr);
    EXPECT_EQ(v8->irecvConsumed, nullptr);
  }
  EXPECT_EQ(static_cast<const ncclNet_v9_t*>(dlsym(library, "ncclNetPlugin_v9"))->makeVDevice,
            nullptr);
  const auto* v11 = static_cast<const ncclNet_v11_t*>(dlsym(library, "ncclNetPlugin_v11"));
  EXPECT_NE(v11->finalize, nullptr);
  EXPECT_NE(v11->setNetAttr, nullptr);
  EXPECT_EQ(dlsym(library, "ncclNetPlugin_v12"), nullptr);
  EXPECT_EQ(dlsym(library, "ncclNetPlugin_v7"), nullptr);

  std::vector<std::string> exported = ExportedSymbols(g_plugin_path);
  std::sort(exported.begin(), exported.end());
  EXPECT_EQ(absl::StrJoin(exported, " "),
            "ncclNetPlugin_v10 ncclNetPlugin_v11 ncclNetPlugin_v8 ncclNetPlugin_v9");
  // Not dlclose()d: UCX, which the plugin pulls in, leaves its load-time allocations behind when
  // unloaded, and LeakSanitizer would report them. Unloading is exercised by the children, whose
  // plugin is unloaded at exit.
}

// ---------------------------------------------------------------------------------------------
// Per version.

class PluginVersionTest : public ::testing::TestWithParam<int> {};

TEST_P(PluginVersionTest, TwoProcessesThousandsOfMessagesUpTo64MiB) {
  // v9 pins the class (no probe); the others let the transport probe the link.
  std::vector<std::string> env = kLoopbackEnv;
  if (GetParam() == 9) env.push_back("LBCC_PLUGIN_DEVICES=127.0.0.1=fast");
  RunPair("pair", GetParam(), {"--groups=500", "--expect_speed=10000"}, env);
}

TEST_P(PluginVersionTest, SelfConnectAndBadInput) {
  const pid_t pid = Spawn(ChildArgv("self", GetParam(), {"--groups=150", "--specials=0,8388608"}),
                          kLoopbackEnv);
  EXPECT_EQ(Wait(pid), "exit 0");
}

TEST_P(PluginVersionTest, InitFailsCleanlyOnBadConfiguration) {
  std::vector<std::string> env = kLoopbackEnv;
  env.push_back("LBCC_PLUGIN_DEVICES=nosuchif0");
  pid_t pid = Spawn(ChildArgv("initfails", GetParam(), {"--expect_log=nosuchif0"}), env);
  EXPECT_EQ(Wait(pid), "exit 0");
  env = kLoopbackEnv;
  env.push_back("LBCC_SLOW_STRIPES=99");
  pid = Spawn(ChildArgv("initfails", GetParam(), {"--expect_log=LBCC_SLOW_STRIPES"}), env);
  EXPECT_EQ(Wait(pid), "exit 0");
  // A rank that cannot be dialed is refused at init, saying why (docs/nat.md).
  env = kLoopbackEnv;
  env.push_back("LBCC_REACHABLE=no");
  pid = Spawn(ChildArgv("initfails", GetParam(), {"--expect_log=LBCC_REACHABLE=no"}), env);
  EXPECT_EQ(Wait(pid), "exit 0");
}

INSTANTIATE_TEST_SUITE_P(Versions, PluginVersionTest, ::testing::Values(8, 9, 10, 11),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("v", info.param);
                         });

TEST(PluginTest, DeadPeerFailsPendingRequestsInsteadOfHanging) {
  std::vector<std::string> env = kLoopbackEnv;
  env.push_back("LBCC_PEER_TIMEOUT_MS=3000");
  RunPair("deadpeer", 11, {}, env);
}

// A device configured slow: the slow-link scheduler stripes over two connections and paces at
// 800 Mbit/s (what getProperties reports); the logger shows both.
TEST(PluginTest, SlowDeviceIsStripedPacedAndReportedAtItsRate) {
  std::vector<std::string> env = kLoopbackEnv;
  env.push_back("LBCC_PLUGIN_DEVICES=127.0.0.1=slow");
  env.push_back("LBCC_SLOW_STRIPES=2");
  env.push_back("LBCC_SLOW_PACE_MBITS=800");
  RunPair("pair", 10,
          {"--groups=120", "--specials=0,8388608", "--expect_speed=800",
           "--expect_link=slow link", "--expect_paced=1"},
          env);
}

// ---------------------------------------------------------------------------------------------
// Over an emulated slow link (tools/testbed): host 0 fast, host 1 behind 100 Mbit/s.

std::string g_testbed_path;  // From --testbed= (plugin_testbed_test), else PLUGIN_TESTBED_SCRIPT.

std::string TestbedScript() {
  if (!g_testbed_path.empty()) return g_testbed_path;
  const char* script = std::getenv("PLUGIN_TESTBED_SCRIPT");
  return script != nullptr ? script : "";
}

// Runs the testbed script with `args`; its exit status.
std::string Testbed(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {TestbedScript()};
  argv.insert(argv.end(), args.begin(), args.end());
  return Wait(Spawn(argv, {}));
}

// Two emulated hosts (tools/testbed) for one test: skipped where the testbed cannot run. Up()
// brings them up (taken down again when the test ends); Wrap() runs a rank's command on its host.
class PluginTestbedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TestbedScript().empty()) {
      GTEST_SKIP() << "no testbed script (run //plugin:plugin_testbed_test, or set "
                      "PLUGIN_TESTBED_SCRIPT to tools/testbed/testbed)";
    }
    if (Testbed({"check"}) != "exit 0") {
      GTEST_SKIP() << "testbed check failed here (needs root and iproute2; see its output above)";
    }
    Testbed({"down", "--stale"});  // What a crashed run left behind.
  }
  void TearDown() override {
    if (!name_.empty()) EXPECT_EQ(Testbed({"down", "--name", name_}), "exit 0");
  }

  // `testbed up` of 2 hosts named `prefix` + this process's pid, with `args`; its exit status.
  std::string Up(const std::string& prefix, const std::vector<std::string>& args) {
    const std::string name = absl::StrCat(prefix, getpid());
    std::vector<std::string> argv = {"up", "--name", name, "--hosts", "2"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--owner-pid", absl::StrCat(getpid())});
    const std::string status = Testbed(argv);
    if (status == "exit 0") name_ = name;
    return status;
  }

  std::function<std::vector<std::string>(int, std::vector<std::string>)> Wrap() const {
    return [name = name_](int rank, std::vector<std::string> argv) {
      std::vector<std::string> wrapped = {TestbedScript(), "exec", "--name", name,
                                          absl::StrCat(rank), "--"};
      wrapped.insert(wrapped.end(), argv.begin(), argv.end());
      return wrapped;
    };
  }

 private:
  std::string name_;  // Set once up.
};

TEST_F(PluginTestbedTest, TrafficOverA100MbitLink) {
  ASSERT_EQ(Up("plg", {"--rate", "100mbit", "--slow", "1"}), "exit 0");
  // UCX over tcp only: shared memory between the two processes would bypass the shaped link.
  std::vector<std::string> env = {"LBCC_DEBUG=INFO", "UCX_MEM_EVENTS=no", "UCX_TLS=tcp",
                                  "LBCC_SLOW_STRIPES=2"};
  RunPair("pair", 11,
          {"--groups=250", "--max_random_kib=256", "--specials=0,1,67108864",
           "--expect_link=slow link, 2 stripes", "--expect_measured_slow=1"},
          env, Wrap(),
          {{"LBCC_PLUGIN_DEVICES=10.77.0.1"}, {"LBCC_PLUGIN_DEVICES=10.77.0.2"}});
}

// IPv6 devices on dual-stack hosts (testbed --ipv6: IPv4 and IPv6 on every eth0): the devices
// named by IPv6 address, bare and in brackets. UCX's tcp transport must take the device's IPv6
// address (PinUcxAddressFamily); with its default order (IPv4 first) UCX 1.13 aborted with a
// corrupted heap on the first connection.
TEST_F(PluginTestbedTest, Ipv6DevicesOnDualStackHosts) {
  ASSERT_EQ(Up("plg6", {"--ipv6"}), "exit 0");
  std::vector<std::string> env = {"LBCC_DEBUG=INFO", "UCX_MEM_EVENTS=no", "UCX_TLS=tcp",
                                  "LBCC_LINK_CLASS=fast"};
  RunPair("pair", 11, {"--groups=60", "--max_random_kib=64", "--specials=0,1,4194304"}, env,
          Wrap(), {{"LBCC_PLUGIN_DEVICES=fd77::1"}, {"LBCC_PLUGIN_DEVICES=[fd77::2]"}});
}

}  // namespace
}  // namespace lbcc::plugin::testing

int main(int argc, char** argv) {
  using namespace lbcc::plugin::testing;  // NOLINT
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.find('=') == std::string::npos) continue;
    args[arg.substr(2, arg.find('=') - 2)] = arg.substr(arg.find('=') + 1);
  }
  if (args.count("role")) return RunRole(args);

  char self[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return 2;
  g_self_path.assign(self, static_cast<size_t>(length));
  char plugin[PATH_MAX];
  if (!args.count("plugin") || realpath(args["plugin"].c_str(), plugin) == nullptr) {
    std::fprintf(stderr, "usage: %s --plugin=path/to/libnccl-net-lbcc.so\n", argv[0]);
    return 2;
  }
  g_plugin_path = plugin;
  char testbed[PATH_MAX];
  if (args.count("testbed") && realpath(args["testbed"].c_str(), testbed) != nullptr) {
    g_testbed_path = testbed;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
