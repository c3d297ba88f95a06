// The C API: argument checks, error strings and last-error messages, and collectives over two
// ranks as threads.
#include "comm/lbcc.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "codecs/subspace_basis.h"
#include "codecs/subspace_training.h"
#include "base/tensor_view.h"
#include "base/scoped_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

lbccConfig_t LoopbackConfig() {
  lbccConfig_t config = LBCC_CONFIG_INITIALIZER;
  config.transport = "loopback";
  config.timeoutSeconds = 30;
  return config;
}

TEST(CApiTest, NullPointersAndBadArguments) {
  EXPECT_EQ(lbccGetVersion(nullptr), lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("version is NULL"));
  int version = 0;
  EXPECT_EQ(lbccGetVersion(&version), lbccSuccess);
  EXPECT_EQ(version, LBCC_VERSION_CODE);
  EXPECT_EQ(lbccGetUniqueId(nullptr), lbccInvalidArgument);
  EXPECT_EQ(lbccCommDestroy(nullptr), lbccInvalidArgument);
  EXPECT_EQ(lbccTest(nullptr), lbccInvalidArgument);
  EXPECT_EQ(lbccWait(nullptr), lbccInvalidArgument);
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  lbccComm_t comm = nullptr;
  lbccConfig_t bad = LoopbackConfig();
  bad.size = 3;
  EXPECT_EQ(lbccCommInitRank(&comm, 1, id, 0, &bad), lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("LBCC_CONFIG_INITIALIZER"));
  EXPECT_EQ(comm, nullptr);
  lbccConfig_t config = LoopbackConfig();
  EXPECT_EQ(lbccCommInitRank(&comm, 1, id, 3, &config), lbccInvalidArgument);
  EXPECT_STRNE(lbccGetErrorString(lbccTimeout), lbccGetErrorString(lbccDataLoss));
}

TEST(CApiTest, SingleRankCollectivesAndErrors) {
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  lbccComm_t comm = nullptr;
  lbccConfig_t config = LoopbackConfig();
  ASSERT_EQ(lbccCommInitRank(&comm, 1, id, 0, &config), lbccSuccess);
  int count = 0, rank = -1;
  EXPECT_EQ(lbccCommCount(comm, &count), lbccSuccess);
  EXPECT_EQ(lbccCommUserRank(comm, &rank), lbccSuccess);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(rank, 0);
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  lbccRequest_t request = nullptr;
  EXPECT_EQ(lbccAllReduce(x, y, 4, static_cast<lbccDataType_t>(42), lbccSum, comm, &request),
            lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(comm), HasSubstr("lbccDataType_t 42"));
  EXPECT_EQ(lbccAllReduce(nullptr, y, 4, lbccFloat32, lbccSum, comm, &request),
            lbccInvalidArgument);
  EXPECT_EQ(lbccAllReduce(x, y, 4, lbccInt32, lbccSum, comm, &request), lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(comm), HasSubstr("not f32, f16 or bf16"));
  ASSERT_EQ(lbccAllReduce(x, y, 4, lbccFloat32, lbccSum, comm, &request), lbccSuccess);
  EXPECT_EQ(lbccWait(request), lbccSuccess);
  EXPECT_EQ(lbccTest(request), lbccSuccess);
  EXPECT_EQ(lbccRequestFree(request), lbccSuccess);
  EXPECT_EQ(y[3], 4.0f);
  EXPECT_EQ(lbccCommDestroy(comm), lbccSuccess);
}

