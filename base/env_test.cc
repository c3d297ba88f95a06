#include "base/env.h"

#include <cstdlib>
#include <string>

#include "base/scoped_env.h"
#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::env {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::ScopedEnv;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

TEST(EnvTest, DeclarationsAreSortedUniqueDocumentedAndDefaultsValid) {
  ScopedEnv a("LBCC_DEBUG", nullptr), b("LBCC_DEBUG_FILE", nullptr), c("LBCC_SIMD", nullptr);
  absl::string_view previous;
  for (const Spec& spec : AllSpecs()) {
    EXPECT_TRUE(spec.name.substr(0, 5) == "LBCC_") << spec.name;
    EXPECT_LT(previous, spec.name) << "declarations must be sorted and unique";
    EXPECT_FALSE(spec.help.empty()) << spec.name;
    previous = spec.name;
  }
  // Unset variables take their defaults, which must validate.
  EXPECT_THAT(ValidateEnvironment(), IsOk());
}

TEST(EnvTest, EnumIsCaseInsensitiveAndReturnsDeclaredSpelling) {
  ScopedEnv debug("LBCC_DEBUG", "info");
  EXPECT_THAT(GetString("LBCC_DEBUG"), IsOkAndHolds("INFO"));
}

TEST(EnvTest, DefaultWhenUnset) {
  ScopedEnv debug("LBCC_DEBUG", nullptr);
  EXPECT_THAT(GetString("LBCC_DEBUG"), IsOkAndHolds("WARN"));
}

TEST(EnvTest, BadEnumValueIsAClearError) {
  ScopedEnv debug("LBCC_DEBUG", "LOUD");
  EXPECT_THAT(GetString("LBCC_DEBUG"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("LBCC_DEBUG='LOUD'"), HasSubstr("TRACE"))));
  EXPECT_THAT(ValidateEnvironment(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LBCC_DEBUG")));
}

TEST(EnvTest, UnknownLbccVariableIsReported) {
  ScopedEnv typo("LBCC_DEBGU", "INFO");
  EXPECT_THAT(ValidateEnvironment(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("LBCC_DEBGU is not an LBCC variable")));
}

TEST(EnvTest, MisspeltVariableNamesTheClosestDeclaredOne) {
  ScopedEnv typo("LBCC_TIMOUT_S", "2");
  EXPECT_THAT(EnvironmentProblems(),
              ::testing::Contains(
                  "LBCC_TIMOUT_S is not an LBCC variable (did you mean LBCC_TIMEOUT_S?)"));
  EXPECT_EQ(ClosestName("LBCC_TIMOUT_S"), "LBCC_TIMEOUT_S");
  EXPECT_EQ(ClosestName("lbcc_sparse_group_elems"), "LBCC_SPARSE_GROUP_ELEMENTS");
  EXPECT_EQ(ClosestName("LBCC_ZZZZZZZZZZZ"), "");
}

TEST(EnvTest, FarFromEveryNameSaysSoWithoutAGuess) {
  ScopedEnv typo("LBCC_ZZZZZZZZZZZ", "1");
  EXPECT_THAT(EnvironmentProblems(),
              ::testing::Contains(HasSubstr("LBCC_ZZZZZZZZZZZ is not an LBCC variable (misspelt?")));
}

TEST(EnvTest, ToolVariablesAreNotProblems) {
  ScopedEnv python("LBCC_PYTHON", "/usr/bin/python3"), path("LBCC_PYTHONPATH", "/tmp"),
      skip("LBCC_SETUP_SKIP", "1");
  EXPECT_THAT(ValidateEnvironment(), IsOk());
}

TEST(EnvTest, InvalidValueIsAProblemNamingTheVariable) {
  ScopedEnv timeout("LBCC_TIMEOUT_S", "0");
  EXPECT_THAT(EnvironmentProblems(),
              ::testing::ElementsAre(HasSubstr("LBCC_TIMEOUT_S='0' is invalid")));
  EXPECT_THAT(GetDouble("LBCC_TIMEOUT_S"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LBCC_TIMEOUT_S='0'")));
  timeout.Set("-5");
  EXPECT_THAT(GetDouble("LBCC_TIMEOUT_S"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LBCC_TIMEOUT_S='-5'")));
}

TEST(EnvTest, UndeclaredOrMistypedReadIsInternal) {
  EXPECT_THAT(GetInt("LBCC_NO_SUCH_VARIABLE"), StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(GetInt("LBCC_DEBUG"), StatusIs(absl::StatusCode::kInternal, HasSubstr("enum")));
  EXPECT_THAT(GetBool("LBCC_SIMD"), StatusIs(absl::StatusCode::kInternal));
}

TEST(EnvTest, ParseBool) {
  for (const char* t : {"1", "true", "YES", " on "}) EXPECT_THAT(ParseBool(t), IsOkAndHolds(true));
  for (const char* f : {"0", "False", "no", "OFF"}) EXPECT_THAT(ParseBool(f), IsOkAndHolds(false));
  for (const char* bad : {"", "2", "maybe", "tru"}) {
    EXPECT_THAT(ParseBool(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(EnvTest, ParseBytes) {
  EXPECT_THAT(ParseBytes("4096"), IsOkAndHolds(4096));
  EXPECT_THAT(ParseBytes("256K"), IsOkAndHolds(256 << 10));
  EXPECT_THAT(ParseBytes("256KiB"), IsOkAndHolds(256 << 10));
  EXPECT_THAT(ParseBytes("1mb"), IsOkAndHolds(1 << 20));
  EXPECT_THAT(ParseBytes("3G"), IsOkAndHolds(int64_t{3} << 30));
  EXPECT_THAT(ParseBytes("2T"), IsOkAndHolds(int64_t{2} << 40));
  EXPECT_THAT(ParseBytes("12B"), IsOkAndHolds(12));
  for (const char* bad : {"", "K", "-1", "1.5M", "10X", "99999999999999999999", "9000000T"}) {
    EXPECT_THAT(ParseBytes(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(EnvTest, DescribeAllListsEveryVariableAndFlagsInvalidValues) {
  ScopedEnv simd("LBCC_SIMD", "sse9");
  const std::string table = DescribeAll();
  for (const Spec& spec : AllSpecs()) EXPECT_THAT(table, HasSubstr(std::string(spec.name)));
  EXPECT_THAT(table, HasSubstr("`sse9` INVALID"));
}

}  // namespace
}  // namespace lbcc::env
