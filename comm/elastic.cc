// ElasticGroup (comm/elastic.h): one member. Threads: a reader of the master's messages, a
// heartbeat sender that also watches the master's silence, and one set-up thread per epoch that
// builds its Communicator as soon as the epoch is announced (so set-up overlaps the trainer's
// inner steps). The caller's thread runs phases: acquire the epoch's communicator,
// run the phase, report to the master, wait for its decision, then commit or roll back.
#include "comm/elastic.h"

#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <tuple>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "comm/elastic_wire.h"

namespace lbcc::comm {

absl::StatusOr<absl::Duration> ResolvePeerTimeout(absl::Duration given);  // elastic_master.cc

using elastic::Message;
using elastic::MsgType;
using elastic::Phase;
using elastic::Socket;

bool IsRetryable(const absl::Status& status) { return absl::IsAborted(status); }

namespace {
// The mark of IsReplicaLeft's status: its message's start (not a status payload: payloads are
// absl::Cord, whose thread-local sampling state would leak into liblbcc.so's dynamic symbols).
constexpr char kReplicaLeftPrefix[] = "ElasticGroup: pipeline replica left the group: ";
}  // namespace

bool IsReplicaLeft(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         absl::StartsWith(status.message(), kReplicaLeftPrefix);
}

namespace {

// Threads an elastic group starts and never joins (an epoch's set-up; aborting or destroying a
// superseded epoch's communicator): exit() waits for them, up to kExitWait, before the
// libraries' finalizers run (atexit handlers run first), so that none of them is inside UCX,
// OpenSSL or BLAS while those tear down. Members that return from main right after Leave() or
// Destroy() aborted there (SIGSEGV/SIGABRT in UCX's async thread or in ucp_worker_create).
class Background {
 public:
  static constexpr absl::Duration kExitWait = absl::Seconds(10);

  static Background& Get() {
    static Background* background = new Background();  // Never destroyed: used at exit.
    return *background;
  }

  // Runs `fn` on a detached thread that exit() waits for. What `fn` holds is released before
  // the thread counts as done (releasing a communicator may start another such thread).
  template <typename Fn>
  void Start(Fn fn) {
    {
      MutexLock lock(&mu_);
      ++running_;
      if (!at_exit_) {
        at_exit_ = true;
        std::atexit([] { Get().AwaitAll(); });
      }
    }
    std::thread([this, fn = std::move(fn)]() mutable {
      {
        Fn run = std::move(fn);
        run();
      }
      MutexLock lock(&mu_);
      --running_;
    }).detach();
  }

 private:
  void AwaitAll() {
    MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; },
                              kExitWait)) {
      LBCC_LOG(WARN) << "ElasticGroup: exiting with " << running_
                     << " set-up or close thread(s) still running after "
                     << absl::FormatDuration(kExitWait);
    }
  }

  Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool at_exit_ ABSL_GUARDED_BY(mu_) = false;
};

// Holds a codec state's update back: SparseAllReduce's Commit() and Abort() only mark it, and
// the group commits or aborts the inner state itself (at once when the exchange succeeded
// here; after the master's decision when it failed: the step may still be forwarded).
class DeferredState final : public codecs::CodecState {
 public:
  explicit DeferredState(codecs::CodecState* inner) : inner_(inner) {}
  codecs::CodecId codec() const override { return inner_->codec(); }
  bool has_pending() const override { return inner_->has_pending() && !marked_ && !dropped_; }
  absl::Status Commit() override {
    if (!has_pending()) return absl::FailedPreconditionError("elastic: no pending update");
    marked_ = true;
    return absl::OkStatus();
  }
  absl::Status Abort() override {
    if (!has_pending()) return absl::FailedPreconditionError("elastic: no pending update");
    dropped_ = true;
    return absl::OkStatus();
  }
  codecs::CodecState* inner() const { return inner_; }
  // The master's decision: apply or drop whatever the inner state holds.
  absl::Status Finish(bool commit) {
    marked_ = dropped_ = false;
    if (!inner_->has_pending()) return absl::OkStatus();
    return commit ? inner_->Commit() : inner_->Abort();
  }

 private:
  codecs::CodecState* const inner_;
  bool marked_ = false;
  bool dropped_ = false;
};

codecs::CodecState* Unwrap(codecs::CodecState* state) {
  return state == nullptr ? nullptr : static_cast<DeferredState*>(state)->inner();
}

// The caller's codec with DeferredState unwrapped on the way in.
class DeferringCodec final : public codecs::Codec {
 public:
  explicit DeferringCodec(const codecs::Codec& inner) : inner_(inner) {}
  codecs::CodecId id() const override { return inner_.id(); }
  absl::string_view name() const override { return inner_.name(); }
  std::string Describe() const override { return inner_.Describe(); }
  absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t> shape) const override {
    return inner_.MaxEncodedBytes(shape);
  }
  std::unique_ptr<codecs::CodecState> NewState() const override { return inner_.NewState(); }
  absl::StatusOr<size_t> Encode(const TensorView& input, codecs::CodecState* state,
                                absl::Span<uint8_t> out) const override {
    return inner_.Encode(input, Unwrap(state), out);
  }
  absl::StatusOr<size_t> EncodeStreamed(const TensorView& input, codecs::CodecState* state,
                                        absl::Span<uint8_t> out,
                                        codecs::EncodeObserver* observer) const override {
    return inner_.EncodeStreamed(input, Unwrap(state), out, observer);
  }
  std::unique_ptr<codecs::CodecScratch> NewDecodeScratch() const override {
    return inner_.NewDecodeScratch();
  }
  absl::Status PrepareDecode(const codecs::DecodeCall& call,
                             codecs::CodecScratch* scratch) const override {
    return inner_.PrepareDecode(call, scratch);
  }
  void ApplyDecode(const codecs::DecodeCall& call, codecs::CodecScratch* scratch) const override {
    inner_.ApplyDecode(call, scratch);
  }
  absl::Status Inspect(const codecs::PayloadInfo& info,
                       codecs::PayloadSummary* summary) const override {
    return inner_.Inspect(info, summary);
  }
  bool ClipsToMedianNorm() const override { return inner_.ClipsToMedianNorm(); }

 private:
  const codecs::Codec& inner_;
};

