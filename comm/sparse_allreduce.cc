#include "comm/sparse_allreduce.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "codecs/payload.h"
#include "comm/agreement.h"
#include "comm/sparse_blob.h"
#include "comm/tensor_codec.h"

namespace lbcc::comm {
namespace internal {
namespace {

// Groups are exchanged in a pipeline, so that encoding group g + 1 overlaps the exchange of
// group g (a model's parameters are many tensors); every group costs a synchronisation of all
// ranks (its all-gather), so there are at most this many, and not small ones (the default
// minimum of LBCC_SPARSE_GROUP_ELEMENTS; docs/sparse_allreduce.md).
constexpr int kMaxPipelineGroups = 8;

// Over slow links, a large tensor alone in its group goes out in this many pieces while it is
// encoded, then a final message (sparse_blob.h); few, since every message costs each receiver
// CPU (docs/sparse_allreduce.md).
constexpr int kStreamPieces = 4;
constexpr int64_t kStreamMinElements = int64_t{1} << 16;

// Bounds what one peer may make us allocate for one message.
constexpr size_t kMaxMessageBytes = size_t{1} << 40;

// The agreement's decision on step `op` (comm/agreement.h). A rank whose caller aborted the
// communicator (Communicator::Abort) votes abort and returns at once: the peers learn why from
// its vote, and its caller does not wait for their votes, which on a failed step serve only to
// name a lost rank (the agreement waits up to its grace period for them). The kAborted code
// keeps that naming out; the worker reports the caller's abort (AbortRecord::Explain).
absl::Status Decide(OutcomeAgreement& agreement, const Group& group, uint64_t op,
                    absl::Status local, absl::Time deadline) {
  if (!local.ok()) {
    const absl::Status by_caller = group.fabric->caller_abort();
    if (!by_caller.ok()) {
      (void)agreement.Decide(group, op, absl::AbortedError(by_caller.message()), deadline);
      return local;
    }
  }
  return agreement.Decide(group, op, std::move(local), deadline);
}

}  // namespace

// The codec reports its body's leading bytes as they become final (codecs::EncodeObserver;
// TopK-EF's index section, most of the payload); they go out as a piece once `threshold` bytes
// are pending, instead of after the encode, which for one tensor cannot otherwise overlap the
// wire. Always exactly kStreamPieces pieces: a sender with less to stream sends empty ones.
class PieceSender final : public codecs::EncodeObserver {
 public:
  // `send` puts one piece on the wire (and keeps it alive as long as needed).
  PieceSender(std::function<void(std::string)> send, size_t threshold)
      : send_(std::move(send)), threshold_(threshold) {}

  void Append(absl::Span<const uint8_t> bytes) override {
    if (!usable_) return;
    pending_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (pending_.size() >= threshold_ && sent_ < kStreamPieces) {
      sent_bytes_ += pending_.size();
      Send(std::move(pending_));
      pending_.clear();
    }
  }
  void Discard() override { usable_ = false; }

  // Sends the pieces still due (empty); returns the piece bytes the blob's payload starts with.
  size_t Finish() {
    while (sent_ < kStreamPieces) Send(std::string());
    return usable_ ? sent_bytes_ : 0;
  }

 private:
  void Send(std::string piece) {
    send_(std::move(piece));
    ++sent_;
  }

