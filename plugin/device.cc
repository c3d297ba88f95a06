#include "plugin/device.h"

#include <climits>
#include <cstdlib>
#include <fstream>
#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "transport/netif.h"
#include "transport/options.h"

namespace lbcc::plugin {

std::vector<Interface> ListInterfaces() {
  std::vector<Interface> result;
  for (const transport::NetInterface& i : transport::ListNetInterfaces()) {
    result.push_back({i.name, i.address, i.loopback, i.ipv6});
  }
  return result;
}

namespace {

// "[fd77::2]" -> "fd77::2"; anything else unchanged.
absl::string_view Unbracket(absl::string_view target) {
  if (target.size() > 2 && target.front() == '[' && target.back() == ']') {
    return target.substr(1, target.size() - 2);
  }
  return target;
}

}  // namespace

absl::StatusOr<std::vector<DeviceConfig>> ParseDevices(absl::string_view spec,
                                                       const std::vector<Interface>& interfaces) {
  std::vector<DeviceConfig> devices;
  std::set<std::string> seen;
  for (absl::string_view raw : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    const absl::string_view entry = absl::StripAsciiWhitespace(raw);
    std::vector<absl::string_view> parts = absl::StrSplit(entry, '=');
    if (parts.size() > 2 || parts[0].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LBCC_PLUGIN_DEVICES entry '", entry,
                       "': expected <interface|address|host name>[=fast|=slow]"));
    }
    DeviceConfig device;
    if (parts.size() == 2) {
      absl::StatusOr<transport::LinkClass> link_class = transport::ParseLinkClass(parts[1]);
      if (!link_class.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("LBCC_PLUGIN_DEVICES entry '", entry,
                                                       "': ", link_class.status().message()));
      }
      device.link_class = *link_class;
    }
    const std::string target(Unbracket(absl::StripAsciiWhitespace(parts[0])));
    // An interface name first (the first of its addresses: IPv4 before IPv6).
    for (const Interface& interface : interfaces) {
      if (interface.name == target) {
        device.ifname = interface.name;
        device.ip = interface.ip;
        device.name = interface.name;
        device.ipv6 = interface.ipv6;
        break;
      }
    }
    if (device.ip.empty()) {
      // An address, or a host name resolving to one (its first: IPv4 before IPv6).
      absl::StatusOr<std::vector<std::string>> addresses = transport::ResolveHost(
          target, absl::StrCat("LBCC_PLUGIN_DEVICES entry '", entry, "'"));
      if (!addresses.ok()) {
        std::vector<std::string> names;
        for (const Interface& interface : interfaces) {
          if (std::find(names.begin(), names.end(), interface.name) == names.end()) {
            names.push_back(interface.name);
          }
        }
        return absl::InvalidArgumentError(absl::StrCat(
            addresses.status().message(), "; nor is it an interface that is up here (",
            names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
      }
      device.ip = addresses->front();
      device.ipv6 = device.ip.find(':') != std::string::npos;
      device.name = device.ip;
      for (const Interface& interface : interfaces) {
        if (interface.ip == device.ip) {
          device.ifname = interface.name;
          device.name = interface.name;
          break;
        }
      }
    }
    if (!seen.insert(device.ip).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("LBCC_PLUGIN_DEVICES lists address ", device.ip, " twice"));
    }
    devices.push_back(std::move(device));
  }
  if (devices.empty()) return absl::InvalidArgumentError("LBCC_PLUGIN_DEVICES lists no device");
  return devices;
}

std::vector<DeviceConfig> DefaultDevices(const std::vector<Interface>& interfaces) {
  std::vector<DeviceConfig> devices;
  std::set<std::string> seen;  // One device per interface: its first address (IPv4 first).
  std::vector<Interface> sorted = interfaces;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Interface& a, const Interface& b) {
    return a.name != b.name ? a.name < b.name : !a.ipv6 && b.ipv6;
  });
  for (const Interface& interface : sorted) {
    if (interface.loopback || absl::StartsWith(interface.name, "docker")) continue;
    if (!seen.insert(interface.name).second) continue;
    devices.push_back({interface.name, interface.ip, interface.name, std::nullopt,
                       interface.ipv6});
  }
  if (devices.empty()) {
    for (const Interface& interface : sorted) {
      if (interface.loopback && !interface.ipv6) {
        devices.push_back({interface.name, interface.ip, interface.name, std::nullopt, false});
        break;
      }
    }
  }
  if (devices.empty()) devices.push_back({"lo", "127.0.0.1", "", std::nullopt, false});
  return devices;
}

int InterfaceSpeedMbits(const std::string& ifname) {
  if (ifname.empty() || ifname.find('/') != std::string::npos) return 0;
  std::ifstream in(absl::StrCat("/sys/class/net/", ifname, "/speed"));
  std::string text;
  if (!in || !std::getline(in, text)) return 0;  // Loopback and virtual devices fail the read.
  int speed = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &speed) || speed <= 0) return 0;
  return speed;
}

std::string InterfacePciPath(const std::string& ifname) {
  if (ifname.empty() || ifname.find('/') != std::string::npos) return "";
  const std::string link = absl::StrCat("/sys/class/net/", ifname, "/device");
  char resolved[PATH_MAX];
  if (realpath(link.c_str(), resolved) == nullptr) return "";
  return resolved;
}

}  // namespace lbcc::plugin
