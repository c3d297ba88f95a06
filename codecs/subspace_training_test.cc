#include "codecs/subspace_training.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "base/status_matchers.h"
#include "codecs/subspace_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

std::shared_ptr<const SubspaceBasis> MakeBasis(int64_t d, int64_t k, int64_t m, int64_t v,
                                               bool table, uint64_t seed = 5) {
  SubspaceSeedSpec spec;
  spec.model_dim = d;
  spec.rank = k;
  spec.components = m;
  spec.vocab_size = v;
  spec.with_table = table;
  spec.table_stddev = 0.5;
  spec.seed = seed;
  spec.version = 4;
  auto basis = SubspaceBasis::FromSeed(spec);
  EXPECT_THAT(basis.status(), IsOk());
  return *basis;
}

TensorView View(std::vector<float>& x, int64_t rows, int64_t cols) {
  auto view = TensorView::Host(x.data(), {rows, cols});
  EXPECT_THAT(view.status(), IsOk());
  return *view;
}

std::vector<float> Gaussian(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(dist(rng));
  return x;
}

// U U^T x for a row-major [rows x d] matrix, in double.
std::vector<double> ProjectRowsReference(const SubspaceBasis& b, absl::Span<const float> x,
                                         int64_t rows) {
  const int64_t d = b.model_dim(), k = b.rank();
  std::vector<double> out(rows * d, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      double c = 0;
      for (int64_t i = 0; i < d; ++i) c += double{b.u()[i * k + j]} * x[r * d + i];
      for (int64_t i = 0; i < d; ++i) out[r * d + i] += b.u()[i * k + j] * c;
    }
  }
  return out;
}

std::vector<float> Transpose(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  }
  return t;
}

class ProjectWeightTest : public ::testing::TestWithParam<SubspaceArithmetic> {};

TEST_P(ProjectWeightTest, BothOrientations) {
  const int64_t d = 40, k = 7, n = 300;
  auto basis = MakeBasis(d, k, 1, 0, false);
  const std::vector<float> w = Gaussian(n * d, 1);  // [n x d]
  const std::vector<double> expected = ProjectRowsReference(*basis, w, n);

  std::vector<float> cols = w;
  ASSERT_THAT(ProjectWeight(*basis, View(cols, n, d), ModelDimSide::kColumns, GetParam()), IsOk());
  std::vector<float> rows = Transpose(w, n, d);  // [d x n]
  ASSERT_THAT(ProjectWeight(*basis, View(rows, d, n), ModelDimSide::kRows, GetParam()), IsOk());
  const std::vector<float> rows_back = Transpose(rows, d, n);
  for (int64_t i = 0; i < n * d; ++i) {
    ASSERT_NEAR(cols[i], expected[i], 1e-5);
    ASSERT_NEAR(rows_back[i], expected[i], 1e-5);
  }
  // Idempotent: a projected weight stays where it is.
  std::vector<float> again = cols;
  ASSERT_THAT(ProjectWeight(*basis, View(again, n, d), ModelDimSide::kColumns, GetParam()), IsOk());
  for (int64_t i = 0; i < n * d; ++i) ASSERT_NEAR(again[i], cols[i], 1e-5);
  if (GetParam() == SubspaceArithmetic::kPortable) {
    // The portable result is the double product rounded once.
    for (int64_t i = 0; i < n * d; ++i) ASSERT_NEAR(cols[i], expected[i], 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Arithmetic, ProjectWeightTest,
                         ::testing::Values(SubspaceArithmetic::kBlas,
                                           SubspaceArithmetic::kPortable),
                         [](const auto& info) {
                           return info.param == SubspaceArithmetic::kBlas ? "Blas" : "Portable";
                         });

TEST(ProjectWeightErrorsTest, Rejections) {
  auto basis = MakeBasis(16, 4, 1, 0, false);
  std::vector<float> w(16 * 5, 1.0f);
  EXPECT_THAT(ProjectWeight(*basis, View(w, 16, 5), ModelDimSide::kColumns,
                            SubspaceArithmetic::kBlas),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("columns must be d")));
  EXPECT_THAT(ProjectWeight(*basis, View(w, 5, 16), ModelDimSide::kRows, SubspaceArithmetic::kBlas),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows must be d")));
  auto mixture = MakeBasis(16, 4, 2, 0, false);
  EXPECT_THAT(ProjectWeight(*mixture, View(w, 16, 5), ModelDimSide::kRows,
                            SubspaceArithmetic::kBlas),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("single basis")));
  for (float x : w) ASSERT_EQ(x, 1.0f);
}

TEST(ShiftEmbeddingTest, KeepsTheEmbeddingOutputAndMovesTheRestIntoTheTable) {
  const int64_t d = 32, k = 6, v = 50, tokens = 20;
  for (bool with_table : {true, false}) {
    for (auto arithmetic : {SubspaceArithmetic::kBlas, SubspaceArithmetic::kPortable}) {
      auto basis = MakeBasis(d, k, 1, v, with_table);
      const std::vector<float> e0 = Gaussian(v * d, 2, 0.3);  // a dense embedding, off-subspace
      std::vector<float> e = e0;
      LBCC_ASSERT_OK_AND_ASSIGN(auto shifted, ShiftEmbedding(*basis, View(e, v, d), arithmetic));
      EXPECT_EQ(shifted->id().version, basis->id().version + 1);
      EXPECT_NE(shifted->id().hash, basis->id().hash);
      EXPECT_TRUE(shifted->has_table());
      // h0 = T[y] + E[y] is unchanged, and E now lies in span(U).
      const std::vector<double> projected = ProjectRowsReference(*basis, e, v);
      for (int64_t i = 0; i < v * d; ++i) {
        const double before = (with_table ? basis->table()[i] : 0.0f) + double{e0[i]};
        ASSERT_NEAR(shifted->table()[i] + double{e[i]}, before, 1e-6);
        ASSERT_NEAR(e[i], projected[i], 1e-5);
      }
      // The codec with the shifted basis carries h0 = T'[y] + E'[y] losslessly.
      auto codec = SubspaceCodec::Create(shifted, {DType::kF32});
      ASSERT_THAT(codec.status(), IsOk());
      std::vector<int32_t> ids(tokens);
      for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((t * 7) % v);
      std::vector<float> h0(tokens * d), out(tokens * d);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t i = 0; i < d; ++i) {
          h0[t * d + i] = shifted->table()[ids[t] * d + i] + e[ids[t] * d + i];
        }
      }
      LBCC_ASSERT_OK_AND_ASSIGN(auto payload, codec->EncodeForward(View(h0, tokens, d), ids));
      ASSERT_THAT(codec->DecodeForward(payload, View(out, tokens, d)), IsOk());
      for (int64_t i = 0; i < tokens * d; ++i) ASSERT_NEAR(out[i], h0[i], 1e-5);
      // A payload of the old basis is refused by the new one (and the other way round).
      auto old_codec = SubspaceCodec::Create(basis, {DType::kF32});
      ASSERT_THAT(old_codec.status(), IsOk());
      EXPECT_THAT(old_codec->DecodeForward(payload, View(out, tokens, d)),
                  StatusIs(absl::StatusCode::kFailedPrecondition));
    }
  }
}