// ---- Configuration ----
// Every bad field fails init with lbccInvalidArgument naming it; an explicit field wins over
// its environment variable.
TEST(CApiConfigTest, BadFieldsAreNamed) {
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  struct Case {
    void (*edit)(lbccConfig_t*);
    const char* message;
  };
  const Case cases[] = {
      {[](lbccConfig_t* c) { c->magic = 0; }, "lbccConfig_t.magic"},
      {[](lbccConfig_t* c) { c->version = LBCC_VERSION_CODE + 1; }, "lbccConfig_t.version"},
      {[](lbccConfig_t* c) { c->timeoutSeconds = 0; }, "lbccConfig_t.timeoutSeconds=0"},
      {[](lbccConfig_t* c) { c->timeoutSeconds = -2; }, "lbccConfig_t.timeoutSeconds=-2"},
      {[](lbccConfig_t* c) { c->algorithms = "allreduce=hierarchical"; },
       "allreduce has no hierarchical algorithm"},
      {[](lbccConfig_t* c) { c->algorithms = "allreduce"; }, "lbccConfig_t.algorithms='allreduce'"},
      {[](lbccConfig_t* c) { c->sparseGroupElements = 0; }, "sparse_group_elements=0"},
      {[](lbccConfig_t* c) { c->strictEnv = 2; }, "lbccConfig_t.strictEnv=2"},
      {[](lbccConfig_t* c) { c->jobSecret = "xyz"; }, "lbccConfig_t.jobSecret: "},
      {[](lbccConfig_t* c) { c->jobSecretFile = "/nonexistent/secret"; },
       "lbccConfig_t.jobSecretFile: "},
      {[](lbccConfig_t* c) {
         c->jobSecret = "00";
         c->jobSecretFile = "/nonexistent/secret";
       },
       "set jobSecret or jobSecretFile, not both"},
      {[](lbccConfig_t* c) { c->encrypt = "maybe"; }, "lbccConfig_t.encrypt: "},
      {[](lbccConfig_t* c) { c->peerTimeoutSeconds = 0; }, "lbccConfig_t.peerTimeoutSeconds=0"},
  };
  for (const Case& c : cases) {
    lbccConfig_t config = LoopbackConfig();
    c.edit(&config);
    lbccComm_t comm = nullptr;
    EXPECT_EQ(lbccCommInitRankConfig(&comm, 1, id, 0, &config), lbccInvalidArgument) << c.message;
    EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr(c.message));
    EXPECT_EQ(comm, nullptr);
  }
}

TEST(CApiConfigTest, ExplicitFieldsWinOverTheEnvironment) {
  lbcc::testing::ScopedEnv algo("LBCC_ALGO", "allreduce=hierarchical");
  lbcc::testing::ScopedEnv group("LBCC_SPARSE_GROUP_ELEMENTS", "0");
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  lbccConfig_t config = LoopbackConfig();
  lbccComm_t comm = nullptr;
  EXPECT_EQ(lbccCommInitRankConfig(&comm, 1, id, 0, &config), lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("LBCC_SPARSE_GROUP_ELEMENTS='0'"));
  config.sparseGroupElements = 4096;
  EXPECT_EQ(lbccCommInitRankConfig(&comm, 1, id, 0, &config), lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("LBCC_ALGO='allreduce=hierarchical'"));
  config.algorithms = "allreduce=ring";
  ASSERT_EQ(lbccCommInitRankConfig(&comm, 1, id, 0, &config), lbccSuccess);
  float x[2] = {1, 2};
  lbccRequest_t request = nullptr;
  ASSERT_EQ(lbccAllReduce(x, x, 2, lbccFloat32, lbccSum, comm, &request), lbccSuccess);
  EXPECT_EQ(lbccWait(request), lbccSuccess);
  EXPECT_EQ(lbccRequestFree(request), lbccSuccess);
  EXPECT_EQ(lbccCommDestroy(comm), lbccSuccess);
}

