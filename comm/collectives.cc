#include "comm/collectives.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/time/clock.h"
#include "base/check.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "transport/netif.h"

namespace lbcc::comm {
namespace {

using transport::Priority;
using transport::Tag;

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// Bundle: u32 count, then per entry u32 index, u64 size, bytes.
std::string Bundle(const std::vector<std::string>& payloads, const std::vector<int>& indices) {
  std::string out;
  auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  const uint32_t count = static_cast<uint32_t>(indices.size());
  put(&count, 4);
  for (int index : indices) {
    const uint32_t i = static_cast<uint32_t>(index);
    const uint64_t size = payloads[index].size();
    put(&i, 4);
    put(&size, 8);
    out += payloads[index];
  }
  return out;
}

absl::Status Unbundle(const std::string& bundle, std::vector<std::string>* payloads,
                      std::vector<bool>* have) {
  size_t offset = 0;
  auto take = [&](void* p, size_t n) {
    if (bundle.size() - offset < n) return false;
    std::memcpy(p, bundle.data() + offset, n);
    offset += n;
    return true;
  };
  uint32_t count = 0;
  if (!take(&count, 4)) return absl::DataLossError("truncated payload bundle");
  for (uint32_t e = 0; e < count; ++e) {
    uint32_t index = 0;
    uint64_t size = 0;
    if (!take(&index, 4) || !take(&size, 8) || bundle.size() - offset < size ||
        index >= payloads->size() || (*have)[index]) {
      return absl::DataLossError("malformed payload bundle");
    }
    (*payloads)[index].assign(bundle.data() + offset, size);
    (*have)[index] = true;
    offset += size;
  }
  if (offset != bundle.size()) return absl::DataLossError("trailing bytes in payload bundle");
  return absl::OkStatus();
}

// Whether ranks a and b advertise different hosts (UCX's "host:port"; other backends' addresses
// name no host: never).
bool AcrossNetwork(const Fabric& fabric, int a, int b) {
  const std::vector<std::string>& addresses = fabric.addresses();
  if (a >= static_cast<int>(addresses.size()) || b >= static_cast<int>(addresses.size())) {
    return false;
  }
  absl::StatusOr<transport::HostAndPort> host_a =
      transport::ParseHostPort(addresses[a], "address");
  absl::StatusOr<transport::HostAndPort> host_b =
      transport::ParseHostPort(addresses[b], "address");
  return host_a.ok() && host_b.ok() && host_a->host != host_b->host;
}

// dst[i] = round(float(dst[i]) + float(src[i])) in `dtype`.
void Accumulate(void* dst, const void* src, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < count; ++i) d[i] += s[i];
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToBf16(Bf16ToF32(d[i]) + Bf16ToF32(s[i]));
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToF16(F16ToF32(d[i]) + F16ToF32(s[i]));
      return;
    }
    default:
      LBCC_CHECK(false) << "Accumulate: unsupported dtype";
  }
}

void Scale(void* data, size_t count, DType dtype, float factor) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) d[i] *= factor;
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToBf16(Bf16ToF32(d[i]) * factor);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToF16(F16ToF32(d[i]) * factor);
      return;
    }
    default:
      LBCC_CHECK(false) << "Scale: unsupported dtype";
  }
}

}  // namespace

// The machinery every all-gather algorithm runs on. Operations go to the Fabric's endpoints in
// joins; a join's continuation runs once all of its operations completed OK, on the thread of
// the last completion (a transport thread, where it may post but must not block), or inline in
// Arm() when they all completed before. Algorithm code (Start and the continuations) runs under
// step_mu_, so it needs no locking of its own. The first failed operation aborts the Fabric,
// as Batch::Wait does, and stops the continuations; the task is done once its operations drained.
class AllGatherTask::State : public std::enable_shared_from_this<AllGatherTask::State> {
 public:
  State(const Group& group, Tag tag, Priority priority, absl::Time deadline, size_t max_bytes)
      : group_(group), tag_(tag), priority_(priority), max_bytes_(max_bytes),
        deadline_(deadline) {}
  virtual ~State() = default;

  void Launch(std::string mine) {
    out_.assign(group_.size(), std::string());
    out_[group_.me] = std::move(mine);
    MutexLock step(&step_mu_);
    if (group_.size() == 1) {
      Finish(absl::OkStatus());
      return;
    }
    Start();
  }

  bool Done() const {
    MutexLock lock(&mu_);
    return DoneLocked();
  }

