// LBCC's UCX lives in its own link-map namespace (transport/ucx_api.h): with another library of
// UCX's soname already loaded into the program and exporting UCX's symbols (a stub whose every
// entry fails, standing in for HPC-X's UCX), the program's own lookups reach the stub, and the UCX
// transport still connects and moves data over tcp on the loopback device, with the stub never
// called.
#include <dlfcn.h>
#include <link.h>
#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lbcc_ucx/ucx_library.h"
#include "transport/subprocess.h"
#include "transport/test_util.h"
#include "transport/ucx_api.h"
#include "transport/ucx_transport.h"

namespace lbcc::transport {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::transport::testing::kWait;
using ::lbcc::transport::testing::RecvResult;
using ::lbcc::transport::testing::RunfilePath;
using ::lbcc::transport::testing::SendResult;
using ::testing::HasSubstr;
using ::testing::Not;

using ConfigRead = ucs_status_t (*)(const char*, const char*, ucp_config_t**);

class UcxIsolationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Into the program's namespace, global, before LBCC's UCX is loaded: later lookups of the
    // soname or of UCX's symbols in that namespace find the stub.
    const std::string path = RunfilePath("transport/libucp_stub.so");
    stub_ = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(stub_, nullptr) << dlerror();
    stub_calls_ = reinterpret_cast<int (*)()>(dlsym(stub_, "ucp_stub_calls"));
    ASSERT_NE(stub_calls_, nullptr);
  }

  static void* stub_;
  static int (*stub_calls_)();
};

void* UcxIsolationTest::stub_ = nullptr;
int (*UcxIsolationTest::stub_calls_)() = nullptr;

TEST_F(UcxIsolationTest, TheProgramsNamespaceSeesTheStub) {
  // The clash a second UCX causes: by soname and by symbol, the program gets the stub.
  void* by_soname = dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(by_soname, nullptr);
  EXPECT_EQ(by_soname, stub_);
  dlclose(by_soname);
  auto config_read = reinterpret_cast<ConfigRead>(dlsym(RTLD_DEFAULT, "ucp_config_read"));
  ASSERT_NE(config_read, nullptr);
  ucp_config_t* config = nullptr;
  const int before = stub_calls_();
  EXPECT_EQ(config_read(nullptr, nullptr, &config), UCS_ERR_UNSUPPORTED);
  EXPECT_EQ(stub_calls_(), before + 1);
}

TEST_F(UcxIsolationTest, LbccsUcxIsItsOwnCopyInItsOwnNamespace) {
  const ucx_api::LoadInfo& info = ucx_api::Info();
  ASSERT_TRUE(info.loaded) << info.error;
  EXPECT_TRUE(info.own_namespace);
  // The UCX that tools/setup builds with LBCC's patches (third_party/ucx.bzl), not the system's.
  EXPECT_EQ(info.library, LBCC_UCX_PATCHED_LIBRARY);
  EXPECT_THAT(info.library, Not(HasSubstr("stub")));
  // Its symbols are not the stub's.
  EXPECT_NE(reinterpret_cast<void*>(ucx_api::Get().ucp_config_read),
            dlsym(stub_, "ucp_config_read"));
}

TEST_F(UcxIsolationTest, TransportWorksBesideTheStub) {
  const int before = stub_calls_();
  TransportOptions options;
  options.ucx_tls = "tcp";
  options.ucx_net_devices = "lo";
  options.peer_timeout = absl::Seconds(3);
  options.link_class = LinkClass::kFast;  // No probe: the test is about the library, not speed.
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> server, NewUcxTransport(options));
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> client, NewUcxTransport(options));
  LBCC_ASSERT_OK_AND_ASSIGN(std::string address, server->Listen("127.0.0.1:0"));
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Endpoint> a, client->Connect(address, kWait));
  LBCC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Endpoint> b, server->Accept(kWait));
  // Eager and rendezvous sizes, both ways.
  for (size_t bytes : {size_t{64}, size_t{4} << 20}) {
    const std::vector<uint8_t> up = testing::Pattern(bytes, 3);
    const std::vector<uint8_t> down = testing::Pattern(bytes, 5);
    std::vector<uint8_t> at_server(bytes), at_client(bytes);
    RecvResult server_got, client_got;
    SendResult up_sent, down_sent;
    b->Recv(1, absl::MakeSpan(at_server), server_got.Callback());
    a->Recv(2, absl::MakeSpan(at_client), client_got.Callback());
    a->Send(1, up, {}, up_sent.Callback());
    b->Send(2, down, {}, down_sent.Callback());
    EXPECT_THAT(up_sent.Wait(), IsOk());
    EXPECT_THAT(down_sent.Wait(), IsOk());
    ASSERT_THAT(server_got.Wait(), IsOkAndHolds(bytes));
    ASSERT_THAT(client_got.Wait(), IsOkAndHolds(bytes));
    EXPECT_EQ(at_server, up);
    EXPECT_EQ(at_client, down);
  }
  EXPECT_EQ(stub_calls_(), before) << "LBCC's transport called the stub UCX";
}