  const std::function<void(std::string)> send_;
  const size_t threshold_;
  std::string pending_;
  size_t sent_bytes_ = 0;
  int sent_ = 0;
  bool usable_ = true;
};

std::vector<std::pair<size_t, size_t>> PlanGroups(
    const std::vector<Communicator::SparseTensor>& tensors, int max_groups,
    int64_t min_elements) {
  int64_t total = 0;
  for (const auto& t : tensors) total += t.delta.num_elements();
  const int64_t target = std::max(total / std::max(1, max_groups), min_elements);
  std::vector<std::pair<size_t, size_t>> groups;
  size_t begin = 0;
  int64_t filled = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    filled += tensors[i].delta.num_elements();
    if (filled >= target || i + 1 == tensors.size()) {
      groups.emplace_back(begin, i + 1);
      begin = i + 1;
      filled = 0;
    }
  }
  if (groups.empty()) groups.emplace_back(0, 0);
  return groups;
}

int64_t ResolveSparseGroupElements(const OpOptions& options, const CommConfig& config) {
  if (options.sparse_group_elements > 0) return options.sparse_group_elements;
  return *config.sparse_group_elements;  // Resolved at Init.
}

SparseAllReduceSchedule::SparseAllReduceSchedule(
    const Resources& resources, const std::vector<Communicator::SparseTensor>& tensors,
    const codecs::Codec& codec, const codecs::DecodeOptions& decode, const OpOptions& options,
    int64_t min_elements)
    : group_(*resources.group),
      tag_(resources.tag),
      deadline_(resources.deadline),
      topology_(*resources.topology),
      pool_(resources.pool),
      encode_buffer_(*resources.encode_buffer),
      decode_scratch_(*resources.decode_scratch),
      tensors_(tensors),
      codec_(codec),
      decode_(decode),
      options_(options),
      configured_(resources.configured),
      agreement_(resources.agreement),
      profile_(resources.profile),
      header_(resources.header),
      min_elements_(min_elements) {}

SparseAllReduceSchedule::~SparseAllReduceSchedule() = default;

absl::Status SparseAllReduceSchedule::Run() {
  const absl::Time t0 = absl::Now();
  if (absl::Status planned = Plan(); !planned.ok()) {
    return PassHeader() ? planned : header_status_;  // a mismatch explains more than the plan
  }
  PrepareDecodeScratch();
  MaybeFault(group_, FaultPoint::kBeforeSend);
  pool_->Submit([this] { ExchangeAndValidate(); });
  EncodeAndStream();
  const absl::Time t1 = absl::Now();
  {
    MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return exchange_done_; });
  }
  absl::Status sent = DrainTasks();
  if (!sent.ok() && exchanged_.ok()) exchanged_ = sent;
  MaybeFault(group_, FaultPoint::kAfterLastSend);
  const absl::Time t2 = absl::Now();
  concluded_ = t2;  // Conclude() moves it to the agreement's end; a failed header round has none.
  // A failed header round posted nothing: the states' pending encodes are dropped, and the
  // caller reports the verdict as CheckSignatures would have.
  const absl::Status concluded = header_status_.ok() ? Conclude() : header_status_;
  if (!header_status_.ok()) AbortStates();
  const absl::Time t3 = absl::Now();
  if (profile_ != nullptr) {
    profile_->header += header_wait_;
    profile_->encode += t1 - t0 - header_wait_;
    profile_->wire_wait += t2 - t1;
    profile_->agreement += concluded_ - t2;
    profile_->decode += t3 - concluded_;
    profile_->validate += validating_;
  }
  LBCC_RETURN_IF_ERROR(concluded);
  LBCC_LOG(TRACE) << "SparseAllReduce rank " << group_.me << ": " << tensors_.size()
                  << " tensors in " << plan_.size() << " groups, algorithm "
                  << AlgorithmName(algorithms_[0]) << ", encode "
                  << absl::ToDoubleMilliseconds(t1 - t0) << " ms, then exchange and validation "
                  << absl::ToDoubleMilliseconds(t2 - t1) << " ms, agreement "
                  << absl::ToDoubleMilliseconds(concluded_ - t2) << " ms, decode "
                  << absl::ToDoubleMilliseconds(t3 - concluded_) << " ms";
  return absl::OkStatus();
}

