// TopK-EF encode, step 1 on the GPU: one thread block per chunk fuses the error-feedback
// update with the chunk's top-k selection (codecs/topk_ef.h, steps 1 and 2).
//
// Per chunk c (geometry of codecs/chunking.h):
//   e' = (beta * e) + (lr * delta) for the chunk's positions, written to `next`;
//   the k entries of largest |e'| (ties to the lower local position, exactly the CPU codec's
//   rule) are written in ascending local order to sel_local / sel_value [c * k, c * k + k);
//   the adaptive index coding's length of this chunk for sub-blocks of 64 and of 128 positions
//   goes to bits6[c] / bits7[c];
//   a non-finite e' lowers *bad_chunk to c.
//
// The selection finds T, the k-th largest |e'| bits (an order-preserving key for floats; bit 31
// is 0), and how many entries equal to T to take. A first radix pass histograms the key's top 12
// bits (exponent + 4 mantissa bits: 4096 bins, 16 per thread) and locates the bin holding T. On
// Gaussian-like data that bin holds a few dozen entries, so instead of more passes its keys
// are compacted into shared memory (at most kSelectCandidates) and each candidate's rank
// among them (key descending, then slot) is counted directly: the candidate of rank
// `remaining` - 1 is T. A bin holding more entries (concentrated or equal values) takes another
// 12-bit pass, then the last 7 bits, which pin T exactly. Either way T and the count to take
// are those of a sort of the chunk's keys: the compaction's order (atomic slots) changes which
// candidate reports T, never T. A block-wide scan then gives every selected entry its slot.
// Thread t holds the 16 consecutive local positions [16 t, 16 t + 16), so thread order is local
// order and one scan places the entries in ascending order, ties to the lower position. The
// result is a pure function of the values: identical to the CPU codec's selection, bit for bit.
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
// Radix passes over the key's 31 bits: 12 + 12 + 7.
inline constexpr int kSelectPasses = 3;
inline constexpr int kSelectBins = 4096;
inline constexpr int kSelectBinsPerThread = kSelectBins / kSelectThreads;  // 16
// The largest bin finished by ranking its entries instead of another pass.
inline constexpr int kSelectCandidates = kSelectThreads;

LBCC_HD constexpr int SelectShift(int pass) { return pass == 0 ? 19 : pass == 1 ? 7 : 0; }
LBCC_HD constexpr uint32_t SelectWidth(int pass) { return pass == 2 ? 0x7Fu : 0xFFFu; }

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

// The radix select after `pass` passes: entries whose key matches `prefix` on `mask` (`count`
// of them) hold T, the `remaining`-th largest among them.
struct SelectState {
  uint32_t prefix;
  uint32_t mask;
  uint32_t remaining;
  uint32_t count;
};

struct SelectShared {
  alignas(16) uint32_t hist[kSelectBins];  // thread t's bins: [16 t, 16 t + 16)
  // Keys of T's bin, then 4 zeros (a candidate never counts them: 0 is not above any key and
  // they sit after every candidate).
  alignas(16) uint32_t cand[kSelectCandidates + 4];
  uint32_t part[kSelectThreads];  // per thread: its bins' total
  // Suffix sums of part; later the exclusive scan of (entries > T) << 16 | (entries == T).
  uint32_t scan[kSelectThreads];
  alignas(16) uint32_t part6[64];  // index bits per sub-block of 64 and of 128 positions
  alignas(16) uint32_t part7[32];
  SelectState state[kSelectPasses + 1];  // state[p]: after p passes (each written once)
  uint32_t cand_count;
  uint32_t thr;   // T
  uint32_t need;  // entries equal to T to take
};

struct SelectLocal {
  float v[kSelectPerThread];
};

// Thread t's 16 bins as 4 groups of 4 words. The device reads them with 128-bit accesses, the
// groups in an order rotated by t / 2, so the 8 threads of each access phase hit distinct banks.
LBCC_HD uint32_t SumOwnBins(const uint32_t* hist, int t) {
  const uint32_t* mine = hist + kSelectBinsPerThread * t;
  uint32_t s = 0;
#if defined(__CUDA_ARCH__)
LBCC_UNROLL
  for (int q = 0; q < 4; ++q) {
    const uint4 v = reinterpret_cast<const uint4*>(mine)[(q + (t >> 1)) & 3];
    s += v.x + v.y + v.z + v.w;
  }
#else
  for (int i = 0; i < kSelectBinsPerThread; ++i) s += mine[i];
#endif
  return s;
}