  // Waits until the payloads are in (`gathered_only`) or until every operation completed, or
  // the deadline; after a failure, until no callback can touch the task any more.
  absl::Status Await(bool gathered_only) {
    bool timed_out = false;
    {
      MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !error_.ok() || (finished_ && (gathered_only || ops_ == 0));
      };
      while (!ready()) {
        if (cv_.WaitWithDeadline(&mu_, deadline_) && !ready()) {
          error_ = NoAnswerError(receives_, sends_);
          timed_out = true;
          break;
        }
      }
      if (error_.ok()) return result_;
    }
    // Fail fast everywhere (the first failed operation aborted already); closing the endpoints
    // fails what is still pending here, so the drain below ends.
    if (timed_out) group_.fabric->Abort(error_status());
    MutexLock lock(&mu_);
    while (ops_ > 0) cv_.Wait(&mu_);
    return error_;
  }

  std::vector<std::string>& out() { return out_; }

 protected:
  // A set of operations and what runs once all completed OK. `pending` counts the operations
  // not yet completed, plus one until Arm().
  struct Join {
    int pending = 1;
    absl::AnyInvocable<void()> then;
  };

  virtual void Start() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) = 0;

  Join* NewJoin(absl::AnyInvocable<void()> then) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    joins_.emplace_back();
    joins_.back().then = std::move(then);
    return &joins_.back();
  }
  // Posts are counted before they are issued, so no completion can find a join at zero early.
  // `data` and `into` must live as long as the task (members of the algorithm or out_).
  void Send(Join* join, int index, Tag tag, const std::string* data)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    const int peer = group_.ranks[index];
    Count(join, peer, /*receive=*/false);
    group_.fabric->out(peer)->Send(
        tag, Bytes(*data), {priority_}, [self = shared_from_this(), join, peer](absl::Status s) {
          if (!s.ok()) s = Annotate(s, absl::StrCat("send to rank ", peer));
          self->OpDone(join, std::move(s), peer, false);
        });
  }
  void RecvAny(Join* join, int index, Tag tag, std::string* into, size_t max_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    const int peer = group_.ranks[index];
    Count(join, peer, /*receive=*/true);
    group_.fabric->in(peer)->Recv(
        tag,
        [into, max_bytes](size_t size) -> absl::StatusOr<absl::Span<uint8_t>> {
          if (size > max_bytes) {
            return absl::DataLossError(
                absl::StrCat("message of ", size, " bytes exceeds the limit of ", max_bytes));
          }
          into->resize(size);
          return absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(into->data()), size);
        },
        [self = shared_from_this(), join, peer](absl::StatusOr<size_t> n) {
          absl::Status s = n.status();
          if (!s.ok()) s = Annotate(s, absl::StrCat("receive from rank ", peer));
          self->OpDone(join, std::move(s), peer, true);
        });
  }
  // Everything of `join` is posted: its continuation may run (at once, if all completed).
  void Arm(Join* join) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    bool fire = false;
    {
      MutexLock lock(&mu_);
      fire = --join->pending == 0 && error_.ok();
    }
    if (fire) join->then();
  }
  // The algorithm's end: the payloads are in place (OK), or what it found wrong in them.
  void Finish(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    MutexLock lock(&mu_);
    finished_ = true;
    result_ = std::move(status);
    cv_.SignalAll();
  }

  const Group group_;
  const Tag tag_;
  const Priority priority_;
  const size_t max_bytes_;
  std::vector<std::string> out_;  // written by receives and algorithm code, read after Finish
  Mutex step_mu_;

 private:
  bool DoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ops_ == 0 && (finished_ || !error_.ok());
  }
  absl::Status error_status() {
    MutexLock lock(&mu_);
    return error_;
  }
  void Count(Join* join, int peer, bool receive) {
    MutexLock lock(&mu_);
    ++ops_;
    if (join != nullptr) ++join->pending;
    std::vector<int>& by_rank = receive ? receives_ : sends_;
    if (static_cast<size_t>(peer) >= by_rank.size()) by_rank.resize(peer + 1, 0);
    ++by_rank[peer];
  }
  void OpDone(Join* join, absl::Status status, int peer, bool receive) {
    bool fire = false;
    bool abort = false;
    {
      MutexLock lock(&mu_);
      --(receive ? receives_ : sends_)[peer];
      if (!status.ok() && error_.ok()) {
        error_ = status;
        abort = true;
      }
      fire = join != nullptr && --join->pending == 0 && error_.ok();
      if (!fire) --ops_;  // a firing operation stays counted until its continuation ran
      cv_.SignalAll();
    }
    if (abort) group_.fabric->Abort(status);
    if (!fire) return;
    {
      MutexLock step(&step_mu_);
      join->then();
    }
    MutexLock lock(&mu_);
    --ops_;
    cv_.SignalAll();
  }

  const absl::Time deadline_;
  std::deque<Join> joins_ ABSL_GUARDED_BY(step_mu_);  // stable addresses
  mutable Mutex mu_;
  CondVar cv_;
  int ops_ ABSL_GUARDED_BY(mu_) = 0;         // posted, not completed (or continuing)
  // Per peer (its rank in the Fabric): receives and sends not completed yet, for the timeout.
  std::vector<int> receives_ ABSL_GUARDED_BY(mu_), sends_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the first failed operation, or the deadline
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status result_ ABSL_GUARDED_BY(mu_);  // Finish()'s verdict
};

