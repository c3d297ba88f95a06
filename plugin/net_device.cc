#include "plugin/net_device.h"

#include <pthread.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "transport/options.h"

namespace lbcc::plugin {
namespace {

// The acceptor thread looks at its stop flag this often.
constexpr absl::Duration kAcceptPoll = absl::Milliseconds(100);

}  // namespace

using transport::Endpoint;

absl::StatusOr<std::string> Device::EnsureListening() {
  MutexLock lock(&mu_);
  if (!address_.empty()) return address_;
  LBCC_ASSIGN_OR_RETURN(transport::Transport * transport, GetTransportLocked());
  LBCC_ASSIGN_OR_RETURN(address_, transport->Listen(spec_.listen_address),
                        _.Prepend(absl::StrCat("device ", spec_.name, ": ")));
  acceptor_ = std::thread([this, transport] { AcceptLoop(transport); });
  LBCC_LOG(INFO) << "dev " << state_->index << " (" << spec_.name << ") listens on " << address_
                 << " over " << transport->backend();
  return address_;
}

void Device::Interrupt() {
  stop_.store(true);
  MutexLock lock(&mu_);
  if (transport_ != nullptr) transport_->Shutdown();
}

void Device::Shutdown() {
  std::unique_ptr<transport::Transport> transport;
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    transport = std::move(transport_);
  }
  stop_.store(true);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  std::vector<std::shared_ptr<ListenCore>> listeners;
  {
    MutexLock lock(&state_->mu);
    state_->stopped = true;
    for (auto& [id, endpoint] : state_->greeting) endpoints.push_back(std::move(endpoint));
    state_->greeting.clear();
    for (auto& endpoint : state_->graveyard) endpoints.push_back(std::move(endpoint));
    state_->graveyard.clear();
    for (auto& [id, listener] : state_->listeners) listeners.push_back(listener);
  }
  for (auto& listener : listeners) {
    MutexLock lock(&listener->mu);
    for (auto& endpoint : listener->ready) endpoints.push_back(std::move(endpoint));
    listener->ready.clear();
  }
  endpoints.clear();  // Closes them.
  // Closes every endpoint they made: open comms fail with Cancelled.
  transport.reset();
}

absl::StatusOr<transport::Transport*> Device::GetTransportLocked() {
  if (shut_down_) return absl::CancelledError("plugin shut down");
  if (transport_ == nullptr) {
    // UCX's tcp transport takes the listen address's family first (transport/options.h).
    transport::TransportOptions options = options_->transport;
    const absl::Status family = transport::PinUcxAddressFamily(
        absl::StartsWith(spec_.listen_address, "["), !spec_.ifname.empty(), &options);
    if (!family.ok()) return Annotate(family, absl::StrCat("device ", spec_.name));
    LBCC_ASSIGN_OR_RETURN(transport_, options_->make_transport(options),
                          _.Prepend(absl::StrCat("device ", spec_.name, ": ")));
  }
  return transport_.get();
}

void Device::AcceptLoop(transport::Transport* transport) {
  pthread_setname_np(pthread_self(), "lbcc-net-accept");
  while (!stop_.load()) {
    absl::StatusOr<std::unique_ptr<Endpoint>> endpoint = transport->Accept(kAcceptPoll);
    {
      std::vector<std::unique_ptr<Endpoint>> dead;
      {
        MutexLock lock(&state_->mu);
        dead.swap(state_->graveyard);
      }
    }
    if (endpoint.ok()) {
      Greet(std::move(*endpoint));
    } else if (endpoint.status().code() != absl::StatusCode::kDeadlineExceeded) {
      if (!stop_.load()) {
        LBCC_LOG(WARN) << "dev " << state_->index << ": accepting stopped: "
                       << endpoint.status();
      }
      return;
    }
  }
}

void Device::Greet(std::unique_ptr<Endpoint> endpoint) {
  Endpoint* raw = endpoint.get();
  uint64_t id;
  {
    MutexLock lock(&state_->mu);
    id = state_->next_greeting++;
    state_->greeting.emplace(id, std::move(endpoint));
  }
  auto buffer = std::make_shared<std::array<uint8_t, kHelloBytes>>();
  // The endpoint stays in `greeting` (or moves to a listen comm) until the callback ran, and
  // only this thread destroys endpoints of the graveyard, so `raw` is valid here.
  raw->Recv(kHelloTag, absl::MakeSpan(*buffer),
            [state = state_, id, buffer](absl::StatusOr<size_t> length) {
              OnHello(state.get(), id, *buffer, std::move(length));
            });
}

void Device::OnHello(DeviceState* state, uint64_t id,
                     const std::array<uint8_t, kHelloBytes>& hello, absl::StatusOr<size_t> length) {
  MutexLock lock(&state->mu);
  auto it = state->greeting.find(id);
  if (it == state->greeting.end()) return;  // Shut down meanwhile.
  std::unique_ptr<Endpoint> endpoint = std::move(it->second);
  state->greeting.erase(it);
  uint32_t magic = 0;
  uint16_t version = 0;
  uint64_t comm_id = 0;
  std::memcpy(&magic, hello.data(), 4);
  std::memcpy(&version, hello.data() + 4, 2);
  std::memcpy(&comm_id, hello.data() + 8, 8);
  std::shared_ptr<ListenCore> listener;
  if (!length.ok()) {
    LBCC_LOG(INFO) << "dev " << state->index << ": connection from "
                   << endpoint->peer_address() << " ended before its hello: " << length.status();
  } else if (*length != kHelloBytes || magic != kHelloMagic || version != kHelloVersion) {
    LBCC_LOG(WARN) << "dev " << state->index << ": connection from "
                   << endpoint->peer_address() << " sent no LBCC hello; closing it";
  } else {
    auto found = state->listeners.find(comm_id);
    if (found != state->listeners.end()) {
      listener = found->second;
    } else {
      LBCC_LOG(INFO) << "dev " << state->index << ": connection from "
                     << endpoint->peer_address() << " for a closed listen comm; closing it";
    }
  }
  if (listener != nullptr) {
    MutexLock listener_lock(&listener->mu);
    if (!listener->closed) {
      listener->ready.push_back(std::move(endpoint));
      return;
    }
  }
  endpoint->Close();
  state->graveyard.push_back(std::move(endpoint));
}

}  // namespace lbcc::plugin
