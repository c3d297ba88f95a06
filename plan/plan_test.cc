// The planning model: input errors, the formulas on layouts whose answer is known by hand, the
// algorithm comm's table picks, and the recommendation's contract.
#include "plan/plan.h"

#include <string>
#include <utility>
#include <vector>

#include "base/status_matchers.h"
#include "gtest/gtest.h"
#include "plan/bytes.h"
#include "plan/ring.h"
#include "transport/options.h"

namespace lbcc::plan {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

// 4 ranks, every link slow, every down-link `mbit`, up-links fast: lbcc_perf's testbed layout.
std::string FlatCollective(const std::string& op, int tensors, double mbit) {
  return R"({"topology": {"nranks": 4},
             "rates": {"efficiency": 1, "default": {"down_mbit": )" +
         std::to_string(mbit) + R"(, "up_mbit": 100000}},
             "collective": {"op": ")" + op + R"(", "bytes": 16777216, "tensors": )" +
         std::to_string(tensors) + "}}";
}

constexpr char kPipelineJob[] = R"({
  "topology": {"nranks": 4, "islands": [[0, 1]],
               "replicas": [{"kind": "full", "rank": 0}, {"kind": "full", "rank": 1},
                            {"kind": "pipeline", "stages": [2, 3]}]},
  "rates": {"default": {"up_mbit": 100, "down_mbit": 100, "latency_ms": 10},
            "ranks": [{"rank": 0, "up_mbit": 10000, "down_mbit": 10000},
                      {"rank": 1, "up_mbit": 10000, "down_mbit": 10000}]},
  "model": {"params": 200000000, "stage_params": [100000000, 100000000], "d": 1024,
            "seq_len": 1024, "vocab": 50257, "tokens_per_step": 65536},
  "compute": {"default_tflops": 50},
  "job": {"H": 30}
})";

TEST(PlanInput, TopologyWithoutRatesNamesRates) {
  EXPECT_THAT(ParsePlanInput(R"({"topology": {"nranks": 2},
                                 "collective": {"bytes": 1024}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rates")));
}

TEST(PlanInput, RateOfZeroNamesTheField) {
  EXPECT_THAT(ParsePlanInput(R"({"topology": {"nranks": 2},
                                 "rates": {"ranks": [{"rank": 1, "up_mbit": 100, "down_mbit": 0}],
                                           "default": {"up_mbit": 1, "down_mbit": 1}},
                                 "collective": {"bytes": 1024}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ranks[0].down_mbit")));
}

TEST(PlanInput, RankWithoutRateNamesTheRank) {
  EXPECT_THAT(ParsePlanInput(R"({"topology": {"nranks": 3},
                                 "rates": {"ranks": [{"rank": 1, "up_mbit": 100, "down_mbit": 9}]},
                                 "collective": {"bytes": 1024}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 0")));
}

TEST(PlanInput, StagesThatDoNotAddUpNameStageParams) {
  std::string job = kPipelineJob;
  job.replace(job.find("[100000000, 100000000]"), 22, "[100000000, 90000000]");
  EXPECT_THAT(ParsePlanInput(job), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("model.stage_params")));
  job = kPipelineJob;
  job.replace(job.find("[100000000, 100000000]"), 22, "[200000000]");
  EXPECT_THAT(ParsePlanInput(job), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("pipelines have 2")));
}

TEST(PlanInput, UnknownKeysAndBadTopologyAreErrors) {
  EXPECT_THAT(ParsePlanInput(R"({"topology": {"nranks": 2}, "ratez": {}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ratez")));
  // comm's parser still rejects rate keys inside the topology itself.
  EXPECT_THAT(ParsePlanInput(R"({"topology": {"nranks": 2, "up_mbit": 5}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("up_mbit")));
  EXPECT_THAT(ParsePlanInput("{"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Collective, DirectSparseAllReduceOnFlatLinks) {
  auto in = ParsePlanInput(FlatCollective("sparse_allreduce", 1, 100));
  ASSERT_THAT(in.status(), IsOk());
  auto c = PredictCollective(*in);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->algorithm, comm::Algorithm::kDirect);
  // Each rank receives the 3 other ranks' blobs; one 4M tensor streams (16-byte final header).
  codecs::TopKEfOptions options;
  auto payload = TopKEfPayloadBytes({1024, 4096}, options);
  ASSERT_THAT(payload.status(), IsOk());
  const double blob = 5 + 8 + *payload + 16;
  EXPECT_DOUBLE_EQ(c->rank0_recv_bytes, 3 * blob);
  EXPECT_DOUBLE_EQ(c->slow_recv_bytes_all, 12 * blob);
  // No CPU given: the wire alone, at 100 Mbit/s, plus the latency term (0 here).
  EXPECT_NEAR(c->seconds, 3 * blob / 12.5e6, 1e-9);
}

TEST(Collective, DenseRingAllReduce) {
  auto in = ParsePlanInput(FlatCollective("allreduce", 1, 100));
  ASSERT_THAT(in.status(), IsOk());
  auto c = PredictCollective(*in);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->algorithm, comm::Algorithm::kRing);
  EXPECT_DOUBLE_EQ(c->rank0_recv_bytes, 2.0 * 3 / 4 * 16777216);
  EXPECT_NEAR(c->seconds, 2.0 * 3 / 4 * 16777216 / 12.5e6, 1e-9);
}

// The credit window: a window of one chunk stops and waits for each chunk's credit (a round
// trip plus the credit's turnaround); a window that covers a round trip's bytes never waits.
TEST(Collective, CreditWindowStallsADenseRing) {
  auto doc = [](const std::string& extra) {
    return R"({"topology": {"nranks": 4},
               "rates": {"efficiency": 1, "chunk_bytes": 262144, )" + extra + R"(
                         "default": {"down_mbit": 100, "up_mbit": 100000, "latency_ms": 1}},
               "collective": {"op": "allreduce", "bytes": 16777216}})";
  };
  auto in = ParsePlanInput(doc(R"("window_bytes": 262144, "credit_ms": 3,)"));
  ASSERT_THAT(in.status(), IsOk());
  auto c = PredictCollective(*in);
  ASSERT_THAT(c.status(), IsOk());
  // Per step 4 MiB in 16 windows: 15 stalls of rtt (2 x 2 ms) + 3 ms; latency 2 ms per step.
  const double step = 4194304 / 12.5e6 + 15 * (0.004 + 0.003) + 0.002;
  EXPECT_NEAR(c->seconds, 6 * step, 1e-9);
  EXPECT_NE(c->bottleneck.find("credit window"), std::string::npos) << c->bottleneck;
  // 1 MiB: the first chunk's credit is back (21 ms + 7 ms) before the window is sent (84 ms).
  in = ParsePlanInput(doc(R"("window_bytes": 1048576, "credit_ms": 3,)"));
  ASSERT_THAT(in.status(), IsOk());
  c = PredictCollective(*in);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_NEAR(c->seconds, 6 * (4194304 / 12.5e6 + 0.002), 1e-9);
}

// Without overrides the window is the transport's own: transport::WindowBytes over the
// scheduler options the environment gives (LBCC_SLOW_CHUNK_BYTES, _STRIPES, _WINDOW_BYTES).
TEST(Collective, WindowIsTheTransportsOwn) {
  auto in = ParsePlanInput(FlatCollective("allreduce", 1, 100));
  ASSERT_THAT(in.status(), IsOk());
  auto options = transport::TransportOptions::FromEnv();
  ASSERT_THAT(options.status(), IsOk());
  EXPECT_EQ(in->net.scheduler.chunk_bytes, options->scheduler.chunk_bytes);
  EXPECT_EQ(in->net.scheduler.window_bytes, options->scheduler.window_bytes);
  EXPECT_EQ(in->net.scheduler.stripes, options->scheduler.stripes);
  for (double rtt : {0.0, 0.001, 0.1}) {
    EXPECT_EQ(WindowOf(in->net, 12.5e6, rtt),
              static_cast<double>(transport::WindowBytes(options->scheduler, 12.5e6, rtt)));
  }
}

TEST(PlanInput, BadSchedulerFieldsNameTheField) {
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, std::string>>{{"chunk_bytes", "0"},
                                                        {"window_bytes", "-1"},
                                                        {"stripes", "0"},
                                                        {"credit_ms", "-2"},
                                                        {"message_ms", "\"x\""},
                                                        {"efficiency", "0"}}) {
    const std::string doc = R"({"topology": {"nranks": 2}, "rates": {")" + field + "\": " +
                            value + R"(, "default": {"up_mbit": 1, "down_mbit": 1}},
                                   "collective": {"bytes": 1024}})";
    EXPECT_THAT(ParsePlanInput(doc), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("rates: " + field)))
        << doc;
  }
}

