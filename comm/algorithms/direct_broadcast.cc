// Broadcast: the root sends the buffer to every rank at once.
#include "comm/collectives.h"

namespace lbcc::comm {

using transport::Priority;
using transport::Tag;

absl::Status Broadcast(const Group& group, Tag tag, void* buffer, size_t bytes, int root,
                       Priority priority, absl::Time deadline) {
  if (group.size() == 1) return absl::OkStatus();
  absl::Span<uint8_t> span(static_cast<uint8_t*>(buffer), bytes);
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    for (int i = 0; i < group.size(); ++i) {
      if (i != root) batch.Send(group.ranks[i], tag, span, priority);
    }
  } else {
    batch.Recv(group.ranks[root], tag, span);
  }
  return batch.Wait();
}

}  // namespace lbcc::comm
