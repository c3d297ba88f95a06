// Pipeline activations over two ranks as threads (loopback): round trips in both directions,
// basis checks, in-flight backwards across a basis change, corrupt and misshapen payloads, and
// many microbatches in flight.
#include "comm/activations.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/status_matchers.h"
#include "codecs/dense_quant.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"
#include "codecs/subspace_training.h"
#include "codecs/table_delta.h"
#include "comm/testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::comm {
namespace {

using ::lbcc::comm::testing::RankOptions;
using ::lbcc::comm::testing::RunRanks;
using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr int64_t kD = 32, kK = 8, kV = 40, kTokens = 12;

SubspaceBasisPtr Basis(uint32_t version = 0, int64_t components = 1) {
  codecs::SubspaceSeedSpec spec;
  spec.model_dim = kD;
  spec.rank = kK;
  spec.components = components;
  spec.vocab_size = kV;
  spec.with_table = true;
  spec.table_stddev = 0.5;
  spec.seed = 7;
  spec.version = version;
  return *codecs::SubspaceBasis::FromSeed(spec);
}

// A basis with the same U and another table and version, as an embedding shift makes.
SubspaceBasisPtr Shifted(const SubspaceBasisPtr& basis) {
  std::vector<float> table(basis->table().begin(), basis->table().end());
  for (float& t : table) t *= 1.5f;
  return *basis->WithTable(std::move(table), basis->id().version + 1);
}

// Activations of microbatch `mb` and their ids (not in the subspace: the codec's round trip
// is compared with its own decode, bit for bit).
struct Microbatch {
  std::vector<float> h;
  std::vector<int32_t> ids;
  std::vector<float> g;
};

Microbatch MakeMicrobatch(int mb) {
  Microbatch m;
  for (int64_t t = 0; t < kTokens; ++t) {
    m.ids.push_back(static_cast<int32_t>((t * 7 + mb * 3) % kV));
    for (int64_t j = 0; j < kD; ++j) {
      m.h.push_back(static_cast<float>((t * 5 + j * 3 + mb) % 11) / 8.0f - 0.5f);
      m.g.push_back(static_cast<float>((t * 3 + j + 2 * mb) % 13) / 16.0f - 0.25f);
    }
  }
  return m;
}

TensorView View(std::vector<float>& v) { return *TensorView::Host(v.data(), {kTokens, kD}); }

// What the codec alone makes of `m` with `basis`: the payloads and their decodes.
struct Expected {
  std::vector<uint8_t> forward, backward;
  std::vector<float> h, g;
};

Expected Encode(Microbatch m, const SubspaceBasisPtr& basis,
                codecs::SubspaceCodecOptions options = {}) {
  codecs::SubspaceCodec codec = *codecs::SubspaceCodec::Create(basis, options);
  Expected e;
  e.forward = *codec.EncodeForward(View(m.h), m.ids);
  e.backward = *codec.EncodeBackward(View(m.g));
  e.h.resize(kTokens * kD);
  e.g.resize(kTokens * kD);
  EXPECT_THAT(codec.DecodeForward(e.forward, View(e.h)), IsOk());
  EXPECT_THAT(codec.DecodeBackward(e.backward, View(e.g)), IsOk());
  return e;
}

absl::Status Check(bool ok, absl::string_view what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

TEST(ActivationsTest, ForwardAndBackwardRoundTripWithTheCodecsBytes) {
  const SubspaceBasisPtr basis = Basis();
  codecs::SubspaceCodecOptions options;
  options.coefficient_dtype = DType::kF32;
  const Expected expected = Encode(MakeMicrobatch(0), basis, options);
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    Microbatch m = MakeMicrobatch(0);
    if (rank == 0) {
      LBCC_RETURN_IF_ERROR(SendActivations(comm, View(m.h), m.ids, basis, options, 1, 3)->Wait());
      std::vector<float> g(kTokens * kD, -9.0f);
      ActivationRoute route;
      std::vector<uint8_t> payload;
      LBCC_RETURN_IF_ERROR(
          RecvActivationGrads(comm, View(g), {basis}, 1, 3, &route, &payload)->Wait());
      LBCC_RETURN_IF_ERROR(Check(payload == expected.backward, "backward bytes differ"));
      LBCC_RETURN_IF_ERROR(Check(g == expected.g, "gradient differs"));
      return Check(route.basis == basis->id() && route.tokens == kTokens, "backward route");
    }
    std::vector<float> h(kTokens * kD, -9.0f);
    std::vector<int32_t> ids(kTokens, -1);
    ActivationRoute route;
    std::vector<uint8_t> payload;
    LBCC_RETURN_IF_ERROR(
        RecvActivations(comm, View(h), absl::MakeSpan(ids), {basis}, 0, 3, &route, &payload)
            ->Wait());
    LBCC_RETURN_IF_ERROR(Check(payload == expected.forward, "forward bytes differ"));
    LBCC_RETURN_IF_ERROR(Check(h == expected.h, "activations differ"));
    LBCC_RETURN_IF_ERROR(Check(ids == m.ids, "ids differ"));
    LBCC_RETURN_IF_ERROR(Check(route.basis == basis->id() && route.selectors.values.empty(),
                               "forward route"));
    return SendActivationGrads(comm, View(m.g), basis, options, route.selectors, 0, 3)->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));
  // The payload is the forward's k coefficients and one id per token: 76 + 12 * (4 * 8 + 1).
  EXPECT_EQ(expected.forward.size(), 76u + kTokens * (4 * kK + 1));
}

