// AVX2 versions of cpu_kernels.h. Every function carries target("avx2,fma") so the file builds
// with the default flags and the rest of the binary stays runnable on CPUs without AVX2; they
// are only reached through KernelsFor(), which checks the CPU first.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "codecs/cpu_kernels.h"

#define LBCC_AVX2 __attribute__((target("avx2,fma")))

namespace lbcc::codecs {
namespace {

// For each 8-bit mask, the lanes whose bit is set, in order (then zeros): the permutation that
// packs the selected lanes to the front.
struct CompactLut {
  alignas(32) uint32_t lanes[256][8];
  constexpr CompactLut() : lanes() {
    for (int mask = 0; mask < 256; ++mask) {
      int n = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if (mask & (1 << lane)) lanes[mask][n++] = static_cast<uint32_t>(lane);
      }
      for (; n < 8; ++n) lanes[mask][n] = 0;
    }
  }
};
constexpr CompactLut kCompactLut;

inline uint32_t AbsBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & kAbsMask;
}

LBCC_AVX2 inline uint32_t HorizontalMaxU32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

LBCC_AVX2 uint32_t EfUpdateAvx2(const float* e, const float* d, float* out, int64_t n, float beta,
                                float lr) {
  const __m256 vb = _mm256_set1_ps(beta), vl = _mm256_set1_ps(lr);
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  __m256i vmax0 = _mm256_setzero_si256(), vmax1 = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 u0 = _mm256_mul_ps(vb, _mm256_loadu_ps(e + i));
    const __m256 u1 = _mm256_mul_ps(vb, _mm256_loadu_ps(e + i + 8));
    const __m256 v0 = _mm256_mul_ps(vl, _mm256_loadu_ps(d + i));
    const __m256 v1 = _mm256_mul_ps(vl, _mm256_loadu_ps(d + i + 8));
    const __m256 r0 = _mm256_add_ps(u0, v0);
    const __m256 r1 = _mm256_add_ps(u1, v1);
    _mm256_storeu_ps(out + i, r0);
    _mm256_storeu_ps(out + i + 8, r1);
    vmax0 = _mm256_max_epu32(vmax0, _mm256_and_si256(_mm256_castps_si256(r0), mask));
    vmax1 = _mm256_max_epu32(vmax1, _mm256_and_si256(_mm256_castps_si256(r1), mask));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm256_add_ps(_mm256_mul_ps(vb, _mm256_loadu_ps(e + i)),
                                   _mm256_mul_ps(vl, _mm256_loadu_ps(d + i)));
    _mm256_storeu_ps(out + i, r);
    vmax0 = _mm256_max_epu32(vmax0, _mm256_and_si256(_mm256_castps_si256(r), mask));
  }
  const uint32_t max_bits = HorizontalMaxU32(_mm256_max_epu32(vmax0, vmax1));
  return internal::EfUpdateRange(e, d, out, i, n, beta, lr, max_bits);
}

LBCC_AVX2 int64_t CompactAvx2(const float* block, int64_t stride, int64_t h, int64_t w,
                              uint32_t thr, uint32_t* idx, uint32_t* bits, uint32_t* max_abs) {
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  __m256i vmax = _mm256_setzero_si256();
  uint32_t max_bits = 0;
  // abs bits are < 2^31, so a signed compare against thr - 1 is abs >= thr (thr 0: all).
  const __m256i below = _mm256_set1_epi32(static_cast<int>(thr) - 1);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t m = 0;
  for (int64_t r = 0; r < h; ++r) {
    const float* row = block + r * stride;
    const int64_t base = r * w;
    int64_t c = 0;
    for (; c + 8 <= w; c += 8) {
      const __m256i raw = _mm256_castps_si256(_mm256_loadu_ps(row + c));
      const __m256i a = _mm256_and_si256(raw, mask);
      vmax = _mm256_max_epu32(vmax, a);
      const int sel = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, below)));
      const __m256i perm =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(kCompactLut.lanes[sel]));
      const __m256i positions =
          _mm256_add_epi32(lanes, _mm256_set1_epi32(static_cast<int>(base + c)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bits + m),
                          _mm256_permutevar8x32_epi32(raw, perm));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + m),
                          _mm256_permutevar8x32_epi32(positions, perm));
      m += __builtin_popcount(static_cast<unsigned>(sel));
    }
    for (; c < w; ++c) {
      uint32_t raw;
      std::memcpy(&raw, row + c, sizeof(raw));
      idx[m] = static_cast<uint32_t>(base + c);
      bits[m] = raw;
      m += (raw & kAbsMask) >= thr;
      max_bits = std::max(max_bits, raw & kAbsMask);
    }
  }
  *max_abs = std::max(max_bits, HorizontalMaxU32(vmax));
  return m;
}

