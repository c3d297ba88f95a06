#include "codecs/index_coding.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "codecs/bitstream.h"
#include "codecs/chunking.h"
#include "codecs/cpu_kernels.h"

namespace lbcc::codecs {
namespace {

constexpr int kMaxSubBlocks = 64;  // 4096 / 64

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt topk_ef payload: index section: ", what));
}

int64_t NumSubBlocks(int64_t chunk_len, int b) { return (chunk_len + (int64_t{1} << b) - 1) >> b; }

int64_t SubBlockSize(int64_t chunk_len, int b, int64_t j) {
  return std::min<int64_t>(int64_t{1} << b, chunk_len - (j << b));
}

// Counts per sub-block of 2^b positions for the k ascending indices of one chunk.
void CountSubBlocks(const uint16_t* local, int64_t k, int b, int64_t num_sub, int32_t* counts) {
  std::fill(counts, counts + num_sub, 0);
  for (int64_t i = 0; i < k; ++i) ++counts[local[i] >> b];
}

uint64_t SubBlockBits(int64_t n, int64_t s, int b, int p) {
  const uint64_t rice = static_cast<uint64_t>(n >> p) + 1 + p;
  const uint64_t offsets = static_cast<uint64_t>(n) * b;
  return rice + (static_cast<uint64_t>(s) < offsets ? static_cast<uint64_t>(s) : offsets);
}

}  // namespace

absl::string_view IndexCodingName(IndexCoding coding) {
  switch (coding) {
    case IndexCoding::kAuto:
      return "auto";
    case IndexCoding::kPacked12:
      return "packed12";
    case IndexCoding::kAdaptive:
      return "adaptive";
  }
  return "unknown";
}

int AdaptiveRice(const IndexLayout& layout, int sub_block_log2) {
  if (layout.chunk_len <= 0 || layout.k <= 0) return 0;
  const double lambda = static_cast<double>(layout.k) * static_cast<double>(1 << sub_block_log2) /
                        static_cast<double>(layout.chunk_len);
  const double p = RoundHalfEven(std::log2(lambda));
  return static_cast<int>(std::clamp(p, 0.0, static_cast<double>(sub_block_log2)));
}

uint64_t AdaptiveBits(absl::Span<const uint16_t> local, const IndexLayout& layout,
                      const AdaptiveParams& params) {
  const int b = params.sub_block_log2, p = params.rice;
  const int64_t num_sub = NumSubBlocks(layout.chunk_len, b);
  int32_t counts[kMaxSubBlocks];
  uint64_t bits = 0;
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    CountSubBlocks(local.data() + c * layout.k, layout.k, b, num_sub, counts);
    for (int64_t j = 0; j < num_sub; ++j) {
      bits += SubBlockBits(counts[j], SubBlockSize(layout.chunk_len, b, j), b, p);
    }
  }
  return bits;
}

AdaptiveChoice ChooseAdaptive(absl::Span<const uint16_t> local, const IndexLayout& layout) {
  const int p6 = AdaptiveRice(layout, 6), p7 = AdaptiveRice(layout, 7);
  const int64_t num6 = NumSubBlocks(layout.chunk_len, 6);
  const int64_t num7 = NumSubBlocks(layout.chunk_len, 7);
  int32_t counts[kMaxSubBlocks];
  uint64_t bits6 = 0, bits7 = 0;
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    CountSubBlocks(local.data() + c * layout.k, layout.k, 6, num6, counts);
    for (int64_t j = 0; j < num6; ++j) {
      bits6 += SubBlockBits(counts[j], SubBlockSize(layout.chunk_len, 6, j), 6, p6);
    }
    for (int64_t j = 0; j < num7; ++j) {
      const int64_t n = counts[2 * j] + (2 * j + 1 < num6 ? counts[2 * j + 1] : 0);
      bits7 += SubBlockBits(n, SubBlockSize(layout.chunk_len, 7, j), 7, p7);
    }
  }
  AdaptiveChoice choice;
  if (bits7 < bits6) {
    choice.params = {7, p7};
    choice.bits = bits7;
  } else {
    choice.params = {6, p6};
    choice.bits = bits6;
  }
  return choice;
}

