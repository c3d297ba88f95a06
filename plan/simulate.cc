// `lbcc plan simulate`: the planning model at internet scale. Participants (each a full
// data-parallel replica) with access links drawn log-uniform between --min_mbit and --max_mbit
// (down), up = down x uniform(--up_ratio_min, 1) (asymmetric), one-way latency uniform 5-50 ms,
// compute log-uniform 0.3-3 PFLOP/s; models of 1B, 8B and 70B parameters. Two layouts:
//   flat:  every participant its own island (every link slow);
//   sites: islands of 8 participants on fast links behind one shared site link (drawn as above).
// For every (layout, participants, model) it predicts the outer step with the table's algorithm
// and with each algorithm forced (direct, ring, hierarchical), and writes one JSON row each.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "plan/cli.h"
#include "plan/plan.h"

namespace lbcc::plan {
namespace {

constexpr char kUsage[] =
    "usage: lbcc plan simulate [--out=FILE.json] [--seed=N] [--participants=16,32,...]\n"
    "                          [--min_mbit=50] [--max_mbit=1000] [--up_ratio_min=0.2]\n"
    "                          [--H=30] [--tokens_per_step=524288]\n"
    "                          [--encode_gelements_s=0.87] [--decode_gvalues_s=0.39]\n"
    "Internet-scale runs of the planning model (full replicas, SparseAllReduce every H steps):\n"
    "link rates log-uniform in [min_mbit, max_mbit] down, up = down x U(up_ratio_min, 1),\n"
    "models of 1B, 8B, 70B, layouts flat and sites (8 per site), each algorithm forced and the\n"
    "table's choice. Writes JSON rows to --out (default stdout). bench/plan_internet.sh turns\n"
    "them into bench/results/plan_internet.md and a plot.\n";

struct ModelSize {
  const char* name;
  double params;
  int64_t d;
};

struct Options {
  std::string out;
  uint64_t seed = 1;
  std::vector<int> participants = {16, 32, 64, 128, 256, 512, 1024};
  double min_mbit = 50, max_mbit = 1000, up_ratio_min = 0.2;
  int H = 30;
  int64_t tokens_per_step = 1 << 19;
  double encode_gelements_s = 0.87, decode_gvalues_s = 0.39;
};

nlohmann::json Layout(int n, bool sites, const Options& o, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto rate = [&] {
    const double lo = std::log(o.min_mbit), hi = std::log(o.max_mbit);
    const double down = std::exp(lo + (hi - lo) * u(rng));
    const double up = down * (o.up_ratio_min + (1 - o.up_ratio_min) * u(rng));
    return nlohmann::json{{"down_mbit", down}, {"up_mbit", up}, {"latency_ms", 5 + 45 * u(rng)}};
  };
  nlohmann::json topology = {{"nranks", n}};
  nlohmann::json rates = {{"fast", {{"gbit", 100}, {"latency_ms", 0.01}}}};
  if (!sites) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < n; ++r) {
      nlohmann::json l = rate();
      l["rank"] = r;
      ranks.push_back(l);
    }
    rates["ranks"] = ranks;
  } else {
    nlohmann::json islands = nlohmann::json::array(), site_rates = nlohmann::json::array();
    for (int i = 0; i * 8 < n; ++i) {
      nlohmann::json island = nlohmann::json::array();
      for (int r = i * 8; r < std::min(n, i * 8 + 8); ++r) island.push_back(r);
      islands.push_back(island);
      nlohmann::json l = rate();
      l["island"] = i;
      site_rates.push_back(l);
    }
    topology["islands"] = islands;
    rates["default"] = {{"up_mbit", 100000}, {"down_mbit", 100000}, {"latency_ms", 0.01}};
    rates["sites"] = site_rates;
  }
  return {{"topology", topology}, {"rates", rates}};
}

bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "lbcc plan simulate: bad argument %s (use --name=value)\n%s",
                   arg.c_str(), kUsage);
      return false;
    }
    const std::string name = arg.substr(2, eq - 2), value = arg.substr(eq + 1);
    bool ok = true;
    int64_t i64 = 0;
    if (name == "out") {
      o->out = value;
    } else if (name == "seed") {
      ok = absl::SimpleAtoi(value, &i64) && i64 >= 0;
      o->seed = static_cast<uint64_t>(i64);
    } else if (name == "participants") {
      o->participants.clear();
      for (absl::string_view p : absl::StrSplit(value, ',')) {
        int n = 0;
        ok = ok && absl::SimpleAtoi(p, &n) && n >= 2 && n <= 4096;
        o->participants.push_back(n);
      }
    } else if (name == "min_mbit") {
      ok = absl::SimpleAtod(value, &o->min_mbit) && o->min_mbit > 0;
    } else if (name == "max_mbit") {
      ok = absl::SimpleAtod(value, &o->max_mbit) && o->max_mbit >= o->min_mbit;
    } else if (name == "up_ratio_min") {
      ok = absl::SimpleAtod(value, &o->up_ratio_min) && o->up_ratio_min > 0 &&
           o->up_ratio_min <= 1;
    } else if (name == "H") {
      ok = absl::SimpleAtoi(value, &o->H) && o->H >= 1;
    } else if (name == "tokens_per_step") {
      ok = absl::SimpleAtoi(value, &o->tokens_per_step) && o->tokens_per_step > 0;
    } else if (name == "encode_gelements_s") {
      ok = absl::SimpleAtod(value, &o->encode_gelements_s) && o->encode_gelements_s > 0;
    } else if (name == "decode_gvalues_s") {
      ok = absl::SimpleAtod(value, &o->decode_gvalues_s) && o->decode_gvalues_s > 0;
    } else {
      std::fprintf(stderr, "lbcc plan simulate: unknown option --%s\n%s", name.c_str(), kUsage);
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "lbcc plan simulate: bad value for --%s: %s\n", name.c_str(),
                   value.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int SimulateMain(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) return 2;
  const std::vector<ModelSize> models = {{"1B", 1e9, 2048}, {"8B", 8e9, 4096}, {"70B", 70e9, 8192}};
  nlohmann::json rows = nlohmann::json::array();
  for (bool sites : {false, true}) {
    for (int n : o.participants) {
      // The same compute draws for both layouts; links drawn per layout.
      std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(n) * 2 + (sites ? 1 : 0));
      nlohmann::json doc = Layout(n, sites, o, rng);
      rng.seed(o.seed * 1000003 + static_cast<uint64_t>(n) * 2 + 7919);
      std::uniform_real_distribution<double> u(0.0, 1.0);
      nlohmann::json compute = nlohmann::json::array();
      for (int r = 0; r < n; ++r) {
        compute.push_back({{"rank", r}, {"tflops", 300 * std::pow(10.0, u(rng))}});
      }
      doc["compute"] = {{"ranks", compute}};
      doc["cpu"] = {{"encode_gelements_s", o.encode_gelements_s},
                    {"decode_gvalues_s", o.decode_gvalues_s}};
      for (const ModelSize& m : models) {
        doc["model"] = {{"params", m.params},
                        {"d", m.d},
                        {"seq_len", 2048},
                        {"tokens_per_step", o.tokens_per_step}};
        for (const char* algo : {"auto", "direct", "ring", "hierarchical"}) {
          doc["job"] = {{"H", o.H}, {"algo", algo}};
          absl::StatusOr<PlanInput> in = ParsePlanInput(doc.dump());
          absl::StatusOr<Prediction> p =
              in.ok() ? Predict(*in) : absl::StatusOr<Prediction>(in.status());
          if (!p.ok()) {
            std::fprintf(stderr, "lbcc plan simulate: %s\n", p.status().ToString().c_str());
            return 1;
          }
          double compute_s = 0, down = 0, up = 0;
          for (const ReplicaPrediction& r : p->replicas) compute_s = std::max(compute_s, r.inner_s);
          for (double b : p->sync.bytes.slow_down) down = std::max(down, b);
          for (double b : p->sync.bytes.slow_up) up = std::max(up, b);
          rows.push_back({{"layout", sites ? "sites" : "flat"},
                          {"participants", n},
                          {"model", m.name},
                          {"params", m.params},
                          {"requested", algo},
                          {"algorithm", comm::AlgorithmName(p->sync.algorithm[0])},
                          {"H", o.H},
                          {"compute_s", o.H * compute_s},
                          {"sync_s", p->sync.seconds},
                          {"wire_s", p->sync.wire_s},
                          {"latency_s", p->sync.latency_s},
                          {"encode_s", p->sync.encode_s},
                          {"decode_s", p->sync.decode_s},
                          {"overlap_s", p->sync.overlap_s},
                          {"payload_bytes", p->sync.payload_bytes[0]},
                          {"max_slow_down_bytes", down},
                          {"max_slow_up_bytes", up},
                          {"outer_s", p->outer_s},
                          {"utilization", p->utilization},
                          {"slowest_utilization",
                           o.H * compute_s / (o.H * compute_s + p->sync.seconds)},
                          {"bottleneck", p->sync.bottleneck}});
          std::fprintf(stderr, "# %s n=%d %s %s: sync %.3g s\n", sites ? "sites" : "flat", n,
                       m.name, algo, p->sync.seconds);
        }
      }
    }
  }
  const std::string text = rows.dump(1) + "\n";
  if (o.out.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::ofstream(o.out) << text;
  }
  return 0;
}

}  // namespace lbcc::plan
