#include "codecs/subspace_basis.h"

#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lbcc::codecs {
namespace {

using ::lbcc::testing::IsOk;
using ::lbcc::testing::StatusIs;
using ::testing::HasSubstr;

// Path of the subspace_seed_hash helper (first argument, see BUILD.bazel).
std::string g_helper;

SubspaceSeedSpec Spec(int64_t d, int64_t k, int64_t m = 1, int64_t v = 0, bool table = false,
                      uint64_t seed = 7, uint32_t version = 1) {
  SubspaceSeedSpec s;
  s.model_dim = d;
  s.rank = k;
  s.components = m;
  s.vocab_size = v;
  s.with_table = table;
  s.seed = seed;
  s.version = version;
  return s;
}

std::shared_ptr<const SubspaceBasis> Seeded(const SubspaceSeedSpec& spec) {
  auto basis = SubspaceBasis::FromSeed(spec);
  EXPECT_THAT(basis.status(), IsOk());
  return basis.ok() ? *basis : nullptr;
}

uint64_t FileHash(const SubspaceBasis& basis) {
  const std::vector<uint8_t> bytes = basis.Serialize();
  return XXH3_64bits(bytes.data(), bytes.size());
}

TEST(SubspaceRandomTest, PortableLogAndCosineAgreeWithLibm) {
  double worst_log = 0, worst_cos = 0;
  for (uint64_t n = 0; n < 200000; ++n) {
    const double u = ((subspace_internal::Random64(1, 2, n) >> 11) + 1) * 0x1.0p-53;
    worst_log = std::max(worst_log, std::fabs(subspace_internal::PortableLog(u) - std::log(u)) /
                                        std::max(1.0, std::fabs(std::log(u))));
    worst_cos = std::max(worst_cos,
                         std::fabs(subspace_internal::PortableCos2Pi(u) - std::cos(2 * M_PI * u)));
  }
  EXPECT_LT(worst_log, 1e-15);
  EXPECT_LT(worst_cos, 1e-15);
  EXPECT_EQ(subspace_internal::PortableLog(1.0), 0.0);
  EXPECT_NEAR(subspace_internal::PortableLog(0x1.0p-53), -53 * std::log(2.0), 1e-13);
  EXPECT_NEAR(subspace_internal::PortableLog(4.9e-324), std::log(4.9e-324), 1e-12);  // subnormal
  EXPECT_EQ(subspace_internal::PortableCos2Pi(0.0), 1.0);
  EXPECT_EQ(subspace_internal::PortableCos2Pi(0.5), -1.0);
  EXPECT_EQ(subspace_internal::PortableCos2Pi(1.0), 1.0);
}

TEST(SubspaceRandomTest, GeneratorIsPinned) {
  // The generator is part of the basis identity: these values must never change.
  EXPECT_EQ(subspace_internal::Random64(0, 0, 0), 0xf52e8e8de110ecf4ull);
  EXPECT_EQ(subspace_internal::Random64(42, 3, 1000), 0xf852a452eb0d151eull);
}

TEST(SubspaceRandomTest, GaussianMoments) {
  const int n = 400000;
  double sum = 0, sum2 = 0, sum4 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = subspace_internal::Gaussian(9, 0, i);
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0, 0.01);
  EXPECT_NEAR(sum4 / n, 3.0, 0.05);
}

TEST(SubspaceRandomTest, HouseholderQIsOrthonormalAndSpansTheInput) {
  const int64_t d = 37, k = 9;
  std::vector<double> a(d * k);
  for (int64_t i = 0; i < d * k; ++i) a[i] = subspace_internal::Gaussian(3, 0, i);
  const std::vector<double> q = subspace_internal::HouseholderQ(a, d, k);
  // Q^T Q = I; R = Q^T A is upper triangular with a positive diagonal; Q R = A.
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      double qq = 0, r = 0;
      for (int64_t t = 0; t < d; ++t) {
        qq += q[i * d + t] * q[j * d + t];
        r += q[i * d + t] * a[j * d + t];
      }
      EXPECT_NEAR(qq, i == j ? 1.0 : 0.0, 1e-14);
      if (i > j) {
        EXPECT_NEAR(r, 0.0, 1e-13);
      } else if (i == j) {
        EXPECT_GT(r, 0.0);
      }
    }
  }
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t t = 0; t < d; ++t) {
      double qr = 0;
      for (int64_t i = 0; i <= j; ++i) {
        double r = 0;
        for (int64_t s = 0; s < d; ++s) r += q[i * d + s] * a[j * d + s];
        qr += q[i * d + t] * r;
      }
      EXPECT_NEAR(qr, a[j * d + t], 1e-12);
    }
  }
}

