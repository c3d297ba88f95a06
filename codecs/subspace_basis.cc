// Compiled with -ffp-contract=off (see codecs/BUILD.bazel): the generator, the QR and the
// portable products below must round every operation separately on every compiler and -march,
// because their bits define a basis' identity.
#include "codecs/subspace_basis.h"

#include <cblas.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "codecs/payload.h"

namespace lbcc::codecs {
namespace subspace_internal {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "basis files assume little-endian");

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Unit(uint64_t x) { return static_cast<double>((x >> 11) + 1) * 0x1.0p-53; }

// Sum of a[i] * b[i] in a fixed order: eight interleaved partial sums (lane i % 8), combined
// pairwise. Vectorising this loop keeps every lane's sequence of operations, so the result is
// the same at any SIMD width. Changing this order changes every seeded basis' hash.
double Dot(const double* a, const double* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i < n; ++i, ++l) s[l] += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// y -= f * x.
void SubScaled(double* y, const double* x, double f, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] -= f * x[i];
}

template <typename A, typename B>
void GemmImpl(const A* a, int64_t lda, const B* b, int64_t ldb, double* c, int64_t ldc, int64_t m,
              int64_t n, int64_t p) {
  constexpr int64_t kTile = 256;
  constexpr int64_t kRows = 4;
  double acc[kRows][kTile];
  for (int64_t r0 = 0; r0 < m; r0 += kRows) {
    const int64_t rows = std::min(kRows, m - r0);
    for (int64_t n0 = 0; n0 < n; n0 += kTile) {
      const int64_t nt = std::min(kTile, n - n0);
      for (int64_t r = 0; r < rows; ++r) std::fill(acc[r], acc[r] + nt, 0.0);
      // Every output accumulates a[r, q] * b[q, c] for q = 0, 1, ... in order; the row and
      // column blocking only decides which outputs share a pass over b.
      for (int64_t q = 0; q < p; ++q) {
        const B* brow = b + q * ldb + n0;
        for (int64_t r = 0; r < rows; ++r) {
          const double av = static_cast<double>(a[(r0 + r) * lda + q]);
          double* out = acc[r];
          for (int64_t col = 0; col < nt; ++col) out[col] += av * static_cast<double>(brow[col]);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        std::copy(acc[r], acc[r] + nt, c + (r0 + r) * ldc + n0);
      }
    }
  }
}

}  // namespace

uint64_t Random64(uint64_t seed, uint64_t stream, uint64_t n) {
  const uint64_t key = Mix64(seed ^ Mix64(stream ^ 0x5375627370616365ull));
  return Mix64(key + (n + 1) * 0x9E3779B97F4A7C15ull);
}

double PortableLog(double x) {
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  int64_t e = static_cast<int64_t>((bits >> 52) & 0x7ff);
  if (e == 0) {  // subnormal: scale into the normal range (exact)
    x *= 0x1.0p54;
    std::memcpy(&bits, &x, sizeof(bits));
    e = static_cast<int64_t>((bits >> 52) & 0x7ff) - 54;
  }
  e -= 1023;
  // m in [1, 2), then folded into (sqrt(2)/2, sqrt(2)].
  bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
  double m;
  std::memcpy(&m, &bits, sizeof(m));
  if (m > 1.4142135623730951) {
    m *= 0.5;
    e += 1;
  }
  // ln m = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...), |s| <= 0.1716.
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double poly = 1.0 / 23.0;
  poly = poly * s2 + 1.0 / 21.0;
  poly = poly * s2 + 1.0 / 19.0;
  poly = poly * s2 + 1.0 / 17.0;
  poly = poly * s2 + 1.0 / 15.0;
  poly = poly * s2 + 1.0 / 13.0;
  poly = poly * s2 + 1.0 / 11.0;
  poly = poly * s2 + 1.0 / 9.0;
  poly = poly * s2 + 1.0 / 7.0;
  poly = poly * s2 + 1.0 / 5.0;
  poly = poly * s2 + 1.0 / 3.0;
  poly = poly * s2 + 1.0;
  return static_cast<double>(e) * 0.6931471805599453 + 2.0 * s * poly;
}