TEST(PlanInput, NegativeRateAndMissingModelFieldsNameTheField) {
  EXPECT_THAT(ParsePlanInput(R"({"topology": {"nranks": 2},
                                 "rates": {"default": {"up_mbit": -5, "down_mbit": 1}},
                                 "collective": {"bytes": 1024}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("default.up_mbit")));
  EXPECT_THAT(ParsePlanInput(R"({"topology": {"nranks": 2},
                                 "rates": {"default": {"down_mbit": 1}},
                                 "collective": {"bytes": 1024}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("default.up_mbit")));
  std::string job = kPipelineJob;
  job.replace(job.find(R"("d": 1024,)"), 10, "");
  EXPECT_THAT(ParsePlanInput(job),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.d")));
  job = kPipelineJob;
  job.replace(job.find(R"("default_tflops": 50)"), 20, R"("default_tflops": 0)");
  EXPECT_THAT(ParsePlanInput(job),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("default_tflops")));
}

TEST(Collective, CpuTimeOverlapsTheWire) {
  std::string doc = FlatCollective("sparse_allreduce", 16, 100);
  doc.insert(doc.rfind('}'), R"(, "cpu": {"encode_ms": 8, "exchange_ms": 1, "decode_ms": 2})");
  auto in = ParsePlanInput(doc);
  ASSERT_THAT(in.status(), IsOk());
  auto c = PredictCollective(*in);
  ASSERT_THAT(c.status(), IsOk());
  // 4 groups: the wire starts after the first group's encode; the last group's share waits for
  // the whole encode. The result lies between the wire alone plus the serial CPU and the sum.
  EXPECT_GT(c->seconds, c->wire_s + 0.003 - 1e-9);
  EXPECT_LT(c->seconds, c->wire_s + 0.011);
}

// Shared cores: each phase takes at least the hosts' CPU for its bytes, every rank's bytes
// sent + received over the copy rate, summed over the ranks and spread over the cores.
TEST(Collective, SharedCoresBoundADenseRing) {
  const auto with_cpu = [](const std::string& cpu) {
    std::string doc = FlatCollective("allreduce", 1, 100);
    doc.insert(doc.rfind('}'), R"(, "cpu": )" + cpu);
    return doc;
  };
  auto free_cores = ParsePlanInput(FlatCollective("allreduce", 1, 100));
  ASSERT_THAT(free_cores.status(), IsOk());
  auto link = PredictCollective(*free_cores);
  ASSERT_THAT(link.status(), IsOk());
  // Per step each of 4 ranks sends and receives 4 MiB: 8 MiB at 1 GB/s = 8.39 ms on a core of
  // its own, below the link's 335 ms: the link drains last.
  auto in = ParsePlanInput(with_cpu(R"({"copy_gbytes_s": 1})"));
  ASSERT_THAT(in.status(), IsOk());
  auto c = PredictCollective(*in);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_DOUBLE_EQ(c->seconds, link->seconds);
  EXPECT_EQ(c->host_s, 0);
  // On 1 shared core at 0.05 GB/s: 4 x 8 MiB per step / 0.05 GB/s = 671 ms > 335 ms.
  in = ParsePlanInput(with_cpu(R"({"copy_gbytes_s": 0.05, "shared_cores": 1})"));
  ASSERT_THAT(in.status(), IsOk());
  c = PredictCollective(*in);
  ASSERT_THAT(c.status(), IsOk());
  const double step = 4 * 2 * 4194304 / 0.05e9;
  EXPECT_NEAR(c->seconds, 6 * step, 1e-9);
  EXPECT_NEAR(c->host_s, 6 * step, 1e-9);
  EXPECT_NE(c->bottleneck.find("4 ranks on 1 cores"), std::string::npos) << c->bottleneck;
  // Two cores halve it; as many cores as ranks leave each rank its own.
  in = ParsePlanInput(with_cpu(R"({"copy_gbytes_s": 0.05, "shared_cores": 2})"));
  ASSERT_THAT(in.status(), IsOk());
  c = PredictCollective(*in);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_NEAR(c->seconds, 6 * step / 2, 1e-9);
  // (at 0.02 GB/s a rank's own 8 MiB per step take 419 ms, more than the link's 335 ms).
  in = ParsePlanInput(with_cpu(R"({"copy_gbytes_s": 0.02, "shared_cores": 8})"));
  ASSERT_THAT(in.status(), IsOk());
  c = PredictCollective(*in);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_NEAR(c->seconds, 6 * 2 * 4194304 / 0.02e9, 1e-9);
}

