// Child processes for multi-process tests and benchmarks: start with extra environment, read
// stdout line by line with deadlines, kill, wait. Never hangs: every wait has a deadline.
#ifndef LBCC_TRANSPORT_SUBPROCESS_H_
#define LBCC_TRANSPORT_SUBPROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lbcc::transport::testing {

class Subprocess {
 public:
  // Starts argv[0] (a path) with the current environment plus `env` ("NAME=value"). stdout is a
  // pipe read by the methods below; stderr goes to ours.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           const std::vector<std::string>& env = {});
  ~Subprocess();  // SIGKILLs and reaps a child that still runs.

  // The next stdout line for which `match` holds (earlier lines are kept in output()).
  // DeadlineExceeded after `timeout`, Unavailable at end of output.
  absl::StatusOr<std::string> ReadLine(const std::function<bool(const std::string&)>& match,
                                       absl::Duration timeout);
  // Everything until the child closes stdout.
  absl::StatusOr<std::string> ReadAll(absl::Duration timeout);
  // Exit code, or 128 + signal. DeadlineExceeded if still running after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  void Kill(int signal);
  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

 private:
  Subprocess(pid_t pid, int out) : pid_(pid), out_(out) {}
  // Reads what is available within `deadline`; false at end of output.
  absl::StatusOr<bool> Fill(absl::Time deadline);

  pid_t pid_;
  int out_;
  bool reaped_ = false;
  int exit_code_ = 0;
  std::string buffer_;  // Unconsumed stdout.
  std::string output_;  // Everything read so far.
};

// Runs argv to completion; its stdout, or an error naming the exit code.
absl::StatusOr<std::string> Run(const std::vector<std::string>& argv, absl::Duration timeout,
                                const std::vector<std::string>& env = {});

// The path of a file of this workspace in the runfiles of the running test or binary
// ("transport/transport_perf"), or the workspace-relative path when there are no runfiles.
std::string RunfilePath(const std::string& path, const char* argv0 = nullptr);

}  // namespace lbcc::transport::testing

#endif  // LBCC_TRANSPORT_SUBPROCESS_H_
