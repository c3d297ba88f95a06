// ProcessGroupLBCC: torch.distributed's c10d::ProcessGroup (torch 1.13's headers from Debian's
// libtorch-dev) over an LBCC Communicator, so `init_process_group(backend="lbcc")` runs every
// standard collective on CPU tensors through comm/'s raw-buffer collectives.
//
// Rendezvous: through the c10d Store torch passes in. Rank 0 creates an LBCC unique id and
// store.set()s it; the others store.get() it (no extra port besides the root LBCC's id names).
//
// Asynchrony: every collective posts to the communicator's worker and returns a WorkLBCC at once.
// A completion thread per process group (and one for point-to-point) waits on requests in posting
// order, copies staged outputs back and completes the Work and its Future; Work::wait() waits on
// its own request directly, so it never waits behind another operation. Errors surface as
// RuntimeError "LBCC <CODE>: <message>" from wait() and from the Future.
//
// Thread-safety: as c10d's contract: collectives are posted in the same order on every rank;
// Work objects are thread-safe.
#ifndef LBCC_PYTHON_TORCH_BACKEND_PROCESS_GROUP_LBCC_H_
#define LBCC_PYTHON_TORCH_BACKEND_PROCESS_GROUP_LBCC_H_

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace lbcc::torch_backend {

// One posted operation: the LBCC request, the tensors it reads and writes (kept alive), and what
// to do once the request succeeded (copy staged outputs back).
class WorkLBCC : public c10d::Work {
 public:
  WorkLBCC(int rank, c10d::OpType type, comm::RequestPtr request,
           std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive,
           std::function<void()> finish, std::chrono::milliseconds timeout);
  ~WorkLBCC() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // recv_anysource's: the rank the message came from, once the Work completed (torch's
  // `work._source_rank()`); other operations throw as c10d::Work does.
  int sourceRank() const override;
  void SetSource(std::shared_ptr<int> source) { source_ = std::move(source); }

  // Runs once the request is done (from the completion thread or from wait()): the finish step,
  // then completes the Work and the Future. Idempotent.
  void Complete();
  const comm::RequestPtr& request() const { return request_; }

 private:
  comm::RequestPtr request_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_alive_;
  std::function<void()> finish_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<int> source_;  // recv_anysource: written by comm before the request completes
  std::once_flag once_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Turns an LBCC status into the exception the Work carries: "LBCC <CODE>: <message>".
std::exception_ptr ToException(const absl::Status& status);

class ProcessGroupLBCC : public c10d::ProcessGroup {
 public:
  // Joins through `store` (blocks until every rank joined, or `timeout`); throws RuntimeError with
  // LBCC's code when that fails.
  ProcessGroupLBCC(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout);
  ~ProcessGroupLBCC() override;

  const std::string getBackendName() const override { return "lbcc"; }
  comm::Communicator& communicator() { return *comm_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return sequence_; }

 private:
  // Registers `work` with the completion thread (`p2p`: the point-to-point one).
  c10::intrusive_ptr<c10d::Work> Track(c10::intrusive_ptr<WorkLBCC> work, bool p2p);
  c10::intrusive_ptr<WorkLBCC> MakeWork(c10d::OpType type, comm::RequestPtr request,
                                        std::vector<at::Tensor> outputs,
                                        std::vector<at::Tensor> keep_alive,
                                        std::function<void()> finish = nullptr);
  comm::OpOptions Options(std::chrono::milliseconds timeout) const;
  void CompletionLoop(int queue);

  std::unique_ptr<comm::Communicator> comm_;
  std::chrono::milliseconds timeout_;
  bool verify_ = false;  // TORCH_DISTRIBUTED_DEBUG=DETAIL or LBCC_VERIFY_COLLECTIVES=1
  uint64_t sequence_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<WorkLBCC>> queues_[2];  // guarded by mu_
  bool stopping_ = false;                               // guarded by mu_
  std::thread completion_[2];
};

}  // namespace lbcc::torch_backend

#endif  // LBCC_PYTHON_TORCH_BACKEND_PROCESS_GROUP_LBCC_H_
