// TopK-EF encode, step 1 on the GPU: one thread block per chunk fuses the error-feedback
// update with the chunk's top-k selection (codecs/topk_ef.h, steps 1 and 2).
//
// Per chunk c (geometry of codecs/chunking.h):
//   e' = (beta * e) + (lr * delta) for the chunk's positions, written to `next`;
//   the k entries of largest |e'| (ties to the lower local position, exactly the CPU codec's
//   rule) are written in ascending local order to sel_local / sel_value [c * k, c * k + k);
//   the adaptive index coding's length of this chunk for sub-blocks of 64 and of 128 positions
//   goes to bits6[c] / bits7[c];
//   a non-finite e', or one above 2^100 (codecs/topk_ef.h), lowers *bad_chunk to c.
//
// The selection is a radix select on the |e'| bits (order-preserving for finite floats): four
// passes (exponent, then 8 + 8 + 7 mantissa bits) find the k-th largest key T and how many
// entries equal to T are needed; a
// block-wide scan then gives every selected entry its slot. Thread t holds the 16 consecutive
// local positions [16 t, 16 t + 16), so thread order is local order and one scan places the
// entries in ascending order. The result is a pure function of the values: identical to the CPU
// codec's selection, bit for bit.
//
// Thread-safety: pure functions over the caller's buffers.
#ifndef LBCC_KERNELS_TOPK_SELECT_H_
#define LBCC_KERNELS_TOPK_SELECT_H_

#include <cstdint>

#include "kernels/hd.h"

