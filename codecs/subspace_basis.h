// The shared basis of the subspace activation codec: U (d x k, orthonormal columns), optionally
// M such blocks for a mixture of subspaces, and an optional fixed token table T (V x d).
//
// Pipeline stages constrain every write into the residual stream to span(U), so the residual of
// token y satisfies h - T[y] in span(U) and crosses a stage boundary as k coefficients plus y
// (see codecs/subspace_codec.h). Every stage and replica must hold the same bits of U and T, so a
// basis is identified by a content hash (XXH3-64 of its canonical bytes) and a version, and is
// made in one of three ways:
//   - FromSeed(): a portable generator (SplitMix64 counters -> Box-Muller with LBCC's own log and
//     cosine in plain IEEE double arithmetic) and Householder QR in double, written as loops
//     with a fixed order of operations and compiled without FMA contraction. No libm
//     transcendental and no BLAS kernel is involved (both differ between CPUs), so every x86-64
//     machine regenerates identical bits; tests pin the hash.
//   - FromMatrices(): caller-provided U (checked orthonormal) and T.
//   - Parse()/Load(): the file image written by Serialize()/Save() (self-describing, checksummed).
//
// Layout: U is stored row-major as [d x (M*k)]: row i holds U_0[i, :], U_1[i, :], ...; component m
// is the d x k submatrix starting at column m*k with leading dimension M*k. T is row-major V x d.
//
// Thread-safety: a SubspaceBasis is immutable after creation; share it freely between threads
// (as std::shared_ptr<const SubspaceBasis>).
#ifndef LBCC_CODECS_SUBSPACE_BASIS_H_
#define LBCC_CODECS_SUBSPACE_BASIS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lbcc::codecs {

// What identifies a basis on the wire. Two bases with equal ids hold identical bytes.
struct SubspaceBasisId {
  uint64_t hash = 0;
  uint32_t version = 0;

  friend bool operator==(const SubspaceBasisId& a, const SubspaceBasisId& b) {
    return a.hash == b.hash && a.version == b.version;
  }
  friend bool operator!=(const SubspaceBasisId& a, const SubspaceBasisId& b) { return !(a == b); }
  // "0123456789abcdef/v3".
  std::string ToString() const;
};

// Limits on shapes (they keep every size computation far from overflow).
inline constexpr int64_t kSubspaceMaxModelDim = 1 << 20;
inline constexpr int64_t kSubspaceMaxComponents = 255;  // selectors travel as one byte
inline constexpr int64_t kSubspaceMaxVocab = INT32_MAX;  // token ids are int32

// Bytes of one token id on the wire for a vocabulary of `vocab_size`: the narrowest of 1, 2, 3
// or 4 bytes that holds vocab_size - 1; 0 when vocab_size is 0 (no ids).
int SubspaceIdWidth(int64_t vocab_size);

struct SubspaceSeedSpec {
  int64_t model_dim = 0;     // d
  int64_t rank = 0;          // k, 1 <= k <= d
  int64_t components = 1;    // M, number of subspaces (1 = a single basis)
  int64_t vocab_size = 0;    // V: token ids in [0, V) travel with activations; 0 = no ids
  bool with_table = false;   // generate T (V x d) with entries N(0, table_stddev^2)
  double table_stddev = 1.0;
  uint64_t seed = 0;
  uint32_t version = 0;
};

// How the training-side helpers (subspace_training.h) and the embedding shift multiply.
enum class SubspaceArithmetic {
  // cblas_sgemm: fastest; bits depend on the CPU's OpenBLAS kernel, so two machines may differ
  // in the last place.
  kBlas,
  // Double-precision loops with a fixed summation order (vectorised across independent outputs
  // only) and no FMA contraction: identical bits on every x86-64 machine, several times slower.
  kPortable,
};

class SubspaceBasis {
 public:
  // Generates U (and T when spec.with_table) from the seed. InvalidArgument for a bad spec
  // (d outside [1, kSubspaceMaxModelDim], k outside [1, d], M outside [1, 255], V outside
  // [0, INT32_MAX], with_table without vocabulary, non-finite or negative stddev).
  // Cost: about 4 d k^2 M double flops for the QR and a few dozen per table entry.
  static absl::StatusOr<std::shared_ptr<const SubspaceBasis>> FromSeed(const SubspaceSeedSpec& spec);

  // Takes U ([d x (M*k)] row-major, see the header comment) and T (empty, or V*d values).
  // InvalidArgument when sizes disagree, a value is not finite, or a component's
  // OrthonormalityError() exceeds `orthonormality_tolerance`.
  static absl::StatusOr<std::shared_ptr<const SubspaceBasis>> FromMatrices(
      int64_t model_dim, int64_t rank, int64_t components, int64_t vocab_size,
      std::vector<float> u, std::vector<float> table, uint32_t version,
      double orthonormality_tolerance = 1e-4);

  // Reads a file image written by Serialize(); `bytes` need only live for the call. DataLoss for
  // anything malformed (magic, format version, sizes, checksum, a content hash that does not
  // match the contents, non-finite values, non-orthonormal U).
  static absl::StatusOr<std::shared_ptr<const SubspaceBasis>> Parse(absl::Span<const uint8_t> bytes);
  // Parse() of a file's contents; errno-derived codes (NotFound, PermissionDenied, ...) when the
  // file cannot be read.
  static absl::StatusOr<std::shared_ptr<const SubspaceBasis>> Load(const std::string& path);

