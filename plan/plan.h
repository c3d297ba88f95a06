// The LBCC planning model: what one outer step of a heterogeneous SparseLoCo job costs on a
// given network, and which replicas need their pipeline boundaries compressed to reach a
// target compute utilization. Formulas, each term named: docs/planning.md.
//
//   absl::StatusOr<PlanInput> input = ParsePlanInput(json_text);
//   absl::StatusOr<Prediction> p = Predict(*input);          // one outer step
//   absl::StatusOr<Recommendation> r = Recommend(*input);    // least compression per replica
//   absl::StatusOr<CollectivePrediction> c = PredictCollective(*input);  // one collective
//
// The input is LBCC's topology JSON (comm/topology.h, parsed by comm) beside a "rates" section
// (plan/network.h) and "model", "compute", "cpu", "job" or "collective" sections; the schema
// is in docs/planning.md and plan/README.md. Byte counts come from the codecs' formulas
// (plan/bytes.h) and the algorithm from comm's selection table (comm/algorithms.h), so the plan
// predicts what LBCC would do, not what a generic collective would.
//
// Errors: InvalidArgument naming the field (a topology without rates, stages that do not add
// up to the parameter count, a rate of 0, an unknown key). Thread-safety: pure functions over
// immutable values.
#ifndef LBCC_PLAN_PLAN_H_
#define LBCC_PLAN_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/dtype.h"
#include "codecs/topk_ef.h"
#include "comm/algorithms.h"
#include "nlohmann/json.hpp"
#include "plan/bytes.h"
#include "plan/network.h"

