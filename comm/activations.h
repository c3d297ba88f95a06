// Pipeline activations through a Communicator: the subspace codec (codecs/subspace_codec.h) on
// the point-to-point path between two adjacent stages.
//
//   forward   SendActivations(h, ids)      -> RecvActivations(h_out, ids_out, &route)
//             c = U^T (h - T[y]) and the token ids y; the receiver rebuilds h = U c + T[y]
//   backward  SendActivationGrads(g, ...)  -> RecvActivationGrads(g_out)
//             g_c = U^T g; the receiver rebuilds U g_c
//
// Every payload names its basis (content hash and version). A receive accepts a list of bases,
// newest first: the current one and the previous ones kept while backwards of microbatches
// whose forward used them are still in flight (1F1B puts a basis change between a microbatch's
// forward and its backward; see docs/activations.md). The backward of a microbatch is sent
// with the basis and mixture selectors of its forward, which RecvActivations reports in its
// ActivationRoute.
//
// The lossy boundary (codecs/subspace_training.h, TableRefreshMode::kLossy) uses the synced
// token-embedding table as the basis' table and refreshes it after every outer step. A stage
// that holds no embedding follows it through table deltas (codecs/table_delta.h):
//   SendTableUpdate(before, after)  -> RecvTableUpdate(table)
// carries the elements whose bits changed, after which both sides call RefreshTable (or
// ActivationChannel::RefreshTable) on identical bits and reach the same basis id.
//
// Two layers:
//   - free functions that take the basis explicitly: what the C API (lbcc.h) and the Python
//     bindings call, so every language puts the same bytes on the wire;
//   - ActivationChannel: one boundary (communicator, peer, tag) that keeps the current basis
//     and the previous ones itself.
//
// Messages go through Communicator::SendCompressed / RecvCompressed: kHigh priority, not
// ordered with collectives, in order per (peer, tag). Forward and backward may share a tag
// (they travel in opposite directions).
//
// Errors. Returned by the posting call as an already completed request (nothing is sent):
// InvalidArgument for caller input (a null basis, bad options, `h` not host f32 [tokens, d],
// ids outside [0, V) or of the wrong count, a bad peer). Returned by the request:
//   FailedPrecondition  the payload is intact but names a basis the receiver does not accept
//                       (the message names the payload's basis and the accepted ones);
//   DataLoss            corrupt or foreign bytes (checksum, another codec, the other direction);
//   InvalidArgument     a payload of another shape than the receive's buffers;
//   Unavailable / DeadlineExceeded / Cancelled as for every operation (communicator.h).
// On any error the output buffers are untouched.
//
// Thread-safety: the free functions are as thread-safe as the Communicator (post from one
// thread per rank). ActivationChannel is thread-safe; its basis list is guarded by a mutex.
#ifndef LBCC_COMM_ACTIVATIONS_H_
#define LBCC_COMM_ACTIVATIONS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "base/tensor_view.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"
#include "codecs/subspace_training.h"
#include "comm/communicator.h"
#include "comm/request.h"

