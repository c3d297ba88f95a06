// The C API's one internal header, shared by its sections (c_api_communicator.cc,
// c_api_collectives.cc, c_api_activations.cc, comm/elastic/c_api.cc): the handles behind lbcc.h's
// opaque types, the one conversion from Status (Fail), argument checks, and the converters more
// than one section uses. Not installed; nothing outside the C API includes it.
//
// The sections define extern "C" functions at global scope, so the helpers live in
// lbcc::comm::c_api and are named at global scope below (this header is included only by them).
//
// Thread safety: the helpers are pure except Fail, which writes the calling thread's last error
// and the communicator's (under its mutex).
#ifndef LBCC_COMM_C_API_INTERNAL_H_
#define LBCC_COMM_C_API_INTERNAL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"
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

namespace lbcc::comm::c_api {

lbccResult_t ToResult(absl::StatusCode code);

// The one conversion from Status: records the message (for lbccGetLastError: the calling
// thread's, and `comm`'s when given) and returns the code.
lbccResult_t Fail(const absl::Status& status, lbccComm* comm = nullptr);

lbccResult_t NullArgument(const char* function, const char* name);

// A collective's argument error on a valid communicator: the call still takes part (an error
// contribution in its place, Communicator::PostRejected), so every rank fails this operation
// and the ranks stay in step; the error is reported from the call itself.
lbccResult_t Reject(const char* function, const absl::Status& status, lbccComm* comm);

// lbccDataType_t -> DType (the C enum mirrors DType's wire ids); InvalidArgument if unknown.
absl::StatusOr<DType> ToDType(lbccDataType_t type);

// lbccConfig_t -> CommConfig, field by field; NULL is the default config.
absl::StatusOr<CommConfig> ConfigFrom(const lbccConfig_t* config);

// A posted request as an lbccRequest_t; an argument error known at post time is reported from
// the call itself. `keep_alive` lives as long as the request.
lbccResult_t Finish(RequestPtr request, lbccComm* comm, lbccRequest_t* out,
                    std::shared_ptr<void> keep_alive = nullptr);

// lbccSparseAllReduce's and lbccElasticSparseAllReduce's arguments, checked.
struct SparseCall {
  std::vector<Communicator::SparseTensor> tensors;
  std::shared_ptr<codecs::TopKEfCodec> codec;
  codecs::DecodeOptions decode;
};

absl::StatusOr<SparseCall> ParseSparseCall(const char* name, int ntensors,
                                           const float* const* deltas, float* const* outs,
                                           const int* ranks, const int64_t* const* dims,
                                           lbccTopKState_t* states,
                                           const lbccTopKConfig_t* config,
                                           lbccAggregation_t aggregation);

}  // namespace lbcc::comm::c_api

using lbcc::comm::Communicator;
using lbcc::comm::c_api::ConfigFrom;
using lbcc::comm::c_api::Fail;
using lbcc::comm::c_api::Finish;
using lbcc::comm::c_api::NullArgument;
using lbcc::comm::c_api::ParseSparseCall;
using lbcc::comm::c_api::Reject;
using lbcc::comm::c_api::SparseCall;
using lbcc::comm::c_api::ToDType;

#define LBCC_C_CHECK_PTR(function, ptr) \
  if ((ptr) == nullptr) return NullArgument(function, #ptr)

// A NULL buffer of a collective: rejected as Reject does.
#define LBCC_C_CHECK_BUF(function, ptr, comm)                                                   \
  if ((ptr) == nullptr)                                                                         \
  return Reject(function,                                                                       \
                absl::InvalidArgumentError(absl::StrCat(function, ": ", #ptr, " is NULL")), comm)

#endif  // LBCC_COMM_C_API_INTERNAL_H_
