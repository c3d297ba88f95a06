// Collectives over raw buffers of every element type torch.distributed uses (base's DType: f32,
// f16, bf16, f64, i8, u8, i16, i32, i64, bool) and every reduction it names (ReduceOp,
// comm/reduce.h): all-reduce, reduce, reduce-scatter, all-to-all, gather, scatter. The
// Communicator exposes them as its raw-buffer methods (communicator.h); the blocking
// group-level functions below run on its worker thread, like collectives.h.
//
// Algorithms: reductions are a ring over RingPass (collectives.h) for every type and op
// (reduce-scatter, then an all-gather or a gather to the root), so every rank ends with
// identical bits; all-to-all, gather and scatter send every slice directly. Every message goes
// through the Fabric's endpoints, so slow links get the transport's slow-link scheduler.
// 16-bit floats are combined in f32 and rounded once per step (like NCCL); integers wrap.
//
// Errors: InvalidArgument (an op that does not apply to the type, e.g. bitwise on floats or avg
// on integers; bad root/peer; buffer sizes that disagree), DataLoss (a peer sent a message of
// another size: ranks disagree on shape or type), plus the Fabric's Unavailable /
// DeadlineExceeded / Cancelled. Every operation's signature (operation, type, op, counts,
// root) is checked on every rank first (comm/signature.h): a mismatch fails every rank with
// FailedPrecondition naming two ranks and the field, without aborting the communicator.
// OpOptions::verify adds the older textual fingerprint exchange (InvalidArgument naming the
// rank) for what the signature does not cover.
//
// Thread-safety: stateless functions; one call at a time per Group (as collectives.h).
#ifndef LBCC_COMM_DENSE_COLLECTIVES_H_
#define LBCC_COMM_DENSE_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "comm/collectives.h"

namespace lbcc::comm {

class Signature;  // comm/signature.h

// Group-level algorithms (blocking). Buffers are `count` elements of `type` unless said.

// in -> out (may alias), reduced over the group.
absl::Status AllReduceRing(const Group& group, transport::Tag tag, const void* in,
                                void* out, size_t count, DType type, ReduceOp op,
                                transport::Priority priority, absl::Time deadline);
// The same result for small buffers in one round: every rank's `in` to every rank, folded in
// rank order (identical bits on every rank) instead of the ring's 2 (n - 1) latency-bound
// rounds. Communicator::AllReduce uses it where the selection table (comm/algorithms.h)
// says direct: up to kDirectAllReduceBytes.
inline constexpr size_t kDirectAllReduceBytes = size_t{64} << 10;
absl::Status AllReduceDirect(const Group& group, transport::Tag tag, const void* in,
                                  void* out, size_t count, DType type, ReduceOp op,
                                  transport::Priority priority, absl::Time deadline);
// AllReduceDirect with the operation header in its one round (ExchangeWithHeader,
// comm/signature.h), for an operation posted with Communicator::PostWithHeader: every peer's
// header is checked before any data is used, and the round at kSignatureStep is the whole
// operation. count * DTypeSize(type) must be at most kMaxHeaderData.
absl::Status AllReduceDirectWithHeader(const Group& group, transport::Tag tag,
                                            uint64_t sequence, const Signature& signature,
                                            const void* in, void* out, size_t count,
                                            DType type, ReduceOp op, absl::Time deadline);
// in: group.size() blocks of `count`; out (count): this rank's block, reduced over the group.
absl::Status ReduceScatterRing(const Group& group, transport::Tag tag, const void* in,
                                    void* out, size_t count, DType type, ReduceOp op,
                                    transport::Priority priority, absl::Time deadline);
// The reduction lands in `out` on `root` only (out may be null elsewhere).
absl::Status ReduceRing(const Group& group, transport::Tag tag, const void* in, void* out,
                             size_t count, DType type, ReduceOp op, int root,
                             transport::Priority priority, absl::Time deadline);
// Rank i's send_bytes[j] bytes at in + send_offsets[j] go to rank j, which receives them into
// out + recv_offsets[i] (recv_bytes[i] bytes; DataLoss when the sizes disagree).
struct AllToAllLayout {
  std::vector<size_t> send_offsets, send_bytes, recv_offsets, recv_bytes;
};
absl::Status AllToAllDirect(const Group& group, transport::Tag tag, const void* in,
                                 void* out, const AllToAllLayout& layout,
                                 transport::Priority priority, absl::Time deadline);
// Gather: `bytes` from every rank into out (group.size() * bytes) on root.
absl::Status GatherDirect(const Group& group, transport::Tag tag, const void* in, void* out,
                               size_t bytes, int root, transport::Priority priority,
                               absl::Time deadline);
// Scatter: root's in (group.size() * bytes) block i to rank i's out (bytes).
absl::Status ScatterDirect(const Group& group, transport::Tag tag, const void* in,
                                void* out, size_t bytes, int root, transport::Priority priority,
                                absl::Time deadline);
// Every rank's `fingerprint` is compared with rank 0's; InvalidArgument naming the first rank
// that differs (on every rank).
absl::Status VerifyFingerprints(const Group& group, transport::Tag tag,
                                const std::string& fingerprint, absl::Time deadline);

namespace collective_internal {
// A caller's raw buffer as the bytes the transport moves (dense_collectives.cc and
// communicator_dense.cc).
inline absl::Span<uint8_t> Span(void* data, size_t bytes) {
  return absl::Span<uint8_t>(static_cast<uint8_t*>(data), bytes);
}
inline absl::Span<const uint8_t> ConstSpan(const void* data, size_t bytes) {
  return absl::Span<const uint8_t>(static_cast<const uint8_t*>(data), bytes);
}
// InvalidArgument naming `what` unless 0 <= root < n.
absl::Status CheckRoot(int root, int n, absl::string_view what);
// An all-gather as an all-to-all: this rank's `bytes` to every rank, rank i's into row i.
AllToAllLayout AllGatherLayout(int n, size_t bytes);
}  // namespace collective_internal

}  // namespace lbcc::comm

#endif  // LBCC_COMM_DENSE_COLLECTIVES_H_
