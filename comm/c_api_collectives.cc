// The C API's collectives section (comm/lbcc.h): dense and sparse collectives, requests
// (test, wait, free), top-k state, compressed send and receive.
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/dense_quant.h"
#include "codecs/topk_ef.h"
#include "comm/c_api_internal.h"
#include "comm/communicator.h"
#include "comm/lbcc.h"

namespace {

// A host f32 view of `ndims` dims; NULL data is allowed only for empty tensors.
absl::StatusOr<lbcc::TensorView> HostView(float* data, int ndims, const int64_t* dims) {
  if (ndims < 0 || ndims > lbcc::kMaxRank || (ndims > 0 && dims == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("bad ndims ", ndims, " or NULL dims"));
  }
  return lbcc::TensorView::Host(data, lbcc::Shape(dims, dims + ndims));
}

}  // namespace

namespace lbcc::comm::c_api {
namespace {

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
    case lbccValues2Bit: options.values = lbcc::codecs::ValueCoding::kBinMean2; break;
    case lbccValues4Bit: options.values = lbcc::codecs::ValueCoding::kBinMean4; break;
    case lbccValues8Bit: options.values = lbcc::codecs::ValueCoding::kBinMean8; break;
    case lbccValuesBf16: options.values = lbcc::codecs::ValueCoding::kBf16; break;
    case lbccValuesFp16: options.values = lbcc::codecs::ValueCoding::kF16; break;
    case lbccValuesFp32: options.values = lbcc::codecs::ValueCoding::kF32; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown lbccValueCoding_t ", static_cast<int>(config->values)));
  }
  LBCC_RETURN_IF_ERROR(options.Validate());
  return options;
}

}  // namespace

lbccResult_t Finish(lbcc::comm::RequestPtr request, lbccComm* comm, lbccRequest_t* out,
                    std::shared_ptr<void> keep_alive) {
  // Argument errors are known at once: report them from the call itself. Failures of a posted
  // operation come from lbccTest / lbccWait, even when they happen before this returns.
  if (request->RejectedAtPost()) return Fail(request->status(), comm);
  *out = new lbccRequest{std::move(request), comm, std::move(keep_alive)};
  return lbccSuccess;
}

