// ElasticGroup (elastic.h): epoch building. Every epoch the master announces gets its
// Communicator on a thread of its own, as soon as it is announced (so set-up overlaps the
// trainer's inner steps): derived from the previous epoch's (Communicator::Subgroup) after
// departures when no phase runs on it, else built anew (Communicator::Init on the epoch's
// bootstrap root). A superseded epoch's communicator is retired (aborted, then destroyed off
// the callers' threads).
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "comm/elastic/background.h"
#include "comm/elastic/group_impl.h"
#include "comm/fabric.h"

namespace lbcc::comm {

using elastic::Message;
using elastic::MsgType;
using elastic::Phase;

bool ElasticGroup::Impl::OnEpochLocked(const Message& m) {
  if (m.epoch <= info_.epoch) return true;
  EpochInfo info;
  info.epoch = m.epoch;
  info.rank = static_cast<int>(m.rank);
  info.nranks = static_cast<int>(m.nranks);
  if (m.unique_id.size() != sizeof(info.id.internal)) {
    FailLocked(absl::DataLossError("ElasticGroup: the master sent a malformed epoch"));
    return false;
  }
  std::memcpy(info.id.internal, m.unique_id.data(), sizeof(info.id.internal));
  info.needs_state = m.needs_state;
  info.names = m.names;
  info.reason = m.text;
  info.parent_epoch = m.parent_epoch;
  info.parent_ranks.assign(m.parent_ranks.begin(), m.parent_ranks.end());
  info.forward = m.forward;
  info.forward_step = m.forward_step;
  info.forward_source = static_cast<int>(m.forward_source);
  info.forward_to = m.forward_to;
  info_ = std::move(info);
  step_ = std::max(step_, m.step);
  ++stats_.epochs_seen;
  // Derived from the epoch this member holds, when no phase runs on it; else it is aborted (a
  // running operation must fail now) and the set-up reports that.
  std::shared_ptr<Communicator> parent;
  if (info_.parent_epoch != 0 && comm_ && comm_epoch_ == info_.parent_epoch && !in_phase_ &&
      comm_->status().ok()) {
    parent = comm_;
  } else if (comm_) {
    RetireLocked(comm_);
  }
  CancelSetupLocked(absl::CancelledError(absl::StrCat(
      "ElasticGroup ", options_.name, ": the set-up was superseded by epoch ", info_.epoch)));
  setup_cancel_ = std::make_shared<Cancellation>();
  elastic::Background::Start([self = shared_from_this(), info = info_, parent = std::move(parent),
                              cancel = setup_cancel_] { self->BuildEpoch(info, parent, cancel); });
  return true;
}

// On a thread of its own: cancelling shuts the set-up's transport down, which may take a
// moment (UCX finishes cancelled requests), and the caller holds the group's mutex.
void ElasticGroup::Impl::CancelSetupLocked(absl::Status why) {
  std::shared_ptr<Cancellation> cancel = std::move(setup_cancel_);
  if (cancel == nullptr || cancel->cancelled()) return;
  elastic::Background::Start(
      [cancel = std::move(cancel), why = std::move(why)] { cancel->Cancel(why); });
}

void ElasticGroup::Impl::OnDecisionLocked(const Message& m) {
  decisions_[Key(m.epoch, m.phase, m.step)] = m;
  // A committed transfer: every member of this epoch holds the state now.
  if (m.ok && m.phase == Phase::kSync && m.epoch == info_.epoch) info_.needs_state.clear();
  if (m.ok && m.phase != Phase::kSync) step_ = std::max(step_, m.step + 1);
  if (m.broken) expect_after_ = std::max(expect_after_, m.next_epoch - 1);
}

// Builds `info`'s communicator, on a thread of its own per epoch, so that a set-up never holds
// up the newer epoch's. An epoch superseded while its members meet (one left before joining
// its bootstrap, or before connecting) is cancelled (`cancel`, by OnEpochLocked): its set-up
// returns Cancelled at once instead of at the set-up timeout. The thread keeps the Impl alive.
void ElasticGroup::Impl::BuildEpoch(const EpochInfo& info,
                                    const std::shared_ptr<Communicator>& parent,
                                    const std::shared_ptr<Cancellation>& cancel) {
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      info.parent_epoch == 0
          ? Communicator::Init(info.id, info.nranks, info.rank, options_.comm_config, cancel)
      : parent != nullptr
          ? parent->Subgroup(info.parent_ranks, static_cast<uint32_t>(2 + info.epoch % 65534))
          : absl::StatusOr<std::unique_ptr<Communicator>>(absl::FailedPreconditionError(
                absl::StrCat("epoch ", info.parent_epoch, "'s communicator is not usable here "
                             "to derive epoch ", info.epoch, " from")));
  std::shared_ptr<Communicator> built;
  if (comm.ok()) built = elastic::Adopt(std::move(*comm));
  Message failed;
  failed.type = MsgType::kSetupFailed;
  failed.epoch = info.epoch;
  failed.text = comm.status().ToString();
  // The peer it could not connect to (a fresh epoch's ranks are the fabric's): the master
  // drops a member its peers cannot reach (MembershipPolicy, "blame").
  if (const std::optional<int> peer = FailedPeer(comm.status());
      peer.has_value() && info.parent_epoch == 0 && *peer < info.nranks) {
    failed.blame = static_cast<uint32_t>(*peer + 1);
  }
  std::shared_ptr<Communicator> old;
  bool superseded = false;
  {
    MutexLock lock(&mu_);
    if (info_.epoch != info.epoch || left_ || !fatal_.ok()) {  // superseded: drop it
      LBCC_LOG_IF(INFO, absl::IsCancelled(comm.status()))
          << "ElasticGroup " << options_.name << ": epoch " << info.epoch
          << "'s set-up stopped: " << comm.status().message();
      // A failure of its own still tells the master whom it could not reach.
      if (failed.blame == 0 || left_ || !fatal_.ok()) return;
      superseded = true;
    } else {
      if (setup_cancel_ == cancel) setup_cancel_.reset();
      old = std::move(comm_);
      comm_ = std::move(built);
      comm_epoch_ = info.epoch;
      setup_status_ = comm.status();
      if (comm.ok()) ++(info.parent_epoch != 0 ? stats_.derived_epochs : stats_.fresh_epochs);
    }
  }
  old.reset();
  if (superseded) {
    (void)link_->Send(failed, absl::Seconds(1));
  } else if (!comm.ok()) {
    LBCC_LOG(WARN) << "ElasticGroup " << options_.name << ": epoch " << info.epoch
                   << " set-up failed: " << comm.status();
    (void)link_->Send(failed, absl::Seconds(1));
  }
}

// Aborts a superseded communicator. While a phase runs on it, its control connections stay up
// until the phase ends (EndPhase): the phase's own outcome agreement may still complete over
// them (every payload was exchanged), and its vote reaches the peers.
void ElasticGroup::Impl::RetireLocked(std::shared_ptr<Communicator> comm) {
  if (in_phase_) close_after_phase_.push_back(comm);
  elastic::AbortSoon(std::move(comm), !in_phase_);
}

}  // namespace lbcc::comm
