#include "python/torch_backend/process_group_lbcc.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/env.h"
#include "comm/bootstrap.h"
#include "comm/collectives.h"

namespace lbcc::torch_backend {
namespace {

using c10d::OpType;
using comm::ReduceOp;
using lbcc::DType;
using Work = c10::intrusive_ptr<c10d::Work>;

constexpr char kUniqueIdKey[] = "lbcc/unique_id";

std::string Message(const absl::Status& status) {
  return absl::StrCat("LBCC ", absl::StatusCodeToString(status.code()), ": ", status.message());
}

[[noreturn]] void Throw(const absl::Status& status) { throw std::runtime_error(Message(status)); }

[[noreturn]] void ThrowInvalid(const std::string& what) {
  Throw(absl::InvalidArgumentError(what));
}

DType TypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kF32;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kDouble: return DType::kF64;
    case at::kChar: return DType::kI8;
    case at::kByte: return DType::kU8;
    case at::kShort: return DType::kI16;
    case at::kInt: return DType::kI32;
    case at::kLong: return DType::kI64;
    case at::kBool: return DType::kBool;
    default:
      ThrowInvalid(absl::StrCat("dtype ", std::string(c10::toString(t.scalar_type())),
                                " is not supported (float32, float16, bfloat16, float64, "
                                "int8..int64, uint8, bool)"));
  }
}

ReduceOp OpOf(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::kSum;
    case c10d::ReduceOp::AVG: return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::kProduct;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    case c10d::ReduceOp::BAND: return ReduceOp::kBand;
    case c10d::ReduceOp::BOR: return ReduceOp::kBor;
    case c10d::ReduceOp::BXOR: return ReduceOp::kBxor;
    default:
      Throw(absl::UnimplementedError(
          absl::StrCat("reduce op ", static_cast<int>(op.op_), " (PREMUL_SUM) is not supported")));
  }
}

void CheckTensor(const at::Tensor& t, const char* what) {
  if (!t.defined() || t.device().type() != c10::DeviceType::CPU || t.is_sparse()) {
    ThrowInvalid(absl::StrCat(what, ": tensors must be dense CPU tensors"));
  }
  (void)TypeOf(t);
}

void CheckSame(const at::Tensor& a, const at::Tensor& b, const char* what) {
  if (a.scalar_type() != b.scalar_type() || a.numel() != b.numel()) {
    ThrowInvalid(absl::StrCat(what, ": tensors differ in dtype or size (",
                              std::string(c10::toString(a.scalar_type())), "[", a.numel(),
                              "] vs ", std::string(c10::toString(b.scalar_type())), "[",
                              b.numel(), "])"));
  }
}

const at::Tensor& Single(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1) {
    ThrowInvalid(absl::StrCat(what, ": expects one tensor per call, got ", tensors.size()));
  }
  CheckTensor(tensors[0], what);
  return tensors[0];
}

int CheckRank(int64_t rank, int size, const char* what) {
  if (rank < 0 || rank >= size) {
    ThrowInvalid(absl::StrCat(what, ": rank ", rank, " out of range [0, ", size, ")"));
  }
  return static_cast<int>(rank);
}

