// The C API (comm/lbcc.h) over the C++ Communicator. Statuses become lbccResult_t in exactly
// one place (Fail), which also keeps the full message for lbccGetLastError.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/version.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"
#include "comm/activations.h"
#include "comm/communicator.h"
#include "comm/elastic.h"
#include "comm/lbcc.h"

struct lbccComm {
  std::unique_ptr<lbcc::comm::Communicator> comm;
  lbcc::Mutex mu;
  std::string last_error ABSL_GUARDED_BY(mu);
};

struct lbccRequest {
  lbcc::comm::RequestPtr request;
  lbccComm* comm = nullptr;
  std::shared_ptr<void> keep_alive;  // Codecs and views the operation uses.
};

struct lbccTopKState {
  lbcc::codecs::TopKEfState state;
};

namespace {

using lbcc::comm::Communicator;

thread_local std::string g_last_error;

static_assert(sizeof(lbccUniqueId) == sizeof(lbcc::comm::UniqueId), "unique id size");

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

// The one conversion from Status: records the message and returns the code.
lbccResult_t Fail(const absl::Status& status, lbccComm* comm = nullptr) {
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

#define LBCC_C_CHECK_PTR(function, ptr) \
  if ((ptr) == nullptr) return NullArgument(function, #ptr)

// A collective's argument error on a valid communicator: the call still takes part (an error
// contribution in its place, Communicator::PostRejected), so every rank fails this operation
// and the ranks stay in step; the error is reported from the call itself.
lbccResult_t Reject(const char* function, const absl::Status& status, lbccComm* comm) {
  comm->comm->PostRejected(function, status);
  return Fail(status, comm);
}

// A NULL buffer of a collective: rejected as above.
#define LBCC_C_CHECK_BUF(function, ptr, comm)                                                   \
  if ((ptr) == nullptr)                                                                         \
  return Reject(function,                                                                       \
                absl::InvalidArgumentError(absl::StrCat(function, ": ", #ptr, " is NULL")), comm)

absl::StatusOr<lbcc::DType> ToDType(lbccDataType_t type) {
  const uint8_t value = static_cast<uint8_t>(type);
  if (static_cast<int>(type) < 0 || static_cast<int>(type) > 255 || !lbcc::IsValidDType(value)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown lbccDataType_t ", static_cast<int>(type)));
  }
  return static_cast<lbcc::DType>(value);  // lbccDataType_t mirrors DType's wire ids.
}

// ---- Configuration: lbccConfig_t -> CommConfig, field by field ----
absl::StatusOr<lbcc::comm::CommConfig> ConfigFrom(const lbccConfig_t* config) {
  lbcc::comm::CommConfig out;
  if (config == nullptr) return out;
  if (config->size != sizeof(lbccConfig_t)) {
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
  return out;
}
// ---- end of Configuration ----

lbccResult_t Finish(lbcc::comm::RequestPtr request, lbccComm* comm, lbccRequest_t* out,
                    std::shared_ptr<void> keep_alive = nullptr) {
  // Argument errors are known at once: report them from the call itself. Failures of a posted
  // operation come from lbccTest / lbccWait, even when they happen before this returns.
  if (request->RejectedAtPost()) return Fail(request->status(), comm);
  *out = new lbccRequest{std::move(request), comm, std::move(keep_alive)};
  return lbccSuccess;
}

// A host f32 view of `ndims` dims; NULL data is allowed only for empty tensors.
absl::StatusOr<lbcc::TensorView> HostView(float* data, int ndims, const int64_t* dims) {
  if (ndims < 0 || ndims > lbcc::kMaxRank || (ndims > 0 && dims == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("bad ndims ", ndims, " or NULL dims"));
  }
  return lbcc::TensorView::Host(data, lbcc::Shape(dims, dims + ndims));
}

absl::StatusOr<lbcc::codecs::TopKEfOptions> TopKOptions(const lbccTopKConfig_t* config) {
  lbcc::codecs::TopKEfOptions options;
  if (config == nullptr) return options;
  if (config->size != sizeof(lbccTopKConfig_t)) {
    return absl::InvalidArgumentError(
        "lbccTopKConfig_t.size is wrong: initialise it with LBCC_TOPK_CONFIG_INITIALIZER");
  }
  options.top_k = config->topK;
  options.beta = config->beta;
  options.lr = config->lr;
  switch (config->values) {
    case lbccValues2Bit:
      options.values = lbcc::codecs::ValueCoding::kBinMean2;
      break;
    case lbccValues4Bit:
      options.values = lbcc::codecs::ValueCoding::kBinMean4;
      break;
    case lbccValues8Bit:
      options.values = lbcc::codecs::ValueCoding::kBinMean8;
      break;
    case lbccValuesBf16:
      options.values = lbcc::codecs::ValueCoding::kBf16;
      break;
    case lbccValuesFp16:
      options.values = lbcc::codecs::ValueCoding::kF16;
      break;
    case lbccValuesFp32:
      options.values = lbcc::codecs::ValueCoding::kF32;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown lbccValueCoding_t ", static_cast<int>(config->values)));
  }
  LBCC_RETURN_IF_ERROR(options.Validate());
  return options;
}

// lbccSparseAllReduce's and lbccElasticSparseAllReduce's arguments, checked.
struct SparseCall {
  std::vector<Communicator::SparseTensor> tensors;
  std::shared_ptr<lbcc::codecs::TopKEfCodec> codec;
  lbcc::codecs::DecodeOptions decode;
};

absl::StatusOr<SparseCall> ParseSparseCall(const char* name, int ntensors,
                                           const float* const* deltas, float* const* outs,
                                           const int* ranks, const int64_t* const* dims,
                                           lbccTopKState_t* states,
                                           const lbccTopKConfig_t* config,
                                           lbccAggregation_t aggregation) {
  if (ntensors < 0) return absl::InvalidArgumentError("ntensors < 0");
  if (ntensors > 0) {
    for (const auto& [ptr, what] : {std::pair<const void*, const char*>{deltas, "deltas"},
                                    {outs, "outs"},
                                    {ranks, "ranks"},
                                    {dims, "dims"},
                                    {states, "states"}}) {
      if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, ": ", what, " is NULL"));
    }
  }
  LBCC_ASSIGN_OR_RETURN(lbcc::codecs::TopKEfOptions options, TopKOptions(config));
  SparseCall call;
  LBCC_ASSIGN_OR_RETURN(call.codec, lbcc::codecs::TopKEfCodec::Create(options));
  call.decode.clip_to_median_norm = (aggregation & lbccAggClipToMedianNorm) != 0;
  switch (static_cast<int>(aggregation) & ~static_cast<int>(lbccAggClipToMedianNorm)) {
    case lbccAggSparseLoCo:
      call.decode.aggregation = lbcc::codecs::Aggregation::kSparseLoCoMean;
      break;
    case lbccAggMean:
      call.decode.aggregation = lbcc::codecs::Aggregation::kMean;
      break;
    case lbccAggSum:
      call.decode.aggregation = lbcc::codecs::Aggregation::kSum;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown lbccAggregation_t ", static_cast<int>(aggregation)));
  }
  for (int i = 0; i < ntensors; ++i) {
    if (deltas[i] == nullptr || outs[i] == nullptr || states[i] == nullptr ||
        (ranks[i] > 0 && dims[i] == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": tensor ", i, " has a NULL pointer"));
    }
    if (ranks[i] < 0 || ranks[i] > lbcc::kMaxRank) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, ": bad rank ", ranks[i]));
    }
    lbcc::Shape shape(dims[i], dims[i] + ranks[i]);
    LBCC_ASSIGN_OR_RETURN(lbcc::TensorView delta,
                          lbcc::TensorView::Host(const_cast<float*>(deltas[i]), shape));
    LBCC_ASSIGN_OR_RETURN(lbcc::TensorView out, lbcc::TensorView::Host(outs[i], shape));
    call.tensors.push_back({delta, out, &states[i]->state});
  }
  return call;
}

}  // namespace

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
  if (comm == nullptr) return g_last_error.c_str();
  lbcc::MutexLock lock(&comm->mu);
  // The communicator outlives the call; the pointer stays valid until its next failure.
  return comm->last_error.c_str();
}