namespace {

using State = AllGatherTask::State;

// Every rank sends to every rank at once; gathered once every receive is in.
class DirectGather final : public State {
 public:
  using State::State;

 private:
  void Start() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    Join* received = NewJoin([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { Finish(absl::OkStatus()); });
    for (int i = 0; i < group_.size(); ++i) {
      if (i == group_.me) continue;
      Send(nullptr, i, tag_, &out_[group_.me]);
      RecvAny(received, i, tag_, &out_[i], max_bytes_);
    }
    Arm(received);
  }
};

// N-1 steps: pass to the right what came from the left one step earlier.
class RingGather final : public State {
 public:
  using State::State;

 private:
  void Start() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) { Step(0); }
  void Step(int step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    const int n = group_.size();
    if (step == n - 1) {
      Finish(absl::OkStatus());
      return;
    }
    const int send_index = (group_.me - step + n) % n;
    const int recv_index = (group_.me - step - 1 + n) % n;
    Join* join = NewJoin([this, step]() ABSL_NO_THREAD_SAFETY_ANALYSIS { Step(step + 1); });
    Send(join, (group_.me + 1) % n, tag_ + step, &out_[send_index]);
    RecvAny(join, (group_.me + n - 1) % n, tag_ + step, &out_[recv_index], max_bytes_);
    Arm(join);
  }
};

// Gather in fast islands, leaders exchange the island payloads (each payload crosses each slow
// link once), leaders hand every member the full set. Tags: tag (member -> leader), tag + 1
// (leader <-> leader, one payload per message), tag + 2 (leader -> members, the full set).
class HierarchicalGather final : public State {
 public:
  using State::State;

 private:
  void Start() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    const Topology& topology = group_.fabric->topology();
    // Islands in order of their first member; the leader is the first member.
    std::map<int, std::vector<int>> by_island;  // island id -> group indices
    std::vector<int> island_order;
    for (int i = 0; i < group_.size(); ++i) {
      const int island = topology.island_of(group_.ranks[i]);
      if (!by_island.count(island)) island_order.push_back(island);
      by_island[island].push_back(i);
    }
    mine_ = by_island[topology.island_of(group_.ranks[group_.me])];
    if (group_.me != mine_[0]) {
      // Member: hand the payload to the leader, get everything back.
      const size_t bundle_max = max_bytes_ * group_.size() + 16 * group_.size() + 4;
      Join* join = NewJoin([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { MemberReceived(); });
      Send(join, mine_[0], tag_, &out_[group_.me]);
      RecvAny(join, mine_[0], tag_ + 2, &bundle_, bundle_max);
      Arm(join);
      return;
    }
    // Leader: 1-2. every island payload goes to every other leader as soon as this leader has
    // it (its own at once, a member's when it and the members before it arrived), one payload
    // per message, so a slow link starts with the island's first finished encode instead of
    // waiting for its last; the other leaders' payloads arrive the same way, one message each.
    size_t incoming = 0;
    for (int island : island_order) {
      const std::vector<int>& members = by_island[island];
      if (members[0] == group_.me) continue;
      other_leaders_.push_back(members[0]);
      incoming += members.size();
    }
    incoming_.resize(incoming);
    singles_.resize(mine_.size());
    exchange_ = NewJoin([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { LeadersExchanged(); });
    const size_t single_max = max_bytes_ + 16;  // Bundle framing of one payload
    size_t slot = 0;
    for (int other : other_leaders_) {
      for (size_t m = 0; m < by_island[topology.island_of(group_.ranks[other])].size(); ++m) {
        RecvAny(exchange_, other, tag_ + 1, &incoming_[slot++], single_max);
      }
    }
    arrived_.assign(mine_.size(), false);
    arrived_[0] = true;
    for (size_t k = 1; k < mine_.size(); ++k) {
      Join* join = NewJoin([this, k]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        arrived_[k] = true;
        Forward();
      });
      RecvAny(join, mine_[k], tag_, &out_[mine_[k]], max_bytes_);
      Arm(join);
    }
    Forward();
  }