namespace lbcc::plan {

struct ModelSpec {
  int64_t params = 0;                // total parameter count
  std::vector<int64_t> stage_params;  // per pipeline stage (= shard); sums to params
  int64_t d = 0;                     // model width
  int64_t layers = 0;
  int64_t seq_len = 0;
  int64_t vocab = 0;                 // token ids cross pipeline boundaries; 0: none
  int64_t tokens_per_step = 0;       // per replica and inner step
  int64_t microbatch_tokens = 0;     // per pipeline microbatch (default: seq_len)
  double flops_per_token = 0;        // forward + backward (default 6 * params)
  // Each shard's parameters as tensors (shapes), in order; by default [d, d] matrices and a
  // 1-D remainder, as a transformer's projections come.
  std::vector<std::vector<std::vector<int64_t>>> shard_shapes;
};

// Per rank: effective training throughput, or a measured inner step (the rank's stage of one
// inner step for a pipeline stage).
struct RankCompute {
  double flops_per_s = 0;
  double step_s = 0;  // > 0: measured, wins over flops_per_s
};

// Codec CPU time per SparseAllReduce: measured (a calibration run on unshaped links) or from
// rates. Negative means "not given".
struct CpuModel {
  double encode_s = -1;    // this rank's encode of every group
  double exchange_s = -1;  // after the encode, with no wire: waiting for the others, validation
  double decode_s = -1;    // the aggregate written
  double allreduce_s = -1;  // dense all-reduce: CPU not overlapped with the wire (collective)
  double encode_elements_per_s = 0;  // else: t_encode = elements / this
  double decode_values_per_s = 0;    // and t_decode = selected values of every rank / this
};

struct JobSpec {
  int H = 30;
  codecs::TopKEfOptions topk;                 // SparseLoCo defaults
  int64_t sparse_group_elements = 1 << 20;   // LBCC_SPARSE_GROUP_ELEMENTS
  comm::Algorithm algorithm = comm::Algorithm::kAuto;
  std::vector<int64_t> boundary_k;  // per replica: subspace k (0: dense bf16 boundary)
  DType coefficient_dtype = DType::kBF16;
  double target_utilization = 0.95;
  // SparseLoCo(overlap="streaming")'s fragments F (docs/overlap.md), for the overlap columns.
  int overlap_fragments = 2;
};

// One collective alone (what bench/lbcc_perf measures): validation mode.
struct CollectiveSpec {
  std::string op = "sparse_allreduce";  // or "allreduce" (dense fp32: the table's direct or ring)
  int64_t bytes = 0;                    // dense fp32 bytes
  int tensors = 1;                      // split into this many equal tensors
};

// A context-parallel ring attention job (plan/ring.h, docs/context_parallel.md "Planning"):
// the model and sequence split over every rank of the topology, K/V on comm::ContextRing.
struct RingSpec {
  int64_t context = 0;  // tokens of one sequence, split evenly over the ranks
  int64_t batch = 1;    // sequences per step
  int64_t d = 0;        // model width (K and V are [tokens, d] per layer)
  int64_t heads = 1;
  int64_t layers = 1;   // ring attentions per step (one per layer)
  bool causal = true;
  RingCoding coding;     // K's and V's codec (both the same)
  double compression = 0;  // > 0 and no k given: the largest k saving at least this vs bf16
  double attention_flops_per_s = 0;  // block attention rate of one rank (measured or given)
  // The caller's encode or decode of one f32 [tokens, d] tensor, elements per second of one
  // rank (ring.codec_gelements_s; default per codec: plan/ring.h kDefaultCodecGElementsPerS*).
  double codec_elements_per_s = 0;
  // The rest of the step: non-ring compute (forward, backward, optimizer) measured, or
  // 6 x params x tokens per rank / other_flops_per_s (default attention_flops_per_s);
  // plus the dense f32 gradient all-reduce of `params` in `grad_tensors` equal tensors.
  double other_s = -1;
  double other_flops_per_s = 0;
  int64_t params = 0;
  int64_t grad_tensors = 1;
};

// Parses a "ring" section for `nranks` ranks into `out` (ParsePlanInput calls it; defined in
// plan/ring.cc). InvalidArgument "ring.<field>: ..." for a bad or missing field, an unknown key,
// a context not divisible by the ranks, d not divisible by heads, a codec not one of raw, bf16,
// fp16, subspace, a subspace codec with neither k nor compression.
absl::Status ParseRingSpec(const nlohmann::json& ring, int nranks, RingSpec* out);

struct PlanInput {
  Network net;
  ModelSpec model;
  std::vector<RankCompute> compute;
  CpuModel cpu;
  JobSpec job;
  std::optional<CollectiveSpec> collective;
  std::optional<RingSpec> ring;
};

// Parses the whole document. Only "topology" and "rates" are required in collective mode and
// with a "ring" section (plan/ring.h); otherwise "model" and "compute" too.
absl::StatusOr<PlanInput> ParsePlanInput(absl::string_view json_text);

// SparseAllReduce of every shard at once (the outer step's synchronisation).
struct SyncPrediction {
  std::vector<comm::Algorithm> algorithm;  // per shard
  std::vector<int> groups;                 // exchange groups per shard
  std::vector<double> payload_bytes;       // per rank: its payloads (all its shards)
  LinkBytes bytes{0};                      // per rank and link class, up and down
  double wire_s = 0;       // the network phases alone
  double latency_s = 0;    // their latency terms
  double encode_s = 0;     // slowest rank
  double exchange_cpu_s = 0;
  double decode_s = 0;
  double overlap_s = 0;    // encode hidden behind the wire (or the wire behind the encode)
  double seconds = 0;      // t_sync
  std::string bottleneck;  // the resource that drains last
};

struct ReplicaPrediction {
  int replica = 0;
  bool pipeline = false;
  std::vector<int> ranks;
  int64_t boundary_k = 0;
  int64_t model_dim = 0;      // d (for k/d)
  double compute_s = 0;       // t_compute: one inner step on infinitely fast links
  double busy_s = 0;          // its ranks' compute of one inner step, summed (shared cores)
  double inner_s = 0;         // t_inner: one inner step
  double boundary_forward_bytes = 0;   // per microbatch and boundary
  double boundary_backward_bytes = 0;
  double boundary_s = 0;      // slowest boundary, one microbatch, both directions (bandwidth)
  double boundary_latency_s = 0;  // latency of every boundary, in and out, per inner step
  int microbatches = 0;
  double bubble_fraction = 0;  // (S - 1) / (M + S - 1)
  double comm_s = 0;          // t_comm per outer step: exposed boundary time x H + t_sync
  double wait_s = 0;          // idle for slower replicas per outer step
  double utilization = 0;     // H t_compute / (H t_compute + t_comm)
  // With the outer exchange overlapped (docs/overlap.md): only the part of t_sync that the
  // inner steps between post and merge do not cover is exposed.
  //   delayed (delay H):        exposed = max(0, t_sync - H t_inner)
  //   streaming (F fragments, delay H/F, each fragment's exchange t_f = latency part of t_sync
  //   + the rest / F):          exposed = F max(0, t_f - (H/F) t_inner)
  // utilization = H t_compute / (H t_inner + exposed). The exchange's encode and decode are
  // taken to run on a core the inner steps do not need (LBCC's worker thread).
  double utilization_delayed = 0;
  double utilization_streaming = 0;
  std::string limit;          // what bounds its inner step
};

struct Prediction {
  int H = 0;
  std::vector<ReplicaPrediction> replicas;
  SyncPrediction sync;
  double outer_s = 0;     // H * max(max t_inner, shared_step_s) + t_sync
  double cpu_floor_s = 0;  // shared cores: every rank's compute of an inner step / the cores
  double shared_step_s = 0;  // shared cores: the inner steps' time with the cores shared
  double utilization = 0;  // job: sum of compute over sum of (compute + comm + wait)
  std::string critical_path;
};

absl::StatusOr<Prediction> Predict(const PlanInput& input);

// Shared cores (docs/planning.md, "Shared cores"): the time each replica needs for H inner
// steps when all of them run on `cores` cores at once. Each inner step of a replica is its
// compute (compute_s at full speed, wanting busy_s / compute_s cores meanwhile) and then its
// exposed communication (inner_s - compute_s), which takes no core; computing replicas share
// the cores equally (a replica's share capped at what it wants), and a replica that is
// waiting on its links, or done, leaves them to the others. Returns each replica's finish.
std::vector<double> SharedCoresFinish(const std::vector<ReplicaPrediction>& replicas, int cores,
                                      int H);

struct Recommendation {
  double target = 0;
  bool reached = false;
  int H = 0;
  Prediction least;          // least compression per replica
  Prediction compress_all;   // every pipeline replica at the strongest k the least plan uses
  std::string note;          // why not reached, when not
};
// Least H (from 1, 2, 5, 10, 15, 30, 50, 100, 250, 500) and per pipeline replica the largest
// k/d (1, 1/2, ... 1/128; 1 = dense) at which every replica reaches the target.
absl::StatusOr<Recommendation> Recommend(const PlanInput& input);

struct CollectivePrediction {
  std::string op;
  comm::Algorithm algorithm = comm::Algorithm::kAuto;
  double seconds = 0;
  double wire_s = 0;
  double cpu_s = 0;
  double host_s = 0;                 // phases where the hosts' CPU, not a link, drains last
  double rank0_recv_bytes = 0;       // what lbcc_perf reports as wire_recv_bytes
  double slow_recv_bytes_all = 0;    // every rank's slow-link bytes received
  std::string bottleneck;
};
absl::StatusOr<CollectivePrediction> PredictCollective(const PlanInput& input);

nlohmann::json ToJson(const Prediction& p);
nlohmann::json ToJson(const Recommendation& r);
nlohmann::json ToJson(const CollectivePrediction& c);
// Human-readable tables.
std::string FormatPrediction(const Prediction& p);
std::string FormatRecommendation(const Recommendation& r);

// Scales every slow rate (access and site links) by `factor` (> 0).
Network ScaleSlowRates(const Network& net, double factor);

}  // namespace lbcc::plan

#endif  // LBCC_PLAN_PLAN_H_
