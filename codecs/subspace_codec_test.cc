#include "codecs/subspace_codec.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/status_matchers.h"
#include "codecs/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

std::shared_ptr<const SubspaceBasis> MakeBasis(int64_t d, int64_t k, int64_t m, int64_t v,
                                               bool table, uint64_t seed = 17,
                                               uint32_t version = 1) {
  SubspaceSeedSpec spec;
  spec.model_dim = d;
  spec.rank = k;
  spec.components = m;
  spec.vocab_size = v;
  spec.with_table = table;
  spec.table_stddev = 0.5;
  spec.seed = seed;
  spec.version = version;
  auto basis = SubspaceBasis::FromSeed(spec);
  EXPECT_THAT(basis.status(), IsOk());
  return *basis;
}

SubspaceCodec MakeCodec(std::shared_ptr<const SubspaceBasis> basis, DType dtype = DType::kF32,
                        int64_t mixture_block = 8, int64_t int8_block = 32) {
  SubspaceCodecOptions options;
  options.coefficient_dtype = dtype;
  options.mixture_block = mixture_block;
  options.int8_block = int8_block;
  auto codec = SubspaceCodec::Create(std::move(basis), options);
  EXPECT_THAT(codec.status(), IsOk());
  return *std::move(codec);
}

TensorView View(std::vector<float>& x, int64_t rows, int64_t cols) {
  auto view = TensorView::Host(x.data(), {rows, cols});
  EXPECT_THAT(view.status(), IsOk());
  return *view;
}

std::vector<float> Gaussian(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

std::vector<int32_t> Ids(int64_t tokens, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(tokens);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
  if (tokens > 1) ids[1] = static_cast<int32_t>(vocab - 1);  // the largest id travels too
  return ids;
}

// h = T[y] + U_sel c for random c, with the component of each block of `block` tokens given.
std::vector<float> InSubspace(const SubspaceBasis& b, absl::Span<const int32_t> ids,
                              int64_t tokens, absl::Span<const uint8_t> selectors, int64_t block,
                              uint64_t seed, std::vector<double>* coefficients = nullptr) {
  const int64_t d = b.model_dim(), k = b.rank();
  const std::vector<float> c = Gaussian(tokens * k, seed);
  std::vector<float> h(tokens * d);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t m = selectors.empty() ? 0 : selectors[t / block];
    for (int64_t i = 0; i < d; ++i) {
      double s = b.has_table() ? b.table()[ids[t] * d + i] : 0.0;
      for (int64_t j = 0; j < k; ++j) s += double{b.component(m)[i * b.ld() + j]} * c[t * k + j];
      h[t * d + i] = static_cast<float>(s);
    }
  }
  if (coefficients != nullptr) coefficients->assign(c.begin(), c.end());
  return h;
}

double SquaredNorm(absl::Span<const float> x) {
  double s = 0;
  for (float v : x) s += double{v} * v;
  return s;
}

double SquaredDistance(absl::Span<const float> a, absl::Span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
  return s;
}

// The fp32 coefficients of a payload (they end its body).
std::vector<float> Fp32Coefficients(const std::vector<uint8_t>& payload, int64_t count) {
  std::vector<float> c(count);
  std::memcpy(c.data(), payload.data() + payload.size() - 8 - 4 * count, 4 * count);
  return c;
}

void Reseal(std::vector<uint8_t>* payload) {
  const uint64_t sum = XXH3_64bits(payload->data(), payload->size() - 8);
  std::memcpy(payload->data() + payload->size() - 8, &sum, 8);
}

// Offset of the params block in a payload of rank 2.
constexpr size_t kParams = 24 + 16;
// Offset of the body.
constexpr size_t kBody = kParams + kSubspaceParamsBytes;

class SubspaceDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(SubspaceDTypeTest, RoundTripInSubspace) {
  const int64_t d = 64, k = 16, v = 1000, tokens = 37;
  auto basis = MakeBasis(d, k, 1, v, true);
  SubspaceCodec codec = MakeCodec(basis, GetParam());
  const std::vector<int32_t> ids = Ids(tokens, v, 1);
  std::vector<double> c;
  std::vector<float> h = InSubspace(*basis, ids, tokens, {}, 1, 2, &c);
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> payload, codec.EncodeForward(View(h, tokens, d), ids));
  EXPECT_EQ(payload.size(), codec.ForwardPayloadBytes(tokens));
  std::vector<float> out(tokens * d, 0.0f);
  std::vector<int32_t> ids_out(tokens, -1);
  ASSERT_THAT(codec.DecodeForward(payload, View(out, tokens, d), absl::MakeSpan(ids_out)), IsOk());
  EXPECT_EQ(ids_out, ids);
  // U is orthonormal: the activation error is the coefficient error, relative to ||c||.
  double c2 = 0;
  for (double x : c) c2 += x * x;
  const double relative = std::sqrt(SquaredDistance(h, out) / c2);
  const double bound = GetParam() == DType::kF32    ? 1e-6
                       : GetParam() == DType::kF16  ? 1e-3
                       : GetParam() == DType::kBF16 ? 4e-3
                                                    : 1.5e-2;
  EXPECT_LT(relative, bound) << DTypeName(GetParam());
}