size_t AdaptiveMaxBytes(const IndexLayout& layout) {
  // Per sub-block: a count of at most s needs (s >> p) + 1 + p bits, positions at most s bits.
  // Summed with p = 0 (the largest unary part) and the largest p (b) for the fixed part.
  const int64_t num_sub = NumSubBlocks(layout.chunk_len, 6);
  const uint64_t per_chunk = static_cast<uint64_t>(layout.chunk_len) * 2 + num_sub * (1 + 7);
  return static_cast<size_t>((per_chunk * layout.num_chunks + 7) / 8);
}

void EncodePacked12(absl::Span<const uint16_t> local, absl::Span<uint8_t> out) {
  const size_t n = local.size();
  LBCC_CHECK_EQ(out.size(), Packed12Bytes(static_cast<int64_t>(n)));
  uint8_t* o = out.data();
  size_t i = 0;
  for (; i + 1 < n; i += 2) {
    const uint32_t a = local[i], b = local[i + 1];
    LBCC_DCHECK(a < 4096 && b < 4096);
    const uint32_t word = a | (b << 12);
    o[0] = static_cast<uint8_t>(word);
    o[1] = static_cast<uint8_t>(word >> 8);
    o[2] = static_cast<uint8_t>(word >> 16);
    o += 3;
  }
  if (i < n) {
    o[0] = static_cast<uint8_t>(local[i]);
    o[1] = static_cast<uint8_t>(local[i] >> 8);
  }
}

absl::Status DecodePacked12(absl::Span<const uint8_t> bytes, const IndexLayout& layout,
                            absl::Span<uint16_t> out) {
  const int64_t count = layout.count();
  if (bytes.size() != Packed12Bytes(count)) {
    return Corrupt(absl::StrCat("packed12 section has ", bytes.size(), " bytes, ", count,
                                " indices need ", Packed12Bytes(count)));
  }
  LBCC_CHECK_GE(out.size(), static_cast<size_t>(count));
  if (count % 2 == 1 && (bytes[bytes.size() - 1] & 0xF0) != 0) {
    return Corrupt("non-zero padding after the last index");
  }
  // Unpack, then check every chunk at once (strictly ascending runs of k, all < chunk_len); only
  // a rejected section is scanned again, chunk by chunk, to name the chunk.
  const CpuKernels& kern = ActiveKernels();
  uint16_t* o = out.data();
  kern.unpack12(bytes.data(), count, o);
  const int64_t k = layout.k;
  if (count == 0 || kern.runs_ascending(o, layout.num_chunks, k, layout.chunk_len)) {
    return absl::OkStatus();
  }
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    const uint16_t* x = o + c * k;
    bool bad = x[k - 1] >= layout.chunk_len;
    for (int64_t j = 1; j < k; ++j) bad |= x[j] <= x[j - 1];
    if (bad) {
      return Corrupt(absl::StrCat("chunk ", c,
                                  ": indices not strictly ascending or outside the chunk of ",
                                  layout.chunk_len));
    }
  }
  return Corrupt("indices not strictly ascending");  // unreachable: the kernels agree
}

AdaptiveIndexEncoder::AdaptiveIndexEncoder(const IndexLayout& layout,
                                           const AdaptiveParams& params, absl::Span<uint8_t> out)
    : layout_(layout), params_(params), writer_(out) {}

