// The subspace codec's elementwise work on the GPU (codecs/subspace_codec.h); the products
// U^T h and U c run in cuBLAS (Backend::Gemm).
//
// Forward encode: all = h U (every component at once) -> subtract (T U)[y] -> per mixture block
// the component with the most energy (fp32 sum of squares per token, double per block, ties to
// the lowest index: the CPU's rule) -> that component's coefficients -> quantize.
// Decode: dequantize -> out = T[y] (forward with a table) -> out += c U^T.
// Quantizers: fp32, bf16 / fp16 (round to nearest even), int8 with one absmax scale per run of
// int8_block coefficients of a token (scale = absmax / 127, q = rint(x * (127 / absmax)), NaN
// sent as 0): the CPU codec's operations.
//
// Not bit-identical to the CPU codec: cuBLAS and OpenBLAS sum the products in different orders
// (and use FMA), so coefficients differ in the last bits (|error| <= about d * 2^-24 * |U^T| |h|
// per coefficient; a mixture's choice can differ where two components' energies tie to that
// precision). Everything after the product is the CPU's arithmetic, and the payload format is
// identical.
//
// Thread-safety: pure functions over the caller's buffers.
#ifndef LBCC_KERNELS_SUBSPACE_KERNELS_H_
#define LBCC_KERNELS_SUBSPACE_KERNELS_H_

#include <cstdint>

#include "kernels/hd.h"

namespace lbcc::kernels {

// Coefficient dtypes (base/dtype.h wire ids).
inline constexpr int kCoefF32 = 1;
inline constexpr int kCoefF16 = 2;
inline constexpr int kCoefBf16 = 3;
inline constexpr int kCoefI8 = 4;

struct SubspaceForwardArgs {
  int64_t tokens = 0;
  int64_t k = 0;
  int64_t components = 1;       // M
  int64_t mixture_block = 0;    // tokens per selector (M > 1)
  const int32_t* ids = nullptr;              // nullptr: no table to subtract
  const float* projected_table = nullptr;    // (T U) [V x M k]
  float* all = nullptr;         // [tokens x M k]: h U in, minus (T U)[y] out
  float* coef = nullptr;        // [tokens x k] (M > 1): the chosen component's coefficients
  uint8_t* selectors = nullptr; // ceil(tokens / mixture_block) (M > 1)
};

// all[t][j] -= (T U)[ids[t]][j], element e = t * ld + j.
LBCC_HD void SubtractProjectedTable(const SubspaceForwardArgs& a, int64_t e) {
  const int64_t ld = a.components * a.k;
  const int64_t t = e / ld, j = e - t * ld;
  a.all[e] = hd::Sub(a.all[e], a.projected_table[static_cast<int64_t>(a.ids[t]) * ld + j]);
}

// The component of mixture block `blk` (codecs SubspaceCodec::ProjectForward).
LBCC_HD uint8_t ChooseComponent(const SubspaceForwardArgs& a, int64_t blk) {
  const int64_t ld = a.components * a.k;
  const int64_t t0 = blk * a.mixture_block;
  const int64_t t1 = t0 + a.mixture_block < a.tokens ? t0 + a.mixture_block : a.tokens;
  int64_t best = 0;
  double best_energy = 0;
  for (int64_t c = 0; c < a.components; ++c) {
    double energy = 0;
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = a.all + t * ld + c * a.k;
      float s = 0;
      for (int64_t j = 0; j < a.k; ++j) s = hd::Add(s, hd::Mul(row[j], row[j]));
      energy = hd::DAdd(energy, static_cast<double>(s));
    }
    if (c == 0 || energy > best_energy) {
      best = c;
      best_energy = energy;
    }
  }
  return static_cast<uint8_t>(best);
}

// coef[t][j] = all[t][selector(t) * k + j], element e = t * k + j.
LBCC_HD void GatherComponent(const SubspaceForwardArgs& a, int64_t e) {
  const int64_t t = e / a.k, j = e - t * a.k;
  const int64_t c = a.selectors[t / a.mixture_block];
  a.coef[e] = a.all[t * a.components * a.k + c * a.k + j];
}

