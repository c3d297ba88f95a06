#include "plan/network.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace lbcc::plan {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("rates: ", field, ": ", what));
}

absl::Status CheckKeys(const Json& object, std::initializer_list<const char*> allowed,
                       absl::string_view where) {
  return CheckJsonKeys(object, allowed, absl::StrCat("rates: ", where));
}

// A positive rate (Mbit/s or Gbit/s in the file) as bytes per second.
absl::StatusOr<double> Rate(const Json& object, const char* key, double bits_per_unit,
                            absl::string_view where) {
  const std::string field = absl::StrCat(where, ".", key);
  if (!object.contains(key)) return Bad(field, "is required");
  const Json& v = object[key];
  if (!v.is_number()) return Bad(field, "must be a number");
  const double x = v.get<double>();
  if (!(x > 0) || !std::isfinite(x)) {
    return Bad(field, absl::StrCat("is ", x, "; a rate must be > 0"));
  }
  return x * bits_per_unit / 8.0;
}

absl::StatusOr<double> Latency(const Json& object, absl::string_view where) {
  if (!object.contains("latency_ms")) return 0.0;
  const Json& v = object["latency_ms"];
  if (!v.is_number() || v.get<double>() < 0 || !std::isfinite(v.get<double>())) {
    return Bad(absl::StrCat(where, ".latency_ms"), "must be a number >= 0");
  }
  return v.get<double>() * 1e-3;
}

absl::StatusOr<AccessLink> ParseAccess(const Json& object, absl::string_view where,
                                       std::initializer_list<const char*> extra = {}) {
  std::vector<const char*> keys = {"up_mbit", "down_mbit", "latency_ms"};
  keys.insert(keys.end(), extra.begin(), extra.end());
  if (!object.is_object()) return Bad(where, "must be an object");
  for (const auto& item : object.items()) {
    bool known = false;
    for (const char* key : keys) known = known || item.key() == key;
    if (!known) return Bad(where, absl::StrCat("unknown key '", item.key(), "'"));
  }
  AccessLink link;
  LBCC_ASSIGN_OR_RETURN(link.up_bps, Rate(object, "up_mbit", 1e6, where));
  LBCC_ASSIGN_OR_RETURN(link.down_bps, Rate(object, "down_mbit", 1e6, where));
  LBCC_ASSIGN_OR_RETURN(link.latency_s, Latency(object, where));
  return link;
}

absl::Status ParseBursts(const Json& object, absl::string_view where, AccessLink* link) {
  for (auto [key, out] : {std::pair<const char*, double*>{"up_burst_bytes", &link->up_burst_bytes},
                          {"down_burst_bytes", &link->down_burst_bytes}}) {
    if (!object.contains(key)) continue;
    const Json& v = object[key];
    if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>())) {
      return Bad(absl::StrCat(where, ".", key), "must be a number >= 0 (bytes)");
    }
    *out = v.get<double>();
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Index(const Json& object, const char* key, int limit,
                          absl::string_view where) {
  if (!object.is_object() || !object.contains(key) || !object[key].is_number_integer()) {
    return Bad(where, absl::StrCat("'", key, "' (an integer) is required"));
  }
  const int64_t v = object[key].get<int64_t>();
  if (v < 0 || v >= limit) {
    return Bad(absl::StrCat(where, ".", key), absl::StrCat("unknown ", key, " ", v, " (", limit,
                                                           key == std::string("rank")
                                                               ? " ranks)"
                                                               : " islands)"));
  }
  return static_cast<int>(v);
}

}  // namespace

