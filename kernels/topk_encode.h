// TopK-EF encode after the selection (kernels/topk_select.h): the index coding's choice and
// bit streams, the value codings, and the error-feedback correction, as per-element functions
// the kernels and their host emulation share. Formats: codecs/index_coding.h,
// codecs/value_coding.h; each function says which CPU code it mirrors.
//
// Thread-safety: pure functions over the caller's buffers (AdaptiveChunkWriter ORs into words
// that neighbouring chunks share, through hd::AtomicOrU32).
#ifndef LBCC_KERNELS_TOPK_ENCODE_H_
#define LBCC_KERNELS_TOPK_ENCODE_H_

#include <cstdint>

#include "kernels/binmean_stats.h"
#include "kernels/hd.h"
#include "kernels/topk_select.h"

namespace lbcc::kernels {

// Wire values of codecs/value_coding.h and codecs/index_coding.h (checked against the codecs'
// enums in kernels/topk_device.cc).
inline constexpr int kValueF32 = 1;
inline constexpr int kValueBf16 = 2;
inline constexpr int kValueF16 = 3;
inline constexpr int kValueBinMean2 = 4;
inline constexpr int kValueBinMean4 = 5;
inline constexpr int kValueBinMean8 = 6;
inline constexpr int kValueAbsmax8 = 7;
inline constexpr int kValueAbsmax4 = 8;
inline constexpr int kIndexAuto = 0;
inline constexpr int kIndexPacked12 = 1;
inline constexpr int kIndexAdaptive = 2;

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

// codecs::EncodeAdaptive for chunk `c` alone, starting at bit `first_bit` of the stream. `idx`
// holds the chunk's k ascending local positions. One thread per chunk.
LBCC_HD void WriteAdaptiveChunk(const uint16_t* idx, int64_t k, int64_t chunk_len, int b, int p,
                                uint64_t first_bit, uint32_t* words) {
  BitSink sink{words, first_bit};
  const int64_t size = int64_t{1} << b;
  const int64_t num_sub = (chunk_len + size - 1) >> b;
  int64_t i = 0;
  for (int64_t j = 0; j < num_sub; ++j) {
    const uint32_t base = static_cast<uint32_t>(j << b);
    const int64_t s = chunk_len - (j << b) < size ? chunk_len - (j << b) : size;
    int64_t n = 0;
    while (i + n < k && idx[i + n] < base + size) ++n;
    sink.PutUnary(static_cast<uint32_t>(n >> p));
    sink.Put(static_cast<uint32_t>(n & ((int64_t{1} << p) - 1)), p);
    if (s < n * b) {
      uint32_t words4[4] = {0, 0, 0, 0};
      for (int64_t t = 0; t < n; ++t) {
        const uint32_t off = idx[i + t] - base;
        words4[off >> 5] |= 1u << (off & 31);
      }
      for (int64_t bit = 0; bit < s; bit += 32) {
        sink.Put(words4[bit >> 5], static_cast<int>(s - bit < 32 ? s - bit : 32));
      }
    } else {
      for (int64_t t = 0; t < n; ++t) sink.Put(idx[i + t] - base, b);
    }
    i += n;
  }
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
