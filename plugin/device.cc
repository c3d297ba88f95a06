#include "plugin/device.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "transport/options.h"

namespace lbcc::plugin {

std::vector<Interface> ListInterfaces() {
  std::vector<Interface> result;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return result;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    if (!(entry->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) continue;
    Interface interface;
    interface.name = entry->ifa_name;
    interface.ip = text;
    interface.loopback = (entry->ifa_flags & IFF_LOOPBACK) != 0;
    result.push_back(std::move(interface));
  }
  freeifaddrs(list);
  return result;
}

absl::StatusOr<std::vector<DeviceConfig>> ParseDevices(absl::string_view spec,
                                                       const std::vector<Interface>& interfaces) {
  std::vector<DeviceConfig> devices;
  std::set<std::string> seen;
  for (absl::string_view raw : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    const absl::string_view entry = absl::StripAsciiWhitespace(raw);
    std::vector<absl::string_view> parts = absl::StrSplit(entry, '=');
    if (parts.size() > 2 || parts[0].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LBCC_PLUGIN_DEVICES entry '", entry, "': expected <interface|IPv4>[=fast|=slow]"));
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
    const std::string target(absl::StripAsciiWhitespace(parts[0]));
    in_addr parsed{};
    if (inet_pton(AF_INET, target.c_str(), &parsed) == 1) {
      device.ip = target;
      device.name = target;
      for (const Interface& interface : interfaces) {
        if (interface.ip == target) {
          device.ifname = interface.name;
          device.name = interface.name;
          break;
        }
      }
    } else {
      for (const Interface& interface : interfaces) {
        if (interface.name == target) {
          device.ifname = interface.name;
          device.ip = interface.ip;
          device.name = interface.name;
          break;
        }
      }
      if (device.ip.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("LBCC_PLUGIN_DEVICES entry '", entry,
                         "': no interface of that name is up with an IPv4 address"));
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
  std::set<std::string> seen;
  std::vector<Interface> sorted = interfaces;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Interface& a, const Interface& b) { return a.name < b.name; });
  for (const Interface& interface : sorted) {
    if (interface.loopback || absl::StartsWith(interface.name, "docker")) continue;
    if (!seen.insert(interface.ip).second) continue;
    devices.push_back({interface.name, interface.ip, interface.name, std::nullopt});
  }
  if (devices.empty()) {
    for (const Interface& interface : sorted) {
      if (interface.loopback) {
        devices.push_back({interface.name, interface.ip, interface.name, std::nullopt});
        break;
      }
    }
  }
  if (devices.empty()) devices.push_back({"lo", "127.0.0.1", "", std::nullopt});
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
