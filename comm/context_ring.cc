// The context-parallel ring (context_ring.h): a pass is one collective on the communicator's
// worker thread that moves payload bytes; encoding, decoding and the caller's compute run on the
// caller's thread. The two meet in a Pass (mutex + condition variable): the worker publishes
// each round's received payloads, and in the backward it takes each round's payloads from the
// caller.
#include "comm/context_ring.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "codecs/codec.h"
#include "comm/fabric.h"

namespace lbcc::comm {
namespace {

constexpr const char* kForwardOp = "ContextRingForward";
constexpr const char* kBackwardOp = "ContextRingBackward";
// How often a caller's wait looks at the request too: a pass whose signature check failed (or
// that the communicator cancelled before it ran) never runs its op, so only the request knows.
constexpr absl::Duration kRequestPoll = absl::Milliseconds(5);

transport::Tag StepTag(transport::Tag base, int round, int tensor, int tensors) {
  return base + static_cast<transport::Tag>(round * tensors + tensor);
}

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

}  // namespace

std::string RingCodec::Describe() const {
  switch (kind) {
    case Kind::kRawF32:
      return "raw_f32";
    case Kind::kDense:
      return absl::StrCat("dense(", codecs::DenseFormatName(dense_format), ")");
    case Kind::kSubspace:
      return absl::StrCat("subspace(basis=", basis ? basis->id().ToString() : "null",
                          ", d=", basis ? basis->model_dim() : 0, ", k=",
                          basis ? basis->rank() : 0, ", M=", basis ? basis->components() : 0,
                          ", ", DTypeName(subspace.coefficient_dtype), ", int8_block=",
                          subspace.int8_block, ", mixture_block=", subspace.mixture_block, ")");
  }
  return "unknown";
}

// One tensor's codec and decoding memory (the caller's thread only).
struct ContextRing::Tensor {
  RingCodec spec;
  int64_t tokens = 0, dim = 0;
  std::unique_ptr<codecs::DenseQuantCodec> dense;
  std::optional<codecs::SubspaceCodec> subspace;
  codecs::DecodeScratch scratch;
  std::vector<float> sum;  // Backward: the partial sum being extended.

  size_t raw_bytes() const { return static_cast<size_t>(tokens * dim) * sizeof(float); }

  absl::StatusOr<std::string> Encode(const TensorView& x, bool forward,
                                     const codecs::SubspaceSelectors& selectors,
                                     codecs::SubspaceSelectors* selectors_out) {
    switch (spec.kind) {
      case RingCodec::Kind::kRawF32:
        return std::string(static_cast<const char*>(x.data()), raw_bytes());
      case RingCodec::Kind::kDense: {
        LBCC_ASSIGN_OR_RETURN(size_t max, dense->MaxEncodedBytes(x.shape()));
        std::string out(max, '\0');
        LBCC_ASSIGN_OR_RETURN(
            size_t n, dense->Encode(x, nullptr,
                                    absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(out.data()),
                                                        out.size())));
        out.resize(n);
        return out;
      }
      case RingCodec::Kind::kSubspace: {
        absl::StatusOr<std::vector<uint8_t>> bytes =
            forward ? subspace->EncodeForward(x, {}, selectors_out)
                    : subspace->EncodeBackward(x, selectors);
        if (!bytes.ok()) return bytes.status();
        return std::string(bytes->begin(), bytes->end());
      }
    }
    return absl::InternalError("unknown ring codec");
  }

  // A peer's payload into `out`. Anything a peer sent that does not fit is DataLoss, except a
  // subspace payload naming another basis (FailedPrecondition, as the codec says).
  absl::Status Decode(const std::string& payload, bool forward, const TensorView& out,
                      codecs::SubspaceSelectors* selectors_out) {
    absl::Status status;
    switch (spec.kind) {
      case RingCodec::Kind::kRawF32:
        if (payload.size() != raw_bytes()) {
          return absl::DataLossError(absl::StrCat("a raw f32 block of ", payload.size(),
                                                  " bytes; expected ", raw_bytes()));
        }
        std::memcpy(out.data(), payload.data(), payload.size());
        return absl::OkStatus();
      case RingCodec::Kind::kDense: {
        codecs::DecodeOptions options;
        options.aggregation = codecs::Aggregation::kSum;
        const absl::Span<const uint8_t> one[] = {Bytes(payload)};
        status = codecs::DecodeAccumulate(*dense, one, options, out, &scratch);
        break;
      }
      case RingCodec::Kind::kSubspace:
        status = forward ? subspace->DecodeForward(Bytes(payload), out, {}, selectors_out)
                         : subspace->DecodeBackward(Bytes(payload), out, selectors_out);
        break;
    }
    if (status.code() == absl::StatusCode::kInvalidArgument) {
      // Our views were checked: a payload of another codec or shape came from the peer.
      return absl::DataLossError(absl::StrCat("a peer's block does not decode: ",
                                              status.message()));
    }
    return status;
  }
};

