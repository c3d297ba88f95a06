// The C API's context ring (lbcc.h): three ranks as threads, a subspace mixture ring forward and
// backward, and argument errors.
#include <cmath>
#include <thread>
#include <vector>

#include "comm/lbcc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

constexpr int kRanks = 3;
constexpr int64_t kTokens = 16, kDim = 8;

TEST(CApiContextRingTest, SubspaceRingForwardAndBackward) {
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  std::vector<std::vector<float>> own(kRanks, std::vector<float>(kTokens * kDim));
  std::vector<std::vector<float>> seen(kRanks * kRanks);
  std::vector<std::vector<float>> grads(kRanks);
  std::vector<int> failures(kRanks, 0);
  std::vector<std::thread> threads;
  for (int me = 0; me < kRanks; ++me) {
    threads.emplace_back([&, me] {
      auto check = [&](bool ok) { failures[me] += ok ? 0 : 1; };
      lbccConfig_t config = LBCC_CONFIG_INITIALIZER;
      config.transport = "loopback";
      config.timeoutSeconds = 30;
      lbccComm_t comm = nullptr;
      if (lbccCommInitRank(&comm, kRanks, id, me, &config) != lbccSuccess) return check(false);
      lbccRingCodec_t codec = LBCC_RING_CODEC_INITIALIZER;
      codec.kind = LBCC_RING_SUBSPACE;
      codec.rank = 3;
      codec.components = 2;
      codec.seed = 11;
      codec.coefficients = lbccFloat32;
      codec.mixtureBlock = 4;
      lbccContextRing_t ring = nullptr;
      check(lbccContextRingCreate(comm, 0, &codec, kTokens, kDim, &ring) == lbccInvalidArgument);
      check(lbccContextRingCreate(comm, 1, &codec, kTokens, kDim, &ring) == lbccSuccess);
      size_t forward = 0;
      check(lbccContextRingPayloadBytes(ring, 0, &forward, nullptr) == lbccSuccess);
      check(forward < kTokens * kDim * sizeof(float));
      std::vector<float> k(kTokens * kDim);
      for (size_t i = 0; i < k.size(); ++i) k[i] = std::sin(0.37f * i + me);
      const float* mine[] = {k.data()};
      float* mine_out[] = {own[me].data()};
      check(lbccContextRingBeginForward(ring, mine, mine_out) == lbccSuccess);
      for (int r = 1; r < kRanks; ++r) {
        std::vector<float> block(kTokens * kDim);
        float* out[] = {block.data()};
        int source = -1;
        check(lbccContextRingNextForward(ring, out, &source) == lbccSuccess);
        check(source == (me - r + kRanks) % kRanks);
        if (source >= 0 && source < kRanks) seen[me * kRanks + source] = block;
      }
      check(lbccContextRingEndForward(ring) == lbccSuccess);
      check(lbccContextRingBeginBackward(ring) == lbccSuccess);
      check(lbccContextRingPassGradient(ring, nullptr, nullptr) == lbccInvalidArgument);
      for (int r = 1; r < kRanks; ++r) {
        const int owner = (me + r) % kRanks;
        const float* g[] = {seen[me * kRanks + owner].data()};
        int got = -1;
        check(lbccContextRingPassGradient(ring, g, &got) == lbccSuccess);
        check(got == owner);
      }
      grads[me].resize(kTokens * kDim);
      float* out[] = {grads[me].data()};
      check(lbccContextRingEndBackward(ring, out) == lbccSuccess);
      check(lbccContextRingDestroy(ring) == lbccSuccess);
      check(lbccCommDestroy(comm) == lbccSuccess);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_THAT(failures, ::testing::Each(0));
  for (int me = 0; me < kRanks; ++me) {
    for (int src = 0; src < kRanks; ++src) {
      if (src != me) EXPECT_EQ(seen[me * kRanks + src], own[src]);
    }
    for (int64_t i = 0; i < kTokens * kDim; ++i) {
      EXPECT_NEAR(grads[me][i], (kRanks - 1) * own[me][i], 1e-4);
    }
  }
}

TEST(CApiContextRingTest, BadArguments) {
  EXPECT_EQ(lbccContextRingDestroy(nullptr), lbccInvalidArgument);
  EXPECT_EQ(lbccContextRingEndForward(nullptr), lbccInvalidArgument);
  lbccUniqueId id;
  ASSERT_EQ(lbccGetUniqueId(&id), lbccSuccess);
  lbccConfig_t config = LBCC_CONFIG_INITIALIZER;
  config.transport = "loopback";
  lbccComm_t comm = nullptr;
  ASSERT_EQ(lbccCommInitRank(&comm, 1, id, 0, &config), lbccSuccess);
  lbccRingCodec_t codec = LBCC_RING_CODEC_INITIALIZER;
  codec.size = 1;
  lbccContextRing_t ring = nullptr;
  EXPECT_EQ(lbccContextRingCreate(comm, 1, &codec, 4, 4, &ring), lbccInvalidArgument);
  EXPECT_THAT(lbccGetLastError(comm), HasSubstr("LBCC_RING_CODEC_INITIALIZER"));
  codec = LBCC_RING_CODEC_INITIALIZER;
  codec.kind = LBCC_RING_SUBSPACE;
  codec.basisPath = "/nonexistent/basis";
  EXPECT_NE(lbccContextRingCreate(comm, 1, &codec, 4, 4, &ring), lbccSuccess);
  codec = LBCC_RING_CODEC_INITIALIZER;
  ASSERT_EQ(lbccContextRingCreate(comm, 1, &codec, 4, 4, &ring), lbccSuccess);
  EXPECT_EQ(lbccContextRingNextForward(ring, nullptr, nullptr), lbccInvalidArgument);
  float x[16] = {};
  float* out[] = {x};
  EXPECT_EQ(lbccContextRingNextForward(ring, out, nullptr), lbccInvalidUsage);
  EXPECT_THAT(lbccGetLastError(comm), HasSubstr("BeginForward"));
  EXPECT_EQ(lbccContextRingDestroy(ring), lbccSuccess);
  EXPECT_EQ(lbccCommDestroy(comm), lbccSuccess);
}

}  // namespace