TEST(ShiftEmbeddingTest, PortableShiftIsReproducible) {
  const int64_t d = 64, k = 8, v = 40;
  auto basis = MakeBasis(d, k, 1, v, true);
  // The input comes from the portable generator too (std:: distributions differ between
  // standard libraries).
  std::vector<float> e1(v * d);
  for (int64_t i = 0; i < v * d; ++i) {
    e1[i] = static_cast<float>(subspace_internal::Gaussian(3, 0, static_cast<uint64_t>(i)));
  }
  std::vector<float> e2 = e1;
  LBCC_ASSERT_OK_AND_ASSIGN(auto a, ShiftEmbedding(*basis, View(e1, v, d),
                                                   SubspaceArithmetic::kPortable));
  LBCC_ASSERT_OK_AND_ASSIGN(auto b, ShiftEmbedding(*basis, View(e2, v, d),
                                                   SubspaceArithmetic::kPortable));
  EXPECT_EQ(a->id(), b->id());
  EXPECT_EQ(e1, e2);
  // Pinned: the portable shift's bits are the same on every machine and build.
  EXPECT_EQ(a->id().ToString(), "1d926e95a597b22b/v5");
}

TEST(ShiftEmbeddingTest, EveryRankComputesTheSameNextBasisOverSeveralShifts) {
  // Four "ranks" (threads) hold bit-identical embeddings and apply the same synced updates; each
  // shifts on its own (no basis traffic). Every shift bumps the version by one and every rank
  // ends with the same basis id, table and embedding bits.
  const int64_t d = 48, k = 6, v = 30, shifts = 3, ranks = 4;
  auto basis = MakeBasis(d, k, 1, v, true);
  std::vector<float> start(v * d);
  for (int64_t i = 0; i < v * d; ++i) {
    start[i] = static_cast<float>(subspace_internal::Gaussian(11, 0, static_cast<uint64_t>(i)));
  }
  std::vector<std::vector<float>> embeddings(ranks, start);
  std::vector<std::shared_ptr<const SubspaceBasis>> result(ranks);
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      std::shared_ptr<const SubspaceBasis> b = basis;
      for (int64_t s = 0; s < shifts; ++s) {
        std::vector<float>& e = embeddings[r];
        for (int64_t i = 0; i < v * d; ++i) {  // the "outer step": the same update everywhere
          e[i] += 0.1f * static_cast<float>(subspace_internal::Gaussian(
                             12, static_cast<uint64_t>(s), static_cast<uint64_t>(i)));
        }
        auto view = TensorView::Host(e.data(), {v, d});
        if (!view.ok()) {
          status[r] = view.status();
          return;
        }
        auto next = ShiftEmbedding(*b, *view, SubspaceArithmetic::kPortable);
        if (!next.ok()) {
          status[r] = next.status();
          return;
        }
        b = *next;
      }
      result[r] = b;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    ASSERT_THAT(status[r], IsOk());
    EXPECT_EQ(result[r]->id().version, basis->id().version + shifts);
    EXPECT_EQ(result[r]->id(), result[0]->id());
    EXPECT_EQ(embeddings[r], embeddings[0]);
    EXPECT_TRUE(std::equal(result[r]->table().begin(), result[r]->table().end(),
                           result[0]->table().begin()));
  }
  // Every row of E is left in span(U): projecting again changes nothing (up to rounding).
  std::vector<float> again = embeddings[0];
  ASSERT_THAT(ProjectWeight(*basis, View(again, v, d), ModelDimSide::kColumns,
                            SubspaceArithmetic::kPortable),
              IsOk());
  for (int64_t i = 0; i < v * d; ++i) ASSERT_NEAR(again[i], embeddings[0][i], 1e-5);
}

