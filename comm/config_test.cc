// CommConfig: per setting, the declared default, the environment as the default, an explicit
// field winning over it, and a change of the environment after Init changing nothing; the
// environment check at Init (warnings, strict); every collective's choice through the table.
#include "comm/config.h"

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/scoped_env.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "codecs/topk_ef.h"
#include "comm/communicator.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::comm::testing::RunRanksWithConfig;
using ::lbcc::testing::IsOk;
using ::lbcc::testing::IsOkAndHolds;
using ::lbcc::testing::ScopedEnv;
using ::lbcc::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// Collects WARN lines while alive.
class WarnLines {
 public:
  WarnLines() {
    SetLogSink([this](LogLevel level, absl::string_view, int, absl::string_view message) {
      if (level != LogLevel::kWarn) return;
      MutexLock lock(&mu_);
      lines_.emplace_back(message);
    });
  }
  ~WarnLines() { SetLogSink(nullptr); }
  std::vector<std::string> lines() {
    MutexLock lock(&mu_);
    return lines_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// Every variable a communicator reads at Init starts unset; tests set the ones they need.
class ConfigTest : public ::testing::Test {
 protected:
  ScopedEnv transport_{"LBCC_TRANSPORT", nullptr};
  ScopedEnv listen_{"LBCC_LISTEN_ADDR", nullptr};
  ScopedEnv timeout_{"LBCC_TIMEOUT_S", nullptr};
  ScopedEnv group_{"LBCC_SPARSE_GROUP_ELEMENTS", nullptr};
  ScopedEnv algo_{"LBCC_ALGO", nullptr};
  ScopedEnv strict_{"LBCC_STRICT_ENV", nullptr};
  ScopedEnv slow_ranks_{"LBCC_SLOW_RANKS", nullptr};
  ScopedEnv typo_{"LBCC_TIMOUT_S", nullptr};
  ScopedEnv simd_{"LBCC_SIMD", nullptr};
};

// A one-rank communicator over loopback (unless `config` names a backend).
absl::StatusOr<std::unique_ptr<Communicator>> OneRank(CommConfig config = {}) {
  if (!config.backend.has_value()) config.backend = "loopback";
  LBCC_ASSIGN_OR_RETURN(UniqueId id, CreateUniqueId(config));
  return Communicator::Init(id, 1, 0, std::move(config));
}

CommConfig Loopback() {
  CommConfig config;
  config.backend = "loopback";
  config.timeout = absl::Seconds(60);
  return config;
}

TEST_F(ConfigTest, UnsetFieldsTakeTheDeclaredDefaults) {
  absl::StatusOr<CommConfig> config = ResolveConfig({});
  ASSERT_THAT(config.status(), IsOk());
  EXPECT_EQ(config->backend, "ucx");
  EXPECT_EQ(config->listen_host, "");  // Chosen when the ranks meet (transport/netif.h).
  EXPECT_EQ(config->timeout, absl::Seconds(300));
  EXPECT_EQ(config->sparse_group_elements, int64_t{1} << 20);
  EXPECT_EQ(config->strict_env, false);
  EXPECT_FALSE(config->topology.has_value());
  for (Collective c : kAllCollectives) {
    EXPECT_EQ(config->algorithms[static_cast<int>(c)], Algorithm::kAuto) << CollectiveName(c);
  }
}

TEST_F(ConfigTest, Timeout) {
  timeout_.Set("42");
  EXPECT_THAT(ResolveConfig({}).value().timeout, absl::Seconds(42));
  CommConfig explicit_config;
  explicit_config.timeout = absl::Seconds(7);
  EXPECT_EQ(ResolveConfig(explicit_config).value().timeout, absl::Seconds(7));
  timeout_.Set("abc");  // Not read when the field is set.
  EXPECT_EQ(ResolveConfig(explicit_config).value().timeout, absl::Seconds(7));
  for (const char* bad : {"0", "-3", "abc"}) {
    timeout_.Set(bad);
    EXPECT_THAT(ResolveConfig({}).status(),
                StatusIs(kInvalid, HasSubstr(absl::StrCat("LBCC_TIMEOUT_S='", bad, "'"))));
    EXPECT_THAT(OneRank().status(), StatusIs(kInvalid, HasSubstr("LBCC_TIMEOUT_S"))) << bad;
  }
  for (absl::Duration bad : {absl::ZeroDuration(), absl::Seconds(-1), absl::InfiniteDuration()}) {
    explicit_config.timeout = bad;
    EXPECT_THAT(ResolveConfig(explicit_config).status(),
                StatusIs(kInvalid, HasSubstr("CommConfig.timeout=")));
  }

  timeout_.Set("42");
  absl::StatusOr<std::unique_ptr<Communicator>> comm = OneRank();
  ASSERT_THAT(comm.status(), IsOk());
  timeout_.Set("abc");
  EXPECT_EQ((*comm)->config().timeout, absl::Seconds(42));
  EXPECT_THAT((*comm)->Barrier()->Wait(), IsOk());
  absl::StatusOr<std::unique_ptr<Communicator>> child = (*comm)->Split(0, 0);
  ASSERT_THAT(child.status(), IsOk());
  EXPECT_EQ((*child)->config().timeout, absl::Seconds(42));
}

TEST_F(ConfigTest, Transport) {
  transport_.Set("loopback");
  EXPECT_EQ(ResolveConfig({}).value().backend, "loopback");
  CommConfig explicit_config;
  explicit_config.backend = "ucx";
  EXPECT_EQ(ResolveConfig(explicit_config).value().backend, "ucx");
  transport_.Set("carrier-pigeon");
  EXPECT_THAT(ResolveConfig({}).status(),
              StatusIs(kInvalid, HasSubstr("LBCC_TRANSPORT='carrier-pigeon'")));

  transport_.Set("loopback");
  CommConfig from_env;  // backend unset: LBCC_TRANSPORT.
  absl::StatusOr<UniqueId> id = CreateUniqueId(from_env);
  ASSERT_THAT(id.status(), IsOk());
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::Init(*id, 1, 0, from_env);
  ASSERT_THAT(comm.status(), IsOk());
  transport_.Set("carrier-pigeon");
  EXPECT_EQ((*comm)->config().backend, "loopback");
  absl::StatusOr<std::unique_ptr<Communicator>> child = (*comm)->Split(0, 0);
  ASSERT_THAT(child.status(), IsOk());
  EXPECT_EQ((*child)->config().backend, "loopback");
  EXPECT_THAT((*child)->Barrier()->Wait(), IsOk());
}

// The transport's settings and the job's secret are resolved with the rest: the environment as
// the default, an explicit field winning, a given TransportOptions used as it is.
TEST_F(ConfigTest, TransportSettingsAndTheJobSecret) {
  const std::string hex(64, 'a');
  ScopedEnv secret("LBCC_JOB_SECRET", hex.c_str());
  ScopedEnv encrypt("LBCC_ENCRYPT", "all");
  ScopedEnv peer("LBCC_PEER_TIMEOUT_MS", "2500");
  ScopedEnv chunk("LBCC_SLOW_CHUNK_BYTES", "64K");
  LBCC_ASSERT_OK_AND_ASSIGN(CommConfig from_env, ResolveConfig({}));
  ASSERT_TRUE(from_env.transport.has_value());
  ASSERT_TRUE(from_env.job_secret.has_value());
  EXPECT_EQ(from_env.job_secret->bytes()[0], 0xaa);
  EXPECT_EQ(from_env.transport->security.secret->bytes()[0], 0xaa);
  EXPECT_EQ(from_env.encrypt, transport::EncryptMode::kAll);
  EXPECT_EQ(from_env.peer_timeout, absl::Milliseconds(2500));
  EXPECT_EQ(from_env.transport->scheduler.chunk_bytes, 64 << 10);
  EXPECT_THAT(from_env.DebugString(), AllOf(HasSubstr("job_secret=(set)"), Not(HasSubstr(hex))));

  CommConfig set;
  set.job_secret = *transport::JobSecret::FromHex(std::string(64, 'b'));
  set.encrypt = transport::EncryptMode::kSlow;
  set.peer_timeout = absl::Seconds(4);
  LBCC_ASSERT_OK_AND_ASSIGN(CommConfig resolved, ResolveConfig(set));
  EXPECT_EQ(resolved.transport->security.secret->bytes()[0], 0xbb);
  EXPECT_EQ(resolved.transport->security.encrypt, transport::EncryptMode::kSlow);
  EXPECT_EQ(resolved.transport->peer_timeout, absl::Seconds(4));
  EXPECT_EQ(resolved.transport->scheduler.chunk_bytes, 64 << 10) << "the rest from the environment";

  CommConfig given;
  given.transport = transport::TransportOptions();
  LBCC_ASSERT_OK_AND_ASSIGN(CommConfig as_given, ResolveConfig(given));
  EXPECT_EQ(as_given.transport->scheduler.chunk_bytes, transport::SchedulerOptions().chunk_bytes);
  EXPECT_FALSE(as_given.job_secret.has_value()) << "the environment applies to none of its fields";
  EXPECT_EQ(as_given.encrypt, transport::SecurityOptions().encrypt);

  set.peer_timeout = absl::ZeroDuration();
  EXPECT_THAT(ResolveConfig(set).status(),
              StatusIs(kInvalid, HasSubstr("CommConfig.peer_timeout=0 is invalid")));
  secret.Set("not-hex");
  EXPECT_THAT(ResolveConfig({}).status(), StatusIs(kInvalid, HasSubstr("LBCC_JOB_SECRET")));
}

// Ranks authenticate (bootstrap and links) with the secret their config resolved, not the
// environment's: two with the config's secret meet, a rank with another one is refused.
TEST_F(ConfigTest, TheResolvedSecretIsTheOneTheRanksAuthenticateWith) {
  CommConfig config = Loopback();
  config.backend = "ucx";
  config.listen_host = "127.0.0.1";
  config.timeout = absl::Seconds(20);
  config.job_secret = transport::JobSecret::Random();
  ScopedEnv secret("LBCC_JOB_SECRET", std::string(64, 'c').c_str());
  auto results = RunRanksWithConfig(2, config, [](int, Communicator& comm) {
    return comm.Barrier()->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));

  config.timeout = absl::Seconds(5);
  LBCC_ASSERT_OK_AND_ASSIGN(UniqueId id, CreateUniqueId(config));
  CommConfig stranger = config;
  stranger.job_secret = transport::JobSecret::Random();
  absl::Status member_status, stranger_status;
  std::thread member([&] { member_status = Communicator::Init(id, 2, 0, config).status(); });
  stranger_status = Communicator::Init(id, 2, 1, stranger).status();
  member.join();
  EXPECT_THAT(stranger_status, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(member_status, Not(IsOk()));
}

// Settings are resolved once: after every rank's Init, no operation reads the environment
// (env::ReadCount counts every read through base/env, the only reader in library code).
TEST_F(ConfigTest, NothingReadsTheEnvironmentAfterInit) {
  CommConfig config = Loopback();
  config.backend = "ucx";
  config.listen_host = "127.0.0.1";
  Mutex mu;
  CondVar cv;
  int initialised = 0;
  uint64_t reads_after_init = 0;
  auto results = RunRanksWithConfig(2, config, [&](int rank, Communicator& comm) -> absl::Status {
    {
      MutexLock lock(&mu);  // The last rank out of Init takes the count; nobody reads after.
      if (++initialised == 2) {
        reads_after_init = env::ReadCount();
        cv.SignalAll();
      }
      while (initialised < 2) cv.Wait(&mu);
    }
    std::vector<float> x = {1.0f + rank, 2.0f};
    const TensorView view = *TensorView::Host(x.data(), {2});
    LBCC_RETURN_IF_ERROR(comm.AllReduce(view, view, ReduceOp::kSum)->Wait());
    LBCC_RETURN_IF_ERROR(comm.Broadcast(view, 0)->Wait());
    auto codec = *codecs::TopKEfCodec::Create({});
    std::vector<float> delta(8192, 1.0f + rank), out(8192);
    codecs::TopKEfState state;
    Communicator::SparseTensor tensor{*TensorView::Host(delta.data(), {8192}),
                                      *TensorView::Host(out.data(), {8192}), &state};
    LBCC_RETURN_IF_ERROR(comm.SparseAllReduce({tensor}, codec.get())->Wait());
    codecs::TopKEfState send_state;
    RequestPtr sent = comm.SendCompressed(*TensorView::Host(delta.data(), {8192}), codec.get(),
                                          &send_state, 1 - rank, 7);
    LBCC_RETURN_IF_ERROR(comm.RecvCompressed(*TensorView::Host(out.data(), {8192}), 1 - rank, 7)
                             ->Wait());
    LBCC_RETURN_IF_ERROR(sent->Wait());
    LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> child, comm.Split(0, rank));
    LBCC_RETURN_IF_ERROR(child->Barrier()->Wait());
    LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
  EXPECT_EQ(env::ReadCount(), reads_after_init)
      << "an operation, a split or a communicator's end read the environment";
}

TEST_F(ConfigTest, ListenHost) {
  listen_.Set("10.9.8.7");
  EXPECT_EQ(ResolveConfig({}).value().listen_host, "10.9.8.7");
  CommConfig explicit_config = Loopback();
  explicit_config.listen_host = "127.0.0.1";
  EXPECT_EQ(ResolveConfig(explicit_config).value().listen_host, "127.0.0.1");
  // The bootstrap root listens where the config says, not where the environment does.
  absl::StatusOr<std::unique_ptr<Communicator>> comm = OneRank(explicit_config);
  ASSERT_THAT(comm.status(), IsOk());
  listen_.Set("10.1.1.1");
  EXPECT_EQ((*comm)->config().listen_host, "127.0.0.1");
}

TEST_F(ConfigTest, SparseGroupElements) {
  group_.Set("4096");
  EXPECT_EQ(ResolveConfig({}).value().sparse_group_elements, 4096);
  CommConfig explicit_config;
  explicit_config.sparse_group_elements = 1;
  EXPECT_EQ(ResolveConfig(explicit_config).value().sparse_group_elements, 1);
  explicit_config.sparse_group_elements = 0;
  EXPECT_THAT(ResolveConfig(explicit_config).status(),
              StatusIs(kInvalid, HasSubstr("CommConfig.sparse_group_elements=0")));
  group_.Set("0");
  EXPECT_THAT(ResolveConfig({}).status(),
              StatusIs(kInvalid, HasSubstr("LBCC_SPARSE_GROUP_ELEMENTS='0'")));
  EXPECT_THAT(OneRank().status(), StatusIs(kInvalid, HasSubstr("LBCC_SPARSE_GROUP_ELEMENTS")));

  group_.Set("4096");
  absl::StatusOr<std::unique_ptr<Communicator>> comm = OneRank();
  ASSERT_THAT(comm.status(), IsOk());
  // Read per operation, this value would fail the exchange below.
  group_.Set("0");
  EXPECT_EQ((*comm)->config().sparse_group_elements, 4096);
  auto codec = *codecs::TopKEfCodec::Create({});
  std::vector<float> delta(8192, 1.0f), out(8192);
  codecs::TopKEfState state;
  Communicator::SparseTensor tensor{*TensorView::Host(delta.data(), {8192}),
                                    *TensorView::Host(out.data(), {8192}), &state};
  EXPECT_THAT((*comm)->SparseAllReduce({tensor}, codec.get())->Wait(), IsOk());
}

TEST_F(ConfigTest, Algorithms) {
  auto choice = [](const CommConfig& config, Collective c) {
    return config.algorithms[static_cast<int>(c)];
  };
  algo_.Set("allgatherv=ring");
  CommConfig config = ResolveConfig({}).value();
  EXPECT_EQ(choice(config, Collective::kAllGatherV), Algorithm::kRing);
  EXPECT_EQ(choice(config, Collective::kAllReduce), Algorithm::kAuto);
  // Per collective: the explicit entry wins, the environment fills the others.
  algo_.Set("allgatherv=ring, barrier=ring");
  CommConfig explicit_config;
  explicit_config.SetAlgorithm(Collective::kAllGatherV, Algorithm::kDirect);
  config = ResolveConfig(explicit_config).value();
  EXPECT_EQ(choice(config, Collective::kAllGatherV), Algorithm::kDirect);
  EXPECT_EQ(choice(config, Collective::kBarrier), Algorithm::kRing);
  EXPECT_EQ(choice(config, Collective::kBroadcast), Algorithm::kAuto);

  for (const auto& [bad, why] : std::vector<std::pair<const char*, const char*>>{
           {"allreduce=hierarchical", "allreduce has no hierarchical algorithm"},
           {"allgatherv", "expected collective=algorithm"},
           {"sparse=ring", "unknown collective 'sparse'"},
           {"allgatherv=fast", "unknown algorithm 'fast'"},
           {"allgatherv=ring,allgatherv=direct", "names allgatherv twice"}}) {
    algo_.Set(bad);
    EXPECT_THAT(ResolveConfig({}).status(),
                StatusIs(kInvalid, AllOf(HasSubstr(absl::StrCat("LBCC_ALGO='", bad, "'")),
                                         HasSubstr(why))));
    EXPECT_THAT(OneRank().status(), StatusIs(kInvalid, HasSubstr("LBCC_ALGO"))) << bad;
  }
  algo_.Set(nullptr);
  CommConfig impossible;
  impossible.SetAlgorithm(Collective::kBroadcast, Algorithm::kRing);
  EXPECT_THAT(ResolveConfig(impossible).status(),
              StatusIs(kInvalid, HasSubstr("CommConfig.algorithms: broadcast has no ring")));

  // Two ranks: LBCC_ALGO changed between Init and the operation changes nothing (read per
  // operation: allreduce=ring would replace the table's direct).
  Mutex mu;
  CondVar cv;
  bool changed = false;
  auto results = RunRanksWithConfig(2, Loopback(), [&](int rank, Communicator& comm) {
    LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
    {
      MutexLock lock(&mu);
      if (rank == 0) {
        algo_.Set("allreduce=ring");  // The other rank waits below: nobody reads meanwhile.
        changed = true;
        cv.SignalAll();
      }
      while (!changed) cv.Wait(&mu);
    }
    std::vector<float> x = {1.0f + rank, 2.0f};
    const TensorView view = *TensorView::Host(x.data(), {2});
    LBCC_RETURN_IF_ERROR(comm.AllReduce(view, view, ReduceOp::kSum)->Wait());
    if (x[0] != 3.0f || x[1] != 4.0f) return absl::InternalError("wrong sum");
    LBCC_ASSIGN_OR_RETURN(Algorithm chosen,
                          comm.ChooseAlgorithm(Collective::kAllReduce,
                                               Group{comm.fabric(), comm.global_ranks(), rank}, 8,
                                               Algorithm::kAuto));
    if (chosen != Algorithm::kDirect) return absl::InternalError("not the table's direct");
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST_F(ConfigTest, StrictEnvAndTheEnvironmentCheckAtInit) {
  typo_.Set("2");
  {
    WarnLines warnings;
    EXPECT_THAT(OneRank(Loopback()).status(), IsOk());
    EXPECT_THAT(warnings.lines(),
                Contains(HasSubstr(
                    "LBCC_TIMOUT_S is not an LBCC variable (did you mean LBCC_TIMEOUT_S?)")));
  }
  strict_.Set("1");
  EXPECT_THAT(OneRank(Loopback()).status(),
              StatusIs(kInvalid, AllOf(HasSubstr("LBCC_STRICT_ENV=1"),
                                       HasSubstr("did you mean LBCC_TIMEOUT_S?"))));
  CommConfig lenient = Loopback();
  lenient.strict_env = false;  // Wins over LBCC_STRICT_ENV=1.
  EXPECT_THAT(OneRank(lenient).status(), IsOk());
  EXPECT_EQ(ResolveConfig(lenient).value().strict_env, false);
  strict_.Set("0");
  CommConfig strict = Loopback();
  strict.strict_env = true;  // Wins over LBCC_STRICT_ENV=0.
  EXPECT_THAT(OneRank(strict).status(), StatusIs(kInvalid, HasSubstr("LBCC_TIMOUT_S")));
  strict_.Set("maybe");
  EXPECT_THAT(OneRank(Loopback()).status(), StatusIs(kInvalid, HasSubstr("LBCC_STRICT_ENV='maybe'")));

  // An invalid value of a variable the communicator does not read: a warning, or with strict
  // an error.
  strict_.Set(nullptr);
  typo_.Set(nullptr);
  simd_.Set("avx512");
  {
    WarnLines warnings;
    absl::StatusOr<std::unique_ptr<Communicator>> comm = OneRank(Loopback());
    ASSERT_THAT(comm.status(), IsOk());
    EXPECT_THAT(warnings.lines(), Contains(HasSubstr("LBCC_SIMD='avx512' is invalid")));
    // After Init nothing checks again: a child of a lenient communicator stays lenient.
    strict_.Set("1");
    EXPECT_THAT((*comm)->Split(0, 0).status(), IsOk());
  }
  EXPECT_THAT(OneRank(Loopback()).status(), StatusIs(kInvalid, HasSubstr("LBCC_SIMD='avx512'")));
}

TEST_F(ConfigTest, Topology) {
  slow_ranks_.Set("1");
  std::vector<LinkClass> links(2);
  CommConfig derived = Loopback();
  auto results = RunRanksWithConfig(2, derived, [&](int rank, Communicator& comm) {
    links[rank] = comm.topology().link(0, 1);
    return absl::OkStatus();
  });
  ASSERT_THAT(results, Each(IsOk()));
  EXPECT_THAT(links, Each(LinkClass::kSlow));
  CommConfig given = Loopback();
  given.topology = *Topology::FromJson(R"({"nranks": 2, "islands": [[0, 1]]})");  // Wins.
  results = RunRanksWithConfig(2, given, [&](int rank, Communicator& comm) {
    links[rank] = comm.topology().link(0, 1);
    return absl::OkStatus();
  });
  ASSERT_THAT(results, Each(IsOk()));
  EXPECT_THAT(links, Each(LinkClass::kFast));
}

TEST_F(ConfigTest, CreateUniqueIdHonoursTheTimeout) {
  timeout_.Set("0");
  EXPECT_THAT(CreateUniqueId(CommConfig()).status(),
              StatusIs(kInvalid, HasSubstr("LBCC_TIMEOUT_S='0'")));
  CommConfig explicit_config;
  explicit_config.timeout = absl::Seconds(5);
  EXPECT_THAT(CreateUniqueId(explicit_config).status(), IsOk());
  explicit_config.timeout = absl::ZeroDuration();
  EXPECT_THAT(CreateUniqueId(explicit_config).status(),
              StatusIs(kInvalid, HasSubstr("CreateUniqueId: timeout=0")));
}

TEST_F(ConfigTest, SplitChildrenInheritTheConfig) {
  CommConfig config = Loopback();
  config.timeout = absl::Seconds(7);
  config.sparse_group_elements = 4096;
  config.SetAlgorithm(Collective::kAllGatherV, Algorithm::kRing);
  auto results = RunRanksWithConfig(3, config, [](int rank, Communicator& comm) -> absl::Status {
    LBCC_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> child, comm.Split(rank % 2, rank));
    if (child->config().DebugString() != comm.config().DebugString()) {
      return absl::InternalError(absl::StrCat("child ", child->config().DebugString(),
                                              " parent ", comm.config().DebugString()));
    }
    return child->Barrier()->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

// Ranks 0 and 1 share a fast island; 2 and 3 are alone behind slow links.
Topology Hetero4() { return *Topology::FromJson(R"({"nranks": 4, "islands": [[0, 1]]})"); }

TEST_F(ConfigTest, EveryCollectiveAsksTheTableWithTheConfigsChoice) {
  // AllGather runs what the config names: hierarchical brings each payload into each island
  // once (8 payloads over slow links in all), direct sends 10 (see communicator_test).
  constexpr size_t kSize = 1 << 20;
  std::map<Algorithm, double> slow_payloads;
  for (Algorithm algorithm : {Algorithm::kHierarchical, Algorithm::kDirect}) {
    CommConfig config = Loopback();
    config.topology = Hetero4();
    config.SetAlgorithm(Collective::kAllGather, algorithm);
    Mutex mu;
    uint64_t slow_received = 0;
    auto results = RunRanksWithConfig(4, config, [&](int rank, Communicator& comm) {
      std::vector<uint8_t> in(kSize, static_cast<uint8_t>(rank)), out(4 * kSize);
      LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
      const uint64_t before = comm.fabric()->BytesByClass().slow_received;
      LBCC_ASSIGN_OR_RETURN(TensorView in_view,
                            TensorView::Create(in.data(), DType::kU8, {int64_t{kSize}}));
      LBCC_ASSIGN_OR_RETURN(TensorView out_view,
                            TensorView::Create(out.data(), DType::kU8, {int64_t{4 * kSize}}));
      LBCC_RETURN_IF_ERROR(comm.AllGather(in_view, out_view)->Wait());
      const uint64_t after = comm.fabric()->BytesByClass().slow_received;
      for (int r = 0; r < 4; ++r) {
        if (out[r * kSize] != r || out[r * kSize + kSize - 1] != r) {
          return absl::InternalError("wrong all-gather");
        }
      }
      MutexLock lock(&mu);
      slow_received += after - before;
      return absl::OkStatus();
    });
    ASSERT_THAT(results, Each(IsOk())) << AlgorithmName(algorithm);
    slow_payloads[algorithm] = static_cast<double>(slow_received) / kSize;
  }
  EXPECT_NEAR(slow_payloads[Algorithm::kHierarchical], 8, 0.04);
  EXPECT_NEAR(slow_payloads[Algorithm::kDirect], 10, 0.04);

  // Every collective: the operation's request wins over the config, the config over the table.
  CommConfig config = Loopback();
  config.topology = Hetero4();
  config.SetAlgorithm(Collective::kAllGatherV, Algorithm::kRing)
      .SetAlgorithm(Collective::kBarrier, Algorithm::kRing)
      .SetAlgorithm(Collective::kAllGather, Algorithm::kDirect);
  auto results = RunRanksWithConfig(4, config, [](int rank, Communicator& comm) -> absl::Status {
    const Group group{comm.fabric(), comm.global_ranks(), rank};
    struct Case {
      Collective collective;
      Algorithm requested, expected;
    };
    for (const Case& c : {Case{Collective::kAllGatherV, Algorithm::kAuto, Algorithm::kRing},
                          Case{Collective::kAllGatherV, Algorithm::kDirect, Algorithm::kDirect},
                          Case{Collective::kBarrier, Algorithm::kAuto, Algorithm::kRing},
                          Case{Collective::kAllGather, Algorithm::kAuto, Algorithm::kDirect},
                          Case{Collective::kAllGather, Algorithm::kHierarchical,
                               Algorithm::kHierarchical},
                          Case{Collective::kAllReduce, Algorithm::kAuto, Algorithm::kDirect},
                          Case{Collective::kBroadcast, Algorithm::kAuto, Algorithm::kDirect}}) {
      LBCC_ASSIGN_OR_RETURN(Algorithm chosen,
                            comm.ChooseAlgorithm(c.collective, group, 1000, c.requested));
      if (chosen != c.expected) {
        return absl::InternalError(absl::StrCat(CollectiveName(c.collective), " chose ",
                                                AlgorithmName(chosen)));
      }
    }
    OpOptions ring;
    ring.algorithm = Algorithm::kRing;
    int32_t value = rank == 2 ? 77 : -1;
    LBCC_ASSIGN_OR_RETURN(TensorView value_view, TensorView::Create(&value, DType::kI32, {1}));
    if (comm.Broadcast(value_view, 0, ring)->Wait().code() != absl::StatusCode::kInvalidArgument) {
      return absl::InternalError("broadcast ran a ring it does not have");
    }
    // Each collective runs with the config's algorithm.
    LBCC_RETURN_IF_ERROR(comm.Barrier()->Wait());
    const std::string mine(100 + rank, static_cast<char>('a' + rank));
    std::vector<std::string> all;
    LBCC_RETURN_IF_ERROR(comm.AllGatherV(&mine, &all)->Wait());
    for (int r = 0; r < 4; ++r) {
      if (all[r] != std::string(100 + r, static_cast<char>('a' + r))) {
        return absl::InternalError("wrong all-gather-v");
      }
    }
    LBCC_RETURN_IF_ERROR(comm.Broadcast(value_view, 2)->Wait());
    if (value != 77) return absl::InternalError("wrong broadcast");
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

}  // namespace
}  // namespace lbcc::comm
