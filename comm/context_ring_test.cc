// The context ring with real concurrency: ranks as threads over loopback (and UCX on
// 127.0.0.1), forward and backward passes, every codec kind, and the failures every collective
// must report on every rank (a mismatched call, a rejected argument, a dead peer).
#include "comm/context_ring.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "codecs/subspace_basis.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::lbcc::comm::testing::RankOptions;
using ::lbcc::comm::testing::RunRanks;
using ::testing::AnyOf;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr int64_t kTokens = 24;
constexpr int64_t kDim = 16;
constexpr int64_t kElems = kTokens * kDim;

// Values exact in bf16 (small integers over 8): tensor t of rank r.
std::vector<float> BlockOf(int rank, int t) {
  std::vector<float> v(kElems);
  for (int64_t i = 0; i < kElems; ++i) {
    v[i] = static_cast<float>(((rank * 7 + t * 3 + i * 5) % 33) - 16) / 8.0f;
  }
  return v;
}
// Rank `from`'s gradient contribution to block `owner` (bf16-exact, sums exact too).
std::vector<float> GradOf(int from, int owner, int t) {
  std::vector<float> v(kElems);
  for (int64_t i = 0; i < kElems; ++i) {
    v[i] = static_cast<float>((from * 11 + owner * 5 + t + i) % 9 - 4);
  }
  return v;
}

TensorView View(std::vector<float>& v) { return *TensorView::Host(v.data(), {kTokens, kDim}); }

absl::Status Expect(bool ok, absl::string_view what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

// A whole forward and backward with exact codecs: every block arrives bit for bit from the
// right rank, and every owner gets the exact sum of the others' contributions.
absl::Status ExactRoundTrip(Communicator& comm, RingCodec codec) {
  const int n = comm.nranks(), me = comm.rank();
  ContextRingOptions options;
  options.tensors = {codec, codec};
  options.tokens = kTokens;
  options.dim = kDim;
  LBCC_ASSIGN_OR_RETURN(auto ring, ContextRing::Create(&comm, options));
  std::vector<float> k = BlockOf(me, 0), v = BlockOf(me, 1);
  std::vector<float> k_own(kElems), v_own(kElems);
  const Fabric::ClassBytes before = comm.fabric()->BytesByClass();
  LBCC_RETURN_IF_ERROR(ring->BeginForward({View(k), View(v)}, {View(k_own), View(v_own)}));
  LBCC_RETURN_IF_ERROR(Expect(k_own == k && v_own == v, "own block not exact"));
  for (int r = 1; r < n; ++r) {
    std::vector<float> kr(kElems), vr(kElems);
    LBCC_ASSIGN_OR_RETURN(int src, ring->NextForward({View(kr), View(vr)}));
    LBCC_RETURN_IF_ERROR(Expect(src == (me - r + n) % n, "wrong source"));
    LBCC_RETURN_IF_ERROR(Expect(std::memcmp(kr.data(), BlockOf(src, 0).data(), kElems * 4) == 0 &&
                                    std::memcmp(vr.data(), BlockOf(src, 1).data(), kElems * 4) == 0,
                                absl::StrCat("block of rank ", src, " not bit-exact")));
  }
  LBCC_RETURN_IF_ERROR(ring->EndForward());
  const Fabric::ClassBytes after = comm.fabric()->BytesByClass();
  const uint64_t payload = ring->payload_bytes(0).forward + ring->payload_bytes(1).forward;
  LBCC_RETURN_IF_ERROR(Expect(after.fast_sent - before.fast_sent >= (n - 1) * payload,
                              "forward bytes not counted on the fast links"));

  LBCC_RETURN_IF_ERROR(ring->BeginBackward());
  for (int r = 1; r < n; ++r) {
    const int owner = (me + r) % n;
    std::vector<float> gk = GradOf(me, owner, 0), gv = GradOf(me, owner, 1);
    LBCC_ASSIGN_OR_RETURN(int got, ring->PassGradient({View(gk), View(gv)}));
    LBCC_RETURN_IF_ERROR(Expect(got == owner, "wrong owner"));
  }
  std::vector<float> dk(kElems, -1), dv(kElems, -1);
  LBCC_RETURN_IF_ERROR(ring->EndBackward({View(dk), View(dv)}));
  for (int t = 0; t < 2; ++t) {
    std::vector<float> want(kElems, 0);
    for (int from = 0; from < n; ++from) {
      if (from == me) continue;
      std::vector<float> g = GradOf(from, me, t);
      for (int64_t i = 0; i < kElems; ++i) want[i] += g[i];
    }
    LBCC_RETURN_IF_ERROR(Expect((t == 0 ? dk : dv) == want, "gradient sum not exact"));
  }
  return absl::OkStatus();
}

class ContextRingBackendTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ContextRingBackendTest, RawF32IsBitExactBothWays) {
  RankOptions options;
  options.backend = GetParam();
  auto results = RunRanks(4, options, [](int, Communicator& comm) {
    return ExactRoundTrip(comm, RingCodec::Raw());
  });
  EXPECT_THAT(results, Each(IsOk()));
}

