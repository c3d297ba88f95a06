// AllReduceRing: reduce-scatter and all-gather in one pipelined ring pass, every DType and
// ReduceOp.
#include <cstring>
#include <vector>

#include "base/status_macros.h"
#include "comm/algorithms/reduce_ring.h"
#include "comm/collectives.h"

namespace lbcc::comm {

using transport::Priority;
using transport::Tag;

absl::Status AllReduceRing(const Group& group, Tag tag, const void* in, void* out, size_t count,
                           DType type, ReduceOp op, Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckReduceOp(type, op));
  const size_t element = DTypeSize(type);
  if (in != out) std::memmove(out, in, count * element);
  const int n = group.size();
  if (n == 1) return absl::OkStatus();
  return RingPass(group, static_cast<uint8_t*>(out), EvenChunkOffsets(count, n, element), element,
                  ReduceRingSchedule(group, tag, type, op, /*all_gather=*/true), priority,
                  deadline);
}

}  // namespace lbcc::comm
