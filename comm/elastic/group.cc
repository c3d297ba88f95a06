// ElasticGroup (elastic.h): joining, leaving and the master's messages. Epoch building is in
// group_epochs.cc, the elastic step in group_step.cc (group_impl.h has the map).
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "comm/config.h"
#include "comm/elastic/background.h"
#include "comm/elastic/group_impl.h"
#include "comm/fabric.h"

namespace lbcc::comm {

using elastic::Message;
using elastic::MsgType;
using elastic::Phase;

namespace {
// The mark of IsReplicaLeft's status: its message's start (not a status payload: payloads are
// absl::Cord, whose thread-local sampling state would leak into liblbcc.so's dynamic symbols).
constexpr char kReplicaLeftPrefix[] = "ElasticGroup: pipeline replica left the group: ";
}  // namespace

bool IsRetryable(const absl::Status& status) { return absl::IsAborted(status); }

bool IsReplicaLeft(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         absl::StartsWith(status.message(), kReplicaLeftPrefix);
}

ElasticGroup::Impl::Impl(ElasticOptions options, std::vector<TensorView> shared)
    : options_(std::move(options)), state_(std::move(shared), options_.op_timeout) {}

ElasticGroup::Impl::~Impl() { (void)Leave(); }

absl::Status ElasticGroup::Impl::CheckOptions() const {
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
  return state_.Check();
}

absl::Status ElasticGroup::Impl::Join() {
  if (options_.master_address.empty()) {
    LBCC_ASSIGN_OR_RETURN(options_.master_address, env::GetString("LBCC_MASTER_ADDR"));
  }
  if (options_.master_address.empty()) {
    return absl::InvalidArgumentError(
        "ElasticGroup: no master address (ElasticOptions.master_address or LBCC_MASTER_ADDR)");
  }
  LBCC_RETURN_IF_ERROR(CheckOptions());
  {
    // A transport this process cannot create at all (UCX not loadable) would fail every epoch's
    // set-up on every such member, and the master would hand out new epochs for ever.
    LBCC_ASSIGN_OR_RETURN(const CommConfig resolved, ResolveConfig(options_.comm_config));
    const std::string backend = resolved.backend.value_or("ucx");
    if (absl::Status s = BackendAvailable(backend); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("ElasticGroup: the ", backend,
                                                 " transport: ", s.message()));
    }
  }
  if (options_.name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    options_.name = absl::StrCat(host, ":", getpid());
  }
  LBCC_ASSIGN_OR_RETURN(peer_timeout_, elastic::ResolvePeerTimeout(options_.peer_timeout));
  setup_timeout_ = options_.comm_config.timeout.value_or(peer_timeout_ + absl::Seconds(5));
  options_.comm_config.timeout = setup_timeout_;
  const absl::Time deadline = absl::Now() + options_.join_timeout;
  Message join, welcome;
  join.type = MsgType::kJoin;
  join.job_id = options_.job_id;
  join.name = options_.name;
  join.state_step = options_.state_step;
  join.replica = options_.replica;
  join.stage = static_cast<uint32_t>(options_.stage);
  join.replica_stages = static_cast<uint32_t>(options_.replica_stages);
  LBCC_ASSIGN_OR_RETURN(link_, elastic::MasterLink::Connect(
                                   options_.master_address, join,
                                   std::min(deadline, absl::Now() + setup_timeout_),
                                   setup_timeout_, &welcome));
  {
    MutexLock lock(&mu_);
    step_ = welcome.step;
  }
  link_->Start(this, peer_timeout_);
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

// The others may still be finishing the step this member committed last: leaving now would
// announce the new epoch while a phase runs on their communicator, which must then be aborted
// instead of derived from (a fresh epoch: bootstrap and connections). The master's decision on
// that step means every other member reported it (its exchange is over there), so the
// departure finds them between phases. Bounded by the peer timeout (a member that stopped
// answering is dropped by then).
void ElasticGroup::Impl::AwaitLastDecisionLocked() {
  if (!held_.has_value() || held_forwarding_ || !fatal_.ok()) return;
  const DecisionKey key = Key(held_->epoch, Phase::kStep, held_->step);
  mu_.AwaitWithTimeout(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !fatal_.ok() || decisions_.count(key) > 0;
      },
      peer_timeout_);
}

