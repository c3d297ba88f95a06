// The one place that chooses a collective algorithm for (collective, link mix, message size),
// like UCC's score ranges: a table, not `if (slow)` checks scattered through the collectives.
// Every collective of the Communicator asks it (Communicator::ChooseAlgorithm):
//
//   Algorithm a = SelectAlgorithm(Collective::kAllGatherV, shape, bytes_per_rank,
//                                 op_options.algorithm, config.algorithm(Collective::kAllGatherV));
//
// The per-operation request wins, then the communicator's configuration (CommConfig, whose
// defaults come from LBCC_ALGO="allgatherv=ring,allreduce=ring", parsed once at Init), then the
// table's first matching row.
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

// Collectives with a row in the table. Never renumber: the values index CommConfig's
// per-collective choices, and the names are LBCC_ALGO's keys.
enum class Collective : uint8_t {
  kAllGatherV = 0,  // "allgatherv": Communicator::AllGatherV and SparseAllReduce's exchange.
  kAllReduce = 1,   // "allreduce": dense.
  kBroadcast = 2,   // "broadcast"
  kAllGather = 3,   // "allgather": dense, equal sizes.
  kBarrier = 4,     // "barrier"
  kContextRing = 5,  // "contextring": comm/context_ring.h's K/V ring (forward and backward).
};
inline constexpr int kNumCollectives = 6;
inline constexpr Collective kAllCollectives[kNumCollectives] = {
    Collective::kAllGatherV, Collective::kAllReduce, Collective::kBroadcast,
    Collective::kAllGather, Collective::kBarrier, Collective::kContextRing};

enum class Algorithm : uint8_t {
  kAuto = 0,       // Let the table decide.
  kDirect,         // Every rank sends to every rank at once (fewest steps).
  kRing,           // N-1 neighbour steps (bandwidth-optimal, pipelined).
  kHierarchical,   // Gather in fast islands, leaders exchange over slow links, spread.
};

absl::string_view CollectiveName(Collective collective);
absl::string_view AlgorithmName(Algorithm algorithm);
absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name);
// "allgatherv", "allreduce", ... (CollectiveName's spelling). InvalidArgument listing the names.
absl::StatusOr<Collective> ParseCollective(absl::string_view name);
// Whether `collective` has an implementation of `algorithm` (kAuto: false).
bool HasAlgorithm(Collective collective, Algorithm algorithm);

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

// `requested` (the operation's) unless kAuto, else `configured` (the communicator's
// CommConfig) unless kAuto, else the table's first matching row. InvalidArgument naming the
// collective for an algorithm it does not have.
absl::StatusOr<Algorithm> SelectAlgorithm(Collective collective, const GroupShape& shape,
                                          size_t bytes_per_rank, Algorithm requested,
                                          Algorithm configured);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_ALGORITHMS_H_
