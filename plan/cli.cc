#include "plan/cli.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "plan/plan.h"

namespace lbcc::plan {
namespace {

constexpr char kUsage[] =
    "usage:\n"
    "  lbcc plan --input=JOB.json [--json] [--target=0.95] [--plot=OUT.png]\n"
    "  lbcc plan simulate [--out=DIR] [--seed=N] [--participants=16,32,...,1024]\n"
    "\n"
    "Predicts one outer step of a heterogeneous SparseLoCo job on the network JOB.json\n"
    "describes: per replica the inner step (compute, pipeline boundaries, 1F1B bubble), the\n"
    "SparseAllReduce (bytes per link from the codecs' formulas, the algorithm LBCC's selection\n"
    "table picks, encode/decode overlap), compute utilization t_compute / (t_compute + t_comm)\n"
    "and the critical path; then the least compression per replica (which pipeline replicas\n"
    "to compress, k/d, H) that reaches --target, beside compress-all.\n"
    "A JOB.json with a \"collective\" section predicts one collective instead (what\n"
    "bench/lbcc_perf measures).\n"
    "\n"
    "JOB.json: {\"topology\": {comm/topology.h schema} or \"topology_file\": PATH,\n"
    "           \"rates\": {\"default\"|\"ranks\"|\"sites\": up_mbit, down_mbit, latency_ms; \"fast\",\n"
    "                     \"efficiency\", \"pace_mbit\"},\n"
    "           \"model\": {params | stage_params, d, seq_len, tokens_per_step, vocab, ...},\n"
    "           \"compute\": {default_tflops, ranks: [{rank, tflops | step_s}]},\n"
    "           \"cpu\": {encode_ms, exchange_ms, decode_ms | encode_gelements_s, decode_gvalues_s},\n"
    "           \"job\": {H, top_k, values, indices, boundary: [{replica, k}], target_utilization}}\n"
    "See docs/planning.md for every field and formula.\n"
    "\n"
    "options:\n"
    "  --input=FILE    the job (also accepted as the first positional argument)\n"
    "  --json          print the prediction and recommendation as JSON\n"
    "  --target=F      target compute utilization (default: job.target_utilization, 0.95)\n"
    "  --plot=PNG      also plot utilization vs slow-link bandwidth (every slow rate scaled)\n"
    "                  for dense boundaries, the recommendation and compress-all (matplotlib;\n"
    "                  python from LBCC_PYTHON, default /usr/bin/python3)\n";

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The plot script: next to the binary's runfiles, else the source tree.
std::string PlotScript() {
  if (const char* s = std::getenv("LBCC_PLAN_PLOT_SCRIPT")) return s;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = 0;
    for (const std::string& candidate :
         {absl::StrCat(exe, ".runfiles/lbcc/plan/plot_plan.py"), std::string("plan/plot_plan.py")}) {
      if (access(candidate.c_str(), R_OK) == 0) return candidate;
    }
  }
  return "plan/plot_plan.py";
}

// Utilization against slow-link bandwidth for three configurations; JSON for plot_plan.py.
absl::StatusOr<nlohmann::json> Sweep(const PlanInput& in, const Recommendation& rec) {
  double base = 0;
  int links = 0;
  const int n = in.net.topology.nranks();
  for (int r = 0; r < n; ++r) {
    bool slow = false;
    for (int p = 0; p < n; ++p) slow = slow || in.net.topology.link(r, p) == comm::LinkClass::kSlow;
    if (!slow) continue;
    base += std::log(in.net.rank_link[r].down_bps * 8 / 1e6);
    ++links;
  }
  // Geometric mean of the slow ranks' down rates, Mbit/s.
  base = links > 0 ? std::exp(base / links) : in.net.fast.down_bps * 8 / 1e6;
  struct Config {
    const char* name;
    PlanInput input;
  };
  std::vector<Config> configs = {{"dense boundaries", in}, {"least compression", in},
                                 {"compress all", in}};
  for (size_t m = 0; m < in.job.boundary_k.size(); ++m) {
    configs[0].input.job.boundary_k[m] = 0;
    configs[1].input.job.boundary_k[m] = rec.least.replicas[m].boundary_k;
    configs[2].input.job.boundary_k[m] = rec.compress_all.replicas[m].boundary_k;
  }
  for (Config& c : configs) c.input.job.H = rec.H;
  nlohmann::json out = {{"H", rec.H},
                        {"target", rec.target},
                        {"base_mbit", base},
                        {"series", nlohmann::json::array()}};
  for (const Config& c : configs) {
    nlohmann::json series = {{"name", c.name}, {"mbit", {}}, {"job", {}}, {"worst", {}}};
    for (int i = 0; i <= 24; ++i) {
      const double factor = std::pow(10.0, -1.5 + i * 0.125);
      PlanInput scaled = c.input;
      scaled.net = ScaleSlowRates(c.input.net, factor);
      LBCC_ASSIGN_OR_RETURN(const Prediction p, Predict(scaled));
      double worst = 1;
      for (const ReplicaPrediction& r : p.replicas) worst = std::min(worst, r.utilization);
      series["mbit"].push_back(base * factor);
      series["job"].push_back(p.utilization);
      series["worst"].push_back(worst);
    }
    out["series"].push_back(series);
  }
  return out;
}

}  // namespace

