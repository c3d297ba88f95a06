// The one place where LBCC's environment variables are declared and read.
//
// Every LBCC_* variable is declared once, in the table in base/env.cc, with its type, default,
// valid range or choices and a line of documentation; `bazel run //tools:lbcc -- env` prints
// the table with the current values. Readers use the typed getters below, which parse and
// validate on every call (values are read at configuration time, never on hot paths):
//
//   LBCC_ASSIGN_OR_RETURN(int64_t chunk, env::GetBytes("LBCC_SLOW_CHUNK_BYTES"));
//
// Errors: InvalidArgument for a value that does not parse or is out of range (the message names
// the variable, the value and what is expected); Internal for a name that is not declared or
// is read with the wrong type (an LBCC bug).
//
// Thread-safety: all functions are thread-safe as long as nobody calls setenv concurrently.
#ifndef LBCC_BASE_ENV_H_
#define LBCC_BASE_ENV_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lbcc::env {

enum class Type {
  kBool,    // 1/0, true/false, yes/no, on/off (any case)
  kInt,     // decimal integer within [min, max]
  kDouble,  // finite number within [min, max]
  kString,  // free text
  kEnum,    // one of `choices` ("a|b|c"), case-insensitive; returned in the declared spelling
  kBytes,   // integer with optional suffix K, M, G, T (powers of 1024; KiB/KB accepted too)
};

struct Spec {
  absl::string_view name;
  Type type;
  absl::string_view default_value;  // Parsed like a user value.
  absl::string_view help;
  absl::string_view choices = {};   // kEnum only.
  double min = 0;                  // kInt, kDouble, kBytes (inclusive).
  double max = 0;                  // kInt, kDouble, kBytes (inclusive); min == max: unbounded.
};

// Every declared variable, sorted by name.
absl::Span<const Spec> AllSpecs();
// nullptr when `name` is not declared.
const Spec* FindSpec(absl::string_view name);

absl::StatusOr<bool> GetBool(absl::string_view name);
absl::StatusOr<int64_t> GetInt(absl::string_view name);
absl::StatusOr<double> GetDouble(absl::string_view name);
absl::StatusOr<std::string> GetString(absl::string_view name);  // kString and kEnum.
absl::StatusOr<int64_t> GetBytes(absl::string_view name);

// A variable of another program (UCX_*, the launchers' RANK / MASTER_ADDR / SLURM_* /
// OMPI_*, NCCL_DEBUG, TORCH_DISTRIBUTED_DEBUG, Bazel's TEST_SRCDIR) or of LBCC's build and tools
// (LBCC_PYTHON, LBCC_PLAN_PLOT_SCRIPT): its raw value, nullopt when unset. Library code reads no
// variable but through this file (//tools:getenv_test checks).
std::optional<std::string> GetForeign(absl::string_view name);

// How many times the getters above have read the environment in this process. Settings are
// resolved once (comm/config.h): tests check that this stays put after a communicator's Init.
uint64_t ReadCount();

// Checks every LBCC_* variable in the environment: it must be declared and its value valid.
// One message per problem: "LBCC_TIMOUT_S is not an LBCC variable (did you mean
// LBCC_TIMEOUT_S?)", "LBCC_TIMEOUT_S='0' is invalid: expected ...". The build's and tools'
// own LBCC_PYTHON, LBCC_PYTHONPATH, LBCC_SETUP_SKIP and LBCC_PLAN_PLOT_SCRIPT are not problems
// (read with GetForeign).
std::vector<std::string> EnvironmentProblems();
// InvalidArgument joining EnvironmentProblems(), ok when there are none.
absl::Status ValidateEnvironment();
// The declared name closest to `name` (edit distance, case-insensitive, at most a third of
// `name` wrong); empty when none is that close.
std::string ClosestName(absl::string_view name);

// A Markdown table of every variable: name, type, default, current value, documentation.
std::string DescribeAll();

// Parsers shared with config files and command-line flags.
absl::StatusOr<bool> ParseBool(absl::string_view text);
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);

}  // namespace lbcc::env

#endif  // LBCC_BASE_ENV_H_
