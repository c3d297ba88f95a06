// ElasticGroup (elastic.h): the elastic step. The caller's thread acquires the newest epoch's
// communicator (after the master's decision on the step this member committed last, running
// the epoch's forward phase first if it has one), runs a phase on it, reports the local outcome
// to the master and, for a sync or forward phase, waits for the decision. A step commits at
// once where its exchange succeeded (the decision is awaited before the next phase); where it
// failed, the master's decision says whether the result is forwarded or the step rolled back.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "comm/elastic/background.h"
#include "comm/elastic/group_impl.h"

namespace lbcc::comm {

using elastic::DeferredState;
using elastic::Message;
using elastic::MsgType;
using elastic::Phase;

namespace {

bool IsCallerError(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsDataLoss(s) || absl::IsUnimplemented(s);
}

absl::Status LeftError() {
  return absl::FailedPreconditionError("ElasticGroup: this member left the group");
}

// Applies (or drops) the held-back updates; the first error.
absl::Status FinishAll(std::vector<std::unique_ptr<DeferredState>>& states, bool commit) {
  absl::Status first;
  for (auto& s : states) {
    absl::Status f = s->Finish(commit);
    if (first.ok()) first = f;
  }
  return first;
}

}  // namespace

absl::Status ElasticGroup::Impl::Boundary() {
  LBCC_ASSIGN_OR_RETURN(Acquired a, Acquire());
  if (a.info.needs_state.empty()) return absl::OkStatus();  // nobody to bring up to date
  return RunPhase(a, Phase::kSync, [&]() -> absl::Status {
    LBCC_ASSIGN_OR_RETURN(const elastic::StateTraffic traffic,
                          state_.Sync(*a.comm, a.info.rank, a.info.needs_state));
    MutexLock lock(&mu_);
    stats_.state_bytes_sent = traffic.sent;
    stats_.state_bytes_received = traffic.received;
    return absl::OkStatus();
  });
}

absl::Status ElasticGroup::Impl::SparseAllReduce(
    const std::vector<Communicator::SparseTensor>& tensors, const codecs::Codec* codec,
    codecs::DecodeOptions decode) {
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
  elastic::DeferringCodec deferring(*codec);
  OpOptions op = Communicator::BulkOptions();
  op.timeout = options_.op_timeout;
  const absl::Time started = absl::Now();
  LBCC_RETURN_IF_ERROR(BeginPhase(a));
  const absl::Status local = a.comm->SparseAllReduce(wrapped, &deferring, decode, op)->Wait();
  EndPhase();
  Report(a, Phase::kStep, a.step, local);
  LBCC_LOG(TRACE) << "ElasticGroup " << options_.name << ": epoch " << a.info.epoch << " step "
                  << a.step << " exchange " << absl::ToDoubleMilliseconds(absl::Now() - started)
                  << " ms: " << (local.ok() ? "committed" : local.ToString());
  if (!local.ok()) return FailedStep(a, wrapped, local, states);
  // Committed at once; the master's decision is awaited before the next phase (Acquire), and
  // this member remembers where the result is in case a member whose exchange failed needs
  // it: the caller leaves `out` as it is until its next call (elastic.h), and the forward
  // phase runs at the start of that call, so the steady state copies nothing.
  Held held{a.info.epoch, a.step, {}};
  for (const auto& t : tensors) held.out.push_back(t.out);
  const absl::Status committed = FinishAll(states, true);
  MutexLock lock(&mu_);
  held_ = std::move(held);
  held_forwarding_ = false;
  step_ = std::max(step_, a.step + 1);
  stats_.committed_epoch = a.info.epoch;
  return committed;
}

// The exchange failed here: the master decides once every member of the epoch is accounted for
// (a member that committed may forward the result: then this call succeeds after all).
absl::Status ElasticGroup::Impl::FailedStep(
    const Acquired& a, const std::vector<Communicator::SparseTensor>& wrapped,
    const absl::Status& local, std::vector<std::unique_ptr<DeferredState>>& states) {
  const DecisionKey key = Key(a.info.epoch, Phase::kStep, a.step);
  Message decision;
  absl::Status fatal;
  {
    MutexLock lock(&mu_);
    const bool decided = AwaitDecisionLocked(key, a.info.epoch, Phase::kStep, a.step, false);
    if (left_) {
      fatal = LeftError();
    } else if (!fatal_.ok()) {
      fatal = fatal_;
    } else if (decided) {
      decision = decisions_[key];
    }
  }
  if (fatal.ok() && decision.forward) {
    ForwardTarget target{a.info.epoch, a.step, &wrapped, false};
    absl::StatusOr<Acquired> forwarded = Acquire(&target);
    if (target.done) {
      LBCC_RETURN_IF_ERROR(FinishAll(states, true));
      MutexLock lock(&mu_);
      stats_.committed_epoch = a.info.epoch;
      return absl::OkStatus();
    }
    fatal = forwarded.ok() ? absl::AbortedError("ElasticGroup: step not forwarded")
                           : forwarded.status();
    if (IsRetryable(fatal)) fatal = absl::OkStatus();  // rolled back: as an abort below
  }
  (void)FinishAll(states, false);
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

// Waits for the master's decision of the step this member committed last: committed (forget
// it), to be forwarded (kept until the forward phase ran), or rolled back (fatal: this member
// applied it).
absl::Status ElasticGroup::Impl::SettleHeldLocked(absl::Time deadline, absl::Duration limit) {
  if (!held_.has_value() || held_forwarding_) return absl::OkStatus();
  const DecisionKey key = Key(held_->epoch, Phase::kStep, held_->step);
  const absl::Time wait_start = absl::Now();
  const bool waited = decisions_.count(key) == 0;
  const bool got = mu_.AwaitWithDeadline(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return left_ || !fatal_.ok() || decisions_.count(key) > 0;
      },
      deadline);
  if (left_) return LeftError();
  if (!fatal_.ok()) return fatal_;
  if (waited) {
    ++stats_.decision_waits;
    stats_.decision_wait += absl::Now() - wait_start;
  }
  if (!got) {
    return absl::DeadlineExceededError(absl::StrCat("ElasticGroup: no decision on step ",
                                                    held_->step, " within ",
                                                    absl::FormatDuration(limit)));
  }
  const Message& d = decisions_[key];
  if (d.ok) {
    held_.reset();
    decisions_.erase(decisions_.begin(), decisions_.upper_bound(key));
  } else if (d.forward) {
    held_forwarding_ = true;  // kept until the forward phase ran
  } else {
    FailLocked(absl::DataLossError(absl::StrCat("ElasticGroup: the job rolled back step ",
                                                held_->step, ", which this member had committed: ",
                                                d.text)));
    return fatal_;
  }
  return absl::OkStatus();
}

// Acquire's wait under mu_: the held step settled, then the newest epoch's communicator.
absl::Status ElasticGroup::Impl::TakeEpochLocked(ForwardTarget* target, Acquired* a, bool* enter,
                                                 bool* forward) {
  const absl::Duration limit = setup_timeout_ + options_.op_timeout;
  const absl::Time deadline = absl::Now() + limit;
  LBCC_RETURN_IF_ERROR(SettleHeldLocked(deadline, limit));
  if (target != nullptr) {
    auto it = decisions_.find(Key(target->epoch, Phase::kStep, target->step));
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
  if (left_) return LeftError();
  if (!fatal_.ok()) return fatal_;
  if (!ready) {
    return absl::DeadlineExceededError(absl::StrCat(
        "ElasticGroup: no usable epoch within ", absl::FormatDuration(limit), " (epoch ",
        info_.epoch, ": ", setup_status_.ToString(), ")"));
  }
  if (info_.epoch != entered_epoch_) {
    entered_epoch_ = info_.epoch;
    *enter = true;
  }
  if (held_forwarding_ && !info_.forward) {
    held_.reset();  // every member that needed it is gone
    held_forwarding_ = false;
  }
  *forward = info_.forward &&
             decisions_.count(Key(info_.epoch, Phase::kForward, info_.forward_step)) == 0;
  *a = Acquired{comm_, info_, step_};
  return absl::OkStatus();
}

// Waits for the master's decision of the step this member committed last, then for the newest
// epoch's communicator, and first runs the epoch's forward phase if it has one. `target`: the
// call of a step that failed here and is to receive its result.
absl::StatusOr<ElasticGroup::Impl::Acquired> ElasticGroup::Impl::Acquire(ForwardTarget* target) {
  while (true) {
    Acquired a;
    bool enter = false, forward = false;
    {
      MutexLock lock(&mu_);
      LBCC_RETURN_IF_ERROR(TakeEpochLocked(target, &a, &enter, &forward));
    }
    if (enter) {
      // Tells the master this member takes part in no older exchange.
      Message m;
      m.type = MsgType::kEnter;
      m.epoch = a.info.epoch;
      (void)link_->Send(m, absl::Seconds(5));
    }
    if (!forward) {
      if (target != nullptr) return absl::AbortedError("ElasticGroup: the step was not forwarded");
      return a;
    }
    Acquired f = a;
    f.step = a.info.forward_step;
    const absl::Status s = RunPhase(f, Phase::kForward, [&] { return ForwardStep(f, target); });
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

// The forward phase: the source sends the result of the step to every member whose exchange
// of it failed (XXH3-checked); the others take part with nothing to do.
absl::Status ElasticGroup::Impl::ForwardStep(const Acquired& a, ForwardTarget* target) {
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
    return elastic::SendResult(*a.comm, out, to, options_.op_timeout);
  }
  if (std::find(to.begin(), to.end(), static_cast<uint32_t>(rank)) == to.end()) {
    return absl::OkStatus();
  }
  if (target == nullptr || target->step != a.info.forward_step) {
    return absl::InternalError(absl::StrCat("ElasticGroup: step ", a.info.forward_step,
                                            " is forwarded to this member, which is not in it"));
  }
  std::vector<TensorView> outs;
  for (const auto& t : *target->tensors) outs.push_back(t.out);
  return elastic::ReceiveResult(*a.comm, a.info.forward_source, a.info.forward_step, outs,
                                options_.op_timeout);
}

// Marks the acquired epoch's communicator busy (a newer epoch must abort it, not derive from
// it); Aborted when the epoch changed since Acquire (nothing ran: retry).
absl::Status ElasticGroup::Impl::BeginPhase(const Acquired& a) {
  MutexLock lock(&mu_);
  if (info_.epoch != a.info.epoch) {
    return absl::AbortedError(absl::StrCat("membership changed: ", info_.reason));
  }
  in_phase_ = true;
  return absl::OkStatus();
}

void ElasticGroup::Impl::EndPhase() {
  MutexLock lock(&mu_);
  in_phase_ = false;
  for (auto& comm : close_after_phase_) elastic::AbortSoon(std::move(comm), /*control=*/true);
  close_after_phase_.clear();
}

// Waits for the master's decision on `key` (or this member leaving or failing; with
// `or_new_epoch`, a newer epoch). The master decides once every member of the epoch is accounted
// for, and a member held inside another group's call (a trainer stepping its model's shard
// groups one after the other) never is: bounded by the set-up and operation timeouts, after
// which this member fails out of the group (DeadlineExceeded: Join again), so that the master
// drops it and decides without it. True when the decision is there.
bool ElasticGroup::Impl::AwaitDecisionLocked(const DecisionKey& key, uint64_t epoch, Phase phase,
                                             uint64_t step, bool or_new_epoch) {
  const absl::Duration limit = setup_timeout_ + options_.op_timeout;
  const bool done = mu_.AwaitWithTimeout(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return left_ || !fatal_.ok() || decisions_.count(key) > 0 ||
               (or_new_epoch && info_.epoch > epoch);
      },
      limit);
  if (!done) {
    FailLocked(absl::DeadlineExceededError(absl::StrCat(
        "ElasticGroup: no decision on ", phase == Phase::kStep ? "step " : "the phase of step ",
        step, " of epoch ", epoch, " within ", absl::FormatDuration(limit),
        " (a member of the epoch neither reported nor left: one held in another group's call "
        "cannot); this member left the group: Join again")));
  }
  return decisions_.count(key) > 0;
}

void ElasticGroup::Impl::Report(const Acquired& a, Phase phase, uint64_t step,
                                const absl::Status& local) {
  Message report;
  report.type = MsgType::kReport;
  report.epoch = a.info.epoch;
  report.step = step;
  report.phase = phase;
  report.ok = local.ok();
  report.broken = !a.comm->status().ok();
  report.code = static_cast<uint32_t>(local.code());
  report.text = std::string(local.message());
  (void)link_->Send(report, absl::Seconds(5));  // a lost master shows later
}

// Runs one sync or forward phase in the acquired epoch and waits for the master's decision.
template <typename Body>
absl::Status ElasticGroup::Impl::RunPhase(const Acquired& a, Phase phase, Body body) {
  const absl::Time started = absl::Now();
  LBCC_RETURN_IF_ERROR(BeginPhase(a));
  const absl::Status local = body();
  EndPhase();
  const absl::Duration ran = absl::Now() - started;
  Report(a, phase, a.step, local);
  return AwaitPhaseDecision(a, phase, local, ran);
}

absl::Status ElasticGroup::Impl::AwaitPhaseDecision(const Acquired& a, Phase phase,
                                                    const absl::Status& local,
                                                    absl::Duration ran) {
  const absl::Time reported = absl::Now();
  Message decision;
  bool decided = false;
  std::string changed;
  absl::Status fatal;
  {
    MutexLock lock(&mu_);
    const DecisionKey key = Key(a.info.epoch, phase, a.step);
    (void)AwaitDecisionLocked(key, a.info.epoch, phase, a.step, true);
    if (decisions_.count(key)) {
      decided = true;
      decision = decisions_[key];
      decisions_.erase(decisions_.begin(), decisions_.upper_bound(key));
    } else if (left_) {
      fatal = LeftError();
    } else if (!fatal_.ok()) {
      fatal = fatal_;
    } else {
      changed = absl::StrCat("membership changed: ", info_.reason);
    }
    LBCC_LOG(TRACE) << "ElasticGroup " << options_.name << ": epoch " << a.info.epoch << " step "
                    << a.step << (phase == Phase::kSync ? " sync " : " forward ")
                    << absl::ToDoubleMilliseconds(ran) << " ms, decision after "
                    << absl::ToDoubleMilliseconds(absl::Now() - reported) << " ms";
    if (!(decided && decision.ok)) ++stats_.aborted_calls;
    if (decided && decision.ok) stats_.committed_epoch = a.info.epoch;
  }
  if (decided && decision.ok) return absl::OkStatus();
  if (!fatal.ok()) return fatal;
  if (!decided) return absl::AbortedError(changed);
  if (!local.ok() && IsCallerError(local)) return local;
  return absl::AbortedError(absl::StrCat("elastic phase aborted in epoch ", a.info.epoch, ": ",
                                         decision.text));
}

}  // namespace lbcc::comm
