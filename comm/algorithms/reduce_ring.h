// The reduction rings' schedule over RingPass (collectives.h), shared by ring_all_reduce.cc,
// ring_reduce_scatter.cc and ring_reduce.cc. Internal to comm/.
//
// Thread-safety: stateless.
#ifndef LBCC_COMM_ALGORITHMS_REDUCE_RING_H_
#define LBCC_COMM_ALGORITHMS_REDUCE_RING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/dtype.h"
#include "comm/collectives.h"
#include "comm/reduce.h"

namespace lbcc::comm {

// The ring's schedule: the reduce-scatter (steps 0 .. n-2, tags tag + s, chunk c combined
// starting at rank c + 1, so that rank r ends owning chunk r), then with `all_gather` the
// all-gather of the owned chunks (tags tag + n + s) in the same pipelined pass, `op`'s last
// step (avg's division) applied to each owned segment as it completes.
RingSchedule ReduceRingSchedule(const Group& g, transport::Tag tag, DType type, ReduceOp op,
                                bool all_gather);

// Ring reduce-scatter in place over `data` split at begin(c): after n-1 steps this rank's chunk
// (group.me) holds the reduction over the group. Chunk c is combined starting at rank c + 1.
template <typename Begin>
absl::Status RingReduceScatterInPlace(const Group& g, transport::Tag tag, uint8_t* data,
                                      Begin begin, DType type, ReduceOp op,
                                      transport::Priority priority, absl::Time deadline) {
  const int n = g.size();
  const size_t element = DTypeSize(type);
  std::vector<size_t> offsets(n + 1);
  for (int c = 0; c <= n; ++c) offsets[c] = begin(c) * element;
  return RingPass(g, data, offsets, element,
                  ReduceRingSchedule(g, tag, type, op, /*all_gather=*/false), priority, deadline);
}

}  // namespace lbcc::comm

#endif  // LBCC_COMM_ALGORITHMS_REDUCE_RING_H_