LBCC_AVX2 int64_t FilterGeAvx2(const uint32_t* idx, const uint32_t* bits, int64_t m, uint32_t thr,
                               uint32_t* out_idx, uint32_t* out_bits) {
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  const __m256i below = _mm256_set1_epi32(static_cast<int>(thr) - 1);
  int64_t n = 0, i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i));
    const __m256i pos = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + i));
    const __m256i a = _mm256_and_si256(raw, mask);
    const int sel = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, below)));
    const __m256i perm =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(kCompactLut.lanes[sel]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out_bits + n),
                        _mm256_permutevar8x32_epi32(raw, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out_idx + n),
                        _mm256_permutevar8x32_epi32(pos, perm));
    n += __builtin_popcount(static_cast<unsigned>(sel));
  }
  for (; i < m; ++i) {
    out_idx[n] = idx[i];
    out_bits[n] = bits[i];
    n += (bits[i] & kAbsMask) >= thr;
  }
  return n;
}

LBCC_AVX2 int64_t CountGeAvx2(const uint32_t* bits, int64_t m, uint32_t thr) {
  const __m256i below = _mm256_set1_epi32(static_cast<int>(thr) - 1);
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  __m256i acc = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m256i a =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i)), mask);
    acc = _mm256_sub_epi32(acc, _mm256_cmpgt_epi32(a, below));
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  int64_t n = 0;
  for (int lane = 0; lane < 8; ++lane) n += lanes[lane];
  for (; i < m; ++i) n += (bits[i] & kAbsMask) >= thr;
  return n;
}

LBCC_AVX2 uint32_t KthLargestAvx2(const uint32_t* bits, int64_t m, int64_t k, uint32_t lo,
                                  uint32_t hi, int64_t* count_lo, int64_t* count_hi) {
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  const int64_t full = m & ~int64_t{7};
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    const __m256i below = _mm256_set1_epi32(static_cast<int>(mid) - 1);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 16 <= full; i += 16) {
      const __m256i a0 = _mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i)), mask);
      const __m256i a1 = _mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i + 8)), mask);
      acc0 = _mm256_sub_epi32(acc0, _mm256_cmpgt_epi32(a0, below));
      acc1 = _mm256_sub_epi32(acc1, _mm256_cmpgt_epi32(a1, below));
    }
    for (; i < full; i += 8) {
      const __m256i a = _mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i)), mask);
      acc0 = _mm256_sub_epi32(acc0, _mm256_cmpgt_epi32(a, below));
    }
    __m256i acc = _mm256_add_epi32(acc0, acc1);
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(1, 0, 3, 2)));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, _MM_SHUFFLE(2, 3, 0, 1)));
    int64_t count = _mm_cvtsi128_si32(sum);
    for (; i < m; ++i) count += (bits[i] & kAbsMask) >= mid;
    internal::BisectKth(count, k, mid, &lo, &hi, count_lo, count_hi);
  }
  return lo;
}