// One pass, shared by the caller's thread and the worker's op (which may outlive the ring).
struct ContextRing::Pass {
  Pass(bool forward, int rounds, int tensors)
      : forward(forward), rounds(rounds), tensors(tensors),
        in(rounds, std::vector<std::string>(tensors)),
        out(rounds > 0 ? rounds : 1, std::vector<std::string>(tensors)) {}

  const bool forward;
  const int rounds, tensors;
  std::vector<size_t> max_bytes;  // Per tensor: the largest payload a peer may send.
  // Payloads: in[r - 1] arrive in round r (written by the worker before `arrived` reaches r);
  // out[r - 1] leave in round r (forward: out[0] is this rank's block, later rounds relay in[];
  // backward: written by the caller before `ready` reaches r).
  std::vector<std::vector<std::string>> in, out;

  Mutex mu;
  CondVar cv;
  int arrived ABSL_GUARDED_BY(mu) = 0;
  int ready ABSL_GUARDED_BY(mu) = 0;
  absl::Status cancelled ABSL_GUARDED_BY(mu);  // The caller gave up (not OK).
  bool finished ABSL_GUARDED_BY(mu) = false;   // The worker's op returned ...
  absl::Status result ABSL_GUARDED_BY(mu);     // ... with this.

  // The worker's op: rounds of sends to `to` and receives from `from`.
  absl::Status Run(const Group& group, transport::Tag tag, absl::Time deadline,
                   transport::Priority priority) {
    const int n = group.size();
    const int to = group.ranks[(group.me + (forward ? 1 : n - 1)) % n];
    const int from = group.ranks[(group.me + (forward ? n - 1 : 1)) % n];
    Batch sends(group.fabric, deadline);
    absl::Status status;
    for (int r = 1; r <= rounds && status.ok(); ++r) {
      if (!forward) {
        MutexLock lock(&mu);
        while (ready < r && cancelled.ok()) {
          if (cv.WaitWithDeadline(&mu, deadline) && ready < r && cancelled.ok()) {
            status = absl::DeadlineExceededError(absl::StrCat(
                "the caller did not pass round ", r, "'s gradient before the timeout"));
            break;
          }
        }
        if (status.ok() && ready < r) status = cancelled;
        if (!status.ok()) {
          group.fabric->Abort(status);  // Peers wait for this rank's partial sums: fail them.
          break;
        }
      }
      const std::vector<std::string>& send = forward && r > 1 ? in[r - 2] : out[r - 1];
      for (int t = 0; t < tensors; ++t) {
        sends.Send(to, StepTag(tag, r, t, tensors), Bytes(send[t]), priority);
      }
      Batch receives(group.fabric, deadline);
      for (int t = 0; t < tensors; ++t) {
        receives.RecvAny(from, StepTag(tag, r, t, tensors), &in[r - 1][t], max_bytes[t]);
      }
      status = receives.Wait();
      if (status.ok()) {
        MutexLock lock(&mu);
        arrived = r;
        cv.SignalAll();
      }
    }
    absl::Status sent = sends.Wait();
    if (status.ok()) status = sent;
    return status;
  }

  void Finished(absl::Status status) {
    MutexLock lock(&mu);
    finished = true;
    result = std::move(status);
    cv.SignalAll();
  }

  void Cancel(absl::Status why) {
    MutexLock lock(&mu);
    if (cancelled.ok()) cancelled = std::move(why);
    cv.SignalAll();
  }

