// The codecs' scalar rounding rules, one definition for the CPU codecs and their CUDA twins
// (kernels/ hands this nvcc-clean header to nvcc): round half to even, the absmax scale caps,
// saturating and stochastic fp16 / bf16 rounding, stochastic rounding to an integer. Every
// operation goes through base/host_device.h, so host and device compute the same bits.
//
// Thread-safety: pure functions.
#ifndef LBCC_CODECS_ROUNDING_H_
#define LBCC_CODECS_ROUNDING_H_

#include <cstdint>

#include "base/host_device.h"
#include "codecs/counter_rng.h"

namespace lbcc::codecs {

// Bits of |x| for a float x: order-preserving for finite values; > kMaxFiniteAbsBits means
// infinite or NaN.
inline constexpr uint32_t kAbsMask = 0x7fffffffu;
inline constexpr uint32_t kMaxFiniteAbsBits = 0x7f7fffffu;

// Absmax scales are capped so that qmax * scale stays finite (only values within 1 % of
// FLT_MAX feel it): at most FLT_MAX / 128 for 8-bit codes, FLT_MAX / 8 for 4-bit codes.
inline constexpr float kMaxScale8 = 3.4028234663852886e38f / 128;
inline constexpr float kMaxScale4 = 3.4028234663852886e38f / 8;

// Python's round() on floats, independent of the FPU rounding mode.
LBCC_HD float RoundHalfEvenF(float x) {
  const float r = hd::Floor(x);
  const float d = hd::Sub(x, r);  // exact: r and x share the binade or r is 0 / -1
  if (d > 0.5f) return hd::Add(r, 1.0f);
  if (d == 0.5f && hd::Fmod(r, 2.0f) != 0.0f) return hd::Add(r, 1.0f);
  return r;
}

// t rounded down or up at random: floor(t + u), u = CounterUniform(seed, n).
LBCC_HD float StochasticRoundF(float t, uint64_t seed, uint64_t n) {
  return hd::Floor(hd::Add(t, CounterUniform(seed, n)));
}

// Round to nearest even, saturating at the format's largest finite value (infinity -> max).
// Returns the reconstruction; *code receives the 16 bits.
LBCC_HD float SaturateBf16(float v, uint16_t* code) {
  uint16_t c = hd::F32ToBf16(v);
  if ((c & 0x7FFF) == 0x7F80) c = static_cast<uint16_t>((c & 0x8000) | 0x7F7F);
  *code = c;
  return hd::Bf16ToF32(c);
}
LBCC_HD float SaturateF16(float v, uint16_t* code) {
  uint16_t c = hd::F32ToF16(v);
  if ((c & 0x7FFF) == 0x7C00) c = static_cast<uint16_t>((c & 0x8000) | 0x7BFF);  // 65504
  *code = c;
  return hd::F16ToF32(c);
}

// The next fp16 code toward +infinity / -infinity (c finite and not the largest).
LBCC_HD uint16_t NextUpF16(uint16_t c) {
  if (c == 0x8000) return 0x0001;
  return (c & 0x8000) ? static_cast<uint16_t>(c - 1) : static_cast<uint16_t>(c + 1);
}
LBCC_HD uint16_t NextDownF16(uint16_t c) {
  if (c == 0x0000) return 0x8001;
  return (c & 0x8000) ? static_cast<uint16_t>(c + 1) : static_cast<uint16_t>(c - 1);
}

// Stochastic bf16: 16 random bits added below bf16's last place, then truncation. The caller
// rejects a result whose exponent is all ones (beyond bf16's range).
LBCC_HD uint16_t StochasticBf16(float v, uint64_t seed, uint64_t n) {
  return static_cast<uint16_t>((hd::Bits(v) + (CounterRandom32(seed, n) & 0xFFFFu)) >> 16);
}

// Stochastic fp16: v (finite, |v| <= 65504) becomes one of its two fp16 neighbours lo <= v <= hi,
// hi with probability (v - lo) / (hi - lo) in fp64; an fp16 value stays itself. `c` is v's
// nearest code, hd::F32ToF16(v) (which the callers have at hand).
LBCC_HD uint16_t StochasticF16(float v, uint16_t c, uint64_t seed, uint64_t n) {
  const float r = hd::F16ToF32(c);
  if (r == v) return c;
  uint16_t lo = c, hi = c;
  if (r < v) {
    hi = NextUpF16(c);
  } else {
    lo = NextDownF16(c);
  }
  const double flo = hd::F16ToF32(lo), fhi = hd::F16ToF32(hi);
  const double p = hd::DDiv(hd::DSub(static_cast<double>(v), flo), hd::DSub(fhi, flo));
  return static_cast<double>(CounterUniform(seed, n)) < p ? hi : lo;
}

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_ROUNDING_H_