TEST(SubspaceRandomTest, PortableGemmSumsInOrder) {
  const int64_t m = 7, n = 300, p = 19;  // n spans two column tiles, m a partial row block
  std::vector<float> a(m * p);
  std::vector<double> b(p * n), c(m * n, -1.0);
  for (int64_t i = 0; i < m * p; ++i) a[i] = static_cast<float>(subspace_internal::Gaussian(1, 0, i));
  for (int64_t i = 0; i < p * n; ++i) b[i] = subspace_internal::Gaussian(1, 1, i);
  subspace_internal::PortableGemm(a.data(), p, b.data(), n, c.data(), n, m, n, p);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t col = 0; col < n; ++col) {
      double s = 0;
      for (int64_t q = 0; q < p; ++q) s += static_cast<double>(a[r * p + q]) * b[q * n + col];
      ASSERT_EQ(c[r * n + col], s) << r << ", " << col;
    }
  }
}

TEST(SubspaceBasisTest, IdWidths) {
  EXPECT_EQ(SubspaceIdWidth(0), 0);
  EXPECT_EQ(SubspaceIdWidth(1), 1);
  EXPECT_EQ(SubspaceIdWidth(256), 1);
  EXPECT_EQ(SubspaceIdWidth(257), 2);
  EXPECT_EQ(SubspaceIdWidth(65536), 2);
  EXPECT_EQ(SubspaceIdWidth(65537), 3);
  EXPECT_EQ(SubspaceIdWidth(1 << 24), 3);
  EXPECT_EQ(SubspaceIdWidth((1 << 24) + 1), 4);
  EXPECT_EQ(SubspaceIdWidth(INT32_MAX), 4);
}

TEST(SubspaceBasisTest, SeededBasisIsOrthonormal) {
  for (const auto& spec : {Spec(256, 32), Spec(64, 64), Spec(100, 1), Spec(128, 16, 4)}) {
    auto basis = Seeded(spec);
    ASSERT_NE(basis, nullptr);
    EXPECT_EQ(basis->u().size(), static_cast<size_t>(spec.model_dim * spec.rank * spec.components));
    EXPECT_LT(basis->OrthonormalityError(), 1e-6) << spec.model_dim << "x" << spec.rank;
  }
}

TEST(SubspaceBasisTest, SeededBasisIsDeterministicAndSeedSensitive) {
  auto a = Seeded(Spec(96, 12, 3, 500, true, 11, 2));
  auto b = Seeded(Spec(96, 12, 3, 500, true, 11, 2));
  auto c = Seeded(Spec(96, 12, 3, 500, true, 12, 2));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(a->id(), b->id());
  EXPECT_EQ(a->Serialize(), b->Serialize());
  EXPECT_NE(a->id().hash, c->id().hash);
  EXPECT_EQ(a->id().version, 2u);
  // Components are different subspaces; the table has the requested scale.
  EXPECT_NE(0, std::memcmp(a->component(0), a->component(1), 12 * sizeof(float)));
  double sum2 = 0;
  for (float t : a->table()) sum2 += t * t;
  EXPECT_NEAR(sum2 / a->table().size(), 1.0, 0.05);
  // The projected table is T U.
  ASSERT_EQ(a->projected_table().size(), static_cast<size_t>(500 * 36));
  double pu = 0;
  for (int64_t i = 0; i < 96; ++i) pu += double{a->table()[7 * 96 + i]} * a->u()[i * 36 + 13];
  EXPECT_NEAR(a->projected_table()[7 * 36 + 13], pu, 1e-5);
}

