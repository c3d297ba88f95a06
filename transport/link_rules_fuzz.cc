// Fuzzes the link-rules parser (transport/link_rules.h; LBCC_LINK_RULES_FILE, a file a job may
// be handed): any text gives rules or InvalidArgument naming the line, never a crash; a host
// name resolves through a stand-in (no look-up leaves the process); Lookup on the hosts of the
// text and on what SplitHostPort makes of them answers without crashing.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "transport/link_rules.h"

namespace {

// Names resolve to one documentation address (RFC 5737), or fail like an unknown name.
absl::StatusOr<std::vector<std::string>> FakeResolve(absl::string_view host,
                                                     absl::string_view what) {
  if (host.size() % 2 == 0) return std::vector<std::string>{"192.0.2.1"};
  return absl::InvalidArgumentError(absl::StrCat(what, ": cannot resolve '", host, "'"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lbcc::transport;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<LinkRules> rules = LinkRules::ParseWith(text, "fuzz", FakeResolve);
  if (!rules.ok()) {
    if (rules.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(" \t\r\n#"),
                                               absl::SkipEmpty())) {
    const HostPort hp = SplitHostPort(word);
    if (hp.port < 0 || hp.port > 65535) std::abort();
    (void)rules->Lookup(hp.host, hp.port);
    (void)rules->Lookup(word, 0);
  }
  (void)ParseLinkClass(text);
  return 0;
}
