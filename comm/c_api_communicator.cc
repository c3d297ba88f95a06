// The C API's communicator section (comm/lbcc.h): version, errors, unique id, init, split,
// destroy, abort, count, rank, link bytes; the conversions every section shares (Fail, the
// configuration) are defined here too (declared in comm/c_api_internal.h).
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/version.h"
#include "comm/c_api_internal.h"
#include "comm/communicator.h"
#include "comm/config.h"
#include "comm/lbcc.h"
#include "transport/secure.h"

namespace lbcc::comm::c_api {
namespace {

thread_local std::string g_last_error;

static_assert(sizeof(lbccUniqueId) == sizeof(lbcc::comm::UniqueId), "unique id size");

}  // namespace

lbccResult_t ToResult(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return lbccSuccess;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
      return lbccInvalidArgument;
    case absl::StatusCode::kFailedPrecondition:
      return lbccInvalidUsage;
    case absl::StatusCode::kUnavailable:
      return lbccSystemError;
    case absl::StatusCode::kDeadlineExceeded:
      return lbccTimeout;
    case absl::StatusCode::kDataLoss:
      return lbccDataLoss;
    case absl::StatusCode::kUnimplemented:
      return lbccUnimplemented;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
      return lbccCancelled;
    default:
      return lbccInternalError;
  }
}

lbccResult_t Fail(const absl::Status& status, lbccComm* comm) {
  if (status.ok()) return lbccSuccess;
  g_last_error = status.ToString();
  if (comm != nullptr) {
    lbcc::MutexLock lock(&comm->mu);
    comm->last_error = g_last_error;
  }
  return ToResult(status.code());
}

lbccResult_t NullArgument(const char* function, const char* name) {
  return Fail(absl::InvalidArgumentError(absl::StrCat(function, ": ", name, " is NULL")));
}

lbccResult_t Reject(const char* function, const absl::Status& status, lbccComm* comm) {
  comm->comm->PostRejected(function, status);
  return Fail(status, comm);
}

absl::StatusOr<lbcc::DType> ToDType(lbccDataType_t type) {
  const uint8_t value = static_cast<uint8_t>(type);
  if (static_cast<int>(type) < 0 || static_cast<int>(type) > 255 || !lbcc::IsValidDType(value)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown lbccDataType_t ", static_cast<int>(type)));
  }
  return static_cast<lbcc::DType>(value);  // lbccDataType_t mirrors DType's wire ids.
}

// ---- Configuration: lbccConfig_t -> CommConfig, field by field ----
// The fields added with LBCC_CONFIG_SIZE_V1: the job secret, encryption and the peer timeout.
absl::Status SecurityFrom(const lbccConfig_t& config, lbcc::comm::CommConfig& out) {
  if (config.jobSecret != nullptr && config.jobSecretFile != nullptr) {
    return absl::InvalidArgumentError(
        "lbccConfig_t: set jobSecret or jobSecretFile, not both");
  }
  if (config.jobSecret != nullptr) {
    LBCC_ASSIGN_OR_RETURN(out.job_secret, lbcc::transport::JobSecret::FromHex(config.jobSecret),
                          _.Prepend("lbccConfig_t.jobSecret: "));
  }
  if (config.jobSecretFile != nullptr) {
    LBCC_ASSIGN_OR_RETURN(out.job_secret,
                          lbcc::transport::JobSecret::FromFile(config.jobSecretFile),
                          _.Prepend("lbccConfig_t.jobSecretFile: "));
  }
  if (config.encrypt != nullptr) {
    LBCC_ASSIGN_OR_RETURN(out.encrypt, lbcc::transport::ParseEncryptMode(config.encrypt),
                          _.Prepend("lbccConfig_t.encrypt: "));
  }
  if (config.peerTimeoutSeconds != LBCC_CONFIG_UNDEF_DOUBLE) {
    if (!(config.peerTimeoutSeconds > 0) || !std::isfinite(config.peerTimeoutSeconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat("lbccConfig_t.peerTimeoutSeconds=", config.peerTimeoutSeconds,
                       " is invalid: expected a finite number > 0 (LBCC_CONFIG_UNDEF_DOUBLE: "
                       "LBCC_PEER_TIMEOUT_MS)"));
    }
    out.peer_timeout = absl::Seconds(config.peerTimeoutSeconds);
  }
  return absl::OkStatus();
}

