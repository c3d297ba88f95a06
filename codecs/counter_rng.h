// A counter-based random generator for reproducible stochastic rounding: the n-th number of a
// stream is a pure function of (seed, n), so results do not depend on threads, SIMD width or
// the order of work. Not for cryptography.
//
//   Mix32(x):  x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
//              (a bijection on 32 bits with good avalanche)
//   CounterRandom32(seed, n) = Mix32(Mix32(lo32(n) ^ lo32(seed)) ^ Mix32(hi32(n) + hi32(seed)
//                                                                      + 0x9e3779b9))
//   CounterUniform(seed, n)  = (CounterRandom32(seed, n) >> 8) * 2^-24, in [0, 1)
//
// One definition for the CPU codecs and the CUDA kernels (kernels/ hands this nvcc-clean header
// to nvcc): standard headers and base/host_device.h only.
//
// Thread-safety: pure functions.
#ifndef LBCC_CODECS_COUNTER_RNG_H_
#define LBCC_CODECS_COUNTER_RNG_H_

#include <cstdint>

#include "base/host_device.h"

namespace lbcc::codecs {

LBCC_HD uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

LBCC_HD uint32_t CounterRandom32(uint64_t seed, uint64_t n) {
  const uint32_t high =
      Mix32(static_cast<uint32_t>(n >> 32) + static_cast<uint32_t>(seed >> 32) + 0x9e3779b9u);
  return Mix32(Mix32(static_cast<uint32_t>(n) ^ static_cast<uint32_t>(seed)) ^ high);
}

LBCC_HD float CounterUniform(uint64_t seed, uint64_t n) {
  return hd::Mul(static_cast<float>(CounterRandom32(seed, n) >> 8), 1.0f / 16777216.0f);
}

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_COUNTER_RNG_H_
