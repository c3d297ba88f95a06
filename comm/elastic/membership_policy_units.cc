// MembershipPolicy (membership_policy.h): pipeline replicas as units. The stages of a replica
// are members of different jobs (one per model shard) whose policies share a UnitTable: a
// replica is admitted once every stage is back, at one outer step of every job, and a stage
// that leaves takes the whole replica out of every job.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "comm/elastic/membership_policy.h"

namespace lbcc::comm::elastic {

// A joined stage registers in its unit; a new incarnation of a stage whose old one the master
// has not dropped yet (it was stopped or cut off) replaces it: the old one is gone for its user
// and its replica leaves with it.
void MembershipPolicy::JoinUnit(Conn& conn, const Message& m) {
  conn.replica = m.replica;
  conn.stage = static_cast<int>(m.stage);
  conn.replica_stages = static_cast<int>(m.replica_stages);
  auto found = units_->units.find(m.replica);
  if (found != units_->units.end()) {
    auto old = found->second.present.find(conn.stage);
    if (old != found->second.present.end()) {
      const UnitTable::Stage gone = old->second;
      gone.policy->DropStage(gone.member, absl::StrCat("was replaced by ", conn.name));
    }
  }
  // Looked up after the drop, which erases a unit left with no stage.
  UnitTable::Unit& unit = units_->units[m.replica];
  unit.stages = static_cast<int>(m.replica_stages);
  unit.present[conn.stage] = UnitTable::Stage{this, conn.id, conn.name};
  ReleaseUnit(m.replica);
}

// Once every stage of `replica` is back, each becomes a newcomer of its job, to be admitted at
// one outer step: the first that every job with members can still reach.
void MembershipPolicy::ReleaseUnit(const std::string& replica) {
  UnitTable::Unit& unit = units_->units[replica];
  if (unit.released || static_cast<int>(unit.present.size()) < unit.stages) return;
  uint64_t target = 0;
  for (const auto& [stage, st] : unit.present) {
    if (!st.policy->members_.empty()) target = std::max(target, st.policy->step_ + 1);
  }
  unit.released = true;
  unit.target = target;
  LBCC_LOG(INFO) << "lbcc-master: every stage of pipeline replica '" << replica
                 << "' is back; admitted at outer step " << target;
  const std::map<int, UnitTable::Stage> stages = unit.present;
  for (const auto& [stage, st] : stages) {
    st.policy->QueueJoiner(st.member, st.policy->members_.empty() ? 0 : target);
  }
}

// Drops member `id` of this job (a stage replaced, or its replica left).
void MembershipPolicy::DropStage(uint64_t id, absl::string_view what) {
  if (!Live(id)) return;
  Drop(id, what, false);
  FlushFailedSends();
}

// `conn` (stage `stage` of `replica`) is gone: the replica leaves every shard's group. Its other
// stages that are members are evicted with a status saying so (IsReplicaLeft); those still
// waiting go back to waiting for the missing stage.
void MembershipPolicy::LoseStage(const Conn& conn, absl::string_view what) {
  auto found = units_->units.find(conn.replica);
  if (found == units_->units.end()) return;
  UnitTable::Unit& unit = found->second;
  auto self = unit.present.find(conn.stage);
  if (self == unit.present.end() || self->second.policy != this ||
      self->second.member != conn.id) {
    return;  // an old incarnation, already replaced
  }
  unit.present.erase(self);
  unit.released = false;
  const std::string text =
      absl::StrCat("pipeline replica '", conn.replica, "' left the data-parallel group: its stage ",
                   conn.stage, " (", conn.name, ") ", what);
  std::vector<UnitTable::Stage> evict;
  for (auto it = unit.present.begin(); it != unit.present.end();) {
    const UnitTable::Stage st = it->second;
    MembershipPolicy* p = st.policy;
    if (p->IsMember(st.member)) {
      evict.push_back(st);
      it = unit.present.erase(it);
      continue;
    }
    // Waiting: not admitted without the missing stage.
    p->joiners_.erase(std::remove(p->joiners_.begin(), p->joiners_.end(), st.member),
                      p->joiners_.end());
    p->join_target_.erase(st.member);
    ++it;
  }
  if (unit.present.empty()) units_->units.erase(found);
  for (const UnitTable::Stage& st : evict) st.policy->EvictStage(st, conn.replica, text);
}

// Stage `stage` of this job leaves with its replica (LoseStage): told why, then dropped.
void MembershipPolicy::EvictStage(const UnitTable::Stage& stage, const std::string& replica,
                                  const std::string& text) {
  auto c = conns_.find(stage.member);
  if (c == conns_.end()) return;
  const std::shared_ptr<Conn> keep = c->second;
  Message evicted;
  evicted.type = MsgType::kEvicted;
  evicted.replica_left = true;
  evicted.text = text;
  (void)output_->Send(stage.member, evicted, absl::Milliseconds(100));
  LBCC_LOG(INFO) << "lbcc-master: " << keep->name << ": " << text;
  Drop(stage.member, absl::StrCat("left with its pipeline replica '", replica, "'"), false);
  FlushFailedSends();
}

// Puts a stage that missed its replica's step back into its unit (waiting for a release). The
// unit may be gone (LoseStage erases one left with no stage): made anew with its stage count,
// else it would count none, release this stage alone and refuse its siblings for ever.
void MembershipPolicy::RegisterAgain(const Conn& conn) {
  UnitTable::Unit& unit = units_->units[conn.replica];
  unit.stages = conn.replica_stages;
  unit.present[conn.stage] = UnitTable::Stage{this, conn.id, conn.name};
  ReleaseUnit(conn.replica);
}

}  // namespace lbcc::comm::elastic
