// NetOptions: every setting of the plugin's Net (devices, transport options, timeouts, reported
// speed and latency, device-memory staging), resolved once when the plugin starts; Net reads
// nothing from the environment afterwards.
//
// FromEnv() is the one place that builds them from the LBCC_* variables (and the UCX backend
// as the transport factory); tests fill the struct directly (loopback transport, emulated GPU).
//
// Thread-safety: a plain value; FromEnv() may run on any thread.
#ifndef LBCC_PLUGIN_NET_OPTIONS_H_
#define LBCC_PLUGIN_NET_OPTIONS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plugin/gpu.h"
#include "transport/options.h"
#include "transport/transport.h"

namespace lbcc::plugin {

struct DeviceSpec {
  std::string name;            // Shown to NCCL.
  std::string listen_address;  // Passed to Transport::Listen ("10.0.0.2:0"; a name for loopback).
  std::string ifname;          // For the speed and PCI path; may be empty.
  std::optional<transport::LinkClass> link_class;  // Configured; empty: the transport decides.
};

struct NetOptions {
  std::vector<DeviceSpec> devices;
  transport::TransportOptions transport;
  // Makes each device's transport (default: UCX).
  std::function<absl::StatusOr<std::unique_ptr<transport::Transport>>(
      const transport::TransportOptions&)>
      make_transport;
  // A connection attempt fails after this long (LBCC_TIMEOUT_S).
  absl::Duration connect_timeout = absl::Seconds(300);
  // Reported device speed (LBCC_PLUGIN_SPEED_MBITS) and latency (LBCC_PLUGIN_LATENCY_US);
  // 0: derived, see Net::Properties().
  double speed_mbits = 0;
  double latency_us = 0;
  // Close*() wait at most this long for the transport to release the buffers of pending requests.
  absl::Duration close_grace = absl::Seconds(10);
  // Device memory (NCCL_PTR_CUDA): the Gpu that stages it through pinned host buffers; null:
  // host memory only (a build without CUDA, or no CUDA device). FromEnv: NewCudaGpu().
  std::shared_ptr<Gpu> gpu;
  // Pinned staging buffers allocated at most (LBCC_PLUGIN_STAGING_BYTES), over all comms; a comm
  // holding none may exceed it by one request (see staging.h).
  size_t staging_bytes = size_t{256} << 20;

  // Devices from LBCC_PLUGIN_DEVICES (device.h), transport options from the LBCC_* transport
  // variables, the UCX backend. InvalidArgument for a bad value.
  static absl::StatusOr<NetOptions> FromEnv();
};

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_NET_OPTIONS_H_