  // Sends the island payloads that arrived, in member order, to the other leaders.
  void Forward() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    while (forwarded_ < mine_.size() && arrived_[forwarded_]) {
      singles_[forwarded_] = Bundle(out_, {mine_[forwarded_]});
      for (int other : other_leaders_) Send(exchange_, other, tag_ + 1, &singles_[forwarded_]);
      ++forwarded_;
    }
    if (forwarded_ == mine_.size() && !exchange_armed_) {
      exchange_armed_ = true;
      Arm(exchange_);
    }
  }

  // 3. spread the full set in the island.
  void LeadersExchanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    std::vector<bool> have(group_.size(), false);
    for (int i : mine_) have[i] = true;
    for (const std::string& single : incoming_) {
      absl::Status status = Unbundle(single, &out_, &have);
      if (!status.ok()) return Finish(status);
    }
    if (std::count(have.begin(), have.end(), true) != group_.size()) {
      return Finish(absl::DataLossError("island payloads missing"));
    }
    if (mine_.size() == 1) return Finish(absl::OkStatus());
    std::vector<int> everyone(group_.size());
    for (int i = 0; i < group_.size(); ++i) everyone[i] = i;
    bundle_ = Bundle(out_, everyone);
    Join* spread = NewJoin([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { Finish(absl::OkStatus()); });
    for (size_t k = 1; k < mine_.size(); ++k) Send(spread, mine_[k], tag_ + 2, &bundle_);
    Arm(spread);
  }

  void MemberReceived() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    std::vector<bool> have(group_.size(), false);
    const std::string own = out_[group_.me];
    absl::Status status = Unbundle(bundle_, &out_, &have);
    if (!status.ok()) return Finish(status);
    if (std::count(have.begin(), have.end(), true) != group_.size() || out_[group_.me] != own) {
      return Finish(absl::DataLossError("leader's bundle misses payloads"));
    }
    Finish(absl::OkStatus());
  }

  std::vector<int> mine_;           // this island's group indices; mine_[0] leads
  std::vector<int> other_leaders_;  // group indices
  std::vector<std::string> incoming_;  // other islands' payloads, one bundle each
  std::vector<std::string> singles_;   // this island's payloads as sent to the other leaders
  std::vector<bool> arrived_;          // per member of this island
  size_t forwarded_ = 0;               // members whose payload went to the other leaders
  Join* exchange_ = nullptr;           // receives from and sends to the other leaders
  bool exchange_armed_ = false;
  std::string bundle_;  // member: the set from the leader; leader: the set for the members
};

// Algorithm::kAuto reaching the collectives is our bug.
class UnresolvedGather final : public State {
 public:
  using State::State;

 private:
  void Start() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
    Finish(absl::InternalError("AllGatherV: algorithm not resolved"));
  }
};

}  // namespace

std::unique_ptr<AllGatherTask> AllGatherTask::Post(const Group& group, Tag tag, std::string mine,
                                                   Algorithm algorithm, Priority priority,
                                                   absl::Time deadline, size_t max_bytes) {
  std::shared_ptr<State> state;
  switch (algorithm) {
    case Algorithm::kDirect:
      state = std::make_shared<DirectGather>(group, tag, priority, deadline, max_bytes);
      break;
    case Algorithm::kRing:
      state = std::make_shared<RingGather>(group, tag, priority, deadline, max_bytes);
      break;
    case Algorithm::kHierarchical:
      state = std::make_shared<HierarchicalGather>(group, tag, priority, deadline, max_bytes);
      break;
    case Algorithm::kAuto:
      state = std::make_shared<UnresolvedGather>(group, tag, priority, deadline, max_bytes);
      break;
  }
  state->Launch(std::move(mine));
  return std::unique_ptr<AllGatherTask>(new AllGatherTask(std::move(state)));
}