// The job secret set in the config (not the environment's) is the one the root and the ranks
// authenticate with; a struct of the older size (before jobSecret) is still accepted.
TEST(CApiConfigTest, TheConfigsJobSecretWinsAndAnOlderStructStillWorks) {
  const std::string env_secret(64, 'c');
  lbcc::testing::ScopedEnv secret("LBCC_JOB_SECRET", env_secret.c_str());
  lbccConfig_t config = LoopbackConfig();
  const std::string mine(64, 'a');
  config.jobSecret = mine.c_str();
  config.encrypt = "all";
  config.peerTimeoutSeconds = 5;
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueIdConfig(&id, &config), lbccSuccess) << lbccGetLastError(nullptr);
  lbccResult_t results[2] = {lbccInternalError, lbccInternalError};
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      lbccComm_t comm = nullptr;
      results[rank] = lbccCommInitRankConfig(&comm, 2, id, rank, &config);
      if (results[rank] != lbccSuccess) return;
      lbccRequest_t request = nullptr;
      results[rank] = lbccBarrier(comm, &request);
      if (results[rank] == lbccSuccess) results[rank] = lbccWait(request);
      if (request != nullptr) lbccRequestFree(request);
      lbccCommDestroy(comm);
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(results[0], lbccSuccess);
  EXPECT_EQ(results[1], lbccSuccess);

  lbcc::testing::ScopedEnv no_secret("LBCC_JOB_SECRET", nullptr);
  lbccConfig_t older = LoopbackConfig();
  older.size = LBCC_CONFIG_SIZE_V1;
  older.jobSecret = "not read: past the older struct's end";
  ASSERT_EQ(lbccGetUniqueIdConfig(&id, &older), lbccSuccess) << lbccGetLastError(nullptr);
  lbccComm_t comm = nullptr;
  ASSERT_EQ(lbccCommInitRankConfig(&comm, 1, id, 0, &older), lbccSuccess)
      << lbccGetLastError(nullptr);
  EXPECT_EQ(lbccCommDestroy(comm), lbccSuccess);
}

TEST(CApiConfigTest, GetUniqueIdHonoursTheTimeoutVariable) {
  lbcc::testing::ScopedEnv timeout("LBCC_TIMEOUT_S", "0");
  lbccUniqueId id;
  EXPECT_EQ(lbccGetUniqueId(&id), lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("LBCC_TIMEOUT_S='0'"));
}
// ---- end of Configuration ----

lbccResult_t Barrier(lbccComm_t comm) {
  lbccRequest_t request = nullptr;
  lbccResult_t rc = lbccBarrier(comm, &request);
  if (rc == lbccSuccess) rc = lbccWait(request);
  if (request) lbccRequestFree(request);
  return rc;
}

