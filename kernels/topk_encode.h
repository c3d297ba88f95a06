// TopK-EF encode after the selection (kernels/topk_select.h): the index coding's choice and
// bit streams, the value codings, and the error-feedback correction, as per-element functions
// the kernels and their host emulation share. Formats: codecs/index_coding.h,
// codecs/value_coding.h; each function says which CPU code it mirrors.
//
// Thread-safety: pure functions over the caller's buffers (WriteAdaptiveChunk ORs into the
// words that neighbouring chunks share, through hd::AtomicOrU32).
#ifndef LBCC_KERNELS_TOPK_ENCODE_H_
#define LBCC_KERNELS_TOPK_ENCODE_H_

#include <cstdint>

#include "codecs/wire_values.h"
#include "kernels/binmean_stats.h"
#include "kernels/hd.h"
#include "kernels/topk_select.h"

namespace lbcc::kernels {

// The codecs' value and index codings (codecs/wire_values.h) as the kernels' int fields hold them.
inline constexpr int kValueF32 = static_cast<int>(codecs::ValueCoding::kF32);
inline constexpr int kValueBf16 = static_cast<int>(codecs::ValueCoding::kBf16);
inline constexpr int kValueF16 = static_cast<int>(codecs::ValueCoding::kF16);
inline constexpr int kValueBinMean2 = static_cast<int>(codecs::ValueCoding::kBinMean2);
inline constexpr int kValueBinMean4 = static_cast<int>(codecs::ValueCoding::kBinMean4);
inline constexpr int kValueBinMean8 = static_cast<int>(codecs::ValueCoding::kBinMean8);
inline constexpr int kValueAbsmax8 = static_cast<int>(codecs::ValueCoding::kAbsmax8);
inline constexpr int kValueAbsmax4 = static_cast<int>(codecs::ValueCoding::kAbsmax4);
inline constexpr int kIndexAuto = static_cast<int>(codecs::IndexCoding::kAuto);
inline constexpr int kIndexPacked12 = static_cast<int>(codecs::IndexCoding::kPacked12);
inline constexpr int kIndexAdaptive = static_cast<int>(codecs::IndexCoding::kAdaptive);

LBCC_HD int BinMeanBits(int coding) {
  return coding == kValueBinMean2 ? 2 : coding == kValueBinMean4 ? 4 : coding == kValueBinMean8 ? 8 : 0;
}

// What the device tells the host after an encode (one small copy back).
struct EncodeSummary {
  int32_t bad_chunk;          // smallest chunk with a non-finite e'; INT32_MAX if none
  int32_t index_coding;       // kIndexPacked12 or kIndexAdaptive
  int32_t sub_block_log2;     // adaptive: 6 or 7
  int32_t rice;               // adaptive: Rice parameter
  uint64_t index_bytes;       // the index section's length
  uint32_t fallbacks;         // kFallback* bits (binmean_stats.h)
  float shift;                // bin-mean parameters
  float scale;
  float lookup[256];
  float table[256];           // lookup[b] + shift: the reconstructions
};

// codecs::ChooseAdaptive and the kAuto rule of codecs/topk_ef.cc, from the two totals.
struct IndexPlanArgs {
  int requested = kIndexAuto;  // the codec's option
  int64_t count = 0;           // selected values
  int rice6 = 0;
  int rice7 = 0;
};
LBCC_HD void PlanIndexCoding(const IndexPlanArgs& a, uint64_t total6, uint64_t total7,
                             EncodeSummary* s) {
  const uint64_t packed_bytes = static_cast<uint64_t>((a.count * 12 + 7) / 8);
  int b = 6, p = a.rice6;
  uint64_t bits = total6;
  if (total7 < total6) {
    b = 7;
    p = a.rice7;
    bits = total7;
  }
  const uint64_t adaptive_bytes = (bits + 7) / 8;
  bool adaptive = a.requested == kIndexAdaptive;
  if (a.requested == kIndexAuto) adaptive = adaptive_bytes < packed_bytes;
  s->index_coding = adaptive ? kIndexAdaptive : kIndexPacked12;
  s->sub_block_log2 = adaptive ? b : 0;
  s->rice = adaptive ? p : 0;
  s->index_bytes = adaptive ? adaptive_bytes : packed_bytes;
}

// codecs::EncodePacked12, pair `i` of the whole list: indices 2i and 2i + 1 into bytes 3i..
// (an odd count ends with a 2-byte word).
LBCC_HD void WritePacked12Pair(const uint16_t* local, int64_t count, int64_t i, uint8_t* out) {
  uint8_t* o = out + 3 * i;
  if (2 * i + 1 < count) {
    const uint32_t word = static_cast<uint32_t>(local[2 * i]) |
                          (static_cast<uint32_t>(local[2 * i + 1]) << 12);
    o[0] = static_cast<uint8_t>(word);
    o[1] = static_cast<uint8_t>(word >> 8);
    o[2] = static_cast<uint8_t>(word >> 16);
  } else {
    o[0] = static_cast<uint8_t>(local[2 * i]);
    o[1] = static_cast<uint8_t>(local[2 * i] >> 8);
  }
}

// An LSB-first bit stream (codecs/bitstream.h's BitWriter) written into zeroed 32-bit words
// from bit `pos` on; words at the ends may be shared with other writers, hence the OR.
struct BitSink {
  uint32_t* words;
  uint64_t pos;
  LBCC_HD void Put(uint32_t value, int bits) {
    if (bits == 0) return;
    const uint64_t w = pos >> 5;
    const int o = static_cast<int>(pos & 31);
    hd::AtomicOrU32(words + w, value << o);
    if (o + bits > 32) hd::AtomicOrU32(words + w + 1, value >> (32 - o));
    pos += static_cast<uint64_t>(bits);
  }
  LBCC_HD void PutUnary(uint32_t q) {
    while (q >= 24) {
      Put(0xFFFFFFu, 24);
      q -= 24;
    }
    Put((1u << q) - 1u, static_cast<int>(q) + 1);
  }
};

// The adaptive index writer (codecs::EncodeAdaptive), one thread block per chunk, thread j for
// sub-block j (at most 64 of them: b >= 6, chunk_len <= 4096):
//   1. the chunk's selected positions become a bitmap in shared memory (one bit per position;
//      a sub-block of 2^b positions is 2^(b-5) whole words of it, since 2^b is a multiple of 32);
//   2. thread j counts its sub-block (popcount) and its length, SubBlockBits, the very formula
//      of the selection's bits6 / bits7, so the chunk's bits end where the next chunk's start;
//   3. a block scan of the lengths gives each sub-block its first bit;
//   4. each thread writes its sub-block (Rice count, then its bitmap words or its offsets in
//      ascending order) into the chunk's bits in shared memory (ORs: neighbours share words);
//   5. the block stores those words: plain stores inside, an OR into the first and the last
//      word, which the neighbouring chunks may share (the output is zeroed beforehand).
// The bits are codecs::EncodeAdaptive's, sub-block for sub-block (kernels/topk_encode_test.cc).
inline constexpr int kAdaptiveThreads = 64;
// A chunk's adaptive bits: at most 2 * chunk_len + 8 per sub-block of 64 (AdaptiveMaxBytes),
// plus a word for starting anywhere in the first one.
inline constexpr int kAdaptiveWords = (2 * 4096 + 64 * 8) / 32 + 1;

struct AdaptiveShared {
  uint32_t present[4096 / 32];     // bit l: local position l is selected
  uint32_t len[kAdaptiveThreads];  // bits of sub-block j
  uint32_t at[kAdaptiveThreads];   // ... and where they start in the chunk
  uint32_t words[kAdaptiveWords];  // the chunk's bits, from bit first_bit % 32 of words[0]
};
struct AdaptiveLocal {};

// Writes chunk `c`'s stream, whose `k` ascending local positions are `idx`, from bit
// `first_bit` of `out` on, with sub-blocks of 2^b positions and Rice parameter p. Block `blk`
// has kAdaptiveThreads threads.
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void WriteAdaptiveChunk(Block& blk, const uint16_t* idx, int64_t k, int64_t chunk_len,
                                int b, int p, uint64_t first_bit, uint32_t* out) {
  AdaptiveShared& sh = blk.shared();
  const int threads = kAdaptiveThreads;
  const int size = 1 << b;
  const int per_sub = size >> 5;  // bitmap words per sub-block
  const int num_sub = static_cast<int>((chunk_len + size - 1) >> b);
  const uint32_t lead = static_cast<uint32_t>(first_bit & 31);
  // Sub-block j: its selected entries and its positions.
  const auto count = [&](int j) {
    uint32_t n = 0;
    for (int q = 0; q < per_sub; ++q) {
      n += static_cast<uint32_t>(hd::Popc(sh.present[j * per_sub + q]));
    }
    return n;
  };
  const auto positions = [&](int j) {
    const int64_t rest = chunk_len - (static_cast<int64_t>(j) << b);
    return static_cast<uint32_t>(rest < size ? rest : size);
  };
  blk.Phase([&](int t, AdaptiveLocal&) {
    for (int w = t; w < 4096 / 32; w += threads) sh.present[w] = 0;
  });
  blk.Phase([&](int t, AdaptiveLocal&) {
    for (int64_t i = t; i < k; i += threads) {
      const uint32_t l = idx[i];
      hd::AtomicOrU32(&sh.present[l >> 5], 1u << (l & 31));
    }
    for (int w = t; w < kAdaptiveWords; w += threads) sh.words[w] = 0;
  });
  blk.Phase([&](int t, AdaptiveLocal&) {
    sh.len[t] = t < num_sub ? SubBlockBits(count(t), positions(t), b, p) : 0u;
  });
  blk.ExclusiveSum(sh.len, sh.at);
  blk.Phase([&](int t, AdaptiveLocal&) {
    if (t >= num_sub) return;
    const uint32_t* map = sh.present + t * per_sub;
    const uint32_t n = count(t), s = positions(t);
    BitSink sink{sh.words, static_cast<uint64_t>(lead) + sh.at[t]};
    sink.PutUnary(n >> p);
    sink.Put(n & ((1u << p) - 1u), p);
    if (s < n * static_cast<uint32_t>(b)) {
      // Positions past chunk_len are never set, so whole words are the bitmap's bits.
      for (uint32_t bit = 0; bit < s; bit += 32) {
        sink.Put(map[bit >> 5], static_cast<int>(s - bit < 32 ? s - bit : 32));
      }
    } else {
      for (int q = 0; q < per_sub; ++q) {
        for (uint32_t m = map[q]; m != 0; m &= m - 1) {
          sink.Put(static_cast<uint32_t>(32 * q + hd::LowestBit(m)), b);
        }
      }
    }
  });
  blk.Phase([&](int t, AdaptiveLocal&) {
    const uint32_t total = sh.at[threads - 1] + sh.len[threads - 1];
    const uint32_t used = (lead + total + 31) >> 5;
    uint32_t* dst = out + (first_bit >> 5);
    for (uint32_t w = static_cast<uint32_t>(t); w < used; w += threads) {
      if (w == 0 || w + 1 == used) {
        hd::AtomicOrU32(dst + w, sh.words[w]);
      } else {
        dst[w] = sh.words[w];
      }
    }
  });
}

// Bin-mean section byte `j`: the codes of values [j * per_byte, ...) packed low bits first
// (codecs PackCodes), and their reconstructions table[code] written into values (v_hat).
LBCC_HD void PackBinMeanByte(const uint8_t* codes, int64_t n, int bits, const float* table,
                             int64_t j, uint8_t* section, float* values) {
  const int per_byte = 8 / bits;
  uint8_t byte = 0;
  for (int q = 0; q < per_byte; ++q) {
    const int64_t i = j * per_byte + q;
    if (i < n) {
      byte = static_cast<uint8_t>(byte | (codes[i] << (q * bits)));
      values[i] = table[codes[i]];
    }
  }
  section[j] = byte;
}

// fp32 / bf16 / fp16 value `i`: its code into the section and its reconstruction into values.
LBCC_HD void EncodeFloatValue(int coding, int64_t i, uint8_t* section, float* values) {
  const float v = values[i];
  if (coding == kValueF32) {
    hd::StoreF32(section + 4 * i, v);
    return;
  }
  uint16_t code;
  values[i] = coding == kValueBf16 ? hd::SaturateBf16(v, &code) : hd::SaturateF16(v, &code);
  hd::StoreU16(section + 2 * i, code);
}

// Absmax codings (codecs EncodeAbsmax): the scale of a run, min(absmax / qmax, cap).
LBCC_HD float AbsmaxScale(uint32_t max_abs_bits, int coding) {
  const bool eight = coding == kValueAbsmax8;
  const float qmax = eight ? 127.0f : 7.0f;
  return hd::MinF(hd::Div(hd::Float(max_abs_bits), qmax), eight ? hd::kMaxScale8 : hd::kMaxScale4);
}
// The code of value v under `scale`, and its reconstruction q * scale.
LBCC_HD int AbsmaxCode(float v, float scale, int coding, float* v_hat) {
  const float qmax = coding == kValueAbsmax8 ? 127.0f : 7.0f;
  float q = 0;
  if (scale != 0.0f) q = hd::MinF(hd::MaxF(hd::RoundHalfEvenF(hd::Div(v, scale)), -qmax), qmax);
  *v_hat = hd::Mul(q, scale);
  return static_cast<int>(q);
}
// Absmax code byte `j` (int8: value j; 4-bit: values 2j, 2j + 1, low nibble first), given the
// runs' scales; values receive the reconstructions.
LBCC_HD void PackAbsmaxByte(int coding, const float* scales, int64_t block, int64_t n, int64_t j,
                            uint8_t* codes, float* values) {
  if (coding == kValueAbsmax8) {
    float v_hat;
    const int q = AbsmaxCode(values[j], scales[j / block], coding, &v_hat);
    codes[j] = static_cast<uint8_t>(static_cast<int8_t>(q));
    values[j] = v_hat;
    return;
  }
  uint8_t byte = 0;
  for (int h = 0; h < 2; ++h) {
    const int64_t i = 2 * j + h;
    if (i < n) {
      float v_hat;
      const int q = AbsmaxCode(values[i], scales[i / block], coding, &v_hat);
      byte = static_cast<uint8_t>(byte | ((q & 0xF) << (4 * h)));
      values[i] = v_hat;
    }
  }
  codes[j] = byte;
}

// Step 4 of codecs/topk_ef.h for selected value i: next -= v_hat at its position.
LBCC_HD void SubtractReconstruction(const Geometry& g, int64_t k, const uint16_t* sel_local,
                                    const float* v_hat, int64_t i, float* next) {
  const int64_t c = i / k;
  float& slot = next[ChunkCorner(g, c) + LocalOffset(g, sel_local[i])];
  slot = hd::Sub(slot, v_hat[i]);
}

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_TOPK_ENCODE_H_