  // Waits until round r's payloads arrived; else the pass's failure (the worker's, or the
  // request's when the op never ran).
  absl::Status AwaitArrived(int r, const Request& request) {
    MutexLock lock(&mu);
    while (arrived < r) {
      if (finished) {
        return result.ok() ? absl::InternalError("the ring pass ended before its last round")
                           : result;
      }
      if (request.Test()) {
        absl::Status s = request.status();
        return s.ok() ? absl::InternalError("the ring pass ended before its last round") : s;
      }
      cv.WaitWithTimeout(&mu, kRequestPoll);
    }
    return absl::OkStatus();
  }
};

ContextRing::ContextRing(Communicator* comm, ContextRingOptions options)
    : comm_(comm), options_(std::move(options)), rank_(comm->rank()), nranks_(comm->nranks()) {}

ContextRing::~ContextRing() {
  if (request_ != nullptr && !request_->Test()) {
    Cancel(absl::CancelledError("ContextRing destroyed during a pass"));
  }
}

absl::StatusOr<std::unique_ptr<ContextRing>> ContextRing::Create(Communicator* comm,
                                                                 ContextRingOptions options) {
  if (comm == nullptr) return absl::InvalidArgumentError("ContextRing: null communicator");
  if (options.tensors.empty()) {
    return absl::InvalidArgumentError("ContextRing: a block needs at least one tensor");
  }
  if (options.tokens < 1 || options.dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ContextRing: tokens ", options.tokens,
                                                   " and dim ", options.dim, " must be >= 1"));
  }
  if (options.tokens * options.dim > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError("ContextRing: block too large");
  }
  const Group group{comm->fabric(), comm->global_ranks(), comm->rank()};
  LBCC_ASSIGN_OR_RETURN(
      Algorithm chosen,
      comm->ChooseAlgorithm(Collective::kContextRing, group,
                            static_cast<size_t>(options.tokens * options.dim) * 4,
                            options.algorithm));
  options.algorithm = chosen;
  std::unique_ptr<ContextRing> ring(new ContextRing(comm, options));
  const Shape shape{options.tokens, options.dim};
  for (size_t t = 0; t < options.tensors.size(); ++t) {
    const RingCodec& spec = options.tensors[t];
    auto tensor = std::make_unique<Tensor>();
    tensor->spec = spec;
    tensor->tokens = options.tokens;
    tensor->dim = options.dim;
    RingPayloadBytes bytes;
    const std::string what = absl::StrCat("ContextRing: tensor ", t, " (", spec.Describe(), ")");
    switch (spec.kind) {
      case RingCodec::Kind::kRawF32:
        bytes.forward = bytes.backward = tensor->raw_bytes();
        break;
      case RingCodec::Kind::kDense: {
        codecs::DenseQuantOptions dense;
        dense.format = spec.dense_format;
        auto codec = codecs::DenseQuantCodec::Create(dense);
        if (!codec.ok()) return Annotate(codec.status(), what);
        tensor->dense = std::move(*codec);
        LBCC_ASSIGN_OR_RETURN(bytes.forward, tensor->dense->MaxEncodedBytes(shape));
        bytes.backward = bytes.forward;
        break;
      }
      case RingCodec::Kind::kSubspace: {
        if (spec.basis == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": no basis"));
        if (spec.basis->vocab_size() != 0 || spec.basis->model_dim() != options.dim) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, ": the basis must have no vocabulary and d = dim = ", options.dim));
        }
        auto codec = codecs::SubspaceCodec::Create(spec.basis, spec.subspace);
        if (!codec.ok()) return Annotate(codec.status(), what);
        tensor->subspace.emplace(std::move(*codec));
        bytes.forward = tensor->subspace->ForwardPayloadBytes(options.tokens);
        bytes.backward = tensor->subspace->BackwardPayloadBytes(options.tokens);
        break;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat(what, ": unknown codec kind"));
    }
    ring->bytes_.push_back(bytes);
    ring->tensors_.push_back(std::move(tensor));
  }
  ring->selectors_.assign(options.tensors.size(),
                          std::vector<codecs::SubspaceSelectors>(ring->nranks_));
  return ring;
}