double PortableCos2Pi(double x) {
  // x = q/4 + r exactly, |r| <= 1/8; cos(2 pi x) = cos(t + q pi/2) with t = 2 pi r.
  const int64_t q = static_cast<int64_t>(x * 4.0 + 0.5);
  const double r = x - static_cast<double>(q) * 0.25;
  const double t = 6.283185307179586 * r;
  const double t2 = t * t;
  // Taylor series to t^20 and t^21; |t| <= pi/4.
  double c = 1.0 / 2432902008176640000.0;  // 1/20!
  c = c * -t2 + 1.0 / 6402373705728000.0;  // 1/18!
  c = c * -t2 + 1.0 / 20922789888000.0;    // 1/16!
  c = c * -t2 + 1.0 / 87178291200.0;       // 1/14!
  c = c * -t2 + 1.0 / 479001600.0;         // 1/12!
  c = c * -t2 + 1.0 / 3628800.0;           // 1/10!
  c = c * -t2 + 1.0 / 40320.0;             // 1/8!
  c = c * -t2 + 1.0 / 720.0;               // 1/6!
  c = c * -t2 + 1.0 / 24.0;                // 1/4!
  c = c * -t2 + 1.0 / 2.0;                 // 1/2!
  c = c * -t2 + 1.0;
  double s = 1.0 / 51090942171709440000.0;  // 1/21!
  s = s * -t2 + 1.0 / 121645100408832000.0;  // 1/19!
  s = s * -t2 + 1.0 / 355687428096000.0;     // 1/17!
  s = s * -t2 + 1.0 / 1307674368000.0;       // 1/15!
  s = s * -t2 + 1.0 / 6227020800.0;          // 1/13!
  s = s * -t2 + 1.0 / 39916800.0;            // 1/11!
  s = s * -t2 + 1.0 / 362880.0;              // 1/9!
  s = s * -t2 + 1.0 / 5040.0;                // 1/7!
  s = s * -t2 + 1.0 / 120.0;                 // 1/5!
  s = s * -t2 + 1.0 / 6.0;                   // 1/3!
  s = s * -t2 + 1.0;
  s *= t;
  switch (q & 3) {
    case 0:
      return c;
    case 1:
      return -s;
    case 2:
      return -c;
    default:
      return s;
  }
}

double Gaussian(uint64_t seed, uint64_t stream, uint64_t n) {
  const double u1 = Unit(Random64(seed, stream, 2 * n));
  const double u2 = Unit(Random64(seed, stream, 2 * n + 1));
  return std::sqrt(-2.0 * PortableLog(u1)) * PortableCos2Pi(u2);
}

std::vector<double> HouseholderQ(std::vector<double> a, int64_t d, int64_t k) {
  LBCC_CHECK_EQ(a.size(), static_cast<size_t>(d * k));
  LBCC_CHECK_LE(k, d);
  std::vector<double> beta(k, 0.0);
  std::vector<double> alpha(k, 0.0);
  // Factor: column j's tail becomes the Householder vector v_j (v_j[0] at row j).
  for (int64_t j = 0; j < k; ++j) {
    double* x = a.data() + j * d + j;
    const int64_t len = d - j;
    const double norm = std::sqrt(Dot(x, x, len));
    alpha[j] = x[0] >= 0 ? -norm : norm;
    x[0] -= alpha[j];
    const double vv = Dot(x, x, len);
    beta[j] = vv > 0 ? 2.0 / vv : 0.0;
    for (int64_t col = j + 1; col < k; ++col) {
      double* y = a.data() + col * d + j;
      SubScaled(y, x, beta[j] * Dot(x, y, len), len);
    }
  }
  // Q = H_0 H_1 ... H_{k-1} [I; 0], accumulated from the last reflector.
  std::vector<double> q(static_cast<size_t>(d * k), 0.0);
  for (int64_t j = 0; j < k; ++j) q[j * d + j] = 1.0;
  for (int64_t j = k - 1; j >= 0; --j) {
    const double* v = a.data() + j * d + j;
    const int64_t len = d - j;
    for (int64_t col = j; col < k; ++col) {
      double* y = q.data() + col * d + j;
      SubScaled(y, v, beta[j] * Dot(v, y, len), len);
    }
  }
  // R's diagonal is alpha; make it positive so Q is unique (and Haar-distributed for Gaussian a).
  for (int64_t j = 0; j < k; ++j) {
    if (alpha[j] < 0) {
      for (int64_t i = 0; i < d; ++i) q[j * d + i] = -q[j * d + i];
    }
  }
  return q;
}