// Codec rates are one core's: on shared cores the ranks' encodes are serialised.
TEST(Collective, SharedCoresSerialiseCodecRates) {
  auto time = [](const std::string& cpu) {
    std::string doc = FlatCollective("sparse_allreduce", 16, 100000);
    doc.insert(doc.rfind('}'), R"(, "cpu": )" + cpu);
    auto in = ParsePlanInput(doc);
    EXPECT_THAT(in.status(), IsOk());
    auto c = PredictCollective(*in);
    EXPECT_THAT(c.status(), IsOk());
    return c->cpu_s;
  };
  const double own = time(R"({"encode_gelements_s": 0.1})");
  EXPECT_NEAR(own, 4194304 / 0.1e9, 1e-12);
  EXPECT_NEAR(time(R"({"encode_gelements_s": 0.1, "shared_cores": 2})"), 2 * own, 1e-12);
  EXPECT_NEAR(time(R"({"encode_gelements_s": 0.1, "shared_cores": 4})"), own, 1e-12);
  // Measured times are taken as measured (the calibration ran with the same sharing).
  EXPECT_NEAR(time(R"({"encode_ms": 7, "shared_cores": 1})"), 0.007, 1e-12);
}

// Shared cores: no replica's inner step ends before every rank's compute of it has had the
// cores, and a replica's compute is slowed while the others compute beside it.
TEST(Predict, SharedCoresSlowTheInnerStep) {
  std::string job = kPipelineJob;
  auto in = ParsePlanInput(job);
  ASSERT_THAT(in.status(), IsOk());
  auto own = Predict(*in);
  ASSERT_THAT(own.status(), IsOk());
  EXPECT_EQ(own->cpu_floor_s, 0);
  EXPECT_EQ(own->shared_step_s, 0);
  job.insert(job.rfind('}'), R"(, "cpu": {"shared_cores": 2})");
  in = ParsePlanInput(job);
  ASSERT_THAT(in.status(), IsOk());
  auto shared = Predict(*in);
  ASSERT_THAT(shared.status(), IsOk());
  // Two full replicas (c each) and two stages (c / 2 each) on 2 cores: 1.5 c per inner step.
  const double c = shared->replicas[0].compute_s;
  EXPECT_NEAR(shared->cpu_floor_s, 1.5 * c, 1e-9 * c);
  double slowest = 0;
  for (const ReplicaPrediction& r : shared->replicas) slowest = std::max(slowest, r.inner_s);
  // Never faster than the floor or than the slowest replica alone; never slower than both
  // one after the other.
  EXPECT_GE(shared->shared_step_s, std::max(slowest, 1.5 * c) * (1 - 1e-9));
  EXPECT_LE(shared->shared_step_s, (slowest + 1.5 * c) * (1 + 1e-9));
  EXPECT_NEAR(shared->outer_s, 30 * std::max(slowest, shared->shared_step_s) +
                                   shared->sync.seconds,
              1e-9 * shared->outer_s);
  EXPECT_GE(shared->outer_s, own->outer_s);
  if (shared->shared_step_s > slowest * (1 + 1e-9)) {
    EXPECT_NE(shared->critical_path.find("shared cores"), std::string::npos)
        << shared->critical_path;
  }
}

ReplicaPrediction Replica(double compute_s, double busy_s, double inner_s) {
  ReplicaPrediction r;
  r.compute_s = compute_s;
  r.busy_s = busy_s;
  r.inner_s = inner_s;
  return r;
}

// Two full replicas computing 1 s per inner step and a pipeline computing 1 s and then waiting
// 1 s on its links, on 2 cores, H = 4. While the pipeline computes the three share the cores
// (2/3 each): its compute takes 1.5 s, the full replicas get 1 s of work done; while it waits
// the full replicas have a core each. So every 2.5 s the full replicas finish two steps and the
// pipeline one: the full replicas are done at 5 s, and the pipeline, alone from then, needs
// 2 s for each of its last two steps: 9 s (8 s on cores of its own, 6 s the floor).
TEST(SharedCoresFinish, ComputeSlowsWhileOthersComputeAndNotWhileTheyWait) {
  const std::vector<ReplicaPrediction> replicas = {Replica(1, 1, 1), Replica(1, 1, 1),
                                                   Replica(1, 1, 2)};
  const std::vector<double> finish = SharedCoresFinish(replicas, 2, 4);
  ASSERT_EQ(finish.size(), 3u);
  EXPECT_NEAR(finish[0], 5, 1e-9);
  EXPECT_NEAR(finish[1], 5, 1e-9);
  EXPECT_NEAR(finish[2], 9, 1e-9);
  // Enough cores: each replica's own H inner steps.
  const std::vector<double> alone = SharedCoresFinish(replicas, 3, 4);
  EXPECT_NEAR(alone[0], 4, 1e-9);
  EXPECT_NEAR(alone[2], 8, 1e-9);
  // Compute only, one core: the floor (every replica's work, one after another in effect).
  const std::vector<double> floor = SharedCoresFinish({Replica(1, 1, 1), Replica(2, 2, 2)}, 1, 3);
  EXPECT_NEAR(floor[0], 6, 1e-9);  // shares the core for 6 s, its 3 s of work done
  EXPECT_NEAR(floor[1], 9, 1e-9);  // then alone for the rest of its 6 s of work
  // A pipeline whose stages compute at once (busy 2 s in 1 s of compute) wants two cores.
  const std::vector<double> two = SharedCoresFinish({Replica(1, 2, 1)}, 1, 2);
  EXPECT_NEAR(two[0], 4, 1e-9);
  // Nothing to do, or no steps: done at once.
  EXPECT_EQ(SharedCoresFinish({Replica(0, 0, 0)}, 2, 5)[0], 0);
  EXPECT_EQ(SharedCoresFinish({Replica(1, 1, 1)}, 2, 0)[0], 0);
}

