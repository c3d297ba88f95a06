// Dense collectives over every element type torch.distributed uses (f32, f16, bf16, f64, i8,
// u8, i16, i32, i64, bool) and every reduction it names (sum, avg, product, min, max, band,
// bor, bxor): all-reduce, reduce, reduce-scatter, all-to-all, gather, scatter, and dense
// point-to-point. The Communicator exposes them as Dense* methods (communicator.h); the
// blocking group-level functions below run on its worker thread, like collectives.h.
//
// Algorithms: reductions are the ring of collectives.h generalised to every type and op
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
// DenseOptions::verify adds the older textual fingerprint exchange (InvalidArgument naming the
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

// Element types of the dense collectives (not wire ids: nothing here is stored or encoded).
enum class DenseType : uint8_t { kF32, kF16, kBF16, kF64, kI8, kU8, kI16, kI32, kI64, kBool };
// Reductions, in torch.distributed.ReduceOp's terms.
enum class DenseOp : uint8_t { kSum, kAvg, kProduct, kMin, kMax, kBand, kBor, kBxor };

size_t DenseTypeSize(DenseType type);
absl::string_view DenseTypeName(DenseType type);
absl::string_view DenseOpName(DenseOp op);
bool IsFloatingDense(DenseType type);
// InvalidArgument when `op` does not apply to `type`: bitwise ops on floats, avg on integers or
// bool. (Bool: sum/max/bor are "or", product/min/band "and", bxor "xor".)
absl::Status CheckDenseOp(DenseType type, DenseOp op);

// dst[i] = dst[i] op src[i] for `count` elements (avg adds; DenseFinish divides). The pair must
// pass CheckDenseOp; dst and src must not overlap. Vectorized per op (the same bits as the
// element-by-element loop).
void DenseCombine(void* dst, const void* src, size_t count, DenseType type, DenseOp op);
// Applies the last step of `op` over `n` ranks: divides by n for avg, nothing otherwise.
void DenseFinish(void* data, size_t count, DenseType type, DenseOp op, int n);

struct DenseOptions {
  absl::Duration timeout = absl::ZeroDuration();  // Zero: the communicator's.
  transport::Priority priority = transport::Priority::kNormal;
  // Also exchange the textual fingerprint first (one more small all-gather); see the header.
  bool verify = false;
  // DenseAllReduce: kAuto takes the communicator's configured choice (LBCC_ALGO's allreduce=),
  // else the selection table's (comm/algorithms.h: direct up to 64 KiB per rank, else ring);
  // direct or ring force one (Communicator::ChooseAlgorithm).
  Algorithm algorithm = Algorithm::kAuto;
};

// Group-level algorithms (blocking). Buffers are `count` elements of `type` unless said.

// in -> out (may alias), reduced over the group.
absl::Status DenseAllReduceRing(const Group& group, transport::Tag tag, const void* in,
                                void* out, size_t count, DenseType type, DenseOp op,
                                transport::Priority priority, absl::Time deadline);
// The same result for small buffers in one round: every rank's `in` to every rank, folded in
// rank order (identical bits on every rank) instead of the ring's 2 (n - 1) latency-bound
// rounds. Communicator::DenseAllReduce uses it where the selection table (comm/algorithms.h)
// says direct: up to kDenseDirectAllReduceBytes.
inline constexpr size_t kDenseDirectAllReduceBytes = size_t{64} << 10;
absl::Status DenseAllReduceDirect(const Group& group, transport::Tag tag, const void* in,
                                  void* out, size_t count, DenseType type, DenseOp op,
                                  transport::Priority priority, absl::Time deadline);
// DenseAllReduceDirect with the operation header in its one round (ExchangeWithHeader,
// comm/signature.h), for an operation posted with Communicator::PostWithHeader: every peer's
// header is checked before any data is used, and the round at kSignatureStep is the whole
// operation. count * DenseTypeSize(type) must be at most kMaxHeaderData.
absl::Status DenseAllReduceDirectWithHeader(const Group& group, transport::Tag tag,
                                            uint64_t sequence, const Signature& signature,
                                            const void* in, void* out, size_t count,
                                            DenseType type, DenseOp op, absl::Time deadline);
// in: group.size() blocks of `count`; out (count): this rank's block, reduced over the group.
absl::Status DenseReduceScatterRing(const Group& group, transport::Tag tag, const void* in,
                                    void* out, size_t count, DenseType type, DenseOp op,
                                    transport::Priority priority, absl::Time deadline);
// The reduction lands in `out` on `root` only (out may be null elsewhere).
absl::Status DenseReduceRing(const Group& group, transport::Tag tag, const void* in, void* out,
                             size_t count, DenseType type, DenseOp op, int root,
                             transport::Priority priority, absl::Time deadline);
// Rank i's send_bytes[j] bytes at in + send_offsets[j] go to rank j, which receives them into
// out + recv_offsets[i] (recv_bytes[i] bytes; DataLoss when the sizes disagree).
struct AllToAllLayout {
  std::vector<size_t> send_offsets, send_bytes, recv_offsets, recv_bytes;
};
absl::Status DenseAllToAllDirect(const Group& group, transport::Tag tag, const void* in,
                                 void* out, const AllToAllLayout& layout,
                                 transport::Priority priority, absl::Time deadline);
// Gather: `bytes` from every rank into out (group.size() * bytes) on root.
absl::Status DenseGatherDirect(const Group& group, transport::Tag tag, const void* in, void* out,
                               size_t bytes, int root, transport::Priority priority,
                               absl::Time deadline);
// Scatter: root's in (group.size() * bytes) block i to rank i's out (bytes).
absl::Status DenseScatterDirect(const Group& group, transport::Tag tag, const void* in,
                                void* out, size_t bytes, int root, transport::Priority priority,
                                absl::Time deadline);
// Every rank's `fingerprint` is compared with rank 0's; InvalidArgument naming the first rank
// that differs (on every rank).
absl::Status VerifyFingerprints(const Group& group, transport::Tag tag,
                                const std::string& fingerprint, absl::Time deadline);

namespace dense_internal {
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
}  // namespace dense_internal

}  // namespace lbcc::comm

#endif  // LBCC_COMM_DENSE_COLLECTIVES_H_