absl::StatusOr<Network> ParseRates(const Json& rates, comm::Topology topology,
                                   const transport::SchedulerOptions& scheduler) {
  if (rates.is_null()) {
    return absl::InvalidArgumentError(
        "rates: the topology has no rates: add a \"rates\" object (per-rank up_mbit, down_mbit, "
        "latency_ms; see docs/planning.md)");
  }
  LBCC_RETURN_IF_ERROR(
      CheckKeys(rates,
                {"efficiency", "pace_mbit", "fast", "default", "ranks", "sites", "chunk_bytes",
                 "window_bytes", "stripes", "credit_ms", "message_ms"},
                "rates"));
  Network net;
  net.scheduler = scheduler;
  auto bytes_field = [&](const char* key, bool zero_ok, int64_t* out) -> absl::Status {
    if (!rates.contains(key)) return absl::OkStatus();
    const Json& v = rates[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || (!zero_ok && v.get<int64_t>() == 0)) {
      return Bad(key, zero_ok ? "must be an integer >= 0" : "must be an integer > 0");
    }
    *out = v.get<int64_t>();
    return absl::OkStatus();
  };
  LBCC_RETURN_IF_ERROR(bytes_field("chunk_bytes", false, &net.scheduler.chunk_bytes));
  LBCC_RETURN_IF_ERROR(bytes_field("window_bytes", true, &net.scheduler.window_bytes));
  int64_t stripes = net.scheduler.stripes;
  LBCC_RETURN_IF_ERROR(bytes_field("stripes", false, &stripes));
  net.scheduler.stripes = static_cast<int>(std::min<int64_t>(stripes, 1 << 16));
  if (net.scheduler.chunk_bytes <= 0) {
    return Bad("chunk_bytes", absl::StrCat("is ", net.scheduler.chunk_bytes,
                                           " (LBCC_SLOW_CHUNK_BYTES); must be > 0"));
  }
  for (const char* key : {"credit_ms", "message_ms"}) {
    if (!rates.contains(key)) continue;
    const Json& v = rates[key];
    if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>())) {
      return Bad(key, "must be a number >= 0");
    }
    (std::string(key) == "credit_ms" ? net.credit_s : net.message_s) = v.get<double>() * 1e-3;
  }
  const int n = topology.nranks();
  net.topology = std::move(topology);
  if (rates.contains("efficiency")) {
    const Json& e = rates["efficiency"];
    if (!e.is_number() || !(e.get<double>() > 0) || e.get<double>() > 1) {
      return Bad("efficiency", "must be a number in (0, 1]");
    }
    net.efficiency = e.get<double>();
  }
  if (rates.contains("pace_mbit")) {
    LBCC_ASSIGN_OR_RETURN(net.pace_bps, Rate(rates, "pace_mbit", 1e6, "rates"));
  }
  net.fast = {10e9 / 8, 10e9 / 8, 50e-6};  // 10 Gbit/s, 50 us unless given
  if (rates.contains("fast")) {
    const Json& f = rates["fast"];
    LBCC_RETURN_IF_ERROR(CheckKeys(f, {"gbit", "latency_ms"}, "fast"));
    LBCC_ASSIGN_OR_RETURN(const double bps, Rate(f, "gbit", 1e9, "fast"));
    LBCC_ASSIGN_OR_RETURN(const double latency, Latency(f, "fast"));
    net.fast = {bps, bps, latency};
  }
  std::optional<AccessLink> fallback;
  if (rates.contains("default")) {
    LBCC_ASSIGN_OR_RETURN(fallback, ParseAccess(rates["default"], "default",
                                                {"up_burst_bytes", "down_burst_bytes"}));
    LBCC_RETURN_IF_ERROR(ParseBursts(rates["default"], "default", &*fallback));
  }
  std::vector<std::optional<AccessLink>> per_rank(n);
  if (rates.contains("ranks")) {
    const Json& list = rates["ranks"];
    if (!list.is_array()) return Bad("ranks", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = absl::StrCat("ranks[", i, "]");
      LBCC_ASSIGN_OR_RETURN(const int rank, Index(list[i], "rank", n, where));
      if (per_rank[rank]) return Bad(where, absl::StrCat("rank ", rank, " listed twice"));
      LBCC_ASSIGN_OR_RETURN(per_rank[rank], ParseAccess(list[i], where, {"rank", "up_burst_bytes",
                                                                          "down_burst_bytes"}));
      LBCC_RETURN_IF_ERROR(ParseBursts(list[i], where, &*per_rank[rank]));
    }
  }
  net.rank_link.resize(n);
  for (int r = 0; r < n; ++r) {
    bool slow = false;
    for (int p = 0; p < n; ++p) slow = slow || net.topology.link(r, p) == comm::LinkClass::kSlow;
    if (per_rank[r]) {
      net.rank_link[r] = *per_rank[r];
    } else if (fallback) {
      net.rank_link[r] = *fallback;
    } else if (slow) {
      return Bad("ranks", absl::StrCat("rank ", r,
                                       " has slow links but no rate (and rates.default is not "
                                       "given)"));
    } else {
      net.rank_link[r] = net.fast;  // never used: all its links are fast
    }
  }
  net.site_link.resize(net.topology.islands().size());
  if (rates.contains("sites")) {
    const Json& list = rates["sites"];
    if (!list.is_array()) return Bad("sites", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = absl::StrCat("sites[", i, "]");
      LBCC_ASSIGN_OR_RETURN(const int island,
                            Index(list[i], "island", static_cast<int>(net.site_link.size()),
                                  where));
      if (net.site_link[island]) {
        return Bad(where, absl::StrCat("island ", island, " listed twice"));
      }
      LBCC_ASSIGN_OR_RETURN(net.site_link[island], ParseAccess(list[i], where, {"island"}));
    }
  }
  return net;
}

