// ElasticMaster (elastic.h): the membership service's socket server around MembershipPolicy
// (membership_policy.h). One acceptor thread, one reader thread per joined member, one ticker
// thread (heartbeats, silence checks); each feeds its events to the policy under the mutex the
// masters of one model share (ElasticUnits::mu), and the policy's decisions are carried out on
// the members' sockets before the mutex is released.
//
// The service faces whoever can reach it (README, Security). A new connection is not a member
// until its first frame, a join, has arrived: until then the acceptor alone holds it, in one
// epoll set with the listener (a thousand silent connections cost a member's join nothing; no
// thread, nothing in the policy), for at most handshake_timeout, with at most kMaxMemberFrame
// bytes in its frame, and at most max_handshakes of them at once (the oldest is closed to make
// room for a new one). Every peer address holds at most max_connections_per_address
// connections, joining or joined. Members' later frames are bounded by kMaxMemberFrame too.
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "comm/bootstrap.h"
#include "comm/elastic/elastic.h"
#include "comm/elastic/membership_policy.h"
#include "comm/elastic/wire.h"
#include "transport/netif.h"

namespace lbcc::comm {

using elastic::MembershipPolicy;
using elastic::Message;
using elastic::Socket;

// Pipeline replicas as units (elastic.h): the unit table the policies of one model's shard jobs
// share, and the mutex under which every one of their masters handles its events, so that a
// departure in one job and the evictions it causes in the others are one sequential step.
class ElasticUnits {
 public:
  Mutex mu;
  elastic::UnitTable table ABSL_GUARDED_BY(mu);
};

std::shared_ptr<ElasticUnits> NewElasticUnits() { return std::make_shared<ElasticUnits>(); }

class ElasticMaster::Impl : private elastic::PolicyOutput {
 public:
  explicit Impl(ElasticMasterOptions options)
      : options_(std::move(options)),
        units_(options_.units != nullptr ? options_.units : NewElasticUnits()),
        mu_(units_->mu) {}
  ~Impl() override {
    Stop();
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }

  absl::Status Start();
  void Stop();

  const std::string& address() const { return address_; }
  uint64_t epoch() {
    MutexLock lock(&mu_);
    return policy_->epoch();
  }
  uint64_t steps() {
    MutexLock lock(&mu_);
    return policy_->committed_steps();
  }
  int members() {
    MutexLock lock(&mu_);
    return policy_->members();
  }
  bool AwaitEpoch(uint64_t n, absl::Duration timeout) {
    return Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return policy_->epoch() >= n; },
                 timeout);
  }
  bool AwaitSteps(uint64_t n, absl::Duration timeout) {
    return Await(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return policy_->committed_steps() >= n; },
        timeout);
  }
  bool AwaitCommitInEpoch(uint64_t epoch, absl::Duration timeout) {
    return Await(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return policy_->commit_epoch() >= epoch; },
        timeout);
  }
  bool AwaitWaiting(int n, absl::Duration timeout) {
    return Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return policy_->waiting() >= n; },
                 timeout);
  }

 private:
  template <typename Pred>
  bool Await(Pred pred, absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(pred, timeout);
  }

  // A connection that has not sent its join yet (the acceptor's own).
  struct Pending {
    std::shared_ptr<Socket> sock;
    std::string peer;     // "host:port"
    std::string address;  // the host: what max_connections_per_address counts
    absl::Time deadline;  // handshake_timeout after it was accepted
    elastic::FrameReader frames{elastic::kMaxMemberFrame};
  };
  // A reader thread and whether it ended (the acceptor joins ended ones).
  struct Reader {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  void AcceptLoop();
  // Reads what arrived on `p`; true when it is finished with (joined, refused or failed: the
  // caller stops watching it; a joined one's socket belongs to its reader thread).
  bool ReadPending(Pending& p);
  // Closes a connection that never joined, saying why in the log (at most one line per second
  // per reason; the others are counted in the next line).
  void Reject(Pending& p, const std::string& why);
  void Admit(Pending& p, const Message& join);
  void ReadLoop(uint64_t id, std::shared_ptr<Socket> sock);
  void TickLoop();
  void ReleaseAddress(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A joined connection's share of its address's count, once (closed by the policy, lost, or
  // the master stops).
  void ReleaseMember(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void JoinEndedReaders();

  // PolicyOutput, called by the policy with mu_ held.
  bool Send(uint64_t member, const Message& message, absl::Duration timeout) override
      ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto it = socks_.find(member);
    return it != socks_.end() && it->second->Send(message, absl::Now() + timeout).ok();
  }
  void Close(uint64_t member) override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // Its address's count first: once the peer sees the connection closed, it may open another.
    ReleaseMember(member);
    auto it = socks_.find(member);
    if (it == socks_.end()) return;
    it->second->Shutdown();
    socks_.erase(it);
  }
  absl::StatusOr<UniqueId> NewUniqueId() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto cancel = std::make_shared<Cancellation>();
    absl::StatusOr<UniqueId> id =
        CreateUniqueId(options_.bootstrap_host, options_.setup_timeout, BootstrapSecurity{},
                       cancel);
    if (id.ok()) roots_.push_back(std::move(cancel));
    return id;
  }
  void SupersedeRoots() override ABSL_NO_THREAD_SAFETY_ANALYSIS { StopRootsLocked("superseded"); }
  // Each root's thread ends at once: a root that answered already has nothing to stop.
  void StopRootsLocked(absl::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::shared_ptr<Cancellation>& root : roots_) {
      root->Cancel(absl::CancelledError(absl::StrCat(
          "bootstrap: this elastic epoch's root stopped: the epoch was ", why)));
    }
    roots_.clear();
  }

  ElasticMasterOptions options_;
  const std::shared_ptr<ElasticUnits> units_;
  std::string address_;
  absl::Duration peer_timeout_;
  std::unique_ptr<Socket> listener_;
  int epoll_fd_ = -1;  // the acceptor's: the listener and the connections waiting to join
  std::thread acceptor_, ticker_;

  Mutex& mu_;  // units_->mu: shared with the masters of the other shards
  std::unique_ptr<MembershipPolicy> policy_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Reader> readers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Socket>> socks_ ABSL_GUARDED_BY(mu_);  // open connections
  // The bootstrap roots of the current epoch (at most one): stopped when it is superseded.
  std::vector<std::shared_ptr<Cancellation>> roots_ ABSL_GUARDED_BY(mu_);
  // Open connections (joining or joined) per peer host.
  std::map<std::string, int> per_address_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> member_address_ ABSL_GUARDED_BY(mu_);  // joined: its host
  // Rejections of connections that never joined, for the rate-limited log (acceptor only).
  struct RejectLog {
    absl::Time last = absl::InfinitePast();
    int64_t unlogged = 0;
  };
  std::map<std::string, RejectLog> reject_log_;
};

