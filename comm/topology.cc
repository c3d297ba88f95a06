#include "comm/topology.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/env.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace lbcc::comm {
namespace {

using Json = nlohmann::json;
using Override = std::pair<std::pair<int, int>, LinkClass>;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("topology: ", what));
}

absl::Status CheckKeys(const Json& object, std::initializer_list<const char*> allowed,
                       absl::string_view where) {
  for (const auto& item : object.items()) {
    bool known = false;
    for (const char* key : allowed) known = known || item.key() == key;
    if (!known) return Bad(absl::StrCat("unknown key '", item.key(), "' in ", where));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> RankValue(const Json& value, int nranks, absl::string_view where) {
  if (!value.is_number_integer()) return Bad(absl::StrCat(where, ": a rank must be an integer"));
  const int64_t rank = value.get<int64_t>();
  if (rank < 0 || rank >= nranks) {
    return Bad(absl::StrCat(where, ": unknown rank ", rank, " (nranks ", nranks, ")"));
  }
  return static_cast<int>(rank);
}

absl::StatusOr<std::vector<int>> RankList(const Json& value, int nranks, absl::string_view where) {
  if (!value.is_array()) return Bad(absl::StrCat(where, " must be a list of ranks"));
  std::vector<int> ranks;
  for (const Json& item : value) {
    LBCC_ASSIGN_OR_RETURN(int rank, RankValue(item, nranks, where));
    ranks.push_back(rank);
  }
  return ranks;
}

}  // namespace

absl::string_view LinkClassName(LinkClass link) {
  return link == LinkClass::kFast ? "fast" : "slow";
}

Topology Topology::Flat(int nranks) {
  Topology topology;
  topology.nranks_ = nranks;
  for (int r = 0; r < nranks; ++r) topology.replicas_.push_back({RankRole::Kind::kFull, {r}});
  const absl::Status status = topology.Finish({});
  (void)status;  // Cannot fail: every rank is in exactly one island and one replica.
  return topology;
}

absl::Status Topology::Finish(const std::vector<Override>& overrides) {
  if (nranks_ < 1) return Bad("nranks must be at least 1");
  // Islands: each listed rank in exactly one; the rest alone.
  island_of_.assign(nranks_, -1);
  for (size_t i = 0; i < islands_.size(); ++i) {
    if (islands_[i].empty()) return Bad(absl::StrCat("island ", i, " is empty"));
    for (int rank : islands_[i]) {
      if (island_of_[rank] != -1) {
        return Bad(absl::StrCat("rank ", rank, " is in islands ", island_of_[rank], " and ", i));
      }
      island_of_[rank] = static_cast<int>(i);
    }
  }
  for (int rank = 0; rank < nranks_; ++rank) {
    if (island_of_[rank] == -1) {
      island_of_[rank] = static_cast<int>(islands_.size());
      islands_.push_back({rank});
    }
  }
  // Replicas: each rank in exactly one.
  roles_.assign(nranks_, RankRole{RankRole::Kind::kFull, -1, 0});
  int stages = -1;
  for (size_t m = 0; m < replicas_.size(); ++m) {
    const Replica& replica = replicas_[m];
    if (replica.ranks.empty()) return Bad(absl::StrCat("replica ", m, " has no rank"));
    if (replica.kind == RankRole::Kind::kPipeline) {
      if (stages != -1 && stages != static_cast<int>(replica.ranks.size())) {
        return Bad(absl::StrCat("pipeline replicas have different depths (", stages, " and ",
                                replica.ranks.size(), ")"));
      }
      stages = static_cast<int>(replica.ranks.size());
    }
    for (size_t s = 0; s < replica.ranks.size(); ++s) {
      const int rank = replica.ranks[s];
      if (roles_[rank].replica != -1) {
        return Bad(absl::StrCat("rank ", rank, " is in replicas ", roles_[rank].replica, " and ",
                                m));
      }
      roles_[rank] = RankRole{replica.kind, static_cast<int>(m), static_cast<int>(s)};
    }
  }
  for (int rank = 0; rank < nranks_; ++rank) {
    if (roles_[rank].replica == -1) return Bad(absl::StrCat("rank ", rank, " is in no replica"));
  }
  num_shards_ = std::max(stages, 1);
  // Links.
  links_.assign(static_cast<size_t>(nranks_) * nranks_, LinkClass::kSlow);
  for (int a = 0; a < nranks_; ++a) {
    for (int b = 0; b < nranks_; ++b) {
      if (a == b || island_of_[a] == island_of_[b]) {
        links_[static_cast<size_t>(a) * nranks_ + b] = LinkClass::kFast;
      }
    }
  }
  for (const Override& o : overrides) {
    links_[static_cast<size_t>(o.first.first) * nranks_ + o.first.second] = o.second;
    links_[static_cast<size_t>(o.first.second) * nranks_ + o.first.first] = o.second;
  }
  return SplitIslandsByLinks();
}

// An island is a set of ranks linked fast pairwise: that is what hierarchical algorithms (and
// the selection table's choice of them) assume. Where slow links were given inside an island
// (LBCC_SLOW_RANKS on one host, a "slow" link override), the island splits into the groups of
// its ranks that are still linked fast; a split that is not such a clique (a-b and b-c fast,
// a-c slow) is a contradiction and rejected. Fast links between islands are kept as given.
absl::Status Topology::SplitIslandsByLinks() {
  std::vector<std::vector<int>> islands;
  for (const std::vector<int>& island : islands_) {
    std::vector<bool> placed(island.size(), false);
    for (size_t i = 0; i < island.size(); ++i) {
      if (placed[i]) continue;
      // The ranks reachable from island[i] over fast links inside the island.
      std::vector<int> group = {island[i]};
      placed[i] = true;
      for (size_t head = 0; head < group.size(); ++head) {
        for (size_t j = 0; j < island.size(); ++j) {
          if (!placed[j] && link(group[head], island[j]) == LinkClass::kFast) {
            placed[j] = true;
            group.push_back(island[j]);
          }
        }
      }
      std::sort(group.begin(), group.end());
      for (int a : group) {
        for (int b : group) {
          if (a != b && link(a, b) != LinkClass::kFast) {
            return Bad(absl::StrCat(
                "contradictory links: ranks ", absl::StrJoin(group, ","),
                " are joined by fast links but the link ", a, "-", b,
                " is slow (an island must be ranks linked fast pairwise: list them as separate "
                "islands or make the link fast)"));
          }
        }
      }
      islands.push_back(std::move(group));
    }
  }
  islands_ = std::move(islands);
  for (size_t i = 0; i < islands_.size(); ++i) {
    for (int rank : islands_[i]) island_of_[rank] = static_cast<int>(i);
  }
  return absl::OkStatus();
}

namespace {

// Checks what nlohmann's DOM parser lets through or reports without a place: a syntax error
// gives its byte offset and what stood there; a key repeated within one object is an error
// (the DOM parser keeps the last one silently).
class StrictJsonChecker final : public nlohmann::json_sax<Json> {
 public:
  const std::string& error() const { return error_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    if (!keys_.back().insert(key).second) {
      error_ = absl::StrCat("key '", key, "' appears twice in one object");
      return false;
    }
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception&) override {
    error_ = absl::StrCat("not valid JSON at byte ", position, " (near '",
                          last_token.substr(0, 40), "')");
    return false;
  }

 private:
  std::vector<absl::flat_hash_set<std::string>> keys_;
  std::string error_;
};

}  // namespace

absl::StatusOr<Topology> Topology::FromJson(absl::string_view text) {
  StrictJsonChecker checker;
  if (!Json::sax_parse(text.begin(), text.end(), &checker)) return Bad(checker.error());
  const Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Bad("not valid JSON");
  if (!json.is_object()) return Bad("the top level must be an object");
  LBCC_RETURN_IF_ERROR(CheckKeys(json, {"nranks", "islands", "replicas", "links"}, "topology"));
  if (!json.contains("nranks") || !json["nranks"].is_number_integer()) {
    return Bad("'nranks' (an integer) is required");
  }
  const int64_t nranks = json["nranks"].get<int64_t>();
  // The link table holds nranks^2 classes and is filled pair by pair: 2^20 ranks asked for a
  // terabyte, and 12842 ranks (18 bytes of JSON) took seconds to check (topology_fuzz); 4096
  // ranks are 16 MiB.
  constexpr int64_t kMaxRanks = 1 << 12;
  if (nranks < 1 || nranks > kMaxRanks) {
    return Bad(absl::StrCat("nranks ", nranks, " is out of range (1 to ", kMaxRanks, ")"));
  }
  Topology topology;
  topology.nranks_ = static_cast<int>(nranks);
  if (json.contains("islands")) {
    if (!json["islands"].is_array()) return Bad("'islands' must be a list of rank lists");
    for (const Json& island : json["islands"]) {
      LBCC_ASSIGN_OR_RETURN(std::vector<int> ranks, RankList(island, topology.nranks_, "islands"));
      topology.islands_.push_back(std::move(ranks));
    }
  }
  if (json.contains("replicas")) {
    if (!json["replicas"].is_array()) return Bad("'replicas' must be a list");
    for (const Json& replica : json["replicas"]) {
      if (!replica.is_object() || !replica.contains("kind") || !replica["kind"].is_string()) {
        return Bad("each replica needs a 'kind' of \"full\" or \"pipeline\"");
      }
      const std::string kind = replica["kind"].get<std::string>();
      if (kind == "full") {
        LBCC_RETURN_IF_ERROR(CheckKeys(replica, {"kind", "rank"}, "a full replica"));
        if (!replica.contains("rank")) return Bad("a full replica needs 'rank'");
        LBCC_ASSIGN_OR_RETURN(int rank, RankValue(replica["rank"], topology.nranks_, "replica"));
        topology.replicas_.push_back({RankRole::Kind::kFull, {rank}});
      } else if (kind == "pipeline") {
        LBCC_RETURN_IF_ERROR(CheckKeys(replica, {"kind", "stages"}, "a pipeline replica"));
        if (!replica.contains("stages")) return Bad("a pipeline replica needs 'stages'");
        LBCC_ASSIGN_OR_RETURN(std::vector<int> stages,
                              RankList(replica["stages"], topology.nranks_, "stages"));
        topology.replicas_.push_back({RankRole::Kind::kPipeline, std::move(stages)});
      } else {
        return Bad(absl::StrCat("unknown replica kind '", kind, "' (full or pipeline)"));
      }
    }
  } else {
    for (int r = 0; r < topology.nranks_; ++r) {
      topology.replicas_.push_back({RankRole::Kind::kFull, {r}});
    }
  }
  std::vector<Override> overrides;
  if (json.contains("links")) {
    if (!json["links"].is_array()) return Bad("'links' must be a list");
    for (const Json& link : json["links"]) {
      if (!link.is_object()) return Bad("each link override must be an object");
      LBCC_RETURN_IF_ERROR(CheckKeys(link, {"ranks", "class"}, "a link override"));
      if (!link.contains("ranks") || !link.contains("class") || !link["class"].is_string()) {
        return Bad("a link override needs 'ranks' [a, b] and 'class'");
      }
      LBCC_ASSIGN_OR_RETURN(std::vector<int> pair, RankList(link["ranks"], topology.nranks_, "links"));
      if (pair.size() != 2 || pair[0] == pair[1]) {
        return Bad("a link override names two different ranks");
      }
      const std::string cls = link["class"].get<std::string>();
      if (cls != "fast" && cls != "slow") {
        return Bad(absl::StrCat("unknown link class '", cls, "' (fast or slow)"));
      }
      overrides.push_back({{pair[0], pair[1]}, cls == "fast" ? LinkClass::kFast : LinkClass::kSlow});
    }
  }
  LBCC_RETURN_IF_ERROR(topology.Finish(overrides));
  return topology;
}

absl::StatusOr<Topology> Topology::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read topology file ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<Topology> topology = FromJson(text.str());
  if (!topology.ok()) return Annotate(topology.status(), path);
  return topology;
}

