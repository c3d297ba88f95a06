#include "comm/dense_collectives.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/mutex.h"
#include "base/dtype.h"
#include "base/status_macros.h"
#include "comm/signature.h"

namespace lbcc::comm {
namespace {

using collective_internal::AllGatherLayout;
using collective_internal::CheckRoot;
using collective_internal::ConstSpan;
using collective_internal::Span;
using transport::Priority;
using transport::Tag;


// The ring's schedule: the reduce-scatter (steps 0 .. n-2, tags tag + s, chunk c combined
// starting at rank c + 1, so that rank r ends owning chunk r), then with `all_gather` the
// all-gather of the owned chunks (tags tag + n + s) in the same pipelined pass, `op`'s last
// step (avg's division) applied to each owned segment as it completes.
RingSchedule ReduceRingSchedule(const Group& g, Tag tag, DType type, ReduceOp op, bool all_gather) {
  const int n = g.size();
  const int me = g.me;
  RingSchedule ring;
  ring.combine_steps = n - 1;
  ring.steps = all_gather ? 2 * (n - 1) : n - 1;
  ring.send_chunk = [me, n](int s) { return ((me - s - 1) % n + n) % n; };
  ring.recv_chunk = [me, n](int s) { return ((me - s - 2) % n + n) % n; };
  ring.step_tag = [tag, n](int s) { return s < n - 1 ? tag + s : tag + n + (s - (n - 1)); };
  ring.combine = [type, op](uint8_t* dst, const uint8_t* src, size_t elements) {
    ReduceCombine(dst, src, elements, type, op);
  };
  if (all_gather) {
    ring.finish = [type, op, n](uint8_t* segment, size_t elements) {
      ReduceFinish(segment, elements, type, op, n);
    };
  }
  return ring;
}

// Ring reduce-scatter in place over `data` split at begin(c): after n-1 steps this rank's chunk
// (group.me) holds the reduction over the group. Chunk c is combined starting at rank c + 1.
template <typename Begin>
absl::Status RingReduceScatterInPlace(const Group& g, Tag tag, uint8_t* data, Begin begin,
                                      DType type, ReduceOp op, Priority priority,
                                      absl::Time deadline) {
  const int n = g.size();
  const size_t element = DTypeSize(type);
  std::vector<size_t> offsets(n + 1);
  for (int c = 0; c <= n; ++c) offsets[c] = begin(c) * element;
  return RingPass(g, data, offsets, element, ReduceRingSchedule(g, tag, type, op, /*all_gather=*/false),
                  priority, deadline);
}

}  // namespace

namespace collective_internal {
absl::Status CheckRoot(int root, int n, absl::string_view what) {
  if (root < 0 || root >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", root, " out of range [0, ", n, ")"));
  }
  return absl::OkStatus();
}
}  // namespace collective_internal

namespace collective_internal {
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
}  // namespace collective_internal

absl::Status AllReduceDirect(const Group& group, Tag tag, const void* in, void* out,
                                  size_t count, DType type, ReduceOp op, Priority priority,
                                  absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckReduceOp(type, op));
  const size_t bytes = count * DTypeSize(type);
  const int n = group.size();
  if (n == 1) {
    if (in != out) std::memmove(out, in, bytes);
    return absl::OkStatus();
  }
  std::vector<uint8_t> rows(static_cast<size_t>(n) * bytes);
  LBCC_RETURN_IF_ERROR(AllToAllDirect(group, tag, in, rows.data(), AllGatherLayout(n, bytes),
                                           priority, deadline));
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
                                            const Signature& signature, const void* in,
                                            void* out, size_t count, DType type, ReduceOp op,
                                            absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckReduceOp(type, op));
  const size_t bytes = count * DTypeSize(type);
  std::vector<std::string> storage;
  std::vector<absl::Span<const uint8_t>> rows;
  LBCC_RETURN_IF_ERROR(ExchangeWithHeader(group, tag, sequence, signature, ConstSpan(in, bytes),
                                          &storage, &rows, deadline));
  // Every row is a copy (this rank's own too), so `in` may alias `out`.
  if (bytes > 0) std::memcpy(out, rows[0].data(), bytes);
  for (size_t i = 1; i < rows.size(); ++i) ReduceCombine(out, rows[i].data(), count, type, op);
  ReduceFinish(out, count, type, op, group.size());
  return absl::OkStatus();
}