TEST(ProjectPseudoGradientTest, KeepsTheInSubspacePartOfTheDelta) {
  const int64_t d = 24, k = 5, n = 70;
  auto basis = MakeBasis(d, k, 1, 0, false);
  for (auto arithmetic : {SubspaceArithmetic::kBlas, SubspaceArithmetic::kPortable}) {
    std::vector<float> outer = Gaussian(n * d, 21);  // [n x d], not in span(U)
    std::vector<float> local = Gaussian(n * d, 22);
    std::vector<float> delta(n * d);
    for (int64_t i = 0; i < n * d; ++i) delta[i] = outer[i] - local[i];
    const std::vector<double> kept = ProjectRowsReference(*basis, delta, n);
    ASSERT_THAT(ProjectPseudoGradient(*basis, View(outer, n, d), View(local, n, d),
                                      ModelDimSide::kColumns, arithmetic),
                IsOk());
    for (int64_t i = 0; i < n * d; ++i) {
      ASSERT_NEAR(outer[i] - local[i], kept[i], 1e-5) << i;
    }
    // Rows orientation: the transposed problem gives the transposed answer.
    std::vector<float> outer_t = Transpose(Gaussian(n * d, 21), n, d);
    std::vector<float> local_t = Transpose(Gaussian(n * d, 22), n, d);
    ASSERT_THAT(ProjectPseudoGradient(*basis, View(outer_t, d, n), View(local_t, d, n),
                                      ModelDimSide::kRows, arithmetic),
                IsOk());
    const std::vector<float> back = Transpose(local_t, d, n);
    for (int64_t i = 0; i < n * d; ++i) ASSERT_NEAR(back[i], local[i], 1e-5) << i;
  }
}

TEST(ProjectPseudoGradientTest, Rejections) {
  auto basis = MakeBasis(16, 4, 1, 0, false);
  std::vector<float> outer(16 * 5, 2.0f), local(16 * 5, 1.0f), small(16 * 4, 1.0f);
  EXPECT_THAT(ProjectPseudoGradient(*basis, View(outer, 5, 16), View(small, 4, 16),
                                    ModelDimSide::kColumns, SubspaceArithmetic::kPortable),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shapes differ")));
  EXPECT_THAT(ProjectPseudoGradient(*basis, View(outer, 16, 5), View(local, 16, 5),
                                    ModelDimSide::kColumns, SubspaceArithmetic::kPortable),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("columns must be d")));
  auto mixture = MakeBasis(16, 4, 2, 0, false);
  EXPECT_THAT(ProjectPseudoGradient(*mixture, View(outer, 16, 5), View(local, 16, 5),
                                    ModelDimSide::kRows, SubspaceArithmetic::kPortable),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("single basis")));
  for (float x : local) ASSERT_EQ(x, 1.0f);
}

