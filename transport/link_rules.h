// Link rules: the class (fast or slow) that the LBCC_LINK_RULES_FILE file names for given peers,
// its parser and its lookup, and the peer addresses they match (SplitHostPort). The file's format
// is documented in transport/options.h, where TransportOptions holds the parsed rules; the class
// rule that combines both ends' rules (slow wins) and the probe is transport/link_setup.h's.
// One implementation; used by every backend through LinkSetup.
//
// Thread-safety: LinkRules is a value (immutable after Parse / Load); the free functions are pure.
#ifndef LBCC_TRANSPORT_LINK_RULES_H_
#define LBCC_TRANSPORT_LINK_RULES_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/transport.h"

namespace lbcc::transport {

// "fast" or "slow" (any case, surrounding spaces ignored); InvalidArgument naming the text
// otherwise. The class words of a rules line and of LBCC_LINK_CLASS.
absl::StatusOr<LinkClass> ParseLinkClass(absl::string_view text);

// The link-rules file. Immutable after Parse().
class LinkRules {
 public:
  // Parses the rules format. `source` names the text in errors ("link rules file <source>
  // line N: ..."); InvalidArgument for a bad line.
  static absl::StatusOr<LinkRules> Parse(absl::string_view text, absl::string_view source = "");
  // Parse with `resolve` standing for ResolveHost (transport/netif.h) on the host names in the
  // rules: the pure parser, for fuzzing without name look-ups.
  using Resolver = absl::FunctionRef<absl::StatusOr<std::vector<std::string>>(
      absl::string_view host, absl::string_view what)>;
  static absl::StatusOr<LinkRules> ParseWith(absl::string_view text, absl::string_view source,
                                             Resolver resolve);
  // Reads and parses `path`. InvalidArgument "cannot read link rules file <path>: <reason>" when
  // it cannot be read, or the parse error naming the path and line.
  static absl::StatusOr<LinkRules> Load(const std::string& path);

  // The class for a peer at host:port (port 0: unknown), if a rule covers it: host:port, then
  // host, then *.
  std::optional<LinkClass> Lookup(absl::string_view host, int port) const;
  bool empty() const { return rules_.empty(); }

 private:
  std::map<std::string, LinkClass> rules_;  // "host:port", "host" or "*".
};

// An address as the rules see it: "10.0.0.3:5000" -> {10.0.0.3, 5000}; a name without a numeric
// port ("rank0") -> {rank0, 0}.
struct HostPort {
  std::string host;
  int port = 0;
};
HostPort SplitHostPort(absl::string_view address);

}  // namespace lbcc::transport

#endif  // LBCC_TRANSPORT_LINK_RULES_H_