// 1. Every rank plans the same groups, algorithms and tags: they depend only on the shapes, the
// codec (the worst-case payload size) and the topology, never on what a rank encoded.
absl::Status SparseAllReduceSchedule::Plan() {
  // An all-gather uses at most max(n, 3) tag steps; groups take disjoint step ranges.
  steps_ = static_cast<uint32_t>(std::max(group_.size(), 3));
  const int max_groups =
      static_cast<int>(std::min<uint32_t>(kMaxPipelineGroups, kSignatureStep / steps_));
  plan_ = PlanGroups(tensors_, max_groups, min_elements_);
  const int num_groups = static_cast<int>(plan_.size());
  const GroupShape shape = ShapeOf(topology_, group_.ranks);
  algorithms_.resize(num_groups);
  for (int g = 0; g < num_groups; ++g) {
    size_t bytes = 5;
    for (size_t i = plan_[g].first; i < plan_[g].second; ++i) {
      absl::StatusOr<size_t> max = codec_.MaxEncodedBytes(tensors_[i].delta.shape());
      bytes += 8 + (max.ok() ? *max : 0);  // A bad shape fails in the encode.
    }
    LBCC_ASSIGN_OR_RETURN(algorithms_[g], SelectAlgorithm(Collective::kAllGatherV, shape, bytes,
                                                          options_.algorithm, configured_));
  }
  direct_ = std::all_of(algorithms_.begin(), algorithms_.end(),
                        [](Algorithm a) { return a == Algorithm::kDirect; });
  // Streamed groups: one large tensor, over slow links. Without the direct algorithm each of its
  // messages is an all-gather with tag steps of its own, so only while they fit in the tag space.
  pieces_.assign(num_groups, 0);
  first_step_.assign(num_groups + 1, 0);
  for (int g = 0; g < num_groups; ++g) {
    if (group_.size() > 1 && shape.any_slow && plan_[g].second - plan_[g].first == 1 &&
        tensors_[plan_[g].first].delta.num_elements() >= kStreamMinElements) {
      pieces_[g] = kStreamPieces;
    }
    const uint32_t rounds = direct_ ? 1 : static_cast<uint32_t>(pieces_[g] + 1);
    first_step_[g + 1] = first_step_[g] + rounds * steps_;
  }
  if (first_step_[num_groups] > kSignatureStep) {
    std::fill(pieces_.begin(), pieces_.end(), 0);
    for (int g = 0; g < num_groups; ++g) first_step_[g + 1] = first_step_[g] + steps_;
  }
  groups_.resize(num_groups);
  per_rank_.resize(group_.size());
  return absl::OkStatus();
}

void SparseAllReduceSchedule::PrepareDecodeScratch() {
  if (decode_scratch_.size() < tensors_.size()) decode_scratch_.resize(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (decode_scratch_[i] == nullptr) {
      decode_scratch_[i] = std::make_unique<codecs::DecodeScratch>();
    }
  }
}

// 2. Group by group, each posted as soon as it is encoded, without waiting for the previous
// group's all-gather: a rank whose encode runs ahead keeps the links busy while a slower one
// catches up. Once this rank gave up (an error blob), later groups are not encoded: their blobs
// repeat the error. Once it learns that another rank gave up, it sends placeholders. Either
// way every group is exchanged, so no send waits for a receive that never comes; only a failed
// exchange stops the posting.
void SparseAllReduceSchedule::EncodeAndStream() {
  for (int g = 0; g < static_cast<int>(plan_.size()); ++g) {
    bool placeholder = false;
    {
      MutexLock lock(&mu_);
      if (exchange_failed_) break;
      placeholder = stop_encoding_;
    }
    EncodeGroup(g, placeholder);
    if (g == 0) MaybeFault(group_, FaultPoint::kMidExchange);
    MutexLock lock(&mu_);
    encoded_ = g + 1;
  }
}

// A blob is u8 ok, then u32 count + (u64 size, bytes) per tensor, or the error that made this
// rank give up (sparse_blob.h). A streamed group's pieces go out while the encode runs.
void SparseAllReduceSchedule::EncodeGroup(int g, bool placeholder) {
  std::unique_ptr<PieceSender> piece_sender;
  if (pieces_[g] > 0) {
    absl::StatusOr<size_t> max = codec_.MaxEncodedBytes(tensors_[plan_[g].first].delta.shape());
    const size_t threshold = std::max<size_t>(4096, (max.ok() ? *max : 0) / (2 * kStreamPieces));
    piece_sender = std::make_unique<PieceSender>(
        [this, g](std::string piece) { PostMessage(g, std::move(piece)); }, threshold);
  }
  size_t stream_prefix = 0;  // the blob's bytes before the streamed ones
  std::string blob(1, '\1');
  const uint32_t count = static_cast<uint32_t>(plan_[g].second - plan_[g].first);
  blob.append(reinterpret_cast<const char*>(&count), 4);
  for (size_t i = plan_[g].first;
       i < plan_[g].second && local_.ok() && !placeholder && header_status_.ok(); ++i) {
    local_ = EncodeTensorInto(i, piece_sender.get(), &blob, &stream_prefix);
  }
  if (!local_.ok()) blob = ErrorBlob(local_);
  if (placeholder && local_.ok()) blob = ErrorBlob(absl::AbortedError("another rank gave up"));
  if (piece_sender == nullptr) {
    PostMessage(g, std::move(blob));
    return;
  }
  size_t used = piece_sender->Finish();
  if (!local_.ok() || placeholder || stream_prefix == 0) used = 0;
  PostMessage(g, StreamFinal(blob, used > 0 ? stream_prefix : blob.size(), used));
  groups_[g].blob = std::move(blob);
}