TEST(ShiftEmbeddingTest, Rejections) {
  auto basis = MakeBasis(16, 4, 1, 10, true);
  std::vector<float> e(10 * 16, 1.0f);
  EXPECT_THAT(ShiftEmbedding(*basis, View(e, 16, 10), SubspaceArithmetic::kBlas).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto no_vocab = MakeBasis(16, 4, 1, 0, false);
  EXPECT_THAT(ShiftEmbedding(*no_vocab, View(e, 10, 16), SubspaceArithmetic::kBlas).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("vocabulary")));
  auto mixture = MakeBasis(16, 4, 2, 10, true);
  EXPECT_THAT(ShiftEmbedding(*mixture, View(e, 10, 16), SubspaceArithmetic::kBlas).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  LBCC_ASSERT_OK_AND_ASSIGN(
      auto last, SubspaceBasis::FromMatrices(16, 4, 1, 10, {basis->u().begin(), basis->u().end()},
                                             {}, UINT32_MAX));
  EXPECT_THAT(ShiftEmbedding(*last, View(e, 10, 16), SubspaceArithmetic::kBlas).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("version")));
  for (float x : e) ASSERT_EQ(x, 1.0f);
}

TEST(RefreshTableTest, LossyTakesTheEmbeddingBitForBitAndLeavesItAlone) {
  const int64_t d = 24, k = 5, v = 30, tokens = 9;
  for (bool with_table : {true, false}) {
    auto basis = MakeBasis(d, k, 1, v, with_table);
    std::vector<float> e = Gaussian(v * d, 8, 0.7);
    e[3] = -0.0f;  // bits, not values, are copied
    const std::vector<float> e0 = e;
    LBCC_ASSERT_OK_AND_ASSIGN(
        auto next, RefreshTable(*basis, View(e, v, d), TableRefreshMode::kLossy,
                                SubspaceArithmetic::kBlas));
    EXPECT_EQ(next->id().version, basis->id().version + 1);
    EXPECT_NE(next->id().hash, basis->id().hash);
    ASSERT_EQ(next->table().size(), e0.size());
    EXPECT_EQ(std::memcmp(next->table().data(), e0.data(), e0.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(e.data(), e0.data(), e0.size() * sizeof(float)), 0);
    // U is the old one: only T and the version moved.
    EXPECT_TRUE(std::equal(next->u().begin(), next->u().end(), basis->u().begin()));
    // The lossy boundary: h = E[y] + U c crosses exactly; anything else loses its part outside
    // span(U) and nothing more.
    auto codec = SubspaceCodec::Create(next, {DType::kF32});
    ASSERT_THAT(codec.status(), IsOk());
    std::vector<int32_t> ids(tokens);
    std::vector<float> h(tokens * d), out(tokens * d);
    const std::vector<float> c = Gaussian(tokens * k, 9);
    for (int64_t t = 0; t < tokens; ++t) {
      ids[t] = static_cast<int32_t>((t * 11) % v);
      for (int64_t i = 0; i < d; ++i) {
        double x = e0[ids[t] * d + i];
        for (int64_t j = 0; j < k; ++j) x += double{next->u()[i * k + j]} * c[t * k + j];
        h[t * d + i] = static_cast<float>(x);
      }
    }
    LBCC_ASSERT_OK_AND_ASSIGN(auto payload, codec->EncodeForward(View(h, tokens, d), ids));
    ASSERT_THAT(codec->DecodeForward(payload, View(out, tokens, d)), IsOk());
    for (int64_t i = 0; i < tokens * d; ++i) ASSERT_NEAR(out[i], h[i], 1e-5);
  }
}

TEST(RefreshTableTest, EqualInputsGiveEqualIdsOnEveryRank) {
  const int64_t d = 32, k = 4, v = 20;
  auto basis = MakeBasis(d, k, 1, v, true);
  std::vector<float> e1 = Gaussian(v * d, 10), e2 = e1;
  for (TableRefreshMode mode : {TableRefreshMode::kLossy, TableRefreshMode::kConstrained}) {
    LBCC_ASSERT_OK_AND_ASSIGN(auto a, RefreshTable(*basis, View(e1, v, d), mode,
                                                   SubspaceArithmetic::kPortable));
    LBCC_ASSERT_OK_AND_ASSIGN(auto b, RefreshTable(*basis, View(e2, v, d), mode,
                                                   SubspaceArithmetic::kPortable));
    EXPECT_EQ(a->id(), b->id());
    EXPECT_EQ(a->id().version, basis->id().version + 1);
  }
  // One bit of the embedding changes the lossy id.
  std::vector<float> e3 = e1;
  e3[17] = std::nextafter(e3[17], 10.0f);
  LBCC_ASSERT_OK_AND_ASSIGN(auto a, RefreshTable(*basis, View(e1, v, d), TableRefreshMode::kLossy,
                                                 SubspaceArithmetic::kPortable));
  LBCC_ASSERT_OK_AND_ASSIGN(auto c, RefreshTable(*basis, View(e3, v, d), TableRefreshMode::kLossy,
                                                 SubspaceArithmetic::kPortable));
  EXPECT_EQ(a->id().version, c->id().version);
  EXPECT_NE(a->id().hash, c->id().hash);
}

TEST(RefreshTableTest, ConstrainedIsShiftEmbedding) {
  const int64_t d = 24, k = 6, v = 15;
  for (auto arithmetic : {SubspaceArithmetic::kBlas, SubspaceArithmetic::kPortable}) {
    auto basis = MakeBasis(d, k, 1, v, true);
    std::vector<float> e1 = Gaussian(v * d, 12), e2 = e1;
    LBCC_ASSERT_OK_AND_ASSIGN(auto refreshed, RefreshTable(*basis, View(e1, v, d),
                                                           TableRefreshMode::kConstrained,
                                                           arithmetic));
    LBCC_ASSERT_OK_AND_ASSIGN(auto shifted, ShiftEmbedding(*basis, View(e2, v, d), arithmetic));
    EXPECT_EQ(refreshed->id(), shifted->id());
    EXPECT_EQ(e1, e2);  // modified in place, the same way
    EXPECT_NE(e1, Gaussian(v * d, 12));
  }
}

TEST(RefreshTableTest, Rejections) {
  auto basis = MakeBasis(16, 4, 1, 10, true);
  std::vector<float> e(10 * 16, 1.0f);
  for (TableRefreshMode mode : {TableRefreshMode::kLossy, TableRefreshMode::kConstrained}) {
    const auto a = SubspaceArithmetic::kPortable;
    EXPECT_THAT(RefreshTable(*basis, View(e, 16, 10), mode, a).status(),
                StatusIs(absl::StatusCode::kInvalidArgument));
    std::vector<int32_t> wide(10 * 16);
    LBCC_ASSERT_OK_AND_ASSIGN(TensorView i32,
                              TensorView::Create(wide.data(), DType::kI32, {10, 16}));
    EXPECT_THAT(RefreshTable(*basis, i32, mode, a).status(),
                StatusIs(absl::StatusCode::kInvalidArgument));
    auto no_vocab = MakeBasis(16, 4, 1, 0, false);
    EXPECT_THAT(RefreshTable(*no_vocab, View(e, 10, 16), mode, a).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("vocabulary")));
    auto mixture = MakeBasis(16, 4, 2, 10, true);
    EXPECT_THAT(RefreshTable(*mixture, View(e, 10, 16), mode, a).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition));
    LBCC_ASSERT_OK_AND_ASSIGN(
        auto last, SubspaceBasis::FromMatrices(16, 4, 1, 10, {basis->u().begin(), basis->u().end()},
                                               {}, UINT32_MAX));
    EXPECT_THAT(RefreshTable(*last, View(e, 10, 16), mode, a).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("version")));
    for (float x : e) ASSERT_EQ(x, 1.0f);
  }
  // The lossy table is data of the next basis: non-finite values are refused, nothing changes.
  e[5] = std::nanf("");
  EXPECT_THAT(RefreshTable(*basis, View(e, 10, 16), TableRefreshMode::kLossy,
                           SubspaceArithmetic::kPortable)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SubspaceEnergyTest, MeasuresTheOutOfSubspacePart) {
  const int64_t d = 30, k = 5, v = 12, tokens = 16;
  auto basis = MakeBasis(d, k, 1, v, true);
  std::vector<int32_t> ids(tokens);
  for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>(t % v);
  // h = T[y] + in-span part + orthogonal part of known energy.
  const std::vector<float> raw = Gaussian(tokens * d, 4);
  const std::vector<double> in_span = ProjectRowsReference(*basis, raw, tokens);
  std::vector<float> h(tokens * d);
  double orthogonal = 0, inside = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      const double off = raw[t * d + i] - in_span[t * d + i];
      orthogonal += off * off;
      inside += in_span[t * d + i] * in_span[t * d + i];
      h[t * d + i] = static_cast<float>(basis->table()[ids[t] * d + i] + raw[t * d + i]);
    }
  }
  LBCC_ASSERT_OK_AND_ASSIGN(SubspaceEnergy e, MeasureSubspaceEnergy(basis, View(h, tokens, d), ids));
  EXPECT_NEAR(e.residual, orthogonal, 1e-4 * orthogonal);
  EXPECT_NEAR(e.captured, inside, 1e-4 * inside);
  EXPECT_NEAR(e.total, inside + orthogonal, 1e-4 * (inside + orthogonal));
  EXPECT_NEAR(e.residual_fraction(), orthogonal / (inside + orthogonal), 1e-4);
}