lbccResult_t lbccGetUniqueId(lbccUniqueId* unique_id) {
  LBCC_C_CHECK_PTR("lbccGetUniqueId", unique_id);
  absl::StatusOr<lbcc::comm::UniqueId> id = lbcc::comm::CreateUniqueId(lbcc::comm::CommConfig());
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

// ---- Dense collectives (comm/dense_collectives.h): lbccReduce, lbccReduceScatter,
// lbccAllToAll, and lbccAllReduce for integer types and lbccProd/lbccMin/lbccMax.
namespace {

absl::StatusOr<lbcc::comm::DenseType> ToDenseType(lbccDataType_t type) {
  LBCC_ASSIGN_OR_RETURN(lbcc::DType dtype, ToDType(type));
  switch (dtype) {
    case lbcc::DType::kF32: return lbcc::comm::DenseType::kF32;
    case lbcc::DType::kF16: return lbcc::comm::DenseType::kF16;
    case lbcc::DType::kBF16: return lbcc::comm::DenseType::kBF16;
    case lbcc::DType::kI8: return lbcc::comm::DenseType::kI8;
    case lbcc::DType::kU8: return lbcc::comm::DenseType::kU8;
    case lbcc::DType::kI32: return lbcc::comm::DenseType::kI32;
    case lbcc::DType::kI64: return lbcc::comm::DenseType::kI64;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown lbccDataType_t ", static_cast<int>(type)));
}

absl::StatusOr<lbcc::comm::DenseOp> ToDenseOp(lbccRedOp_t op) {
  switch (op) {
    case lbccSum: return lbcc::comm::DenseOp::kSum;
    case lbccAvg: return lbcc::comm::DenseOp::kAvg;
    case lbccProd: return lbcc::comm::DenseOp::kProduct;
    case lbccMin: return lbcc::comm::DenseOp::kMin;
    case lbccMax: return lbcc::comm::DenseOp::kMax;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown lbccRedOp_t ", static_cast<int>(op)));
}

lbccResult_t DenseAllReduceC(const void* sendbuff, void* recvbuff, size_t count,
                             lbccDataType_t datatype, lbccRedOp_t op, lbccComm* comm,
                             lbccRequest_t* request) {
  absl::StatusOr<lbcc::comm::DenseType> type = ToDenseType(datatype);
  if (!type.ok()) return Reject("lbccAllReduce", type.status(), comm);
  absl::StatusOr<lbcc::comm::DenseOp> dense_op = ToDenseOp(op);
  if (!dense_op.ok()) return Reject("lbccAllReduce", dense_op.status(), comm);
  return Finish(comm->comm->DenseAllReduce(sendbuff, recvbuff, count, *type, *dense_op), comm,
                request);
}

}  // namespace

lbccResult_t lbccReduce(const void* sendbuff, void* recvbuff, size_t count,
                        lbccDataType_t datatype, lbccRedOp_t op, int root, lbccComm_t comm,
                        lbccRequest_t* request) {
  LBCC_C_CHECK_PTR("lbccReduce", comm);
  LBCC_C_CHECK_PTR("lbccReduce", request);
  if (count > 0) LBCC_C_CHECK_BUF("lbccReduce", sendbuff, comm);
  absl::StatusOr<lbcc::comm::DenseType> type = ToDenseType(datatype);
  if (!type.ok()) return Reject("lbccReduce", type.status(), comm);
  absl::StatusOr<lbcc::comm::DenseOp> dense_op = ToDenseOp(op);
  if (!dense_op.ok()) return Reject("lbccReduce", dense_op.status(), comm);
  return Finish(comm->comm->DenseReduce(sendbuff, recvbuff, count, *type, *dense_op, root), comm,
                request);
}

lbccResult_t lbccReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               lbccDataType_t datatype, lbccRedOp_t op, lbccComm_t comm,
                               lbccRequest_t* request) {
  LBCC_C_CHECK_PTR("lbccReduceScatter", comm);
  LBCC_C_CHECK_PTR("lbccReduceScatter", request);
  if (recvcount > 0) {
    LBCC_C_CHECK_BUF("lbccReduceScatter", sendbuff, comm);
    LBCC_C_CHECK_BUF("lbccReduceScatter", recvbuff, comm);
  }
  absl::StatusOr<lbcc::comm::DenseType> type = ToDenseType(datatype);
  if (!type.ok()) return Reject("lbccReduceScatter", type.status(), comm);
  absl::StatusOr<lbcc::comm::DenseOp> dense_op = ToDenseOp(op);
  if (!dense_op.ok()) return Reject("lbccReduceScatter", dense_op.status(), comm);
  return Finish(
      comm->comm->DenseReduceScatter(sendbuff, recvbuff, recvcount, *type, *dense_op), comm,
      request);
}

lbccResult_t lbccAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          lbccDataType_t datatype, lbccComm_t comm, lbccRequest_t* request) {
  LBCC_C_CHECK_PTR("lbccAllToAll", comm);
  LBCC_C_CHECK_PTR("lbccAllToAll", request);
  if (count > 0) {
    LBCC_C_CHECK_BUF("lbccAllToAll", sendbuff, comm);
    LBCC_C_CHECK_BUF("lbccAllToAll", recvbuff, comm);
  }
  absl::StatusOr<lbcc::comm::DenseType> type = ToDenseType(datatype);
  if (!type.ok()) return Reject("lbccAllToAll", type.status(), comm);
  const size_t block = count * lbcc::comm::DenseTypeSize(*type);
  lbcc::comm::AllToAllLayout layout;
  for (int i = 0; i < comm->comm->nranks(); ++i) {
    layout.send_offsets.push_back(i * block);
    layout.send_bytes.push_back(block);
    layout.recv_offsets.push_back(i * block);
    layout.recv_bytes.push_back(block);
  }
  return Finish(comm->comm->DenseAllToAll(sendbuff, recvbuff, std::move(layout)), comm, request);
}

lbccResult_t lbccAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           lbccDataType_t datatype, lbccRedOp_t op, lbccComm_t comm,
                           lbccRequest_t* request) {
  LBCC_C_CHECK_PTR("lbccAllReduce", comm);
  LBCC_C_CHECK_PTR("lbccAllReduce", request);
  if (count > 0) {
    LBCC_C_CHECK_BUF("lbccAllReduce", sendbuff, comm);
    LBCC_C_CHECK_BUF("lbccAllReduce", recvbuff, comm);
  }
  absl::StatusOr<lbcc::DType> dtype = ToDType(datatype);
  if (!dtype.ok()) return Reject("lbccAllReduce", dtype.status(), comm);
  if (op == lbccProd || op == lbccMin || op == lbccMax) {
    return DenseAllReduceC(sendbuff, recvbuff, count, datatype, op, comm, request);
  }
  const int64_t n = static_cast<int64_t>(count);
  absl::StatusOr<lbcc::TensorView> in =
      lbcc::TensorView::Create(const_cast<void*>(sendbuff), *dtype, {n});
  if (!in.ok()) return Reject("lbccAllReduce", in.status(), comm);
  absl::StatusOr<lbcc::TensorView> out = lbcc::TensorView::Create(recvbuff, *dtype, {n});
  if (!out.ok()) return Reject("lbccAllReduce", out.status(), comm);
  return Finish(comm->comm->AllReduce(*in, *out,
                                      op == lbccSum ? lbcc::comm::ReduceOp::kSum
                                                    : lbcc::comm::ReduceOp::kMean),
                comm, request);
}

