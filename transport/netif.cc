#include "transport/netif.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace lbcc::transport {
namespace {

constexpr char kDefaultFilter[] = "^docker,lo";

std::string Numeric(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof(text));
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

std::string Names(const std::vector<NetInterface>& interfaces) {
  std::vector<std::string> names;
  for (const NetInterface& i : interfaces) names.push_back(absl::StrCat(i.name, " ", i.address));
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

// The local address a connected UDP socket toward `target` gets: the kernel's route choice.
// Nothing is sent.
absl::StatusOr<std::string> RoutedSource(const std::string& target) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* info = nullptr;
  if (getaddrinfo(target.c_str(), "9", &hints, &info) != 0 || info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("'", target, "' is not an address"));
  }
  const int fd = socket(info->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  std::string result;
  if (fd >= 0 && connect(fd, info->ai_addr, info->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      result = Numeric(reinterpret_cast<const sockaddr*>(&local));
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(info);
  if (result.empty()) {
    return absl::UnavailableError(absl::StrCat("no route to ", target));
  }
  return result;
}

NetChoice ChoiceOf(const NetInterface& i, std::string reason) {
  NetChoice c;
  c.interface = i.name;
  c.address = i.address;
  c.ipv6 = i.ipv6;
  c.loopback = i.loopback;
  c.reason = std::move(reason);
  return c;
}

}  // namespace

std::vector<NetInterface> ListNetInterfaces() {
  std::vector<NetInterface> result;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return result;
  for (ifaddrs* e = list; e != nullptr; e = e->ifa_next) {
    if (e->ifa_addr == nullptr || !(e->ifa_flags & IFF_UP)) continue;
    const int family = e->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(e->ifa_addr)->sin6_addr)) {
      continue;
    }
    NetInterface i;
    i.name = e->ifa_name;
    i.address = Numeric(e->ifa_addr);
    i.ipv6 = family == AF_INET6;
    i.loopback = (e->ifa_flags & IFF_LOOPBACK) != 0;
    if (!i.address.empty()) result.push_back(std::move(i));
  }
  freeifaddrs(list);
  // IPv4 first, keeping the kernel's order otherwise.
  std::stable_sort(result.begin(), result.end(),
                   [](const NetInterface& a, const NetInterface& b) { return !a.ipv6 && b.ipv6; });
  return result;
}

absl::StatusOr<InterfaceFilter> InterfaceFilter::Parse(absl::string_view spec) {
  InterfaceFilter f;
  f.spec_ = std::string(absl::StripAsciiWhitespace(spec));
  absl::string_view rest = f.spec_;
  f.is_default_ = rest.empty();
  if (rest.empty()) rest = kDefaultFilter;
  if (absl::ConsumePrefix(&rest, "^")) f.exclude_ = true;
  if (absl::ConsumePrefix(&rest, "=")) f.exact_ = true;
  for (absl::string_view name : absl::StrSplit(rest, ',', absl::SkipWhitespace())) {
    name = absl::StripAsciiWhitespace(name);
    if (name.empty() || name.size() >= IFNAMSIZ ||
        name.find_first_of("^= \t") != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LBCC_SOCKET_IFNAME='", spec, "': '", name,
          "' is not an interface name or prefix (syntax: eth,ib | =eth0 | ^docker,lo | ^=eth1)"));
    }
    f.names_.emplace_back(name);
  }
  if (f.names_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LBCC_SOCKET_IFNAME='", spec, "' names no interface"));
  }
  return f;
}

bool InterfaceFilter::Matches(absl::string_view name) const {
  bool hit = false;
  for (const std::string& n : names_) {
    if (exact_ ? name == n : absl::StartsWith(name, n)) hit = true;
  }
  return hit != exclude_;
}