struct SubspaceQuantizeArgs {
  int64_t tokens = 0;
  int64_t k = 0;
  int dtype = kCoefBf16;
  int64_t int8_block = 0;
  const float* coef = nullptr;  // [tokens x k]
  uint8_t* scales = nullptr;    // int8: f32 [tokens x ceil(k / int8_block)]
  uint8_t* out = nullptr;       // coefficients in the dtype
};

// fp32 / 16-bit coefficient e.
LBCC_HD void QuantizeCoefficient(const SubspaceQuantizeArgs& a, int64_t e) {
  const float x = a.coef[e];
  if (a.dtype == kCoefF32) {
    hd::StoreF32(a.out + 4 * e, x);
  } else {
    hd::StoreU16(a.out + 2 * e, a.dtype == kCoefBf16 ? hd::F32ToBf16(x) : hd::F32ToF16(x));
  }
}

// int8 run r of all tokens' runs: token r / runs_per_token, run r % runs_per_token.
LBCC_HD void QuantizeInt8Run(const SubspaceQuantizeArgs& a, int64_t r) {
  const int64_t per_token = (a.k + a.int8_block - 1) / a.int8_block;
  const int64_t t = r / per_token, j0 = (r - t * per_token) * a.int8_block;
  const int64_t j1 = j0 + a.int8_block < a.k ? j0 + a.int8_block : a.k;
  const float* row = a.coef + t * a.k;
  float absmax = 0;  // NaN coefficients are ignored here and sent as 0
  for (int64_t j = j0; j < j1; ++j) absmax = hd::MaxF(absmax, hd::Float(hd::AbsBits(row[j])));
  const float scale = hd::Div(absmax, 127.0f);
  const float inv = absmax > 0 ? hd::Div(127.0f, absmax) : 0.0f;
  hd::StoreF32(a.scales + 4 * r, scale);
  for (int64_t j = j0; j < j1; ++j) {
#if defined(__CUDA_ARCH__)
    float q = rintf(hd::Mul(row[j], inv));
#else
    float q = std::nearbyint(hd::Mul(row[j], inv));
#endif
    if (q != q) q = 0;
    q = hd::MinF(127.0f, hd::MaxF(-127.0f, q));
    a.out[t * a.k + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
  }
}

struct SubspaceDequantizeArgs {
  int64_t tokens = 0;
  int64_t k = 0;
  int dtype = kCoefBf16;
  int64_t int8_block = 0;
  const uint8_t* scales = nullptr;  // int8
  const uint8_t* in = nullptr;      // coefficients in the dtype
  float* coef = nullptr;            // [tokens x k]
};

LBCC_HD void DequantizeCoefficient(const SubspaceDequantizeArgs& a, int64_t e) {
  switch (a.dtype) {
    case kCoefF32:
      a.coef[e] = hd::LoadF32(a.in + 4 * e);
      return;
    case kCoefBf16:
      a.coef[e] = hd::Bf16ToF32(hd::LoadU16(a.in + 2 * e));
      return;
    case kCoefF16:
      a.coef[e] = hd::F16ToF32(hd::LoadU16(a.in + 2 * e));
      return;
    default: {
      const int64_t t = e / a.k, j = e - t * a.k;
      const int64_t per_token = (a.k + a.int8_block - 1) / a.int8_block;
      const float scale = hd::LoadF32(a.scales + 4 * (t * per_token + j / a.int8_block));
      a.coef[e] = hd::Mul(static_cast<float>(static_cast<int8_t>(a.in[e])), scale);
    }
  }
}

struct SubspaceGatherArgs {
  int64_t tokens = 0;
  int64_t d = 0;
  const int32_t* ids = nullptr;
  const float* table = nullptr;  // T [V x d]
  float* out = nullptr;          // [tokens x d]
};

// out[t][i] = T[ids[t]][i], element e = t * d + i.
LBCC_HD void GatherTableElement(const SubspaceGatherArgs& a, int64_t e) {
  const int64_t t = e / a.d, i = e - t * a.d;
  a.out[e] = a.table[static_cast<int64_t>(a.ids[t]) * a.d + i];
}

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_SUBSPACE_KERNELS_H_