// Rows drawn from planted subspaces: block b of `block` rows lies in subspace truth[b] (plus
// noise of relative energy `noise`).
std::vector<float> PlantedRows(const SubspaceBasis& planted, absl::Span<const uint8_t> truth,
                               int64_t block, double noise, uint64_t seed) {
  const int64_t d = planted.model_dim(), k = planted.rank();
  const int64_t rows = static_cast<int64_t>(truth.size()) * block;
  const std::vector<float> c = Gaussian(rows * k, seed);
  const std::vector<float> n = Gaussian(rows * d, seed + 1, noise * std::sqrt(double(k) / d));
  std::vector<float> x(rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    const float* u = planted.component(truth[r / block]);
    for (int64_t i = 0; i < d; ++i) {
      double s = n[r * d + i];
      for (int64_t j = 0; j < k; ++j) s += double{u[i * planted.ld() + j]} * c[r * k + j];
      x[r * d + i] = static_cast<float>(s);
    }
  }
  return x;
}

TEST(FitSubspaceBasisTest, RecoversPlantedSubspaces) {
  const int64_t d = 48, k = 4, m = 3, block = 16;
  auto planted = MakeBasis(d, k, m, 0, false, 77);
  std::vector<uint8_t> truth;
  for (int b = 0; b < 30; ++b) truth.push_back(static_cast<uint8_t>((b * 7 + b / 3) % m));
  std::vector<float> x = PlantedRows(*planted, truth, block, 0.01, 8);
  const int64_t rows = static_cast<int64_t>(x.size()) / d;

  SubspaceFitOptions options;
  options.rank = k;
  options.components = m;
  options.mixture_block = block;
  LBCC_ASSERT_OK_AND_ASSIGN(auto mixture, FitSubspaceBasis(View(x, rows, d), options));
  EXPECT_EQ(mixture->components(), m);
  EXPECT_LT(mixture->OrthonormalityError(), 1e-5);
  LBCC_ASSERT_OK_AND_ASSIGN(SubspaceEnergy fitted,
                            MeasureSubspaceEnergy(mixture, View(x, rows, d), {}, block));
  EXPECT_LT(fitted.residual_fraction(), 1e-3);

  options.components = 1;
  LBCC_ASSERT_OK_AND_ASSIGN(auto single, FitSubspaceBasis(View(x, rows, d), options));
  LBCC_ASSERT_OK_AND_ASSIGN(SubspaceEnergy single_energy,
                            MeasureSubspaceEnergy(single, View(x, rows, d), {}, block));
  EXPECT_GT(single_energy.residual_fraction(), 0.3);
  // The principal subspace of one planted component is that component.
  std::vector<uint8_t> one(10, 1);
  std::vector<float> y = PlantedRows(*planted, one, block, 0.0, 9);
  LBCC_ASSERT_OK_AND_ASSIGN(auto pca, FitSubspaceBasis(View(y, 10 * block, d), options));
  LBCC_ASSERT_OK_AND_ASSIGN(SubspaceEnergy pca_energy,
                            MeasureSubspaceEnergy(pca, View(y, 10 * block, d), {}));
  EXPECT_LT(pca_energy.residual_fraction(), 1e-8);

  options.components = 40;
  EXPECT_THAT(FitSubspaceBasis(View(x, rows, d), options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// A toy two-stage, subspace-constrained model. Stage 1 (before the boundary):
//   h0 = T[y] + U e[y],  a = tanh(W1 h0),  h1 = h0 + U (Z^T a)
// Stage 2 (after the boundary): z = W2 h1,  loss = sum_t sum_o (log cosh z_o - target_o z_o).
// Every residual write of stage 1 lies in span(U), so h1 crosses as U^T (h1 - T[y]) exactly and
// the gradient crosses back as U^T g_h1: stage 1's parameter gradients must equal the dense ones.
struct ToyModel {
  int64_t v = 20, d = 24, k = 6, f = 10, o = 5, tokens = 7;
  std::shared_ptr<const SubspaceBasis> basis;
  std::vector<double> e, w1, z, w2, target;
  std::vector<int32_t> ids;

  double U(int64_t i, int64_t j) const { return basis->u()[i * k + j]; }
  double T(int64_t y, int64_t i) const { return basis->table()[y * d + i]; }

  struct Activations {
    std::vector<double> h0, a, h1;
  };
  Activations Stage1() const {
    Activations act{std::vector<double>(tokens * d), std::vector<double>(tokens * f),
                    std::vector<double>(tokens * d)};
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t y = ids[t];
      for (int64_t i = 0; i < d; ++i) {
        double s = T(y, i);
        for (int64_t j = 0; j < k; ++j) s += U(i, j) * e[y * k + j];
        act.h0[t * d + i] = s;
      }
      std::vector<double> s(k, 0.0);
      for (int64_t r = 0; r < f; ++r) {
        double pre = 0;
        for (int64_t i = 0; i < d; ++i) pre += w1[r * d + i] * act.h0[t * d + i];
        act.a[t * f + r] = std::tanh(pre);
        for (int64_t j = 0; j < k; ++j) s[j] += z[r * k + j] * act.a[t * f + r];
      }
      for (int64_t i = 0; i < d; ++i) {
        double w = act.h0[t * d + i];
        for (int64_t j = 0; j < k; ++j) w += U(i, j) * s[j];
        act.h1[t * d + i] = w;
      }
    }
    return act;
  }
  // Stage 2: the loss, and optionally g_h1 [tokens x d] and g_w2.
  double Stage2(const std::vector<double>& h1, std::vector<double>* g_h1,
                std::vector<double>* g_w2) const {
    double loss = 0;
    if (g_h1 != nullptr) g_h1->assign(tokens * d, 0.0);
    if (g_w2 != nullptr) g_w2->assign(o * d, 0.0);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t q = 0; q < o; ++q) {
        double zq = 0;
        for (int64_t i = 0; i < d; ++i) zq += w2[q * d + i] * h1[t * d + i];
        loss += std::log(std::cosh(zq)) - target[t * o + q] * zq;
        const double g = std::tanh(zq) - target[t * o + q];
        for (int64_t i = 0; i < d; ++i) {
          if (g_h1 != nullptr) (*g_h1)[t * d + i] += w2[q * d + i] * g;
          if (g_w2 != nullptr) (*g_w2)[q * d + i] += g * h1[t * d + i];
        }
      }
    }
    return loss;
  }
  double Loss() const { return Stage2(Stage1().h1, nullptr, nullptr); }

  // Stage 1's parameter gradients from the gradient g_h1 arriving at the boundary.
  void Stage1Backward(const Activations& act, const std::vector<double>& g_h1,
                      std::vector<double>* g_e, std::vector<double>* g_w1,
                      std::vector<double>* g_z) const {
    g_e->assign(v * k, 0.0);
    g_w1->assign(f * d, 0.0);
    g_z->assign(f * k, 0.0);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> g_s(k, 0.0);  // U^T g_h1
      for (int64_t j = 0; j < k; ++j) {
        for (int64_t i = 0; i < d; ++i) g_s[j] += U(i, j) * g_h1[t * d + i];
      }
      std::vector<double> g_h0(g_h1.begin() + t * d, g_h1.begin() + (t + 1) * d);
      for (int64_t r = 0; r < f; ++r) {
        const double a = act.a[t * f + r];
        double g_a = 0;
        for (int64_t j = 0; j < k; ++j) {
          (*g_z)[r * k + j] += a * g_s[j];
          g_a += z[r * k + j] * g_s[j];
        }
        const double g_pre = g_a * (1 - a * a);
        for (int64_t i = 0; i < d; ++i) {
          (*g_w1)[r * d + i] += g_pre * act.h0[t * d + i];
          g_h0[i] += w1[r * d + i] * g_pre;
        }
      }
      for (int64_t j = 0; j < k; ++j) {
        for (int64_t i = 0; i < d; ++i) (*g_e)[ids[t] * k + j] += U(i, j) * g_h0[i];
      }
    }
  }
};

