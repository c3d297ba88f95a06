// ElasticMaster (comm/elastic.h): the membership service. One acceptor thread, one reader
// thread per connection, one ticker thread (heartbeats, silence checks); every event is handled
// under mu_, so the membership logic below is sequential.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "comm/bootstrap.h"
#include "comm/elastic.h"
#include "comm/elastic_wire.h"
#include "transport/netif.h"

namespace lbcc::comm {

using elastic::Message;
using elastic::MsgType;
using elastic::Phase;
using elastic::Socket;

absl::StatusOr<absl::Duration> ResolvePeerTimeout(absl::Duration given) {
  if (given > absl::ZeroDuration()) return given;
  LBCC_ASSIGN_OR_RETURN(const int64_t ms, env::GetInt("LBCC_PEER_TIMEOUT_MS"));
  return absl::Milliseconds(ms);
}

// Member lists of this many past epochs are kept for late reports of their exchanges.
constexpr uint64_t kKeptEpochs = 64;

// Pipeline replicas as units (elastic.h). Every master sharing this object runs its membership
// logic under `mu`, so a departure in one shard's job and the evictions it causes in the
// others are one sequential step.
class ElasticUnits {
 public:
  Mutex mu;
  struct Stage {
    ElasticMaster::Impl* master = nullptr;
    uint64_t conn = 0;
    std::string name;
  };
  struct Unit {
    int stages = 0;
    std::map<int, Stage> present;  // joined stages (waiting or members), by stage
    bool released = false;         // every stage was back: each waits for outer step `target`
    uint64_t target = 0;
  };
  std::map<std::string, Unit> units ABSL_GUARDED_BY(mu);
};

std::shared_ptr<ElasticUnits> NewElasticUnits() { return std::make_shared<ElasticUnits>(); }

class ElasticMaster::Impl {
 public:
  explicit Impl(ElasticMasterOptions options)
      : options_(std::move(options)),
        units_(options_.units != nullptr ? options_.units : NewElasticUnits()),
        mu_(units_->mu) {}
  ~Impl() { Stop(); }

  absl::Status Start() {
    if (options_.job_id.empty()) {
      return absl::InvalidArgumentError("ElasticMaster: job_id is empty");
    }
    if (options_.min_members < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("ElasticMaster: min_members ", options_.min_members, " < 1"));
    }
    LBCC_ASSIGN_OR_RETURN(peer_timeout_, ResolvePeerTimeout(options_.peer_timeout));
    if (options_.setup_timeout <= absl::ZeroDuration()) {
      options_.setup_timeout = peer_timeout_ + absl::Seconds(5);
    }
    LBCC_ASSIGN_OR_RETURN(listener_, Socket::Listen(options_.listen_address, &address_));
    if (options_.bootstrap_host.empty()) {
      LBCC_ASSIGN_OR_RETURN(const transport::HostAndPort bound,
                            transport::ParseHostPort(address_, "elastic master"));
      options_.bootstrap_host = bound.host;  // Without the brackets of an IPv6 address.
    }
    acceptor_ = std::thread([this] { AcceptLoop(); });
    ticker_ = std::thread([this] { TickLoop(); });
    LBCC_LOG(INFO) << "lbcc-master: job '" << options_.job_id << "' listening on " << address_;
    return absl::OkStatus();
  }

