// tools/ucx/'s patches to UCX 1.13.1: ucx_async_probe drives UCX through the sequence each
// fixes; this test runs it on the UCX that tools/setup builds with the patches, which
// transport/ucx_api.cc loads, and on the system's, to show that the probe meets the bug the
// patch fixes.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lbcc_ucx/ucx_library.h"
#include "transport/subprocess.h"

namespace lbcc::transport {
namespace {

using ::lbcc::transport::testing::RunfilePath;
using ::lbcc::transport::testing::Subprocess;
using ::testing::HasSubstr;

struct ProbeResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr.
};

// The probe's `mode` with `library_path` as LD_LIBRARY_PATH (empty: the dynamic linker's
// default).
ProbeResult RunProbe(const std::string& mode, const std::string& library_path) {
  ProbeResult result;
  const std::string probe = RunfilePath("transport/ucx_async_probe");
  std::string command = "exec '" + probe + "' " + mode + " 2>&1";
  if (!library_path.empty()) command = "LD_LIBRARY_PATH='" + library_path + "' " + command;
  // UCX's fatal-error handler would otherwise print a backtrace or wait for a debugger.
  absl::StatusOr<std::unique_ptr<Subprocess>> child =
      Subprocess::Start({"/bin/sh", "-c", command}, {"UCX_HANDLE_ERRORS=none"});
  if (!child.ok()) {
    result.output = std::string(child.status().message());
    return result;
  }
  absl::StatusOr<std::string> output = (*child)->ReadAll(absl::Seconds(30));
  result.output = output.ok() ? *output : (*child)->output();
  absl::StatusOr<int> code = (*child)->Wait(absl::Seconds(10));
  if (code.ok()) result.exit_code = *code;
  return result;
}

// The probe's `mode` on the patched UCX: it ran there, through the whole sequence (exit 0),
// and printed `line`.
void ExpectPatched(const std::string& mode, const std::string& line) {
  const ProbeResult result = RunProbe(mode, LBCC_UCX_PATCHED_LIBDIR);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr(std::string("libucs: ") + LBCC_UCX_PATCHED_LIBDIR));
  EXPECT_THAT(result.output, HasSubstr(line));
}

// The probe's `mode` on the system's UCX, when it is the 1.13 the patches are for (Debian 12's
// libucx0; another skips): it printed `line` and exited with `exit_code`.
void ExpectSystem(const std::string& mode, const std::string& line, int exit_code) {
  const ProbeResult result = RunProbe(mode, "");
  if (result.output.find("ucx version: 1.13.") == std::string::npos) {
    GTEST_SKIP() << "the system's UCX is not 1.13: " << result.output;
  }
  EXPECT_THAT(result.output, ::testing::Not(HasSubstr(LBCC_UCX_PATCHED_LIBDIR)));
  EXPECT_THAT(result.output, HasSubstr(line));
  EXPECT_EQ(result.exit_code, exit_code) << result.output;
}

TEST(UcxAsyncTest, PatchedUcxDropsAStaleMissedEvent) {
  ExpectPatched("missed-event", "the removed handler ran 0 times, the new one (B's) 0");
}

TEST(UcxAsyncTest, SystemUcxAbortsOnAStaleMissedEvent) {
  ExpectSystem("missed-event", "handler->async == async", 128 + 6);  // SIGABRT.
}

TEST(UcxAsyncTest, PatchedUcxDropsAStaleMissedEventInTheSameContext) {
  ExpectPatched("missed-event-same", "the removed handler ran 0 times, the new one (A's) 0");
}

TEST(UcxAsyncTest, SystemUcxHandsAStaleEventToTheNewHandler) {
  // Within one context 1.13.1 does not abort: the new handler takes the old fd's event.
  ExpectSystem("missed-event-same", "the removed handler ran 0 times, the new one (A's) 1", 1);
}

TEST(UcxAsyncTest, PatchedUcxClosesAListenersPendingConnectionsWithIt) {
  ExpectPatched("listener", "the accepted connection is closed after the listener's destruction");
}

TEST(UcxAsyncTest, SystemUcxKeepsADestroyedListenersPendingConnection) {
  // The connection that would call the destroyed listener back once its client speaks.
  ExpectSystem("listener", "the accepted connection is open after the listener's destruction", 1);
}

}  // namespace
}  // namespace lbcc::transport
