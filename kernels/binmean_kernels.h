// The bin-mean value coding's kernels (codecs/value_coding.h) as block-model code
// (kernels/block.h): the CUDA launchers and the emulated backend run these same functions, with
// the same grid, so host tests cover the reductions' decomposition, the fallbacks and the
// partial layouts. The arithmetic and its proofs: kernels/binmean_stats.h.
//
// Steps over the n selected values (a grid of BinMeanParts(n) blocks of 256 threads where a
// step is partial, one block where it finalizes, one block per bin for the lookup):
//   1. PartialStats(center = false): per block, statistics of its values
//   2. FinalizeStats(scale = false): shift (exact parallel sum, or 4 threads fold the lanes)
//   3. PartialStats(center = true): centred values c = v - shift and their statistics
//   4. FinalizeStats(scale = true): norm (bracketed, or the lanes' fold) and scale
//   5. Codes<bins>: codes, and per block and bin the statistics of the bin's centred values
//   6. Lookup: one block per bin: its mean (exact parallel sum, or the CPU's fold)
//   7. Pack: code bytes and reconstructions lookup[code] + shift
//
// Thread-safety: pure functions over the caller's buffers.
#ifndef LBCC_KERNELS_BINMEAN_KERNELS_H_
#define LBCC_KERNELS_BINMEAN_KERNELS_H_

#include <cstdint>

#include "kernels/binmean_stats.h"
#include "kernels/hd.h"
#include "kernels/topk_encode.h"