LBCC_AVX2 void BinMeanCodesAvx2(const float* c, int64_t n, float scale, float offset,
                                float max_code, uint8_t* codes) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256 voff = _mm256_set1_ps(offset), vmaxc = _mm256_set1_ps(max_code);
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 t = _mm256_add_ps(_mm256_div_ps(_mm256_loadu_ps(c + i), vscale), voff);
    __m256 q = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(_mm256_max_ps(q, zero), vmaxc);
    const __m256i qi = _mm256_cvttps_epi32(q);
    const __m128i p16 =
        _mm_packus_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packus_epi16(p16, p16));
  }
  for (; i < n; ++i) {
    const float t = (c[i] / scale) + offset;
    const float q = std::min(std::max(RoundHalfEvenF(t), 0.0f), max_code);
    codes[i] = static_cast<uint8_t>(q);
  }
}

LBCC_AVX2 float Absmax8BlockAvx2(const float* x, int64_t n, int8_t* codes, uint32_t* max_abs_bits) {
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  __m256i vmax0 = _mm256_setzero_si256(), vmax1 = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    vmax0 = _mm256_max_epu32(vmax0,
                             _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(x + i)), mask));
    vmax1 = _mm256_max_epu32(
        vmax1, _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(x + i + 8)), mask));
  }
  uint32_t max_bits = HorizontalMaxU32(_mm256_max_epu32(vmax0, vmax1));
  for (; i < n; ++i) max_bits = std::max(max_bits, AbsBits(x[i]));
  *max_abs_bits = max_bits;
  float scale;
  if (!internal::Absmax8Scale(max_bits, n, codes, &scale)) return scale;
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i q[4];
    for (int j = 0; j < 4; ++j) {
      __m256 t = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i + 8 * j), vs), kRound);
      t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);
      q[j] = _mm256_cvttps_epi32(t);
    }
    const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), p);
  }
  for (; i < n; ++i) {
    const float q = std::min(std::max(RoundHalfEvenF(x[i] / scale), -127.0f), 127.0f);
    codes[i] = static_cast<int8_t>(q);
  }
  return scale;
}

// Non-temporal store of 8 floats at p: one 32-byte store (kStream 2: p is 32-byte aligned) or
// two 16-byte ones (kStream 1: 16-byte aligned).
template <int kStream>
LBCC_AVX2 inline void Stream8(float* p, __m256 v) {
  if (kStream == 2) {
    _mm256_stream_ps(p, v);
  } else {
    _mm_stream_ps(p, _mm256_castps256_ps128(v));
    _mm_stream_ps(p + 4, _mm256_extractf128_ps(v, 1));
  }
}

// kStream (without kAccumulate; 0: plain stores): the 16-position steps store the output
// non-temporally (1, 2) where the caller checked the alignment that Stream8 needs for out and
// the stride; kStageStores (3): plain stores, untouched positions become -0 (stage_block).
constexpr int kStageStores = 3;

#define LBCC_AVX2_STEP LBCC_AVX2 inline __attribute__((always_inline))

// The constants of one finish (FinalizeBlockAvx2T), built once per block.
struct FinishConstants {
  __m256 neg_zero;
  __m256i zero;
  __m256i mantissa;
  // 0x7F000000 - bits(2^e) = bits(2^-e): the exact reciprocal of a power-of-two count, so the
  // product is the correctly rounded quotient, like the division. Counts are mostly 1 or 2;
  // other counts take the division.
  __m256i reciprocal_base;
  bool replicas_pow2;
  __m256 replicas;
  __m256 replicas_reciprocal;
};

LBCC_AVX2_STEP FinishConstants MakeFinishConstants(float replicas) {
  uint32_t replicas_bits;
  std::memcpy(&replicas_bits, &replicas, sizeof(replicas_bits));
  return FinishConstants{_mm256_set1_ps(-0.0f),
                         _mm256_setzero_si256(),
                         _mm256_set1_epi32(0x007FFFFF),
                         _mm256_set1_epi32(0x7F000000),
                         replicas >= 1.0f && (replicas_bits & 0x007FFFFF) == 0,
                         _mm256_set1_ps(replicas),
                         _mm256_set1_ps(1.0f / replicas)};
}