TEST(CApiTest, TwoRanksAllReduceAndSparseAllReduce) {
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  std::vector<lbccResult_t> results(2, lbccInternalError);
  std::vector<std::vector<float>> outs(2, std::vector<float>(64 * 64));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      lbccConfig_t config = LoopbackConfig();
      lbccComm_t comm = nullptr;
      lbccResult_t rc = lbccCommInitRank(&comm, 2, id, r, &config);
      if (rc != lbccSuccess) {
        results[r] = rc;
        return;
      }
      float value = static_cast<float>(r + 1);
      lbccRequest_t req = nullptr;
      rc = lbccAllReduce(&value, &value, 1, lbccFloat32, lbccAvg, comm, &req);
      if (rc == lbccSuccess) rc = lbccWait(req);
      if (req) lbccRequestFree(req);
      if (rc == lbccSuccess && value != 1.5f) rc = lbccInternalError;
      // SparseLoCo on one 64x64 tensor: rank r's delta is r+1 everywhere.
      std::vector<float> delta(64 * 64, static_cast<float>(r + 1));
      const float* deltas[1] = {delta.data()};
      float* out_ptrs[1] = {outs[r].data()};
      const int ranks[1] = {2};
      const int64_t dims0[2] = {64, 64};
      const int64_t* dims[1] = {dims0};
      lbccTopKState_t state = nullptr;
      lbccTopKStateCreate(&state);
      lbccTopKConfig_t topk = LBCC_TOPK_CONFIG_INITIALIZER;
      topk.values = lbccValuesFp32;
      req = nullptr;
      if (rc == lbccSuccess) {
        rc = lbccSparseAllReduce(1, deltas, out_ptrs, ranks, dims, &state, &topk, lbccAggSum,
                                 comm, &req);
      }
      if (rc == lbccSuccess) rc = lbccWait(req);
      if (req) lbccRequestFree(req);
      lbccTopKStateDestroy(state);
      // A compressed boundary: rank 0 sends a 2x3 tensor as bf16; rank 1 receives it, then a
      // receive with the wrong shape fails without touching its buffer. That payload has
      // arrived before the receive is posted (it precedes the barrier on the same path), so the
      // receive is refused at once: still reported by lbccWait, not by the posting call, which
      // only reports bad arguments.
      const int64_t shape[2] = {2, 3};
      lbccDenseConfig_t dense = LBCC_DENSE_CONFIG_INITIALIZER;
      dense.format = lbccDenseBf16;
      float boundary[6] = {0.5f, -1.0f, 2.0f, 3.0f, -4.0f, 8.0f};
      if (rc == lbccSuccess) {
        lbccRequest_t a = nullptr, b = nullptr;
        if (r == 0) {
          rc = lbccSendCompressed(boundary, 2, shape, &dense, 1, 9, comm, &a);
          if (rc == lbccSuccess) rc = lbccWait(a);
          if (rc == lbccSuccess) rc = lbccSendCompressed(boundary, 2, shape, &dense, 1, 10, comm, &b);
          if (rc == lbccSuccess) rc = lbccWait(b);
          if (rc == lbccSuccess) rc = Barrier(comm);
        } else {
          float got[6] = {};
          rc = lbccRecvCompressed(got, 2, shape, 0, 9, comm, &a);
          if (rc == lbccSuccess) rc = lbccWait(a);
          if (rc == lbccSuccess && std::memcmp(got, boundary, sizeof(got)) != 0) rc = lbccInternalError;
          const int64_t wrong[1] = {6};
          float untouched[6] = {7, 7, 7, 7, 7, 7};
          if (rc == lbccSuccess) rc = Barrier(comm);
          if (rc == lbccSuccess) rc = lbccRecvCompressed(untouched, 1, wrong, 0, 10, comm, &b);
          if (rc == lbccSuccess) {
            rc = lbccWait(b) == lbccInvalidArgument && untouched[3] == 7.0f ? lbccSuccess
                                                                              : lbccInternalError;
          }
        }
        if (a) lbccRequestFree(a);
        if (b) lbccRequestFree(b);
      }
      lbccCommDestroy(comm);
      results[r] = rc;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[0], lbccSuccess) << lbccGetErrorString(results[0]);
  EXPECT_EQ(results[1], lbccSuccess) << lbccGetErrorString(results[1]);
  EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4), 0);
  // Sum aggregation of two replicas that both keep 64 of each 4096: coordinates selected by
  // both hold 3 = 1 + 2, by one of them 1 or 2, by none 0; the total mass is bounded below.
  double total = 0;
  for (float v : outs[0]) total += v;
  EXPECT_GT(total, 64 * 1.0);
}

// ---- Pipeline activations ----

lbccBasisSpec_t SmallSpec(uint32_t version = 0) {
  lbccBasisSpec_t spec = LBCC_BASIS_SPEC_INITIALIZER;
  spec.modelDim = 16;
  spec.rank = 4;
  spec.vocabSize = 10;
  spec.withTable = 1;
  spec.seed = 3;
  spec.version = version;
  return spec;
}

