// Starting the child processes of the harness and the benchmark (posix_spawn, no fork of a
// multi-threaded parent).
#ifndef LBCC_PLUGIN_TESTING_SPAWN_H_
#define LBCC_PLUGIN_TESTING_SPAWN_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace lbcc::plugin::testing {

// Starts argv[0] (a path) with this process's environment plus `env` ("NAME=value", in order:
// a later entry replaces an earlier one). In the child `close_fd` (when >= 0, the parent's end
// of a socket pair) is closed and `stdout_fd` (when >= 0) becomes stdout. Returns the pid, or
// -1 with the posix_spawn error number in *error.
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            int close_fd, int stdout_fd, int* error);

}  // namespace lbcc::plugin::testing

#endif  // LBCC_PLUGIN_TESTING_SPAWN_H_
