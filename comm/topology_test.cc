#include "comm/topology.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kHetero[] = R"({
  "nranks": 5,
  "islands": [[0, 1]],
  "replicas": [{"kind": "full", "rank": 0}, {"kind": "full", "rank": 1},
               {"kind": "pipeline", "stages": [2, 3, 4]}],
  "links": [{"ranks": [3, 4], "class": "fast"}]
})";

TEST(TopologyTest, ParsesIslandsReplicasAndLinks) {
  LBCC_ASSERT_OK_AND_ASSIGN(Topology t, Topology::FromJson(kHetero));
  EXPECT_EQ(t.nranks(), 5);
  EXPECT_EQ(t.link(0, 1), LinkClass::kFast);
  EXPECT_EQ(t.link(0, 2), LinkClass::kSlow);
  EXPECT_EQ(t.link(2, 3), LinkClass::kSlow);
  EXPECT_EQ(t.link(4, 3), LinkClass::kFast);  // Override, symmetric.
  EXPECT_EQ(t.link(2, 2), LinkClass::kFast);
  EXPECT_EQ(t.islands().size(), 4u);  // {0,1} plus singletons 2, 3, 4.
  EXPECT_EQ(t.num_shards(), 3);
  EXPECT_THAT(t.ShardRanks(0), ElementsAre(0, 1, 2));
  EXPECT_THAT(t.ShardRanks(2), ElementsAre(0, 1, 4));
  EXPECT_EQ(t.role(3).kind, RankRole::Kind::kPipeline);
  EXPECT_EQ(t.role(3).replica, 2);
  EXPECT_EQ(t.role(3).stage, 1);
  EXPECT_TRUE(t.AllFast({0, 1}));
  EXPECT_FALSE(t.AllFast({0, 1, 2}));
}

TEST(TopologyTest, JsonRoundTrip) {
  LBCC_ASSERT_OK_AND_ASSIGN(Topology t, Topology::FromJson(kHetero));
  LBCC_ASSERT_OK_AND_ASSIGN(Topology back, Topology::FromJson(t.ToJson()));
  EXPECT_EQ(back.ToJson(), t.ToJson());
  for (int a = 0; a < 5; ++a) {
    for (int b = 0; b < 5; ++b) EXPECT_EQ(back.link(a, b), t.link(a, b));
  }
}

TEST(TopologyTest, DefaultsAndFlat) {
  LBCC_ASSERT_OK_AND_ASSIGN(Topology t, Topology::FromJson(R"({"nranks": 3})"));
  EXPECT_EQ(t.num_shards(), 1);
  EXPECT_THAT(t.ShardRanks(0), ElementsAre(0, 1, 2));
  EXPECT_EQ(t.link(0, 1), LinkClass::kSlow);
  Topology flat = Topology::Flat(2);
  EXPECT_EQ(flat.link(0, 1), LinkClass::kSlow);
  EXPECT_EQ(flat.role(1).replica, 1);
}

TEST(TopologyTest, FromHostnamesGroupsSameHost) {
  LBCC_ASSERT_OK_AND_ASSIGN(Topology t,
                            Topology::FromHostnames({"a", "b", "a", "c", "b"}));
  EXPECT_EQ(t.link(0, 2), LinkClass::kFast);
  EXPECT_EQ(t.link(1, 4), LinkClass::kFast);
  EXPECT_EQ(t.link(0, 1), LinkClass::kSlow);
  EXPECT_EQ(t.islands().size(), 3u);
}

TEST(TopologyTest, Rejections) {
  struct Case {
    const char* json;
    const char* message;
  };
  const Case cases[] = {
      {"not json", "not valid JSON at byte 2 (near 'no')"},
      {R"({"nranks": 2,, "islands": []})", "not valid JSON at byte 14"},
      {R"({"nranks": 2, "nranks": 3})", "key 'nranks' appears twice"},
      {R"({"nranks": 2, "links": [{"ranks": [0, 1], "class": "fast", "class": "slow"}]})",
       "key 'class' appears twice"},
      {"[1]", "object"},
      {R"({"islands": []})", "nranks"},
      {R"({"nranks": 0})", "out of range"},
      // topology_fuzz: the link table of 2^20 ranks would take a terabyte, and 12842 ranks
      // took seconds to fill.
      {R"({"nranks": 1048576})", "out of range (1 to 4096)"},
      {R"({"nranks": 12842})", "out of range (1 to 4096)"},
      {R"({"nranks": 2, "island": [[0]]})", "unknown key 'island'"},
      {R"({"nranks": 2, "islands": [[0, 5]]})", "unknown rank 5"},
      {R"({"nranks": 2, "islands": [[0, 1], [1]]})", "rank 1 is in islands 0 and 1"},
      {R"({"nranks": 2, "islands": [[]]})", "empty"},
      {R"({"nranks": 2, "replicas": [{"kind": "full", "rank": 0}]})", "rank 1 is in no replica"},
      {R"({"nranks": 2, "replicas": [{"kind": "full", "rank": 0}, {"kind": "full", "rank": 0}]})",
       "rank 0 is in replicas 0 and 1"},
      {R"({"nranks": 2, "replicas": [{"kind": "half", "rank": 0}]})", "unknown replica kind"},
      {R"({"nranks": 5, "replicas": [{"kind": "pipeline", "stages": [0, 1]},
                                    {"kind": "pipeline", "stages": [2, 3, 4]}]})",
       "different depths"},
      {R"({"nranks": 2, "replicas": [{"kind": "full", "rank": "0"}]})", "integer"},
      {R"({"nranks": 2, "links": [{"ranks": [0, 0], "class": "fast"}]})", "two different"},
      {R"({"nranks": 2, "links": [{"ranks": [0, 1], "class": "medium"}]})", "unknown link class"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Topology::FromJson(c.json),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.json;
  }
}