// agg by kRule for 8 positions of counts `cnt` (kSparseLoCoMean: / count; kMean: / replicas).
// `nb` is the counts as floats' bits; the caller tests whether they are all powers of two.
template <int kRule>
LBCC_AVX2_STEP __m256 DivideAggregate(const FinishConstants& k, __m256 agg, __m256i nb,
                                      bool counts_pow2) {
  if (kRule == 0) {
    return counts_pow2
               ? _mm256_mul_ps(agg, _mm256_castsi256_ps(_mm256_sub_epi32(k.reciprocal_base, nb)))
               : _mm256_div_ps(agg, _mm256_castsi256_ps(nb));
  }
  if (kRule == 1) {
    return k.replicas_pow2 ? _mm256_mul_ps(agg, k.replicas_reciprocal)
                           : _mm256_div_ps(agg, k.replicas);
  }
  return agg;
}

// Writes 8 finished positions: out + agg where taken (kAccumulate), agg or -0 (kStageStores),
// agg or +0 otherwise, non-temporally when kStream is 1 or 2 and `may_stream`.
template <bool kAccumulate, int kStream>
LBCC_AVX2_STEP void StoreFinished8(const FinishConstants& k, float* o, __m256 agg, __m256 taken,
                                   bool may_stream) {
  if (kAccumulate) {
    const __m256 old = _mm256_loadu_ps(o);
    _mm256_storeu_ps(o, _mm256_blendv_ps(old, _mm256_add_ps(old, agg), taken));
  } else if (kStream == kStageStores) {
    _mm256_storeu_ps(o, _mm256_blendv_ps(k.neg_zero, agg, taken));
  } else if (kStream != 0 && may_stream) {
    Stream8<kStream>(o, _mm256_and_ps(agg, taken));
  } else {
    _mm256_storeu_ps(o, _mm256_and_ps(agg, taken));
  }
}

// 16 positions per step: one load and one reset of the counts, one test for the division.
template <int kRule, bool kAccumulate, int kStream>
LBCC_AVX2_STEP void FinishStep16(const FinishConstants& k, float* a, uint16_t* n, float* o) {
  const __m256i cnt16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(n));
  const __m256i cnt0 = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(cnt16));
  const __m256i cnt1 = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(cnt16, 1));
  __m256 agg0 = _mm256_loadu_ps(a);
  __m256 agg1 = _mm256_loadu_ps(a + 8);
  if (kRule == 0 || kRule == 1) {
    const __m256i nb0 = _mm256_castps_si256(_mm256_cvtepi32_ps(cnt0));
    const __m256i nb1 = _mm256_castps_si256(_mm256_cvtepi32_ps(cnt1));
    const bool pow2 = kRule == 0 && _mm256_testz_si256(_mm256_or_si256(nb0, nb1), k.mantissa);
    agg0 = DivideAggregate<kRule>(k, agg0, nb0, pow2);
    agg1 = DivideAggregate<kRule>(k, agg1, nb1, pow2);
  }
  const __m256 taken0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(cnt0, k.zero));
  const __m256 taken1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(cnt1, k.zero));
  StoreFinished8<kAccumulate, kStream>(k, o, agg0, taken0, true);
  StoreFinished8<kAccumulate, kStream>(k, o + 8, agg1, taken1, true);
  _mm256_storeu_ps(a, k.neg_zero);
  _mm256_storeu_ps(a + 8, k.neg_zero);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(n), k.zero);
}