TEST(CApiTest, BasisHandlesAndActivationArguments) {
  lbccBasis_t basis = nullptr;
  EXPECT_EQ(lbccBasisCreateFromSeed(nullptr, &basis), lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("spec is NULL"));
  lbccBasisSpec_t spec = SmallSpec();
  EXPECT_EQ(lbccBasisCreateFromSeed(&spec, nullptr), lbccInvalidArgument);
  spec.size = 1;
  EXPECT_EQ(lbccBasisCreateFromSeed(&spec, &basis), lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("LBCC_BASIS_SPEC_INITIALIZER"));
  spec = SmallSpec();
  spec.rank = 17;  // k > d
  EXPECT_EQ(lbccBasisCreateFromSeed(&spec, &basis), lbccInvalidArgument);
  EXPECT_EQ(basis, nullptr);
  EXPECT_EQ(lbccBasisLoad("/nonexistent/basis", &basis), lbccInvalidArgument);  // NotFound
  EXPECT_EQ(lbccBasisDestroy(nullptr), lbccInvalidArgument);

  // A mixture basis file: the C API carries no selectors, so it refuses it.
  lbcc::codecs::SubspaceSeedSpec mixture;
  mixture.model_dim = 16;
  mixture.rank = 4;
  mixture.components = 2;
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/mixture.lbccb";
  ASSERT_TRUE((*lbcc::codecs::SubspaceBasis::FromSeed(mixture))->Save(path).ok());
  EXPECT_EQ(lbccBasisLoad(path.c_str(), &basis), lbccUnimplemented);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("mixture basis (M = 2)"));

  spec = SmallSpec();
  ASSERT_EQ(lbccBasisCreateFromSeed(&spec, &basis), lbccSuccess);
  int64_t d = 0, k = 0, v = 0;
  uint32_t version = 9;
  EXPECT_EQ(lbccBasisGetInfo(basis, &d, &k, &v, nullptr, &version), lbccSuccess);
  EXPECT_EQ(d, 16);
  EXPECT_EQ(k, 4);
  EXPECT_EQ(v, 10);
  EXPECT_EQ(version, 0u);

  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  lbccConfig_t config = LoopbackConfig();
  lbccComm_t comm = nullptr;
  ASSERT_EQ(lbccCommInitRank(&comm, 1, id, 0, &config), lbccSuccess);
  std::vector<float> h(3 * 16);
  int32_t ids[3] = {1, 2, 3};
  lbccRequest_t request = nullptr;
  EXPECT_EQ(lbccSendActivations(h.data(), ids, 3, nullptr, nullptr, 0, 0, comm, &request),
            lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("basis is NULL"));
  EXPECT_EQ(lbccSendActivations(h.data(), nullptr, 3, basis, nullptr, 1, 0, comm, &request),
            lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(comm), HasSubstr("ids is NULL"));
  EXPECT_EQ(lbccSendActivations(nullptr, ids, 3, basis, nullptr, 1, 0, comm, &request),
            lbccInvalidArgument);
  EXPECT_EQ(lbccSendActivations(h.data(), ids, -1, basis, nullptr, 1, 0, comm, &request),
            lbccInvalidArgument);
  lbccActivationConfig_t coding = LBCC_ACTIVATION_CONFIG_INITIALIZER;
  coding.coefficients = lbccInt32;
  EXPECT_EQ(lbccSendActivations(h.data(), ids, 3, basis, &coding, 1, 0, comm, &request),
            lbccInvalidArgument);
  coding.size = 0;
  EXPECT_EQ(lbccSendActivationGrads(h.data(), 3, basis, &coding, 1, 0, comm, &request),
            lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(comm), HasSubstr("LBCC_ACTIVATION_CONFIG_INITIALIZER"));
  // One rank: no peer to talk to.
  EXPECT_EQ(lbccSendActivationGrads(h.data(), 3, basis, nullptr, 0, 0, comm, &request),
            lbccInvalidArgument);
  lbccBasis_t bases[2] = {basis, nullptr};
  EXPECT_EQ(lbccRecvActivations(h.data(), ids, 3, nullptr, 1, 0, 0, comm, &request),
            lbccInvalidArgument);
  EXPECT_EQ(lbccRecvActivations(h.data(), ids, 3, bases, 0, 0, 0, comm, &request),
            lbccInvalidArgument);
  EXPECT_EQ(lbccRecvActivationGrads(h.data(), 3, bases, 2, 0, 0, comm, &request),
            lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(comm), HasSubstr("bases[1] is NULL"));
  EXPECT_EQ(request, nullptr);
  EXPECT_EQ(lbccCommDestroy(comm), lbccSuccess);
  EXPECT_EQ(lbccBasisDestroy(basis), lbccSuccess);
}

