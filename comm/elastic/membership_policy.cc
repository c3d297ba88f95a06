// MembershipPolicy (membership_policy.h): connections, joins, departures, epochs and admission.
// Reports and decisions are in membership_policy_steps.cc, pipeline units in
// membership_policy_units.cc.
#include "comm/elastic/membership_policy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace lbcc::comm::elastic {

namespace {
// How long a decision or an epoch may take to be sent to one member before it counts as
// unreachable; best-effort messages to members about to be closed get less.
constexpr absl::Duration kSendTimeout = absl::Seconds(1);
constexpr absl::Duration kLastWordTimeout = absl::Milliseconds(100);
// How long a set-up failure that names a peer waits for the epoch's other failures (their
// connections time out at the same deadline, within milliseconds of each other).
constexpr absl::Duration kBlameGrace = absl::Milliseconds(250);
}  // namespace

MembershipPolicy::MembershipPolicy(PolicyOptions options, UnitTable* units, PolicyOutput* output)
    : options_(std::move(options)), units_(units), output_(output) {}

uint64_t MembershipPolicy::Connected(std::string peer, absl::Time now) {
  auto conn = std::make_shared<Conn>();
  conn->id = ++next_id_;
  conn->name = std::move(peer);
  conn->last_heard = now;
  conns_[conn->id] = conn;
  return conn->id;
}

void MembershipPolicy::Received(uint64_t member, const Message& message, absl::Time now) {
  auto it = conns_.find(member);
  if (it == conns_.end()) return;  // dropped meanwhile
  std::shared_ptr<Conn> conn = it->second;
  conn->last_heard = now;
  Handle(*conn, message);
  FlushFailedSends();
}

void MembershipPolicy::Lost(uint64_t member, absl::string_view why) {
  if (!Live(member)) return;
  Drop(member, absl::StrCat("lost its connection (", why, ")"), false);
  FlushFailedSends();
}

void MembershipPolicy::Tick(absl::Time now) {
  if (now >= settle_due()) SettleSetupFailure();
  std::vector<std::shared_ptr<Conn>> all;
  for (auto& [id, conn] : conns_) all.push_back(conn);
  for (auto& conn : all) {
    if (!Live(conn->id)) continue;
    const absl::Duration silent = now - conn->last_heard;
    if (silent > options_.peer_timeout) {
      Message evicted;
      evicted.type = MsgType::kEvicted;
      evicted.text = absl::StrCat("silent for ", absl::ToInt64Milliseconds(silent),
                                  " ms (LBCC_PEER_TIMEOUT_MS ",
                                  absl::ToInt64Milliseconds(options_.peer_timeout), ")");
      (void)output_->Send(conn->id, evicted, kLastWordTimeout);
      Drop(conn->id, absl::StrCat("was ", evicted.text), false);
    } else if (conn->joined) {
      Message hb;
      hb.type = MsgType::kHeartbeat;
      Send(conn->id, hb);
    }
  }
  FlushFailedSends();
}

void MembershipPolicy::Stop() {
  for (auto& [name, unit] : units_->units) {
    for (auto it = unit.present.begin(); it != unit.present.end();) {
      it = it->second.policy == this ? unit.present.erase(it) : std::next(it);
    }
    unit.released = false;
  }
}

bool MembershipPolicy::connected(uint64_t member) const { return Live(member); }

void MembershipPolicy::Send(uint64_t member, const Message& m) {
  if (!Live(member)) return;
  if (!output_->Send(member, m, kSendTimeout)) failed_sends_.push_back(member);
}

void MembershipPolicy::FlushFailedSends() {
  while (!failed_sends_.empty()) {
    const uint64_t id = failed_sends_.back();
    failed_sends_.pop_back();
    if (Live(id)) Drop(id, "could not be reached", false);
  }
}

std::string MembershipPolicy::Describe(const Conn& conn) const {
  const auto it = std::find(members_.begin(), members_.end(), conn.id);
  if (it != members_.end()) {
    return absl::StrCat("rank ", it - members_.begin(), " (", conn.name, ")");
  }
  return absl::StrCat("member ", conn.name);
}