// A shaper's bucket: after the link idled, what refilled passes at line speed.
TEST(Links, AnIdleLinksBucketPassesAtLineSpeed) {
  auto net = ParseRates(nlohmann::json::parse(R"({"efficiency": 0.5,
      "default": {"up_mbit": 8000, "down_mbit": 8000},
      "ranks": [{"rank": 1, "up_mbit": 8000, "down_mbit": 8, "down_burst_bytes": 4000}]})"),
                        comm::Topology::Flat(2));
  ASSERT_THAT(net.status(), IsOk());
  // 1 MB/s line rate, goodput 0.5 MB/s: 10000 bytes take 20 ms; the bucket's 4000 bytes pass
  // 4 ms early once refilled (4 ms of idle), a part of them after less idle.
  auto seconds = [&](double bytes, double idle) {
    const PhaseTime t = TimeOfPhase(*net, {{0, 1, bytes}}, nullptr, idle);
    return t.seconds - t.latency_s;
  };
  EXPECT_NEAR(seconds(10000, 0), 0.020, 1e-12);
  EXPECT_NEAR(seconds(10000, 1), 0.016, 1e-12);
  EXPECT_NEAR(seconds(10000, 0.004), 0.016, 1e-12);
  EXPECT_NEAR(seconds(10000, 0.001), 0.019, 1e-12);
  // All of it within the bucket: only the unshaped up-link's time is left.
  EXPECT_NEAR(seconds(1000, 1), 1000 / (1e9 * 0.5), 1e-12);
  // The other direction has no bucket.
  const PhaseTime back = TimeOfPhase(*net, {{1, 0, 10000}}, nullptr, 1);
  EXPECT_NEAR(back.seconds - back.latency_s, 10000 / (1e9 * 0.5), 1e-12);
  EXPECT_THAT(ParseRates(nlohmann::json::parse(R"({"default": {"up_mbit": 1, "down_mbit": 1,
                                                     "down_burst_bytes": -1}})"),
                         comm::Topology::Flat(2))
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("default.down_burst_bytes")));
  EXPECT_THAT(ParseRates(nlohmann::json::parse(R"({"default": {"up_mbit": 1, "down_mbit": 1},
      "sites": [{"island": 0, "up_mbit": 1, "down_mbit": 1, "up_burst_bytes": 5}]})"),
                         comm::Topology::Flat(2))
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown key 'up_burst_bytes'")));
}

// A pipeline's first forward and last backward follow a stage's compute: on a link with a
// bucket they are shorter by what it refilled, and the inner step with them.
TEST(Predict, ABucketShortensThePipelinesFillTransfers) {
  auto without = ParsePlanInput(kPipelineJob);
  ASSERT_THAT(without.status(), IsOk());
  std::string job = kPipelineJob;
  const std::string rate = R"("down_mbit": 100)";
  ASSERT_NE(job.find(rate), std::string::npos);
  job.replace(job.find(rate), rate.size(),
              R"("down_mbit": 100, "down_burst_bytes": 1e12, "up_burst_bytes": 1e12)");
  auto with = ParsePlanInput(job);
  ASSERT_THAT(with.status(), IsOk()) << job;
  auto a = Predict(*without), b = Predict(*with);
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  // Both fill transfers (forward and backward) shorter by a stage's compute of a microbatch.
  const double c = b->replicas[2].compute_s;  // M = 64 microbatches of two equal stages
  const double per_micro = (b->replicas[2].busy_s / 64) / 2;
  ASSERT_GT(per_micro, 0);
  EXPECT_NEAR(a->replicas[2].inner_s - b->replicas[2].inner_s, 2 * per_micro, 1e-9 * c);
  EXPECT_EQ(b->replicas[0].inner_s, a->replicas[0].inner_s);
}

TEST(PlanInput, BadCpuFieldsNameTheField) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"shared_cores", "-1"}, {"shared_cores", "1.5"}, {"copy_gbytes_s", "-3"},
           {"copy_gbytes_s", "\"fast\""}}) {
    const std::string doc = R"({"topology": {"nranks": 2},
                                "rates": {"default": {"up_mbit": 1, "down_mbit": 1}},
                                "cpu": {")" + field + "\": " + value + R"(},
                                "collective": {"bytes": 1024}})";
    EXPECT_THAT(ParsePlanInput(doc), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("cpu." + field)))
        << doc;
  }
}

TEST(Sync, TablePicksHierarchicalForIslandsAndItMovesFewerSiteBytes) {
  const std::string base = R"({
    "topology": {"nranks": 6, "islands": [[0, 1, 2, 3]]},
    "rates": {"default": {"up_mbit": 10000, "down_mbit": 10000},
              "sites": [{"island": 0, "up_mbit": 10000, "down_mbit": 100}],
              "ranks": [{"rank": 4, "up_mbit": 100, "down_mbit": 100},
                        {"rank": 5, "up_mbit": 100, "down_mbit": 100}]},
    "collective": {"op": "sparse_allreduce", "bytes": 4194304})";
  auto hier = ParsePlanInput(base + "}");
  ASSERT_THAT(hier.status(), IsOk());
  auto h = PredictCollective(*hier);
  ASSERT_THAT(h.status(), IsOk());
  EXPECT_EQ(h->algorithm, comm::Algorithm::kHierarchical);
  auto flat = ParsePlanInput(base + R"(, "job": {"algo": "direct"}})");
  ASSERT_THAT(flat.status(), IsOk());
  auto f = PredictCollective(*flat);
  ASSERT_THAT(f.status(), IsOk());
  EXPECT_EQ(f->algorithm, comm::Algorithm::kDirect);
  // Behind one shared site link, direct brings each remote payload in once per member.
  EXPECT_LT(h->seconds, f->seconds);
  EXPECT_LT(h->slow_recv_bytes_all, f->slow_recv_bytes_all);
}