void PortableGemm(const float* a, int64_t lda, const double* b, int64_t ldb, double* c,
                  int64_t ldc, int64_t m, int64_t n, int64_t p) {
  GemmImpl(a, lda, b, ldb, c, ldc, m, n, p);
}
void PortableGemm(const double* a, int64_t lda, const double* b, int64_t ldb, double* c,
                  int64_t ldc, int64_t m, int64_t n, int64_t p) {
  GemmImpl(a, lda, b, ldb, c, ldc, m, n, p);
}
void PortableGemm(const double* a, int64_t lda, const float* b, int64_t ldb, double* c,
                  int64_t ldc, int64_t m, int64_t n, int64_t p) {
  GemmImpl(a, lda, b, ldb, c, ldc, m, n, p);
}

}  // namespace subspace_internal

namespace {

constexpr char kFileMagic[8] = {'L', 'B', 'C', 'C', 'S', 'U', 'B', 'B'};
constexpr uint32_t kFileFormatVersion = 1;
constexpr size_t kFileHeaderBytes = 64;
constexpr uint64_t kTableStream = uint64_t{1} << 32;
constexpr char kHashPrefix[] = "LBCC subspace basis v1";

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt subspace basis file: ", what));
}

absl::Status CheckShape(int64_t d, int64_t k, int64_t m, int64_t v) {
  if (d < 1 || d > kSubspaceMaxModelDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("model dim d = ", d, " outside [1, ", kSubspaceMaxModelDim, "]"));
  }
  if (k < 1 || k > d) {
    return absl::InvalidArgumentError(absl::StrCat("rank k = ", k, " outside [1, d = ", d, "]"));
  }
  if (m < 1 || m > kSubspaceMaxComponents) {
    return absl::InvalidArgumentError(
        absl::StrCat("components M = ", m, " outside [1, ", kSubspaceMaxComponents, "]"));
  }
  if (v < 0 || v > kSubspaceMaxVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocabulary V = ", v, " outside [0, ", kSubspaceMaxVocab, "]"));
  }
  return absl::OkStatus();
}

bool AllFinite(absl::Span<const float> values) {
  for (float x : values) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double ComponentOrthonormalityError(const float* u, int64_t ld, int64_t d, int64_t k) {
  std::vector<double> ud(static_cast<size_t>(d * k));
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < k; ++j) ud[i * k + j] = u[i * ld + j];
  }
  std::vector<double> g(static_cast<size_t>(k * k));
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(k), static_cast<int>(k),
              static_cast<int>(d), 1.0, ud.data(), static_cast<int>(k), ud.data(),
              static_cast<int>(k), 0.0, g.data(), static_cast<int>(k));
  double worst = 0;
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const double e = std::fabs(g[i * k + j] - (i == j ? 1.0 : 0.0));
      if (!(e <= worst)) worst = e;  // NaN propagates as the worst
    }
  }
  return worst;
}

}  // namespace

std::string SubspaceBasisId::ToString() const {
  return absl::StrFormat("%016x/v%u", hash, version);
}

int SubspaceIdWidth(int64_t vocab_size) {
  if (vocab_size <= 0) return 0;
  if (vocab_size <= (int64_t{1} << 8)) return 1;
  if (vocab_size <= (int64_t{1} << 16)) return 2;
  if (vocab_size <= (int64_t{1} << 24)) return 3;
  return 4;
}