void AdaptiveIndexEncoder::EncodeChunks(absl::Span<const uint16_t> local, int64_t end_chunk) {
  LBCC_CHECK_LE(end_chunk, layout_.num_chunks);
  LBCC_CHECK_GE(static_cast<int64_t>(local.size()), end_chunk * layout_.k);
  const int b = params_.sub_block_log2, p = params_.rice;
  const int64_t num_sub = NumSubBlocks(layout_.chunk_len, b);
  const uint32_t offset_mask = (1u << b) - 1;
  int32_t counts[kMaxSubBlocks];
  // A local copy: the writer's state stays in registers (stores through the output bytes could
  // alias a member's).
  BitWriter writer = writer_;
  // The most a chunk writes (AdaptiveMaxBytes' bound): with that much room its usual
  // sub-blocks go through PutUnchecked.
  const size_t chunk_bytes =
      static_cast<size_t>((layout_.chunk_len * 2 + num_sub * (1 + 7) + 7) / 8);
  const uint16_t* const last = local.data() + local.size();
  for (int64_t c = next_chunk_; c < end_chunk; ++c) {
    const uint16_t* idx = local.data() + c * layout_.k;
    CountSubBlocks(idx, layout_.k, b, num_sub, counts);
    const bool room = writer.HasRoom(chunk_bytes);
    for (int64_t j = 0; j < num_sub; ++j) {
      const int64_t n = counts[j];
      const int64_t s = SubBlockSize(layout_.chunk_len, b, j);
      const uint32_t q = static_cast<uint32_t>(n >> p);
      const uint32_t rem = static_cast<uint32_t>(n & ((1 << p) - 1));
      if (room && n <= 4 && s >= n * b && last - idx >= 4) {
        // The usual sub-block (at top_k 64 about one index): count and up to four offsets in
        // two puts; offsets past the n-th are read but masked off.
        writer.PutUnchecked(((1u << q) - 1u) | (rem << (q + 1)), static_cast<int>(q) + 1 + p);
        const uint32_t offsets = (idx[0] & offset_mask) | (idx[1] & offset_mask) << b |
                                 (idx[2] & offset_mask) << (2 * b) |
                                 (idx[3] & offset_mask) << (3 * b);
        const int bits = static_cast<int>(n) * b;
        writer.PutUnchecked(offsets & ((uint32_t{1} << bits) - 1), bits);
        idx += n;
        continue;
      }
      const uint32_t base = static_cast<uint32_t>(j << b);
      writer.PutUnary(q);
      writer.Put(rem, p);
      if (s < n * b) {
        // Bitmap of s <= 128 bits, written in 32-bit words.
        uint32_t words[4] = {0, 0, 0, 0};
        for (int64_t t = 0; t < n; ++t) {
          const uint32_t off = idx[t] - base;
          words[off >> 5] |= 1u << (off & 31);
        }
        for (int64_t bit = 0; bit < s; bit += 32) {
          writer.Put(words[bit >> 5], static_cast<int>(std::min<int64_t>(32, s - bit)));
        }
      } else {
        for (int64_t t = 0; t < n; ++t) writer.Put(idx[t] - base, b);
      }
      idx += n;
    }
  }
  writer_ = writer;
  next_chunk_ = std::max(next_chunk_, end_chunk);
}

size_t AdaptiveIndexEncoder::Finish() {
  LBCC_CHECK_EQ(next_chunk_, layout_.num_chunks) << "adaptive index encoder finished early";
  return writer_.Finish();
}

void EncodeAdaptive(absl::Span<const uint16_t> local, const IndexLayout& layout,
                    const AdaptiveParams& params, absl::Span<uint8_t> out) {
  AdaptiveIndexEncoder encoder(layout, params, out);
  encoder.EncodeChunks(local, layout.num_chunks);
  const size_t written = encoder.Finish();
  LBCC_CHECK_EQ(written, out.size()) << "adaptive index size mismatch";
}

namespace {

enum class AdaptiveError { kNone, kCount, kTooMany, kBitmap, kOffset, kTotal, kTruncated, kEnd };

#define LBCC_INLINE_STEP inline __attribute__((always_inline))

// The adaptive decoder's bit window: the same reader logic as BitReader (bitstream.h), with its
// four members held in registers once the always-inline steps below are inlined into the loop.
struct AdaptiveWindow {
  const uint8_t* ptr;
  const uint8_t* end;
  uint64_t acc = 0;
  int fill = 0;

