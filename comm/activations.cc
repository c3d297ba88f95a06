// Pipeline activations over SendCompressed / RecvCompressed (see activations.h).
#include "comm/activations.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "codecs/table_delta.h"

namespace lbcc::comm {
namespace {

using codecs::SubspaceDirection;

const char* DirectionName(SubspaceDirection direction) {
  return direction == SubspaceDirection::kForward ? "activations" : "activation gradients";
}

// One subspace message as a codecs::Codec, so SendCompressed can carry it: Encode() runs the
// forward encoder (with the ids) or the backward one (with the selectors). It lives for one
// SendCompressed call, which encodes before it returns.
class SubspaceMessageCodec final : public codecs::Codec {
 public:
  SubspaceMessageCodec(codecs::SubspaceCodec codec, SubspaceDirection direction,
                       absl::Span<const int32_t> ids, const codecs::SubspaceSelectors* selectors)
      : codec_(std::move(codec)), direction_(direction), ids_(ids), selectors_(selectors) {}

  codecs::CodecId id() const override {
    return direction_ == SubspaceDirection::kForward ? codecs::CodecId::kSubspaceForward
                                                     : codecs::CodecId::kSubspaceBackward;
  }
  std::string Describe() const override { return absl::StrCat("subspace ", DirectionName(direction_)); }
  absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t> shape) const override {
    if (shape.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          DirectionName(direction_), ": expected [tokens, d], got ", ShapeToString(shape)));
    }
    return direction_ == SubspaceDirection::kForward ? codec_.ForwardPayloadBytes(shape[0])
                                                     : codec_.BackwardPayloadBytes(shape[0]);
  }
  absl::StatusOr<size_t> Encode(const TensorView& input, codecs::CodecState* state,
                                absl::Span<uint8_t> out) const override {
    (void)state;
    if (direction_ == SubspaceDirection::kForward) return codec_.EncodeForward(input, ids_, out);
    return codec_.EncodeBackward(input, *selectors_, out);
  }

 private:
  mutable codecs::SubspaceCodec codec_;  // scratch; one call at a time
  SubspaceDirection direction_;
  absl::Span<const int32_t> ids_;
  const codecs::SubspaceSelectors* selectors_;
};

RequestPtr Send(Communicator& comm, SubspaceDirection direction, const TensorView& x,
                absl::Span<const int32_t> ids, const SubspaceBasisPtr& basis,
                const codecs::SubspaceCodecOptions& options,
                const codecs::SubspaceSelectors& selectors, int peer, uint32_t tag) {
  const char* what = direction == SubspaceDirection::kForward ? "SendActivations"
                                                              : "SendActivationGrads";
  if (basis == nullptr) {
    return CompletedRequest(absl::InvalidArgumentError(absl::StrCat(what, ": basis is null")));
  }
  absl::StatusOr<codecs::SubspaceCodec> codec = codecs::SubspaceCodec::Create(basis, options);
  if (!codec.ok()) return CompletedRequest(Annotate(codec.status(), what));
  SubspaceMessageCodec message(*std::move(codec), direction, ids, &selectors);
  return comm.SendCompressed(x, &message, nullptr, peer, tag);
}

// What a receive decodes with (on a transport thread) and where it reports.
struct Receive {
  SubspaceDirection direction;
  std::vector<SubspaceBasisPtr> accepted;
  absl::Span<int32_t> ids;
  ActivationRoute* route;
  std::vector<uint8_t>* payload;

