#include "codecs/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace lbcc::codecs {
namespace {

inline uint32_t AbsBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & kAbsMask;
}

uint32_t EfUpdateScalar(const float* e, const float* d, float* out, int64_t n, float beta,
                        float lr) {
  return internal::EfUpdateRange(e, d, out, 0, n, beta, lr, 0);
}

int64_t CompactScalar(const float* block, int64_t stride, int64_t h, int64_t w, uint32_t thr,
                      uint32_t* idx, uint32_t* bits, uint32_t* max_abs) {
  int64_t m = 0;
  uint32_t max_bits = 0;
  for (int64_t r = 0; r < h; ++r) {
    const float* row = block + r * stride;
    for (int64_t c = 0; c < w; ++c) {
      uint32_t raw;
      std::memcpy(&raw, row + c, sizeof(raw));
      idx[m] = static_cast<uint32_t>(r * w + c);
      bits[m] = raw;
      m += (raw & kAbsMask) >= thr;
      max_bits = std::max(max_bits, raw & kAbsMask);
    }
  }
  *max_abs = max_bits;
  return m;
}

int64_t FilterGeScalar(const uint32_t* idx, const uint32_t* bits, int64_t m, uint32_t thr,
                       uint32_t* out_idx, uint32_t* out_bits) {
  int64_t n = 0;
  for (int64_t i = 0; i < m; ++i) {
    out_idx[n] = idx[i];
    out_bits[n] = bits[i];
    n += (bits[i] & kAbsMask) >= thr;
  }
  return n;
}

int64_t CountGeScalar(const uint32_t* bits, int64_t m, uint32_t thr) {
  int64_t n = 0;
  for (int64_t i = 0; i < m; ++i) n += (bits[i] & kAbsMask) >= thr;
  return n;
}

uint32_t KthLargestScalar(const uint32_t* bits, int64_t m, int64_t k, uint32_t lo, uint32_t hi,
                          int64_t* count_lo, int64_t* count_hi) {
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    internal::BisectKth(CountGeScalar(bits, m, mid), k, mid, &lo, &hi, count_lo, count_hi);
  }
  return lo;
}

void BinMeanCodesScalar(const float* c, int64_t n, float scale, float offset, float max_code,
                        uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) {
    const float t = (c[i] / scale) + offset;
    const float q = std::min(std::max(RoundHalfEvenF(t), 0.0f), max_code);
    codes[i] = static_cast<uint8_t>(q);
  }
}

float Absmax8BlockScalar(const float* x, int64_t n, int8_t* codes, uint32_t* max_abs_bits) {
  uint32_t max_bits = 0;
  for (int64_t i = 0; i < n; ++i) max_bits = std::max(max_bits, AbsBits(x[i]));
  *max_abs_bits = max_bits;
  float scale;
  if (!internal::Absmax8Scale(max_bits, n, codes, &scale)) return scale;
  for (int64_t i = 0; i < n; ++i) {
    const float q = std::min(std::max(RoundHalfEvenF(x[i] / scale), -127.0f), 127.0f);
    codes[i] = static_cast<int8_t>(q);
  }
  return scale;
}

// finalize_block and stage_block: `fill` is what an untouched position becomes without
// accumulate.
void FinishBlockScalar(float* acc, uint16_t* count, int64_t h, int64_t w, float* out,
                       int64_t stride, int rule, float replicas, bool accumulate, float fill) {
  for (int64_t r = 0; r < h; ++r) {
    float* a = acc + r * w;
    uint16_t* n = count + r * w;
    float* o = out + r * stride;
    for (int64_t c = 0; c < w; ++c) {
      internal::FinishPositionScalar(a + c, n + c, o + c, rule, replicas, accumulate, fill);
    }
  }
}

void FinalizeBlockScalar(float* acc, uint16_t* count, int64_t h, int64_t w, float* out,
                         int64_t stride, int rule, float replicas, bool accumulate,
                         bool /*stream*/) {
  FinishBlockScalar(acc, count, h, w, out, stride, rule, replicas, accumulate, 0.0f);
}

void StageBlockScalar(float* acc, uint16_t* count, int64_t h, int64_t w, float* buf,
                      int64_t stride, int rule, float replicas) {
  FinishBlockScalar(acc, count, h, w, buf, stride, rule, replicas, false, -0.0f);
}

void AddRowsScalar(const float* src, int64_t src_stride, int64_t h, int64_t w, float* out,
                   int64_t out_stride) {
  for (int64_t r = 0; r < h; ++r) {
    for (int64_t c = 0; c < w; ++c) out[r * out_stride + c] += src[r * src_stride + c];
  }
}

void StoreFenceScalar() {}

void Unpack12Scalar(const uint8_t* in, int64_t count, uint16_t* out) {
  const int64_t pairs = count / 2;
  for (int64_t i = 0; i < pairs; ++i) {
    const uint8_t* q = in + 3 * i;
    const uint32_t word =
        q[0] | (static_cast<uint32_t>(q[1]) << 8) | (static_cast<uint32_t>(q[2]) << 16);
    out[2 * i] = static_cast<uint16_t>(word & 0xFFF);
    out[2 * i + 1] = static_cast<uint16_t>(word >> 12);
  }
  if (count % 2 == 1) {
    const uint8_t* q = in + 3 * pairs;
    out[count - 1] = static_cast<uint16_t>(q[0] | ((q[1] & 0xF) << 8));
  }
}