// Two stages: a forward with v0, a basis change to v1 on both sides, the backward of the v0
// forward (accepted with the previous basis kept), and a receiver that knows only v1 refusing
// a v0 payload with lbccInvalidUsage and an untouched buffer.
TEST(CApiTest, TwoStagesActivationsAcrossABasisChange) {
  lbccBasisSpec_t spec0 = SmallSpec(0), spec1 = SmallSpec(1);
  lbccBasis_t v0 = nullptr, v1 = nullptr;
  ASSERT_EQ(lbccBasisCreateFromSeed(&spec0, &v0), lbccSuccess);
  ASSERT_EQ(lbccBasisCreateFromSeed(&spec1, &v1), lbccSuccess);
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  constexpr int64_t kTokens = 5, kD = 16;
  std::vector<lbccResult_t> results(2, lbccInternalError);
  std::vector<std::string> errors(2);
  std::vector<float> received(kTokens * kD), grads(kTokens * kD, -1.0f);
  std::vector<float> refused(kTokens * kD, 7.0f);
  std::vector<int32_t> ids(kTokens, -1);
  const int32_t sent_ids[kTokens] = {0, 9, 4, 4, 1};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      lbccConfig_t config = LoopbackConfig();
      lbccComm_t comm = nullptr;
      lbccResult_t rc = lbccCommInitRank(&comm, 2, id, r, &config);
      auto step = [&](lbccResult_t posted, lbccRequest_t* request) {
        if (rc != lbccSuccess) return;
        rc = posted == lbccSuccess ? lbccWait(*request) : posted;
        if (*request != nullptr) lbccRequestFree(*request);
        *request = nullptr;
      };
      lbccRequest_t request = nullptr;
      lbccActivationConfig_t coding = LBCC_ACTIVATION_CONFIG_INITIALIZER;
      coding.coefficients = lbccFloat32;
      std::vector<float> h(kTokens * kD);
      for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i % 7) - 3.0f;
      lbccBasis_t both[2] = {v1, v0};
      if (r == 0) {
        step(lbccSendActivations(h.data(), sent_ids, kTokens, v0, &coding, 1, 2, comm, &request),
             &request);
        step(lbccRecvActivationGrads(grads.data(), kTokens, both, 2, 1, 2, comm, &request),
             &request);
        step(lbccSendActivations(h.data(), sent_ids, kTokens, v0, &coding, 1, 2, comm, &request),
             &request);
      } else {
        step(lbccRecvActivations(received.data(), ids.data(), kTokens, &v0, 1, 0, 2, comm,
                                 &request),
             &request);
        step(lbccSendActivationGrads(h.data(), kTokens, v0, &coding, 0, 2, comm, &request),
             &request);
        if (rc == lbccSuccess) {
          rc = lbccRecvActivations(refused.data(), nullptr, kTokens, &v1, 1, 0, 2, comm, &request);
          if (rc == lbccSuccess) rc = lbccWait(request);
          if (request != nullptr) lbccRequestFree(request);
          if (rc == lbccInvalidUsage) errors[r] = lbccGetLastError(comm);
          rc = rc == lbccInvalidUsage ? lbccSuccess : lbccInternalError;
        }
      }
      if (rc != lbccSuccess) errors[r] = lbccGetLastError(comm);
      if (comm != nullptr) lbccCommDestroy(comm);
      results[r] = rc;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[0], lbccSuccess) << errors[0];
  EXPECT_EQ(results[1], lbccSuccess) << errors[1];
  EXPECT_EQ(std::vector<int32_t>(sent_ids, sent_ids + kTokens), ids);
  EXPECT_NE(grads[0], -1.0f);
  uint64_t hash0 = 0, hash1 = 0;
  lbccBasisGetInfo(v0, nullptr, nullptr, nullptr, &hash0, nullptr);
  lbccBasisGetInfo(v1, nullptr, nullptr, nullptr, &hash1, nullptr);
  char name0[32], name1[32];
  std::snprintf(name0, sizeof(name0), "%016llx/v0", static_cast<unsigned long long>(hash0));
  std::snprintf(name1, sizeof(name1), "%016llx/v1", static_cast<unsigned long long>(hash1));
  EXPECT_THAT(errors[1], HasSubstr(name0));
  EXPECT_THAT(errors[1], HasSubstr(name1));
  EXPECT_EQ(refused, std::vector<float>(kTokens * kD, 7.0f));
  lbccBasisDestroy(v0);
  lbccBasisDestroy(v1);
}


