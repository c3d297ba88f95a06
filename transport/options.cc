#include "transport/options.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace lbcc::transport {

absl::string_view LinkClassName(LinkClass link_class) {
  return link_class == LinkClass::kSlow ? "slow" : "fast";
}

absl::string_view PriorityName(Priority priority) {
  switch (priority) {
    case Priority::kHigh:
      return "high";
    case Priority::kNormal:
      return "normal";
    case Priority::kBulk:
      return "bulk";
  }
  return "?";
}

int64_t WindowBytes(const SchedulerOptions& options, double rate_bytes_per_second,
                    double rtt_seconds) {
  if (options.window_bytes > 0) return options.window_bytes;
  const int64_t floor =
      options.chunk_bytes * std::max(kMinWindowChunks, std::max(1, options.stripes));
  const double bdp = 2 * rate_bytes_per_second * rtt_seconds;
  return std::max<int64_t>(floor, static_cast<int64_t>(bdp));
}

double BulkPaceBytesPerSecond(double probed_send_bytes_per_second,
                              double nonbulk_bytes_per_second) {
  const double rate = probed_send_bytes_per_second;
  return std::max(kBulkYieldFloor * rate,
                  (1 - kBulkYieldMargin) * rate - 2 * nonbulk_bytes_per_second);
}

int64_t BulkYieldChunkBytes(const SchedulerOptions& options, double pace_bytes_per_second) {
  const int64_t bytes =
      static_cast<int64_t>(pace_bytes_per_second * absl::ToDoubleSeconds(kBulkYieldChunkTime));
  return std::max<int64_t>(std::min<int64_t>(kBulkYieldMinChunkBytes, options.chunk_bytes),
                           std::min(bytes, options.chunk_bytes));
}

absl::StatusOr<TransportOptions> TransportOptions::FromEnv() {
  TransportOptions options;
  LBCC_ASSIGN_OR_RETURN(options.scheduler.chunk_bytes, env::GetBytes("LBCC_SLOW_CHUNK_BYTES"));
  LBCC_ASSIGN_OR_RETURN(const double pace_mbits, env::GetDouble("LBCC_SLOW_PACE_MBITS"));
  options.scheduler.pace_bytes_per_second = pace_mbits * 1e6 / 8;
  LBCC_ASSIGN_OR_RETURN(const int64_t stripes, env::GetInt("LBCC_SLOW_STRIPES"));
  options.scheduler.stripes = static_cast<int>(stripes);
  LBCC_ASSIGN_OR_RETURN(options.scheduler.window_bytes, env::GetBytes("LBCC_SLOW_WINDOW_BYTES"));
  LBCC_ASSIGN_OR_RETURN(options.scheduler.bulk_yield, env::GetBool("LBCC_SLOW_BULK_YIELD"));
  LBCC_ASSIGN_OR_RETURN(options.fast_chunk_bytes, env::GetBytes("LBCC_FAST_CHUNK_BYTES"));
  LBCC_ASSIGN_OR_RETURN(const std::string link_class, env::GetString("LBCC_LINK_CLASS"));
  if (link_class != "auto") {
    LBCC_ASSIGN_OR_RETURN(options.link_class, ParseLinkClass(link_class));
  }
  LBCC_ASSIGN_OR_RETURN(const std::string rules_file, env::GetString("LBCC_LINK_RULES_FILE"));
  if (!rules_file.empty()) {
    LBCC_ASSIGN_OR_RETURN(options.link_rules, LinkRules::Load(rules_file));
  }
  LBCC_ASSIGN_OR_RETURN(const double gbits, env::GetDouble("LBCC_SLOW_LINK_GBITS"));
  options.slow_threshold_bits_per_second = gbits * 1e9;
  LBCC_ASSIGN_OR_RETURN(options.probe_max_bytes, env::GetBytes("LBCC_LINK_PROBE_BYTES"));
  LBCC_ASSIGN_OR_RETURN(const int64_t timeout_ms, env::GetInt("LBCC_PEER_TIMEOUT_MS"));
  options.peer_timeout = absl::Milliseconds(timeout_ms);
  LBCC_ASSIGN_OR_RETURN(options.slow_eager_bytes, env::GetBytes("LBCC_SLOW_EAGER_BYTES"));
  LBCC_ASSIGN_OR_RETURN(const int64_t spin_us, env::GetInt("LBCC_UCX_SPIN_US"));
  options.progress_spin = absl::Microseconds(spin_us);
  LBCC_ASSIGN_OR_RETURN(options.security, SecurityOptions::FromEnv());
  // UCX's own variables, so that the checks below see what UCX will use without reading the
  // environment again (UCX reads them itself either way).
  options.ucx_tls = env::GetForeign("UCX_TLS").value_or("");
  options.ucx_net_devices = env::GetForeign("UCX_NET_DEVICES").value_or("");
  options.ucx_tcp_af_prio = env::GetForeign("UCX_TCP_AF_PRIO").value_or("");
  return options;
}