// A contiguous tensor with the data of `t` (t itself when it already is).
at::Tensor Contiguous(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Flattens `tensors` (same dtype) into one new 1-D tensor.
at::Tensor Flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// Copies consecutive slices of `flat` into `tensors`.
void Unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (at::Tensor t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

size_t Bytes(const at::Tensor& t) { return t.numel() * t.element_size(); }

}  // namespace

std::exception_ptr ToException(const absl::Status& status) {
  return std::make_exception_ptr(std::runtime_error(Message(status)));
}

WorkLBCC::WorkLBCC(int rank, OpType type, comm::RequestPtr request,
                   std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive,
                   std::function<void()> finish, std::chrono::milliseconds timeout)
    : c10d::Work(rank, type),
      request_(std::move(request)),
      outputs_(std::move(outputs)),
      keep_alive_(std::move(keep_alive)),
      finish_(std::move(finish)),
      timeout_(timeout),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

WorkLBCC::~WorkLBCC() = default;

void WorkLBCC::Complete() {
  std::call_once(once_, [this] {
    absl::Status status = request_->status();
    std::exception_ptr error;
    if (!status.ok()) {
      error = ToException(status);
    } else if (finish_) {
      try {
        finish_();
      } catch (...) {
        error = std::current_exception();
      }
    }
    keep_alive_.clear();
    finish(error);
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  });
}

bool WorkLBCC::isCompleted() {
  if (request_->Test()) Complete();
  return c10d::Work::isCompleted();
}

bool WorkLBCC::isSuccess() const { return c10d::Work::isSuccess(); }

bool WorkLBCC::wait(std::chrono::milliseconds timeout) {
  // Without a timeout of its own, wait up to the group's timeout and a margin: the operation has
  // that deadline itself, so LBCC's own error (naming the peer) normally comes first.
  const absl::Duration limit = timeout == kNoTimeout
                                   ? absl::FromChrono(timeout_) + absl::Seconds(10)
                                   : absl::FromChrono(timeout);
  (void)request_->WaitFor(limit);
  if (!request_->Test()) {
    Throw(absl::DeadlineExceededError(absl::StrCat(
        c10d::opTypeToString(opType_), ": not done after ", absl::FormatDuration(limit))));
  }
  Complete();
  std::lock_guard<std::mutex> lock(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkLBCC::getFuture() { return future_; }

int WorkLBCC::sourceRank() const {
  if (source_ == nullptr) return c10d::Work::sourceRank();
  if (!request_->Test() || !request_->status().ok()) {
    Throw(absl::FailedPreconditionError(
        "recv_anysource: the source rank is known once the receive completed successfully"));
  }
  return *source_;
}

ProcessGroupLBCC::ProcessGroupLBCC(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                   int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), timeout_(timeout) {
  absl::StatusOr<comm::FabricOptions> options = comm::FabricOptionsFromEnv();
  if (!options.ok()) Throw(options.status());
  options->timeout = absl::FromChrono(timeout);
  comm::UniqueId id;
  if (rank == 0) {
    absl::StatusOr<comm::UniqueId> created =
        comm::CreateUniqueId(options->listen_host, options->timeout);
    if (!created.ok()) Throw(created.status());
    id = *created;
    store->set(kUniqueIdKey, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    const std::vector<uint8_t> bytes = store->get(kUniqueIdKey);
    if (bytes.size() != sizeof(id.internal)) {
      Throw(absl::DataLossError(absl::StrCat("the store's LBCC unique id has ", bytes.size(),
                                             " bytes, expected ", sizeof(id.internal))));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  absl::StatusOr<bool> verify = env::GetBool("LBCC_VERIFY_COLLECTIVES");
  if (!verify.ok()) Throw(verify.status());
  verify_ = *verify || env::GetForeign("TORCH_DISTRIBUTED_DEBUG").value_or("") == "DETAIL";
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
      comm::Communicator::Init(id, size, rank, *std::move(options));
  if (!comm.ok()) Throw(comm.status());
  comm_ = *std::move(comm);
  for (int q = 0; q < 2; ++q) completion_[q] = std::thread([this, q] { CompletionLoop(q); });
}

ProcessGroupLBCC::~ProcessGroupLBCC() {
  // Destroying the communicator fails what is still queued or pending (Cancelled), so the
  // completion threads can drain their queues.
  comm_.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : completion_) t.join();
}

void ProcessGroupLBCC::CompletionLoop(int queue) {
  while (true) {
    c10::intrusive_ptr<WorkLBCC> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queues_[queue].empty(); });
      if (queues_[queue].empty()) return;
      work = queues_[queue].front();
      queues_[queue].pop_front();
    }
    (void)work->request()->Wait();
    work->Complete();
  }
}

comm::OpOptions ProcessGroupLBCC::Options(std::chrono::milliseconds timeout) const {
  comm::OpOptions options;
  options.timeout = absl::FromChrono(timeout.count() > 0 ? timeout : timeout_);
  options.verify = verify_;
  return options;
}

c10::intrusive_ptr<WorkLBCC> ProcessGroupLBCC::MakeWork(OpType type, comm::RequestPtr request,
                                                         std::vector<at::Tensor> outputs,
                                                         std::vector<at::Tensor> keep_alive,
                                                         std::function<void()> finish) {
  if (request->RejectedAtPost()) Throw(request->status());
  ++sequence_;
  return c10::make_intrusive<WorkLBCC>(getRank(), type, std::move(request), std::move(outputs),
                                       std::move(keep_alive), std::move(finish), timeout_);
}

Work ProcessGroupLBCC::Track(c10::intrusive_ptr<WorkLBCC> work, bool p2p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queues_[p2p ? 1 : 0].push_back(work);
  }
  cv_.notify_all();
  return work;
}

// Copies `staged` back into `target` when they are not the same tensor.
static std::function<void()> CopyBack(at::Tensor target, at::Tensor staged) {
  if (target.is_same(staged)) return nullptr;
  return [target, staged]() mutable {
    at::NoGradGuard no_grad;
    target.copy_(staged);
  };
}

Work ProcessGroupLBCC::broadcast(std::vector<at::Tensor>& tensors,
                                 const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = Single(tensors, "broadcast");
  const int root = CheckRank(opts.rootRank, getSize(), "broadcast");
  at::Tensor buf = Contiguous(t);
  auto request = comm_->Broadcast(buf.data_ptr(), Bytes(buf), root, Options(opts.timeout));
  return Track(MakeWork(OpType::BROADCAST, request, tensors, {buf}, CopyBack(t, buf)), false);
}

Work ProcessGroupLBCC::allreduce(std::vector<at::Tensor>& tensors,
                                 const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = Single(tensors, "allreduce");
  // Small tensors go in one round (comm's AllReduceDirect), larger ones by the ring.
  at::Tensor buf = Contiguous(t);
  auto request = comm_->AllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), TypeOf(buf),
                                  OpOf(opts.reduceOp), Options(opts.timeout));
  return Track(MakeWork(OpType::ALLREDUCE, request, tensors, {buf}, CopyBack(t, buf)), false);
}

