// lbcc: LBCC's command-line tool.
//
//   lbcc version            print the version
//   lbcc env [--check]      list every LBCC_* variable with its default and current value;
//                           --check exits 1 when a set variable is unknown or invalid
//   lbcc help               this text
#include <cstdio>
#include <cstring>
#include <string>

#include "base/env.h"
#include "base/version.h"

namespace {

constexpr char kUsage[] =
    "usage: lbcc <command> [options]\n"
    "\n"
    "commands:\n"
    "  version           print LBCC's version\n"
    "  env [--check]     list LBCC_* environment variables (type, default, current value);\n"
    "                    --check: exit 1 if a set LBCC_* variable is unknown or invalid\n"
    "  help              show this text\n";

int Env(int argc, char** argv) {
  bool check = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--check") == 0) {
      check = true;
    } else {
      std::fprintf(stderr, "lbcc env: unknown option %s\n%s", argv[i], kUsage);
      return 2;
    }
  }
  std::fputs(lbcc::env::DescribeAll().c_str(), stdout);
  absl::Status status = lbcc::env::ValidateEnvironment();
  if (!status.ok()) {
    std::fprintf(stderr, "lbcc env: %s\n", std::string(status.message()).c_str());
    return check ? 1 : 0;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "version") {
    std::printf("LBCC %s\n", LBCC_VERSION_STRING);
    return 0;
  }
  if (command == "env") return Env(argc - 2, argv + 2);
  std::fprintf(stderr, "lbcc: unknown command '%s'\n%s", command.c_str(), kUsage);
  return 2;
}
