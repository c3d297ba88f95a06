#include "codecs/index_coding.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "codecs/bitstream.h"
#include "codecs/chunking.h"

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
  const uint8_t* p = bytes.data();
  const int32_t chunk_len = static_cast<int32_t>(layout.chunk_len);
  int64_t t = 0;
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    int32_t prev = -1;
    bool bad = false;
    for (int64_t j = 0; j < layout.k; ++j, ++t) {
      const uint8_t* q = p + (t >> 1) * 3;
      const int32_t idx = (t & 1) ? ((q[1] >> 4) | (q[2] << 4)) : (q[0] | ((q[1] & 0xF) << 8));
      bad |= (idx <= prev) | (idx >= chunk_len);
      out[t] = static_cast<uint16_t>(idx);
      prev = idx;
    }
    if (bad) {
      return Corrupt(absl::StrCat("chunk ", c,
                                  ": indices not strictly ascending or outside the chunk of ",
                                  chunk_len));
    }
  }
  return absl::OkStatus();
}

void EncodeAdaptive(absl::Span<const uint16_t> local, const IndexLayout& layout,
                    const AdaptiveParams& params, absl::Span<uint8_t> out) {
  const int b = params.sub_block_log2, p = params.rice;
  const int64_t num_sub = NumSubBlocks(layout.chunk_len, b);
  int32_t counts[kMaxSubBlocks];
  BitWriter writer(out);
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    const uint16_t* idx = local.data() + c * layout.k;
    CountSubBlocks(idx, layout.k, b, num_sub, counts);
    int64_t i = 0;
    for (int64_t j = 0; j < num_sub; ++j) {
      const int64_t n = counts[j];
      const int64_t s = SubBlockSize(layout.chunk_len, b, j);
      const uint32_t base = static_cast<uint32_t>(j << b);
      writer.PutUnary(static_cast<uint32_t>(n >> p));
      writer.Put(static_cast<uint32_t>(n & ((1 << p) - 1)), p);
      if (s < n * b) {
        // Bitmap of s <= 128 bits, written in 32-bit words.
        uint32_t words[4] = {0, 0, 0, 0};
        for (int64_t t = 0; t < n; ++t) {
          const uint32_t off = idx[i + t] - base;
          words[off >> 5] |= 1u << (off & 31);
        }
        for (int64_t bit = 0; bit < s; bit += 32) {
          writer.Put(words[bit >> 5], static_cast<int>(std::min<int64_t>(32, s - bit)));
        }
      } else {
        for (int64_t t = 0; t < n; ++t) writer.Put(idx[i + t] - base, b);
      }
      i += n;
    }
  }
  const size_t written = writer.Finish();
  LBCC_CHECK_EQ(written, out.size()) << "adaptive index size mismatch";
}

absl::Status DecodeAdaptive(absl::Span<const uint8_t> bytes, const IndexLayout& layout,
                            const AdaptiveParams& params, absl::Span<uint16_t> out) {
  const int b = params.sub_block_log2, p = params.rice;
  if (b != 6 && b != 7) return Corrupt(absl::StrCat("sub-block log2 ", b, " (expected 6 or 7)"));
  if (p < 0 || p > b) return Corrupt(absl::StrCat("Rice parameter ", p, " outside [0, ", b, "]"));
  LBCC_CHECK_GE(out.size(), static_cast<size_t>(layout.count()));
  const int64_t num_sub = NumSubBlocks(layout.chunk_len, b);
  BitReader reader(bytes);
  int64_t t = 0;
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    int64_t written = 0;
    for (int64_t j = 0; j < num_sub; ++j) {
      const int64_t s = SubBlockSize(layout.chunk_len, b, j);
      const uint32_t base = static_cast<uint32_t>(j << b);
      uint32_t q = 0, low = 0;
      if (!reader.GetUnary(static_cast<uint32_t>(s >> p), &q) || !reader.Get(p, &low)) {
        return Corrupt(absl::StrCat("chunk ", c, ": bad or truncated count"));
      }
      const int64_t n = (static_cast<int64_t>(q) << p) | low;
      if (n > s || written + n > layout.k) {
        return Corrupt(absl::StrCat("chunk ", c, ": sub-block count ", n, " exceeds its size ",
                                    s, " or the chunk's k ", layout.k));
      }
      if (s < n * b) {
        int64_t seen = 0;
        for (int64_t bit = 0; bit < s; bit += 32) {
          const int width = static_cast<int>(std::min<int64_t>(32, s - bit));
          uint32_t word = 0;
          if (!reader.Get(width, &word)) return Corrupt("truncated bitmap");
          seen += __builtin_popcount(word);
          if (seen > n) return Corrupt(absl::StrCat("chunk ", c, ": bitmap holds more than ", n));
          while (word != 0) {
            const int z = __builtin_ctz(word);
            out[t + written++] = static_cast<uint16_t>(base + bit + z);
            word &= word - 1;
          }
        }
        if (seen != n) return Corrupt(absl::StrCat("chunk ", c, ": bitmap holds fewer than ", n));
      } else {
        int64_t prev = -1;
        for (int64_t i = 0; i < n; ++i) {
          uint32_t off = 0;
          if (!reader.Get(b, &off)) return Corrupt("truncated offsets");
          if (static_cast<int64_t>(off) <= prev || static_cast<int64_t>(off) >= s) {
            return Corrupt(absl::StrCat("chunk ", c, ": offset ", off,
                                        " not ascending or outside its sub-block"));
          }
          prev = off;
          out[t + written++] = static_cast<uint16_t>(base + off);
        }
      }
    }
    if (written != layout.k) {
      return Corrupt(absl::StrCat("chunk ", c, " holds ", written, " indices, expected ",
                                  layout.k));
    }
    t += layout.k;
  }
  if (!reader.AtCleanEnd()) return Corrupt("trailing bytes or non-zero padding");
  return absl::OkStatus();
}

}  // namespace lbcc::codecs