TEST_F(UcxIsolationTest, TransportStartsOnAThreadTheProgramCreated) {
  // Such a thread has the program's C library set up, not the one of UCX's namespace (whose
  // configuration parser reads its ctype tables): ucx_api sets that one up per thread.
  TransportOptions options;
  options.ucx_tls = "tcp";
  options.ucx_net_devices = "lo";
  absl::Status status = absl::UnknownError("the thread did not run");
  std::thread thread([&] {
    absl::StatusOr<std::unique_ptr<Transport>> transport = NewUcxTransport(options);
    status = transport.status();
  });
  thread.join();
  EXPECT_THAT(status, IsOk());
}

// The size of the C library's thread-local block (its PT_TLS segment; UCX's namespace loads the
// same file).
size_t LibcTlsBytes() {
  size_t bytes = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name == nullptr || std::strstr(info->dlpi_name, "libc.so.6") == nullptr) {
          return 0;
        }
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_TLS) {
            *static_cast<size_t*>(out) = info->dlpi_phdr[i].p_memsz;
          }
        }
        return 1;
      },
      &bytes);
  return bytes;
}

// A thread created while UCX's namespace was being loaded can find its block of that
// namespace's C library thread-local storage never initialized (glibc sets a new thread's block
// up before listing the thread, a load sets up the listed threads' blocks: a thread between the
// two misses both). Such a thread is made here by zeroing a new thread's block, which is the
// state glibc leaves it in; its first UCX call must still find its locale and ctype tables
// there, and UCX's configuration parser must run on it.
TEST(UcxLoadTest, AThreadWhoseNamespaceThreadLocalsWereNeverSetUpStillRunsUcx) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // A crash must not take the suite down.
  EXPECT_EXIT(
      {
        ASSERT_TRUE(ucx_api::Info().own_namespace);
        Dl_info where;
        link_map* ucp = nullptr;
        ASSERT_NE(dladdr1(reinterpret_cast<void*>(ucx_api::Get().ucp_cleanup), &where,
                          reinterpret_cast<void**>(&ucp), RTLD_DL_LINKMAP),
                  0);
        Lmid_t lmid = LM_ID_BASE;
        ASSERT_EQ(dlinfo(ucp, RTLD_DI_LMID, &lmid), 0) << dlerror();  // a handle is its map
        void* libc = dlmopen(lmid, "libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        ASSERT_NE(libc, nullptr) << dlerror();
        const size_t bytes = LibcTlsBytes();
        ASSERT_GT(bytes, 0u);
        absl::Status status = absl::UnknownError("the thread did not run");
        std::thread thread([&] {
          void* block = nullptr;
          if (dlinfo(libc, RTLD_DI_TLS_DATA, &block) != 0 || block == nullptr) {
            status = absl::InternalError("no thread-local block of the namespace's C library");
            return;
          }
          std::memset(block, 0, bytes);
          TransportOptions options;
          options.ucx_tls = "tcp";
          options.ucx_net_devices = "lo";
          status = NewUcxTransport(options).status();
        });
        thread.join();
        std::fprintf(stderr, "transport on that thread: %s\n", status.ToString().c_str());
        std::exit(status.ok() ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "transport on that thread: OK");
}

// An atexit handler registered before UCX's first use runs before the handler that hands out
// the stand-ins from exit() on (transport/ucx_api.cc), so a transport it creates or destroys
// reaches UCX itself: one destroyed on the stand-ins would leave its worker with UCX's async
// thread, which aborts the process when libucs's destructor frees its handler table.
TEST(UcxExitTest, AtexitHandlerRegisteredBeforeUcxsFirstUseStillReachesUcx) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // A fresh process: UCX not loaded yet.
  EXPECT_EXIT(
      {
        std::atexit(+[] {
          TransportOptions options;
          options.ucx_tls = "tcp";
          options.ucx_net_devices = "lo";
          absl::StatusOr<std::unique_ptr<Transport>> transport = NewUcxTransport(options);
          if (!transport.ok()) {
            std::fprintf(stderr, "at exit: %s\n", transport.status().ToString().c_str());
            std::_Exit(3);
          }
          transport->reset();
          std::fprintf(stderr, "at exit: UCX transport created and destroyed\n");
        });
        ASSERT_TRUE(ucx_api::Info().loaded);  // UCX's first use, after that handler.
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "at exit: UCX transport created and destroyed");
}

}  // namespace
}  // namespace lbcc::transport
