// Topology: which ranks share a fast island, which ranks form full replicas and which form
// pipeline replicas (stage s of replica m), and the class of the link between any two ranks.
//
// Sources, in order of precedence:
//   1. a JSON file (LBCC_TOPO_FILE or an explicit path), schema below;
//   2. derived from host names: ranks on the same host form a fast island, every rank is a
//      full replica;
// then LBCC_SLOW_RANKS (e.g. "2,3") makes every link touching those ranks slow.
//
// JSON schema (unknown keys are errors, so typos do not pass silently):
//   {
//     "nranks": 5,
//     "islands":  [[0, 1], [2]],                  // optional; unlisted ranks: own island
//     "replicas": [{"kind": "full", "rank": 0},   // optional; default: all full replicas
//                  {"kind": "full", "rank": 1},
//                  {"kind": "pipeline", "stages": [2, 3, 4]}],
//     "links":    [{"ranks": [0, 2], "class": "fast"}]   // optional per-pair overrides
//   }
// Links inside an island are fast, between islands slow, unless overridden. An island is always
// a set of ranks linked fast pairwise: a slow override or slow rank inside an island splits it
// (a slow rank becomes an island of its own); a split that leaves ranks joined by fast links
// but not pairwise fast is InvalidArgument.
//
// Data parallelism over pipelines happens per shard: shard s = every full replica + stage s of
// every pipeline replica (all pipelines must have the same number of stages). A full replica
// takes part in every shard.
//
// Errors: InvalidArgument naming the problem (unknown rank, rank in two islands or replicas,
// rank in no replica, unequal pipeline depths, bad JSON, unknown key, bad link class).
// Thread-safety: a Topology is an immutable value after construction.
#ifndef LBCC_COMM_TOPOLOGY_H_
#define LBCC_COMM_TOPOLOGY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lbcc::comm {

enum class LinkClass : uint8_t { kFast = 0, kSlow = 1 };
absl::string_view LinkClassName(LinkClass link);

struct RankRole {
  enum class Kind : uint8_t { kFull, kPipeline };
  Kind kind;
  int replica;  // Index into Topology::replicas().
  int stage;    // Pipeline stage; 0 for a full replica.
};

class Topology {
 public:
  struct Replica {
    RankRole::Kind kind;
    std::vector<int> ranks;  // One rank for a full replica; stage order for a pipeline.
  };

  // Every rank its own island and a full replica: all links slow. For tests and the default
  // of a communicator without topology information.
  static Topology Flat(int nranks);

  static absl::StatusOr<Topology> FromJson(absl::string_view json);
  static absl::StatusOr<Topology> FromFile(const std::string& path);
  // Same host name = same fast island; every rank a full replica.
  static absl::StatusOr<Topology> FromHostnames(absl::Span<const std::string> hostnames);
  // The file named by LBCC_TOPO_FILE if set, else FromHostnames; then LBCC_SLOW_RANKS.
  static absl::StatusOr<Topology> FromEnvironment(absl::Span<const std::string> hostnames);

  // Makes every link that touches one of `ranks` slow; each such rank becomes an island of its
  // own. InvalidArgument for unknown ranks.
  absl::Status MarkSlowRanks(absl::Span<const int> ranks);

  int nranks() const { return nranks_; }
  LinkClass link(int a, int b) const { return links_[static_cast<size_t>(a) * nranks_ + b]; }
  int island_of(int rank) const { return island_of_[rank]; }
  const std::vector<std::vector<int>>& islands() const { return islands_; }
  const std::vector<Replica>& replicas() const { return replicas_; }
  const RankRole& role(int rank) const { return roles_[rank]; }
  // 1 when there is no pipeline replica.
  int num_shards() const { return num_shards_; }
  // Ranks of shard s in replica order (full replicas, then pipeline stage s, as listed).
  std::vector<int> ShardRanks(int shard) const;
  // True when every pair of distinct ranks in `ranks` is linked fast.
  bool AllFast(absl::Span<const int> ranks) const;

  // The canonical JSON form (parses back to an equal topology).
  std::string ToJson() const;

 private:
  // Fills roles, islands and links from the members; validates.
  absl::Status Finish(const std::vector<std::pair<std::pair<int, int>, LinkClass>>& overrides);
  // Splits islands along slow links inside them; InvalidArgument where that is contradictory.
  absl::Status SplitIslandsByLinks();

  int nranks_ = 0;
  std::vector<std::vector<int>> islands_;
  std::vector<int> island_of_;
  std::vector<Replica> replicas_;
  std::vector<RankRole> roles_;
  std::vector<LinkClass> links_;
  int num_shards_ = 1;
};

}  // namespace lbcc::comm

#endif  // LBCC_COMM_TOPOLOGY_H_
