#include "plan/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "base/status_macros.h"
#include "plan/plan.h"
#include "plan/ring.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, input, "", "plan: the job JSON (also accepted as the first positional "
          "argument)");
ABSL_FLAG(bool, json, false, "plan: print the prediction and recommendation as JSON");
ABSL_FLAG(double, target, 0.95,
          "plan: target compute utilization in (0, 1); unset: the job's job.target_utilization");
ABSL_FLAG(std::string, plot, "",
          "plan: also plot utilization vs slow-link bandwidth (every slow rate scaled) for dense "
          "boundaries, the recommendation and compress-all into this PNG (matplotlib; python "
          "from LBCC_PYTHON, default /usr/bin/python3)");

// `lbcc plan ring`: the context-parallel ring from flags (or --input with a "ring" section).
ABSL_FLAG(int64_t, context, 0, "plan ring: tokens of one sequence, split over --ranks");
ABSL_FLAG(int, ranks, 4, "plan ring: ranks of the ring (the context parallelism)");
ABSL_FLAG(double, link_mbit, 0, "plan ring: every rank's link rate, up and down, Mbit/s");
ABSL_FLAG(double, latency_ms, 0, "plan ring: one-way latency of every link, ms");
ABSL_FLAG(double, message_ms, 0,
          "plan ring: per message, the receiver's time to act on it, ms (rates.message_ms)");
ABSL_FLAG(int64_t, batch, 1, "plan ring: sequences per step");
ABSL_FLAG(int64_t, dim, 0, "plan ring: model width d (K and V are d wide)");
ABSL_FLAG(int64_t, heads, 1, "plan ring: attention heads (must divide d)");
ABSL_FLAG(int64_t, layers, 1, "plan ring: layers (one ring attention each)");
ABSL_FLAG(bool, causal, true, "plan ring: causal attention (--nocausal: every block attended)");
ABSL_FLAG(std::string, kv_codec, "bf16", "plan ring: K/V codec: raw, bf16, fp16 or subspace");
ABSL_FLAG(double, compression, 0,
          "plan ring: subspace: the fraction of bf16's ring bytes to save (the largest k "
          "reaching it); or give --kv_k");
ABSL_FLAG(int64_t, kv_k, 0, "plan ring: subspace: k coefficients per token");
ABSL_FLAG(int64_t, components, 4, "plan ring: subspace: components M of the mixture");
ABSL_FLAG(int64_t, mixture_block, 64, "plan ring: subspace: tokens per component selector");
ABSL_FLAG(double, attention_gflops, 0,
          "plan ring: block attention rate of one rank, GFLOP/s (measure it)");
ABSL_FLAG(double, codec_gelements_s, 0,
          "plan ring: the caller's K/V encode or decode rate of one rank, G f32 elements/s "
          "(ring.codec_gelements_s; unset: the codec's default, plan/ring.h; measure it)");
ABSL_FLAG(double, other_s, -1,
          "plan ring: measured non-ring compute and optimizer per step, s (default: 6 x params "
          "x tokens per rank at the attention rate)");
ABSL_FLAG(int64_t, params, 0, "plan ring: parameters; their f32 gradient is all-reduced per step");
ABSL_FLAG(int64_t, grad_tensors, 1, "plan ring: the gradient all-reduce's tensors (one each)");