int PlanMain(int argc, char** argv) {
  if (argc >= 1 && std::strcmp(argv[0], "simulate") == 0) return SimulateMain(argc - 1, argv + 1);
  std::string input_path, plot, target_text;
  bool json = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name, std::string* out) {
      const std::string prefix = absl::StrCat("--", name);
      if (arg == prefix && i + 1 < argc) {
        *out = argv[++i];
        return true;
      }
      if (arg.rfind(prefix + "=", 0) == 0) {
        *out = arg.substr(prefix.size() + 1);
        return true;
      }
      return false;
    };
    if (arg == "--help" || arg == "-h" || arg == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--json") {
      json = true;
    } else if (value("input", &input_path) || value("plot", &plot) ||
               value("target", &target_text)) {
    } else if (arg.rfind("--", 0) != 0 && input_path.empty()) {
      input_path = arg;
    } else {
      std::fprintf(stderr, "lbcc plan: unknown argument %s\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  if (input_path.empty()) {
    std::fprintf(stderr, "lbcc plan: --input is required\n%s", kUsage);
    return 2;
  }
  absl::StatusOr<std::string> text = ReadAll(input_path);
  if (!text.ok()) {
    std::fprintf(stderr, "lbcc plan: %s\n", std::string(text.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<PlanInput> in = ParsePlanInput(*text);
  if (!in.ok()) {
    std::fprintf(stderr, "lbcc plan: %s: %s\n", input_path.c_str(), in.status().ToString().c_str());
    return 1;
  }
  if (!target_text.empty()) {
    double t = 0;
    if (!absl::SimpleAtod(target_text, &t) || !(t > 0) || t >= 1) {
      std::fprintf(stderr, "lbcc plan: --target=%s must be a number in (0, 1)\n",
                   target_text.c_str());
      return 2;
    }
    in->job.target_utilization = t;
  }
  if (in->collective) {
    absl::StatusOr<CollectivePrediction> c = PredictCollective(*in);
    if (!c.ok()) {
      std::fprintf(stderr, "lbcc plan: %s\n", c.status().ToString().c_str());
      return 1;
    }
    if (json) {
      std::printf("%s\n", ToJson(*c).dump(2).c_str());
    } else {
      std::printf("%s (%s): %.6g s (wire %.6g s, cpu %.6g s; %s); rank 0 receives %.0f B, all "
                  "ranks %.0f B on slow links\n",
                  c->op.c_str(), std::string(comm::AlgorithmName(c->algorithm)).c_str(),
                  c->seconds, c->wire_s, c->cpu_s, c->bottleneck.c_str(), c->rank0_recv_bytes,
                  c->slow_recv_bytes_all);
    }
    return 0;
  }
  absl::StatusOr<Prediction> p = Predict(*in);
  absl::StatusOr<Recommendation> rec =
      p.ok() ? Recommend(*in) : absl::StatusOr<Recommendation>(p.status());
  if (!rec.ok()) {
    std::fprintf(stderr, "lbcc plan: %s\n", rec.status().ToString().c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n",
                nlohmann::json({{"prediction", ToJson(*p)}, {"recommendation", ToJson(*rec)}})
                    .dump(2)
                    .c_str());
  } else {
    std::printf("%s\n%s", FormatPrediction(*p).c_str(), FormatRecommendation(*rec).c_str());
  }
  if (!plot.empty()) {
    absl::StatusOr<nlohmann::json> sweep = Sweep(*in, *rec);
    if (!sweep.ok()) {
      std::fprintf(stderr, "lbcc plan: %s\n", sweep.status().ToString().c_str());
      return 1;
    }
    const std::string data = plot + ".json";
    std::ofstream(data) << sweep->dump(1) << "\n";
    const char* py = std::getenv("LBCC_PYTHON");
    const std::string cmd = absl::StrCat(py != nullptr && *py ? py : "/usr/bin/python3", " '",
                                         PlotScript(), "' '", data, "' '", plot, "'");
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "lbcc plan: plotting failed (%s); the data is in %s\n", cmd.c_str(),
                   data.c_str());
      return 1;
    }
    if (!json) std::printf("plot: %s (data %s)\n", plot.c_str(), data.c_str());
  }
  return 0;
}

}  // namespace lbcc::plan
