// Scalar arithmetic that host code and CUDA kernels share, one definition for both: the
// `LBCC_HD` marker (`__host__ __device__` under nvcc, `inline` otherwise), float bit casts,
// fp32 / fp64 operations rounded to nearest and never fused, and the fp32 <-> fp16 / bf16
// conversions (round to nearest even; NaN stays a quiet NaN, values beyond the range become
// infinities, fp16 subnormals are produced and read exactly).
//
// On the device every operation is the CUDA `_rn` intrinsic (never contracted into an FMA,
// whatever nvcc's -fmad); on the host it is the plain operator (the packages that rely on it
// build with -ffp-contract=off). So a function written with these computes the same bits on
// both, and the host build of a kernel can be tested against the CPU code without a GPU.
//
// nvcc-clean on purpose: standard headers only (no Abseil, no other LBCC header), and nothing
// from std:: on the device path. kernels/ hands this file to nvcc with its .cu sources.
//
// Thread-safety: pure functions.
#ifndef LBCC_BASE_HOST_DEVICE_H_
#define LBCC_BASE_HOST_DEVICE_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LBCC_HD __host__ __device__ __forceinline__
#else
#define LBCC_HD inline
#endif

namespace lbcc::hd {

LBCC_HD uint32_t Bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
#endif
}

LBCC_HD float Float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
#endif
}

// fp32, round to nearest even, never fused.
LBCC_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LBCC_HD float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
LBCC_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LBCC_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// fp64, round to nearest even, never fused.
LBCC_HD double DAdd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
LBCC_HD double DSub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
LBCC_HD double DMul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
LBCC_HD double DDiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
LBCC_HD double DSqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
// double -> float, round to nearest even.
LBCC_HD float ToFloat(double a) {
#if defined(__CUDA_ARCH__)
  return __double2float_rn(a);
#else
  return static_cast<float>(a);
#endif
}
LBCC_HD float Floor(float x) {
#if defined(__CUDA_ARCH__)
  return floorf(x);
#else
  return std::floor(x);
#endif
}
LBCC_HD float Fmod(float x, float y) {
#if defined(__CUDA_ARCH__)
  return fmodf(x, y);
#else
  return std::fmod(x, y);
#endif
}
LBCC_HD double Ldexp(double x, int e) {
#if defined(__CUDA_ARCH__)
  return ldexp(x, e);
#else
  return std::ldexp(x, e);
#endif
}

// std::min / std::max as host code calls them (the first argument wins ties and NaN).
LBCC_HD float MaxF(float a, float b) { return (a < b) ? b : a; }
LBCC_HD float MinF(float a, float b) { return (b < a) ? b : a; }

// fp32 -> bf16 / fp16, round to nearest even; bf16 / fp16 -> fp32, exact.
LBCC_HD uint16_t F32ToBf16(float value) {
  const uint32_t bits = Bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

LBCC_HD float Bf16ToF32(uint16_t value) { return Float(static_cast<uint32_t>(value) << 16); }

LBCC_HD uint16_t F32ToF16(float value) {
  const uint32_t bits = Bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) {
    return static_cast<uint16_t>(sign | 0x7e00u | static_cast<uint16_t>((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (abs >= 0x38800000u) {
    // Normal fp16: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
    const uint32_t rebased = abs - 0x38000000u;
    const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>((rebased + rounding) >> 13));
  }
  if (abs < 0x33000000u) return sign;  // below half the smallest subnormal: +-0
  // Subnormal fp16 (value = m * 2^-24): shift the full significand into place and round.
  const uint32_t exponent = abs >> 23;
  const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24 for exponents 112..102
  uint32_t half = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (remainder > halfway || (remainder == halfway && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(half));
}

LBCC_HD float F16ToF32(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0x1fu) return Float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return Float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return Float(sign);
  // Subnormal: normalise.
  int e = -1;
  do {
    ++e;
    mantissa <<= 1;
  } while ((mantissa & 0x400u) == 0);
  return Float(sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mantissa & 0x3ffu) << 13));
}

}  // namespace lbcc::hd

#endif  // LBCC_BASE_HOST_DEVICE_H_