// ---- The lossy boundary: table refresh and table updates ----

TEST(CApiTest, BasisRefreshTableBothModes) {
  lbccBasisSpec_t spec = SmallSpec(2);
  lbccBasis_t basis = nullptr, next = nullptr, again = nullptr;
  ASSERT_EQ(lbccBasisCreateFromSeed(&spec, &basis), lbccSuccess);
  std::vector<float> e(10 * 16);
  for (size_t i = 0; i < e.size(); ++i) e[i] = static_cast<float>(i % 13) * 0.25f - 1.0f;
  const std::vector<float> e0 = e;
  EXPECT_EQ(lbccBasisRefreshTable(nullptr, e.data(), LBCC_TABLE_LOSSY, &next),
            lbccInvalidArgument);
  EXPECT_EQ(lbccBasisRefreshTable(basis, e.data(), LBCC_TABLE_LOSSY, nullptr),
            lbccInvalidArgument);
  EXPECT_EQ(lbccBasisRefreshTable(basis, nullptr, LBCC_TABLE_LOSSY, &next), lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("embedding is NULL"));
  EXPECT_EQ(lbccBasisRefreshTable(basis, e.data(), static_cast<lbccTableRefreshMode_t>(7), &next),
            lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("lbccTableRefreshMode_t 7"));
  EXPECT_EQ(next, nullptr);

  // Lossy: version + 1, the table is the embedding, the embedding untouched; equal inputs give
  // equal ids.
  ASSERT_EQ(lbccBasisRefreshTable(basis, e.data(), LBCC_TABLE_LOSSY, &next), lbccSuccess);
  ASSERT_EQ(lbccBasisRefreshTable(basis, e.data(), LBCC_TABLE_LOSSY, &again), lbccSuccess);
  uint64_t hash0 = 0, hash1 = 0, hash2 = 0;
  uint32_t version1 = 0, version2 = 0;
  lbccBasisGetInfo(basis, nullptr, nullptr, nullptr, &hash0, nullptr);
  lbccBasisGetInfo(next, nullptr, nullptr, nullptr, &hash1, &version1);
  lbccBasisGetInfo(again, nullptr, nullptr, nullptr, &hash2, &version2);
  EXPECT_EQ(version1, 3u);
  EXPECT_EQ(version2, 3u);
  EXPECT_EQ(hash1, hash2);
  EXPECT_NE(hash1, hash0);
  EXPECT_EQ(std::memcmp(e.data(), e0.data(), e.size() * sizeof(float)), 0);
  auto lossy = lbcc::codecs::SubspaceBasis::FromSeed({16, 4, 1, 10, true, 1.0, 3, 2});
  ASSERT_TRUE(lossy.ok());
  auto expected = (*lossy)->WithTable(e0, 3);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(hash1, (*expected)->id().hash);
  lbccBasisDestroy(again);

  // Constrained: the embedding shift (in place), the same id as the C++ one.
  std::vector<float> shifted_cpp = e0;
  auto shifted = lbcc::codecs::ShiftEmbedding(
      **lossy, *lbcc::TensorView::Host(shifted_cpp.data(), {10, 16}),
      lbcc::codecs::SubspaceArithmetic::kPortable);
  ASSERT_TRUE(shifted.ok());
  ASSERT_EQ(lbccBasisRefreshTable(basis, e.data(), LBCC_TABLE_CONSTRAINED, &again), lbccSuccess);
  lbccBasisGetInfo(again, nullptr, nullptr, nullptr, &hash2, &version2);
  EXPECT_EQ(hash2, (*shifted)->id().hash);
  EXPECT_EQ(version2, 3u);
  EXPECT_EQ(e, shifted_cpp);
  lbccBasisDestroy(again);
  lbccBasisDestroy(next);

  // No vocabulary: the table has nothing to index (lbccInvalidUsage).
  spec.vocabSize = 0;
  spec.withTable = 0;
  lbccBasis_t no_vocab = nullptr;
  ASSERT_EQ(lbccBasisCreateFromSeed(&spec, &no_vocab), lbccSuccess);
  EXPECT_EQ(lbccBasisRefreshTable(no_vocab, e.data(), LBCC_TABLE_LOSSY, &next), lbccInvalidUsage);
  EXPECT_THAT(lbccGetLastError(nullptr), HasSubstr("vocabulary"));
  lbccBasisDestroy(no_vocab);
  lbccBasisDestroy(basis);
}