lbccResult_t lbccAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           lbccDataType_t datatype, lbccComm_t comm, lbccRequest_t* request) {
  LBCC_C_CHECK_PTR("lbccAllGather", comm);
  LBCC_C_CHECK_PTR("lbccAllGather", request);
  if (sendcount > 0) {
    LBCC_C_CHECK_BUF("lbccAllGather", sendbuff, comm);
    LBCC_C_CHECK_BUF("lbccAllGather", recvbuff, comm);
  }
  absl::StatusOr<lbcc::DType> dtype = ToDType(datatype);
  if (!dtype.ok()) return Reject("lbccAllGather", dtype.status(), comm);
  const int64_t n = static_cast<int64_t>(sendcount);
  absl::StatusOr<lbcc::TensorView> in =
      lbcc::TensorView::Create(const_cast<void*>(sendbuff), *dtype, {n});
  if (!in.ok()) return Reject("lbccAllGather", in.status(), comm);
  absl::StatusOr<lbcc::TensorView> out =
      lbcc::TensorView::Create(recvbuff, *dtype, {n * comm->comm->nranks()});
  if (!out.ok()) return Reject("lbccAllGather", out.status(), comm);
  return Finish(comm->comm->AllGather(*in, *out), comm, request);
}

lbccResult_t lbccBroadcast(void* buff, size_t count, lbccDataType_t datatype, int root,
                           lbccComm_t comm, lbccRequest_t* request) {
  LBCC_C_CHECK_PTR("lbccBroadcast", comm);
  LBCC_C_CHECK_PTR("lbccBroadcast", request);
  if (count > 0) LBCC_C_CHECK_BUF("lbccBroadcast", buff, comm);
  absl::StatusOr<lbcc::DType> dtype = ToDType(datatype);
  if (!dtype.ok()) return Reject("lbccBroadcast", dtype.status(), comm);
  absl::StatusOr<lbcc::TensorView> view =
      lbcc::TensorView::Create(buff, *dtype, {static_cast<int64_t>(count)});
  if (!view.ok()) return Reject("lbccBroadcast", view.status(), comm);
  return Finish(comm->comm->Broadcast(*view, root), comm, request);
}

lbccResult_t lbccBarrier(lbccComm_t comm, lbccRequest_t* request) {
  LBCC_C_CHECK_PTR("lbccBarrier", comm);
  LBCC_C_CHECK_PTR("lbccBarrier", request);
  return Finish(comm->comm->Barrier(), comm, request);
}

lbccResult_t lbccTopKStateCreate(lbccTopKState_t* state) {
  LBCC_C_CHECK_PTR("lbccTopKStateCreate", state);
  *state = new lbccTopKState();
  return lbccSuccess;
}

lbccResult_t lbccTopKStateDestroy(lbccTopKState_t state) {
  LBCC_C_CHECK_PTR("lbccTopKStateDestroy", state);
  delete state;
  return lbccSuccess;
}