Work ProcessGroupLBCC::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) ThrowInvalid("allreduce_coalesced: no tensors");
  for (const at::Tensor& t : tensors) {
    CheckTensor(t, "allreduce_coalesced");
    if (t.scalar_type() != tensors[0].scalar_type()) {
      ThrowInvalid("allreduce_coalesced: tensors must have one dtype");
    }
  }
  at::Tensor flat = Flatten(tensors);
  auto request = comm_->AllReduce(flat.data_ptr(), flat.data_ptr(), flat.numel(), TypeOf(flat),
                                  OpOf(opts.reduceOp), Options(opts.timeout));
  std::vector<at::Tensor> targets = tensors;
  return Track(MakeWork(OpType::ALLREDUCE_COALESCED, request, tensors, {flat},
                        [flat, targets] { Unflatten(flat, targets); }),
               false);
}

Work ProcessGroupLBCC::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  const at::Tensor& t = Single(tensors, "reduce");
  const int root = CheckRank(opts.rootRank, getSize(), "reduce");
  at::Tensor buf = Contiguous(t);
  auto request = comm_->Reduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), TypeOf(buf),
                               OpOf(opts.reduceOp), root, Options(opts.timeout));
  return Track(MakeWork(OpType::REDUCE, request, tensors, {buf},
                        getRank() == root ? CopyBack(t, buf) : nullptr),
               false);
}

