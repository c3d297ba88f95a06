// ReduceScatterRing: the reduce-scatter half of the reduction ring.
#include <cstring>
#include <vector>

#include "base/status_macros.h"
#include "comm/algorithms/reduce_ring.h"
#include "comm/collectives.h"

namespace lbcc::comm {

using transport::Priority;
using transport::Tag;

absl::Status ReduceScatterRing(const Group& group, Tag tag, const void* in, void* out, size_t count,
                               DType type, ReduceOp op, Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckReduceOp(type, op));
  const size_t element = DTypeSize(type);
  const int n = group.size();
  std::vector<uint8_t> work(static_cast<const uint8_t*>(in),
                            static_cast<const uint8_t*>(in) + n * count * element);
  auto begin = [&](int c) { return count * static_cast<size_t>(c); };
  LBCC_RETURN_IF_ERROR(
      RingReduceScatterInPlace(group, tag, work.data(), begin, type, op, priority, deadline));
  uint8_t* mine = work.data() + begin(group.me) * element;
  ReduceFinish(mine, count, type, op, n);
  std::memcpy(out, mine, count * element);
  return absl::OkStatus();
}

}  // namespace lbcc::comm