// 8 positions. No branch on `taken`: on dense chunks it would mispredict; untouched lanes are
// rewritten with their own bits (or +0).
template <int kRule, bool kAccumulate, int kStream>
LBCC_AVX2_STEP void FinishStep8(const FinishConstants& k, float* a, uint16_t* n, float* o) {
  const __m256i cnt =
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(n)));
  const __m256 taken = _mm256_castsi256_ps(_mm256_cmpgt_epi32(cnt, k.zero));
  __m256 agg = _mm256_loadu_ps(a);
  if (kRule == 0 || kRule == 1) {
    const __m256i nb = _mm256_castps_si256(_mm256_cvtepi32_ps(cnt));
    agg = DivideAggregate<kRule>(k, agg, nb, kRule == 0 && _mm256_testz_si256(nb, k.mantissa));
  }
  StoreFinished8<kAccumulate, kStream>(k, o, agg, taken, false);
  _mm256_storeu_ps(a, k.neg_zero);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(n), _mm_setzero_si128());
}

#undef LBCC_AVX2_STEP

// kRule as in cpu_kernels.h (0 sparseloco, 1 mean, 2 sum).
template <int kRule, bool kAccumulate, int kStream>
LBCC_AVX2 void FinalizeBlockAvx2T(float* acc, uint16_t* count, int64_t h, int64_t w, float* out,
                                  int64_t stride, float replicas) {
  const FinishConstants k = MakeFinishConstants(replicas);
  const float fill = kStream == kStageStores ? -0.0f : 0.0f;
  for (int64_t r = 0; r < h; ++r) {
    float* a = acc + r * w;
    uint16_t* n = count + r * w;
    float* o = out + r * stride;
    int64_t c = 0;
    for (; c + 16 <= w; c += 16) FinishStep16<kRule, kAccumulate, kStream>(k, a + c, n + c, o + c);
    for (; c + 8 <= w; c += 8) FinishStep8<kRule, kAccumulate, kStream>(k, a + c, n + c, o + c);
    for (; c < w; ++c) {
      internal::FinishPositionScalar(a + c, n + c, o + c, kRule, replicas, kAccumulate, fill);
    }
  }
}

LBCC_AVX2 void FinalizeBlockAvx2(float* acc, uint16_t* count, int64_t h, int64_t w, float* out,
                                 int64_t stride, int rule, float replicas, bool accumulate,
                                 bool stream) {
  using Fn = void (*)(float*, uint16_t*, int64_t, int64_t, float*, int64_t, float);
  // Columns: assign, accumulate, assign with 16-byte and with 32-byte streaming stores.
  static constexpr Fn kTable[3][4] = {
      {FinalizeBlockAvx2T<0, false, 0>, FinalizeBlockAvx2T<0, true, 0>,
       FinalizeBlockAvx2T<0, false, 1>, FinalizeBlockAvx2T<0, false, 2>},
      {FinalizeBlockAvx2T<1, false, 0>, FinalizeBlockAvx2T<1, true, 0>,
       FinalizeBlockAvx2T<1, false, 1>, FinalizeBlockAvx2T<1, false, 2>},
      {FinalizeBlockAvx2T<2, false, 0>, FinalizeBlockAvx2T<2, true, 0>,
       FinalizeBlockAvx2T<2, false, 1>, FinalizeBlockAvx2T<2, false, 2>},
  };
  const uintptr_t bits = reinterpret_cast<uintptr_t>(out) | static_cast<uintptr_t>(stride) * 4;
  int column = accumulate ? 1 : 0;
  if (!accumulate && stream) column = bits % 32 == 0 ? 3 : bits % 16 == 0 ? 2 : 0;
  kTable[rule][column](acc, count, h, w, out, stride, replicas);
}

LBCC_AVX2 void StageBlockAvx2(float* acc, uint16_t* count, int64_t h, int64_t w, float* buf,
                              int64_t stride, int rule, float replicas) {
  using Fn = void (*)(float*, uint16_t*, int64_t, int64_t, float*, int64_t, float);
  static constexpr Fn kTable[3] = {FinalizeBlockAvx2T<0, false, kStageStores>,
                                   FinalizeBlockAvx2T<1, false, kStageStores>,
                                   FinalizeBlockAvx2T<2, false, kStageStores>};
  kTable[rule](acc, count, h, w, buf, stride, replicas);
}

