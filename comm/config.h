// CommConfig: every setting of a communicator, resolved once when it is created.
//
// Like NCCL's ncclConfig_t: a struct of typed fields that the caller fills in before
// Communicator::Init. A field left unset takes its environment variable (declared in
// base/env.cc), then that variable's declared default; a field that is set wins over the
// environment. Init resolves every field (ResolveConfig) and the communicator keeps the result
// (Communicator::config()); nothing reads these variables after Init, and Split() children
// inherit their parent's config.
//
//   CommConfig config;
//   config.timeout = absl::Seconds(30);                             // wins over LBCC_TIMEOUT_S
//   config.SetAlgorithm(Collective::kAllReduce, Algorithm::kRing);  // wins over LBCC_ALGO
//   LBCC_ASSIGN_OR_RETURN(auto comm, Communicator::Init(id, nranks, rank, config));
//
// The C API's lbccConfig_t (comm/lbcc.h) maps onto this struct field by field.
//
// Errors: InvalidArgument naming the field or the variable and the value.
// Thread-safety: CommConfig is a value. ResolveConfig, CheckEnvironment and CreateUniqueId read
// the environment: nobody may call setenv concurrently.
#ifndef LBCC_COMM_CONFIG_H_
#define LBCC_COMM_CONFIG_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/algorithms.h"
#include "comm/bootstrap.h"
#include "comm/fabric.h"
#include "comm/topology.h"
#include "transport/options.h"
#include "transport/secure.h"

namespace lbcc::comm {

struct CommConfig {
  // Transport backend: "ucx", "socket" or "loopback" (LBCC_TRANSPORT).
  std::optional<std::string> backend;
  // IPv4 address this rank listens on (LBCC_LISTEN_ADDR).
  std::optional<std::string> listen_host;
  // Whether peers can dial this rank: "auto", "yes" or "no" (LBCC_REACHABLE; FabricOptions).
  std::optional<std::string> reachable;
  // Set-up, and each operation without a timeout of its own; > 0 and finite (LBCC_TIMEOUT_S).
  std::optional<absl::Duration> timeout;
  // Unset: LBCC_TOPO_FILE and LBCC_SLOW_RANKS over the ranks' host names (same host = fast
  // island), derived when the ranks meet; it stays unset in the resolved config, and
  // Communicator::topology() holds the result.
  std::optional<Topology> topology;
  // SparseAllReduce's smallest exchange group in elements, >= 1; must be the same on every rank
  // (LBCC_SPARSE_GROUP_ELEMENTS).
  std::optional<int64_t> sparse_group_elements;
  // Per collective (indexed by Collective), an algorithm to use instead of the selection
  // table's; kAuto: the table's (LBCC_ALGO, whose unnamed collectives are kAuto).
  std::array<std::optional<Algorithm>, kNumCollectives> algorithms;
  // Unknown LBCC_* variables and invalid values fail Init instead of logging a warning
  // (LBCC_STRICT_ENV).
  std::optional<bool> strict_env;
  // The transport's settings (transport/options.h: slow-link scheduling, link classes and
  // rules, probes, UCX's own variables, the job secret and encryption). Unset:
  // TransportOptions::FromEnv (LBCC_SLOW_*, LBCC_LINK_*, LBCC_PEER_TIMEOUT_MS, LBCC_UCX_SPIN_US,
  // LBCC_JOB_SECRET / LBCC_JOB_SECRET_FILE, LBCC_ENCRYPT, UCX_TLS, UCX_NET_DEVICES,
  // UCX_TCP_AF_PRIO). Set: used as given; the environment applies to none of its fields.
  std::optional<transport::TransportOptions> transport;
  // The fields a C caller sets (lbccConfig_t), each winning over `transport`'s own:
  // the job secret (transport.security.secret; LBCC_JOB_SECRET / LBCC_JOB_SECRET_FILE). In the
  // resolved config, unset means the job has no secret of its own (a secret the unique id
  // carries still applies, LBCC_SECRET_IN_ID).
  std::optional<transport::JobSecret> job_secret;
  // Which links are sealed (transport.security.encrypt; LBCC_ENCRYPT).
  std::optional<transport::EncryptMode> encrypt;
  // A peer that stops answering fails pending work within about this long, > 0
  // (transport.peer_timeout; LBCC_PEER_TIMEOUT_MS).
  std::optional<absl::Duration> peer_timeout;

  CommConfig& SetAlgorithm(Collective collective, Algorithm algorithm);
  // The choice for `collective`; kAuto (the table's) when unset.
  Algorithm algorithm(Collective collective) const;
  // One line naming every field, for logs; unset fields read "(unset)".
  std::string DebugString() const;
};

// Every unset field but `topology` from the environment, then the declared default; every
// field validated (the algorithms against HasAlgorithm); `transport` set and agreeing with
// job_secret, encrypt and peer_timeout. InvalidArgument naming the field
// ("CommConfig.timeout") or the variable and its value.
absl::StatusOr<CommConfig> ResolveConfig(CommConfig requested);

// "collective=algorithm,..." (LBCC_ALGO's syntax): the entries it names. InvalidArgument
// naming `source` (the variable or field the text came from) and the text.
absl::StatusOr<std::array<std::optional<Algorithm>, kNumCollectives>> ParseAlgorithmList(
    absl::string_view text, absl::string_view source);

// Every FabricOptions field is a value, so each becomes a set field.
CommConfig ConfigFromFabricOptions(FabricOptions options);
// The fabric's part of a resolved config.
FabricOptions FabricOptionsOf(const CommConfig& resolved);

// Checks the environment at Init (env::EnvironmentProblems: misspelt LBCC_* names with the
// closest known name, invalid values). Not strict: one WARN line per problem, OK. Strict
// (`requested.strict_env`, else LBCC_STRICT_ENV): InvalidArgument listing every problem.
absl::Status CheckEnvironment(const CommConfig& requested);

// Starts a bootstrap root (bootstrap.h) on the config's listen_host for its timeout: unset,
// LBCC_LISTEN_ADDR and LBCC_TIMEOUT_S. InvalidArgument for a bad value.
absl::StatusOr<UniqueId> CreateUniqueId(const CommConfig& config);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_CONFIG_H_
