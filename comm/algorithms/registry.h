// The implementations' table: one row per Algorithm (comm/algorithms.h), naming the function
// that implements it for each kind of collective. The Communicator and AllGatherTask run the
// row of the algorithm the selection table chose; HasAlgorithm(collective, algorithm) is "that
// row has the collective's slot". Rows and the selection rules live in one file
// (comm/algorithms/table.cc): adding an algorithm is its file under comm/algorithms/, its
// declaration (collectives.h), and its row (plus its Algorithm value and selection rules when it
// is a new kind).
//
// Thread-safety: immutable.
#ifndef LBCC_COMM_ALGORITHMS_REGISTRY_H_
#define LBCC_COMM_ALGORITHMS_REGISTRY_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/algorithms.h"
#include "comm/collectives.h"

namespace lbcc::comm {

// What an all-gather's state machine is made with (AllGatherTask::Post's arguments).
struct GatherParams {
  const Group& group;
  transport::Tag tag;
  transport::Priority priority;
  absl::Time deadline;
  size_t max_bytes;
};
// kAllGatherV, kAllGather, kBarrier: the all-gather task's state machine (all_gather_task.h).
using AllGatherFactory = std::shared_ptr<AllGatherTask::State> (*)(const GatherParams& params);
// kAllReduce: in -> out (may alias), `count` elements of `type` reduced with `op`.
using AllReduceFn = absl::Status (*)(const Group& group, transport::Tag tag, const void* in,
                                     void* out, size_t count, DType type, ReduceOp op,
                                     transport::Priority priority, absl::Time deadline);
// kAllReduce in one round that carries the operation header (Communicator::PostWithHeader).
using HeaderAllReduceFn = absl::Status (*)(const Group& group, transport::Tag tag,
                                           uint64_t sequence, const Signature& signature,
                                           const void* in, void* out, size_t count, DType type,
                                           ReduceOp op, absl::Time deadline);
// kBroadcast: `bytes` of `buffer` from group index `root` to every rank.
using BroadcastFn = absl::Status (*)(const Group& group, transport::Tag tag, void* buffer,
                                     size_t bytes, int root, transport::Priority priority,
                                     absl::Time deadline);

struct AlgorithmEntry {
  Algorithm algorithm;
  AllGatherFactory all_gather = nullptr;
  // The raw-buffer all-reduce (every DType and ReduceOp).
  AllReduceFn all_reduce = nullptr;
  // The all-reduce of tensor views (f32, f16, bf16; sum or avg), where it differs from
  // `all_reduce`; null: `all_reduce_with_header` runs it.
  AllReduceFn tensor_all_reduce = nullptr;
  // The all-reduce in one round with the operation header, for buffers up to kMaxHeaderData.
  HeaderAllReduceFn all_reduce_with_header = nullptr;
  BroadcastFn broadcast = nullptr;
  // kContextRing: the row runs comm/context_ring.h's pass (neighbour rounds; only the ring).
  bool context_ring = false;
};

absl::Span<const AlgorithmEntry> AlgorithmTable();
// `algorithm`'s row; nullptr for kAuto.
const AlgorithmEntry* FindAlgorithm(Algorithm algorithm);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_ALGORITHMS_REGISTRY_H_
