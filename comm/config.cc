#include "comm/config.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/cpu.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace lbcc::comm {
namespace {

// LBCC_SPARSE_GROUP_ELEMENTS's declared range, for explicit values too.
constexpr int64_t kMaxGroupElements = int64_t{1} << 40;

size_t Index(Collective collective) { return static_cast<size_t>(collective); }

template <typename T>
std::string OrUnset(const std::optional<T>& value) {
  return value.has_value() ? absl::StrCat(*value) : "(unset)";
}

absl::Status CheckAlgorithm(Collective collective, Algorithm algorithm, absl::string_view source) {
  if (algorithm == Algorithm::kAuto || HasAlgorithm(collective, algorithm)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", CollectiveName(collective),
                                                 " has no ", AlgorithmName(algorithm),
                                                 " algorithm"));
}

// The explicit value, validated, else LBCC_TIMEOUT_S (whose declared range is > 0 already).
absl::StatusOr<absl::Duration> TimeoutOf(const std::optional<absl::Duration>& timeout,
                                         absl::string_view field) {
  if (!timeout.has_value()) {
    LBCC_ASSIGN_OR_RETURN(const double seconds, env::GetDouble("LBCC_TIMEOUT_S"));
    return absl::Seconds(seconds);
  }
  if (*timeout <= absl::ZeroDuration() || *timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(field, "=", absl::FormatDuration(*timeout),
                                                   " is invalid: expected a finite duration > 0"));
  }
  return *timeout;
}

absl::StatusOr<std::string> ListenHostOf(const std::optional<std::string>& host) {
  if (host.has_value()) return *host;
  return env::GetString("LBCC_LISTEN_ADDR");
}

absl::Status ResolveAlgorithms(CommConfig& config) {
  bool all_set = true;
  for (const std::optional<Algorithm>& a : config.algorithms) all_set = all_set && a.has_value();
  if (!all_set) {
    LBCC_ASSIGN_OR_RETURN(const std::string text, env::GetString("LBCC_ALGO"));
    LBCC_ASSIGN_OR_RETURN(auto from_env, ParseAlgorithmList(text, "LBCC_ALGO"));
    for (Collective c : kAllCollectives) {
      const std::optional<Algorithm>& env_choice = from_env[Index(c)];
      std::optional<Algorithm>& choice = config.algorithms[Index(c)];
      if (choice.has_value()) continue;
      if (env_choice.has_value()) {
        LBCC_RETURN_IF_ERROR(
            CheckAlgorithm(c, *env_choice, absl::StrCat("LBCC_ALGO='", text, "'")));
      }
      choice = env_choice.value_or(Algorithm::kAuto);
    }
  }
  for (Collective c : kAllCollectives) {
    LBCC_RETURN_IF_ERROR(CheckAlgorithm(c, *config.algorithms[Index(c)], "CommConfig.algorithms"));
  }
  return absl::OkStatus();
}

// `transport` from the environment when unset, then the C-settable fields over it; each of
// those fields holds the resolved value afterwards.
absl::Status ResolveTransport(CommConfig& config) {
  if (!config.transport.has_value()) {
    LBCC_ASSIGN_OR_RETURN(config.transport, transport::TransportOptions::FromEnv());
  }
  transport::TransportOptions& t = *config.transport;
  if (config.job_secret.has_value()) t.security.secret = config.job_secret;
  config.job_secret = t.security.secret;
  if (config.encrypt.has_value()) t.security.encrypt = *config.encrypt;
  config.encrypt = t.security.encrypt;
  if (config.peer_timeout.has_value()) {
    if (*config.peer_timeout <= absl::ZeroDuration() ||
        *config.peer_timeout == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CommConfig.peer_timeout=", absl::FormatDuration(*config.peer_timeout),
                       " is invalid: expected a finite duration > 0"));
    }
    t.peer_timeout = *config.peer_timeout;
  }
  config.peer_timeout = t.peer_timeout;
  return absl::OkStatus();
}

}  // namespace

CommConfig& CommConfig::SetAlgorithm(Collective collective, Algorithm algorithm) {
  algorithms[Index(collective)] = algorithm;
  return *this;
}

Algorithm CommConfig::algorithm(Collective collective) const {
  return algorithms[Index(collective)].value_or(Algorithm::kAuto);
}

std::string CommConfig::DebugString() const {
  std::vector<std::string> choices;
  for (Collective c : kAllCollectives) {
    const std::optional<Algorithm>& a = algorithms[Index(c)];
    choices.push_back(absl::StrCat(CollectiveName(c), "=",
                                   a.has_value() ? AlgorithmName(*a) : "(unset)"));
  }
  return absl::StrCat(
      "transport=", OrUnset(backend), " listen=", OrUnset(listen_host),
      " reachable=", OrUnset(reachable),
      " timeout=", timeout.has_value() ? absl::FormatDuration(*timeout) : "(unset)",
      " topology=", topology.has_value() ? "given" : "(derived)",
      " sparse_group_elements=", OrUnset(sparse_group_elements), " algorithms=",
      absl::StrJoin(choices, ","),
      " strict_env=", strict_env.has_value() ? (*strict_env ? "1" : "0") : "(unset)",
      " transport_options=", transport.has_value() ? "given" : "(unset)",
      " job_secret=", job_secret.has_value() ? "(set)" : "(unset)",
      " encrypt=", encrypt.has_value() ? transport::EncryptModeName(*encrypt) : "(unset)",
      " peer_timeout=", peer_timeout.has_value() ? absl::FormatDuration(*peer_timeout) : "(unset)");
}