INSTANTIATE_TEST_SUITE_P(Backends, ContextRingBackendTest, ::testing::Values("loopback", "ucx"));

TEST(ContextRingTest, DenseBf16IsBitExactOnBf16Values) {
  auto results = RunRanks(3, {}, [](int, Communicator& comm) {
    return ExactRoundTrip(comm, RingCodec::Dense(codecs::DenseFormat::kBf16));
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(ContextRingTest, SingleRankHasNoRounds) {
  auto results = RunRanks(1, {}, [](int, Communicator& comm) {
    return ExactRoundTrip(comm, RingCodec::Raw());
  });
  EXPECT_THAT(results, Each(IsOk()));
}

// Mixture of subspaces: every rank decodes a block to the same bits its owner's mine_out holds
// (the constrained block), and gradients come back projected on the forward's components.
TEST(ContextRingTest, SubspaceMixtureDecodesTheSameConstrainedBlockEverywhere) {
  codecs::SubspaceSeedSpec spec;
  spec.model_dim = kDim;
  spec.rank = 4;
  spec.components = 3;
  spec.seed = 7;
  auto basis = codecs::SubspaceBasis::FromSeed(spec);
  ASSERT_THAT(basis.status(), IsOk());
  codecs::SubspaceCodecOptions coef;
  coef.coefficient_dtype = DType::kF32;
  coef.mixture_block = 8;
  constexpr int kRanks = 3;
  std::vector<std::vector<float>> owned(kRanks), seen(kRanks * kRanks);
  auto results = RunRanks(kRanks, {}, [&](int me, Communicator& comm) -> absl::Status {
    ContextRingOptions options;
    options.tensors = {RingCodec::Subspace(*basis, coef)};
    options.tokens = kTokens;
    options.dim = kDim;
    LBCC_ASSIGN_OR_RETURN(auto ring, ContextRing::Create(&comm, options));
    LBCC_RETURN_IF_ERROR(Expect(ring->payload_bytes(0).forward < kElems * 4 / 3,
                                "subspace payload not compressed"));
    std::vector<float> k = BlockOf(me, 0);
    owned[me].resize(kElems);
    LBCC_RETURN_IF_ERROR(ring->BeginForward({View(k)}, {View(owned[me])}));
    for (int r = 1; r < kRanks; ++r) {
      std::vector<float> kr(kElems);
      LBCC_ASSIGN_OR_RETURN(int src, ring->NextForward({View(kr)}));
      seen[me * kRanks + src] = kr;
    }
    LBCC_RETURN_IF_ERROR(ring->EndForward());
    // Backward: every contribution is the block's own constrained values, which lie in the
    // span of the chosen components, so the projected sum is exact up to f32 rounding.
    LBCC_RETURN_IF_ERROR(ring->BeginBackward());
    for (int r = 1; r < kRanks; ++r) {
      const int owner = (me + r) % kRanks;
      std::vector<float> g = seen[me * kRanks + owner];
      LBCC_RETURN_IF_ERROR(ring->PassGradient({View(g)}).status());
    }
    std::vector<float> dk(kElems);
    LBCC_RETURN_IF_ERROR(ring->EndBackward({View(dk)}));
    for (int64_t i = 0; i < kElems; ++i) {
      const float want = (kRanks - 1) * owned[me][i];
      if (std::fabs(dk[i] - want) > 1e-4f * (1 + std::fabs(want))) {
        return absl::InternalError(absl::StrCat("gradient ", i, ": ", dk[i], " vs ", want));
      }
    }
    return absl::OkStatus();
  });
  ASSERT_THAT(results, Each(IsOk()));
  double residual = 0, total = 0;
  for (int me = 0; me < kRanks; ++me) {
    for (int src = 0; src < kRanks; ++src) {
      if (src == me) continue;
      EXPECT_EQ(seen[me * kRanks + src], owned[src]) << "rank " << me << " decoded " << src;
    }
    const std::vector<float> raw = BlockOf(me, 0);
    for (int64_t i = 0; i < kElems; ++i) {
      residual += (raw[i] - owned[me][i]) * (raw[i] - owned[me][i]);
      total += raw[i] * raw[i];
    }
  }
  // A random block is not in the subspaces: the constraint removed energy (the model's
  // reparameterization is what makes real K/V fit).
  EXPECT_GT(residual, 0.0);
  EXPECT_LT(residual, total);
}

TEST(ContextRingTest, MismatchedCallFailsOnEveryRankAndTheRingStaysUsable) {
  auto results = RunRanks(3, {}, [](int me, Communicator& comm) -> absl::Status {
    ContextRingOptions options;
    options.tensors = {me == 2 ? RingCodec::Dense(codecs::DenseFormat::kBf16) : RingCodec::Raw()};
    options.tokens = kTokens;
    options.dim = kDim;
    LBCC_ASSIGN_OR_RETURN(auto ring, ContextRing::Create(&comm, options));
    std::vector<float> k = BlockOf(me, 0), kr(kElems, 0);
    LBCC_RETURN_IF_ERROR(ring->BeginForward({View(k)}));
    absl::StatusOr<int> src = ring->NextForward({View(kr)});
    if (src.status().code() != absl::StatusCode::kFailedPrecondition ||
        !absl::StrContains(src.status().message(), "tensor 0 codec")) {
      return absl::InternalError(absl::StrCat("expected a codec mismatch, got ",
                                              src.status().ToString()));
    }
    LBCC_RETURN_IF_ERROR(Expect(kr == std::vector<float>(kElems, 0), "output written"));
    // The communicator still works: a matching pass succeeds.
    return ExactRoundTrip(comm, RingCodec::Raw());
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(ContextRingTest, RejectedArgumentFailsEveryRank) {
  auto results = RunRanks(3, {}, [](int me, Communicator& comm) -> absl::Status {
    ContextRingOptions options;
    options.tensors = {RingCodec::Raw()};
    options.tokens = kTokens;
    options.dim = kDim;
    LBCC_ASSIGN_OR_RETURN(auto ring, ContextRing::Create(&comm, options));
    std::vector<float> k = BlockOf(me, 0), kr(kElems);
    TensorView wrong = *TensorView::Host(k.data(), {kDim, kTokens});
    absl::Status begin = ring->BeginForward({me == 1 ? wrong : View(k)});
    if (me == 1) {
      LBCC_RETURN_IF_ERROR(Expect(begin.code() == absl::StatusCode::kInvalidArgument,
                                  begin.ToString()));
    } else {
      LBCC_RETURN_IF_ERROR(begin);
      absl::Status s = ring->NextForward({View(kr)}).status();
      LBCC_RETURN_IF_ERROR(Expect(s.code() == absl::StatusCode::kInvalidArgument &&
                                      absl::StrContains(s.message(), "rank 1"),
                                  s.ToString()));
    }
    // The ranks stay in step: the next collective runs everywhere.
    return comm.Barrier()->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

TEST(ContextRingTest, OutOfOrderCallsAreFailedPrecondition) {
  auto results = RunRanks(2, {}, [](int me, Communicator& comm) -> absl::Status {
    ContextRingOptions options;
    options.tensors = {RingCodec::Raw()};
    options.tokens = kTokens;
    options.dim = kDim;
    LBCC_ASSIGN_OR_RETURN(auto ring, ContextRing::Create(&comm, options));
    std::vector<float> k = BlockOf(me, 0);
    LBCC_RETURN_IF_ERROR(Expect(ring->NextForward({View(k)}).status().code() ==
                                    absl::StatusCode::kFailedPrecondition,
                                "NextForward before BeginForward"));
    LBCC_RETURN_IF_ERROR(Expect(ring->EndBackward({View(k)}).code() ==
                                    absl::StatusCode::kFailedPrecondition,
                                "EndBackward without a pass"));
    // A backward before any forward is rejected on every rank alike.
    absl::Status s = ring->BeginBackward();
    return Expect(s.code() == absl::StatusCode::kFailedPrecondition, s.ToString());
  });
  EXPECT_THAT(results, Each(IsOk()));
  ContextRingOptions bad;
  bad.tensors = {RingCodec::Raw()};
  bad.tokens = kTokens;
  bad.dim = kDim;
  bad.algorithm = Algorithm::kDirect;
  auto direct = RunRanks(1, {}, [&](int, Communicator& comm) -> absl::Status {
    return ContextRing::Create(&comm, bad).status();
  });
  EXPECT_THAT(direct, Each(StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("contextring has no direct"))));
}

// A rank that stops consuming a forward (its ring destroyed after one round) leaves the others'
// forward complete and the communicator usable: the relays need nothing from its thread.
TEST(ContextRingTest, AbandonedForwardFinishesItsRelays) {
  auto results = RunRanks(3, {}, [](int me, Communicator& comm) -> absl::Status {
    {
      ContextRingOptions options;
      options.tensors = {RingCodec::Raw()};
      options.tokens = kTokens;
      options.dim = kDim;
      LBCC_ASSIGN_OR_RETURN(auto ring, ContextRing::Create(&comm, options));
      std::vector<float> k = BlockOf(me, 0), kr(kElems);
      LBCC_RETURN_IF_ERROR(ring->BeginForward({View(k)}));
      const int rounds = me == 1 ? 1 : 2;
      for (int r = 0; r < rounds; ++r) {
        LBCC_RETURN_IF_ERROR(ring->NextForward({View(kr)}).status());
      }
      if (me != 1) LBCC_RETURN_IF_ERROR(ring->EndForward());
    }
    return comm.Barrier()->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));
}

// A rank dies in the middle of a backward: every other rank's pending call fails (no hang).
TEST(ContextRingTest, DeadPeerFailsEveryRank) {
  RankOptions rank_options;
  rank_options.timeout = absl::Seconds(30);
  auto results = RunRanks(4, rank_options, [](int me, Communicator& comm) -> absl::Status {
    ContextRingOptions options;
    options.tensors = {RingCodec::Raw()};
    options.tokens = kTokens;
    options.dim = kDim;
    LBCC_ASSIGN_OR_RETURN(auto ring, ContextRing::Create(&comm, options));
    std::vector<float> k = BlockOf(me, 0), kr(kElems);
    // Rank 3 may crash while a peer still relays the forward: any call from here on may be
    // the one that fails.
    absl::Status s = ring->BeginForward({View(k)});
    for (int r = 1; r < 4 && s.ok(); ++r) s = ring->NextForward({View(kr)}).status();
    if (s.ok()) s = ring->EndForward();
    if (s.ok()) s = ring->BeginBackward();
    if (me == 3) {
      LBCC_RETURN_IF_ERROR(s);
      LBCC_RETURN_IF_ERROR(ring->PassGradient({View(k)}).status());
      comm.fabric()->CrashForTesting();
      return absl::OkStatus();
    }
    for (int r = 1; r < 4 && s.ok(); ++r) s = ring->PassGradient({View(k)}).status();
    if (s.ok()) s = ring->EndBackward({View(kr)});
    return Expect(s.code() == absl::StatusCode::kUnavailable ||
                      s.code() == absl::StatusCode::kCancelled ||
                      s.code() == absl::StatusCode::kDeadlineExceeded,
                  absl::StrCat("rank ", me, ": ", s.ToString()));
  });
  EXPECT_THAT(results, Each(IsOk()));
}

}  // namespace
}  // namespace lbcc::comm