absl::StatusOr<lbcc::comm::CommConfig> ConfigFrom(const lbccConfig_t* config) {
  lbcc::comm::CommConfig out;
  if (config == nullptr) return out;
  if (config->size != sizeof(lbccConfig_t) && config->size != LBCC_CONFIG_SIZE_V1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lbccConfig_t.size=", config->size, " is wrong (this library's is ",
        sizeof(lbccConfig_t), "): initialise it with LBCC_CONFIG_INITIALIZER"));
  }
  if (config->magic != LBCC_CONFIG_MAGIC) {
    return absl::InvalidArgumentError(
        "lbccConfig_t.magic is wrong: initialise it with LBCC_CONFIG_INITIALIZER");
  }
  if (config->version > LBCC_VERSION_CODE) {
    return absl::InvalidArgumentError(absl::StrCat("lbccConfig_t.version=", config->version,
                                                   " is newer than this library (",
                                                   LBCC_VERSION_CODE, ")"));
  }
  if (config->transport != nullptr) out.backend = config->transport;
  if (config->listenAddr != nullptr) out.listen_host = config->listenAddr;
  if (config->topologyFile != nullptr) {
    LBCC_ASSIGN_OR_RETURN(out.topology, lbcc::comm::Topology::FromFile(config->topologyFile));
  }
  if (config->timeoutSeconds != LBCC_CONFIG_UNDEF_DOUBLE) {
    if (!(config->timeoutSeconds > 0) || !std::isfinite(config->timeoutSeconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat("lbccConfig_t.timeoutSeconds=", config->timeoutSeconds,
                       " is invalid: expected a finite number > 0 (LBCC_CONFIG_UNDEF_DOUBLE: "
                       "LBCC_TIMEOUT_S)"));
    }
    out.timeout = absl::Seconds(config->timeoutSeconds);
  }
  if (config->algorithms != nullptr) {
    LBCC_ASSIGN_OR_RETURN(out.algorithms, lbcc::comm::ParseAlgorithmList(
                                              config->algorithms, "lbccConfig_t.algorithms"));
  }
  if (config->sparseGroupElements != LBCC_CONFIG_UNDEF_INT) {
    out.sparse_group_elements = config->sparseGroupElements;
  }
  if (config->strictEnv != LBCC_CONFIG_UNDEF_INT) {
    if (config->strictEnv != 0 && config->strictEnv != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lbccConfig_t.strictEnv=", config->strictEnv, " is invalid: expected 0 or 1"));
    }
    out.strict_env = config->strictEnv == 1;
  }
  if (config->size >= sizeof(lbccConfig_t)) LBCC_RETURN_IF_ERROR(SecurityFrom(*config, out));
  return out;
}
// ---- end of Configuration ----

}  // namespace lbcc::comm::c_api

