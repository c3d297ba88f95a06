// cli: how every LBCC command-line binary reads its arguments (lbcc, lbcc_perf, gloo_allreduce).
//
// Flags are Abseil flags (ABSL_FLAG in the binary's own .cc); this file only decides what the
// command line means, so that every binary behaves the same way:
//   --name=value, --name value, -name value, -n value and -nVALUE (one-letter flags, as
//   nccl-tests' getopt takes them), --flag / --noflag for booleans, "--" ends the flags;
//   -h / --help prints the usage text and the binary's own flags and exits 0, with no other
//   effect; an unknown flag, a missing value or a value the flag's type rejects exits 2 with a
//   message that names the flag. Abseil's own ParseCommandLine is not used: it exits 1 on --help
//   and on errors.
// One implementation (cli.cc); not thread-safe (call once, from main, before other threads).
#ifndef LBCC_TOOLS_CLI_H_
#define LBCC_TOOLS_CLI_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lbcc::cli {

struct Parsed {
  std::vector<std::string> positional;  // Arguments that are not flags, in order.
  std::set<std::string> given;          // Names of the flags set on the command line.
  bool help = false;                    // -h or --help was given.

  bool Given(absl::string_view name) const { return given.count(std::string(name)) > 0; }
};

// Sets the flags named on argv[1..argc) and returns the rest. InvalidArgument (the message names
// the flag) for an unknown flag, a missing value or a value the flag's type rejects. Flags set
// before an error keep their new value.
absl::StatusOr<Parsed> Parse(int argc, char** argv);

// `usage` followed by one line per flag defined in a source file whose path ends with
// `flags_file` (e.g. "bench/lbcc_perf.cc"): "  --name (default ...)  help".
std::string Help(absl::string_view usage, absl::string_view flags_file);

// Parse() for main(): prints Help() to stdout and exits 0 for --help; prints
// "<program>: <message> (see --help)" to stderr and exits 2 on an error.
Parsed ParseOrExit(int argc, char** argv, absl::string_view usage, absl::string_view flags_file);

}  // namespace lbcc::cli

#endif  // LBCC_TOOLS_CLI_H_