absl::Status AllReduceRing(const Group& group, Tag tag, const void* in, void* out,
                                size_t count, DType type, ReduceOp op, Priority priority,
                                absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckReduceOp(type, op));
  const size_t element = DTypeSize(type);
  if (in != out) std::memmove(out, in, count * element);
  const int n = group.size();
  if (n == 1) return absl::OkStatus();
  std::vector<size_t> offsets(n + 1);
  for (int c = 0; c <= n; ++c) offsets[c] = count * static_cast<size_t>(c) / n * element;
  return RingPass(group, static_cast<uint8_t*>(out), offsets, element,
                  ReduceRingSchedule(group, tag, type, op, /*all_gather=*/true), priority, deadline);
}

absl::Status ReduceScatterRing(const Group& group, Tag tag, const void* in, void* out,
                                    size_t count, DType type, ReduceOp op, Priority priority,
                                    absl::Time deadline) {
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

absl::Status ReduceRing(const Group& group, Tag tag, const void* in, void* out,
                             size_t count, DType type, ReduceOp op, int root,
                             Priority priority, absl::Time deadline) {
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
  ReduceFinish(work.data() + begin(group.me) * element, begin(group.me + 1) - begin(group.me),
              type, op, n);
  // Every rank's reduced chunk goes to the root.
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    for (int c = 0; c < n; ++c) {
      if (c == root) continue;
      batch.Recv(group.ranks[c], tag + n,
                 Span(work.data() + begin(c) * element, (begin(c + 1) - begin(c)) * element));
    }
  } else {
    batch.Send(group.ranks[root], tag + n,
               ConstSpan(work.data() + begin(group.me) * element,
                         (begin(group.me + 1) - begin(group.me)) * element),
               priority);
  }
  LBCC_RETURN_IF_ERROR(batch.Wait());
  if (group.me == root) std::memcpy(out, work.data(), count * element);
  return absl::OkStatus();
}

absl::Status AllToAllDirect(const Group& group, Tag tag, const void* in, void* out,
                                 const AllToAllLayout& layout, Priority priority,
                                 absl::Time deadline) {
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
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAll: sends ", layout.send_bytes[me], " bytes to itself but expects ",
                     layout.recv_bytes[me]));
  }
  std::memmove(dst + layout.recv_offsets[me], src + layout.send_offsets[me],
               layout.send_bytes[me]);
  Batch batch(group.fabric, deadline);
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<int>(i) == me) continue;
    batch.Send(group.ranks[i], tag, ConstSpan(src + layout.send_offsets[i], layout.send_bytes[i]),
               priority);
    batch.Recv(group.ranks[i], tag, Span(dst + layout.recv_offsets[i], layout.recv_bytes[i]));
  }
  return batch.Wait();
}

absl::Status GatherDirect(const Group& group, Tag tag, const void* in, void* out,
                               size_t bytes, int root, Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckRoot(root, group.size(), "Gather"));
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    uint8_t* dst = static_cast<uint8_t*>(out);
    std::memmove(dst + root * bytes, in, bytes);
    for (int i = 0; i < group.size(); ++i) {
      if (i != root) batch.Recv(group.ranks[i], tag, Span(dst + i * bytes, bytes));
    }
  } else {
    batch.Send(group.ranks[root], tag, ConstSpan(in, bytes), priority);
  }
  return batch.Wait();
}

absl::Status ScatterDirect(const Group& group, Tag tag, const void* in, void* out,
                                size_t bytes, int root, Priority priority, absl::Time deadline) {
  LBCC_RETURN_IF_ERROR(CheckRoot(root, group.size(), "Scatter"));
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    const uint8_t* src = static_cast<const uint8_t*>(in);
    std::memmove(out, src + root * bytes, bytes);
    for (int i = 0; i < group.size(); ++i) {
      if (i != root) batch.Send(group.ranks[i], tag, ConstSpan(src + i * bytes, bytes), priority);
    }
  } else {
    batch.Recv(group.ranks[root], tag, Span(out, bytes));
  }
  return batch.Wait();
}

absl::Status VerifyFingerprints(const Group& group, Tag tag, const std::string& fingerprint,
                                absl::Time deadline) {
  std::vector<std::string> all;
  LBCC_RETURN_IF_ERROR(AllGatherV(group, tag, fingerprint, &all, Algorithm::kDirect,
                                  Priority::kHigh, deadline, 4096));
  for (int i = 1; i < group.size(); ++i) {
    if (all[i] != all[0]) {
      return absl::InvalidArgumentError(absl::StrCat("ranks disagree on the collective: rank 0 posted ",
                                                     all[0], ", rank ", i, " posted ", all[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace lbcc::comm
