// The one table of comm's collective algorithms: the implementations (registry.h), one row per
// Algorithm, and the selection rules (comm/algorithms.h's SelectionTable), the first matching
// rule per collective winning.
#include "comm/algorithms/all_gather_task.h"
#include "comm/algorithms/registry.h"

namespace lbcc::comm {
namespace {

using Links = SelectionRule::Links;
constexpr size_t kMax = ~size_t{0};

constexpr AlgorithmEntry kAlgorithms[] = {
    {.algorithm = Algorithm::kDirect,
     .all_gather = NewDirectGather,
     .all_reduce = AllReduceDirect,
     .all_reduce_with_header = AllReduceDirectWithHeader,
     .broadcast = Broadcast},
    {.algorithm = Algorithm::kRing,
     .all_gather = NewRingGather,
     .all_reduce = AllReduceRing,
     .tensor_all_reduce = FloatAllReduceRing,
     .context_ring = true},
    {.algorithm = Algorithm::kHierarchical, .all_gather = NewHierarchicalGather},
};

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
// - Context ring: ring (each K/V block visits every rank once over neighbour links, so each
//   link carries n-1 blocks per pass in each direction whatever the link mix).
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
    {Collective::kContextRing, Links::kAny, false, 0, kMax, Algorithm::kRing},
};

}  // namespace

absl::Span<const AlgorithmEntry> AlgorithmTable() { return kAlgorithms; }

const AlgorithmEntry* FindAlgorithm(Algorithm algorithm) {
  for (const AlgorithmEntry& entry : kAlgorithms) {
    if (entry.algorithm == algorithm) return &entry;
  }
  return nullptr;
}

// A collective has an algorithm when the algorithm's row fills the collective's slot.
bool HasAlgorithm(Collective collective, Algorithm algorithm) {
  const AlgorithmEntry* entry = FindAlgorithm(algorithm);
  if (entry == nullptr) return false;
  switch (collective) {
    case Collective::kAllGatherV:
    case Collective::kAllGather:
    case Collective::kBarrier:
      return entry->all_gather != nullptr;
    case Collective::kAllReduce:
      return entry->all_reduce != nullptr;
    case Collective::kBroadcast:
      return entry->broadcast != nullptr;
    case Collective::kContextRing:
      return entry->context_ring;
  }
  return false;
}

absl::Span<const SelectionRule> SelectionTable() { return kTable; }

}  // namespace lbcc::comm
