// AllToAllDirect: every slice straight to its rank; and the layout of an all-gather as one.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/collectives.h"

namespace lbcc::comm {

using transport::Priority;
using transport::Tag;

AllToAllLayout AllGatherLayout(int n, size_t bytes) {
  AllToAllLayout layout;
  for (int i = 0; i < n; ++i) {
    layout.send_offsets.push_back(0);
    layout.send_bytes.push_back(bytes);
    layout.recv_offsets.push_back(static_cast<size_t>(i) * bytes);
    layout.recv_bytes.push_back(bytes);
  }
  return layout;
}

absl::Status AllToAllDirect(const Group& group, Tag tag, const void* in, void* out,
                            const AllToAllLayout& layout, Priority priority, absl::Time deadline) {
  const size_t n = group.size();
  if (layout.send_offsets.size() != n || layout.send_bytes.size() != n ||
      layout.recv_offsets.size() != n || layout.recv_bytes.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAll: the layout must have ", n, " entries per list"));
  }
  const uint8_t* src = static_cast<const uint8_t*>(in);
  uint8_t* dst = static_cast<uint8_t*>(out);
  const int me = group.me;
  if (layout.send_bytes[me] != layout.recv_bytes[me]) {
    return absl::InvalidArgumentError(absl::StrCat("AllToAll: sends ", layout.send_bytes[me],
                                                   " bytes to itself but expects ",
                                                   layout.recv_bytes[me]));
  }
  std::memmove(dst + layout.recv_offsets[me], src + layout.send_offsets[me], layout.send_bytes[me]);
  Batch batch(group.fabric, deadline);
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<int>(i) == me) continue;
    batch.Send(group.ranks[i], tag, RawBytes(src + layout.send_offsets[i], layout.send_bytes[i]),
               priority);
    batch.Recv(group.ranks[i], tag, RawBytes(dst + layout.recv_offsets[i], layout.recv_bytes[i]));
  }
  return batch.Wait();
}

}  // namespace lbcc::comm