lbccResult_t lbccSparseAllReduce(int ntensors, const float* const* deltas, float* const* outs,
                                 const int* ranks, const int64_t* const* dims,
                                 lbccTopKState_t* states, const lbccTopKConfig_t* config,
                                 lbccAggregation_t aggregation, lbccComm_t comm,
                                 lbccRequest_t* request) {
  const char* kName = "lbccSparseAllReduce";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  absl::StatusOr<SparseCall> call =
      ParseSparseCall(kName, ntensors, deltas, outs, ranks, dims, states, config, aggregation);
  if (!call.ok()) return Reject(kName, call.status(), comm);
  return Finish(comm->comm->SparseAllReduce(std::move(call->tensors), call->codec.get(),
                                            call->decode),
                comm, request, call->codec);
}

lbccResult_t lbccSendCompressed(const float* buff, int ndims, const int64_t* dims,
                                const lbccDenseConfig_t* config, int peer, uint32_t tag,
                                lbccComm_t comm, lbccRequest_t* request) {
  LBCC_C_CHECK_PTR("lbccSendCompressed", comm);
  LBCC_C_CHECK_PTR("lbccSendCompressed", request);
  absl::StatusOr<lbcc::TensorView> view = HostView(const_cast<float*>(buff), ndims, dims);
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), "lbccSendCompressed"), comm);
  lbcc::codecs::DenseQuantOptions options;
  if (config != nullptr) {
    if (config->size != sizeof(lbccDenseConfig_t)) {
      return Fail(absl::InvalidArgumentError(
                      "lbccDenseConfig_t.size is wrong: use LBCC_DENSE_CONFIG_INITIALIZER"),
                  comm);
    }
    switch (config->format) {
      case lbccDenseInt8:
        options.format = lbcc::codecs::DenseFormat::kInt8;
        break;
      case lbccDenseInt4:
        options.format = lbcc::codecs::DenseFormat::kInt4;
        break;
      case lbccDenseFp16:
        options.format = lbcc::codecs::DenseFormat::kF16;
        break;
      case lbccDenseBf16:
        options.format = lbcc::codecs::DenseFormat::kBf16;
        break;
      default:
        return Fail(absl::InvalidArgumentError(absl::StrCat(
                        "unknown lbccDenseFormat_t ", static_cast<int>(config->format))),
                    comm);
    }
    options.block = config->block;
    options.stochastic = config->stochastic != 0;
  }
  absl::StatusOr<std::unique_ptr<lbcc::codecs::DenseQuantCodec>> codec =
      lbcc::codecs::DenseQuantCodec::Create(options);
  if (!codec.ok()) return Fail(codec.status(), comm);
  std::shared_ptr<lbcc::codecs::DenseQuantCodec> shared(std::move(*codec));
  return Finish(comm->comm->SendCompressed(*view, shared.get(), nullptr, peer, tag), comm,
                request, shared);
}

lbccResult_t lbccRecvCompressed(float* buff, int ndims, const int64_t* dims, int peer,
                                uint32_t tag, lbccComm_t comm, lbccRequest_t* request) {
  LBCC_C_CHECK_PTR("lbccRecvCompressed", comm);
  LBCC_C_CHECK_PTR("lbccRecvCompressed", request);
  absl::StatusOr<lbcc::TensorView> view = HostView(buff, ndims, dims);
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), "lbccRecvCompressed"), comm);
  return Finish(comm->comm->RecvCompressed(*view, peer, tag), comm, request);
}

lbccResult_t lbccTest(lbccRequest_t request) {
  LBCC_C_CHECK_PTR("lbccTest", request);
  if (!request->request->Test()) return lbccInProgress;
  return Fail(request->request->status(), request->comm);
}

lbccResult_t lbccWait(lbccRequest_t request) {
  LBCC_C_CHECK_PTR("lbccWait", request);
  return Fail(request->request->Wait(), request->comm);
}

lbccResult_t lbccRequestFree(lbccRequest_t request) {
  LBCC_C_CHECK_PTR("lbccRequestFree", request);
  // A request freed while running would leave its operation writing into buffers the caller
  // may reuse: wait for it first.
  (void)request->request->Wait();
  delete request;
  return lbccSuccess;
}

}  // extern "C"

// ---- Pipeline activations (comm/activations.h) ----

struct lbccBasis {
  lbcc::comm::SubspaceBasisPtr basis;
};

namespace {

// A handle over `basis`; a mixture basis is refused (the C API carries no selectors).
lbccResult_t NewBasis(absl::StatusOr<lbcc::comm::SubspaceBasisPtr> made, const char* function,
                      lbccBasis_t* out) {
  if (!made.ok()) return Fail(lbcc::Annotate(made.status(), function));
  if ((*made)->components() != 1) {
    return Fail(absl::UnimplementedError(absl::StrCat(
        function, ": a mixture basis (M = ", (*made)->components(),
        ") needs the forward's selectors for its backward, which the C API does not carry: "
        "use the C++ ActivationChannel")));
  }
  *out = new lbccBasis{*std::move(made)};
  return lbccSuccess;
}

absl::StatusOr<lbcc::codecs::SubspaceCodecOptions> ActivationOptions(
    const lbccActivationConfig_t* config) {
  lbcc::codecs::SubspaceCodecOptions options;
  if (config == nullptr) return options;
  if (config->size != sizeof(lbccActivationConfig_t)) {
    return absl::InvalidArgumentError(
        "lbccActivationConfig_t.size is wrong: use LBCC_ACTIVATION_CONFIG_INITIALIZER");
  }
  LBCC_ASSIGN_OR_RETURN(options.coefficient_dtype, ToDType(config->coefficients));
  options.int8_block = config->int8Block;
  return options;  // The codec checks the values (f32, bf16, f16 or i8; the block's range).
}

absl::StatusOr<std::vector<lbcc::comm::SubspaceBasisPtr>> AcceptedBases(const lbccBasis_t* bases,
                                                                        int nbases) {
  if (nbases < 1) return absl::InvalidArgumentError(absl::StrCat("nbases ", nbases, " < 1"));
  std::vector<lbcc::comm::SubspaceBasisPtr> accepted;
  for (int i = 0; i < nbases; ++i) {
    if (bases[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("bases[", i, "] is NULL"));
    }
    accepted.push_back(bases[i]->basis);
  }
  return accepted;
}

// A host f32 view of [tokens, d].
absl::StatusOr<lbcc::TensorView> TokensView(const float* data, int64_t tokens,
                                            const lbcc::codecs::SubspaceBasis& basis) {
  const int64_t d = basis.model_dim();
  if (tokens < 0 || tokens > INT64_MAX / 8 / d) {
    return absl::InvalidArgumentError(absl::StrCat("bad tokens ", tokens));
  }
  if (tokens > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("NULL buffer for ", tokens, " tokens"));
  }
  return lbcc::TensorView::Host(const_cast<float*>(data), {tokens, d});
}