TEST_P(SubspaceDTypeTest, IdempotentAfterOneRoundTrip) {
  const int64_t d = 48, k = 12, v = 300, tokens = 21;
  auto basis = MakeBasis(d, k, 1, v, true);
  SubspaceCodec codec = MakeCodec(basis, GetParam(), 8, 5);
  const std::vector<int32_t> ids = Ids(tokens, v, 3);
  std::vector<float> h = Gaussian(tokens * d, 4);  // arbitrary, not in the subspace
  LBCC_ASSERT_OK_AND_ASSIGN(auto p1, codec.EncodeForward(View(h, tokens, d), ids));
  std::vector<float> once(tokens * d), twice(tokens * d);
  ASSERT_THAT(codec.DecodeForward(p1, View(once, tokens, d)), IsOk());
  LBCC_ASSERT_OK_AND_ASSIGN(auto p2, codec.EncodeForward(View(once, tokens, d), ids));
  ASSERT_THAT(codec.DecodeForward(p2, View(twice, tokens, d)), IsOk());
  if (GetParam() == DType::kBF16 || GetParam() == DType::kF16) {
    // Decoded coefficients are representable; re-encoding lands on the same values.
    EXPECT_EQ(p1, p2);
  }
  EXPECT_LT(std::sqrt(SquaredDistance(once, twice) / SquaredNorm(once)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, SubspaceDTypeTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kI8),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(SubspaceCodecTest, EnergyIdentityForArbitraryActivations) {
  const int64_t d = 96, k = 20, v = 50, tokens = 33;
  auto basis = MakeBasis(d, k, 1, v, true);
  SubspaceCodec codec = MakeCodec(basis);
  const std::vector<int32_t> ids = Ids(tokens, v, 5);
  std::vector<float> h = Gaussian(tokens * d, 6);
  LBCC_ASSERT_OK_AND_ASSIGN(auto payload, codec.EncodeForward(View(h, tokens, d), ids));
  std::vector<float> out(tokens * d);
  ASSERT_THAT(codec.DecodeForward(payload, View(out, tokens, d)), IsOk());
  double centred = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      const double x = double{h[t * d + i]} - basis->table()[ids[t] * d + i];
      centred += x * x;
    }
  }
  const double c2 = SquaredNorm(Fp32Coefficients(payload, tokens * k));
  // ||h - dec(enc(h))||^2 = ||h - T[y]||^2 - ||c||^2.
  EXPECT_NEAR(SquaredDistance(h, out), centred - c2, 1e-5 * centred);
  EXPECT_GT(c2, 0.1 * centred);  // the identity is not vacuous: both terms are large

  LBCC_ASSERT_OK_AND_ASSIGN(SubspaceEnergy energy, codec.MeasureEnergy(View(h, tokens, d), ids));
  EXPECT_NEAR(energy.total, centred, 1e-6 * centred);
  EXPECT_NEAR(energy.captured, c2, 1e-5 * centred);
  EXPECT_NEAR(energy.residual, SquaredDistance(h, out), 1e-5 * centred);
  EXPECT_NEAR(energy.residual_fraction(), 1.0 - c2 / centred, 1e-5);
}

TEST(SubspaceCodecTest, AdjointOfEncodeAndDecode) {
  const int64_t d = 80, k = 10, tokens = 19;
  for (int64_t m : {1, 3}) {
    auto basis = MakeBasis(d, k, m, 0, false, 23 + m);
    SubspaceCodec codec = MakeCodec(basis, DType::kF32, 4);
    SubspaceSelectors selectors;
    if (m > 1) {
      selectors.mixture_block = 4;
      selectors.values = {0, 2, 1, 1, 2};
    }
    std::vector<float> a = Gaussian(tokens * d, 7), g = Gaussian(tokens * d, 8);
    // c = U^T a and U c from one backward payload; U^T g from another.
    LBCC_ASSERT_OK_AND_ASSIGN(auto pa, codec.EncodeBackward(View(a, tokens, d), selectors));
    LBCC_ASSERT_OK_AND_ASSIGN(auto pg, codec.EncodeBackward(View(g, tokens, d), selectors));
    const std::vector<float> c = Fp32Coefficients(pa, tokens * k);
    const std::vector<float> utg = Fp32Coefficients(pg, tokens * k);
    std::vector<float> uc(tokens * d);
    SubspaceSelectors decoded;
    ASSERT_THAT(codec.DecodeBackward(pa, View(uc, tokens, d), &decoded), IsOk());
    EXPECT_EQ(decoded.values, selectors.values);
    double lhs = 0, rhs = 0, scale = 0;
    for (int64_t i = 0; i < tokens * d; ++i) lhs += double{uc[i]} * g[i];
    for (int64_t i = 0; i < tokens * k; ++i) {
      rhs += double{c[i]} * utg[i];
      scale += std::fabs(double{c[i]} * utg[i]);
    }
    EXPECT_NEAR(lhs, rhs, 1e-5 * scale) << "M = " << m;
  }
}

