#include "base/dtype.h"

#include <immintrin.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/cpu.h"

namespace lbcc {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
    case DType::kI64:
    case DType::kF64:
      return 8;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kF64:
      return "f64";
    case DType::kI16:
      return "i16";
    case DType::kBool:
      return "bool";
  }
  return "invalid";
}

bool IsValidDType(uint8_t value) {
  return value >= static_cast<uint8_t>(DType::kF32) && value <= static_cast<uint8_t>(DType::kI64);
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "f32" || lower == "fp32" || lower == "float32" || lower == "float") {
    return DType::kF32;
  }
  if (lower == "f16" || lower == "fp16" || lower == "float16" || lower == "half") {
    return DType::kF16;
  }
  if (lower == "bf16" || lower == "bfloat16") return DType::kBF16;
  if (lower == "i8" || lower == "int8") return DType::kI8;
  if (lower == "u8" || lower == "uint8") return DType::kU8;
  if (lower == "i32" || lower == "int32") return DType::kI32;
  if (lower == "i64" || lower == "int64") return DType::kI64;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name, "' (expected f32, f16, bf16, i8, u8, i32 or i64)"));
}

namespace {

__attribute__((target("avx2,f16c"))) void F32ToF16F16c(const float* in, uint16_t* out,
                                                        size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = F32ToF16(in[i]);
}

__attribute__((target("avx2,f16c"))) void F16ToF32F16c(const uint16_t* in, float* out,
                                                        size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = F16ToF32(in[i]);
}

}  // namespace

void ConvertF32ToBf16(absl::Span<const float> in, absl::Span<uint16_t> out) {
  LBCC_CHECK_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = F32ToBf16(in[i]);
}

void ConvertBf16ToF32(absl::Span<const uint16_t> in, absl::Span<float> out) {
  LBCC_CHECK_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = Bf16ToF32(in[i]);
}

void ConvertF32ToF16(absl::Span<const float> in, absl::Span<uint16_t> out) {
  LBCC_CHECK_EQ(in.size(), out.size());
  if (ActiveSimdLevel() == SimdLevel::kAvx2 && CpuHasF16c()) {
    F32ToF16F16c(in.data(), out.data(), in.size());
    return;
  }
  for (size_t i = 0; i < in.size(); ++i) out[i] = F32ToF16(in[i]);
}

void ConvertF16ToF32(absl::Span<const uint16_t> in, absl::Span<float> out) {
  LBCC_CHECK_EQ(in.size(), out.size());
  if (ActiveSimdLevel() == SimdLevel::kAvx2 && CpuHasF16c()) {
    F16ToF32F16c(in.data(), out.data(), in.size());
    return;
  }
  for (size_t i = 0; i < in.size(); ++i) out[i] = F16ToF32(in[i]);
}

}  // namespace lbcc