absl::Status ContextRing::CheckViews(absl::Span<const TensorView> views, absl::string_view what,
                                     bool allow_empty) const {
  if (allow_empty && views.empty()) return absl::OkStatus();
  if (views.size() != tensors_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", views.size(),
                                                   " tensors; the ring carries ",
                                                   tensors_.size()));
  }
  const Shape shape{options_.tokens, options_.dim};
  for (size_t t = 0; t < views.size(); ++t) {
    const TensorView& v = views[t];
    if (!v.is_host() || v.dtype() != DType::kF32 || v.shape() != shape || v.data() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": tensor ", t, " must be host f32 [", options_.tokens, ", ", options_.dim,
          "]; got ", DTypeName(v.dtype()), " ", ShapeToString(v.shape()),
          v.is_host() ? "" : " (device memory)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ContextRing::Begin(bool forward, absl::Span<const TensorView> mine,
                                absl::Span<const TensorView> mine_out) {
  const char* op = forward ? kForwardOp : kBackwardOp;
  absl::Status why;
  if (request_ != nullptr && !request_->Test()) {
    why = absl::FailedPreconditionError(absl::StrCat(op, ": the previous pass is still running"));
  } else if (!forward && !forward_done_) {
    why = absl::FailedPreconditionError(
        absl::StrCat(op, ": no forward pass of this ring ended before it"));
  } else if (forward) {
    why = CheckViews(mine, op, false);
    if (why.ok()) why = CheckViews(mine_out, absl::StrCat(op, " (mine_out)"), true);
  }
  auto pass = std::make_shared<Pass>(forward, rounds(), static_cast<int>(tensors_.size()));
  for (const RingPayloadBytes& b : bytes_) pass->max_bytes.push_back(forward ? b.forward : b.backward);
  if (why.ok() && forward) {
    for (size_t t = 0; t < tensors_.size() && why.ok(); ++t) {
      codecs::SubspaceSelectors& own = selectors_[t][rank_];
      absl::StatusOr<std::string> payload = tensors_[t]->Encode(mine[t], true, {}, &own);
      if (!payload.ok()) {
        why = Annotate(payload.status(), absl::StrCat(op, ": tensor ", t));
        break;
      }
      pass->out[0][t] = std::move(*payload);
    }
    // This rank's own block as the others will decode it.
    for (size_t t = 0; t < mine_out.size() && why.ok(); ++t) {
      why = tensors_[t]->Decode(pass->out[0][t], true, mine_out[t], nullptr);
    }
  }
  forward_done_ = forward_done_ && !forward;
  round_ = 0;
  if (!why.ok()) {
    // Every rank's pass fails at this position: the ranks stay in step.
    request_ = comm_->PostRejected(op, why);
    pass_ = nullptr;
    return why;
  }
  Signature signature = comm_->NewSignature(op);
  signature.Add("tokens", options_.tokens).Add("dim", options_.dim);
  for (size_t t = 0; t < tensors_.size(); ++t) {
    signature.Add(absl::StrCat("tensor ", t, " codec"), options_.tensors[t].Describe());
  }
  signature.Add("algorithm", AlgorithmName(options_.algorithm));
  const transport::Priority priority = options_.priority;
  request_ = comm_->Post(
      std::move(signature),
      [pass, priority](const Group& group, transport::Tag tag, absl::Time deadline) {
        absl::Status status = pass->Run(group, tag, deadline, priority);
        pass->Finished(status);
        return status;
      },
      options_.timeout);
  pass_ = std::move(pass);
  return absl::OkStatus();
}

absl::Status ContextRing::BeginForward(absl::Span<const TensorView> mine,
                                       absl::Span<const TensorView> mine_out) {
  return Begin(true, mine, mine_out);
}

absl::Status ContextRing::BeginBackward() { return Begin(false, {}, {}); }

void ContextRing::Cancel(absl::Status why) {
  if (pass_ != nullptr) {
    pass_->Cancel(why);
    // Mid-backward the peers wait for this rank's partial sums: fail them now rather than at
    // the timeout. A forward needs nothing from this thread: its relays finish on their own.
    if (!pass_->forward && !request_->Test()) comm_->fabric()->Abort(why);
  }
  if (request_ != nullptr) (void)request_->Wait();
}

absl::StatusOr<int> ContextRing::NextForward(absl::Span<const TensorView> out) {
  if (pass_ == nullptr || !pass_->forward) {
    return absl::FailedPreconditionError("NextForward: no forward pass running (BeginForward)");
  }
  if (round_ >= rounds()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NextForward: all ", rounds(), " rounds were taken"));
  }
  LBCC_RETURN_IF_ERROR(CheckViews(out, "NextForward", false));
  const int r = round_ + 1;
  LBCC_RETURN_IF_ERROR(pass_->AwaitArrived(r, *request_));
  const int source = (rank_ - r + nranks_) % nranks_;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    absl::Status s = tensors_[t]->Decode(pass_->in[r - 1][t], true, out[t], &selectors_[t][source]);
    if (!s.ok()) {
      s = Annotate(s, absl::StrCat("NextForward: block of rank ", source, ", tensor ", t));
      Cancel(s);
      return s;
    }
  }
  round_ = r;
  return source;
}