void MembershipPolicy::Refuse(Conn& conn, const absl::Status& why) {
  LBCC_LOG(WARN) << "lbcc-master: refusing " << conn.name << ": " << why;
  Message m;
  m.type = MsgType::kRefuse;
  m.code = static_cast<uint32_t>(why.code());
  m.text = std::string(why.message());
  (void)output_->Send(conn.id, m, kSendTimeout);
  output_->Close(conn.id);
  conns_.erase(conn.id);
}

void MembershipPolicy::Handle(Conn& conn, const Message& m) {
  switch (m.type) {
    case MsgType::kJoin:
      return OnJoin(conn, m);
    case MsgType::kHeartbeat:
      return;
    case MsgType::kReport:
      return OnReport(conn, m);
    case MsgType::kLeave:
      return Drop(conn.id, "left", true);
    case MsgType::kEnter:
      return OnEnter(conn, m.epoch);
    case MsgType::kSetupFailed:
      return OnSetupFailed(conn, m);
    default: {
      const absl::Status why = absl::DataLossError(absl::StrCat(
          "lbcc-master: unexpected message type ", static_cast<int>(m.type), " from a member"));
      if (!conn.joined) return Refuse(conn, why);
      // A member (or a joiner) leaves the job the way a lost one does: Refuse only closed its
      // connection and left it in the member list, and the next epoch aborted the master on
      // the missing connection (wire_master_fuzz's finding).
      Message refusal;
      refusal.type = MsgType::kRefuse;
      refusal.code = static_cast<uint32_t>(why.code());
      refusal.text = std::string(why.message());
      (void)output_->Send(conn.id, refusal, kLastWordTimeout);
      return Drop(conn.id, absl::StrCat("was refused: ", why.message()), false);
    }
  }
}

void MembershipPolicy::OnSetupFailed(Conn& conn, const Message& m) {
  RecordBlame(conn, m);
  if (m.epoch != epoch_ || !IsMember(conn.id)) return;
  const std::string reason =
      absl::StrCat("the communicator could not be built at ", Describe(conn), ": ", m.text);
  if (m.blame == 0 && !setup_failure_.has_value()) {
    fresh_next_ = true;  // a derived epoch could not be derived there
    NewEpoch(members_, reason);
    return;
  }
  // A connection failed: the others' failures of this epoch arrive about now.
  if (!setup_failure_.has_value()) {
    setup_failure_ = SetupFailure{epoch_, conn.last_heard, {}, reason};
  }
  setup_failure_->reported.insert(conn.id);
  if (setup_failure_->reported.size() == members_.size()) SettleSetupFailure();
}

// Reports of older epochs count too: a member whose failure came after the next epoch was
// announced still says whom it could not reach.
void MembershipPolicy::RecordBlame(const Conn& conn, const Message& m) {
  auto epoch = epoch_members_.find(m.epoch);
  if (m.blame == 0 || epoch == epoch_members_.end() || m.blame > epoch->second.size()) return;
  const uint64_t blamed = epoch->second[m.blame - 1];
  if (blamed == conn.id || !IsMember(conn.id) || !IsMember(blamed)) return;
  named_by_[blamed].insert(conn.id);
  const auto [low, high] = std::minmax(conn.id, blamed);
  pair_failures_[{low, high}].insert(m.epoch);
}

absl::Time MembershipPolicy::settle_due() const {
  return setup_failure_.has_value() ? setup_failure_->since + kBlameGrace
                                    : absl::InfiniteFuture();
}

