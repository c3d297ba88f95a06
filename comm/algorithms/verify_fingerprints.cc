// VerifyFingerprints: OpOptions::verify's textual check that every rank posted the same call.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "comm/collectives.h"

namespace lbcc::comm {

using transport::Priority;
using transport::Tag;

absl::Status VerifyFingerprints(const Group& group, Tag tag, const std::string& fingerprint,
                                absl::Time deadline) {
  std::vector<std::string> all;
  LBCC_RETURN_IF_ERROR(AllGatherV(group, tag, fingerprint, &all, Algorithm::kDirect,
                                  Priority::kHigh, deadline, 4096));
  for (int i = 1; i < group.size(); ++i) {
    if (all[i] != all[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("ranks disagree on the collective: rank 0 posted ", all[0], ", rank ", i,
                       " posted ", all[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace lbcc::comm