absl::Status ElasticMaster::Impl::Start() {
  if (options_.job_id.empty()) return absl::InvalidArgumentError("ElasticMaster: job_id is empty");
  if (options_.handshake_timeout <= absl::ZeroDuration() ||
      options_.max_connections_per_address < 1 || options_.max_handshakes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ElasticMaster: handshake_timeout ", absl::FormatDuration(options_.handshake_timeout),
        ", max_connections_per_address ", options_.max_connections_per_address,
        " and max_handshakes ", options_.max_handshakes, " must be positive"));
  }
  if (options_.min_members < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ElasticMaster: min_members ", options_.min_members, " < 1"));
  }
  LBCC_ASSIGN_OR_RETURN(peer_timeout_, elastic::ResolvePeerTimeout(options_.peer_timeout));
  if (options_.setup_timeout <= absl::ZeroDuration()) {
    options_.setup_timeout = peer_timeout_ + absl::Seconds(5);
  }
  LBCC_ASSIGN_OR_RETURN(listener_, Socket::Listen(options_.listen_address, &address_));
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("ElasticMaster: epoll_create1: ", std::strerror(errno)));
  }
  if (options_.bootstrap_host.empty()) {
    LBCC_ASSIGN_OR_RETURN(const transport::HostAndPort bound,
                          transport::ParseHostPort(address_, "elastic master"));
    options_.bootstrap_host = bound.host;  // Without the brackets of an IPv6 address.
  }
  {
    MutexLock lock(&mu_);
    elastic::PolicyOutput* output = this;  // the server carries out the policy's decisions
    policy_ = std::make_unique<MembershipPolicy>(
        elastic::PolicyOptions{options_.job_id, address_, peer_timeout_, options_.min_members},
        &units_->table, output);
  }
  acceptor_ = std::thread([this] { AcceptLoop(); });
  ticker_ = std::thread([this] { TickLoop(); });
  LBCC_LOG(INFO) << "lbcc-master: job '" << options_.job_id << "' listening on " << address_;
  return absl::OkStatus();
}

void ElasticMaster::Impl::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [id, sock] : socks_) sock->Shutdown();
    if (policy_ != nullptr) policy_->Stop();
    StopRootsLocked("stopped with its master");
  }
  if (listener_) listener_->Shutdown();
  if (acceptor_.joinable()) acceptor_.join();
  if (ticker_.joinable()) ticker_.join();
  std::list<Reader> readers;
  {
    MutexLock lock(&mu_);
    readers.swap(readers_);
  }
  for (Reader& r : readers) r.thread.join();
}