void MembershipPolicy::SettleSetupFailure() {
  const SetupFailure failure = *std::move(setup_failure_);
  setup_failure_.reset();
  if (failure.epoch != epoch_) return;  // a newer epoch began meanwhile
  // Of the pairs whose set-ups failed in two epochs: the member named by the most members,
  // on a tie the newer.
  uint64_t victim = 0, other = 0;
  size_t most = 0;
  const std::set<uint64_t>* epochs = nullptr;
  for (const auto& [pair, failed] : pair_failures_) {
    if (failed.size() < 2 || !IsMember(pair.first) || !IsMember(pair.second)) continue;
    for (const auto& [who, peer] : {pair, std::make_pair(pair.second, pair.first)}) {
      const size_t named = named_by_[who].size();
      if (named > most || (named == most && who > victim)) {
        victim = who;
        other = peer;
        most = named;
        epochs = &failed;
      }
    }
  }
  if (victim == 0) {
    fresh_next_ = true;
    NewEpoch(members_, failure.reason);
    return;
  }
  const size_t named_other = named_by_[other].size();
  const std::string what = absl::StrCat(
      "unreachable from ", Describe(*conns_.at(other)), ": the set-ups of epochs ",
      *epochs->begin(), " and ", *std::next(epochs->begin()),
      " failed between them; named by ", most, " member(s), ", Describe(*conns_.at(other)),
      " by ", named_other, most == named_other ? " (a tie: the newer member goes)" : "");
  pair_failures_.clear();
  named_by_.clear();
  Message evicted;
  evicted.type = MsgType::kEvicted;
  evicted.text = what;
  (void)output_->Send(victim, evicted, kLastWordTimeout);
  fresh_next_ = true;
  Drop(victim, what, false);
}

bool MembershipPolicy::IsMember(uint64_t id) const {
  return std::find(members_.begin(), members_.end(), id) != members_.end();
}

bool MembershipPolicy::Live(uint64_t id) const { return conns_.count(id) > 0; }

absl::Status MembershipPolicy::CheckJoin(const Message& m) const {
  if (m.job_id != options_.job_id) {
    return absl::InvalidArgumentError(absl::StrCat("lbcc-master at ", options_.address,
                                                   ": job id '", m.job_id,
                                                   "' is not this job's ('", options_.job_id,
                                                   "')"));
  }
  if (m.state_step >= 0 && static_cast<uint64_t>(m.state_step) != step_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lbcc-master: stale shared state: it is of step ", m.state_step, ", the job is at step ",
        step_, "; join without state_step"));
  }
  if (m.replica.empty() != (m.replica_stages == 0) ||
      (!m.replica.empty() && m.stage >= m.replica_stages)) {
    return absl::InvalidArgumentError(absl::StrCat("lbcc-master: stage ", m.stage,
                                                   " of pipeline replica '", m.replica,
                                                   "' with ", m.replica_stages, " stages"));
  }
  if (!m.replica.empty()) {
    auto unit = units_->units.find(m.replica);
    if (unit != units_->units.end() && !unit->second.present.empty() &&
        unit->second.stages != static_cast<int>(m.replica_stages)) {
      return absl::InvalidArgumentError(absl::StrCat("lbcc-master: pipeline replica '",
                                                     m.replica, "' has ", unit->second.stages,
                                                     " stages, not ", m.replica_stages));
    }
  }
  return absl::OkStatus();
}

void MembershipPolicy::OnJoin(Conn& conn, const Message& m) {
  if (conn.joined) return;
  if (absl::Status s = CheckJoin(m); !s.ok()) return Refuse(conn, s);
  conn.joined = true;
  if (!m.name.empty()) conn.name = m.name;
  Message welcome;
  welcome.type = MsgType::kWelcome;
  welcome.member_id = conn.id;
  welcome.step = step_;
  welcome.peer_timeout_ms =
      static_cast<uint64_t>(absl::ToInt64Milliseconds(options_.peer_timeout));
  Send(conn.id, welcome);
  LBCC_LOG(INFO) << "lbcc-master: " << conn.name << " waits to join (epoch " << epoch_
                 << ", step " << step_ << ")";
  if (m.replica.empty()) return QueueJoiner(conn.id, 0);
  JoinUnit(conn, m);
}