AllGatherTask::~AllGatherTask() { (void)state_->Await(/*gathered_only=*/false); }

bool AllGatherTask::Test() const { return state_->Done(); }

absl::Status AllGatherTask::WaitGathered() { return state_->Await(/*gathered_only=*/true); }

absl::Status AllGatherTask::Wait() { return state_->Await(/*gathered_only=*/false); }

std::vector<std::string>& AllGatherTask::result() { return state_->out(); }

absl::Status AllGatherV(const Group& group, Tag tag, const std::string& mine,
                        std::vector<std::string>* out, Algorithm algorithm, Priority priority,
                        absl::Time deadline, size_t max_bytes) {
  std::unique_ptr<AllGatherTask> task =
      AllGatherTask::Post(group, tag, mine, algorithm, priority, deadline, max_bytes);
  absl::Status status = task->Wait();
  *out = std::move(task->result());
  return status;
}

absl::Status RingPass(const Group& group, uint8_t* data, absl::Span<const size_t> offsets,
                      size_t element, const RingSchedule& schedule, Priority priority,
                      absl::Time deadline) {
  const int n = group.size();
  const int steps = schedule.steps;
  const int staged = schedule.combine_steps;  // steps whose receives are staged and combined
  if (n == 1 || steps <= 0) return absl::OkStatus();
  LBCC_CHECK(static_cast<int>(offsets.size()) == n + 1) << "RingPass: offsets";
  const int right = group.ranks[(group.me + 1) % n];
  const int left = group.ranks[(group.me + n - 1) % n];
  size_t largest = 0;  // elements
  for (int c = 0; c < n; ++c) largest = std::max(largest, (offsets[c + 1] - offsets[c]) / element);
  // Segments pay where a chunk takes long on the wire: over slow links. Over fast ones a step
  // takes about as long as the thread hand-offs a segment costs, so a chunk goes whole. Every
  // rank derives the same segments from the same offsets and topology.
  // Neighbours that advertise different hosts have a network between them even where the
  // topology made one fast island of them (hosts that share a name, as tools/testbed's do), and
  // a chunk takes long on such a wire too.
  bool slow_ring = false;
  for (int i = 0; i < n; ++i) {
    const int a = group.ranks[i], b = group.ranks[(i + 1) % n];
    slow_ring = slow_ring || group.fabric->topology().link(a, b) == LinkClass::kSlow ||
                AcrossNetwork(*group.fabric, a, b);
  }
  const size_t segments =
      !slow_ring ? 1
                 : std::max<size_t>(1, std::min(largest, (largest * element + kRingSegmentBytes -
                                                          1) / kRingSegmentBytes));
  auto seg_begin = [&](int c, size_t j) {  // byte offset of segment j of chunk c in `data`
    const size_t elements = (offsets[c + 1] - offsets[c]) / element;
    return offsets[c] + elements * j / segments * element;
  };
  // Combined receives land in one of two staging buffers (by step parity) first; a step's
  // receives are posted a step ahead, the next buffer's once the step before it was combined.
  // Not zero-filled: every byte a combine reads was received first.
  std::unique_ptr<uint8_t[]> incoming[2];
  if (staged > 0) {
    for (auto& buffer : incoming) buffer.reset(new uint8_t[largest * element]);
  }
  auto target = [&](int step, size_t j) -> uint8_t* {
    const int c = schedule.recv_chunk(step);
    if (step >= staged) return data + seg_begin(c, j);
    return incoming[step % 2].get() + (seg_begin(c, j) - offsets[c]);
  };
  // Declared after the buffers they point into, so they are destroyed (drained) first.
  std::vector<std::unique_ptr<Batch>> sends;
  std::vector<std::unique_ptr<Batch>> recvs(static_cast<size_t>(steps) * segments);
  auto post_recvs = [&](int step) {
    const int c = schedule.recv_chunk(step);
    for (size_t j = 0; j < segments; ++j) {
      auto batch = std::make_unique<Batch>(group.fabric, deadline);
      batch->Recv(left, schedule.step_tag(step),
                  absl::MakeSpan(target(step, j), seg_begin(c, j + 1) - seg_begin(c, j)));
      recvs[step * segments + j] = std::move(batch);
    }
  };
  auto post_send = [&](int step, size_t j) {
    const int c = schedule.send_chunk(step);
    auto batch = std::make_unique<Batch>(group.fabric, deadline);
    batch->Send(right, schedule.step_tag(step),
                absl::MakeConstSpan(data + seg_begin(c, j), seg_begin(c, j + 1) - seg_begin(c, j)),
                priority);
    sends.push_back(std::move(batch));
  };
  // Receives straight into `data` (the all-gather's) are posted once no combine but the last
  // step's can still touch their chunks (the last combined chunk is never received again).
  auto post_direct_recvs = [&] {
    for (int step = staged; step < steps; ++step) post_recvs(step);
  };
  for (int step = 0; step < std::min(staged, 2); ++step) post_recvs(step);
  if (staged <= 1) post_direct_recvs();
  for (size_t j = 0; j < segments; ++j) post_send(0, j);
  const absl::Time start = absl::Now();
  for (int step = 0; step < steps; ++step) {
    const int c = schedule.recv_chunk(step);
    for (size_t j = 0; j < segments; ++j) {
      LBCC_RETURN_IF_ERROR(recvs[step * segments + j]->Wait());
      if (step < staged) {
        const size_t elements = (seg_begin(c, j + 1) - seg_begin(c, j)) / element;
        schedule.combine(data + seg_begin(c, j), target(step, j), elements);
        if (step == staged - 1 && schedule.finish) schedule.finish(data + seg_begin(c, j), elements);
      }
      if (step + 1 < steps) post_send(step + 1, j);
    }
    if (step + 2 < staged) post_recvs(step + 2);
    if (step + 2 == staged) post_direct_recvs();
    LBCC_LOG(TRACE) << "ring (tag " << schedule.step_tag(0) << "): step " << step << " of "
                    << steps << ", " << segments << " segments of chunk " << c << ", in after "
                    << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms";
  }
  for (auto& batch : sends) LBCC_RETURN_IF_ERROR(batch->Wait());
  LBCC_LOG(TRACE) << "ring (tag " << schedule.step_tag(0) << "): sends done after "
                  << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms";
  return absl::OkStatus();
}

