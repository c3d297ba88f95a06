// The statistics of SparseLoCo's bin-mean quantizer (codecs/value_coding.h), computed in
// parallel yet bit-identical to the CPU codec.
//
// The CPU codec defines three reductions by their order of operations: shift = fp32(S / n) with
// S the sum of the values in double over four lanes (lane i % 4, each a left-to-right fold,
// combined as (l0 + l1) + (l2 + l3)); norm = fp32(sqrt(R)) with R the same 4-lane fold of the
// squares of the centred values; and per bin the left-to-right double sum of its centred values.
// A parallel reduction adds in another order, and double addition is not associative, so
// reproducing those bits needs an argument, not luck:
//
//  * Sums of values (shift, bin sums). Every float x != 0 is an integer multiple of its unit in
//    the last place, 2^(E - 150) for biased exponent E (2^-149 for subnormals). Let g be the
//    smallest such exponent over the values and A = sum |x|. If A < 2^(g + 53), every partial
//    sum of any subset is a multiple of 2^g of magnitude below 2^(g + 53), hence a double: every
//    addition, in the CPU's order or any other, is exact, and all orders give the exact sum.
//    SumsAreExact() checks this on the computed A with a factor-2 margin, which covers the
//    rounding of A itself. Typical pseudo-gradients pass easily (the values of one tensor span a
//    few binades); when they do not, the kernels fall back to the CPU's sequential fold.
//  * The sum of squares is never exact (squares have 48 significant bits and pile up), but all
//    its terms are positive, so both the CPU's fold and the GPU's tree stay within a relative
//    error gamma(depth) = depth * 2^-53 of the exact sum. NormFromSquares() maps the whole
//    interval of sums the CPU could have computed through sqrt and the rounding to fp32; both
//    are monotonic, so when both ends give the same float, that float is the CPU's norm. The
//    interval is about 2^-35 wide relative to the norm for 2^18 values against fp32's 2^-24
//    spacing: the fallback (the CPU's own fold) runs for roughly one tensor in a few thousand.
//
// Every step after the reductions is elementwise fp32/fp64 with round-to-nearest (kernels/hd.h),
// so shift, scale, codes, lookup table and reconstructions equal the CPU codec's, bit for bit.
//
// Thread-safety: pure functions.
#ifndef LBCC_KERNELS_BINMEAN_STATS_H_
#define LBCC_KERNELS_BINMEAN_STATS_H_

#include <cstdint>

#include "kernels/hd.h"

