// The plugin's CUDA path on a real GPU, as NCCL drives it: the built .so (v11 table) reports
// NCCL_PTR_CUDA, and messages between cudaMalloc'ed buffers, registered as NCCL_PTR_CUDA, cross a
// self-connection and a connection between two processes, grouped receives and 8 requests in
// flight, every byte checked after copying the received device buffers back (and the bytes past
// each message untouched). iflush is called after every receive as NCCL does for GPU memory.
//
// Built only with --config=cuda (cc_test tagged gpu); children exit 77 when no CUDA device is
// visible and the test then skips. kernels/gpu_check.sh-style driver: plugin/gpu_check.sh.
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "plugin/nccl_net.h"
#include "plugin/testing/plugin_api.h"
#include "plugin/testing/socket_io.h"
#include "plugin/testing/traffic.h"

namespace lbcc::plugin::testing {
namespace {

std::string g_plugin_path;
constexpr int kNoGpu = 77;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "[gpu child %d] FAILED: %s\n", getpid(), message.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}
#define GPU_OK(expr)                                                              \
  do {                                                                            \
    absl::Status s_ = (expr);                                                     \
    if (!s_.ok()) Die(absl::StrCat(#expr, " (line ", __LINE__, "): ", s_.ToString())); \
  } while (0)
#define CUDA_OK(expr)                                                             \
  do {                                                                            \
    cudaError_t e_ = (expr);                                                      \
    if (e_ != cudaSuccess) Die(absl::StrCat(#expr, ": ", cudaGetErrorString(e_))); \
  } while (0)
#define GPU_CHECK(cond, message)                                                  \
  do {                                                                            \
    if (!(cond)) Die(absl::StrCat(#cond, " (line ", __LINE__, "): ", message));   \
  } while (0)

void WriteAll(int fd, const void* data, size_t size) {
  if (!WriteFully(fd, data, size)) Die("socket write");
}
void ReadAll(int fd, void* data, size_t size) {
  if (!ReadFully(fd, data, size)) Die("socket read");
}

struct Comms {
  void* listen = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
};

Comms Establish(PluginApi& api, void* ctx, int fd) {
  Comms comms;
  std::array<uint8_t, LBCC_NCCL_NET_HANDLE_MAXSIZE> mine{}, theirs{};
  GPU_OK(api.Listen(ctx, 0, mine.data(), &comms.listen));
  if (fd < 0) {
    theirs = mine;
  } else {
    WriteAll(fd, mine.data(), mine.size());
    ReadAll(fd, theirs.data(), theirs.size());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (comms.send == nullptr || comms.recv == nullptr) {
    if (comms.send == nullptr) GPU_OK(api.Connect(ctx, 0, theirs.data(), &comms.send));
    if (comms.recv == nullptr) GPU_OK(api.Accept(comms.listen, &comms.recv));
    GPU_CHECK(absl::Now() < deadline, "connect/accept did not finish");
    std::this_thread::yield();
  }
  return comms;
}

// Sizes of the messages, in order; receives take them two at a time (grouped, n = 2).
std::vector<size_t> Sizes() {
  std::vector<size_t> sizes;
  for (int round = 0; round < 4; ++round) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{4093}, size_t{1} << 20,
                        (size_t{4} << 20) + 3, size_t{64} << 20}) {
      sizes.push_back(size);
    }
  }
  return sizes;
}

struct DeviceBuffer {
  void* data = nullptr;
  size_t size = 0;
  void* mhandle = nullptr;
};

DeviceBuffer MakeBuffer(PluginApi& api, void* comm, size_t size, int fill, uint64_t pattern) {
  DeviceBuffer buffer;
  buffer.size = size;
  CUDA_OK(cudaMalloc(&buffer.data, size > 0 ? size : 1));
  if (pattern != 0) {
    std::vector<uint8_t> host(size);
    FillPattern(pattern, absl::MakeSpan(host));
    CUDA_OK(cudaMemcpy(buffer.data, host.data(), size, cudaMemcpyHostToDevice));
  } else {
    CUDA_OK(cudaMemset(buffer.data, fill, size > 0 ? size : 1));
  }
  // cudaMemset and small pageable cudaMemcpy may still be in flight on the legacy stream; the
  // plugin copies on its own non-blocking stream, which does not wait for it. NCCL only posts
  // buffers whose contents are already in device memory: do the same.
  CUDA_OK(cudaDeviceSynchronize());
  GPU_OK(api.RegMr(comm, buffer.data, size > 0 ? size : 1, &buffer.mhandle));
  return buffer;
}

void FreeBuffer(PluginApi& api, void* comm, DeviceBuffer& buffer) {
  GPU_OK(api.DeregMr(comm, buffer.mhandle));
  CUDA_OK(cudaFree(buffer.data));
}

void WaitRequest(PluginApi& api, void* request, int* sizes, const absl::Time deadline) {
  bool done = false;
  while (!done) {
    GPU_OK(api.Test(request, &done, sizes));
    GPU_CHECK(absl::Now() < deadline, "request never finished");
    if (!done) std::this_thread::yield();
  }
}

// Every message of Sizes(), 8 sends in flight, pattern seed + index.
void Sends(PluginApi& api, void* comm, uint64_t seed) {
  const std::vector<size_t> sizes = Sizes();
  const absl::Time deadline = absl::Now() + absl::Seconds(300);
  std::deque<std::pair<void*, DeviceBuffer>> in_flight;
  for (size_t i = 0; i < sizes.size(); ++i) {
    DeviceBuffer buffer = MakeBuffer(api, comm, sizes[i], 0, seed + i);
    void* request = nullptr;
    while (request == nullptr) {
      GPU_OK(api.Isend(comm, buffer.data, sizes[i], static_cast<int>(i), buffer.mhandle,
                       &request));
      GPU_CHECK(absl::Now() < deadline, "isend never got a request");
    }
    in_flight.emplace_back(request, buffer);
    if (in_flight.size() == 8 || i + 1 == sizes.size()) {
      while (!in_flight.empty()) {
        int sent = -1;
        WaitRequest(api, in_flight.front().first, &sent, deadline);
        FreeBuffer(api, comm, in_flight.front().second);
        in_flight.pop_front();
      }
    }
  }
}

// Receives two messages per irecv into buffers 64 bytes larger than each message.
void Receives(PluginApi& api, void* comm, uint64_t seed) {
  const std::vector<size_t> sizes = Sizes();
  const absl::Time deadline = absl::Now() + absl::Seconds(300);
  for (size_t i = 0; i < sizes.size(); i += 2) {
    DeviceBuffer buffers[2];
    void* data[2];
    size_t lengths[2];
    int tags[2];
    void* mhandles[2];
    for (int k = 0; k < 2; ++k) {
      buffers[k] = MakeBuffer(api, comm, sizes[i + k] + 64, 0xee, 0);
      data[k] = buffers[k].data;
      lengths[k] = buffers[k].size;
      tags[k] = static_cast<int>(i + k);
      mhandles[k] = buffers[k].mhandle;
    }
    void* request = nullptr;
    while (request == nullptr) {
      GPU_OK(api.Irecv(comm, 2, data, lengths, tags, mhandles, &request));
      GPU_CHECK(absl::Now() < deadline, "irecv never got a request");
    }
    int got[2] = {-1, -1};
    WaitRequest(api, request, got, deadline);
    void* flush = nullptr;
    GPU_OK(api.Iflush(comm, &flush));
    if (flush != nullptr) WaitRequest(api, flush, nullptr, deadline);
    for (int k = 0; k < 2; ++k) {
      GPU_CHECK(got[k] == static_cast<int>(sizes[i + k]), got[k]);
      std::vector<uint8_t> host(buffers[k].size);
      CUDA_OK(cudaMemcpy(host.data(), buffers[k].data, host.size(), cudaMemcpyDeviceToHost));
      const int64_t bad =
          FindMismatch(seed + i + k, absl::MakeConstSpan(host.data(), sizes[i + k]));
      GPU_CHECK(bad < 0, absl::StrCat("message ", i + k, " differs at byte ", bad));
      for (size_t b = sizes[i + k]; b < host.size(); ++b) {
        GPU_CHECK(host[b] == 0xee, absl::StrCat("message ", i + k, " wrote past its end"));
      }
      FreeBuffer(api, comm, buffers[k]);
    }
  }
}

// One child: self-connected (fd < 0) or one of two peers over `fd`.
int Child(int fd, uint64_t my_seed, uint64_t peer_seed) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return kNoGpu;
  CUDA_OK(cudaSetDevice(0));
  absl::StatusOr<std::unique_ptr<PluginApi>> api = PluginApi::Load(g_plugin_path, 11);
  GPU_OK(api.status());
  void* ctx = nullptr;
  GPU_OK((*api)->Init(1, &ctx));
  Properties props;
  GPU_OK((*api)->GetProperties(0, &props));
  GPU_CHECK(props.ptr_support & LBCC_NCCL_PTR_CUDA,
            absl::StrCat("ptrSupport ", props.ptr_support, ": the plugin does not take CUDA "
                         "memory (built without --config=cuda?)"));
  (*api)->set_memory_type(LBCC_NCCL_PTR_CUDA);
  Comms comms = Establish(**api, ctx, fd);
  const absl::Time start = absl::Now();
  std::thread sender([&] {
    CUDA_OK(cudaSetDevice(0));
    Sends(**api, comms.send, my_seed);
  });
  std::thread receiver([&] {
    CUDA_OK(cudaSetDevice(0));
    Receives(**api, comms.recv, fd < 0 ? my_seed : peer_seed);
  });
  sender.join();
  receiver.join();
  std::fprintf(stderr, "[gpu child %d] %zu messages each way checked in %s\n", getpid(),
               Sizes().size(), absl::FormatDuration(absl::Now() - start).c_str());
  if (fd >= 0) {
    char byte = 'x';  // Both finished receiving before either closes.
    WriteAll(fd, &byte, 1);
    ReadAll(fd, &byte, 1);
  }
  GPU_OK((*api)->CloseSend(comms.send));
  GPU_OK((*api)->CloseRecv(comms.recv));
  GPU_OK((*api)->CloseListen(comms.listen));
  GPU_OK((*api)->Finalize(ctx));
  return 0;
}

// Forks the children before this process touches CUDA; their exit codes.
std::vector<int> RunChildren(int count) {
  int fds[2] = {-1, -1};
  if (count == 2) EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < count; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (count == 2) close(fds[1 - i]);
      std::_Exit(Child(count == 2 ? fds[i] : -1, 1000 * (i + 1), 1000 * (2 - i)));
    }
    pids.push_back(pid);
  }
  if (count == 2) {
    close(fds[0]);
    close(fds[1]);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

void Expect(const std::vector<int>& codes) {
  for (int code : codes) {
    if (code == kNoGpu) {
      GTEST_SKIP() << "no CUDA device visible";
    }
  }
  for (int code : codes) EXPECT_EQ(code, 0) << "a child failed (see its FAILED line above)";
}

TEST(PluginGpuTest, SelfConnectionBetweenDeviceBuffers) { Expect(RunChildren(1)); }

TEST(PluginGpuTest, TwoProcessesBetweenDeviceBuffers) { Expect(RunChildren(2)); }

}  // namespace
}  // namespace lbcc::plugin::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--plugin=")) {
      lbcc::plugin::testing::g_plugin_path = argv[i] + std::strlen("--plugin=");
    }
  }
  if (lbcc::plugin::testing::g_plugin_path.empty()) {
    std::fprintf(stderr, "usage: plugin_gpu_test --plugin=/path/to/libnccl-net-lbcc.so\n");
    return 2;
  }
  return RUN_ALL_TESTS();
}