LBCC_AVX2 void StoreFenceAvx2() { _mm_sfence(); }

LBCC_AVX2 void AddRowsAvx2(const float* src, int64_t src_stride, int64_t h, int64_t w,
                           float* out, int64_t out_stride) {
  for (int64_t r = 0; r < h; ++r) {
    const float* s = src + r * src_stride;
    float* o = out + r * out_stride;
    int64_t c = 0;
    for (; c + 16 <= w; c += 16) {
      const __m256 a0 = _mm256_add_ps(_mm256_loadu_ps(o + c), _mm256_loadu_ps(s + c));
      const __m256 a1 = _mm256_add_ps(_mm256_loadu_ps(o + c + 8), _mm256_loadu_ps(s + c + 8));
      _mm256_storeu_ps(o + c, a0);
      _mm256_storeu_ps(o + c + 8, a1);
    }
    for (; c + 8 <= w; c += 8) {
      _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_loadu_ps(o + c), _mm256_loadu_ps(s + c)));
    }
    for (; c < w; ++c) o[c] = o[c] + s[c];
  }
}

// 16 indices (24 bytes) per step: the two 128-bit lanes take bytes 0..11 and 12..23, a byte
// shuffle gathers each index's two bytes into a 16-bit lane, then even lanes keep their low 12
// bits and odd lanes shift right by 4.
LBCC_AVX2 void Unpack12Avx2(const uint8_t* in, int64_t count, uint16_t* out) {
  const int64_t bytes = (count * 12 + 7) / 8;
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 3, 4, 5, 6);
  const __m256i shuffle = _mm256_setr_epi8(0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 7, 8, 9, 10, 10, 11, 0, 1,
                                           1, 2, 3, 4, 4, 5, 6, 7, 7, 8, 9, 10, 10, 11);
  const __m256i low12 = _mm256_set1_epi32(0x00000FFF);
  int64_t i = 0;
  for (; i + 16 <= count && (i / 16) * 24 + 32 <= bytes; i += 16) {
    const __m256i raw =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + (i / 16) * 24));
    const __m256i pairs = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(raw, lanes), shuffle);
    const __m256i even = _mm256_and_si256(pairs, low12);
    const __m256i odd = _mm256_srli_epi16(pairs, 4);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_blend_epi16(even, odd, 0xAA));
  }
  for (; i + 1 < count; i += 2) {
    const uint8_t* q = in + 3 * (i / 2);
    const uint32_t word =
        q[0] | (static_cast<uint32_t>(q[1]) << 8) | (static_cast<uint32_t>(q[2]) << 16);
    out[i] = static_cast<uint16_t>(word & 0xFFF);
    out[i + 1] = static_cast<uint16_t>(word >> 12);
  }
  if (i < count) {
    const uint8_t* q = in + 3 * (i / 2);
    out[i] = static_cast<uint16_t>(q[0] | ((q[1] & 0xF) << 8));
  }
}

