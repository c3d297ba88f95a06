#include "transport/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/env.h"

extern char** environ;

namespace lbcc::transport::testing {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              const std::vector<std::string>& env) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const std::string& extra : env) {
    const std::string name = extra.substr(0, extra.find('=') + 1);
    for (auto it = env_strings.begin(); it != env_strings.end();) {
      it = it->rfind(name, 0) == 0 ? env_strings.erase(it) : it + 1;
    }
    env_strings.push_back(extra);
  }
  std::vector<char*> c_env, c_argv;
  for (std::string& s : env_strings) c_env.push_back(s.data());
  c_env.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& s : argv_copy) c_argv.push_back(s.data());
  c_argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, c_argv[0], &actions, nullptr, c_argv.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (rc != 0) {
    close(pipe_fds[0]);
    return absl::NotFoundError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid, pipe_fds[0]));
}

Subprocess::~Subprocess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  close(out_);
}

void Subprocess::Kill(int signal) {
  if (!reaped_) kill(pid_, signal);
}

absl::StatusOr<bool> Subprocess::Fill(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("child output");
  pollfd fd{out_, POLLIN, 0};
  const int n = poll(&fd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
  if (n == 0) return absl::DeadlineExceededError("child output");
  if (n < 0) {
    if (errno == EINTR) return true;
    return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
  }
  char chunk[4096];
  const ssize_t got = read(out_, chunk, sizeof(chunk));
  if (got < 0) {
    if (errno == EINTR) return true;
    return absl::InternalError(absl::StrCat("read: ", std::strerror(errno)));
  }
  if (got == 0) return false;
  buffer_.append(chunk, static_cast<size_t>(got));
  output_.append(chunk, static_cast<size_t>(got));
  return true;
}

absl::StatusOr<std::string> Subprocess::ReadLine(
    const std::function<bool(const std::string&)>& match, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    size_t newline;
    while ((newline = buffer_.find('\n')) != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      if (match(line)) return line;
    }
    absl::StatusOr<bool> more = Fill(deadline);
    if (!more.ok()) return more.status();
    if (!*more) return absl::UnavailableError("child closed its output");
  }
}

absl::StatusOr<std::string> Subprocess::ReadAll(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<bool> more = Fill(deadline);
    if (!more.ok()) return more.status();
    if (!*more) break;
  }
  std::string rest = std::move(buffer_);
  buffer_.clear();
  return rest;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!reaped_) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("child still running");
    absl::SleepFor(absl::Milliseconds(10));  // Polling for the child's exit.
  }
  return exit_code_;
}

absl::StatusOr<std::string> Run(const std::vector<std::string>& argv, absl::Duration timeout,
                                const std::vector<std::string>& env) {
  absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(argv, env);
  if (!child.ok()) return child.status();
  absl::StatusOr<std::string> out = (*child)->ReadAll(timeout);
  if (!out.ok()) {
    return absl::Status(out.status().code(),
                        absl::StrCat(absl::StrJoin(argv, " "), ": ", out.status().message()));
  }
  absl::StatusOr<int> code = (*child)->Wait(timeout);
  if (!code.ok()) return code.status();
  if (*code != 0) {
    return absl::UnknownError(
        absl::StrCat(absl::StrJoin(argv, " "), " exited with ", *code, "; output: ", *out));
  }
  return out;
}

std::string RunfilePath(const std::string& path, const char* argv0) {
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const std::optional<std::string> dir = env::GetForeign(var); dir && !dir->empty()) {
      const std::string candidate = absl::StrCat(*dir, "/lbcc/", path);
      if (access(candidate.c_str(), F_OK) == 0) return candidate;
    }
  }
  if (argv0 != nullptr) {
    const std::string candidate = absl::StrCat(argv0, ".runfiles/lbcc/", path);
    if (access(candidate.c_str(), F_OK) == 0) return candidate;
  }
  return path;
}

}  // namespace lbcc::transport::testing