void ElasticMaster::Impl::AcceptLoop() {
  // Keyed in accept order, which is also deadline order (every deadline is accept time +
  // handshake_timeout): begin() is the oldest and the next to expire.
  std::map<uint64_t, Pending> pending;
  uint64_t next_key = 1;  // 0 is the listener's
  bool listening = false;
  absl::Time listener_paused_until = absl::InfinitePast();
  absl::Time next_reap = absl::InfinitePast();
  auto watch = [&](int op, int fd, uint64_t key) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = key;
    epoll_ctl(epoll_fd_, op, fd, &e);
  };
  auto drop = [&](std::map<uint64_t, Pending>::iterator it) {
    watch(EPOLL_CTL_DEL, it->second.sock->fd(), 0);
    return pending.erase(it);
  };
  epoll_event events[64];
  while (true) {
    {
      MutexLock lock(&mu_);
      if (stopping_) break;
    }
    const absl::Time now = absl::Now();
    if (now >= next_reap) {
      JoinEndedReaders();
      next_reap = now + absl::Milliseconds(elastic::kPollSliceMs);
    }
    // Connections that did not join in time.
    while (!pending.empty() && pending.begin()->second.deadline <= now) {
      Pending& p = pending.begin()->second;
      Reject(p, absl::StrCat("no join within ", absl::FormatDuration(options_.handshake_timeout),
                             " (handshake_timeout; ", p.frames.buffered(), " bytes received)"));
      drop(pending.begin());
    }
    if (!listening && now >= listener_paused_until) {
      watch(EPOLL_CTL_ADD, listener_->fd(), 0);
      listening = true;
    }
    absl::Time wake = now + absl::Milliseconds(elastic::kPollSliceMs);
    if (!pending.empty()) wake = std::min(wake, pending.begin()->second.deadline);
    const int n = epoll_wait(epoll_fd_, events, 64, elastic::PollSliceMs(wake - now));
    bool accept = false;
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == 0) {
        accept = true;
        continue;
      }
      auto it = pending.find(key);
      if (it != pending.end() && ReadPending(it->second)) drop(it);
    }
    if (!accept) continue;
    while (true) {
      absl::StatusOr<std::unique_ptr<Socket>> sock = listener_->AcceptNow();
      if (!sock.ok()) {
        // Out of descriptors (EMFILE) or another listener failure: the listener would be
        // ready again at once; leave it a poll slice for connections to close.
        if (!absl::IsCancelled(sock.status())) {
          LBCC_LOG(WARN) << "lbcc-master: accept failed: " << sock.status();
        }
        watch(EPOLL_CTL_DEL, listener_->fd(), 0);
        listening = false;
        listener_paused_until = absl::Now() + absl::Milliseconds(elastic::kPollSliceMs);
        break;
      }
      if (*sock == nullptr) break;
      Pending p;
      p.sock = std::move(*sock);
      p.peer = p.sock->peer();
      absl::StatusOr<transport::HostAndPort> hp = transport::ParseHostPort(p.peer, "peer");
      p.address = hp.ok() ? hp->host : p.peer;
      p.deadline = absl::Now() + options_.handshake_timeout;
      int open = 0;
      {
        MutexLock lock(&mu_);
        open = ++per_address_[p.address];
      }
      if (open > options_.max_connections_per_address) {
        Reject(p, absl::StrCat("its address has ", options_.max_connections_per_address,
                               " connections open already (max_connections_per_address)"));
        continue;
      }
      if (static_cast<int>(pending.size()) >= options_.max_handshakes) {
        // The oldest has had the longest to send its join; a member sends it at once.
        Reject(pending.begin()->second,
               absl::StrCat(options_.max_handshakes,
                            " connections are waiting to join (max_handshakes), and it is the "
                            "oldest without a join"));
        drop(pending.begin());
      }
      const uint64_t key = next_key++;
      watch(EPOLL_CTL_ADD, p.sock->fd(), key);
      pending.emplace(key, std::move(p));
    }
  }
  for (auto& [key, p] : pending) p.sock->Shutdown();
  MutexLock lock(&mu_);
  for (auto& [key, p] : pending) ReleaseAddress(p.address);
}

