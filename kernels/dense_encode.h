// Dense quantizer encode on the GPU (codecs/dense_quant.h), bit for bit: blockwise absmax
// int8 / int4 (nearest or stochastic rounding) and fp16 / bf16 (nearest or stochastic).
//
// Int formats: one thread block per quantization block finds the block's largest |x| (an exact
// maximum over the bits, so the order of work does not matter), derives the scale, then codes
// every element (int4: every byte of two elements). 16-bit formats: one thread per element.
// An element the CPU codec would reject (NaN, infinity, beyond the 16-bit format's range) lowers
// *first_bad to its index; the host then reports the CPU's error for that element.
//
// Thread-safety: pure functions over the caller's buffers.
#ifndef LBCC_KERNELS_DENSE_ENCODE_H_
#define LBCC_KERNELS_DENSE_ENCODE_H_

#include <cstdint>

#include "codecs/rounding.h"
#include "kernels/aggregate.h"
#include "kernels/hd.h"

namespace lbcc::kernels {

struct DenseEncodeArgs {
  int32_t format = kDenseInt8;
  int64_t block = 0;  // int formats
  bool stochastic = false;
  uint64_t seed = 0;
  const float* x = nullptr;
  int64_t n = 0;
  float* scales = nullptr;   // int formats: one per block
  uint8_t* codes = nullptr;  // int8: n bytes; int4: ceil(n / 2); 16-bit: 2 n
  uint64_t* first_bad = nullptr;
};

// The code of one element of an int format given its block's scale (codecs EncodeIntScalar /
// Absmax8BlockScalar).
LBCC_HD int DenseIntCode(const DenseEncodeArgs& a, float scale, int64_t i) {
  const float qmax = a.format == kDenseInt8 ? 127.0f : 7.0f;
  float q = 0;
  if (scale != 0.0f) {
    const float t = hd::Div(a.x[i], scale);
    q = a.stochastic ? codecs::StochasticRoundF(t, a.seed, static_cast<uint64_t>(i))
                     : hd::RoundHalfEvenF(t);
    q = hd::MinF(hd::MaxF(q, -qmax), qmax);
  }
  return static_cast<int>(q);
}

inline constexpr int kDenseThreads = 256;

struct DenseBlockShared {
  uint32_t max_bits;
  float scale;
};
struct DenseBlockLocal {};

// Quantization block `blk` of an int format.
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void DenseEncodeIntBlock(Block& b, const DenseEncodeArgs& a, int64_t blk) {
  DenseBlockShared& sh = b.shared();
  const int threads = b.threads();
  const int64_t begin = blk * a.block;
  const int64_t end = begin + a.block < a.n ? begin + a.block : a.n;
  b.Phase([&](int t, DenseBlockLocal&) {
    if (t == 0) sh.max_bits = 0;
  });
  b.Phase([&](int t, DenseBlockLocal&) {
    uint32_t mine = 0;
    for (int64_t i = begin + t; i < end; i += threads) {
      const uint32_t bits = hd::AbsBits(a.x[i]);
      if (bits > hd::kMaxFiniteAbsBits) hd::AtomicMinU64(a.first_bad, static_cast<uint64_t>(i));
      mine = bits > mine ? bits : mine;
    }
    hd::AtomicMaxU32(&sh.max_bits, mine);
  });
  b.Phase([&](int t, DenseBlockLocal&) {
    if (t == 0) {
      const bool eight = a.format == kDenseInt8;
      float scale = 0;
      if (sh.max_bits <= hd::kMaxFiniteAbsBits) {
        scale = hd::MinF(hd::Div(hd::Float(sh.max_bits), eight ? 127.0f : 7.0f),
                         eight ? hd::kMaxScale8 : hd::kMaxScale4);
      }
      sh.scale = scale;
      a.scales[blk] = scale;
    }
  });
  b.Phase([&](int t, DenseBlockLocal&) {
    const float scale = sh.scale;
    if (a.format == kDenseInt8) {
      for (int64_t i = begin + t; i < end; i += threads) {
        a.codes[i] = static_cast<uint8_t>(static_cast<int8_t>(DenseIntCode(a, scale, i)));
      }
      return;
    }
    // int4: byte j holds elements 2j (low nibble) and 2j + 1; blocks are multiples of 16, so a
    // byte never straddles two blocks.
    for (int64_t j = begin / 2 + t; 2 * j < end; j += threads) {
      uint8_t byte = static_cast<uint8_t>(DenseIntCode(a, scale, 2 * j) & 0xF);
      if (2 * j + 1 < end) byte = static_cast<uint8_t>(byte | ((DenseIntCode(a, scale, 2 * j + 1) & 0xF) << 4));
      a.codes[j] = byte;
    }
  });
}

// Element i of a 16-bit format (codecs EncodeHalf).
LBCC_HD void DenseEncodeHalfElement(const DenseEncodeArgs& a, int64_t i) {
  const float v = a.x[i];
  if (hd::AbsBits(v) > hd::kMaxFiniteAbsBits) {
    hd::AtomicMinU64(a.first_bad, static_cast<uint64_t>(i));
    return;
  }
  uint16_t c;
  if (a.format == kDenseBf16) {
    c = a.stochastic ? codecs::StochasticBf16(v, a.seed, static_cast<uint64_t>(i))
                     : hd::F32ToBf16(v);
    if ((c & 0x7F80) == 0x7F80) {
      hd::AtomicMinU64(a.first_bad, static_cast<uint64_t>(i));
      return;
    }
  } else {
    const float mag = hd::Float(hd::AbsBits(v));
    if (mag > 65504.0f && (a.stochastic || mag >= 65520.0f)) {
      hd::AtomicMinU64(a.first_bad, static_cast<uint64_t>(i));
      return;
    }
    c = hd::F32ToF16(v);
    if (a.stochastic) c = codecs::StochasticF16(v, c, a.seed, static_cast<uint64_t>(i));
  }
  hd::StoreU16(a.codes + 2 * i, c);
}

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_DENSE_ENCODE_H_