  absl::Status Decode(absl::Span<const uint8_t> bytes, const TensorView& out) const {
    LBCC_ASSIGN_OR_RETURN(const codecs::SubspacePayloadHeader header,
                          codecs::InspectSubspacePayload(bytes));
    // The basis the payload names (e.g. the previous one while in-flight backwards drain);
    // otherwise the newest, whose decoder rejects the payload naming both bases.
    SubspaceBasisPtr basis = accepted.front();
    bool found = false;
    for (const SubspaceBasisPtr& b : accepted) {
      if (b->id() == header.basis) {
        basis = b;
        found = true;
        break;
      }
    }
    LBCC_ASSIGN_OR_RETURN(codecs::SubspaceCodec codec, codecs::SubspaceCodec::Create(basis));
    ActivationRoute got;
    absl::Status status =
        direction == SubspaceDirection::kForward
            ? codec.DecodeForward(bytes, out, ids, &got.selectors)
            : codec.DecodeBackward(bytes, out, &got.selectors);
    if (!found && accepted.size() > 1 && status.code() == absl::StatusCode::kFailedPrecondition) {
      std::vector<std::string> names;
      for (const SubspaceBasisPtr& b : accepted) names.push_back(b->id().ToString());
      status = Annotate(status, absl::StrCat("accepted bases: ", absl::StrJoin(names, ", ")));
    }
    LBCC_RETURN_IF_ERROR(status);
    got.basis = header.basis;
    got.tokens = header.tokens;
    if (route != nullptr) *route = std::move(got);
    if (payload != nullptr) payload->assign(bytes.begin(), bytes.end());
    return absl::OkStatus();
  }
};

RequestPtr Recv(Communicator& comm, SubspaceDirection direction, const TensorView& out,
                absl::Span<int32_t> ids, std::vector<SubspaceBasisPtr> accepted, int peer,
                uint32_t tag, ActivationRoute* route, std::vector<uint8_t>* payload) {
  const char* what = direction == SubspaceDirection::kForward ? "RecvActivations"
                                                              : "RecvActivationGrads";
  if (accepted.empty() || std::any_of(accepted.begin(), accepted.end(),
                                      [](const SubspaceBasisPtr& b) { return b == nullptr; })) {
    return CompletedRequest(
        absl::InvalidArgumentError(absl::StrCat(what, ": no bases, or a null one")));
  }
  const int64_t d = accepted.front()->model_dim();
  if (!out.is_host() || out.dtype() != DType::kF32 || out.rank() != 2 || out.dim(1) != d) {
    return CompletedRequest(absl::InvalidArgumentError(absl::StrCat(
        what, ": output is ", out.DebugString(), ", expected f32[tokens, ", d, "]@host")));
  }
  if (!ids.empty() && static_cast<int64_t>(ids.size()) != out.dim(0)) {
    return CompletedRequest(absl::InvalidArgumentError(absl::StrCat(
        what, ": ids output holds ", ids.size(), " values for ", out.dim(0), " tokens")));
  }
  auto receive = std::make_shared<const Receive>(
      Receive{direction, std::move(accepted), ids, route, payload});
  return comm.RecvCompressed(out, peer, tag,
                             [receive](absl::Span<const uint8_t> bytes, const TensorView& target) {
                               return receive->Decode(bytes, target);
                             });
}

// A table delta as a codecs::Codec, so SendCompressed carries it like the activations: the
// message is encoded when the object is made and copied out by Encode(). It lives for one
// SendCompressed call.
class TableDeltaMessage final : public codecs::Codec {
 public:
  explicit TableDeltaMessage(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}

  // Not an envelope payload (no codec id: the message has its own magic); the id only names
  // a device twin, and table deltas are host-only.
  codecs::CodecId id() const override { return static_cast<codecs::CodecId>(0); }
  absl::string_view name() const override { return "table_delta"; }
  std::string Describe() const override { return "table delta"; }
  absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t>) const override {
    return bytes_.size();
  }
  absl::StatusOr<size_t> Encode(const TensorView&, codecs::CodecState*,
                                absl::Span<uint8_t> out) const override {
    if (out.size() < bytes_.size()) return absl::InternalError("table delta: short buffer");
    std::copy(bytes_.begin(), bytes_.end(), out.begin());
    return bytes_.size();
  }

 private:
  std::vector<uint8_t> bytes_;
};

// A 1-D host f32 view of a table (RecvCompressed's `out`; SendCompressed's input, which the
// message codec does not read).
absl::StatusOr<TensorView> TableView(const float* data, size_t size) {
  if (size > static_cast<size_t>(INT64_MAX / sizeof(float))) {
    return absl::InvalidArgumentError(absl::StrCat("a table of ", size, " elements"));
  }
  return TensorView::Host(const_cast<float*>(data), {static_cast<int64_t>(size)});
}

}  // namespace