absl::StatusOr<SparseCall> ParseSparseCall(const char* name, int ntensors,
                                           const float* const* deltas, float* const* outs,
                                           const int* ranks, const int64_t* const* dims,
                                           lbccTopKState_t* states, const lbccTopKConfig_t* config,
                                           lbccAggregation_t aggregation) {
  if (ntensors < 0) return absl::InvalidArgumentError("ntensors < 0");
  if (ntensors > 0) {
    for (const auto& [ptr, what] : {std::pair<const void*, const char*>{deltas, "deltas"},
                                    {outs, "outs"},
                                    {ranks, "ranks"},
                                    {dims, "dims"},
                                    {states, "states"}}) {
      if (ptr == nullptr)
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", what, " is NULL"));
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
    case lbccAggMean: call.decode.aggregation = lbcc::codecs::Aggregation::kMean; break;
    case lbccAggSum: call.decode.aggregation = lbcc::codecs::Aggregation::kSum; break;
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

}  // namespace lbcc::comm::c_api

extern "C" {

// ---- Collectives over raw buffers (comm/collectives.h): lbccReduce, lbccReduceScatter,
// lbccAllToAll, and lbccAllReduce for integer types and lbccProd/lbccMin/lbccMax.
namespace {

absl::StatusOr<lbcc::comm::ReduceOp> ToReduceOp(lbccRedOp_t op) {
  switch (op) {
    case lbccSum: return lbcc::comm::ReduceOp::kSum;
    case lbccAvg: return lbcc::comm::ReduceOp::kAvg;
    case lbccProd: return lbcc::comm::ReduceOp::kProduct;
    case lbccMin: return lbcc::comm::ReduceOp::kMin;
    case lbccMax: return lbcc::comm::ReduceOp::kMax;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown lbccRedOp_t ", static_cast<int>(op)));
}

// The checks of a collective with a send and a receive buffer: `comm` and `request` set, both
// buffers too when `count` > 0, a known `datatype` (into *type); a NULL buffer or an unknown
// type is rejected on a valid communicator. lbccSuccess: the call goes on.
lbccResult_t CheckBuffers(const char* name, lbccComm* comm, lbccRequest_t* request, size_t count,
                          const void* sendbuff, const void* recvbuff, lbccDataType_t datatype,
                          lbcc::DType* type) {
  LBCC_C_CHECK_PTR(name, comm);
  LBCC_C_CHECK_PTR(name, request);
  if (count > 0) {
    LBCC_C_CHECK_BUF(name, sendbuff, comm);
    LBCC_C_CHECK_BUF(name, recvbuff, comm);
  }
  absl::StatusOr<lbcc::DType> converted = ToDType(datatype);
  if (!converted.ok()) return Reject(name, converted.status(), comm);
  *type = *converted;
  return lbccSuccess;
}

// Host views of a collective's send (`in_count` elements) and receive buffers.
absl::StatusOr<std::pair<lbcc::TensorView, lbcc::TensorView>> BufferViews(
    const void* sendbuff, int64_t in_count, void* recvbuff, int64_t out_count, lbcc::DType type) {
  LBCC_ASSIGN_OR_RETURN(lbcc::TensorView in,
                        lbcc::TensorView::Create(const_cast<void*>(sendbuff), type, {in_count}));
  LBCC_ASSIGN_OR_RETURN(lbcc::TensorView out,
                        lbcc::TensorView::Create(recvbuff, type, {out_count}));
  return std::make_pair(in, out);
}

// A reducing call's element type and reduction, converted.
struct ReduceArgs {
  lbcc::DType type;
  lbcc::comm::ReduceOp op;
};
absl::StatusOr<ReduceArgs> ToReduceArgs(lbccDataType_t datatype, lbccRedOp_t op) {
  LBCC_ASSIGN_OR_RETURN(lbcc::DType type, ToDType(datatype));
  LBCC_ASSIGN_OR_RETURN(lbcc::comm::ReduceOp reduce_op, ToReduceOp(op));
  return ReduceArgs{type, reduce_op};
}

lbccResult_t RawAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                          lbccDataType_t datatype, lbccRedOp_t op, lbccComm* comm,
                          lbccRequest_t* request) {
  absl::StatusOr<ReduceArgs> args = ToReduceArgs(datatype, op);
  if (!args.ok()) return Reject("lbccAllReduce", args.status(), comm);
  return Finish(comm->comm->AllReduce(sendbuff, recvbuff, count, args->type, args->op), comm,
                request);
}

}  // namespace

lbccResult_t lbccReduce(const void* sendbuff, void* recvbuff, size_t count, lbccDataType_t datatype,
                        lbccRedOp_t op, int root, lbccComm_t comm, lbccRequest_t* request) {
  LBCC_C_CHECK_PTR("lbccReduce", comm);
  LBCC_C_CHECK_PTR("lbccReduce", request);
  if (count > 0) LBCC_C_CHECK_BUF("lbccReduce", sendbuff, comm);
  absl::StatusOr<ReduceArgs> args = ToReduceArgs(datatype, op);
  if (!args.ok()) return Reject("lbccReduce", args.status(), comm);
  return Finish(comm->comm->Reduce(sendbuff, recvbuff, count, args->type, args->op, root), comm,
                request);
}

lbccResult_t lbccReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               lbccDataType_t datatype, lbccRedOp_t op, lbccComm_t comm,
                               lbccRequest_t* request) {
  lbcc::DType type;
  const lbccResult_t checked = CheckBuffers("lbccReduceScatter", comm, request, recvcount, sendbuff,
                                            recvbuff, datatype, &type);
  if (checked != lbccSuccess) return checked;
  absl::StatusOr<ReduceArgs> args = ToReduceArgs(datatype, op);
  if (!args.ok()) return Reject("lbccReduceScatter", args.status(), comm);
  return Finish(comm->comm->ReduceScatter(sendbuff, recvbuff, recvcount, args->type, args->op),
                comm, request);
}

lbccResult_t lbccAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          lbccDataType_t datatype, lbccComm_t comm, lbccRequest_t* request) {
  lbcc::DType type;
  const lbccResult_t checked =
      CheckBuffers("lbccAllToAll", comm, request, count, sendbuff, recvbuff, datatype, &type);
  if (checked != lbccSuccess) return checked;
  const size_t block = count * lbcc::DTypeSize(type);
  lbcc::comm::AllToAllLayout layout;
  for (int i = 0; i < comm->comm->nranks(); ++i) {
    layout.send_offsets.push_back(i * block);
    layout.send_bytes.push_back(block);
    layout.recv_offsets.push_back(i * block);
    layout.recv_bytes.push_back(block);
  }
  return Finish(comm->comm->AllToAll(sendbuff, recvbuff, std::move(layout)), comm, request);
}

lbccResult_t lbccAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           lbccDataType_t datatype, lbccRedOp_t op, lbccComm_t comm,
                           lbccRequest_t* request) {
  lbcc::DType dtype;
  const lbccResult_t checked =
      CheckBuffers("lbccAllReduce", comm, request, count, sendbuff, recvbuff, datatype, &dtype);
  if (checked != lbccSuccess) return checked;
  if (op == lbccProd || op == lbccMin || op == lbccMax) {
    return RawAllReduce(sendbuff, recvbuff, count, datatype, op, comm, request);
  }
  const int64_t n = static_cast<int64_t>(count);
  absl::StatusOr<std::pair<lbcc::TensorView, lbcc::TensorView>> views =
      BufferViews(sendbuff, n, recvbuff, n, dtype);
  if (!views.ok()) return Reject("lbccAllReduce", views.status(), comm);
  return Finish(comm->comm->AllReduce(
                    views->first, views->second,
                    op == lbccSum ? lbcc::comm::ReduceOp::kSum : lbcc::comm::ReduceOp::kAvg),
                comm, request);
}

