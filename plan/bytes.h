// Payload byte formulas the planner uses: what LBCC's codecs put on the wire, from the codecs'
// own formulas, never from a fit.
//
//   TopKEfPayloadBytes   one TopK-EF payload (envelope + params + index + value sections).
//                        packed12 index coding: exact (TopKEfCodec::MaxEncodedBytes).
//                        adaptive: the expected length for selections uniformly spread over
//                        each chunk (the count per sub-block is hypergeometric; the encoder's
//                        choice of b = 6 or 7 is taken on the expectations); the bound it never
//                        exceeds is AdaptiveMaxBytes. auto: the smaller of the two.
//   SparseBlobBytes      what one rank contributes to one SparseAllReduce exchange group
//                        (comm/sparse_blob.h): u8 ok, u32 count, u64 size per tensor, payloads,
//                        plus the 16-byte final header of a streamed group.
//   SubspaceBoundaryBytes one pipeline-boundary payload per microbatch and direction
//                        (codecs::SubspaceLayout + the envelope), or the dense bf16 activations
//                        when the boundary is not compressed.
//   RingTensorBytes      one tensor (K or V) of a context-ring block as comm::ContextRing sends
//                        it, forward (the block) and backward (its gradient's partial sum): raw
//                        f32, a dense format (DenseQuantCodec::MaxEncodedBytes, exact), or the
//                        subspace codec with V = 0 (codecs::SubspaceLayout + the envelope, with a
//                        selector per mixture block when M > 1: SubspaceCodec's own formula).
//
// Errors: InvalidArgument naming the bad value (shape, option). Thread-safety: pure functions.
#ifndef LBCC_PLAN_BYTES_H_
#define LBCC_PLAN_BYTES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/dtype.h"
#include "codecs/topk_ef.h"

namespace lbcc::plan {

// Bytes of one TopK-EF payload of `shape` with `options` (see the header comment for what
// "expected" means with adaptive or auto index coding).
absl::StatusOr<double> TopKEfPayloadBytes(absl::Span<const int64_t> shape,
                                          const codecs::TopKEfOptions& options);

// Expected bits of the adaptive index coding of `num_chunks` chunks of `chunk_len` positions
// with k selected per chunk, positions uniform; the encoder's min over b = 6 and b = 7.
double ExpectedAdaptiveBits(int64_t num_chunks, int64_t chunk_len, int64_t k);

// Exchange groups as SparseAllReduce plans them (comm/compressed.cc PlanGroups): consecutive
// tensors totalling at least max(total / 8, min_elements) elements; [begin, end) ranges.
std::vector<std::pair<size_t, size_t>> PlanGroups(absl::Span<const int64_t> tensor_elements,
                                                  int64_t min_elements);

// One rank's blob for the tensors [begin, end) of `shapes`; `streamed`: the group goes out in
// pieces (one tensor of >= 2^16 elements over slow links).
absl::StatusOr<double> SparseBlobBytes(const std::vector<std::vector<int64_t>>& shapes,
                                       size_t begin, size_t end,
                                       const codecs::TopKEfOptions& options, bool streamed);

struct BoundaryCoding {
  int64_t model_dim = 0;   // d
  int64_t rank = 0;        // k of the subspace; 0: not compressed (dense activations)
  int64_t vocab_size = 0;  // V (token ids travel forward); 0: no ids
  DType coefficient_dtype = DType::kBF16;  // f32, bf16, f16 or i8 (dense: bf16 activations)
  int64_t int8_block = 32;                 // coefficients per int8 scale
};

// Forward (activations + ids) and backward (gradients) bytes of one microbatch of `tokens`.
struct BoundaryBytes {
  double forward = 0;
  double backward = 0;
};
absl::StatusOr<BoundaryBytes> SubspaceBoundaryBytes(const BoundaryCoding& coding,
                                                    int64_t tokens);

// How one tensor of a context-ring block travels (comm::RingCodec, sizes only).
struct RingCoding {
  enum class Kind { kRawF32, kDense, kSubspace };
  Kind kind = Kind::kDense;
  std::string dense_format = "bf16";       // kDense: a codecs::DenseFormat name
  int64_t rank = 0;                        // kSubspace: k
  int64_t components = 1;                  // kSubspace: M (> 1: one selector per block)
  int64_t mixture_block = 64;              // kSubspace: tokens per selector
  DType coefficient_dtype = DType::kBF16;  // kSubspace: f32, bf16, f16 or i8
  int64_t int8_block = 32;                 // kSubspace: coefficients per int8 scale
};

// Bytes of one tensor's payload per ring round for a block of `tokens` x `dim` f32 values.
// InvalidArgument naming the bad value (dim or tokens < 1, k outside [1, dim], an unknown
// dense format, M outside [1, 255], a mixture block outside [1, 65535]).
struct RingTensorBytes {
  double forward = 0;
  double backward = 0;
};
absl::StatusOr<RingTensorBytes> RingPayloadBytes(const RingCoding& coding, int64_t tokens,
                                                 int64_t dim);

}  // namespace lbcc::plan

#endif  // LBCC_PLAN_BYTES_H_