absl::StatusOr<Topology> Topology::FromHostnames(absl::Span<const std::string> hostnames) {
  if (hostnames.empty()) return Bad("no ranks");
  Topology topology;
  topology.nranks_ = static_cast<int>(hostnames.size());
  std::map<std::string, int> island_of_host;
  for (int r = 0; r < topology.nranks_; ++r) {
    auto [it, inserted] =
        island_of_host.emplace(hostnames[r], static_cast<int>(topology.islands_.size()));
    if (inserted) topology.islands_.push_back({});
    topology.islands_[it->second].push_back(r);
    topology.replicas_.push_back({RankRole::Kind::kFull, {r}});
  }
  LBCC_RETURN_IF_ERROR(topology.Finish({}));
  return topology;
}

absl::StatusOr<Topology> Topology::FromEnvironment(absl::Span<const std::string> hostnames) {
  LBCC_ASSIGN_OR_RETURN(std::string file, env::GetString("LBCC_TOPO_FILE"));
  Topology topology;
  if (!file.empty()) {
    LBCC_ASSIGN_OR_RETURN(topology, FromFile(file));
    if (topology.nranks() != static_cast<int>(hostnames.size())) {
      return Bad(absl::StrCat(file, " describes ", topology.nranks(), " ranks, the communicator has ",
                              hostnames.size()));
    }
  } else {
    LBCC_ASSIGN_OR_RETURN(topology, FromHostnames(hostnames));
  }
  LBCC_ASSIGN_OR_RETURN(std::string slow, env::GetString("LBCC_SLOW_RANKS"));
  std::vector<int> slow_ranks;
  for (absl::string_view item : absl::StrSplit(slow, ',', absl::SkipWhitespace())) {
    int rank = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat("LBCC_SLOW_RANKS='", slow, "' is invalid: expected ranks like 2,3"));
    }
    slow_ranks.push_back(rank);
  }
  LBCC_RETURN_IF_ERROR(topology.MarkSlowRanks(slow_ranks));
  return topology;
}

