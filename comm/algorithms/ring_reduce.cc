// ReduceRing: a ring reduce-scatter, then every rank's reduced chunk to the root.
#include <cstring>
#include <vector>

#include "base/status_macros.h"
#include "comm/algorithms/reduce_ring.h"
#include "comm/collectives.h"

namespace lbcc::comm {

using transport::Priority;
using transport::Tag;

absl::Status ReduceRing(const Group& group, Tag tag, const void* in, void* out, size_t count,
                        DType type, ReduceOp op, int root, Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckReduceOp(type, op));
  LBCC_RETURN_IF_ERROR(CheckRoot(root, group.size(), "Reduce"));
  const size_t element = DTypeSize(type);
  const int n = group.size();
  std::vector<uint8_t> work(static_cast<const uint8_t*>(in),
                            static_cast<const uint8_t*>(in) + count * element);
  auto begin = [&](int c) { return count * static_cast<size_t>(c) / n; };
  if (n > 1) {
    LBCC_RETURN_IF_ERROR(
        RingReduceScatterInPlace(group, tag, work.data(), begin, type, op, priority, deadline));
  }
  ReduceFinish(work.data() + begin(group.me) * element, begin(group.me + 1) - begin(group.me), type,
               op, n);
  // Every rank's reduced chunk goes to the root.
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    for (int c = 0; c < n; ++c) {
      if (c == root) continue;
      batch.Recv(group.ranks[c], tag + n,
                 RawBytes(work.data() + begin(c) * element, (begin(c + 1) - begin(c)) * element));
    }
  } else {
    batch.Send(group.ranks[root], tag + n,
               RawBytes(work.data() + begin(group.me) * element,
                        (begin(group.me + 1) - begin(group.me)) * element),
               priority);
  }
  LBCC_RETURN_IF_ERROR(batch.Wait());
  if (group.me == root) std::memcpy(out, work.data(), count * element);
  return absl::OkStatus();
}

}  // namespace lbcc::comm