// The ids of `tokens` tokens for `basis`: none when it has no vocabulary (or ids is NULL on a
// receive).
absl::StatusOr<absl::Span<int32_t>> IdSpan(const int32_t* ids, int64_t tokens,
                                           const lbcc::codecs::SubspaceBasis& basis,
                                           bool required) {
  if (basis.vocab_size() == 0 || tokens == 0 || (ids == nullptr && !required)) {
    return absl::Span<int32_t>();
  }
  if (ids == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ids is NULL, but basis ", basis.id().ToString(), " has a vocabulary of ",
        basis.vocab_size()));
  }
  return absl::Span<int32_t>(const_cast<int32_t*>(ids), static_cast<size_t>(tokens));
}

}  // namespace

extern "C" {

lbccResult_t lbccBasisCreateFromSeed(const lbccBasisSpec_t* spec, lbccBasis_t* basis) {
  LBCC_C_CHECK_PTR("lbccBasisCreateFromSeed", spec);
  LBCC_C_CHECK_PTR("lbccBasisCreateFromSeed", basis);
  *basis = nullptr;
  if (spec->size != sizeof(lbccBasisSpec_t)) {
    return Fail(absl::InvalidArgumentError(
        "lbccBasisSpec_t.size is wrong: initialise it with LBCC_BASIS_SPEC_INITIALIZER"));
  }
  lbcc::codecs::SubspaceSeedSpec s;
  s.model_dim = spec->modelDim;
  s.rank = spec->rank;
  s.vocab_size = spec->vocabSize;
  s.with_table = spec->withTable != 0;
  s.table_stddev = spec->tableStddev;
  s.seed = spec->seed;
  s.version = spec->version;
  return NewBasis(lbcc::codecs::SubspaceBasis::FromSeed(s), "lbccBasisCreateFromSeed", basis);
}

lbccResult_t lbccBasisLoad(const char* path, lbccBasis_t* basis) {
  LBCC_C_CHECK_PTR("lbccBasisLoad", path);
  LBCC_C_CHECK_PTR("lbccBasisLoad", basis);
  *basis = nullptr;
  return NewBasis(lbcc::codecs::SubspaceBasis::Load(path), "lbccBasisLoad", basis);
}

lbccResult_t lbccBasisDestroy(lbccBasis_t basis) {
  LBCC_C_CHECK_PTR("lbccBasisDestroy", basis);
  delete basis;
  return lbccSuccess;
}

lbccResult_t lbccBasisGetInfo(const lbccBasis_t basis, int64_t* model_dim, int64_t* rank,
                              int64_t* vocab_size, uint64_t* hash, uint32_t* version) {
  LBCC_C_CHECK_PTR("lbccBasisGetInfo", basis);
  const lbcc::codecs::SubspaceBasis& b = *basis->basis;
  if (model_dim) *model_dim = b.model_dim();
  if (rank) *rank = b.rank();
  if (vocab_size) *vocab_size = b.vocab_size();
  if (hash) *hash = b.id().hash;
  if (version) *version = b.id().version;
  return lbccSuccess;
}

lbccResult_t lbccSendActivations(const float* h, const int32_t* ids, int64_t tokens,
                                 lbccBasis_t basis, const lbccActivationConfig_t* config,
                                 int peer, uint32_t tag, lbccComm_t comm,
                                 lbccRequest_t* request) {
  const char* kName = "lbccSendActivations";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  LBCC_C_CHECK_PTR(kName, basis);
  absl::StatusOr<lbcc::TensorView> view = TokensView(h, tokens, *basis->basis);
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName), comm);
  absl::StatusOr<absl::Span<int32_t>> id_span = IdSpan(ids, tokens, *basis->basis, true);
  if (!id_span.ok()) return Fail(lbcc::Annotate(id_span.status(), kName), comm);
  absl::StatusOr<lbcc::codecs::SubspaceCodecOptions> options = ActivationOptions(config);
  if (!options.ok()) return Fail(options.status(), comm);
  return Finish(lbcc::comm::SendActivations(*comm->comm, *view, *id_span, basis->basis, *options,
                                            peer, tag),
                comm, request);
}

lbccResult_t lbccRecvActivations(float* h, int32_t* ids, int64_t tokens, const lbccBasis_t* bases,
                                 int nbases, int peer, uint32_t tag, lbccComm_t comm,
                                 lbccRequest_t* request) {
  const char* kName = "lbccRecvActivations";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  LBCC_C_CHECK_PTR(kName, bases);
  absl::StatusOr<std::vector<lbcc::comm::SubspaceBasisPtr>> accepted =
      AcceptedBases(bases, nbases);
  if (!accepted.ok()) return Fail(lbcc::Annotate(accepted.status(), kName), comm);
  const lbcc::codecs::SubspaceBasis& newest = *accepted->front();
  absl::StatusOr<lbcc::TensorView> view = TokensView(h, tokens, newest);
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName), comm);
  absl::StatusOr<absl::Span<int32_t>> id_span = IdSpan(ids, tokens, newest, false);
  if (!id_span.ok()) return Fail(lbcc::Annotate(id_span.status(), kName), comm);
  return Finish(lbcc::comm::RecvActivations(*comm->comm, *view, *id_span, *std::move(accepted),
                                            peer, tag),
                comm, request);
}

