#include "comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/version.h"
#include "comm/algorithms/registry.h"
#include "comm/rendezvous.h"

namespace lbcc::comm {
namespace {

// Bounds what one peer may make us allocate for one payload.
constexpr size_t kMaxPayloadBytes = size_t{1} << 40;

// How long an operation the caller's abort failed waits at most for the aborting thread to have
// closed every endpoint (AbortRecord::AwaitClosed); closing only queues work.
constexpr absl::Duration kAbortCloseWait = absl::Seconds(1);

// The fields of every signature: what must be the same on every rank whatever the operation.
Signature::Fields SettingsFields(const CommConfig& config, const Topology& topology, int nranks,
                                 uint32_t comm_id) {
  Signature::Fields fields;
  fields.emplace_back("nranks", absl::StrCat(nranks));
  fields.emplace_back("communicator", absl::StrCat(comm_id));
  // Islands, replicas and link classes: LBCC_TOPO_FILE, LBCC_SLOW_RANKS and the host names.
  const std::string topology_json = topology.ToJson();
  fields.emplace_back("topology (LBCC_TOPO_FILE, LBCC_SLOW_RANKS, host names)",
                      absl::StrCat(absl::Hex(Signature::HashFields({{"", topology_json}}),
                                             absl::kZeroPad16)));
  std::string algorithms;
  for (Collective c : kAllCollectives) {
    if (config.algorithm(c) == Algorithm::kAuto) continue;
    absl::StrAppend(&algorithms, algorithms.empty() ? "" : ",", CollectiveName(c), "=",
                    AlgorithmName(config.algorithm(c)));
  }
  fields.emplace_back("LBCC_ALGO", algorithms.empty() ? "auto" : algorithms);
  fields.emplace_back("LBCC_SPARSE_GROUP_ELEMENTS",
                      absl::StrCat(config.sparse_group_elements.value_or(0)));
  return fields;
}

absl::Status CheckHostTensor(const TensorView& t, absl::string_view what) {
  if (!t.is_host()) {
    return absl::UnimplementedError(absl::StrCat(what, ": only host tensors are supported"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FabricOptions> FabricOptionsFromEnv() {
  FabricOptions options;
  LBCC_ASSIGN_OR_RETURN(options.backend, env::GetString("LBCC_TRANSPORT"));
  LBCC_ASSIGN_OR_RETURN(options.listen_host, env::GetString("LBCC_LISTEN_ADDR"));
  LBCC_ASSIGN_OR_RETURN(double seconds, env::GetDouble("LBCC_TIMEOUT_S"));
  options.timeout = absl::Seconds(seconds);
  return options;
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Init(const UniqueId& id, int nranks,
                                                                 int rank, CommConfig config) {
  return Init(id, nranks, rank, std::move(config), nullptr);
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Init(
    const UniqueId& id, int nranks, int rank, CommConfig config,
    std::shared_ptr<Cancellation> cancel) {
  LBCC_LOG(INFO) << "LBCC version " << LBCC_VERSION_STRING;
  LBCC_RETURN_IF_ERROR(CheckEnvironment(config));
  LBCC_ASSIGN_OR_RETURN(CommConfig resolved, ResolveConfig(std::move(config)));
  LBCC_LOG(INFO) << "comm: rank " << rank << " config " << resolved.DebugString();
  FabricOptions options = FabricOptionsOf(resolved);
  options.cancel = std::move(cancel);
  LBCC_ASSIGN_OR_RETURN(std::shared_ptr<Fabric> fabric,
                        Fabric::Create(id, nranks, rank, std::move(options)));
  std::vector<int> ranks(nranks);
  for (int r = 0; r < nranks; ++r) ranks[r] = r;
  return std::unique_ptr<Communicator>(
      new Communicator(std::move(fabric), std::move(ranks), 1, std::move(resolved)));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Init(const UniqueId& id, int nranks,
                                                                 int rank, FabricOptions options) {
  return Init(id, nranks, rank, ConfigFromFabricOptions(std::move(options)));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::InitFromEnvironment(
    FabricOptions options) {
  return InitFromEnvironment(ConfigFromFabricOptions(std::move(options)));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::InitFromEnvironment(
    CommConfig config) {
  // The launcher's variables and rendezvous (comm/rendezvous.h); the root waits as long as the
  // ranks will: resolve the timeout before starting it.
  LBCC_ASSIGN_OR_RETURN(const LaunchEnvironment launch, DetectLaunch());
  LBCC_ASSIGN_OR_RETURN(config, ResolveConfig(std::move(config)));
  LBCC_ASSIGN_OR_RETURN(UniqueId id, RendezvousId(launch, *config.listen_host, *config.timeout));
  const int rank = launch.rank, nranks = launch.nranks;
  return Init(id, nranks, rank, std::move(config));
}

Communicator::Communicator(std::shared_ptr<Fabric> fabric, std::vector<int> ranks,
                           uint32_t comm_id, CommConfig config)
    : fabric_(std::move(fabric)), config_(std::move(config)), comm_id_(comm_id) {
  group_.fabric = fabric_.get();
  group_.ranks = std::move(ranks);
  group_.me = static_cast<int>(std::find(group_.ranks.begin(), group_.ranks.end(),
                                         fabric_->rank()) -
                               group_.ranks.begin());
  auto settings = std::make_shared<Signature::Fields>(
      SettingsFields(config_, fabric_->topology(), group_.size(), comm_id_));
  settings_hash_ = Signature::HashFields(*settings);
  settings_ = std::move(settings);
  worker_ = std::thread([this] { WorkerLoop(); });
}

Signature Communicator::NewSignature(absl::string_view op) const {
  return Signature(op, settings_, settings_hash_);
}

Communicator::~Communicator() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  worker_.join();
}

void Communicator::WorkerLoop() {
  while (true) {
    Pending pending;
    bool cancelled = false, aborted = false;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      pending = std::move(queue_.front());
      queue_.pop_front();
      cancelled = stopping_;
      aborted = pending.sequence < cancel_below_;
    }
    const std::string& name = pending.signature.op();
    if (cancelled) {
      pending.request->Complete(absl::CancelledError(
          absl::StrCat(name, ": communicator destroyed before it ran")));
      continue;
    }
    if (aborted) {
      pending.request->Complete(absl::CancelledError(
          absl::StrCat(name, " (op ", pending.sequence, ") on rank ", group_.me,
                       ": communicator aborted by its caller (Communicator::Abort) before it ran")));
      continue;
    }
    absl::Status status = fabric_->aborted();
    if (!status.ok()) {
      status = absl::FailedPreconditionError(
          absl::StrCat(name, ": the communicator failed earlier (", status.ToString(),
                       "); recreate it"));
    } else {
      const absl::Time deadline =
          absl::Now() + (pending.timeout > absl::ZeroDuration() ? pending.timeout
                                                                 : fabric_->options().timeout);
      // Every rank's header first: nothing of the operation is sent or used unless all agree.
      if (pending.header_op) {
        status = pending.header_op(group_, pending.tag, pending.sequence, pending.signature,
                                   deadline);
      } else {
        if (!pending.unchecked) {
          status = CheckSignatures(group_, pending.tag, pending.sequence, pending.signature,
                                   pending.rejection, deadline);
        }
        if (status.ok()) status = pending.op(group_, pending.tag, deadline);
      }
      if (!status.ok() && !fabric_->caller_abort().ok()) {
        fabric_->abort_record()->AwaitClosed(kAbortCloseWait);
      }
      status = Annotate(fabric_->abort_record()->Explain(std::move(status)),
                        absl::StrCat(name, " (op ", pending.sequence, ") on rank ", group_.me));
      LBCC_LOG_IF(WARN, !status.ok()) << status;
    }
    ReleaseTags(pending.tag);
    pending.request->Complete(std::move(status));
  }
}

// The operation has returned on this rank: every message it sends or receives is done, so the
// transport's matching state for its tags (steps below kFirstP2pStep) goes. Without this each
// operation would leave a few entries per link behind, and a job's memory would grow with every
// step.
void Communicator::ReleaseTags(transport::Tag tag) {
  const transport::Tag last = tag + kFirstP2pStep;
  for (int r = 0; r < group_.size(); ++r) {
    if (r == group_.me) continue;
    const int peer = group_.ranks[r];
    if (transport::Endpoint* out = fabric_->out(peer)) out->ReleaseTags(tag, last);
    if (transport::Endpoint* in = fabric_->in(peer)) in->ReleaseTags(tag, last);
  }
}

RequestPtr Communicator::Post(absl::string_view name, Op op, absl::Duration timeout) {
  return Post(NewSignature(name), std::move(op), timeout);
}

RequestPtr Communicator::Post(Signature signature, Op op, absl::Duration timeout) {
  Pending pending;
  pending.signature = std::move(signature);
  pending.op = std::move(op);
  pending.timeout = timeout;
  return Enqueue(std::move(pending));
}

RequestPtr Communicator::PostWithHeader(Signature signature, HeaderOp op,
                                        absl::Duration timeout) {
  Pending pending;
  pending.signature = std::move(signature);
  pending.header_op = std::move(op);
  pending.timeout = timeout;
  return Enqueue(std::move(pending));
}

RequestPtr Communicator::PostUnchecked(absl::string_view name, Op op, absl::Duration timeout) {
  Pending pending;
  pending.signature = NewSignature(name);
  pending.op = std::move(op);
  pending.timeout = timeout;
  pending.unchecked = true;
  return Enqueue(std::move(pending));
}

RequestPtr Communicator::PostRejected(absl::string_view name, absl::Status why) {
  if (why.ok()) why = absl::InternalError(absl::StrCat(name, ": rejected without a reason"));
  Pending pending;
  pending.signature = NewSignature(name);
  pending.rejection = why;
  (void)Enqueue(std::move(pending));  // Its outcome is `why`, known now.
  return CompletedRequest(std::move(why));
}

RequestPtr Communicator::Enqueue(Pending pending) {
  auto request = std::make_shared<Request>();
  MutexLock lock(&mu_);
  if (stopping_) {
    request->Complete(absl::CancelledError("communicator is being destroyed"));
    return request;
  }
  pending.sequence = sequence_++;
  pending.tag = MakeTag(comm_id_, pending.sequence, 0);
  pending.request = request;
  queue_.push_back(std::move(pending));
  cv_.SignalAll();
  return request;
}

void Communicator::Abort() {
  // Operations queued now fail without running, in order behind the running one (whose return
  // the close below hastens): a caller that waits for a later request may free what an earlier
  // one uses only once that one has returned. Marked before the close, so that the worker does
  // not start one of them meanwhile.
  {
    MutexLock lock(&mu_);
    cancel_below_ = sequence_;
  }
  // The Fabric is marked aborted (by the caller) before its endpoints close: the running
  // operation's waits fail as the close reaches them, and each failure reads as this abort.
  fabric_->Abort(absl::CancelledError("communicator aborted by its caller (Communicator::Abort)"),
                 /*by_caller=*/true);
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Split(int color, int key) {
  // Everyone learns everyone's (color, key).
  std::string mine(8, '\0');
  std::memcpy(mine.data(), &color, 4);
  std::memcpy(mine.data() + 4, &key, 4);
  std::vector<std::string> all;
  OpOptions direct;
  direct.algorithm = Algorithm::kDirect;
  LBCC_RETURN_IF_ERROR(AllGatherV(&mine, &all, direct)->Wait());
  const uint64_t split = ++splits_;
  if (color < 0) return std::unique_ptr<Communicator>();
  std::vector<std::tuple<int, int>> members;  // (key, global rank)
  for (int i = 0; i < nranks(); ++i) {
    if (all[i].size() != 8) return absl::DataLossError("Split: malformed color/key");
    int c = 0, k = 0;
    std::memcpy(&c, all[i].data(), 4);
    std::memcpy(&k, all[i].data() + 4, 4);
    if (c == color) members.emplace_back(k, group_.ranks[i]);
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (const auto& [k, r] : members) ranks.push_back(r);
  // A tag space of its own: derived from the parent's id, the split count and the color, the
  // same on every member.
  uint64_t h = (static_cast<uint64_t>(comm_id_) * 0x9e3779b97f4a7c15ull) ^
               (split * 0xbf58476d1ce4e5b9ull) ^ (static_cast<uint64_t>(color) * 0x94d049bb133111ebull);
  h ^= h >> 29;
  uint32_t id = static_cast<uint32_t>(h & 0xffff);
  if (id < 2) id += 2;  // 0 is reserved, 1 is the world communicator.
  return std::unique_ptr<Communicator>(new Communicator(fabric_, std::move(ranks), id, config_));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Subgroup(const std::vector<int>& ranks,
                                                                    uint32_t id) const {
  if (id < 2 || id > 0xffff) {
    return absl::InvalidArgumentError(absl::StrCat("Subgroup: id ", id, " is not in 2..65535"));
  }
  std::vector<int> global;
  bool me = false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= nranks() || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError("Subgroup: ranks must be ascending ranks of the communicator");
    }
    global.push_back(group_.ranks[ranks[i]]);
    me |= ranks[i] == rank();
  }
  if (!me) return absl::InvalidArgumentError("Subgroup: this rank is not in it");
  LBCC_RETURN_IF_ERROR(status());
  return std::unique_ptr<Communicator>(new Communicator(fabric_, std::move(global), id, config_));
}

absl::StatusOr<Algorithm> Communicator::ChooseAlgorithm(Collective collective, const Group& group,
                                                        size_t bytes_per_rank,
                                                        Algorithm requested) const {
  return SelectAlgorithm(collective, ShapeOf(topology(), group.ranks), bytes_per_rank, requested,
                         config_.algorithm(collective));
}

RequestPtr Communicator::AllGatherV(const std::string* mine, std::vector<std::string>* out,
                                    OpOptions options) {
  if (mine == nullptr || out == nullptr) {
    return PostRejected("AllGatherV", absl::InvalidArgumentError("AllGatherV: null argument"));
  }
  // Payload sizes may differ per rank, so the algorithm is chosen by size on the worker (for
  // auto, the table's row must not depend on the size there: ranks would disagree otherwise).
  Signature signature = NewSignature("AllGatherV");
  signature.Add("algorithm", AlgorithmName(options.algorithm));
  return Post(
      std::move(signature),
      [this, mine, out, options](const Group& group, transport::Tag tag, absl::Time deadline) {
        LBCC_ASSIGN_OR_RETURN(Algorithm chosen, ChooseAlgorithm(Collective::kAllGatherV, group,
                                                                mine->size(), options.algorithm));
        return comm::AllGatherV(group, tag, *mine, out, chosen, options.priority, deadline,
                                kMaxPayloadBytes);
      },
      options.timeout);
}

RequestPtr Communicator::AllReduce(const TensorView& in, const TensorView& out, ReduceOp op,
                                   OpOptions options) {
  absl::Status check = CheckHostTensor(in, "AllReduce");
  if (check.ok()) check = CheckHostTensor(out, "AllReduce");
  if (check.ok() && (in.dtype() != out.dtype() || in.num_elements() != out.num_elements())) {
    check = absl::InvalidArgumentError(absl::StrCat("AllReduce: in ", in.DebugString(),
                                                    " and out ", out.DebugString(), " differ"));
  }
  if (check.ok() && !IsFloating(in.dtype())) {
    check = absl::InvalidArgumentError(
        absl::StrCat("AllReduce: dtype ", DTypeName(in.dtype()), " is not f32, f16 or bf16"));
  }
  if (check.ok() && op != ReduceOp::kSum && op != ReduceOp::kAvg) {
    check = absl::InvalidArgumentError(absl::StrCat(
        "AllReduce: reduction ", ReduceOpName(op),
        " of tensor views is sum or avg (the raw-buffer AllReduce takes every reduction)"));
  }
  if (!check.ok()) return PostRejected("AllReduce", check);
  absl::StatusOr<Algorithm> chosen =
      ChooseAlgorithm(Collective::kAllReduce, group_, in.num_bytes(), options.algorithm);
  if (!chosen.ok()) return PostRejected("AllReduce", chosen.status());
  Signature signature = NewSignature("AllReduce");
  signature.Add("dtype", DTypeName(in.dtype()))
      .Add("count", in.num_elements())
      .Add("reduce op", op == ReduceOp::kSum ? "sum" : "mean")
      .Add("algorithm", AlgorithmName(*chosen));
  // The algorithm's row (comm/algorithms/registry.h): ChooseAlgorithm checked that it has one.
  const AlgorithmEntry& entry = *FindAlgorithm(*chosen);
  if (entry.all_reduce_with_header != nullptr) {
    if (in.num_bytes() > kMaxHeaderData) {
      return PostRejected(
          "AllReduce",
          absl::InvalidArgumentError(absl::StrCat(
              "AllReduce: the ", AlgorithmName(*chosen), " algorithm takes at most ",
              kMaxHeaderData, " bytes per rank, not ", in.num_bytes(), " (use ring or auto)")));
    }
    // One round, the operation header in it (ExchangeWithHeader).
    return PostWithHeader(
        std::move(signature),
        [in, out, op, run = entry.all_reduce_with_header](
            const Group& group, transport::Tag tag, uint64_t sequence, const Signature& signature,
            absl::Time deadline) {
          return run(group, tag, sequence, signature, in.data(), out.data(),
                     static_cast<size_t>(in.num_elements()), in.dtype(), op, deadline);
        },
        options.timeout);
  }
  return Post(
      std::move(signature),
      [in, out, op, options, chosen = *chosen, run = entry.tensor_all_reduce](
          const Group& group, transport::Tag tag, absl::Time deadline) {
        if (run == nullptr) {  // a row without a tensor-view all-reduce is our bug
          return absl::InternalError(
              absl::StrCat("AllReduce: no ", AlgorithmName(chosen), " implementation"));
        }
        return run(group, tag, in.data(), out.data(), static_cast<size_t>(in.num_elements()),
                   in.dtype(), op, options.priority, deadline);
      },
      options.timeout);
}

RequestPtr Communicator::AllGather(const TensorView& in, const TensorView& out,
                                   OpOptions options) {
  absl::Status check = CheckHostTensor(in, "AllGather");
  if (check.ok()) check = CheckHostTensor(out, "AllGather");
  if (check.ok() && (in.dtype() != out.dtype() ||
                     out.num_elements() != in.num_elements() * nranks())) {
    check = absl::InvalidArgumentError(absl::StrCat("AllGather: out ", out.DebugString(),
                                                    " must hold nranks x in ", in.DebugString()));
  }
  if (!check.ok()) return PostRejected("AllGather", check);
  absl::StatusOr<Algorithm> chosen =
      ChooseAlgorithm(Collective::kAllGather, group_, in.num_bytes(), options.algorithm);
  if (!chosen.ok()) return PostRejected("AllGather", chosen.status());
  Signature signature = NewSignature("AllGather");
  signature.Add("dtype", DTypeName(in.dtype()))
      .Add("count", in.num_elements())
      .Add("algorithm", AlgorithmName(*chosen));
  return Post(std::move(signature), [in, out, options, chosen = *chosen](
                                        const Group& group, transport::Tag tag,
                                        absl::Time deadline) {
    const std::string mine(static_cast<const char*>(in.data()), in.num_bytes());
    std::vector<std::string> all;
    LBCC_RETURN_IF_ERROR(comm::AllGatherV(group, tag, mine, &all, chosen, options.priority,
                                          deadline, in.num_bytes()));
    for (int i = 0; i < group.size(); ++i) {
      if (all[i].size() != in.num_bytes()) {
        return absl::DataLossError(absl::StrCat("AllGather: rank ", i, " sent ", all[i].size(),
                                                " bytes, expected ", in.num_bytes()));
      }
      std::memcpy(static_cast<char*>(out.data()) + i * in.num_bytes(), all[i].data(),
                  in.num_bytes());
    }
    return absl::OkStatus();
  }, options.timeout);
}

RequestPtr Communicator::Broadcast(const TensorView& buffer, int root, OpOptions options) {
  absl::Status check = CheckHostTensor(buffer, "Broadcast");
  if (check.ok() && (root < 0 || root >= nranks())) {
    check = absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " out of range"));
  }
  if (!check.ok()) return PostRejected("Broadcast", check);
  absl::StatusOr<Algorithm> chosen =
      ChooseAlgorithm(Collective::kBroadcast, group_, buffer.num_bytes(), options.algorithm);
  if (!chosen.ok()) return PostRejected("Broadcast", chosen.status());
  Signature signature = NewSignature("Broadcast");
  signature.Add("dtype", DTypeName(buffer.dtype()))
      .Add("count", buffer.num_elements())
      .Add("root", root)
      .Add("algorithm", AlgorithmName(*chosen));
  return Post(
      std::move(signature),
      [buffer, root, options, run = FindAlgorithm(*chosen)->broadcast](
          const Group& group, transport::Tag tag, absl::Time deadline) -> absl::Status {
        return run(group, tag, buffer.data(), buffer.num_bytes(), root, options.priority, deadline);
      },
      options.timeout);
}

RequestPtr Communicator::Barrier(OpOptions options) {
  absl::StatusOr<Algorithm> chosen =
      ChooseAlgorithm(Collective::kBarrier, group_, 0, options.algorithm);
  if (!chosen.ok()) return PostRejected("Barrier", chosen.status());
  Signature signature = NewSignature("Barrier");
  signature.Add("algorithm", AlgorithmName(*chosen));
  return Post(
      std::move(signature),
      [](const Group&, transport::Tag, absl::Time) -> absl::Status {
        // Nothing left to do: the operation headers (CheckSignatures) went from every rank to
        // every rank, so every rank has reached this barrier.
        return absl::OkStatus();
      },
      options.timeout);
}

}  // namespace lbcc::comm