TEST(ActivationsTest, AnotherBasisVersionIsFailedPreconditionNamingBoth) {
  const SubspaceBasisPtr old_basis = Basis(), new_basis = Shifted(old_basis);
  std::vector<float> untouched;
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    Microbatch m = MakeMicrobatch(1);
    if (rank == 0) {
      return SendActivations(comm, View(m.h), m.ids, new_basis, {}, 1, 0)->Wait();
    }
    std::vector<float> h(kTokens * kD, -9.0f);
    absl::Status status = RecvActivations(comm, View(h), {}, {old_basis}, 0, 0)->Wait();
    untouched = h;
    return status;
  });
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(results[1], StatusIs(absl::StatusCode::kFailedPrecondition,
                                   AllOf(HasSubstr(new_basis->id().ToString()),
                                         HasSubstr(old_basis->id().ToString()))));
  EXPECT_EQ(new_basis->id().ToString().substr(16), "/v1");
  EXPECT_EQ(untouched, std::vector<float>(kTokens * kD, -9.0f));
}

// 1F1B: microbatch 0's forward uses basis v0, both sides move to v1, then microbatch 0's
// backward (encoded with v0, as its forward) still decodes; microbatch 1 goes with v1.
TEST(ActivationsTest, BackwardOfTheOldBasisDecodesAfterTheChange) {
  const SubspaceBasisPtr v0 = Basis(), v1 = Shifted(v0);
  const Expected old0 = Encode(MakeMicrobatch(0), v0), new1 = Encode(MakeMicrobatch(1), v1);
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    LBCC_ASSIGN_OR_RETURN(auto channel, ActivationChannel::Create(&comm, 1 - rank, 5, v0));
    Microbatch m0 = MakeMicrobatch(0), m1 = MakeMicrobatch(1);
    if (rank == 0) {
      LBCC_RETURN_IF_ERROR(channel->SendActivations(View(m0.h), m0.ids)->Wait());
      LBCC_RETURN_IF_ERROR(channel->UpdateBasis(v1));
      LBCC_RETURN_IF_ERROR(channel->SendActivations(View(m1.h), m1.ids)->Wait());
      std::vector<float> g0(kTokens * kD), g1(kTokens * kD);
      ActivationRoute r0, r1;
      LBCC_RETURN_IF_ERROR(channel->RecvActivationGrads(View(g0), &r0)->Wait());
      LBCC_RETURN_IF_ERROR(channel->RecvActivationGrads(View(g1), &r1)->Wait());
      LBCC_RETURN_IF_ERROR(Check(r0.basis == v0->id() && g0 == old0.g, "old backward"));
      return Check(r1.basis == v1->id() && g1 == new1.g, "new backward");
    }
    std::vector<float> h0(kTokens * kD), h1(kTokens * kD);
    ActivationRoute r0, r1;
    LBCC_RETURN_IF_ERROR(channel->RecvActivations(View(h0), {}, &r0)->Wait());
    LBCC_RETURN_IF_ERROR(channel->UpdateBasis(v1));
    LBCC_RETURN_IF_ERROR(channel->RecvActivations(View(h1), {}, &r1)->Wait());
    LBCC_RETURN_IF_ERROR(Check(r0.basis == v0->id() && h0 == old0.h, "old forward"));
    LBCC_RETURN_IF_ERROR(Check(r1.basis == v1->id() && h1 == new1.h, "new forward"));
    LBCC_RETURN_IF_ERROR(channel->SendActivationGrads(View(m0.g), r0)->Wait());
    LBCC_RETURN_IF_ERROR(channel->SendActivationGrads(View(m1.g), r1)->Wait());
    // Once the previous basis is dropped, a late backward of it is refused at once.
    channel->DropPreviousBases();
    return channel->SendActivationGrads(View(m0.g), r0)->Wait();
  });
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(results[1],
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(v0->id().ToString())));
}

