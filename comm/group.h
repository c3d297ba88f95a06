// A group of ranks that a collective runs over: the fabric that reaches them, their global
// ranks in group order and this rank's index. Collectives (collectives.h) and the commit-or-abort
// agreement (agreement.h) both take one; it lives apart from either so that neither includes the
// other's header.
//
// Thread-safety: a plain value; the fabric is the communicator's and outlives every group.
#ifndef LBCC_COMM_GROUP_H_
#define LBCC_COMM_GROUP_H_

#include <vector>

namespace lbcc::comm {

class Fabric;  // comm/fabric.h

struct Group {
  Fabric* fabric = nullptr;
  std::vector<int> ranks;  // Global ranks, in group order.
  int me = 0;              // This rank's index in `ranks`.
  int size() const { return static_cast<int>(ranks.size()); }
};

}  // namespace lbcc::comm

#endif  // LBCC_COMM_GROUP_H_