lbccResult_t lbccSendActivationGrads(const float* grads, int64_t tokens, lbccBasis_t basis,
                                     const lbccActivationConfig_t* config, int peer, uint32_t tag,
                                     lbccComm_t comm, lbccRequest_t* request) {
  const char* kName = "lbccSendActivationGrads";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  LBCC_C_CHECK_PTR(kName, basis);
  absl::StatusOr<lbcc::TensorView> view = TokensView(grads, tokens, *basis->basis);
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName), comm);
  absl::StatusOr<lbcc::codecs::SubspaceCodecOptions> options = ActivationOptions(config);
  if (!options.ok()) return Fail(options.status(), comm);
  return Finish(lbcc::comm::SendActivationGrads(*comm->comm, *view, basis->basis, *options, {},
                                                peer, tag),
                comm, request);
}

lbccResult_t lbccRecvActivationGrads(float* grads, int64_t tokens, const lbccBasis_t* bases,
                                     int nbases, int peer, uint32_t tag, lbccComm_t comm,
                                     lbccRequest_t* request) {
  const char* kName = "lbccRecvActivationGrads";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  LBCC_C_CHECK_PTR(kName, bases);
  absl::StatusOr<std::vector<lbcc::comm::SubspaceBasisPtr>> accepted =
      AcceptedBases(bases, nbases);
  if (!accepted.ok()) return Fail(lbcc::Annotate(accepted.status(), kName), comm);
  absl::StatusOr<lbcc::TensorView> view = TokensView(grads, tokens, *accepted->front());
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName), comm);
  return Finish(lbcc::comm::RecvActivationGrads(*comm->comm, *view, *std::move(accepted), peer,
                                                tag),
                comm, request);
}

lbccResult_t lbccBasisRefreshTable(lbccBasis_t basis, float* embedding,
                                   lbccTableRefreshMode_t mode, lbccBasis_t* next) {
  const char* kName = "lbccBasisRefreshTable";
  LBCC_C_CHECK_PTR(kName, basis);
  LBCC_C_CHECK_PTR(kName, next);
  *next = nullptr;
  lbcc::codecs::TableRefreshMode refresh;
  switch (mode) {
    case LBCC_TABLE_LOSSY:
      refresh = lbcc::codecs::TableRefreshMode::kLossy;
      break;
    case LBCC_TABLE_CONSTRAINED:
      refresh = lbcc::codecs::TableRefreshMode::kConstrained;
      break;
    default:
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(kName, ": unknown lbccTableRefreshMode_t ", static_cast<int>(mode))));
  }
  const lbcc::codecs::SubspaceBasis& b = *basis->basis;
  const int64_t v = b.vocab_size(), d = b.model_dim();
  if (v > 0 && embedding == nullptr) return NullArgument(kName, "embedding");
  absl::StatusOr<lbcc::TensorView> view = lbcc::TensorView::Host(embedding, {v, d});
  if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName));
  return NewBasis(lbcc::codecs::RefreshTable(b, *view, refresh,
                                             lbcc::codecs::SubspaceArithmetic::kPortable),
                  kName, next);
}

lbccResult_t lbccSendTableUpdate(const float* before, const float* after, size_t count, int peer,
                                 uint32_t tag, lbccComm_t comm, size_t* bytes,
                                 lbccRequest_t* request) {
  const char* kName = "lbccSendTableUpdate";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  if (count > 0) {
    LBCC_C_CHECK_PTR(kName, before);
    LBCC_C_CHECK_PTR(kName, after);
  }
  return Finish(lbcc::comm::SendTableUpdate(*comm->comm, absl::MakeConstSpan(before, count),
                                            absl::MakeConstSpan(after, count), peer, tag, bytes),
                comm, request);
}

lbccResult_t lbccRecvTableUpdate(float* table, size_t count, int peer, uint32_t tag,
                                 lbccComm_t comm, size_t* bytes, lbccRequest_t* request) {
  const char* kName = "lbccRecvTableUpdate";
  LBCC_C_CHECK_PTR(kName, comm);
  LBCC_C_CHECK_PTR(kName, request);
  if (count > 0) LBCC_C_CHECK_PTR(kName, table);
  return Finish(lbcc::comm::RecvTableUpdate(*comm->comm, absl::MakeSpan(table, count), peer, tag,
                                            bytes),
                comm, request);
}

}  // extern "C"

// ---- Elastic membership (comm/elastic.h) ----
struct lbccElastic {
  std::unique_ptr<lbcc::comm::ElasticGroup> group;
};

struct lbccElasticMaster {
  std::unique_ptr<lbcc::comm::ElasticMaster> master;
  std::string address;
};

struct lbccElasticUnits {
  std::shared_ptr<lbcc::comm::ElasticUnits> units;
};