absl::Status Topology::MarkSlowRanks(absl::Span<const int> ranks) {
  for (int rank : ranks) {
    if (rank < 0 || rank >= nranks_) {
      return Bad(absl::StrCat("slow rank ", rank, " is unknown (nranks ", nranks_, ")"));
    }
    for (int other = 0; other < nranks_; ++other) {
      if (other == rank) continue;
      links_[static_cast<size_t>(rank) * nranks_ + other] = LinkClass::kSlow;
      links_[static_cast<size_t>(other) * nranks_ + rank] = LinkClass::kSlow;
    }
  }
  // A slow rank on a host it shares with others is an island of its own.
  return SplitIslandsByLinks();
}

std::vector<int> Topology::ShardRanks(int shard) const {
  std::vector<int> ranks;
  for (const Replica& replica : replicas_) {
    if (replica.kind == RankRole::Kind::kFull) {
      ranks.push_back(replica.ranks[0]);
    } else if (shard < static_cast<int>(replica.ranks.size())) {
      ranks.push_back(replica.ranks[shard]);
    }
  }
  return ranks;
}

bool Topology::AllFast(absl::Span<const int> ranks) const {
  for (int a : ranks) {
    for (int b : ranks) {
      if (link(a, b) != LinkClass::kFast) return false;
    }
  }
  return true;
}

std::string Topology::ToJson() const {
  Json json;
  json["nranks"] = nranks_;
  json["islands"] = islands_;
  Json replicas = Json::array();
  for (const Replica& replica : replicas_) {
    if (replica.kind == RankRole::Kind::kFull) {
      replicas.push_back({{"kind", "full"}, {"rank", replica.ranks[0]}});
    } else {
      replicas.push_back({{"kind", "pipeline"}, {"stages", replica.ranks}});
    }
  }
  json["replicas"] = replicas;
  Json links = Json::array();
  for (int a = 0; a < nranks_; ++a) {
    for (int b = a + 1; b < nranks_; ++b) {
      const LinkClass natural = island_of_[a] == island_of_[b] ? LinkClass::kFast : LinkClass::kSlow;
      if (link(a, b) != natural) {
        links.push_back({{"ranks", {a, b}}, {"class", std::string(LinkClassName(link(a, b)))}});
      }
    }
  }
  if (!links.empty()) json["links"] = links;
  return json.dump();
}

}  // namespace lbcc::comm