absl::Status SparseAllReduceSchedule::EncodeTensorInto(size_t i, PieceSender* pieces,
                                                       std::string* blob,
                                                       size_t* stream_prefix) {
  const Communicator::SparseTensor& t = tensors_[i];
  if (t.out.shape() != t.delta.shape() || t.out.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", i, ": out ", t.out.DebugString(),
                                                   " must be f32 of ", t.delta.DebugString(),
                                                   "'s shape"));
  }
  absl::StatusOr<size_t> max = codec_.MaxEncodedBytes(t.delta.shape());
  if (!max.ok()) return Annotate(max.status(), absl::StrCat("tensor ", i));
  encode_buffer_.resize(*max);
  if (!t.delta.is_host() && encode_scratch_ == nullptr) {
    encode_scratch_ = std::make_unique<kernels::DeviceScratch>();
  }
  absl::StatusOr<size_t> size = EncodeTensor(codec_, t.delta, t.state,
                                             absl::MakeSpan(encode_buffer_), t.cuda_stream,
                                             encode_scratch_.get(), pieces);
  if (!size.ok()) return Annotate(size.status(), absl::StrCat("tensor ", i));
  if (pieces != nullptr) {
    absl::StatusOr<size_t> body =
        codecs::PeekPayloadBodyOffset(absl::MakeConstSpan(encode_buffer_.data(), *size));
    if (!body.ok()) return Annotate(body.status(), absl::StrCat("tensor ", i, " (as encoded)"));
    *stream_prefix = blob->size() + 8 + *body;
  }
  const uint64_t size64 = *size;
  blob->append(reinterpret_cast<const char*>(&size64), 8);
  blob->append(reinterpret_cast<const char*>(encode_buffer_.data()), *size);
  return absl::OkStatus();
}

// Message j of group g. With the direct algorithm every message of a group travels on the
// group's tag (matched in order); otherwise each is an all-gather with tag steps of its own (a
// hierarchical leader forwards a member's piece as soon as it has it).
// The header round's verdict, waited for before this rank's first message goes out (the encode
// of the first piece ran meanwhile). On failure nothing is posted: the encode stops, and so does
// the pool's exchange.
bool SparseAllReduceSchedule::PassHeader() {
  if (header_passed_) return true;
  if (!header_status_.ok()) return false;
  if (header_ != nullptr) {
    const absl::Time start = absl::Now();
    absl::Status verdict = header_->Finish();
    header_wait_ += absl::Now() - start;
    if (!verdict.ok()) {
      header_status_ = std::move(verdict);
      MutexLock lock(&mu_);
      header_failed_ = true;
      exchange_failed_ = true;  // the encoder posts no later group
      return false;
    }
  }
  header_passed_ = true;
  return true;
}

void SparseAllReduceSchedule::PostMessage(int g, std::string message) {
  if (!PassHeader()) return;
  std::vector<std::unique_ptr<AllGatherTask>>& messages = groups_[g].messages;
  const uint32_t j = static_cast<uint32_t>(messages.size());
  const transport::Tag tag = tag_ + first_step_[g] + (direct_ ? 0 : j * steps_);
  messages.push_back(AllGatherTask::Post(group_, tag, std::move(message), algorithms_[g],
                                         options_.priority, deadline_, kMaxMessageBytes));
}

