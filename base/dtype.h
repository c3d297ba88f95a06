// Element types of tensors LBCC moves, and exact conversions between fp32 and the 16-bit floats.
//
// DType values are wire ids (payload headers carry them): never renumber one. Ids 1-7 are the
// payload dtypes (IsValidDType); f64, i16 and bool (8-10) are element types of the dense
// collectives only (comm/collectives.h), which no payload carries.
// F32ToBf16 / F32ToF16 round to nearest, ties to even; NaN stays NaN (quiet), infinities stay
// infinite, values beyond the target range become infinities, f16 subnormals are produced and
// read exactly. The bulk converters use F16C when the CPU has it (same results, bit for bit).
//
// Thread-safety: stateless.
#ifndef LBCC_BASE_DTYPE_H_
#define LBCC_BASE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/host_device.h"

namespace lbcc {

enum class DType : uint8_t {
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kI8 = 4,
  kU8 = 5,
  kI32 = 6,
  kI64 = 7,
  kF64 = 8,
  kI16 = 9,
  kBool = 10,
};

// Bytes per element. Returns 0 for a value that is not a DType (e.g. from a corrupt header).
size_t DTypeSize(DType dtype);
// "f32", "f16", "bf16", "i8", "u8", "i32", "i64", "f64", "i16", "bool"; "invalid" otherwise.
absl::string_view DTypeName(DType dtype);
// Accepts the names above and the aliases float32/float/fp32, float16/half/fp16, bfloat16,
// int8, uint8, int32, int64 (case-insensitive). InvalidArgument otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);
// True for the seven payload dtypes (1-7); use on untrusted bytes before DTypeSize.
bool IsValidDType(uint8_t value);
inline bool IsFloating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF64;
}

inline uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}
inline float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// One definition for host code and CUDA kernels (base/host_device.h).
using hd::Bf16ToF32;
using hd::F16ToF32;
using hd::F32ToBf16;
using hd::F32ToF16;

// Bulk conversions; `out.size()` must equal `in.size()` (checked).
void ConvertF32ToBf16(absl::Span<const float> in, absl::Span<uint16_t> out);
void ConvertBf16ToF32(absl::Span<const uint16_t> in, absl::Span<float> out);
void ConvertF32ToF16(absl::Span<const float> in, absl::Span<uint16_t> out);
void ConvertF16ToF32(absl::Span<const uint16_t> in, absl::Span<float> out);

}  // namespace lbcc

#endif  // LBCC_BASE_DTYPE_H_
