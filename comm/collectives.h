// The collective algorithms over a Group of ranks of a Fabric, one file each under
// comm/algorithms/. Internal to comm/: the Communicator chooses the algorithm (the selection
// table, comm/algorithms.h; the implementations' table, comm/algorithms/registry.h) and runs
// these on its worker thread.
//
// The all-gather is a task (AllGatherTask: post, test, wait) that every algorithm (direct, ring,
// hierarchical) provides; it runs on transport completions, with no thread of its own, so any
// number may be in flight (SparseAllReduce posts one per exchange group and streamed piece).
// AllGatherV is its blocking form (post + wait). The other functions block until done or failed.
//
// The raw-buffer collectives take every element type torch.distributed uses (base's DType: f32,
// f16, bf16, f64, i8, u8, i16, i32, i64, bool) and every reduction it names (ReduceOp,
// comm/reduce.h). Reductions are rings over RingPass (reduce-scatter, then an all-gather or a
// gather to the root), so every rank ends with identical bits; all-to-all, gather and scatter
// send every slice directly. Every message goes through the Fabric's endpoints, so slow links get
// the transport's slow-link scheduler.
//
// Errors: InvalidArgument (an op that does not apply to the type, e.g. bitwise on floats or avg
// on integers; bad root/peer; buffer sizes that disagree), DataLoss (a peer sent a message of
// another size: ranks disagree on shape or type), plus the Fabric's Unavailable /
// DeadlineExceeded / Cancelled. On a transport failure, or the deadline, the Fabric is aborted
// (see Batch) and outputs may hold partial results (callers that promise untouched outputs work
// on copies). All ranks of the group must run the same collective with the same tag base and
// algorithm: the Communicator checks every operation's signature first (comm/signature.h).
//
// Thread-safety: one blocking call at a time per Group and tag; an AllGatherTask may be waited
// for from any one thread.
#ifndef LBCC_COMM_COLLECTIVES_H_
#define LBCC_COMM_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/dtype.h"
#include "comm/algorithms.h"
#include "comm/fabric.h"
#include "comm/group.h"
#include "comm/reduce.h"

namespace lbcc::comm {

class Signature;  // comm/signature.h

// Tags: 16 bits of communicator id, 32 bits of operation sequence, 16 bits of step. Collectives
// use steps below kFirstP2pStep; point-to-point operations put the user's tag in the sequence
// field and a step from kFirstP2pStep up, so they never meet a collective's tags, and the
// per-tag state of a completed collective ([MakeTag(c, s, 0), MakeTag(c, s, kFirstP2pStep)))
// can be released without touching theirs.
inline constexpr uint32_t kFirstP2pStep = 0xff00;
// Every collective's operation header (comm/signature.h) uses the two steps below
// kFirstP2pStep; an operation's own messages use steps below kSignatureStep.
inline constexpr uint32_t kSignatureStep = kFirstP2pStep - 2;
inline transport::Tag MakeTag(uint32_t comm_id, uint64_t sequence, uint32_t step) {
  return (static_cast<uint64_t>(comm_id & 0xffff) << 48) | ((sequence & 0xffffffffu) << 16) |
         (step & 0xffff);
}

// One all-gather in flight: every rank's `mine` lands in result()[i] (group order), byte for
// byte. `max_bytes` bounds any one payload a peer may send (DataLoss beyond).
//
//   auto task = AllGatherTask::Post(group, tag, blob, Algorithm::kRing, priority, deadline, max);
//   ... other work; task->Test() polls ...
//   LBCC_RETURN_IF_ERROR(task->Wait());
//   use(task->result());
//
// Post() returns at once; the operations it starts complete on transport threads, and each step
// of the algorithm is posted from the completion of the one before (never blocking there).
// Errors from Wait(): what the transport reported (Unavailable, Cancelled, DataLoss for an
// oversized message; the Fabric is then aborted), DeadlineExceeded once `deadline` passed (the
// Fabric is aborted), DataLoss for a malformed hierarchical bundle (the Fabric is not aborted),
// Internal for Algorithm::kAuto with more than one rank.
class AllGatherTask {
 public:
  // `group.fabric` must outlive the task.
  static std::unique_ptr<AllGatherTask> Post(const Group& group, transport::Tag tag,
                                             std::string mine, Algorithm algorithm,
                                             transport::Priority priority, absl::Time deadline,
                                             size_t max_bytes);
  ~AllGatherTask();  // Waits as Wait() does: no callback touches the task afterwards.
  AllGatherTask(const AllGatherTask&) = delete;
  AllGatherTask& operator=(const AllGatherTask&) = delete;

