// `lbcc plan`: the planning model on the command line (tools/lbcc_main.cc hands it argv after
// the word "plan").
//
//   lbcc plan --input job.json [--json] [--target 0.95] [--plot out.png]
//   lbcc plan simulate [--output rows.json] [--seed N] [--participants 16,64,...]
//
// Flags are Abseil flags read through tools/cli.h (the style of every LBCC binary): --help
// prints the usage and the flags and touches nothing; an unknown flag, or another
// subcommand's, exits 2 with a message naming it. Returns the process exit code: 0 done, 1
// the plan failed (message on stderr, naming the field), 2 bad usage.
#ifndef LBCC_PLAN_CLI_H_
#define LBCC_PLAN_CLI_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/cli.h"

namespace lbcc::plan {

int PlanMain(int argc, char** argv);

// cli::Parse over a subcommand's arguments (argv without the program name) accepting only the
// flags named in `known`: InvalidArgument "unknown flag --name" for any other.
absl::StatusOr<cli::Parsed> ParseFlags(int argc, char** argv,
                                       const std::vector<std::string>& known);

// `lbcc plan simulate` (plan/simulate.cc).
int SimulateMain(int argc, char** argv);

}  // namespace lbcc::plan

#endif  // LBCC_PLAN_CLI_H_