// Writes fixed bytes as a payload (a corrupt or foreign one) through SendCompressed.
class RawCodec final : public codecs::Codec {
 public:
  explicit RawCodec(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  codecs::CodecId id() const override { return codecs::CodecId::kSubspaceForward; }
  std::string Describe() const override { return "raw"; }
  absl::StatusOr<size_t> MaxEncodedBytes(absl::Span<const int64_t>) const override {
    return bytes_.size();
  }
  absl::StatusOr<size_t> Encode(const TensorView&, codecs::CodecState*,
                                absl::Span<uint8_t> out) const override {
    std::memcpy(out.data(), bytes_.data(), bytes_.size());
    return bytes_.size();
  }

 private:
  std::vector<uint8_t> bytes_;
};

TEST(ActivationsTest, CorruptForeignAndMisdirectedPayloadsAreDataLoss) {
  const SubspaceBasisPtr basis = Basis();
  const Expected e = Encode(MakeMicrobatch(2), basis);
  std::vector<uint8_t> flipped = e.forward;
  flipped[flipped.size() / 2] ^= 0x10;
  std::vector<absl::Status> received;
  bool untouched = true;
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    Microbatch m = MakeMicrobatch(2);
    if (rank == 0) {
      RawCodec corrupt(flipped);
      LBCC_RETURN_IF_ERROR(comm.SendCompressed(View(m.h), &corrupt, nullptr, 1, 0)->Wait());
      auto dense = *codecs::DenseQuantCodec::Create({});
      LBCC_RETURN_IF_ERROR(comm.SendCompressed(View(m.h), dense.get(), nullptr, 1, 0)->Wait());
      LBCC_RETURN_IF_ERROR(SendActivationGrads(comm, View(m.g), basis, {}, {}, 1, 0)->Wait());
      // Still usable: a good payload after the bad ones arrives.
      return SendActivations(comm, View(m.h), m.ids, basis, {}, 1, 0)->Wait();
    }
    std::vector<float> h(kTokens * kD, -9.0f);
    std::vector<int32_t> ids(kTokens, -1);
    for (int i = 0; i < 3; ++i) {
      received.push_back(
          RecvActivations(comm, View(h), absl::MakeSpan(ids), {basis}, 0, 0)->Wait());
    }
    untouched = h == std::vector<float>(kTokens * kD, -9.0f) && ids[0] == -1;
    LBCC_RETURN_IF_ERROR(
        RecvActivations(comm, View(h), absl::MakeSpan(ids), {basis}, 0, 0)->Wait());
    return Check(h == e.h && ids == m.ids, "the good payload after the bad ones");
  });
  EXPECT_THAT(results, Each(IsOk()));
  ASSERT_EQ(received.size(), 3u);
  EXPECT_THAT(received, Each(StatusIs(absl::StatusCode::kDataLoss)));
  EXPECT_THAT(received[2], StatusIs(absl::StatusCode::kDataLoss, HasSubstr("backward payload")));
  EXPECT_TRUE(untouched);
}

