// GatherDirect: every rank's bytes straight to the root.
#include <cstring>

#include "base/status_macros.h"
#include "comm/collectives.h"

namespace lbcc::comm {

using transport::Priority;
using transport::Tag;

absl::Status GatherDirect(const Group& group, Tag tag, const void* in, void* out, size_t bytes,
                          int root, Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckRoot(root, group.size(), "Gather"));
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    uint8_t* dst = static_cast<uint8_t*>(out);
    std::memmove(dst + root * bytes, in, bytes);
    for (int i = 0; i < group.size(); ++i) {
      if (i != root) batch.Recv(group.ranks[i], tag, RawBytes(dst + i * bytes, bytes));
    }
  } else {
    batch.Send(group.ranks[root], tag, RawBytes(in, bytes), priority);
  }
  return batch.Wait();
}

}  // namespace lbcc::comm
