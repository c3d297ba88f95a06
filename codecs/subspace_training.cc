// Compiled with -ffp-contract=off (see codecs/BUILD.bazel): kPortable results must not depend on
// the compiler fusing operations.
#include "codecs/subspace_training.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

// LAPACK from OpenBLAS (Fortran calling convention with hidden string lengths).
extern "C" void dsyevr_(const char* jobz, const char* range, const char* uplo, const int* n,
                        double* a, const int* lda, const double* vl, const double* vu,
                        const int* il, const int* iu, const double* abstol, int* m, double* w,
                        double* z, const int* ldz, int* isuppz, double* work, const int* lwork,
                        int* iwork, const int* liwork, int* info, size_t jobz_len,
                        size_t range_len, size_t uplo_len);

namespace lbcc::codecs {
namespace {

using subspace_internal::PortableGemm;

constexpr int64_t kRowChunk = 256;

absl::Status RequireSingle(const SubspaceBasis& basis, absl::string_view what) {
  if (basis.components() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " needs a single basis; this one has M = ", basis.components(), " components"));
  }
  return absl::OkStatus();
}

absl::Status CheckMatrix(const TensorView& x, absl::string_view what) {
  if (!x.is_host() || x.dtype() != DType::kF32 || x.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", x.DebugString(), ", expected a host f32 matrix"));
  }
  if (x.dim(0) > INT32_MAX || x.dim(1) > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is too large: ", x.DebugString()));
  }
  return absl::OkStatus();
}

// U [d x k] and U^T [k x d] in double.
void BasisInDouble(const SubspaceBasis& basis, std::vector<double>* u, std::vector<double>* ut) {
  const int64_t d = basis.model_dim(), k = basis.rank();
  const float* src = basis.u().data();
  u->resize(static_cast<size_t>(d * k));
  ut->resize(static_cast<size_t>(d * k));
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      (*u)[i * k + j] = src[i * k + j];
      (*ut)[j * d + i] = src[i * k + j];
    }
  }
}

// x [rows x d] (float) -> out [rows x d] = x U U^T (float), by row chunks.
void ProjectRows(const SubspaceBasis& basis, const float* x, int64_t rows, float* out,
                 SubspaceArithmetic arithmetic) {
  const int64_t d = basis.model_dim(), k = basis.rank();
  if (rows == 0) return;
  if (arithmetic == SubspaceArithmetic::kBlas) {
    std::vector<float> a(static_cast<size_t>(std::min(rows, kRowChunk) * k));
    for (int64_t r0 = 0; r0 < rows; r0 += kRowChunk) {
      const int n = static_cast<int>(std::min(kRowChunk, rows - r0));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, static_cast<int>(k),
                  static_cast<int>(d), 1.0f, x + r0 * d, static_cast<int>(d), basis.u().data(),
                  static_cast<int>(k), 0.0f, a.data(), static_cast<int>(k));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, static_cast<int>(d),
                  static_cast<int>(k), 1.0f, a.data(), static_cast<int>(k), basis.u().data(),
                  static_cast<int>(k), 0.0f, out + r0 * d, static_cast<int>(d));
    }
    return;
  }
  std::vector<double> u, ut;
  BasisInDouble(basis, &u, &ut);
  std::vector<double> a(static_cast<size_t>(kRowChunk * k)), p(static_cast<size_t>(kRowChunk * d));
  for (int64_t r0 = 0; r0 < rows; r0 += kRowChunk) {
    const int64_t n = std::min(kRowChunk, rows - r0);
    PortableGemm(x + r0 * d, d, u.data(), k, a.data(), k, n, k, d);
    PortableGemm(a.data(), k, ut.data(), d, p.data(), d, n, d, k);
    for (int64_t i = 0; i < n * d; ++i) out[r0 * d + i] = static_cast<float>(p[i]);
  }
}