// 3-4. The exchange stops after the first failed all-gather. After the first group in which a
// rank gave up (every rank sees the same blobs, so every rank at the same group), later groups
// are received but not looked at, and the encoder is told to send placeholders.
void SparseAllReduceSchedule::ExchangeAndValidate() {
  bool gave_up = false;
  for (int g = 0; g < static_cast<int>(plan_.size()); ++g) {
    {
      MutexLock lock(&mu_);
      mu_.Await([this, g]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return encoded_ > g || header_failed_;
      });
      if (header_failed_) break;  // nothing was posted
    }
    absl::Status status = Receive(g);
    if (!status.ok()) {
      exchanged_ = status;
      MutexLock lock(&mu_);
      exchange_failed_ = true;
      break;
    }
    if (gave_up) continue;
    groups_exchanged_ = g + 1;
    if (SomeoneGaveUp(g)) {
      gave_up = true;
      MutexLock lock(&mu_);
      stop_encoding_ = true;
      continue;
    }
    if (invalid_.ok()) {
      const absl::Time start = absl::Now();
      invalid_ = Validate(g);
      validating_ += absl::Now() - start;
    }
  }
  MutexLock lock(&mu_);
  exchange_done_ = true;
}

// Waits for group g's messages to arrive; a streamed group's blobs are rebuilt from them.
absl::Status SparseAllReduceSchedule::Receive(int g) {
  GroupExchange& x = groups_[g];
  absl::Status status;
  for (const std::unique_ptr<AllGatherTask>& message : x.messages) {
    absl::Status gathered = message->WaitGathered();
    if (status.ok()) status = gathered;
  }
  if (!status.ok()) return status;
  if (pieces_[g] == 0) {
    x.all = &x.messages[0]->result();  // read only: this rank's sends may still read it
    return absl::OkStatus();
  }
  x.assembled.assign(group_.size(), std::string());
  x.assembled[group_.me] = std::move(x.blob);
  for (int r = 0; r < group_.size(); ++r) {
    if (r == group_.me) continue;
    std::vector<std::string> parts;
    for (int j = 0; j < pieces_[g]; ++j) parts.push_back(std::move(x.messages[j]->result()[r]));
    absl::StatusOr<std::string> blob =
        AssembleStreamed(parts, x.messages[pieces_[g]]->result()[r], r);
    if (blob.ok()) {
      x.assembled[r] = *std::move(blob);
    } else if (invalid_.ok()) {
      invalid_ = blob.status();  // assembled[r] stays empty: looked at as giving up
    }
  }
  x.all = &x.assembled;
  return absl::OkStatus();
}

// Records the first rank's message (the same on every rank) when some rank gave up in group g.
bool SparseAllReduceSchedule::SomeoneGaveUp(int g) {
  const std::vector<std::string>& all = *groups_[g].all;
  bool someone_gave_up = false;
  for (const std::string& blob : all) {
    someone_gave_up |= blob.empty() || internal::IsErrorBlob(blob);
  }
  if (!someone_gave_up) return false;
  for (int r = 0; r < group_.size() && invalid_.ok(); ++r) {
    invalid_ = SplitBlob(all[r], plan_[g].second - plan_[g].first, r).status();
  }
  return true;
}

