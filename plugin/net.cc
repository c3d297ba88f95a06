#include "plugin/net.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "plugin/comm_core.h"
#include "plugin/connector.h"
#include "plugin/device.h"
#include "plugin/handle.h"
#include "plugin/net_device.h"
#include "plugin/staging.h"

namespace lbcc::plugin {

using transport::LinkClass;

Net::Net(NetOptions options) : options_(std::move(options)), instance_(RandomId()) {}

absl::StatusOr<std::unique_ptr<Net>> Net::Create(NetOptions options) {
  if (options.devices.empty()) return absl::InvalidArgumentError("no network device");
  if (!options.make_transport) return absl::InvalidArgumentError("no transport factory");
  std::unique_ptr<Net> net(new Net(std::move(options)));
  std::shared_ptr<StagingPool> staging;
  if (net->options_.gpu != nullptr) {
    staging = std::make_shared<StagingPool>(net->options_.gpu, net->options_.staging_bytes);
  }
  for (size_t i = 0; i < net->options_.devices.size(); ++i) {
    net->devices_.push_back(std::make_unique<Device>(
        static_cast<int>(i), net->options_.devices[i], &net->options_, staging));
  }
  net->connector_ = std::make_unique<ConnectorPool>(
      [raw = net.get()](Device* device, const ListenHandle& handle) {
        return raw->RunAttempt(device, handle.address, handle.comm_id);
      });
  return net;
}

Net::~Net() { Shutdown(); }

void Net::Shutdown() {
  // Attempts first: they use the devices' transports. Shutting the transports down makes a
  // running attempt return at once rather than at the end of its slice; then the connector
  // threads are joined, and only then are the transports destroyed.
  if (connector_ != nullptr) connector_->RequestStop();
  for (auto& device : devices_) device->Interrupt();
  if (connector_ != nullptr) connector_->Stop();
  for (auto& device : devices_) device->Shutdown();
}

int Net::num_devices() const { return static_cast<int>(devices_.size()); }

absl::StatusOr<DeviceProperties> Net::Properties(int dev) const {
  if (dev < 0 || dev >= num_devices()) {
    return absl::InvalidArgumentError(absl::StrCat("device ", dev, " of ", num_devices()));
  }
  const Device& device = *devices_[dev];
  const DeviceSpec& spec = device.spec();
  DeviceProperties props;
  props.name = spec.name;
  props.pci_path = InterfacePciPath(spec.ifname);
  props.guid = static_cast<uint64_t>(dev);
  props.max_comms = 1 << 20;
  props.max_recvs = kMaxRecvs;
  props.max_message_bytes = kMaxMessageBytes;
  props.ptr_support = kPtrHost | (options_.gpu != nullptr ? kPtrCuda : 0);

  double slowest = 0;
  double rtt = 0;
  {
    DeviceState* state = device.state().get();
    MutexLock lock(&state->mu);
    slowest = state->slowest_slow_bytes_per_second;
    rtt = state->shortest_rtt_seconds;
  }
  const std::optional<LinkClass> configured =
      spec.link_class.has_value() ? spec.link_class : options_.transport.link_class;
  const double pace = options_.transport.scheduler.pace_bytes_per_second;
  double speed = 0;
  if (options_.speed_mbits > 0) {
    speed = options_.speed_mbits;
    props.speed_source = "configured";
  } else if (configured == LinkClass::kSlow && pace > 0) {
    speed = pace * 8e-6;
    props.speed_source = "paced";
  } else if (slowest > 0) {
    speed = slowest * 8e-6;
    props.speed_source = "measured";
  } else if (const int interface_speed = InterfaceSpeedMbits(spec.ifname); interface_speed > 0) {
    speed = interface_speed;
    props.speed_source = "interface";
  } else {
    speed = 10000;
    props.speed_source = "default";
  }
  props.speed_mbits = static_cast<int>(std::clamp(speed, 1.0, static_cast<double>(INT_MAX)));
  if (options_.latency_us > 0) {
    props.latency_us = static_cast<float>(options_.latency_us);
  } else if (rtt > 0) {
    props.latency_us = static_cast<float>(rtt / 2 * 1e6);
  }
  return props;
}

}  // namespace lbcc::plugin