// Top `k` eigenvectors of the symmetric d x d matrix `s` (row-major, upper triangle used), as the
// columns of a row-major d x k float matrix written at `out` with leading dimension `ld`, largest
// eigenvalue first.
absl::Status TopEigenvectors(std::vector<double> s, int64_t d, int64_t k, float* out, int64_t ld) {
  const int n = static_cast<int>(d);
  const int il = static_cast<int>(d - k + 1), iu = n;
  const double vl = 0, vu = 0, abstol = 0;
  int found = 0, info = 0;
  std::vector<double> w(static_cast<size_t>(d)), z(static_cast<size_t>(d * k));
  std::vector<int> isuppz(static_cast<size_t>(2 * k));
  int lwork = -1, liwork = -1, iwork_query = 0;
  double work_query = 0;
  // Row-major upper == column-major lower.
  dsyevr_("V", "I", "L", &n, s.data(), &n, &vl, &vu, &il, &iu, &abstol, &found, w.data(), z.data(),
          &n, isuppz.data(), &work_query, &lwork, &iwork_query, &liwork, &info, 1, 1, 1);
  if (info != 0) return absl::InternalError(absl::StrCat("dsyevr workspace query: info ", info));
  lwork = static_cast<int>(work_query);
  liwork = iwork_query;
  std::vector<double> work(static_cast<size_t>(std::max(lwork, 1)));
  std::vector<int> iwork(static_cast<size_t>(std::max(liwork, 1)));
  dsyevr_("V", "I", "L", &n, s.data(), &n, &vl, &vu, &il, &iu, &abstol, &found, w.data(), z.data(),
          &n, isuppz.data(), work.data(), &lwork, iwork.data(), &liwork, &info, 1, 1, 1);
  if (info != 0 || found != k) {
    return absl::InternalError(absl::StrCat("dsyevr: info ", info, ", ", found, " of ", k,
                                            " eigenvectors"));
  }
  // z is column-major d x k, eigenvalues ascending.
  for (int64_t j = 0; j < k; ++j) {
    const double* col = z.data() + (k - 1 - j) * d;
    for (int64_t i = 0; i < d; ++i) out[i * ld + j] = static_cast<float>(col[i]);
  }
  return absl::OkStatus();
}

// Principal subspace of the rows listed in `rows` of x [n x d] (all rows when empty).
absl::Status FitComponent(const float* x, int64_t d, int64_t n, absl::Span<const int64_t> blocks,
                          int64_t block, int64_t k, float* out, int64_t ld) {
  std::vector<float> s(static_cast<size_t>(d * d), 0.0f);
  auto accumulate = [&](int64_t r0, int64_t r1) {
    if (r1 <= r0) return;
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(d),
                static_cast<int>(r1 - r0), 1.0f, x + r0 * d, static_cast<int>(d), 1.0f, s.data(),
                static_cast<int>(d));
  };
  if (blocks.empty()) {
    accumulate(0, n);
  } else {
    for (int64_t b : blocks) accumulate(b * block, std::min(n, (b + 1) * block));
  }
  return TopEigenvectors(std::vector<double>(s.begin(), s.end()), d, k, out, ld);
}

}  // namespace

absl::Status ProjectWeight(const SubspaceBasis& basis, const TensorView& weight, ModelDimSide side,
                           SubspaceArithmetic arithmetic) {
  LBCC_RETURN_IF_ERROR(RequireSingle(basis, "weight projection"));
  LBCC_RETURN_IF_ERROR(CheckMatrix(weight, "weight"));
  const int64_t d = basis.model_dim(), k = basis.rank();
  const int dim = side == ModelDimSide::kRows ? 0 : 1;
  if (weight.dim(dim) != d) {
    return absl::InvalidArgumentError(absl::StrCat("weight is ", weight.DebugString(), ": its ",
                                                   dim == 0 ? "rows" : "columns", " must be d = ",
                                                   d));
  }
  float* w = weight.data_as<float>();
  if (side == ModelDimSide::kColumns) {
    ProjectRows(basis, w, weight.dim(0), w, arithmetic);
    return absl::OkStatus();
  }
  const int64_t n = weight.dim(1);
  if (n == 0) return absl::OkStatus();
  if (arithmetic == SubspaceArithmetic::kBlas) {
    std::vector<float> a(static_cast<size_t>(k * n));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(k), static_cast<int>(n),
                static_cast<int>(d), 1.0f, basis.u().data(), static_cast<int>(k), w,
                static_cast<int>(n), 0.0f, a.data(), static_cast<int>(n));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(d),
                static_cast<int>(n), static_cast<int>(k), 1.0f, basis.u().data(),
                static_cast<int>(k), a.data(), static_cast<int>(n), 0.0f, w, static_cast<int>(n));
    return absl::OkStatus();
  }
  std::vector<double> u, ut;
  BasisInDouble(basis, &u, &ut);
  std::vector<double> a(static_cast<size_t>(k * n));
  PortableGemm(ut.data(), d, w, n, a.data(), n, k, n, d);  // U^T W
  std::vector<double> p(static_cast<size_t>(kRowChunk * n));
  for (int64_t r0 = 0; r0 < d; r0 += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, d - r0);
    PortableGemm(u.data() + r0 * k, k, a.data(), n, p.data(), n, rows, n, k);
    for (int64_t i = 0; i < rows * n; ++i) w[r0 * n + i] = static_cast<float>(p[i]);
  }
  return absl::OkStatus();
}