TEST(SubspaceBasisTest, HashesArePinned) {
  // A seeded basis must be bit-identical on every machine and build (opt, sanitizers, clang):
  // these hashes were produced once and must never change.
  auto small = Seeded(Spec(64, 8, 2, 300, true, 42, 3));
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->id().ToString(), "655da622ae707dc6/v3");
  auto large = Seeded(Spec(1024, 160, 1, 0, false, 2024, 1));
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(large->id().ToString(), "033be73cc924d122/v1");
}

TEST(SubspaceBasisTest, SeparateProcessesRegenerateIdenticalBits) {
  ASSERT_FALSE(g_helper.empty()) << "pass the subspace_seed_hash path as the first argument";
  auto basis = Seeded(Spec(512, 64, 2, 1000, true, 99, 5));
  ASSERT_NE(basis, nullptr);
  char expected[128];
  std::snprintf(expected, sizeof(expected), "%s %016llx\n", basis->id().ToString().c_str(),
                static_cast<unsigned long long>(FileHash(*basis)));
  std::vector<std::string> outputs;
  for (int run = 0; run < 2; ++run) {
    const std::string command = g_helper + " 512 64 2 1000 1 99 5";
    std::FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string out;
    char buffer[256];
    while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
    ASSERT_EQ(pclose(pipe), 0) << out;
    outputs.push_back(out);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(outputs[0], expected);
}

TEST(SubspaceBasisTest, FileRoundTrip) {
  auto basis = Seeded(Spec(40, 6, 2, 70, true, 5, 9));
  ASSERT_NE(basis, nullptr);
  const std::vector<uint8_t> bytes = basis->Serialize();
  EXPECT_EQ(bytes.size(), 64u + 4 * (40 * 12 + 70 * 40) + 8);
  LBCC_ASSERT_OK_AND_ASSIGN(auto parsed, SubspaceBasis::Parse(bytes));
  EXPECT_EQ(parsed->id(), basis->id());
  EXPECT_EQ(parsed->model_dim(), 40);
  EXPECT_EQ(parsed->rank(), 6);
  EXPECT_EQ(parsed->components(), 2);
  EXPECT_EQ(parsed->vocab_size(), 70);
  EXPECT_TRUE(parsed->has_table());
  EXPECT_EQ(parsed->Serialize(), bytes);

  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/basis.lbcc";
  ASSERT_THAT(basis->Save(path), IsOk());
  LBCC_ASSERT_OK_AND_ASSIGN(auto loaded, SubspaceBasis::Load(path));
  EXPECT_EQ(loaded->id(), basis->id());
  EXPECT_THAT(SubspaceBasis::Load(path + ".missing").status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(basis->Save("/nonexistent-dir/x/basis"), StatusIs(absl::StatusCode::kNotFound));
}

// Rewrites the trailing checksum of a basis file image.
void Reseal(std::vector<uint8_t>* bytes) {
  const uint64_t sum = XXH3_64bits(bytes->data(), bytes->size() - 8);
  std::memcpy(bytes->data() + bytes->size() - 8, &sum, 8);
}

TEST(SubspaceBasisTest, ParseRejectsEveryCorruption) {
  auto basis = Seeded(Spec(8, 2, 1, 3, true, 1, 1));
  ASSERT_NE(basis, nullptr);
  const std::vector<uint8_t> good = basis->Serialize();
  for (size_t byte = 0; byte < good.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bad = good;
      bad[byte] ^= static_cast<uint8_t>(1u << bit);
      ASSERT_THAT(SubspaceBasis::Parse(bad).status(), StatusIs(absl::StatusCode::kDataLoss))
          << "byte " << byte << " bit " << bit;
    }
  }
  EXPECT_THAT(SubspaceBasis::Parse(absl::MakeSpan(good).subspan(0, 50)).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  EXPECT_THAT(SubspaceBasis::Parse(absl::MakeSpan(good).subspan(0, good.size() - 1)).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_THAT(SubspaceBasis::Parse(longer).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("trailing")));

  // With a valid checksum, the content hash and the orthonormality still have to hold.
  std::vector<uint8_t> tampered = good;
  tampered[64 + 4 * 16 + 2] ^= 1;  // a table entry
  Reseal(&tampered);
  EXPECT_THAT(SubspaceBasis::Parse(tampered).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("content hash")));
  std::vector<float> u(basis->u().begin(), basis->u().end());
  u[0] *= 2;
  std::vector<uint8_t> skewed = good;
  std::memcpy(skewed.data() + 64, u.data(), u.size() * 4);
  const uint64_t hash = SubspaceContentHash(8, 2, 1, 3, u, basis->table());
  std::memcpy(skewed.data() + 56, &hash, 8);
  Reseal(&skewed);
  EXPECT_THAT(SubspaceBasis::Parse(skewed).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("orthonormal")));
  std::vector<uint8_t> huge = good;
  const uint64_t d = uint64_t{1} << 40;
  std::memcpy(huge.data() + 16, &d, 8);
  Reseal(&huge);
  EXPECT_THAT(SubspaceBasis::Parse(huge).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("out of range")));
}