TEST(CApiTest, TableUpdateBetweenTwoStages) {
  constexpr size_t kCount = 4000;
  std::vector<float> before(kCount), after(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    before[i] = static_cast<float>(i % 17) - 8.0f;
    after[i] = i % 23 == 0 ? before[i] + 1.0f : before[i];
  }
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  std::vector<lbccResult_t> results(2, lbccInternalError);
  std::vector<std::string> errors(2);
  std::vector<size_t> bytes(2, 0);
  std::vector<float> table = before, wrong(kCount + 1, 5.0f);
  lbccResult_t wrong_rc = lbccSuccess;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      lbccConfig_t config = LoopbackConfig();
      lbccComm_t comm = nullptr;
      lbccResult_t rc = lbccCommInitRank(&comm, 2, id, r, &config);
      lbccRequest_t request = nullptr;
      auto step = [&](lbccResult_t posted) {
        if (rc != lbccSuccess) return;
        rc = posted == lbccSuccess ? lbccWait(request) : posted;
        if (request != nullptr) lbccRequestFree(request);
        request = nullptr;
      };
      if (r == 0) {
        // Argument errors come from the call.
        if (rc == lbccSuccess &&
            (lbccSendTableUpdate(nullptr, after.data(), kCount, 1, 3, comm, nullptr, &request) !=
                 lbccInvalidArgument ||
             lbccSendTableUpdate(before.data(), after.data(), kCount, 1, 3, comm, nullptr,
                                 nullptr) != lbccInvalidArgument ||
             lbccSendTableUpdate(before.data(), after.data(), kCount, 0, 3, comm, nullptr,
                                 &request) != lbccInvalidArgument ||
             request != nullptr)) {
          rc = lbccInternalError;
        }
        step(lbccSendTableUpdate(before.data(), after.data(), kCount, 1, 3, comm, &bytes[0],
                                 &request));
        step(lbccSendTableUpdate(before.data(), after.data(), kCount, 1, 3, comm, nullptr,
                                 &request));
      } else {
        if (rc == lbccSuccess &&
            lbccRecvTableUpdate(nullptr, kCount, 0, 3, comm, nullptr, &request) !=
                lbccInvalidArgument) {
          rc = lbccInternalError;
        }
        step(lbccRecvTableUpdate(table.data(), kCount, 0, 3, comm, &bytes[1], &request));
        if (rc == lbccSuccess) {
          // The second update meets a table of another size: the request fails, untouched.
          rc = lbccRecvTableUpdate(wrong.data(), kCount + 1, 0, 3, comm, nullptr, &request);
          if (rc == lbccSuccess) wrong_rc = lbccWait(request);
          if (request != nullptr) lbccRequestFree(request);
          errors[r] = lbccGetLastError(comm);
        }
      }
      if (rc != lbccSuccess) errors[r] = lbccGetLastError(comm);
      if (comm != nullptr) lbccCommDestroy(comm);
      results[r] = rc;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[0], lbccSuccess) << errors[0];
  EXPECT_EQ(results[1], lbccSuccess) << errors[1];
  EXPECT_EQ(std::memcmp(table.data(), after.data(), kCount * sizeof(float)), 0);
  EXPECT_EQ(wrong_rc, lbccInvalidArgument);
  EXPECT_THAT(errors[1], HasSubstr("table of 4001"));
  EXPECT_EQ(wrong, std::vector<float>(kCount + 1, 5.0f));
  // 174 changed elements of 4000: LEB128 gaps (1 byte each) beat a 500-byte bitmap.
  EXPECT_EQ(bytes[0], 40u + 174 + 174 * 4);
  EXPECT_EQ(bytes[1], bytes[0]);
}

}  // namespace