lbccResult_t lbccAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           lbccDataType_t datatype, lbccComm_t comm, lbccRequest_t* request) {
  lbcc::DType dtype;
  const lbccResult_t checked =
      CheckBuffers("lbccAllGather", comm, request, sendcount, sendbuff, recvbuff, datatype, &dtype);
  if (checked != lbccSuccess) return checked;
  const int64_t n = static_cast<int64_t>(sendcount);
  absl::StatusOr<std::pair<lbcc::TensorView, lbcc::TensorView>> views =
      BufferViews(sendbuff, n, recvbuff, n * comm->comm->nranks(), dtype);
  if (!views.ok()) return Reject("lbccAllGather", views.status(), comm);
  return Finish(comm->comm->AllGather(views->first, views->second), comm, request);
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
  return Finish(
      comm->comm->SparseAllReduce(std::move(call->tensors), call->codec.get(), call->decode), comm,
      request, call->codec);
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
      case lbccDenseInt8: options.format = lbcc::codecs::DenseFormat::kInt8; break;
      case lbccDenseInt4: options.format = lbcc::codecs::DenseFormat::kInt4; break;
      case lbccDenseFp16: options.format = lbcc::codecs::DenseFormat::kF16; break;
      case lbccDenseBf16: options.format = lbcc::codecs::DenseFormat::kBf16; break;
      default:
        return Fail(absl::InvalidArgumentError(absl::StrCat("unknown lbccDenseFormat_t ",
                                                            static_cast<int>(config->format))),
                    comm);
    }
    options.block = config->block;
    options.stochastic = config->stochastic != 0;
  }
  absl::StatusOr<std::unique_ptr<lbcc::codecs::DenseQuantCodec>> codec =
      lbcc::codecs::DenseQuantCodec::Create(options);
  if (!codec.ok()) return Fail(codec.status(), comm);
  std::shared_ptr<lbcc::codecs::DenseQuantCodec> shared(std::move(*codec));
  return Finish(comm->comm->SendCompressed(*view, shared.get(), nullptr, peer, tag), comm, request,
                shared);
}

lbccResult_t lbccRecvCompressed(float* buff, int ndims, const int64_t* dims, int peer, uint32_t tag,
                                lbccComm_t comm, lbccRequest_t* request) {
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