TEST(SubspaceBasisTest, FromMatricesChecksItsInput) {
  auto basis = Seeded(Spec(16, 4, 1, 5, true));
  ASSERT_NE(basis, nullptr);
  std::vector<float> u(basis->u().begin(), basis->u().end());
  std::vector<float> t(basis->table().begin(), basis->table().end());
  LBCC_ASSERT_OK_AND_ASSIGN(auto copy, SubspaceBasis::FromMatrices(16, 4, 1, 5, u, t, 1));
  EXPECT_EQ(copy->id(), basis->id());
  LBCC_ASSERT_OK_AND_ASSIGN(auto other_version, SubspaceBasis::FromMatrices(16, 4, 1, 5, u, t, 2));
  EXPECT_EQ(other_version->id().hash, basis->id().hash);
  EXPECT_NE(other_version->id(), basis->id());
  LBCC_ASSERT_OK_AND_ASSIGN(auto no_table, SubspaceBasis::FromMatrices(16, 4, 1, 5, u, {}, 1));
  EXPECT_NE(no_table->id().hash, basis->id().hash);

  std::vector<float> skewed = u;
  skewed[5] += 0.01f;
  EXPECT_THAT(SubspaceBasis::FromMatrices(16, 4, 1, 5, skewed, t, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("orthonormal")));
  std::vector<float> nan = u;
  nan[0] = NAN;
  EXPECT_THAT(SubspaceBasis::FromMatrices(16, 4, 1, 5, nan, t, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("non-finite")));
  EXPECT_THAT(SubspaceBasis::FromMatrices(16, 4, 1, 5, {1, 2, 3}, t, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SubspaceBasis::FromMatrices(16, 4, 1, 6, u, t, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SubspaceBasis::FromMatrices(16, 4, 2, 5, u, t, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SubspaceBasisTest, FromSeedRejectsBadSpecs) {
  EXPECT_THAT(SubspaceBasis::FromSeed(Spec(0, 1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SubspaceBasis::FromSeed(Spec(8, 9)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SubspaceBasis::FromSeed(Spec(8, 0)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SubspaceBasis::FromSeed(Spec(8, 2, 256)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SubspaceBasis::FromSeed(Spec(8, 2, 1, -1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SubspaceBasis::FromSeed(Spec(8, 2, 1, 0, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab")));
  SubspaceSeedSpec bad_scale = Spec(8, 2, 1, 4, true);
  bad_scale.table_stddev = NAN;
  EXPECT_THAT(SubspaceBasis::FromSeed(bad_scale).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lbcc::codecs

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) lbcc::codecs::g_helper = argv[1];
  return RUN_ALL_TESTS();
}