absl::Status ProjectPseudoGradient(const SubspaceBasis& basis, const TensorView& outer,
                                   const TensorView& local, ModelDimSide side,
                                   SubspaceArithmetic arithmetic) {
  LBCC_RETURN_IF_ERROR(RequireSingle(basis, "pseudo-gradient projection"));
  LBCC_RETURN_IF_ERROR(CheckMatrix(outer, "outer"));
  LBCC_RETURN_IF_ERROR(CheckMatrix(local, "local"));
  if (outer.dim(0) != local.dim(0) || outer.dim(1) != local.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat("outer is ", outer.DebugString(), ", local is ",
                                                   local.DebugString(), ": shapes differ"));
  }
  const int64_t n = local.num_elements();
  const float* s = outer.data_as<float>();
  float* w = local.data_as<float>();
  std::vector<float> delta(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) delta[i] = s[i] - w[i];
  LBCC_ASSIGN_OR_RETURN(const TensorView delta_view,
                        TensorView::Host(delta.data(), {local.dim(0), local.dim(1)}));
  LBCC_RETURN_IF_ERROR(ProjectWeight(basis, delta_view, side, arithmetic));
  for (int64_t i = 0; i < n; ++i) w[i] = s[i] - delta[i];
  return absl::OkStatus();
}