namespace lbcc::comm {

using SubspaceBasisPtr = std::shared_ptr<const codecs::SubspaceBasis>;

// What a received payload used. The backward of a received forward must be sent with the same
// basis and selectors (SendActivationGrads).
struct ActivationRoute {
  codecs::SubspaceBasisId basis;
  int64_t tokens = 0;
  codecs::SubspaceSelectors selectors;  // empty for a single basis
};

// Encodes `h` (host f32 [tokens, d]) with `ids` (tokens values in [0, V); empty when V = 0)
// against `basis` and sends it to `peer`. `h` and `ids` need only live for the call (the
// payload is encoded before it returns).
RequestPtr SendActivations(Communicator& comm, const TensorView& h, absl::Span<const int32_t> ids,
                           const SubspaceBasisPtr& basis,
                           const codecs::SubspaceCodecOptions& options, int peer, uint32_t tag);

// Receives a forward payload from `peer` and decodes it into `h_out` (host f32 [tokens, d]) and
// `ids_out` (tokens values, or empty) with the basis in `accepted` (newest first) that it
// names. When the request succeeds, `*route` (optional) holds what the payload used and
// `*payload` (optional) a copy of its bytes (to relay them to a later stage, or to log them).
// `h_out`, `ids_out`, `route` and `payload` must stay valid until the request is done.
RequestPtr RecvActivations(Communicator& comm, const TensorView& h_out,
                           absl::Span<int32_t> ids_out, std::vector<SubspaceBasisPtr> accepted,
                           int peer, uint32_t tag, ActivationRoute* route = nullptr,
                           std::vector<uint8_t>* payload = nullptr);

// Encodes the gradient `g` (host f32 [tokens, d]) against `basis`, with the mixture
// `selectors` of the forward it belongs to (empty for a single basis), and sends it to `peer`.
// `g` needs only live for the call.
RequestPtr SendActivationGrads(Communicator& comm, const TensorView& g,
                               const SubspaceBasisPtr& basis,
                               const codecs::SubspaceCodecOptions& options,
                               const codecs::SubspaceSelectors& selectors, int peer, uint32_t tag);

// Receives a backward payload into `g_out` (host f32 [tokens, d]); otherwise as
// RecvActivations.
RequestPtr RecvActivationGrads(Communicator& comm, const TensorView& g_out,
                               std::vector<SubspaceBasisPtr> accepted, int peer, uint32_t tag,
                               ActivationRoute* route = nullptr,
                               std::vector<uint8_t>* payload = nullptr);

// Sends the table delta from `before` to `after` (codecs::EncodeTableDelta: the elements whose
// bits differ) to `peer`, on the same path as the activations (kHigh priority, in order per
// (peer, tag), not ordered with collectives). Both spans need only live for the call (the
// message is encoded before it returns); `*bytes` (optional) gets the message's size then.
// Errors: InvalidArgument at once (nothing sent) when the sizes differ or the peer is bad;
// otherwise as SendActivations.
RequestPtr SendTableUpdate(Communicator& comm, absl::Span<const float> before,
                           absl::Span<const float> after, int peer, uint32_t tag,
                           size_t* bytes = nullptr);

// Receives a table delta from `peer` and applies it to `table` (codecs::ApplyTableDelta), so a
// table that held the sender's `before` then holds its `after` bit for bit. `table` and `bytes`
// must stay valid until the request is done; `*bytes` (optional) gets the message's size when
// it succeeds. Errors of the request: DataLoss for a corrupt or foreign message (an activation
// payload on the same tag included), InvalidArgument for a delta of another table size,
// Unavailable / DeadlineExceeded / Cancelled as for every operation; `table` is untouched on
// any error.
RequestPtr RecvTableUpdate(Communicator& comm, absl::Span<float> table, int peer, uint32_t tag,
                           size_t* bytes = nullptr);

// One stage boundary: a communicator, the peer stage's rank and a tag, with the current basis
// and the previous ones still accepted. Both sides call UpdateBasis between the same two
// messages of the schedule.
class ActivationChannel {
 public:
  // InvalidArgument for a bad peer, a null basis or bad options. `comm` must outlive the
  // channel.
  static absl::StatusOr<std::unique_ptr<ActivationChannel>> Create(
      Communicator* comm, int peer, uint32_t tag, SubspaceBasisPtr basis,
      codecs::SubspaceCodecOptions options = {});

  // Forward with the current basis.
  RequestPtr SendActivations(const TensorView& h, absl::Span<const int32_t> ids);
  // Accepts the current and every kept previous basis.
  RequestPtr RecvActivations(const TensorView& h_out, absl::Span<int32_t> ids_out,
                             ActivationRoute* route);
  // The gradient of the microbatch whose forward `route` describes, with its basis and
  // selectors: FailedPrecondition (at once) when that basis is no longer kept.
  RequestPtr SendActivationGrads(const TensorView& g, const ActivationRoute& route);
  RequestPtr RecvActivationGrads(const TensorView& g_out, ActivationRoute* route = nullptr);

  // Makes `basis` current and keeps the `keep_previous` newest of the others for payloads
  // still in flight. InvalidArgument for a null basis, another d, k or M, or keep_previous < 0.
  // A basis equal to the current one changes nothing.
  absl::Status UpdateBasis(SubspaceBasisPtr basis, int keep_previous = 1);
  // Once every in-flight backward drained.
  void DropPreviousBases();
  // The next basis after an outer step, codecs::RefreshTable(basis(), embedding, mode) with
  // kPortable arithmetic (identical bits on every machine), made current with the previous one
  // kept (UpdateBasis(next, 1)). kLossy reads `embedding` (host f32 [V x d]: the synced
  // embedding, or the table a RecvTableUpdate keeps in step); kConstrained shifts it in place.
  // Both sides call it on the same bits between the same two messages and get the same basis
  // id. Errors as codecs::RefreshTable; on error the channel is unchanged. The basis is
  // computed outside the channel's lock (sends go on meanwhile): call it from one thread.
  absl::StatusOr<SubspaceBasisPtr> RefreshTable(const TensorView& embedding,
                                                codecs::TableRefreshMode mode);

  SubspaceBasisPtr basis() const;
  // The current basis first, then the kept previous ones.
  std::vector<SubspaceBasisPtr> accepted_bases() const;
  int peer() const { return peer_; }
  uint32_t tag() const { return tag_; }

 private:
  ActivationChannel(Communicator* comm, int peer, uint32_t tag, SubspaceBasisPtr basis,
                    codecs::SubspaceCodecOptions options);

  Communicator* const comm_;
  const int peer_;
  const uint32_t tag_;
  const codecs::SubspaceCodecOptions options_;
  mutable Mutex mu_;
  std::vector<SubspaceBasisPtr> bases_ ABSL_GUARDED_BY(mu_);  // current first
};

}  // namespace lbcc::comm

#endif  // LBCC_COMM_ACTIVATIONS_H_