// One pass over the whole list: x[i] > x[i - 1] 16 lanes at a time, where the lane of a run's
// first entry (at most one per step, since k >= 16) is exempt; and the unsigned maximum.
LBCC_AVX2 bool RunsAscendingAvx2(const uint16_t* x, int64_t num_runs, int64_t k,
                                 uint32_t limit) {
  const int64_t n = num_runs * k;
  if (k < 16 || n < 17) {
    return KernelsFor(SimdLevel::kScalar).runs_ascending(x, num_runs, k, limit);
  }
  // Signed 16-bit comparison: entries >= 2^15 fail the range check below anyway (limit <=
  // 4096 for chunks).
  __m256i vmax = _mm256_setzero_si256();
  uint32_t bad = 0;
  int64_t next_run = k;
  int64_t i = 1;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i - 1));
    uint32_t not_greater = ~static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpgt_epi16(a, b)));
    if (next_run < i + 16) {
      not_greater &= ~(3u << (2 * (next_run - i)));
      next_run += k;
    }
    bad |= not_greater;
    vmax = _mm256_max_epu16(vmax, a);
  }
  uint32_t max_value = x[0];
  for (; i < n; ++i) {
    if (i % k != 0 && x[i] <= x[i - 1]) bad = 1;
    max_value = std::max<uint32_t>(max_value, x[i]);
  }
  __m128i m = _mm_max_epu16(_mm256_castsi256_si128(vmax), _mm256_extracti128_si256(vmax, 1));
  m = _mm_max_epu16(m, _mm_srli_si128(m, 8));
  m = _mm_max_epu16(m, _mm_srli_si128(m, 4));
  m = _mm_max_epu16(m, _mm_srli_si128(m, 2));
  max_value = std::max<uint32_t>(max_value, static_cast<uint32_t>(_mm_extract_epi16(m, 0)));
  return bad == 0 && max_value < limit;
}

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// As the scalar version, but a sub-block's 8 offset slots leave in one 16-byte store: a byte
// shuffle puts the two bytes holding offset i into 16-bit lane i, a multiply by
// 2^(16 - b - shift_i) lifts the offset to the lane's top and a shift right by 16 - b brings it
// down alone (offset i starts at bit i * b: byte (i * b) / 8, shift (i * b) % 8).
struct AdaptiveLaneAvx2 {
  uint64_t pos;
  uint16_t* out;
};

template <int kB>
LBCC_AVX2 inline __attribute__((always_inline)) uint64_t AdaptiveStepAvx2(
    const uint8_t* in, __m128i vshuffle, __m128i vmul, __m128i vbase,
    AdaptiveLaneAvx2& lane) {
  const uint64_t w = Load64(in + (lane.pos >> 3)) >> (lane.pos & 7);  // >= 57 valid bits
  // The count, capped at 9 (unsigned: no sign extension on the chain).
  const uint64_t q = static_cast<unsigned>(__builtin_ctzll(~w | (uint64_t{1} << 9)));
  const uint64_t head = lane.pos + q + 1;
  const uint64_t offs = kB == 6 ? w >> (q + 1) : Load64(in + (head >> 3)) >> (head & 7);
  __m128i v = _mm_shuffle_epi8(_mm_cvtsi64_si128(static_cast<int64_t>(offs)), vshuffle);
  v = _mm_srli_epi16(_mm_mullo_epi16(v, vmul), 16 - kB);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lane.out), _mm_add_epi16(v, vbase));
  lane.out += q;
  lane.pos += 1 + q * (kB + 1);
  return q;
}

template <int kB>
LBCC_AVX2 void AdaptiveP0LanesAvx2T(const uint8_t* in, int64_t num_sub, int last_max,
                                    uint64_t* pos, uint16_t* const* out, int64_t* count,
                                    bool* ok) {
  static_assert(kAdaptiveLanes == 4, "four lanes below");
  alignas(16) int8_t shuffle[16];
  alignas(16) int16_t multiplier[8];
  for (int i = 0; i < 8; ++i) {
    shuffle[2 * i] = static_cast<int8_t>((i * kB) / 8);
    shuffle[2 * i + 1] = static_cast<int8_t>((i * kB) / 8 + 1);
    multiplier[i] = static_cast<int16_t>(1 << (16 - kB - (i * kB) % 8));
  }
  const __m128i vshuffle = _mm_load_si128(reinterpret_cast<const __m128i*>(shuffle));
  const __m128i vmul = _mm_load_si128(reinterpret_cast<const __m128i*>(multiplier));
  const __m128i vstep = _mm_set1_epi16(static_cast<int16_t>(1 << kB));
  __m128i vbase = _mm_setzero_si128();
  AdaptiveLaneAvx2 a{pos[0], out[0]}, b{pos[1], out[1]}, c{pos[2], out[2]}, d{pos[3], out[3]};
  // Every sub-block but the last: one flag for all lanes, bit 4 of q + 7 (set iff q > 8).
  uint64_t capped = 0;
  for (int64_t j = 0; j + 1 < num_sub; ++j) {
    capped |= AdaptiveStepAvx2<kB>(in, vshuffle, vmul, vbase, a) + 7;
    capped |= AdaptiveStepAvx2<kB>(in, vshuffle, vmul, vbase, b) + 7;
    capped |= AdaptiveStepAvx2<kB>(in, vshuffle, vmul, vbase, c) + 7;
    capped |= AdaptiveStepAvx2<kB>(in, vshuffle, vmul, vbase, d) + 7;
    vbase = _mm_add_epi16(vbase, vstep);
  }
  const bool all_ok = (capped & 16) == 0;
  int l = 0;
  for (AdaptiveLaneAvx2* lane : {&a, &b, &c, &d}) {
    const uint64_t q = AdaptiveStepAvx2<kB>(in, vshuffle, vmul, vbase, *lane);
    pos[l] = lane->pos;
    count[l] = lane->out - out[l];
    ok[l] = all_ok && q <= static_cast<uint64_t>(last_max);
    ++l;
  }
}