Work ProcessGroupLBCC::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                 std::vector<at::Tensor>& inputs,
                                 const c10d::AllgatherOptions& opts) {
  const at::Tensor& in = Single(inputs, "allgather");
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()) {
    ThrowInvalid(absl::StrCat("allgather: expects one list of ", getSize(), " output tensors"));
  }
  for (const at::Tensor& o : outputs[0]) {
    CheckTensor(o, "allgather");
    CheckSame(in, o, "allgather");
  }
  at::Tensor src = Contiguous(in);
  at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
  auto request =
      comm_->AllGather(src.data_ptr(), flat.data_ptr(), Bytes(src), Options(opts.timeout));
  std::vector<at::Tensor> targets = outputs[0];
  return Track(MakeWork(OpType::ALLGATHER, request, targets, {src, flat},
                        [flat, targets] { Unflatten(flat, targets); }),
               false);
}

Work ProcessGroupLBCC::_allgather_base(at::Tensor& output, at::Tensor& input,
                                       const c10d::AllgatherOptions& opts) {
  CheckTensor(output, "_allgather_base");
  CheckTensor(input, "_allgather_base");
  if (output.scalar_type() != input.scalar_type() ||
      output.numel() != input.numel() * getSize()) {
    ThrowInvalid(absl::StrCat("_allgather_base: output must hold ", getSize(), " x ",
                              input.numel(), " elements of the input's dtype, has ",
                              output.numel()));
  }
  at::Tensor src = Contiguous(input), dst = Contiguous(output);
  auto request =
      comm_->AllGather(src.data_ptr(), dst.data_ptr(), Bytes(src), Options(opts.timeout));
  return Track(MakeWork(OpType::_ALLGATHER_BASE, request, {output}, {src, dst},
                        CopyBack(output, dst)),
               false);
}

Work ProcessGroupLBCC::gather(std::vector<std::vector<at::Tensor>>& outputs,
                              std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const at::Tensor& in = Single(inputs, "gather");
  const int root = CheckRank(opts.rootRank, getSize(), "gather");
  at::Tensor src = Contiguous(in);
  at::Tensor flat;
  std::vector<at::Tensor> targets;
  if (getRank() == root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()) {
      ThrowInvalid(absl::StrCat("gather: the root expects one list of ", getSize(), " tensors"));
    }
    for (const at::Tensor& o : outputs[0]) {
      CheckTensor(o, "gather");
      CheckSame(in, o, "gather");
    }
    targets = outputs[0];
    flat = at::empty({getSize() * in.numel()}, in.options());
  } else if (!outputs.empty() && !outputs[0].empty()) {
    ThrowInvalid("gather: only the root passes output tensors");
  }
  auto request = comm_->Gather(src.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr,
                               Bytes(src), root, Options(opts.timeout));
  std::function<void()> finish;
  if (flat.defined()) finish = [flat, targets] { Unflatten(flat, targets); };
  return Track(MakeWork(OpType::GATHER, request, targets, {src, flat}, finish), false);
}

Work ProcessGroupLBCC::scatter(std::vector<at::Tensor>& outputs,
                               std::vector<std::vector<at::Tensor>>& inputs,
                               const c10d::ScatterOptions& opts) {
  const at::Tensor& out = Single(outputs, "scatter");
  const int root = CheckRank(opts.rootRank, getSize(), "scatter");
  at::Tensor flat;
  if (getRank() == root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize()) {
      ThrowInvalid(absl::StrCat("scatter: the root expects one list of ", getSize(), " tensors"));
    }
    for (const at::Tensor& i : inputs[0]) {
      CheckTensor(i, "scatter");
      CheckSame(out, i, "scatter");
    }
    flat = Flatten(inputs[0]);
  } else if (!inputs.empty() && !inputs[0].empty()) {
    ThrowInvalid("scatter: only the root passes input tensors");
  }
  at::Tensor dst = Contiguous(out);
  auto request = comm_->Scatter(flat.defined() ? flat.data_ptr() : nullptr, dst.data_ptr(),
                                Bytes(dst), root, Options(opts.timeout));
  return Track(MakeWork(OpType::SCATTER, request, outputs, {flat, dst}, CopyBack(out, dst)),
               false);
}