void LinkBytes::Add(const LinkBytes& other) {
  for (size_t r = 0; r < slow_up.size(); ++r) {
    slow_up[r] += other.slow_up[r];
    slow_down[r] += other.slow_down[r];
    fast_up[r] += other.fast_up[r];
    fast_down[r] += other.fast_down[r];
  }
}

PhaseTime TimeOfPhase(const Network& net, const std::vector<Transfer>& transfers,
                      LinkBytes* bytes, double idle_s) {
  const int n = net.topology.nranks();
  const size_t islands = net.site_link.size();
  LinkBytes local(n);
  std::vector<double> site_up(islands, 0), site_down(islands, 0);
  PhaseTime t;
  double paced = 0;
  struct Windowed {
    const Transfer* x;
    double rtt;
  };
  std::vector<Windowed> windowed;
  for (const Transfer& x : transfers) {
    if (x.src == x.dst || x.bytes <= 0) continue;
    const bool slow = net.topology.link(x.src, x.dst) == comm::LinkClass::kSlow;
    double latency = 0;
    if (slow) {
      local.slow_up[x.src] += x.bytes;
      local.slow_down[x.dst] += x.bytes;
      const int is = net.topology.island_of(x.src), id = net.topology.island_of(x.dst);
      latency = net.rank_link[x.src].latency_s + net.rank_link[x.dst].latency_s;
      if (is != id) {
        if (net.site_link[is]) {
          site_up[is] += x.bytes;
          latency += net.site_link[is]->latency_s;
        }
        if (net.site_link[id]) {
          site_down[id] += x.bytes;
          latency += net.site_link[id]->latency_s;
        }
      }
      if (net.pace_bps > 0) paced = std::max(paced, x.bytes / net.pace_bps);
      windowed.push_back({&x, 2 * latency});
    } else {
      local.fast_up[x.src] += x.bytes;
      local.fast_down[x.dst] += x.bytes;
      latency = 2 * net.fast.latency_s;
    }
    t.latency_s = std::max(t.latency_s, latency + net.message_s);
  }
  const double e = net.efficiency;
  double worst = paced;
  t.bottleneck = paced > 0 ? "slow-link pacing" : "";
  // What an idle link's refilled shaper bucket saves: its bytes at line speed instead of the rate.
  auto bucket_s = [&](double burst, double rate) {
    return idle_s > 0 && burst > 0 ? std::min(burst / rate, idle_s) : 0.0;
  };
  auto consider = [&](double b, double rate, const std::string& what, double saved = 0) {
    if (b <= 0) return;
    const double s = std::max(0.0, b / (rate * e) - saved);
    if (s > worst) {
      worst = s;
      t.bottleneck = what;
    }
  };
  for (int r = 0; r < n; ++r) {
    const AccessLink& a = net.rank_link[r];
    consider(local.slow_up[r], a.up_bps, absl::StrCat("rank ", r, " up (slow)"),
             bucket_s(a.up_burst_bytes, a.up_bps));
    consider(local.slow_down[r], a.down_bps, absl::StrCat("rank ", r, " down (slow)"),
             bucket_s(a.down_burst_bytes, a.down_bps));
    consider(local.fast_up[r], net.fast.up_bps, absl::StrCat("rank ", r, " up (fast)"));
    consider(local.fast_down[r], net.fast.down_bps, absl::StrCat("rank ", r, " down (fast)"));
  }
  for (size_t i = 0; i < islands; ++i) {
    if (!net.site_link[i]) continue;
    consider(site_up[i], net.site_link[i]->up_bps, absl::StrCat("island ", i, " site up"));
    consider(site_down[i], net.site_link[i]->down_bps, absl::StrCat("island ", i, " site down"));
  }
  // Each slow transfer alone on its path, with its credit window.
  const double drained = worst;
  for (const Windowed& w : windowed) {
    const Transfer& x = *w.x;
    const int is = net.topology.island_of(x.src), id = net.topology.island_of(x.dst);
    double r = std::min(net.rank_link[x.src].up_bps, net.rank_link[x.dst].down_bps);
    if (is != id && net.site_link[is]) r = std::min(r, net.site_link[is]->up_bps);
    if (is != id && net.site_link[id]) r = std::min(r, net.site_link[id]->down_bps);
    // The bucket of the access link that sets the path's rate (of both, when both do).
    const AccessLink& up = net.rank_link[x.src];
    const AccessLink& down = net.rank_link[x.dst];
    double saved = std::numeric_limits<double>::infinity();
    if (r == down.down_bps) saved = std::min(saved, bucket_s(down.down_burst_bytes, r));
    if (r == up.up_bps) saved = std::min(saved, bucket_s(up.up_burst_bytes, r));
    if (!std::isfinite(saved)) saved = 0;
    const double s = std::max(0.0, WindowedTransferSeconds(net, x.bytes, r * e, w.rtt) - saved);
    if (s > worst) {
      worst = s;
      t.bottleneck = absl::StrCat("credit window ", x.src, "->", x.dst);
    }
  }
  t.window_s = worst - drained;
  // The hosts' CPU for the bytes: each rank's on its own core, or all of them on the shared
  // cores (docs/planning.md, "Shared cores").
  if (net.copy_bps > 0) {
    double most = 0, sum = 0;
    for (int r = 0; r < n; ++r) {
      const double b = local.slow_up[r] + local.slow_down[r] + local.fast_up[r] +
                       local.fast_down[r];
      most = std::max(most, b / net.copy_bps);
      sum += b / net.copy_bps;
    }
    t.host_s = net.shared_cores > 0 ? std::max(most, sum / net.shared_cores) : most;
    if (t.host_s > worst) {
      worst = t.host_s;
      t.window_s = 0;  // the window's stalls hide behind the hosts' CPU
      t.bottleneck = net.shared_cores > 0
                         ? absl::StrCat("host CPU (", n, " ranks on ", net.shared_cores,
                                        " cores)")
                         : "host CPU";
    }
  }
  t.seconds = worst + t.latency_s;
  if (bytes != nullptr) bytes->Add(local);
  return t;
}