  // The file image:
  //   "LBCCSUBB" | u32 format version (1) | u32 flags (bit 0: has table) | u64 d | u64 k | u64 M |
  //   u64 V | u32 basis version | u32 reserved (0) | u64 content hash | U as f32 [d x M*k] |
  //   T as f32 [V x d] (if flagged) | u64 XXH3-64 of every byte before it.
  std::vector<uint8_t> Serialize() const;
  // Writes Serialize() to `path` (via a temporary file and rename). errno-derived codes on
  // failure.
  absl::Status Save(const std::string& path) const;

  // A copy with a new table and version (the embedding shift uses this). InvalidArgument when
  // the table size is not V*d or holds non-finite values.
  absl::StatusOr<std::shared_ptr<const SubspaceBasis>> WithTable(std::vector<float> table,
                                                                 uint32_t version) const;

  int64_t model_dim() const { return d_; }
  int64_t rank() const { return k_; }
  int64_t components() const { return m_; }
  int64_t vocab_size() const { return v_; }
  bool has_table() const { return !table_.empty(); }
  int id_width() const { return SubspaceIdWidth(v_); }
  const SubspaceBasisId& id() const { return id_; }

  // U, [d x (M*k)] row-major; the leading dimension of every component is M*k.
  absl::Span<const float> u() const { return u_; }
  const float* component(int64_t m) const { return u_.data() + m * k_; }
  int64_t ld() const { return m_ * k_; }
  // T, [V x d] row-major; empty when there is no table.
  absl::Span<const float> table() const { return table_; }
  // T U, [V x (M*k)] row-major (derived with cblas_sgemm at creation, not part of the identity):
  // lets the encoder compute U^T (h - T[y]) as U^T h - (T U)[y] without a pass over h.
  absl::Span<const float> projected_table() const { return projected_table_; }

  // max over components m and entries (i, j) of |(U_m^T U_m - I)_ij|, computed in double.
  double OrthonormalityError() const;

 private:
  SubspaceBasis() = default;
  static absl::StatusOr<std::shared_ptr<const SubspaceBasis>> Make(
      int64_t d, int64_t k, int64_t m, int64_t v, std::vector<float> u, std::vector<float> table,
      uint32_t version);

  int64_t d_ = 0;
  int64_t k_ = 0;
  int64_t m_ = 1;
  int64_t v_ = 0;
  std::vector<float> u_;
  std::vector<float> table_;
  std::vector<float> projected_table_;
  SubspaceBasisId id_;
};

// The content hash of a basis: XXH3-64 over the canonical bytes
//   "LBCC subspace basis v1" (22 bytes) | u64 d | u64 k | u64 M | u64 V | u64 has_table |
//   U as little-endian f32 | T as little-endian f32.
// Exposed for tests and tools.
uint64_t SubspaceContentHash(int64_t d, int64_t k, int64_t m, int64_t v, absl::Span<const float> u,
                             absl::Span<const float> table);

namespace subspace_internal {

// The portable generator, exposed for tests. Counter-based: value n of stream (seed, stream) is
// Mix64(key + (n + 1) * 0x9E3779B97F4A7C15) with key = Mix64(seed ^ Mix64(stream ^ 0x5375627370616365))
// and Mix64 the SplitMix64 finaliser.
uint64_t Random64(uint64_t seed, uint64_t stream, uint64_t n);
// Box-Muller: sqrt(-2 ln u1) * cos(2 pi u2), u1 = Unit(Random64(.., 2n)), u2 = Unit(Random64(.., 2n+1)),
// Unit(x) = ((x >> 11) + 1) * 2^-53 in (0, 1].
double Gaussian(uint64_t seed, uint64_t stream, uint64_t n);
// LBCC's own ln and cos(2 pi x): +, -, *, / and sqrt only, so the bits do not depend on libm.
double PortableLog(double x);         // x > 0, finite
double PortableCos2Pi(double x);      // x in [0, 1]
// Householder QR of the column-major d x k matrix `a` (columns contiguous, length d); returns the
// thin Q (column-major d x k) with the signs chosen so that R has a positive diagonal.
std::vector<double> HouseholderQ(std::vector<double> a, int64_t d, int64_t k);

// C[m x n] = A[m x p] * B[p x n] in double with a fixed summation order over p, row-major with
// leading dimensions; A and B are float or double. Used by kPortable arithmetic.
void PortableGemm(const float* a, int64_t lda, const double* b, int64_t ldb, double* c,
                  int64_t ldc, int64_t m, int64_t n, int64_t p);
void PortableGemm(const double* a, int64_t lda, const double* b, int64_t ldb, double* c,
                  int64_t ldc, int64_t m, int64_t n, int64_t p);
void PortableGemm(const double* a, int64_t lda, const float* b, int64_t ldb, double* c,
                  int64_t ldc, int64_t m, int64_t n, int64_t p);

}  // namespace subspace_internal
}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_SUBSPACE_BASIS_H_