namespace {

// Fail, with the one retryable status (membership changed) as lbccMembershipChanged and a
// pipeline stage's "its replica left" as lbccReplicaLeft.
lbccResult_t FailElastic(const absl::Status& status) {
  const lbccResult_t result = Fail(status);
  if (lbcc::comm::IsRetryable(status)) return lbccMembershipChanged;
  if (lbcc::comm::IsReplicaLeft(status)) return lbccReplicaLeft;
  return result;
}

// The sizes of lbccElasticConfig_t's layouts: before pipeline units (it ended at `comm`), now.
constexpr size_t kElasticConfigSizeBeforeUnits = offsetof(lbccElasticConfig_t, replica);

absl::StatusOr<absl::Duration> SecondsField(double value, const char* field,
                                            absl::Duration unset) {
  if (value == LBCC_CONFIG_UNDEF_DOUBLE) return unset;
  if (!(value > 0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("lbccElasticConfig_t.", field, "=", value,
                                                   " is invalid: expected a finite number > 0 "
                                                   "(LBCC_CONFIG_UNDEF_DOUBLE: the default)"));
  }
  return absl::Seconds(value);
}

absl::StatusOr<lbcc::comm::ElasticOptions> ElasticOptionsFrom(const lbccElasticConfig_t* config) {
  if ((config->size != sizeof(lbccElasticConfig_t) &&
       config->size != kElasticConfigSizeBeforeUnits) ||
      config->magic != LBCC_CONFIG_MAGIC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lbccElasticConfig_t.size=", config->size, " or its magic is wrong (this library's size is ",
        sizeof(lbccElasticConfig_t), ", or ", kElasticConfigSizeBeforeUnits,
        " before pipeline units): initialise it with LBCC_ELASTIC_CONFIG_INITIALIZER"));
  }
  if (config->version > LBCC_VERSION_CODE) {
    return absl::InvalidArgumentError(absl::StrCat("lbccElasticConfig_t.version=", config->version,
                                                   " is newer than this library (",
                                                   LBCC_VERSION_CODE, ")"));
  }
  if (config->jobId == nullptr) {
    return absl::InvalidArgumentError("lbccElasticConfig_t.jobId is NULL");
  }
  lbcc::comm::ElasticOptions options;
  if (config->masterAddr != nullptr) options.master_address = config->masterAddr;
  options.job_id = config->jobId;
  if (config->name != nullptr) options.name = config->name;
  LBCC_ASSIGN_OR_RETURN(options.op_timeout,
                        SecondsField(config->opTimeoutSeconds, "opTimeoutSeconds",
                                     options.op_timeout));
  LBCC_ASSIGN_OR_RETURN(options.join_timeout,
                        SecondsField(config->joinTimeoutSeconds, "joinTimeoutSeconds",
                                     options.join_timeout));
  LBCC_ASSIGN_OR_RETURN(options.peer_timeout,
                        SecondsField(config->peerTimeoutSeconds, "peerTimeoutSeconds",
                                     options.peer_timeout));
  if (config->stateStep < -1) {
    return absl::InvalidArgumentError(absl::StrCat("lbccElasticConfig_t.stateStep=",
                                                   config->stateStep, " is invalid: >= -1"));
  }
  options.state_step = config->stateStep;
  if (config->comm != nullptr) {
    LBCC_ASSIGN_OR_RETURN(options.comm_config, ConfigFrom(config->comm));
  }
  if (config->size < sizeof(lbccElasticConfig_t)) return options;  // a full replica
  // A pipeline stage: checked here, naming the fields, before anything connects.
  if (config->replica == nullptr) {
    if (config->replicaStages != 0 || config->stage != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lbccElasticConfig_t.replicaStages=", config->replicaStages, ", stage=", config->stage,
          " without a replica: set lbccElasticConfig_t.replica (a pipeline stage) or leave both "
          "0 (a full replica)"));
    }
    return options;
  }
  if (config->replica[0] == '\0') {
    return absl::InvalidArgumentError(
        "lbccElasticConfig_t.replica is empty: a pipeline replica's name, or NULL for a full "
        "replica");
  }
  if (config->replicaStages < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lbccElasticConfig_t.replicaStages=", config->replicaStages, " is invalid for replica '",
        config->replica, "': expected the pipeline replica's number of stages, >= 1"));
  }
  if (config->stage < 0 || config->stage >= config->replicaStages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lbccElasticConfig_t.stage=", config->stage, " is invalid for replica '",
        config->replica, "' of ", config->replicaStages, " stages: expected 0 <= stage < ",
        config->replicaStages));
  }
  options.replica = config->replica;
  options.stage = config->stage;
  options.replica_stages = config->replicaStages;
  return options;
}

absl::StatusOr<lbcc::comm::ElasticMasterOptions> MasterOptionsFrom(
    const lbccElasticMasterConfig_t* config) {
  if (config->size != sizeof(lbccElasticMasterConfig_t) || config->magic != LBCC_CONFIG_MAGIC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lbccElasticMasterConfig_t.size=", config->size,
        " or its magic is wrong (this library's size is ", sizeof(lbccElasticMasterConfig_t),
        "): initialise it with LBCC_ELASTIC_MASTER_CONFIG_INITIALIZER"));
  }
  if (config->version > LBCC_VERSION_CODE) {
    return absl::InvalidArgumentError(absl::StrCat("lbccElasticMasterConfig_t.version=",
                                                   config->version, " is newer than this library (",
                                                   LBCC_VERSION_CODE, ")"));
  }
  if (config->jobId == nullptr || config->jobId[0] == '\0') {
    return absl::InvalidArgumentError("lbccElasticMasterConfig_t.jobId is NULL or empty");
  }
  if (config->minMembers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("lbccElasticMasterConfig_t.minMembers=",
                                                   config->minMembers, " is invalid: >= 1"));
  }
  lbcc::comm::ElasticMasterOptions options;
  if (config->listenAddr != nullptr) options.listen_address = config->listenAddr;
  options.job_id = config->jobId;
  options.min_members = config->minMembers;
  if (config->bootstrapHost != nullptr) options.bootstrap_host = config->bootstrapHost;
  const auto seconds = [](double value, const char* field) -> absl::StatusOr<absl::Duration> {
    if (value == LBCC_CONFIG_UNDEF_DOUBLE) return absl::ZeroDuration();
    if (!(value > 0) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lbccElasticMasterConfig_t.", field, "=", value,
          " is invalid: expected a finite number > 0 (LBCC_CONFIG_UNDEF_DOUBLE: the default)"));
    }
    return absl::Seconds(value);
  };
  LBCC_ASSIGN_OR_RETURN(options.peer_timeout,
                        seconds(config->peerTimeoutSeconds, "peerTimeoutSeconds"));
  LBCC_ASSIGN_OR_RETURN(options.setup_timeout,
                        seconds(config->setupTimeoutSeconds, "setupTimeoutSeconds"));
  if (config->units != nullptr) options.units = config->units->units;
  return options;
}

lbccResult_t StartMaster(lbccElasticMaster_t* master, lbcc::comm::ElasticMasterOptions options,
                         const char* function) {
  absl::StatusOr<std::unique_ptr<lbcc::comm::ElasticMaster>> started =
      lbcc::comm::ElasticMaster::Start(std::move(options));
  if (!started.ok()) return Fail(lbcc::Annotate(started.status(), function));
  *master = new lbccElasticMaster{std::move(*started), ""};
  (*master)->address = (*master)->master->address();
  return lbccSuccess;
}

}  // namespace

