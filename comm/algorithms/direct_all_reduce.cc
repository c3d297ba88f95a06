// AllReduceDirect and AllReduceDirectWithHeader: the all-reduce in one round, every rank's
// data to every rank, folded in rank order.
#include <cstring>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "comm/collectives.h"
#include "comm/signature.h"

namespace lbcc::comm {

using transport::Priority;
using transport::Tag;

absl::Status AllReduceDirect(const Group& group, Tag tag, const void* in, void* out, size_t count,
                             DType type, ReduceOp op, Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckReduceOp(type, op));
  const size_t bytes = count * DTypeSize(type);
  const int n = group.size();
  if (n == 1) {
    if (in != out) std::memmove(out, in, bytes);
    return absl::OkStatus();
  }
  std::vector<uint8_t> rows(static_cast<size_t>(n) * bytes);
  LBCC_RETURN_IF_ERROR(
      AllToAllDirect(group, tag, in, rows.data(), AllGatherLayout(n, bytes), priority, deadline));
  std::memcpy(out, rows.data(), bytes);
  for (int i = 1; i < n; ++i) {
    ReduceCombine(out, rows.data() + static_cast<size_t>(i) * bytes, count, type, op);
  }
  ReduceFinish(out, count, type, op, n);
  return absl::OkStatus();
}

static_assert(kDirectAllReduceBytes <= kMaxHeaderData,
              "the direct all-reduce carries its data with the operation header");

absl::Status AllReduceDirectWithHeader(const Group& group, Tag tag, uint64_t sequence,
                                       const Signature& signature, const void* in, void* out,
                                       size_t count, DType type, ReduceOp op, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckReduceOp(type, op));
  const size_t bytes = count * DTypeSize(type);
  std::vector<std::string> storage;
  std::vector<absl::Span<const uint8_t>> rows;
  LBCC_RETURN_IF_ERROR(ExchangeWithHeader(group, tag, sequence, signature, RawBytes(in, bytes),
                                          &storage, &rows, deadline));
  // Every row is a copy (this rank's own too), so `in` may alias `out`.
  if (bytes > 0) std::memcpy(out, rows[0].data(), bytes);
  for (size_t i = 1; i < rows.size(); ++i) ReduceCombine(out, rows[i].data(), count, type, op);
  ReduceFinish(out, count, type, op, group.size());
  return absl::OkStatus();
}

}  // namespace lbcc::comm
