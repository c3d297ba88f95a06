#include "plugin/testing/spawn.h"

#include <spawn.h>
#include <unistd.h>

#include <map>

extern char** environ;

namespace lbcc::plugin::testing {

pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            int close_fd, int stdout_fd, int* error) {
  std::map<std::string, std::string> merged;
  std::vector<std::string> order;
  auto add = [&](const std::string& entry) {
    const std::string name = entry.substr(0, entry.find('='));
    if (!merged.count(name)) order.push_back(name);
    merged[name] = entry;
  };
  for (char** entry = environ; *entry != nullptr; ++entry) add(*entry);
  for (const std::string& entry : env) add(entry);
  std::vector<std::string> environment;
  for (const std::string& name : order) environment.push_back(merged[name]);
  std::vector<char*> argv_c, env_c;
  for (const std::string& a : argv) argv_c.push_back(const_cast<char*>(a.c_str()));
  argv_c.push_back(nullptr);
  for (const std::string& e : environment) env_c.push_back(const_cast<char*>(e.c_str()));
  env_c.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (close_fd >= 0) posix_spawn_file_actions_addclose(&actions, close_fd);
  if (stdout_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stdout_fd, 1);
  pid_t pid = -1;
  *error = posix_spawn(&pid, argv_c[0], &actions, nullptr, argv_c.data(), env_c.data());
  posix_spawn_file_actions_destroy(&actions);
  return *error == 0 ? pid : -1;
}

}  // namespace lbcc::plugin::testing