  // Tops the window up to 57..64 bits (fewer at the end of the bytes).
  LBCC_INLINE_STEP void Refill() {
    if (end - ptr >= 8) {
      uint64_t word;
      std::memcpy(&word, ptr, 8);
      acc |= word << fill;
      ptr += (63 - fill) >> 3;
      fill |= 56;
    } else {
      while (fill <= 56 && ptr < end) {
        acc |= static_cast<uint64_t>(*ptr++) << fill;
        fill += 8;
      }
    }
  }
  LBCC_INLINE_STEP uint32_t Take(int bits) {  // requires fill >= bits
    const uint32_t v = static_cast<uint32_t>(acc & ((uint64_t{1} << bits) - 1));
    acc >>= bits;
    fill -= bits;
    return v;
  }
};

// Fast path for the common sub-block (at top_k 64 the counts are ~Poisson(1) or Poisson(2)):
// tops the window up when it runs low (8 bytes must be left) and, when the count's quotient is
// <= 2, the count <= 2 and its offsets are listed, decodes it with no data-dependent branch:
// both offset slots are written (*written + 2 <= k keeps them inside the chunk) and checked as
// far as the count says. Otherwise the general code takes the sub-block (same result or error).
enum class FastPath { kDecoded, kGeneral, kBadOffset };
template <int kB, bool kP0>
LBCC_INLINE_STEP FastPath FastSubBlock(AdaptiveWindow& w, int p, int64_t s, uint32_t base,
                                            int64_t k, uint16_t* o, int64_t* written) {
  constexpr int kSlots = 2;
  constexpr int kMaxUsed = kSlots + 1 + 7 + kSlots * kB;
  if (!((w.fill >= kMaxUsed || w.end - w.ptr >= 8) && *written + kSlots <= k)) {
    return FastPath::kGeneral;
  }
  if (w.fill < kMaxUsed) {
    uint64_t word;
    std::memcpy(&word, w.ptr, 8);
    w.acc |= word << w.fill;
    w.ptr += (63 - w.fill) >> 3;
    w.fill |= 56;
  }
  const int q2 = __builtin_ctzll(~w.acc | (uint64_t{1} << 63));  // < 64: the window's ones
  if (!(q2 <= kSlots && q2 <= (s >> p))) return FastPath::kGeneral;
  const int head = q2 + 1 + p;
  const int64_t n2 =
      kP0 ? q2
          : (static_cast<int64_t>(q2) << p) |
                static_cast<int64_t>((w.acc >> (q2 + 1)) & ((uint64_t{1} << p) - 1));
  if (!(n2 <= kSlots && n2 * kB <= s)) return FastPath::kGeneral;
  const uint64_t bits = w.acc >> head;
  constexpr uint64_t kMask = (uint64_t{1} << kB) - 1;
  bool bad = false;
  int64_t prev = -1;
  for (int i = 0; i < kSlots; ++i) {
    const int64_t off = static_cast<int64_t>((bits >> (i * kB)) & kMask);
    o[*written + i] = static_cast<uint16_t>(base + off);
    bad |= (i < n2) & ((off <= prev) | (off >= s));
    prev = off;
  }
  if (bad) return FastPath::kBadOffset;
  const int used = head + static_cast<int>(n2) * kB;  // <= kMaxUsed <= fill
  w.acc >>= used;
  w.fill -= used;
  *written += n2;
  return FastPath::kDecoded;
}

// The general code of one sub-block of s positions starting at `base`: the count (unary
// quotient, then p low bits), then a bitmap of s bits or the n offsets of b bits, whichever the
// encoder wrote (the shorter).
template <int kB>
LBCC_INLINE_STEP AdaptiveError GeneralSubBlock(AdaptiveWindow& w, int p, int64_t s, uint32_t base,
                                               int64_t k, uint16_t* o, int64_t* written) {
  constexpr int b = kB;
  int64_t q = 0;
  for (;;) {
    if (w.fill == 0) {
      w.Refill();
      if (w.fill == 0) return AdaptiveError::kTruncated;
    }
    const uint64_t zeros = ~w.acc;
    int ones = zeros == 0 ? 64 : __builtin_ctzll(zeros);
    if (ones > w.fill) ones = w.fill;
    q += ones;
    if (q > (s >> p)) return AdaptiveError::kCount;
    if (ones < w.fill) {
      w.acc >>= ones + 1;
      w.fill -= ones + 1;
      break;
    }
    w.acc = 0;
    w.fill = 0;
  }
  if (w.fill < p) {
    w.Refill();
    if (w.fill < p) return AdaptiveError::kTruncated;
  }
  const int64_t n = (q << p) | (p > 0 ? w.Take(p) : 0);
  if (n > s) return AdaptiveError::kCount;
  if (*written + n > k) return AdaptiveError::kTooMany;
  if (s < n * b) {
    int64_t seen = 0;
    for (int64_t bit = 0; bit < s; bit += 32) {
      const int width = static_cast<int>(std::min<int64_t>(32, s - bit));
      if (w.fill < width) {
        w.Refill();
        if (w.fill < width) return AdaptiveError::kTruncated;
      }
      uint32_t word = w.Take(width);
      seen += __builtin_popcount(word);
      if (seen > n) return AdaptiveError::kBitmap;
      while (word != 0) {
        o[(*written)++] = static_cast<uint16_t>(base + bit + __builtin_ctz(word));
        word &= word - 1;
      }
    }
    if (seen != n) return AdaptiveError::kBitmap;
    return AdaptiveError::kNone;
  }
  int64_t prev = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (w.fill < b) {
      w.Refill();
      if (w.fill < b) return AdaptiveError::kTruncated;
    }
    const int64_t off = w.Take(b);
    if (off <= prev || off >= s) return AdaptiveError::kOffset;
    prev = off;
    o[(*written)++] = static_cast<uint16_t>(base + off);
  }
  return AdaptiveError::kNone;
}

