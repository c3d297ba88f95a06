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
#include "comm/rendezvous.h"

namespace lbcc::comm {
namespace {

// Bounds what one peer may make us allocate for one payload.
constexpr size_t kMaxPayloadBytes = size_t{1} << 40;

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
  LBCC_LOG(INFO) << "LBCC version " << LBCC_VERSION_STRING;
  LBCC_RETURN_IF_ERROR(CheckEnvironment(config));
  LBCC_ASSIGN_OR_RETURN(CommConfig resolved, ResolveConfig(std::move(config)));
  LBCC_LOG(INFO) << "comm: rank " << rank << " config " << resolved.DebugString();
  LBCC_ASSIGN_OR_RETURN(std::shared_ptr<Fabric> fabric,
                        Fabric::Create(id, nranks, rank, FabricOptionsOf(resolved)));
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
  worker_ = std::thread([this] { WorkerLoop(); });
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
    bool cancelled = false;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      pending = std::move(queue_.front());
      queue_.pop_front();
      cancelled = stopping_;
    }
    if (cancelled) {
      pending.request->Complete(absl::CancelledError(
          absl::StrCat(pending.name, ": communicator destroyed before it ran")));
      continue;
    }
    absl::Status status = fabric_->aborted();
    if (!status.ok()) {
      status = absl::FailedPreconditionError(
          absl::StrCat(pending.name, ": the communicator failed earlier (", status.ToString(),
                       "); recreate it"));
    } else {
      const absl::Time deadline =
          absl::Now() + (pending.timeout > absl::ZeroDuration() ? pending.timeout
                                                                 : fabric_->options().timeout);
      status = Annotate(pending.op(group_, pending.tag, deadline),
                        absl::StrCat(pending.name, " on rank ", group_.me));
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
  auto request = std::make_shared<Request>();
  MutexLock lock(&mu_);
  if (stopping_) {
    request->Complete(absl::CancelledError("communicator is being destroyed"));
    return request;
  }
  queue_.push_back(Pending{std::string(name), std::move(op), timeout,
                           MakeTag(comm_id_, sequence_++, 0), request});
  cv_.SignalAll();
  return request;
}

void Communicator::Abort() { fabric_->Abort(absl::CancelledError("communicator aborted")); }

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

absl::StatusOr<Algorithm> Communicator::ChooseAlgorithm(Collective collective, const Group& group,
                                                        size_t bytes_per_rank,
                                                        Algorithm requested) const {
  return SelectAlgorithm(collective, ShapeOf(topology(), group.ranks), bytes_per_rank, requested,
                         config_.algorithm(collective));
}

RequestPtr Communicator::AllGatherV(const std::string* mine, std::vector<std::string>* out,
                                    OpOptions options) {
  if (mine == nullptr || out == nullptr) {
    return CompletedRequest(absl::InvalidArgumentError("AllGatherV: null argument"));
  }
  return Post(
      "AllGatherV",
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
  if (!check.ok()) return CompletedRequest(check);
  return Post("AllReduce", [this, in, out, op, options](const Group& group, transport::Tag tag,
                                               absl::Time deadline) {
    LBCC_ASSIGN_OR_RETURN(Algorithm chosen, ChooseAlgorithm(Collective::kAllReduce, group,
                                                            in.num_bytes(), options.algorithm));
    switch (chosen) {
      case Algorithm::kRing:
        return AllReduceRing(group, tag, in.data(), out.data(), in.num_elements(), in.dtype(), op,
                             options.priority, deadline);
      default:  // HasAlgorithm lists what exists; a row or override beyond it is our bug.
        return absl::InternalError(
            absl::StrCat("AllReduce: no ", AlgorithmName(chosen), " implementation"));
    }
  }, options.timeout);
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
  if (!check.ok()) return CompletedRequest(check);
  return Post("AllGather", [this, in, out, options](const Group& group, transport::Tag tag,
                                                    absl::Time deadline) {
    const std::string mine(static_cast<const char*>(in.data()), in.num_bytes());
    std::vector<std::string> all;
    LBCC_ASSIGN_OR_RETURN(Algorithm chosen, ChooseAlgorithm(Collective::kAllGather, group,
                                                            mine.size(), options.algorithm));
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
  if (!check.ok()) return CompletedRequest(check);
  return Post(
      "Broadcast",
      [this, buffer, root, options](const Group& group, transport::Tag tag,
                                    absl::Time deadline) -> absl::Status {
        LBCC_ASSIGN_OR_RETURN(Algorithm chosen, ChooseAlgorithm(Collective::kBroadcast, group,
                                                                buffer.num_bytes(),
                                                                options.algorithm));
        switch (chosen) {
          case Algorithm::kDirect:
            return comm::Broadcast(group, tag, buffer.data(), buffer.num_bytes(), root,
                                   options.priority, deadline);
          default:  // HasAlgorithm lists what exists; a row or override beyond it is our bug.
            return absl::InternalError(
                absl::StrCat("Broadcast: no ", AlgorithmName(chosen), " implementation"));
        }
      },
      options.timeout);
}

RequestPtr Communicator::Barrier(OpOptions options) {
  return Post(
      "Barrier",
      [this, options](const Group& group, transport::Tag tag,
                      absl::Time deadline) -> absl::Status {
        // An all-gather of nothing, ahead of other traffic.
        LBCC_ASSIGN_OR_RETURN(Algorithm chosen,
                              ChooseAlgorithm(Collective::kBarrier, group, 0, options.algorithm));
        std::vector<std::string> all;
        return comm::AllGatherV(group, tag, std::string(), &all, chosen,
                                transport::Priority::kHigh, deadline, 0);
      },
      options.timeout);
}

}  // namespace lbcc::comm