TEST(SubspaceCodecTest, ByteAccounting) {
  // The reference example: d 1024, k 160, bf16 coefficients, a vocabulary needing 2-byte ids.
  const int64_t d = 1024, k = 160, v = 50257, tokens = 64;
  auto basis = MakeBasis(d, k, 1, v, false);
  SubspaceCodec codec = MakeCodec(basis, DType::kBF16);
  EXPECT_EQ(basis->id_width(), 2);
  const size_t envelope = PayloadOverheadBytes(2) + kSubspaceParamsBytes;
  EXPECT_EQ(envelope, 76u);
  EXPECT_EQ(codec.ForwardPayloadBytes(tokens), 322 * tokens + envelope);
  EXPECT_EQ(codec.BackwardPayloadBytes(tokens), 320 * tokens + envelope);
  std::vector<float> h = Gaussian(tokens * d, 9);
  LBCC_ASSERT_OK_AND_ASSIGN(auto fwd, codec.EncodeForward(View(h, tokens, d), Ids(tokens, v, 1)));
  EXPECT_EQ(fwd.size(), 322 * tokens + envelope);
  LBCC_ASSERT_OK_AND_ASSIGN(auto bwd, codec.EncodeBackward(View(h, tokens, d)));
  EXPECT_EQ(bwd.size(), 320 * tokens + envelope);
  // int8 in blocks of 32: 160 bytes + 5 fp32 scales + 2-byte id.
  SubspaceCodec int8 = MakeCodec(basis, DType::kI8, 8, 32);
  EXPECT_EQ(int8.ForwardPayloadBytes(tokens), 182 * tokens + envelope);
  SubspaceCodec fp32 = MakeCodec(basis, DType::kF32);
  EXPECT_EQ(fp32.ForwardPayloadBytes(tokens), 642 * tokens + envelope);
}

TEST(SubspaceCodecTest, IdsTravelInTheNarrowestWidth) {
  const int64_t d = 8, k = 2, tokens = 3;
  for (int64_t v : {int64_t{1}, int64_t{256}, int64_t{257}, int64_t{65536}, int64_t{65537},
                    int64_t{1} << 24, (int64_t{1} << 24) + 1, int64_t{INT32_MAX}}) {
    auto basis = MakeBasis(d, k, 1, v, false);
    SubspaceCodec codec = MakeCodec(basis);
    std::vector<float> h = Gaussian(tokens * d, 10);
    const std::vector<int32_t> ids = {0, static_cast<int32_t>(v - 1), static_cast<int32_t>(v / 2)};
    LBCC_ASSERT_OK_AND_ASSIGN(auto payload, codec.EncodeForward(View(h, tokens, d), ids));
    LBCC_ASSERT_OK_AND_ASSIGN(SubspacePayloadHeader header, InspectSubspacePayload(payload));
    EXPECT_EQ(header.id_width, SubspaceIdWidth(v));
    EXPECT_EQ(header.vocab_size, v);
    EXPECT_EQ(payload.size(), 76 + tokens * (k * 4 + SubspaceIdWidth(v)));
    std::vector<float> out(tokens * d);
    std::vector<int32_t> ids_out(tokens);
    ASSERT_THAT(codec.DecodeForward(payload, View(out, tokens, d), absl::MakeSpan(ids_out)), IsOk());
    EXPECT_EQ(ids_out, ids) << "V = " << v;
  }
}