// Islands and link classes never contradict each other: every island is a set of ranks linked
// fast pairwise, which is what hierarchical algorithms and the selection table assume.
TEST(TopologyTest, SlowLinksInsideAnIslandSplitItOrAreRejected) {
  // Every rank slow on one host: four islands of one rank (was one island of slow links, and
  // the table then chose hierarchical).
  setenv("LBCC_SLOW_RANKS", "0,1,2,3", 1);
  LBCC_ASSERT_OK_AND_ASSIGN(Topology all_slow, Topology::FromEnvironment({"h", "h", "h", "h"}));
  unsetenv("LBCC_SLOW_RANKS");
  EXPECT_EQ(all_slow.islands(), (std::vector<std::vector<int>>{{0}, {1}, {2}, {3}}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(all_slow.island_of(r), r);
  // Slow overrides that cut an island in two cliques: two islands.
  LBCC_ASSERT_OK_AND_ASSIGN(Topology split, Topology::FromJson(R"({"nranks": 4,
      "islands": [[0, 1, 2, 3]],
      "links": [{"ranks": [0, 2], "class": "slow"}, {"ranks": [0, 3], "class": "slow"},
                {"ranks": [1, 2], "class": "slow"}, {"ranks": [1, 3], "class": "slow"}]})"));
  EXPECT_EQ(split.islands(), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(split.link(2, 3), LinkClass::kFast);
  // The canonical form parses back to the same islands and links.
  LBCC_ASSERT_OK_AND_ASSIGN(Topology back, Topology::FromJson(split.ToJson()));
  EXPECT_EQ(back.islands(), split.islands());
  EXPECT_EQ(back.link(0, 2), LinkClass::kSlow);
  // 0-1 and 1-2 fast, 0-2 slow: no set of islands fits.
  EXPECT_THAT(Topology::FromJson(R"({"nranks": 3, "islands": [[0, 1, 2]],
                                     "links": [{"ranks": [0, 2], "class": "slow"}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("contradictory links: ranks 0,1,2 are joined by fast links but "
                                 "the link 0-2 is slow")));
  // A fast link between islands is kept as given; the islands stay.
  LBCC_ASSERT_OK_AND_ASSIGN(Topology bridged, Topology::FromJson(R"({"nranks": 3,
      "islands": [[0, 1]], "links": [{"ranks": [1, 2], "class": "fast"}]})"));
  EXPECT_EQ(bridged.islands().size(), 2u);
  EXPECT_EQ(bridged.link(1, 2), LinkClass::kFast);
}

TEST(TopologyTest, EnvironmentFileAndSlowRanks) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/topo.json";
  std::ofstream(path) << R"({"nranks": 3, "islands": [[0, 1, 2]]})";
  setenv("LBCC_TOPO_FILE", path.c_str(), 1);
  setenv("LBCC_SLOW_RANKS", "2", 1);
  LBCC_ASSERT_OK_AND_ASSIGN(Topology t, Topology::FromEnvironment({"h", "h", "h"}));
  EXPECT_EQ(t.link(0, 1), LinkClass::kFast);
  EXPECT_EQ(t.link(0, 2), LinkClass::kSlow);
  EXPECT_EQ(t.link(2, 1), LinkClass::kSlow);
  EXPECT_EQ(t.islands(), (std::vector<std::vector<int>>{{0, 1}, {2}}));
  EXPECT_THAT(Topology::FromEnvironment({"h", "h"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("describes 3 ranks")));
  setenv("LBCC_SLOW_RANKS", "2,x", 1);
  EXPECT_THAT(Topology::FromEnvironment({"h", "h", "h"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LBCC_SLOW_RANKS")));
  setenv("LBCC_SLOW_RANKS", "7", 1);
  EXPECT_THAT(Topology::FromEnvironment({"h", "h", "h"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slow rank 7")));
  setenv("LBCC_TOPO_FILE", "/nonexistent/topo.json", 1);
  EXPECT_THAT(Topology::FromEnvironment({"h"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cannot read")));
  unsetenv("LBCC_TOPO_FILE");
  unsetenv("LBCC_SLOW_RANKS");
  EXPECT_THAT(Topology::FromEnvironment({"h", "g"}), IsOk());
}

}  // namespace
}  // namespace lbcc::comm
