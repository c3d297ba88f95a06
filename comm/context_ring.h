// ContextRing: the context-parallel ring of ring attention. Every rank of a communicator holds
// one chunk of a long sequence and its block of keys and values (K, V: f32 [tokens, dim] each);
// the blocks circulate so that every rank's queries meet every block, and the gradients of the
// blocks come back to their owners.
//
//   forward   round r = 1 .. n-1: this rank relays the block it got in round r-1 (its own in
//             round 1) to its successor (rank + 1) and receives the block of rank (rank - r)
//             from its predecessor. A block is encoded once, by its owner, and relayed as the
//             same bytes, so every rank decodes the same values (a lossy codec's rounding
//             happens once per block, identically everywhere).
//   backward  round r = 1 .. n-1: this rank adds its gradient contribution to block
//             (rank + r) to the partial sum that came from its successor (nothing in round 1),
//             and sends it to its predecessor; after round n-1 the partial sum of its own block
//             (every other rank's contribution) has arrived from its successor.
//
// Each tensor of a block travels with its RingCodec: raw f32 bytes (bit-exact), dense bf16 or
// f16 (codecs/dense_quant.h, the uncompressed reference), or the subspace codec
// (codecs/subspace_codec.h: k coefficients per token of one of M components, a selector per
// `mixture_block` tokens). With the subspace codec the backward payloads are the backward
// direction's g_c = U_sel^T g with the selectors the block's forward payload used, so the
// gradient of a block lands exactly on the coefficients its constrained forward used.
//
// Overlap: each pass is one collective on the communicator's worker thread (ordered with the
// others, its signature checked first on every rank); the caller's thread encodes, decodes and
// computes. NextForward(r) hands out block r as soon as it arrived, after the worker has
// already posted its relay to the successor, so block attention on block r overlaps the link
// carrying block r+1. In the backward, PassGradient(r) returns once the encoded partial sum
// is queued for the worker, so computing contribution r+1 overlaps the link carrying r.
//
//   auto ring = ContextRing::Create(&comm, options);             // codecs per tensor, shape
//   ring->BeginForward({k, v});                                   // posts the forward pass
//   ... attention on own block ...
//   for (int r = 1; r < n; ++r) { src = ring->NextForward({k_r, v_r}); attention(q, k_r, v_r); }
//   ring->EndForward();
//   ring->BeginBackward();
//   for (int r = 1; r < n; ++r) ring->PassGradient({dk[rank + r], dv[rank + r]});
//   ring->EndBackward({dk_from_others, dv_from_others});
//
// Selection: Collective::kContextRing in the one table (comm/algorithms.h); its only algorithm is
// kRing (OpOptions-style requests of another are InvalidArgument on every rank).
// Signature (comm/signature.h): pass, tokens, dim, every tensor's codec with its options and
// basis id, algorithm. Ranks that disagree fail the pass on every rank with
// FailedPrecondition naming the field; a rank whose arguments are rejected (InvalidArgument:
// wrong shape, dtype, memory kind, count of tensors, a pass out of order) makes every rank's
// pass fail with InvalidArgument naming it; neither aborts the communicator.
//
// Errors of the calls (also reported on every rank where the cause is shared):
//   InvalidArgument     caller input (above); also a contribution of the wrong shape in the
//                       middle of a backward, which aborts the communicator (peers are waiting
//                       for its partial sum) and fails the pass everywhere;
//   FailedPrecondition  signatures differ; calls out of order (NextForward before
//                       BeginForward, more than n-1 rounds, EndBackward early); a subspace
//                       block whose payload names another basis (the basis id is part of the
//                       signature, so this means a corrupt or mixed-up sender);
//   DataLoss            corrupt or foreign payload bytes (in a backward the communicator is
//                       aborted: the peers wait for this rank's partial sums);
//   Unavailable / DeadlineExceeded / Cancelled  a peer or link lost, the timeout, an abort
//                       (communicator.h): every rank's pending call fails instead of hanging.
// A call that fails leaves its outputs untouched, except that a decode failing on tensor t
// (DataLoss) may have written tensors before t.
//
// Bytes: every message goes through the Fabric's endpoints and is counted per link class
// (Fabric::BytesByClass), as every collective's.
//
// Thread-safety: a ContextRing belongs to one thread (the one that posts on the communicator).
// Memory: payloads of one pass are kept until the next pass begins (n-1 blocks per tensor).
#ifndef LBCC_COMM_CONTEXT_RING_H_
#define LBCC_COMM_CONTEXT_RING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/tensor_view.h"
#include "codecs/dense_quant.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"
#include "comm/communicator.h"

namespace lbcc::comm {

// How one tensor of a block travels.
struct RingCodec {
  enum class Kind : uint8_t {
    kRawF32 = 0,    // the f32 bytes as they are: bit-exact
    kDense = 1,     // codecs::DenseQuantCodec with `dense_format` (bf16: the reference)
    kSubspace = 2,  // codecs::SubspaceCodec with `basis` (V = 0: no token ids) and `subspace`
  };
  Kind kind = Kind::kRawF32;
  codecs::DenseFormat dense_format = codecs::DenseFormat::kBf16;
  std::shared_ptr<const codecs::SubspaceBasis> basis;
  codecs::SubspaceCodecOptions subspace;