namespace lbcc::kernels {

// codecs::ChunkGeometry, as kernels receive it.
struct Geometry {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t h = 0;
  int64_t w = 0;
  int64_t chunk_len = 0;
  int64_t chunks_x = 0;
  int64_t num_chunks = 0;
};

// Flat offset of chunk c's first element.
LBCC_HD int64_t ChunkCorner(const Geometry& g, int64_t c) {
  const int64_t y = c / g.chunks_x, x = c - y * g.chunks_x;
  return y * g.h * g.cols + x * g.w;
}

// Offset of local position l (< chunk_len <= 4096) from its chunk's corner. l and w fit in 32
// bits, so the division is a 32-bit one (a 64-bit division is a long subroutine on the GPU).
LBCC_HD int64_t LocalOffset(const Geometry& g, int64_t l) {
  const int32_t l32 = static_cast<int32_t>(l), w = static_cast<int32_t>(g.w);
  const int32_t r = l32 / w;
  return static_cast<int64_t>(r) * g.cols + (l32 - r * w);
}

// codecs/index_coding.cc: bits of one sub-block holding n of its s positions with sub-block
// log2 b and Rice parameter p.
LBCC_HD uint32_t SubBlockBits(uint32_t n, uint32_t s, int b, int p) {
  const uint32_t rice = (n >> p) + 1 + static_cast<uint32_t>(p);
  const uint32_t offsets = n * static_cast<uint32_t>(b);
  return rice + (s < offsets ? s : offsets);
}

inline constexpr int kSelectThreads = 256;
inline constexpr int kSelectPerThread = 16;  // 256 * 16 = 4096, the largest chunk

struct SelectArgs {
  Geometry g;
  int64_t k = 0;
  float beta = 0;
  float lr = 0;
  int rice6 = 0;  // Rice parameters of the adaptive coding (codecs::AdaptiveRice)
  int rice7 = 0;
  // Loads e and delta as float4 (w, cols and the pointers allow it: see CanLoadVec4).
  bool vec4 = false;
  const float* e = nullptr;
  const float* delta = nullptr;
  float* next = nullptr;
  uint16_t* sel_local = nullptr;
  float* sel_value = nullptr;
  uint32_t* bits6 = nullptr;
  uint32_t* bits7 = nullptr;
  int32_t* bad_chunk = nullptr;
};

LBCC_HD bool CanLoadVec4(const Geometry& g, const float* e, const float* delta, const float* next) {
  const auto aligned = [](const float* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
  };
  return g.w % 4 == 0 && g.cols % 4 == 0 && aligned(e) && aligned(delta) && aligned(next);
}

struct SelectShared {
  uint32_t hist[kSelectThreads];
  uint32_t suffix[kSelectThreads];
  uint32_t counts[kSelectThreads];  // per thread: (entries > T) << 16 | (entries == T)
  uint32_t before[kSelectThreads];  // exclusive scan of counts
  uint32_t sub_counts[64];          // selected entries per sub-block of 64 positions
  uint32_t part6[64];
  uint32_t part7[32];
  uint32_t prefix;       // radix select: the bits of T found so far
  uint32_t mask;         // ... and which bits those are
  uint32_t remaining;    // entries still to take among those matching prefix
  uint32_t next_prefix;
  uint32_t next_remaining;
};

struct SelectLocal {
  float v[kSelectPerThread];
};

// The steps of SelectChunk, each a sequence of phases of block `b` on chunk `c`.

// EF update and load: e' = beta * e + lr * delta into a.next and each thread's 16 values; a
// chunk with an entry above kMaxEncodableAbsBits (or NaN) lowers *a.bad_chunk to c.
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void SelectLoad(Block& b, const SelectArgs& a, int64_t c) {
  SelectShared& sh = b.shared();
  const Geometry& g = a.g;
  const int64_t n = g.chunk_len;
  const int64_t k = a.k;
  const int64_t corner = ChunkCorner(g, c);
  b.Phase([&](int t, SelectLocal& mine) {
    if (t == 0) {
      sh.prefix = 0;
      sh.mask = 0;
      sh.remaining = static_cast<uint32_t>(k);
    }
    if (t < 64) sh.sub_counts[t] = 0;
    const int64_t first = static_cast<int64_t>(t) * kSelectPerThread;
    bool bad = false;
    // Row and column of the thread's first position (32-bit: both below 4096).
    const int32_t w = static_cast<int32_t>(g.w);
    int32_t r = static_cast<int32_t>(first) / w;
    int32_t col = static_cast<int32_t>(first) - r * w;
    if (a.vec4 && first + kSelectPerThread <= n) {
      // Groups of 4 positions share a row and a 16-byte aligned address (w % 4 == 0).
LBCC_UNROLL
      for (int q = 0; q < kSelectPerThread / 4; ++q) {
        const int64_t off = corner + static_cast<int64_t>(r) * g.cols + col;
        col += 4;
        if (col == w) {
          col = 0;
          ++r;
        }
        float ev[4], dv[4], rv[4];
#if defined(__CUDA_ARCH__)
        const float4 e4 = *reinterpret_cast<const float4*>(a.e + off);
        const float4 d4 = *reinterpret_cast<const float4*>(a.delta + off);
        ev[0] = e4.x; ev[1] = e4.y; ev[2] = e4.z; ev[3] = e4.w;
        dv[0] = d4.x; dv[1] = d4.y; dv[2] = d4.z; dv[3] = d4.w;
#else
        for (int j = 0; j < 4; ++j) {
          ev[j] = a.e[off + j];
          dv[j] = a.delta[off + j];
        }
#endif
LBCC_UNROLL
        for (int j = 0; j < 4; ++j) {
          rv[j] = hd::Add(hd::Mul(a.beta, ev[j]), hd::Mul(a.lr, dv[j]));
          mine.v[4 * q + j] = rv[j];
          bad |= hd::AbsBits(rv[j]) > hd::kMaxEncodableAbsBits;
        }
#if defined(__CUDA_ARCH__)
        *reinterpret_cast<float4*>(a.next + off) = make_float4(rv[0], rv[1], rv[2], rv[3]);
#else
        for (int j = 0; j < 4; ++j) a.next[off + j] = rv[j];
#endif
      }
    } else {
LBCC_UNROLL
      for (int i = 0; i < kSelectPerThread; ++i) {
        float v = 0;
        if (first + i < n) {
          const int64_t off = corner + static_cast<int64_t>(r) * g.cols + col;
          v = hd::Add(hd::Mul(a.beta, a.e[off]), hd::Mul(a.lr, a.delta[off]));
          a.next[off] = v;
          bad |= hd::AbsBits(v) > hd::kMaxEncodableAbsBits;
          if (++col == w) {
            col = 0;
            ++r;
          }
        }
        mine.v[i] = v;
      }
    }
    if (bad) hd::AtomicMinI32(a.bad_chunk, static_cast<int32_t>(c));
  });

}

// sh.prefix = T, the k-th largest |e'| bits, and sh.remaining = how many entries equal to T
// the selection takes (radix select).
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void SelectThreshold(Block& b, const SelectArgs& a) {
  SelectShared& sh = b.shared();
  const int64_t n = a.g.chunk_len;
  // Radix select of T, the k-th largest |e'| bits (bit 31 is 0): the exponent first (bits
  // 30..23, so the first pass already separates the few large entries), then the mantissa in
  // 8, 8 and 7 bits.
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = pass == 3 ? 0 : 23 - 8 * pass;
    const uint32_t width = pass == 3 ? 0x7Fu : 0xFFu;
    b.Phase([&](int t, SelectLocal&) { sh.hist[t] = 0; });
    b.Phase([&](int t, SelectLocal& mine) {
      const uint32_t mask = sh.mask, prefix = sh.prefix;
      const int64_t first = static_cast<int64_t>(t) * kSelectPerThread;
LBCC_UNROLL
      for (int i = 0; i < kSelectPerThread; ++i) {
        const uint32_t key = hd::AbsBits(mine.v[i]);
        b.CountDigit(sh.hist, (key >> shift) & width, first + i < n && (key & mask) == prefix);
      }
    });
    b.InclusiveSuffixSum(sh.hist, sh.suffix);
    b.Phase([&](int t, SelectLocal&) {
      // Exactly one digit d has suffix(d + 1) < remaining <= suffix(d).
      const uint32_t incl = sh.suffix[t], excl = incl - sh.hist[t], rem = sh.remaining;
      if (excl < rem && incl >= rem) {
        sh.next_prefix = sh.prefix | (static_cast<uint32_t>(t) << shift);
        sh.next_remaining = rem - excl;
      }
    });
    b.Phase([&](int t, SelectLocal&) {
      if (t == 0) {
        sh.prefix = sh.next_prefix;
        sh.remaining = sh.next_remaining;
        sh.mask |= width << shift;
      }
    });
  }
}

