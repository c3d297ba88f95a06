#include "comm/algorithms.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/env.h"
#include "base/status_macros.h"

namespace lbcc::comm {
namespace {

using Links = SelectionRule::Links;
constexpr size_t kMax = ~size_t{0};

// The table. Reasoning per row:
// - Payload exchange with slow links and islands of several ranks: hierarchical, so each
//   payload crosses each slow link once and island members share their leader's download.
// - Payload exchange otherwise: small messages direct (one step of latency, and on slow links
//   every rank receives each payload once either way); large ones on fast links by ring.
// - Dense all-reduce: ring (bandwidth-optimal: 2(N-1)/N of the data per rank).
// - Broadcast: direct from the root (groups are small; the root's up-link carries N-1 copies).
constexpr SelectionRule kTable[] = {
    {Collective::kAllGatherV, Links::kSomeSlow, true, 0, kMax, Algorithm::kHierarchical},
    {Collective::kAllGatherV, Links::kSomeSlow, false, 0, kMax, Algorithm::kDirect},
    {Collective::kAllGatherV, Links::kAllFast, false, 0, 1 << 20, Algorithm::kDirect},
    {Collective::kAllGatherV, Links::kAllFast, false, 1 << 20, kMax, Algorithm::kRing},
    {Collective::kAllReduce, Links::kAny, false, 0, kMax, Algorithm::kRing},
    {Collective::kBroadcast, Links::kAny, false, 0, kMax, Algorithm::kDirect},
};

bool Supports(Collective collective, Algorithm algorithm) {
  switch (collective) {
    case Collective::kAllGatherV:
      return true;
    case Collective::kAllReduce:
      return algorithm == Algorithm::kRing;
    case Collective::kBroadcast:
      return algorithm == Algorithm::kDirect;
  }
  return false;
}

// LBCC_ALGO's choice for `collective`, kAuto if none.
absl::StatusOr<Algorithm> FromEnv(Collective collective) {
  LBCC_ASSIGN_OR_RETURN(std::string spec, env::GetString("LBCC_ALGO"));
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, '=');
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("LBCC_ALGO='", spec, "' is invalid: expected collective=algorithm,..."));
    }
    const absl::string_view name = absl::StripAsciiWhitespace(kv[0]);
    bool known = false;
    for (Collective c : {Collective::kAllGatherV, Collective::kAllReduce, Collective::kBroadcast}) {
      known = known || name == CollectiveName(c);
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LBCC_ALGO: unknown collective '", name, "' (allgatherv, allreduce, broadcast)"));
    }
    if (name != CollectiveName(collective)) continue;
    absl::StatusOr<Algorithm> algorithm = ParseAlgorithm(absl::StripAsciiWhitespace(kv[1]));
    if (!algorithm.ok()) return Annotate(algorithm.status(), "LBCC_ALGO");
    return algorithm;
  }
  return Algorithm::kAuto;
}

}  // namespace

absl::string_view CollectiveName(Collective collective) {
  switch (collective) {
    case Collective::kAllGatherV:
      return "allgatherv";
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kBroadcast:
      return "broadcast";
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
                                          size_t bytes_per_rank, Algorithm requested) {
  Algorithm chosen = requested;
  if (chosen == Algorithm::kAuto) {
    LBCC_ASSIGN_OR_RETURN(chosen, FromEnv(collective));
  }
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
  if (chosen == Algorithm::kAuto || !Supports(collective, chosen)) {
    return absl::InvalidArgumentError(absl::StrCat(CollectiveName(collective), " has no ",
                                                   AlgorithmName(chosen), " algorithm"));
  }
  return chosen;
}

}  // namespace lbcc::comm
