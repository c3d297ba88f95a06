// Reductions of the collectives: the one op enum (torch.distributed.ReduceOp's terms) and the
// element kernels every reducing algorithm applies (comm/algorithms/), over base's DType.
//
// Semantics: integers wrap; 16-bit floats are combined in f32 and rounded once per combine (like
// NCCL); for floats NaN wins in min and max (as torch's minimum/maximum), otherwise the first
// operand wins ties; bool's sum/max/bor are "or", product/min/band "and", bxor "xor".
//
// Thread-safety: stateless functions.
#ifndef LBCC_COMM_REDUCE_H_
#define LBCC_COMM_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/dtype.h"

namespace lbcc::comm {

enum class ReduceOp : uint8_t { kSum, kAvg, kProduct, kMin, kMax, kBand, kBor, kBxor };

// torch.dtype's spelling ("float32", "bfloat16", "int64", "bool", ...), which the collectives'
// signatures and errors use; "invalid" otherwise.
absl::string_view TorchDTypeName(DType type);
// "sum", "avg", "product", "min", "max", "band", "bor", "bxor"; "invalid" otherwise.
absl::string_view ReduceOpName(ReduceOp op);
// InvalidArgument when `op` does not apply to `type`: bitwise ops on floats, avg on integers or
// bool; an unknown type or op.
absl::Status CheckReduceOp(DType type, ReduceOp op);

// dst[i] = dst[i] op src[i] for `count` elements (avg adds; ReduceFinish divides). The pair must
// pass CheckReduceOp; dst and src must not overlap. Vectorized per op (the same bits as the
// element-by-element loop).
void ReduceCombine(void* dst, const void* src, size_t count, DType type, ReduceOp op);
// Applies the last step of `op` over `n` ranks: divides by n for avg, nothing otherwise.
void ReduceFinish(void* data, size_t count, DType type, ReduceOp op, int n);

}  // namespace lbcc::comm

#endif  // LBCC_COMM_REDUCE_H_