// A newcomer waits for the commit that makes the job's step `target` (0: the next commit).
void MembershipPolicy::QueueJoiner(uint64_t id, uint64_t target) {
  joiners_.push_back(id);
  join_target_[id] = target;
  // The first epoch waits for min_members; a job whose members all left restarts with one.
  const int needed = epoch_ == 0 ? options_.min_members : 1;
  if (members_.empty() && static_cast<int>(joiners_.size()) >= needed) {
    std::vector<uint64_t> ids;
    ids.swap(joiners_);
    join_target_.clear();
    NewEpoch(ids, absl::StrCat(ids.size(), " member(s) formed the group"));
  }
}

// Removes `id` from the job; a member's departure starts a new epoch of the others.
void MembershipPolicy::Drop(uint64_t id, absl::string_view what, bool clean) {
  auto found = conns_.find(id);
  if (found == conns_.end()) return;
  const std::shared_ptr<Conn> conn = found->second;  // valid until we return
  const std::string who = Describe(*conn);
  output_->Close(id);
  joiners_.erase(std::remove(joiners_.begin(), joiners_.end(), id), joiners_.end());
  join_target_.erase(id);
  const bool member = IsMember(id);
  conns_.erase(id);
  if (!member) {
    TryDecideSteps();  // an exchange that waited for its report
    if (!conn->replica.empty()) LoseStage(*conn, what);
    return;
  }
  std::vector<uint64_t> rest;
  for (uint64_t m : members_) {
    if (m != id) rest.push_back(m);
  }
  LBCC_LOG(INFO) << "lbcc-master: " << who << (clean ? " left" : " dropped: ")
                 << (clean ? "" : what);
  NewEpoch(rest, absl::StrCat(who, " ", what));
  TryDecideSteps();  // an exchange that waited for its report (over the new member list)
  // Last: the other stages' evictions may drop members of this job too.
  if (!conn->replica.empty()) LoseStage(*conn, what);
}

// Departures only: members derive the new communicator from the previous epoch's, with no new
// connections (a member that cannot says so, and a fresh epoch follows).
void MembershipPolicy::DeriveEpoch(uint64_t previous, Message* e) const {
  auto parent = epoch_members_.find(previous);
  if (fresh_next_ || parent == epoch_members_.end()) return;
  std::vector<uint32_t> ranks;
  for (uint64_t id : members_) {
    auto at = std::find(parent->second.begin(), parent->second.end(), id);
    if (at == parent->second.end()) break;
    ranks.push_back(static_cast<uint32_t>(at - parent->second.begin()));
  }
  if (ranks.size() == members_.size() && std::is_sorted(ranks.begin(), ranks.end())) {
    e->parent_epoch = previous;
    e->parent_ranks = std::move(ranks);
  }
}

// The members whose exchange of forward_->step failed get its result first, from the lowest
// rank that committed it; with none left, the step is rolled back on them.
void MembershipPolicy::ForwardInEpoch(Message* e) {
  int source = -1;
  std::vector<uint32_t> to;
  const Forward& f = *forward_;
  for (size_t r = 0; r < members_.size(); ++r) {
    const uint64_t id = members_[r];
    if (source < 0 && std::find(f.sources.begin(), f.sources.end(), id) != f.sources.end()) {
      source = static_cast<int>(r);
    }
    if (std::find(f.receivers.begin(), f.receivers.end(), id) != f.receivers.end()) {
      to.push_back(static_cast<uint32_t>(r));
    }
  }
  if (source >= 0 && !to.empty()) {
    e->forward = true;
    e->forward_step = f.step;
    e->forward_source = static_cast<uint32_t>(source);
    e->forward_to = to;
    return;
  }
  Message d;
  d.type = MsgType::kDecision;
  d.epoch = f.epoch;
  d.step = f.step;
  d.phase = Phase::kStep;
  d.text = "every member that committed it left";
  if (source < 0) {
    for (uint64_t id : f.receivers) Send(id, d);
  } else {
    step_ = std::max(step_, f.step + 1);  // every receiver is gone
  }
  forward_.reset();
}