// The adaptive decoder's inner loop, kept free of error formatting so the bit window stays in
// registers. kB is the sub-block log2 b; kP0 says p is 0 (the usual Rice parameter at top_k
// 64), so the count is the unary quotient: constants shorten the loop's serial chain (window ->
// count -> bits used -> window), which bounds its speed. Decodes chunks [first, last) from bit
// *bit on (*bit <= 8 * bytes.size()) and leaves their end in *bit.
template <int kB, bool kP0>
AdaptiveError DecodeAdaptiveLoop(absl::Span<const uint8_t> bytes, const IndexLayout& layout,
                                 int p_in, int64_t first, int64_t last, uint64_t* bit,
                                 uint16_t* out, int64_t* where) {
  const int p = kP0 ? 0 : p_in;
  AdaptiveWindow w{bytes.data() + (*bit >> 3), bytes.data() + bytes.size()};
  if ((*bit & 7) != 0) {
    w.acc = *w.ptr++ >> (*bit & 7);
    w.fill = 8 - static_cast<int>(*bit & 7);
  }
  const int64_t size = int64_t{1} << kB;
  const int64_t num_sub = NumSubBlocks(layout.chunk_len, kB);
  const int64_t k = layout.k;
  for (int64_t c = first; c < last; ++c) {
    *where = c;
    uint16_t* o = out + c * k;
    int64_t written = 0;
    for (int64_t j = 0; j < num_sub; ++j) {
      const int64_t s = j + 1 < num_sub ? size : layout.chunk_len - (j << kB);
      const uint32_t base = static_cast<uint32_t>(j << kB);
      const FastPath fast = FastSubBlock<kB, kP0>(w, p, s, base, k, o, &written);
      if (fast == FastPath::kDecoded) continue;
      if (fast == FastPath::kBadOffset) return AdaptiveError::kOffset;
      const AdaptiveError e = GeneralSubBlock<kB>(w, p, s, base, k, o, &written);
      if (e != AdaptiveError::kNone) return e;
    }
    if (written != k) return AdaptiveError::kTotal;
  }
  *bit = static_cast<uint64_t>(w.ptr - bytes.data()) * 8 - static_cast<uint64_t>(w.fill);
  return AdaptiveError::kNone;
}

#undef LBCC_INLINE_STEP