absl::Status FloatAllReduceRing(const Group& group, Tag tag, const void* in, void* out,
                                size_t count, DType dtype, ReduceOp op, Priority priority,
                                absl::Time deadline) {
  const size_t element = DTypeSize(dtype);
  if (in != out) std::memmove(out, in, count * element);
  const int n = group.size();
  if (n == 1) return absl::OkStatus();
  // Chunk c covers elements [count * c / n, count * (c + 1) / n).
  std::vector<size_t> offsets(n + 1);
  for (int c = 0; c <= n; ++c) offsets[c] = count * static_cast<size_t>(c) / n * element;
  const int me = group.me;
  // Reduce-scatter (steps 0 .. n-2, tags tag + s): rank r ends owning the full sum of chunk
  // (r + 1) % n; then the all-gather of the owned chunks (tags tag + n + s).
  RingSchedule ring;
  ring.steps = 2 * (n - 1);
  ring.combine_steps = n - 1;
  ring.send_chunk = [me, n](int s) { return ((me - s) % n + n) % n; };
  ring.recv_chunk = [me, n](int s) { return ((me - s - 1) % n + n) % n; };
  ring.step_tag = [tag, n](int s) { return s < n - 1 ? tag + s : tag + n + (s - (n - 1)); };
  ring.combine = [dtype](uint8_t* dst, const uint8_t* src, size_t elements) {
    Accumulate(dst, src, elements, dtype);
  };
  if (op == ReduceOp::kAvg) {
    ring.finish = [dtype, n](uint8_t* segment, size_t elements) {
      Scale(segment, elements, dtype, 1.0f / n);
    };
  }
  return RingPass(group, static_cast<uint8_t*>(out), offsets, element, ring, priority, deadline);
}

absl::Status Broadcast(const Group& group, Tag tag, void* buffer, size_t bytes, int root,
                       Priority priority, absl::Time deadline) {
  if (group.size() == 1) return absl::OkStatus();
  absl::Span<uint8_t> span(static_cast<uint8_t*>(buffer), bytes);
  Batch batch(group.fabric, deadline);
  if (group.me == root) {
    for (int i = 0; i < group.size(); ++i) {
      if (i != root) batch.Send(group.ranks[i], tag, span, priority);
    }
  } else {
    batch.Recv(group.ranks[root], tag, span);
  }
  return batch.Wait();
}

}  // namespace lbcc::comm