TEST(SubspaceCodecTest, WithoutVocabularyOrTable) {
  const int64_t d = 32, k = 8, tokens = 10;
  auto basis = MakeBasis(d, k, 1, 0, false);
  SubspaceCodec codec = MakeCodec(basis);
  std::vector<float> h = InSubspace(*basis, {}, tokens, {}, 1, 11);
  LBCC_ASSERT_OK_AND_ASSIGN(auto payload, codec.EncodeForward(View(h, tokens, d), {}));
  EXPECT_EQ(payload.size(), 76 + tokens * k * 4);
  std::vector<float> out(tokens * d);
  ASSERT_THAT(codec.DecodeForward(payload, View(out, tokens, d)), IsOk());
  EXPECT_LT(SquaredDistance(h, out), 1e-10 * SquaredNorm(h));
  std::vector<int32_t> ids(tokens, 0);
  EXPECT_THAT(codec.EncodeForward(View(h, tokens, d), ids).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no vocabulary")));
  EXPECT_THAT(codec.DecodeForward(payload, View(out, tokens, d), absl::MakeSpan(ids)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SubspaceCodecTest, ZeroTokens) {
  auto basis = MakeBasis(16, 4, 2, 10, true);
  SubspaceCodec codec = MakeCodec(basis, DType::kBF16);
  std::vector<float> h;
  LBCC_ASSERT_OK_AND_ASSIGN(auto payload, codec.EncodeForward(View(h, 0, 16), {}));
  EXPECT_EQ(payload.size(), 76u);
  ASSERT_THAT(codec.DecodeForward(payload, View(h, 0, 16)), IsOk());
  LBCC_ASSERT_OK_AND_ASSIGN(auto back, codec.EncodeBackward(View(h, 0, 16), {4, {}}));
  ASSERT_THAT(codec.DecodeBackward(back, View(h, 0, 16)), IsOk());
}

TEST(SubspaceCodecTest, MixtureChoosesTheComponentHoldingEachBlock) {
  const int64_t d = 48, k = 6, m = 3, v = 100, block = 8, tokens = 43;  // 6 blocks, last partial
  auto basis = MakeBasis(d, k, m, v, true);
  SubspaceCodec codec = MakeCodec(basis, DType::kF32, block);
  EXPECT_EQ(codec.NumSelectors(tokens), 6);
  const std::vector<uint8_t> truth = {2, 0, 0, 1, 2, 1};
  const std::vector<int32_t> ids = Ids(tokens, v, 12);
  std::vector<float> h = InSubspace(*basis, ids, tokens, truth, block, 13);
  SubspaceSelectors chosen;
  LBCC_ASSERT_OK_AND_ASSIGN(auto payload, codec.EncodeForward(View(h, tokens, d), ids, &chosen));
  EXPECT_EQ(chosen.mixture_block, block);
  EXPECT_EQ(chosen.values, truth);
  EXPECT_EQ(payload.size(), codec.ForwardPayloadBytes(tokens));
  EXPECT_EQ(payload.size(), 76 + 6 + tokens * (k * 4 + 1));
  std::vector<float> out(tokens * d);
  SubspaceSelectors decoded;
  ASSERT_THAT(codec.DecodeForward(payload, View(out, tokens, d), {}, &decoded), IsOk());
  EXPECT_EQ(decoded.values, truth);
  EXPECT_LT(SquaredDistance(h, out), 1e-10 * SquaredNorm(h));

  // A single basis of the same bytes (component 0 alone) loses the other blocks' energy.
  std::vector<float> u0(d * k);
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < k; ++j) u0[i * k + j] = basis->component(0)[i * basis->ld() + j];
  }
  LBCC_ASSERT_OK_AND_ASSIGN(
      auto single, SubspaceBasis::FromMatrices(d, k, 1, v, u0,
                                               {basis->table().begin(), basis->table().end()}, 1));
  SubspaceCodec single_codec = MakeCodec(single);
  LBCC_ASSERT_OK_AND_ASSIGN(SubspaceEnergy e_single,
                            single_codec.MeasureEnergy(View(h, tokens, d), ids));
  LBCC_ASSERT_OK_AND_ASSIGN(SubspaceEnergy e_mixture, codec.MeasureEnergy(View(h, tokens, d), ids));
  EXPECT_LT(e_mixture.residual_fraction(), 1e-8);
  EXPECT_GT(e_single.residual_fraction(), 0.5);

  // Backward with the forward's selectors: g_h -> U_sel U_sel^T g_h block by block.
  std::vector<float> g = Gaussian(tokens * d, 14);
  LBCC_ASSERT_OK_AND_ASSIGN(auto back, codec.EncodeBackward(View(g, tokens, d), decoded));
  std::vector<float> g_out(tokens * d);
  ASSERT_THAT(codec.DecodeBackward(back, View(g_out, tokens, d)), IsOk());
  for (int64_t t = 0; t < tokens; t += 5) {
    const float* u = basis->component(truth[t / block]);
    for (int64_t i = 0; i < d; ++i) {
      double expected = 0;
      for (int64_t j = 0; j < k; ++j) {
        double cj = 0;
        for (int64_t s = 0; s < d; ++s) cj += double{u[s * basis->ld() + j]} * g[t * d + s];
        expected += u[i * basis->ld() + j] * cj;
      }
      EXPECT_NEAR(g_out[t * d + i], expected, 1e-5);
    }
  }
}

TEST(SubspaceCodecTest, LargeModelDimDecodesInStages) {
  // At d = 4096 the decoder stages 64 output rows at a time: several stages per component and
  // for the single basis, with partial blocks and a partial last stage.
  const int64_t d = 4096, k = 3, v = 50, block = 8, tokens = 203;
  std::vector<uint8_t> truth;
  for (int64_t b = 0; b < 26; ++b) truth.push_back(static_cast<uint8_t>((b * b + b / 5) % 2));
  const std::vector<int32_t> ids = Ids(tokens, v, 40);
  for (int64_t m : {1, 2}) {
    auto basis = MakeBasis(d, k, m, v, true, 41);
    SubspaceCodec codec = MakeCodec(basis, DType::kF32, block);
    std::vector<float> h = InSubspace(*basis, ids, tokens, m > 1 ? truth : std::vector<uint8_t>{},
                                      block, 42);
    SubspaceSelectors chosen;
    LBCC_ASSERT_OK_AND_ASSIGN(auto payload, codec.EncodeForward(View(h, tokens, d), ids, &chosen));
    if (m > 1) EXPECT_EQ(chosen.values, truth);
    std::vector<float> out(tokens * d);
    ASSERT_THAT(codec.DecodeForward(payload, View(out, tokens, d)), IsOk());
    EXPECT_LT(SquaredDistance(h, out), 1e-10 * SquaredNorm(h)) << "M = " << m;
    for (int64_t t = 0; t < tokens; ++t) {  // row by row: a misplaced row cannot hide
      ASSERT_LT(SquaredDistance(absl::MakeSpan(h).subspan(t * d, d),
                                absl::MakeSpan(out).subspan(t * d, d)),
                1e-8)
          << "token " << t << " M = " << m;
    }
  }
}

// Everything a decoder rejects, and the output it must leave untouched.
class SubspaceRejectionTest : public ::testing::Test {
 protected:
  static constexpr int64_t kD = 24, kK = 4, kV = 300, kTokens = 9, kBlock = 4;
  static constexpr float kSentinel = 12345.0f;

  void SetUp() override {
    basis_ = MakeBasis(kD, kK, 1, kV, true, 31, 2);
    mixture_ = MakeBasis(kD, kK, 3, kV, true, 32, 2);
    ids_ = Ids(kTokens, kV, 15);
    h_ = Gaussian(kTokens * kD, 16);
    out_.assign(kTokens * kD, kSentinel);
  }

  // Decodes with `codec` in `direction` and checks the status and that nothing was written.
  void ExpectRejected(SubspaceCodec& codec, const std::vector<uint8_t>& payload, bool forward,
                      absl::StatusCode code, absl::string_view message) {
    std::vector<int32_t> ids(kTokens, -7);
    SubspaceSelectors selectors{99, {42}};
    const absl::Status status =
        forward ? codec.DecodeForward(payload, View(out_, kTokens, kD), absl::MakeSpan(ids),
                                      &selectors)
                : codec.DecodeBackward(payload, View(out_, kTokens, kD), &selectors);
    EXPECT_THAT(status, StatusIs(code, HasSubstr(std::string(message))));
    for (float x : out_) ASSERT_EQ(x, kSentinel) << status;
    for (int32_t id : ids) ASSERT_EQ(id, -7);
    EXPECT_EQ(selectors.mixture_block, 99);
    EXPECT_EQ(selectors.values, std::vector<uint8_t>{42});
  }

  std::shared_ptr<const SubspaceBasis> basis_, mixture_;
  std::vector<int32_t> ids_;
  std::vector<float> h_, out_;
};

TEST_F(SubspaceRejectionTest, EncoderRejectsBadInput) {
  SubspaceCodec codec = MakeCodec(basis_, DType::kBF16);
  std::vector<int32_t> ids = ids_;
  ids[3] = kV;
  EXPECT_THAT(codec.EncodeForward(View(h_, kTokens, kD), ids).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id 300")));
  ids[3] = -1;
  EXPECT_THAT(codec.EncodeForward(View(h_, kTokens, kD), ids).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id -1")));
  EXPECT_THAT(codec.EncodeForward(View(h_, kTokens, kD), absl::MakeSpan(ids_).subspan(1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token ids for")));
  EXPECT_THAT(codec.EncodeForward(View(h_, kTokens * 2, kD / 2), ids_).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected f32[tokens, 24]")));
  std::vector<uint16_t> half(kTokens * kD);
  LBCC_ASSERT_OK_AND_ASSIGN(TensorView bf16,
                            TensorView::Create(half.data(), DType::kBF16, {kTokens, kD}));
  EXPECT_THAT(codec.EncodeForward(bf16, ids_).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<uint8_t> small(codec.ForwardPayloadBytes(kTokens) - 1);
  EXPECT_THAT(codec.EncodeForward(View(h_, kTokens, kD), ids_, absl::MakeSpan(small)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("buffer")));
  EXPECT_THAT(codec.EncodeBackward(View(h_, kTokens, kD), {kBlock, {0, 0, 0}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no selectors")));

  SubspaceCodec mix = MakeCodec(mixture_, DType::kBF16, kBlock);
  EXPECT_THAT(mix.EncodeBackward(View(h_, kTokens, kD), {kBlock, {0, 1}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 selectors")));
  EXPECT_THAT(mix.EncodeBackward(View(h_, kTokens, kD), {kBlock, {0, 1, 3}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("selector 3")));
  EXPECT_THAT(mix.EncodeBackward(View(h_, kTokens, kD), {0, {}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mixture_block")));

  SubspaceCodecOptions bad;
  bad.coefficient_dtype = DType::kI32;
  EXPECT_THAT(SubspaceCodec::Create(basis_, bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  bad = {};
  bad.int8_block = 0;
  EXPECT_THAT(SubspaceCodec::Create(basis_, bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  bad = {};
  bad.mixture_block = 65536;
  EXPECT_THAT(SubspaceCodec::Create(basis_, bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SubspaceCodec::Create(nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(SubspaceRejectionTest, CorruptBytes) {
  SubspaceCodec codec = MakeCodec(basis_, DType::kI8, kBlock, 3);
  LBCC_ASSERT_OK_AND_ASSIGN(auto good, codec.EncodeForward(View(h_, kTokens, kD), ids_));
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; bit += 3) {
      std::vector<uint8_t> bad = good;
      bad[byte] ^= static_cast<uint8_t>(1u << bit);
      ExpectRejected(codec, bad, true, absl::StatusCode::kDataLoss, "");
    }
  }
  for (size_t length = 0; length < good.size(); length += 7) {
    ExpectRejected(codec, std::vector<uint8_t>(good.begin(), good.begin() + length), true,
                   absl::StatusCode::kDataLoss, "");
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  ExpectRejected(codec, longer, true, absl::StatusCode::kDataLoss, "trailing");
  ExpectRejected(codec, good, false, absl::StatusCode::kDataLoss, "forward payload");
}

TEST_F(SubspaceRejectionTest, ResealedButInconsistentPayloads) {
  SubspaceCodec codec = MakeCodec(basis_, DType::kI8, kBlock, 3);
  LBCC_ASSERT_OK_AND_ASSIGN(auto good, codec.EncodeForward(View(h_, kTokens, kD), ids_));
  auto patched = [&](size_t offset, absl::Span<const uint8_t> bytes) {
    std::vector<uint8_t> p = good;
    std::memcpy(p.data() + offset, bytes.data(), bytes.size());
    Reseal(&p);
    return p;
  };
  // ids are 2 bytes each at the start of the body; 300 and 0xffff are outside [0, 300).
  ExpectRejected(codec, patched(kBody + 2 * 4, {0x2c, 0x01}), true, absl::StatusCode::kDataLoss,
                 "token id 300 at position 4");
  ExpectRejected(codec, patched(kBody, {0xff, 0xff}), true, absl::StatusCode::kDataLoss,
                 "token id 65535");
  // Scales follow the ids: a negative or NaN scale.
  const size_t scales = kBody + 2 * kTokens;
  ExpectRejected(codec, patched(scales + 4, {0, 0, 0x80, 0xbf}), true,
                 absl::StatusCode::kDataLoss, "int8 scale");
  ExpectRejected(codec, patched(scales, {0, 0, 0xc0, 0x7f}), true, absl::StatusCode::kDataLoss,
                 "int8 scale");
  // Params: version of the codec, id width, coefficient dtype, k, M, mixture block.
  ExpectRejected(codec, patched(5, {2}), true, absl::StatusCode::kDataLoss, "codec version");
  ExpectRejected(codec, patched(kParams + 27, {3}), true, absl::StatusCode::kDataLoss, "id width");
  ExpectRejected(codec, patched(kParams + 26, {static_cast<uint8_t>(DType::kI32)}), true,
                 absl::StatusCode::kDataLoss, "coefficient dtype");
  ExpectRejected(codec, patched(kParams + 12, {25, 0, 0, 0}), true, absl::StatusCode::kDataLoss,
                 "k = 25");
  ExpectRejected(codec, patched(kParams + 20, {0, 0}), true, absl::StatusCode::kDataLoss, "M = 0");
  ExpectRejected(codec, patched(kParams + 22, {4, 0}), true, absl::StatusCode::kDataLoss,
                 "mixture block");
  ExpectRejected(codec, patched(kParams + 24, {0, 0}), true, absl::StatusCode::kDataLoss,
                 "int8 block");
  ExpectRejected(codec, patched(8, {static_cast<uint8_t>(DType::kBF16)}), true,
                 absl::StatusCode::kDataLoss, "activation dtype");
  ExpectRejected(codec, patched(10, {1, 0}), true, absl::StatusCode::kDataLoss, "flags");
  // A shape that disagrees with the body.
  ExpectRejected(codec, patched(24, {kTokens + 1}), true, absl::StatusCode::kDataLoss, "body");
  ExpectRejected(codec, patched(24, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0}), true,
                 absl::StatusCode::kDataLoss, "");
  // Same basis hash and version, but a different d: inconsistent, so corrupt.
  ExpectRejected(codec, patched(32, {kD + 1}), true, absl::StatusCode::kDataLoss, "");
  // Another codec's payload.
  std::vector<uint8_t> other(PayloadBytes(2, 0, 8));
  PayloadWriter writer;
  ASSERT_THAT(writer.Begin(absl::MakeSpan(other), CodecId::kDenseQuant, 1, DType::kF32, {2, 1}, 0,
                           8),
              IsOk());
  writer.Finish();
  ExpectRejected(codec, other, true, absl::StatusCode::kDataLoss, "dense_quant");
}

TEST_F(SubspaceRejectionTest, MixtureSelectorsOutOfRange) {
  SubspaceCodec codec = MakeCodec(mixture_, DType::kF32, kBlock);
  LBCC_ASSERT_OK_AND_ASSIGN(auto good, codec.EncodeForward(View(h_, kTokens, kD), ids_));
  std::vector<uint8_t> bad = good;
  bad[kBody + 1] = 3;  // selectors open the body
  Reseal(&bad);
  ExpectRejected(codec, bad, true, absl::StatusCode::kDataLoss, "selector 3 of block 1");
  LBCC_ASSERT_OK_AND_ASSIGN(auto back,
                            codec.EncodeBackward(View(h_, kTokens, kD), {kBlock, {0, 1, 2}}));
  bad = back;
  bad[kBody + 2] = 200;
  Reseal(&bad);
  ExpectRejected(codec, bad, false, absl::StatusCode::kDataLoss, "selector 200");
}

TEST_F(SubspaceRejectionTest, ForeignBasis) {
  SubspaceCodec codec = MakeCodec(basis_, DType::kBF16);
  LBCC_ASSERT_OK_AND_ASSIGN(auto fwd, codec.EncodeForward(View(h_, kTokens, kD), ids_));
  LBCC_ASSERT_OK_AND_ASSIGN(auto bwd, codec.EncodeBackward(View(h_, kTokens, kD)));
  // Another seed (hash differs), the same U and T under another version, another d.
  SubspaceCodec other_seed = MakeCodec(MakeBasis(kD, kK, 1, kV, true, 99, 2));
  LBCC_ASSERT_OK_AND_ASSIGN(
      auto next_version,
      SubspaceBasis::FromMatrices(kD, kK, 1, kV, {basis_->u().begin(), basis_->u().end()},
                                  {basis_->table().begin(), basis_->table().end()}, 3));
  SubspaceCodec other_version = MakeCodec(next_version);
  SubspaceCodec other_vocab = MakeCodec(MakeBasis(kD, kK, 1, kV + 1, true, 31, 2));
  for (const auto* payload : {&fwd, &bwd}) {
    const bool forward = payload == &fwd;
    ExpectRejected(other_seed, *payload, forward, absl::StatusCode::kFailedPrecondition,
                   "encoded with basis");
    ExpectRejected(other_version, *payload, forward, absl::StatusCode::kFailedPrecondition,
                   absl::StrCat("/v2"));
    ExpectRejected(other_vocab, *payload, forward, absl::StatusCode::kFailedPrecondition, "");
  }
  SubspaceCodec other_d = MakeCodec(MakeBasis(kD + 8, kK, 1, kV, true, 31, 2));
  std::vector<float> wide(kTokens * (kD + 8), kSentinel);
  EXPECT_THAT(other_d.DecodeForward(fwd, View(wide, kTokens, kD + 8)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("d 24")));
  for (float x : wide) ASSERT_EQ(x, kSentinel);
  LBCC_ASSERT_OK_AND_ASSIGN(SubspacePayloadHeader header, InspectSubspacePayload(fwd));
  EXPECT_EQ(header.basis, basis_->id());
}

TEST_F(SubspaceRejectionTest, WrongOutputBuffers) {
  SubspaceCodec codec = MakeCodec(basis_, DType::kBF16);
  LBCC_ASSERT_OK_AND_ASSIGN(auto fwd, codec.EncodeForward(View(h_, kTokens, kD), ids_));
  std::vector<float> short_out((kTokens - 1) * kD, kSentinel);
  EXPECT_THAT(codec.DecodeForward(fwd, View(short_out, kTokens - 1, kD)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("output")));
  for (float x : short_out) ASSERT_EQ(x, kSentinel);
  std::vector<int32_t> few_ids(kTokens - 1, -7);
  EXPECT_THAT(codec.DecodeForward(fwd, View(out_, kTokens, kD), absl::MakeSpan(few_ids)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ids output")));
  for (float x : out_) ASSERT_EQ(x, kSentinel);
}

}  // namespace
}  // namespace lbcc::codecs

namespace lbcc::codecs {
namespace {

// --- SubspacePayloadCodec: the subspace codec as a codecs::Codec.

SubspaceCodecOptions Options(DType dtype, int64_t mixture_block) {
  SubspaceCodecOptions o;
  o.coefficient_dtype = dtype;
  o.mixture_block = mixture_block;
  return o;
}

TEST(SubspacePayloadCodecTest, EncodesAndDecodesAsTheSubspaceCodec) {
  const int64_t d = 40, k = 8, m = 3, v = 500, tokens = 29, block = 8;
  auto basis = MakeBasis(d, k, m, v, true);
  SubspaceCodec reference = MakeCodec(basis, DType::kBF16, block);
  LBCC_ASSERT_OK_AND_ASSIGN(
      auto forward, SubspacePayloadCodec::Create(basis, SubspaceDirection::kForward,
                                                 Options(DType::kBF16, block)));
  LBCC_ASSERT_OK_AND_ASSIGN(
      auto backward, SubspacePayloadCodec::Create(basis, SubspaceDirection::kBackward,
                                                  Options(DType::kBF16, block)));
  EXPECT_EQ(forward->id(), CodecId::kSubspaceForward);
  EXPECT_EQ(backward->id(), CodecId::kSubspaceBackward);
  EXPECT_THAT(forward->Describe(), HasSubstr("bf16"));
  const std::vector<int32_t> ids = Ids(tokens, v, 11);
  std::vector<float> h = Gaussian(tokens * d, 12);

  // Forward: the ids come in the state, the chosen selectors come back in it.
  SubspaceSelectors want_selectors;
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> want,
                            reference.EncodeForward(View(h, tokens, d), ids, &want_selectors));
  std::unique_ptr<CodecState> state = forward->NewState();
  ASSERT_NE(state, nullptr);
  auto& message = static_cast<SubspaceMessageState&>(*state);
  message.set_ids(ids);
  LBCC_ASSERT_OK_AND_ASSIGN(const size_t max, forward->MaxEncodedBytes({tokens, d}));
  std::vector<uint8_t> got(max);
  LBCC_ASSERT_OK_AND_ASSIGN(const size_t size,
                            forward->Encode(View(h, tokens, d), state.get(), absl::MakeSpan(got)));
  got.resize(size);
  EXPECT_EQ(got, want);
  EXPECT_EQ(message.selectors().values, want_selectors.values);
  EXPECT_FALSE(message.has_pending());
  EXPECT_THAT(message.Commit(), StatusIs(absl::StatusCode::kFailedPrecondition));

  // Decode through codec.h's free function, with the codec (it holds the basis).
  std::vector<float> out(tokens * d, 7.0f), ref(tokens * d);
  ASSERT_THAT(reference.DecodeForward(want, View(ref, tokens, d)), IsOk());
  const absl::Span<const uint8_t> span(got);
  ASSERT_THAT(DecodeAccumulate(*forward, absl::MakeConstSpan(&span, 1), {}, View(out, tokens, d)),
              IsOk());
  EXPECT_EQ(out, ref);
  // Two payloads: their mean, as dense payloads aggregate; accumulate adds it.
  const absl::Span<const uint8_t> two[2] = {span, span};
  std::vector<float> acc(tokens * d, 1.0f);
  ASSERT_THAT(DecodeAccumulate(*forward, two, {Aggregation::kMean, true}, View(acc, tokens, d)),
              IsOk());
  for (size_t i = 0; i < acc.size(); ++i) ASSERT_EQ(acc[i], 1.0f + (ref[i] + ref[i]) / 2) << i;

  // Backward: the forward's selectors go in the state.
  std::vector<float> g = Gaussian(tokens * d, 13);
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> want_back,
                            reference.EncodeBackward(View(g, tokens, d), want_selectors));
  std::unique_ptr<CodecState> back_state = backward->NewState();
  static_cast<SubspaceMessageState&>(*back_state).set_selectors(want_selectors);
  std::vector<uint8_t> got_back(*backward->MaxEncodedBytes({tokens, d}));
  LBCC_ASSERT_OK_AND_ASSIGN(
      const size_t back_size,
      backward->Encode(View(g, tokens, d), back_state.get(), absl::MakeSpan(got_back)));
  got_back.resize(back_size);
  EXPECT_EQ(got_back, want_back);
  // A forward payload is not the backward codec's.
  EXPECT_THAT(DecodeAccumulate(*backward, absl::MakeConstSpan(&span, 1), {}, View(out, tokens, d)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // A state of the other direction, or of another object, is refused.
  EXPECT_THAT(backward->Encode(View(g, tokens, d), state.get(), absl::MakeSpan(got_back)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("SubspaceMessageState")));
  LBCC_ASSERT_OK_AND_ASSIGN(
      auto other, SubspacePayloadCodec::Create(basis, SubspaceDirection::kForward,
                                               Options(DType::kF32, block)));
  EXPECT_THAT(other->Encode(View(h, tokens, d), state.get(), absl::MakeSpan(got)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NewState()")));

  // Zero tokens aggregate to nothing.
  std::unique_ptr<CodecState> empty_state = forward->NewState();
  std::vector<uint8_t> empty(*forward->MaxEncodedBytes({0, d}));
  std::vector<float> none;
  LBCC_ASSERT_OK_AND_ASSIGN(
      const size_t empty_size,
      forward->Encode(*TensorView::Host(none.data(), {0, d}), empty_state.get(),
                      absl::MakeSpan(empty)));
  const absl::Span<const uint8_t> empties[2] = {
      absl::MakeConstSpan(empty).subspan(0, empty_size),
      absl::MakeConstSpan(empty).subspan(0, empty_size)};
  EXPECT_THAT(DecodeAccumulate(*forward, empties, {}, *TensorView::Host(none.data(), {0, d})),
              IsOk());
}

TEST(SubspacePayloadCodecTest, TheRegistryInspectsSubspacePayloads) {
  const int64_t d = 24, k = 6, v = 300, tokens = 5;
  auto basis = MakeBasis(d, k, 1, v, true);
  SubspaceCodec codec = MakeCodec(basis, DType::kI8);
  const std::vector<int32_t> ids = Ids(tokens, v, 21);
  std::vector<float> h = Gaussian(tokens * d, 22);
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> payload,
                            codec.EncodeForward(View(h, tokens, d), ids));
  LBCC_ASSERT_OK_AND_ASSIGN(PayloadSummary summary, InspectPayload(payload));
  EXPECT_EQ(summary.codec, CodecId::kSubspaceForward);
  EXPECT_EQ(summary.selected, tokens * k);
  EXPECT_EQ(summary.total_bytes, payload.size());
  EXPECT_THAT(summary.details, HasSubstr("5 tokens"));
  EXPECT_THAT(summary.details, HasSubstr(basis->id().ToString()));
  EXPECT_THAT(summary.details, HasSubstr("i8"));

  // Without a codec holding the basis, DecodeAccumulate cannot decode it.
  std::vector<float> out(tokens * d, 7.0f);
  const absl::Span<const uint8_t> span(payload);
  EXPECT_THAT(DecodeAccumulate(absl::MakeConstSpan(&span, 1), {}, View(out, tokens, d)),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("basis")));
  EXPECT_THAT(out, ::testing::Each(7.0f));
  // The registered object inspects only.
  auto inspector = SubspacePayloadCodec::Inspector(SubspaceDirection::kForward);
  EXPECT_EQ(inspector->NewState(), nullptr);
  EXPECT_THAT(inspector->MaxEncodedBytes({tokens, d}),
              StatusIs(absl::StatusCode::kFailedPrecondition));

  // A token id >= V under a valid checksum: the body check of InspectPayload finds it.
  std::vector<uint8_t> bad = payload;
  const size_t ids_at = kBody;  // a single basis: the ids start the body
  bad[ids_at] = 0xFF;
  bad[ids_at + 1] = 0xFF;
  Reseal(&bad);
  EXPECT_THAT(InspectPayload(bad), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("token id")));
}

TEST(SubspacePayloadCodecTest, ForeignBasisIsFailedPreconditionAndNothingIsWritten) {
  const int64_t d = 24, k = 6, tokens = 4;
  auto basis = MakeBasis(d, k, 1, 0, false, 1);
  auto other = MakeBasis(d, k, 1, 0, false, 2);
  SubspaceCodec codec = MakeCodec(basis);
  std::vector<float> g = Gaussian(tokens * d, 31);
  LBCC_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> payload, codec.EncodeBackward(View(g, tokens, d)));
  LBCC_ASSERT_OK_AND_ASSIGN(auto decoder,
                            SubspacePayloadCodec::Create(other, SubspaceDirection::kBackward));
  std::vector<float> out(tokens * d, 7.0f);
  const absl::Span<const uint8_t> span(payload);
  EXPECT_THAT(DecodeAccumulate(*decoder, absl::MakeConstSpan(&span, 1), {}, View(out, tokens, d)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("payload 0")));
  EXPECT_THAT(out, ::testing::Each(7.0f));
}

}  // namespace
}  // namespace lbcc::codecs
