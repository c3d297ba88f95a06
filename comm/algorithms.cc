#include "comm/algorithms.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lbcc::comm {
namespace {

using Links = SelectionRule::Links;

}  // namespace

absl::string_view CollectiveName(Collective collective) {
  switch (collective) {
    case Collective::kAllGatherV:
      return "allgatherv";
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kAllGather:
      return "allgather";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kContextRing:
      return "contextring";
  }
  return "unknown";
}

absl::string_view AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kDirect:
      return "direct";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kHierarchical:
      return "hierarchical";
  }
  return "unknown";
}

absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kDirect, Algorithm::kRing,
                      Algorithm::kHierarchical}) {
    if (name == AlgorithmName(a)) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown algorithm '", name, "' (auto, direct, ring, hierarchical)"));
}

absl::StatusOr<Collective> ParseCollective(absl::string_view name) {
  for (Collective c : kAllCollectives) {
    if (name == CollectiveName(c)) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown collective '", name,
      "' (allgatherv, allreduce, broadcast, allgather, barrier, contextring)"));
}


GroupShape ShapeOf(const Topology& topology, absl::Span<const int> ranks) {
  GroupShape shape;
  shape.ranks = static_cast<int>(ranks.size());
  std::set<int> islands;
  std::vector<int> members(topology.islands().size(), 0);
  for (int a : ranks) {
    islands.insert(topology.island_of(a));
    if (++members[topology.island_of(a)] > 1) shape.multi_rank_island = true;
    for (int b : ranks) shape.any_slow = shape.any_slow || topology.link(a, b) == LinkClass::kSlow;
  }
  shape.islands = static_cast<int>(islands.size());
  return shape;
}


absl::StatusOr<Algorithm> SelectAlgorithm(Collective collective, const GroupShape& shape,
                                          size_t bytes_per_rank, Algorithm requested,
                                          Algorithm configured) {
  Algorithm chosen = requested != Algorithm::kAuto ? requested : configured;
  if (chosen == Algorithm::kAuto) {
    for (const SelectionRule& rule : SelectionTable()) {
      if (rule.collective != collective) continue;
      if (rule.links == Links::kAllFast && shape.any_slow) continue;
      if (rule.links == Links::kSomeSlow && !shape.any_slow) continue;
      if (rule.needs_multi_rank_island && !shape.multi_rank_island) continue;
      if (bytes_per_rank < rule.min_bytes || bytes_per_rank >= rule.max_bytes) continue;
      chosen = rule.algorithm;
      break;
    }
  }
  if (!HasAlgorithm(collective, chosen)) {
    return absl::InvalidArgumentError(absl::StrCat(CollectiveName(collective), " has no ",
                                                   AlgorithmName(chosen), " algorithm"));
  }
  return chosen;
}

}  // namespace lbcc::comm