  static RingCodec Raw() { return RingCodec(); }
  static RingCodec Dense(codecs::DenseFormat format) {
    RingCodec c;
    c.kind = Kind::kDense;
    c.dense_format = format;
    return c;
  }
  static RingCodec Subspace(std::shared_ptr<const codecs::SubspaceBasis> basis,
                            codecs::SubspaceCodecOptions options = {}) {
    RingCodec c;
    c.kind = Kind::kSubspace;
    c.basis = std::move(basis);
    c.subspace = options;
    return c;
  }
  // "raw_f32", "dense(bf16)", "subspace(basis=<id>, d=.., k=.., M=.., bf16, block=64)".
  std::string Describe() const;
};

struct ContextRingOptions {
  std::vector<RingCodec> tensors;  // One per tensor of a block (K and V: two).
  int64_t tokens = 0;              // Every tensor of every block is f32 [tokens, dim].
  int64_t dim = 0;
  absl::Duration timeout = absl::ZeroDuration();  // Per pass; zero: the communicator's.
  Algorithm algorithm = Algorithm::kAuto;         // kAuto or kRing.
  transport::Priority priority = transport::Priority::kHigh;
};

// Bytes of one tensor's payload as it crosses a link (forward and backward).
struct RingPayloadBytes {
  size_t forward = 0, backward = 0;
};

class ContextRing {
 public:
  // InvalidArgument for no tensors, tokens or dim < 1, a subspace codec without a basis, with a
  // vocabulary (V > 0) or of another d than `dim`, bad codec options, or an algorithm the
  // collective does not have. `comm` must outlive the ring. Communicates nothing.
  static absl::StatusOr<std::unique_ptr<ContextRing>> Create(Communicator* comm,
                                                             ContextRingOptions options);
  // Waits for a pass still running: a forward finishes its relays on its own; a backward is
  // cancelled and the communicator aborted, so that no peer waits for this rank's sums.
  ~ContextRing();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int rounds() const { return nranks_ - 1; }
  const ContextRingOptions& options() const { return options_; }
  // The payload size of tensor `t` for these options (exact for every codec here).
  RingPayloadBytes payload_bytes(int t) const { return bytes_[t]; }

  // Starts the forward pass with this rank's block `mine` (one f32 [tokens, dim] host view per
  // tensor; read during the call only). `mine_out` (empty, or one view per tensor) gets the
  // block as every other rank decodes it (the constrained K/V a lossy codec makes). A rejected
  // call still takes part (see above) and returns InvalidArgument.
  absl::Status BeginForward(absl::Span<const TensorView> mine,
                            absl::Span<const TensorView> mine_out = {});
  // Round r (the r-th call, 1 <= r <= rounds()): waits for the block of rank (rank - r) mod n
  // and decodes it into `out` (one view per tensor; written only on success); returns that rank.
  absl::StatusOr<int> NextForward(absl::Span<const TensorView> out);
  // Waits for the pass to finish on this rank (every relay delivered). After rounds() calls of
  // NextForward; earlier is FailedPrecondition (the pass goes on).
  absl::Status EndForward();

  // Starts the backward pass (after a forward pass of this ring ended: a subspace codec encodes
  // each block's gradient with the selectors of that block's forward payload).
  absl::Status BeginBackward();
  // Round r (1 <= r <= rounds()): `contribution` (one view per tensor, read during the call) is
  // this rank's gradient with respect to block (rank + r) mod n; it is added to the partial sum
  // from the successor, encoded and queued for the predecessor. Returns that block's owner.
  absl::StatusOr<int> PassGradient(absl::Span<const TensorView> contribution);
  // After rounds() PassGradient calls: writes the sum of every other rank's contribution to this
  // rank's block into `out` (one view per tensor) and waits for the pass to finish.
  absl::Status EndBackward(absl::Span<const TensorView> out);

  struct Pass;    // One pass's state shared with the worker thread (context_ring.cc).
  struct Tensor;  // One tensor's codec and scratch (context_ring.cc).

 private:
  ContextRing(Communicator* comm, ContextRingOptions options);
  absl::Status CheckViews(absl::Span<const TensorView> views, absl::string_view what,
                          bool allow_empty) const;
  absl::Status Begin(bool forward, absl::Span<const TensorView> mine,
                     absl::Span<const TensorView> mine_out);
  // Cancels a running pass (with `why`) and waits for its request.
  void Cancel(absl::Status why);
  absl::Status Finish();

  Communicator* const comm_;
  const ContextRingOptions options_;
  const int rank_, nranks_;
  std::vector<std::unique_ptr<Tensor>> tensors_;
  std::vector<RingPayloadBytes> bytes_;
  std::shared_ptr<Pass> pass_;
  RequestPtr request_;
  int round_ = 0;  // Calls of NextForward / PassGradient in the current pass.
  bool forward_done_ = false;
  // The selectors of every block's forward payload, [tensor][owner rank] (subspace codecs).
  std::vector<std::vector<codecs::SubspaceSelectors>> selectors_;
};

}  // namespace lbcc::comm

#endif  // LBCC_COMM_CONTEXT_RING_H_
