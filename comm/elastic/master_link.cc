#include "comm/elastic/master_link.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace lbcc::comm::elastic {

absl::StatusOr<std::unique_ptr<MasterLink>> MasterLink::Connect(const std::string& address,
                                                                const Message& join,
                                                                absl::Time connect_deadline,
                                                                absl::Duration answer_timeout,
                                                                Message* welcome) {
  LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Socket> sock, Socket::Connect(address, connect_deadline));
  LBCC_RETURN_IF_ERROR(sock->Send(join, absl::Now() + absl::Seconds(5)));
  LBCC_ASSIGN_OR_RETURN(*welcome, sock->Receive(absl::Now() + answer_timeout));
  LBCC_RETURN_IF_ERROR(JoinAnswerStatus(*welcome));
  return std::unique_ptr<MasterLink>(new MasterLink(std::move(sock)));
}

MasterLink::~MasterLink() {
  Shutdown();
  StopHeartbeats();
  Join();
}

void MasterLink::Start(Listener* listener, absl::Duration peer_timeout) {
  listener_ = listener;
  peer_timeout_ = peer_timeout;
  {
    MutexLock lock(&mu_);
    last_heard_ = absl::Now();
  }
  reader_ = std::thread([this] { ReadLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

absl::Status MasterLink::Send(const Message& message, absl::Duration timeout) {
  return sock_->Send(message, absl::Now() + timeout);
}

void MasterLink::StopHeartbeats() {
  MutexLock lock(&mu_);
  heartbeats_stopped_ = true;
}

void MasterLink::Shutdown() { sock_->Shutdown(); }

void MasterLink::Join() {
  for (std::thread* t : {&reader_, &heartbeat_}) {
    if (t->joinable()) t->join();
  }
}

void MasterLink::ReadLoop() {
  while (true) {
    absl::StatusOr<Message> m = sock_->Receive(absl::InfiniteFuture());
    if (!m.ok()) {
      listener_->OnClosed(m.status());
      return;
    }
    {
      MutexLock lock(&mu_);
      last_heard_ = absl::Now();
    }
    if (!listener_->OnMessage(*m)) return;
  }
}

void MasterLink::HeartbeatLoop() {
  const absl::Duration period = std::max(peer_timeout_ / 4, absl::Milliseconds(10));
  absl::Time last_tick = absl::Now();
  while (true) {
    absl::Duration silent;
    {
      MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(
          [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeats_stopped_; }, period);
      if (heartbeats_stopped_) return;
      const absl::Time now = absl::Now();
      if (now - last_tick > peer_timeout_ / 2) {
        // This process was stalled (SIGSTOP, swapped out), not the master: give the reader a
        // period to take what the master sent meanwhile (an eviction) before judging it.
        last_heard_ = std::max(last_heard_, now - peer_timeout_ + period);
      }
      last_tick = now;
      silent = now - last_heard_;
    }
    if (silent > peer_timeout_) {
      listener_->OnSilent(silent);
      Shutdown();
      return;
    }
    Message hb;
    hb.type = MsgType::kHeartbeat;
    // A failed send means the connection is gone: the reader takes what the master sent
    // before it closed (an eviction) and then the end; the silence check covers the rest.
    (void)Send(hb, period);
  }
}

}  // namespace lbcc::comm::elastic