  // True once every operation of the task completed (successfully or not).
  bool Test() const;
  // Blocks until result() holds every rank's payload or the task failed. This rank's own sends
  // may still be in flight (a direct all-gather's receives can finish first): call Wait() too.
  absl::Status WaitGathered();
  // Blocks until every operation completed; returns the task's status.
  absl::Status Wait();
  // The payloads, in group order; complete once WaitGathered() or Wait() returned OK.
  std::vector<std::string>& result();

  class State;  // The algorithm's state machine (comm/algorithms/all_gather_task.h).

 private:
  explicit AllGatherTask(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// The blocking form: AllGatherTask::Post and Wait; *out gets the result (partial on failure).
absl::Status AllGatherV(const Group& group, transport::Tag tag, const std::string& mine,
                        std::vector<std::string>* out, Algorithm algorithm,
                        transport::Priority priority, absl::Time deadline, size_t max_bytes);

// A ring over `data`, pipelined: a reduce-scatter, an all-gather, or both in one pass (an
// all-reduce). Chunk c is bytes [offsets[c], offsets[c + 1]) of `data` (group.size() + 1
// offsets, multiples of `element`). In step s (0 <= s < steps) this rank sends chunk
// send_chunk(s) to the right and receives chunk recv_chunk(s) from the left, and
// send_chunk(s + 1) must be recv_chunk(s). In the first `combine_steps` steps a received chunk
// is combined into its place (combine(dst, src, elements)), later it replaces it; `finish`
// (may be null) runs on each segment of recv_chunk(combine_steps - 1) once combined (an
// average's division). Segment j of step s + 1 leaves as soon as segment j of step s is in, so
// a link streams through the whole ring, phase change included, instead of idling at every
// step while its sender finishes the step before. When a link of the ring is slow (topology)
// every chunk travels as the same number of segments of at most about kRingSegmentBytes; over
// fast links a chunk is one segment. Step s uses tag step_tag(s).
inline constexpr size_t kRingSegmentBytes = size_t{1} << 20;
using RingCombine = std::function<void(uint8_t* dst, const uint8_t* src, size_t elements)>;
struct RingSchedule {
  int steps = 0;
  int combine_steps = 0;
  std::function<int(int)> send_chunk, recv_chunk;
  std::function<transport::Tag(int)> step_tag;
  RingCombine combine;
  std::function<void(uint8_t* data, size_t elements)> finish;
};
absl::Status RingPass(const Group& group, uint8_t* data, absl::Span<const size_t> offsets,
                      size_t element, const RingSchedule& schedule,
                      transport::Priority priority, absl::Time deadline);
// RingPass's offsets for `count` elements of `element` bytes in n even chunks: chunk c covers
// elements [count * c / n, count * (c + 1) / n).
std::vector<size_t> EvenChunkOffsets(size_t count, int n, size_t element);

// The ring of Communicator::AllReduce over tensor views: reduce-scatter + all-gather over
// `count` elements of f32, f16 or bf16, op kSum or kAvg (a multiplication by 1 / n). `in` and
// `out` may alias. 16-bit values are added in fp32 and rounded once per step (like NCCL). Every
// rank ends with identical bits.
absl::Status FloatAllReduceRing(const Group& group, transport::Tag tag, const void* in, void* out,
                                size_t count, DType dtype, ReduceOp op,
                                transport::Priority priority, absl::Time deadline);

// `bytes` of `buffer` from group index `root` to every rank.
absl::Status Broadcast(const Group& group, transport::Tag tag, void* buffer, size_t bytes,
                       int root, transport::Priority priority, absl::Time deadline);

// Group-level algorithms (blocking). Buffers are `count` elements of `type` unless said.

// in -> out (may alias), reduced over the group.
absl::Status AllReduceRing(const Group& group, transport::Tag tag, const void* in, void* out,
                           size_t count, DType type, ReduceOp op, transport::Priority priority,
                           absl::Time deadline);
// The same result for small buffers in one round: every rank's `in` to every rank, folded in
// rank order (identical bits on every rank) instead of the ring's 2 (n - 1) latency-bound
// rounds. Communicator::AllReduce uses it where the selection table (comm/algorithms.h)
// says direct: up to kDirectAllReduceBytes.
inline constexpr size_t kDirectAllReduceBytes = size_t{64} << 10;
absl::Status AllReduceDirect(const Group& group, transport::Tag tag, const void* in, void* out,
                             size_t count, DType type, ReduceOp op, transport::Priority priority,
                             absl::Time deadline);
// AllReduceDirect with the operation header in its one round (ExchangeWithHeader,
// comm/signature.h), for an operation posted with Communicator::PostWithHeader: every peer's
// header is checked before any data is used, and the round at kSignatureStep is the whole
// operation. count * DTypeSize(type) must be at most kMaxHeaderData.
absl::Status AllReduceDirectWithHeader(const Group& group, transport::Tag tag, uint64_t sequence,
                                       const Signature& signature, const void* in, void* out,
                                       size_t count, DType type, ReduceOp op, absl::Time deadline);
// in: group.size() blocks of `count`; out (count): this rank's block, reduced over the group.
absl::Status ReduceScatterRing(const Group& group, transport::Tag tag, const void* in, void* out,
                               size_t count, DType type, ReduceOp op, transport::Priority priority,
                               absl::Time deadline);
// The reduction lands in `out` on `root` only (out may be null elsewhere).
absl::Status ReduceRing(const Group& group, transport::Tag tag, const void* in, void* out,
                        size_t count, DType type, ReduceOp op, int root,
                        transport::Priority priority, absl::Time deadline);
// Rank i's send_bytes[j] bytes at in + send_offsets[j] go to rank j, which receives them into
// out + recv_offsets[i] (recv_bytes[i] bytes; DataLoss when the sizes disagree).
struct AllToAllLayout {
  std::vector<size_t> send_offsets, send_bytes, recv_offsets, recv_bytes;
};
absl::Status AllToAllDirect(const Group& group, transport::Tag tag, const void* in, void* out,
                            const AllToAllLayout& layout, transport::Priority priority,
                            absl::Time deadline);
// Gather: `bytes` from every rank into out (group.size() * bytes) on root.
absl::Status GatherDirect(const Group& group, transport::Tag tag, const void* in, void* out,
                          size_t bytes, int root, transport::Priority priority,
                          absl::Time deadline);
// Scatter: root's in (group.size() * bytes) block i to rank i's out (bytes).
absl::Status ScatterDirect(const Group& group, transport::Tag tag, const void* in, void* out,
                           size_t bytes, int root, transport::Priority priority,
                           absl::Time deadline);
// Every rank's `fingerprint` is compared with rank 0's; InvalidArgument naming the first rank
// that differs (on every rank).
absl::Status VerifyFingerprints(const Group& group, transport::Tag tag,
                                const std::string& fingerprint, absl::Time deadline);

// A caller's raw buffer as the bytes the transport moves (comm/algorithms/ and
// communicator_dense.cc).
inline absl::Span<uint8_t> RawBytes(void* data, size_t bytes) {
  return absl::Span<uint8_t>(static_cast<uint8_t*>(data), bytes);
}
inline absl::Span<const uint8_t> RawBytes(const void* data, size_t bytes) {
  return absl::Span<const uint8_t>(static_cast<const uint8_t*>(data), bytes);
}
// InvalidArgument naming `what` unless 0 <= root < n.
inline absl::Status CheckRoot(int root, int n, absl::string_view what) {
  if (root < 0 || root >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", root, " out of range [0, ", n, ")"));
  }
  return absl::OkStatus();
}
// An all-gather as an all-to-all: this rank's `bytes` to every rank, rank i's into row i.
AllToAllLayout AllGatherLayout(int n, size_t bytes);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_COLLECTIVES_H_
