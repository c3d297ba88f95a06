// Arithmetic the CUDA kernels and their host emulation share, operation for operation.
//
// The CPU codecs (codecs/) define their results as sequences of IEEE fp32 and fp64 operations
// rounded to nearest (compiled with -ffp-contract=off). The scalar rules both sides must agree
// on bit for bit have one definition, which the CPU codecs call too: base/host_device.h (the
// LBCC_HD marker, fp32 / fp64 operations through the _rn intrinsics on the device and plain
// operators on the host, fp16 / bf16 conversions), codecs/rounding.h (round half even, scale
// caps, saturating and stochastic rounding) and codecs/counter_rng.h (the random stream). This
// header brings them into `hd::` and adds what only kernels need: bit counts, unaligned
// little-endian loads and stores, atomics. So a kernel written with these functions computes
// the CPU codec's bits, and the same code compiled for the host (kernels/emulated_backend.h) can
// be tested against the CPU codecs on a machine without a GPU.
//
// nvcc-clean (no Abseil): nvcc compiles the .cu files with kernels/ headers, the three shared
// headers above (kernels/BUILD.bazel hands them to it) and CUDA's own.
//
// Thread-safety: pure functions.
#ifndef LBCC_KERNELS_HD_H_
#define LBCC_KERNELS_HD_H_

#include <cstdint>

#include "base/host_device.h"
#include "codecs/counter_rng.h"
#include "codecs/rounding.h"

#if defined(__CUDACC__)
#define LBCC_UNROLL _Pragma("unroll")
// Before a __host__ __device__ template whose Block argument may be device-only.
#define LBCC_BLOCK_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define LBCC_UNROLL
#define LBCC_BLOCK_TEMPLATE
#endif

namespace lbcc::kernels::hd {

// The shared definitions (base/host_device.h, codecs/rounding.h, codecs/counter_rng.h), under
// the names the kernels use.
using ::lbcc::hd::Add;
using ::lbcc::hd::Bf16ToF32;
using ::lbcc::hd::Bits;
using ::lbcc::hd::DAdd;
using ::lbcc::hd::DDiv;
using ::lbcc::hd::DMul;
using ::lbcc::hd::DSqrt;
using ::lbcc::hd::DSub;
using ::lbcc::hd::Div;
using ::lbcc::hd::F16ToF32;
using ::lbcc::hd::F32ToBf16;
using ::lbcc::hd::F32ToF16;
using ::lbcc::hd::Float;
using ::lbcc::hd::Floor;
using ::lbcc::hd::Fmod;
using ::lbcc::hd::Ldexp;
using ::lbcc::hd::MaxF;
using ::lbcc::hd::MinF;
using ::lbcc::hd::Mul;
using ::lbcc::hd::Sub;
using ::lbcc::hd::ToFloat;
using ::lbcc::codecs::CounterRandom32;
using ::lbcc::codecs::CounterUniform;
using ::lbcc::codecs::kAbsMask;
using ::lbcc::codecs::kMaxFiniteAbsBits;
using ::lbcc::codecs::kMaxScale4;
using ::lbcc::codecs::kMaxScale8;
using ::lbcc::codecs::Mix32;
using ::lbcc::codecs::RoundHalfEvenF;
using ::lbcc::codecs::SaturateBf16;
using ::lbcc::codecs::SaturateF16;

// |x| bits of codecs::kMaxEncodableMagnitude (2^100): TopK-EF refuses larger e' entries.
inline constexpr uint32_t kMaxEncodableAbsBits = 0x71800000u;

LBCC_HD uint32_t AbsBits(float x) { return Bits(x) & kAbsMask; }

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