Work ProcessGroupLBCC::reduce_scatter(std::vector<at::Tensor>& outputs,
                                      std::vector<std::vector<at::Tensor>>& inputs,
                                      const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = Single(outputs, "reduce_scatter");
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize()) {
    ThrowInvalid(absl::StrCat("reduce_scatter: expects one list of ", getSize(), " inputs"));
  }
  for (const at::Tensor& i : inputs[0]) {
    CheckTensor(i, "reduce_scatter");
    CheckSame(out, i, "reduce_scatter");
  }
  at::Tensor flat = Flatten(inputs[0]);
  at::Tensor dst = Contiguous(out);
  auto request = comm_->ReduceScatter(flat.data_ptr(), dst.data_ptr(), dst.numel(), TypeOf(dst),
                                      OpOf(opts.reduceOp), Options(opts.timeout));
  return Track(
      MakeWork(OpType::REDUCE_SCATTER, request, outputs, {flat, dst}, CopyBack(out, dst)),
      false);
}

Work ProcessGroupLBCC::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                            const c10d::ReduceScatterOptions& opts) {
  CheckTensor(output, "_reduce_scatter_base");
  CheckTensor(input, "_reduce_scatter_base");
  if (output.scalar_type() != input.scalar_type() ||
      input.numel() != output.numel() * getSize()) {
    ThrowInvalid(absl::StrCat("_reduce_scatter_base: input must hold ", getSize(), " x ",
                              output.numel(), " elements of the output's dtype, has ",
                              input.numel()));
  }
  at::Tensor src = Contiguous(input), dst = Contiguous(output);
  auto request = comm_->ReduceScatter(src.data_ptr(), dst.data_ptr(), dst.numel(), TypeOf(dst),
                                      OpOf(opts.reduceOp), Options(opts.timeout));
  return Track(MakeWork(OpType::_REDUCE_SCATTER_BASE, request, {output}, {src, dst},
                        CopyBack(output, dst)),
               false);
}

Work ProcessGroupLBCC::alltoall_base(at::Tensor& output, at::Tensor& input,
                                     std::vector<int64_t>& output_splits,
                                     std::vector<int64_t>& input_splits,
                                     const c10d::AllToAllOptions& opts) {
  CheckTensor(output, "alltoall_base");
  CheckTensor(input, "alltoall_base");
  if (output.scalar_type() != input.scalar_type()) ThrowInvalid("alltoall_base: dtypes differ");
  const int n = getSize();
  auto layout_of = [n](const at::Tensor& t, const std::vector<int64_t>& splits,
                       std::vector<size_t>* offsets, std::vector<size_t>* bytes) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t row_bytes = rows == 0 ? 0 : Bytes(t) / rows;
    std::vector<int64_t> s = splits;
    if (s.empty()) {
      if (rows % n != 0) {
        ThrowInvalid(absl::StrCat("alltoall_base: dim 0 (", rows, ") not divisible by ", n));
      }
      s.assign(n, rows / n);
    }
    if (static_cast<int>(s.size()) != n) {
      ThrowInvalid(absl::StrCat("alltoall_base: expected ", n, " split sizes, got ", s.size()));
    }
    int64_t total = 0;
    for (int64_t rows_i : s) {
      if (rows_i < 0) ThrowInvalid("alltoall_base: negative split size");
      offsets->push_back(total * row_bytes);
      bytes->push_back(rows_i * row_bytes);
      total += rows_i;
    }
    if (total != rows) {
      ThrowInvalid(absl::StrCat("alltoall_base: split sizes sum to ", total, ", dim 0 is ", rows));
    }
  };
  comm::AllToAllLayout layout;
  layout_of(input, input_splits, &layout.send_offsets, &layout.send_bytes);
  layout_of(output, output_splits, &layout.recv_offsets, &layout.recv_bytes);
  at::Tensor src = Contiguous(input), dst = Contiguous(output);
  auto request =
      comm_->AllToAll(src.data_ptr(), dst.data_ptr(), std::move(layout), Options(opts.timeout));
  return Track(
      MakeWork(OpType::ALLTOALL_BASE, request, {output}, {src, dst}, CopyBack(output, dst)),
      false);
}