bool RunsAscendingScalar(const uint16_t* x, int64_t num_runs, int64_t k, uint32_t limit) {
  bool bad = false;
  for (int64_t c = 0; c < num_runs; ++c) {
    const uint16_t* r = x + c * k;
    bad |= r[k - 1] >= limit;
    for (int64_t j = 1; j < k; ++j) bad |= r[j] <= r[j - 1];
  }
  return !bad;
}

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;  // little-endian, as the bit streams
}

// Lanes interleaved sub-block by sub-block (four independent bit chains in flight); each step
// is free of data-dependent branches.
struct AdaptiveLane {
  uint64_t pos;
  uint16_t* out;
};

template <int kB>
inline __attribute__((always_inline)) uint64_t AdaptiveStep(const uint8_t* in, uint32_t base,
                                                            AdaptiveLane& lane) {
  constexpr uint64_t kMask = (uint64_t{1} << kB) - 1;
  const uint64_t w = Load64(in + (lane.pos >> 3)) >> (lane.pos & 7);  // >= 57 valid bits
  // The count, capped at 9 (unsigned: no sign extension on the chain).
  const uint64_t q = static_cast<unsigned>(__builtin_ctzll(~w | (uint64_t{1} << 9)));
  const uint64_t head = lane.pos + q + 1;
  // b = 6: a count <= 8 leaves its 8 x 6 offset bits inside the window.
  const uint64_t offs = kB == 6 ? w >> (q + 1) : Load64(in + (head >> 3)) >> (head & 7);
  for (int i = 0; i < 8; ++i) {
    lane.out[i] = static_cast<uint16_t>(base + ((offs >> (i * kB)) & kMask));
  }
  lane.out += q;
  lane.pos += 1 + q * (kB + 1);
  return q;
}

template <int kB>
void AdaptiveP0LanesScalarT(const uint8_t* in, int64_t num_sub, int last_max, uint64_t* pos,
                            uint16_t* const* out, int64_t* count, bool* ok) {
  static_assert(kAdaptiveLanes == 4, "four lanes below");
  AdaptiveLane a{pos[0], out[0]}, b{pos[1], out[1]}, c{pos[2], out[2]}, d{pos[3], out[3]};
  // Every sub-block but the last: one flag for all lanes, bit 4 of q + 7 (set iff q > 8).
  uint64_t capped = 0;
  uint32_t base = 0;
  for (int64_t j = 0; j + 1 < num_sub; ++j) {
    capped |= AdaptiveStep<kB>(in, base, a) + 7;
    capped |= AdaptiveStep<kB>(in, base, b) + 7;
    capped |= AdaptiveStep<kB>(in, base, c) + 7;
    capped |= AdaptiveStep<kB>(in, base, d) + 7;
    base += 1u << kB;
  }
  const bool all_ok = (capped & 16) == 0;
  int l = 0;
  for (AdaptiveLane* lane : {&a, &b, &c, &d}) {
    const uint64_t q = AdaptiveStep<kB>(in, base, *lane);
    pos[l] = lane->pos;
    count[l] = lane->out - out[l];
    ok[l] = all_ok && q <= static_cast<uint64_t>(last_max);
    ++l;
  }
}

void AdaptiveP0LanesScalar(const uint8_t* in, int b, int64_t num_sub, int last_max,
                           uint64_t* pos, uint16_t* const* out, int64_t* count, bool* ok) {
  if (b == 6) {
    AdaptiveP0LanesScalarT<6>(in, num_sub, last_max, pos, out, count, ok);
  } else {
    AdaptiveP0LanesScalarT<7>(in, num_sub, last_max, pos, out, count, ok);
  }
}

void Dequant8BlockScalar(const int8_t* codes, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(std::max<int>(codes[i], -127)) * scale;
  }
}

void Dequant8BlockAddScalar(const int8_t* codes, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] += static_cast<float>(std::max<int>(codes[i], -127)) * scale;
  }
}

const CpuKernels kScalarKernels = {
    SimdLevel::kScalar,  EfUpdateScalar,         CompactScalar,       FilterGeScalar,
    CountGeScalar,       KthLargestScalar,       BinMeanCodesScalar,  FinalizeBlockScalar,
    StoreFenceScalar,    StageBlockScalar,       AddRowsScalar,    Absmax8BlockScalar,
    Dequant8BlockScalar, Dequant8BlockAddScalar, Unpack12Scalar,     RunsAscendingScalar,
    AdaptiveP0LanesScalar,
};

}  // namespace

const CpuKernels& KernelsFor(SimdLevel level) {
  static const bool has_avx2 = CpuHasAvx2Fma();
  if (level == SimdLevel::kAvx2 && has_avx2) return internal::Avx2Kernels();
  return kScalarKernels;
}

const CpuKernels& ActiveKernels() { return KernelsFor(ActiveSimdLevel()); }

}  // namespace lbcc::codecs
