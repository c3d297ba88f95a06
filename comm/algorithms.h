// The one place that chooses a collective algorithm for (collective, link mix, message size),
// like UCC's score ranges: a table, not `if (slow)` checks scattered through the collectives.
//
//   Algorithm a = SelectAlgorithm(Collective::kAllGatherV, shape, bytes_per_rank);
//
// LBCC_ALGO overrides the table per collective: "allgatherv=ring,allreduce=ring" (allgatherv
// carries SparseAllReduce's payload exchange).
//
// Thread-safety: stateless.
#ifndef LBCC_COMM_ALGORITHMS_H_
#define LBCC_COMM_ALGORITHMS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "comm/topology.h"

namespace lbcc::comm {

enum class Collective : uint8_t {
  kAllGatherV,       // payload exchange of SparseAllReduce, AllGather, Barrier
  kAllReduce,        // dense
  kBroadcast,
};

enum class Algorithm : uint8_t {
  kAuto = 0,       // Let the table decide.
  kDirect,         // Every rank sends to every rank at once (fewest steps).
  kRing,           // N-1 neighbour steps (bandwidth-optimal, pipelined).
  kHierarchical,   // Gather in fast islands, leaders exchange over slow links, spread.
};

absl::string_view CollectiveName(Collective collective);
absl::string_view AlgorithmName(Algorithm algorithm);
absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name);

// What the table looks at in a group of ranks.
struct GroupShape {
  int ranks = 1;
  bool any_slow = false;          // Some pair of the group is linked slow.
  bool multi_rank_island = false;  // Some fast island holds two or more of the group.
  int islands = 1;                 // Fast islands the group spans.
};
GroupShape ShapeOf(const Topology& topology, absl::Span<const int> ranks);

// One row of the table: the first row whose conditions all hold wins.
struct SelectionRule {
  Collective collective;
  enum class Links : uint8_t { kAny, kAllFast, kSomeSlow } links;
  bool needs_multi_rank_island;  // Only when islands can gather over fast links.
  size_t min_bytes;              // Bytes per rank, inclusive.
  size_t max_bytes;              // Exclusive.
  Algorithm algorithm;
};
absl::Span<const SelectionRule> SelectionTable();

// The table's choice, unless `requested` is not kAuto or LBCC_ALGO names one for `collective`.
// InvalidArgument for a bad LBCC_ALGO or an algorithm the collective does not have.
absl::StatusOr<Algorithm> SelectAlgorithm(Collective collective, const GroupShape& shape,
                                          size_t bytes_per_rank,
                                          Algorithm requested = Algorithm::kAuto);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_ALGORITHMS_H_