namespace {

// What every next-table computation needs: a single basis with a vocabulary and a version
// left, and a host f32 [V x d] embedding. `what` names the operation in the errors.
absl::Status CheckNextTable(const SubspaceBasis& basis, const TensorView& embedding,
                            absl::string_view what) {
  LBCC_RETURN_IF_ERROR(RequireSingle(basis, what));
  if (basis.vocab_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(what, " needs a basis with a vocabulary"));
  }
  if (basis.id().version == std::numeric_limits<uint32_t>::max()) {
    return absl::FailedPreconditionError("basis version is at its maximum");
  }
  LBCC_RETURN_IF_ERROR(CheckMatrix(embedding, "embedding"));
  if (embedding.dim(0) != basis.vocab_size() || embedding.dim(1) != basis.model_dim()) {
    return absl::InvalidArgumentError(absl::StrCat("embedding is ", embedding.DebugString(),
                                                   ", expected [V = ", basis.vocab_size(),
                                                   ", d = ", basis.model_dim(), "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SubspaceBasis>> ShiftEmbedding(const SubspaceBasis& basis,
                                                                    const TensorView& embedding,
                                                                    SubspaceArithmetic arithmetic) {
  LBCC_RETURN_IF_ERROR(CheckNextTable(basis, embedding, "the embedding shift"));
  const int64_t v = basis.vocab_size(), d = basis.model_dim();
  float* e = embedding.data_as<float>();
  std::vector<float> projected(static_cast<size_t>(v * d));
  ProjectRows(basis, e, v, projected.data(), arithmetic);
  std::vector<float> table(static_cast<size_t>(v * d));
  const float* old_table = basis.has_table() ? basis.table().data() : nullptr;
  for (int64_t i = 0; i < v * d; ++i) {
    const double t = old_table != nullptr ? old_table[i] : 0.0;
    table[i] = static_cast<float>(t + (static_cast<double>(e[i]) - projected[i]));
  }
  LBCC_ASSIGN_OR_RETURN(std::shared_ptr<const SubspaceBasis> shifted,
                        basis.WithTable(std::move(table), basis.id().version + 1));
  std::memcpy(e, projected.data(), sizeof(float) * v * d);
  return shifted;
}

absl::StatusOr<std::shared_ptr<const SubspaceBasis>> RefreshTable(const SubspaceBasis& basis,
                                                                  const TensorView& embedding,
                                                                  TableRefreshMode mode,
                                                                  SubspaceArithmetic arithmetic) {
  if (mode == TableRefreshMode::kConstrained) return ShiftEmbedding(basis, embedding, arithmetic);
  LBCC_RETURN_IF_ERROR(CheckNextTable(basis, embedding, "the lossy table refresh"));
  const int64_t v = basis.vocab_size(), d = basis.model_dim();
  const float* e = embedding.data_as<const float>();
  return basis.WithTable(std::vector<float>(e, e + v * d), basis.id().version + 1);
}

absl::StatusOr<SubspaceEnergy> MeasureSubspaceEnergy(std::shared_ptr<const SubspaceBasis> basis,
                                                     const TensorView& h,
                                                     absl::Span<const int32_t> ids,
                                                     int64_t mixture_block) {
  SubspaceCodecOptions options;
  options.coefficient_dtype = DType::kF32;
  options.mixture_block = mixture_block;
  LBCC_ASSIGN_OR_RETURN(SubspaceCodec codec, SubspaceCodec::Create(std::move(basis), options));
  return codec.MeasureEnergy(h, ids);
}

namespace {

// A mixture of M subspaces fitted to blocks of rows (FitSubspaceBasis, M > 1): farthest-first
// seeding, then rounds that assign each block to the component capturing most of its energy
// and refit every component to its blocks.
class MixtureFit {
 public:
  MixtureFit(const float* x, int64_t n, int64_t d, int64_t k, int64_t m, int64_t block)
      : x_(x), n_(n), d_(d), k_(k), m_(m), ld_(m * k), block_(block),
        blocks_((n + block - 1) / block), u_(static_cast<size_t>(d * ld_)),
        total_(static_cast<size_t>(blocks_), 0.0), coef_(static_cast<size_t>(n * ld_)),
        captured_(static_cast<size_t>(blocks_ * m)) {
    for (int64_t r = 0; r < n_; ++r) {
      double s = 0;
      for (int64_t i = 0; i < d_; ++i) s += static_cast<double>(x_[r * d_ + i]) * x_[r * d_ + i];
      total_[r / block_] += s;
    }
  }

  // Farthest-first seeding: each new component is the principal subspace of the block the
  // components so far capture worst (the first block drawn from `seed`).
  absl::Status Seed(uint64_t seed) {
    std::vector<int64_t> seeds = {static_cast<int64_t>(subspace_internal::Random64(seed, 0, 0) %
                                                       static_cast<uint64_t>(blocks_))};
    LBCC_RETURN_IF_ERROR(FitComponent(x_, d_, n_, seeds, block_, k_, u_.data(), ld_));
    for (int64_t c = 1; c < m_; ++c) {
      Measure(c);
      const int64_t b = WorstBlock(c, seeds);
      seeds.push_back(b);
      LBCC_RETURN_IF_ERROR(FitComponent(x_, d_, n_, {b}, block_, k_, u_.data() + c * k_, ld_));
    }
    return absl::OkStatus();
  }

  // Up to `iterations` (at least 1) rounds of assignment and refit, until no block moves; a
  // component left without blocks is refitted to the worst-captured block.
  absl::Status Refine(int iterations) {
    std::vector<int64_t> assignment(static_cast<size_t>(blocks_), -1);
    for (int round = 0; round < std::max(1, iterations); ++round) {
      Measure(m_);
      bool changed = false;
      std::vector<std::vector<int64_t>> members(static_cast<size_t>(m_));
      for (int64_t b = 0; b < blocks_; ++b) {
        int64_t best = 0;
        for (int64_t c = 1; c < m_; ++c) {
          if (captured_[b * m_ + c] > captured_[b * m_ + best]) best = c;
        }
        changed |= assignment[b] != best;
        assignment[b] = best;
        members[best].push_back(b);
      }
      if (!changed) break;
      std::vector<int64_t> reseeded;
      for (int64_t c = 0; c < m_; ++c) {
        if (members[c].empty()) {
          const int64_t b = WorstBlock(m_, reseeded);
          reseeded.push_back(b);
          members[c].push_back(b);
        }
        LBCC_RETURN_IF_ERROR(
            FitComponent(x_, d_, n_, members[c], block_, k_, u_.data() + c * k_, ld_));
      }
    }
    return absl::OkStatus();
  }

  std::vector<float> TakeMatrices() { return std::move(u_); }

 private:
  // captured_[b * m + c]: the energy of block b in component c, for components [0, upto).
  void Measure(int64_t upto) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n_),
                static_cast<int>(upto * k_), static_cast<int>(d_), 1.0f, x_, static_cast<int>(d_),
                u_.data(), static_cast<int>(ld_), 0.0f, coef_.data(), static_cast<int>(ld_));
    std::fill(captured_.begin(), captured_.end(), 0.0);
    for (int64_t r = 0; r < n_; ++r) {
      for (int64_t c = 0; c < upto; ++c) {
        double s = 0;
        for (int64_t j = 0; j < k_; ++j) {
          const double v = coef_[r * ld_ + c * k_ + j];
          s += v * v;
        }
        captured_[(r / block_) * m_ + c] += s;
      }
    }
  }

  // The block (not in `exclude`) whose energy components [0, upto) capture the smallest best
  // fraction of.
  int64_t WorstBlock(int64_t upto, const std::vector<int64_t>& exclude) const {
    int64_t worst = -1;
    double worst_fraction = 2;
    for (int64_t b = 0; b < blocks_; ++b) {
      if (std::find(exclude.begin(), exclude.end(), b) != exclude.end()) continue;
      double best = 0;
      for (int64_t c = 0; c < upto; ++c) best = std::max(best, captured_[b * m_ + c]);
      const double fraction = total_[b] > 0 ? best / total_[b] : 1.0;
      if (fraction < worst_fraction) {
        worst_fraction = fraction;
        worst = b;
      }
    }
    return worst;
  }

  const float* x_;
  const int64_t n_, d_, k_, m_, ld_, block_, blocks_;
  std::vector<float> u_;            // d x (m k), the components side by side
  std::vector<double> total_;       // per block: its energy
  std::vector<float> coef_;         // n x (m k) projections
  std::vector<double> captured_;    // per block and component
};

}  // namespace

