// ElasticMaster (elastic.h): the membership service's socket server around MembershipPolicy
// (membership_policy.h). One acceptor thread, one reader thread per connection, one ticker
// thread (heartbeats, silence checks); each feeds its events to the policy under the mutex the
// masters of one model share (ElasticUnits::mu), and the policy's decisions are carried out on
// the members' sockets before the mutex is released.
#include <algorithm>
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
  ~Impl() override { Stop(); }

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

  void AcceptLoop();
  void ReadLoop(uint64_t id, std::shared_ptr<Socket> sock);
  void TickLoop();

  // PolicyOutput, called by the policy with mu_ held.
  bool Send(uint64_t member, const Message& message, absl::Duration timeout) override
      ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto it = socks_.find(member);
    return it != socks_.end() && it->second->Send(message, absl::Now() + timeout).ok();
  }
  void Close(uint64_t member) override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto it = socks_.find(member);
    if (it == socks_.end()) return;
    it->second->Shutdown();
    socks_.erase(it);
  }
  absl::StatusOr<UniqueId> NewUniqueId() override {
    return CreateUniqueId(options_.bootstrap_host, options_.setup_timeout);
  }

  ElasticMasterOptions options_;
  const std::shared_ptr<ElasticUnits> units_;
  std::string address_;
  absl::Duration peer_timeout_;
  std::unique_ptr<Socket> listener_;
  std::thread acceptor_, ticker_;

  Mutex& mu_;  // units_->mu: shared with the masters of the other shards
  std::unique_ptr<MembershipPolicy> policy_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> readers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Socket>> socks_ ABSL_GUARDED_BY(mu_);  // open connections
};

absl::Status ElasticMaster::Impl::Start() {
  if (options_.job_id.empty()) return absl::InvalidArgumentError("ElasticMaster: job_id is empty");
  if (options_.min_members < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ElasticMaster: min_members ", options_.min_members, " < 1"));
  }
  LBCC_ASSIGN_OR_RETURN(peer_timeout_, elastic::ResolvePeerTimeout(options_.peer_timeout));
  if (options_.setup_timeout <= absl::ZeroDuration()) {
    options_.setup_timeout = peer_timeout_ + absl::Seconds(5);
  }
  LBCC_ASSIGN_OR_RETURN(listener_, Socket::Listen(options_.listen_address, &address_));
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

void ElasticMaster::Impl::AcceptLoop() {
  while (true) {
    absl::StatusOr<std::unique_ptr<Socket>> sock =
        listener_->Accept(absl::Now() + absl::Milliseconds(200));
    MutexLock lock(&mu_);
    if (stopping_) return;
    if (!sock.ok()) continue;
    std::shared_ptr<Socket> shared = std::move(*sock);
    const uint64_t id = policy_->Connected(shared->peer(), absl::Now());
    socks_[id] = shared;
    readers_.emplace_back([this, id, shared] { ReadLoop(id, shared); });
  }
}

void ElasticMaster::Impl::ReadLoop(uint64_t id, std::shared_ptr<Socket> sock) {
  while (true) {
    absl::StatusOr<Message> m = sock->Receive(absl::InfiniteFuture());
    MutexLock lock(&mu_);
    if (stopping_ || !policy_->connected(id)) return;
    if (!m.ok()) {
      policy_->Lost(id, m.status().message());
      return;
    }
    policy_->Received(id, *m, absl::Now());
  }
}

void ElasticMaster::Impl::TickLoop() {
  const absl::Duration period = std::max(peer_timeout_ / 4, absl::Milliseconds(10));
  MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; },
                         period);
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