// Rice parameter 0 (the encoder's choice at top_k 64 per 4096): when every sub-block lists
// its offsets, a chunk takes exactly num_sub + k * (b + 1) bits, so chunk c + 1 starts that
// far after chunk c. The kernel decodes kAdaptiveLanes chunks from those predicted starts at
// once; lane l is taken only when lanes < l were, it ended at the predicted start of l + 1
// with k entries and no capped count, and its entries pass the run check (ascending, inside
// the chunk): together that is exactly when the sequential decoder accepts the chunk, with
// the same entries (sub-block bases step by 2^b, so ascending within sub-blocks and across
// them is ascending overall). Any other lane is decoded again by DecodeAdaptiveLoop from its
// now known start, which also names the error. Streams that keep failing (bitmaps, counts
// above 8) back off to the sequential decoder for growing runs of chunks.
template <int kB>
AdaptiveError DecodeAdaptiveRice0(const CpuKernels& kern, absl::Span<const uint8_t> bytes,
                                  const IndexLayout& layout, uint64_t* bit, uint16_t* out,
                                  int64_t* where) {
  const int64_t num_sub = NumSubBlocks(layout.chunk_len, kB);
  const int64_t k = layout.k, num_chunks = layout.num_chunks;
  const uint64_t total_bits = static_cast<uint64_t>(bytes.size()) * 8;
  const bool lanes_apply = k >= 1 && num_sub <= kMaxSubBlocks && k <= 8 * num_sub;
  const int last_max =
      num_sub < 1 ? 0
                  : static_cast<int>(std::min<int64_t>(
                        8, (layout.chunk_len - ((num_sub - 1) << kB)) / kB));
  const uint64_t chunk_bits = static_cast<uint64_t>(num_sub + k * (kB + 1));
  const uint64_t span_bits = (kAdaptiveLanes - 1) * chunk_bits + AdaptiveLaneReadBits(num_sub);
  alignas(16) uint16_t lane_out[kAdaptiveLanes][kAdaptiveLaneCapacity];
  uint16_t* const lane_ptr[kAdaptiveLanes] = {lane_out[0], lane_out[1], lane_out[2],
                                              lane_out[3]};
  static_assert(kAdaptiveLanes == 4, "lane_ptr lists four lanes");
  uint64_t pos = *bit;
  int64_t c = 0, sequential = 0, backoff = 1;
  while (c < num_chunks) {
    if (lanes_apply && sequential == 0 && num_chunks - c >= kAdaptiveLanes &&
        span_bits <= total_bits - pos) {
      uint64_t lane_pos[kAdaptiveLanes];
      int64_t count[kAdaptiveLanes];
      bool ok[kAdaptiveLanes];
      for (int l = 0; l < kAdaptiveLanes; ++l) lane_pos[l] = pos + l * chunk_bits;
      kern.adaptive_p0_lanes(bytes.data(), kB, num_sub, /*last_max=*/last_max, lane_pos,
                             lane_ptr, count, ok);
      int good = 0;
      while (good < kAdaptiveLanes && ok[good] && count[good] == k &&
             lane_pos[good] == pos + (good + 1) * chunk_bits) {
        std::memcpy(out + (c + good) * k, lane_out[good], static_cast<size_t>(k) * 2);
        ++good;
      }
      const uint32_t limit = static_cast<uint32_t>(layout.chunk_len);
      if (good > 0 && !kern.runs_ascending(out + c * k, good, k, limit)) {
        int ascending = 0;
        while (ascending < good && kern.runs_ascending(out + (c + ascending) * k, 1, k, limit)) {
          ++ascending;
        }
        good = ascending;
      }
      c += good;
      pos += good * chunk_bits;
      if (good == kAdaptiveLanes) {
        backoff = 1;
        continue;
      }
      sequential = backoff;
      backoff = std::min<int64_t>(2 * backoff, 64);
    }
    const AdaptiveError error =
        DecodeAdaptiveLoop<kB, true>(bytes, layout, 0, c, c + 1, &pos, out, where);
    if (error != AdaptiveError::kNone) return error;
    ++c;
    if (sequential > 0) --sequential;
  }
  *bit = pos;
  return AdaptiveError::kNone;
}

// Every chunk by DecodeAdaptiveLoop.
AdaptiveError DecodeAdaptiveSequentialChunks(absl::Span<const uint8_t> bytes,
                                             const IndexLayout& layout, int b, int p,
                                             uint64_t* bit, uint16_t* out, int64_t* where) {
  const int64_t n = layout.num_chunks;
  if (b == 6) {
    return p == 0 ? DecodeAdaptiveLoop<6, true>(bytes, layout, p, 0, n, bit, out, where)
                  : DecodeAdaptiveLoop<6, false>(bytes, layout, p, 0, n, bit, out, where);
  }
  return p == 0 ? DecodeAdaptiveLoop<7, true>(bytes, layout, p, 0, n, bit, out, where)
                : DecodeAdaptiveLoop<7, false>(bytes, layout, p, 0, n, bit, out, where);
}