// Group g's payloads, checked while later groups are on the wire. Host outputs: PrepareDecode
// checks every payload in full (envelope, XXH3 checksum, indices, values, shape) and stages it
// in the tensor's scratch, so that afterwards ApplyDecode only writes. CUDA outputs: every
// envelope is checked here, and every tensor but the first in full (InspectPayload); the
// device decode checks the first before it writes. Either way a bad payload fails the
// collective before any output is written; it does not stop the exchange (the peers expect
// every group).
absl::Status SparseAllReduceSchedule::Validate(int g) {
  const std::vector<std::string>& all = *groups_[g].all;
  const size_t count = plan_[g].second - plan_[g].first;
  for (int r = 0; r < group_.size(); ++r) {
    LBCC_ASSIGN_OR_RETURN(std::vector<absl::Span<const uint8_t>> spans,
                          SplitBlob(all[r], count, r));
    per_rank_[r].insert(per_rank_[r].end(), spans.begin(), spans.end());
  }
  std::vector<absl::Span<const uint8_t>> payloads(group_.size());
  for (size_t i = plan_[g].first; i < plan_[g].second; ++i) {
    for (int r = 0; r < group_.size(); ++r) payloads[r] = per_rank_[r][i];
    if (tensors_[i].out.is_host()) {
      absl::Status status =
          codecs::PrepareDecode(payloads, decode_, tensors_[i].out, decode_scratch_[i].get());
      if (!status.ok()) return Annotate(status, absl::StrCat("tensor ", i));
      continue;
    }
    for (int r = 0; r < group_.size(); ++r) {
      absl::Status status;
      Shape shape;
      if (i == 0) {
        absl::StatusOr<codecs::PayloadInfo> info = codecs::ParsePayload(payloads[r]);
        status = info.status();
        if (status.ok()) shape = info->shape;
      } else {
        absl::StatusOr<codecs::PayloadSummary> summary = codecs::InspectPayload(payloads[r]);
        status = summary.status();
        if (status.ok()) shape = summary->shape;
      }
      if (status.ok() && shape != tensors_[i].out.shape()) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "shape ", ShapeToString(shape), " != ", ShapeToString(tensors_[i].out.shape())));
      }
      if (!status.ok()) return Annotate(status, absl::StrCat("tensor ", i, ": payload ", r));
    }
  }
  return absl::OkStatus();
}

// Every task posted, waited for: what the pool did not wait for (after a failed exchange) and
// this rank's last sends. The first send error, if any.
absl::Status SparseAllReduceSchedule::DrainTasks() {
  absl::Status first;
  for (GroupExchange& x : groups_) {
    for (const std::unique_ptr<AllGatherTask>& message : x.messages) {
      absl::Status status = message->Wait();
      if (first.ok()) first = status;
    }
  }
  return first;
}

// 5. The outcome, in this order: a failed exchange, this rank's own error, a bad payload or
// another rank's error; then the agreement (comm/agreement.h) makes it the same on every
// surviving rank; only then are the outputs written and the states committed.
absl::Status SparseAllReduceSchedule::Conclude() {
  absl::Status failure = exchanged_;
  if (failure.ok()) failure = local_;
  if (failure.ok()) failure = invalid_;
  if (failure.ok() && groups_exchanged_ != static_cast<int>(plan_.size())) {
    failure = absl::InternalError("SparseAllReduce: exchange ended early without an error");
  }
#ifndef LBCC_MEASURE_WITHOUT_AGREEMENT  // bench/agreement_overhead.sh's baseline only
  if (agreement_ != nullptr) failure = Decide(*agreement_, group_, tag_, failure, deadline_);
#endif
  concluded_ = absl::Now();
  if (!failure.ok()) {
    AbortStates();
    return failure;
  }
  return DecodeAndCommit();
}

// Outputs decoded in rank order, then every state committed.
absl::Status SparseAllReduceSchedule::DecodeAndCommit() {
  std::unique_ptr<kernels::DeviceScratch> device_scratch;
  std::vector<absl::Span<const uint8_t>> payloads(group_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Communicator::SparseTensor& t = tensors_[i];
    absl::Status status;
    if (t.out.is_host()) {
      status = codecs::ApplyDecode(decode_scratch_[i].get());
    } else {
      for (int r = 0; r < group_.size(); ++r) payloads[r] = per_rank_[r][i];
      if (device_scratch == nullptr) device_scratch = std::make_unique<kernels::DeviceScratch>();
      status = kernels::DecodeAccumulateOnDevice(payloads, decode_, t.out, t.cuda_stream,
                                                 device_scratch.get());
      if (!status.ok() && i == 0) {
        // Checked in full by the device decode, before it writes.
        AbortStates();
        return Annotate(status, absl::StrCat("tensor ", i));
      }
    }
    if (!status.ok()) {
      // Validated in full above: an error here is an LBCC bug.
      AbortStates();
      return absl::InternalError(absl::StrCat("tensor ", i, ": ", status.ToString()));
    }
  }
  for (const Communicator::SparseTensor& t : tensors_) {
    if (t.state != nullptr) LBCC_RETURN_IF_ERROR(t.state->Commit());
  }
  return absl::OkStatus();
}