LBCC_HD void ClearOwnBins(uint32_t* hist, int t) {
  uint32_t* mine = hist + kSelectBinsPerThread * t;
#if defined(__CUDA_ARCH__)
LBCC_UNROLL
  for (int q = 0; q < 4; ++q) {
    reinterpret_cast<uint4*>(mine)[(q + (t >> 1)) & 3] = make_uint4(0, 0, 0, 0);
  }
#else
  for (int i = 0; i < kSelectBinsPerThread; ++i) mine[i] = 0;
#endif
}

// Runs the chunk `c` on block `b` (kSelectThreads threads).
LBCC_BLOCK_TEMPLATE
template <typename Block>
LBCC_HD void SelectChunk(Block& b, const SelectArgs& a, int64_t c) {
  SelectShared& sh = b.shared();
  const Geometry& g = a.g;
  const int64_t n = g.chunk_len;
  const int64_t k = a.k;
  const int64_t corner = ChunkCorner(g, c);
  const bool take_all = k >= n;

  // EF update and load.
  b.Phase([&](int t, SelectLocal& mine) {
    if (t == 0) {
      sh.state[0] = SelectState{0, 0, static_cast<uint32_t>(k), static_cast<uint32_t>(n)};
      sh.cand_count = 0;
      sh.thr = 0;
      sh.need = 0;
    }
    if (!take_all) ClearOwnBins(sh.hist, t);
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
          bad |= hd::AbsBits(rv[j]) > hd::kMaxFiniteAbsBits;
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
          bad |= hd::AbsBits(v) > hd::kMaxFiniteAbsBits;
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

  // T, the k-th largest key (see the header comment).
  if (!take_all) {
    for (int pass = 0; pass < kSelectPasses; ++pass) {
      const int shift = SelectShift(pass);
      const uint32_t width = SelectWidth(pass);
      const bool last = pass == kSelectPasses - 1;
      b.Phase([&](int t, SelectLocal& mine) {
        const SelectState s = sh.state[pass];
        const int64_t first = static_cast<int64_t>(t) * kSelectPerThread;
LBCC_UNROLL
        for (int i = 0; i < kSelectPerThread; ++i) {
          const uint32_t key = hd::AbsBits(mine.v[i]);
          b.CountDigit(sh.hist, (key >> shift) & width,
                       first + i < n && (key & s.mask) == s.prefix);
        }
      });
      b.InclusiveSuffixSumOf(
          [&](int t, SelectLocal&) {
            const uint32_t total = SumOwnBins(sh.hist, t);
            sh.part[t] = total;
            return total;
          },
          sh.scan);
      b.Phase([&](int t, SelectLocal&) {
        // Exactly one thread has scan(t + 1) < remaining <= scan(t); it walks its bins down.
        const SelectState s = sh.state[pass];
        const uint32_t incl = sh.scan[t], excl = incl - sh.part[t];
        if (excl < s.remaining && incl >= s.remaining) {
          const uint32_t* mine = sh.hist + kSelectBinsPerThread * t;
          uint32_t above = excl, digit = 0, count = 0, rem = 0;
          bool found = false;
          // Four words at a time, from the top (few registers: the values stay live).
LBCC_NO_UNROLL
          for (int q = kSelectBinsPerThread / 4 - 1; q >= 0; --q) {
            uint32_t h[4];
#if defined(__CUDA_ARCH__)
            const uint4 v = reinterpret_cast<const uint4*>(mine)[q];
            h[0] = v.x; h[1] = v.y; h[2] = v.z; h[3] = v.w;
#else
            for (int u = 0; u < 4; ++u) h[u] = mine[4 * q + u];
#endif
LBCC_UNROLL
            for (int u = 3; u >= 0; --u) {
              if (!found && above + h[u] >= s.remaining) {
                found = true;
                digit = static_cast<uint32_t>(kSelectBinsPerThread * t + 4 * q + u);
                count = h[u];
                rem = s.remaining - above;
              }
              above += h[u];
            }
          }
          const SelectState next{s.prefix | (digit << shift), s.mask | (width << shift), rem,
                                 count};
          sh.state[pass + 1] = next;
          if (last) {
            sh.thr = next.prefix;
            sh.need = rem;
          } else if (count <= static_cast<uint32_t>(kSelectCandidates)) {
            for (int j = 0; j < 4; ++j) sh.cand[count + j] = 0;
          }
        }
        // The next pass (if any) counts into cleared bins; the next chunk finds them cleared.
        ClearOwnBins(sh.hist, t);
      });
      if (last || sh.state[pass + 1].count > static_cast<uint32_t>(kSelectCandidates)) continue;

      // T's bin is small: compact its keys and rank them.
      b.Phase([&](int t, SelectLocal& mine) {
        const SelectState s = sh.state[pass + 1];
        const int64_t first = static_cast<int64_t>(t) * kSelectPerThread;
LBCC_UNROLL
        for (int i = 0; i < kSelectPerThread; ++i) {
          const uint32_t key = hd::AbsBits(mine.v[i]);
          if (first + i < n && (key & s.mask) == s.prefix) {
            sh.cand[hd::AtomicFetchAddU32(&sh.cand_count, 1)] = key;
          }
        }
      });
      b.Phase([&](int t, SelectLocal&) {
        const SelectState s = sh.state[pass + 1];
        const uint32_t m = s.count;
        if (static_cast<uint32_t>(t) < m) {
          // Rank of candidate t in (key descending, slot ascending) order.
          const uint32_t key = sh.cand[t];
          uint32_t gt = 0, eq_before = 0;
          for (uint32_t j = 0; j < m; j += 4) {
            uint32_t o[4];
#if defined(__CUDA_ARCH__)
            const uint4 q = *reinterpret_cast<const uint4*>(sh.cand + j);
            o[0] = q.x; o[1] = q.y; o[2] = q.z; o[3] = q.w;
#else
            for (int u = 0; u < 4; ++u) o[u] = sh.cand[j + u];
#endif
LBCC_UNROLL
            for (uint32_t u = 0; u < 4; ++u) {
              gt += o[u] > key ? 1u : 0u;
              eq_before += (o[u] == key && j + u < static_cast<uint32_t>(t)) ? 1u : 0u;
            }
          }
          if (gt + eq_before + 1 == s.remaining) {
            sh.thr = key;
            sh.need = s.remaining - gt;
          }
        }
      });
      break;
    }
  }

  // Slots: entries > T first-come in local order, plus the first `need` entries == T.
  b.ExclusiveSumOf(
      [&](int t, SelectLocal& mine) {
        const uint32_t thr = sh.thr;
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
        return (gt << 16) | eq;
      },
      sh.scan);
  b.Phase([&](int t, SelectLocal& mine) {
    const uint32_t thr = sh.thr, need = sh.need;
    uint32_t gt_before = sh.scan[t] >> 16, eq_before = sh.scan[t] & 0xFFFFu;
    const int64_t first = static_cast<int64_t>(t) * kSelectPerThread;
LBCC_UNROLL
    for (int i = 0; i < kSelectPerThread; ++i) {
      if (first + i < n) {
        const uint32_t key = hd::AbsBits(mine.v[i]);
        const bool gt = take_all || key > thr;
        const bool eq = !take_all && key == thr;
        if (gt || (eq && eq_before < need)) {
          const uint32_t slot = gt_before + (eq_before < need ? eq_before : need);
          a.sel_local[c * k + slot] = static_cast<uint16_t>(first + i);
          a.sel_value[c * k + slot] = mine.v[i];
        }
        gt_before += gt ? 1u : 0u;
        eq_before += eq ? 1u : 0u;
      }
    }

    // The chunk's adaptive index length for sub-blocks of 64 (b = 6) and 128 (b = 7)
    // positions: a sub-block's count is the difference of the slots taken before its first
    // and after its last thread (4 and 8 threads of 16 positions).
    const auto taken_before = [&](int u) -> uint32_t {
      if (u >= kSelectThreads) return static_cast<uint32_t>(take_all ? n : k);
      const uint32_t v = sh.scan[u], eqb = v & 0xFFFFu;
      return (v >> 16) + (eqb < need ? eqb : need);
    };
    if (t < 64) {
      uint32_t bits = 0;
      if (64 * static_cast<int64_t>(t) < n) {
        const int64_t s = n - 64 * static_cast<int64_t>(t) < 64 ? n - 64 * t : 64;
        bits = SubBlockBits(taken_before(4 * t + 4) - taken_before(4 * t),
                            static_cast<uint32_t>(s), 6, a.rice6);
      }
      sh.part6[t] = bits;
    } else if (t < 96) {
      const int j = t - 64;
      uint32_t bits = 0;
      if (128 * static_cast<int64_t>(j) < n) {
        const int64_t s = n - 128 * static_cast<int64_t>(j) < 128 ? n - 128 * j : 128;
        bits = SubBlockBits(taken_before(8 * j + 8) - taken_before(8 * j),
                            static_cast<uint32_t>(s), 7, a.rice7);
      }
      sh.part7[j] = bits;
    }
  });
  b.Phase([&](int t, SelectLocal&) {
    if (t == 0) {
      uint32_t b6 = 0, b7 = 0;
LBCC_UNROLL
      for (int j = 0; j < 64; ++j) b6 += sh.part6[j];
LBCC_UNROLL
      for (int j = 0; j < 32; ++j) b7 += sh.part7[j];
      a.bits6[c] = b6;
      a.bits7[c] = b7;
    }
  });
}

}  // namespace lbcc::kernels

#endif  // LBCC_KERNELS_TOPK_SELECT_H_