uint64_t SubspaceContentHash(int64_t d, int64_t k, int64_t m, int64_t v, absl::Span<const float> u,
                             absl::Span<const float> table) {
  XXH3_state_t* state = XXH3_createState();
  LBCC_CHECK(state != nullptr) << "XXH3_createState";
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, kHashPrefix, sizeof(kHashPrefix) - 1);
  for (uint64_t field : {static_cast<uint64_t>(d), static_cast<uint64_t>(k),
                         static_cast<uint64_t>(m), static_cast<uint64_t>(v),
                         static_cast<uint64_t>(table.empty() ? 0 : 1)}) {
    XXH3_64bits_update(state, &field, sizeof(field));
  }
  XXH3_64bits_update(state, u.data(), u.size() * sizeof(float));
  if (!table.empty()) XXH3_64bits_update(state, table.data(), table.size() * sizeof(float));
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

absl::StatusOr<std::shared_ptr<const SubspaceBasis>> SubspaceBasis::Make(
    int64_t d, int64_t k, int64_t m, int64_t v, std::vector<float> u, std::vector<float> table,
    uint32_t version) {
  std::shared_ptr<SubspaceBasis> basis(new SubspaceBasis());
  basis->d_ = d;
  basis->k_ = k;
  basis->m_ = m;
  basis->v_ = v;
  basis->u_ = std::move(u);
  basis->table_ = std::move(table);
  basis->id_.hash = SubspaceContentHash(d, k, m, v, basis->u_, basis->table_);
  basis->id_.version = version;
  if (!basis->table_.empty()) {
    const int64_t n = m * k;
    basis->projected_table_.resize(static_cast<size_t>(v * n));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(v),
                static_cast<int>(n), static_cast<int>(d), 1.0f, basis->table_.data(),
                static_cast<int>(d), basis->u_.data(), static_cast<int>(n), 0.0f,
                basis->projected_table_.data(), static_cast<int>(n));
  }
  return std::shared_ptr<const SubspaceBasis>(std::move(basis));
}

absl::StatusOr<std::shared_ptr<const SubspaceBasis>> SubspaceBasis::FromSeed(
    const SubspaceSeedSpec& spec) {
  LBCC_RETURN_IF_ERROR(CheckShape(spec.model_dim, spec.rank, spec.components, spec.vocab_size));
  if (spec.with_table && spec.vocab_size == 0) {
    return absl::InvalidArgumentError("a seeded table needs vocab_size > 0");
  }
  if (spec.with_table && !(std::isfinite(spec.table_stddev) && spec.table_stddev >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table_stddev ", spec.table_stddev, " is not a finite value >= 0"));
  }
  const int64_t d = spec.model_dim, k = spec.rank, m = spec.components;
  const int64_t ld = m * k;
  std::vector<float> u(static_cast<size_t>(d * ld));
  for (int64_t c = 0; c < m; ++c) {
    // G_c[i, j] = Gaussian(seed, stream c, i * k + j), held column-major for the QR.
    std::vector<double> g(static_cast<size_t>(d * k));
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        g[j * d + i] = subspace_internal::Gaussian(spec.seed, static_cast<uint64_t>(c),
                                                   static_cast<uint64_t>(i * k + j));
      }
    }
    const std::vector<double> q = subspace_internal::HouseholderQ(std::move(g), d, k);
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < k; ++j) u[i * ld + c * k + j] = static_cast<float>(q[j * d + i]);
    }
  }
  std::vector<float> table;
  if (spec.with_table) {
    const int64_t v = spec.vocab_size;
    table.resize(static_cast<size_t>(v * d));
    for (int64_t n = 0; n < v * d; ++n) {
      table[n] = static_cast<float>(
          spec.table_stddev *
          subspace_internal::Gaussian(spec.seed, kTableStream, static_cast<uint64_t>(n)));
    }
  }
  return Make(d, k, m, spec.vocab_size, std::move(u), std::move(table), spec.version);
}