constexpr uint32_t kStateTag = 0x5e1a;       // shared-state transfer (DenseSend/DenseRecv)
constexpr uint32_t kForwardTag = 0x5e1b;     // a step's result to members whose exchange failed
constexpr uint32_t kStateMagic = 0x5453424c;  // "LBST"

// One member's view of the shared state, exchanged before a transfer.
struct StateRecord {
  uint8_t synced = 0;
  uint64_t hash = 0;
  uint64_t bytes = 0;
};

// Header of a transfer: what follows on the same tag.
struct StateHeader {
  uint32_t magic = kStateMagic;
  uint32_t compressed = 0;  // 1: zstd frame
  uint64_t raw_bytes = 0;
  uint64_t wire_bytes = 0;
  uint64_t hash = 0;
};

bool IsCallerError(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsDataLoss(s) || absl::IsUnimplemented(s);
}

}  // namespace

class ElasticGroup::Impl : public std::enable_shared_from_this<ElasticGroup::Impl> {
 public:
  Impl(ElasticOptions options, std::vector<TensorView> shared)
      : options_(std::move(options)), shared_(std::move(shared)) {}

  ~Impl() {
    (void)Leave();
  }

  absl::Status Join() {
    if (options_.master_address.empty()) {
      LBCC_ASSIGN_OR_RETURN(options_.master_address, env::GetString("LBCC_MASTER_ADDR"));
    }
    if (options_.master_address.empty()) {
      return absl::InvalidArgumentError(
          "ElasticGroup: no master address (ElasticOptions.master_address or LBCC_MASTER_ADDR)");
    }
    if (options_.job_id.empty()) return absl::InvalidArgumentError("ElasticGroup: job_id is empty");
    if (options_.replica.empty() != (options_.replica_stages == 0) || options_.replica_stages < 0 ||
        (!options_.replica.empty() &&
         (options_.stage < 0 || options_.stage >= options_.replica_stages))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ElasticGroup: pipeline stage ", options_.stage, " of replica '", options_.replica,
          "' with ", options_.replica_stages,
          " stages (a replica name, replica_stages >= 1 and 0 <= stage < replica_stages, or none "
          "of them)"));
    }
    for (size_t i = 0; i < shared_.size(); ++i) {
      if (!shared_[i].is_host() || (shared_[i].data() == nullptr && shared_[i].num_bytes() > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("ElasticGroup: shared state tensor ", i, " is not host memory"));
      }
      state_bytes_ += shared_[i].num_bytes();
    }
    if (options_.name.empty()) {
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      options_.name = absl::StrCat(host, ":", getpid());
    }
    LBCC_ASSIGN_OR_RETURN(peer_timeout_, ResolvePeerTimeout(options_.peer_timeout));
    setup_timeout_ = options_.comm_config.timeout.value_or(peer_timeout_ + absl::Seconds(5));
    options_.comm_config.timeout = setup_timeout_;
    const absl::Time deadline = absl::Now() + options_.join_timeout;
    LBCC_ASSIGN_OR_RETURN(sock_, Socket::Connect(options_.master_address,
                                                 std::min(deadline, absl::Now() + setup_timeout_)));
    Message join;
    join.type = MsgType::kJoin;
    join.job_id = options_.job_id;
    join.name = options_.name;
    join.state_step = options_.state_step;
    join.replica = options_.replica;
    join.stage = static_cast<uint32_t>(options_.stage);
    join.replica_stages = static_cast<uint32_t>(options_.replica_stages);
    LBCC_RETURN_IF_ERROR(sock_->Send(join, absl::Now() + absl::Seconds(5)));
    LBCC_ASSIGN_OR_RETURN(Message welcome, sock_->Receive(absl::Now() + setup_timeout_));
    if (welcome.type == MsgType::kRefuse) {
      return absl::Status(static_cast<absl::StatusCode>(welcome.code), welcome.text);
    }
    if (welcome.type != MsgType::kWelcome) {
      return absl::DataLossError("ElasticGroup: the master did not answer the join");
    }
    {
      MutexLock lock(&mu_);
      last_heard_ = absl::Now();
      step_ = welcome.step;
    }
    reader_ = std::thread([this] { ReadLoop(); });
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return info_.epoch > 0 || !fatal_.ok(); },
        deadline);
    if (!fatal_.ok()) return fatal_;
    if (info_.epoch == 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "ElasticGroup: not admitted by the master at ", options_.master_address, " within ",
          absl::FormatDuration(options_.join_timeout)));
    }
    return absl::OkStatus();
  }

  absl::Status Leave() {
    {
      MutexLock lock(&mu_);
      if (left_) return absl::OkStatus();
      // The others may still be finishing the step this member committed last: leaving now
      // would announce the new epoch while a phase runs on their communicator, which must then
      // be aborted instead of derived from (a fresh epoch: bootstrap and connections). The
      // master's decision on that step means every other member reported it (its exchange is
      // over there), so the departure finds them between phases. Bounded by the peer timeout
      // (a member that stopped answering is dropped by then).
      if (held_.has_value() && !held_forwarding_ && fatal_.ok()) {
        const auto key =
            std::make_tuple(held_->epoch, static_cast<int>(Phase::kStep), held_->step);
        mu_.AwaitWithTimeout(
            [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return !fatal_.ok() || decisions_.count(key) > 0;
            },
            peer_timeout_);
      }
      left_ = true;
    }
    if (sock_ != nullptr) {
      Message leave;
      leave.type = MsgType::kLeave;
      if (sock_->Send(leave, absl::Now() + absl::Seconds(1)).ok() && reader_.joinable()) {
        // The master closes the connection once it took the leave; reading to its end first
        // leaves nothing unread, so closing sends no reset that could drop the last report.
        MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(
            [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reader_done_ || !fatal_.ok(); },
            absl::Seconds(1));
      }
      sock_->Shutdown();
    }
    std::shared_ptr<Communicator> comm;
    {
      MutexLock lock(&mu_);
      comm = comm_;
    }
    if (comm) {
      comm->Abort();
      // Its control connections too: the others finished this member's last step (the wait
      // above) and keep their own connections, so they never say the goodbyes a closing fabric
      // lingers for (up to its timeout), and a process that exits right after Leave() must not
      // have a communicator still closing (Background).
      comm->fabric()->AbortWithControl(absl::CancelledError("ElasticGroup: left the group"));
    }
    for (std::thread* t : {&reader_, &heartbeat_}) {
      if (t->joinable()) t->join();
    }
    MutexLock lock(&mu_);
    comm_.reset();  // closes on a thread of its own (Adopt)
    return absl::OkStatus();
  }

  absl::Status Boundary() {
    LBCC_ASSIGN_OR_RETURN(Acquired a, Acquire());
    if (a.info.needs_state.empty()) return absl::OkStatus();  // nobody to bring up to date
    return RunPhase(a, Phase::kSync, [&] { return SyncState(a); }, nullptr);
  }

  absl::Status SparseAllReduce(const std::vector<Communicator::SparseTensor>& tensors,
                               const codecs::Codec* codec, codecs::DecodeOptions decode) {
    if (codec == nullptr) return absl::InvalidArgumentError("ElasticGroup: codec is null");
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i].delta.is_host() || !tensors[i].out.is_host()) {
        return absl::UnimplementedError(
            absl::StrCat("ElasticGroup::SparseAllReduce: tensor ", i, " is not in host memory"));
      }
    }
    LBCC_ASSIGN_OR_RETURN(Acquired a, Acquire());
    if (!a.info.needs_state.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ElasticGroup: epoch ", a.info.epoch, " has members without the shared state (",
          absl::StrJoin(a.info.needs_state, ", "), "): call Boundary() first"));
    }
    std::vector<std::unique_ptr<DeferredState>> states;
    std::vector<Communicator::SparseTensor> wrapped = tensors;
    for (auto& t : wrapped) {
      if (t.state != nullptr) {
        states.push_back(std::make_unique<DeferredState>(t.state));
        t.state = states.back().get();
      }
    }
    DeferringCodec deferring(*codec);
    OpOptions op = Communicator::BulkOptions();
    op.timeout = options_.op_timeout;
    const absl::Time started = absl::Now();
    LBCC_RETURN_IF_ERROR(BeginPhase(a));
    const absl::Status local =
        a.comm->SparseAllReduce(wrapped, &deferring, decode, op)->Wait();
    EndPhase();
    auto finish = [&](bool commit) {
      absl::Status first;
      for (auto& s : states) {
        absl::Status f = s->Finish(commit);
        if (first.ok()) first = f;
      }
      return first;
    };
    Report(a, Phase::kStep, a.step, local);
    LBCC_LOG(TRACE) << "ElasticGroup " << options_.name << ": epoch " << a.info.epoch << " step "
                    << a.step << " exchange " << absl::ToDoubleMilliseconds(absl::Now() - started)
                    << " ms: " << (local.ok() ? "committed" : local.ToString());
    if (local.ok()) {
      // Committed at once; the master's decision is awaited before the next phase (Acquire),
      // and this member remembers where the result is in case a member whose exchange failed
      // needs it: the caller leaves `out` as it is until its next call (elastic.h), and the
      // forward phase runs at the start of that call, so the steady state copies nothing.
      Held held{a.info.epoch, a.step, {}};
      for (const auto& t : tensors) held.out.push_back(t.out);
      const absl::Status committed = finish(true);
      MutexLock lock(&mu_);
      held_ = std::move(held);
      held_forwarding_ = false;
      step_ = std::max(step_, a.step + 1);
      stats_.committed_epoch = a.info.epoch;
      return committed;
    }
    // Failed here: the master decides once every member of the epoch is accounted for (a
    // member that committed may forward the result: then this call succeeds after all).
    const auto key = std::make_tuple(a.info.epoch, static_cast<int>(Phase::kStep), a.step);
    Message decision;
    absl::Status fatal;
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return left_ || !fatal_.ok() || decisions_.count(key) > 0;
      });
      if (left_) {
        fatal = absl::FailedPreconditionError("ElasticGroup: this member left the group");
      } else if (!fatal_.ok()) {
        fatal = fatal_;
      } else {
        decision = decisions_[key];
      }
    }
    if (fatal.ok() && decision.forward) {
      ForwardTarget target{a.info.epoch, a.step, &wrapped, false};
      absl::StatusOr<Acquired> forwarded = Acquire(&target);
      if (target.done) {
        LBCC_RETURN_IF_ERROR(finish(true));
        MutexLock lock(&mu_);
        stats_.committed_epoch = a.info.epoch;
        return absl::OkStatus();
      }
      fatal = forwarded.ok() ? absl::AbortedError("ElasticGroup: step not forwarded")
                             : forwarded.status();
      if (IsRetryable(fatal)) fatal = absl::OkStatus();  // rolled back: as an abort below
    }
    (void)finish(false);
    std::string changed;
    {
      MutexLock lock(&mu_);
      ++stats_.aborted_calls;
      if (info_.epoch > a.info.epoch) changed = absl::StrCat("membership changed: ", info_.reason);
    }
    if (!fatal.ok()) return fatal;
    if (IsCallerError(local)) return local;
    if (!changed.empty()) return absl::AbortedError(changed);
    return absl::AbortedError(absl::StrCat("elastic phase aborted in epoch ", a.info.epoch, ": ",
                                           decision.text));
  }

  uint64_t epoch() {
    MutexLock lock(&mu_);
    return info_.epoch;
  }
  bool AwaitEpoch(uint64_t n, absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return info_.epoch >= n || !fatal_.ok(); },
        timeout) &&
           info_.epoch >= n;
  }
  int rank() {
    MutexLock lock(&mu_);
    return info_.rank;
  }
  int size() {
    MutexLock lock(&mu_);
    return info_.nranks;
  }
  uint64_t step() {
    MutexLock lock(&mu_);
    return step_;
  }
  ElasticStats stats() {
    MutexLock lock(&mu_);
    ElasticStats s = stats_;
    s.state_bytes = state_bytes_;
    return s;
  }
  std::shared_ptr<Communicator> communicator() {
    MutexLock lock(&mu_);
    return comm_epoch_ == info_.epoch ? comm_ : nullptr;
  }

 private:
  struct EpochInfo {
    uint64_t epoch = 0;
    int rank = 0, nranks = 0;
    UniqueId id{};
    std::vector<uint32_t> needs_state;
    std::vector<std::string> names;
    std::string reason;
    uint64_t parent_epoch = 0;  // derived from this epoch's communicator (0: built anew)
    std::vector<int> parent_ranks;
    bool forward = false;  // forward_source sends step forward_step's result to forward_to
    uint64_t forward_step = 0;
    int forward_source = 0;
    std::vector<uint32_t> forward_to;
  };
  // A member whose exchange of `step` failed, waiting to receive its result.
  struct ForwardTarget {
    uint64_t epoch = 0, step = 0;
    const std::vector<Communicator::SparseTensor>* tensors = nullptr;
    bool done = false;
  };
  // A step this member committed before the master decided it: its result, kept until every
  // member has the step (the master may ask this member to forward it).
  struct Held {
    uint64_t epoch = 0, step = 0;
    std::vector<TensorView> out;  // the caller's `out` tensors of that call
  };
  struct Acquired {
    std::shared_ptr<Communicator> comm;
    EpochInfo info;
    uint64_t step = 0;
  };

  // An epoch's communicator, destroyed on a thread of its own by whoever drops it last (the
  // reader, an epoch's set-up thread before it reports a failed set-up, the caller's thread at
  // the end of a phase, Leave()): closing its connections lingers for the peers' goodbyes on
  // the control connections until the last operation's agreement window ends (up to the
  // set-up timeout), and peers that keep theirs (a derived epoch) or are gone never say it.
  static std::shared_ptr<Communicator> Adopt(std::unique_ptr<Communicator> comm) {
    return std::shared_ptr<Communicator>(comm.release(), [](Communicator* c) {
      Background::Get().Start([c] { delete c; });
    });
  }

  // Aborts `comm` on a thread of its own: closing endpoints to a dead peer can take the
  // transport's timeout, and the master's reader must keep reading (heartbeats) meanwhile.
  // With `control`, its control connections close too (Fabric::AbortWithControl): the master
  // decides this epoch's outcomes, and a peer inside an operation this member never runs (or
  // was rejected here) would otherwise wait in the communicator's outcome agreement for its
  // vote for a grace period (up to 10 s) before its retry.
  static void AbortSoon(std::shared_ptr<Communicator> comm, bool control) {
    Background::Get().Start([comm = std::move(comm), control] {
      const absl::Status why =
          absl::CancelledError("communicator aborted: its elastic epoch was superseded");
      if (control) {
        comm->fabric()->AbortWithControl(why);
      } else {
        comm->fabric()->Abort(why);
      }
    });
  }

  // Aborts a superseded communicator. While a phase runs on it, its control connections stay
  // up until the phase ends (EndPhase): the phase's own outcome agreement may still complete
  // over them (every payload was exchanged), and its vote reaches the peers.
  void RetireLocked(std::shared_ptr<Communicator> comm) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (in_phase_) close_after_phase_.push_back(comm);
    AbortSoon(std::move(comm), !in_phase_);
  }

  // Fails the group for good (the master is lost, or it evicted or refused us).
  void FailLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!fatal_.ok() || left_) return;
    LBCC_LOG(WARN) << "ElasticGroup " << options_.name << ": " << why;
    fatal_ = std::move(why);
    if (comm_) RetireLocked(comm_);
  }

  absl::Status MasterLost(absl::string_view how) {
    return absl::UnavailableError(absl::StrCat("ElasticGroup: the membership service (lbcc-master) at ",
                                               options_.master_address, " ", how));
  }

  void ReadLoop() {
    while (true) {
      absl::StatusOr<Message> m = sock_->Receive(absl::InfiniteFuture());
      {
        MutexLock lock(&mu_);
        if (left_) {
          if (m.ok()) continue;  // read to the end (Leave)
          reader_done_ = true;
          return;
        }
        if (!m.ok()) {
          FailLocked(MasterLost(absl::StrCat("is lost: ", m.status().message())));
          return;
        }
        last_heard_ = absl::Now();
        switch (m->type) {
          case MsgType::kEpoch: {
            if (m->epoch <= info_.epoch) break;
            EpochInfo info;
            info.epoch = m->epoch;
            info.rank = static_cast<int>(m->rank);
            info.nranks = static_cast<int>(m->nranks);
            if (m->unique_id.size() != sizeof(info.id.internal)) {
              FailLocked(absl::DataLossError("ElasticGroup: the master sent a malformed epoch"));
              return;
            }
            std::memcpy(info.id.internal, m->unique_id.data(), sizeof(info.id.internal));
            info.needs_state = m->needs_state;
            info.names = m->names;
            info.reason = m->text;
            info.parent_epoch = m->parent_epoch;
            info.parent_ranks.assign(m->parent_ranks.begin(), m->parent_ranks.end());
            info.forward = m->forward;
            info.forward_step = m->forward_step;
            info.forward_source = static_cast<int>(m->forward_source);
            info.forward_to = m->forward_to;
            info_ = std::move(info);
            step_ = std::max(step_, m->step);
            ++stats_.epochs_seen;
            // Derived from the epoch this member holds, when no phase runs on it; else it is
            // aborted (a running operation must fail now) and the set-up reports that.
            std::shared_ptr<Communicator> parent;
            if (info_.parent_epoch != 0 && comm_ && comm_epoch_ == info_.parent_epoch &&
                !in_phase_ && comm_->status().ok()) {
              parent = comm_;
            } else if (comm_) {
              RetireLocked(comm_);
            }
            Background::Get().Start(
                [self = shared_from_this(), info = info_, parent = std::move(parent)] {
                  self->BuildEpoch(info, parent);
                });
            break;
          }
          case MsgType::kDecision:
            decisions_[{m->epoch, static_cast<int>(m->phase), m->step}] = *m;
            // A committed transfer: every member of this epoch holds the state now.
            if (m->ok && m->phase == Phase::kSync && m->epoch == info_.epoch) {
              info_.needs_state.clear();
            }
            if (m->ok && m->phase != Phase::kSync) step_ = std::max(step_, m->step + 1);
            if (m->broken) expect_after_ = std::max(expect_after_, m->next_epoch - 1);
            break;
          case MsgType::kRefuse:
            FailLocked(absl::Status(static_cast<absl::StatusCode>(m->code), m->text));
            return;
          case MsgType::kEvicted: {
            if (m->replica_left) {
              FailLocked(absl::FailedPreconditionError(absl::StrCat(
                  kReplicaLeftPrefix, m->text,
                  "; Join again: the replica is admitted once all its stages are back")));
              return;
            }
            FailLocked(absl::FailedPreconditionError(absl::StrCat(
                "ElasticGroup: evicted by the membership service: ", m->text,
                "; the group went on without this member (Join again)")));
            return;
          }
          default:
            break;
        }
      }
    }
  }

  void HeartbeatLoop() {
    const absl::Duration period = std::max(peer_timeout_ / 4, absl::Milliseconds(10));
    MutexLock lock(&mu_);
    absl::Time last_tick = absl::Now();
    while (!left_ && fatal_.ok()) {
      mu_.AwaitWithTimeout(
          [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return left_ || !fatal_.ok(); }, period);
      if (left_ || !fatal_.ok()) return;
      const absl::Time now = absl::Now();
      if (now - last_tick > peer_timeout_ / 2) {
        // This process was stalled (SIGSTOP, swapped out), not the master: give the reader a
        // period to take what the master sent meanwhile (an eviction) before judging it.
        last_heard_ = std::max(last_heard_, now - peer_timeout_ + period);
      }
      last_tick = now;
      const absl::Duration silent = now - last_heard_;
      if (silent > peer_timeout_) {
        FailLocked(MasterLost(absl::StrCat("was silent for ", absl::ToInt64Milliseconds(silent),
                                           " ms")));
        sock_->Shutdown();
        return;
      }
      mu_.Unlock();
      Message hb;
      hb.type = MsgType::kHeartbeat;
      // A failed send means the connection is gone: the reader takes what the master sent
      // before it closed (an eviction) and then the end; the silence check covers the rest.
      (void)sock_->Send(hb, absl::Now() + period);
      mu_.Lock();
    }
  }

  // Builds `info`'s communicator, on a thread of its own per epoch: an epoch superseded while
  // its members meet (one left before joining its bootstrap) holds its thread until the set-up
  // timeout, and must not hold up the newer epoch. The thread keeps the Impl alive.
  void BuildEpoch(const EpochInfo& info, const std::shared_ptr<Communicator>& parent) {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        info.parent_epoch == 0
            ? Communicator::Init(info.id, info.nranks, info.rank, options_.comm_config)
        : parent != nullptr
            ? parent->Subgroup(info.parent_ranks, static_cast<uint32_t>(2 + info.epoch % 65534))
            : absl::StatusOr<std::unique_ptr<Communicator>>(absl::FailedPreconditionError(
                  absl::StrCat("epoch ", info.parent_epoch, "'s communicator is not usable here "
                               "to derive epoch ", info.epoch, " from")));
    std::shared_ptr<Communicator> built;
    if (comm.ok()) built = Adopt(std::move(*comm));
    std::shared_ptr<Communicator> old;
    {
      MutexLock lock(&mu_);
      if (info_.epoch != info.epoch || left_ || !fatal_.ok()) return;  // superseded: drop it
      old = std::move(comm_);
      comm_ = std::move(built);
      comm_epoch_ = info.epoch;
      setup_status_ = comm.status();
      if (comm.ok()) ++(info.parent_epoch != 0 ? stats_.derived_epochs : stats_.fresh_epochs);
    }
    old.reset();
    if (!comm.ok()) {
      LBCC_LOG(WARN) << "ElasticGroup " << options_.name << ": epoch " << info.epoch
                     << " set-up failed: " << comm.status();
      Message failed;
      failed.type = MsgType::kSetupFailed;
      failed.epoch = info.epoch;
      failed.text = comm.status().ToString();
      (void)sock_->Send(failed, absl::Now() + absl::Seconds(1));
    }
  }

  // Waits for the master's decision of the step this member committed last, then for the
  // newest epoch's communicator, and first runs the epoch's forward phase if it has one.
  // `target`: the call of a step that failed here and is to receive its result.
  absl::StatusOr<Acquired> Acquire(ForwardTarget* target = nullptr) {
    const absl::Duration limit = setup_timeout_ + options_.op_timeout;
    while (true) {
      Acquired a;
      bool enter = false, forward = false;
      {
        MutexLock lock(&mu_);
        const absl::Time deadline = absl::Now() + limit;
        if (held_.has_value() && !held_forwarding_) {
          const auto key = std::make_tuple(held_->epoch, static_cast<int>(Phase::kStep), held_->step);
          const absl::Time wait_start = absl::Now();
          const bool waited = decisions_.count(key) == 0;
          const bool got = mu_.AwaitWithDeadline(
              [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                return left_ || !fatal_.ok() || decisions_.count(key) > 0;
              },
              deadline);
          if (left_) return absl::FailedPreconditionError("ElasticGroup: this member left the group");
          if (!fatal_.ok()) return fatal_;
          if (waited) {
            ++stats_.decision_waits;
            stats_.decision_wait += absl::Now() - wait_start;
          }
          if (!got) {
            return absl::DeadlineExceededError(absl::StrCat(
                "ElasticGroup: no decision on step ", held_->step, " within ",
                absl::FormatDuration(limit)));
          }
          const Message& d = decisions_[key];
          if (d.ok) {
            held_.reset();
            decisions_.erase(decisions_.begin(), decisions_.upper_bound(key));
          } else if (d.forward) {
            held_forwarding_ = true;  // kept until the forward phase ran
          } else {
            FailLocked(absl::DataLossError(absl::StrCat(
                "ElasticGroup: the job rolled back step ", held_->step,
                ", which this member had committed: ", d.text)));
            return fatal_;
          }
        }
        if (target != nullptr) {
          auto it = decisions_.find(
              std::make_tuple(target->epoch, static_cast<int>(Phase::kStep), target->step));
          if (it != decisions_.end() && !it->second.forward) {
            return absl::AbortedError(absl::StrCat("membership changed: step ", target->step,
                                                   " is rolled back: ", it->second.text));
          }
        }
        const bool ready = mu_.AwaitWithDeadline(
            [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return left_ || !fatal_.ok() ||
                     (info_.epoch > expect_after_ && comm_epoch_ == info_.epoch && comm_ != nullptr);
            },
            deadline);
        if (left_) return absl::FailedPreconditionError("ElasticGroup: this member left the group");
        if (!fatal_.ok()) return fatal_;
        if (!ready) {
          return absl::DeadlineExceededError(absl::StrCat(
              "ElasticGroup: no usable epoch within ", absl::FormatDuration(limit),
              " (epoch ", info_.epoch, ": ", setup_status_.ToString(), ")"));
        }
        if (info_.epoch != entered_epoch_) {
          entered_epoch_ = info_.epoch;
          enter = true;
        }
        if (held_forwarding_ && !info_.forward) {
          held_.reset();  // every member that needed it is gone
          held_forwarding_ = false;
        }
        forward = info_.forward &&
                  decisions_.count(std::make_tuple(info_.epoch, static_cast<int>(Phase::kForward),
                                                   info_.forward_step)) == 0;
        a = Acquired{comm_, info_, step_};
      }
      if (enter) {
        // Tells the master this member takes part in no older exchange.
        Message m;
        m.type = MsgType::kEnter;
        m.epoch = a.info.epoch;
        (void)sock_->Send(m, absl::Now() + absl::Seconds(5));
      }
      if (!forward) {
        if (target != nullptr) return absl::AbortedError("ElasticGroup: the step was not forwarded");
        return a;
      }
      Acquired f = a;
      f.step = a.info.forward_step;
      const absl::Status s = RunPhase(f, Phase::kForward, [&] { return ForwardStep(f, target); },
                                      nullptr);
      if (s.ok()) {
        MutexLock lock(&mu_);
        if (held_.has_value() && held_->step == f.step) {
          held_.reset();
          held_forwarding_ = false;
        }
        if (target != nullptr && target->step == f.step) {
          target->done = true;
          return a;
        }
        continue;
      }
      if (!IsRetryable(s)) return s;
      // The master forwards again in a new epoch, or rolls the step back.
    }
  }

  // The forward phase: the source sends the result of the step to every member whose
  // exchange of it failed (XXH3-checked); the others take part with nothing to do.
  absl::Status ForwardStep(const Acquired& a, ForwardTarget* target) {
    Communicator& comm = *a.comm;
    const std::vector<uint32_t>& to = a.info.forward_to;
    const int rank = a.info.rank;
    if (rank == a.info.forward_source) {
      std::string out;
      {
        MutexLock lock(&mu_);
        if (!held_.has_value() || held_->step != a.info.forward_step) {
          return absl::InternalError(absl::StrCat("ElasticGroup: asked to forward step ",
                                                  a.info.forward_step, ", which it does not hold"));
        }
        for (const TensorView& t : held_->out) {
          out.append(static_cast<const char*>(t.data()), t.num_bytes());
        }
      }
      StateHeader header;
      header.raw_bytes = header.wire_bytes = out.size();
      header.hash = XXH3_64bits(out.data(), out.size());
      for (uint32_t r : to) {
        RequestPtr h = comm.DenseSend(&header, sizeof(header), static_cast<int>(r), kForwardTag);
        RequestPtr b = comm.DenseSend(out.data(), out.size(), static_cast<int>(r), kForwardTag);
        LBCC_RETURN_IF_ERROR(WaitOrAbort(comm, h));
        LBCC_RETURN_IF_ERROR(WaitOrAbort(comm, b));
      }
      return absl::OkStatus();
    }
    if (std::find(to.begin(), to.end(), static_cast<uint32_t>(rank)) == to.end()) {
      return absl::OkStatus();
    }
    if (target == nullptr || target->step != a.info.forward_step) {
      return absl::InternalError(absl::StrCat("ElasticGroup: step ", a.info.forward_step,
                                              " is forwarded to this member, which is not in it"));
    }
    uint64_t bytes = 0;
    for (const auto& t : *target->tensors) bytes += t.out.num_bytes();
    StateHeader header;
    LBCC_RETURN_IF_ERROR(WaitOrAbort(
        comm, comm.DenseRecv(&header, sizeof(header), a.info.forward_source, kForwardTag)));
    if (header.magic != kStateMagic || header.raw_bytes != bytes || header.wire_bytes != bytes) {
      return absl::DataLossError(absl::StrCat("ElasticGroup: bad forwarded result of step ",
                                              a.info.forward_step, " from rank ",
                                              a.info.forward_source));
    }
    std::string body(bytes, '\0');
    LBCC_RETURN_IF_ERROR(WaitOrAbort(
        comm, comm.DenseRecv(body.data(), body.size(), a.info.forward_source, kForwardTag)));
    if (XXH3_64bits(body.data(), body.size()) != header.hash) {
      return absl::DataLossError(absl::StrCat("ElasticGroup: the forwarded result of step ",
                                              a.info.forward_step, " does not match its hash"));
    }
    size_t at = 0;
    for (const auto& t : *target->tensors) {
      std::memcpy(t.out.data(), body.data() + at, t.out.num_bytes());
      at += t.out.num_bytes();
    }
    return absl::OkStatus();
  }

  // Marks the acquired epoch's communicator busy (a newer epoch must abort it, not derive from
  // it); Aborted when the epoch changed since Acquire (nothing ran: retry).
  absl::Status BeginPhase(const Acquired& a) {
    MutexLock lock(&mu_);
    if (info_.epoch != a.info.epoch) {
      return absl::AbortedError(absl::StrCat("membership changed: ", info_.reason));
    }
    in_phase_ = true;
    return absl::OkStatus();
  }
  void EndPhase() {
    MutexLock lock(&mu_);
    in_phase_ = false;
    for (auto& comm : close_after_phase_) AbortSoon(std::move(comm), /*control=*/true);
    close_after_phase_.clear();
  }

  void Report(const Acquired& a, Phase phase, uint64_t step, const absl::Status& local) {
    Message report;
    report.type = MsgType::kReport;
    report.epoch = a.info.epoch;
    report.step = step;
    report.phase = phase;
    report.ok = local.ok();
    report.broken = !a.comm->status().ok();
    report.code = static_cast<uint32_t>(local.code());
    report.text = std::string(local.message());
    (void)sock_->Send(report, absl::Now() + absl::Seconds(5));  // a lost master shows later
  }

  // Runs one phase in the acquired epoch and applies the master's decision.
  template <typename Body, typename Finish>
  absl::Status RunPhase(const Acquired& a, Phase phase, Body body, Finish finish) {
    const absl::Time started = absl::Now();
    LBCC_RETURN_IF_ERROR(BeginPhase(a));
    const absl::Status local = body();
    EndPhase();
    const absl::Time ran = absl::Now();
    Report(a, phase, a.step, local);
    Message decision;
    bool decided = false;
    std::string changed;
    absl::Status fatal;
    {
      MutexLock lock(&mu_);
      const auto key = std::make_tuple(a.info.epoch, static_cast<int>(phase), a.step);
      mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return left_ || !fatal_.ok() || decisions_.count(key) > 0 || info_.epoch > a.info.epoch;
      });
      if (decisions_.count(key)) {
        decided = true;
        decision = decisions_[key];
        decisions_.erase(decisions_.begin(), decisions_.upper_bound(key));
      } else if (left_) {
        fatal = absl::FailedPreconditionError("ElasticGroup: this member left the group");
      } else if (!fatal_.ok()) {
        fatal = fatal_;
      } else {
        changed = absl::StrCat("membership changed: ", info_.reason);
      }
      LBCC_LOG(TRACE) << "ElasticGroup " << options_.name << ": epoch " << a.info.epoch
                      << " step " << a.step << (phase == Phase::kSync ? " sync " : " forward ")
                      << absl::ToDoubleMilliseconds(ran - started) << " ms, decision after "
                      << absl::ToDoubleMilliseconds(absl::Now() - ran) << " ms";
      if (!(decided && decision.ok)) ++stats_.aborted_calls;
      if (decided && decision.ok) stats_.committed_epoch = a.info.epoch;
    }
    if (decided && decision.ok) {
      if constexpr (!std::is_same_v<Finish, std::nullptr_t>) {
        if (absl::Status s = finish(true); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    if constexpr (!std::is_same_v<Finish, std::nullptr_t>) (void)finish(false);
    if (!fatal.ok()) return fatal;
    if (!decided) return absl::AbortedError(changed);
    if (!local.ok() && IsCallerError(local)) return local;
    return absl::AbortedError(absl::StrCat("elastic phase aborted in epoch ", a.info.epoch,
                                           ": ", decision.text));
  }

  // Hashes the shared state.
  uint64_t HashState() const {
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    for (const TensorView& t : shared_) XXH3_64bits_update(st, t.data(), t.num_bytes());
    const uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
  }

  // Boundary's phase: every member's hash, then each newcomer's state from its best source.
  absl::Status SyncState(const Acquired& a) {
    Communicator& comm = *a.comm;
    const std::vector<uint32_t>& needs = a.info.needs_state;
    const bool synced = std::find(needs.begin(), needs.end(), static_cast<uint32_t>(a.info.rank)) ==
                        needs.end();
    StateRecord mine{static_cast<uint8_t>(synced), HashState(), state_bytes_};
    std::string mine_bytes(reinterpret_cast<const char*>(&mine), sizeof(mine));
    std::vector<std::string> all;
    OpOptions op;
    op.timeout = options_.op_timeout;
    LBCC_RETURN_IF_ERROR(comm.AllGatherV(&mine_bytes, &all, op)->Wait());
    std::vector<StateRecord> records(all.size());
    int reference = -1;
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r].size() != sizeof(StateRecord)) {
        return absl::DataLossError(absl::StrCat("ElasticGroup: rank ", r, " sent a bad state record"));
      }
      std::memcpy(&records[r], all[r].data(), sizeof(StateRecord));
      if (records[r].synced && reference < 0) reference = static_cast<int>(r);
    }
    if (reference < 0) {
      return absl::FailedPreconditionError("ElasticGroup: no member of the epoch holds the shared state");
    }
    const StateRecord& ref = records[reference];
    for (size_t r = 0; r < records.size(); ++r) {
      if (records[r].synced && (records[r].hash != ref.hash || records[r].bytes != ref.bytes)) {
        return absl::DataLossError(absl::StrFormat(
            "ElasticGroup: the members' shared states differ: rank %d has %d bytes of XXH3 "
            "%016x, rank %d %d bytes of XXH3 %016x",
            reference, ref.bytes, ref.hash, r, records[r].bytes, records[r].hash));
      }
    }
    if (ref.bytes != state_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ElasticGroup: the job's shared state is ", ref.bytes, " bytes, this member's ",
          state_bytes_));
    }
    uint64_t sent = 0, received = 0;
    for (uint32_t j : needs) {
      if (records[j].hash == ref.hash && records[j].bytes == ref.bytes) continue;  // up to date
      if (records[j].bytes != ref.bytes) continue;  // j fails by itself (InvalidArgument)
      // The source: a holder on a fast link to j if there is one, then the lowest rank.
      // (The topology is the connections', by global rank: a derived epoch's ranks differ.)
      auto link = [&](int a, int b) {
        return comm.topology().link(comm.global_ranks()[a], comm.global_ranks()[b]);
      };
      int source = -1;
      for (size_t r = 0; r < records.size(); ++r) {
        if (!records[r].synced) continue;
        if (source < 0 || (link(static_cast<int>(r), j) == LinkClass::kFast &&
                           link(source, j) != LinkClass::kFast)) {
          source = static_cast<int>(r);
        }
      }
      const bool slow = link(source, j) == LinkClass::kSlow;
      if (a.info.rank == source) {
        LBCC_ASSIGN_OR_RETURN(uint64_t n, SendState(comm, static_cast<int>(j), slow, ref.hash));
        sent += n;
      } else if (a.info.rank == static_cast<int>(j)) {
        LBCC_ASSIGN_OR_RETURN(uint64_t n, ReceiveState(comm, source, ref.hash));
        received += n;
      }
    }
    MutexLock lock(&mu_);
    stats_.state_bytes_sent = sent;
    stats_.state_bytes_received = received;
    return absl::OkStatus();
  }

  absl::Status WaitOrAbort(Communicator& comm, const RequestPtr& r) {
    absl::Status s = r->WaitFor(options_.op_timeout);
    if (absl::IsDeadlineExceeded(s)) {
      comm.Abort();
      return r->Wait();
    }
    return s;
  }

  absl::StatusOr<uint64_t> SendState(Communicator& comm, int peer, bool slow, uint64_t hash) {
    std::string raw;
    raw.reserve(state_bytes_);
    for (const TensorView& t : shared_) {
      raw.append(static_cast<const char*>(t.data()), t.num_bytes());
    }
    StateHeader header;
    header.raw_bytes = raw.size();
    header.hash = hash;
    std::string body;
    if (slow && !raw.empty()) {
      body.resize(ZSTD_compressBound(raw.size()));
      const size_t n = ZSTD_compress(body.data(), body.size(), raw.data(), raw.size(), 3);
      if (!ZSTD_isError(n) && n < raw.size()) {
        body.resize(n);
        header.compressed = 1;
      }
    }
    if (!header.compressed) body.swap(raw);
    header.wire_bytes = body.size();
    RequestPtr h = comm.DenseSend(&header, sizeof(header), peer, kStateTag);
    RequestPtr b = comm.DenseSend(body.data(), body.size(), peer, kStateTag);
    LBCC_RETURN_IF_ERROR(WaitOrAbort(comm, h));
    LBCC_RETURN_IF_ERROR(WaitOrAbort(comm, b));
    return sizeof(header) + body.size();
  }

  absl::StatusOr<uint64_t> ReceiveState(Communicator& comm, int source, uint64_t hash) {
    StateHeader header;
    LBCC_RETURN_IF_ERROR(WaitOrAbort(comm, comm.DenseRecv(&header, sizeof(header), source, kStateTag)));
    if (header.magic != kStateMagic || header.raw_bytes != state_bytes_ ||
        header.wire_bytes > std::max<uint64_t>(ZSTD_compressBound(state_bytes_), state_bytes_) ||
        header.hash != hash) {
      return absl::DataLossError(absl::StrCat("ElasticGroup: bad shared-state header from rank ",
                                              source));
    }
    std::string body(header.wire_bytes, '\0');
    LBCC_RETURN_IF_ERROR(
        WaitOrAbort(comm, comm.DenseRecv(body.data(), body.size(), source, kStateTag)));
    std::string raw;
    if (header.compressed) {
      raw.resize(header.raw_bytes);
      const size_t n = ZSTD_decompress(raw.data(), raw.size(), body.data(), body.size());
      if (ZSTD_isError(n) || n != raw.size()) {
        return absl::DataLossError(absl::StrCat(
            "ElasticGroup: the shared state from rank ", source, " does not decompress"));
      }
    } else {
      raw.swap(body);
    }
    const uint64_t got = XXH3_64bits(raw.data(), raw.size());
    if (got != hash) {
      return absl::DataLossError(absl::StrFormat(
          "ElasticGroup: the shared state from rank %d hashes to %016x, every member's is %016x",
          source, got, hash));
    }
    size_t at = 0;
    for (const TensorView& t : shared_) {
      std::memcpy(t.data(), raw.data() + at, t.num_bytes());
      at += t.num_bytes();
    }
    return sizeof(header) + header.wire_bytes;
  }

  ElasticOptions options_;
  const std::vector<TensorView> shared_;
  uint64_t state_bytes_ = 0;
  absl::Duration peer_timeout_;
  absl::Duration setup_timeout_;
  std::unique_ptr<Socket> sock_;
  std::thread reader_, heartbeat_;

  Mutex mu_;
  bool left_ ABSL_GUARDED_BY(mu_) = false;
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;  // after Leave(): the master closed
  bool in_phase_ ABSL_GUARDED_BY(mu_) = false;  // an operation runs on comm_ (BeginPhase)
  // Aborted while a phase ran on them: their control connections close when it ends.
  std::vector<std::shared_ptr<Communicator>> close_after_phase_ ABSL_GUARDED_BY(mu_);
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_);
  EpochInfo info_ ABSL_GUARDED_BY(mu_);   // the newest epoch announced
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;  // committed outer steps of the job
  uint64_t expect_after_ ABSL_GUARDED_BY(mu_) = 0;  // a decision announced a newer epoch
  uint64_t entered_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // the newest epoch told to the master
  std::optional<Held> held_ ABSL_GUARDED_BY(mu_);
  bool held_forwarding_ ABSL_GUARDED_BY(mu_) = false;  // held_ is to be forwarded
  std::shared_ptr<Communicator> comm_ ABSL_GUARDED_BY(mu_);
  uint64_t comm_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status setup_status_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<uint64_t, int, uint64_t>, Message> decisions_ ABSL_GUARDED_BY(mu_);
  ElasticStats stats_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<ElasticGroup>> ElasticGroup::Join(
    ElasticOptions options, std::vector<TensorView> shared_state) {
  auto impl = std::make_shared<Impl>(std::move(options), std::move(shared_state));
  if (absl::Status s = impl->Join(); !s.ok()) {
    (void)impl->Leave();  // stops the threads Join started
    return s;
  }
  return std::unique_ptr<ElasticGroup>(new ElasticGroup(std::move(impl)));
}

ElasticGroup::ElasticGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
ElasticGroup::~ElasticGroup() { (void)impl_->Leave(); }
absl::Status ElasticGroup::Boundary() { return impl_->Boundary(); }
absl::Status ElasticGroup::SparseAllReduce(const std::vector<Communicator::SparseTensor>& tensors,
                                           const codecs::Codec* codec,
                                           codecs::DecodeOptions decode) {
  return impl_->SparseAllReduce(tensors, codec, decode);
}
absl::Status ElasticGroup::Leave() { return impl_->Leave(); }
uint64_t ElasticGroup::epoch() const { return impl_->epoch(); }
bool ElasticGroup::AwaitEpoch(uint64_t n, absl::Duration timeout) const {
  return impl_->AwaitEpoch(n, timeout);
}
int ElasticGroup::rank() const { return impl_->rank(); }
int ElasticGroup::size() const { return impl_->size(); }
uint64_t ElasticGroup::step() const { return impl_->step(); }
ElasticStats ElasticGroup::stats() const { return impl_->stats(); }
std::shared_ptr<Communicator> ElasticGroup::communicator() const { return impl_->communicator(); }

}  // namespace lbcc::comm
