#include "transport/link_rules.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "transport/netif.h"

namespace lbcc::transport {

absl::StatusOr<LinkClass> ParseLinkClass(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "fast") return LinkClass::kFast;
  if (lower == "slow") return LinkClass::kSlow;
  return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a link class (fast, slow)"));
}

namespace {

// A numeric host in canonical form ("fd77:0::3" -> "fd77::3"); anything else unchanged.
std::string CanonicalHost(absl::string_view host) {
  absl::StatusOr<SocketAddress> numeric = NumericSocketAddress(host, 0);
  return numeric.ok() ? numeric->host : std::string(host);
}

std::string RuleKey(absl::string_view host, int port) {
  return port > 0 ? JoinHostPort(host, port) : std::string(host);
}

// The keys a rule's peer stands for: "*"; or its host (an IPv4 or IPv6 literal in canonical
// form, or a name together with every address it resolves to), with ":port" when it has one.
// Peers: "10.0.0.3", "10.0.0.3:5000", "fd77::3", "[fd77::3]", "[fd77::3]:5000", "node3",
// "node3:5000".
absl::StatusOr<std::vector<std::string>> RuleKeys(absl::string_view peer,
                                                  const std::string& where,
                                                  LinkRules::Resolver resolve) {
  if (peer == "*") return std::vector<std::string>{"*"};
  absl::string_view host = peer;
  int port = 0;
  const auto bad_port = [&] {
    return absl::InvalidArgumentError(absl::StrCat(where, ": bad port in '", peer, "'"));
  };
  if (absl::ConsumePrefix(&host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unclosed bracket in '", peer, "'"));
    }
    absl::string_view rest = host.substr(close + 1);
    host = host.substr(0, close);
    if (!NumericSocketAddress(host, 0).ok() || host.find(':') == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": '", peer, "' has no IPv6 address in its brackets"));
    }
    if (!rest.empty()) {
      if (!absl::ConsumePrefix(&rest, ":") || !absl::SimpleAtoi(rest, &port) || port <= 0 ||
          port > 65535) {
        return bad_port();
      }
    }
  } else if (NumericSocketAddress(host, 0).ok()) {
    // An IPv4 literal, or a bare IPv6 one (its last group is never read as a port).
  } else if (const size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    if (!absl::SimpleAtoi(host.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return bad_port();
    }
    host = host.substr(0, colon);
    if (host.find(':') != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": '", peer, "' is not an address (IPv6 with a port as [addr]:port)"));
    }
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no host in '", peer, "'"));
  }
  std::vector<std::string> keys;
  if (NumericSocketAddress(host, 0).ok()) {
    keys.push_back(RuleKey(CanonicalHost(host), port));
    return keys;
  }
  // A host name: the name itself (the loopback backend's peers are names) and its addresses
  // (UCX's peers are numeric).
  LBCC_ASSIGN_OR_RETURN(const std::vector<std::string> addresses,
                        resolve(host, absl::StrCat(where, " '", peer, "'")));
  keys.push_back(RuleKey(host, port));
  for (const std::string& address : addresses) keys.push_back(RuleKey(address, port));
  return keys;
}

}  // namespace

absl::StatusOr<LinkRules> LinkRules::Parse(absl::string_view text, absl::string_view source) {
  return ParseWith(text, source, ResolveHost);
}

absl::StatusOr<LinkRules> LinkRules::ParseWith(absl::string_view text, absl::string_view source,
                                               Resolver resolve) {
  LinkRules rules;
  const std::string where =
      source.empty() ? std::string("link rules") : absl::StrCat("link rules file ", source);
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    if (words.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " line ", line_number, ": expected '<host[:port]|*> <fast|slow>', got '",
          absl::StripAsciiWhitespace(line), "'"));
    }
    absl::StatusOr<LinkClass> link_class = ParseLinkClass(words[1]);
    if (!link_class.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " line ", line_number, ": ", link_class.status().message()));
    }
    LBCC_ASSIGN_OR_RETURN(const std::vector<std::string> keys,
                          RuleKeys(words[0], absl::StrCat(where, " line ", line_number), resolve));
    for (const std::string& key : keys) rules.rules_[key] = *link_class;
  }
  return rules;
}

absl::StatusOr<LinkRules> LinkRules::Load(const std::string& path) {
  auto cannot_read = [&path](int error) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read link rules file ", path, ": ", std::strerror(error)));
  };
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return cannot_read(errno);
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  const bool failed = std::ferror(file) != 0;
  const int error = errno;
  std::fclose(file);
  if (failed) return cannot_read(error);  // E.g. a directory.
  return Parse(text, path);
}

std::optional<LinkClass> LinkRules::Lookup(absl::string_view host, int port) const {
  const std::string canonical = CanonicalHost(host);
  if (port > 0) {
    auto it = rules_.find(RuleKey(canonical, port));
    if (it != rules_.end()) return it->second;
  }
  auto it = rules_.find(canonical);
  if (it != rules_.end()) return it->second;
  it = rules_.find("*");
  if (it != rules_.end()) return it->second;
  return std::nullopt;
}

HostPort SplitHostPort(absl::string_view address) {
  HostPort result;
  absl::StatusOr<HostAndPort> bracketed = ParseHostPort(address, "peer");
  if (absl::StartsWith(address, "[") && bracketed.ok()) {
    result.host = bracketed->host;
    result.port = bracketed->port;
    return result;
  }
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon != absl::string_view::npos && absl::SimpleAtoi(address.substr(colon + 1), &port) &&
      port >= 0 && port <= 65535) {
    result.host = std::string(address.substr(0, colon));
    result.port = port;
  } else {
    result.host = std::string(address);
  }
  return result;
}

}  // namespace lbcc::transport
