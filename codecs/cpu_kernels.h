// The CPU inner loops of the codecs, in a portable version and an AVX2 version (chosen at run
// time from base/cpu.h's ActiveSimdLevel()). Both versions produce bit-identical results: they
// perform the same IEEE fp32 operations in the same order per element (no FMA contraction: the
// codecs build with -ffp-contract=off), and integer work is exact.
//
// Thread-safety: the functions are pure; the tables are immutable.
#ifndef LBCC_CODECS_CPU_KERNELS_H_
#define LBCC_CODECS_CPU_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/cpu.h"
#include "codecs/rounding.h"

namespace lbcc::codecs {

// kAbsMask, kMaxFiniteAbsBits, kMaxScale8 / kMaxScale4 and RoundHalfEvenF: codecs/rounding.h.

struct CpuKernels {
  SimdLevel level;

  // out[i] = (beta * e[i]) + (lr * d[i]) in fp32 (two products, then the sum). Returns the
  // largest |out[i]| as bits (see kMaxFiniteAbsBits). out may not alias e or d.
  uint32_t (*ef_update)(const float* e, const float* d, float* out, int64_t n, float beta,
                        float lr);

  // Candidates of an h x w block (rows `stride` floats apart): the local positions r * w + c
  // whose |value| bits are >= thr, ascending, and the values' raw bits. Returns the count and
  // the largest |value| bits of the whole block in *max_abs. idx and bits need h * w + 8
  // entries (the vector version stores whole vectors).
  int64_t (*compact)(const float* block, int64_t stride, int64_t h, int64_t w, uint32_t thr,
                     uint32_t* idx, uint32_t* bits, uint32_t* max_abs);

  // The same over a list: keeps the entries i < m with (bits[i] & kAbsMask) >= thr, in order.
  // out_idx and out_bits need (result + 8) entries.
  int64_t (*filter_ge)(const uint32_t* idx, const uint32_t* bits, int64_t m, uint32_t thr,
                       uint32_t* out_idx, uint32_t* out_bits);

  // Number of i < m with (bits[i] & kAbsMask) >= thr.
  int64_t (*count_ge)(const uint32_t* bits, int64_t m, uint32_t thr);

  // Bisection for the k-th largest |value| among the m entries of `bits`: given lo with
  // count_ge(lo) >= k (count *count_lo) and hi with count_ge(hi) < k (count *count_hi), returns
  // the largest t with count_ge(t) >= k and updates *count_lo = count_ge(t), *count_hi =
  // count_ge(t + 1).
  uint32_t (*kth_largest)(const uint32_t* bits, int64_t m, int64_t k, uint32_t lo, uint32_t hi,
                          int64_t* count_lo, int64_t* count_hi);

  // Bin-mean codes of centered values c: codes[i] = clamp(round_half_even((c[i] / scale) +
  // offset), 0, max_code), fp32 operations.
  void (*binmean_codes)(const float* c, int64_t n, float scale, float offset, float max_code,
                        uint8_t* codes);

  // Writes one chunk's aggregate into the output, position by position over the h x w block:
  // where count[l] > 0, agg = acc[l] (kSum), acc[l] / count[l] (kSparseLoCoMean) or
  // acc[l] / replicas (kMean), fp32 division (a power-of-two divisor may be applied as its exact
  // reciprocal: the same correctly rounded result), and out = agg (or out + agg when
  // accumulate); where count[l] is 0 the output keeps its bits when accumulate and becomes +0
  // otherwise. Resets acc to -0 and count to 0.
  // `rule` is codec.h's Aggregation as an int (0 sparseloco, 1 mean, 2 sum). `stream` (a hint,
  // without accumulate): the output is not read again soon, so the vector version writes it
  // with non-temporal stores where aligned (no read for ownership); call store_fence() before
  // anything else reads it. The bits written are the same either way.
  void (*finalize_block)(float* acc, uint16_t* count, int64_t h, int64_t w, float* out,
                         int64_t stride, int rule, float replicas, bool accumulate, bool stream);
  // Orders finalize_block's non-temporal stores before later stores (sfence); no-op in scalar.
  void (*store_fence)();
  // finalize_block without accumulate into a staging buffer `buf` (rows `stride` floats apart),
  // except that untouched positions become -0: add_rows then adds the buffer to the output, and
  // x + -0 is x, so untouched positions keep their bits there too (only a signalling NaN comes
  // out quiet). Resets acc and count.
  void (*stage_block)(float* acc, uint16_t* count, int64_t h, int64_t w, float* buf,
                      int64_t stride, int rule, float replicas);
  // out[r * out_stride + c] = out[...] + src[r * src_stride + c] for r < h, c < w (fp32).
  void (*add_rows)(const float* src, int64_t src_stride, int64_t h, int64_t w, float* out,
                   int64_t out_stride);

  // Dense blockwise int8 absmax over one block of n values: returns the block's scale
  // (min(absmax / 127, kMaxScale8), 0 for an all-zero block) after writing codes; max_abs_bits
  // receives the largest |x| as bits (non-finite check). Round half to even.
  float (*absmax8_block)(const float* x, int64_t n, int8_t* codes, uint32_t* max_abs_bits);
  // out[i] = codes[i] * scale (codes clamped to [-127, 127]); accumulate: out[i] += that.
  void (*dequant8_block)(const int8_t* codes, int64_t n, float scale, float* out);
  void (*dequant8_block_add)(const int8_t* codes, int64_t n, float scale, float* out);