RequestPtr SendTableUpdate(Communicator& comm, absl::Span<const float> before,
                           absl::Span<const float> after, int peer, uint32_t tag, size_t* bytes) {
  absl::StatusOr<std::vector<uint8_t>> message = codecs::EncodeTableDelta(before, after);
  if (!message.ok()) return CompletedRequest(Annotate(message.status(), "SendTableUpdate"));
  absl::StatusOr<TensorView> view = TableView(after.data(), after.size());
  if (!view.ok()) return CompletedRequest(Annotate(view.status(), "SendTableUpdate"));
  const size_t size = message->size();
  TableDeltaMessage codec(*std::move(message));
  RequestPtr request = comm.SendCompressed(*view, &codec, nullptr, peer, tag);
  if (bytes != nullptr && !request->RejectedAtPost()) *bytes = size;
  return request;
}

RequestPtr RecvTableUpdate(Communicator& comm, absl::Span<float> table, int peer, uint32_t tag,
                           size_t* bytes) {
  absl::StatusOr<TensorView> view = TableView(table.data(), table.size());
  if (!view.ok()) return CompletedRequest(Annotate(view.status(), "RecvTableUpdate"));
  return comm.RecvCompressed(
      *view, peer, tag, [table, bytes](absl::Span<const uint8_t> message, const TensorView&) {
        absl::Status status = codecs::ApplyTableDelta(message, table);
        if (status.ok() && bytes != nullptr) *bytes = message.size();
        return Annotate(status, "RecvTableUpdate");
      });
}

RequestPtr SendActivations(Communicator& comm, const TensorView& h, absl::Span<const int32_t> ids,
                           const SubspaceBasisPtr& basis,
                           const codecs::SubspaceCodecOptions& options, int peer, uint32_t tag) {
  return Send(comm, SubspaceDirection::kForward, h, ids, basis, options, {}, peer, tag);
}

RequestPtr RecvActivations(Communicator& comm, const TensorView& h_out,
                           absl::Span<int32_t> ids_out, std::vector<SubspaceBasisPtr> accepted,
                           int peer, uint32_t tag, ActivationRoute* route,
                           std::vector<uint8_t>* payload) {
  return Recv(comm, SubspaceDirection::kForward, h_out, ids_out, std::move(accepted), peer, tag,
              route, payload);
}

RequestPtr SendActivationGrads(Communicator& comm, const TensorView& g,
                               const SubspaceBasisPtr& basis,
                               const codecs::SubspaceCodecOptions& options,
                               const codecs::SubspaceSelectors& selectors, int peer,
                               uint32_t tag) {
  return Send(comm, SubspaceDirection::kBackward, g, {}, basis, options, selectors, peer, tag);
}

RequestPtr RecvActivationGrads(Communicator& comm, const TensorView& g_out,
                               std::vector<SubspaceBasisPtr> accepted, int peer, uint32_t tag,
                               ActivationRoute* route, std::vector<uint8_t>* payload) {
  return Recv(comm, SubspaceDirection::kBackward, g_out, {}, std::move(accepted), peer, tag,
              route, payload);
}

absl::StatusOr<std::unique_ptr<ActivationChannel>> ActivationChannel::Create(
    Communicator* comm, int peer, uint32_t tag, SubspaceBasisPtr basis,
    codecs::SubspaceCodecOptions options) {
  if (comm == nullptr || peer < 0 || peer >= comm->nranks() || peer == comm->rank()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ActivationChannel: bad peer ", peer, comm == nullptr ? " (no communicator)" : ""));
  }
  if (basis == nullptr) return absl::InvalidArgumentError("ActivationChannel: basis is null");
  LBCC_RETURN_IF_ERROR(codecs::SubspaceCodec::Create(basis, options).status());
  return std::unique_ptr<ActivationChannel>(
      new ActivationChannel(comm, peer, tag, std::move(basis), options));
}

ActivationChannel::ActivationChannel(Communicator* comm, int peer, uint32_t tag,
                                     SubspaceBasisPtr basis, codecs::SubspaceCodecOptions options)
    : comm_(comm), peer_(peer), tag_(tag), options_(options), bases_{std::move(basis)} {}