LBCC_AVX2 void AdaptiveP0LanesAvx2(const uint8_t* in, int b, int64_t num_sub, int last_max,
                                   uint64_t* pos, uint16_t* const* out, int64_t* count,
                                   bool* ok) {
  if (b == 6) {
    AdaptiveP0LanesAvx2T<6>(in, num_sub, last_max, pos, out, count, ok);
  } else {
    AdaptiveP0LanesAvx2T<7>(in, num_sub, last_max, pos, out, count, ok);
  }
}

template <bool kAdd>
LBCC_AVX2 inline void Dequant8Avx2(const int8_t* codes, int64_t n, float scale, float* out) {
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256i floor = _mm256_set1_epi32(-127);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    const __m256i a = _mm256_max_epi32(_mm256_cvtepi8_epi32(raw), floor);
    const __m256i b = _mm256_max_epi32(_mm256_cvtepi8_epi32(_mm_srli_si128(raw, 8)), floor);
    __m256 fa = _mm256_mul_ps(_mm256_cvtepi32_ps(a), vs);
    __m256 fb = _mm256_mul_ps(_mm256_cvtepi32_ps(b), vs);
    if (kAdd) {
      fa = _mm256_add_ps(_mm256_loadu_ps(out + i), fa);
      fb = _mm256_add_ps(_mm256_loadu_ps(out + i + 8), fb);
    }
    _mm256_storeu_ps(out + i, fa);
    _mm256_storeu_ps(out + i + 8, fb);
  }
  for (; i < n; ++i) {
    const float v = static_cast<float>(std::max<int>(codes[i], -127)) * scale;
    out[i] = kAdd ? out[i] + v : v;
  }
}

LBCC_AVX2 void Dequant8BlockAvx2(const int8_t* codes, int64_t n, float scale, float* out) {
  Dequant8Avx2<false>(codes, n, scale, out);
}

LBCC_AVX2 void Dequant8BlockAddAvx2(const int8_t* codes, int64_t n, float scale, float* out) {
  Dequant8Avx2<true>(codes, n, scale, out);
}

const CpuKernels kAvx2Kernels = {
    SimdLevel::kAvx2, EfUpdateAvx2,      CompactAvx2,      FilterGeAvx2,      CountGeAvx2,
    KthLargestAvx2,   BinMeanCodesAvx2, FinalizeBlockAvx2, StoreFenceAvx2, StageBlockAvx2, AddRowsAvx2,   Absmax8BlockAvx2,
    Dequant8BlockAvx2,
    Dequant8BlockAddAvx2, Unpack12Avx2, RunsAscendingAvx2, AdaptiveP0LanesAvx2,
};

}  // namespace

namespace internal {
const CpuKernels& Avx2Kernels() { return kAvx2Kernels; }
}  // namespace internal

}  // namespace lbcc::codecs