namespace lbcc::plan {

absl::StatusOr<cli::Parsed> ParseFlags(int argc, char** argv,
                                       const std::vector<std::string>& known) {
  std::vector<char*> full = {const_cast<char*>("lbcc plan")};
  full.insert(full.end(), argv, argv + argc);
  LBCC_ASSIGN_OR_RETURN(cli::Parsed parsed,
                        cli::Parse(static_cast<int>(full.size()), full.data()));
  // The lbcc binary holds every subcommand's flags; this one takes only its own.
  for (const std::string& name : parsed.given) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  return parsed;
}

namespace {

constexpr char kUsage[] =
    "usage:\n"
    "  lbcc plan --input=JOB.json [--json] [--target=0.95] [--plot=OUT.png]\n"
    "  lbcc plan simulate [--output=FILE.json] [--seed=N] [--participants=16,32,...,1024] ...\n"
    "  lbcc plan ring --context=TOKENS --link_mbit=R --attention_gflops=G --dim=D [--ranks=4]\n"
    "                 [--kv_codec=bf16|subspace --compression=0.95|--kv_k=K]\n"
    "                 [--codec_gelements_s=G] [--json] ...\n"
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
    "           \"rates\": {\"default\"|\"ranks\"|\"sites\": up_mbit, down_mbit, latency_ms\n"
    "                     (default|ranks: up_burst_bytes, down_burst_bytes); \"fast\",\n"
    "                     \"efficiency\", \"pace_mbit\", \"chunk_bytes\", \"window_bytes\",\n"
    "                     \"stripes\" (default: the transport's LBCC_SLOW_*), \"credit_ms\",\n"
    "                     \"message_ms\"},\n"
    "           \"model\": {params | stage_params, d, seq_len, tokens_per_step, vocab, ...},\n"
    "           \"compute\": {default_tflops, ranks: [{rank, tflops | step_s}]},\n"
    "           \"cpu\": {encode_ms, exchange_ms, decode_ms | encode_gelements_s, decode_gvalues_s,\n"
    "                   allreduce_ms, copy_gbytes_s, shared_cores},\n"
    "           \"job\": {H, top_k, values, indices, boundary: [{replica, k}], target_utilization}}\n"
    "See docs/planning.md for every field and formula.\n"
    "\n"
    "lbcc plan ring: one training step of context-parallel ring attention (comm::ContextRing):\n"
    "per layer the forward pass (K/V blocks to the successor) and the backward pass (dK/dV\n"
    "partial sums to the predecessor), each round's wire overlapped with block attention and\n"
    "the caller's encode and decode of the blocks (--codec_gelements_s), plus\n"
    "the rest of the step and the dense gradient all-reduce. --input=JOB.json with a \"ring\"\n"
    "section instead of the flags: docs/context_parallel.md, \"Planning\".\n";

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The plot script: next to the binary's runfiles, else the source tree.
std::string PlotScript() {
  if (std::optional<std::string> s = env::GetForeign("LBCC_PLAN_PLOT_SCRIPT")) return *s;
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

// The plan document `lbcc plan ring`'s flags describe.
nlohmann::json RingJobFromFlags(const cli::Parsed& parsed) {
  const double mbit = absl::GetFlag(FLAGS_link_mbit);
  nlohmann::json ring = {{"context", absl::GetFlag(FLAGS_context)},
                         {"batch", absl::GetFlag(FLAGS_batch)},
                         {"d", absl::GetFlag(FLAGS_dim)},
                         {"heads", absl::GetFlag(FLAGS_heads)},
                         {"layers", absl::GetFlag(FLAGS_layers)},
                         {"causal", absl::GetFlag(FLAGS_causal)},
                         {"codec", absl::GetFlag(FLAGS_kv_codec)},
                         {"attention_gflops", absl::GetFlag(FLAGS_attention_gflops)},
                         {"params", absl::GetFlag(FLAGS_params)},
                         {"grad_tensors", absl::GetFlag(FLAGS_grad_tensors)}};
  if (absl::GetFlag(FLAGS_other_s) >= 0) ring["other_s"] = absl::GetFlag(FLAGS_other_s);
  // Given (0 too, which the planner rejects naming the key), else the codec's default.
  if (parsed.Given("codec_gelements_s")) {
    ring["codec_gelements_s"] = absl::GetFlag(FLAGS_codec_gelements_s);
  }
  if (absl::GetFlag(FLAGS_kv_codec) == "subspace") {
    ring["components"] = absl::GetFlag(FLAGS_components);
    ring["mixture_block"] = absl::GetFlag(FLAGS_mixture_block);
    if (absl::GetFlag(FLAGS_kv_k) > 0) ring["k"] = absl::GetFlag(FLAGS_kv_k);
    if (absl::GetFlag(FLAGS_compression) > 0) ring["compression"] = absl::GetFlag(FLAGS_compression);
  }
  return {{"topology", {{"nranks", absl::GetFlag(FLAGS_ranks)}}},
          {"rates",
           {{"default",
             {{"up_mbit", mbit}, {"down_mbit", mbit}, {"latency_ms", absl::GetFlag(FLAGS_latency_ms)}}},
            {"message_ms", absl::GetFlag(FLAGS_message_ms)}}},
          {"ring", ring}};
}

int RingMain(int argc, char** argv) {
  absl::StatusOr<cli::Parsed> parsed =
      ParseFlags(argc, argv,
                 {"input", "json", "context", "ranks", "link_mbit", "latency_ms", "message_ms",
                  "batch", "dim",
                  "heads", "layers", "causal", "kv_codec", "compression", "kv_k", "components",
                  "mixture_block", "attention_gflops", "codec_gelements_s", "other_s", "params",
                  "grad_tensors"});
  if (!parsed.ok()) {
    std::fprintf(stderr, "lbcc plan ring: %s (see lbcc plan --help)\n",
                 std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (parsed->help) {
    std::fputs(cli::Help(kUsage, "plan/cli.cc").c_str(), stdout);
    return 0;
  }
  if (!parsed->positional.empty()) {
    std::fprintf(stderr, "lbcc plan ring: unexpected argument %s (see lbcc plan --help)\n",
                 parsed->positional.front().c_str());
    return 2;
  }
  std::string doc;
  const std::string input_path = absl::GetFlag(FLAGS_input);
  if (!input_path.empty()) {
    for (const std::string& name : parsed->given) {
      if (name != "input" && name != "json") {
        std::fprintf(stderr, "lbcc plan ring: --%s and --input: the document has the ring\n",
                     name.c_str());
        return 2;
      }
    }
    absl::StatusOr<std::string> text = ReadAll(input_path);
    if (!text.ok()) {
      std::fprintf(stderr, "lbcc plan ring: %s\n", std::string(text.status().message()).c_str());
      return 1;
    }
    doc = *text;
  } else {
    for (const char* required : {"context", "link_mbit", "dim", "attention_gflops"}) {
      if (!parsed->Given(required)) {
        std::fprintf(stderr, "lbcc plan ring: --%s is required (see lbcc plan --help)\n",
                     required);
        return 2;
      }
    }
    doc = RingJobFromFlags(*parsed).dump();
  }
  absl::StatusOr<PlanInput> in = ParsePlanInput(doc);
  absl::StatusOr<RingPrediction> p =
      !in.ok()   ? absl::StatusOr<RingPrediction>(in.status())
      : in->ring ? PredictRing(*in)
                 : absl::InvalidArgumentError("ring: the document has no \"ring\" section");
  if (!p.ok()) {
    std::fprintf(stderr, "lbcc plan ring: %s\n", p.status().ToString().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", ToJson(*p).dump(2).c_str());
  } else {
    std::fputs(FormatRingPrediction(*p).c_str(), stdout);
  }
  return 0;
}

}  // namespace

int PlanMain(int argc, char** argv) {
  if (argc >= 1 && std::strcmp(argv[0], "simulate") == 0) return SimulateMain(argc - 1, argv + 1);
  if (argc >= 1 && std::strcmp(argv[0], "ring") == 0) return RingMain(argc - 1, argv + 1);
  absl::StatusOr<cli::Parsed> parsed = ParseFlags(argc, argv, {"input", "json", "target", "plot"});
  if (!parsed.ok()) {
    std::fprintf(stderr, "lbcc plan: %s (see lbcc plan --help)\n",
                 std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (parsed->help || (!parsed->positional.empty() && parsed->positional[0] == "help")) {
    std::fputs(cli::Help(kUsage, "plan/cli.cc").c_str(), stdout);
    return 0;
  }
  std::string input_path = absl::GetFlag(FLAGS_input);
  const std::string plot = absl::GetFlag(FLAGS_plot);
  const bool json = absl::GetFlag(FLAGS_json);
  std::vector<std::string> rest = parsed->positional;
  if (input_path.empty() && !rest.empty()) {
    input_path = rest.front();
    rest.erase(rest.begin());
  }
  if (!rest.empty()) {
    std::fprintf(stderr, "lbcc plan: unexpected argument %s (see lbcc plan --help)\n",
                 rest.front().c_str());
    return 2;
  }
  if (input_path.empty()) {
    std::fprintf(stderr, "lbcc plan: --input is required (see lbcc plan --help)\n");
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
  if (parsed->Given("target")) {
    const double t = absl::GetFlag(FLAGS_target);
    if (!(t > 0) || t >= 1) {
      std::fprintf(stderr, "lbcc plan: --target=%g must be a number in (0, 1)\n", t);
      return 2;
    }
    in->job.target_utilization = t;
  }
  if (in->ring) {  // the same as `lbcc plan ring --input`
    absl::StatusOr<RingPrediction> r = PredictRing(*in);
    if (!r.ok()) {
      std::fprintf(stderr, "lbcc plan: %s\n", r.status().ToString().c_str());
      return 1;
    }
    std::printf("%s", json ? (ToJson(*r).dump(2) + "\n").c_str() : FormatRingPrediction(*r).c_str());
    return 0;
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
    std::string py = env::GetForeign("LBCC_PYTHON").value_or("");
    if (py.empty()) py = "/usr/bin/python3";
    const std::string cmd = absl::StrCat(py, " '",
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