std::optional<LinkClass> TransportOptions::ConfiguredClass(absl::string_view host,
                                                           int port) const {
  std::optional<LinkClass> from_rules = link_rules.Lookup(host, port);
  if (from_rules.has_value()) return from_rules;
  return link_class;
}

absl::Status PinUcxDevice(const std::string& device, bool ipv6, TransportOptions* options) {
  if (!device.empty() && options->ucx_net_devices.empty()) {
    options->ucx_net_devices = device;
  }
  return PinUcxAddressFamily(ipv6, !device.empty(), options);
}

absl::Status PinUcxAddressFamily(bool ipv6, bool device_known, TransportOptions* options) {
  const std::string set = options->ucx_tcp_af_prio;
  const absl::string_view family = ipv6 ? "inet6" : "inet";
  if (absl::StripAsciiWhitespace(set).empty()) {
    if (ipv6 && device_known) options->ucx_tcp_af_prio = "inet6";
    return absl::OkStatus();
  }
  std::vector<std::string> order;
  bool listed = false, first = false;
  for (absl::string_view entry : absl::StrSplit(set, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    if (absl::EqualsIgnoreCase(entry, family)) {
      first = first || order.empty();
      listed = true;
    } else {
      order.emplace_back(entry);
    }
  }
  if (!listed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX_TCP_AF_PRIO='", set, "' leaves out ", family, ", the family of the address this rank ",
        "listens on (", ipv6 ? "IPv6" : "IPv4", "): UCX's tcp transport could not reach its ",
        "peers. Add ", family, " to UCX_TCP_AF_PRIO or unset it, or choose an ",
        ipv6 ? "IPv4" : "IPv6", " address (LBCC_LISTEN_ADDR, LBCC_SOCKET_IFNAME, MASTER_ADDR)"));
  }
  order.insert(order.begin(), std::string(family));
  const std::string reordered = absl::StrJoin(order, ",");
  if (!first) {
    LBCC_LOG(INFO) << "UCX_TCP_AF_PRIO=" << set << " used as " << reordered
                   << ": the rank listens on " << (ipv6 ? "IPv6" : "IPv4")
                   << ", and UCX's tcp transport connects from the family it takes first";
  }
  options->ucx_tcp_af_prio = reordered;
  return absl::OkStatus();
}

absl::Status CheckUcxAddressFamily(absl::string_view af_prio, absl::string_view listen_host,
                                   const std::vector<NetInterface>& interfaces) {
  const NetInterface* listen = nullptr;
  for (const NetInterface& i : interfaces) {
    if (i.address == listen_host) listen = &i;
  }
  if (listen == nullptr || listen->loopback) return absl::OkStatus();
  bool has_v4 = false, has_v6 = false;
  for (const NetInterface& i : interfaces) {
    if (i.name != listen->name) continue;
    (i.ipv6 ? has_v6 : has_v4) = true;
  }
  const std::string order =
      absl::StripAsciiWhitespace(af_prio).empty() ? "inet,inet6" : std::string(af_prio);
  std::string taken;
  for (absl::string_view entry : absl::StrSplit(order, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    if ((absl::EqualsIgnoreCase(entry, "inet") && has_v4) ||
        (absl::EqualsIgnoreCase(entry, "inet6") && has_v6)) {
      taken = absl::AsciiStrToLower(entry);
      break;
    }
  }
  const std::string wanted = listen->ipv6 ? "inet6" : "inet";
  if (taken.empty() || taken == wanted) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "UCX_TCP_AF_PRIO='", order, "' makes UCX's tcp transport use ", taken, " on ",
      listen->name, ", but the transport listens on its ", listen->ipv6 ? "IPv6" : "IPv4",
      " address ", listen_host, ": UCX would connect from the wrong family. Put ", wanted,
      " first (TransportOptions::ucx_tcp_af_prio or UCX_TCP_AF_PRIO; transport::PinUcxDevice ",
      "does it)"));
}

}  // namespace lbcc::transport