TEST(ActivationsTest, WrongShapesAreInvalidArgument) {
  const SubspaceBasisPtr basis = Basis();
  bool untouched = false;
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    Microbatch m = MakeMicrobatch(3);
    std::vector<float> narrow(kTokens * (kD - 1));
    TensorView narrow_view = *TensorView::Host(narrow.data(), {kTokens, kD - 1});
    if (rank == 0) {
      // Refused before anything is sent: another d, ids out of range or of the wrong count,
      // no basis, bad options.
      RequestPtr r = SendActivations(comm, narrow_view, m.ids, basis, {}, 1, 0);
      LBCC_RETURN_IF_ERROR(Check(r->RejectedAtPost(), "narrow h posted"));
      EXPECT_THAT(r->status(), StatusIs(absl::StatusCode::kInvalidArgument));
      std::vector<int32_t> bad_ids = m.ids;
      bad_ids[3] = kV;
      EXPECT_THAT(SendActivations(comm, View(m.h), bad_ids, basis, {}, 1, 0)->Wait(),
                  StatusIs(absl::StatusCode::kInvalidArgument));
      EXPECT_THAT(SendActivations(comm, View(m.h), absl::MakeSpan(m.ids).subspan(1), basis, {},
                                  1, 0)
                      ->Wait(),
                  StatusIs(absl::StatusCode::kInvalidArgument));
      EXPECT_THAT(SendActivations(comm, View(m.h), m.ids, nullptr, {}, 1, 0)->Wait(),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("basis is null")));
      codecs::SubspaceCodecOptions bad;
      bad.coefficient_dtype = DType::kI32;
      EXPECT_THAT(SendActivations(comm, View(m.h), m.ids, basis, bad, 1, 0)->Wait(),
                  StatusIs(absl::StatusCode::kInvalidArgument));
      EXPECT_THAT(SendActivations(comm, View(m.h), m.ids, basis, {}, 0, 0)->Wait(),
                  StatusIs(absl::StatusCode::kInvalidArgument));
      // One good payload of 12 tokens; the receiver expects 6.
      return SendActivations(comm, View(m.h), m.ids, basis, {}, 1, 0)->Wait();
    }
    EXPECT_THAT(RecvActivations(comm, narrow_view, {}, {basis}, 0, 0)->status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected f32[tokens, 32]")));
    std::vector<int32_t> few_ids(3);
    std::vector<float> h(kTokens * kD);
    EXPECT_THAT(RecvActivations(comm, View(h), absl::MakeSpan(few_ids), {basis}, 0, 0)->status(),
                StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(RecvActivations(comm, View(h), {}, {}, 0, 0)->status(),
                StatusIs(absl::StatusCode::kInvalidArgument));
    std::vector<float> half(kTokens / 2 * kD, -9.0f);
    absl::Status status =
        RecvActivations(comm, *TensorView::Host(half.data(), {kTokens / 2, kD}), {}, {basis}, 0, 0)
            ->Wait();
    untouched = half == std::vector<float>(kTokens / 2 * kD, -9.0f);
    return status;
  });
  EXPECT_THAT(results[0], IsOk());
  EXPECT_THAT(results[1], StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("the payload holds f32[12, 32]")));
  EXPECT_TRUE(untouched);
}