absl::StatusOr<std::array<std::optional<Algorithm>, kNumCollectives>> ParseAlgorithmList(
    absl::string_view text, absl::string_view source) {
  std::array<std::optional<Algorithm>, kNumCollectives> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> kv = absl::StrSplit(item, '=');
    const std::string context = absl::StrCat(source, "='", text, "'");
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, " is invalid: expected collective=algorithm,..."));
    }
    LBCC_ASSIGN_OR_RETURN(const Collective collective,
                          ParseCollective(absl::StripAsciiWhitespace(kv[0])),
                          _.Prepend(absl::StrCat(context, ": ")));
    LBCC_ASSIGN_OR_RETURN(const Algorithm algorithm,
                          ParseAlgorithm(absl::StripAsciiWhitespace(kv[1])),
                          _.Prepend(absl::StrCat(context, ": ")));
    if (out[Index(collective)].has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, " names ", CollectiveName(collective), " twice"));
    }
    out[Index(collective)] = algorithm;
  }
  return out;
}

absl::StatusOr<CommConfig> ResolveConfig(CommConfig config) {
  if (!config.backend.has_value()) {
    LBCC_ASSIGN_OR_RETURN(config.backend, env::GetString("LBCC_TRANSPORT"));
  }
  LBCC_ASSIGN_OR_RETURN(config.listen_host, ListenHostOf(config.listen_host));
  if (!config.reachable.has_value()) {
    LBCC_ASSIGN_OR_RETURN(config.reachable, env::GetString("LBCC_REACHABLE"));
  } else if (*config.reachable != "auto" && *config.reachable != "yes" &&
             *config.reachable != "no") {
    return absl::InvalidArgumentError(absl::StrCat("CommConfig.reachable='", *config.reachable,
                                                   "' is invalid: expected auto, yes or no"));
  }
  LBCC_ASSIGN_OR_RETURN(config.timeout, TimeoutOf(config.timeout, "CommConfig.timeout"));
  if (config.sparse_group_elements.has_value()) {
    if (*config.sparse_group_elements < 1 || *config.sparse_group_elements > kMaxGroupElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("CommConfig.sparse_group_elements=", *config.sparse_group_elements,
                       " is invalid: expected an integer in [1, ", kMaxGroupElements, "]"));
    }
  } else {
    LBCC_ASSIGN_OR_RETURN(config.sparse_group_elements,
                          env::GetInt("LBCC_SPARSE_GROUP_ELEMENTS"));
  }
  LBCC_RETURN_IF_ERROR(ResolveAlgorithms(config));
  if (!config.strict_env.has_value()) {
    LBCC_ASSIGN_OR_RETURN(config.strict_env, env::GetBool("LBCC_STRICT_ENV"));
  }
  LBCC_RETURN_IF_ERROR(ResolveTransport(config));
  // LBCC_SIMD: the CPU codecs' level, fixed for the process now rather than at the first
  // encode (base/cpu.h).
  ActiveSimdLevel();
  return config;
}

CommConfig ConfigFromFabricOptions(FabricOptions options) {
  CommConfig config;
  config.backend = std::move(options.backend);
  config.listen_host = std::move(options.listen_host);
  if (!options.reachable.empty()) config.reachable = std::move(options.reachable);
  config.timeout = options.timeout;
  config.topology = std::move(options.topology);
  config.transport = std::move(options.transport);
  return config;
}

FabricOptions FabricOptionsOf(const CommConfig& resolved) {
  FabricOptions options;
  options.backend = resolved.backend.value_or(options.backend);
  options.listen_host = resolved.listen_host.value_or(options.listen_host);
  options.reachable = resolved.reachable.value_or(options.reachable);
  options.timeout = resolved.timeout.value_or(options.timeout);
  options.topology = resolved.topology;
  options.transport = resolved.transport;
  return options;
}

absl::Status CheckEnvironment(const CommConfig& requested) {
  bool strict = false;
  if (requested.strict_env.has_value()) {
    strict = *requested.strict_env;
  } else {
    LBCC_ASSIGN_OR_RETURN(strict, env::GetBool("LBCC_STRICT_ENV"));
  }
  const std::vector<std::string> problems = env::EnvironmentProblems();
  if (problems.empty()) return absl::OkStatus();
  if (strict) {
    return absl::InvalidArgumentError(
        absl::StrCat("the environment has problems (LBCC_STRICT_ENV=1): ",
                     absl::StrJoin(problems, "; ")));
  }
  for (const std::string& problem : problems) {
    LBCC_LOG(WARN) << "environment: " << problem << " (LBCC_STRICT_ENV=1 makes this fatal)";
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueId> CreateUniqueId(const CommConfig& config) {
  LBCC_ASSIGN_OR_RETURN(const std::string host, ListenHostOf(config.listen_host));
  LBCC_ASSIGN_OR_RETURN(const absl::Duration timeout,
                        TimeoutOf(config.timeout, "CreateUniqueId: timeout"));
  // The root authenticates with the secret the ranks will resolve: the config's, else the
  // given transport settings', else the environment's.
  BootstrapSecurity security;
  if (config.job_secret.has_value()) {
    security = BootstrapSecurity{true, config.job_secret};
  } else if (config.transport.has_value()) {
    security = BootstrapSecurity{true, config.transport->security.secret};
  }
  return CreateUniqueId(host, timeout, security);
}

}  // namespace lbcc::comm
