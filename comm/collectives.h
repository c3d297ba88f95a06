// The collective algorithms over a Group of ranks of a Fabric. Internal to comm/: the
// Communicator chooses the algorithm (comm/algorithms.h) and runs these on its worker thread.
//
// Every function blocks until done or failed; on failure the Fabric is aborted (see Batch) and
// outputs may hold partial results (callers that promise untouched outputs work on copies).
// All ranks of the group must call the same function with the same tag base and algorithm.
//
// Thread-safety: one call at a time per Group.
#ifndef LBCC_COMM_COLLECTIVES_H_
#define LBCC_COMM_COLLECTIVES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/dtype.h"
#include "comm/algorithms.h"
#include "comm/fabric.h"

namespace lbcc::comm {

struct Group {
  Fabric* fabric = nullptr;
  std::vector<int> ranks;  // Global ranks, in group order.
  int me = 0;              // This rank's index in `ranks`.
  int size() const { return static_cast<int>(ranks.size()); }
};

// Tags: 16 bits of communicator id, 32 bits of operation sequence, 16 bits of step.
inline transport::Tag MakeTag(uint32_t comm_id, uint64_t sequence, uint32_t step) {
  return (static_cast<uint64_t>(comm_id & 0xffff) << 48) | ((sequence & 0xffffffffu) << 16) |
         (step & 0xffff);
}

// Every rank's `mine` lands in out[i] (group order), byte for byte. `max_bytes` bounds any one
// payload a peer may send (DataLoss beyond).
absl::Status AllGatherV(const Group& group, transport::Tag tag, const std::string& mine,
                        std::vector<std::string>* out, Algorithm algorithm,
                        transport::Priority priority, absl::Time deadline, size_t max_bytes);

enum class ReduceOp : uint8_t { kSum, kMean };

// Ring reduce-scatter + all-gather over `count` elements of f32, f16 or bf16. `in` and `out`
// may alias. 16-bit values are added in fp32 and rounded once per step (like NCCL). Every rank
// ends with identical bits.
absl::Status AllReduceRing(const Group& group, transport::Tag tag, const void* in, void* out,
                           size_t count, DType dtype, ReduceOp op, transport::Priority priority,
                           absl::Time deadline);

// `bytes` of `buffer` from group index `root` to every rank.
absl::Status Broadcast(const Group& group, transport::Tag tag, void* buffer, size_t bytes,
                       int root, transport::Priority priority, absl::Time deadline);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_COLLECTIVES_H_