void SparseAllReduceSchedule::AbortStates() {
  for (const Communicator::SparseTensor& t : tensors_) {
    if (t.state != nullptr && t.state->has_pending()) (void)t.state->Abort();
  }
}

}  // namespace internal

SparseAllReduceProfile& SparseAllReduceProfile::operator+=(const SparseAllReduceProfile& o) {
  calls += o.calls;
  header += o.header;
  encode += o.encode;
  wire_wait += o.wire_wait;
  agreement += o.agreement;
  decode += o.decode;
  total += o.total;
  validate += o.validate;
  return *this;
}

SparseAllReduceProfile SparseAllReduceProfile::operator-(const SparseAllReduceProfile& o) const {
  SparseAllReduceProfile d = *this;
  d.calls -= o.calls;
  d.header -= o.header;
  d.encode -= o.encode;
  d.wire_wait -= o.wire_wait;
  d.agreement -= o.agreement;
  d.decode -= o.decode;
  d.total -= o.total;
  d.validate -= o.validate;
  return d;
}

SparseAllReduceProfile Communicator::sparse_profile() const {
  MutexLock lock(&profile_mu_);
  return profile_;
}

RequestPtr Communicator::SparseAllReduce(std::vector<SparseTensor> tensors,
                                         const codecs::Codec* codec, codecs::DecodeOptions decode,
                                         OpOptions options) {
  if (codec == nullptr) {
    return PostRejected("SparseAllReduce", absl::InvalidArgumentError("SparseAllReduce: null codec"));
  }
  Signature signature = NewSignature("SparseAllReduce");
  std::vector<const Shape*> shapes;
  for (const SparseTensor& t : tensors) shapes.push_back(&t.delta.shape());
  AddSparseAllReduceFields(signature, *codec, decode,
                           internal::ResolveSparseGroupElements(options, config_),
                           options.algorithm, shapes);
  // The header round runs inside the operation, overlapping the first group's encode (no data
  // goes out before its verdict), so that a peer lost during it goes through the outcome
  // agreement too: every survivor aborts alike, and the error names the lost rank instead of the
  // survivor whose closed links this rank noticed first (agreement.h).
  return PostWithHeader(
      std::move(signature),
      [this, tensors = std::move(tensors), codec, decode, options](
          const Group& group, transport::Tag tag, uint64_t sequence, const Signature& signature,
          absl::Time deadline) -> absl::Status {
        const absl::Time start = absl::Now();
        // The header round travels while the first group encodes (SignatureCheck).
        std::unique_ptr<SignatureCheck> header =
            SignatureCheck::Start(group, tag, sequence, signature, deadline);
        SparseAllReduceProfile profile;
        profile.calls = 1;
        const int64_t min_elements = internal::ResolveSparseGroupElements(options, config_);
        internal::SparseAllReduceSchedule::Resources resources;
        resources.group = &group;
        resources.tag = tag;
        resources.deadline = deadline;
        resources.topology = &topology();
        resources.pool = &pool_;
        resources.encode_buffer = &encode_buffer_;
        resources.decode_scratch = &decode_scratch_;
        resources.configured = config_.algorithm(Collective::kAllGatherV);
        resources.agreement = group.fabric->agreement();
        resources.profile = &profile;
        resources.header = header.get();
        internal::SparseAllReduceSchedule schedule(resources, tensors, *codec, decode, options,
                                                   min_elements);
        absl::Status status = schedule.Run();
        profile.total = absl::Now() - start;
        {
          MutexLock lock(&profile_mu_);
          profile_ += profile;
        }
        if (schedule.header_failed()) {
          // A peer lost during the header round goes through the outcome agreement too: every
          // survivor aborts alike, naming the lost rank (agreement.h).
          OutcomeAgreement* agreement = group.fabric->agreement();
          const bool peer_lost = absl::IsUnavailable(status) ||
                                 absl::IsDeadlineExceeded(status) || absl::IsCancelled(status);
          if (!peer_lost || agreement == nullptr) return status;
          return internal::Decide(*agreement, group, tag, status, deadline);
        }
        return status;
      },
      options.timeout);
}

}  // namespace lbcc::comm