TEST(Predict, PipelineTermsAndUtilization) {
  auto in = ParsePlanInput(kPipelineJob);
  ASSERT_THAT(in.status(), IsOk());
  auto dense = Predict(*in);
  ASSERT_THAT(dense.status(), IsOk());
  ASSERT_EQ(dense->replicas.size(), 3u);
  const ReplicaPrediction& pipe = dense->replicas[2];
  EXPECT_TRUE(pipe.pipeline);
  EXPECT_EQ(pipe.microbatches, 64);
  EXPECT_DOUBLE_EQ(pipe.bubble_fraction, 1.0 / 65);
  EXPECT_DOUBLE_EQ(pipe.boundary_forward_bytes, 1024.0 * 1024 * 2);
  // Full replicas: compute alone per inner step, t_sync once per outer step.
  const ReplicaPrediction& full = dense->replicas[0];
  EXPECT_DOUBLE_EQ(full.compute_s, 65536.0 * 6 * 200e6 / 50e12);
  EXPECT_DOUBLE_EQ(full.utilization, 30 * full.compute_s / (30 * full.compute_s +
                                                             dense->sync.seconds));
  // Compressing the boundary: fewer bytes, higher utilization.
  in->job.boundary_k[2] = 64;
  auto compressed = Predict(*in);
  ASSERT_THAT(compressed.status(), IsOk());
  EXPECT_LT(compressed->replicas[2].boundary_forward_bytes, pipe.boundary_forward_bytes);
  EXPECT_GT(compressed->replicas[2].utilization, pipe.utilization);
  EXPECT_DOUBLE_EQ(compressed->outer_s,
                   30 * std::max({compressed->replicas[0].inner_s,
                                  compressed->replicas[2].inner_s}) +
                       compressed->sync.seconds);
}