absl::StatusOr<HostAndPort> ParseHostPort(absl::string_view text, absl::string_view what) {
  HostAndPort hp;
  absl::string_view host, port;
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "' is not host:port (", why,
                                                   "; IPv6 as [addr]:port)"));
  };
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("unclosed bracket");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) return bad("no port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != absl::string_view::npos) return bad("bare IPv6 address");
  }
  if (host.empty()) return bad("no host");
  if (!absl::SimpleAtoi(port, &hp.port) || hp.port < 0 || hp.port > 65535) {
    return bad("bad port");
  }
  hp.host = std::string(host);
  return hp;
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<std::vector<std::string>> ResolveHost(absl::string_view host,
                                                     absl::string_view what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* info = nullptr;
  const std::string name(host);
  const int rc = getaddrinfo(name.c_str(), nullptr, &hints, &info);
  if (rc != 0 || info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": host '", host,
                                                   "' does not resolve (", gai_strerror(rc),
                                                   "); check the name, /etc/hosts or DNS"));
  }
  std::vector<std::string> v4, v6;
  for (addrinfo* a = info; a != nullptr; a = a->ai_next) {
    std::string text = Numeric(a->ai_addr);
    if (text.empty()) continue;
    std::vector<std::string>& list = a->ai_family == AF_INET ? v4 : v6;
    if (std::find(list.begin(), list.end(), text) == list.end()) list.push_back(std::move(text));
  }
  freeaddrinfo(info);
  v4.insert(v4.end(), v6.begin(), v6.end());
  if (v4.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": host '", host, "' has no IPv4 or IPv6 address"));
  }
  return v4;
}

bool IsLoopbackAddress(absl::string_view numeric_address) {
  in_addr v4{};
  in6_addr v6{};
  const std::string text(numeric_address);
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

std::string UnmappedIPv4(absl::string_view host) {
  absl::string_view v4 = host;
  if (absl::ConsumePrefix(&v4, "::ffff:") && v4.find('.') != absl::string_view::npos) {
    return std::string(v4);
  }
  return std::string(host);
}

absl::StatusOr<SocketAddress> NumericSocketAddress(absl::string_view host, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", port, " is out of range"));
  }
  SocketAddress a;
  const std::string text(host);
  auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (inet_pton(AF_INET, text.c_str(), &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    a.length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, text.c_str(), &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    a.length = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", host, "' is not a numeric IPv4 or IPv6 address"));
  }
  a.host = Numeric(a.get());  // Canonical form ("fd77:0::1" reads back as "fd77::1").
  a.port = port;
  return a;
}

absl::StatusOr<SocketAddress> ParseSocketAddress(absl::string_view text, absl::string_view what) {
  LBCC_ASSIGN_OR_RETURN(const HostAndPort hp, ParseHostPort(text, what));
  LBCC_ASSIGN_OR_RETURN(const std::vector<std::string> resolved,
                        ResolveHost(hp.host, absl::StrCat(what, " '", text, "'")));
  return NumericSocketAddress(resolved.front(), hp.port);
}

absl::StatusOr<SocketAddress> SocketAddressOf(const sockaddr_storage& storage) {
  SocketAddress a;
  a.storage = storage;
  if (storage.ss_family == AF_INET) {
    a.length = sizeof(sockaddr_in);
    a.port = ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  } else if (storage.ss_family == AF_INET6) {
    a.length = sizeof(sockaddr_in6);
    a.port = ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("address family ", storage.ss_family, " is neither IPv4 nor IPv6"));
  }
  a.host = Numeric(a.get());
  return a;
}

namespace {

// LBCC_LISTEN_ADDR: an interface name, else an address (or a name resolving to one).
absl::StatusOr<NetChoice> OverrideChoice(absl::string_view text,
                                         const std::vector<NetInterface>& interfaces) {
  for (const NetInterface& i : interfaces) {
    if (i.name == text) return ChoiceOf(i, "LBCC_LISTEN_ADDR");
  }
  absl::StatusOr<std::vector<std::string>> addresses = ResolveHost(text, "LBCC_LISTEN_ADDR");
  if (!addresses.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LBCC_LISTEN_ADDR='", text,
                     "' is neither an interface here nor an address that resolves (interfaces: ",
                     Names(interfaces), ")"));
  }
  NetChoice c;
  c.address = addresses->front();
  c.ipv6 = c.address.find(':') != std::string::npos;
  c.loopback = IsLoopbackAddress(c.address);
  c.reason = "LBCC_LISTEN_ADDR";
  for (const NetInterface& i : interfaces) {
    if (i.address == c.address) c.interface = i.name;
  }
  return c;
}

