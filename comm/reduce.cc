#include "comm/reduce.h"

#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/dtype.h"

namespace lbcc::comm {
namespace {

// One element of `kOp` (avg adds; ReduceFinish divides). Integers wrap instead of overflowing
// (undefined for int); for floats NaN wins in min and max, as torch's minimum/maximum do, and
// otherwise the first operand wins ties (b < a ? b : a).
template <ReduceOp kOp, typename T>
inline T CombineOne(T a, T b) {
  if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  } else if constexpr (kOp == ReduceOp::kProduct) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  } else if constexpr (kOp == ReduceOp::kMin || kOp == ReduceOp::kMax) {
    const T better = kOp == ReduceOp::kMin ? (b < a ? b : a) : (b > a ? b : a);
    if constexpr (std::is_floating_point_v<T>) {
      // a != a: a is NaN (written as a comparison so that the loop below stays vectorizable).
      return a != a ? a : (b != b ? b : better);
    } else {
      return better;
    }
  } else {
    static_assert(std::is_integral_v<T>, "bitwise reductions are for integers (CheckReduceOp)");
    if constexpr (kOp == ReduceOp::kBand) return a & b;
    if constexpr (kOp == ReduceOp::kBor) return a | b;
    return a ^ b;
  }
}

// d[i] = d[i] kOp s[i]. The loop runs in blocks of a constant 64 bytes, which GCC vectorizes at
// -O2 (its cheap cost model takes only loops of a known trip count), then a scalar tail; the
// result is element by element the same as the scalar loop's. d and s never overlap (a receive
// buffer is never the data it is combined into).
template <ReduceOp kOp, typename T>
void CombineLoop(T* __restrict d, const T* __restrict s, size_t count) {
  constexpr size_t kBlock = 64 / sizeof(T);
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    for (size_t k = 0; k < kBlock; ++k) d[i + k] = CombineOne<kOp>(d[i + k], s[i + k]);
  }
  for (; i < count; ++i) d[i] = CombineOne<kOp>(d[i], s[i]);
}

template <typename T>
void CombineAll(void* dst, const void* src, size_t count, ReduceOp op) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return CombineLoop<ReduceOp::kSum>(d, s, count);
    case ReduceOp::kProduct: return CombineLoop<ReduceOp::kProduct>(d, s, count);
    case ReduceOp::kMin: return CombineLoop<ReduceOp::kMin>(d, s, count);
    case ReduceOp::kMax: return CombineLoop<ReduceOp::kMax>(d, s, count);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::kBand) return CombineLoop<ReduceOp::kBand>(d, s, count);
        if (op == ReduceOp::kBor) return CombineLoop<ReduceOp::kBor>(d, s, count);
        return CombineLoop<ReduceOp::kBxor>(d, s, count);
      }
      break;
  }
  LBCC_CHECK(false) << "ReduceCombine: op not checked";
}

// 16-bit floats: combined in f32, rounded once.
template <ReduceOp kOp, float (*ToF32)(uint16_t), uint16_t (*FromF32)(float)>
void CombineHalfLoop(uint16_t* __restrict d, const uint16_t* __restrict s, size_t count) {
  for (size_t i = 0; i < count; ++i) d[i] = FromF32(CombineOne<kOp>(ToF32(d[i]), ToF32(s[i])));
}

template <float (*ToF32)(uint16_t), uint16_t (*FromF32)(float)>
void CombineHalf(void* dst, const void* src, size_t count, ReduceOp op) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return CombineHalfLoop<ReduceOp::kSum, ToF32, FromF32>(d, s, count);
    case ReduceOp::kProduct:
      return CombineHalfLoop<ReduceOp::kProduct, ToF32, FromF32>(d, s, count);
    case ReduceOp::kMin: return CombineHalfLoop<ReduceOp::kMin, ToF32, FromF32>(d, s, count);
    case ReduceOp::kMax: return CombineHalfLoop<ReduceOp::kMax, ToF32, FromF32>(d, s, count);
    default: LBCC_CHECK(false) << "ReduceCombine: op not checked";
  }
}

void CombineBool(void* dst, const void* src, size_t count, ReduceOp op) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < count; ++i) {
    const bool a = d[i] != 0, b = s[i] != 0;
    switch (op) {
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
      case ReduceOp::kBand: d[i] = a && b; break;
      case ReduceOp::kBxor: d[i] = a != b; break;
      default:  // sum, max, bor
        d[i] = a || b;
    }
  }
}

}  // namespace

absl::string_view TorchDTypeName(DType type) {
  switch (type) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF64: return "float64";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kI16: return "int16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kBool: return "bool";
  }
  return "invalid";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  return "invalid";
}

absl::Status CheckReduceOp(DType type, ReduceOp op) {
  if (DTypeSize(type) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dense type ", static_cast<int>(type)));
  }
  if (ReduceOpName(op) == "invalid") {
    return absl::InvalidArgumentError(absl::StrCat("unknown reduction ", static_cast<int>(op)));
  }
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if (bitwise && IsFloating(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduction ", ReduceOpName(op), " does not apply to ", TorchDTypeName(type)));
  }
  if (op == ReduceOp::kAvg && !IsFloating(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduction avg needs a floating type, not ", TorchDTypeName(type)));
  }
  return absl::OkStatus();
}

void ReduceCombine(void* dst, const void* src, size_t count, DType type, ReduceOp op) {
  switch (type) {
    case DType::kF32: return CombineAll<float>(dst, src, count, op);
    case DType::kF64: return CombineAll<double>(dst, src, count, op);
    case DType::kF16: return CombineHalf<F16ToF32, F32ToF16>(dst, src, count, op);
    case DType::kBF16: return CombineHalf<Bf16ToF32, F32ToBf16>(dst, src, count, op);
    case DType::kI8: return CombineAll<int8_t>(dst, src, count, op);
    case DType::kU8: return CombineAll<uint8_t>(dst, src, count, op);
    case DType::kI16: return CombineAll<int16_t>(dst, src, count, op);
    case DType::kI32: return CombineAll<int32_t>(dst, src, count, op);
    case DType::kI64: return CombineAll<int64_t>(dst, src, count, op);
    case DType::kBool: return CombineBool(dst, src, count, op);
  }
}

void ReduceFinish(void* data, size_t count, DType type, ReduceOp op, int n) {
  if (op != ReduceOp::kAvg || n == 1) return;
  switch (type) {
    case DType::kF32: {
      float* d = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) d[i] /= static_cast<float>(n);
      return;
    }
    case DType::kF64: {
      double* d = static_cast<double*>(data);
      for (size_t i = 0; i < count; ++i) d[i] /= n;
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToF16(F16ToF32(d[i]) / n);
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) d[i] = F32ToBf16(Bf16ToF32(d[i]) / n);
      return;
    }
    default: LBCC_CHECK(false) << "ReduceFinish: avg on a non-floating type";
  }
}

}  // namespace lbcc::comm