  void Stop() {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
      for (auto& [id, conn] : conns_) conn->sock->Shutdown();
      for (auto& [name, unit] : units_->units) {
        for (auto it = unit.present.begin(); it != unit.present.end();) {
          it = it->second.master == this ? unit.present.erase(it) : std::next(it);
        }
        unit.released = false;
      }
    }
    if (listener_) listener_->Shutdown();
    if (acceptor_.joinable()) acceptor_.join();
    if (ticker_.joinable()) ticker_.join();
    std::vector<std::thread> readers;
    {
      MutexLock lock(&mu_);
      readers.swap(readers_);
    }
    for (std::thread& t : readers) t.join();
  }

  const std::string& address() const { return address_; }
  uint64_t epoch() {
    MutexLock lock(&mu_);
    return epoch_;
  }
  uint64_t steps() {
    MutexLock lock(&mu_);
    return step_;
  }
  int members() {
    MutexLock lock(&mu_);
    return static_cast<int>(members_.size());
  }
  bool AwaitEpoch(uint64_t n, absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return epoch_ >= n; },
                                timeout);
  }
  bool AwaitSteps(uint64_t n, absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return step_ >= n; },
                                timeout);
  }
  bool AwaitCommitInEpoch(uint64_t epoch, absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return commit_epoch_ >= epoch; }, timeout);
  }
  bool AwaitWaiting(int n, absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return static_cast<int>(joiners_.size()) >= n; },
        timeout);
  }

 private:
  struct Conn {
    uint64_t id = 0;
    std::string name;
    std::shared_ptr<Socket> sock;
    absl::Time last_heard;
    bool joined = false;
    bool synced = false;
    bool dead = false;
    // The newest (epoch, step) it reported or entered: it takes part in no older exchange.
    std::pair<uint64_t, uint64_t> last{0, 0};
    // A pipeline stage (ElasticOptions::replica): its replica and stage.
    std::string replica;
    int stage = 0;
  };
  struct Report {
    Phase phase;
    uint64_t step;
    bool ok;
    bool broken;
    uint32_t code;
    std::string text;
  };

  void AcceptLoop() {
    while (true) {
      absl::StatusOr<std::unique_ptr<Socket>> sock =
          listener_->Accept(absl::Now() + absl::Milliseconds(200));
      MutexLock lock(&mu_);
      if (stopping_) return;
      if (!sock.ok()) continue;
      auto conn = std::make_shared<Conn>();
      conn->id = ++next_id_;
      conn->sock = std::move(*sock);
      conn->name = conn->sock->peer();
      conn->last_heard = absl::Now();
      conns_[conn->id] = conn;
      readers_.emplace_back([this, conn] { ReadLoop(conn); });
    }
  }

  void ReadLoop(std::shared_ptr<Conn> conn) {
    while (true) {
      absl::StatusOr<Message> m = conn->sock->Receive(absl::InfiniteFuture());
      MutexLock lock(&mu_);
      if (stopping_ || conn->dead) return;
      if (!m.ok()) {
        Drop(*conn, absl::StrCat("lost its connection (", m.status().message(), ")"), false);
        FlushFailedSends();
        return;
      }
      conn->last_heard = absl::Now();
      Handle(*conn, *m);
      FlushFailedSends();
    }
  }

  void TickLoop() {
    const absl::Duration period = std::max(peer_timeout_ / 4, absl::Milliseconds(10));
    MutexLock lock(&mu_);
    while (!stopping_) {
      mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; },
                           period);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      std::vector<std::shared_ptr<Conn>> all;
      for (auto& [id, conn] : conns_) all.push_back(conn);
      for (auto& conn : all) {
        if (conn->dead) continue;
        const absl::Duration silent = now - conn->last_heard;
        if (silent > peer_timeout_) {
          Message evicted;
          evicted.type = MsgType::kEvicted;
          evicted.text = absl::StrCat("silent for ", absl::ToInt64Milliseconds(silent),
                                      " ms (LBCC_PEER_TIMEOUT_MS ",
                                      absl::ToInt64Milliseconds(peer_timeout_), ")");
          (void)conn->sock->Send(evicted, now + absl::Milliseconds(100));
          Drop(*conn, absl::StrCat("was ", evicted.text), false);
        } else if (conn->joined) {
          Message hb;
          hb.type = MsgType::kHeartbeat;
          Send(*conn, hb);
        }
      }
      FlushFailedSends();
    }
  }

  void Send(Conn& conn, const Message& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (conn.dead) return;
    if (!conn.sock->Send(m, absl::Now() + absl::Seconds(1)).ok()) failed_sends_.push_back(conn.id);
  }

  void FlushFailedSends() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!failed_sends_.empty()) {
      const uint64_t id = failed_sends_.back();
      failed_sends_.pop_back();
      auto it = conns_.find(id);
      if (it != conns_.end()) Drop(*it->second, "could not be reached", false);
    }
  }

  std::string Describe(const Conn& conn) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto it = std::find(members_.begin(), members_.end(), conn.id);
    if (it != members_.end()) {
      return absl::StrCat("rank ", it - members_.begin(), " (", conn.name, ")");
    }
    return absl::StrCat("member ", conn.name);
  }

  void Refuse(Conn& conn, absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    LBCC_LOG(WARN) << "lbcc-master: refusing " << conn.name << ": " << why;
    Message m;
    m.type = MsgType::kRefuse;
    m.code = static_cast<uint32_t>(why.code());
    m.text = std::string(why.message());
    (void)conn.sock->Send(m, absl::Now() + absl::Seconds(1));
    conn.dead = true;
    conn.sock->Shutdown();
    conns_.erase(conn.id);
  }

  void Handle(Conn& conn, const Message& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (m.type) {
      case MsgType::kJoin:
        return OnJoin(conn, m);
      case MsgType::kHeartbeat:
        return;
      case MsgType::kReport:
        return OnReport(conn, m);
      case MsgType::kLeave:
        return Drop(conn, "left", true);
      case MsgType::kEnter:
        return OnEnter(conn, m.epoch);
      case MsgType::kSetupFailed:
        if (m.epoch == epoch_ && IsMember(conn.id)) {
          fresh_next_ = true;  // a derived epoch could not be derived there
          NewEpoch(members_, absl::StrCat("the communicator could not be built at ",
                                          Describe(conn), ": ", m.text));
        }
        return;
      default:
        return Refuse(conn, absl::DataLossError(absl::StrCat(
                                "lbcc-master: unexpected message type ",
                                static_cast<int>(m.type), " from a member")));
    }
  }

  bool IsMember(uint64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::find(members_.begin(), members_.end(), id) != members_.end();
  }

  void OnJoin(Conn& conn, const Message& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (conn.joined) return;
    if (m.job_id != options_.job_id) {
      return Refuse(conn, absl::InvalidArgumentError(absl::StrCat(
                              "lbcc-master at ", address_, ": job id '", m.job_id,
                              "' is not this job's ('", options_.job_id, "')")));
    }
    if (m.state_step >= 0 && static_cast<uint64_t>(m.state_step) != step_) {
      return Refuse(conn, absl::FailedPreconditionError(absl::StrCat(
                              "lbcc-master: stale shared state: it is of step ", m.state_step,
                              ", the job is at step ", step_, "; join without state_step")));
    }
    if (m.replica.empty() != (m.replica_stages == 0) ||
        (!m.replica.empty() && m.stage >= m.replica_stages)) {
      return Refuse(conn, absl::InvalidArgumentError(absl::StrCat(
                              "lbcc-master: stage ", m.stage, " of pipeline replica '", m.replica,
                              "' with ", m.replica_stages, " stages")));
    }
    if (!m.replica.empty()) {
      auto unit = units_->units.find(m.replica);
      if (unit != units_->units.end() && !unit->second.present.empty() &&
          unit->second.stages != static_cast<int>(m.replica_stages)) {
        return Refuse(conn, absl::InvalidArgumentError(absl::StrCat(
                                "lbcc-master: pipeline replica '", m.replica, "' has ",
                                unit->second.stages, " stages, not ", m.replica_stages)));
      }
    }
    conn.joined = true;
    if (!m.name.empty()) conn.name = m.name;
    Message welcome;
    welcome.type = MsgType::kWelcome;
    welcome.member_id = conn.id;
    welcome.step = step_;
    welcome.peer_timeout_ms = static_cast<uint64_t>(absl::ToInt64Milliseconds(peer_timeout_));
    Send(conn, welcome);
    LBCC_LOG(INFO) << "lbcc-master: " << conn.name << " waits to join (epoch " << epoch_
                   << ", step " << step_ << ")";
    if (m.replica.empty()) return QueueJoiner(conn.id, 0);
    conn.replica = m.replica;
    conn.stage = static_cast<int>(m.stage);
    ElasticUnits::Unit& unit = units_->units[m.replica];
    unit.stages = static_cast<int>(m.replica_stages);
    auto old = unit.present.find(conn.stage);
    if (old != unit.present.end()) {
      // A new incarnation of a stage whose old one the master has not dropped yet (it was
      // stopped or cut off): the old one is gone for its user; its replica leaves with it.
      ElasticUnits::Stage gone = old->second;
      gone.master->DropStage(gone.conn, absl::StrCat("was replaced by ", conn.name));
    }
    unit.present[conn.stage] = ElasticUnits::Stage{this, conn.id, conn.name};
    ReleaseUnit(m.replica);
  }

  // A newcomer waits for the commit that makes the job's step `target` (0: the next commit).
  void QueueJoiner(uint64_t id, uint64_t target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  // Once every stage of `replica` is back, each becomes a newcomer of its job, to be admitted
  // at one outer step: the first that every job with members can still reach.
  void ReleaseUnit(const std::string& replica) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    ElasticUnits::Unit& unit = units_->units[replica];
    if (unit.released || static_cast<int>(unit.present.size()) < unit.stages) return;
    uint64_t target = 0;
    for (const auto& [stage, st] : unit.present) {
      if (!st.master->members_.empty()) target = std::max(target, st.master->step_ + 1);
    }
    unit.released = true;
    unit.target = target;
    LBCC_LOG(INFO) << "lbcc-master: every stage of pipeline replica '" << replica
                   << "' is back; admitted at outer step " << target;
    const std::map<int, ElasticUnits::Stage> stages = unit.present;
    for (const auto& [stage, st] : stages) {
      st.master->QueueJoiner(st.conn, st.master->members_.empty() ? 0 : target);
    }
  }

  // Drops member `id` of this master (a stage replaced, or its replica left).
  void DropStage(uint64_t id, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    std::shared_ptr<Conn> keep = it->second;
    Drop(*keep, what, false);
    FlushFailedSends();
  }

  // `conn` (stage `stage` of `replica`) is gone: the replica leaves every shard's group. Its
  // other stages that are members are evicted with a status saying so (IsReplicaLeft); those
  // still waiting go back to waiting for the missing stage.
  void LoseStage(const Conn& conn, absl::string_view what) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto found = units_->units.find(conn.replica);
    if (found == units_->units.end()) return;
    ElasticUnits::Unit& unit = found->second;
    auto self = unit.present.find(conn.stage);
    if (self == unit.present.end() || self->second.master != this ||
        self->second.conn != conn.id) {
      return;  // an old incarnation, already replaced
    }
    unit.present.erase(self);
    unit.released = false;
    const std::string text =
        absl::StrCat("pipeline replica '", conn.replica, "' left the data-parallel group: its stage ",
                     conn.stage, " (", conn.name, ") ", what);
    std::vector<ElasticUnits::Stage> evict;
    for (auto it = unit.present.begin(); it != unit.present.end();) {
      ElasticUnits::Stage st = it->second;
      Impl* m = st.master;
      if (m->IsMember(st.conn)) {
        evict.push_back(st);
        it = unit.present.erase(it);
        continue;
      }
      // Waiting: not admitted without the missing stage.
      m->joiners_.erase(std::remove(m->joiners_.begin(), m->joiners_.end(), st.conn),
                        m->joiners_.end());
      m->join_target_.erase(st.conn);
      ++it;
    }
    if (unit.present.empty()) units_->units.erase(found);
    for (const ElasticUnits::Stage& st : evict) {
      auto c = st.master->conns_.find(st.conn);
      if (c == st.master->conns_.end()) continue;
      std::shared_ptr<Conn> keep = c->second;
      Message evicted;
      evicted.type = MsgType::kEvicted;
      evicted.replica_left = true;
      evicted.text = text;
      (void)keep->sock->Send(evicted, absl::Now() + absl::Milliseconds(100));
      LBCC_LOG(INFO) << "lbcc-master: " << keep->name << ": " << text;
      st.master->Drop(*keep, absl::StrCat("left with its pipeline replica '", conn.replica, "'"),
                      false);
      st.master->FlushFailedSends();
    }
  }

  void OnReport(Conn& conn, const Message& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    conn.last = std::max(conn.last, std::make_pair(m.epoch, m.phase == Phase::kStep ? m.step : 0));
    if (m.phase == Phase::kStep) return OnStepReport(conn, m);
    if (m.epoch != epoch_ || !IsMember(conn.id)) return;  // a phase of an older epoch
    reports_[conn.id] = Report{m.phase, m.step, m.ok, m.broken, m.code, m.text};
    if (reports_.size() < members_.size()) return;
    // Every member reported: decide.
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
          why = absl::StrCat("rank ", r, " (", conns_[members_[r]]->name, "): ", rep.text);
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
    const bool admit =
        forwarded && Admissible(std::max(step_, forward_->step + 1));
    // A failed forward is retried in a new epoch (another source); a failed sync when the
    // communicator broke.
    const bool again = !all_ok && (broken || first.phase == Phase::kForward);
    d.broken = admit || again;
    d.next_epoch = epoch_ + 1;
    d.text = why;
    for (uint64_t id : members_) Send(*conns_[id], d);
    if (all_ok) {
      for (uint64_t id : members_) conns_[id]->synced = true;
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

  // Whether a commit that makes the job's step `step` admits a newcomer.
  bool Admissible(uint64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (uint64_t id : joiners_) {
      if (join_target_.at(id) <= step) return true;
    }
    return false;
  }

  // Joiners whose step has come become members (a step just committed). A pipeline stage
  // whose job went past its replica's step without admitting it (that commit could not admit)
  // would train at another step than its other stages: its replica leaves and joins again.
  void Admit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<uint64_t> ids = members_, missed;
    std::string names;
    std::vector<uint64_t> waiting;
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
      absl::StrAppend(&names, names.empty() ? "" : ", ", conns_[id]->name);
    }
    joiners_ = waiting;
    if (ids.size() > members_.size()) NewEpoch(ids, absl::StrCat(names, " joined at step ", step_));
    for (uint64_t id : missed) {
      const uint64_t target = join_target_.at(id);
      join_target_.erase(id);
      auto c = conns_.find(id);
      if (c == conns_.end()) continue;
      std::shared_ptr<Conn> keep = c->second;
      // The stages admitted meanwhile are evicted; this one waits for them again.
      LoseStage(*keep, absl::StrCat("could not be admitted at outer step ", target,
                                    " with the others (its job is at step ", step_, ")"));
      if (!keep->dead) RegisterAgain(*keep);
    }
  }

  // Puts a stage that missed its replica's step back into its unit (waiting for a release).
  void RegisterAgain(Conn& conn) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    ElasticUnits::Unit& unit = units_->units[conn.replica];
    unit.present[conn.stage] = ElasticUnits::Stage{this, conn.id, conn.name};
    ReleaseUnit(conn.replica);
  }

  bool Live(uint64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = conns_.find(id);
    return it != conns_.end() && !it->second->dead;
  }

  // A step's exchange (docs/elastic.md, "Deciding off the critical path"): members that
  // succeeded committed at once, so the decision waits for every member of the step's epoch
  // (reported, gone, or working in a later epoch or step without having taken part), even after
  // the epoch moved on, and is commit, forward (some failed: they get the result from one that
  // committed) or abort (nobody alive committed).
  void OnStepReport(Conn& conn, const Message& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
  void OnEnter(Conn& conn, uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  void TryDecideSteps() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = open_.begin(); it != open_.end();) {
      const auto [epoch, step] = it->first;
      Open& open = it->second;
      // A member already past this exchange (an exchange opened after it moved on).
      for (uint64_t id : open.members) {
        if (!open.reports.count(id) && Live(id) && conns_[id]->last > it->first) {
          open.reports[id] = Report{Phase::kStep, step, false, false, 0,
                                    "it did not take part (it works in a later epoch or step)"};
        }
      }
      bool complete = true;
      for (uint64_t id : open.members) complete &= open.reports.count(id) > 0 || !Live(id);
      if (!complete) {
        ++it;
        continue;
      }
      bool all_ok = true, broken = false;
      std::vector<uint64_t> sources, receivers;
      std::string why;
      for (size_t r = 0; r < open.members.size(); ++r) {
        const uint64_t id = open.members[r];
        auto rep = open.reports.find(id);
        if (rep == open.reports.end()) {
          all_ok = false;
          if (why.empty()) why = absl::StrCat("rank ", r, " left before it reported");
          continue;
        }
        broken |= rep->second.broken;
        if (rep->second.ok) {
          if (Live(id)) sources.push_back(id);
        } else {
          all_ok = false;
          if (Live(id) && rep->second.code != 0) receivers.push_back(id);
          if (why.empty()) {
            why = absl::StrCat("rank ", r, " (", Live(id) ? conns_[id]->name : "gone", "): ",
                               rep->second.text);
          }
        }
      }
      const std::vector<uint64_t> told = open.members;
      it = open_.erase(it);
      Message d;
      d.type = MsgType::kDecision;
      d.epoch = epoch;
      d.step = step;
      d.phase = Phase::kStep;
      // Every live member has the step when only members that are gone failed it.
      d.ok = all_ok || (!sources.empty() && receivers.empty());
      d.text = why;
      const bool forward = !all_ok && !sources.empty() && !receivers.empty();
      const bool admit =
          all_ok && epoch == epoch_ && !forward_ && Admissible(std::max(step_, step + 1));
      d.forward = forward;
      d.broken = admit || forward || (!all_ok && broken && epoch == epoch_);
      d.next_epoch = epoch_ + 1;
      for (uint64_t id : told) {
        if (Live(id)) Send(*conns_[id], d);
      }
      if (all_ok || (!sources.empty() && receivers.empty())) {
        // Every live member of the epoch has the step (a member that failed is gone).
        for (uint64_t id : told) {
          if (Live(id)) conns_[id]->synced = true;
        }
        step_ = std::max(step_, step + 1);
        commit_epoch_ = std::max(commit_epoch_, epoch);
        if (admit) Admit();
      } else if (forward) {
        forward_ = Forward{epoch, step, sources, receivers};
        NewEpoch(members_, absl::StrCat("step ", step, " failed on some members only (", why,
                                        "): they receive its result"));
      } else if (d.broken) {
        NewEpoch(members_, absl::StrCat("the communicator failed: ", why));
      }
      it = open_.begin();  // decisions may have changed the map
    }
    // Members of epochs no open exchange needs any more.
    uint64_t keep = epoch_ > kKeptEpochs ? epoch_ - kKeptEpochs : 0;
    for (const auto& [k, open] : open_) keep = std::min(keep, k.first);
    epoch_members_.erase(epoch_members_.begin(), epoch_members_.lower_bound(keep));
  }

  // Removes `conn` from the job; a member's departure starts a new epoch of the others.
  void Drop(Conn& conn, absl::string_view what, bool clean) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (conn.dead) return;
    const std::string who = Describe(conn);
    conn.dead = true;
    conn.sock->Shutdown();
    joiners_.erase(std::remove(joiners_.begin(), joiners_.end(), conn.id), joiners_.end());
    join_target_.erase(conn.id);
    const bool member = IsMember(conn.id);
    std::shared_ptr<Conn> keep = conns_[conn.id];  // `conn` stays valid until we return
    conns_.erase(conn.id);
    if (!member) {
      TryDecideSteps();  // an exchange that waited for its report
      if (!conn.replica.empty()) LoseStage(conn, what);
      return;
    }
    std::vector<uint64_t> rest;
    for (uint64_t id : members_) {
      if (id != conn.id) rest.push_back(id);
    }
    LBCC_LOG(INFO) << "lbcc-master: " << who << (clean ? " left" : " dropped: ") << (clean ? "" : what);
    NewEpoch(rest, absl::StrCat(who, " ", what));
    TryDecideSteps();  // an exchange that waited for its report (over the new member list)
    // Last: the other stages' evictions may drop members of this job too.
    if (!conn.replica.empty()) LoseStage(conn, what);
  }

  void NewEpoch(std::vector<uint64_t> ids, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t previous = epoch_;
    ++epoch_;
    reports_.clear();
    members_ = std::move(ids);
    epoch_members_[epoch_] = members_;
    LBCC_LOG(INFO) << "lbcc-master: epoch " << previous << " -> " << epoch_ << " ("
                   << members_.size() << " members): " << reason;
    if (members_.empty()) return;
    bool any_synced = false;
    for (uint64_t id : members_) any_synced |= conns_[id]->synced;
    // No member holds the state (the group forms, or every holder left): rank 0's is the
    // reference from now on.
    if (!any_synced) conns_[members_[0]]->synced = true;
    uint64_t parent_epoch = 0;
    std::vector<uint32_t> parent_ranks;
    // Departures only: members derive the new communicator from the previous epoch's, with
    // no new connections (a member that cannot says so, and a fresh epoch follows).
    auto parent = epoch_members_.find(previous);
    if (!fresh_next_ && parent != epoch_members_.end()) {
      std::vector<uint32_t> ranks;
      for (uint64_t id : members_) {
        auto at = std::find(parent->second.begin(), parent->second.end(), id);
        if (at == parent->second.end()) break;
        ranks.push_back(static_cast<uint32_t>(at - parent->second.begin()));
      }
      if (ranks.size() == members_.size() && std::is_sorted(ranks.begin(), ranks.end())) {
        parent_epoch = previous;
        parent_ranks = std::move(ranks);
      }
    }
    // A derived epoch needs no bootstrap root (nobody would connect to it).
    absl::StatusOr<UniqueId> uid =
        parent_epoch != 0 ? UniqueId{}
                          : CreateUniqueId(options_.bootstrap_host, options_.setup_timeout);
    if (!uid.ok()) {
      // Cannot form the epoch: tell the members why instead of leaving them waiting.
      std::vector<uint64_t> all = members_;
      for (uint64_t id : all) Refuse(*conns_[id], uid.status());
      members_.clear();
      return;
    }
    Message e;
    e.type = MsgType::kEpoch;
    e.epoch = epoch_;
    e.step = step_;
    e.nranks = static_cast<uint32_t>(members_.size());
    e.unique_id.assign(uid->internal, sizeof(uid->internal));
    for (size_t r = 0; r < members_.size(); ++r) {
      const Conn& c = *conns_[members_[r]];
      e.names.push_back(c.name);
      if (!c.synced) e.needs_state.push_back(static_cast<uint32_t>(r));
    }
    if (forward_) {
      // The members whose exchange of forward_->step failed get its result first, from the
      // lowest rank that committed it; with none left, the step is rolled back on them.
      int source = -1;
      std::vector<uint32_t> to;
      for (size_t r = 0; r < members_.size(); ++r) {
        const uint64_t id = members_[r];
        const auto& f = *forward_;
        if (source < 0 && std::find(f.sources.begin(), f.sources.end(), id) != f.sources.end()) {
          source = static_cast<int>(r);
        }
        if (std::find(f.receivers.begin(), f.receivers.end(), id) != f.receivers.end()) {
          to.push_back(static_cast<uint32_t>(r));
        }
      }
      if (source >= 0 && !to.empty()) {
        e.forward = true;
        e.forward_step = forward_->step;
        e.forward_source = static_cast<uint32_t>(source);
        e.forward_to = to;
      } else {
        Message d;
        d.type = MsgType::kDecision;
        d.epoch = forward_->epoch;
        d.step = forward_->step;
        d.phase = Phase::kStep;
        d.text = "every member that committed it left";
        if (source < 0) {
          for (uint64_t id : forward_->receivers) {
            if (Live(id)) Send(*conns_[id], d);
          }
        } else {
          step_ = std::max(step_, forward_->step + 1);  // every receiver is gone
        }
        forward_.reset();
      }
    }
    e.parent_epoch = parent_epoch;
    e.parent_ranks = std::move(parent_ranks);
    fresh_next_ = false;
    e.text = absl::StrCat(reason, " (epoch ", previous, " -> ", epoch_, ")");
    for (size_t r = 0; r < members_.size(); ++r) {
      e.rank = static_cast<uint32_t>(r);
      Send(*conns_[members_[r]], e);
    }
  }

  ElasticMasterOptions options_;
  const std::shared_ptr<ElasticUnits> units_;
  absl::Duration peer_timeout_;
  std::string address_;
  std::unique_ptr<Socket> listener_;
  std::thread acceptor_, ticker_;

  Mutex& mu_;  // units_->mu: shared with the masters of the other shards
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> readers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> members_ ABSL_GUARDED_BY(mu_);  // the current epoch, in rank order
  std::vector<uint64_t> joiners_ ABSL_GUARDED_BY(mu_);  // waiting for a step boundary
  // Per joiner: the job's step at whose commit it is admitted (0: the next commit).
  std::map<uint64_t, uint64_t> join_target_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;  // committed outer steps
  uint64_t commit_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // the newest epoch a step committed in
  std::map<uint64_t, Report> reports_ ABSL_GUARDED_BY(mu_);  // the current sync/forward phase's
  // Step exchanges waiting for their decision, by (epoch, step).
  struct Open {
    std::vector<uint64_t> members;  // the epoch's, in rank order
    std::map<uint64_t, Report> reports;
  };
  std::map<std::pair<uint64_t, uint64_t>, Open> open_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::vector<uint64_t>> epoch_members_ ABSL_GUARDED_BY(mu_);
  // A step that failed on some members only: `receivers` get its result from one of `sources`.
  struct Forward {
    uint64_t epoch = 0, step = 0;
    std::vector<uint64_t> sources, receivers;
  };
  std::optional<Forward> forward_ ABSL_GUARDED_BY(mu_);
  bool fresh_next_ ABSL_GUARDED_BY(mu_) = false;  // the next epoch is not derived
  std::vector<uint64_t> failed_sends_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<ElasticMaster>> ElasticMaster::Start(ElasticMasterOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  LBCC_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<ElasticMaster>(new ElasticMaster(std::move(impl)));
}

ElasticMaster::ElasticMaster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ElasticMaster::~ElasticMaster() = default;
std::string ElasticMaster::address() const { return impl_->address(); }
uint64_t ElasticMaster::epoch() const { return impl_->epoch(); }
uint64_t ElasticMaster::committed_steps() const { return impl_->steps(); }
int ElasticMaster::members() const { return impl_->members(); }
bool ElasticMaster::AwaitEpoch(uint64_t n, absl::Duration timeout) const {
  return impl_->AwaitEpoch(n, timeout);
}
bool ElasticMaster::AwaitCommittedSteps(uint64_t n, absl::Duration timeout) const {
  return impl_->AwaitSteps(n, timeout);
}
bool ElasticMaster::AwaitCommitInEpoch(uint64_t epoch, absl::Duration timeout) const {
  return impl_->AwaitCommitInEpoch(epoch, timeout);
}
bool ElasticMaster::AwaitWaiting(int n, absl::Duration timeout) const {
  return impl_->AwaitWaiting(n, timeout);
}
void ElasticMaster::Stop() { impl_->Stop(); }

}  // namespace lbcc::comm
