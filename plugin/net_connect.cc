// Net's listen, connect and accept calls (connection set-up; never blocking).
#include "plugin/net.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "plugin/comm_core.h"
#include "plugin/connector.h"
#include "plugin/handle.h"
#include "plugin/net_device.h"

namespace lbcc::plugin {
namespace {

// One transport Connect() call waits at most this long (doubling up to kMaxSlice) so that
// Shutdown() never waits long for a running attempt.
constexpr absl::Duration kFirstSlice = absl::Seconds(5);
constexpr absl::Duration kMaxSlice = absl::Seconds(60);

}  // namespace

using transport::Endpoint;

absl::StatusOr<ListenComm*> Net::Listen(int dev, absl::Span<uint8_t> handle) {
  if (dev < 0 || dev >= num_devices()) {
    return absl::InvalidArgumentError(absl::StrCat("listen on device ", dev, " of ",
                                                   num_devices()));
  }
  if (handle.size() < kHandleBytes) return absl::InvalidArgumentError("handle buffer too small");
  Device* device = devices_[dev].get();
  LBCC_ASSIGN_OR_RETURN(const std::string address, device->EnsureListening());
  auto comm = std::make_unique<ListenComm>();
  comm->device = device->state();
  comm->core = std::make_shared<ListenCore>();
  comm->close_grace = options_.close_grace;
  {
    MutexLock lock(&comm->device->mu);
    if (comm->device->stopped) return absl::CancelledError("plugin shut down");
    do {
      comm->comm_id = RandomId();
    } while (comm->comm_id == 0 || comm->device->listeners.contains(comm->comm_id));
    comm->device->listeners[comm->comm_id] = comm->core;
  }
  absl::Status encoded = EncodeListenHandle({address, comm->comm_id}, handle);
  if (!encoded.ok()) {
    MutexLock lock(&comm->device->mu);
    comm->device->listeners.erase(comm->comm_id);
    return encoded;
  }
  RegisterObject(comm.get(), ObjectKind::kListen);
  return comm.release();
}

absl::StatusOr<SendComm*> Net::Connect(int dev, absl::Span<uint8_t> handle) {
  if (handle.size() < kHandleBytes) return absl::InvalidArgumentError("handle buffer too small");
  if (dev < 0 || dev >= num_devices()) {
    return absl::InvalidArgumentError(absl::StrCat("connect on device ", dev, " of ",
                                                   num_devices()));
  }
  std::optional<ConnectStage> stage = ReadConnectStage(handle);
  if (!stage.has_value() || stage->net_instance != instance_) {
    absl::StatusOr<ListenHandle> decoded = DecodeListenHandle(handle);
    if (!decoded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("connect: not a listen handle of this plugin: ",
                       decoded.status().message()));
    }
    LBCC_ASSIGN_OR_RETURN(const uint64_t id,
                          connector_->Start(devices_[dev].get(), std::move(*decoded)));
    WriteConnectStage(handle, {instance_, id});
    return nullptr;
  }
  LBCC_ASSIGN_OR_RETURN(auto outcome, connector_->Poll(stage->attempt_id));
  if (!outcome.has_value()) return nullptr;  // Still connecting.
  ClearConnectStage(handle);
  LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> endpoint, std::move(*outcome));
  Device* device = devices_[dev].get();
  NoteNewLink(device->state().get(), *endpoint, "send comm to");
  auto comm = std::make_unique<SendComm>();
  comm->core = std::make_shared<CommCore>(std::move(endpoint), /*send=*/true, device->state(),
                                          options_.close_grace);
  comm->core->self = comm->core;
  RegisterObject(comm.get(), ObjectKind::kSend);
  return comm.release();
}

absl::StatusOr<std::unique_ptr<Endpoint>> Net::RunAttempt(Device* device,
                                                          const std::string& address,
                                                          uint64_t comm_id) {
  LBCC_ASSIGN_OR_RETURN(transport::Transport * transport, device->TransportForConnect());
  transport::ConnectOptions connect_options;
  if (device->spec().link_class.has_value()) {
    connect_options.has_link_class = true;
    connect_options.link_class = *device->spec().link_class;
  }
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  absl::Duration slice = kFirstSlice;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    absl::StatusOr<std::unique_ptr<Endpoint>> endpoint =
        transport->Connect(address, std::max(std::min(slice, left), absl::Milliseconds(1)),
                           connect_options);
    if (endpoint.ok()) {
      auto hello = std::make_shared<std::array<uint8_t, kHelloBytes>>();
      std::memcpy(hello->data(), &kHelloMagic, 4);
      std::memcpy(hello->data() + 4, &kHelloVersion, 2);
      std::memcpy(hello->data() + 8, &comm_id, 8);
      (*endpoint)->Send(kHelloTag, absl::MakeConstSpan(*hello), {transport::Priority::kHigh},
                        [hello](absl::Status) {});
      return endpoint;
    }
    const absl::StatusCode code = endpoint.status().code();
    const bool retry = code == absl::StatusCode::kDeadlineExceeded ||
                       code == absl::StatusCode::kUnavailable;
    if (!retry || connector_->stopping() || absl::Now() >= deadline) {
      return absl::Status(
          code, absl::StrCat("connect to ", address, " (dev ", device->spec().name, "): ",
                             endpoint.status().message(),
                             retry ? " (is that rank behind NAT or a firewall that refuses inbound "
                                     "connections? the plugin cannot reach such a rank: "
                                     "docs/nat.md)"
                                   : ""));
    }
    slice = std::min(slice * 2, kMaxSlice);
  }
}

absl::StatusOr<RecvComm*> Net::Accept(ListenComm* listen) {
  if (listen == nullptr || LookupObject(listen) != ObjectKind::kListen) {
    return absl::InvalidArgumentError("not an open listen comm of this plugin");
  }
  std::unique_ptr<Endpoint> endpoint;
  {
    MutexLock lock(&listen->core->mu);
    if (listen->core->ready.empty()) return nullptr;
    endpoint = std::move(listen->core->ready.front());
    listen->core->ready.pop_front();
  }
  NoteNewLink(listen->device.get(), *endpoint, "receive comm from");
  auto comm = std::make_unique<RecvComm>();
  comm->core = std::make_shared<CommCore>(std::move(endpoint), /*send=*/false, listen->device,
                                          listen->close_grace);
  comm->core->self = comm->core;
  RegisterObject(comm.get(), ObjectKind::kRecv);
  return comm.release();
}

absl::Status Net::CloseListen(ListenComm* comm) {
  if (comm == nullptr || !UnregisterObject(comm, ObjectKind::kListen)) {
    return absl::InvalidArgumentError("closeListen: not an open listen comm of this plugin");
  }
  {
    MutexLock lock(&comm->device->mu);
    comm->device->listeners.erase(comm->comm_id);
  }
  std::deque<std::unique_ptr<Endpoint>> unaccepted;
  {
    MutexLock lock(&comm->core->mu);
    comm->core->closed = true;
    unaccepted.swap(comm->core->ready);
  }
  unaccepted.clear();  // Connections nobody accepted: their peers see the link close.
  comm->magic = 0;
  delete comm;
  return absl::OkStatus();
}

}  // namespace lbcc::plugin
