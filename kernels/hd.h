// Arithmetic the CUDA kernels and their host emulation share, operation for operation.
//
// The CPU codecs (codecs/) define their results as sequences of IEEE fp32 and fp64 operations
// rounded to nearest (compiled with -ffp-contract=off). Every function here performs the same
// operation: on the device through the _rn intrinsics (never contracted into an FMA, whatever
// nvcc's -fmad), on the host through plain operators (kernels/ also builds with
// -ffp-contract=off). So a kernel written with these functions computes the CPU codec's bits,
// and the same code compiled for the host (kernels/emulated_backend.h) can be tested against the
// CPU codecs on a machine without a GPU.
//
// Self-contained on purpose (no Abseil, no codecs/ headers): nvcc compiles the .cu files with
// nothing but kernels/ headers and CUDA's own.
//
// Thread-safety: pure functions.
#ifndef LBCC_KERNELS_HD_H_
#define LBCC_KERNELS_HD_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LBCC_HD __host__ __device__ __forceinline__
#define LBCC_UNROLL _Pragma("unroll")
// Before a __host__ __device__ template whose Block argument may be device-only.
#define LBCC_BLOCK_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define LBCC_HD inline
#define LBCC_UNROLL
#define LBCC_BLOCK_TEMPLATE
#endif

namespace lbcc::kernels::hd {

inline constexpr uint32_t kAbsMask = 0x7fffffffu;
inline constexpr uint32_t kMaxFiniteAbsBits = 0x7f7fffffu;
// |x| bits of codecs::kMaxEncodableMagnitude (2^100): TopK-EF refuses larger e' entries.
inline constexpr uint32_t kMaxEncodableAbsBits = 0x71800000u;
// Absmax scales are capped so that qmax * scale stays finite (codecs/cpu_kernels.h).
inline constexpr float kMaxScale8 = 3.4028234663852886e38f / 128;
inline constexpr float kMaxScale4 = 3.4028234663852886e38f / 8;

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

LBCC_HD uint32_t AbsBits(float x) { return Bits(x) & kAbsMask; }

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

// std::min / std::max as the CPU codecs call them (the first argument wins ties and NaN).
LBCC_HD float MaxF(float a, float b) { return (a < b) ? b : a; }
LBCC_HD float MinF(float a, float b) { return (b < a) ? b : a; }

// Python's round() on floats: codecs::RoundHalfEvenF, operation for operation.
LBCC_HD float RoundHalfEvenF(float x) {
  const float r = Floor(x);
  const float d = Sub(x, r);
  if (d > 0.5f) return Add(r, 1.0f);
  if (d == 0.5f && Fmod(r, 2.0f) != 0.0f) return Add(r, 1.0f);
  return r;
}

// base/dtype.h's conversions, bit for bit.
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
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs >= 0x38800000u) {
    const uint32_t rebased = abs - 0x38000000u;
    const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>((rebased + rounding) >> 13));
  }
  if (abs < 0x33000000u) return sign;
  const uint32_t exponent = abs >> 23;
  const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;
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
  int e = -1;
  do {
    ++e;
    mantissa <<= 1;
  } while ((mantissa & 0x400u) == 0);
  return Float(sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mantissa & 0x3ffu) << 13));
}

// codecs/value_coding.cc: round to nearest even, saturating at the format's largest finite
// value. Returns the reconstruction; *code receives the 16 bits.
LBCC_HD float SaturateBf16(float v, uint16_t* code) {
  uint16_t c = F32ToBf16(v);
  if ((c & 0x7FFF) == 0x7F80) c = static_cast<uint16_t>((c & 0x8000) | 0x7F7F);
  *code = c;
  return Bf16ToF32(c);
}
LBCC_HD float SaturateF16(float v, uint16_t* code) {
  uint16_t c = F32ToF16(v);
  if ((c & 0x7FFF) == 0x7C00) c = static_cast<uint16_t>((c & 0x8000) | 0x7BFF);
  *code = c;
  return F16ToF32(c);
}

// codecs/counter_rng.h, bit for bit.
LBCC_HD uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
LBCC_HD uint32_t CounterRandom32(uint64_t seed, uint64_t n) {
  const uint32_t high = Mix32(static_cast<uint32_t>(n >> 32) + static_cast<uint32_t>(seed >> 32) +
                              0x9e3779b9u);
  return Mix32(Mix32(static_cast<uint32_t>(n) ^ static_cast<uint32_t>(seed)) ^ high);
}
LBCC_HD float CounterUniform(uint64_t seed, uint64_t n) {
  return Mul(static_cast<float>(CounterRandom32(seed, n) >> 8), 1.0f / 16777216.0f);
}

// Set bits of x, and the position of its lowest set bit (x != 0).
LBCC_HD int Popc(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}
LBCC_HD int LowestBit(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(x)) - 1;
#else
  return __builtin_ctz(x);
#endif
}

// Little-endian loads and stores of possibly unaligned bytes.
LBCC_HD uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}
LBCC_HD uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
LBCC_HD float LoadF32(const uint8_t* p) { return Float(LoadU32(p)); }
LBCC_HD void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
LBCC_HD void StoreU32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}
LBCC_HD void StoreF32(uint8_t* p, float v) { StoreU32(p, Bits(v)); }

// Atomic updates of device memory that several threads (or blocks) share. The host emulation
// runs one simulated thread at a time, so plain updates are the same operation there.
LBCC_HD void AtomicAddU32(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p += v;
#endif
}
LBCC_HD void AtomicOrU32(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicOr(p, v);
#else
  *p |= v;
#endif
}
LBCC_HD void AtomicMaxU32(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicMax(p, v);
#else
  if (v > *p) *p = v;
#endif
}
LBCC_HD void AtomicMinI32(int32_t* p, int32_t v) {
#if defined(__CUDA_ARCH__)
  atomicMin(p, v);
#else
  if (v < *p) *p = v;
#endif
}
LBCC_HD void AtomicMinU64(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  atomicMin(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
#else
  if (v < *p) *p = v;
#endif
}
LBCC_HD void AtomicAddF64(double* p, double v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p = DAdd(*p, v);
#endif
}

}  // namespace lbcc::kernels::hd

#endif  // LBCC_KERNELS_HD_H_