extern "C" {

lbccResult_t lbccGetVersion(int* version) {
  LBCC_C_CHECK_PTR("lbccGetVersion", version);
  *version = LBCC_VERSION_CODE;
  return lbccSuccess;
}

const char* lbccGetErrorString(lbccResult_t result) {
  switch (result) {
    case lbccSuccess:
      return "no error";
    case lbccSystemError:
      return "a peer or link was lost (unhandled system error)";
    case lbccInternalError:
      return "internal error (an LBCC bug)";
    case lbccInvalidArgument:
      return "invalid argument";
    case lbccInvalidUsage:
      return "invalid usage (wrong state)";
    case lbccRemoteError:
      return "remote process exited or there was a network error";
    case lbccInProgress:
      return "operation in progress";
    case lbccTimeout:
      return "timed out waiting for a peer";
    case lbccDataLoss:
      return "corrupt or foreign payload";
    case lbccUnimplemented:
      return "not supported for this input";
    case lbccCancelled:
      return "cancelled (aborted or destroyed)";
    case lbccMembershipChanged:
      return "membership changed (retry the call over the new epoch)";
    case lbccReplicaLeft:
      return "this member's pipeline replica left the data-parallel group (join again)";
    default:
      return "unknown result code";
  }
}

const char* lbccGetLastError(lbccComm_t comm) {
  if (comm == nullptr) return lbcc::comm::c_api::g_last_error.c_str();
  lbcc::MutexLock lock(&comm->mu);
  // The communicator outlives the call; the pointer stays valid until its next failure.
  return comm->last_error.c_str();
}

lbccResult_t lbccGetUniqueId(lbccUniqueId* unique_id) {
  return lbccGetUniqueIdConfig(unique_id, nullptr);
}

lbccResult_t lbccGetUniqueIdConfig(lbccUniqueId* unique_id, const lbccConfig_t* config) {
  LBCC_C_CHECK_PTR("lbccGetUniqueId", unique_id);
  absl::StatusOr<lbcc::comm::CommConfig> options = ConfigFrom(config);
  if (!options.ok()) return Fail(options.status());
  absl::StatusOr<lbcc::comm::UniqueId> id = lbcc::comm::CreateUniqueId(*options);
  if (!id.ok()) return Fail(id.status());
  std::memcpy(unique_id, &*id, sizeof(*unique_id));
  return lbccSuccess;
}

lbccResult_t lbccCommInitRankConfig(lbccComm_t* comm, int nranks, lbccUniqueId comm_id, int rank,
                                    const lbccConfig_t* config) {
  LBCC_C_CHECK_PTR("lbccCommInitRankConfig", comm);
  *comm = nullptr;
  absl::StatusOr<lbcc::comm::CommConfig> options = ConfigFrom(config);
  if (!options.ok()) return Fail(options.status());
  lbcc::comm::UniqueId id;
  std::memcpy(&id, &comm_id, sizeof(id));
  absl::StatusOr<std::unique_ptr<Communicator>> created =
      Communicator::Init(id, nranks, rank, *std::move(options));
  if (!created.ok()) return Fail(created.status());
  *comm = new lbccComm();
  (*comm)->comm = *std::move(created);
  return lbccSuccess;
}

lbccResult_t lbccCommInitRank(lbccComm_t* comm, int nranks, lbccUniqueId comm_id, int rank,
                              const lbccConfig_t* config) {
  return lbccCommInitRankConfig(comm, nranks, comm_id, rank, config);
}

lbccResult_t lbccCommInitFromEnv(lbccComm_t* comm, const lbccConfig_t* config) {
  LBCC_C_CHECK_PTR("lbccCommInitFromEnv", comm);
  *comm = nullptr;
  absl::StatusOr<lbcc::comm::CommConfig> options = ConfigFrom(config);
  if (!options.ok()) return Fail(options.status());
  absl::StatusOr<std::unique_ptr<Communicator>> created =
      Communicator::InitFromEnvironment(*std::move(options));
  if (!created.ok()) return Fail(created.status());
  *comm = new lbccComm();
  (*comm)->comm = *std::move(created);
  return lbccSuccess;
}

lbccResult_t lbccCommSplit(lbccComm_t comm, int color, int key, lbccComm_t* newcomm) {
  LBCC_C_CHECK_PTR("lbccCommSplit", comm);
  LBCC_C_CHECK_PTR("lbccCommSplit", newcomm);
  *newcomm = nullptr;
  absl::StatusOr<std::unique_ptr<Communicator>> split =
      comm->comm->Split(color < 0 ? -1 : color, key);
  if (!split.ok()) return Fail(split.status(), comm);
  if (*split != nullptr) {
    *newcomm = new lbccComm();
    (*newcomm)->comm = *std::move(split);
  }
  return lbccSuccess;
}

lbccResult_t lbccCommDestroy(lbccComm_t comm) {
  LBCC_C_CHECK_PTR("lbccCommDestroy", comm);
  delete comm;
  return lbccSuccess;
}

lbccResult_t lbccCommAbort(lbccComm_t comm) {
  LBCC_C_CHECK_PTR("lbccCommAbort", comm);
  comm->comm->Abort();
  delete comm;
  return lbccSuccess;
}

lbccResult_t lbccCommCount(const lbccComm_t comm, int* count) {
  LBCC_C_CHECK_PTR("lbccCommCount", comm);
  LBCC_C_CHECK_PTR("lbccCommCount", count);
  *count = comm->comm->nranks();
  return lbccSuccess;
}

lbccResult_t lbccCommUserRank(const lbccComm_t comm, int* rank) {
  LBCC_C_CHECK_PTR("lbccCommUserRank", comm);
  LBCC_C_CHECK_PTR("lbccCommUserRank", rank);
  *rank = comm->comm->rank();
  return lbccSuccess;
}

lbccResult_t lbccCommLinkBytes(const lbccComm_t comm, uint64_t* fast_sent, uint64_t* fast_recv,
                               uint64_t* slow_sent, uint64_t* slow_recv) {
  LBCC_C_CHECK_PTR("lbccCommLinkBytes", comm);
  const lbcc::comm::Fabric::ClassBytes bytes = comm->comm->fabric()->BytesByClass();
  if (fast_sent) *fast_sent = bytes.fast_sent;
  if (fast_recv) *fast_recv = bytes.fast_received;
  if (slow_sent) *slow_sent = bytes.slow_sent;
  if (slow_recv) *slow_recv = bytes.slow_received;
  return lbccSuccess;
}

}  // extern "C"