  // 12-bit packed indices (index_coding.h's kPacked12): out[i] for i < count from
  // Packed12Bytes(count) bytes (an odd count's last index from the final two bytes; its
  // padding bits are not looked at).
  void (*unpack12)(const uint8_t* in, int64_t count, uint16_t* out);

  // True when x[0 .. num_runs * k) is num_runs runs of k strictly ascending values, each
  // < limit (k >= 1).
  bool (*runs_ascending)(const uint16_t* x, int64_t num_runs, int64_t k, uint32_t limit);

  // The adaptive index coding's common case (index_coding.h: Rice parameter 0, every sub-block
  // lists its offsets), kAdaptiveLanes chunks at once so that their serial bit chains overlap.
  // Lane l reads one chunk of `num_sub` >= 1 sub-blocks of 2^b positions (b = 6 or 7) from bit
  // pos[l] of `in`: per sub-block j, a unary count n, then n b-bit offsets o, each appended to
  // out[l] as (j << b) + o. On return pos[l] is the lane's end bit, count[l] the entries
  // appended, and ok[l] false when a count exceeds 8 (last_max for the last sub-block; the
  // entries are then meaningless); a count above 8 before the last sub-block in any lane makes
  // every ok[l] false (it is rare in valid streams). Nothing else is checked: the caller
  // verifies order, totals and the end against a sequential decode. Reads in[pos[l] / 8 ..]
  // only below bit
  // pos[l] + AdaptiveLaneReadBits(num_sub); out[l] holds kAdaptiveLaneCapacity entries (slots
  // past count[l] are scratch).
  void (*adaptive_p0_lanes)(const uint8_t* in, int b, int64_t num_sub, int last_max,
                            uint64_t* pos, uint16_t* const* out, int64_t* count, bool* ok);
};

inline constexpr int kAdaptiveLanes = 4;
// A lane stores 8 slots per sub-block and advances by at most 9 (a count > 8 is capped at 9):
// 64 sub-blocks x 9 + 8 entries, rounded up.
inline constexpr int64_t kAdaptiveLaneCapacity = 640;
// A sub-block advances at most 1 + 9 * 8 bits; its loads reach 74 bits past its start.
inline constexpr uint64_t AdaptiveLaneReadBits(int64_t num_sub) {
  return static_cast<uint64_t>(num_sub) * 73 + 64;
}

const CpuKernels& KernelsFor(SimdLevel level);
// KernelsFor(ActiveSimdLevel()).
const CpuKernels& ActiveKernels();

namespace internal {
// ef_update over [i, n) in scalar code (the scalar kernel, and the AVX2 kernel's tail): returns
// the larger of max_bits and the largest |out| bits written.
inline uint32_t EfUpdateRange(const float* e, const float* d, float* out, int64_t i, int64_t n,
                              float beta, float lr, uint32_t max_bits) {
  for (; i < n; ++i) {
    const float u = beta * e[i];
    const float v = lr * d[i];
    const float r = u + v;
    out[i] = r;
    const uint32_t bits = hd::Bits(r) & kAbsMask;
    max_bits = max_bits < bits ? bits : max_bits;
  }
  return max_bits;
}

// absmax8_block's scale for a block of n values whose largest |x| bits are max_bits:
// min(absmax / 127, kMaxScale8). Returns false when nothing is left to code (an all-zero or
// non-finite block): the codes are then zeroed and *scale is the block's result (0 when
// non-finite).
inline bool Absmax8Scale(uint32_t max_bits, int64_t n, int8_t* codes, float* scale) {
  const float s = hd::MinF(hd::Float(max_bits) / 127.0f, kMaxScale8);
  if (max_bits > kMaxFiniteAbsBits || s == 0.0f) {
    std::memset(codes, 0, static_cast<size_t>(n));
    *scale = max_bits > kMaxFiniteAbsBits ? 0.0f : s;
    return false;
  }
  *scale = s;
  return true;
}

// One step of kth_largest's bisection: `count` entries are >= mid.
inline void BisectKth(int64_t count, int64_t k, uint32_t mid, uint32_t* lo, uint32_t* hi,
                      int64_t* count_lo, int64_t* count_hi) {
  if (count >= k) {
    *lo = mid;
    *count_lo = count;
  } else {
    *hi = mid;
    *count_hi = count;
  }
}

// One position of a chunk's finish (finalize_block, stage_block) in scalar code, for the scalar
// kernels and the AVX2 kernels' row tails: where the count is > 0, out = agg (or out + agg),
// agg by `rule` as in finalize_block, and the accumulator and count are reset; an untouched
// position becomes `fill` unless accumulating.
inline void FinishPositionScalar(float* a, uint16_t* n, float* o, int rule, float replicas,
                                 bool accumulate, float fill) {
  if (*n == 0) {
    if (!accumulate) *o = fill;
    return;
  }
  float agg = *a;
  if (rule == 0) agg = agg / static_cast<float>(*n);
  if (rule == 1) agg = agg / replicas;
  *o = accumulate ? *o + agg : agg;
  *a = -0.0f;
  *n = 0;
}

// Defined in cpu_kernels_avx2.cc; only called when the CPU has AVX2 and FMA.
const CpuKernels& Avx2Kernels();
}  // namespace internal

}  // namespace lbcc::codecs

#endif  // LBCC_CODECS_CPU_KERNELS_H_