absl::Status ElasticGroup::Impl::Leave() {
  {
    MutexLock lock(&mu_);
    if (left_) return absl::OkStatus();
    AwaitLastDecisionLocked();
    left_ = true;
    if (link_ != nullptr) link_->StopHeartbeats();
    CancelSetupLocked(absl::CancelledError(
        absl::StrCat("ElasticGroup ", options_.name, ": left the group")));
  }
  if (link_ != nullptr) {
    Message leave;
    leave.type = MsgType::kLeave;
    if (link_->Send(leave, absl::Seconds(1)).ok() && link_->started()) {
      // The master closes the connection once it took the leave; reading to its end first
      // leaves nothing unread, so closing sends no reset that could drop the last report.
      MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(
          [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reader_done_ || !fatal_.ok(); },
          absl::Seconds(1));
    }
    link_->Shutdown();
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
  if (link_ != nullptr) link_->Join();
  MutexLock lock(&mu_);
  comm_.reset();  // closes on a thread of its own (Adopt)
  return absl::OkStatus();
}

// Fails the group for good (the master is lost, or it evicted or refused us).
void ElasticGroup::Impl::FailLocked(absl::Status why) {
  if (!fatal_.ok() || left_) return;
  LBCC_LOG(WARN) << "ElasticGroup " << options_.name << ": " << why;
  if (link_ != nullptr) link_->StopHeartbeats();
  CancelSetupLocked(absl::CancelledError(absl::StrCat(
      "ElasticGroup ", options_.name, ": the group failed (", why.message(), ")")));
  fatal_ = std::move(why);
  // Out of the group, this member has no outcome left to agree on: its control connections
  // close too, even inside a phase, so that its own call ends now (not when its peers' votes
  // come, or their connections close) and its peers see it gone at once.
  if (comm_) elastic::AbortSoon(comm_, /*control=*/true);
}

absl::Status ElasticGroup::Impl::MasterLost(absl::string_view how) const {
  return absl::UnavailableError(absl::StrCat(
      "ElasticGroup: the membership service (lbcc-master) at ", options_.master_address, " ",
      how));
}

bool ElasticGroup::Impl::OnMessage(const Message& m) {
  MutexLock lock(&mu_);
  if (left_) return true;  // read to the end (Leave)
  switch (m.type) {
    case MsgType::kEpoch:
      return OnEpochLocked(m);
    case MsgType::kDecision:
      OnDecisionLocked(m);
      return true;
    case MsgType::kRefuse:
      FailLocked(absl::Status(static_cast<absl::StatusCode>(m.code), m.text));
      return false;
    case MsgType::kEvicted:
      if (m.replica_left) {
        FailLocked(absl::FailedPreconditionError(
            absl::StrCat(kReplicaLeftPrefix, m.text,
                         "; Join again: the replica is admitted once all its stages are back")));
        return false;
      }
      FailLocked(absl::FailedPreconditionError(absl::StrCat(
          "ElasticGroup: evicted by the membership service: ", m.text,
          "; the group went on without this member (Join again)")));
      return false;
    default:
      return true;
  }
}

void ElasticGroup::Impl::OnClosed(const absl::Status& why) {
  MutexLock lock(&mu_);
  if (left_) {
    reader_done_ = true;
    return;
  }
  FailLocked(MasterLost(absl::StrCat("is lost: ", why.message())));
}

void ElasticGroup::Impl::OnSilent(absl::Duration silent) {
  MutexLock lock(&mu_);
  FailLocked(
      MasterLost(absl::StrCat("was silent for ", absl::ToInt64Milliseconds(silent), " ms")));
}

uint64_t ElasticGroup::Impl::epoch() {
  MutexLock lock(&mu_);
  return info_.epoch;
}

bool ElasticGroup::Impl::AwaitEpoch(uint64_t n, absl::Duration timeout) {
  MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
             [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return info_.epoch >= n || !fatal_.ok(); },
             timeout) &&
         info_.epoch >= n;
}

int ElasticGroup::Impl::rank() {
  MutexLock lock(&mu_);
  return info_.rank;
}

int ElasticGroup::Impl::size() {
  MutexLock lock(&mu_);
  return info_.nranks;
}

uint64_t ElasticGroup::Impl::step() {
  MutexLock lock(&mu_);
  return step_;
}

ElasticStats ElasticGroup::Impl::stats() {
  MutexLock lock(&mu_);
  ElasticStats s = stats_;
  s.state_bytes = state_.bytes();
  return s;
}

std::shared_ptr<Communicator> ElasticGroup::Impl::communicator() {
  MutexLock lock(&mu_);
  return comm_epoch_ == info_.epoch ? comm_ : nullptr;
}

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