absl::StatusOr<std::shared_ptr<const SubspaceBasis>> SubspaceBasis::FromMatrices(
    int64_t model_dim, int64_t rank, int64_t components, int64_t vocab_size, std::vector<float> u,
    std::vector<float> table, uint32_t version, double orthonormality_tolerance) {
  LBCC_RETURN_IF_ERROR(CheckShape(model_dim, rank, components, vocab_size));
  const size_t u_size = static_cast<size_t>(model_dim * components * rank);
  if (u.size() != u_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("U holds ", u.size(), " values, d x M*k = ", u_size));
  }
  if (!table.empty() && table.size() != static_cast<size_t>(vocab_size * model_dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "T holds ", table.size(), " values, V x d = ", vocab_size * model_dim));
  }
  if (!AllFinite(u) || !AllFinite(table)) {
    return absl::InvalidArgumentError("U or T holds a non-finite value");
  }
  for (int64_t c = 0; c < components; ++c) {
    const double err =
        ComponentOrthonormalityError(u.data() + c * rank, components * rank, model_dim, rank);
    if (!(err <= orthonormality_tolerance)) {
      return absl::InvalidArgumentError(absl::StrCat("component ", c, " of U is not orthonormal: max |U^T U - I| = ",
                                                     err, " > ", orthonormality_tolerance));
    }
  }
  return Make(model_dim, rank, components, vocab_size, std::move(u), std::move(table), version);
}

absl::StatusOr<std::shared_ptr<const SubspaceBasis>> SubspaceBasis::WithTable(
    std::vector<float> table, uint32_t version) const {
  if (table.size() != static_cast<size_t>(v_ * d_) || table.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("T holds ", table.size(), " values, V x d = ", v_ * d_));
  }
  if (!AllFinite(table)) return absl::InvalidArgumentError("T holds a non-finite value");
  return Make(d_, k_, m_, v_, u_, std::move(table), version);
}

double SubspaceBasis::OrthonormalityError() const {
  double worst = 0;
  for (int64_t c = 0; c < m_; ++c) {
    worst = std::max(worst, ComponentOrthonormalityError(component(c), ld(), d_, k_));
  }
  return worst;
}

std::vector<uint8_t> SubspaceBasis::Serialize() const {
  const size_t u_bytes = u_.size() * sizeof(float), t_bytes = table_.size() * sizeof(float);
  std::vector<uint8_t> out(kFileHeaderBytes + u_bytes + t_bytes + 8);
  ByteWriter w(absl::MakeSpan(out));
  w.Bytes(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(kFileMagic), sizeof(kFileMagic)));
  w.U32(kFileFormatVersion);
  w.U32(has_table() ? 1u : 0u);
  w.U64(static_cast<uint64_t>(d_));
  w.U64(static_cast<uint64_t>(k_));
  w.U64(static_cast<uint64_t>(m_));
  w.U64(static_cast<uint64_t>(v_));
  w.U32(id_.version);
  w.U32(0);
  w.U64(id_.hash);
  LBCC_CHECK_EQ(w.offset(), kFileHeaderBytes);
  w.Bytes(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(u_.data()), u_bytes));
  if (t_bytes > 0) {
    w.Bytes(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(table_.data()), t_bytes));
  }
  w.U64(XXH3_64bits(out.data(), out.size() - 8));
  return out;
}

