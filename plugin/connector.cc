#include "plugin/connector.h"

#include <pthread.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace lbcc::plugin {
namespace {

// Connection attempts run on at most this many threads.
constexpr int kConnectThreads = 4;

}  // namespace

using transport::Endpoint;

absl::StatusOr<uint64_t> ConnectorPool::Start(Device* device, ListenHandle handle) {
  MutexLock lock(&mu_);
  if (stop_) return absl::CancelledError("plugin shut down");
  auto attempt = std::make_shared<ConnectAttempt>();
  attempt->id = next_id_++;
  attempt->device = device;
  attempt->handle = std::move(handle);
  attempts_[attempt->id] = attempt;
  queue_.push_back(attempt);
  if (idle_ == 0 && static_cast<int>(threads_.size()) < kConnectThreads) {
    threads_.emplace_back([this] { Work(); });
  } else {
    cv_.Signal();
  }
  return attempt->id;
}

absl::StatusOr<ConnectorPool::Outcome> ConnectorPool::Poll(uint64_t id) {
  MutexLock lock(&mu_);
  if (stop_) return absl::CancelledError("plugin shut down");
  auto it = attempts_.find(id);
  if (it == attempts_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("connect: the handle names attempt ", id, ", which this plugin does not "
                     "know (a handle reused after its connect finished?)"));
  }
  if (!it->second->done) return Outcome();
  std::shared_ptr<ConnectAttempt> attempt = std::move(it->second);
  attempts_.erase(it);
  return Outcome(std::move(attempt->result));
}

void ConnectorPool::RequestStop() {
  MutexLock lock(&mu_);
  stop_ = true;
  stop_flag_.store(true);
  cv_.SignalAll();
}

void ConnectorPool::Stop() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    stop_flag_.store(true);
    cv_.SignalAll();
    threads.swap(threads_);
  }
  for (std::thread& thread : threads) thread.join();
  // Results nobody collected are endpoints of transports about to close: drop them first.
  absl::flat_hash_map<uint64_t, std::shared_ptr<ConnectAttempt>> attempts;
  {
    MutexLock lock(&mu_);
    attempts.swap(attempts_);
    queue_.clear();
  }
}

void ConnectorPool::Work() {
  pthread_setname_np(pthread_self(), "lbcc-net-conn");
  MutexLock lock(&mu_);
  while (true) {
    while (queue_.empty() && !stop_) {
      ++idle_;
      cv_.Wait(&mu_);
      --idle_;
    }
    if (stop_) return;
    std::shared_ptr<ConnectAttempt> attempt = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    absl::StatusOr<std::unique_ptr<Endpoint>> result =
        connect_(attempt->device, attempt->handle);
    mu_.Lock();
    attempt->result = std::move(result);
    attempt->done = true;
  }
}

}  // namespace lbcc::plugin
