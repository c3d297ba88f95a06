#include "comm/algorithms.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lbcc::comm {
namespace {

using Links = SelectionRule::Links;
constexpr size_t kMax = ~size_t{0};

// The table. Reasoning per row:
// - Payload exchange with slow links and islands of several ranks: hierarchical, so each
//   payload crosses each slow link once and island members share their leader's download.
// - Payload exchange otherwise: small messages direct (one step of latency, and on slow links
//   every rank receives each payload once either way); large ones on fast links by ring.
// - Dense all-gather: the payload exchange's rows (it is one, of equal sizes).
// - Dense all-reduce: up to 64 KiB per rank direct (one latency-bound round that also carries
//   the operation header, instead of the ring's 2(N-1) rounds after a header round); larger
//   by ring (bandwidth-optimal: 2(N-1)/N of the data per rank).
// - Broadcast: direct from the root (groups are small; the root's up-link carries N-1 copies).
// - Barrier: direct (an all-gather of nothing: one step, whatever the links).
constexpr SelectionRule kTable[] = {
    {Collective::kAllGatherV, Links::kSomeSlow, true, 0, kMax, Algorithm::kHierarchical},
    {Collective::kAllGatherV, Links::kSomeSlow, false, 0, kMax, Algorithm::kDirect},
    {Collective::kAllGatherV, Links::kAllFast, false, 0, 1 << 20, Algorithm::kDirect},
    {Collective::kAllGatherV, Links::kAllFast, false, 1 << 20, kMax, Algorithm::kRing},
    {Collective::kAllGather, Links::kSomeSlow, true, 0, kMax, Algorithm::kHierarchical},
    {Collective::kAllGather, Links::kSomeSlow, false, 0, kMax, Algorithm::kDirect},
    {Collective::kAllGather, Links::kAllFast, false, 0, 1 << 20, Algorithm::kDirect},
    {Collective::kAllGather, Links::kAllFast, false, 1 << 20, kMax, Algorithm::kRing},
    {Collective::kAllReduce, Links::kAny, false, 0, (64 << 10) + 1, Algorithm::kDirect},
    {Collective::kAllReduce, Links::kAny, false, (64 << 10) + 1, kMax, Algorithm::kRing},
    {Collective::kBroadcast, Links::kAny, false, 0, kMax, Algorithm::kDirect},
    {Collective::kBarrier, Links::kAny, false, 0, kMax, Algorithm::kDirect},
};

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
      "unknown collective '", name, "' (allgatherv, allreduce, broadcast, allgather, barrier)"));
}

// Which implementations exist (collectives.h): the all-gathers, and the barrier built on
// AllGatherV, have all three; all-reduce has ring, broadcast direct.
bool HasAlgorithm(Collective collective, Algorithm algorithm) {
  if (algorithm == Algorithm::kAuto) return false;
  switch (collective) {
    case Collective::kAllGatherV:
    case Collective::kAllGather:
    case Collective::kBarrier:
      return true;
    case Collective::kAllReduce:
      return algorithm == Algorithm::kRing || algorithm == Algorithm::kDirect;
    case Collective::kBroadcast:
      return algorithm == Algorithm::kDirect;
  }
  return false;
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

absl::Span<const SelectionRule> SelectionTable() { return kTable; }

absl::StatusOr<Algorithm> SelectAlgorithm(Collective collective, const GroupShape& shape,
                                          size_t bytes_per_rank, Algorithm requested,
                                          Algorithm configured) {
  Algorithm chosen = requested != Algorithm::kAuto ? requested : configured;
  if (chosen == Algorithm::kAuto) {
    for (const SelectionRule& rule : kTable) {
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
