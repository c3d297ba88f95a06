// Decode-accumulate on the GPU: the aggregation of codecs::DecodeAccumulate (codec.h) over
// payloads the host has validated, bit for bit.
//
// TopK-EF: one thread block per chunk keeps the chunk's accumulator (-0 per position, so that
// -0 + v == v) and selection counts in shared memory, adds the payloads one after another (a
// barrier between payloads keeps the CPU's order: agg = (v_0 + v_1) + v_2 ... in rank order;
// within a payload a chunk's positions are distinct, so its threads never collide), then writes
// the chunk: the rule's division where a payload carried the position, 0 (or the old value when
// accumulating) where none did.
// Dense formats: one thread per element, payloads in rank order.
//
// Thread-safety: pure functions over the caller's buffers.
#ifndef LBCC_KERNELS_AGGREGATE_H_
#define LBCC_KERNELS_AGGREGATE_H_

#include <cstdint>

#include "codecs/wire_values.h"
#include "kernels/hd.h"
#include "kernels/topk_encode.h"
#include "kernels/topk_select.h"

namespace lbcc::kernels {

// codecs::Aggregation (codecs/wire_values.h) as the kernels' int fields hold it.
inline constexpr int kAggSparseLoCoMean = static_cast<int>(codecs::Aggregation::kSparseLoCoMean);
inline constexpr int kAggMean = static_cast<int>(codecs::Aggregation::kMean);
inline constexpr int kAggSum = static_cast<int>(codecs::Aggregation::kSum);

// One validated TopK-EF payload as the device sees it.
struct TopKPayloadDesc {
  int64_t k = 0;
  int64_t index_offset = 0;        // into AggregateArgs::indices
  const uint8_t* values = nullptr; // the value section, 4-byte aligned
  int32_t coding = 0;
  int64_t block = 0;               // absmax runs
  const float* table = nullptr;    // bin-mean: lookup[b] + shift (ValueDecoder's table)
};

// Value i of a payload (codecs::ValueDecoder::Decode); `runs` = ceil(count / block) for the
// absmax codings (their codes follow one scale per run).
LBCC_HD float DecodeTopKValue(const TopKPayloadDesc& p, int64_t runs, int64_t i) {
  switch (p.coding) {
    case kValueF32:
      return hd::Float(reinterpret_cast<const uint32_t*>(p.values)[i]);
    case kValueBf16:
      return hd::Bf16ToF32(reinterpret_cast<const uint16_t*>(p.values)[i]);
    case kValueF16:
      return hd::F16ToF32(reinterpret_cast<const uint16_t*>(p.values)[i]);
    case kValueBinMean2:
      return p.table[(p.values[i >> 2] >> ((i & 3) * 2)) & 3];
    case kValueBinMean4:
      return p.table[(p.values[i >> 1] >> ((i & 1) * 4)) & 15];
    case kValueBinMean8:
      return p.table[p.values[i]];
    default: {  // kValueAbsmax8, kValueAbsmax4
      const float scale = reinterpret_cast<const float*>(p.values)[i / p.block];
      const uint8_t* codes = p.values + 4 * runs;
      int q;
      if (p.coding == kValueAbsmax8) {
        q = static_cast<int8_t>(codes[i]);
        q = q < -127 ? -127 : q;
      } else {
        q = (codes[i >> 1] >> ((i & 1) * 4)) & 0xF;
        q = q >= 8 ? q - 16 : q;
        q = q < -7 ? -7 : q;
      }
      return hd::Mul(static_cast<float>(q), scale);
    }
  }
}

struct AggregateArgs {
  Geometry g;
  const TopKPayloadDesc* payloads = nullptr;
  int32_t num_payloads = 0;
  const uint16_t* indices = nullptr;  // every payload's local indices
  int32_t rule = kAggSparseLoCoMean;
  bool accumulate = false;
  float* out = nullptr;
};

inline constexpr int kAggregateThreads = 256;

struct AggregateShared {
  float acc[4096];
  uint16_t count[4096];
  TopKPayloadDesc payload;  // the payload being added
  int64_t runs;
};

struct AggregateLocal {};

LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void AggregateChunk(Block& b, const AggregateArgs& a, int64_t c) {
  AggregateShared& sh = b.shared();
  const Geometry& g = a.g;
  const int64_t n = g.chunk_len;
  const int threads = b.threads();
  b.Phase([&](int t, AggregateLocal&) {
    for (int64_t l = t; l < n; l += threads) {
      sh.acc[l] = -0.0f;
      sh.count[l] = 0;
    }
  });
  for (int32_t r = 0; r < a.num_payloads; ++r) {
    b.Phase([&](int t, AggregateLocal&) {
      if (t == 0) {
        sh.payload = a.payloads[r];
        sh.runs = sh.payload.block > 0 ? (g.num_chunks * sh.payload.k + sh.payload.block - 1) /
                                             sh.payload.block
                                       : 0;
      }
    });
    b.Phase([&](int t, AggregateLocal&) {
      const TopKPayloadDesc& p = sh.payload;
      const uint16_t* idx = a.indices + p.index_offset + c * p.k;
      for (int64_t j = t; j < p.k; j += threads) {
        const int64_t i = c * p.k + j;
        const float v = DecodeTopKValue(p, sh.runs, i);
        const uint16_t l = idx[j];
        sh.acc[l] = hd::Add(sh.acc[l], v);
        sh.count[l] = static_cast<uint16_t>(sh.count[l] + 1);
      }
    });
  }
  b.Phase([&](int t, AggregateLocal&) {
    const int64_t corner = ChunkCorner(g, c);
    const float replicas = static_cast<float>(a.num_payloads);
    for (int64_t l = t; l < n; l += threads) {
      float& slot = a.out[corner + LocalOffset(g, l)];
      const uint32_t cnt = sh.count[l];
      if (cnt == 0) {
        if (!a.accumulate) slot = 0.0f;
        continue;
      }
      float agg = sh.acc[l];
      if (a.rule == kAggSparseLoCoMean) agg = hd::Div(agg, static_cast<float>(cnt));
      if (a.rule == kAggMean) agg = hd::Div(agg, replicas);
      slot = a.accumulate ? hd::Add(slot, agg) : agg;
    }
  });
}

// Dense quantizer payloads (codecs/dense_quant.h), validated by the host.
inline constexpr int kDenseInt8 = static_cast<int>(codecs::DenseFormat::kInt8);
inline constexpr int kDenseInt4 = static_cast<int>(codecs::DenseFormat::kInt4);
inline constexpr int kDenseF16 = static_cast<int>(codecs::DenseFormat::kF16);
inline constexpr int kDenseBf16 = static_cast<int>(codecs::DenseFormat::kBf16);

struct DensePayloadDesc {
  int32_t format = kDenseInt8;
  int64_t block = 0;
  const float* scales = nullptr;   // int formats, 4-byte aligned
  const uint8_t* codes = nullptr;  // 2-byte aligned for the 16-bit formats
};

LBCC_HD float DecodeDenseValue(const DensePayloadDesc& p, int64_t i) {
  switch (p.format) {
    case kDenseInt8: {
      int q = static_cast<int8_t>(p.codes[i]);
      q = q < -127 ? -127 : q;
      return hd::Mul(static_cast<float>(q), p.scales[i / p.block]);
    }
    case kDenseInt4: {
      int q = (p.codes[i >> 1] >> ((i & 1) * 4)) & 0xF;
      q = q >= 8 ? q - 16 : q;
      q = q < -7 ? -7 : q;
      return hd::Mul(static_cast<float>(q), p.scales[i / p.block]);
    }
    case kDenseF16:
      return hd::F16ToF32(reinterpret_cast<const uint16_t*>(p.codes)[i]);
    default:
      return hd::Bf16ToF32(reinterpret_cast<const uint16_t*>(p.codes)[i]);
  }
}

struct DenseAggregateArgs {
  const DensePayloadDesc* payloads = nullptr;
  int32_t num_payloads = 0;
  int64_t num_elements = 0;
  bool divide = false;  // the means divide by the number of payloads
  bool accumulate = false;
  float* out = nullptr;
};

// Element i (codecs DenseQuantDecodeAccumulate).
LBCC_HD void AggregateDenseElement(const DenseAggregateArgs& a, int64_t i) {
  float acc = -0.0f;
  for (int32_t r = 0; r < a.num_payloads; ++r) acc = hd::Add(acc, DecodeDenseValue(a.payloads[r], i));
  const float agg = a.divide ? hd::Div(acc, static_cast<float>(a.num_payloads)) : acc;
  a.out[i] = a.accumulate ? hd::Add(a.out[i], agg) : agg;
}

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_AGGREGATE_H_