void MembershipPolicy::NewEpoch(std::vector<uint64_t> ids, const std::string& reason) {
  const uint64_t previous = epoch_;
  ++epoch_;
  output_->SupersedeRoots();
  reports_.clear();
  members_ = std::move(ids);
  epoch_members_[epoch_] = members_;
  LBCC_LOG(INFO) << "lbcc-master: epoch " << previous << " -> " << epoch_ << " ("
                 << members_.size() << " members): " << reason;
  if (members_.empty()) return;
  bool any_synced = false;
  for (uint64_t id : members_) any_synced |= conns_.at(id)->synced;
  // No member holds the state (the group forms, or every holder left): rank 0's is the
  // reference from now on.
  if (!any_synced) conns_.at(members_[0])->synced = true;
  Message e;
  DeriveEpoch(previous, &e);
  // A derived epoch needs no bootstrap root (nobody would connect to it).
  absl::StatusOr<UniqueId> uid = e.parent_epoch != 0 ? UniqueId{} : output_->NewUniqueId();
  if (!uid.ok()) {
    // Cannot form the epoch: tell the members why instead of leaving them waiting.
    const std::vector<uint64_t> all = members_;
    for (uint64_t id : all) Refuse(*conns_.at(id), uid.status());
    members_.clear();
    return;
  }
  e.type = MsgType::kEpoch;
  e.epoch = epoch_;
  e.step = step_;
  e.nranks = static_cast<uint32_t>(members_.size());
  e.unique_id.assign(uid->internal, sizeof(uid->internal));
  for (size_t r = 0; r < members_.size(); ++r) {
    const Conn& c = *conns_.at(members_[r]);
    e.names.push_back(c.name);
    if (!c.synced) e.needs_state.push_back(static_cast<uint32_t>(r));
  }
  if (forward_) ForwardInEpoch(&e);
  fresh_next_ = false;
  e.text = absl::StrCat(reason, " (epoch ", previous, " -> ", epoch_, ")");
  for (size_t r = 0; r < members_.size(); ++r) {
    e.rank = static_cast<uint32_t>(r);
    Send(members_[r], e);
  }
}

// Whether a commit that makes the job's step `step` admits a newcomer.
bool MembershipPolicy::Admissible(uint64_t step) const {
  for (uint64_t id : joiners_) {
    if (join_target_.at(id) <= step) return true;
  }
  return false;
}

// Joiners whose step has come become members (a step just committed). A pipeline stage whose
// job went past its replica's step without admitting it (that commit could not admit) would
// train at another step than its other stages: its replica leaves and joins again.
void MembershipPolicy::Admit() {
  std::vector<uint64_t> ids = members_, missed, waiting;
  std::string names;
  for (uint64_t id : joiners_) {
    const uint64_t target = join_target_.at(id);
    if (target > step_) {
      waiting.push_back(id);
      continue;
    }
    if (target != 0 && target != step_) {
      missed.push_back(id);
      continue;
    }
    ids.push_back(id);
    join_target_.erase(id);
    absl::StrAppend(&names, names.empty() ? "" : ", ", conns_.at(id)->name);
  }
  joiners_ = waiting;
  if (ids.size() > members_.size()) NewEpoch(ids, absl::StrCat(names, " joined at step ", step_));
  for (uint64_t id : missed) {
    const uint64_t target = join_target_.at(id);
    join_target_.erase(id);
    auto c = conns_.find(id);
    if (c == conns_.end()) continue;
    const std::shared_ptr<Conn> keep = c->second;
    // The stages admitted meanwhile are evicted; this one waits for them again.
    LoseStage(*keep, absl::StrCat("could not be admitted at outer step ", target,
                                  " with the others (its job is at step ", step_, ")"));
    if (Live(id)) RegisterAgain(*keep);
  }
}

}  // namespace lbcc::comm::elastic