// Overlapped outer steps (docs/overlap.md): delayed hides t_sync behind the H inner steps,
// streaming each fragment's exchange behind H / F of them; both are never below blocking, and
// streaming with one fragment is delayed.
TEST(Predict, OverlapHidesTheSyncBehindTheInnerSteps) {
  std::string job = kPipelineJob;
  job.replace(job.find(R"("job": {"H": 30})"), std::string(R"("job": {"H": 30})").size(),
              R"("job": {"H": 4, "overlap_fragments": 2})");
  auto in = ParsePlanInput(job);
  ASSERT_THAT(in.status(), IsOk());
  auto p = Predict(*in);
  ASSERT_THAT(p.status(), IsOk());
  const double t_sync = p->sync.seconds, lat = p->sync.latency_s;
  for (const ReplicaPrediction& r : p->replicas) {
    const double exposed_delayed = std::max(0.0, t_sync - 4 * r.inner_s);
    const double t_fragment = lat + (t_sync - lat) / 2;
    const double exposed_streaming = 2 * std::max(0.0, t_fragment - 2 * r.inner_s);
    EXPECT_DOUBLE_EQ(r.utilization_delayed,
                     4 * r.compute_s / (4 * r.inner_s + exposed_delayed));
    EXPECT_DOUBLE_EQ(r.utilization_streaming,
                     4 * r.compute_s / (4 * r.inner_s + exposed_streaming));
    EXPECT_GE(r.utilization_delayed, r.utilization);
    EXPECT_GE(r.utilization_streaming, r.utilization * (1 - 1e-12));
  }
  // A full replica whose sync is shorter than its H inner steps computes all the time.
  const ReplicaPrediction& full = p->replicas[0];
  if (t_sync < 4 * full.inner_s) EXPECT_DOUBLE_EQ(full.utilization_delayed, 1.0);
  EXPECT_LT(full.utilization, 1.0);
  in->job.overlap_fragments = 1;
  auto one = Predict(*in);
  ASSERT_THAT(one.status(), IsOk());
  for (const ReplicaPrediction& r : one->replicas) {
    EXPECT_DOUBLE_EQ(r.utilization_streaming, r.utilization_delayed);
  }
  job.replace(job.find(R"("overlap_fragments": 2)"), 22, R"("overlap_fragments": 5)");
  EXPECT_THAT(ParsePlanInput(job).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.overlap_fragments")));
}

TEST(Recommend, LeastCompressionReachesTheTargetAndCompressAllIsNoWeaker) {
  auto in = ParsePlanInput(kPipelineJob);
  ASSERT_THAT(in.status(), IsOk());
  in->job.target_utilization = 0.9;
  auto r = Recommend(*in);
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_TRUE(r->reached) << r->note;
  for (const ReplicaPrediction& p : r->least.replicas) EXPECT_GE(p.utilization, 0.9);
  const ReplicaPrediction& least = r->least.replicas[2];
  const ReplicaPrediction& all = r->compress_all.replicas[2];
  EXPECT_GT(least.boundary_k, 0);  // 100 Mbit/s cannot carry dense activations here
  EXPECT_LE(all.boundary_k, least.boundary_k);
  // One step less compression would miss the target at the same H.
  if (least.boundary_k * 2 <= 1024) {
    in->job.H = r->H;
    in->job.boundary_k[2] = least.boundary_k * 2;
    auto weaker = Predict(*in);
    ASSERT_THAT(weaker.status(), IsOk());
    EXPECT_LT(weaker->replicas[2].utilization, 0.9);
  }
}

TEST(Recommend, UnreachableTargetSaysWhy) {
  std::string job = kPipelineJob;
  job.replace(job.find(R"("up_mbit": 100, "down_mbit": 100, "latency_ms": 10)"), 49,
              R"("up_mbit": 0.01, "down_mbit": 0.01, "latency_ms": 10)");
  auto in = ParsePlanInput(job);
  ASSERT_THAT(in.status(), IsOk());
  auto r = Recommend(*in);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_FALSE(r->reached);
  EXPECT_THAT(r->note, HasSubstr("replica 2"));
}

// ---- The context ring (plan/ring.h) ---------------------------------------------------------

// `n` ranks, every link `mbit` both ways with `latency_ms`, the example's model by default.
std::string RingJob(int n, double mbit, const std::string& ring, double latency_ms = 0) {
  return R"({"topology": {"nranks": )" + std::to_string(n) +
         R"(}, "rates": {"efficiency": 1, "default": {"up_mbit": )" + std::to_string(mbit) +
         R"(, "down_mbit": )" + std::to_string(mbit) + R"(, "latency_ms": )" +
         std::to_string(latency_ms) + R"(}}, "ring": {)" + ring + "}}";
}

absl::StatusOr<RingPrediction> Ring(const std::string& job) {
  absl::StatusOr<PlanInput> in = ParsePlanInput(job);
  if (!in.ok()) return in.status();
  return PredictRing(*in);
}

TEST(Ring, InputErrorsNameTheField) {
  const char* base = R"("context": 256, "d": 64, "attention_gflops": 1)";
  EXPECT_THAT(Ring(RingJob(3, 100, base)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ring.context")));
  EXPECT_THAT(Ring(RingJob(4, 100, R"("context": 256, "d": 64)")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ring.attention_gflops")));
  EXPECT_THAT(Ring(RingJob(4, 100, std::string(base) + R"(, "heads": 5)")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ring.heads")));
  EXPECT_THAT(Ring(RingJob(4, 100, std::string(base) + R"(, "codec": "int8")")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ring.codec")));
  EXPECT_THAT(Ring(RingJob(4, 100, std::string(base) + R"(, "codec": "subspace")")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("either k or compression")));
  EXPECT_THAT(Ring(RingJob(4, 100, std::string(base) + R"(, "k": 3)")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ring.k")));
  EXPECT_THAT(Ring(RingJob(4, 100, std::string(base) + R"(, "codec": "subspace", "k": 65)")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("k is 65")));
  EXPECT_THAT(Ring(RingJob(4, 100, std::string(base) + R"(, "tokens": 3)")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens")));
}

// A compression ratio picks the largest k that reaches it, from the codec's own sizes.
TEST(Ring, CompressionPicksTheLargestKThatReachesIt) {
  for (double ratio : {0.9, 0.95}) {
    const std::string ring = R"("context": 256, "batch": 8, "d": 64, "attention_gflops": 1,
        "codec": "subspace", "components": 4, "mixture_block": 16, "compression": )" +
                             std::to_string(ratio);
    absl::StatusOr<RingPrediction> p = Ring(RingJob(4, 100, ring));
    ASSERT_THAT(p.status(), IsOk());
    EXPECT_GE(p->saved, ratio);
    RingCoding one_more;
    one_more.kind = RingCoding::Kind::kSubspace;
    one_more.rank = p->k + 1;
    one_more.components = 4;
    one_more.mixture_block = 16;
    absl::StatusOr<RingTensorBytes> b = RingPayloadBytes(one_more, 8 * 64, 64);
    ASSERT_THAT(b.status(), IsOk());
    EXPECT_GT(2 * b->forward, (1 - ratio) * p->bf16_bytes) << "k " << p->k + 1;
  }
  EXPECT_EQ(Ring(RingJob(4, 100, R"("context": 256, "batch": 8, "d": 64, "attention_gflops": 1,
        "codec": "subspace", "components": 4, "mixture_block": 16, "compression": 0.95)"))->k, 3);
}

// Two ranks, causal, by hand: rank 1 attends its own block and rank 0's, rank 0 only its own.
// Forward: every rank encodes its K and V and decodes them back (bf16 is lossy: the block the
// others see), rank 1 computes its block, waits for rank 0's (one hop), decodes and computes
// it. Backward: rank 1 computes dK/dV for both blocks, encodes rank 0's partial sum and sends
// it (one hop); rank 0 decodes it. K/V do not travel again.
TEST(Ring, TwoRanksCausalByHand) {
  const std::string ring = R"("context": 1024, "batch": 2, "d": 128, "heads": 4, "layers": 3,
      "attention_gflops": 10, "codec_gelements_s": 0.1)";
  for (double mbit : {1.0, 10000.0}) {  // wire-bound, then compute-bound
    absl::StatusOr<PlanInput> in = ParsePlanInput(RingJob(2, mbit, ring, 5));
    ASSERT_THAT(in.status(), IsOk());
    absl::StatusOr<RingPrediction> p = PredictRing(*in);
    ASSERT_THAT(p.status(), IsOk());
    const double tokens = 2 * 512;
    const double c_f = 4.0 * 2 * 512 * 512 * 128 / 10e9, c_b = 2.5 * c_f;
    EXPECT_DOUBLE_EQ(p->block_forward_s, c_f);
    EXPECT_DOUBLE_EQ(p->block_backward_s, c_b);
    const double e = 2 * tokens * 128 / 0.1e9;  // K and V, or dK and dV: either way
    EXPECT_DOUBLE_EQ(p->block_encode_s, e);
    EXPECT_DOUBLE_EQ(p->block_decode_s, e);
    EXPECT_DOUBLE_EQ(p->codec_gelements_s, 0.1);
    // One bf16 K block: the dense codec's payload (tokens x d x 2 + its envelope).
    EXPECT_GT(p->forward_bytes, 2 * tokens * 128 * 2);
    EXPECT_LT(p->forward_bytes, 2 * tokens * 128 * 2 + 256);
    EXPECT_EQ(p->backward_bytes, p->forward_bytes);
    EXPECT_NEAR(p->saved, 0, 1e-12);
    const double wire = p->forward_bytes / (mbit * 1e6 / 8);
    EXPECT_NEAR(p->round_forward_wire_s, wire, 1e-9 * wire);
    EXPECT_GE(p->round_latency_s, 0.005);
    const double hop = p->round_forward_wire_s + p->round_latency_s;
    EXPECT_NEAR(p->forward_s, 2 * e + std::max(c_f, hop) + e + c_f, 1e-12);
    EXPECT_NEAR(p->backward_s, 2 * c_b + e + hop + e, 1e-12);
    EXPECT_NEAR(p->ring_s, 3 * (p->forward_s + p->backward_s), 1e-12);
    EXPECT_NEAR(p->ring_compute_s, 3 * 2 * (c_f + c_b), 1e-12);
    EXPECT_NEAR(p->ring_codec_s, 3 * 5 * e, 1e-12);  // own: encode + decode; 1 + 2 per pass
    EXPECT_NEAR(p->ring_wire_s, 3 * 2 * hop, 1e-12);
    EXPECT_EQ(p->ring_bytes_step, 3 * (p->forward_bytes + p->backward_bytes));
    EXPECT_EQ(p->limit, mbit < 10 ? "wire" : "compute");
    EXPECT_NEAR(p->overlap_ratio,
                p->ring_s / std::max(p->ring_compute_s + p->ring_codec_s, p->ring_wire_s), 1e-12);
    EXPECT_EQ(p->allreduce_s, 0);
    EXPECT_EQ(p->step_s, p->ring_s);
  }
}

// The caller's codec rate: given (> 0, else InvalidArgument naming the key) or the codec's
// default; its term is the f32 elements coded, so it scales with the blocks (and a dense
// codec's payload bytes) and not with the codec's compression.
TEST(Ring, CodecRateIsPositiveOrTheCodecsDefault) {
  const std::string base = R"("context": 256, "d": 64, "attention_gflops": 1)";
  for (const char* rate : {"0", "-1", "\"fast\""}) {
    EXPECT_THAT(Ring(RingJob(4, 100, base + R"(, "codec_gelements_s": )" + rate)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("ring.codec_gelements_s")))
        << rate;
  }
  const std::vector<std::pair<std::string, double>> defaults = {
      {R"("raw")", kDefaultCodecGElementsPerSRaw},
      {R"("bf16")", kDefaultCodecGElementsPerSDense},
      {R"("fp16")", kDefaultCodecGElementsPerSDense},
      {R"("subspace", "k": 4)", kDefaultCodecGElementsPerSSubspace}};
  for (const auto& [codec, rate] : defaults) {
    absl::StatusOr<RingPrediction> p = Ring(RingJob(4, 100, base + R"(, "codec": )" + codec));
    ASSERT_THAT(p.status(), IsOk()) << codec;
    EXPECT_DOUBLE_EQ(p->codec_gelements_s, rate) << codec;
    EXPECT_DOUBLE_EQ(p->block_encode_s, 2.0 * 64 * 64 / (rate * 1e9)) << codec;
  }
}

TEST(Ring, CodecTermScalesWithThePayload) {
  auto predict = [](int batch, const std::string& codec) {
    return Ring(RingJob(4, 100, R"("context": 1024, "d": 128, "attention_gflops": 5,
        "codec_gelements_s": 0.2, "batch": )" + std::to_string(batch) + ", " + codec));
  };
  for (const std::string codec :
       {R"("codec": "bf16")", R"("codec": "raw")",
        R"("codec": "subspace", "k": 8, "components": 4, "mixture_block": 64)"}) {
    absl::StatusOr<RingPrediction> one = predict(2, codec), two = predict(4, codec);
    ASSERT_THAT(one.status(), IsOk()) << codec;
    ASSERT_THAT(two.status(), IsOk()) << codec;
    EXPECT_DOUBLE_EQ(two->block_encode_s, 2 * one->block_encode_s) << codec;
    EXPECT_DOUBLE_EQ(two->ring_codec_s, 2 * one->ring_codec_s) << codec;
    EXPECT_GT(one->ring_codec_s, 0) << codec;
    // Twice the block, twice the payload (up to the envelope and the selectors).
    EXPECT_NEAR(two->forward_bytes / one->forward_bytes, 2, 0.05) << codec;
  }
  // The same blocks through the compressing codec: fewer bytes, the same elements coded.
  absl::StatusOr<RingPrediction> bf16 = predict(2, R"("codec": "bf16")");
  absl::StatusOr<RingPrediction> sub =
      predict(2, R"("codec": "subspace", "k": 8, "components": 4, "mixture_block": 64)");
  ASSERT_THAT(bf16.status(), IsOk());
  ASSERT_THAT(sub.status(), IsOk());
  EXPECT_LT(sub->forward_bytes, bf16->forward_bytes / 10);
  EXPECT_DOUBLE_EQ(sub->block_encode_s, bf16->block_encode_s);
}

// Compute-bound (every rank attends every block, a fast link), the encodes and decodes add to
// the caller's side of every round exactly: the forward by the own block's encode (and decode
// back, for a lossy codec) and one decode per received block, the backward by one decode and
// one encode per round. The wire and the block compute do not change.
TEST(Ring, CodecAddsToTheComputeSideOfEachRound) {
  for (const char* codec : {"bf16", "raw"}) {
    auto predict = [&](double rate) {
      return Ring(RingJob(4, 100000, R"("context": 4096, "d": 128, "causal": false,
          "attention_gflops": 1, "codec": ")" + std::string(codec) +
                                         R"(", "codec_gelements_s": )" + std::to_string(rate)));
    };
    absl::StatusOr<RingPrediction> with = predict(0.05), without = predict(1e12);
    ASSERT_THAT(with.status(), IsOk());
    ASSERT_THAT(without.status(), IsOk());
    EXPECT_EQ(with->limit, "compute");
    EXPECT_LT(without->ring_codec_s, 1e-12);
    const double e = with->block_encode_s, d = with->block_decode_s;
    EXPECT_DOUBLE_EQ(e, 2.0 * 1024 * 128 / 0.05e9);
    const double begin = std::string(codec) == "raw" ? e : e + d;
    EXPECT_NEAR(with->forward_s - without->forward_s, begin + 3 * d, 1e-12) << codec;
    EXPECT_NEAR(with->backward_s - without->backward_s, 3 * (d + e), 1e-12) << codec;
    EXPECT_NEAR(with->ring_codec_s, begin + 3 * d + 3 * (d + e), 1e-12) << codec;
    EXPECT_NEAR(with->ring_s - without->ring_s, with->ring_codec_s, 1e-12) << codec;
    EXPECT_EQ(with->ring_compute_s, without->ring_compute_s);
    EXPECT_EQ(with->ring_wire_s, without->ring_wire_s);
  }
}

// Overlap: far from the balance point the ring costs about the larger of its compute and its
// wire; the busiest rank (the last, causal) bounds it.
TEST(Ring, OverlapHidesTheSmallerSide) {
  const std::string ring = R"("context": 8192, "batch": 1, "d": 256, "layers": 2,
      "attention_gflops": 20)";
  absl::StatusOr<RingPrediction> slow = Ring(RingJob(8, 10, ring));
  absl::StatusOr<RingPrediction> fast = Ring(RingJob(8, 100000, ring));
  ASSERT_THAT(slow.status(), IsOk());
  ASSERT_THAT(fast.status(), IsOk());
  EXPECT_EQ(slow->limit, "wire");
  EXPECT_EQ(fast->limit, "compute");
  EXPECT_GE(slow->ring_s, slow->ring_wire_s);
  EXPECT_LE(slow->overlap_ratio, 1.1);
  EXPECT_GE(fast->ring_s, fast->ring_compute_s);
  EXPECT_LE(fast->overlap_ratio, 1.1);
  // Not causal: every rank computes every block, so the compute doubles almost.
  absl::StatusOr<RingPrediction> full =
      Ring(RingJob(8, 100000, ring + R"(, "causal": false)"));
  ASSERT_THAT(full.status(), IsOk());
  EXPECT_NEAR(full->ring_compute_s, fast->ring_compute_s, 1e-12);  // rank 7 computes all 8
  EXPECT_GE(full->ring_s, fast->ring_s);
}

// Compression shrinks the wire by the payloads' ratio and leaves the compute alone.
TEST(Ring, CompressionScalesTheWire) {
  const std::string model = R"("context": 4096, "batch": 4, "d": 256, "heads": 8, "layers": 4,
      "attention_gflops": 5)";
  absl::StatusOr<RingPrediction> bf16 = Ring(RingJob(4, 100, model));
  absl::StatusOr<RingPrediction> sub = Ring(RingJob(
      4, 100, model + R"(, "codec": "subspace", "k": 12, "components": 4, "mixture_block": 64)"));
  ASSERT_THAT(bf16.status(), IsOk());
  ASSERT_THAT(sub.status(), IsOk());
  EXPECT_EQ(sub->k, 12);
  EXPECT_NEAR(sub->saved, 1 - sub->forward_bytes / bf16->forward_bytes, 1e-12);
  EXPECT_GT(sub->saved, 0.95);
  EXPECT_NEAR(sub->round_forward_wire_s / bf16->round_forward_wire_s,
              sub->forward_bytes / bf16->forward_bytes, 1e-9);
  EXPECT_EQ(sub->ring_compute_s, bf16->ring_compute_s);
  EXPECT_LT(sub->ring_s, bf16->ring_s);
}

// The rest of the step: given, or 6 x params x tokens at the other rate; plus the dense gradient
// all-reduce, tensor by tensor, as PredictCollective's ring all-reduce.
TEST(Ring, StepAddsOtherComputeAndTheGradientAllReduce) {
  const std::string model = R"("context": 256, "batch": 8, "d": 64, "layers": 2,
      "attention_gflops": 1, "params": 150000, "grad_tensors": 30)";
  absl::StatusOr<RingPrediction> p = Ring(RingJob(4, 100, model + R"(, "other_gflops": 2)", 1));
  ASSERT_THAT(p.status(), IsOk());
  EXPECT_NEAR(p->other_s, 6.0 * 150000 * 8 * 64 / 2e9, 1e-12);
  absl::StatusOr<PlanInput> coll = ParsePlanInput(
      R"({"topology": {"nranks": 4}, "rates": {"efficiency": 1, "default": {"up_mbit": 100,
          "down_mbit": 100, "latency_ms": 1}}, "collective": {"op": "allreduce", "bytes": 20000}})");
  ASSERT_THAT(coll.status(), IsOk());
  absl::StatusOr<CollectivePrediction> one = PredictCollective(*coll);
  ASSERT_THAT(one.status(), IsOk());
  EXPECT_NEAR(p->allreduce_s, 30 * one->seconds, 1e-12);
  EXPECT_NEAR(p->step_s, p->ring_s + p->other_s + p->allreduce_s, 1e-12);
  absl::StatusOr<RingPrediction> given = Ring(RingJob(4, 100, model + R"(, "other_s": 0.25)", 1));
  ASSERT_THAT(given.status(), IsOk());
  EXPECT_EQ(given->other_s, 0.25);
  EXPECT_NEAR(given->ring_s, p->ring_s, 1e-12);
}

// Shared cores: the ranks computing a block in the same round share them. Two ranks, causal,
// one core: both compute their own block at once (twice as long), then rank 1 alone computes
// rank 0's block.
TEST(Ring, SharedCoresSlowTheRoundsWhereRanksComputeTogether) {
  const std::string ring = R"("context": 1024, "batch": 2, "d": 128, "attention_gflops": 10,
      "codec_gelements_s": 1e12)";
  std::string job = RingJob(2, 10000, ring);
  job.insert(job.size() - 1, R"(, "cpu": {"shared_cores": 1})");
  absl::StatusOr<RingPrediction> shared = Ring(job);
  absl::StatusOr<RingPrediction> alone = Ring(RingJob(2, 10000, ring));
  ASSERT_THAT(shared.status(), IsOk());
  ASSERT_THAT(alone.status(), IsOk());
  const double c_f = alone->block_forward_s, c_b = alone->block_backward_s;
  const double hop = alone->round_forward_wire_s + alone->round_latency_s;
  EXPECT_NEAR(alone->forward_s, std::max(c_f, hop) + c_f, 1e-12);
  EXPECT_NEAR(shared->forward_s, std::max(2 * c_f, hop) + c_f, 1e-12);
  EXPECT_NEAR(shared->backward_s, 2 * c_b + c_b + hop, 1e-12);
  EXPECT_NEAR(shared->ring_compute_s, 3 * (c_f + c_b), 1e-12);
  // Both ranks code in every round: their codec work shares the core too.
  EXPECT_DOUBLE_EQ(shared->block_encode_s, 2 * alone->block_encode_s);
  // Not causal on 4 ranks and 2 cores: every round has 4 ranks computing, so twice the compute.
  const std::string full = R"("context": 4096, "d": 128, "causal": false, "attention_gflops": 1,
      "codec_gelements_s": 1e12)";
  std::string job4 = RingJob(4, 10000, full);
  job4.insert(job4.size() - 1, R"(, "cpu": {"shared_cores": 2})");
  absl::StatusOr<RingPrediction> four = Ring(job4);
  absl::StatusOr<RingPrediction> own = Ring(RingJob(4, 10000, full));
  ASSERT_THAT(four.status(), IsOk());
  ASSERT_THAT(own.status(), IsOk());
  EXPECT_NEAR(four->ring_compute_s, 2 * own->ring_compute_s, 1e-12);
  EXPECT_EQ(four->limit, "compute");
}

// A dense all-reduce takes the table's algorithm: up to 64 KiB direct (one round, every rank's
// data to every other), above it the ring (2 (N - 1) steps of a quarter each on 4 ranks).
TEST(PredictCollective, SmallDenseAllReduceIsDirect) {
  auto predict = [](int64_t bytes) {
    return PredictCollective(*ParsePlanInput(
        R"({"topology": {"nranks": 4}, "rates": {"efficiency": 1, "default": {"up_mbit": 100,
            "down_mbit": 100}}, "collective": {"op": "allreduce", "bytes": )" +
        std::to_string(bytes) + "}}"));
  };
  absl::StatusOr<CollectivePrediction> small = predict(65536), large = predict(65540);
  ASSERT_THAT(small.status(), IsOk());
  ASSERT_THAT(large.status(), IsOk());
  EXPECT_EQ(small->algorithm, comm::Algorithm::kDirect);
  EXPECT_EQ(large->algorithm, comm::Algorithm::kRing);
  EXPECT_NEAR(small->wire_s, 3 * 65536 * 8 / 100e6, 1e-3 * small->wire_s);
  EXPECT_NEAR(large->wire_s, 6 * 16385 * 8 / 100e6, 1e-3 * large->wire_s);
  EXPECT_EQ(small->rank0_recv_bytes, 3 * 65536);
}

}  // namespace
}  // namespace lbcc::plan
