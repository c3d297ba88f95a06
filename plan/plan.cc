#include "plan/plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "plan/bytes.h"
#include "plan/json_fields.h"
#include "transport/options.h"

namespace lbcc::plan {
namespace {

using Json = nlohmann::json;

constexpr int64_t kStreamMinElements = int64_t{1} << 16;  // comm/compressed.cc
constexpr int kStreamPieces = 4;                          // comm/compressed.cc

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckKeys(const Json& object, std::initializer_list<const char*> allowed,
                       absl::string_view where) {
  return CheckJsonKeys(object, allowed, where);
}


absl::StatusOr<std::string> ReadText(const std::string& path, absl::string_view field) {
  std::ifstream in(path);
  if (!in) return Bad(field, absl::StrCat("cannot read '", path, "'"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Each shard's parameters as [d, d] matrices and a 1-D remainder.
std::vector<std::vector<int64_t>> DefaultShapes(int64_t params, int64_t d) {
  std::vector<std::vector<int64_t>> shapes;
  const int64_t square = d * d;
  for (int64_t i = 0; i < params / square; ++i) shapes.push_back({d, d});
  if (params % square != 0) shapes.push_back({params % square});
  return shapes;
}

// lbcc_perf's tensors: `count` elements split into `parts` (the last takes the remainder),
// [n / 4096, 4096] when 4096 divides n, else [n].
std::vector<std::vector<int64_t>> PerfShapes(int64_t count, int parts) {
  parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(parts, count)));
  std::vector<std::vector<int64_t>> shapes;
  for (int p = 0; p < parts; ++p) {
    const int64_t begin = count / parts * p;
    const int64_t end = p + 1 == parts ? count : count / parts * (p + 1);
    const int64_t n = end - begin;
    if (n % 4096 == 0 && n >= 4096) {
      shapes.push_back({n / 4096, 4096});
    } else {
      shapes.push_back({n});
    }
  }
  return shapes;
}

absl::Status ParseModel(const Json& m, const comm::Topology& topology, ModelSpec* model) {
  LBCC_RETURN_IF_ERROR(CheckKeys(m,
                                 {"params", "stage_params", "d", "layers", "seq_len", "vocab",
                                  "tokens_per_step", "microbatch_tokens", "flops_per_token",
                                  "shard_shapes"},
                                 "model"));
  const int shards = topology.num_shards();
  if (m.contains("stage_params")) {
    const Json& list = m["stage_params"];
    if (!list.is_array()) return Bad("model.stage_params", "must be a list of integers");
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_number() || !(list[i].get<double>() > 0)) {
        return Bad(absl::StrCat("model.stage_params[", i, "]"), "must be a number > 0");
      }
      model->stage_params.push_back(static_cast<int64_t>(list[i].get<double>()));
    }
    if (static_cast<int>(model->stage_params.size()) != shards) {
      return Bad("model.stage_params",
                 absl::StrCat("has ", model->stage_params.size(), " stages; the topology's "
                              "pipelines have ", shards));
    }
  }
  int64_t sum = 0;
  for (int64_t p : model->stage_params) sum += p;
  if (m.contains("params")) {
    LBCC_ASSIGN_OR_RETURN(model->params, JsonInteger(m, "params", "model", std::nullopt));
    if (!model->stage_params.empty() && sum != model->params) {
      return Bad("model.stage_params",
                 absl::StrCat("add up to ", sum, " parameters, model.params is ", model->params));
    }
  } else if (!model->stage_params.empty()) {
    model->params = sum;
  } else {
    return Bad("model.params", "is required (or model.stage_params)");
  }
  if (model->stage_params.empty()) {
    if (shards > 1) {
      return Bad("model.stage_params",
                 absl::StrCat("is required: the topology has pipelines of ", shards, " stages"));
    }
    model->stage_params = {model->params};
  }
  LBCC_ASSIGN_OR_RETURN(model->d, JsonInteger(m, "d", "model", std::nullopt));
  LBCC_ASSIGN_OR_RETURN(model->layers, JsonInteger(m, "layers", "model", int64_t{0}, true));
  LBCC_ASSIGN_OR_RETURN(model->seq_len, JsonInteger(m, "seq_len", "model", std::nullopt));
  LBCC_ASSIGN_OR_RETURN(model->vocab, JsonInteger(m, "vocab", "model", int64_t{0}, true));
  LBCC_ASSIGN_OR_RETURN(model->tokens_per_step,
                        JsonInteger(m, "tokens_per_step", "model", std::nullopt));
  LBCC_ASSIGN_OR_RETURN(model->microbatch_tokens,
                        JsonInteger(m, "microbatch_tokens", "model", model->seq_len));
  LBCC_ASSIGN_OR_RETURN(model->flops_per_token,
                        JsonNumber(m, "flops_per_token", "model", 6.0 * model->params));
  if (m.contains("shard_shapes")) {
    const Json& list = m["shard_shapes"];
    if (!list.is_array() || static_cast<int>(list.size()) != shards) {
      return Bad("model.shard_shapes", absl::StrCat("must list ", shards, " shards"));
    }
    for (size_t s = 0; s < list.size(); ++s) {
      std::vector<std::vector<int64_t>> shapes;
      int64_t total = 0;
      for (const Json& shape : list[s]) {
        std::vector<int64_t> dims;
        int64_t n = 1;
        for (const Json& dim : shape) {
          if (!dim.is_number_integer() || dim.get<int64_t>() <= 0) {
            return Bad(absl::StrCat("model.shard_shapes[", s, "]"), "dims must be integers > 0");
          }
          dims.push_back(dim.get<int64_t>());
          n *= dims.back();
        }
        total += n;
        shapes.push_back(dims);
      }
      if (total != model->stage_params[s]) {
        return Bad(absl::StrCat("model.shard_shapes[", s, "]"),
                   absl::StrCat("hold ", total, " parameters, the stage has ",
                                model->stage_params[s]));
      }
      model->shard_shapes.push_back(shapes);
    }
  } else {
    for (int64_t p : model->stage_params) model->shard_shapes.push_back(DefaultShapes(p, model->d));
  }
  return absl::OkStatus();
}

absl::Status ParseCompute(const Json& c, int nranks, std::vector<RankCompute>* out) {
  LBCC_RETURN_IF_ERROR(CheckKeys(c, {"default_tflops", "ranks"}, "compute"));
  std::optional<double> fallback;
  if (c.contains("default_tflops")) {
    LBCC_ASSIGN_OR_RETURN(const double t, JsonNumber(c, "default_tflops", "compute", std::nullopt));
    fallback = t * 1e12;
  }
  std::vector<std::optional<RankCompute>> ranks(nranks);
  if (c.contains("ranks")) {
    if (!c["ranks"].is_array()) return Bad("compute.ranks", "must be a list");
    for (size_t i = 0; i < c["ranks"].size(); ++i) {
      const Json& r = c["ranks"][i];
      const std::string where = absl::StrCat("compute.ranks[", i, "]");
      LBCC_RETURN_IF_ERROR(CheckKeys(r, {"rank", "tflops", "step_s"}, where));
      LBCC_ASSIGN_OR_RETURN(const int64_t rank, JsonInteger(r, "rank", where, std::nullopt, true));
      if (rank >= nranks) return Bad(where, absl::StrCat("unknown rank ", rank));
      RankCompute rc;
      if (r.contains("step_s")) {
        LBCC_ASSIGN_OR_RETURN(rc.step_s, JsonNumber(r, "step_s", where, std::nullopt));
      } else {
        LBCC_ASSIGN_OR_RETURN(const double t, JsonNumber(r, "tflops", where, std::nullopt));
        rc.flops_per_s = t * 1e12;
      }
      ranks[rank] = rc;
    }
  }
  out->resize(nranks);
  for (int r = 0; r < nranks; ++r) {
    if (ranks[r]) {
      (*out)[r] = *ranks[r];
    } else if (fallback) {
      (*out)[r].flops_per_s = *fallback;
    } else {
      return Bad("compute.ranks",
                 absl::StrCat("rank ", r, " has no tflops or step_s (and no default_tflops)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseCpu(const Json& c, CpuModel* cpu, Network* net) {
  LBCC_RETURN_IF_ERROR(
      CheckKeys(c,
                {"encode_ms", "exchange_ms", "decode_ms", "allreduce_ms", "encode_gelements_s",
                 "decode_gvalues_s", "copy_gbytes_s", "shared_cores"},
                "cpu"));
  LBCC_ASSIGN_OR_RETURN(const double copy, JsonNumber(c, "copy_gbytes_s", "cpu", 0.0, true));
  net->copy_bps = copy * 1e9;
  LBCC_ASSIGN_OR_RETURN(const int64_t cores,
                        JsonInteger(c, "shared_cores", "cpu", int64_t{0}, true));
  if (cores > (1 << 20)) return Bad("cpu.shared_cores", absl::StrCat("is ", cores, "; too many"));
  net->shared_cores = static_cast<int>(cores);
  auto ms = [&](const char* key, double* out) -> absl::Status {
    if (!c.contains(key)) return absl::OkStatus();
    LBCC_ASSIGN_OR_RETURN(const double v, JsonNumber(c, key, "cpu", std::nullopt, true));
    *out = v * 1e-3;
    return absl::OkStatus();
  };
  LBCC_RETURN_IF_ERROR(ms("encode_ms", &cpu->encode_s));
  LBCC_RETURN_IF_ERROR(ms("exchange_ms", &cpu->exchange_s));
  LBCC_RETURN_IF_ERROR(ms("decode_ms", &cpu->decode_s));
  LBCC_RETURN_IF_ERROR(ms("allreduce_ms", &cpu->allreduce_s));
  LBCC_ASSIGN_OR_RETURN(const double enc, JsonNumber(c, "encode_gelements_s", "cpu", 0.0, true));
  LBCC_ASSIGN_OR_RETURN(const double dec, JsonNumber(c, "decode_gvalues_s", "cpu", 0.0, true));
  cpu->encode_elements_per_s = enc * 1e9;
  cpu->decode_values_per_s = dec * 1e9;
  return absl::OkStatus();
}

absl::Status ParseJob(const Json& j, const comm::Topology& topology, JobSpec* job) {
  LBCC_RETURN_IF_ERROR(CheckKeys(j,
                                 {"H", "top_k", "values", "indices", "group_elements", "algo",
                                  "boundary", "coefficients", "target_utilization",
                                  "overlap_fragments"},
                                 "job"));
  LBCC_ASSIGN_OR_RETURN(const int64_t h, JsonInteger(j, "H", "job", int64_t{30}));
  job->H = static_cast<int>(h);
  LBCC_ASSIGN_OR_RETURN(job->topk.top_k, JsonNumber(j, "top_k", "job", 64.0));
  if (j.contains("values")) {
    if (!j["values"].is_string()) return Bad("job.values", "must be a string");
    absl::StatusOr<codecs::ValueCoding> v =
        codecs::ParseValueCoding(j["values"].get<std::string>());
    if (!v.ok()) return Bad("job.values", v.status().message());
    job->topk.values = *v;
  }
  if (j.contains("indices")) {
    const std::string name = j["indices"].is_string() ? j["indices"].get<std::string>() : "";
    bool found = false;
    for (codecs::IndexCoding c : {codecs::IndexCoding::kAuto, codecs::IndexCoding::kPacked12,
                                  codecs::IndexCoding::kAdaptive}) {
      if (name == codecs::IndexCodingName(c)) {
        job->topk.indices = c;
        found = true;
      }
    }
    if (!found) return Bad("job.indices", "must be auto, packed12 or adaptive");
  }
  LBCC_RETURN_IF_ERROR(job->topk.Validate());
  LBCC_ASSIGN_OR_RETURN(job->sparse_group_elements,
                        JsonInteger(j, "group_elements", "job", job->sparse_group_elements));
  if (j.contains("algo")) {
    absl::StatusOr<comm::Algorithm> a =
        comm::ParseAlgorithm(j["algo"].is_string() ? j["algo"].get<std::string>() : "?");
    if (!a.ok()) return Bad("job.algo", a.status().message());
    job->algorithm = *a;
  }
  if (j.contains("coefficients")) {
    const std::string c = j["coefficients"].is_string() ? j["coefficients"].get<std::string>() : "";
    if (c == "bf16") {
      job->coefficient_dtype = DType::kBF16;
    } else if (c == "fp16") {
      job->coefficient_dtype = DType::kF16;
    } else if (c == "fp32") {
      job->coefficient_dtype = DType::kF32;
    } else if (c == "int8") {
      job->coefficient_dtype = DType::kI8;
    } else {
      return Bad("job.coefficients", "must be bf16, fp16, fp32 or int8");
    }
  }
  LBCC_ASSIGN_OR_RETURN(job->target_utilization,
                        JsonNumber(j, "target_utilization", "job", job->target_utilization));
  if (job->target_utilization >= 1) return Bad("job.target_utilization", "must be below 1");
  LBCC_ASSIGN_OR_RETURN(const int64_t fragments,
                        JsonInteger(j, "overlap_fragments", "job", int64_t{2}, true));
  if (fragments < 1 || fragments > job->H) {
    return Bad("job.overlap_fragments", "must be in 1..H");
  }
  job->overlap_fragments = static_cast<int>(fragments);
  job->boundary_k.assign(topology.replicas().size(), 0);
  if (j.contains("boundary")) {
    if (!j["boundary"].is_array()) return Bad("job.boundary", "must be a list");
    for (size_t i = 0; i < j["boundary"].size(); ++i) {
      const Json& b = j["boundary"][i];
      const std::string where = absl::StrCat("job.boundary[", i, "]");
      LBCC_RETURN_IF_ERROR(CheckKeys(b, {"replica", "k"}, where));
      LBCC_ASSIGN_OR_RETURN(const int64_t m, JsonInteger(b, "replica", where, std::nullopt, true));
      if (m >= static_cast<int64_t>(topology.replicas().size()) ||
          topology.replicas()[m].kind != comm::RankRole::Kind::kPipeline) {
        return Bad(where, absl::StrCat("replica ", m, " is not a pipeline replica"));
      }
      LBCC_ASSIGN_OR_RETURN(job->boundary_k[m], JsonInteger(b, "k", where, std::nullopt, true));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseCollective(const Json& c, CollectiveSpec* out) {
  LBCC_RETURN_IF_ERROR(CheckKeys(c, {"op", "bytes", "tensors"}, "collective"));
  if (c.contains("op")) {
    out->op = c["op"].is_string() ? c["op"].get<std::string>() : "";
    if (out->op != "sparse_allreduce" && out->op != "allreduce") {
      return Bad("collective.op", "must be sparse_allreduce or allreduce");
    }
  }
  LBCC_ASSIGN_OR_RETURN(out->bytes, JsonInteger(c, "bytes", "collective", std::nullopt));
  if (out->bytes < 4) return Bad("collective.bytes", "must be at least 4");
  LBCC_ASSIGN_OR_RETURN(const int64_t t, JsonInteger(c, "tensors", "collective", int64_t{1}));
  out->tensors = static_cast<int>(t);
  return absl::OkStatus();
}

// ---- Prediction -------------------------------------------------------------------------------

// Payload and blob bytes per shard, memoised by shape (large models repeat one shape).
class ByteCache {
 public:
  explicit ByteCache(const codecs::TopKEfOptions& options) : options_(options) {}
  absl::StatusOr<double> Payload(const std::vector<int64_t>& shape) {
    auto it = expected_.find(shape);
    if (it != expected_.end()) return it->second;
    LBCC_ASSIGN_OR_RETURN(const double b, TopKEfPayloadBytes(shape, options_));
    expected_[shape] = b;
    return b;
  }
  absl::StatusOr<double> Max(const codecs::TopKEfCodec& codec, const std::vector<int64_t>& shape) {
    auto it = max_.find(shape);
    if (it != max_.end()) return it->second;
    LBCC_ASSIGN_OR_RETURN(const size_t b, codec.MaxEncodedBytes(shape));
    max_[shape] = static_cast<double>(b);
    return static_cast<double>(b);
  }

 private:
  codecs::TopKEfOptions options_;
  std::map<std::vector<int64_t>, double> expected_, max_;
};

// What one shard's SparseAllReduce sends: per group the blob every rank contributes.
struct ShardExchange {
  std::vector<int> ranks;
  comm::Algorithm algorithm = comm::Algorithm::kAuto;
  std::vector<double> blob;  // per group
  double total = 0;          // sum of blobs
  double first_fraction = 1;  // share of the encode before its first bytes can leave
  double tail_fraction = 1;   // share of the wire that waits for the end of the encode
  int64_t elements = 0;
  int64_t selected = 0;       // values selected per rank
};

absl::StatusOr<ShardExchange> PlanShard(const PlanInput& in, const std::vector<int>& ranks,
                                        const std::vector<std::vector<int64_t>>& shapes,
                                        ByteCache& cache) {
  ShardExchange x;
  x.ranks = ranks;
  LBCC_ASSIGN_OR_RETURN(std::unique_ptr<codecs::TopKEfCodec> codec,
                        codecs::TopKEfCodec::Create(in.job.topk));
  std::vector<int64_t> elements;
  for (const auto& s : shapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    elements.push_back(n);
    x.elements += n;
    LBCC_ASSIGN_OR_RETURN(const codecs::ChunkGeometry g, in.job.topk.Geometry(s));
    x.selected += g.num_chunks * in.job.topk.KFor(g);
  }
  const std::vector<std::pair<size_t, size_t>> groups =
      PlanGroups(elements, in.job.sparse_group_elements);
  const comm::GroupShape shape = comm::ShapeOf(in.net.topology, ranks);
  // The table sees the worst-case blob of the first group, as compressed.cc does per group.
  double worst = 5;
  for (size_t i = groups[0].first; i < groups[0].second; ++i) {
    LBCC_ASSIGN_OR_RETURN(const double m, cache.Max(*codec, shapes[i]));
    worst += 8 + m;
  }
  LBCC_ASSIGN_OR_RETURN(x.algorithm,
                        comm::SelectAlgorithm(comm::Collective::kAllGatherV, shape,
                                              static_cast<size_t>(worst), in.job.algorithm,
                                              comm::Algorithm::kAuto));
  const bool many = ranks.size() > 1;
  bool single_streamed = false;
  for (const auto& [begin, end] : groups) {
    const bool streamed = many && shape.any_slow && end - begin == 1 &&
                          elements[begin] >= kStreamMinElements;
    double blob = 5;
    for (size_t i = begin; i < end; ++i) {
      LBCC_ASSIGN_OR_RETURN(const double p, cache.Payload(shapes[i]));
      blob += 8 + p;
    }
    if (streamed) blob += 16;
    x.blob.push_back(blob);
    x.total += blob;
    single_streamed = streamed && groups.size() == 1;
  }
  if (single_streamed) {
    // One tensor sent in pieces while it is encoded: kStreamPieces pieces of
    // max(4096, worst / 8) index bytes, then the rest once the encode ends.
    LBCC_ASSIGN_OR_RETURN(const double m, cache.Max(*codec, shapes[0]));
    const double piece = std::max(4096.0, m / (2 * kStreamPieces));
    const double index = x.total - 8 -
                         static_cast<double>(codecs::ValueSectionBytes(
                             in.job.topk.values, x.selected, in.job.topk.value_block));
    const double streamed = std::min(index, piece * kStreamPieces);
    x.first_fraction = std::min(1.0, piece / std::max(index, 1.0));
    x.tail_fraction = (x.total - streamed) / x.total;
  } else {
    x.first_fraction = x.blob.front() / x.total;
    x.tail_fraction = x.blob.back() / x.total;
  }
  return x;
}

// Network phases of the shards' exchanges, shard phases run at once.
void ExchangePhases(const Network& net, const std::vector<ShardExchange>& shards,
                    SyncPrediction* out) {
  std::vector<std::vector<Transfer>> phases;
  auto phase = [&](size_t i) -> std::vector<Transfer>& {
    if (phases.size() <= i) phases.resize(i + 1);
    return phases[i];
  };
  for (const ShardExchange& x : shards) {
    const int n = static_cast<int>(x.ranks.size());
    if (n < 2) continue;
    switch (x.algorithm) {
      case comm::Algorithm::kRing:
        for (int step = 0; step < n - 1; ++step) {
          for (int i = 0; i < n; ++i) {
            phase(step).push_back({x.ranks[i], x.ranks[(i + 1) % n], x.total});
          }
        }
        break;
      case comm::Algorithm::kHierarchical: {
        // Islands in order of their first member; the leader is the first member.
        std::vector<std::vector<int>> islands;
        std::map<int, size_t> index;
        for (int r : x.ranks) {
          const int island = net.topology.island_of(r);
          if (!index.count(island)) {
            index[island] = islands.size();
            islands.emplace_back();
          }
          islands[index[island]].push_back(r);
        }
        const double single = x.total + 16;  // one payload per message, bundle header
        const double everyone = 4 + n * (12 + x.total);
        for (const auto& island : islands) {
          for (size_t k = 1; k < island.size(); ++k) phase(0).push_back({island[k], island[0],
                                                                         x.total});
          for (const auto& other : islands) {
            if (other[0] == island[0]) continue;
            phase(1).push_back({island[0], other[0], single * island.size()});
          }
          for (size_t k = 1; k < island.size(); ++k) phase(2).push_back({island[0], island[k],
                                                                         everyone});
        }
        break;
      }
      default:  // direct
        for (int s : x.ranks) {
          for (int d : x.ranks) {
            if (s != d) phase(0).push_back({s, d, x.total});
          }
        }
    }
  }
  out->bytes = LinkBytes(net.topology.nranks());
  for (const auto& transfers : phases) {
    const PhaseTime t = TimeOfPhase(net, transfers, &out->bytes);
    if (t.seconds - t.latency_s >= out->wire_s - out->latency_s) out->bottleneck = t.bottleneck;
    out->wire_s += t.seconds;
    out->latency_s += t.latency_s;
  }
}

absl::StatusOr<SyncPrediction> PredictSync(const PlanInput& in, ByteCache& cache) {
  SyncPrediction sync;
  const comm::Topology& topo = in.net.topology;
  std::vector<ShardExchange> shards;
  sync.payload_bytes.assign(topo.nranks(), 0);
  double first = 0, tail = 0, elements = 0, selected_all = 0;
  for (int s = 0; s < topo.num_shards(); ++s) {
    LBCC_ASSIGN_OR_RETURN(ShardExchange x, PlanShard(in, topo.ShardRanks(s),
                                                     in.model.shard_shapes[s], cache));
    sync.algorithm.push_back(x.algorithm);
    sync.groups.push_back(static_cast<int>(x.blob.size()));
    for (int r : x.ranks) sync.payload_bytes[r] += x.total;
    first = std::max(first, x.first_fraction);
    tail = std::max(tail, x.tail_fraction);
    elements = std::max(elements, static_cast<double>(x.elements));
    selected_all = std::max(selected_all, static_cast<double>(x.selected * x.ranks.size()));
    shards.push_back(std::move(x));
  }
  ExchangePhases(in.net, shards, &sync);
  // A full replica encodes every shard: its encode covers the whole model.
  double full_elements = 0;
  for (const ShardExchange& x : shards) full_elements += static_cast<double>(x.elements);
  const bool any_full = std::any_of(topo.replicas().begin(), topo.replicas().end(),
                                    [](const comm::Topology::Replica& r) {
                                      return r.kind == comm::RankRole::Kind::kFull;
                                    });
  const double enc_elements = any_full ? full_elements : elements;
  const CpuModel& cpu = in.cpu;
  // Rates are one core's; every rank encodes (and decodes) at once, so on shared cores the
  // work of all of them is serialised (docs/planning.md, "Shared cores"). Measured times were
  // measured with the layout's own sharing and are taken as they are.
  const double serial = CpuSerialisation(in.net, topo.nranks());
  sync.encode_s = cpu.encode_s >= 0 ? cpu.encode_s
                  : cpu.encode_elements_per_s > 0
                      ? serial * enc_elements / cpu.encode_elements_per_s
                      : 0;
  sync.decode_s = cpu.decode_s >= 0 ? cpu.decode_s
                  : cpu.decode_values_per_s > 0
                      ? serial * selected_all * (any_full ? topo.num_shards() : 1) /
                            cpu.decode_values_per_s
                      : 0;
  sync.exchange_cpu_s = std::max(0.0, cpu.exchange_s);
  // Three paths, the longest wins (docs/planning.md, "Sync"):
  //   cpu:   encode, then exchange + validation with no wire (what an unshaped run measures),
  //          then decode;
  //   tail:  the last group's share of the wire cannot leave before the encode ends;
  //   wire:  bytes leave once the first group (or piece) is encoded; decode follows the last.
  const double bandwidth = sync.wire_s - sync.latency_s;
  const double cpu_path = sync.encode_s + sync.exchange_cpu_s + sync.decode_s;
  const double tail_path = sync.encode_s + tail * bandwidth + sync.decode_s;
  const double wire_path = first * sync.encode_s + bandwidth + sync.decode_s;
  const double longest = std::max({cpu_path, tail_path, wire_path});
  sync.overlap_s = cpu_path + bandwidth - longest;
  sync.seconds = longest + sync.latency_s;
  if (longest == cpu_path && cpu_path > 0) {
    sync.bottleneck = "codec CPU (encode, validation, decode)";
  } else if (longest == tail_path && sync.encode_s > 0) {
    sync.bottleneck = absl::StrCat("encode, then the last group on ", sync.bottleneck);
  }
  return sync;
}

absl::StatusOr<ReplicaPrediction> PredictReplica(const PlanInput& in, int m, int64_t k) {
  const comm::Topology& topo = in.net.topology;
  const comm::Topology::Replica& replica = topo.replicas()[m];
  const ModelSpec& model = in.model;
  ReplicaPrediction r;
  r.replica = m;
  r.pipeline = replica.kind == comm::RankRole::Kind::kPipeline;
  r.ranks = replica.ranks;
  r.boundary_k = r.pipeline ? k : 0;
  r.model_dim = model.d;
  const double tokens = static_cast<double>(model.tokens_per_step);
  auto stage_compute = [&](int rank, double params_share) {
    const RankCompute& c = in.compute[rank];
    if (c.step_s > 0) return c.step_s;
    return tokens * model.flops_per_token * params_share / c.flops_per_s;
  };
  if (!r.pipeline) {
    r.compute_s = r.inner_s = r.busy_s = stage_compute(replica.ranks[0], 1.0);
    r.microbatches = 1;
    r.limit = "compute";
    return r;
  }
  const int stages = static_cast<int>(replica.ranks.size());
  const int64_t micro = std::max<int64_t>(1, (model.tokens_per_step + model.microbatch_tokens - 1) /
                                                 model.microbatch_tokens);
  r.microbatches = static_cast<int>(micro);
  double slot_compute = 0, stage_sum = 0;
  int slowest_stage = 0;
  std::vector<double> stage_c(stages);
  for (int s = 0; s < stages; ++s) {
    const double share = static_cast<double>(model.stage_params[s]) / model.params;
    const double c = stage_compute(replica.ranks[s], share) / micro;
    stage_c[s] = c;
    stage_sum += c;
    if (c > slot_compute) {
      slot_compute = c;
      slowest_stage = s;
    }
  }
  BoundaryCoding coding;
  coding.model_dim = model.d;
  coding.rank = k;
  coding.vocab_size = model.vocab;
  coding.coefficient_dtype = in.job.coefficient_dtype;
  LBCC_ASSIGN_OR_RETURN(const BoundaryBytes bytes,
                        SubspaceBoundaryBytes(coding, model.microbatch_tokens));
  r.boundary_forward_bytes = bytes.forward;
  r.boundary_backward_bytes = bytes.backward;
  int slowest_boundary = -1;
  double fill_latency = 0, fill_transfers = 0;
  for (int s = 0; s + 1 < stages; ++s) {
    const int a = replica.ranks[s], b = replica.ranks[s + 1];
    // In the steady state a stage sends one microbatch forward while the next one's gradient
    // comes back: both directions at once.
    const PhaseTime t = TimeOfPhase(in.net, {{a, b, bytes.forward}, {b, a, bytes.backward}});
    // The first microbatch's forward and the last one's backward cross it alone, each after
    // its links idled for at least a stage's compute of one microbatch (what a shaper's
    // bucket refilled meanwhile passes at line speed; docs/planning.md, "Shaper bucket").
    const PhaseTime f = TimeOfPhase(in.net, {{a, b, bytes.forward}}, nullptr, stage_c[s]);
    const PhaseTime w = TimeOfPhase(in.net, {{b, a, bytes.backward}}, nullptr, stage_c[s + 1]);
    fill_transfers += (f.seconds - f.latency_s) + (w.seconds - w.latency_s);
    fill_latency += f.latency_s + w.latency_s;
    if (t.seconds - t.latency_s > r.boundary_s) {
      r.boundary_s = t.seconds - t.latency_s;
      slowest_boundary = s;
    }
  }
  // 1F1B (docs/planning.md, "Inner step"): one microbatch end to end (every stage's compute,
  // every boundary forward and back, their latencies), then M - 1 more slots of the slowest
  // stage's compute or the slowest boundary's transfer, whichever is longer (sends overlap the
  // next microbatch's compute).
  const double slots = static_cast<double>(micro + stages - 1);
  const double more = static_cast<double>(micro - 1);
  r.compute_s = more * slot_compute + stage_sum;
  r.busy_s = static_cast<double>(micro) * stage_sum;
  r.inner_s = more * std::max(slot_compute, r.boundary_s) + stage_sum + fill_transfers +
              fill_latency;
  r.boundary_latency_s = fill_latency;
  r.bubble_fraction = (stages - 1) / slots;
  r.limit = r.boundary_s > slot_compute
                ? absl::StrCat("boundary ", slowest_boundary, "->", slowest_boundary + 1)
                : absl::StrCat("stage ", slowest_stage, " compute");
  return r;
}

}  // namespace

absl::StatusOr<PlanInput> ParsePlanInput(absl::string_view text) {
  const Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError("plan input: not valid JSON");
  LBCC_RETURN_IF_ERROR(CheckKeys(json,
                                 {"topology", "topology_file", "rates", "model", "compute", "cpu",
                                  "job", "collective", "ring"},
                                 "plan input"));
  absl::StatusOr<comm::Topology> topology = absl::InvalidArgumentError(
      "topology: required (a \"topology\" object in comm/topology.h's schema, or "
      "\"topology_file\")");
  if (json.contains("topology")) {
    topology = comm::Topology::FromJson(json["topology"].dump());
  } else if (json.contains("topology_file")) {
    if (!json["topology_file"].is_string()) return Bad("topology_file", "must be a path");
    LBCC_ASSIGN_OR_RETURN(const std::string t,
                          ReadText(json["topology_file"].get<std::string>(), "topology_file"));
    topology = comm::Topology::FromJson(t);
  }
  LBCC_RETURN_IF_ERROR(topology.status());
  PlanInput in;
  // The slow-link scheduler the transport would run with in this environment (LBCC_SLOW_*).
  absl::StatusOr<transport::TransportOptions> transport_options =
      transport::TransportOptions::FromEnv();
  if (!transport_options.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment (the transport's LBCC_SLOW_* settings): ",
        transport_options.status().message()));
  }
  LBCC_ASSIGN_OR_RETURN(in.net, ParseRates(json.contains("rates") ? json["rates"] : Json(),
                                           *topology, transport_options->scheduler));
  const comm::Topology& topo = in.net.topology;
  if (json.contains("cpu")) LBCC_RETURN_IF_ERROR(ParseCpu(json["cpu"], &in.cpu, &in.net));
  LBCC_RETURN_IF_ERROR(ParseJob(json.contains("job") ? json["job"] : Json::object(), topo,
                                &in.job));
  if (json.contains("collective")) {
    in.collective.emplace();
    LBCC_RETURN_IF_ERROR(ParseCollective(json["collective"], &*in.collective));
    return in;
  }
  if (json.contains("ring")) {
    if (json.contains("model") || json.contains("compute")) {
      return Bad("ring", "a ring job takes its model and compute from the ring section");
    }
    in.ring.emplace();
    LBCC_RETURN_IF_ERROR(ParseRingSpec(json["ring"], topo.nranks(), &*in.ring));
    return in;
  }
  if (!json.contains("model")) {
    return Bad("model", "is required (or a \"collective\" or \"ring\" section)");
  }
  LBCC_RETURN_IF_ERROR(ParseModel(json["model"], topo, &in.model));
  if (!json.contains("compute")) return Bad("compute", "is required: default_tflops or ranks");
  LBCC_RETURN_IF_ERROR(ParseCompute(json["compute"], topo.nranks(), &in.compute));
  for (size_t m = 0; m < topo.replicas().size(); ++m) {
    const int64_t k = in.job.boundary_k[m];
    if (k > in.model.d) {
      return Bad(absl::StrCat("job.boundary (replica ", m, ")"),
                 absl::StrCat("k ", k, " exceeds model.d ", in.model.d));
    }
  }
  return in;
}

std::vector<double> SharedCoresFinish(const std::vector<ReplicaPrediction>& replicas, int cores,
                                      int H) {
  // A fluid simulation, event by event: between two phase ends every computing replica runs at
  // the same speed, min(1, cores / the cores all of them want).
  struct State {
    double compute = 0, comm = 0, want = 1;  // per inner step
    int steps_left = 0;
    bool computing = true;
    double left = 0;  // of the current phase: compute at full speed, or seconds of comm
  };
  std::vector<State> st(replicas.size());
  std::vector<double> finish(replicas.size(), 0.0);
  size_t running = 0;
  for (size_t i = 0; i < replicas.size(); ++i) {
    const ReplicaPrediction& r = replicas[i];
    State& s = st[i];
    s.compute = std::max(0.0, r.compute_s);
    s.comm = std::max(0.0, r.inner_s - r.compute_s);
    s.want = s.compute > 0 ? std::max(1.0, r.busy_s / s.compute) : 1.0;
    s.steps_left = H;
    s.left = s.compute;
    if (H > 0 && s.compute + s.comm > 0) ++running;
    if (H <= 0 || s.compute + s.comm <= 0) s.steps_left = 0;
  }
  // Moves replica i past every phase of zero length; false once its H steps are done.
  auto settle = [&](State& s) {
    while (s.steps_left > 0 && s.left <= 0) {
      if (s.computing) {
        s.computing = false;
        s.left = s.comm;
      } else {
        s.computing = true;
        s.left = s.compute;
        --s.steps_left;
      }
    }
    return s.steps_left > 0;
  };
  for (State& s : st) {
    if (s.steps_left > 0 && !settle(s)) --running;
  }
  double now = 0;
  // Every event ends a phase: at most 2 H per replica (the bound only guards the loop).
  for (size_t events = 0; running > 0 && events < 4 * replicas.size() * (size_t(H) + 1);
       ++events) {
    double want = 0;
    for (const State& s : st) {
      if (s.steps_left > 0 && s.computing) want += s.want;
    }
    const double speed = want > cores ? cores / want : 1.0;
    double dt = std::numeric_limits<double>::infinity();
    for (const State& s : st) {
      if (s.steps_left > 0) dt = std::min(dt, s.computing ? s.left / speed : s.left);
    }
    now += dt;
    for (size_t i = 0; i < st.size(); ++i) {
      State& s = st[i];
      if (s.steps_left == 0) continue;
      const double done = s.computing ? dt * speed : dt;
      // A phase within a rounding error of its end ends now.
      s.left = s.left - done <= 1e-12 * std::max(1.0, s.left) ? 0 : s.left - done;
      if (!settle(s)) {
        finish[i] = now;
        --running;
      }
    }
  }
  return finish;
}

absl::StatusOr<Prediction> Predict(const PlanInput& in) {
  if (in.compute.empty()) return Bad("compute", "no compute section (collective-only input)");
  Prediction p;
  p.H = in.job.H;
  ByteCache cache(in.job.topk);
  LBCC_ASSIGN_OR_RETURN(p.sync, PredictSync(in, cache));
  double slowest = 0;
  int slowest_replica = 0;
  for (size_t m = 0; m < in.net.topology.replicas().size(); ++m) {
    LBCC_ASSIGN_OR_RETURN(ReplicaPrediction r,
                          PredictReplica(in, static_cast<int>(m), in.job.boundary_k[m]));
    if (r.inner_s > slowest) {
      slowest = r.inner_s;
      slowest_replica = static_cast<int>(m);
    }
    p.replicas.push_back(std::move(r));
  }
  // Shared cores: every rank's compute runs on the same C cores, so a replica's compute is
  // slowed while the others compute too (docs/planning.md, "Shared cores").
  bool cores_bound = false;
  if (in.net.shared_cores > 0) {
    double busy = 0;
    for (const ReplicaPrediction& r : p.replicas) {
      busy += r.busy_s;
    }
    p.cpu_floor_s = busy / in.net.shared_cores;
    const std::vector<double> finish =
        SharedCoresFinish(p.replicas, in.net.shared_cores, in.job.H);
    const auto last = std::max_element(finish.begin(), finish.end());
    p.shared_step_s = *last / in.job.H;
    if (p.shared_step_s > slowest * (1 + 1e-9)) {
      slowest = p.shared_step_s;
      slowest_replica = static_cast<int>(last - finish.begin());
      cores_bound = true;
    }
  }
  const double H = in.job.H;
  p.outer_s = H * slowest + p.sync.seconds;
  double compute = 0, total = 0;
  for (ReplicaPrediction& r : p.replicas) {
    r.comm_s = H * (r.inner_s - r.compute_s) + p.sync.seconds;
    r.wait_s = H * (slowest - r.inner_s);
    r.utilization = H * r.compute_s / (H * r.compute_s + r.comm_s);
    // Overlapped outer exchanges (ReplicaPrediction's comment): only the part of the sync
    // that the inner steps between post and merge do not cover is exposed.
    const double F = in.job.overlap_fragments;
    const double fragment_steps = std::max(1, in.job.H / in.job.overlap_fragments);
    const double t_fragment = p.sync.latency_s + (p.sync.seconds - p.sync.latency_s) / F;
    const double exposed_delayed = std::max(0.0, p.sync.seconds - H * r.inner_s);
    const double exposed_streaming =
        F * std::max(0.0, t_fragment - fragment_steps * r.inner_s);
    r.utilization_delayed = H * r.compute_s / (H * r.inner_s + exposed_delayed);
    r.utilization_streaming = H * r.compute_s / (H * r.inner_s + exposed_streaming);
    compute += H * r.compute_s;
    total += p.outer_s;
  }
  p.utilization = total > 0 ? compute / total : 0;
  if (cores_bound) {
    const ReplicaPrediction& c = p.replicas[slowest_replica];
    p.critical_path = absl::StrFormat(
        "%d x inner step of replica %d on %d shared cores (%.4g s; %.4g s on cores of its own, "
        "every rank's compute %.4g s) + sync %.4g s (%s)",
        in.job.H, slowest_replica, in.net.shared_cores, slowest, c.inner_s, p.cpu_floor_s,
        p.sync.seconds, p.sync.bottleneck);
    return p;
  }
  const ReplicaPrediction& c = p.replicas[slowest_replica];
  p.critical_path = absl::StrFormat(
      "%d x inner step of replica %d (%s, %.4g s) + sync %.4g s (%s)", in.job.H,
      slowest_replica, c.limit, c.inner_s, p.sync.seconds, p.sync.bottleneck);
  return p;
}

absl::StatusOr<Recommendation> Recommend(const PlanInput& in) {
  Recommendation rec;
  rec.target = in.job.target_utilization;
  const std::vector<int> hs = {1, 2, 5, 10, 15, 30, 50, 100, 250, 500};
  const std::vector<int> divisors = {1, 2, 4, 8, 16, 32, 64, 128};
  const auto& replicas = in.net.topology.replicas();
  auto k_of = [&](int divisor) {
    return divisor == 1 ? int64_t{0} : std::max<int64_t>(1, in.model.d / divisor);
  };
  PlanInput trial = in;
  for (int h : hs) {
    trial.job.H = h;
    bool all = true;
    int strongest = 1;
    for (size_t m = 0; m < replicas.size() && all; ++m) {
      bool reached = false;
      const int choices = replicas[m].kind == comm::RankRole::Kind::kPipeline
                              ? static_cast<int>(divisors.size())
                              : 1;
      for (int i = 0; i < choices && !reached; ++i) {
        trial.job.boundary_k[m] = k_of(divisors[i]);
        LBCC_ASSIGN_OR_RETURN(const Prediction p, Predict(trial));
        if (p.replicas[m].utilization >= rec.target) {
          reached = true;
          if (replicas[m].kind == comm::RankRole::Kind::kPipeline) {
            strongest = std::max(strongest, divisors[i]);
          }
        }
      }
      all = reached;
    }
    if (!all) continue;
    rec.reached = true;
    rec.H = h;
    LBCC_ASSIGN_OR_RETURN(rec.least, Predict(trial));
    PlanInput every = trial;
    for (size_t m = 0; m < replicas.size(); ++m) {
      if (replicas[m].kind == comm::RankRole::Kind::kPipeline) {
        every.job.boundary_k[m] = k_of(strongest);
      }
    }
    LBCC_ASSIGN_OR_RETURN(rec.compress_all, Predict(every));
    return rec;
  }
  // Not reachable: the most the candidates give (largest H, strongest compression).
  trial.job.H = hs.back();
  for (size_t m = 0; m < replicas.size(); ++m) {
    if (replicas[m].kind == comm::RankRole::Kind::kPipeline) {
      trial.job.boundary_k[m] = k_of(divisors.back());
    }
  }
  rec.H = hs.back();
  LBCC_ASSIGN_OR_RETURN(rec.least, Predict(trial));
  rec.compress_all = rec.least;
  std::vector<std::string> short_of;
  for (const ReplicaPrediction& r : rec.least.replicas) {
    if (r.utilization < rec.target) {
      short_of.push_back(absl::StrFormat("replica %d %.1f %% (%s)", r.replica,
                                         100 * r.utilization, r.limit));
    }
  }
  rec.note = absl::StrCat("target not reached even at H = ", hs.back(), " and k/d = 1/",
                          divisors.back(), ": ", absl::StrJoin(short_of, ", "));
  return rec;
}

absl::StatusOr<CollectivePrediction> PredictCollective(const PlanInput& in) {
  if (!in.collective) return Bad("collective", "no collective section");
  const CollectiveSpec& spec = *in.collective;
  const comm::Topology& topo = in.net.topology;
  const int n = topo.nranks();
  std::vector<int> all(n);
  for (int r = 0; r < n; ++r) all[r] = r;
  CollectivePrediction out;
  out.op = spec.op;
  const int64_t count = spec.bytes / 4;
  if (spec.op == "allreduce") {
    // The table's choice: direct (up to 64 KiB: every rank's data to every rank in one round,
    // the operation header with it) or ring reduce-scatter + all-gather (2 (N - 1) steps of
    // count / N elements each).
    LBCC_ASSIGN_OR_RETURN(
        out.algorithm,
        comm::SelectAlgorithm(comm::Collective::kAllReduce, comm::ShapeOf(topo, all),
                              static_cast<size_t>(4 * count), in.job.algorithm,
                              comm::Algorithm::kAuto));
    const bool direct = out.algorithm == comm::Algorithm::kDirect;
    LinkBytes bytes(n);
    const double piece = 4.0 * static_cast<double>(count) / (direct ? 1 : n);
    std::vector<Transfer> step;
    for (int r = 0; r < n; ++r) {
      for (int p = 1; p < (direct ? n : 2); ++p) step.push_back({r, (r + p) % n, piece});
    }
    for (int i = 0; i < (direct ? 1 : 2 * (n - 1)); ++i) {
      const PhaseTime t = TimeOfPhase(in.net, step, &bytes);
      out.wire_s += t.seconds;
      if (t.host_s >= t.seconds - t.latency_s) out.host_s += t.seconds - t.latency_s;
      out.bottleneck = t.bottleneck;
    }
    out.cpu_s = std::max(0.0, in.cpu.allreduce_s);
    out.seconds = out.wire_s + out.cpu_s;
    out.rank0_recv_bytes = bytes.slow_down[0] + bytes.fast_down[0];
    for (int r = 0; r < n; ++r) out.slow_recv_bytes_all += bytes.slow_down[r];
    return out;
  }
  PlanInput one = in;
  one.model.shard_shapes = {PerfShapes(count, spec.tensors)};
  ByteCache cache(in.job.topk);
  LBCC_ASSIGN_OR_RETURN(const SyncPrediction sync, PredictSync(one, cache));
  out.algorithm = sync.algorithm[0];
  out.seconds = sync.seconds;
  out.wire_s = sync.wire_s;
  out.cpu_s = sync.encode_s + sync.exchange_cpu_s + sync.decode_s;
  out.rank0_recv_bytes = sync.bytes.slow_down[0] + sync.bytes.fast_down[0];
  for (int r = 0; r < n; ++r) out.slow_recv_bytes_all += sync.bytes.slow_down[r];
  out.bottleneck = sync.bottleneck;
  return out;
}

Network ScaleSlowRates(const Network& net, double factor) {
  Network out = net;
  for (AccessLink& l : out.rank_link) {
    l.up_bps *= factor;
    l.down_bps *= factor;
  }
  for (auto& s : out.site_link) {
    if (s) {
      s->up_bps *= factor;
      s->down_bps *= factor;
    }
  }
  if (out.pace_bps > 0) out.pace_bps *= factor;
  return out;
}

// ---- Output -----------------------------------------------------------------------------------

Json ToJson(const Prediction& p) {
  Json replicas = Json::array();
  for (const ReplicaPrediction& r : p.replicas) {
    replicas.push_back({{"replica", r.replica},
                        {"kind", r.pipeline ? "pipeline" : "full"},
                        {"ranks", r.ranks},
                        {"boundary_k", r.boundary_k},
                        {"compute_s", r.compute_s},
                        {"busy_s", r.busy_s},
                        {"inner_s", r.inner_s},
                        {"microbatches", r.microbatches},
                        {"boundary_forward_bytes", r.boundary_forward_bytes},
                        {"boundary_backward_bytes", r.boundary_backward_bytes},
                        {"boundary_s", r.boundary_s},
                        {"boundary_latency_s", r.boundary_latency_s},
                        {"bubble_fraction", r.bubble_fraction},
                        {"comm_s", r.comm_s},
                        {"wait_s", r.wait_s},
                        {"utilization", r.utilization},
                        {"utilization_delayed", r.utilization_delayed},
                        {"utilization_streaming", r.utilization_streaming},
                        {"limit", r.limit}});
  }
  Json algorithms = Json::array();
  for (comm::Algorithm a : p.sync.algorithm) algorithms.push_back(comm::AlgorithmName(a));
  Json sync = {{"algorithm", algorithms},
               {"groups", p.sync.groups},
               {"payload_bytes", p.sync.payload_bytes},
               {"slow_up_bytes", p.sync.bytes.slow_up},
               {"slow_down_bytes", p.sync.bytes.slow_down},
               {"fast_up_bytes", p.sync.bytes.fast_up},
               {"fast_down_bytes", p.sync.bytes.fast_down},
               {"wire_s", p.sync.wire_s},
               {"latency_s", p.sync.latency_s},
               {"encode_s", p.sync.encode_s},
               {"exchange_cpu_s", p.sync.exchange_cpu_s},
               {"decode_s", p.sync.decode_s},
               {"overlap_s", p.sync.overlap_s},
               {"seconds", p.sync.seconds},
               {"bottleneck", p.sync.bottleneck}};
  return {{"H", p.H},
          {"replicas", replicas},
          {"sync", sync},
          {"outer_s", p.outer_s},
          {"cpu_floor_s", p.cpu_floor_s},
          {"shared_step_s", p.shared_step_s},
          {"utilization", p.utilization},
          {"critical_path", p.critical_path}};
}

Json ToJson(const Recommendation& r) {
  return {{"target_utilization", r.target}, {"reached", r.reached}, {"H", r.H},
          {"least", ToJson(r.least)},       {"compress_all", ToJson(r.compress_all)},
          {"note", r.note}};
}

Json ToJson(const CollectivePrediction& c) {
  return {{"op", c.op},
          {"algorithm", comm::AlgorithmName(c.algorithm)},
          {"seconds", c.seconds},
          {"wire_s", c.wire_s},
          {"cpu_s", c.cpu_s},
          {"host_s", c.host_s},
          {"wire_recv_bytes", c.rank0_recv_bytes},
          {"slow_recv_bytes_all_ranks", c.slow_recv_bytes_all},
          {"bottleneck", c.bottleneck}};
}

std::string FormatPrediction(const Prediction& p) {
  std::string s = absl::StrFormat(
      "%-8s %-9s %-10s %8s %11s %11s %12s %10s %8s %11s %11s %7s  %s\n", "replica", "kind",
      "ranks", "k", "compute(s)", "inner(s)", "boundary(B)", "bnd(s)/mb", "bubble", "comm(s)",
      "wait(s)", "util", "limit");
  for (const ReplicaPrediction& r : p.replicas) {
    const std::string k = r.pipeline ? (r.boundary_k == 0 ? "dense" : absl::StrCat(r.boundary_k))
                                     : "-";
    absl::StrAppendFormat(
        &s, "%-8d %-9s %-10s %8s %11.4g %11.4g %12.0f %10.4g %7.1f%% %11.4g %11.4g %6.1f%%  %s\n",
        r.replica, r.pipeline ? "pipeline" : "full", absl::StrJoin(r.ranks, ","), k, r.compute_s,
        r.inner_s, r.boundary_forward_bytes + r.boundary_backward_bytes, r.boundary_s,
        100 * r.bubble_fraction, r.comm_s, r.wait_s, 100 * r.utilization, r.limit);
  }
  std::vector<std::string> algos;
  for (comm::Algorithm a : p.sync.algorithm) algos.push_back(std::string(comm::AlgorithmName(a)));
  double max_payload = 0, max_down = 0;
  for (double b : p.sync.payload_bytes) max_payload = std::max(max_payload, b);
  for (double b : p.sync.bytes.slow_down) max_down = std::max(max_down, b);
  absl::StrAppendFormat(
      &s,
      "sync (SparseAllReduce, %s): payload <= %.0f B per rank, slow down-link <= %.0f B; wire "
      "%.4g s (latency %.3g s), encode %.4g s, decode %.4g s, overlap %.4g s -> %.4g s (%s)\n",
      absl::StrJoin(algos, "/"), max_payload, max_down, p.sync.wire_s, p.sync.latency_s,
      p.sync.encode_s, p.sync.decode_s, p.sync.overlap_s, p.sync.seconds, p.sync.bottleneck);
  if (p.cpu_floor_s > 0) {
    absl::StrAppendFormat(&s,
                          "shared cores: every rank's compute of an inner step takes %.4g s; an "
                          "inner step with the cores shared %.4g s\n",
                          p.cpu_floor_s, p.shared_step_s);
  }
  absl::StrAppendFormat(&s, "outer step (H = %d): %.4g s, job utilization %.1f %%\n", p.H,
                        p.outer_s, 100 * p.utilization);
  absl::StrAppendFormat(&s, "overlapped outer steps (docs/overlap.md), utilization per replica:");
  for (const ReplicaPrediction& r : p.replicas) {
    absl::StrAppendFormat(&s, " %d: blocking %.1f %%, delayed %.1f %%, streaming %.1f %%;",
                          r.replica, 100 * r.utilization, 100 * r.utilization_delayed,
                          100 * r.utilization_streaming);
  }
  s.back() = '\n';
  absl::StrAppendFormat(&s, "critical path: %s\n", p.critical_path);
  return s;
}

std::string FormatRecommendation(const Recommendation& r) {
  std::string s = absl::StrFormat("recommendation for %.1f %% compute utilization: ",
                                  100 * r.target);
  if (!r.reached) {
    absl::StrAppend(&s, "NOT REACHABLE. ", r.note, "\n");
    return s;
  }
  absl::StrAppendFormat(&s, "H = %d\n", r.H);
  absl::StrAppendFormat(&s, "%-8s %-9s %14s %9s %14s %9s\n", "replica", "kind", "least: k/d",
                        "util", "compress-all", "util");
  for (size_t i = 0; i < r.least.replicas.size(); ++i) {
    const ReplicaPrediction& a = r.least.replicas[i];
    const ReplicaPrediction& b = r.compress_all.replicas[i];
    auto kd = [](const ReplicaPrediction& x) -> std::string {
      if (!x.pipeline) return "-";
      if (x.boundary_k == 0) return "dense";
      return absl::StrFormat("%d (1/%d)", x.boundary_k, x.model_dim / x.boundary_k);
    };
    absl::StrAppendFormat(&s, "%-8d %-9s %14s %8.1f%% %14s %8.1f%%\n", a.replica,
                          a.pipeline ? "pipeline" : "full", kd(a), 100 * a.utilization, kd(b),
                          100 * b.utilization);
  }
  absl::StrAppendFormat(&s, "job utilization: least %.1f %%, compress-all %.1f %%\n",
                        100 * r.least.utilization, 100 * r.compress_all.utilization);
  return s;
}

}  // namespace lbcc::plan
