#include "transport/options.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/env.h"
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

absl::StatusOr<LinkClass> ParseLinkClass(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "fast") return LinkClass::kFast;
  if (lower == "slow") return LinkClass::kSlow;
  return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a link class (fast, slow)"));
}

int64_t WindowBytes(const SchedulerOptions& options, double rate_bytes_per_second,
                    double rtt_seconds) {
  if (options.window_bytes > 0) return options.window_bytes;
  const int64_t floor = options.chunk_bytes * std::max(1, options.stripes);
  const double bdp = 2 * rate_bytes_per_second * rtt_seconds;
  return std::max<int64_t>(floor, static_cast<int64_t>(bdp));
}

absl::StatusOr<Topology> Topology::Parse(absl::string_view text) {
  Topology topology;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    if (words.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology line ", line_number, ": expected '<host[:port]|*> <fast|slow>', got '",
          absl::StripAsciiWhitespace(line), "'"));
    }
    absl::StatusOr<LinkClass> link_class = ParseLinkClass(words[1]);
    if (!link_class.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("topology line ", line_number, ": ", link_class.status().message()));
    }
    std::string key(words[0]);
    const size_t colon = key.rfind(':');
    if (colon != std::string::npos) {
      int port = 0;
      if (!absl::SimpleAtoi(key.substr(colon + 1), &port) || port <= 0 || port > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat("topology line ", line_number, ": bad port in '", key, "'"));
      }
    }
    topology.rules_[key] = *link_class;
  }
  return topology;
}

absl::StatusOr<Topology> Topology::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read topology file ", path));
  std::stringstream text;
  text << in.rdbuf();
  LBCC_ASSIGN_OR_RETURN(Topology topology, Parse(text.str()),
                        _.Prepend(absl::StrCat("topology file ", path)));
  return topology;
}

std::optional<LinkClass> Topology::Lookup(absl::string_view host, int port) const {
  if (port > 0) {
    auto it = rules_.find(absl::StrCat(host, ":", port));
    if (it != rules_.end()) return it->second;
  }
  auto it = rules_.find(std::string(host));
  if (it != rules_.end()) return it->second;
  it = rules_.find("*");
  if (it != rules_.end()) return it->second;
  return std::nullopt;
}

absl::StatusOr<TransportOptions> TransportOptions::FromEnv() {
  TransportOptions options;
  LBCC_ASSIGN_OR_RETURN(options.scheduler.chunk_bytes, env::GetBytes("LBCC_SLOW_CHUNK_BYTES"));
  LBCC_ASSIGN_OR_RETURN(const double pace_mbits, env::GetDouble("LBCC_SLOW_PACE_MBITS"));
  options.scheduler.pace_bytes_per_second = pace_mbits * 1e6 / 8;
  LBCC_ASSIGN_OR_RETURN(const int64_t stripes, env::GetInt("LBCC_SLOW_STRIPES"));
  options.scheduler.stripes = static_cast<int>(stripes);
  LBCC_ASSIGN_OR_RETURN(options.scheduler.window_bytes, env::GetBytes("LBCC_SLOW_WINDOW_BYTES"));
  LBCC_ASSIGN_OR_RETURN(options.fast_chunk_bytes, env::GetBytes("LBCC_FAST_CHUNK_BYTES"));
  LBCC_ASSIGN_OR_RETURN(const std::string link_class, env::GetString("LBCC_LINK_CLASS"));
  if (link_class != "auto") {
    LBCC_ASSIGN_OR_RETURN(options.link_class, ParseLinkClass(link_class));
  }
  LBCC_ASSIGN_OR_RETURN(const std::string topology_file, env::GetString("LBCC_LINK_RULES_FILE"));
  if (!topology_file.empty()) {
    LBCC_ASSIGN_OR_RETURN(options.topology, Topology::Load(topology_file));
  }
  LBCC_ASSIGN_OR_RETURN(const double gbits, env::GetDouble("LBCC_SLOW_LINK_GBITS"));
  options.slow_threshold_bits_per_second = gbits * 1e9;
  LBCC_ASSIGN_OR_RETURN(options.probe_max_bytes, env::GetBytes("LBCC_LINK_PROBE_BYTES"));
  LBCC_ASSIGN_OR_RETURN(const int64_t timeout_ms, env::GetInt("LBCC_PEER_TIMEOUT_MS"));
  options.peer_timeout = absl::Milliseconds(timeout_ms);
  LBCC_ASSIGN_OR_RETURN(options.slow_eager_bytes, env::GetBytes("LBCC_SLOW_EAGER_BYTES"));
  LBCC_ASSIGN_OR_RETURN(const int64_t spin_us, env::GetInt("LBCC_UCX_SPIN_US"));
  options.progress_spin = absl::Microseconds(spin_us);
  return options;
}

std::optional<LinkClass> TransportOptions::ConfiguredClass(absl::string_view host,
                                                           int port) const {
  std::optional<LinkClass> from_topology = topology.Lookup(host, port);
  if (from_topology.has_value()) return from_topology;
  return link_class;
}

}  // namespace lbcc::transport
