// `lbcc plan`: the planning model on the command line (tools/lbcc_main.cc hands it argv after
// the word "plan").
//
//   lbcc plan --input job.json [--json] [--target 0.95] [--plot out.png]
//   lbcc plan simulate [--out DIR] [--seed N] [--participants 16,64,...]
//
// Returns the process exit code: 0 done, 1 the plan failed (message on stderr, naming the
// field), 2 bad usage. --help prints the usage and touches nothing.
#ifndef LBCC_PLAN_CLI_H_
#define LBCC_PLAN_CLI_H_

namespace lbcc::plan {

int PlanMain(int argc, char** argv);

// `lbcc plan simulate` (plan/simulate.cc).
int SimulateMain(int argc, char** argv);

}  // namespace lbcc::plan

#endif  // LBCC_PLAN_CLI_H_
