#include "plugin/net_options.h"

#include <algorithm>
#include <utility>

#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "plugin/device.h"
#include "transport/netif.h"
#include "transport/ucx_transport.h"

namespace lbcc::plugin {

absl::StatusOr<NetOptions> NetOptions::FromEnv() {
  NetOptions options;
  // NCCL has every rank listen and its peers connect, and the plugin's links are UCX's, whose
  // tcp lanes connect from both ends (docs/nat.md): a rank that cannot be dialed cannot take part.
  LBCC_ASSIGN_OR_RETURN(const std::string reachable, env::GetString("LBCC_REACHABLE"));
  if (reachable == "no") {
    return absl::FailedPreconditionError(
        "LBCC_REACHABLE=no: this rank cannot be dialed (behind NAT or a firewall), and the NCCL "
        "net plugin needs every rank's listener reachable (NCCL's peers connect to it, and the "
        "plugin's UCX links connect from both ends); run such a rank with LBCC's own "
        "collectives over LBCC_TRANSPORT=socket (docs/nat.md)");
  }
  LBCC_ASSIGN_OR_RETURN(options.transport, transport::TransportOptions::FromEnv());
  LBCC_ASSIGN_OR_RETURN(const std::string spec, env::GetString("LBCC_PLUGIN_DEVICES"));
  const std::vector<Interface> interfaces = ListInterfaces();
  std::vector<DeviceConfig> devices;
  if (spec.empty()) {
    devices = DefaultDevices(interfaces);
  } else {
    LBCC_ASSIGN_OR_RETURN(devices, ParseDevices(spec, interfaces));
  }
  for (DeviceConfig& device : devices) {
    options.devices.push_back(
        {device.name, transport::JoinHostPort(device.ip, 0), device.ifname, device.link_class});
  }
  LBCC_ASSIGN_OR_RETURN(const double timeout_s, env::GetDouble("LBCC_TIMEOUT_S"));
  options.connect_timeout = absl::Seconds(timeout_s);
  LBCC_ASSIGN_OR_RETURN(options.speed_mbits, env::GetDouble("LBCC_PLUGIN_SPEED_MBITS"));
  LBCC_ASSIGN_OR_RETURN(options.latency_us, env::GetDouble("LBCC_PLUGIN_LATENCY_US"));
  options.close_grace = std::max(options.transport.peer_timeout, absl::Seconds(1));
  LBCC_ASSIGN_OR_RETURN(const int64_t staging_bytes, env::GetBytes("LBCC_PLUGIN_STAGING_BYTES"));
  options.staging_bytes = static_cast<size_t>(staging_bytes);
  absl::StatusOr<std::unique_ptr<Gpu>> gpu = NewCudaGpu();
  if (gpu.ok()) {
    options.gpu = std::move(*gpu);
    LBCC_LOG(INFO) << "CUDA memory: staged through pinned host buffers (at most "
                   << options.staging_bytes << " bytes)";
  } else if (gpu.status().code() != absl::StatusCode::kUnimplemented) {
    LBCC_LOG(INFO) << "host memory only: " << gpu.status().message();
  }
  options.make_transport = [](const transport::TransportOptions& transport_options) {
    return transport::NewUcxTransport(transport_options);
  };
  return options;
}

}  // namespace lbcc::plugin