// Clean end at bit `end`: every byte consumed, only zero padding bits left.
bool AtCleanEnd(absl::Span<const uint8_t> bytes, uint64_t end) {
  const uint64_t rest = static_cast<uint64_t>(bytes.size()) * 8 - end;
  if (rest >= 8) return false;
  return rest == 0 || (bytes[bytes.size() - 1] >> (8 - rest)) == 0;
}

absl::Status AdaptiveStatus(AdaptiveError error, int64_t chunk, const IndexLayout& layout) {
  switch (error) {
    case AdaptiveError::kNone:
      return absl::OkStatus();
    case AdaptiveError::kCount:
      return Corrupt(absl::StrCat("chunk ", chunk, ": sub-block count exceeds its size"));
    case AdaptiveError::kTooMany:
      return Corrupt(absl::StrCat("chunk ", chunk, ": more than k = ", layout.k, " indices"));
    case AdaptiveError::kBitmap:
      return Corrupt(absl::StrCat("chunk ", chunk, ": bitmap disagrees with its count"));
    case AdaptiveError::kOffset:
      return Corrupt(
          absl::StrCat("chunk ", chunk, ": offset not ascending or outside its sub-block"));
    case AdaptiveError::kTotal:
      return Corrupt(absl::StrCat("chunk ", chunk, " holds fewer than k = ", layout.k, " indices"));
    case AdaptiveError::kTruncated:
      return Corrupt(absl::StrCat("chunk ", chunk, ": truncated"));
    case AdaptiveError::kEnd:
      return Corrupt("trailing bytes or non-zero padding");
  }
  return Corrupt("unreachable");
}

absl::Status CheckAdaptiveParams(const AdaptiveParams& params) {
  const int b = params.sub_block_log2, p = params.rice;
  if (b != 6 && b != 7) return Corrupt(absl::StrCat("sub-block log2 ", b, " (expected 6 or 7)"));
  if (p < 0 || p > b) return Corrupt(absl::StrCat("Rice parameter ", p, " outside [0, ", b, "]"));
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeAdaptive(absl::Span<const uint8_t> bytes, const IndexLayout& layout,
                            const AdaptiveParams& params, absl::Span<uint16_t> out) {
  if (absl::Status status = CheckAdaptiveParams(params); !status.ok()) return status;
  LBCC_CHECK_GE(out.size(), static_cast<size_t>(layout.count()));
  const int b = params.sub_block_log2, p = params.rice;
  const CpuKernels& kern = ActiveKernels();
  int64_t chunk = 0;
  uint64_t bit = 0;
  AdaptiveError error;
  if (p != 0) {
    error = DecodeAdaptiveSequentialChunks(bytes, layout, b, p, &bit, out.data(), &chunk);
  } else if (b == 6) {
    error = DecodeAdaptiveRice0<6>(kern, bytes, layout, &bit, out.data(), &chunk);
  } else {
    error = DecodeAdaptiveRice0<7>(kern, bytes, layout, &bit, out.data(), &chunk);
  }
  if (error == AdaptiveError::kNone && !AtCleanEnd(bytes, bit)) error = AdaptiveError::kEnd;
  return AdaptiveStatus(error, chunk, layout);
}

namespace internal {

absl::Status DecodeAdaptiveSequential(absl::Span<const uint8_t> bytes, const IndexLayout& layout,
                                      const AdaptiveParams& params, absl::Span<uint16_t> out) {
  if (absl::Status status = CheckAdaptiveParams(params); !status.ok()) return status;
  LBCC_CHECK_GE(out.size(), static_cast<size_t>(layout.count()));
  int64_t chunk = 0;
  uint64_t bit = 0;
  AdaptiveError error = DecodeAdaptiveSequentialChunks(bytes, layout, params.sub_block_log2,
                                                       params.rice, &bit, out.data(), &chunk);
  if (error == AdaptiveError::kNone && !AtCleanEnd(bytes, bit)) error = AdaptiveError::kEnd;
  return AdaptiveStatus(error, chunk, layout);
}

}  // namespace internal

}  // namespace lbcc::codecs