absl::StatusOr<std::shared_ptr<const SubspaceBasis>> SubspaceBasis::Parse(
    absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kFileHeaderBytes + 8) {
    return Corrupt(absl::StrCat("truncated: ", bytes.size(), " bytes, a header needs ",
                                kFileHeaderBytes + 8));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kFileMagic, sizeof(kFileMagic)) != 0) return Corrupt("bad magic");
  const uint32_t format = Get<uint32_t>(p + 8);
  if (format != kFileFormatVersion) {
    return Corrupt(absl::StrCat("unknown format version ", format, " (this build reads ",
                                kFileFormatVersion, ")"));
  }
  const uint32_t flags = Get<uint32_t>(p + 12);
  if ((flags & ~1u) != 0) return Corrupt(absl::StrCat("unknown flags 0x", absl::Hex(flags)));
  const uint64_t d = Get<uint64_t>(p + 16), k = Get<uint64_t>(p + 24), m = Get<uint64_t>(p + 32),
                 v = Get<uint64_t>(p + 40);
  const uint32_t version = Get<uint32_t>(p + 48);
  if (Get<uint32_t>(p + 52) != 0) return Corrupt("reserved field is not zero");
  const uint64_t hash = Get<uint64_t>(p + 56);
  // Bound every field before multiplying (d <= 2^20, M*k <= 2^28, V < 2^31).
  if (d > static_cast<uint64_t>(kSubspaceMaxModelDim) || k > d ||
      m > static_cast<uint64_t>(kSubspaceMaxComponents) ||
      v > static_cast<uint64_t>(kSubspaceMaxVocab)) {
    return Corrupt(absl::StrCat("shape out of range: d ", d, " k ", k, " M ", m, " V ", v));
  }
  absl::Status shape = CheckShape(static_cast<int64_t>(d), static_cast<int64_t>(k),
                                  static_cast<int64_t>(m), static_cast<int64_t>(v));
  if (!shape.ok()) return Corrupt(shape.message());
  const bool with_table = (flags & 1u) != 0;
  if (with_table && v == 0) return Corrupt("table flagged with an empty vocabulary");
  const uint64_t u_count = d * m * k;
  const uint64_t t_count = with_table ? v * d : 0;
  const uint64_t expected = kFileHeaderBytes + 4 * (u_count + t_count) + 8;
  if (bytes.size() != expected) {
    return Corrupt(absl::StrCat(bytes.size() < expected ? "truncated" : "trailing bytes",
                                ": header declares ", expected, " bytes, got ", bytes.size()));
  }
  if (XXH3_64bits(p, expected - 8) != Get<uint64_t>(p + expected - 8)) {
    return Corrupt("checksum mismatch");
  }
  std::vector<float> u(u_count), table(t_count);
  std::memcpy(u.data(), p + kFileHeaderBytes, u_count * 4);
  if (t_count > 0) std::memcpy(table.data(), p + kFileHeaderBytes + u_count * 4, t_count * 4);
  if (!AllFinite(u) || !AllFinite(table)) return Corrupt("non-finite value in U or T");
  if (SubspaceContentHash(d, k, m, v, u, table) != hash) {
    return Corrupt("content hash does not match the contents");
  }
  for (uint64_t c = 0; c < m; ++c) {
    const double err = ComponentOrthonormalityError(u.data() + c * k, m * k, d, k);
    if (!(err <= 1e-4)) {
      return Corrupt(absl::StrCat("component ", c, " is not orthonormal (max |U^T U - I| = ", err,
                                  ")"));
    }
  }
  return Make(d, k, m, v, std::move(u), std::move(table), version);
}

absl::StatusOr<std::shared_ptr<const SubspaceBasis>> SubspaceBasis::Load(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  std::vector<uint8_t> bytes;
  uint8_t buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) {
    bytes.insert(bytes.end(), buffer, buffer + n);
  }
  const bool failed = std::ferror(f) != 0;
  const int error = errno;
  std::fclose(f);
  if (failed) return absl::ErrnoToStatus(error, absl::StrCat("read ", path));
  absl::StatusOr<std::shared_ptr<const SubspaceBasis>> basis = Parse(bytes);
  if (!basis.ok()) return Annotate(basis.status(), path);
  return basis;
}

absl::Status SubspaceBasis::Save(const std::string& path) const {
  const std::vector<uint8_t> bytes = Serialize();
  const std::string tmp = absl::StrCat(path, ".tmp");
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("create ", tmp));
  const bool wrote = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  int error = errno;
  if (std::fclose(f) != 0 && wrote) {
    error = errno;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(error, absl::StrCat("close ", tmp));
  }
  if (!wrote) {
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(error, absl::StrCat("write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    error = errno;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(error, absl::StrCat("rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace lbcc::codecs