namespace lbcc::kernels {

inline constexpr int kBinMeanThreads = 256;
// Partial statistics per reduction step (the grid of the partial steps).
inline constexpr int kMaxPartials = 256;

struct BinMeanArgs {
  int64_t n = 0;       // selected values, > 0
  int bits = 2;        // 2, 4 or 8
  float range_sigmas = 6;
  float* values = nullptr;   // in: the selected values; out: their reconstructions
  float* centered = nullptr; // scratch, n
  uint8_t* codes = nullptr;  // scratch, n
  uint8_t* section = nullptr;  // ceil(n * bits / 8) bytes
  EncodeSummary* summary = nullptr;  // shift, scale, lookup, table, fallbacks; reads bad_chunk
  SumStats* partials = nullptr;      // kMaxPartials
  BinStats* bin_partials = nullptr;  // kMaxPartials * 256
};

// Blocks of the partial steps: at least 2048 values each, at most kMaxPartials.
LBCC_HD int BinMeanParts(int64_t n) {
  int64_t parts = (n + 2047) / 2048;
  if (parts > kMaxPartials) parts = kMaxPartials;
  return parts < 1 ? 1 : static_cast<int>(parts);
}

// A bound on the roundings a square's contribution goes through on its way into the total: its
// thread's items, the block's combine of 256 threads, a finalizing thread's share of the
// partials, the final combine of 256 threads. The combines are trees of 8 levels (TreeCombine);
// the bound still counts 256 each, as for a chain: it only has to be an upper bound, and the
// CPU's own n / 4 roundings dominate the bracket anyway.
LBCC_HD int64_t BinMeanDepth(int64_t n, int parts) {
  const int64_t stride = static_cast<int64_t>(parts) * kBinMeanThreads;
  const int64_t per_thread = (n + stride - 1) / stride;
  const int64_t per_finalizer = (parts + kBinMeanThreads - 1) / kBinMeanThreads;
  return per_thread + kBinMeanThreads + per_finalizer + kBinMeanThreads + 8;
}

struct StatsShared {
  SumStats part[kBinMeanThreads];
  double lanes[4];
  int fallback;
};
struct StatsLocal {};

// part[0] = the Combine of part[0..kBinMeanThreads), as a tree: pairs at distance 128, 64, ...,
// 1, one phase each (8 roundings deep instead of a 255-long chain on one thread). Any order is
// fine for the statistics: sums, absolute sums and the exactness tests come out the same in
// every order, and the sum of squares only needs its depth bounded (binmean_stats.h).
LBCC_BLOCK_TEMPLATE
template <typename Block, typename Stats>
LBCC_HD void TreeCombine(Block& b, Stats* part) {
  for (int stride = kBinMeanThreads / 2; stride > 0; stride >>= 1) {
    b.Phase([&](int t, auto&) {
      if (t < stride) part[t] = Combine(part[t], part[t + stride]);
    });
  }
}

// Step 1 or 3, block `p` of `parts`.
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void PartialStatsBlock(Block& b, const BinMeanArgs& a, bool center, int p, int parts) {
  StatsShared& sh = b.shared();
  b.Phase([&](int t, StatsLocal&) {
    SumStats mine;
    const float shift = center ? a.summary->shift : 0.0f;
    const int64_t stride = static_cast<int64_t>(parts) * kBinMeanThreads;
    for (int64_t i = static_cast<int64_t>(p) * kBinMeanThreads + t; i < a.n; i += stride) {
      float x = a.values[i];
      if (center) {
        x = hd::Sub(x, shift);
        a.centered[i] = x;
      }
      AddTerm(mine, x);
    }
    sh.part[t] = mine;
  });
  TreeCombine(b, sh.part);
  b.Phase([&](int t, StatsLocal&) {
    if (t == 0) a.partials[p] = sh.part[0];
  });
}

// Step 2 (the shift) or 4 (the scale): one block.
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void FinalizeStatsBlock(Block& b, const BinMeanArgs& a, int parts, bool scale) {
  StatsShared& sh = b.shared();
  b.Phase([&](int t, StatsLocal&) {
    SumStats mine;
    for (int p = t; p < parts; p += kBinMeanThreads) mine = Combine(mine, a.partials[p]);
    sh.part[t] = mine;
  });
  TreeCombine(b, sh.part);
  b.Phase([&](int t, StatsLocal&) {
    if (t != 0) return;
    const SumStats total = sh.part[0];
    EncodeSummary& s = *a.summary;
    const bool bad = s.bad_chunk != INT32_MAX;  // garbage in: skip the slow path
    bool fallback;
    if (!scale) {
      fallback = !SumsAreExact(total) && !bad;
      if (!fallback) s.shift = ShiftFromSum(total.sum, a.n);
    } else {
      float norm = 0;
      const bool decided = NormFromSquares(total.sq_sum, a.n, BinMeanDepth(a.n, parts), &norm);
      fallback = !decided && !bad;
      if (!fallback) s.scale = BinMeanScale(norm, a.n, a.range_sigmas, 1 << a.bits);
    }
    sh.fallback = fallback ? 1 : 0;
  });
  if (sh.fallback == 0) return;
  // The CPU's own order: four sequential lanes, then (l0 + l1) + (l2 + l3).
  b.Phase([&](int t, StatsLocal&) {
    if (t < 4) sh.lanes[t] = LaneFold(scale ? a.centered : a.values, a.n, t, scale);
  });
  b.Phase([&](int t, StatsLocal&) {
    if (t != 0) return;
    EncodeSummary& s = *a.summary;
    if (!scale) {
      s.shift = ShiftFromSum(CombineLanes(sh.lanes[0], sh.lanes[1], sh.lanes[2], sh.lanes[3]), a.n);
      s.fallbacks |= kFallbackShift;
    } else {
      const float norm = NormFromLanes(sh.lanes[0], sh.lanes[1], sh.lanes[2], sh.lanes[3]);
      s.scale = BinMeanScale(norm, a.n, a.range_sigmas, 1 << a.bits);
      s.fallbacks |= kFallbackNorm;
    }
  });
}

struct CodesShared {
  double sum[256];
  double abs_sum[256];
  int32_t min_exponent[256];
  uint32_t count[256];
  BinStats few[kBinMeanThreads][4];  // 4 bins: every thread's statistics
  BinStats groups[16][4];
};
struct CodesLocal {};

// Step 5, block `p` of `parts`. With 4 bins the hot bins would serialize shared atomics, so each
// thread keeps its own and the block combines them in two levels; 16 and 256 bins spread the
// atomics. The order of the additions does not matter (binmean_stats.h).
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void CodesBlock(Block& b, const BinMeanArgs& a, int p, int parts) {
  CodesShared& sh = b.shared();
  const int bins = 1 << a.bits;
  b.Phase([&](int t, CodesLocal&) {
    for (int bin = t; bin < bins; bin += kBinMeanThreads) {
      sh.sum[bin] = 0;
      sh.abs_sum[bin] = 0;
      sh.min_exponent[bin] = kNoExponent;
      sh.count[bin] = 0;
    }
  });
  b.Phase([&](int t, CodesLocal&) {
    const float scale = a.summary->scale;
    const int64_t stride = static_cast<int64_t>(parts) * kBinMeanThreads;
    BinStats mine[4];
    for (int64_t i = static_cast<int64_t>(p) * kBinMeanThreads + t; i < a.n; i += stride) {
      const float c = a.centered[i];
      const uint8_t code = BinMeanCode(c, scale, bins);
      a.codes[i] = code;
      if (bins == 4) {
LBCC_UNROLL
        for (int bin = 0; bin < 4; ++bin) {
          if (code == bin) AddToBin(mine[bin], c);
        }
      } else {
        const double d = c;
        hd::AtomicAddF64(&sh.sum[code], d);
        hd::AtomicAddF64(&sh.abs_sum[code], d < 0 ? -d : d);
        const uint32_t bits = hd::AbsBits(c);
        if (bits != 0) {
          const int32_t e = static_cast<int32_t>(bits >> 23);
          hd::AtomicMinI32(&sh.min_exponent[code], e < 1 ? 1 : e);
        }
        hd::AtomicAddU32(&sh.count[code], 1);
      }
    }
    if (bins == 4) {
LBCC_UNROLL
      for (int bin = 0; bin < 4; ++bin) sh.few[t][bin] = mine[bin];
    }
  });
  if (bins == 4) {
    b.Phase([&](int t, CodesLocal&) {
      if (t >= 64) return;
      const int bin = t & 3, group = t >> 2;
      BinStats s = sh.few[group * 16][bin];
      for (int q = 1; q < 16; ++q) s = Combine(s, sh.few[group * 16 + q][bin]);
      sh.groups[group][bin] = s;
    });
    b.Phase([&](int t, CodesLocal&) {
      if (t >= 4) return;
      BinStats s = sh.groups[0][t];
      for (int g = 1; g < 16; ++g) s = Combine(s, sh.groups[g][t]);
      sh.sum[t] = s.sum;
      sh.abs_sum[t] = s.abs_sum;
      sh.min_exponent[t] = s.min_exponent;
      sh.count[t] = s.count;
    });
  }
  b.Phase([&](int t, CodesLocal&) {
    for (int bin = t; bin < bins; bin += kBinMeanThreads) {
      BinStats& out = a.bin_partials[static_cast<int64_t>(p) * 256 + bin];
      out.sum = sh.sum[bin];
      out.abs_sum = sh.abs_sum[bin];
      out.min_exponent = sh.min_exponent[bin];
      out.count = sh.count[bin];
    }
  });
}

struct LookupShared {
  BinStats part[kBinMeanThreads];
};
struct LookupLocal {};

// Step 6: block `bin` (a grid of one block per bin). Thread t combines the partials t, t + 256,
// ... of the bin (parts <= kMaxPartials = 256: one load each), a tree combines the threads, and
// thread 0 sets the bin's lookup. The order does not change the result: with sum |x| within
// BinSumIsExact's bound every partial sum is exact, so the absolute sum, the test and the sum
// come out the same in any order; outside it the sum is refolded in the CPU's order.
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void LookupBlock(Block& b, const BinMeanArgs& a, int parts, int bin) {
  LookupShared& sh = b.shared();
  b.Phase([&](int t, LookupLocal&) {
    BinStats mine;
    for (int p = t; p < parts; p += kBinMeanThreads) {
      mine = Combine(mine, a.bin_partials[static_cast<int64_t>(p) * 256 + bin]);
    }
    sh.part[t] = mine;
  });
  TreeCombine(b, sh.part);
  b.Phase([&](int t, LookupLocal&) {
    if (t != 0) return;
    EncodeSummary& s = *a.summary;
    const bool bad = s.bad_chunk != INT32_MAX;
    const BinStats total = sh.part[0];
    double sum = total.sum;
    if (!BinSumIsExact(total) && !bad) {
      sum = BinFold(a.centered, a.codes, a.n, bin);
      hd::AtomicOrU32(&s.fallbacks, kFallbackBins);
    }
    s.lookup[bin] = BinLookup(sum, total.count);
    s.table[bin] = hd::Add(s.lookup[bin], s.shift);
  });
}

struct PackShared {
  float table[256];
};
struct PackLocal {};

// Step 7, block `p` of a grid of `blocks` (over the section's bytes).
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void PackBlock(Block& b, const BinMeanArgs& a, int64_t p, int64_t blocks) {
  PackShared& sh = b.shared();
  b.Phase([&](int t, PackLocal&) {
    if (t < (1 << a.bits)) sh.table[t] = a.summary->table[t];
  });
  b.Phase([&](int t, PackLocal&) {
    const int64_t bytes = (a.n * a.bits + 7) / 8;
    for (int64_t j = p * kBinMeanThreads + t; j < bytes; j += blocks * kBinMeanThreads) {
      PackBinMeanByte(a.codes, a.n, a.bits, sh.table, j, a.section, a.values);
    }
  });
}

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_BINMEAN_KERNELS_H_