bool ElasticMaster::Impl::ReadPending(Pending& p) {
  char buffer[4096];
  while (true) {
    absl::StatusOr<size_t> n = p.sock->ReadSome(buffer, sizeof(buffer));
    if (!n.ok()) {
      Reject(p, absl::StrCat("closed before it joined (", n.status().message(), ")"));
      return true;
    }
    if (*n == 0) return false;
    p.frames.Append(absl::string_view(buffer, *n));
    absl::StatusOr<std::optional<std::string>> frame = p.frames.Next();
    if (!frame.ok()) {
      Reject(p, std::string(frame.status().message()));
      return true;
    }
    if (!frame->has_value()) continue;
    absl::StatusOr<Message> m = elastic::Decode(**frame);
    if (!m.ok()) {
      Reject(p, std::string(m.status().message()));
      return true;
    }
    if (m->type != elastic::MsgType::kJoin) {
      Message refuse;
      refuse.type = elastic::MsgType::kRefuse;
      refuse.code = static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition);
      refuse.text = absl::StrCat("lbcc-master at ", address_,
                                 ": the first message must be a join, not type ",
                                 static_cast<int>(m->type));
      (void)p.sock->Send(refuse, absl::Now() + absl::Milliseconds(100));
      Reject(p, refuse.text);
      return true;
    }
    // Whatever followed the join (heartbeats sent before the answer) is the reader's.
    p.sock->Unread(p.frames.TakeBuffered());
    Admit(p, *m);
    return true;
  }
}

void ElasticMaster::Impl::Reject(Pending& p, const std::string& why) {
  {
    MutexLock lock(&mu_);
    ReleaseAddress(p.address);
  }
  p.sock->Shutdown();
  // The reason without numbers that differ per connection keys the rate limit.
  std::string key = why.substr(0, why.find_first_of("0123456789("));
  RejectLog& log = reject_log_[key];
  const absl::Time now = absl::Now();
  if (now - log.last < absl::Seconds(1)) {
    ++log.unlogged;
    return;
  }
  LBCC_LOG(WARN) << "lbcc-master: closed the connection from " << p.peer << ": " << why
                 << (log.unlogged > 0
                         ? absl::StrCat(" (and ", log.unlogged, " more for this reason since)")
                         : std::string());
  log.last = now;
  log.unlogged = 0;
}

void ElasticMaster::Impl::Admit(Pending& p, const Message& join) {
  MutexLock lock(&mu_);
  if (stopping_) {
    p.sock->Shutdown();
    ReleaseAddress(p.address);
    return;
  }
  const uint64_t id = policy_->Connected(p.peer, absl::Now());
  socks_[id] = p.sock;
  member_address_[id] = p.address;
  policy_->Received(id, join, absl::Now());
  auto done = std::make_shared<std::atomic<bool>>(false);
  readers_.push_back(Reader{std::thread([this, id, sock = p.sock, done] {
                              ReadLoop(id, sock);
                              done->store(true);
                            }),
                            done});
}

void ElasticMaster::Impl::ReleaseMember(uint64_t id) {
  auto it = member_address_.find(id);
  if (it == member_address_.end()) return;
  ReleaseAddress(it->second);
  member_address_.erase(it);
}

void ElasticMaster::Impl::ReleaseAddress(const std::string& address) {
  auto it = per_address_.find(address);
  if (it != per_address_.end() && --it->second <= 0) per_address_.erase(it);
}

void ElasticMaster::Impl::JoinEndedReaders() {
  std::list<Reader> ended;
  {
    MutexLock lock(&mu_);
    for (auto it = readers_.begin(); it != readers_.end();) {
      if (it->done->load()) {
        ended.splice(ended.end(), readers_, it++);
      } else {
        ++it;
      }
    }
  }
  for (Reader& r : ended) r.thread.join();
}

void ElasticMaster::Impl::ReadLoop(uint64_t id, std::shared_ptr<Socket> sock) {
  while (true) {
    absl::StatusOr<Message> m = sock->Receive(absl::InfiniteFuture(), elastic::kMaxMemberFrame);
    MutexLock lock(&mu_);
    if (stopping_ || !policy_->connected(id)) {
      ReleaseMember(id);  // the policy closed it (released then), or the master stops
      sock->Shutdown();
      return;
    }
    if (!m.ok()) {
      policy_->Lost(id, m.status().message());
      ReleaseMember(id);
      sock->Shutdown();
      return;
    }
    policy_->Received(id, *m, absl::Now());
  }
}

void ElasticMaster::Impl::TickLoop() {
  const absl::Duration period = std::max(peer_timeout_ / 4, absl::Milliseconds(10));
  MutexLock lock(&mu_);
  while (!stopping_) {
    // Every period, and sooner when set-up failures being collected are due to be settled
    // (MembershipPolicy::settle_due; one can begin while this thread waits).
    const absl::Time next_tick = absl::Now() + period;
    while (!stopping_) {
      const absl::Time due = std::min(next_tick, policy_->settle_due());
      if (absl::Now() >= due) break;
      mu_.AwaitWithDeadline(
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return stopping_ || policy_->settle_due() < due;
          },
          due);
    }
    if (stopping_) return;
    policy_->Tick(absl::Now());
  }
}

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