// 1F1B with two microbatches in flight and a basis change midway: every forward and every
// backward arrives, in order, with the bytes the codec makes.
TEST(ActivationsTest, ManyMicrobatchesInFlightNothingLost) {
  constexpr int kMicrobatches = 16, kInFlight = 2, kChangeAt = 7;
  const SubspaceBasisPtr v0 = Basis(0, /*components=*/3), v1 = Shifted(v0);
  std::vector<Expected> expected;
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    Microbatch m = MakeMicrobatch(mb);
    const SubspaceBasisPtr& b = mb < kChangeAt ? v0 : v1;
    codecs::SubspaceCodec codec = *codecs::SubspaceCodec::Create(b);
    Expected e;
    codecs::SubspaceSelectors selectors;
    e.forward = *codec.EncodeForward(View(m.h), m.ids, &selectors);
    e.backward = *codec.EncodeBackward(View(m.g), selectors);
    expected.push_back(std::move(e));
  }
  std::vector<std::vector<uint8_t>> forwards(kMicrobatches), backwards(kMicrobatches);
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    LBCC_ASSIGN_OR_RETURN(auto channel, ActivationChannel::Create(&comm, 1 - rank, 1, v0));
    if (rank == 0) {
      std::vector<float> g(kTokens * kD);
      std::vector<RequestPtr> sends;
      auto backward = [&](int mb) {
        return comm::RecvActivationGrads(comm, View(g), channel->accepted_bases(), 1, 1, nullptr,
                                         &backwards[mb])
            ->Wait();
      };
      for (int mb = 0; mb < kMicrobatches; ++mb) {
        if (mb == kChangeAt) LBCC_RETURN_IF_ERROR(channel->UpdateBasis(v1));
        Microbatch m = MakeMicrobatch(mb);
        sends.push_back(channel->SendActivations(View(m.h), m.ids));
        if (mb >= kInFlight) LBCC_RETURN_IF_ERROR(backward(mb - kInFlight));
      }
      for (int mb = kMicrobatches - kInFlight; mb < kMicrobatches; ++mb) {
        LBCC_RETURN_IF_ERROR(backward(mb));
      }
      for (const RequestPtr& r : sends) LBCC_RETURN_IF_ERROR(r->Wait());
      return absl::OkStatus();
    }
    std::vector<float> h(kTokens * kD);
    std::vector<ActivationRoute> routes(kMicrobatches);
    std::vector<RequestPtr> sends;
    auto backward = [&](int mb) {
      Microbatch m = MakeMicrobatch(mb);
      sends.push_back(channel->SendActivationGrads(View(m.g), routes[mb]));
    };
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      if (mb == kChangeAt) LBCC_RETURN_IF_ERROR(channel->UpdateBasis(v1));
      LBCC_RETURN_IF_ERROR(comm::RecvActivations(comm, View(h), {}, channel->accepted_bases(), 0,
                                                 1, &routes[mb], &forwards[mb])
                               ->Wait());
      if (routes[mb].selectors.values.empty()) return absl::InternalError("no selectors");
      if (mb >= kInFlight) backward(mb - kInFlight);
    }
    for (int mb = kMicrobatches - kInFlight; mb < kMicrobatches; ++mb) backward(mb);
    for (const RequestPtr& r : sends) LBCC_RETURN_IF_ERROR(r->Wait());
    return absl::OkStatus();
  });
  EXPECT_THAT(results, Each(IsOk()));
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    EXPECT_EQ(forwards[mb], expected[mb].forward) << "forward of microbatch " << mb;
    EXPECT_EQ(backwards[mb], expected[mb].backward) << "backward of microbatch " << mb;
  }
}


// ---- The lossy boundary: table updates and table refresh ----

// The synced embedding before and after an outer step that changed about 1 in 20 elements.
struct TableStep {
  std::vector<float> before, after;
};

TableStep MakeTableStep(size_t n = kV * kD) {
  TableStep s;
  for (size_t i = 0; i < n; ++i) {
    s.before.push_back(static_cast<float>((i * 37) % 101) / 50.0f - 1.0f);
  }
  s.after = s.before;
  for (size_t i = 0; i < n; i += 1 + (i * 7) % 37) s.after[i] += 0.125f;
  return s;
}