RequestPtr ActivationChannel::SendActivations(const TensorView& h,
                                              absl::Span<const int32_t> ids) {
  return comm::SendActivations(*comm_, h, ids, basis(), options_, peer_, tag_);
}

RequestPtr ActivationChannel::RecvActivations(const TensorView& h_out,
                                              absl::Span<int32_t> ids_out,
                                              ActivationRoute* route) {
  return comm::RecvActivations(*comm_, h_out, ids_out, accepted_bases(), peer_, tag_, route);
}

RequestPtr ActivationChannel::SendActivationGrads(const TensorView& g,
                                                  const ActivationRoute& route) {
  SubspaceBasisPtr basis;
  std::vector<std::string> kept;
  for (const SubspaceBasisPtr& b : accepted_bases()) {
    if (b->id() == route.basis) basis = b;
    kept.push_back(b->id().ToString());
  }
  if (basis == nullptr) {
    return CompletedRequest(absl::FailedPreconditionError(absl::StrCat(
        "SendActivationGrads: the forward used basis ", route.basis.ToString(),
        ", which this channel no longer keeps (kept: ", absl::StrJoin(kept, ", "), ")")));
  }
  if (g.rank() >= 1 && g.dim(0) != route.tokens) {
    return CompletedRequest(absl::InvalidArgumentError(
        absl::StrCat("SendActivationGrads: gradient of ", g.DebugString(), " for a forward of ",
                     route.tokens, " tokens")));
  }
  return comm::SendActivationGrads(*comm_, g, basis, options_, route.selectors, peer_, tag_);
}

RequestPtr ActivationChannel::RecvActivationGrads(const TensorView& g_out,
                                                  ActivationRoute* route) {
  return comm::RecvActivationGrads(*comm_, g_out, accepted_bases(), peer_, tag_, route);
}

absl::Status ActivationChannel::UpdateBasis(SubspaceBasisPtr basis, int keep_previous) {
  if (basis == nullptr || keep_previous < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("UpdateBasis: null basis or keep_previous ", keep_previous, " < 0"));
  }
  MutexLock lock(&mu_);
  const codecs::SubspaceBasis& current = *bases_.front();
  if (basis->id() == current.id()) return absl::OkStatus();
  if (basis->model_dim() != current.model_dim() || basis->rank() != current.rank() ||
      basis->components() != current.components()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UpdateBasis: basis ", basis->id().ToString(), " has d ", basis->model_dim(), ", k ",
        basis->rank(), ", M ", basis->components(), "; the channel's ", current.id().ToString(),
        " has d ", current.model_dim(), ", k ", current.rank(), ", M ", current.components()));
  }
  bases_.erase(std::remove_if(bases_.begin(), bases_.end(),
                              [&](const SubspaceBasisPtr& b) { return b->id() == basis->id(); }),
               bases_.end());
  bases_.insert(bases_.begin(), std::move(basis));
  bases_.resize(std::min(bases_.size(), static_cast<size_t>(keep_previous) + 1));
  return absl::OkStatus();
}

void ActivationChannel::DropPreviousBases() {
  MutexLock lock(&mu_);
  bases_.resize(1);
}

absl::StatusOr<SubspaceBasisPtr> ActivationChannel::RefreshTable(const TensorView& embedding,
                                                                 codecs::TableRefreshMode mode) {
  const SubspaceBasisPtr current = basis();
  LBCC_ASSIGN_OR_RETURN(SubspaceBasisPtr next,
                        codecs::RefreshTable(*current, embedding, mode,
                                             codecs::SubspaceArithmetic::kPortable));
  LBCC_RETURN_IF_ERROR(UpdateBasis(next, /*keep_previous=*/1));
  return next;
}

SubspaceBasisPtr ActivationChannel::basis() const {
  MutexLock lock(&mu_);
  return bases_.front();
}

std::vector<SubspaceBasisPtr> ActivationChannel::accepted_bases() const {
  MutexLock lock(&mu_);
  return bases_;
}

}  // namespace lbcc::comm