std::vector<double> Doubles(size_t n, uint64_t seed, double scale) {
  const std::vector<float> x = Gaussian(n, seed, scale);
  return std::vector<double>(x.begin(), x.end());
}

double MaxAbs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

TEST(SubspaceGradientTest, CompressedBackwardGivesTheDenseParameterGradients) {
  ToyModel model;
  model.basis = MakeBasis(model.d, model.k, 1, model.v, true, 123);
  model.e = Doubles(model.v * model.k, 1, 0.5);
  model.w1 = Doubles(model.f * model.d, 2, 0.3);
  model.z = Doubles(model.f * model.k, 3, 0.5);
  model.w2 = Doubles(model.o * model.d, 4, 0.3);
  model.target = Doubles(model.tokens * model.o, 5, 0.5);
  for (int64_t t = 0; t < model.tokens; ++t) model.ids.push_back(static_cast<int32_t>((5 * t + 3) % model.v));
  const int64_t tokens = model.tokens, d = model.d;

  // Dense reference: no codec.
  const ToyModel::Activations act = model.Stage1();
  std::vector<double> g_h1_dense, g_w2_dense;
  model.Stage2(act.h1, &g_h1_dense, &g_w2_dense);
  std::vector<double> g_e_dense, g_w1_dense, g_z_dense;
  model.Stage1Backward(act, g_h1_dense, &g_e_dense, &g_w1_dense, &g_z_dense);

  // Pipeline: stage 1 sends h1 through the forward codec, stage 2 sends g_h1 back.
  auto made = SubspaceCodec::Create(model.basis, {DType::kF32});
  ASSERT_THAT(made.status(), IsOk());
  SubspaceCodec& codec = *made;
  std::vector<float> h1(act.h1.begin(), act.h1.end()), h1_received(tokens * d);
  LBCC_ASSERT_OK_AND_ASSIGN(auto fwd, codec.EncodeForward(View(h1, tokens, d), model.ids));
  EXPECT_EQ(fwd.size(), 76 + tokens * (model.k * 4 + 1));  // 24 floats per token would be 96 B
  ASSERT_THAT(codec.DecodeForward(fwd, View(h1_received, tokens, d)), IsOk());
  for (int64_t i = 0; i < tokens * d; ++i) ASSERT_NEAR(h1_received[i], act.h1[i], 1e-5);
  std::vector<double> g_h1_stage2, g_w2;
  model.Stage2(std::vector<double>(h1_received.begin(), h1_received.end()), &g_h1_stage2, &g_w2);
  std::vector<float> g_send(g_h1_stage2.begin(), g_h1_stage2.end()), g_received(tokens * d);
  LBCC_ASSERT_OK_AND_ASSIGN(auto bwd, codec.EncodeBackward(View(g_send, tokens, d)));
  ASSERT_THAT(codec.DecodeBackward(bwd, View(g_received, tokens, d)), IsOk());
  std::vector<double> g_e, g_w1, g_z;
  model.Stage1Backward(act, std::vector<double>(g_received.begin(), g_received.end()), &g_e,
                       &g_w1, &g_z);

  // The transmitted gradient is not the dense one: most of g_h1 lies outside span(U) ...
  double off = 0, all = 0;
  for (int64_t i = 0; i < tokens * d; ++i) {
    off += (g_received[i] - g_h1_dense[i]) * (g_received[i] - g_h1_dense[i]);
    all += g_h1_dense[i] * g_h1_dense[i];
  }
  EXPECT_GT(off, 0.5 * all);
  // ... yet every parameter gradient equals the dense one.
  auto expect_equal = [](const std::vector<double>& got, const std::vector<double>& want,
                         double tolerance, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    const double scale = MaxAbs(want);
    ASSERT_GT(scale, 1e-3) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], tolerance * scale) << what << "[" << i << "]";
    }
  };
  expect_equal(g_e, g_e_dense, 1e-5, "e");
  expect_equal(g_w1, g_w1_dense, 1e-5, "W1");
  expect_equal(g_z, g_z_dense, 1e-5, "Z");
  expect_equal(g_w2, g_w2_dense, 1e-5, "W2");

  // And the dense gradients are the true ones: central finite differences of the loss.
  auto finite_difference = [&](std::vector<double>* param) {
    std::vector<double> g(param->size());
    const double h = 1e-5;
    for (size_t i = 0; i < param->size(); ++i) {
      const double saved = (*param)[i];
      (*param)[i] = saved + h;
      const double up = model.Loss();
      (*param)[i] = saved - h;
      const double down = model.Loss();
      (*param)[i] = saved;
      g[i] = (up - down) / (2 * h);
    }
    return g;
  };
  expect_equal(finite_difference(&model.e), g_e, 1e-6, "FD e");
  expect_equal(finite_difference(&model.w1), g_w1, 1e-6, "FD W1");
  expect_equal(finite_difference(&model.z), g_z, 1e-6, "FD Z");
  expect_equal(finite_difference(&model.w2), g_w2_dense, 1e-6, "FD W2");
}

}  // namespace
}  // namespace lbcc::codecs
