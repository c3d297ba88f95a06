// Fuzzes the topology parser (comm/topology.h, Topology::FromJson: LBCC_TOPOLOGY_FILE and the
// planner's job files): any text gives a topology or InvalidArgument, never a crash or an
// allocation the text does not pay for; an accepted topology's canonical JSON parses back to
// the same JSON and answers link(), role() and its shards for every rank.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "comm/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lbcc::comm::Topology;
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Topology> t = Topology::FromJson(json);
  if (!t.ok()) {
    if (t.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const std::string canonical = t->ToJson();
  absl::StatusOr<Topology> back = Topology::FromJson(canonical);
  if (!back.ok() || back->ToJson() != canonical) std::abort();
  const int n = t->nranks();
  for (int a = 0; a < n; ++a) (void)t->role(a);
  // Symmetry on the first ranks only: the whole table is n^2 (up to 16 Mi) checks per input.
  const int m = std::min(n, 64);
  for (int a = 0; a < m; ++a) {
    for (int b = 0; b < m; ++b) {
      if (t->link(a, b) != t->link(b, a)) std::abort();
    }
  }
  for (int s = 0; s < t->num_shards(); ++s) (void)t->ShardRanks(s);
  return 0;
}
