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

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "plan/cli.h"
#include "plan/plan.h"

ABSL_FLAG(std::string, output, "", "plan simulate: write the JSON rows here (default stdout)");
ABSL_FLAG(int64_t, seed, 1, "plan simulate: seed of the link and compute draws");
ABSL_FLAG(std::string, participants, "16,32,64,128,256,512,1024",
          "plan simulate: comma-separated participant counts, each in [2, 4096]");
ABSL_FLAG(double, min_mbit, 50, "plan simulate: slowest down-link drawn, Mbit/s");
ABSL_FLAG(double, max_mbit, 1000, "plan simulate: fastest down-link drawn, Mbit/s");
ABSL_FLAG(double, up_ratio_min, 0.2, "plan simulate: up-link = down-link x U(this, 1)");
ABSL_FLAG(int, H, 30, "plan simulate: inner steps per outer step");
ABSL_FLAG(int64_t, tokens_per_step, 1 << 19, "plan simulate: tokens per replica and inner step");
ABSL_FLAG(double, encode_gelements_s, 0.87,
          "plan simulate: TopK-EF encode rate, 1e9 elements per second");
ABSL_FLAG(double, decode_gvalues_s, 0.39,
          "plan simulate: decode rate, 1e9 selected values per second");

namespace lbcc::plan {
namespace {

constexpr char kUsage[] =
    "usage: lbcc plan simulate [--output=FILE.json] [--seed=N] [--participants=16,32,...]\n"
    "                          [--min_mbit=50] [--max_mbit=1000] [--up_ratio_min=0.2]\n"
    "                          [--H=30] [--tokens_per_step=524288]\n"
    "                          [--encode_gelements_s=0.87] [--decode_gvalues_s=0.39]\n"
    "Internet-scale runs of the planning model (full replicas, SparseAllReduce every H steps):\n"
    "link rates log-uniform in [min_mbit, max_mbit] down, up = down x U(up_ratio_min, 1),\n"
    "models of 1B, 8B, 70B, layouts flat and sites (8 per site), each algorithm forced and the\n"
    "table's choice. Writes JSON rows to --output (default stdout). bench/plan_internet.sh turns\n"
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

// The flags as Options; InvalidArgument naming the flag for a value out of range.
absl::StatusOr<Options> ReadOptions(const cli::Parsed& parsed) {
  Options o;
  auto bad = [](absl::string_view flag, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
  };
  o.out = absl::GetFlag(FLAGS_output);
  const int64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed < 0) return bad("seed", "must be >= 0");
  o.seed = static_cast<uint64_t>(seed);
  if (parsed.Given("participants")) {
    o.participants.clear();
    for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_participants), ',')) {
      int n = 0;
      if (!absl::SimpleAtoi(p, &n) || n < 2 || n > 4096) {
        return bad("participants", absl::StrCat("'", p, "' is not a count in [2, 4096]"));
      }
      o.participants.push_back(n);
    }
  }
  o.min_mbit = absl::GetFlag(FLAGS_min_mbit);
  o.max_mbit = absl::GetFlag(FLAGS_max_mbit);
  o.up_ratio_min = absl::GetFlag(FLAGS_up_ratio_min);
  o.H = absl::GetFlag(FLAGS_H);
  o.tokens_per_step = absl::GetFlag(FLAGS_tokens_per_step);
  o.encode_gelements_s = absl::GetFlag(FLAGS_encode_gelements_s);
  o.decode_gvalues_s = absl::GetFlag(FLAGS_decode_gvalues_s);
  if (!(o.min_mbit > 0)) return bad("min_mbit", "must be > 0");
  if (!(o.max_mbit >= o.min_mbit)) return bad("max_mbit", "must be >= --min_mbit");
  if (!(o.up_ratio_min > 0) || o.up_ratio_min > 1) return bad("up_ratio_min", "must be in (0, 1]");
  if (o.H < 1) return bad("H", "must be >= 1");
  if (o.tokens_per_step <= 0) return bad("tokens_per_step", "must be > 0");
  if (!(o.encode_gelements_s > 0)) return bad("encode_gelements_s", "must be > 0");
  if (!(o.decode_gvalues_s > 0)) return bad("decode_gvalues_s", "must be > 0");
  return o;
}

}  // namespace

int SimulateMain(int argc, char** argv) {
  absl::StatusOr<cli::Parsed> parsed =
      ParseFlags(argc, argv,
                 {"output", "seed", "participants", "min_mbit", "max_mbit", "up_ratio_min", "H",
                  "tokens_per_step", "encode_gelements_s", "decode_gvalues_s"});
  if (parsed.ok() && parsed->help) {
    std::fputs(cli::Help(kUsage, "plan/simulate.cc").c_str(), stdout);
    return 0;
  }
  if (parsed.ok() && !parsed->positional.empty()) {
    parsed = absl::InvalidArgumentError(
        absl::StrCat("unexpected argument ", parsed->positional.front()));
  }
  absl::StatusOr<Options> options =
      parsed.ok() ? ReadOptions(*parsed) : absl::StatusOr<Options>(parsed.status());
  if (!options.ok()) {
    std::fprintf(stderr, "lbcc plan simulate: %s (see lbcc plan simulate --help)\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  const Options& o = *options;
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
