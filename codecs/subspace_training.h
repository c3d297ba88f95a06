// Training-side helpers of the subspace codec: keeping a model's residual writes in span(U).
//
//   ProjectWeight          W <- U U^T W on the model-dim side of a weight (both orientations),
//                          for dense W_o / W_2 after each optimizer (or SparseLoCo outer) step.
//   ShiftEmbedding         T <- T + (E - E U U^T), E <- E U U^T: moves the out-of-subspace part of
//                          a dense embedding into the fixed table (h0 = T[y] + E[y] is unchanged up
//                          to rounding) and returns the basis with the new table and version + 1.
//   RefreshTable           the basis for the next outer step in either boundary design
//                          (reference/subspace.md, "Two designs"): kLossy takes the synced
//                          embedding itself as T (nothing constrained, embedding untouched);
//                          kConstrained is ShiftEmbedding. Version + 1 either way.
//   ProjectPseudoGradient  W <- S - U U^T (S - W): projects a replica's pseudo-gradient S - W
//                          (S the outer copy) onto span(U) before it is compressed, so top-k
//                          spends its budget only on what the outer step keeps.
//   MeasureSubspaceEnergy  how much of a batch's h - T[y] lies outside the subspace.
//   FitSubspaceBasis       a basis (or a mixture of subspaces) fitted to samples of h - T[y]:
//                          principal subspace for M = 1, K-subspaces over token blocks for M > 1.
//                          The result is distributed as a file (SubspaceBasis::Save), not a seed.
//
// Arithmetic: the caller chooses (see SubspaceArithmetic). A shifted table defines the next
// basis' hash, so ranks that each apply the shift must use kPortable (identical bits on every
// x86-64 machine) unless one rank computes it and ships the file. Weight projection with kBlas is
// several times faster; use kPortable where replicas must stay bit-identical.
//
// These helpers need a single basis (M = 1); a mixture basis gets FailedPrecondition.
// Thread-safety: stateless functions; the caller must not touch a tensor while it is modified.
#ifndef LBCC_CODECS_SUBSPACE_TRAINING_H_
#define LBCC_CODECS_SUBSPACE_TRAINING_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/tensor_view.h"
#include "codecs/subspace_basis.h"
#include "codecs/subspace_codec.h"

namespace lbcc::codecs {

// Which dimension of a weight is the model (residual) dimension d.
enum class ModelDimSide {
  kRows,     // W is [d x n]: W <- U (U^T W)     (e.g. y = W x writing into the residual)
  kColumns,  // W is [n x d]: W <- (W U) U^T     (e.g. y = x W, the PyTorch Linear weight of a
             //                                  layer reading from or writing to the residual)
};

// Projects `weight` (host f32, rank 2, the `side` dimension equal to d) in place.
// InvalidArgument for a bad view; FailedPrecondition for a mixture basis.
absl::Status ProjectWeight(const SubspaceBasis& basis, const TensorView& weight, ModelDimSide side,
                           SubspaceArithmetic arithmetic);

// Shifts `embedding` (host f32 [V x d], V the basis' vocabulary) in place and returns the basis
// with T + (E - E U U^T) (a zero T when the basis has none) and version + 1. `embedding` is
// modified only when the call succeeds. InvalidArgument for a bad view; FailedPrecondition for a
// mixture basis, a basis without vocabulary, or version UINT32_MAX.
absl::StatusOr<std::shared_ptr<const SubspaceBasis>> ShiftEmbedding(const SubspaceBasis& basis,
                                                                    const TensorView& embedding,
                                                                    SubspaceArithmetic arithmetic);

// The two pipeline-boundary designs' table after a SparseLoCo outer step.
enum class TableRefreshMode {
  // The seed paper's lossy boundary: no weight is constrained; T is the synced token-embedding
  // table itself, so the boundary sends c = U^T (h - E[y]) and loses what lies outside span(U)
  // only on compressed replicas. The next basis is basis.WithTable(E, version + 1); E is read,
  // never written.
  kLossy,
  // Protocol Models' constrained boundary: ShiftEmbedding (E projected in place, T absorbs the
  // rest).
  kConstrained,
};

// The basis for the next outer step: `embedding` is host f32 [V x d], V the basis'
// vocabulary (and d its model dimension), holding the synced embedding every rank has after the
// outer step. kLossy copies it bit for bit into the table (`arithmetic` is unused: a copy
// involves none) and leaves it untouched; kConstrained is ShiftEmbedding(basis, embedding,
// arithmetic), which modifies it in place on success. Either way every rank that passes the
// same bits gets the same basis id (hash and version + 1), so stages agree on the version
// without shipping the basis; a stage without the embedding rebuilds the table from a table
// delta (table_delta.h) first. Errors: FailedPrecondition for a mixture basis, a basis without
// vocabulary, or version UINT32_MAX; InvalidArgument for a bad view (not host f32 [V x d]) or,
// kLossy, non-finite values in it. On error nothing is modified.
absl::StatusOr<std::shared_ptr<const SubspaceBasis>> RefreshTable(const SubspaceBasis& basis,
                                                                  const TensorView& embedding,
                                                                  TableRefreshMode mode,
                                                                  SubspaceArithmetic arithmetic);

// In place: local <- outer - P(outer - local), P = U U^T on the `side` dimension, i.e. the
// pseudo-gradient outer - local projected onto span(U) (docs/boundary_modes.md). `outer`
// and `local` are host f32 matrices of one shape; when `outer` already lies in span(U) this
// equals ProjectWeight(local). InvalidArgument for bad or mismatched views; FailedPrecondition
// for a mixture basis. kPortable gives identical bits on every x86-64 machine.
absl::Status ProjectPseudoGradient(const SubspaceBasis& basis, const TensorView& outer,
                                   const TensorView& local, ModelDimSide side,
                                   SubspaceArithmetic arithmetic);

// Out-of-subspace energy of activations `h` (host f32 [tokens, d]) with ids `ids` (as
// SubspaceCodec::EncodeForward; a mixture basis chooses components per `mixture_block` tokens).
absl::StatusOr<SubspaceEnergy> MeasureSubspaceEnergy(std::shared_ptr<const SubspaceBasis> basis,
                                                     const TensorView& h,
                                                     absl::Span<const int32_t> ids,
                                                     int64_t mixture_block = 64);

struct SubspaceFitOptions {
  int64_t rank = 0;            // k
  int64_t components = 1;      // M
  int64_t mixture_block = 64;  // tokens per assignment unit (M > 1), as the codec's
  int iterations = 10;         // K-subspaces rounds at most (M > 1); stops when stable
  uint64_t seed = 0;           // picks the first seed block (M > 1)
  uint32_t version = 0;
  int64_t vocab_size = 0;      // copied into the basis
  std::vector<float> table;    // copied into the basis (empty or V x d)
};

// Fits a basis to `samples` (host f32 [n, d], rows h - T[y], in token order so that blocks of
// mixture_block rows are the codec's blocks). M = 1: the top-k eigenvectors of X^T X (LAPACK
// dsyevr). M > 1: farthest-first seeding over blocks, then rounds of "assign each block to the
// component capturing most of its energy, refit each component to its blocks"; an emptied
// component is reseeded with the worst-captured block. InvalidArgument for bad options or views;
// Internal if LAPACK fails.
absl::StatusOr<std::shared_ptr<const SubspaceBasis>> FitSubspaceBasis(
    const TensorView& samples, const SubspaceFitOptions& options);

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_SUBSPACE_TRAINING_H_