bool SameBits(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Stage 0 holds the embedding; stage 1 holds only the synced table. After the outer step stage
// 0 sends the delta; both refresh (lossy) and reach the same basis, which then carries the
// activations.
TEST(TableUpdateTest, ReceiverFollowsTheSenderBitForBitAndBothRefreshAlike) {
  const SubspaceBasisPtr v0 = Basis();
  const TableStep step = MakeTableStep();
  LBCC_ASSERT_OK_AND_ASSIGN(const std::vector<uint8_t> delta,
                            codecs::EncodeTableDelta(step.before, step.after));
  std::vector<float> received = step.before;
  std::vector<size_t> bytes(2, 0);
  std::vector<codecs::SubspaceBasisId> ids(2);
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    LBCC_ASSIGN_OR_RETURN(auto channel, ActivationChannel::Create(&comm, 1 - rank, 4, v0));
    std::vector<float> embedding = step.after;  // stage 0's synced embedding
    Microbatch m = MakeMicrobatch(5);
    if (rank == 0) {
      LBCC_RETURN_IF_ERROR(
          SendTableUpdate(comm, step.before, step.after, 1, 4, &bytes[0])->Wait());
      TensorView e = *TensorView::Host(embedding.data(), {kV, kD});
      LBCC_ASSIGN_OR_RETURN(SubspaceBasisPtr next,
                            channel->RefreshTable(e, codecs::TableRefreshMode::kLossy));
      ids[0] = next->id();
      LBCC_RETURN_IF_ERROR(Check(SameBits(embedding, step.after), "lossy refresh wrote E"));
      return channel->SendActivations(View(m.h), m.ids)->Wait();
    }
    LBCC_RETURN_IF_ERROR(
        RecvTableUpdate(comm, absl::MakeSpan(received), 0, 4, &bytes[1])->Wait());
    TensorView t = *TensorView::Host(received.data(), {kV, kD});
    LBCC_ASSIGN_OR_RETURN(SubspaceBasisPtr next,
                          channel->RefreshTable(t, codecs::TableRefreshMode::kLossy));
    ids[1] = next->id();
    std::vector<float> h(kTokens * kD);
    ActivationRoute route;
    LBCC_RETURN_IF_ERROR(channel->RecvActivations(View(h), {}, &route)->Wait());
    LBCC_RETURN_IF_ERROR(Check(route.basis == next->id(), "activations of the new basis"));
    // The previous basis is still accepted for backwards in flight.
    return Check(channel->accepted_bases().size() == 2 &&
                     channel->accepted_bases()[1]->id() == v0->id(),
                 "previous basis kept");
  });
  EXPECT_THAT(results, Each(IsOk()));
  EXPECT_TRUE(SameBits(received, step.after));
  EXPECT_EQ(bytes[0], delta.size());
  EXPECT_EQ(bytes[1], delta.size());
  EXPECT_LT(delta.size(), step.after.size() * sizeof(float) / 2);
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_EQ(ids[0].version, v0->id().version + 1);
}

TEST(TableUpdateTest, ConstrainedRefreshOnBothSidesGivesTheSameBasis) {
  const SubspaceBasisPtr v0 = Basis(3);
  std::vector<codecs::SubspaceBasisId> ids(2);
  std::vector<std::vector<float>> embeddings(2, MakeTableStep().after);
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    LBCC_ASSIGN_OR_RETURN(auto channel, ActivationChannel::Create(&comm, 1 - rank, 0, v0));
    TensorView e = *TensorView::Host(embeddings[rank].data(), {kV, kD});
    LBCC_ASSIGN_OR_RETURN(SubspaceBasisPtr next,
                          channel->RefreshTable(e, codecs::TableRefreshMode::kConstrained));
    ids[rank] = next->id();
    return Check(channel->basis() == next, "current basis");
  });
  EXPECT_THAT(results, Each(IsOk()));
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_EQ(ids[0].version, 4u);
  EXPECT_EQ(embeddings[0], embeddings[1]);
  EXPECT_NE(embeddings[0], MakeTableStep().after);  // shifted in place
}

