// The network devices the plugin offers NCCL: which local addresses it listens on, the link class
// configured for each, and what the operating system says about the interface behind it.
//
// LBCC_PLUGIN_DEVICES lists them, comma-separated; each entry is an interface name, an IPv4 or
// IPv6 address (bare or in brackets) or a host name (resolved with getaddrinfo: its first
// address, IPv4 before IPv6), optionally followed by =fast or =slow:
//
//   LBCC_PLUGIN_DEVICES=eth0                 one device, link class from the transport
//   LBCC_PLUGIN_DEVICES=eth0=fast,eth1=slow  two devices with explicit classes
//   LBCC_PLUGIN_DEVICES=fd77::2=slow         an IPv6 address
//   LBCC_PLUGIN_DEVICES=127.0.0.1            loopback (tests)
//
// An interface listens on its first address (IPv4 before IPv6). Empty (the default): every
// interface that is up with an IPv4 or a global IPv6 address, except loopback and docker*,
// sorted by name, one device each; loopback alone when there is no other.
//
// Thread-safety: pure functions (they read /sys and the interface list).
#ifndef LBCC_PLUGIN_DEVICE_H_
#define LBCC_PLUGIN_DEVICE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/transport.h"

namespace lbcc::plugin {

struct Interface {
  std::string name;  // "eth0".
  std::string ip;    // Numeric: "10.0.0.2", "fd77::2".
  bool loopback = false;
  bool ipv6 = false;
};

// Up interfaces' addresses, IPv4 and global IPv6 (transport::ListNetInterfaces: IPv4 first,
// getifaddrs order otherwise); an interface with both appears once per address.
std::vector<Interface> ListInterfaces();

struct DeviceConfig {
  std::string name;    // What NCCL shows: the interface name, or the address when no interface has it.
  std::string ip;      // Listen address, numeric (no brackets).
  std::string ifname;  // Empty when the address belongs to no interface found.
  std::optional<transport::LinkClass> link_class;  // Configured; empty: the transport decides.
  bool ipv6 = false;
};

// Parses the LBCC_PLUGIN_DEVICES syntax above against `interfaces`. InvalidArgument naming the
// entry for an unknown interface or a name that does not resolve, a malformed class, or a
// duplicate.
absl::StatusOr<std::vector<DeviceConfig>> ParseDevices(absl::string_view spec,
                                                       const std::vector<Interface>& interfaces);

// The devices used when LBCC_PLUGIN_DEVICES is empty.
std::vector<DeviceConfig> DefaultDevices(const std::vector<Interface>& interfaces);

// The interface's speed from /sys/class/net/<ifname>/speed in Mbit/s; 0 when unknown (loopback,
// virtual devices, no such file).
int InterfaceSpeedMbits(const std::string& ifname);

// The PCI path of the interface's device (realpath of /sys/class/net/<ifname>/device); empty for
// virtual interfaces.
std::string InterfacePciPath(const std::string& ifname);

}  // namespace lbcc::plugin

#endif  // LBCC_PLUGIN_DEVICE_H_