// Writes the selection (local positions ascending, values) into slots c * k ... and counts
// the selected entries per sub-block of 64 positions.
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void SelectSlots(Block& b, const SelectArgs& a, int64_t c, bool take_all) {
  SelectShared& sh = b.shared();
  const int64_t n = a.g.chunk_len;
  const int64_t k = a.k;
  // Slots: entries > T first-come in local order, plus the first `remaining` entries == T.
  b.Phase([&](int t, SelectLocal& mine) {
    const uint32_t thr = sh.prefix;
    const int64_t first = static_cast<int64_t>(t) * kSelectPerThread;
    uint32_t gt = 0, eq = 0;
LBCC_UNROLL
    for (int i = 0; i < kSelectPerThread; ++i) {
      if (first + i < n) {
        const uint32_t key = hd::AbsBits(mine.v[i]);
        gt += (take_all || key > thr) ? 1u : 0u;
        eq += (!take_all && key == thr) ? 1u : 0u;
      }
    }
    sh.counts[t] = (gt << 16) | eq;
  });
  b.ExclusiveSum(sh.counts, sh.before);
  b.Phase([&](int t, SelectLocal& mine) {
    const uint32_t thr = sh.prefix, need = sh.remaining;
    uint32_t gt_before = sh.before[t] >> 16, eq_before = sh.before[t] & 0xFFFFu;
    const int64_t first = static_cast<int64_t>(t) * kSelectPerThread;
LBCC_UNROLL
    for (int i = 0; i < kSelectPerThread; ++i) {
      if (first + i < n) {
        const uint32_t key = hd::AbsBits(mine.v[i]);
        const bool gt = take_all || key > thr;
        const bool eq = !take_all && key == thr;
        if (gt || (eq && eq_before < need)) {
          const uint32_t slot = gt_before + (eq_before < need ? eq_before : need);
          const int64_t l = first + i;
          a.sel_local[c * k + slot] = static_cast<uint16_t>(l);
          a.sel_value[c * k + slot] = mine.v[i];
          hd::AtomicAddU32(&sh.sub_counts[l >> 6], 1);
        }
        gt_before += gt ? 1u : 0u;
        eq_before += eq ? 1u : 0u;
      }
    }
  });

}

// a.bits6[c], a.bits7[c]: the chunk's adaptive index length for b = 6 and b = 7.
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void SelectIndexBits(Block& b, const SelectArgs& a, int64_t c) {
  SelectShared& sh = b.shared();
  const int64_t n = a.g.chunk_len;
  b.Phase([&](int t, SelectLocal&) {
    const int64_t num6 = (n + 63) >> 6, num7 = (n + 127) >> 7;
    if (t < 64) {
      uint32_t bits = 0;
      if (t < num6) {
        const int64_t s = n - 64 * static_cast<int64_t>(t) < 64 ? n - 64 * t : 64;
        bits = SubBlockBits(sh.sub_counts[t], static_cast<uint32_t>(s), 6, a.rice6);
      }
      sh.part6[t] = bits;
    } else if (t < 96) {
      const int j = t - 64;
      uint32_t bits = 0;
      if (j < num7) {
        const uint32_t count =
            sh.sub_counts[2 * j] + (2 * j + 1 < num6 ? sh.sub_counts[2 * j + 1] : 0u);
        const int64_t s = n - 128 * static_cast<int64_t>(j) < 128 ? n - 128 * j : 128;
        bits = SubBlockBits(count, static_cast<uint32_t>(s), 7, a.rice7);
      }
      sh.part7[j] = bits;
    }
  });
  b.Phase([&](int t, SelectLocal&) {
    if (t == 0) {
      uint32_t b6 = 0, b7 = 0;
      for (int j = 0; j < 64; ++j) b6 += sh.part6[j];
      for (int j = 0; j < 32; ++j) b7 += sh.part7[j];
      a.bits6[c] = b6;
      a.bits7[c] = b7;
    }
  });
}

// Runs the chunk `c` on block `b` (kSelectThreads threads).
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void SelectChunk(Block& b, const SelectArgs& a, int64_t c) {
  const bool take_all = a.k >= a.g.chunk_len;
  SelectLoad(b, a, c);
  if (!take_all) SelectThreshold(b, a);
  SelectSlots(b, a, c, take_all);
  SelectIndexBits(b, a, c);
}

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_TOPK_SELECT_H_