absl::StatusOr<std::shared_ptr<const SubspaceBasis>> FitSubspaceBasis(
    const TensorView& samples, const SubspaceFitOptions& options) {
  LBCC_RETURN_IF_ERROR(CheckMatrix(samples, "samples"));
  const int64_t n = samples.dim(0), d = samples.dim(1), k = options.rank, m = options.components;
  const int64_t block = options.mixture_block;
  if (d < 1 || d > kSubspaceMaxModelDim || k < 1 || k > d || m < 1 ||
      m > kSubspaceMaxComponents || n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cannot fit k = ", k, ", M = ", m, " to ",
                                                   samples.DebugString()));
  }
  if (m > 1 && (block < 1 || block > 65535 || (n + block - 1) / block < m)) {
    return absl::InvalidArgumentError(absl::StrCat("need at least M = ", m, " blocks of ", block,
                                                   " rows, have ", n, " rows"));
  }
  const float* x = samples.data_as<float>();
  if (m == 1) {
    std::vector<float> u(static_cast<size_t>(d * k));
    LBCC_RETURN_IF_ERROR(FitComponent(x, d, n, {}, block, k, u.data(), k));
    return SubspaceBasis::FromMatrices(d, k, 1, options.vocab_size, std::move(u), options.table,
                                       options.version);
  }
  MixtureFit fit(x, n, d, k, m, block);
  LBCC_RETURN_IF_ERROR(fit.Seed(options.seed));
  LBCC_RETURN_IF_ERROR(fit.Refine(options.iterations));
  return SubspaceBasis::FromMatrices(d, k, m, options.vocab_size, fit.TakeMatrices(),
                                     options.table, options.version);
}

}  // namespace lbcc::codecs