absl::Status ContextRing::Finish() {
  absl::Status s = request_->Wait();
  pass_ = nullptr;
  return s;
}

absl::Status ContextRing::EndForward() {
  if (pass_ == nullptr || !pass_->forward) {
    return absl::FailedPreconditionError("EndForward: no forward pass running");
  }
  if (round_ < rounds()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "EndForward after ", round_, " of ", rounds(), " rounds (call NextForward first)"));
  }
  LBCC_RETURN_IF_ERROR(Finish());
  forward_done_ = true;
  return absl::OkStatus();
}

absl::StatusOr<int> ContextRing::PassGradient(absl::Span<const TensorView> contribution) {
  if (pass_ == nullptr || pass_->forward) {
    return absl::FailedPreconditionError("PassGradient: no backward pass running (BeginBackward)");
  }
  if (round_ >= rounds()) {
    return absl::FailedPreconditionError(
        absl::StrCat("PassGradient: all ", rounds(), " rounds were passed"));
  }
  const int r = round_ + 1;
  const int owner = (rank_ + r) % nranks_;
  absl::Status s = CheckViews(contribution, "PassGradient", false);
  if (s.ok() && r > 1) s = pass_->AwaitArrived(r - 1, *request_);
  std::vector<std::string> payloads(tensors_.size());
  for (size_t t = 0; t < tensors_.size() && s.ok(); ++t) {
    Tensor& tensor = *tensors_[t];
    const TensorView& c = contribution[t];
    const size_t n = static_cast<size_t>(options_.tokens * options_.dim);
    tensor.sum.resize(n);
    TensorView sum = *TensorView::Create(tensor.sum.data(), DType::kF32,
                                         {options_.tokens, options_.dim});
    if (r > 1) {
      s = tensor.Decode(pass_->in[r - 2][t], false, sum, nullptr);
      if (!s.ok()) {
        s = Annotate(s, absl::StrCat("PassGradient: partial sum of block ", owner));
        break;
      }
      const float* add = static_cast<const float*>(c.data());
      for (size_t i = 0; i < n; ++i) tensor.sum[i] += add[i];
    } else {
      std::memcpy(tensor.sum.data(), c.data(), n * sizeof(float));
    }
    absl::StatusOr<std::string> payload =
        tensor.Encode(sum, false, selectors_[t][owner], nullptr);
    if (!payload.ok()) {
      s = Annotate(payload.status(), absl::StrCat("PassGradient: block ", owner, ", tensor ", t));
      break;
    }
    payloads[t] = std::move(*payload);
  }
  if (!s.ok()) {
    Cancel(s);
    return s;
  }
  {
    MutexLock lock(&pass_->mu);
    pass_->out[r - 1] = std::move(payloads);
    pass_->ready = r;
    pass_->cv.SignalAll();
  }
  round_ = r;
  return owner;
}

absl::Status ContextRing::EndBackward(absl::Span<const TensorView> out) {
  if (pass_ == nullptr || pass_->forward) {
    return absl::FailedPreconditionError("EndBackward: no backward pass running");
  }
  if (round_ < rounds()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "EndBackward after ", round_, " of ", rounds(), " rounds (call PassGradient first)"));
  }
  LBCC_RETURN_IF_ERROR(CheckViews(out, "EndBackward", false));
  if (rounds() == 0) {
    for (const TensorView& v : out) std::memset(v.data(), 0, v.num_bytes());
    return Finish();
  }
  LBCC_RETURN_IF_ERROR(pass_->AwaitArrived(rounds(), *request_));
  for (size_t t = 0; t < tensors_.size(); ++t) {
    absl::Status s = tensors_[t]->Decode(pass_->in[rounds() - 1][t], false, out[t], nullptr);
    if (!s.ok()) {
      s = Annotate(s, absl::StrCat("EndBackward: tensor ", t));
      Cancel(s);
      return s;
    }
  }
  return Finish();
}

}  // namespace lbcc::comm
