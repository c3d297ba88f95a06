// Network interfaces and host names: which address a rank listens on and advertises, chosen the
// way NCCL chooses its socket interface, and host-name resolution for every address LBCC takes.
//
//   LBCC_SOCKET_IFNAME  NCCL_SOCKET_IFNAME's syntax: a comma list of name prefixes ("eth,ib"),
//                       "=" before the list for exact names ("=eth0,eth1"), "^" before it to
//                       exclude ("^docker,lo"; "^=" excludes exact names). Unset: every
//                       interface but lo and docker*.
//   LBCC_LISTEN_ADDR    an override: an address (IPv4 or IPv6) or an interface name.
//
// SelectListenAddress picks, in order: LBCC_LISTEN_ADDR; else the interface whose address routes
// toward the bootstrap root (a UDP socket connected toward it reports the local address; nothing
// is sent), if the filter allows it; else the first up interface the filter allows (IPv4 before
// IPv6); else loopback. A root on loopback means every rank is on this host: loopback then.
//
// Errors: InvalidArgument naming the value (an interface list that matches nothing, with the
// interfaces there are; an unresolvable host; a malformed host:port).
// Thread-safety: functions are thread-safe (getifaddrs and getaddrinfo are).
#ifndef LBCC_TRANSPORT_NETIF_H_
#define LBCC_TRANSPORT_NETIF_H_

#include <sys/socket.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace lbcc::transport {

struct NetInterface {
  std::string name;     // "eth0"
  std::string address;  // Numeric: "10.77.0.2" or "fd00::2".
  bool ipv6 = false;
  bool loopback = false;
};

// Up interfaces with an IPv4 or a global IPv6 address (link-local IPv6 is left out: it needs a
// scope id peers cannot use), in the kernel's order.
std::vector<NetInterface> ListNetInterfaces();

// A parsed LBCC_SOCKET_IFNAME.
class InterfaceFilter {
 public:
  // NCCL's syntax (see above). Empty: the default (^docker,lo).
  static absl::StatusOr<InterfaceFilter> Parse(absl::string_view spec);
  bool Matches(absl::string_view name) const;
  const std::string& spec() const { return spec_; }
  bool is_default() const { return is_default_; }

 private:
  std::string spec_;
  bool is_default_ = true;
  bool exclude_ = false;
  bool exact_ = false;
  std::vector<std::string> names_;
};

// Where a rank listens and what it advertises.
struct NetChoice {
  std::string interface;  // Empty when LBCC_LISTEN_ADDR gave an address of no local interface.
  std::string address;    // Numeric.
  bool ipv6 = false;
  bool loopback = false;
  std::string reason;     // For the INFO line: "routes to 10.77.0.1", "LBCC_LISTEN_ADDR", ...
};

// `listen_override`: LBCC_LISTEN_ADDR's value ("" for none). `ifname`: LBCC_SOCKET_IFNAME's.
// `root_host`: the bootstrap root's host (name or address; "" for the root itself). Logs the
// choice at INFO ("NET/Socket: using eth0 10.77.0.2 (routes to 10.77.0.1)").
absl::StatusOr<NetChoice> SelectListenAddress(absl::string_view listen_override,
                                              absl::string_view ifname,
                                              absl::string_view root_host,
                                              const std::vector<NetInterface>& interfaces);
// The same with this machine's interfaces and LBCC_SOCKET_IFNAME from the environment.
absl::StatusOr<NetChoice> SelectListenAddress(absl::string_view listen_override,
                                              absl::string_view root_host);

// "host:port", "[v6]:port" or "v6addr:port" is not accepted (ambiguous): brackets for IPv6.
struct HostAndPort {
  std::string host;  // Without brackets.
  int port = 0;
};
absl::StatusOr<HostAndPort> ParseHostPort(absl::string_view text, absl::string_view what);
// "host:port", with brackets around an IPv6 host.
std::string JoinHostPort(absl::string_view host, int port);

// The numeric addresses `host` (a name or a literal) resolves to, IPv4 first, as getaddrinfo
// lists them. InvalidArgument naming `what` and the host when it does not resolve.
absl::StatusOr<std::vector<std::string>> ResolveHost(absl::string_view host,
                                                     absl::string_view what);

bool IsLoopbackAddress(absl::string_view numeric_address);
// An IPv4 address seen through a dual-stack socket ("::ffff:10.0.0.2") in its IPv4 form
// ("10.0.0.2"); any other host unchanged.
std::string UnmappedIPv4(absl::string_view host);

// A resolved socket address, IPv4 or IPv6, for the socket and UCX calls that take a sockaddr.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;  // sizeof(sockaddr_in) or sizeof(sockaddr_in6).
  std::string host;      // Numeric, without brackets.
  int port = 0;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  bool ipv6() const { return storage.ss_family == AF_INET6; }
  // "10.77.0.2:4000" or "[fd77::2]:4000" (JoinHostPort): what ParseSocketAddress reads back.
  std::string ToString() const { return JoinHostPort(host, port); }
};

// "host:port" (ParseHostPort's syntax: IPv6 in brackets) with the host resolved (ResolveHost:
// the first address, IPv4 before IPv6). InvalidArgument naming `what` and the text.
absl::StatusOr<SocketAddress> ParseSocketAddress(absl::string_view text, absl::string_view what);
// A numeric host (IPv4 or IPv6 literal) and a port; InvalidArgument when `host` is not numeric.
absl::StatusOr<SocketAddress> NumericSocketAddress(absl::string_view host, int port);
// What the kernel or UCX reports (getsockname, a listener's or a connection's address).
// InvalidArgument for a family other than IPv4 and IPv6.
absl::StatusOr<SocketAddress> SocketAddressOf(const sockaddr_storage& storage);

// One TCP connection attempt of `fd` (a fresh stream socket) to `to` that gives up at
// `deadline`, whatever the kernel's SYN retries would take (a firewall that drops packets
// answers nothing for over two minutes): a non-blocking connect() waited for with poll(), the
// socket left blocking again. Returns the attempt's errno: 0 connected, ETIMEDOUT the deadline
// passed first, ECONNREFUSED nobody listens, ...
int ConnectBefore(int fd, const sockaddr* to, socklen_t length, absl::Time deadline);

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_NETIF_H_
