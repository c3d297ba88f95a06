// SparseLoCo's outer loop for C++ trainers that link LBCC: the algorithm of lbcc.torch.SparseLoCo
// (python/lbcc/torch/sparseloco.py, ../shared/reference/sparseloco.md) over host f32 parameter
// buffers that the trainer's inner optimizer updates in place, with the same overlap modes and
// merge rule (docs/overlap.md):
//
//   none       every H-th Step(): delta = theta_global - theta_local, the compressed exchange
//              (Communicator::SparseAllReduce with the TopK-EF codec and its error feedback),
//              theta_global -= g, theta_local = theta_global; the step blocks for the exchange.
//   delayed    the exchange is posted (bulk priority) and merged `delay` steps later (default H,
//              the one-step-delayed outer update):
//                post:   delta = start - theta_local; post delta; start = theta_local
//                merge:  theta_global -= g; theta_local = theta_global + (theta_local - start);
//                        start = theta_global
//   streaming  the tensors in `fragments` fragments of consecutive tensors balanced by elements;
//              fragment f's rounds end at inner steps f * H / F + n * H (default delay H / F).
// Within one Step() the deltas of the rounds ending there are taken first, then the merges due
// there run, then the posts go out. The outer parameters change only at merges, by the same
// aggregate on every replica, so they stay bit-identical. A failed exchange (its outcome agreed
// by every rank, its error feedback rolled back) is dropped by every replica, and Step()
// returns its error.
//
//   SparseLoCoOptions options;
//   options.overlap = OuterOverlap::kDelayed;
//   LBCC_ASSIGN_OR_RETURN(auto outer, SparseLoCo::Create(&comm, params, options));
//   for (...) { InnerStep(params); LBCC_RETURN_IF_ERROR(outer->Step()); }
//   LBCC_RETURN_IF_ERROR(outer->Flush());  // merges what is still in flight
//
// Thread-safety: one thread calls every method; an exchange in flight runs on the communicator's
// worker thread and owns its deltas, aggregates and error-feedback states until it finished, so
// the accessors of those wait for it first.
#ifndef LBCC_COMM_SPARSELOCO_H_
#define LBCC_COMM_SPARSELOCO_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/tensor_view.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"

namespace lbcc::comm {

enum class OuterOverlap { kNone, kDelayed, kStreaming };

struct SparseLoCoOptions {
  int inner_steps = 15;                // H
  codecs::TopKEfOptions codec;         // top_k, beta, lr (the outer learning rate), values
  codecs::Aggregation aggregation = codecs::Aggregation::kSparseLoCoMean;
  float weight_decay = 0;              // decoupled: theta_global *= 1 - lr * weight_decay
  bool sign = false;                   // theta_global -= lr * sign(g) instead of g
  OuterOverlap overlap = OuterOverlap::kNone;
  int fragments = 1;                   // kStreaming: in [1, number of tensors]
  int delay = 0;                       // overlap: steps from post to merge, in [1, H]; 0: default
  bool sync_initial = true;            // broadcast the parameters from rank 0 first (collective)
};

class SparseLoCo {
 public:
  // `params`: host f32 tensors (their shapes chunk the top-k), which must outlive the object.
  // InvalidArgument for bad options or tensors (named) or none. Collective when
  // options.sync_initial.
  static absl::StatusOr<std::unique_ptr<SparseLoCo>> Create(Communicator* comm,
                                                            std::vector<TensorView> params,
                                                            const SparseLoCoOptions& options);
  ~SparseLoCo();  // waits for the exchanges in flight (without merging them)

  // After every inner step: the outer work due at this step (see the top). Blocks only for a
  // blocking exchange, or for a merge whose exchange has not finished yet.
  absl::Status Step();
  // Merges every exchange in flight now (every replica at the same step); no-op without overlap.
  absl::Status Flush();

  int64_t inner_step_count() const { return step_; }
  int64_t exchanges_posted() const { return posted_; }
  int64_t exchanges_merged() const { return merged_; }
  const std::vector<std::pair<size_t, size_t>>& fragments() const { return fragments_; }
  // theta_global of tensor i.
  absl::Span<const float> outer(size_t i) const { return outer_[i]; }
  // The error feedback of tensor i (waits for the exchanges in flight first).
  const codecs::TopKEfState& error_feedback(size_t i);

 private:
  struct Exchange;

  SparseLoCo(Communicator* comm, std::vector<TensorView> params,
             const SparseLoCoOptions& options, std::unique_ptr<codecs::TopKEfCodec> codec);
  absl::Status BlockingOuterStep();
  std::unique_ptr<Exchange> TakeDeltas(size_t fragment);
  void Post(Exchange& exchange);
  absl::Status Merge(std::unique_ptr<Exchange> exchange);
  void ApplyAggregate(size_t i, const std::vector<float>& g);
  void Drain();

  Communicator* const comm_;
  const std::vector<TensorView> params_;
  const SparseLoCoOptions options_;
  const std::unique_ptr<codecs::TopKEfCodec> codec_;
  std::vector<std::unique_ptr<codecs::CodecState>> states_;
  std::vector<std::vector<float>> outer_;  // theta_global
  std::vector<std::vector<float>> start_;  // overlap: where unposted progress is measured from
  std::vector<std::pair<size_t, size_t>> fragments_;
  int delay_ = 0;
  std::deque<std::unique_ptr<Exchange>> pending_;  // posted, not merged; in posting order
  int64_t step_ = 0, posted_ = 0, merged_ = 0;
};

// [begin, end) ranges of consecutive tensors, each non-empty, balanced by elements (the
// fragments of lbcc.torch.SparseLoCo's streaming mode, the same cut).
std::vector<std::pair<size_t, size_t>> FragmentRanges(const std::vector<size_t>& sizes,
                                                      int fragments);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_SPARSELOCO_H_