// The interface the kernel routes toward the root through, if the filter allows it. nullopt:
// no route, or an interface the filter excludes.
absl::StatusOr<std::optional<NetChoice>> RoutedChoice(
    absl::string_view root_host, const InterfaceFilter& filter,
    const std::vector<NetInterface>& interfaces) {
  LBCC_ASSIGN_OR_RETURN(const std::vector<std::string> root,
                        ResolveHost(root_host, "bootstrap root"));
  absl::StatusOr<std::string> source = RoutedSource(root.front());
  if (!source.ok()) return std::nullopt;
  for (const NetInterface& i : interfaces) {
    if (i.address != *source) continue;
    // A root on loopback: every rank is on this host. Its IPv4 address even for a root on ::1:
    // UCX's tcp transport uses no IPv6 address on lo.
    if (i.loopback && IsLoopbackAddress(root.front())) {
      const NetInterface* chosen = &i;
      for (const NetInterface& j : interfaces) {
        if (j.loopback && j.name == i.name && !j.ipv6) {
          chosen = &j;
          break;
        }
      }
      return ChoiceOf(*chosen, absl::StrCat("the bootstrap root ", root_host, " is local"));
    }
    if (filter.Matches(i.name)) return ChoiceOf(i, absl::StrCat("routes to ", root_host));
    if (i.loopback) {
      // The root is one of this host's own addresses: use that address's interface.
      for (const NetInterface& j : interfaces) {
        if (j.address == root.front() && filter.Matches(j.name)) {
          return ChoiceOf(j, absl::StrCat("the bootstrap root ", root_host, " is here"));
        }
      }
    }
    break;
  }
  return std::nullopt;
}

// No override: toward the root, else the first allowed interface, else loopback.
absl::StatusOr<NetChoice> DefaultChoice(const InterfaceFilter& filter, absl::string_view root_host,
                                        const std::vector<NetInterface>& interfaces) {
  std::vector<const NetInterface*> allowed;
  for (const NetInterface& i : interfaces) {
    if (filter.Matches(i.name)) allowed.push_back(&i);
  }
  if (!filter.is_default() && allowed.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LBCC_SOCKET_IFNAME='", filter.spec(),
                     "' matches no interface that is up here (interfaces: ", Names(interfaces),
                     ")"));
  }
  if (!root_host.empty()) {
    LBCC_ASSIGN_OR_RETURN(std::optional<NetChoice> routed,
                          RoutedChoice(root_host, filter, interfaces));
    if (routed.has_value()) return *std::move(routed);
  }
  if (!allowed.empty()) {
    return ChoiceOf(*allowed.front(), filter.is_default()
                                          ? "first up interface"
                                          : absl::StrCat("LBCC_SOCKET_IFNAME=", filter.spec()));
  }
  for (const NetInterface& i : interfaces) {
    if (i.loopback) return ChoiceOf(i, "no other interface is up");
  }
  return absl::UnavailableError(
      absl::StrCat("no network interface is up here (interfaces: ", Names(interfaces), ")"));
}

}  // namespace

absl::StatusOr<NetChoice> SelectListenAddress(absl::string_view listen_override,
                                              absl::string_view ifname,
                                              absl::string_view root_host,
                                              const std::vector<NetInterface>& interfaces) {
  LBCC_ASSIGN_OR_RETURN(const InterfaceFilter filter, InterfaceFilter::Parse(ifname));
  const absl::string_view override_text = absl::StripAsciiWhitespace(listen_override);
  LBCC_ASSIGN_OR_RETURN(const NetChoice choice,
                        override_text.empty() ? DefaultChoice(filter, root_host, interfaces)
                                              : OverrideChoice(override_text, interfaces));
  LBCC_LOG(INFO) << "NET/Socket: using " << (choice.interface.empty() ? "-" : choice.interface)
                 << " " << choice.address << " (" << choice.reason << ")";
  return choice;
}

absl::StatusOr<NetChoice> SelectListenAddress(absl::string_view listen_override,
                                              absl::string_view root_host) {
  LBCC_ASSIGN_OR_RETURN(const std::string ifname, env::GetString("LBCC_SOCKET_IFNAME"));
  return SelectListenAddress(listen_override, ifname, root_host, ListNetInterfaces());
}

int ConnectBefore(int fd, const sockaddr* to, socklen_t length, absl::Time deadline) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return errno;
  int error = 0;
  if (connect(fd, to, length) != 0) {
    error = errno;
    while (error == EINPROGRESS || error == EINTR) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        error = ETIMEDOUT;
        break;
      }
      pollfd p{fd, POLLOUT, 0};
      const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
      const int n = poll(&p, 1, ms);
      if (n < 0 && errno != EINTR) {
        error = errno;
      } else if (n > 0) {
        socklen_t len = sizeof(error);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) error = errno;
      }
    }
  }
  if (error == 0 && fcntl(fd, F_SETFL, flags) < 0) error = errno;
  return error;
}

}  // namespace lbcc::transport