Work ProcessGroupLBCC::alltoall(std::vector<at::Tensor>& outputs,
                                std::vector<at::Tensor>& inputs,
                                const c10d::AllToAllOptions& opts) {
  const int n = getSize();
  if (static_cast<int>(outputs.size()) != n || static_cast<int>(inputs.size()) != n) {
    ThrowInvalid(absl::StrCat("alltoall: expects ", n, " input and ", n, " output tensors"));
  }
  comm::AllToAllLayout layout;
  size_t send = 0, recv = 0;
  for (int i = 0; i < n; ++i) {
    CheckTensor(inputs[i], "alltoall");
    CheckTensor(outputs[i], "alltoall");
    if (inputs[i].scalar_type() != inputs[0].scalar_type() ||
        outputs[i].scalar_type() != inputs[0].scalar_type()) {
      ThrowInvalid("alltoall: tensors must have one dtype");
    }
    layout.send_offsets.push_back(send);
    layout.send_bytes.push_back(Bytes(inputs[i]));
    send += Bytes(inputs[i]);
    layout.recv_offsets.push_back(recv);
    layout.recv_bytes.push_back(Bytes(outputs[i]));
    recv += Bytes(outputs[i]);
  }
  at::Tensor src = Flatten(inputs);
  int64_t out_elements = 0;
  for (const at::Tensor& o : outputs) out_elements += o.numel();
  at::Tensor flat = at::empty({out_elements}, outputs[0].options());
  auto request =
      comm_->AllToAll(src.data_ptr(), flat.data_ptr(), std::move(layout), Options(opts.timeout));
  std::vector<at::Tensor> targets = outputs;
  return Track(MakeWork(OpType::ALLTOALL, request, targets, {src, flat},
                        [flat, targets] { Unflatten(flat, targets); }),
               false);
}

Work ProcessGroupLBCC::barrier(const c10d::BarrierOptions& opts) {
  comm::OpOptions options;
  options.timeout = Options(opts.timeout).timeout;
  return Track(MakeWork(OpType::BARRIER, comm_->Barrier(options), {}, {}), false);
}

void ProcessGroupLBCC::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  (void)wait_all_ranks;  // LBCC's barrier fails every rank with the first error it sees.
  comm::OpOptions options;
  options.timeout = Options(opts.timeout).timeout;
  absl::Status status = comm_->Barrier(options)->Wait();
  if (!status.ok()) {
    Throw(absl::Status(status.code(),
                       absl::StrCat("monitored_barrier on rank ", getRank(), ": ",
                                    status.message())));
  }
}

Work ProcessGroupLBCC::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = Single(tensors, "send");
  CheckRank(dst, getSize(), "send");
  at::Tensor buf = Contiguous(t);
  auto request = comm_->Send(buf.data_ptr(), Bytes(buf), dst, static_cast<uint32_t>(tag));
  return Track(MakeWork(OpType::SEND, request, tensors, {buf}), true);
}

Work ProcessGroupLBCC::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = Single(tensors, "recv");
  CheckRank(src, getSize(), "recv");
  at::Tensor buf = Contiguous(t);
  auto request = comm_->Recv(buf.data_ptr(), Bytes(buf), src, static_cast<uint32_t>(tag));
  return Track(MakeWork(OpType::RECV, request, tensors, {buf}, CopyBack(t, buf)), true);
}

Work ProcessGroupLBCC::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor& t = Single(tensors, "recv_anysource");
  at::Tensor buf = Contiguous(t);
  auto source = std::make_shared<int>(-1);
  auto request =
      comm_->RecvAny(buf.data_ptr(), Bytes(buf), static_cast<uint32_t>(tag), source.get());
  c10::intrusive_ptr<WorkLBCC> work =
      MakeWork(OpType::RECVANYSOURCE, request, tensors, {buf}, CopyBack(t, buf));
  work->SetSource(std::move(source));
  return Track(work, true);
}

}  // namespace lbcc::torch_backend
