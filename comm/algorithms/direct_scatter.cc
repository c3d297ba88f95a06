// ScatterDirect: the root's blocks straight to their ranks.
#include <cstring>

#include "base/status_macros.h"
#include "comm/collectives.h"

namespace lbcc::comm {

using transport::Priority;
using transport::Tag;

absl::Status ScatterDirect(const Group& group, Tag tag, const void* in, void* out, size_t bytes,
                           int root, Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckRoot(root, group.size(), "Scatter"));
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    const uint8_t* src = static_cast<const uint8_t*>(in);
    std::memmove(out, src + root * bytes, bytes);
    for (int i = 0; i < group.size(); ++i) {
      if (i != root) batch.Send(group.ranks[i], tag, RawBytes(src + i * bytes, bytes), priority);
    }
  } else {
    batch.Recv(group.ranks[root], tag, RawBytes(out, bytes));
  }
  return batch.Wait();
}

}  // namespace lbcc::comm