TEST(TableUpdateTest, CorruptAndForeignMessagesAreDataLossAndWrongSizesInvalidArgument) {
  const SubspaceBasisPtr basis = Basis();
  const TableStep step = MakeTableStep();
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> flipped,
                            codecs::EncodeTableDelta(step.before, step.after));
  flipped[flipped.size() / 2] ^= 0x04;
  std::vector<absl::Status> received;
  std::vector<float> table = step.before;
  bool untouched = true;
  size_t bytes = 12345;
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    if (rank == 0) {
      // Refused before anything is sent.
      RequestPtr r = SendTableUpdate(comm, step.before, absl::MakeSpan(step.after).subspan(1), 1, 0);
      LBCC_RETURN_IF_ERROR(Check(r->RejectedAtPost(), "mismatched sizes posted"));
      EXPECT_THAT(r->status(), StatusIs(absl::StatusCode::kInvalidArgument));
      EXPECT_THAT(SendTableUpdate(comm, step.before, step.after, 0, 0)->status(),
                  StatusIs(absl::StatusCode::kInvalidArgument));
      std::vector<float> h = MakeMicrobatch(0).h;
      RawCodec corrupt(flipped);
      LBCC_RETURN_IF_ERROR(comm.SendCompressed(View(h), &corrupt, nullptr, 1, 0)->Wait());
      Microbatch m = MakeMicrobatch(0);
      LBCC_RETURN_IF_ERROR(SendActivations(comm, View(m.h), m.ids, basis, {}, 1, 0)->Wait());
      // A delta of a table one element longer.
      std::vector<float> longer_before = step.before, longer_after = step.after;
      longer_before.push_back(0.0f);
      longer_after.push_back(1.0f);
      LBCC_RETURN_IF_ERROR(SendTableUpdate(comm, longer_before, longer_after, 1, 0)->Wait());
      // Still usable: a good update after the bad ones arrives.
      return SendTableUpdate(comm, step.before, step.after, 1, 0)->Wait();
    }
    for (int i = 0; i < 3; ++i) {
      received.push_back(RecvTableUpdate(comm, absl::MakeSpan(table), 0, 0, &bytes)->Wait());
      untouched = untouched && SameBits(table, step.before) && bytes == 12345;
    }
    LBCC_RETURN_IF_ERROR(RecvTableUpdate(comm, absl::MakeSpan(table), 0, 0)->Wait());
    return Check(SameBits(table, step.after), "the good update after the bad ones");
  });
  EXPECT_THAT(results, Each(IsOk()));
  ASSERT_EQ(received.size(), 3u);
  EXPECT_THAT(received[0], StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum")));
  EXPECT_THAT(received[1], StatusIs(absl::StatusCode::kDataLoss, HasSubstr("magic")));
  EXPECT_THAT(received[2], StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr(absl::StrCat("table of ", step.before.size()))));
  EXPECT_TRUE(untouched);
}

// Every element changed in a table of 9M floats: the message (values plus a bitmap of n bits)
// is larger than the dense table by n / 8 bytes, above what RecvCompressed once allowed
// (the table's bytes + 1 MiB).
TEST(TableUpdateTest, AWhollyChangedLargeTableStillArrives) {
  constexpr size_t kN = 9'000'000;
  std::vector<float> before(kN), after(kN);
  for (size_t i = 0; i < kN; ++i) {
    before[i] = static_cast<float>(i % 1000);
    after[i] = before[i] + 0.5f;
  }
  std::vector<float> table = before;
  size_t sent = 0;
  auto results = RunRanks(2, {}, [&](int rank, Communicator& comm) -> absl::Status {
    if (rank == 0) return SendTableUpdate(comm, before, after, 1, 7, &sent)->Wait();
    return RecvTableUpdate(comm, absl::MakeSpan(table), 0, 7)->Wait();
  });
  EXPECT_THAT(results, Each(IsOk()));
  EXPECT_EQ(sent, 40 + kN / 8 + 4 * kN);
  EXPECT_TRUE(SameBits(table, after));
}

}  // namespace
}  // namespace lbcc::comm
