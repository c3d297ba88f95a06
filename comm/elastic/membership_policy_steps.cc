// MembershipPolicy (membership_policy.h): the members' reports and the master's decisions.
//
// A sync or forward phase is decided once every member of the current epoch reported. A step's
// exchange (docs/elastic.md, "Deciding off the critical path") is decided once every member of
// the step's epoch is accounted for (reported, gone, or working in a later epoch or step
// without having taken part), even after the epoch moved on: commit, forward (some failed: they
// get the result from one that committed) or abort (nobody alive committed).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/elastic/membership_policy.h"

namespace lbcc::comm::elastic {

namespace {
// Member lists of this many past epochs are kept for late reports of their exchanges.
constexpr uint64_t kKeptEpochs = 64;
}  // namespace

void MembershipPolicy::OnReport(Conn& conn, const Message& m) {
  conn.last = std::max(conn.last, std::make_pair(m.epoch, m.phase == Phase::kStep ? m.step : 0));
  if (m.phase == Phase::kStep) return OnStepReport(conn, m);
  if (m.epoch != epoch_ || !IsMember(conn.id)) return;  // a phase of an older epoch
  reports_[conn.id] = Report{m.phase, m.step, m.ok, m.broken, m.code, m.text};
  if (reports_.size() < members_.size()) return;
  DecidePhase();
}

// Every member of the epoch reported its sync or forward phase.
void MembershipPolicy::DecidePhase() {
  const Report first = reports_.begin()->second;  // a copy: reports_ is cleared below
  bool all_ok = true, broken = false;
  std::string why;
  for (size_t r = 0; r < members_.size(); ++r) {
    const Report& rep = reports_[members_[r]];
    if (rep.phase != first.phase || rep.step != first.step) {
      all_ok = false;
      if (why.empty()) {
        why = absl::StrCat("members disagree on the phase: rank ", r, " is at step ", rep.step,
                           ", another at step ", first.step);
      }
    }
    if (!rep.ok) {
      all_ok = false;
      if (why.empty()) {
        why = absl::StrCat("rank ", r, " (", conns_.at(members_[r])->name, "): ", rep.text);
      }
    }
    broken |= rep.broken;
  }
  reports_.clear();
  Message d;
  d.type = MsgType::kDecision;
  d.epoch = epoch_;
  d.step = first.step;
  d.phase = first.phase;
  d.ok = all_ok;
  const bool forwarded = all_ok && first.phase == Phase::kForward && forward_;
  const bool admit = forwarded && Admissible(std::max(step_, forward_->step + 1));
  // A failed forward is retried in a new epoch (another source); a failed sync when the
  // communicator broke.
  const bool again = !all_ok && (broken || first.phase == Phase::kForward);
  d.broken = admit || again;
  d.next_epoch = epoch_ + 1;
  d.text = why;
  for (uint64_t id : members_) Send(id, d);
  if (all_ok) {
    for (uint64_t id : members_) conns_.at(id)->synced = true;
    if (forwarded) {
      step_ = std::max(step_, forward_->step + 1);
      commit_epoch_ = std::max(commit_epoch_, epoch_);  // every live member has it now
      forward_.reset();
    }
    if (admit) Admit();
  } else if (again) {
    NewEpoch(members_, first.phase == Phase::kForward
                           ? absl::StrCat("forwarding step ", first.step, " failed: ", why)
                           : absl::StrCat("the communicator failed: ", why));
  }
}

void MembershipPolicy::OnStepReport(Conn& conn, const Message& m) {
  auto members = epoch_members_.find(m.epoch);
  if (members == epoch_members_.end()) return;
  const std::vector<uint64_t>& ids = members->second;
  if (std::find(ids.begin(), ids.end(), conn.id) == ids.end()) return;
  const auto key = std::make_pair(m.epoch, m.step);
  // Any other open exchange this member did not report: it did not take part.
  for (auto& [k, open] : open_) {
    if (k != key && k.first <= m.epoch && !open.reports.count(conn.id) &&
        std::find(open.members.begin(), open.members.end(), conn.id) != open.members.end()) {
      open.reports[conn.id] = Report{Phase::kStep, k.second, false, false, 0,
                                     absl::StrCat("it is at step ", m.step, " of epoch ", m.epoch)};
    }
  }
  Open& open = open_[key];
  if (open.members.empty()) open.members = ids;
  open.reports[conn.id] = Report{m.phase, m.step, m.ok, m.broken, m.code, m.text};
  TryDecideSteps();
}

// kEnter: the member works in `epoch` now; it did not take part in older open exchanges.
void MembershipPolicy::OnEnter(Conn& conn, uint64_t epoch) {
  conn.last = std::max(conn.last, std::make_pair(epoch, uint64_t{0}));
  for (auto& [k, open] : open_) {
    if (k.first < epoch && !open.reports.count(conn.id) &&
        std::find(open.members.begin(), open.members.end(), conn.id) != open.members.end()) {
      open.reports[conn.id] =
          Report{Phase::kStep, k.second, false, false, 0,
                 absl::StrCat("it did not take part (it works in epoch ", epoch, ")")};
    }
  }
  TryDecideSteps();
}

// A complete exchange's reports: who committed (sources), who failed and is still here to
// receive the result (receivers), and the first failure.
MembershipPolicy::StepOutcome MembershipPolicy::Tally(const Open& open) {
  StepOutcome out;
  for (size_t r = 0; r < open.members.size(); ++r) {
    const uint64_t id = open.members[r];
    auto rep = open.reports.find(id);
    if (rep == open.reports.end()) {
      out.all_ok = false;
      if (out.why.empty()) out.why = absl::StrCat("rank ", r, " left before it reported");
      continue;
    }
    out.broken |= rep->second.broken;
    if (rep->second.ok) {
      if (Live(id)) out.sources.push_back(id);
      continue;
    }
    out.all_ok = false;
    if (Live(id) && rep->second.code != 0) out.receivers.push_back(id);
    if (out.why.empty()) {
      out.why = absl::StrCat("rank ", r, " (", Live(id) ? conns_.at(id)->name : "gone", "): ",
                             rep->second.text);
    }
  }
  return out;
}

void MembershipPolicy::TryDecideSteps() {
  for (auto it = open_.begin(); it != open_.end();) {
    Open& open = it->second;
    // A member already past this exchange (an exchange opened after it moved on).
    for (uint64_t id : open.members) {
      if (!open.reports.count(id) && Live(id) && conns_.at(id)->last > it->first) {
        open.reports[id] = Report{Phase::kStep, it->first.second, false, false, 0,
                                  "it did not take part (it works in a later epoch or step)"};
      }
    }
    bool complete = true;
    for (uint64_t id : open.members) complete &= open.reports.count(id) > 0 || !Live(id);
    if (!complete) {
      ++it;
      continue;
    }
    const auto [epoch, step] = it->first;
    const StepOutcome outcome = Tally(open);
    const std::vector<uint64_t> told = open.members;
    open_.erase(it);
    DecideStep(epoch, step, told, outcome);
    it = open_.begin();  // decisions may have changed the map
  }
  // Members of epochs no open exchange needs any more.
  uint64_t keep = epoch_ > kKeptEpochs ? epoch_ - kKeptEpochs : 0;
  for (const auto& [k, open] : open_) keep = std::min(keep, k.first);
  epoch_members_.erase(epoch_members_.begin(), epoch_members_.lower_bound(keep));
}

void MembershipPolicy::DecideStep(uint64_t epoch, uint64_t step,
                                  const std::vector<uint64_t>& told, const StepOutcome& o) {
  // Every live member has the step when only members that are gone failed it.
  const bool committed = o.all_ok || (!o.sources.empty() && o.receivers.empty());
  const bool forward = !o.all_ok && !o.sources.empty() && !o.receivers.empty();
  const bool admit =
      o.all_ok && epoch == epoch_ && !forward_ && Admissible(std::max(step_, step + 1));
  Message d;
  d.type = MsgType::kDecision;
  d.epoch = epoch;
  d.step = step;
  d.phase = Phase::kStep;
  d.ok = committed;
  d.text = o.why;
  d.forward = forward;
  d.broken = admit || forward || (!o.all_ok && o.broken && epoch == epoch_);
  d.next_epoch = epoch_ + 1;
  for (uint64_t id : told) Send(id, d);
  if (committed) {
    for (uint64_t id : told) {
      if (Live(id)) conns_.at(id)->synced = true;
    }
    step_ = std::max(step_, step + 1);
    commit_epoch_ = std::max(commit_epoch_, epoch);
    pair_failures_.clear();  // the links work: earlier set-up failures no longer count
    named_by_.clear();
    if (admit) Admit();
  } else if (forward) {
    forward_ = Forward{epoch, step, o.sources, o.receivers};
    NewEpoch(members_, absl::StrCat("step ", step, " failed on some members only (", o.why,
                                    "): they receive its result"));
  } else if (d.broken) {
    NewEpoch(members_, absl::StrCat("the communicator failed: ", o.why));
  }
}

}  // namespace lbcc::comm::elastic