extern "C" {

lbccResult_t lbccElasticJoin(lbccElastic_t* group, const lbccElasticConfig_t* config, int nstate,
                             void* const* state, const size_t* state_bytes) {
  const char* kName = "lbccElasticJoin";
  LBCC_C_CHECK_PTR(kName, group);
  LBCC_C_CHECK_PTR(kName, config);
  if (nstate < 0) return Fail(absl::InvalidArgumentError("lbccElasticJoin: nstate < 0"));
  if (nstate > 0) {
    LBCC_C_CHECK_PTR(kName, state);
    LBCC_C_CHECK_PTR(kName, state_bytes);
  }
  absl::StatusOr<lbcc::comm::ElasticOptions> options = ElasticOptionsFrom(config);
  if (!options.ok()) return Fail(lbcc::Annotate(options.status(), kName));
  std::vector<lbcc::TensorView> views;
  for (int i = 0; i < nstate; ++i) {
    if (state[i] == nullptr && state_bytes[i] > 0) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("lbccElasticJoin: state buffer ", i, " is NULL")));
    }
    absl::StatusOr<lbcc::TensorView> view = lbcc::TensorView::Create(
        state[i], lbcc::DType::kU8, {static_cast<int64_t>(state_bytes[i])});
    if (!view.ok()) return Fail(lbcc::Annotate(view.status(), kName));
    views.push_back(*view);
  }
  absl::StatusOr<std::unique_ptr<lbcc::comm::ElasticGroup>> joined =
      lbcc::comm::ElasticGroup::Join(*std::move(options), std::move(views));
  if (!joined.ok()) return FailElastic(joined.status());
  *group = new lbccElastic{std::move(*joined)};
  return lbccSuccess;
}

lbccResult_t lbccElasticBoundary(lbccElastic_t group) {
  LBCC_C_CHECK_PTR("lbccElasticBoundary", group);
  return FailElastic(group->group->Boundary());
}

lbccResult_t lbccElasticSparseAllReduce(int ntensors, const float* const* deltas,
                                        float* const* outs, const int* ranks,
                                        const int64_t* const* dims, lbccTopKState_t* states,
                                        const lbccTopKConfig_t* config,
                                        lbccAggregation_t aggregation, lbccElastic_t group) {
  const char* kName = "lbccElasticSparseAllReduce";
  LBCC_C_CHECK_PTR(kName, group);
  absl::StatusOr<SparseCall> call =
      ParseSparseCall(kName, ntensors, deltas, outs, ranks, dims, states, config, aggregation);
  if (!call.ok()) return Fail(lbcc::Annotate(call.status(), kName));
  return FailElastic(
      group->group->SparseAllReduce(call->tensors, call->codec.get(), call->decode));
}

lbccResult_t lbccElasticLeave(lbccElastic_t group) {
  LBCC_C_CHECK_PTR("lbccElasticLeave", group);
  return FailElastic(group->group->Leave());
}

lbccResult_t lbccElasticQuery(const lbccElastic_t group, uint64_t* epoch, int* rank, int* size,
                              uint64_t* step) {
  LBCC_C_CHECK_PTR("lbccElasticQuery", group);
  if (epoch != nullptr) *epoch = group->group->epoch();
  if (rank != nullptr) *rank = group->group->rank();
  if (size != nullptr) *size = group->group->size();
  if (step != nullptr) *step = group->group->step();
  return lbccSuccess;
}

lbccResult_t lbccElasticDestroy(lbccElastic_t group) {
  LBCC_C_CHECK_PTR("lbccElasticDestroy", group);
  delete group;
  return lbccSuccess;
}

lbccResult_t lbccElasticMasterCreate(lbccElasticMaster_t* master, const char* listen_addr,
                                     const char* job_id, int min_members,
                                     double peer_timeout_seconds) {
  LBCC_C_CHECK_PTR("lbccElasticMasterCreate", master);
  LBCC_C_CHECK_PTR("lbccElasticMasterCreate", job_id);
  lbcc::comm::ElasticMasterOptions options;
  if (listen_addr != nullptr) options.listen_address = listen_addr;
  options.job_id = job_id;
  options.min_members = min_members;
  if (!std::isfinite(peer_timeout_seconds)) {
    return Fail(absl::InvalidArgumentError("lbccElasticMasterCreate: peerTimeoutSeconds is not finite"));
  }
  if (peer_timeout_seconds > 0) options.peer_timeout = absl::Seconds(peer_timeout_seconds);
  return StartMaster(master, std::move(options), "lbccElasticMasterCreate");
}

lbccResult_t lbccElasticMasterCreateConfig(lbccElasticMaster_t* master,
                                           const lbccElasticMasterConfig_t* config) {
  const char* kName = "lbccElasticMasterCreateConfig";
  LBCC_C_CHECK_PTR(kName, master);
  LBCC_C_CHECK_PTR(kName, config);
  absl::StatusOr<lbcc::comm::ElasticMasterOptions> options = MasterOptionsFrom(config);
  if (!options.ok()) return Fail(lbcc::Annotate(options.status(), kName));
  return StartMaster(master, *std::move(options), kName);
}

lbccResult_t lbccElasticUnitsCreate(lbccElasticUnits_t* units) {
  LBCC_C_CHECK_PTR("lbccElasticUnitsCreate", units);
  *units = new lbccElasticUnits{lbcc::comm::NewElasticUnits()};
  return lbccSuccess;
}

lbccResult_t lbccElasticUnitsDestroy(lbccElasticUnits_t units) {
  LBCC_C_CHECK_PTR("lbccElasticUnitsDestroy", units);
  delete units;  // the masters hold their own references
  return lbccSuccess;
}

const char* lbccElasticMasterAddress(const lbccElasticMaster_t master) {
  return master == nullptr ? "" : master->address.c_str();
}

lbccResult_t lbccElasticMasterQuery(const lbccElasticMaster_t master, uint64_t* epoch,
                                    int* members, uint64_t* committed_steps) {
  LBCC_C_CHECK_PTR("lbccElasticMasterQuery", master);
  if (epoch != nullptr) *epoch = master->master->epoch();
  if (members != nullptr) *members = master->master->members();
  if (committed_steps != nullptr) *committed_steps = master->master->committed_steps();
  return lbccSuccess;
}

lbccResult_t lbccElasticMasterDestroy(lbccElasticMaster_t master) {
  LBCC_C_CHECK_PTR("lbccElasticMasterDestroy", master);
  master->master->Stop();
  delete master;
  return lbccSuccess;
}

}  // extern "C"
// ---- end of Elastic membership ----