double CpuSerialisation(const Network& net, int busy) {
  if (net.shared_cores <= 0 || busy <= net.shared_cores) return 1.0;
  return static_cast<double>(busy) / net.shared_cores;
}

double WindowOf(const Network& net, double bytes_per_second, double rtt_s) {
  return static_cast<double>(transport::WindowBytes(net.scheduler, bytes_per_second, rtt_s));
}

double WindowedTransferSeconds(const Network& net, double bytes, double r, double rtt_s) {
  if (bytes <= 0 || r <= 0) return 0;
  const double window = std::max(1.0, WindowOf(net, r, rtt_s));
  const double chunk = std::min(window, static_cast<double>(net.scheduler.chunk_bytes));
  // The first chunk's credit is back after the chunk drains, a round trip and the credit's
  // turnaround; if the window is not all sent by then the sender stalls that long per window.
  const double stall = std::max(0.0, chunk / r + rtt_s + net.credit_s - window / r);
  const double windows = std::ceil(bytes / window);
  return bytes / r + std::max(0.0, windows - 1) * stall;
}

absl::Status CheckJsonKeys(const nlohmann::json& object,
                           std::initializer_list<const char*> allowed, absl::string_view where) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
  };
  if (!object.is_object()) return bad("must be an object");
  for (const auto& item : object.items()) {
    bool known = false;
    for (const char* key : allowed) known = known || item.key() == key;
    if (!known) return bad(absl::StrCat("unknown key '", item.key(), "'"));
  }
  return absl::OkStatus();
}

}  // namespace lbcc::plan