namespace lbcc::kernels {

inline constexpr int32_t kNoExponent = 1 << 20;

// Partial statistics of a set of floats. Combine() merges two in any order.
struct SumStats {
  double sum = 0;      // sum of x
  double abs_sum = 0;  // sum of |x|
  double sq_sum = 0;   // sum of x * x (each square exact in double)
  int32_t min_exponent = kNoExponent;  // min over x != 0 of max(biased exponent, 1)
};

LBCC_HD void AddTerm(SumStats& s, float x) {
  const double d = x;
  s.sum = hd::DAdd(s.sum, d);
  s.abs_sum = hd::DAdd(s.abs_sum, d < 0 ? -d : d);
  s.sq_sum = hd::DAdd(s.sq_sum, hd::DMul(d, d));
  const uint32_t bits = hd::AbsBits(x);
  if (bits != 0) {
    int32_t e = static_cast<int32_t>(bits >> 23);
    if (e < 1) e = 1;
    if (e < s.min_exponent) s.min_exponent = e;
  }
}

LBCC_HD SumStats Combine(const SumStats& a, const SumStats& b) {
  SumStats s;
  s.sum = hd::DAdd(a.sum, b.sum);
  s.abs_sum = hd::DAdd(a.abs_sum, b.abs_sum);
  s.sq_sum = hd::DAdd(a.sq_sum, b.sq_sum);
  s.min_exponent = a.min_exponent < b.min_exponent ? a.min_exponent : b.min_exponent;
  return s;
}

// True when every partial sum of the values behind `s`, in any order, is exact in double (see
// the header comment), so s.sum is the exact sum and equals the CPU's fold.
LBCC_HD bool SumsAreExact(const SumStats& s) {
  if (s.min_exponent == kNoExponent) return true;  // all values are zero
  return s.abs_sum <= hd::Ldexp(1.0, s.min_exponent - 150 + 52);
}

// One lane of the CPU's LaneSum (codecs/value_coding.cc): the left-to-right double fold of
// x[lane], x[lane + 4], ... (of their squares when `squares`).
LBCC_HD double LaneFold(const float* x, int64_t n, int lane, bool squares) {
  double acc = 0;
  for (int64_t i = lane; i < n; i += 4) {
    const double t = x[i];
    acc = hd::DAdd(acc, squares ? hd::DMul(t, t) : t);
  }
  return acc;
}

LBCC_HD double CombineLanes(double l0, double l1, double l2, double l3) {
  return hd::DAdd(hd::DAdd(l0, l1), hd::DAdd(l2, l3));
}

// shift = fp32(sum / n), n > 0.
LBCC_HD float ShiftFromSum(double sum, int64_t n) {
  return hd::ToFloat(hd::DDiv(sum, static_cast<double>(n)));
}

// The CPU's norm = fp32(sqrt(R)) for R its 4-lane fold of the n squares, given `sq_sum`, the
// same squares summed so that no term went through more than `depth` roundings. Returns false
// when the interval of possible R straddles an fp32 rounding boundary (fold the lanes then).
LBCC_HD bool NormFromSquares(double sq_sum, int64_t n, int64_t depth, float* norm) {
  const double u = 1.1102230246251565e-16;  // 2^-53
  // CPU: ceil(n / 4) - 1 roundings inside a lane, 2 when the lanes combine.
  const double cpu_depth = static_cast<double>((n + 3) / 4 + 1);
  const double gamma_cpu = 1.01 * cpu_depth * u;
  const double gamma_gpu = 1.01 * static_cast<double>(depth) * u;
  const double delta = gamma_cpu + 2 * gamma_gpu + 16 * u;
  if (!(delta < 1e-3)) return false;
  const double lo = hd::DMul(sq_sum, 1.0 - delta);
  const double hi = hd::DMul(sq_sum, 1.0 + delta);
  const float a = hd::ToFloat(hd::DSqrt(lo));
  const float b = hd::ToFloat(hd::DSqrt(hi));
  if (hd::Bits(a) != hd::Bits(b)) return false;
  *norm = a;
  return true;
}

LBCC_HD float NormFromLanes(double l0, double l1, double l2, double l3) {
  return hd::ToFloat(hd::DSqrt(CombineLanes(l0, l1, l2, l3)));
}

// scale = (range * sigma) / bins, sigma = norm / fp32(sqrt(n - 1)) (0 for n <= 1); 1 when the
// scale is 0, NaN or infinite.
LBCC_HD float BinMeanScale(float norm, int64_t n, float range_sigmas, int bins) {
  const float sigma =
      n > 1 ? hd::Div(norm, hd::ToFloat(hd::DSqrt(static_cast<double>(n - 1)))) : 0.0f;
  float scale = hd::Div(hd::Mul(range_sigmas, sigma), static_cast<float>(bins));
  if (!(scale != 0.0f) || hd::AbsBits(scale) > hd::kMaxFiniteAbsBits) scale = 1.0f;
  return scale;
}

// The bin of a centred value: clamp(round_half_even(c / scale + bins / 2), 0, bins - 1).
LBCC_HD uint8_t BinMeanCode(float c, float scale, int bins) {
  const float t = hd::Add(hd::Div(c, scale), static_cast<float>(bins / 2));
  const float q =
      hd::MinF(hd::MaxF(hd::RoundHalfEvenF(t), 0.0f), static_cast<float>(bins - 1));
  return static_cast<uint8_t>(q);
}

// Partial statistics of one bin.
struct BinStats {
  double sum = 0;
  double abs_sum = 0;
  int32_t min_exponent = kNoExponent;
  uint32_t count = 0;
};

LBCC_HD void AddToBin(BinStats& s, float c) {
  const double d = c;
  s.sum = hd::DAdd(s.sum, d);
  s.abs_sum = hd::DAdd(s.abs_sum, d < 0 ? -d : d);
  const uint32_t bits = hd::AbsBits(c);
  if (bits != 0) {
    int32_t e = static_cast<int32_t>(bits >> 23);
    if (e < 1) e = 1;
    if (e < s.min_exponent) s.min_exponent = e;
  }
  ++s.count;
}

LBCC_HD BinStats Combine(const BinStats& a, const BinStats& b) {
  BinStats s;
  s.sum = hd::DAdd(a.sum, b.sum);
  s.abs_sum = hd::DAdd(a.abs_sum, b.abs_sum);
  s.min_exponent = a.min_exponent < b.min_exponent ? a.min_exponent : b.min_exponent;
  s.count = a.count + b.count;
  return s;
}

LBCC_HD bool BinSumIsExact(const BinStats& s) {
  if (s.min_exponent == kNoExponent) return true;
  return s.abs_sum <= hd::Ldexp(1.0, s.min_exponent - 150 + 52);
}

// lookup = fp32(sum / count), 0 for an empty bin.
LBCC_HD float BinLookup(double sum, uint32_t count) {
  return count > 0 ? hd::ToFloat(hd::DDiv(sum, static_cast<double>(count))) : 0.0f;
}

// The CPU's sum of bin `bin`: the left-to-right double fold of the centred values coded `bin`.
LBCC_HD double BinFold(const float* centered, const uint8_t* codes, int64_t n, int bin) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (codes[i] == bin) acc = hd::DAdd(acc, static_cast<double>(centered[i]));
  }
  return acc;
}

// Fallbacks taken by one encode (EncodeSummary::fallbacks).
inline constexpr uint32_t kFallbackShift = 1;  // the shift's sum was folded sequentially
inline constexpr uint32_t kFallbackNorm = 2;   // ... the sum of squares
inline constexpr uint32_t kFallbackBins = 4;   // ... at least one bin's sum

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_BINMEAN_STATS_H_
